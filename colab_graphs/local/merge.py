"""Weight merging on state dicts, and a disk cache of merged models.

The operations behind the `weight` protocols (``colab_graphs.protocols.weight``). θ is a model's weights, every
floating tensor in fp32; τ_i = θ_i - θ_base is member i's task vector:

- ``linear``: Σ_i c_i θ_i. A uniform soup has c_i = 1/n; Model Swarms' particles are affine combinations.
- ``ties`` (Yadav et al., 2023): trim each τ_i to its ``density`` fraction of largest magnitudes, elect each
  entry's sign as the sign of Σ_i w_i τ_i (0 counts as +), and average the entries that agree with it:
  θ_base + Σ_i w_i τ_i [agrees] / Σ_i w_i [agrees] (entries no τ_i touches keep θ_base).
- ``dare`` (Yu et al., 2024): drop each entry of τ_i with probability ``drop_rate`` and rescale what is kept by
  1 / (1 - drop_rate); ``dare_ties`` is ``ties`` over the DARE-sparsified task vectors, so with drop rate 0 it
  is ``ties``.
- ``extrapolate`` (ExPO, Zheng et al., 2025): θ_aligned + α (θ_aligned - θ_reference).
- LoRA (LoraHub, Huang et al., 2024): adapters compose as A = Σ w_i A_i, B = Σ w_i B_i, and an adapter merges
  into its base as W + s B A with s = lora_alpha / r (lora_alpha / √r with rsLoRA).

Merged models are ordinary model folders under ``merges_home()``, named by a key over the operation, the
sha256 of every input's weights and the parameters; a folder is written once (atomically, one writer across
threads and processes) and found again by every later audit. ``stats`` counts the merges this process wrote.

mergekit (0.1.5) installs beside this project's pinned stack, but merging here is done on state dicts instead:
the search methods score many candidates that only ever live in memory, DARE needs a seeded draw (mergekit draws
from torch's global generator), and LoraHub is no mergekit method. ``ties`` equals mergekit's ``ties`` (checked
to the bit on the tiny models, densities 1 and 0.5); ``dare_ties`` equals mergekit's ``dare_ties`` with
``normalize: true``: mergekit's default for it sums the agreeing entries instead of averaging them, so its drop
rate 0 is not TIES, while the DARE paper applies TIES' disjoint mean after DARE, as here.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import colab_graphs._env  # noqa: F401  (offline settings before transformers loads)

State = dict[str, Any]  # parameter name -> torch.Tensor

ADAPTER_CONFIG = "adapter_config.json"
RECIPE_FILE = "colab_graphs_merge.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
# Fields of config.json that two models must share for their weights to be merged entry by entry.
ARCHITECTURE_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "tie_word_embeddings",
)


class MergeError(ValueError):
    """Weights that cannot be merged (other architectures, other adapter bases, unsupported adapters)."""


@dataclass
class Work:
    """Work this process did (merges written, fits computed; cache hits count nothing) and its seconds."""

    done: int = 0
    seconds: float = 0.0


stats = Work()


def merges_home() -> Path:
    """Where merged models live: ``$COLAB_GRAPHS_MERGE_DIR``, else ``merges/`` beside the zoo's ``models/``."""
    explicit = os.environ.get("COLAB_GRAPHS_MERGE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    from colab_graphs.local.zoo import models_home

    return models_home().parent / "merges"


# --- what a model is -----------------------------------------------------------------------------------------


def is_adapter(folder: Path) -> bool:
    """Whether ``folder`` holds a PEFT LoRA adapter (an ``adapter_config.json`` and no full model)."""
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def model_folder(ref: str) -> Path:
    """The folder behind a model reference (``local/`` prefix optional): a zoo name, a model or adapter folder."""
    ref = ref.removeprefix("local/")
    path = Path(ref).expanduser()
    if path.is_dir() and is_adapter(path):
        return path.resolve()
    from colab_graphs.local.zoo import resolve

    return resolve(ref)


def served_folder(ref: str) -> Path:
    """The full model folder the local provider loads for ``ref``: an adapter comes merged into its base."""
    folder = model_folder(ref)
    return merged_adapter_folder(folder) if is_adapter(folder) else folder


_identities: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


def identity(folder: Path) -> str:
    """sha256 of a folder's config and weights (remembered while the files keep their size and mtime)."""
    files = sorted(
        p for p in folder.iterdir() if p.is_file() and (p.suffix in _WEIGHT_SUFFIXES or p.suffix == ".json")
    )
    files = [p for p in files if p.name != RECIPE_FILE and not p.name.startswith("tokenizer")]
    stamp = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    key = (str(folder), stamp)
    if key not in _identities:
        digest = hashlib.sha256()
        for p in files:
            digest.update(p.name.encode() + b"\0")
            with p.open("rb") as fh:
                for block in iter(functools.partial(fh.read, 1 << 20), b""):
                    digest.update(block)
        _identities[key] = digest.hexdigest()
    return _identities[key]


def architecture(folder: Path) -> dict[str, Any]:
    """The config fields that decide whether two models' weights line up (an adapter: its base and LoRA shape)."""
    if is_adapter(folder):
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
        return {
            "base": identity(adapter_base(folder)),
            "r": config.get("r"),
            "lora_alpha": config.get("lora_alpha"),
            "use_rslora": bool(config.get("use_rslora")),
            "target_modules": sorted(config.get("target_modules") or []),
        }
    config = json.loads((folder / "config.json").read_text())
    return {f: config.get(f) for f in ARCHITECTURE_FIELDS}


def describe(arch: Mapping[str, Any]) -> str:
    if "base" in arch:
        return f"LoRA r={arch['r']} on {', '.join(arch['target_modules'])}, base {arch['base'][:12]}"
    return (
        f"{arch['model_type']}, hidden {arch['hidden_size']}, {arch['num_hidden_layers']} layers, "
        f"vocab {arch['vocab_size']}"
    )


def architecture_problems(folders: Mapping[str, Path]) -> list[str]:
    """One line per group of members whose architecture differs from the first member's ([] when all agree)."""
    archs = {name: architecture(folder) for name, folder in folders.items()}
    groups: dict[str, list[str]] = {}
    for name, arch in archs.items():
        groups.setdefault(json.dumps(arch, sort_keys=True), []).append(name)
    if len(groups) < 2:
        return []
    return [f"{', '.join(names)}: {describe(archs[names[0]])}" for names in groups.values()]


# --- state dicts ---------------------------------------------------------------------------------------------


def load_state(folder: Path) -> State:
    """A model folder's (or adapter folder's) weights; floating tensors in fp32."""
    import torch

    files = sorted(p for p in folder.iterdir() if p.suffix in _WEIGHT_SUFFIXES)
    if not files:
        raise MergeError(f"{folder}: no weight files (*.safetensors, *.bin)")
    state: State = {}
    for path in files:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state.update(load_file(str(path)))
        else:
            state.update(torch.load(path, map_location="cpu", weights_only=True))
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def _check_aligned(states: Sequence[State], names: Sequence[str]) -> None:
    first = states[0]
    for state, name in zip(states[1:], names[1:], strict=True):
        if state.keys() != first.keys():
            odd = sorted(state.keys() ^ first.keys())[:3]
            raise MergeError(f"{name} and {names[0]} hold different parameters (e.g. {', '.join(odd)})")
        for k, v in state.items():
            if v.shape != first[k].shape:
                raise MergeError(
                    f"{k}: {name} has shape {tuple(v.shape)}, {names[0]} {tuple(first[k].shape)}"
                )


def linear(states: Sequence[State], coefficients: Sequence[float]) -> State:
    """Σ_i c_i θ_i over floating tensors (others are the first state's)."""
    if len(states) != len(coefficients) or not states:
        raise ValueError("linear: one coefficient per state, at least one state")
    _check_aligned(states, [f"model {i}" for i in range(len(states))])
    out: State = {}
    for k, first in states[0].items():
        if not first.is_floating_point():
            out[k] = first.clone()
            continue
        acc = first.mul(coefficients[0])
        for state, c in zip(states[1:], coefficients[1:], strict=True):
            acc.add_(state[k], alpha=c)
        out[k] = acc
    return out


def soup(states: Sequence[State]) -> State:
    """The uniform average of ``states`` (a model soup)."""
    return linear(states, [1.0 / len(states)] * len(states))


def _trim(delta: Any, density: float) -> Any:
    """Keep the ``density`` fraction of ``delta``'s entries with the largest magnitude (TIES' trim)."""
    import torch

    if density >= 1.0:
        return delta
    k = int(density * delta.numel())
    if k <= 0:
        return torch.zeros_like(delta)
    threshold = delta.abs().flatten().kthvalue(delta.numel() - k + 1).values
    return torch.where(delta.abs() >= threshold, delta, torch.zeros_like(delta))


def dare(delta: Any, drop_rate: float, generator: Any) -> Any:
    """Drop each entry with probability ``drop_rate``; rescale the kept ones by 1 / (1 - drop_rate)."""
    import torch

    if not 0.0 <= drop_rate < 1.0:
        raise ValueError(f"drop_rate must be in [0, 1), got {drop_rate}")
    if drop_rate == 0.0:
        return delta
    keep = torch.rand(delta.shape, generator=generator) >= drop_rate
    return torch.where(keep, delta / (1.0 - drop_rate), torch.zeros_like(delta))


def ties(
    base: State,
    states: Sequence[State],
    weights: Sequence[float] | None = None,
    density: float = 1.0,
    *,
    sparsify: Callable[[str, int, Any], Any] | None = None,
) -> State:
    """TIES merging of ``states`` onto ``base`` (see the module docstring).

    Args:
        weights: one per state (default 1 each); the result is their weighted mean where signs agree.
        density: fraction of each task vector's entries kept by magnitude (1: all).
        sparsify: applied to each task vector before trimming, as ``sparsify(name, i, delta)`` (DARE).
    """
    import torch

    weights = list(weights) if weights is not None else [1.0] * len(states)
    if len(weights) != len(states) or not states:
        raise ValueError("ties: one weight per state, at least one state")
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density}")
    _check_aligned([base, *states], ["base", *(f"model {i}" for i in range(len(states)))])
    out: State = {}
    for k in sorted(base):
        b = base[k]
        if not b.is_floating_point():
            out[k] = b.clone()
            continue
        weighted = []  # w_i τ_i, sparsified and trimmed
        for i, (state, w) in enumerate(zip(states, weights, strict=True)):
            delta = state[k] - b
            if sparsify is not None:
                delta = sparsify(k, i, delta)
            weighted.append(_trim(delta, density).mul_(w))
        elected = weighted[0].clone()
        for wd in weighted[1:]:
            elected.add_(wd)
        positive = elected >= 0  # the elected sign of Σ w_i τ_i (0 counts as +)
        total = torch.zeros_like(b)
        divisor = torch.zeros_like(b)
        for wd, w in zip(weighted, weights, strict=True):
            agree = torch.where(positive, wd > 0, wd < 0)  # zero entries agree with no sign
            total.add_(torch.where(agree, wd, 0.0))
            divisor.add_(agree.to(b.dtype), alpha=w)
        out[k] = total.div_(torch.where(divisor == 0, 1.0, divisor)).add_(b)
    return out


