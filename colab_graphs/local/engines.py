"""The engines that serve ``local/<name>`` models in this process: one per model path and dtype, loaded on first use.

:mod:`colab_graphs.local.provider` (the LiteLLM provider) and the logit-level modules
(:mod:`colab_graphs.local.logits`, :mod:`colab_graphs.local.guided`) all take their engines from here, so a
model loaded for an ordinary call is the one a logit-level protocol decodes with.
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any

import colab_graphs._env  # noqa: F401  (offline settings before transformers loads)
from colab_graphs.local.local_engine import LocalEngine

PROVIDER = "local"
DTYPES = ("float32", "bfloat16", "float16")

_engines: dict[tuple[str, str], LocalEngine] = {}
_named: dict[str, LocalEngine] = {}
_versions: dict[str, str] = {}  # name served from memory -> a token renewed whenever its weights are swapped
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
    from colab_graphs.local.merge import served_folder

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
        _versions[name] = uuid.uuid4().hex
        engine = _named.get(name)
        if engine is None:
            engine = _named[name] = LocalEngine(model, tokenizer, name=name)
        else:
            with engine.lock:  # never swap in the middle of a batch
                engine.model, engine.tokenizer = model, tokenizer
    return engine


def memory_version(name: str) -> str | None:
    """The token of the weights served from memory as ``local/<name>`` (renewed by each `set_local_model`), or
    None when no model is served from memory under that name. The call cache keys on it: the weights of a model
    in memory have no name that outlives them."""
    return _versions.get(name)


def unload(model_ref: str | None = None) -> None:
    """Forget loaded engines (all of them, or those for ``model_ref``) so their memory can be freed."""
    with _load_lock:
        if model_ref is None:
            gone = [*_engines.values(), *_named.values()]
        else:
            ref = model_ref.removeprefix(f"{PROVIDER}/")
            gone = [e for e in (*_engines.values(), *_named.values()) if e.name == ref]
        for name in [k for k, e in _named.items() if e in gone]:
            _versions.pop(name, None)
            del _named[name]
        for table in (_engines, _by_ref):
            for key in [k for k, e in table.items() if e in gone]:
                del table[key]
        for engine in gone:
            engine.close()
