"""GraphSpec validation: every problem is found and named; the builder produces valid specs."""

from __future__ import annotations

import pytest

from colab_graphs.builder import GraphBuilder
from colab_graphs.spec import END, START, GraphSpec, SpecError, template_fields


def two_seats(members: list[str] | None = None) -> GraphBuilder:
    b = GraphBuilder("pair", members=members or ["a", "b"])
    b.seat("draft", member="a", prompt="{input}", writes="draft")
    b.seat("final", member="b", prompt="Improve: {d}", reads={"d": "draft"}, writes="final")
    return b.chain("draft", "final").output("final")


def problems_of(b: GraphBuilder, pool: list[str] | None = None) -> list[str]:
    with pytest.raises(SpecError) as err:
        b.build(validate=False).validate_for(pool)
    return err.value.problems


def test_a_valid_chain_builds() -> None:
    spec = two_seats().build()
    assert spec.node_names == ["draft", "final"]
    assert [(e.sources, e.target) for e in spec.edges] == [
        ([START], "draft"),
        (["draft"], "final"),
        (["final"], END),
    ]


def test_seat_with_unknown_member_is_named() -> None:
    b = GraphBuilder("g", members=["a"])
    b.seat("s", member="zed", prompt="{input}").chain("s").output("s")
    assert problems_of(b) == ["node 's': unknown member 'zed' (graph members: a)"]


def test_graph_member_missing_from_the_pool_is_named() -> None:
    (problem,) = problems_of(two_seats(), pool=["a", "c"])
    assert problem == "member(s) b not in the pool (a, c)"


def test_loop_without_bound_is_rejected() -> None:
    b = two_seats()
    b.route("final", "match_name", {"again": "draft", "done": END}, key="final")
    (problem,) = problems_of(b)
    assert (
        problem.startswith("loop ") and "draft" in problem and "final" in problem and "max_visits" in problem
    )


def test_loop_with_bound_is_accepted() -> None:
    b = GraphBuilder("loop", members=["a"])
    b.seat("draft", member="a", prompt="{input} {prev}", reads={"prev": "draft"}, writes="draft")
    b.edge(START, "draft").route(
        "draft", "match_name", {"again": "draft", "done": END}, max_visits=3, exit=END
    )
    b.output("draft").build()


def test_bound_needs_an_exit() -> None:
    b = GraphBuilder("loop", members=["a"])
    b.seat("draft", member="a", prompt="{input}", writes="draft")
    b.edge(START, "draft").route("draft", "match_name", {"again": "draft", "done": END}, max_visits=2)
    assert problems_of(b.output("draft")) == [
        "route after 'draft': max_visits needs an `exit` target and a bound >= 1"
    ]


def test_end_unreachable_is_named() -> None:
    b = GraphBuilder("g", members=["a"])
    b.seat("s", member="a", prompt="{input}").edge(START, "s").output("s")
    assert problems_of(b) == ["END is unreachable from START", "END is unreachable from node 's'"]


def test_node_unreachable_from_start_is_named() -> None:
    b = two_seats()
    b.seat("orphan", member="a", prompt="{input}").edge("orphan", END)
    assert problems_of(b) == ["node 'orphan' is unreachable from START"]


def test_reading_a_key_nobody_writes_is_named() -> None:
    b = GraphBuilder("g", members=["a"])
    b.seat("s", member="a", prompt="{x}", reads={"x": "critique"}).chain("s").output("s")
    assert problems_of(b) == ["node 's' reads 'critique' (as 'x') but no node writes it"]


def test_patterns_and_optional_reads_may_match_nothing() -> None:
    b = GraphBuilder("g", members=["a"])
    b.seat("s", member="a", prompt="{x} {y}", reads={"x": "critique:*", "y": "hint?"}).chain("s").output("s")
    b.build()


