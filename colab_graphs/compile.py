"""GraphSpec -> LangGraph `CompiledStateGraph`.

The compiled graph is a plain LangGraph object: invoke, stream, checkpoint it, or add it as a node of another
graph (it reads `input` and writes `answer`). Model calls go through the `ModelClient` of the run's context
(LangGraph's `context=`: a `RunContext`, set by the runner, which also carries the trace), else through the
client and pool given at compile time.
"""

import asyncio
import inspect
import json
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from typing_extensions import TypedDict  # pydantic builds JSON schemas from it on 3.11 (get_input_jsonschema)

from colab_graphs import otel
from colab_graphs.langchain.lc import ChatRun
from colab_graphs.logit_pool import check_pool_supports, check_seat_supports
from colab_graphs.mechanism import decided
from colab_graphs.models.client import ModelClient, background_loop, default_client
from colab_graphs.models.flight import Memo
from colab_graphs.models.spend import CapReached
from colab_graphs.pool import Pool
from colab_graphs.registry import registry_lookup
from colab_graphs.spec import END, START, Aggregate, Edge, GraphSpec, LogitSeat, Route, Seat, is_pattern
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.task_types import DEFAULT_INSTRUCTION, TaskType, TaskView
from colab_graphs.trace import Call, Trace

if TYPE_CHECKING:
    from langgraph._internal._runnable import RunnableCallable
    from langgraph.graph.state import CompiledStateGraph

FUSED_NODE = "protocol"  # the one node of a fused protocol (see compile_graph(fuse=True))


def _merge(left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    return {**(left or {}), **(right or {})}


def _add_counts(left: dict[str, int] | None, right: dict[str, int] | None) -> dict[str, int]:
    out = dict(left or {})
    for k, v in (right or {}).items():
        out[k] = out.get(k, 0) + v
    return out


class GraphState(TypedDict, total=False):
    input: str
    example: dict[str, Any]
    values: Annotated[dict[str, Any], _merge]
    visits: Annotated[dict[str, int], _add_counts]
    answer: str


@dataclass
class RunContext:
    """What nodes need at run time (LangGraph's run context: `graph.ainvoke(state, context=RunContext(...))`): the call path, the pool, the trace being recorded (if any), and the task
    bound to the example being run (what aggregators and routers ask about answers)."""

    client: ModelClient
    pool: Pool
    trace: Trace | None = None
    task: TaskView | None = None
    # What the runs of one example share (an audit's coalitions): a seat whose request another run made takes
    # its call and records it as served again, as the client's cache would serve it; one in flight is waited for.
    memo: Memo | None = None


class NodeRun(Protocol):
    """A node's async function, as LangGraph calls it: the state, its `Runtime` (whose `context` is our
    `RunContext`), the node's `RunnableConfig`; it returns the node's state update."""

    async def __call__(
        self, state: GraphState, runtime: Any = None, config: Any = None
    ) -> dict[str, Any]: ...


# A node's sync function (pure-Python nodes): (state, runtime) -> update.
SyncRun = Callable[[GraphState, Any], dict[str, Any]]
# A node's update when it needs nothing awaited (a pure-Python node; a seat whose request the run's memo
# holds), else None.
Ready = Callable[[GraphState, Any], dict[str, Any] | None]


def task_view(state: GraphState, runtime: Any, fallback: RunContext | None) -> TaskView:
    """The run's task, else one derived from the state's example (a graph invoked directly by a user)."""
    rt = getattr(runtime, "context", None) or fallback
    if rt is not None and rt.task is not None:
        return rt.task
    fields = dict(state.get("example") or {})
    fields.setdefault("id", "")
    fields.setdefault("input", state.get("input", ""))
    try:
        example = Example.model_validate(fields)
    except ValueError:
        example = Example(id="", input=str(state.get("input", "")))
    from colab_graphs.tasks.scoring import task_for

    try:
        return TaskView(task_for(example), example)
    except (KeyError, ValueError):
        return TaskView(TaskType(), example)


class TemplateError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def _writer_order(spec: GraphSpec) -> dict[str, int]:
    return {n.writes: i for i, n in enumerate(spec.nodes)}


def resolve_reads(reads: dict[str, str], state: GraphState, order: dict[str, int]) -> dict[str, Any]:
    """Template variable -> value: a string for exact reads, a list (writer order) for pattern reads."""
    if not reads:
        return {}
    values = state.get("values") or {}
    out: dict[str, Any] = {}
    for var, ref in reads.items():
        if is_pattern(ref):
            prefix = ref[:-1]
            keys = [k for k in values if k.startswith(prefix) and "#" not in k]
            keys.sort(key=lambda k: order.get(k, math.inf))
            out[var] = [values[k] for k in keys]
        elif ref == "input":
            out[var] = state.get("input", "")
        else:
            out[var] = values.get(ref.rstrip("?"), "")
    return out


def render_list(items: list[str]) -> str:
    if not items:
        return "(none)"
    return "\n\n".join(f"Response {i}:\n{item.strip()}" for i, item in enumerate(items, 1))


def render(template: str, node: str, state: GraphState, reads: dict[str, Any]) -> str:
    context: dict[str, Any] = {"answer_format": DEFAULT_INSTRUCTION, **(state.get("example") or {})}
    context["input"] = state.get("input", "")
    for var, value in reads.items():
        context[var] = render_list(value) if isinstance(value, list) else value
    try:
        return template.format_map(context)
    except KeyError as exc:
        raise TemplateError(
            f"node {node!r}: template variable {exc.args[0]!r} is neither read from the state nor a field "
            f"of the example (available: {', '.join(sorted(context))})"
        ) from None


def _context(runtime: Any, fallback: RunContext | None) -> RunContext:
    """The run's context (LangGraph hands nodes its `Runtime`, whose `context` is ours), else the fallback."""
    rt: RunContext | None = getattr(runtime, "context", None)
    if rt is not None:
        return rt
    if fallback is not None:
        return fallback
    raise RuntimeError(
        "no model client: compile the graph with a pool (compile_graph(spec, pool)) or run it through "
        "colab_graphs.run_graph"
    )


def _messages(system: str | None, prompt: str) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system}] if system else []
    msgs.append({"role": "user", "content": prompt})
    return msgs


