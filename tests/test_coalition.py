"""The coalition transformer: each node's removal rule, edge rewiring on chains, joins and routes."""

from __future__ import annotations

import pytest

from colab_graphs.builder import GraphBuilder
from colab_graphs.coalition import CoalitionError, restrict
from colab_graphs.compile import compile_graph
from colab_graphs.models.client import ModelClient
from colab_graphs.spec import END, START, Aggregate, GraphSpec, LogitSeat, Seat


def edges(spec: GraphSpec) -> list[tuple[tuple[str, ...], str]]:
    return [(tuple(e.sources), e.target) for e in spec.edges]


def chain3(read_middle: str = "mid?") -> GraphSpec:
    """a drafts, b revises, c finalises; c reads b's revision through `read_middle`."""
    b = GraphBuilder("chain", members=["a", "b", "c"])
    b.seat("first", member="a", prompt="{input}", writes="first")
    b.seat("middle", member="b", prompt="{x}", reads={"x": "first"}, writes="mid")
    b.seat("last", member="c", prompt="{x} {y}", reads={"x": "first", "y": read_middle}, writes="out")
    return b.chain("first", "middle", "last").output("out").build()


def voting(members: list[str]) -> GraphSpec:
    b = GraphBuilder("vote", members=members)
    seats = [f"ans_{m}" for m in members]
    for m, s in zip(members, seats, strict=True):
        b.seat(s, member=m, prompt="{input}", writes=f"ans:{m}")
    b.aggregate("vote", "vote", reads={"all": "ans:*"}, writes="final")
    return b.fan(START, seats, join="vote").edge("vote", END).output("final").build()


def cascade(on_target_absent: str = "skip", on_source_absent: str | None = None) -> GraphSpec:
    """cheap (a) accepts or defers to strong (b); pick takes the last answer written."""
    b = GraphBuilder("cascade", members=["a", "b"])
    b.seat("cheap", member="a", prompt="{input}", writes="cheap")
    b.seat("strong", member="b", prompt="{input}", writes="strong")
    b.aggregate("pick", "last", reads={"c": "cheap?", "s": "strong?"}, writes="final", extract=True)
    b.edge(START, "cheap").edge("strong", "pick").edge("pick", END)
    b.route(
        "cheap",
        "confidence",
        {"accept": "pick", "defer": "strong"},
        default="strong",
        key="cheap",
        on_target_absent=on_target_absent,
        on_source_absent=on_source_absent,
    )
    return b.output("final").build()


def test_grand_coalition_is_the_spec_itself() -> None:
    spec = chain3()
    assert restrict(spec, ["c", "a", "b"]) is spec


def test_empty_coalition_has_no_graph() -> None:
    assert restrict(chain3(), []) is None


def test_unknown_member_is_an_error() -> None:
    with pytest.raises(CoalitionError, match="unknown member\\(s\\) zed"):
        restrict(chain3(), ["a", "zed"])


def test_chain_is_rewired_around_a_dropped_seat() -> None:
    spec = restrict(chain3(), ["a", "c"])
    assert spec.members == ["a", "c"] and spec.node_names == ["first", "last"]
    assert edges(spec) == [((START,), "first"), (("first",), "last"), (("last",), END)]


def test_dropping_the_first_seat_connects_start_to_the_next() -> None:
    b = GraphBuilder("chain", members=["a", "b"])
    b.seat("first", member="a", prompt="{input}", writes="first")
    b.seat("second", member="b", prompt="{input} {x}", reads={"x": "first?"}, writes="out")
    spec = restrict(b.chain("first", "second").output("out").build(), ["b"])
    assert edges(spec) == [((START,), "second"), (("second",), END)]


def test_dropping_a_seat_whose_output_is_read_exactly_is_a_named_error() -> None:
    with pytest.raises(CoalitionError) as err:
        restrict(chain3(read_middle="mid"), ["a", "c"])
    assert err.value.problems == [
        "coalition ['a', 'c']: node 'last' reads 'mid' (as 'y') but no node writes it"
    ]


def test_join_keeps_its_remaining_sources() -> None:
    spec = restrict(voting(["a", "b", "c"]), ["a", "c"])
    assert spec.node_names == ["ans_a", "ans_c", "vote"]
    assert edges(spec) == [
        ((START,), "ans_a"),
        ((START,), "ans_c"),
        (("ans_a", "ans_c"), "vote"),
        (("vote",), END),
    ]


def test_join_with_one_source_left_is_a_plain_edge() -> None:
    spec = restrict(voting(["a", "b", "c"]), ["b"])
    assert edges(spec) == [((START,), "ans_b"), (("ans_b",), "vote"), (("vote",), END)]


