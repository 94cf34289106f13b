"""Loading what every command shares: pool, data, protocol or user graph, client, parameters."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import typer

from colab_graphs.pool import Pool, PoolError
from colab_graphs.spec import GraphSpec


class UsageError(typer.BadParameter):
    pass


def fail(message: str, code: int = 2) -> None:
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def parse_params(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            fail(f"-P expects key=value, got {pair!r}")
        out[key.strip()] = value
    return out


def load_pool(path: Path | None) -> Pool:
    try:
        if path is None:
            from colab_graphs.defaults import default_pool

            return default_pool()
        return Pool.from_yaml(path)
    except PoolError as err:
        fail(str(err))
        raise


def load_data(source: str | None, limit: int | None, seed: int | None = None, split: str | None = None):
    from colab_graphs.data.loaders import load_examples

    if source is None:
        from colab_graphs.defaults import DEFAULT_DATA, DEFAULT_LIMIT

        source, limit = DEFAULT_DATA, limit or DEFAULT_LIMIT
    try:
        examples = load_examples(source, limit=limit, shuffle_seed=seed, split=split)
    except (ValueError, FileNotFoundError, ImportError, KeyError) as err:
        fail(str(err))
        raise
    if not examples:
        fail(f"{source}: no examples")
    return examples


def load_user_graph(ref: str, members: list[str], params: dict[str, Any]) -> GraphSpec:
    """`path/to/file.py:NAME`, NAME a GraphSpec, a builder `(members, **params) -> GraphSpec`, or a GraphBuilder."""
    path_s, sep, name = ref.rpartition(":")
    if not sep or not path_s or not name:
        fail(f"--graph expects path/to/file.py:NAME, got {ref!r}")
    path = Path(path_s)
    if not path.exists():
        fail(f"--graph: {path} does not exist")
    module_name = f"colab_graphs_user_{path.stem}"
    spec_obj = importlib.util.spec_from_file_location(module_name, path)
    assert spec_obj and spec_obj.loader
    module = importlib.util.module_from_spec(spec_obj)
    sys.modules[module_name] = module
    spec_obj.loader.exec_module(module)
    if not hasattr(module, name):
        fail(f"--graph: {path} defines no {name!r}")
    obj = getattr(module, name)
    from colab_graphs.builder import GraphBuilder

    if isinstance(obj, GraphSpec):
        if params:
            fail(f"--graph {ref}: -P parameters need a builder function, and {name} is a fixed GraphSpec")
        return obj
    if isinstance(obj, GraphBuilder):
        return obj.build()
    if callable(obj):
        from colab_graphs.protocols.registry import get_protocol

        try:
            info = get_protocol(name)
            if info.builder is obj:
                from colab_graphs.protocols.registry import build_protocol

                return build_protocol(name, members, **params)
        except KeyError:
            pass
        spec = obj(members, **params)
        if not isinstance(spec, GraphSpec):
            fail(f"--graph: {ref} returned {type(spec).__name__}, expected a GraphSpec")
        return spec
    fail(f"--graph: {ref} is a {type(obj).__name__}, expected a GraphSpec or a builder function")
    raise AssertionError


def resolve_protocol(
    protocol: str | None,
    graph: str | None,
    members: list[str],
    params: dict[str, Any],
    pool: Pool | None = None,
) -> GraphSpec:
    """The GraphSpec a command runs. Pool member descriptions fill a protocol's `descriptions` parameter."""
    from colab_graphs.spec import SpecError

    if protocol and graph:
        fail("give --protocol or --graph, not both")
    try:
        if graph:
            return load_user_graph(graph, members, params)
        from colab_graphs.defaults import DEFAULT_PROTOCOL
        from colab_graphs.protocols.registry import build_protocol, get_protocol

        name = protocol or DEFAULT_PROTOCOL
        if pool is not None and "descriptions" in get_protocol(name).params and "descriptions" not in params:
            described = {m.name: m.description for m in pool if m.description}
            if described:
                params = {**params, "descriptions": described}
        return build_protocol(name, members, **params)
    except (KeyError, ValueError, SpecError) as err:
        fail(str(err.args[0]) if isinstance(err, KeyError) else str(err))
        raise


def make_client(cache_dir: Path | None, no_cache: bool, max_concurrency: int, **kwargs: Any):
    from colab_graphs.models.cache import CallCache
    from colab_graphs.models.client import ModelClient

    cache = None if no_cache else CallCache(cache_dir)
    client = ModelClient(cache, max_concurrency=max_concurrency, **kwargs)
    freeze_startup_heap()
    return client


def freeze_startup_heap() -> None:
    """Hide what the command has loaded so far (modules, LiteLLM's price table) from the cyclic collector.

    A command holds tens of MB of long-lived objects before its first call, and every full collection walked
    them again: about 2 s of CPU in a 200-example vote audit (BENCHMARKS.md). `gc.freeze()` moves them to a
    permanent generation; what is allocated afterwards is collected as usual. A CLI process owns its heap;
    the library functions leave the collector alone.
    """
    import gc

    import litellm  # noqa: F401  (every call goes through it; its tables are the bulk worth freezing)

    gc.collect()
    gc.freeze()
