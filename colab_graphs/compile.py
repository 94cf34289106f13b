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
from dataclasses import dataclass
from typing import Annotated, Any

from typing_extensions import TypedDict  # pydantic builds JSON schemas from it on 3.11 (get_input_jsonschema)

from colab_graphs.data.example import Example
from colab_graphs.data.tasks import DEFAULT_INSTRUCTION, TaskType, TaskView
from colab_graphs.logit_pool import check_pool_supports, check_seat_supports
from colab_graphs.models.client import (
    ModelClient,
    background_loop,
    being_cancelled,
    default_client,
    fail_flight,
)
from colab_graphs.models.lc import ChatRun
from colab_graphs.pool import Pool
from colab_graphs.registry import registry_lookup
from colab_graphs.spec import END, START, Aggregate, Edge, GraphSpec, LogitSeat, Seat, is_pattern
from colab_graphs.trace import Trace

FUSED_NODE = "protocol"  # the one node of a fused protocol (see compile_graph(fuse=True))


def _merge(left: dict | None, right: dict | None) -> dict:
    return {**(left or {}), **(right or {})}


def _add_counts(left: dict | None, right: dict | None) -> dict:
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
    # Seat results by request, shared by the runs of one example (an audit's coalitions): a seat whose request
    # is already here takes its result and records a cached call, as the client's cache would serve it; one
    # whose request is in flight waits for it.
    memo: dict[Any, Any] | None = None


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
    from colab_graphs.data.scoring import task_for

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
    rt = getattr(runtime, "context", None)
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


def _node(afn, fn=None):
    """A node that runs `afn` under `ainvoke` and `fn` under `invoke`.

    Without `fn`, `invoke` runs `afn` on a background loop (model seats). Built as LangGraph builds nodes from
    plain functions (no tracing callbacks, no thread hop for pure-Python nodes under `ainvoke`), with its
    `Runtime` (and so our `RunContext`) passed to the parameter named `runtime` and, for model nodes, the
    node's `RunnableConfig` to `config` (its callbacks see each seat's call as a chat model's). LangGraph's builder takes one
    function per node; a node with both a sync and an async form needs its `RunnableCallable`, the one private
    LangGraph name this package uses (tests/test_compile.py pins it).
    """
    from langgraph._internal._runnable import RunnableCallable

    if fn is None:
        # `config` unannotated: LangGraph hands the node's RunnableConfig to a parameter of that name when it is
        # unannotated or annotated RunnableConfig (importing that type here would cost every import of us).
        def fn(state: GraphState, runtime: Any = None, config=None) -> dict[str, Any]:
            return asyncio.run_coroutine_threadsafe(afn(state, runtime, config), background_loop()).result()

    return RunnableCallable(fn, afn, name=getattr(afn, "__name__", None), trace=False)


def _update(node_name: str, written: dict[str, Any], output_key: str) -> dict[str, Any]:
    """A node's state update; the node that writes the protocol's output also sets `answer`.

    Setting `answer` where the output is written (one writer per key) saves the graph a final superstep.
    """
    update: dict[str, Any] = {"values": written, "visits": {node_name: 1}}
    if output_key in written:
        update["answer"] = str(written[output_key])
    return update


