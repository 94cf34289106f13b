"""The call path for agents, through real HTTP: replies that call tools, and replies streamed as they come."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import CallError, Delta, ModelClient
from colab_graphs.testing import Reply, ToolCall
from colab_graphs.trace import Trace

pytestmark = pytest.mark.integration

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def ask(text: str = "What is the weather in Paris?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def forecaster(messages: list[dict[str, Any]], params: dict[str, Any]) -> str | Reply:
    """Calls get_weather when offered it (once), then answers from the tool's result."""
    if messages[-1]["role"] == "tool":
        return f"It is {messages[-1]['content']} in Paris today."
    if params.get("tools"):
        return Reply("", (ToolCall("get_weather", {"city": "Paris"}),))
    return "It is probably sunny in Paris."


def test_a_reply_that_calls_a_tool_carries_the_call_and_is_cached_with_it(
    scripted_server, pool_for, arun, tmp_path
) -> None:
    server = scripted_server({"a": forecaster})
    member = pool_for(server, ["a"])["a"]
    first = ModelClient(CallCache(tmp_path / "c"))
    result = arun(first.complete(member, ask(), overrides={"tools": [WEATHER]}))
    assert result.text == "" and result.finish_reason == "tool_calls"
    (call,) = result.tool_calls
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    again = ModelClient(CallCache(tmp_path / "c"))
    hit = arun(again.complete(member, ask(), overrides={"tools": [WEATHER]}))
    assert hit.cached and hit.tool_calls == result.tool_calls and hit.finish_reason == "tool_calls"
    assert len(server.requests) == 1


def test_the_tools_offered_are_part_of_the_request(scripted_server, pool_for, arun, tmp_cache) -> None:
    server = scripted_server({"a": forecaster})
    member = pool_for(server, ["a"])["a"]
    client = ModelClient(tmp_cache)
    with_tools = arun(client.complete(member, ask(), overrides={"tools": [WEATHER]}))
    without = arun(client.complete(member, ask()))
    assert with_tools.tool_calls and without.tool_calls is None
    assert without.text == "It is probably sunny in Paris." and not without.cached


def test_the_trace_records_the_tool_calls(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": forecaster})
    trace = Trace(example_id="e", protocol="p")
    result = arun(
        ModelClient().complete(
            pool_for(server, ["a"])["a"], ask(), overrides={"tools": [WEATHER]}, trace=trace
        )
    )
    assert trace.calls[0].tool_calls == result.tool_calls
    assert trace.calls[0].settings["tools"] == [WEATHER]


def test_a_conversation_with_a_tool_result_reaches_the_member(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": forecaster})
    member = pool_for(server, ["a"])["a"]
    client = ModelClient()
    first = arun(client.complete(member, ask(), overrides={"tools": [WEATHER]}))
    call = first.tool_calls[0]
    history = [
        *ask(),
        {"role": "assistant", "content": None, "tool_calls": first.tool_calls},
        {"role": "tool", "tool_call_id": call["id"], "content": "22 C and sunny"},
    ]
    final = arun(client.complete(member, history, overrides={"tools": [WEATHER]}))
    assert final.text == "It is 22 C and sunny in Paris today." and final.tool_calls is None


def stream(client: ModelClient, member, messages, **options: Any) -> tuple[list[Delta], Any]:
    deltas: list[Delta] = []

    async def main():
        result = await client.complete(member, messages, on_delta=deltas.append, **options)
        return result

    return deltas, main


def test_a_streamed_reply_arrives_in_pieces_that_make_the_reply(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "The weather in Paris is sunny."})
    deltas, main = stream(ModelClient(), pool_for(server, ["a"])["a"], ask())
    result = arun(main())
    assert [d.text for d in deltas] == ["The", " weather", " in", " Paris", " is", " sunny."]
    assert "".join(d.text for d in deltas) == result.text
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (6, 6)  # words, as scripted
    assert server.requests[0].stream


def test_a_streamed_tool_call_arrives_in_openai_pieces(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": forecaster})
    deltas, main = stream(ModelClient(), pool_for(server, ["a"])["a"], ask(), overrides={"tools": [WEATHER]})
    result = arun(main())
    pieces = [c for d in deltas for c in d.tool_calls or []]
    assert pieces[0]["id"] == result.tool_calls[0]["id"] and pieces[0]["function"]["name"] == "get_weather"
    arguments = "".join((c.get("function") or {}).get("arguments") or "" for c in pieces)
    assert json.loads(arguments) == {"city": "Paris"} and len(pieces) > 2
    assert result.tool_calls[0]["function"]["arguments"] == arguments


def test_a_cached_reply_streams_as_one_piece_and_is_shared_with_unstreamed_calls(
    scripted_server, pool_for, arun, tmp_cache
) -> None:
    server = scripted_server({"a": "The weather in Paris is sunny."})
    member = pool_for(server, ["a"])["a"]
    client = ModelClient(tmp_cache)
    arun(client.complete(member, ask()))  # not streamed
    deltas, main = stream(client, member, ask())
    result = arun(main())
    assert result.cached and [d.text for d in deltas] == ["The weather in Paris is sunny."]
    assert len(server.requests) == 1


def test_identical_streams_in_flight_make_one_call(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "The weather in Paris is sunny."}, latency_s=0.2)
    member = pool_for(server, ["a"])["a"]
    client = ModelClient()
    first, main_first = stream(client, member, ask())
    second, main_second = stream(client, member, ask())

    async def both():
        return await asyncio.gather(main_first(), main_second())

    results = arun(both())
    assert len(server.requests) == 1
    assert "".join(d.text for d in first) == "".join(d.text for d in second) == results[0].text
    assert sorted(r.cached for r in results) == [False, True]


def test_a_stream_is_retried_when_it_fails_before_its_first_piece(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "sunny"}, fail_first=1)
    deltas, main = stream(ModelClient(backoff_s=0.01), pool_for(server, ["a"])["a"], ask())
    result = arun(main())
    assert result.text == "sunny" and result.attempts == 2 and [d.text for d in deltas] == ["sunny"]


def test_a_stream_that_fails_for_good_raises_a_typed_error(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "sunny"}, fail_first=10)
    deltas, main = stream(ModelClient(retries=1, backoff_s=0.01), pool_for(server, ["a"])["a"], ask())
    with pytest.raises(CallError) as err:
        arun(main())
    assert err.value.kind == "server" and err.value.attempts == 2 and deltas == []


def test_a_members_num_retries_is_the_retry_count_for_its_calls(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "sunny"}, fail_first=3)
    patient = pool_for(server, ["a"], num_retries=3)["a"]
    result = arun(ModelClient(retries=0, backoff_s=0.01).complete(patient, ask()))
    assert result.attempts == 4
    with pytest.raises(CallError):
        arun(
            ModelClient(retries=5, backoff_s=0.01).complete(
                pool_for(server, ["a"], num_retries=0)["a"], ask("x")
            )
        )
