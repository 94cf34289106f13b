"""Chat calls posted straight to an OpenAI-compatible server, without LiteLLM: the call path's direct lane.

Against a local vLLM server a reply takes milliseconds, and what LiteLLM does around each call (a logging
object, a price calculation, its logging worker, the openai SDK's request and response objects) costs several
times the CPU of the HTTP request itself (BENCHMARKS.md, "Calls per second"). So a call that LiteLLM would
pass to the server unchanged is posted here instead, on one pooled aiohttp session, and its reply read from
the JSON. `ModelClient` takes this lane for a call when `direct_request` gives it one and nothing of the user's
is registered with LiteLLM (`litellm_in_use`: callbacks such as Langfuse or OpenTelemetry, LiteLLM's own
cache, call rules), so a user's integration still sees every call; any other call goes through LiteLLM.

A call goes direct when
- the member has no `deployments` (a Router member stays on `litellm.Router`);
- its model is ``openai/NAME`` with an `api_base` (or `base_url`), neither of them OpenAI's own API or one of
  OpenAI's model names (`openai_model_name`: LiteLLM rewrites their parameters);
- it has an API key (`api_key`, else ``OPENAI_API_KEY``, where LiteLLM looks too), no user, password or query
  string in its `api_base`, and no proxy from the environment (``HTTP_PROXY``, ...) applies to it;
- each setting is a chat parameter LiteLLM sends as it is (`BODY_PARAMS`), `extra_body` (merged into the body,
  as LiteLLM does), `extra_headers` / `headers` / `organization`, a price (`input_cost_per_token`,
  `output_cost_per_token`), or the call path's own (`timeout`, `num_retries`);
- each message is plain: role system, user, assistant or tool, text content (or none);
- the call is not streamed.
Anything else (a ``hosted_vllm/`` model, images, `top_k`, a ``developer`` message, a stream) goes through
LiteLLM, as does every call when `ModelClient(direct=False)` or ``COLAB_GRAPHS_DIRECT=0`` says so.

What LiteLLM does to such a call is done here as well, so the server gets the same request and the call records
the same reply (tests/test_direct.py sends each request and reply shape both ways and compares): message keys
whose value is None are left out; a reply's leading ``<think>...</think>`` is taken out of its text unless the
message carries `reasoning_content` or `reasoning`; a missing finish reason reads "stop" ("tool_calls" with
tool calls), a provider's own is mapped to OpenAI's; missing usage counts 0. A reply of another shape (a tool
call without an id, say) is read by LiteLLM's own converter. Error statuses fail as LiteLLM's exceptions for
them do (`status_kind`).

A direct reply's price comes from the project's price table (`colab_graphs.models.pricing`): the member's own
`input_cost_per_token` / `output_cost_per_token` (as LiteLLM applies them, cached prompt tokens included), else
LiteLLM's price map, looked up once per model off the call loop (the lookup imports LiteLLM); a model without a
price costs None ("unknown"), as before.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from colab_graphs.models.cache import CallCache
from colab_graphs.models.pricing import Price, member_price
from colab_graphs.pool import PRICE_KEYS, Member

PROVIDER = "openai/"
# OpenAI chat parameters LiteLLM sends to an OpenAI-compatible server exactly as given (for a model name that
# is not OpenAI's own; tests/test_direct.py checks each against LiteLLM's request).
BODY_PARAMS = frozenset(
    {
        "temperature", "top_p", "n", "stop", "max_tokens", "max_completion_tokens", "seed", "presence_penalty",
        "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "tools", "tool_choice",
        "parallel_tool_calls", "response_format", "reasoning_effort",
    }
)  # fmt: skip
# The call path's own settings (the client's timeout and retries), and where the request goes.
PATH_KEYS = frozenset({"model", "messages", "api_base", "base_url", "api_key", "timeout", "num_retries"})
HEADER_KEYS = frozenset({"extra_headers", "headers", "organization"})
ROLES = frozenset({"system", "user", "assistant", "tool"})
DIRECT_ENV = "COLAB_GRAPHS_DIRECT"

# OpenAI's own model names (its o-series, GPT-5 and the rest of its catalogue): LiteLLM rewrites their
# parameters (max_tokens, temperature, ...), so their calls go through it. A test checks that every chat model
# of LiteLLM's OpenAI catalogue matches.
_OPENAI_NAME = re.compile(
    r"^(?:gpt-(?!oss)|o\d|chatgpt|codex|text-|davinci|babbage|ft:|computer-use|omni-|chat-latest|daybreak-"
    r"|tts-|whisper|sora|dall-e|container$)"
)
# LiteLLM's callback lists and hooks: anything a user put there must see every call (so it goes via LiteLLM).
_LITELLM_HOOKS = (
    "callbacks",
    "success_callback",
    "failure_callback",
    "input_callback",
    "service_callback",
    "audit_log_callbacks",
    "_async_success_callback",
    "_async_failure_callback",
    "_async_input_callback",
    "pre_call_rules",
    "post_call_rules",
)
# Finish reasons a provider may give and the OpenAI reason LiteLLM reports for them (its `map_finish_reason`,
# which a test compares this with); any other reads "stop", as there.
_FINISH_REASONS = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "function_call",
    **dict.fromkeys(
        ("max_tokens", "compaction", "pause_turn", "model_context_window_exceeded", "MAX_TOKENS", "CONTINUATION"),
        "length",
    ),
    **dict.fromkeys(("tool_use", "TOOL_CALL"), "tool_calls"),
    **dict.fromkeys(
        ("content_filter", "content_filtered", "refusal", "ERROR_TOXIC", "SAFETY", "RECITATION", "LANGUAGE",
         "OTHER", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT",
         "NO_IMAGE", "IMAGE_RECITATION", "IMAGE_OTHER", "ESCALATION", "sensitive", "guardrail_intervened"),
        "content_filter",
    ),
}  # fmt: skip
_THINK = re.compile(
    r"<(?:think|thinking|budget:thinking)>(.*?)</(?:think|thinking|budget:thinking)>(.*)", re.DOTALL
)
_TOOL_CALL_KEYS = frozenset({"id", "type", "function", "index"})


def direct_enabled() -> bool:
    """Whether the environment leaves the direct lane on (``COLAB_GRAPHS_DIRECT=0`` turns it off)."""
    return os.environ.get(DIRECT_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def openai_model_name(name: str) -> bool:
    """Whether `name` (a model name after ``openai/``) is one of OpenAI's own models."""
    return bool(_OPENAI_NAME.match(name) or _OPENAI_NAME.match(name.rsplit("/", 1)[-1]))