def seat_messages(seat: Seat, state: GraphState) -> list[dict[str, str]]:
    """The messages a seat that reads nothing sends on `state` (an example's input state), as its node does.

    Such a seat's request depends on the example alone, so an audit can know it, and whether the cache holds
    it, before any call (`colab_graphs.audit.plan`, and the game computed from answers).
    """
    if seat.reads:
        raise ValueError(
            f"seat {seat.name!r} reads {sorted(seat.reads.values())}: its prompt depends on the run"
        )
    prompt = render(seat.prompt, seat.name, state, {})
    system = render(seat.system, seat.name, state, {}) if seat.system else None
    return _messages(system, prompt)


def _node(afn: NodeRun, fn: SyncRun | None = None, name: str | None = None) -> "RunnableCallable":
    """A node (named `name`, else as `afn`) that runs `afn` under `ainvoke` and `fn` under `invoke`.

    Without `fn`, `invoke` runs `afn` on a background loop (model seats). Built as LangGraph builds nodes from
    plain functions (no tracing callbacks, no thread hop for pure-Python nodes under `ainvoke`), with its
    `Runtime` (and so our `RunContext`) passed to the parameter named `runtime` and, for model nodes, the
    node's `RunnableConfig` to `config` (its callbacks see each seat's call as a chat model's). LangGraph's builder takes one
    function per node; a node with both a sync and an async form needs its `RunnableCallable`, the one private
    LangGraph name this package uses (tests/test_compile.py pins it).
    """
    from langchain_core.runnables import RunnableConfig
    from langgraph._internal._runnable import RunnableCallable

    if fn is None:
        # LangGraph hands the node's RunnableConfig to a parameter of that name when it is unannotated or
        # annotated `RunnableConfig` or `RunnableConfig | None` (imported here: at module level it would cost
        # every import of us).
        def sync(
            state: GraphState, runtime: Any = None, config: RunnableConfig | None = None
        ) -> dict[str, Any]:
            work = otel.carried(afn(state, runtime, config))  # (a trace's current span with it)
            return asyncio.run_coroutine_threadsafe(work, background_loop()).result()

        fn = sync
    return RunnableCallable(fn, afn, name=name or getattr(afn, "__name__", None), trace=False)


