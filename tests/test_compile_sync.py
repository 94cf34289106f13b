"""A compiled graph also runs from synchronous code (`invoke`), e.g. inside a sync LangGraph agent app."""

from __future__ import annotations

from typing import TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from colab_graphs.compile import compile_graph
from colab_graphs.models.client import ModelClient
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.testing.scripts import arithmetic_solver
from tests.conftest import server_pool

pytestmark = pytest.mark.integration


def test_invoke_runs_model_seats_synchronously(scripted_server) -> None:
    server = scripted_server({"a": arithmetic_solver(1.0), "b": arithmetic_solver(1.0, seed=3)})
    pool = server_pool(server, ["a", "b"])
    graph = compile_graph(build_protocol("majority_vote", pool.names), pool, ModelClient(None))
    assert graph.invoke({"input": "What is 20 + 22?"})["answer"] == "42"
    assert {r.model for r in server.requests} == {"a", "b"}


def test_sync_parent_graph_embeds_the_protocol_as_a_node(scripted_server) -> None:
    server = scripted_server({"a": arithmetic_solver(1.0)})
    pool = server_pool(server, ["a"])
    team = compile_graph(build_protocol("solo", pool.names), pool, ModelClient(None))

    class Parent(TypedDict, total=False):
        input: str
        answer: str
        shout: str

    parent = StateGraph(Parent)
    parent.add_node("team", team)
    parent.add_node("shout", lambda s: {"shout": s["answer"] + "!"})
    parent.add_edge(START, "team")
    parent.add_edge("team", "shout")
    parent.add_edge("shout", END)
    assert parent.compile().invoke({"input": "What is 6 * 7?"})["shout"] == "42!"
