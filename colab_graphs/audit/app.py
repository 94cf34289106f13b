"""Audits of a user's own LangGraph app: v(S) = the app's score when only the members in S answer.

The app is any compiled LangGraph graph (a supervisor with workers, a ReAct agent, a planner and critic) whose
model calls use `colab_graphs.member_chat_model(NAME)`. It takes ``{"input": question}`` and its final state
holds ``answer``, as a compiled protocol's does; the example's task scores that answer as it scores a
protocol's. The game plays the app once per coalition and example, with the coalition, the pool, the client,
the trace and the example's call memo bound around the run (`bind_members`), so every call goes through the
call path and identical calls are made once across coalitions (calls made = distinct requests, as for
protocols). A member outside the coalition follows its declared rule (`member_chat_model(..., on_absent=)`):
raise `MemberAbsent` (the default: an app may catch it, e.g. a supervisor skipping that worker), answer
empty, or substitute another member. A `MemberAbsent` the app does not catch ends that run without an
answer (scored as an empty answer, and the play records the member and the node: `ended_by_absent`; every
absent member a call asked for, and what its rule did, is in the play's `absent`); any other exception the
app raises fails the example (reported, not scored), as a failed call does.

Sync and async apps alike, at any concurrency: sync nodes and tools run in the loop's executor while every
model call runs on the call path's own loop (`colab_graphs.models.loops`), so a sync node waiting for its
reply never holds a thread that the reply needs. Each play has a deadline (`--example-timeout`, 600 s by
default): a play past it fails, its error naming the nodes running and the calls pending; a watchdog logs
what every play waits for when no call and no node has finished for a while (`colab_graphs.watch`). The empty coalition scores 0; each member's individual strength is its
`solo` score, as in every audit.

What is hooked where: `AppGame` is a `CoalitionGame` whose coalition graphs are the app bound to a coalition
(it overrides `_graph` and `_fit`); `play_audit(..., game=AppGame(...))` plays it and writes the usual
report, log and plots.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colab_graphs.audit.game import CoalitionGame, coalition_id
from colab_graphs.data.example import Example
from colab_graphs.models.binding import MemberAbsent, MemberBinding, bind_members
from colab_graphs.models.client import CallError, ModelClient
from colab_graphs.pool import Pool
from colab_graphs.watch import APP_EXAMPLE_TIMEOUT_S, current_watch, node_tracker


class AppError(ValueError):
    """An app reference or object that cannot be audited; the message names it and says why."""


@dataclass(frozen=True)
class AppSpec:
    """What an audit records about an app (the report's `protocol`, the log's header): its name, the players,
    and what identifies it (a file's hash when it came from one), so a changed app is not resumed as the
    same audit. It has no graph spec: the viewer shows its calls in the order they were made."""

    name: str
    members: list[str]
    identity: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    empty_fallback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"app": self.name, **self.identity}

    def restricted(self, members: Sequence[str]) -> AppSpec:
        return AppSpec(self.name, list(members), self.identity, self.params)


class AppGraph:
    """The app bound to one coalition, with the `ainvoke(state, config, context=RunContext)` the runner calls."""

    def __init__(self, app: Any, name: str, coalition: Sequence[str]):
        self.app = app
        self.name = name
        self.coalition = frozenset(coalition)

    async def ainvoke(self, state: dict[str, Any], config: Any = None, *, context: Any) -> dict[str, Any]:
        binding = MemberBinding(
            pool=context.pool,
            client=context.client,
            coalition=self.coalition,
            trace=context.trace,
            memo=context.memo,
            loop=asyncio.get_running_loop(),
        )
        watch = current_watch()
        if watch is not None:  # the nodes it runs tell the play's watch (what a stalled play waits for)
            config = {**(config or {}), "callbacks": [node_tracker(watch)]}
        with bind_members(binding):
            try:
                final = await self.app.ainvoke({"input": state["input"]}, config)
            except MemberAbsent as absent:
                # Scored as an empty answer, as the contract says, and visibly: the play records who and where.
                ended = {"member": absent.member, "node": absent.node}
                if context.trace is not None:
                    context.trace.ended_by_absent = ended  # type: ignore[attr-defined]  (a play's extra field)
                return {**state, "answer": ""}
            except CallError:
                raise
            except Exception as exc:  # noqa: BLE001 - the app's own failure fails the example, reported
                message = f"the app raised {type(exc).__name__}: {exc}"
                raise CallError("app", message, self.name, 1) from exc
        return {**state, "answer": answer_text(final)}


def answer_text(final: Any) -> str:
    """The final state's `answer` as text (a message's text when the app stored a message)."""
    answer = final.get("answer") if isinstance(final, dict) else getattr(final, "answer", None)
    if answer is None:
        return ""
    text = getattr(answer, "text", None)
    if text is not None and not isinstance(answer, str):
        return text() if callable(text) else str(text)
    return str(answer)


class AppGame(CoalitionGame):
    """The coalition game of an app (see the module docstring). Arguments as `CoalitionGame`'s, with the app
    (a compiled LangGraph graph) and its `AppSpec` instead of a protocol."""

    def __init__(
        self,
        app: Any,
        spec: AppSpec,
        pool: Pool,
        examples: Sequence[Example],
        *,
        client: ModelClient,
        scorer: str | None = None,
        store: str | os.PathLike[str] | None = None,
        dataset: str | None = None,
    ):
        self.app = app
        super().__init__(
            spec,  # type: ignore[arg-type]  (an AppSpec stands where the game reads a spec's name and members)
            pool,
            examples,
            client=client,
            scorer=scorer,
            store=store,
            dataset=dataset,
        )

    default_example_timeout = APP_EXAMPLE_TIMEOUT_S
    """An app's plays have a deadline by default: a sync node waiting forever must not hang the audit."""

    def _graph(self, game: str, members: list[str]) -> tuple[Any, Any]:
        if game == "solo":
            return super()._graph(game, members)
        cid = coalition_id(game, members)
        if cid not in self._graphs:
            spec = self.spec.restricted(members) if members else None  # type: ignore[attr-defined]
            graph = AppGraph(self.app, self.spec.name, members) if members else None
            self._graphs[cid] = (spec, graph)
        return self._graphs[cid]

    async def _fit(self, game: str, members: list[str]) -> None:
        """Apps have no fit step."""