def _seat_fn(seat: Seat, order: dict[str, int], fallback: RunContext | None, output_key: str):
    """A seat's async node function; its `ready` attribute answers at once when the run's memo has the request."""
    settings_key = json.dumps(seat.settings, sort_keys=True, default=str) if seat.settings else ""
    replay = {"node": seat.name, "seat": seat.name, "cached": True, "latency_s": 0.0, "attempts": 0}
    templates = ("rendered", seat.prompt, seat.system)

    def prepare(state: GraphState, runtime: Any) -> tuple[RunContext, str | None, str, tuple]:
        rt = _context(runtime, fallback)
        # A seat that reads no state renders the same prompt in every run of an example: the memo keeps it.
        rendered = rt.memo.get(templates) if rt.memo is not None and not seat.reads else None
        if rendered is None:
            reads = resolve_reads(seat.reads, state, order)
            prompt = render(seat.prompt, seat.name, state, reads)
            system = render(seat.system, seat.name, state, reads) if seat.system else None
            if rt.memo is not None and not seat.reads:
                rt.memo[templates] = (system, prompt)
        else:
            system, prompt = rendered
        # Member, sample, settings and messages make the request (and its cache key): an equal tuple is the
        # same request, whose result the cache would return.
        return rt, system, prompt, (seat.member, seat.sample, settings_key, system, prompt)

    def written(result: Any) -> dict[str, Any]:
        out: dict[str, Any] = {seat.writes: result.text}
        if result.logprobs:
            out[seat.writes + "#logprob"] = sum(result.logprobs) / len(result.logprobs)
        return _update(seat.name, out, output_key)

    def replayed(rt: RunContext, hit: list[Any]) -> dict[str, Any]:
        result, record, copies = hit
        if rt.trace is not None:
            if seat.name not in copies:  # one cached copy of the record per seat, shared by the replays
                copies[seat.name] = record.model_copy(update=replay)
            rt.trace.calls.append(copies[seat.name])
        return written(result)

    def ready(state: GraphState, runtime: Any) -> dict[str, Any] | None:
        rt, _, _, request = prepare(state, runtime)
        hit = rt.memo.get(request) if rt.memo is not None else None
        return replayed(rt, hit) if isinstance(hit, list) else None

    async def run(state: GraphState, runtime: Any = None, config: Any = None) -> dict[str, Any]:
        rt, system, prompt, request = prepare(state, runtime)
        memo = rt.memo
        while memo is not None and (hit := memo.get(request)) is not None:
            if isinstance(hit, list):
                return replayed(rt, hit)
            # Another run of this example is making the same request: wait for it (as the client's single
            # flight would, for less), and take the call over if that run was cancelled and this one was not.
            try:
                return replayed(rt, await asyncio.shield(hit))
            except asyncio.CancelledError:
                if not (hit.cancelled() and not being_cancelled()):
                    raise
        flight = asyncio.get_running_loop().create_future() if memo is not None else None
        if memo is not None:
            memo[request] = flight
        member, messages = rt.pool[seat.member], _messages(system, prompt)
        events = await ChatRun.start(config, seat.name, member, messages, seat.settings)
        try:
            result, record = await rt.client.complete_recorded(
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
            if flight is not None:
                del memo[request]
                fail_flight(flight, exc)
            raise
        if events is not None:
            await events.end(result)
        if flight is not None:
            memo[request] = entry = [result, record, {}]
            flight.set_result(entry)
        return written(result)

    run.ready = ready
    return run


def _logit_fn(node: LogitSeat, order: dict[str, int], fallback: RunContext | None, output_key: str):
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
            # The local provider decodes with every member's next-token distribution (see models/logits.py).
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


def _takes_task(fn: Any) -> bool:
    params = inspect.signature(fn).parameters.values()
    return any(p.name == "task" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _aggregate_fns(node: Aggregate, order: dict[str, int], output_key: str, fallback: RunContext | None):
    """(sync, async) functions of an aggregate node. Aggregators that take `task` get the run's task."""
    fn = registry_lookup("aggregator", node.fn).obj
    takes_task = _takes_task(fn)

    def run(state: GraphState, runtime: Any = None) -> dict[str, Any]:
        reads = resolve_reads(node.reads, state, order)
        params = {**node.params, "task": task_view(state, runtime, fallback)} if takes_task else node.params
        return _update(node.name, {node.writes: fn(reads, **params)}, output_key)

    async def arun(state: GraphState, runtime: Any = None, config: Any = None) -> dict[str, Any]:
        return run(state, runtime)

    arun.ready = run
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
    """Run concurrently; on the first failure cancel the rest (as a LangGraph superstep does) and raise it."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _fused_fn(levels: list[list[str]], fns: dict[str, Any]):
    """One node that runs the protocol's levels in order, each level's nodes concurrently."""
    readies = {name: getattr(fn, "ready", None) for name, fn in fns.items()}

    async def run(state: GraphState, runtime: Any = None, config: Any = None) -> dict[str, Any]:
        # The state as the graph's reducers would build it (merged values, counted visits), grown in place:
        # a level's updates apply only after all its nodes have read the state.
        values, visits = dict(state.get("values") or {}), dict(state.get("visits") or {})
        view = {**state, "values": values, "visits": visits}
        total: dict[str, Any] = {"values": {}, "visits": {}}
        for names in levels:
            # Nodes that can answer at once do (pure-Python nodes, seats whose request the memo holds); the
            # others run concurrently. Updates apply in declaration order either way.
            updates: list[Any] = [ready(view, runtime) if (ready := readies[n]) else None for n in names]
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


def _route_fn(route, order: dict[str, int], fallback: RunContext | None):
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
        return _target(route.path_map.get(choice, route.default))

    return choose


def _target(name: str | None) -> str:
    return "__end__" if name in (END, None) else name


def _node_functions(spec: GraphSpec, pool: Pool | None, client: ModelClient | None):
    """(async functions of every node, sync functions of pure-Python nodes, the fallback runtime)."""
    spec.validate_for(pool.names if pool is not None else None)
    if pool is not None and any(isinstance(n, LogitSeat) for n in spec.nodes):
        check_pool_supports(spec, pool)  # API members cannot give next-token distributions: fail before calls
    fallback = RunContext(client or default_client(), pool) if pool is not None else None
    order = _writer_order(spec)
    afns: dict[str, Any] = {}
    syncs: dict[str, Any] = {}
    for node in spec.nodes:
        if isinstance(node, Seat):
            afns[node.name] = _seat_fn(node, order, fallback, spec.output)
        elif isinstance(node, LogitSeat):
            afns[node.name] = _logit_fn(node, order, fallback, spec.output)
        else:
            syncs[node.name], afns[node.name] = _aggregate_fns(node, order, spec.output, fallback)
    return afns, syncs, fallback


def compile_graph(
    spec: GraphSpec, pool: Pool | None = None, client: ModelClient | None = None, *, fuse: bool = False
):
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

    afns, syncs, fallback = _node_functions(spec, pool, client)
    builder = StateGraph(GraphState, context_schema=RunContext)
    levels = fusion_levels(spec) if fuse else None
    if levels is not None:
        run = _fused_fn(levels, afns)
        run.__name__ = FUSED_NODE
        builder.add_node(FUSED_NODE, _node(run))
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


class DirectGraph:
    """A protocol without routes run as its fused LangGraph graph runs, without LangGraph's loop.

    The fused graph is one LangGraph node whose function runs the protocol's levels (`fusion_levels`); its
    `ainvoke` returns the input state with that node's update applied by the graph's reducers. `DirectGraph`
    calls the same function and applies the same reducers, so calls, trace, state and answer are the
    graph's (tests/test_fusion.py checks it for every protocol and coalition); what it saves is LangGraph's
    per-invocation machinery (checkpoints, channels, callbacks: about 1 ms of CPU), which an exact audit
    pays thousands of times per example batch. Audits use it; users get the LangGraph graph.
    """

    def __init__(self, name: str, run: Any):
        self.name = name
        self._run = run

    async def ainvoke(
        self, state: dict[str, Any], config: Any = None, *, context: RunContext | None = None
    ) -> dict[str, Any]:
        from langgraph.runtime import Runtime

        update = await self._run(state, Runtime(context=context))
        out = dict(state)
        _apply(out, update)
        return out


def compile_direct(spec: GraphSpec, pool: Pool | None = None, client: ModelClient | None = None):
    """`DirectGraph` of `spec` when it fuses (no routes, one incoming edge per node), else the fused LangGraph
    graph (`compile_graph(..., fuse=True)`): either way an object with `ainvoke(state, config, context=...)`."""
    levels = fusion_levels(spec)
    if levels is None:
        return compile_graph(spec, pool, client, fuse=True)
    afns, _, _ = _node_functions(spec, pool, client)
    return DirectGraph(spec.name, _fused_fn(levels, afns))
