"""Loading what every command shares: pool, data, protocol or user graph, client, parameters."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import typer

from colab_graphs.pool import Pool, PoolError
from colab_graphs.spec import GraphSpec


class UsageError(typer.BadParameter):
    pass


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `message` (secrets redacted: an error may quote a provider that echoed a key) and exit."""
    from rich.console import Console
    from rich.markup import escape

    from colab_graphs.redaction import redact

    # soft_wrap: one line, folded by the terminal if at all; folded by Rich, a path the message names would be
    # cut by a newline wherever the width (80 when not a terminal: CI logs) falls inside it.
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(redact(message))}", highlight=False
    )
    raise typer.Exit(code)


@contextlib.contextmanager
def holding_out(out: Path) -> Iterator[None]:
    """Hold the output folder `out` while the command writes it; a second writer is refused (exit 5)."""
    from colab_graphs.files import FolderBusy, OutLock

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(OutLock(out, " ".join(["colab-graphs", *sys.argv[1:]])))
        except FolderBusy as err:
            fail(str(err), code=FolderBusy.exit_code)
        yield


def check_sandbox(examples: Any, scorer: Any, setting: str | None) -> dict[str, Any] | None:
    """Fail closed before the first call: where any example is scored by code, the sandbox `setting` (else env,
    else auto) must be met here (`colab_graphs.tasks.scoring.require_sandbox`); else exit 6 with what is missing and
    the ways out. Returns the sandbox record (None: no code scores)."""
    from colab_graphs.sandbox import SandboxUnavailable, scope
    from colab_graphs.tasks.scoring import require_sandbox

    try:
        return require_sandbox(examples, scorer, setting)
    except SandboxUnavailable as err:
        fail(str(err), code=scope.EXIT_CODE)


def parse_params(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            fail(f"-P expects key=value, got {pair!r}")
        out[key.strip()] = value
    return out


def load_pool(path: Path | None) -> Pool:
    """The pool file `path` (None: the embedded default), as `colab_graphs.api.as_pool` reads it; a problem is
    a usage error naming the file and line."""
    from colab_graphs.api import as_pool

    try:
        return as_pool(path)
    except PoolError as err:
        fail(str(err))


def load_data(
    source: str | None,
    limit: int | None,
    seed: int | None = None,
    scorer: str | None = None,
    fields: dict[str, str] | None = None,
    split: str | None = None,
):
    """The examples of `source` (None: the embedded default), as `colab_graphs.api.as_examples` reads them
    (`fields`: Example field -> record field; `split`); a problem (file:line where a record is wrong) is a
    usage error, and so is a source with no examples."""
    from colab_graphs.api import as_examples
    from colab_graphs.defaults import DEFAULT_DATA

    if source is None and (fields or split):
        fail("--split and --*-field options map the records of --data: give --data")
    try:
        examples = as_examples(source, limit=limit, seed=seed, scorer=scorer, fields=fields, split=split)
    except (ValueError, FileNotFoundError, ImportError, KeyError) as err:
        fail(str(err))
    if not examples:
        fail(f"{source or DEFAULT_DATA}: no examples")
    return examples


def resolve_protocol(
    protocol: str | None,
    graph: str | None,
    members: list[str],
    params: dict[str, Any],
    pool: Pool | None = None,
) -> GraphSpec:
    """The GraphSpec a command runs (`colab_graphs.resolve`); a problem is a usage error."""
    from colab_graphs.resolve import ProtocolError
    from colab_graphs.resolve import resolve_protocol as resolve
    from colab_graphs.spec import SpecError

    try:
        return resolve(protocol, members, params, graph=graph, pool=pool)
    except (ProtocolError, SpecError) as err:
        fail(str(err))


def make_client(
    cache_dir: Path | None, no_cache: bool, max_concurrency: int, *, preflight: bool = True, **kwargs: Any
):
    """The command's call path: the call cache (unless `no_cache`), and the pre-flight check of endpoints."""
    from colab_graphs.models.cache import CacheError, CallCache
    from colab_graphs.models.client import ModelClient

    try:
        cache = None if no_cache else CallCache(cache_dir)
    except CacheError as err:
        fail(str(err))
    client = ModelClient(cache, max_concurrency=max_concurrency, preflight=preflight, **kwargs)
    freeze_startup_heap()
    return client


def freeze_startup_heap() -> None:
    """Hide what the command has loaded so far (modules) from the cyclic collector, and LiteLLM's modules and
    price table too once a call loads them.

    A command holds tens of MB of long-lived objects before its first call, and every full collection walked
    them again: about 2 s of CPU in a 200-example vote audit (BENCHMARKS.md). `gc.freeze()` moves them to a
    permanent generation; what is allocated afterwards is collected as usual. LiteLLM is loaded later, if at
    all (by a call that goes through it, or the first look-up of a price in its map), so the first full
    collection that finds it loaded freezes the heap again (a collector callback, registered once per process).
    A CLI process owns its heap; the library functions leave the collector alone.
    """
    import gc

    gc.collect()
    gc.freeze()
    if _litellm_watch:
        return
    frozen_again: list[bool] = []
    modules = sys.modules

    def once_litellm_is_loaded(phase: str, info: dict[str, int]) -> None:
        # (gc and the module table from the closure: collections still run at interpreter exit, when nothing
        # can be imported and module globals may be gone. Left registered: removing a callback while the
        # collector runs them skips the next one.) Full collections run during LiteLLM's import too, while its
        # module is in the table and its spec initializing.
        if frozen_again or phase != "stop" or info["generation"] != 2:
            return
        litellm = modules.get("litellm")
        if litellm is not None and not getattr(litellm.__spec__, "_initializing", False):
            frozen_again.append(True)
            gc.freeze()

    _litellm_watch.append(once_litellm_is_loaded)
    gc.callbacks.append(once_litellm_is_loaded)


_litellm_watch: list[Callable[[str, dict[str, int]], None]] = []  # the callback, once registered
