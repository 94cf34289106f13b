"""Seat calls of a compiled protocol raise chat-model callback events, so LangChain tracers (LangSmith-style
handlers) and LangGraph's `stream_mode="messages"` see each call as they see a chat model's."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage

from colab_graphs.compile import compile_graph
from colab_graphs.models.client import ModelClient
from colab_graphs.protocol_registry import build_protocol

pytestmark = pytest.mark.integration

REPLIES = {"a": "The answer is 5.", "b": "The answer is 5.", "c": "The answer is 6."}


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.started: list[tuple[str, str, str]] = []
        self.ended: list[str] = []
        self.errors: list[str] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, *, metadata: Any = None, **kwargs: Any):
        prompt = messages[0][-1].content
        self.started.append((kwargs.get("name"), metadata["ls_model_name"], prompt))

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        self.ended.append(response.generations[0][0].message.content)

    def on_llm_error(self, error: BaseException, **kwargs: Any) -> None:
        self.errors.append(type(error).__name__)


def vote_graph(scripted_server, pool_for, fuse: bool, **server_options: Any):
    server = scripted_server(REPLIES, **server_options)
    pool = pool_for(server, ["a", "b", "c"])
    spec = build_protocol("majority_vote", pool.names)
    return compile_graph(spec, pool, ModelClient(None, retries=0), fuse=fuse), spec


@pytest.mark.parametrize("fuse", [False, True])
def test_every_seat_call_starts_and_ends_a_chat_model_run(scripted_server, pool_for, fuse) -> None:
    graph, spec = vote_graph(scripted_server, pool_for, fuse)
    recorder = Recorder()
    state = graph.invoke({"input": "What is 2 + 3?"}, config={"callbacks": [recorder]})
    seats = [n.name for n in spec.nodes if getattr(n, "member", None)]
    assert sorted(name for name, _, _ in recorder.started) == sorted(seats)
    assert {model for _, model, _ in recorder.started} == {"openai/a", "openai/b", "openai/c"}
    assert all("What is 2 + 3?" in prompt for _, _, prompt in recorder.started)
    assert sorted(recorder.ended) == sorted(REPLIES.values())
    assert state["answer"] == "5"


def test_async_runs_raise_the_same_events(scripted_server, pool_for, arun) -> None:
    graph, _ = vote_graph(scripted_server, pool_for, fuse=False)
    recorder = Recorder()
    arun(graph.ainvoke({"input": "What is 2 + 3?"}, config={"callbacks": [recorder]}))
    assert len(recorder.started) == 3 and sorted(recorder.ended) == sorted(REPLIES.values())


def test_stream_mode_messages_yields_each_seats_reply_with_its_node(scripted_server, pool_for, arun) -> None:
    graph, spec = vote_graph(scripted_server, pool_for, fuse=False)

    async def messages() -> list[tuple[Any, dict[str, Any]]]:
        return [item async for item in graph.astream({"input": "What is 2 + 3?"}, stream_mode="messages")]

    streamed = arun(messages())
    assert all(isinstance(message, AIMessage) for message, _ in streamed)
    by_node = {meta["langgraph_node"]: message.content for message, meta in streamed}
    seats = {n.name: REPLIES[n.member] for n in spec.nodes if getattr(n, "member", None)}
    assert by_node == seats
    assert all(message.usage_metadata["output_tokens"] == 4 for message, _ in streamed)


def test_astream_events_show_chat_model_events_named_for_the_seats(scripted_server, pool_for, arun) -> None:
    graph, spec = vote_graph(scripted_server, pool_for, fuse=True)

    async def events() -> list[dict[str, Any]]:
        return [e async for e in graph.astream_events({"input": "What is 2 + 3?"}, version="v2")]

    chat = [e for e in arun(events()) if e["event"].startswith("on_chat_model")]
    seats = sorted(n.name for n in spec.nodes if getattr(n, "member", None))
    assert sorted(e["name"] for e in chat if e["event"] == "on_chat_model_start") == seats
    ends = [e["data"]["output"].content for e in chat if e["event"] == "on_chat_model_end"]
    assert sorted(ends) == sorted(REPLIES.values())


def test_a_failed_seat_call_ends_its_run_with_an_error(scripted_server, pool_for) -> None:
    from colab_graphs.models.client import CallError

    graph, _ = vote_graph(scripted_server, pool_for, fuse=False, down_models=["c"])
    recorder = Recorder()
    with pytest.raises(CallError):
        graph.invoke({"input": "What is 2 + 3?"}, config={"callbacks": [recorder]})
    assert "CallError" in recorder.errors


def test_a_run_without_callbacks_raises_no_events(scripted_server, pool_for, arun) -> None:
    """Audits and runs pay nothing for the events: no callback manager is made when no one listens."""
    from langchain_core.callbacks import AsyncCallbackManager

    from colab_graphs.langchain.lc import ChatRun
    from colab_graphs.pool import Member

    member = Member(name="a", settings={"model": "openai/a"})
    for config in (None, {}, {"callbacks": None}, {"callbacks": AsyncCallbackManager([])}):
        assert arun(ChatRun.start(config, "seat", member, [])) is None
    assert arun(ChatRun.start({"callbacks": [Recorder()]}, "seat", member, [])) is not None
