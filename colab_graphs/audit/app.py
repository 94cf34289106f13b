"""Audits of a user's own LangGraph app: v(S) = the app's score when only the members in S answer.

The app is any compiled LangGraph graph (a supervisor with workers, a ReAct agent, a planner and critic, a
Functional API `@entrypoint`) whose model calls use `colab_graphs.member_chat_model(NAME)`, named by a
reference (``file.py:NAME``, ``module:NAME``, or ``langgraph.json:NAME``: a graph of LangGraph's deployment
file) or given as an object, or a graph factory (sync, async or a context manager, made as LangGraph's server
makes one: `colab_graphs.audit.app_load`). By default it takes ``{"input": question}`` and its final state holds
``answer``, as a compiled protocol's does; its own keys, a `MessagesState` app's messages, or an entrypoint
taking the question itself and returning its answer are mapped by an `AppIO` (`colab_graphs.audit.app_contract`:
``--input-key`` / ``--answer-key`` / ``--mode``), checked against the app before any call. The example's task
scores that answer as it scores a protocol's. Each play runs on a fresh ``thread_id`` (an app compiled with a
checkpointer is audited unchanged; one without async methods is refused before any call), and an `interrupt()`
is an error naming its node and the coalition that reached it.

The game plays the app once per coalition and example, with the coalition, the pool, the client, the trace
and the example's call memo bound around the run (`bind_members`), so every call goes through the call path
and identical calls are made once across coalitions (calls made = distinct requests, as for
protocols). A member outside the coalition follows its declared rule (`member_chat_model(..., on_absent=)`):
raise `MemberAbsent` (the default: an app may catch it, e.g. a supervisor skipping that worker), answer
empty, or substitute another member. A `MemberAbsent` the app does not catch ends that run without an
answer (scored as an empty answer); any other exception the app raises fails the example (reported, not
scored), as a failed call does, except a broken contract (`AppContractError`: an answer the whole pool's
play did not write, a key it read that the audit does not send, an `interrupt()`), which stops the audit with
what to pass. A play ended by a `MemberAbsent` records the member and the node (`ended_by_absent`), and
every absent member a call asked for, and what its rule did, is in the play's `absent`.

Sync and async apps alike, at any concurrency: sync nodes and tools run in the loop's executor while every
model call runs on the call path's own loop (`colab_graphs.models.loops`), so a sync node waiting for its
reply never holds a thread that the reply needs. Each play has a deadline (`--example-timeout`, 600 s by
default): a play past it fails, its error naming the nodes running and the calls pending; a watchdog logs
what every play waits for when no call and no node has finished for a while (`colab_graphs.watch`). The empty coalition scores 0; each member's individual strength is its
`solo` score, as in every audit.

What is hooked where: `AppGame` is a `CoalitionGame` whose coalition graphs are the app bound to a coalition
(it overrides `_graph` and `_fit`); `play_audit(..., game=AppGame(...))` plays it and writes the usual
report, log and plots. `run_app` scores the app once (the whole pool) through `runner.run_dataset`, with a
protocol run's results, traces, summary and log.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from colab_graphs.audit.app_contract import AppContractError, AppIO, PlayRun, schema_keys
from colab_graphs.audit.game import CoalitionGame, coalition_id
from colab_graphs.langchain.binding import MemberAbsent, MemberBinding, bind_members
from colab_graphs.models.client import CallError, ModelClient
from colab_graphs.pool import Pool
from colab_graphs.tasks.example import Example
from colab_graphs.watch import APP_EXAMPLE_TIMEOUT_S, current_watch, node_tracker


@dataclass(frozen=True)
class AppSpec:
    """What an audit records about an app (the report's `protocol`, the log's header): its name, the players,
    what identifies it (a file's hash when it came from one), and how its state is mapped (`io`; its `params`,
    empty for the default mapping), so a changed app or mapping is not resumed as the same audit. It has no
    graph spec: the viewer shows its calls in the order they were made."""

    name: str
    members: list[str]
    identity: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    empty_fallback: str | None = None
    io: AppIO = field(default_factory=AppIO)

    def to_dict(self) -> dict[str, Any]:
        return {"app": self.name, **self.identity, **({"io": self.params} if self.params else {})}

    def restricted(self, members: Sequence[str]) -> AppSpec:
        return AppSpec(self.name, list(members), self.identity, self.params, io=self.io)


class AppGraph:
    """The app bound to one coalition, with the `ainvoke(state, config, context=RunContext)` the runner calls.

    `full`: the coalition is the whole pool, where the answer must be where `io` reads it (see
    `AppIO.answer`)."""

    def __init__(
        self, app: Any, name: str, coalition: Sequence[str], io: AppIO | None = None, *, full: bool = False
    ):
        self.app = app
        self.name = name
        self.coalition = frozenset(coalition)
        self.io = io or AppIO(mode="keys")
        self.full = full

    async def ainvoke(self, state: dict[str, Any], config: Any = None, *, context: Any) -> dict[str, Any]:
        run = PlayRun(self.app)
        binding = MemberBinding(
            pool=context.pool,
            client=context.client,
            coalition=self.coalition,
            trace=context.trace,
            memo=context.memo,
            loop=asyncio.get_running_loop(),
            graph_of=run.watch.graph_of,
        )
        sent = self.io.input_state(state["input"])
        unsent: str | None = None
        watch = current_watch()
        if watch is not None:  # the nodes it runs tell the play's watch (what a stalled play waits for)
            config = {
                **(config or {}),
                "callbacks": [*((config or {}).get("callbacks") or []), node_tracker(watch)],
            }
        with bind_members(binding):
            try:
                final = await self.app.ainvoke(sent, run.config(config))
            except MemberAbsent as absent:
                # Scored as an empty answer, as the contract says, and visibly: the play records who and where.
                ended = {"member": absent.member, "node": absent.node}
                if context.trace is not None:
                    context.trace.ended_by_absent = ended  # type: ignore[attr-defined]  (a play's extra field)
                return {**state, "answer": ""}
            except CallError:
                raise
            except Exception as exc:  # noqa: BLE001 - the app's own failure fails the example, reported
                # (With a member absent, a missing key is the app's own: one left unwritten by that member.)
                if isinstance(exc, KeyError) and self.full:
                    unsent = self.io.key_error(exc, sent, schema_keys(self.app, "input"))
                if unsent is None:
                    message = f"the app raised {type(exc).__name__}: {exc}"
                    raise CallError("app", message, self.name, 1) from exc
            finally:
                await run.close()
        if unsent is not None:  # the whole pool's play reads a key the audit does not send: stop, saying so
            raise AppContractError(unsent)
        run.check(final, self._played(context.pool.names))
        return {**state, "answer": self.io.answer(final, full=self.full)}

    def _played(self, members: Sequence[str]) -> str:
        """Which play this is, in words: the whole pool, or the coalition and who is absent."""
        present = [m for m in members if m in self.coalition]
        absent = [m for m in members if m not in self.coalition]
        if not absent:
            return f" in the play of the whole pool ({', '.join(present)})"
        return f" in the play of coalition [{', '.join(present)}] (absent: {', '.join(absent)})"


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
    play_cache_allowed = False  # the app's graph is its own code, which the play cache's key does not cover
    """An app's plays have a deadline by default: a sync node waiting forever must not hang the audit."""

    def _graph(self, game: str, members: list[str]) -> tuple[Any, Any]:
        if game == "solo":
            return super()._graph(game, members)
        cid = coalition_id(game, members)
        if cid not in self._graphs:
            spec = self.spec.restricted(members) if members else None  # type: ignore[attr-defined]
            spec_io, full = self.spec.io, members == list(self.spec.members)  # type: ignore[attr-defined]
            graph = AppGraph(self.app, self.spec.name, members, spec_io, full=full) if members else None
            self._graphs[cid] = (spec, graph)
        return self._graphs[cid]

    async def _fit(self, game: str, members: list[str]) -> None:
        """Apps have no fit step."""


async def run_app(
    app: Any,
    spec: AppSpec,
    pool: Pool,
    examples: Sequence[Example],
    *,
    client: ModelClient,
    **run_options: Any,
) -> tuple[list[Any], dict[str, Any]]:
    """Score the app once, the whole pool playing (what `colab-graphs run --app` and `colab_graphs.run(app)`
    do): `runner.run_dataset` with the app for the graph, so the outputs (results.jsonl, traces.jsonl,
    summary.json, log.jsonl) and the viewer are a protocol run's. Each example has a deadline
    (`example_timeout`, default `colab_graphs.watch.APP_EXAMPLE_TIMEOUT_S`), as each play of an app audit."""
    from colab_graphs.runner import run_dataset

    graph = AppGraph(app, spec.name, spec.members, spec.io, full=True)
    if (
        run_options.get("example_timeout") is None
    ):  # an app's examples have a deadline by default, as its plays
        run_options["example_timeout"] = APP_EXAMPLE_TIMEOUT_S
    return await run_dataset(spec, pool, examples, client=client, graph=graph, **run_options)  # type: ignore[arg-type]
