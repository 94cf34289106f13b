"""Compiled graphs through real HTTP: chains, parallel fan-out/fan-in, bounded loops, routes, subgraphs."""

from __future__ import annotations

import math
import re
import time
from typing import Any, TypedDict

import pytest

from colab_graphs.builder import GraphBuilder
from colab_graphs.compile import TemplateError, compile_graph
from colab_graphs.models.client import ModelClient
from colab_graphs.spec import END, START
from colab_graphs.testing import Member, echo
from colab_graphs.trace import Trace

pytestmark = pytest.mark.integration


def user_texts(server) -> list[str]:
    return [r.messages[-1]["content"] for r in server.requests]


def test_compiled_graph_is_a_langgraph_object(scripted_server, pool_for) -> None:
    from langgraph.graph.state import CompiledStateGraph

    server = scripted_server({"a": "x"})
    spec = (
        GraphBuilder("g", members=["a"])
        .seat("s", member="a", prompt="{input}")
        .chain("s")
        .output("s")
        .build()
    )
    graph = compile_graph(spec, pool_for(server, ["a"]), ModelClient())
    assert isinstance(graph, CompiledStateGraph)
    assert set(graph.get_graph().nodes) == {"__start__", "s", "__end__"}  # no extra nodes of ours


@pytest.mark.parametrize("fuse", [False, True])
def test_compiled_graphs_describe_their_input_and_output_as_json_schema(fuse: bool) -> None:
    # Pydantic builds these schemas from the state TypedDict; with typing.TypedDict it refuses on Python < 3.12.
    from colab_graphs.pool import Pool
    from colab_graphs.protocol_registry import build_protocol

    pool = Pool.from_dict(
        {"a": {"model": "openai/a"}, "b": {"model": "openai/b"}, "c": {"model": "openai/c"}}
    )
    graph = compile_graph(build_protocol("majority_vote", pool.names), pool, ModelClient(), fuse=fuse)
    assert graph.get_input_jsonschema()["properties"]["input"] == {"title": "Input", "type": "string"}
    assert graph.get_output_jsonschema()["properties"]["answer"] == {"title": "Answer", "type": "string"}


def test_chain_passes_each_seat_its_reads(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "draft one", "b": echo()})
    b = GraphBuilder("pair", members=["a", "b"])
    b.seat("draft", member="a", prompt="Q: {input}", system="You draft.", writes="draft")
    b.seat("final", member="b", prompt="Improve [{d}] for {input}", reads={"d": "draft"}, writes="final")
    spec = b.chain("draft", "final").output("final").build()
    graph = compile_graph(spec, pool_for(server, ["a", "b"]), ModelClient())
    state = arun(graph.ainvoke({"input": "2+2?"}))
    assert state["answer"] == "Improve [draft one] for 2+2?"
    assert server.requests[0].messages == [
        {"role": "system", "content": "You draft."},
        {"role": "user", "content": "Q: 2+2?"},
    ]
    assert state["values"] == {"draft": "draft one", "final": "Improve [draft one] for 2+2?"}
    assert state["visits"] == {"draft": 1, "final": 1}


def test_example_fields_reach_prompt_templates(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": echo()})
    b = GraphBuilder("mc", members=["a"]).seat("s", member="a", prompt="{input} Options: {choices}")
    graph = compile_graph(b.chain("s").output("s").build(), pool_for(server, ["a"]), ModelClient())
    example = {"id": "1", "input": "Pick one.", "choices": "A or B"}
    state = arun(graph.ainvoke({"input": "Pick one.", "example": example}))
    assert state["answer"] == "Pick one. Options: A or B"


def test_unknown_template_variable_names_node_and_available_fields(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "x"})
    b = GraphBuilder("g", members=["a"]).seat("s", member="a", prompt="{input} {topic}")
    graph = compile_graph(b.chain("s").output("s").build(), pool_for(server, ["a"]), ModelClient())
    with pytest.raises(
        TemplateError, match=r"node 's': template variable 'topic' .* \(available: answer_format, input\)"
    ):
        arun(graph.ainvoke({"input": "q"}))
    assert server.requests == []