def _update(node_name: str, written: dict[str, Any], output_key: str) -> dict[str, Any]:
    """A node's state update; the node that writes the protocol's output also sets `answer`.

    Setting `answer` where the output is written (one writer per key) saves the graph a final superstep.
    """
    update: dict[str, Any] = {"values": written, "visits": {node_name: 1}}
    if output_key in written:
        update["answer"] = str(written[output_key])
    return update


def _seat_fn(
    seat: Seat, order: dict[str, int], fallback: RunContext | None, output_key: str
) -> tuple[NodeRun, Ready]:
    """A seat's async node function and its `Ready` (the update at once when the run's memo holds the call)."""
    settings_key = json.dumps(seat.settings, sort_keys=True, default=str) if seat.settings else ""
    templates = ("rendered", seat.prompt, seat.system)

    def prepare(
        state: GraphState, runtime: Any
    ) -> tuple[RunContext, str | None, str, tuple[str, int, str, str | None, str]]:
        rt = _context(runtime, fallback)
        # A seat that reads no state renders the same prompt in every run of an example: the memo keeps it.
        rendered = rt.memo.prompts.get(templates) if rt.memo is not None and not seat.reads else None
        if rendered is None:
            reads = resolve_reads(seat.reads, state, order)
            prompt = render(seat.prompt, seat.name, state, reads)
            system = render(seat.system, seat.name, state, reads) if seat.system else None
            if rt.memo is not None and not seat.reads:
                rt.memo.prompts[templates] = (system, prompt)
        else:
            system, prompt = rendered
        # Member, sample, settings and messages make the request (and its cache key): an equal tuple is the
        # same request, whose result the cache would return.
        return rt, system, prompt, (seat.member, seat.sample, settings_key, system, prompt)

    def written(call: Call) -> dict[str, Any]:
        out: dict[str, Any] = {seat.writes: call.text}
        if call.logprobs:
            out[seat.writes + "#logprob"] = sum(call.logprobs) / len(call.logprobs)
        return _update(seat.name, out, output_key)

    def replayed(rt: RunContext, memo: Memo, request: Hashable, call: Call) -> dict[str, Any]:
        # One record of the reused call per seat, shared by every run that reuses it there.
        record = memo.replays.get((request, seat.name))
        if record is None:
            record = call.served_again(node=seat.name, seat=seat.name)
            memo.replays[(request, seat.name)] = record
        if rt.trace is not None:
            rt.trace.calls.append(record)
        otel.replayed_call(record)
        return written(call)

    def ready(state: GraphState, runtime: Any) -> dict[str, Any] | None:
        rt, _, _, request = prepare(state, runtime)
        if rt.memo is None:
            return None
        call = rt.memo.calls.landed(request)
        if call is None:
            return None
        with otel.seat_span(seat.name, seat.member):
            return replayed(rt, rt.memo, request, call)

    async def run(state: GraphState, runtime: Any = None, config: Any = None) -> dict[str, Any]:
        with otel.seat_span(seat.name, seat.member):
            return await played(state, runtime, config)

    async def played(state: GraphState, runtime: Any, config: Any) -> dict[str, Any]:
        rt, system, prompt, request = prepare(state, runtime)
        member, messages = rt.pool[seat.member], _messages(system, prompt)

        async def make() -> Call:
            events = await ChatRun.start(config, seat.name, member, messages, seat.settings)
            try:
                call = await rt.client.complete(
                    member,
                    messages,
                    sample=seat.sample,
                    overrides=seat.settings or None,
                    node=seat.name,
                    seat=seat.name,
                    trace=rt.trace,
                )
            except BaseException as exc:
                if events is not None:
                    await events.error(exc)
                raise
            if events is not None:
                await events.end(call)
            return call

        if rt.memo is None:
            return written(await make())
        call, shared = await rt.memo.calls.run(request, make)
        return replayed(rt, rt.memo, request, call) if shared else written(call)

    return run, ready


