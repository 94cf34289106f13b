"""The types of the settings a pool file may give, checked when the pool loads rather than when a call fails.

`temperature: hot`, `max_tokens: lots`, `seed: x` or `max_tokens: -5` used to load and then fail every call of
the member (LiteLLM or the server refuses them), after minutes of work; here they fail the load, naming the
file, the member and every field at fault. The types follow OpenAI's chat-completion parameters as LiteLLM takes
them. A string where a number belongs is converted when it reads as one (a value read from `${ENV}` is always
a string); a value that already has its type is kept as written, so that the cache key of a request (`0` vs
`0.0`) never changes with this check.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, TypeAdapter, ValidationError


def _not_bool(value: Any) -> Any:
    # pydantic reads true as 1; `max_tokens: true` is a mistake, not a request for one token.
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return value


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


Number = Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False)]
NonNegative = Annotated[float, BeforeValidator(_not_bool), Field(ge=0, allow_inf_nan=False)]
Positive = Annotated[float, BeforeValidator(_not_bool), Field(gt=0, allow_inf_nan=False)]
Integer = Annotated[int, BeforeValidator(_not_bool)]
Count = Annotated[int, BeforeValidator(_not_bool), Field(ge=0)]
AtLeastOne = Annotated[int, BeforeValidator(_not_bool), Field(ge=1)]
Text = Annotated[str, AfterValidator(_non_empty)]
Headers = dict[str, str]

SETTING_TYPES: dict[str, Any] = {
    "model": Text,
    "api_base": Text,
    "base_url": Text,
    "api_key": str,
    "api_version": str,
    "organization": str,
    "custom_llm_provider": Text,
    "temperature": NonNegative,
    "top_p": Annotated[float, BeforeValidator(_not_bool), Field(ge=0, le=1, allow_inf_nan=False)],
    "n": AtLeastOne,
    "max_tokens": AtLeastOne,
    "max_completion_tokens": AtLeastOne,
    "stop": str | list[str],
    "seed": Integer,
    "presence_penalty": Number,
    "frequency_penalty": Number,
    "logit_bias": dict[str | int, Number],
    "logprobs": bool,
    "top_logprobs": Count,
    "response_format": dict[str, Any],
    "timeout": Positive,
    "extra_headers": Headers,
    "headers": Headers,
    "extra_body": dict[str, Any],
    "reasoning_effort": Text,
    "top_k": Integer,  # vLLM reads -1 as "off"
    "num_retries": Count,
    "drop_params": bool,
    "aws_region_name": Text,
    "vertex_project": Text,
    "vertex_location": Text,
    "user": str,
    "metadata": dict[str, Any],
    "deployment_id": Text,
    # What a deployment adds (the Router's per-deployment limits).
    "rpm": Count,
    "tpm": Count,
    "weight": NonNegative,
    "order": Integer,
    "max_parallel_requests": AtLeastOne,
    # The member's own keys.
    "description": str,
    "system_prompt": str,
    "cache_namespace": Text,
}
ROUTER_TYPES: dict[str, Any] = {
    "routing_strategy": Text,
    "routing_strategy_args": dict[str, Any],
    "num_retries": Count,
    "retry_after": NonNegative,
    "retry_policy": dict[str, Any],
    "allowed_fails": Count,
    "allowed_fails_policy": dict[str, Any],
    "cooldown_time": NonNegative,
    "disable_cooldowns": bool,
    "timeout": Positive,
    "default_max_parallel_requests": AtLeastOne,
    "enable_pre_call_checks": bool,
    "enable_weighted_failover": bool,
}


@functools.cache
def _adapter(kind: str, field: str) -> TypeAdapter[Any]:
    return TypeAdapter((ROUTER_TYPES if kind == "router" else SETTING_TYPES)[field])


def setting_problems(values: Mapping[str, Any], kind: str = "settings") -> tuple[dict[str, Any], list[str]]:
    """(`values` with strings read as the numbers or flags they spell, one line per field of a wrong type).

    `kind`: "settings" (a member's or a deployment's) or "router". Fields without a known type pass unchecked.
    """
    table = ROUTER_TYPES if kind == "router" else SETTING_TYPES
    out = dict(values)
    problems = []
    for field, value in values.items():
        if field not in table:
            continue
        try:
            checked = _adapter(kind, field).validate_python(value)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = "".join(f"[{p!r}]" for p in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{field}{where}: {value!r}: {message}")
            continue
        if isinstance(value, str) and not isinstance(checked, str):
            out[field] = checked
    if kind == "settings":
        problems += _url_problems(out)
    return out, problems


# Providers that append their route to `api_base` as text (OpenAI's SDK: `{api_base}/chat/completions`).
_APPENDING_PROVIDERS = ("openai/", "hosted_vllm/", "text-completion-openai/")


def _url_problems(settings: Mapping[str, Any]) -> list[str]:
    """URLs that cannot work, each of which used to fail every call of the member at run time:

    - a user:password@ in the URL: LiteLLM's providers send an Authorization header of their own (measured:
      OpenAI-compatible ones with or without a key, Ollama's without one), and its HTTP transport refuses
      credentials in the URL beside it ("Cannot combine AUTHORIZATION header with ... credentials encoded in
      URL", after every retry);
    - a query string (``?key=...``) on an OpenAI-compatible member: the client appends its route after it
      (``/v1?key=.../chat/completions``), so the server sees ``POST /v1`` and answers 404.
    """
    from urllib.parse import urlsplit

    model = str(settings.get("model", ""))
    problems = []
    for field in ("api_base", "base_url"):
        url = settings.get(field)
        if not isinstance(url, str):
            continue
        try:
            parts = urlsplit(url)
            has_userinfo = parts.username is not None
        except ValueError:
            continue
        if has_userinfo:
            problems.append(
                f"{field}: credentials in the URL (user:password@host) cannot be sent (the HTTP client refuses "
                "them beside the Authorization header every request carries); give the credential as api_key, "
                "or as an Authorization header in extra_headers"
            )
        if parts.query and model.startswith(_APPENDING_PROVIDERS):
            problems.append(
                f"{field}: a query string (?{parts.query.split('=')[0]}=...) cannot be sent: the OpenAI client "
                "appends /chat/completions after it and the server sees another path; give a key as api_key, or "
                "as a header in extra_headers"
            )
    return problems
