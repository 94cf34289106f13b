"""In-process LiteLLM provider ``local/<zoo-name-or-path>`` on the transformers backend.

After :func:`register_local_provider`, ``litellm.acompletion(model="local/smollm2-135m", messages=...)`` runs
the model in this process through the same call path as any API model. Concurrent requests to one model are
batched (see :mod:`colab_graphs.local.local_engine`); generation runs in the engine's worker thread, so the
event loop stays free.

Every response carries the exact token ids and per-token logprobs in
``choices[0].provider_specific_fields["colab_graphs"]`` (this field survives litellm's response handling,
``model_dump()`` and rebuilding a ``ModelResponse`` from that dump); read them with
:func:`local_call_details`. With ``logprobs=True`` (and ``top_logprobs=k``) the OpenAI-format
``choices[0].logprobs`` is filled as well.

Logit-level generation (:mod:`colab_graphs.local.logits`) goes through the same provider: pass
``colab_graphs={"logit_mode": "fusion", "members": [...], "weights": [...]}`` as a keyword argument of
``acompletion`` (a pool member's settings can hold it, and it is part of the request, so call caches keyed
on the request see it), or the same mapping as ``metadata={"colab_graphs": {...}}``.

The same mapping may name the dtype a collaborator's weights are served in: ``{"dtype": "bfloat16"}`` (in a
pool file, ``metadata: {colab_graphs: {dtype: bfloat16}}``). The default is float32, and a policy served with
:func:`set_local_model` keeps the dtype of the model the trainer hands over. bfloat16 halves the bytes a
decoding step reads and is ~1.5x faster at batches of 8-16 on CPUs with AMX (no faster at batch 1), but
not batch-invariant: a greedy answer repeats for the same batch, yet may change with the requests it is
batched with (float32 greedy answers have matched their batch-1 answers in every test; BENCHMARKS.md).
Logit-level modes decode in float32.

Example:
    >>> import litellm
    >>> from colab_graphs.local.provider import register_local_provider, local_call_details
    >>> register_local_provider()
    >>> r = litellm.completion(model="local/tiny-random", messages=[{"role": "user", "content": "hi"}],
    ...                        max_tokens=4, temperature=0)
    >>> len(local_call_details(r)["completion_token_ids"])
    4
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

import colab_graphs._env  # noqa: F401  (offline settings before litellm / transformers load)
from colab_graphs.local.engines import DTYPES, PROVIDER, get_engine, set_local_model, unload  # noqa: F401
from colab_graphs.local.local_engine import MAX_BATCH as MAX_BATCH  # (the call path's limit for local calls)
from colab_graphs.local.local_engine import GenerationRequest, GenerationResult, LocalEngine
from colab_graphs.local.sampling import SamplingParams
from colab_graphs.local.weights import weights_identity as weights_identity  # (the call cache keys on it)
from colab_graphs.pool import CONNECTION_KEYS

DETAILS_KEY = "colab_graphs"


def local_call_details(response: Any) -> dict[str, list[Any]] | None:
    """Exact ``prompt_token_ids``, ``completion_token_ids`` and ``logprobs`` of a local model's first choice.

    Reads a response of the in-process provider (``choices[0].provider_specific_fields["colab_graphs"]``) or
    of ``colab-graphs serve`` asked for them (the top-level ``colab_graphs`` key: ``{"choices": [...]}``).
    Accepts a litellm ``ModelResponse``, an OpenAI SDK response, or either's ``model_dump()``. Returns None for
    responses from other providers.
    """

    def get(key: str) -> Any:
        return response.get(key) if isinstance(response, dict) else getattr(response, key, None)

    served = get(DETAILS_KEY)
    if served is None and not isinstance(response, dict):
        served = (getattr(response, "model_extra", None) or {}).get(DETAILS_KEY)  # the OpenAI SDK's extras
    if isinstance(served, dict) and served.get("choices"):
        details = served["choices"][0]
    else:
        choices = get("choices")
        if not choices:
            return None
        choice = choices[0]
        fields = choice.get("provider_specific_fields") if isinstance(choice, dict) else None
        if fields is None and not isinstance(choice, dict):
            fields = getattr(choice, "provider_specific_fields", None)
        details = (fields or {}).get(DETAILS_KEY)
    if not details:
        return None
    return {k: list(details[k]) for k in ("prompt_token_ids", "completion_token_ids", "logprobs")}


def _provider_settings(
    optional_params: dict[str, Any], litellm_params: dict[str, Any] | None
) -> dict[str, Any]:
    """The request's ``colab_graphs`` mapping: a keyword argument, else the same key of ``metadata``."""
    settings = optional_params.get(DETAILS_KEY)
    if settings is None:
        metadata = (litellm_params or {}).get("metadata") or {}
        settings = metadata.get(DETAILS_KEY) if isinstance(metadata, dict) else None
    return dict(settings or {})