def litellm_in_use() -> bool:
    """Whether the user registered anything with LiteLLM that must see each call (callbacks, its cache, rules).

    LiteLLM not imported yet means nothing is registered: this never imports it."""
    litellm = sys.modules.get("litellm")
    if litellm is None:
        return False
    return getattr(litellm, "cache", None) is not None or any(
        getattr(litellm, n, None) for n in _LITELLM_HOOKS
    )


@dataclass(frozen=True)
class DirectRequest:
    """A chat call as it is posted: where, with which headers and body."""

    url: str
    headers: dict[str, str]
    body: bytes
    timeout_s: float | None


def direct_request(member: Member, kwargs: Mapping[str, Any]) -> DirectRequest | None:
    """The call `kwargs` (LiteLLM's keyword arguments for it) as a direct request, or None when it must go
    through LiteLLM (see the module docstring)."""
    model = kwargs.get("model")
    base = kwargs.get("api_base") or kwargs.get("base_url")
    if member.deployments or not base or not isinstance(model, str) or not model.startswith(PROVIDER):
        return None
    name = model[len(PROVIDER) :]
    url = urlsplit(str(base))
    host = (url.hostname or "").lower()
    if not name or openai_model_name(name) or host == "openai.com" or host.endswith(".openai.com"):
        return None
    if url.username or url.password or url.query or url.fragment or _proxied(url.scheme, host):
        return None  # (credentials or a query in the URL, a proxy from the environment: LiteLLM takes them)
    key = kwargs.get("api_key") or os.environ.get("OPENAI_API_KEY")
    if not key:
        return None
    messages = []
    for message in kwargs["messages"]:
        content = message.get("content")
        if message.get("role") not in ROLES or not (content is None or isinstance(content, str)):
            return None
        messages.append({k: v for k, v in message.items() if v is not None})
    body: dict[str, Any] = {"model": name, "messages": messages}
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    for setting, value in kwargs.items():
        if setting in BODY_PARAMS:
            if value is not None:
                body[setting] = value
        elif setting == "extra_body":
            if value is not None and not isinstance(value, Mapping):
                return None
            body.update(value or {})
        elif setting in HEADER_KEYS:
            if setting == "organization":
                value = {"OpenAI-Organization": value} if value else None
            if value is not None and not isinstance(value, Mapping):
                return None
            headers.update({str(k): str(v) for k, v in (value or {}).items()})
        elif setting not in PATH_KEYS and setting not in PRICE_KEYS:
            return None
    timeout = kwargs.get("timeout")
    return DirectRequest(
        url=str(base).rstrip("/") + "/chat/completions",
        headers=headers,
        body=json.dumps(body).encode(),
        timeout_s=None if timeout is None else float(timeout),
    )