def test_parallel_seats_overlap_in_time(scripted_server, pool_for, arun) -> None:
    latency = 0.5
    server = scripted_server({n: f"answer {n}" for n in "abc"}, latency_s=latency)
    pool = pool_for(server, ["a", "b", "c"])
    client = ModelClient()
    arun(client.complete(pool["a"], [{"role": "user", "content": "warm up litellm"}]))
    server.reset()
    b = GraphBuilder("fan", members=["a", "b", "c"])
    for n in "abc":
        b.seat(f"s_{n}", member=n, prompt="{input}", writes=f"ans:{n}")
    b.aggregate("join", "concat", reads={"all": "ans:*"}, writes="final")
    spec = b.fan(START, ["s_a", "s_b", "s_c"], join="join").edge("join", END).output("final").build()
    graph = compile_graph(spec, pool, client)
    started = time.perf_counter()
    state = arun(graph.ainvoke({"input": "go"}))
    wall = time.perf_counter() - started
    spans = [(r.time, r.time + r.duration_s) for r in server.requests]
    assert len(spans) == 3
    assert max(s for s, _ in spans) < min(e for _, e in spans), f"seats ran one after another: {spans}"
    assert wall < 2.5 * latency
    assert state["answer"] == "answer a\n\nanswer b\n\nanswer c"


def test_fan_in_reads_answers_in_writer_order_not_finish_order(scripted_server, pool_for, arun) -> None:
    # "a" finishes last, yet its answer comes first: pattern reads follow spec (pool) order.
    server = scripted_server({"a": Member("slow a", latency_s=0.3), "b": "fast b", "c": "fast c"})
    b = GraphBuilder("fan", members=["a", "b", "c"])
    for n in "abc":
        b.seat(f"s_{n}", member=n, prompt="{input}", writes=f"ans:{n}")
    b.seat("judge", member="b", prompt="Pick:\n{answers}", reads={"answers": "ans:*"}, writes="final")
    spec = b.fan(START, ["s_a", "s_b", "s_c"], join="judge").edge("judge", END).output("final").build()
    graph = compile_graph(spec, pool_for(server, ["a", "b", "c"]), ModelClient())
    arun(graph.ainvoke({"input": "go"}))
    judge_prompt = server.requests[-1].messages[-1]["content"]
    assert judge_prompt == "Pick:\nResponse 1:\nslow a\n\nResponse 2:\nfast b\n\nResponse 3:\nfast c"


def solvers_and_judge(order: str) -> GraphBuilder:
    """README's two solvers and a judge, its edges written fan-then-chain or chain-then-fan."""
    b = GraphBuilder("judged", members=["a", "b", "c"])
    b.seat("solve_a", member="a", prompt="{input}", writes="solution:a")
    b.seat("solve_b", member="b", prompt="{input}", writes="solution:b")
    b.seat(
        "judge", member="c", prompt="Pick:\n{solutions}", reads={"solutions": "solution:*"}, writes="verdict"
    )
    b.aggregate("final", "extract", reads={"answer": "verdict"}, writes="final")
    if order == "fan first":
        b.fan(START, ["solve_a", "solve_b"], join="judge").chain("judge", "final")
    else:
        b.chain("judge", "final").fan(START, ["solve_a", "solve_b"], join="judge")
    return b.output("final")