def _served_dtype(settings: dict[str, Any]) -> str:
    dtype = str(settings.get("dtype") or "float32")
    if dtype != "float32" and settings.get("logit_mode"):
        raise ValueError(f"logit-level modes decode in float32; drop dtype {dtype!r} from the request")
    return dtype


def build_request(
    engine: LocalEngine, messages: list[dict[str, Any]], params: dict[str, Any]
) -> GenerationRequest:
    """A :class:`GenerationRequest` from OpenAI-style sampling parameters (a pool member's settings).

    Raises:
        ValueError: A sampling parameter of the wrong type or out of range, every one named.
    """
    return sampling_request(engine.render(messages), MemberSampling.model_validate(params))


class MemberSampling(SamplingParams):
    """A pool member's sampling settings for the in-process engine: OpenAI's, and the engine's own `top_k`,
    `min_p` and `repetition_penalty` (vLLM's names and meaning; `serve` takes them, as vLLM's server does)."""

    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)


def sampling_request(
    prompt_ids: list[int], params: SamplingParams, max_tokens: int | None = None, choice: int = 0
) -> GenerationRequest:
    """A :class:`GenerationRequest` for checked `params` (`max_tokens` wins over theirs; default 256).

    A temperature below 1e-5 decodes greedily (dividing logits by it would overflow, as in vLLM). Choice `i` of
    a seeded request with n choices draws with seed + i, so each choice repeats and the choices differ.
    """
    temperature = 1.0 if params.temperature is None else params.temperature
    seed = params.seed
    if seed is not None and choice:
        seed = (seed + choice + 2**63) % 2**64 - 2**63  # the same 64-bit generator seed, wrapped
    return GenerationRequest(
        prompt_ids=prompt_ids,
        max_tokens=max_tokens or params.completion_limit or 256,
        temperature=0.0 if temperature < 1e-5 else temperature,
        top_p=1.0 if params.top_p is None else params.top_p,
        seed=seed,
        stop=params.stop_strings,
        top_logprobs=params.top_logprobs or 0,
        top_k=getattr(params, "top_k", None) or 0,
        min_p=getattr(params, "min_p", None) or 0.0,
        repetition_penalty=getattr(params, "repetition_penalty", None) or 1.0,
    )