_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def _proxied(scheme: str, host: str) -> bool:
    """Whether the environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``) sends requests to
    `host` through a proxy. (Read per call, decided once per setting of those variables.)"""
    settings = tuple(os.environ.get(v) or os.environ.get(v.upper()) for v in _PROXY_VARIABLES)
    return any(settings) and _proxied_with(scheme, host, settings)


@functools.lru_cache(maxsize=64)
def _proxied_with(scheme: str, host: str, settings: tuple[str | None, ...]) -> bool:
    from urllib.request import getproxies, proxy_bypass  # (as aiohttp reads the environment)

    proxies = getproxies()
    if scheme not in proxies and "all" not in proxies:
        return False
    return not proxy_bypass(host)


class HTTPStatusError(Exception):
    """The server answered with an error status. `status_code` is the status; the message is the server's."""

    def __init__(self, status_code: int, message: str):
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code


def status_kind(status: int, message: str) -> str:
    """The failure kind (see `colab_graphs.models.client.classify_error`) of an error status, as the LiteLLM
    exception for it classifies: its rate-limit and context-window messages, then the status."""
    text = message.lower()
    if status == 429 or re.search(r"rate[\s_\-]*limit", text):
        return "rate_limit"
    if status in (408, 504):
        return "timeout"
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status in (400, 422):
        if any(s in text for s in ("json", "decode", "malformed", "expecting value", "invalid response")):
            return "malformed"
        return "bad_request"
    return "server"  # 5xx, and the 4xx statuses LiteLLM reports as its generic APIError


def _error_message(raw: bytes) -> str:
    """The server's error message: the `error.message` of an OpenAI-shaped error body, else the body."""
    text = raw.decode("utf-8", errors="replace")
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return str(message if message else text.strip())[:2000]


_session: Any = None
_session_loop: asyncio.AbstractEventLoop | None = None


def _session_here() -> Any:
    """The call loop's one aiohttp session: pooled keep-alive connections (the client's per-endpoint limit
    bounds them). It ignores the environment (no proxy, no ~/.netrc: calls through a proxy go through LiteLLM),
    which also spares each request a read of ~/.netrc in the executor."""
    global _session, _session_loop
    loop = asyncio.get_running_loop()
    if _session is None or _session.closed or _session_loop is not loop:
        import aiohttp

        _session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), trust_env=False, skip_auto_headers=("User-Agent",)
        )
        _session_loop = loop
    return _session


async def close_session() -> None:
    """Close the direct lane's session (at exit, on the call loop: `colab_graphs.models.loops`)."""
    global _session
    if _session is not None and not _session.closed:
        await _session.close()
    _session = None


async def post(request: DirectRequest) -> dict[str, Any]:
    """POST `request` (on the call loop); the reply's JSON. Raises `HTTPStatusError` for an error status,
    `TimeoutError` past the timeout, `ConnectionError` when the connection fails, `ValueError` for a body that
    is not a JSON object."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=request.timeout_s, sock_read=request.timeout_s)
    try:
        async with _session_here().post(
            request.url, data=request.body, headers=request.headers, timeout=timeout
        ) as response:
            raw = await response.read()
            status = response.status
    except TimeoutError as exc:  # (aiohttp's timeouts are TimeoutErrors)
        raise TimeoutError(f"no reply within {request.timeout_s:g} s") from exc
    except aiohttp.ClientError as exc:
        raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
    if status >= 400:
        raise HTTPStatusError(status, _error_message(raw))
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"the reply is not a JSON object: {raw[:200]!r}")
    return data


@dataclass(frozen=True)
class DirectReply:
    """What the call path keeps of a reply (see `colab_graphs.trace.Reply`)."""

    text: str
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[float] | None
    usage: Mapping[str, Any]


def finish_reason(reason: str) -> str:
    """The OpenAI finish reason LiteLLM reports for a provider's `reason`."""
    return _FINISH_REASONS.get(reason, "stop")


def read_reply(data: Mapping[str, Any]) -> DirectReply | None:
    """The reply in `data` (a chat completion's JSON), read as LiteLLM reads it; None for a shape only LiteLLM's
    converter reads (`convert_reply`). Raises `ValueError` for a reply with neither text nor a tool call (the
    call path retries it as malformed)."""
    choices = data.get("choices")
    if not choices or not isinstance(choices, list):
        raise ValueError("response has no choices")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        return None
    thought = (
        _THINK.match(content) if content and not message.keys() & {"reasoning_content", "reasoning"} else None
    )
    if thought is not None:
        content = thought.group(2)
    try:
        tool_calls = _plain_tool_calls(message.get("tool_calls"))
    except _ForLiteLLM:
        return None
    if content is None and not tool_calls:
        raise ValueError("response message has no content")
    finish = choice.get("finish_reason") or choice.get("finish_details") or "stop"
    if not isinstance(finish, str):
        return None
    finish = finish_reason(finish)
    if finish == "stop" and tool_calls:
        finish = "tool_calls"
    usage = data.get("usage") or {}
    logprobs = choice.get("logprobs")
    tokens = logprobs.get("content") if isinstance(logprobs, dict) else None
    return DirectReply(
        text=content or "",
        tool_calls=tool_calls or None,
        finish_reason=finish,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        logprobs=[float(t["logprob"]) for t in tokens] if tokens else None,
        usage=usage,
    )