def _logit_fn(
    node: LogitSeat, order: dict[str, int], fallback: RunContext | None, output_key: str
) -> NodeRun:
    async def run(state: GraphState, runtime: Any = None, config: Any = None) -> dict[str, Any]:
        rt = _context(runtime, fallback)
        reads = resolve_reads(node.reads, state, order)
        prompt = render(node.prompt, node.name, state, reads)
        system = render(node.system, node.name, state, reads) if node.system else None
        members = [rt.pool[m] for m in node.members]
        # The run's pool may not be the one compile_graph checked (or it had none): check it again, cheaply.
        check_seat_supports(node, rt.pool, graph=node.name)
        overrides = dict(node.settings)
        if len(members) > 1:
            # The local provider decodes with every member's next-token distribution (see local/logits.py).
            overrides["metadata"] = {
                "colab_graphs": {
                    "logit_mode": node.mode,
                    "members": [m.model for m in members],
                    **node.params,
                }
            }
        messages = _messages(system, prompt)
        events = await ChatRun.start(config, node.name, members[0], messages, node.settings)
        try:
            with otel.seat_span(node.name, members[0].name):
                result = await rt.client.complete(
                    members[0], messages, overrides=overrides, node=node.name, seat=node.name, trace=rt.trace
                )
        except BaseException as exc:
            if events is not None:
                await events.error(exc)
            raise
        if events is not None:
            await events.end(result)
        return _update(node.name, {node.writes: result.text}, output_key)

    return run


