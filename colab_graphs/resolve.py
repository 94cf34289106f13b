"""From what a user names to the GraphSpec that runs: a registered protocol, or a graph of their own.

One resolution for the CLI, the Python API and training: a protocol name (parameters coerced to their types;
pool members' descriptions fill a router's `descriptions` when not given), or a graph reference
``path/to/file.py:NAME`` / ``package.module:NAME`` where NAME is a GraphSpec, a GraphBuilder, or a builder
``(members, **params) -> GraphSpec`` (a registered builder gets its parameters coerced too).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from colab_graphs.builder import GraphBuilder
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol, get_protocol
from colab_graphs.registry import load_plugins, registry_find
from colab_graphs.spec import GraphSpec


class ProtocolError(ValueError):
    """What to run could not be resolved; the message names the protocol, file or object at fault."""


def resolve_protocol(
    protocol: str | None = None,
    members: list[str] | None = None,
    params: dict[str, Any] | None = None,
    *,
    graph: str | None = None,
    pool: Pool | None = None,
) -> GraphSpec:
    """The GraphSpec to run: protocol `protocol` (default: the embedded default's) or the graph `graph`.

    Args:
        protocol: a registered protocol name.
        members: the members it runs over, in pool order (default: the pool's).
        params: protocol parameters (strings are coerced to each parameter's type).
        graph: ``path/to/file.py:NAME`` or ``package.module:NAME`` instead of a protocol.
        pool: the pool; its members' descriptions fill `descriptions` when the protocol takes them.

    Raises:
        ProtocolError: both or an unknown one given, a bad reference, a builder that returns no GraphSpec,
            invalid parameters (each message names the culprit).
    """
    if protocol and graph:
        raise ProtocolError("give a protocol or a graph, not both")
    names = list(members if members is not None else (pool.names if pool is not None else []))
    params = dict(params or {})
    try:
        if graph:
            return load_graph(graph, names, params)
        from colab_graphs.defaults import DEFAULT_PROTOCOL

        name = protocol or DEFAULT_PROTOCOL
        if pool is not None and "descriptions" in get_protocol(name).params and "descriptions" not in params:
            described = {m.name: m.description for m in pool if m.description}
            if described:
                params["descriptions"] = described
        return build_protocol(name, names, **params)
    except KeyError as err:
        raise ProtocolError(str(err.args[0])) from None
    except ProtocolError:
        raise
    except ValueError as err:
        raise ProtocolError(str(err)) from None


def load_graph(ref: str, members: list[str], params: dict[str, Any]) -> GraphSpec:
    """The GraphSpec of a graph reference (see the module docstring)."""
    where, sep, name = ref.rpartition(":")
    if not sep or not where or not name:
        raise ProtocolError(f"graph {ref!r}: expected path/to/file.py:NAME or package.module:NAME")
    module = load_module(where)
    obj = getattr(module, name, None)
    if obj is None:
        raise ProtocolError(f"graph {ref!r}: {where} defines no {name!r}")
    if isinstance(obj, GraphSpec):
        if params:
            raise ProtocolError(
                f"graph {ref!r}: parameters need a builder function; {name} is a fixed GraphSpec"
            )
        return obj
    if isinstance(obj, GraphBuilder):
        return obj.build()
    if not callable(obj):
        raise ProtocolError(
            f"graph {ref!r}: a {type(obj).__name__}, expected a GraphSpec or a builder function"
        )
    registered = next((i.name for i in registry_find("protocol") if i.obj is obj), None)
    spec = build_protocol(registered, members, **params) if registered else obj(members, **params)
    if not isinstance(spec, GraphSpec):
        raise ProtocolError(f"graph {ref!r} returned a {type(spec).__name__}, expected a GraphSpec")
    return spec


def load_module(where: str, kind: str = "graph") -> Any:
    """The module a reference's `where` names: a Python file (``path/to/file.py``) or an importable module.
    Errors name the `kind` of reference ("graph", "app") and the file or module.

    The plugins load first, so a protocol the module registers under a plugin's name is refused there, naming
    both (`colab_graphs.registry.NameClash`), rather than breaking the plugin's load later.
    """
    load_plugins()
    path = Path(where)
    if path.suffix != ".py" and not path.exists():
        try:
            return importlib.import_module(where)
        except ImportError as err:
            raise ProtocolError(f"{kind}: cannot import {where!r}: {err}") from None
    if not path.exists():
        raise ProtocolError(f"{kind}: {path} does not exist")
    module_name = f"colab_graphs_user_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ProtocolError(f"{kind}: {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
