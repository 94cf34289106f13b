"""Fused compilation: a protocol without routes runs as one LangGraph node, level by level.

The runner, audits and training compile with `fuse=True` (LangGraph's per-node machinery is most of the
framework's CPU per run). Fusion must not change anything a user can see in a run's results: the same
requests, the same answers, the same state, for every protocol and every coalition of it.
"""

from __future__ import annotations

import time

import pytest

import colab_graphs._env  # noqa: F401  (offline settings, before litellm is imported)
from colab_graphs.builder import GraphBuilder
from colab_graphs.coalition import restrict
from colab_graphs.compile import FUSED_NODE, DirectGraph, compile_direct, compile_graph, fusion_levels
from colab_graphs.models.client import CallError, ModelClient
from colab_graphs.models.flight import Memo
from colab_graphs.protocol_registry import build_protocol, list_protocols
from colab_graphs.runner import run_example
from colab_graphs.tasks.example import Example
from colab_graphs.testing.scripts import Member, echo
from tests.conftest import server_pool

TEAM = ["alice", "bob", "carol"]
EXAMPLES = [
    Example(id="e1", input="What is 2 + 3?", answer="5"),
    Example(id="e2", input="What is 7 - 4?", answer="3"),
]


def _api_protocols() -> list[str]:
    # need in-process models, or a fit on a dev split, not scripted API members alone
    local_only = {"local_logits", "local_weights", "dev_split"}
    return [p.name for p in list_protocols() if not local_only & set(p.requires or [])]


def test_levels_of_the_fusable_protocols() -> None:
    assert fusion_levels(build_protocol("majority_vote", TEAM)) == [
        ["answer_alice", "answer_bob", "answer_carol"],
        ["vote"],
    ]
    assert fusion_levels(build_protocol("debate", TEAM, rounds=2)) == [
        ["r1_alice", "r1_bob", "r1_carol"],
        ["r2_alice", "r2_bob", "r2_carol"],
        ["vote"],
    ]
    # Routes (a cascade's "escalate or stop") are compiled node by node.
    assert fusion_levels(build_protocol("cascade", TEAM)) is None


def test_a_join_runs_after_its_latest_source() -> None:
    b = GraphBuilder("uneven", members=["a", "b"])
    b.seat("fast", member="a", prompt="{input}", writes="fast")
    b.seat("slow1", member="b", prompt="{input}", writes="slow1")
    b.seat("slow2", member="b", prompt="{x}", reads={"x": "slow1"}, writes="slow2")
    b.aggregate("pick", fn="concat", reads={"all": "*"}, writes="out")
    b.edge("__start__", "fast").edge("__start__", "slow1").edge("slow1", "slow2")
    b.edge(["fast", "slow2"], "pick").edge("pick", "__end__")
    spec = b.output("out").build()
    assert fusion_levels(spec) == [["fast", "slow1"], ["slow2"], ["pick"]]


@pytest.mark.parametrize("name", _api_protocols())
def test_fused_and_unfused_runs_are_identical_for_every_coalition(name, scripted_server, arun) -> None:
    """Every member echoes its prompt, so each answer spells out exactly what its seat saw and in which order.

    The audits' `DirectGraph` (the fused node's function without LangGraph's loop; routed protocols fall back
    to the fused graph) with one seat memo shared by an example's coalitions gives the same outcome too.
    """
    server = scripted_server({m: echo() for m in TEAM})
    pool = server_pool(server, TEAM)
    full = build_protocol(name, TEAM)
    coalitions = [full.members] + [[m for m in full.members if m != out] for out in full.members]
    memos = {example.id: Memo() for example in EXAMPLES}  # shared by an example's coalitions, as in audits
    for members in coalitions:
        spec = restrict(full, members)
        if spec is None:
            continue
        fused = compile_graph(spec, pool, fuse=True)
        plain = compile_graph(spec, pool, fuse=False)
        direct = compile_direct(spec, pool)
        for example in EXAMPLES:
            a = arun(run_example(fused, spec, pool, ModelClient(None), example))
            b = arun(run_example(plain, spec, pool, ModelClient(None), example))
            c = arun(run_example(direct, spec, pool, ModelClient(None), example, memo=memos[example.id]))
            assert not a.failed and not b.failed and not c.failed, (a.error, b.error, c.error)
            assert a.output == b.output == c.output
            assert a.trace.state == b.trace.state == c.trace.state
            calls = sorted((c.node, c.key) for c in a.trace.calls)
            assert calls == sorted((c.node, c.key) for c in b.trace.calls)
            assert calls == sorted((call.node, call.key) for call in c.trace.calls)


def test_audits_run_fusable_protocols_directly_and_routed_ones_as_the_fused_graph(scripted_server) -> None:
    pool = server_pool(scripted_server({m: "The answer is 5" for m in TEAM}), TEAM)
    assert isinstance(compile_direct(build_protocol("debate", TEAM), pool), DirectGraph)
    routed = compile_direct(build_protocol("cascade", TEAM), pool)
    assert not isinstance(routed, DirectGraph) and hasattr(routed, "get_graph")


def test_a_fused_graph_is_one_node_and_a_routed_one_is_not(scripted_server) -> None:
    server = scripted_server({m: "The answer is 5" for m in TEAM})
    pool = server_pool(server, TEAM)
    vote = compile_graph(build_protocol("majority_vote", TEAM), pool, fuse=True)
    assert set(vote.get_graph().nodes) == {"__start__", FUSED_NODE, "__end__"}
    cascade_spec = build_protocol("cascade", TEAM)
    cascade = compile_graph(cascade_spec, pool, fuse=True)
    assert set(cascade.get_graph().nodes) == {"__start__", "__end__", *cascade_spec.node_names}


def test_fused_graph_runs_under_sync_invoke(scripted_server) -> None:
    server = scripted_server(
        {"alice": "The answer is 5", "bob": "The answer is 5", "carol": "The answer is 4"}
    )
    pool = server_pool(server, TEAM)
    graph = compile_graph(build_protocol("majority_vote", TEAM), pool, ModelClient(None), fuse=True)
    assert "5" in graph.invoke({"input": "What is 2 + 3?"})["answer"]


def test_a_failed_seat_fails_the_run_and_cancels_its_level(scripted_server, arun) -> None:
    """As in a LangGraph superstep: the first failure ends the run; the level's other calls do not linger."""
    server = scripted_server(
        {"alice": Member("The answer is 5", latency_s=5.0), "bob": "The answer is 5", "carol": "x"},
        down_models=["carol"],
    )
    pool = server_pool(server, TEAM)
    spec = build_protocol("majority_vote", TEAM)
    graph = compile_graph(spec, pool, fuse=True)
    started = time.perf_counter()
    outcome = arun(run_example(graph, spec, pool, ModelClient(None, retries=0), EXAMPLES[0]))
    assert outcome.failed and "carol" in (outcome.error or "")
    assert time.perf_counter() - started < 4.0  # alice's 5 s reply was not waited for

    sync = compile_graph(spec, pool, ModelClient(None, retries=0), fuse=True)
    with pytest.raises(CallError, match="carol"):
        sync.invoke({"input": "What is 2 + 3?"})