def test_duplicate_writers_are_named() -> None:
    b = GraphBuilder("g", members=["a", "b"])
    b.seat("s1", member="a", prompt="{input}", writes="ans")
    b.seat("s2", member="b", prompt="{input}", writes="ans")
    b.fan(START, ["s1", "s2"]).edge("s1", END).edge("s2", END).output("ans")
    assert problems_of(b) == ["state key 'ans' is written by several nodes (s1, s2); give each its own key"]


def test_duplicate_node_names_and_reserved_names_are_named() -> None:
    b = GraphBuilder("g", members=["a"])
    b.seat("s", member="a", prompt="{input}", writes="x").seat("s", member="a", prompt="{input}", writes="y")
    b.seat("__end__", member="a", prompt="{input}", writes="z")
    b.chain("s").output("x")
    found = problems_of(b)
    assert "duplicate node name(s): s" in found and "node name '__end__' is reserved" in found


def test_edges_to_unknown_nodes_are_named() -> None:
    b = two_seats().edge("final", "ghost")
    assert "static edge to unknown node 'ghost'" in problems_of(b)


def test_output_must_be_written() -> None:
    b = GraphBuilder("g", members=["a"])
    b.seat("s", member="a", prompt="{input}").chain("s").output("nothing")
    assert problems_of(b) == ["output key 'nothing' is written by no node"]


def test_fallback_without_aggregator_is_named() -> None:
    b = GraphBuilder("g", members=["a"])
    b.seat("s", member="a", prompt="{input}", on_absent="fallback").chain("s").output("s")
    assert problems_of(b) == ["seat 's': on_absent='fallback' needs a `fallback` aggregator"]


def test_every_problem_is_reported_at_once() -> None:
    b = GraphBuilder("g", members=["a"])
    b.seat("s", member="zed", prompt="{x}", reads={"x": "nope"}).chain("s").output("missing")
    with pytest.raises(SpecError) as err:
        b.build()
    assert len(err.value.problems) == 3
    assert str(err.value).startswith("graph 'g' is invalid:\n  - ")


def test_build_without_output_says_how_to_fix_it() -> None:
    b = GraphBuilder("g", members=["a"]).seat("s", member="a", prompt="{input}").chain("s")
    with pytest.raises(ValueError, match=r"\.output\(key\)"):
        b.build()


def test_spec_round_trips_through_a_dict() -> None:
    b = GraphBuilder("g", members=["a", "b"], rounds=2)
    b.seat("x", member="a", prompt="{input}", settings={"temperature": 0.7}, sample=1)
    b.seat("y", member="b", prompt="{input}", on_absent="fallback", fallback=("first", {"extract": True}))
    b.aggregate("v", "vote", reads={"all": "*"}, writes="final")
    b.fan(START, ["x", "y"], join="v").edge("v", END).output("final")
    spec = b.build()
    again = GraphSpec.from_dict(spec.to_dict())
    assert again == spec and again.params == {"rounds": 2}
    assert again.node("y").fallback.params == {"extract": True}


def test_seats_of_lists_a_members_nodes() -> None:
    b = GraphBuilder("g", members=["a", "b"])
    b.seat("x", member="a", prompt="{input}").seat("y", member="b", prompt="{input}")
    b.seat("z", member="a", prompt="{input}")
    spec = b.chain("x", "y", "z").output("z").build()
    assert spec.seats_of("a") == ["x", "z"] and spec.seats_of("b") == ["y"]


def test_template_fields_reads_top_level_names() -> None:
    assert template_fields("{input} and {ex.field} and {items[0]} {input}") == ["input", "ex", "items"]


def test_on_source_absent_must_name_a_path() -> None:
    b = GraphBuilder("cascade", members=["a", "b"])
    b.seat("cheap", member="a", prompt="{input}").seat("strong", member="b", prompt="{input}")
    b.edge(START, "cheap").edge("strong", END)
    b.route(
        "cheap", "confidence", {"accept": END, "defer": "strong"}, on_source_absent="escalate", key="cheap"
    )
    assert problems_of(b.output("strong")) == [
        "route after 'cheap': on_source_absent 'escalate' is not a path_map key (accept, defer)"
    ]