def takes_task(fn: Any) -> bool:
    """Whether an aggregator takes the run's task (a `task` parameter, or `**kwargs`)."""
    params = inspect.signature(fn).parameters.values()
    return any(p.name == "task" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _aggregate_fns(
    node: Aggregate, order: dict[str, int], output_key: str, fallback: RunContext | None
) -> tuple[SyncRun, NodeRun]:
    """(sync, async) functions of an aggregate node (the sync one is also its `Ready`). Aggregators that take
    `task` get the run's task."""
    fn = registry_lookup("aggregator", node.fn).obj
    wants_task = takes_task(fn)

    def run(state: GraphState, runtime: Any = None) -> dict[str, Any]:
        reads = resolve_reads(node.reads, state, order)
        params = {**node.params, "task": task_view(state, runtime, fallback)} if wants_task else node.params
        return _update(node.name, {node.writes: fn(reads, **params)}, output_key)

    async def arun(state: GraphState, runtime: Any = None, config: Any = None) -> dict[str, Any]:
        return run(state, runtime)

    return run, arun


def fusion_levels(spec: GraphSpec) -> list[list[str]] | None:
    """The nodes by superstep when the whole protocol can run as one LangGraph node; None when it cannot.

    It can when there is no route and every node has exactly one incoming edge (a join counts as one): then
    each node runs exactly once, in superstep 1 + the latest superstep among its edge's sources (START's is
    0), and running the levels in order, each level's nodes concurrently on the state as it stood when the
    level began, is what LangGraph's supersteps do. Routed protocols (cascades, loops) are compiled node by
    node.
    """
    if spec.routes or len(spec.nodes) < 2:
        return None
    incoming: dict[str, list[Edge]] = {n: [] for n in spec.node_names}
    for edge in spec.edges:
        if edge.target != END:
            incoming[edge.target].append(edge)
    if any(len(edges) != 1 for edges in incoming.values()):
        return None
    level: dict[str, int] = {START: 0}

    def level_of(name: str) -> int:  # without routes there is no cycle (validation rejects unbounded loops)
        if name not in level:
            level[name] = 1 + max(level_of(s) for s in incoming[name][0].sources)
        return level[name]

    for name in spec.node_names:
        level_of(name)
    levels: list[list[str]] = [[] for _ in range(max(level.values()))]
    for name in spec.node_names:  # declaration order within a level
        levels[level[name] - 1].append(name)
    return levels


def _apply(state: dict[str, Any], update: dict[str, Any]) -> None:
    """Apply a node's update to a state dict with the graph's reducers."""
    state["values"] = _merge(state.get("values"), update.get("values"))
    state["visits"] = _add_counts(state.get("visits"), update.get("visits"))
    if "answer" in update:
        state["answer"] = update["answer"]


async def _all_or_cancel(coros: list[Any]) -> list[Any]:
    """Run concurrently; on the first failure cancel the rest (as a LangGraph superstep does) and raise it.

    A spending cap is the exception: the calls already sent finish (their replies are cached, so a resumed
    run does not pay for them again) and no new one starts, so waiting for them wastes nothing.
    """
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException as exc:
        if not isinstance(exc, CapReached):
            for task in tasks:
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _fused_fn(levels: list[list[str]], fns: dict[str, NodeRun], readies: dict[str, Ready]) -> NodeRun:
    """One node that runs the protocol's levels in order, each level's nodes concurrently."""

    async def run(state: GraphState, runtime: Any = None, config: Any = None) -> dict[str, Any]:
        # The state as the graph's reducers would build it (merged values, counted visits), grown in place:
        # a level's updates apply only after all its nodes have read the state.
        values, visits = dict(state.get("values") or {}), dict(state.get("visits") or {})
        view: GraphState = {**state, "values": values, "visits": visits}
        total: dict[str, Any] = {"values": {}, "visits": {}}
        for names in levels:
            # Nodes that can answer at once do (pure-Python nodes, seats whose request the memo holds); the
            # others run concurrently. Updates apply in declaration order either way.
            updates: list[Any] = [ready(view, runtime) if (ready := readies.get(n)) else None for n in names]
            pending = [i for i, u in enumerate(updates) if u is None]
            if len(pending) == 1:
                updates[pending[0]] = await fns[names[pending[0]]](view, runtime, config)
            elif pending:
                done = await _all_or_cancel([fns[names[i]](view, runtime, config) for i in pending])
                for i, update in zip(pending, done, strict=True):
                    updates[i] = update
            for update in updates:
                values.update(update["values"])
                total["values"].update(update["values"])
                for name, n in update["visits"].items():
                    visits[name] = visits.get(name, 0) + n
                    total["visits"][name] = total["visits"].get(name, 0) + n
                if "answer" in update:
                    view["answer"] = total["answer"] = update["answer"]
        return total

    return run


def _route_fn(
    route: Route, order: dict[str, int], fallback: RunContext | None
) -> Callable[[GraphState, Any], str]:
    fn = registry_lookup("router", route.fn).obj
    key = route.params.get("key")
    params = {k: v for k, v in route.params.items() if k != "key"}

    def choose(state: GraphState, runtime: Any) -> str:
        values = state.get("values") or {}
        if (
            route.max_visits is not None
            and (state.get("visits") or {}).get(route.source, 0) >= route.max_visits
        ):
            return _target(route.exit)
        view = {
            "text": values.get(key, "") if key else "",
            "logprob": values.get(f"{key}#logprob"),
            "values": values,
            "task": task_view(state, runtime, fallback),
        }
        choice = fn(view, route.path_map, **params)
        # A router that fell back for want of what it decides from says so in `view["lacking"]`
        # (`colab_graphs.mechanism`): recorded on the play, so a run where it always did is reported.
        rt = getattr(runtime, "context", None) or fallback
        lacking = view.get("lacking")
        decided(
            rt.trace if rt is not None else None, route.source, lacking if isinstance(lacking, str) else None
        )
        return _target(route.path_map.get(choice, route.default))

    return choose


def _target(name: str | None) -> str:
    return "__end__" if name in (END, None) else name


def _node_functions(
    spec: GraphSpec, pool: Pool | None, client: ModelClient | None
) -> tuple[dict[str, NodeRun], dict[str, SyncRun], dict[str, Ready], RunContext | None]:
    """(async functions of every node, sync functions of pure-Python nodes, `Ready`s of the nodes that have
    one, the fallback runtime)."""
    spec.validate_for(pool.names if pool is not None else None)
    if pool is not None and any(isinstance(n, LogitSeat) for n in spec.nodes):
        check_pool_supports(spec, pool)  # API members cannot give next-token distributions: fail before calls
    fallback = RunContext(client or default_client(), pool) if pool is not None else None
    order = _writer_order(spec)
    afns: dict[str, NodeRun] = {}
    syncs: dict[str, SyncRun] = {}
    readies: dict[str, Ready] = {}
    for node in spec.nodes:
        if isinstance(node, Seat):
            afns[node.name], readies[node.name] = _seat_fn(node, order, fallback, spec.output)
        elif isinstance(node, LogitSeat):
            afns[node.name] = _logit_fn(node, order, fallback, spec.output)
        else:
            syncs[node.name], afns[node.name] = _aggregate_fns(node, order, spec.output, fallback)
            readies[node.name] = syncs[node.name]
    return afns, syncs, readies, fallback


def compile_graph(
    spec: GraphSpec, pool: Pool | None = None, client: ModelClient | None = None, *, fuse: bool = False
) -> "CompiledStateGraph[GraphState, RunContext, GraphState, GraphState]":
    """Compile `spec` into a LangGraph `CompiledStateGraph`.

    Args:
        spec: the protocol (validated here).
        pool: members by name; needed unless every run passes a `RunContext` (`ainvoke(state, context=...)`).
        client: the call path; defaults to a process-wide client with the default cache.
        fuse: run a protocol without routes as one LangGraph node that runs its nodes level by level (same
            calls, same trace, same answer; see `fusion_levels`). LangGraph's per-node machinery is most of
            the framework's CPU per run, so the runner and training fuse; leave it off to stream or draw the
            graph node by node.

    Example:
        >>> graph = compile_graph(spec, pool)                             # doctest: +SKIP
        >>> (await graph.ainvoke({"input": "What is 2 + 3?"}))["answer"]  # doctest: +SKIP
    """
    from langgraph.graph import StateGraph

    afns, syncs, readies, fallback = _node_functions(spec, pool, client)
    builder = StateGraph(GraphState, context_schema=RunContext)
    levels = fusion_levels(spec) if fuse else None
    if levels is not None:
        builder.add_node(FUSED_NODE, _node(_fused_fn(levels, afns, readies), name=FUSED_NODE))
        builder.add_edge(START, FUSED_NODE)
        builder.add_edge(FUSED_NODE, "__end__")
        return builder.compile(name=spec.name)
    for name, afn in afns.items():
        builder.add_node(name, _node(afn, syncs.get(name)))
    for edge in spec.edges:
        sources = [START if s == START else s for s in edge.sources]
        target = _target(edge.target)
        builder.add_edge(sources[0] if len(sources) == 1 else sources, target)
    order = _writer_order(spec)
    for route in spec.routes:
        targets = {_target(t) for t in [*route.path_map.values(), route.default, route.exit] if t}
        builder.add_conditional_edges(
            route.source, _route_fn(route, order, fallback), {t: t for t in sorted(targets)}
        )
    return builder.compile(name=spec.name)


@dataclass(frozen=True)
class DirectRuntime:
    """What the fused node reads of the `Runtime` LangGraph would hand it: the run's context (`_context`). Not
    LangGraph's own class: importing LangGraph (about 0.4 s of CPU) would be all an audit loads it for."""

    context: RunContext | None


class DirectGraph:
    """A protocol without routes run as its fused LangGraph graph runs, without LangGraph's loop.

    The fused graph is one LangGraph node whose function runs the protocol's levels (`fusion_levels`); its
    `ainvoke` returns the input state with that node's update applied by the graph's reducers. `DirectGraph`
    calls the same function and applies the same reducers, so calls, trace, state and answer are the
    graph's (tests/test_fusion.py checks it for every protocol and coalition); what it saves is LangGraph's
    per-invocation machinery (checkpoints, channels, callbacks: about 1 ms of CPU), which an exact audit
    pays thousands of times per example batch. Audits use it; users get the LangGraph graph.
    """

    def __init__(self, name: str, run: NodeRun) -> None:
        self.name = name
        self._run = run

    async def ainvoke(
        self, state: GraphState, config: Any = None, *, context: RunContext | None = None
    ) -> dict[str, Any]:
        update = await self._run(state, DirectRuntime(context))
        out = dict(state)
        _apply(out, update)
        return out


def compile_direct(
    spec: GraphSpec, pool: Pool | None = None, client: ModelClient | None = None
) -> "DirectGraph | CompiledStateGraph[GraphState, RunContext, GraphState, GraphState]":
    """`DirectGraph` of `spec` when it fuses (no routes, one incoming edge per node), else the fused LangGraph
    graph (`compile_graph(..., fuse=True)`): either way an object with `ainvoke(state, config, context=...)`."""
    levels = fusion_levels(spec)
    if levels is None:
        return compile_graph(spec, pool, client, fuse=True)
    afns, _, readies, _ = _node_functions(spec, pool, client)
    return DirectGraph(spec.name, _fused_fn(levels, afns, readies))