def dare_ties(
    base: State,
    states: Sequence[State],
    weights: Sequence[float] | None = None,
    *,
    drop_rate: float,
    density: float = 1.0,
    seed: int = 0,
) -> State:
    """TIES over DARE-sparsified task vectors; the draw is seeded (parameters in name order, states in order)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return ties(
        base, states, weights, density, sparsify=lambda _k, _i, delta: dare(delta, drop_rate, generator)
    )


def extrapolate(aligned: State, reference: State, alpha: float) -> State:
    """ExPO: θ_aligned + α (θ_aligned - θ_reference)."""
    return linear([aligned, reference], [1.0 + alpha, -alpha])


# --- LoRA adapters -------------------------------------------------------------------------------------------


def adapter_config(folder: Path) -> dict[str, Any]:
    """An adapter's config, refused when it is not a plain LoRA adapter this module can merge exactly."""
    config: dict[str, Any] = json.loads((folder / ADAPTER_CONFIG).read_text())
    problems = []
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        problems.append(f"peft_type {config.get('peft_type')!r}")
    for flag in ("use_dora", "fan_in_fan_out"):
        if config.get(flag):
            problems.append(flag)
    for pattern in ("rank_pattern", "alpha_pattern"):
        if config.get(pattern):
            problems.append(pattern)
    if config.get("modules_to_save"):
        problems.append("modules_to_save")
    if problems:
        raise MergeError(f"{folder}: only plain LoRA adapters can be merged here (has {', '.join(problems)})")
    return config