@pytest.mark.parametrize("order", ["fan first", "chain first"])
def test_a_chain_that_continues_a_join_runs_its_first_node_once(
    scripted_server, pool_for, arun, order
) -> None:
    # `chain` enters from START only where nothing else leads to its first node: here the join does, and a
    # START -> judge edge would run the judge a second time, before the solvers, on no solutions.
    server = scripted_server({"a": "The answer is 51.", "b": "The answer is 52.", "c": "The answer is 51."})
    spec = solvers_and_judge(order).build()
    assert [(e.sources, e.target) for e in spec.edges if e.target == "judge"] == [
        (["solve_a", "solve_b"], "judge")
    ]
    state = arun(
        compile_graph(spec, pool_for(server, ["a", "b", "c"]), ModelClient()).ainvoke({"input": "17 * 3?"})
    )
    assert state["answer"] == "51"
    assert sorted(r.model for r in server.chat_requests) == ["a", "b", "c"]  # one call per seat
    assert server.chat_requests[-1].messages[-1]["content"] == (
        "Pick:\nResponse 1:\nThe answer is 51.\n\nResponse 2:\nThe answer is 52."
    )


def test_a_chain_keeps_its_start_edge_where_only_a_loop_leads_back_to_it() -> None:
    b = GraphBuilder("revise", members=["a"])
    b.seat("draft", member="a", prompt="{input} {prev}", reads={"prev": "draft?"}, writes="draft")
    b.aggregate("final", "extract", reads={"answer": "draft"}, writes="final")
    b.chain("draft", "final").route("draft", "match_name", {"again": "draft"}, max_visits=2, exit="final")
    edges = [(e.sources, e.target) for e in b.output("final").build().edges]
    assert edges[0] == ([START], "draft")  # the loop back into `draft` is no way in from START


def test_an_explicit_start_edge_is_kept_beside_a_join() -> None:
    b = solvers_and_judge("fan first").edge(START, "judge")  # asked for in so many words: kept
    assert ([START], "judge") in [(e.sources, e.target) for e in b.build().edges]


def counting_writer(stop_at: int | None = None):
    """A script that answers "again N", N one more than the last number in its prompt; "done" at stop_at."""

    def script(messages: list[dict[str, Any]], params: dict[str, Any]) -> str:
        n = int((re.findall(r"\d+", messages[-1]["content"]) or ["0"])[-1]) + 1
        return "done" if stop_at is not None and n >= stop_at else f"again {n}"

    return script


def loop_graph(server, pool_for, max_visits: int):
    b = GraphBuilder("loop", members=["a"])
    b.seat("draft", member="a", prompt="{input} prev: {prev}", reads={"prev": "draft?"}, writes="draft")
    b.edge(START, "draft")
    b.route(
        "draft", "match_name", {"again": "draft", "done": END}, max_visits=max_visits, exit=END, key="draft"
    )
    return compile_graph(b.output("draft").build(), pool_for(server, ["a"]), ModelClient())


