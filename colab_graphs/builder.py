"""A small Python DSL that produces a GraphSpec.

Example:
    >>> from colab_graphs.builder import GraphBuilder
    >>> b = GraphBuilder("two_step", members=["a", "b"])
    >>> _ = b.seat("draft", member="a", prompt="{input}", writes="draft")
    >>> _ = b.seat("final", member="b", prompt="Improve: {draft}", reads={"draft": "draft"}, writes="final")
    >>> spec = b.chain("draft", "final").output("final").build()
    >>> [n.name for n in spec.nodes]
    ['draft', 'final']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from colab_graphs.spec import (
    END,
    START,
    Aggregate,
    AggregatorRef,
    Edge,
    GraphSpec,
    LogitMode,
    LogitSeat,
    OnAbsent,
    OnTargetAbsent,
    Route,
    Seat,
    edge_triples,
    reachable,
)


class GraphBuilder:
    """Mutable builder; every method returns `self` so calls chain. `build()` validates and freezes."""

    def __init__(self, name: str, members: Sequence[str], description: str | None = None, **params: Any):
        self.name = name
        self.members = list(members)
        self.description = description
        self.params = dict(params)
        self._nodes: list[Seat | LogitSeat | Aggregate] = []
        self._edges: list[Edge] = []
        # The START -> first-node edges `chain` added on its own: `build` keeps one only where nothing else
        # leads to that node, so `fan(START, ..., join="judge").chain("judge", ...)` runs the judge once.
        self._implicit_starts: list[Edge] = []
        self._routes: list[Route] = []
        self._output: str | None = None
        self._empty_fallback: str | None = None

    def seat(
        self,
        name: str,
        *,
        member: str,
        prompt: str,
        writes: str | None = None,
        reads: dict[str, str] | None = None,
        system: str | None = None,
        sample: int = 0,
        settings: dict[str, Any] | None = None,
        on_absent: OnAbsent = "drop",
        substitutes: list[str] | None = None,
        fallback: tuple[str, dict[str, Any]] | str | None = None,
        role: str | None = None,
    ) -> GraphBuilder:
        """Add a model seat. `writes` defaults to the seat's name."""
        fb = None
        if fallback is not None:
            fb = (
                AggregatorRef(fn=fallback)
                if isinstance(fallback, str)
                else AggregatorRef(fn=fallback[0], params=fallback[1])
            )
        self._nodes.append(
            Seat(
                name=name,
                member=member,
                prompt=prompt,
                writes=writes or name,
                reads=dict(reads or {}),
                system=system,
                sample=sample,
                settings=dict(settings or {}),
                on_absent=on_absent,
                substitutes=substitutes,
                fallback=fb,
                role=role,
            )
        )
        return self

    def logit_seat(
        self,
        name: str,
        *,
        members: Sequence[str],
        mode: LogitMode,
        prompt: str,
        writes: str | None = None,
        reads: dict[str, str] | None = None,
        system: str | None = None,
        settings: dict[str, Any] | None = None,
        **params: Any,
    ) -> GraphBuilder:
        """Add a logit-level seat decoded jointly by local `members` (`mode`: fusion | contrastive | nudging | co_llm)."""
        self._nodes.append(
            LogitSeat(
                name=name,
                members=list(members),
                mode=mode,
                prompt=prompt,
                writes=writes or name,
                reads=dict(reads or {}),
                system=system,
                settings=dict(settings or {}),
                params=params,
            )
        )
        return self

    def aggregate(
        self, name: str, fn: str, *, reads: dict[str, str], writes: str | None = None, **params: Any
    ) -> GraphBuilder:
        """Add a pure-Python node running registered aggregator `fn` (vote, first, concat, extract, ...)."""
        self._nodes.append(
            Aggregate(name=name, fn=fn, reads=dict(reads), writes=writes or name, params=params)
        )
        return self

    def edge(self, source: str | Iterable[str], target: str) -> GraphBuilder:
        """`source` -> `target`; an iterable of sources is a join (target waits for all)."""
        sources = [source] if isinstance(source, str) else list(source)
        self._edges.append(Edge(sources=sources, target=target))
        return self

    def chain(self, *names: str) -> GraphBuilder:
        """names[0] -> ... -> names[-1] -> END, entered from START unless something else leads to names[0].

        The START edge is the chain's entry only where it needs one: when `build` finds names[0] reached by
        another edge or route from START (a `fan(..., join=names[0])`, an earlier chain), the chain continues
        that path and adds no START edge, which would run names[0] a second time. Write
        `edge(START, names[0])` to enter it from START as well.
        """
        if not names:
            return self.edge(START, END)
        self.edge(START, names[0])
        self._implicit_starts.append(self._edges[-1])
        path = [*names, END]
        for a, b in zip(path, path[1:], strict=False):
            self.edge(a, b)
        return self

    def fan(
        self, sources: str | Iterable[str], targets: Iterable[str], join: str | None = None
    ) -> GraphBuilder:
        """Each target after `sources` (in parallel); with `join`, a join of all targets into it."""
        targets = list(targets)
        for t in targets:
            self.edge(sources, t)
        if join is not None:
            self.edge(targets, join)
        return self

    def route(
        self,
        source: str,
        fn: str,
        path_map: dict[str, str],
        *,
        default: str | None = None,
        max_visits: int | None = None,
        exit: str | None = None,
        on_target_absent: OnTargetAbsent = "skip",
        on_source_absent: str | None = None,
        **params: Any,
    ) -> GraphBuilder:
        """A conditional edge after `source`: router `fn` picks a `path_map` key (params incl. `key`).

        `on_target_absent` and `on_source_absent` are the route's coalition rules (see `Route`): "skip" a
        removed target (a cascade's next stage) or "remove" its path (a router's candidate); when `source`
        itself is removed, control continues along the `on_source_absent` path key.
        """
        self._routes.append(
            Route(
                source=source,
                fn=fn,
                params=params,
                path_map=dict(path_map),
                default=default if default is not None else next(iter(path_map.values())),
                max_visits=max_visits,
                exit=exit,
                on_target_absent=on_target_absent,
                on_source_absent=on_source_absent,
            )
        )
        return self

    def output(self, key: str) -> GraphBuilder:
        self._output = key
        return self

    def empty_fallback(self, answer: str) -> GraphBuilder:
        """The answer the protocol gives when no member is present (default: none; the empty coalition scores 0)."""
        self._empty_fallback = answer
        return self

    def _entered_edges(self) -> list[Edge]:
        """The edges, less each implicit START edge whose target the other edges and routes reach from START."""
        edges = list(self._edges)
        for implicit in self._implicit_starts:
            others = [e for e in edges if e is not implicit]
            pairs = ((s, t) for s, t, _ in edge_triples(others, self._routes))
            if implicit.target in reachable(START, pairs):
                edges = others
        return edges

    def build(self, validate: bool = True) -> GraphSpec:
        if self._output is None:
            raise ValueError(f"graph {self.name!r}: call .output(key) to say which state key is the answer")
        spec = GraphSpec(
            name=self.name,
            members=self.members,
            nodes=list(self._nodes),
            edges=self._entered_edges(),
            routes=list(self._routes),
            output=self._output,
            params=self.params,
            empty_fallback=self._empty_fallback,
            description=self.description,
        )
        return spec.validate_for() if validate else spec
