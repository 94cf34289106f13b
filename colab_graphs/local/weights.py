"""The identity of the weights the in-process provider would load for a model reference (the call cache keys
on it: `colab_graphs.models.identity`): a zoo model's name and pinned hash, a folder's content hash, an adapter's
with its base's, a model served from memory a token that changes whenever its weights are swapped."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path


def weights_identity(ref: str) -> str:
    """What the local provider would load for `ref`: memory, a zoo model, a folder, an adapter, a hub id."""
    from colab_graphs.local import engines, zoo

    ref = ref.removeprefix("local/")
    in_memory = engines.memory_version(ref)
    if in_memory is not None:
        return f"memory:{ref}:{in_memory}"
    entry = next((e for e in zoo.list_models() if e.name == ref), None)
    if entry is not None:
        return entry.identity
    path = Path(ref).expanduser()
    if not path.is_dir():
        hub = _hub_folder(ref)
        if hub is None:
            return f"unresolved:{ref}"  # the call itself will fail, naming why; nothing stored matches this
        path = hub
    return folder_identity(path.resolve())


@functools.lru_cache(maxsize=64)
def _hub_folder(ref: str) -> Path | None:
    """A hub id's snapshot folder (resolved once per process, as the engine resolves it once)."""
    from colab_graphs.local import zoo

    try:
        return zoo.resolve(ref)
    except FileNotFoundError:
        return None


def folder_identity(folder: Path) -> str:
    """``folder:<sha256>`` over a model folder's config, weights, tokenizer and chat template, or
    ``adapter:<sha256>+<base identity>`` for a LoRA adapter (its base named by the adapter's config)."""
    from colab_graphs.local import merge

    digest = hashlib.sha256(merge.identity(folder).encode())
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.name.startswith(("tokenizer", "chat_template", "special_tokens"))):
            digest.update(path.name.encode() + b"\0" + _file_digest(path).encode())
    if merge.is_adapter(folder):
        base = json.loads((folder / merge.ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
        return f"adapter:{digest.hexdigest()[:32]}+{weights_identity(str(base)) if base else 'no-base'}"
    return f"folder:{digest.hexdigest()[:32]}"


_file_digests: dict[tuple[str, int, int], str] = {}


def _file_digest(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _file_digests:
        _file_digests[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _file_digests[key]