def adapter_base(folder: Path) -> Path:
    """The full model folder an adapter was trained on (``base_model_name_or_path``: a folder or zoo name)."""
    base = adapter_config(folder).get("base_model_name_or_path")
    if not base:
        raise MergeError(f"{folder}: {ADAPTER_CONFIG} names no base_model_name_or_path")
    return model_folder(str(base))


def lora_deltas(adapter: State, config: Mapping[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(adapter key, base weight name, s B A) for every module a LoRA adapter adapts."""
    r = int(config["r"])
    alpha = float(config.get("lora_alpha", r))
    scale = alpha / (r**0.5) if config.get("use_rslora") else alpha / r
    for key, a in adapter.items():
        if ".lora_A." not in key:
            continue
        target = key.split(".lora_A.")[0].removeprefix("base_model.model.") + ".weight"
        yield key, target, scale * (adapter[key.replace(".lora_A.", ".lora_B.")] @ a)


def apply_adapter(base: State, adapter: State, config: Mapping[str, Any]) -> State:
    """``base`` with a LoRA adapter merged in: W + s B A for every adapted module."""
    out = {k: v.clone() for k, v in base.items()}
    for key, target, delta in lora_deltas(adapter, config):
        if target not in out:
            raise MergeError(f"adapter module {key} has no weight {target} in its base model")
        out[target] = out[target] + delta
    return out


def compose_adapters(adapters: Sequence[State], weights: Sequence[float]) -> State:
    """LoraHub's composition: every A and every B is the weighted sum of the adapters' (``linear``)."""
    return linear(adapters, weights)


def merged_adapter_folder(folder: Path) -> Path:
    """A full model folder of ``folder``'s adapter merged into its base (made once, cached)."""
    base = adapter_base(folder)
    config = adapter_config(folder)

    def build() -> State:
        return apply_adapter(load_state(base), load_state(folder), config)

    return materialise("adapter", [folder, base], {}, build, like=base)


# --- the cache of merged folders -----------------------------------------------------------------------------


def merge_key(op: str, inputs: Sequence[Path], params: Mapping[str, Any]) -> str:
    """The key of a merge: its operation, every input's weights (sha256) and its parameters."""
    blob = json.dumps(
        {"op": op, "inputs": [identity(p) for p in inputs], "params": params}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def merged_folder(op: str, inputs: Sequence[Path], params: Mapping[str, Any]) -> Path:
    return merges_home() / f"{op}-{merge_key(op, inputs, params)}"


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def materialise(
    op: str,
    inputs: Sequence[Path],
    params: Mapping[str, Any],
    build: Callable[[], State],
    *,
    like: Path,
) -> Path:
    """The folder of this merge, building it with ``build()`` the first time (config and tokenizer from ``like``)."""
    target = merged_folder(op, inputs, params)
    if (target / RECIPE_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locks_guard:
        lock = _locks.setdefault(target.name, threading.Lock())
    with lock, open(target.parent / f".{target.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        if (target / RECIPE_FILE).is_file():
            return target
        started = time.perf_counter()
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            save_model(build(), like=like, out=staging)
            elapsed = time.perf_counter() - started
            recipe: dict[str, Any] = {
                "op": op,
                "inputs": [str(p) for p in inputs],
                "params": dict(params),
                "like": str(like),
            }
            recipe["merge_s"] = round(elapsed, 3)
            (staging / RECIPE_FILE).write_text(json.dumps(recipe, indent=2, default=str) + "\n")
            if target.exists():
                shutil.rmtree(target)  # a folder a crash left without its recipe
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        stats.done += 1
        stats.seconds += elapsed
    return target


def save_model(state: State, *, like: Path, out: Path) -> None:
    """Write ``state`` as ``out/model.safetensors`` beside ``like``'s config, tokenizer and generation files."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for path in like.iterdir():
        weights = path.suffix in _WEIGHT_SUFFIXES or path.name.endswith(".index.json")
        if path.is_file() and not weights and path.name not in (RECIPE_FILE, "colab_graphs_zoo.json"):
            shutil.copy2(path, out / path.name)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), {"format": "pt"})


def instantiate(like: Path, state: State) -> tuple[Any, Any]:
    """An fp32 model of ``like``'s architecture holding ``state`` (tied weights stay tied), and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(like, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    if unexpected or any(k not in tied and not k.startswith("lm_head") for k in missing):
        raise MergeError(
            f"merged weights do not fit {like}: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    return model.eval(), AutoTokenizer.from_pretrained(like)