def openai_logprobs(tokenizer: Any, result: GenerationResult) -> dict[str, Any]:
    """``choices[0].logprobs`` in OpenAI chat format for ``result``."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        token = tokenizer.decode([token_id])
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    content = []
    for i, (tid, lp) in enumerate(zip(result.completion_ids, result.logprobs, strict=True)):
        item = entry(tid, lp)
        item["top_logprobs"] = [entry(t, v) for t, v in result.top_logprobs[i]] if result.top_logprobs else []
        content.append(item)
    return {"content": content}


def to_model_response(model: str, tokenizer: Any, result: GenerationResult, want_logprobs: bool) -> Any:
    """An OpenAI-shaped litellm ``ModelResponse`` with usage and the exact ids in provider fields."""
    from litellm import ModelResponse

    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": result.finish_reason,
        "message": {"role": "assistant", "content": result.text},
        "provider_specific_fields": {
            DETAILS_KEY: {
                "prompt_token_ids": result.prompt_ids,
                "completion_token_ids": result.completion_ids,
                "logprobs": result.logprobs,
            }
        },
    }
    if want_logprobs:
        choice["logprobs"] = openai_logprobs(tokenizer, result)
    n_prompt, n_completion = len(result.prompt_ids), len(result.completion_ids)
    return ModelResponse(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        object="chat.completion",
        choices=[choice],
        usage={
            "prompt_tokens": n_prompt,
            "completion_tokens": n_completion,
            "total_tokens": n_prompt + n_completion,
        },
    )


def _generate_logit_level(
    model: str, messages: list[dict[str, Any]], params: dict[str, Any], settings: dict[str, Any]
) -> GenerationResult:
    """Dispatch a provider request carrying ``colab_graphs={"logit_mode": ...}`` settings.

    Raises:
        ValueError: Unknown mode, missing members, or a first member that is not the request's model.
    """
    mode = settings.get("logit_mode")
    members = [str(m).removeprefix("local/") for m in settings.get("members") or []]
    if not members or members[0] != model:
        raise ValueError(f"colab_graphs.members must list the request's model {model!r} first, got {members}")
    checked = SamplingParams.model_validate(params)
    common: dict[str, Any] = {
        "max_tokens": checked.completion_limit or 256,
        "temperature": 1.0 if checked.temperature is None else checked.temperature,
        "seed": checked.seed,
        "stop": checked.stop_strings,
    }
    if mode == "fusion":
        from colab_graphs.local.logits import logit_fusion

        return logit_fusion(
            members,
            messages,
            weights=settings.get("weights"),
            top_p=1.0 if checked.top_p is None else checked.top_p,
            **common,
        )
    if mode == "contrastive":
        if len(members) != 2:
            raise ValueError(f"contrastive decoding takes members [strong, weak], got {members}")
        from colab_graphs.local.logits import contrastive_decoding

        return contrastive_decoding(
            members[0],
            members[1],
            messages,
            alpha=float(settings.get("alpha", 0.1)),
            beta=float(settings.get("beta", 1.0)),
            **common,
        )
    if mode in ("nudging", "co_llm"):  # two models guiding one decode: colab_graphs.local.guided
        from colab_graphs.local.guided import generate_guided

        return generate_guided(mode, members, messages, settings, **common)
    raise ValueError(
        f"colab_graphs.logit_mode must be 'fusion', 'contrastive', 'nudging' or 'co_llm', got {mode!r}"
    )


def generate_response(
    model: str,
    messages: list[dict[str, Any]],
    params: dict[str, Any],
    litellm_params: dict[str, Any] | None = None,
) -> Any:
    """Generate with ``local/<model>`` and build the response, blocking the calling thread."""
    settings = _provider_settings(params, litellm_params)
    engine = get_engine(model, _served_dtype(settings))
    if settings.get("logit_mode"):
        result = _generate_logit_level(model, messages, params, settings)
    else:
        result = engine.generate(build_request(engine, messages, params))
    return to_model_response(model, engine.tokenizer, result, bool(params.get("logprobs")))


async def agenerate_result(
    model: str,
    messages: list[dict[str, Any]],
    params: dict[str, Any],
    litellm_params: dict[str, Any] | None = None,
) -> tuple[LocalEngine, GenerationResult]:
    """The engine serving ``local/<model>`` and what it generated for the request (model loading and decoding
    off the event loop)."""
    import asyncio

    settings = _provider_settings(params, litellm_params)
    engine = await asyncio.to_thread(get_engine, model, _served_dtype(settings))
    if settings.get("logit_mode"):
        result = await asyncio.to_thread(_generate_logit_level, model, messages, params, settings)
    else:
        request = await asyncio.to_thread(build_request, engine, messages, params)
        result = await engine.agenerate(request)
    return engine, result


async def agenerate_response(
    model: str,
    messages: list[dict[str, Any]],
    params: dict[str, Any],
    litellm_params: dict[str, Any] | None = None,
) -> Any:
    """Async :func:`generate_response`: model loading and decoding stay off the event loop."""
    engine, result = await agenerate_result(model, messages, params, litellm_params)
    return to_model_response(model, engine.tokenizer, result, bool(params.get("logprobs")))


# The settings a plain call may carry to be answered without LiteLLM (`plain_call_params`): the ones LiteLLM hands
# this provider unchanged as `optional_params` (checked in tests/test_local_lane.py). Any other one (`n`,
# `max_completion_tokens`, which LiteLLM renames, tools, `metadata`, `colab_graphs` logit modes or a dtype) sends
# the call through LiteLLM, as before.
PLAIN_SETTINGS = frozenset(
    {"temperature", "top_p", "max_tokens", "stop", "seed", "top_k", "min_p", "repetition_penalty"}
    | {"logprobs", "top_logprobs"}
)


def plain_call_params(kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The provider's parameters for a call of a ``local/`` model whose every setting LiteLLM would pass on
    unchanged (connection settings aside, which the in-process engine ignores), else None."""
    if not str(kwargs.get("model", "")).startswith(f"{PROVIDER}/"):
        return None
    settings = {
        k: v for k, v in kwargs.items() if k not in CONNECTION_KEYS and k not in ("model", "messages")
    }
    return settings if settings.keys() <= PLAIN_SETTINGS else None


