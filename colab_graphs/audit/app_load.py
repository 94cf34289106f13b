"""Where an audited app comes from: a reference or an object, made as LangGraph's server makes a graph.

A reference names a module's variable (``path/to/file.py:NAME``, ``package.module:NAME``) or a graph of a
LangGraph deployment file (``path/to/langgraph.json:NAME``, see `deployment_ref`). The variable, or an object
given in Python, may be a compiled graph (a `StateGraph`'s or a Functional API `@entrypoint`), a `StateGraph`
(compiled here), or a graph factory, handled as LangGraph's server (``langgraph_api``) handles one: called
with no argument, or with a `RunnableConfig` when it takes one; what it returns awaited when it is a coroutine
(an ``async def`` factory), entered when it is a context manager (sync or async: a factory that opens the
app's resources, e.g. an `AsyncSqliteSaver`, and closes them at exit).

`open_app` makes the app on the running event loop (the loop the audit then plays on: an async saver is bound
to the loop it was made on), checks it before any call (its state mapping, `AppIO.resolve`; a checkpointer
without async methods, `refuse_sync_savers`) and exits the factory's context when the audit ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from colab_graphs.audit.app_contract import AppError, AppIO, entrypoint_function


def find_app(ref: str) -> tuple[Any, str, str, dict[str, Any]]:
    """(the variable a reference names, the reference as shown in errors, the name the app is reported
    under by default, its identity: the reference and its file's hash)."""
    from colab_graphs.resolve import ProtocolError, load_module

    where, sep, name = ref.rpartition(":")
    if not sep and ref.endswith(".json"):
        where, name = ref, ""
    elif not sep or not where or not name:
        raise AppError(
            f"app {ref!r}: expected path/to/file.py:NAME, package.module:NAME or path/to/langgraph.json:NAME"
        )
    shown, title = ref, name  # (a deployment's graph is reported under its name there)
    if where.endswith(".json"):
        where, name, title = deployment_ref(Path(where), name)
        shown = f"{ref} ({where}:{name})"
    try:
        module = load_module(where, kind="app")
    except ProtocolError as err:
        raise AppError(str(err)) from None
    if not hasattr(module, name):
        raise AppError(f"app {shown}: {where} defines no {name!r}")
    identity: dict[str, Any] = {"ref": ref}
    path = Path(getattr(module, "__file__", "") or "")
    if path.is_file():
        identity["source_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return getattr(module, name), shown, title, identity


def load_app(ref: str) -> tuple[Any, Any]:
    """The app a reference names, made here (a sync factory's only: an async one, or a context manager, is
    made where the audit runs, by `open_app`), and its `AppSpec` (no members, the default mapping)."""
    from colab_graphs.audit.app import AppSpec

    obj, shown, title, identity = find_app(ref)
    app = as_app(obj, shown)
    return app, AppSpec(app_name(app, title), [], identity)


def deployment_ref(path: Path, name: str) -> tuple[str, str, str]:
    """(module or file, variable, name) of graph `name` in a LangGraph deployment file (``langgraph.json``): its
    ``"graphs"`` mapping ``name -> "./path/to/file.py:variable"`` (a path relative to the file's folder) or
    ``"package.module:variable"``. No `name` takes the file's only graph. Local ``"dependencies"`` (``"."``,
    ``"./src"``) go on the import path, as LangGraph's server installs them, so the graph's own imports work."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AppError(f"app {path}:{name}: {path} does not exist") from None
    except (OSError, ValueError) as err:
        raise AppError(f"app {path}:{name}: {path} is not a readable JSON file: {err}") from None
    graphs = config.get("graphs") if isinstance(config, dict) else None
    if not isinstance(graphs, dict) or not graphs:
        raise AppError(f'{path}: no "graphs" mapping (name -> "./path/to/file.py:variable")')
    known = ", ".join(map(repr, graphs))
    if not name:
        if len(graphs) > 1:
            raise AppError(f"{path} has graphs {known}: name one ({path}:NAME)")
        name = next(iter(graphs))
    if name not in graphs:
        raise AppError(f"{path} has no graph {name!r}; its graphs: {known}")
    target = graphs[name]
    if isinstance(target, dict):  # {"path": "./file.py:var", "description": ...}
        target = target.get("path")
    where, sep, variable = str(target or "").rpartition(":")
    if not isinstance(target, str) or not sep or not where or not variable:
        raise AppError(f'{path}: graph {name!r} is {target!r}, expected "./path/to/file.py:variable"')
    folder = path.resolve().parent
    for dependency in config.get("dependencies") or ():
        if isinstance(dependency, str) and dependency.startswith((".", "/")):
            local = str((folder / dependency).resolve())
            if local not in sys.path:
                sys.path.insert(0, local)
    if where.endswith(".py") or where.startswith((".", "/")):
        where = str((folder / where).resolve())
    return where, variable, name


def app_name(app: Any, default: str = "app") -> str:
    """The name an audit reports an app under: the name it was compiled with (`compile(name=...)`), else an
    entrypoint's function name when `default` is the generic "app", else `default` (LangGraph names every
    graph "LangGraph" unless told otherwise)."""
    name = getattr(app, "name", None)
    if name and name != "LangGraph":
        return str(name)
    function = entrypoint_function(app) if default == "app" else None
    return str(getattr(function, "__name__", None) or default)


def _called(obj: Any) -> Any:
    """A graph factory's value (called with no argument, or with a `RunnableConfig` when it takes one, as
    LangGraph's server calls factories); any other object as it is."""
    from langgraph.graph import StateGraph

    if callable(obj) and not hasattr(obj, "ainvoke") and not isinstance(obj, StateGraph | type):
        return obj({"configurable": {}}) if _takes_an_argument(obj) else obj()
    return obj


def _deferred(value: Any) -> str | None:
    """What makes a factory's value need the running loop (a coroutine, a context manager), in words."""
    if inspect.isawaitable(value):
        return "a coroutine (an async factory)"
    if hasattr(value, "__aenter__") and hasattr(value, "__aexit__"):
        return "an async context manager"
    if hasattr(value, "__enter__") and hasattr(value, "__exit__") and not hasattr(value, "ainvoke"):
        return "a context manager"
    return None


def _graph(value: Any, what: str) -> Any:
    """The runnable app: a compiled graph as it is, a `StateGraph` compiled."""
    from langgraph.graph import StateGraph

    if isinstance(value, StateGraph):
        value = value.compile()
    if not hasattr(value, "ainvoke"):
        raise AppError(
            f"{what}: a {type(value).__name__}, expected a compiled LangGraph graph (or a StateGraph, or a "
            "function returning one, or an async function or a context manager giving one)"
        )
    return value


def as_app(obj: Any, what: str = "app") -> Any:
    """A runnable app from a compiled graph, a `StateGraph` or a sync factory of either. An async factory or
    a context manager is refused: it is made on the loop the audit runs on (`open_app`)."""
    value = _called(obj)
    deferred = _deferred(value)
    if deferred is not None:
        if inspect.iscoroutine(value):
            value.close()  # (never awaited here: closed, not left to warn)
        raise AppError(
            f"{what} gives {deferred}, made where the audit runs: pass it to run_audit / run (app=...) or "
            "--app, which await or enter it as LangGraph's server does (colab_graphs.audit.app_load.open_app)"
        )
    return _graph(value, what)


async def _made(obj: Any, what: str, stack: contextlib.AsyncExitStack) -> Any:
    """The runnable app from `obj`, on the running loop: a factory called, a coroutine awaited, a context
    manager entered (exited with `stack`), as LangGraph's server makes a graph. A factory that raises is an
    `AppError` naming the app and what it raised (a missing file, a database it cannot open)."""
    try:
        value = _called(obj)
        if inspect.isawaitable(value):
            value = await value
        if hasattr(value, "__aenter__") and hasattr(value, "__aexit__"):
            value = await stack.enter_async_context(value)
        elif _deferred(value) == "a context manager":
            value = stack.enter_context(value)
    except Exception as exc:  # noqa: BLE001 - the user's factory: whatever it raises is named, not a traceback
        raise AppError(f"{what}: its graph factory raised {type(exc).__name__}: {exc}") from exc
    return _graph(value, what)


def _takes_an_argument(factory: Any) -> bool:
    """Whether a graph factory takes an argument (a `RunnableConfig`, as LangGraph's server passes one)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.kind in positional and p.default is inspect.Parameter.empty for p in parameters)


# Async savers of LangGraph's sync ones: (class, module).
_ASYNC_SAVERS = {
    "SqliteSaver": ("AsyncSqliteSaver", "langgraph.checkpoint.sqlite.aio"),
    "PostgresSaver": ("AsyncPostgresSaver", "langgraph.checkpoint.postgres.aio"),
}


async def refuse_sync_savers(app: Any, what: str) -> None:
    """Raise `AppError` when the app (or a subgraph it holds as a node) has a checkpointer without async
    methods: LangGraph's `ainvoke`, which every play uses, raises NotImplementedError on one, and only after the
    audit had made calls. A saver is asked for a checkpoint of a thread of no play (`aget_tuple`, a read; the
    thread is deleted after): one without async methods raises NotImplementedError there. The message names the async saver and how to give
    it to the app."""
    from langgraph.checkpoint.base import BaseCheckpointSaver

    graphs = [app]
    with contextlib.suppress(Exception):  # (an app that cannot list its subgraphs: its own saver is checked)
        graphs += [graph for _, graph in app.get_subgraphs(recurse=True)]
    for graph in graphs:
        saver = getattr(graph, "checkpointer", None)
        if not isinstance(saver, BaseCheckpointSaver):
            continue
        thread = f"colab-graphs-probe-{uuid.uuid4().hex}"
        try:
            await saver.aget_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        except NotImplementedError:
            pass
        else:
            with contextlib.suppress(
                NotImplementedError
            ):  # (a read may leave an empty entry: InMemorySaver's)
                await saver.adelete_thread(thread)
            continue
        kind = type(saver).__name__
        name, module = _ASYNC_SAVERS.get(kind, (None, None))
        use = f"Use {name} (from {module})" if name else "Use an async saver (one with aget_tuple, aput, ...)"
        example = (
            f" (e.g. @contextlib.asynccontextmanager async def make_graph(): async with {name}.from_conn_string("
            "'checkpoints.sqlite') as saver: yield builder.compile(checkpointer=saver))"
            if name
            else ""
        )
        raise AppError(
            f"{what}: its checkpointer is a {kind} ({type(saver).__module__}), which has no async methods: "
            "LangGraph's ainvoke raises NotImplementedError on it, and an audit plays every coalition with "
            f"ainvoke. {use}, made on the running event loop: in an async graph factory{example}, named as the "
            "app (--app file.py:make_graph, app='file.py:make_graph', or in langgraph.json); the audit enters "
            "it as LangGraph's server does and exits it when the audit ends. Or compile the app without a "
            "checkpointer: each play runs on a fresh thread of its own"
        )


@contextlib.asynccontextmanager
async def open_app(
    app: str | Any, members: Sequence[str], io: AppIO | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """The app (a reference or an object, see the module docstring) made on the running loop, and its
    `AppSpec` over `members` (the pool's names, in pool order) with its mapping `io` (default "auto") resolved;
    both checked before any call. A factory's context is exited when this one is."""
    from colab_graphs.audit.app import AppSpec

    async with contextlib.AsyncExitStack() as stack:
        if isinstance(app, str):
            obj, shown, title, identity = find_app(app)
            the_app = await _made(obj, f"app {shown}", stack)
        else:
            the_app, title = await _made(app, "app", stack), "app"
            graph = the_app.get_graph() if hasattr(the_app, "get_graph") else None
            identity = {"nodes": sorted(graph.nodes) if graph is not None else []}
        name = app_name(the_app, title)
        the_io = (io or AppIO()).resolve(the_app, f"app {name!r}")
        await refuse_sync_savers(the_app, f"app {name!r}")
        yield the_app, AppSpec(name, list(members), identity, the_io.params(), io=the_io)