class _ForLiteLLM(Exception):
    """A reply shape that only LiteLLM's converter reads."""


def _plain_tool_calls(calls: Any) -> list[dict[str, Any]] | None:
    """The tool calls as the call path keeps them (None without any). Raises `_ForLiteLLM` for a shape
    LiteLLM must read: no id, another type, arguments that are not text, OpenAI's `multi_tool_use.parallel`."""
    if not calls:
        return None
    if not isinstance(calls, list):
        raise _ForLiteLLM
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or not call.keys() <= _TOOL_CALL_KEYS
            or not isinstance(call.get("id"), str)
            or call.get("type", "function") != "function"
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str)
            or function["name"] == "multi_tool_use.parallel"
        ):
            raise _ForLiteLLM
        out.append(
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": function["name"], "arguments": function["arguments"]},
            }
        )
    return out


def convert_reply(data: Mapping[str, Any]) -> Any:
    """`data` as LiteLLM's `ModelResponse`, by LiteLLM's own converter (for the shapes `read_reply` leaves to it).
    Imports LiteLLM: call it off the call loop."""
    import litellm
    from litellm.litellm_core_utils.llm_response_utils.convert_dict_to_response import (
        convert_to_model_response_object,
    )

    return convert_to_model_response_object(
        response_object=dict(data), model_response_object=litellm.ModelResponse()
    )


def reply_cost(price: Price | None, usage: Mapping[str, Any]) -> float | None:
    """A reply's price at `price` per token (None: unknown), as LiteLLM computes a member's own prices: prompt
    tokens cached or written to a cache at the prompt price, each group priced apart."""
    if price is None:
        return None
    details = usage.get("prompt_tokens_details") or {}
    prompt = float(usage.get("prompt_tokens") or 0)
    cached = float(details.get("cached_tokens") or 0)
    written = float(details.get("cache_write_tokens") or details.get("cache_creation_tokens") or 0)
    regular = max(prompt - cached - written, 0)
    prompt_cost = regular * price.prompt + cached * price.prompt + written * price.prompt
    return prompt_cost + float(usage.get("completion_tokens") or 0) * price.completion


_prices: dict[str, Price | None] = {}
_lookups: dict[str, asyncio.Future[Price | None]] = {}


def settled_price(member: Member) -> tuple[bool, Price | None]:
    """(True, the member's price per token) when it is known without a lookup (its own prices, or its model's
    looked up already), else (False, None): `price_of` looks it up."""
    if any(member.settings.get(k) is not None for k in PRICE_KEYS):
        return True, member_price(member)
    if member.model in _prices:
        return True, _prices[member.model]
    return False, None


async def price_of(member: Member, cache: CallCache | None = None) -> Price | None:
    """The member's price per token (None: unknown), from LiteLLM's price map: looked up once per model, in the
    running loop's executor (the lookup imports LiteLLM: seconds that must not hold the loop), and remembered
    in `cache` for later processes. A price remembered there is used only while LiteLLM is not loaded (so no
    price can have been registered with it since) and its map is the bundled one of the same version."""
    settled, price = settled_price(member)
    if settled:
        return price
    model = member.model
    source = _map_source()
    if cache is not None and source is not None and "litellm" not in sys.modules:
        found, remembered = cache.price(model, source)
        if found:
            _prices[model] = Price(*remembered) if remembered is not None else None
            return _prices[model]
    loop = asyncio.get_running_loop()
    lookup = _lookups.get(model)
    if lookup is None or lookup.get_loop() is not loop:
        lookup = _lookups[model] = loop.run_in_executor(None, member_price, member)
    price = await asyncio.shield(lookup)  # (a waiter cancelled leaves the lookup to the others)
    _prices[model] = price
    _lookups.pop(model, None)
    if cache is not None and source is not None:
        cache.put_price(model, source, None if price is None else (price.prompt, price.completion))
    return price


@functools.cache
def _map_source() -> str | None:
    """Which price map LiteLLM reads: its bundled copy, of its installed version; None when it fetches one
    (that may change at any time, so no price from it is remembered)."""
    from importlib.metadata import PackageNotFoundError, version

    if os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP", "").lower() != "true":
        return None
    try:
        return f"litellm {version('litellm')} bundled map"
    except PackageNotFoundError:
        return None