class BadRequestError(ValueError):
    """A local call's sampling settings are out of range: the request can never succeed (not retried)."""

    status_code = 400


async def answer_plain(
    model: str, messages: list[dict[str, Any]], params: dict[str, Any]
) -> tuple[GenerationResult, dict[str, list[Any]]]:
    """Answer a call `plain_call_params` accepted, as the provider answers it through LiteLLM, without LiteLLM:
    the result and the details a LiteLLM reply would carry (`local_call_details`).

    Raises:
        BadRequestError: A sampling setting of the wrong type or out of range, every one named.
    """
    try:
        _, result = await agenerate_result(model.removeprefix(f"{PROVIDER}/"), messages, params)
    except ValidationError as exc:
        raise BadRequestError(str(exc)) from None
    details: dict[str, list[Any]] = {
        "prompt_token_ids": list(result.prompt_ids),
        "completion_token_ids": list(result.completion_ids),
        "logprobs": list(result.logprobs),
    }
    return result, details


def _handler_class() -> type:
    from litellm import CustomLLM

    # CustomLLM is `Any` to mypy (pyproject: litellm is not analysed), so subclassing it needs the ignore.
    class LocalProvider(CustomLLM):  # type: ignore[misc]
        """LiteLLM custom handler: ``model`` arrives without the ``local/`` prefix."""

        async def acompletion(
            self, model: str, messages: list[dict[str, Any]], *args: Any, **kwargs: Any
        ) -> Any:
            return await agenerate_response(
                model, messages, kwargs.get("optional_params") or {}, kwargs.get("litellm_params")
            )

        def completion(self, model: str, messages: list[dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
            return generate_response(
                model, messages, kwargs.get("optional_params") or {}, kwargs.get("litellm_params")
            )

    return LocalProvider


_handler: Any = None


def register_local_provider() -> None:
    """Make ``local/...`` models callable through litellm. Idempotent; keeps other custom providers."""
    global _handler
    import litellm

    if _handler is None:
        _handler = _handler_class()()
    others = [p for p in litellm.custom_provider_map if p.get("provider") != PROVIDER]
    litellm.custom_provider_map = [*others, {"provider": PROVIDER, "custom_handler": _handler}]
    # litellm reads the map when a call starts, but registers provider names only in custom_llm_setup.
    from litellm.utils import custom_llm_setup

    custom_llm_setup()


def model_folder(model_ref: str) -> Path:
    """The folder a ``local/`` reference loads from (for export and serving with vLLM)."""
    from colab_graphs.local.zoo import resolve

    return resolve(model_ref.removeprefix(f"{PROVIDER}/"))


def prompt_tokens(model: str, messages: list[dict[str, Any]]) -> int | None:
    """The prompt tokens of `messages` for the `local/` model `model` as the engine renders them (its chat
    template applied), or None when its folder is not on disk (nothing is fetched to count)."""
    tokenizer = _local_tokenizer(model)
    if tokenizer is None:
        return None
    plain = [(m["role"], str(m.get("content", ""))) for m in messages]
    return len(LocalEngine._render(tokenizer, plain))


@lru_cache(maxsize=32)
def _local_tokenizer(model: str) -> Any:
    """The tokenizer of a `local/` model whose folder is already on disk (never fetched here), else None."""
    from colab_graphs.local import zoo

    ref = model.removeprefix("local/")
    folder = None
    try:
        entry = zoo.get_entry(ref)
        folder = entry.folder() if entry.is_cached() else None
    except KeyError:
        path = Path(ref).expanduser()
        folder = path if (path / "config.json").is_file() else None
    if folder is None:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