def load_app(ref: str) -> tuple[Any, AppSpec]:
    """The app a reference names (``path/to/file.py:NAME`` or ``package.module:NAME``) and its identity.

    NAME may be a compiled graph, a `StateGraph` (compiled here), or a function of no arguments returning
    either (called here).
    """
    from colab_graphs.resolve import ProtocolError, load_module

    where, sep, name = ref.rpartition(":")
    if not sep or not where or not name:
        raise AppError(f"app {ref!r}: expected path/to/file.py:NAME or package.module:NAME")
    try:
        module = load_module(where, kind="app")
    except ProtocolError as err:
        raise AppError(str(err)) from None
    if not hasattr(module, name):
        raise AppError(f"app {ref!r}: {where} defines no {name!r}")
    app = as_app(getattr(module, name), ref)
    identity: dict[str, Any] = {"ref": ref}
    path = Path(getattr(module, "__file__", "") or "")
    if path.is_file():
        identity["source_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return app, AppSpec(app_name(app, name), [], identity)


def app_name(app: Any, default: str = "app") -> str:
    """The name an audit reports an app under: the name it was compiled with (`compile(name=...)`), else
    `default` (LangGraph names every graph "LangGraph" unless told otherwise)."""
    name = getattr(app, "name", None)
    return str(name) if name and name != "LangGraph" else default


def as_app(obj: Any, what: str = "app") -> Any:
    """A runnable app from a compiled graph, a `StateGraph` or a zero-argument factory of either."""
    from langgraph.graph import StateGraph

    if callable(obj) and not hasattr(obj, "ainvoke") and not isinstance(obj, StateGraph | type):
        obj = obj()
    if isinstance(obj, StateGraph):
        obj = obj.compile()
    if not hasattr(obj, "ainvoke"):
        raise AppError(
            f"{what}: a {type(obj).__name__}, expected a compiled LangGraph graph (or a StateGraph, or a "
            "function returning one)"
        )
    return obj


def resolve_app(app: str | Any, members: Sequence[str]) -> tuple[Any, AppSpec]:
    """The app (a reference ``file.py:NAME`` / ``module:NAME``, or an app object) and its `AppSpec` over
    `members` (the pool's names, in pool order)."""
    if isinstance(app, str):
        the_app, spec = load_app(app)
    else:
        the_app = as_app(app)
        graph = the_app.get_graph() if hasattr(the_app, "get_graph") else None
        nodes = sorted(graph.nodes) if graph is not None else []
        spec = AppSpec(app_name(the_app), [], {"nodes": nodes})
    return the_app, AppSpec(spec.name, list(members), spec.identity)
