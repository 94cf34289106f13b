"""GraphSpec: a collaboration protocol as data — seats, aggregators, edges, routes — and its validation.

The spec is the source of truth: coalitions are rewritten on the spec (`colab_graphs.coalition`) and compiled
to LangGraph per coalition (`colab_graphs.compile`). A spec round-trips through `to_dict` / `from_dict`.

State model: the graph's state holds `input` (the example's input), `example` (all its fields) and `values`, a
mapping from state keys to text. A seat or aggregator *writes* one key and *reads* keys into template variables;
a read ending in `*` is a pattern that gathers every key with that prefix, in the order of their writers in the
spec (pool order, as protocols build them), and may match nothing (that is how coalitions with missing members
still run). An exact read must be written by some node.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

START = "__start__"
END = "__end__"

# The coalition rules and decoding modes a node may name, as types so the builder's arguments are checked too.
OnAbsent = Literal["drop", "substitute", "fallback"]
LogitMode = Literal["fusion", "contrastive", "nudging", "co_llm"]
OnTargetAbsent = Literal["skip", "remove"]

BUILTIN_KEYS = frozenset({"input"})


class SpecError(ValueError):
    """A spec is invalid. `problems` lists every problem found, each naming the node or edge at fault."""

    def __init__(self, spec_name: str, problems: list[str]):
        self.problems = problems
        super().__init__(f"graph {spec_name!r} is invalid:\n  - " + "\n  - ".join(problems))


class AggregatorRef(BaseModel):
    """A pure-Python aggregator by registered name, with its parameters."""

    model_config = ConfigDict(frozen=True)
    fn: str
    params: dict[str, Any] = Field(default_factory=dict)


class Seat(BaseModel):
    """A model node: `member` answers `prompt` (a str.format template) and its text is written to `writes`.

    `on_absent` is the coalition rule when the member is not in the coalition: `drop` (remove the node and
    rewire its neighbours), `substitute` (the first present member of `substitutes`, else of the pool, takes
    the seat: for judge / aggregator / router seats), or `fallback` (the seat becomes the pure-Python
    aggregator `fallback` over the same reads).
    """

    kind: Literal["seat"] = "seat"
    name: str
    member: str
    prompt: str
    system: str | None = None
    reads: dict[str, str] = Field(default_factory=dict)
    writes: str
    sample: int = 0
    settings: dict[str, Any] = Field(default_factory=dict)
    on_absent: OnAbsent = "drop"
    substitutes: list[str] | None = None
    fallback: AggregatorRef | None = None
    role: str | None = None


class LogitSeat(BaseModel):
    """A logit-level node: several local members decode one answer together (fusion, contrastive, or one model
    guiding another: nudging, co_llm)."""

    kind: Literal["logit"] = "logit"
    name: str
    members: list[str]
    mode: LogitMode
    prompt: str
    system: str | None = None
    reads: dict[str, str] = Field(default_factory=dict)
    writes: str
    settings: dict[str, Any] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)


class Aggregate(BaseModel):
    """A pure-Python node: registered aggregator `fn` over the values read, writing one key."""

    kind: Literal["aggregate"] = "aggregate"
    name: str
    fn: str
    params: dict[str, Any] = Field(default_factory=dict)
    reads: dict[str, str] = Field(default_factory=dict)
    writes: str


Node = Annotated[Seat | LogitSeat | Aggregate, Field(discriminator="kind")]


class Edge(BaseModel):
    """`sources` -> `target`. Several sources make a join: the target waits for all of them."""

    sources: list[str]
    target: str


class Route(BaseModel):
    """A conditional edge after `source`: router `fn` reads the state and picks a key of `path_map`.

    `max_visits` bounds a loop: once `source` has run that many times the route takes `exit`.
    """

    source: str
    fn: str
    params: dict[str, Any] = Field(default_factory=dict)
    path_map: dict[str, str]
    default: str
    max_visits: int | None = None
    exit: str | None = None
    # Coalition rules (see colab_graphs.coalition): when a path's target node is removed, "skip" follows that
    # node onward (a cascade skips a stage) and "remove" deletes the path (a router loses a candidate).
    on_target_absent: OnTargetAbsent = "skip"
    # When `source` itself is removed, edges into it continue along this path key (None: they are dropped).
    on_source_absent: str | None = None


class GraphSpec(BaseModel):
    """A collaboration protocol over named members (`members`, in pool order)."""

    name: str
    members: list[str]
    nodes: list[Node]
    edges: list[Edge] = Field(default_factory=list)
    routes: list[Route] = Field(default_factory=list)
    output: str
    params: dict[str, Any] = Field(default_factory=dict)
    empty_fallback: str | None = None
    description: str | None = None

    def node(self, name: str) -> Seat | LogitSeat | Aggregate:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"graph {self.name!r} has no node {name!r}")

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def seats_of(self, member: str) -> list[str]:
        """Names of the nodes `member` sits in."""
        out = []
        for n in self.nodes:
            if (isinstance(n, Seat) and n.member == member) or (
                isinstance(n, LogitSeat) and member in n.members
            ):
                out.append(n.name)
        return out

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraphSpec:
        return cls.model_validate(data)

    def validate_for(self, pool_names: list[str] | None = None) -> GraphSpec:
        """Raise `SpecError` listing every problem; return self when valid."""
        problems = find_problems(self, pool_names)
        if problems:
            raise SpecError(self.name, problems)
        return self


def template_fields(template: str) -> list[str]:
    """Top-level variable names a str.format template uses."""
    names = []
    for _, field, _, _ in string.Formatter().parse(template):
        if field:
            root = field.split(".")[0].split("[")[0]
            if root and root not in names:
                names.append(root)
    return names


def is_pattern(ref: str) -> bool:
    return ref.endswith("*")


def is_optional(ref: str) -> bool:
    """`key?` reads `key` when some node wrote it and "" otherwise (a coalition may have removed the writer)."""
    return ref.endswith("?")


def written_keys(spec: GraphSpec) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in spec.nodes:
        out.setdefault(n.writes, []).append(n.name)
    return out


def graph_edges(spec: GraphSpec) -> list[tuple[str, str, str]]:
    """Every edge as (source, target, kind) with kind 'static' or 'route'."""
    return edge_triples(spec.edges, spec.routes)


def edge_triples(edges: Iterable[Edge], routes: Iterable[Route]) -> list[tuple[str, str, str]]:
    """`edges` and `routes` as (source, target, kind) with kind 'static' or 'route' (a join: one per source)."""
    out = [(s, e.target, "static") for e in edges for s in e.sources]
    for r in routes:
        targets = set(r.path_map.values()) | {r.default} | ({r.exit} if r.exit else set())
        out.extend((r.source, t, "route") for t in sorted(targets))
    return out


def find_problems(spec: GraphSpec, pool_names: list[str] | None = None) -> list[str]:
    """Every problem with `spec` (empty when valid)."""
    problems: list[str] = []
    names = spec.node_names
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"duplicate node name(s): {', '.join(dupes)}")
    for reserved in (START, END):
        if reserved in names:
            problems.append(f"node name {reserved!r} is reserved")
    known = set(names) | {START, END}
    members = set(spec.members)
    if pool_names is not None:
        missing = [m for m in spec.members if m not in pool_names]
        if missing:
            problems.append(f"member(s) {', '.join(missing)} not in the pool ({', '.join(pool_names)})")
    for n in spec.nodes:
        seat_members = [n.member] if isinstance(n, Seat) else n.members if isinstance(n, LogitSeat) else []
        for m in seat_members:
            if m not in members:
                problems.append(
                    f"node {n.name!r}: unknown member {m!r} (graph members: {', '.join(spec.members)})"
                )
        if isinstance(n, Seat) and n.on_absent == "fallback" and n.fallback is None:
            problems.append(f"seat {n.name!r}: on_absent='fallback' needs a `fallback` aggregator")
    writers = written_keys(spec)
    for key, ws in writers.items():
        if len(ws) > 1:
            problems.append(
                f"state key {key!r} is written by several nodes ({', '.join(ws)}); give each its own key"
            )
    for n in spec.nodes:
        for var, ref in n.reads.items():
            if not (is_pattern(ref) or is_optional(ref)) and ref not in writers and ref not in BUILTIN_KEYS:
                problems.append(f"node {n.name!r} reads {ref!r} (as {var!r}) but no node writes it")
    if spec.output not in writers:
        problems.append(f"output key {spec.output!r} is written by no node")
    for src, tgt, kind in graph_edges(spec):
        if src not in known or src == END:
            problems.append(f"{kind} edge from unknown node {src!r}")
        if tgt not in known or tgt == START:
            problems.append(f"{kind} edge to unknown node {tgt!r}")
    for r in spec.routes:
        if r.max_visits is not None and (r.exit is None or r.max_visits < 1):
            problems.append(f"route after {r.source!r}: max_visits needs an `exit` target and a bound >= 1")
        if r.on_source_absent is not None and r.on_source_absent not in r.path_map:
            problems.append(
                f"route after {r.source!r}: on_source_absent {r.on_source_absent!r} is not a path_map key "
                f"({', '.join(r.path_map)})"
            )
    if problems:
        return problems
    edges = [(src, tgt) for src, tgt, _ in graph_edges(spec)]
    if _has_cycle(known, edges):  # (only a graph with loops needs networkx: to name each loop)
        import networkx as nx

        bounded = {r.source for r in spec.routes if r.max_visits is not None}
        graph = nx.DiGraph()
        graph.add_nodes_from(known)
        graph.add_edges_from(edges)
        for cycle in nx.simple_cycles(graph):
            if not bounded.intersection(cycle):
                problems.append(
                    f"loop {' -> '.join([*cycle, cycle[0]])} has no bound (set max_visits on a route in it)"
                )
    from_start = reachable(START, edges)
    to_end = reachable(END, [(tgt, src) for src, tgt in edges])
    if END not in from_start:
        problems.append("END is unreachable from START")
    for name in names:
        if name not in from_start:
            problems.append(f"node {name!r} is unreachable from START")
        elif name not in to_end:
            problems.append(f"END is unreachable from node {name!r}")
    return problems


def reachable(start: str, edges: Iterable[tuple[str, str]]) -> set[str]:
    """The nodes a path along `edges` reaches from `start` (itself included)."""
    after: dict[str, list[str]] = {}
    for src, tgt in edges:
        after.setdefault(src, []).append(tgt)
    seen, todo = {start}, [start]
    while todo:
        for nxt in after.get(todo.pop(), []):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _has_cycle(nodes: set[str], edges: list[tuple[str, str]]) -> bool:
    """Whether `edges` close a loop (Kahn's algorithm: some node is never freed of incoming edges)."""
    incoming = dict.fromkeys(nodes, 0)
    after: dict[str, list[str]] = {}
    for src, tgt in edges:
        incoming[tgt] = incoming.get(tgt, 0) + 1
        after.setdefault(src, []).append(tgt)
    free = [n for n, count in incoming.items() if count == 0]
    freed = 0
    while free:
        freed += 1
        for nxt in after.get(free.pop(), []):
            incoming[nxt] -= 1
            if incoming[nxt] == 0:
                free.append(nxt)
    return freed < len(incoming)