def test_route_skips_a_removed_stage() -> None:
    spec = restrict(cascade(on_target_absent="skip"), ["a"])
    (route,) = spec.routes
    assert route.path_map == {"accept": "pick", "defer": "pick"} and route.default == "pick"
    assert "strong" not in spec.node_names


def test_route_loses_a_removed_candidate() -> None:
    spec = restrict(cascade(on_target_absent="remove"), ["a"])
    (route,) = spec.routes
    assert route.path_map == {"accept": "pick"} and route.default == "pick"


def test_removed_route_source_passes_control_along_its_path() -> None:
    spec = restrict(cascade(on_source_absent="defer"), ["b"])
    assert spec.node_names == ["strong", "pick"] and spec.routes == []
    assert edges(spec) == [((START,), "strong"), (("strong",), "pick"), (("pick",), END)]


def test_removed_route_source_without_a_rule_leaves_no_way_through() -> None:
    with pytest.raises(CoalitionError, match="coalition \\['b'\\]"):
        restrict(cascade(), ["b"])


def test_route_with_no_target_left_is_a_named_error() -> None:
    b = GraphBuilder("router", members=["r", "x", "y"])
    b.seat("pick", member="r", prompt="{input}", writes="choice")
    b.seat("sx", member="x", prompt="{input}", writes="ax").seat(
        "sy", member="y", prompt="{input}", writes="ay"
    )
    b.aggregate("out", "last", reads={"a": "ax?", "b": "ay?"}, writes="final")
    b.edge(START, "pick").edge("sx", "out").edge("sy", "out").edge("out", END)
    b.route("pick", "match_name", {"x": "sx", "y": "sy"}, key="choice", on_target_absent="remove")
    spec = b.output("final").build()
    assert restrict(spec, ["r", "y"]).routes[0].path_map == {"y": "sy"}
    with pytest.raises(CoalitionError, match="route after 'pick' has no target left"):
        restrict(spec, ["r"])


def judged(on_absent: str, **kwargs) -> GraphSpec:
    b = GraphBuilder("judged", members=["a", "b", "j"])
    b.seat("ans_a", member="a", prompt="{input}", writes="ans:a")
    b.seat("ans_b", member="b", prompt="{input}", writes="ans:b")
    b.seat(
        "judge",
        member="j",
        prompt="{all}",
        reads={"all": "ans:*"},
        writes="final",
        on_absent=on_absent,
        **kwargs,
    )
    return b.fan(START, ["ans_a", "ans_b"], join="judge").edge("judge", END).output("final").build()


def test_absent_judge_is_substituted_by_the_first_present_substitute() -> None:
    spec = restrict(judged("substitute", substitutes=["b", "a"]), ["a", "b"])
    judge = spec.node("judge")
    assert isinstance(judge, Seat) and judge.member == "b"
    assert edges(spec) == edges(judged("substitute"))


def test_substitute_without_a_list_takes_the_first_present_pool_member() -> None:
    assert restrict(judged("substitute"), ["b", "a"]).node("judge").member == "a"


def test_absent_judge_falls_back_to_its_aggregator() -> None:
    spec = restrict(judged("fallback", fallback=("vote", {})), ["a", "b"])
    judge = spec.node("judge")
    assert isinstance(judge, Aggregate)
    assert (judge.fn, judge.reads, judge.writes) == ("vote", {"all": "ans:*"}, "final")


def test_logit_seat_keeps_its_present_members_and_goes_when_none_remain() -> None:
    b = GraphBuilder("fusion", members=["a", "b", "c"])
    b.logit_seat("fuse", members=["a", "b"], mode="fusion", prompt="{input}", writes="fused")
    b.seat("solo", member="c", prompt="{input} {f}", reads={"f": "fused?"}, writes="out")
    spec = b.chain("fuse", "solo").output("out").build()
    kept = restrict(spec, ["b", "c"]).node("fuse")
    assert isinstance(kept, LogitSeat) and kept.members == ["b"]
    assert restrict(spec, ["c"]).node_names == ["solo"]


def test_restricted_graph_makes_only_the_present_members_calls(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "The answer is 1.", "b": "The answer is 2.", "c": "The answer is 2."})
    pool = pool_for(server, ["a", "b", "c"])
    graph = compile_graph(restrict(voting(pool.names), ["a", "c"]), pool, ModelClient())
    state = arun(graph.ainvoke({"input": "q"}))
    assert sorted(r.model for r in server.requests) == ["a", "c"]
    # a tie (1 vs 2) goes to the answer of the member first in pool order
    assert state["answer"] == "1"