def test_bounded_loop_stops_at_max_visits(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": counting_writer()})
    state = arun(loop_graph(server, pool_for, max_visits=3).ainvoke({"input": "go"}))
    assert state["visits"] == {"draft": 3}
    assert state["answer"] == "again 3"
    assert user_texts(server) == ["go prev: ", "go prev: again 1", "go prev: again 2"]


def test_loop_leaves_early_when_the_router_says_so(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": counting_writer(stop_at=2)})
    state = arun(loop_graph(server, pool_for, max_visits=5).ainvoke({"input": "go"}))
    assert state["visits"] == {"draft": 2} and state["answer"] == "done"


def test_confidence_route_uses_recorded_logprobs(scripted_server, pool_for, arun) -> None:
    server = scripted_server(
        {"sure": Member("The answer is 4.", confidence=0.9), "unsure": Member("maybe 5", confidence=0.2)}
    )

    def cascade(first: str):
        b = GraphBuilder("cascade", members=[first, "sure"])
        b.seat("cheap", member=first, prompt="{input}", writes="cheap", settings={"logprobs": True})
        b.seat("strong", member="sure", prompt="{input}", writes="strong")
        b.aggregate("pick", "last", reads={"c": "cheap", "s": "strong?"}, writes="final", extract=True)
        b.edge(START, "cheap").edge("strong", "pick").edge("pick", END)
        b.route("cheap", "confidence", {"accept": "pick", "defer": "strong"}, key="cheap", threshold=0.7)
        return b.output("final").build()

    graph = compile_graph(cascade("unsure"), pool_for(server, ["unsure", "sure"]), ModelClient())
    state = arun(graph.ainvoke({"input": "2+2?"}))
    assert math.isclose(state["values"]["cheap#logprob"], math.log(0.2))
    assert "strong" in state["values"] and state["answer"] == "4"

    server.reset()
    graph = compile_graph(cascade("sure"), pool_for(server, ["sure"]), ModelClient())
    state = arun(graph.ainvoke({"input": "2+2?"}))
    assert "strong" not in state["values"] and len(server.requests) == 1


class ParentState(TypedDict, total=False):
    question: str
    input: str
    answer: str
    shout: str


def test_compiled_graph_works_as_a_subgraph_node(scripted_server, pool_for, arun) -> None:
    from langgraph.graph import StateGraph

    server = scripted_server({"a": "The answer is 12.", "b": "The answer is 12.", "c": "The answer is 7."})
    from colab_graphs.protocols.basic import majority_vote

    pool = pool_for(server, ["a", "b", "c"])
    team = compile_graph(majority_vote(pool.names), pool, ModelClient())
    parent = StateGraph(ParentState)
    parent.add_node("ask", lambda s: {"input": f"What is {s['question']}?"})
    parent.add_node("team", team)
    parent.add_node("shout", lambda s: {"shout": s["answer"] + "!"})
    parent.add_edge(START, "ask")
    parent.add_edge("ask", "team")
    parent.add_edge("team", "shout")
    parent.add_edge("shout", END)
    app = parent.compile()
    state = arun(app.ainvoke({"question": "3 * 4"}))
    assert state == {"question": "3 * 4", "input": "What is 3 * 4?", "answer": "12", "shout": "12!"}
    assert len(server.requests) == 3
    assert {r.messages[-1]["content"].split("\n")[0] for r in server.requests} == {"What is 3 * 4?"}


def test_graph_without_pool_or_runtime_says_what_is_missing(arun) -> None:
    spec = (
        GraphBuilder("g", members=["a"])
        .seat("s", member="a", prompt="{input}")
        .chain("s")
        .output("s")
        .build()
    )
    graph = compile_graph(spec)
    with pytest.raises(RuntimeError, match="no model client"):
        arun(graph.ainvoke({"input": "q"}))


def test_compile_checks_members_against_the_pool(scripted_server, pool_for) -> None:
    from colab_graphs.spec import SpecError

    server = scripted_server({"a": "x"})
    spec = GraphBuilder("g", members=["zed"]).seat("s", member="zed", prompt="{input}").chain("s").output("s")
    with pytest.raises(SpecError, match="member\\(s\\) zed not in the pool"):
        compile_graph(spec.build(), pool_for(server, ["a"]), ModelClient())


def test_the_one_private_langgraph_seam_builds_nodes_that_receive_the_run_context(scripted_server, pool_for):
    """compile._node builds nodes with LangGraph's private RunnableCallable (sync and async forms in one node):
    pin it, and check that LangGraph hands such a node our RunContext through its `runtime` parameter."""
    from langgraph._internal._runnable import RunnableCallable

    from colab_graphs.compile import RunContext, _node

    async def afn(state, runtime=None):
        return {"values": {"seen": type(runtime.context).__name__}}

    assert isinstance(_node(afn), RunnableCallable)
    server = scripted_server({"a": "The answer is 4"})
    pool = pool_for(server, ["a"])
    b = GraphBuilder("g", members=["a"]).seat("s", member="a", prompt="{input}", writes="s")
    graph = compile_graph(b.chain("s").output("s").build())  # no pool: only the context can supply one
    trace = Trace(example_id="x", protocol="g")
    state = graph.invoke({"input": "2 + 2?"}, context=RunContext(ModelClient(None), pool, trace))
    assert state["answer"] == "The answer is 4" and [c.member for c in trace.calls] == ["a"]
