"""The coalition transformer: `restrict(spec, members)` -> the protocol as run by a subset of its members.

Each node carries its own removal rule, so the rewrite is mechanical:

- a `Seat` whose member is absent is dropped (`on_absent="drop"`), taken over by the first present member of
  its `substitutes` (else of the pool; `"substitute"`), or turned into its pure-Python `fallback` aggregator;
- a `LogitSeat` keeps its present members and is dropped when none remain;
- static edges are rewired around dropped nodes: a dropped source leaves a join that still has other sources,
  and is otherwise replaced by its own predecessors (a chain a -> b -> c without b becomes a -> c);
- a route whose target was dropped either skips it (`on_target_absent="skip"`: a cascade goes to the next
  stage) or loses that path (`"remove"`: a router loses a candidate); a dropped route source passes its
  incoming edges along its `on_source_absent` path.

Reads by pattern (`answer:*`) simply see fewer values. The result is validated; an invalid coalition is a
`SpecError` naming it, never a silently different protocol. The empty coalition has no graph: `restrict`
returns None and the game scores it by the protocol's `empty_fallback` (0 when it has none).
"""

from __future__ import annotations

from collections.abc import Iterable

from colab_graphs.spec import END, START, Aggregate, Edge, GraphSpec, LogitSeat, Route, Seat, SpecError


class CoalitionError(SpecError):
    pass


def restrict(spec: GraphSpec, members: Iterable[str]) -> GraphSpec | None:
    """The spec as played by `members` (any order; unknown names are an error). None for the empty coalition."""
    wanted = set(members)
    unknown = sorted(wanted - set(spec.members))
    if unknown:
        raise CoalitionError(spec.name, [f"coalition names unknown member(s) {', '.join(unknown)}"])
    present = [m for m in spec.members if m in wanted]
    if not present:
        return None
    if len(present) == len(spec.members):
        return spec

    nodes: list[Seat | LogitSeat | Aggregate] = []
    removed: set[str] = set()
    for node in spec.nodes:
        if isinstance(node, Seat) and node.member not in wanted:
            if node.on_absent == "drop":
                removed.add(node.name)
            elif node.on_absent == "substitute":
                candidates = [m for m in (node.substitutes or spec.members) if m in wanted] or present
                nodes.append(node.model_copy(update={"member": candidates[0]}))
            else:
                assert node.fallback is not None
                nodes.append(
                    Aggregate(
                        name=node.name,
                        fn=node.fallback.fn,
                        params=node.fallback.params,
                        reads=node.reads,
                        writes=node.writes,
                    )
                )
        elif isinstance(node, LogitSeat):
            kept = [m for m in node.members if m in wanted]
            if kept:
                nodes.append(node.model_copy(update={"members": kept}))
            else:
                removed.add(node.name)
        else:
            nodes.append(node)

    routes_by_source = {r.source: r for r in spec.routes}
    static_preds: dict[str, list[str]] = {}
    static_succ: dict[str, list[str]] = {}
    for e in spec.edges:
        static_preds.setdefault(e.target, []).extend(e.sources)
        if len(e.sources) == 1:
            static_succ.setdefault(e.sources[0], []).append(e.target)

    def forward(name: str, seen: frozenset[str] = frozenset()) -> str | None:
        """Where control goes instead of a removed node (None: nowhere, the path is cut)."""
        if name not in removed:
            return name
        if name in seen:
            return None
        route = routes_by_source.get(name)
        if route is not None:
            if route.on_source_absent is None:
                return None
            return forward(route.path_map[route.on_source_absent], seen | {name})
        outs = static_succ.get(name, [])
        if len(outs) == 1:
            return forward(outs[0], seen | {name})
        return None

    def backward(name: str, seen: frozenset[str] = frozenset()) -> list[str]:
        """The present nodes (or START) that feed a removed node, through removed ones."""
        if name not in removed:
            return [name]
        if name in seen:
            return []
        out: list[str] = []
        for p in static_preds.get(name, []):
            for q in backward(p, seen | {name}):
                if q not in out:
                    out.append(q)
        return out

    edges: list[Edge] = []

    def add(sources: list[str], target: str) -> None:
        if any(e.sources == sources and e.target == target for e in edges):
            return
        edges.append(Edge(sources=sources, target=target))

    for e in spec.edges:
        target = e.target
        if target in removed:
            route = routes_by_source.get(target)
            if route is None or route.on_source_absent is None:
                continue  # the removed node's own outputs are rewired from its predecessors below
            forwarded = forward(target)
            if forwarded is None:
                continue
            target = forwarded
        kept = [s for s in e.sources if s not in removed]
        if not kept:
            kept = []
            for s in e.sources:
                kept.extend(q for q in backward(s) if q not in kept)
        if not kept:
            continue
        if len(kept) > 1 and START in kept:
            kept = [s for s in kept if s != START]
        add(kept, target)

    routes: list[Route] = []
    for r in spec.routes:
        if r.source in removed:
            continue
        path_map: dict[str, str] = {}
        for key, target in r.path_map.items():
            if target in removed:
                if r.on_target_absent == "remove":
                    continue
                forwarded = forward(target)
                if forwarded is None:
                    continue
                target = forwarded
            path_map[key] = target
        if not path_map:
            raise CoalitionError(
                spec.name, [f"coalition {present}: route after {r.source!r} has no target left"]
            )
        default = r.default
        if default in removed:
            skipped_to = forward(default) if r.on_target_absent == "skip" else None
            default = skipped_to if skipped_to is not None else next(iter(path_map.values()))
        exit_ = forward(r.exit) if r.exit else None
        routes.append(r.model_copy(update={"path_map": path_map, "default": default, "exit": exit_}))

    out = spec.model_copy(update={"members": present, "nodes": nodes, "edges": edges, "routes": routes})
    try:
        return out.validate_for()
    except SpecError as err:
        raise CoalitionError(spec.name, [f"coalition {present}: {p}" for p in err.problems]) from None


__all__ = ["END", "START", "CoalitionError", "restrict"]
