"""In-process LiteLLM provider ``local/<zoo-name-or-path>`` on the transformers backend.

After :func:`register_local_provider`, ``litellm.acompletion(model="local/smollm2-135m", messages=...)`` runs
the model in this process through the same call path as any API model. Concurrent requests to one model are
batched (see :mod:`colab_graphs.models.local_engine`); generation runs in the engine's worker thread, so the
event loop stays free.

Every response carries the exact token ids and per-token logprobs in
``choices[0].provider_specific_fields["colab_graphs"]`` (this field survives litellm's response handling,
``model_dump()`` and rebuilding a ``ModelResponse`` from that dump); read them with
:func:`local_call_details`. With ``logprobs=True`` (and ``top_logprobs=k``) the OpenAI-format
``choices[0].logprobs`` is filled as well.

Logit-level generation (:mod:`colab_graphs.models.logits`) goes through the same provider: pass
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
    >>> from colab_graphs.models.local import register_local_provider, local_call_details
    >>> register_local_provider()
    >>> r = litellm.completion(model="local/tiny-random", messages=[{"role": "user", "content": "hi"}],
    ...                        max_tokens=4, temperature=0)
    >>> len(local_call_details(r)["completion_token_ids"])
    4
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import colab_graphs._env  # noqa: F401  (offline settings before litellm / transformers load)
from colab_graphs.models.local_engine import GenerationRequest, GenerationResult, LocalEngine

PROVIDER = "local"
DETAILS_KEY = "colab_graphs"
DTYPES = ("float32", "bfloat16", "float16")

_engines: dict[tuple[str, str], LocalEngine] = {}
_named: dict[str, LocalEngine] = {}
_by_ref: dict[tuple[str, str], LocalEngine] = {}
_load_lock = threading.Lock()


def _default_device() -> str:
    import torch

    return os.environ.get("COLAB_GRAPHS_LOCAL_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def get_engine(model_ref: str, dtype: str = "float32") -> LocalEngine:
    """The engine serving ``model_ref``, loading the model on first use (once per process per path/dtype).

    Args:
        model_ref: A name registered with :func:`set_local_model`, a zoo name, a local folder (a model, or a
            LoRA adapter, served merged into its base) or a hub id; a leading ``local/`` is ignored.
        dtype: ``float32`` (default: batched greedy decoding gives the tokens batch-1 decoding gives),
            ``bfloat16`` or ``float16``.

    Returns:
        The engine; its ``.model`` and ``.tokenizer`` may be updated in place (e.g. by a trainer).
    """
    if dtype not in DTYPES:
        raise ValueError(f"local models are served in one of {', '.join(DTYPES)}, not {dtype!r}")
    ref = model_ref.removeprefix(f"{PROVIDER}/")
    if ref in _named:
        return _named[ref]
    if (ref, dtype) in _by_ref:  # skip resolving again (a hub id would hit the HF cache on every call)
        return _by_ref[ref, dtype]
    from colab_graphs.models.merge import served_folder

    path = str(served_folder(ref))  # an adapter folder is served merged into its base
    key = (path, dtype)
    with _load_lock:
        if key not in _engines:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
            model.to(_default_device()).eval()
            _engines[key] = LocalEngine(model, tokenizer, name=ref)
        _by_ref[ref, dtype] = _engines[key]
        return _engines[key]


def set_local_model(name: str, model: Any, tokenizer: Any) -> LocalEngine:
    """Serve an in-memory model as ``local/<name>`` (e.g. the policy a trainer is updating).

    Registering the same name again swaps the weights of the existing engine, so queued and later
    requests use the new model.
    """
    with _load_lock:
        engine = _named.get(name)
        if engine is None:
            engine = _named[name] = LocalEngine(model, tokenizer, name=name)
        else:
            with engine.lock:  # never swap in the middle of a batch
                engine.model, engine.tokenizer = model, tokenizer
    return engine


def unload(model_ref: str | None = None) -> None:
    """Forget loaded engines (all of them, or those for ``model_ref``) so their memory can be freed."""
    with _load_lock:
        if model_ref is None:
            gone = [*_engines.values(), *_named.values()]
        else:
            ref = model_ref.removeprefix(f"{PROVIDER}/")
            gone = [e for e in (*_engines.values(), *_named.values()) if e.name == ref]
        for table in (_engines, _named, _by_ref):
            for key in [k for k, e in table.items() if e in gone]:
                del table[key]
        for engine in gone:
            engine.close()


def local_call_details(response: Any) -> dict[str, list] | None:
    """Exact ``prompt_token_ids``, ``completion_token_ids`` and ``logprobs`` of a local-provider response.

    Accepts a litellm ``ModelResponse`` or its ``model_dump()``. Returns None for responses from other
    providers.
    """
    choices = response.get("choices") if isinstance(response, dict) else getattr(response, "choices", None)
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


def _provider_settings(optional_params: dict[str, Any], litellm_params: dict[str, Any] | None) -> dict:
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


def build_request(engine: LocalEngine, messages: list[dict], params: dict[str, Any]) -> GenerationRequest:
    """A :class:`GenerationRequest` from OpenAI-style sampling parameters."""
    max_tokens = params.get("max_tokens") or params.get("max_completion_tokens") or 256
    if int(max_tokens) < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    stop = params.get("stop") or ()
    temperature = params.get("temperature")
    top_logprobs = params.get("top_logprobs") or 0
    return GenerationRequest(
        prompt_ids=engine.render(messages),
        max_tokens=int(max_tokens),
        temperature=1.0 if temperature is None else float(temperature),
        top_p=1.0 if params.get("top_p") is None else float(params["top_p"]),
        seed=params.get("seed"),
        stop=[stop] if isinstance(stop, str) else list(stop),
        top_logprobs=int(top_logprobs),
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


def generate_response(
    model: str, messages: list[dict], params: dict[str, Any], litellm_params: dict | None = None
) -> Any:
    """Generate with ``local/<model>`` and build the response, blocking the calling thread."""
    settings = _provider_settings(params, litellm_params)
    engine = get_engine(model, _served_dtype(settings))
    if settings.get("logit_mode"):
        from colab_graphs.models.logits import generate_logit_level

        result = generate_logit_level(model, messages, params, settings)
    else:
        result = engine.generate(build_request(engine, messages, params))
    return to_model_response(model, engine.tokenizer, result, bool(params.get("logprobs")))


async def agenerate_response(
    model: str, messages: list[dict], params: dict[str, Any], litellm_params: dict | None = None
) -> Any:
    """Async :func:`generate_response`: model loading and decoding stay off the event loop."""
    import asyncio

    settings = _provider_settings(params, litellm_params)
    engine = await asyncio.to_thread(get_engine, model, _served_dtype(settings))
    if settings.get("logit_mode"):
        from colab_graphs.models.logits import generate_logit_level

        result = await asyncio.to_thread(generate_logit_level, model, messages, params, settings)
    else:
        request = await asyncio.to_thread(build_request, engine, messages, params)
        result = await engine.agenerate(request)
    return to_model_response(model, engine.tokenizer, result, bool(params.get("logprobs")))


def _handler_class() -> type:
    from litellm import CustomLLM

    class LocalProvider(CustomLLM):
        """LiteLLM custom handler: ``model`` arrives without the ``local/`` prefix."""

        async def acompletion(self, model, messages, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            return await agenerate_response(
                model, messages, kwargs.get("optional_params") or {}, kwargs.get("litellm_params")
            )

        def completion(self, model, messages, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
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
    from colab_graphs.models.zoo import resolve

    return resolve(model_ref.removeprefix(f"{PROVIDER}/"))
