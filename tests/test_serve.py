"""Serving a local model over the OpenAI API, and using it from LiteLLM and LangChain / LangGraph."""

from __future__ import annotations

import json
import operator
import urllib.error
import urllib.request
from typing import Annotated, TypedDict

import pytest
from langchain_core.messages import AnyMessage

import colab_graphs._env  # noqa: F401
from colab_graphs.langchain.chat_model import LiteLLMChatModel
from colab_graphs.local.provider import build_request, get_engine
from colab_graphs.serve.server import start_server, vllm_command

QUESTION = [{"role": "user", "content": "What is 2+2?"}]


class State(TypedDict):
    messages: Annotated[list[AnyMessage], operator.add]


@pytest.fixture(scope="module")
def server():
    with start_server("tiny-random", served_name="tiny") as srv:
        yield srv


@pytest.fixture(scope="module")
def greedy():
    engine = get_engine("tiny-random")
    return engine.generate(build_request(engine, QUESTION, {"temperature": 0, "max_tokens": 10})).text


def _http(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_models_endpoint_lists_the_served_name(server):
    status, payload = _http(f"{server.base_url}/models")
    assert status == 200
    assert [m["id"] for m in payload["data"]] == ["tiny"]


def test_litellm_over_http_matches_in_process_generation(server, greedy):
    import litellm

    response = litellm.completion(
        model="openai/tiny",
        api_base=server.base_url,
        api_key="none",
        messages=QUESTION,
        temperature=0,
        max_tokens=10,
    )
    assert response.choices[0].message.content == greedy
    assert response.usage.completion_tokens == 10


def test_litellm_streaming_over_http_reassembles_the_text(server, greedy, arun):
    import litellm

    async def collect() -> tuple[list[str], str | None]:
        stream = await litellm.acompletion(
            model="hosted_vllm/tiny",
            api_base=server.base_url,
            api_key="none",
            messages=QUESTION,
            temperature=0,
            max_tokens=10,
            stream=True,
        )
        pieces, finish = [], None
        async for chunk in stream:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        return pieces, finish

    pieces, finish = arun(collect())
    assert len([p for p in pieces if p]) > 1
    assert "".join(pieces) == greedy
    assert finish == "length"


def test_unknown_model_name_is_rejected_with_404(server):
    status, payload = _http(f"{server.base_url}/chat/completions", {"model": "gpt-4", "messages": QUESTION})
    assert status == 404
    assert "'tiny'" in payload["error"]["message"]


def test_missing_messages_is_a_400(server):
    status, payload = _http(f"{server.base_url}/chat/completions", {"model": "tiny"})
    assert status == 400
    assert "messages" in payload["error"]["message"]


def test_vllm_command_points_at_the_model_folder():
    from colab_graphs.local.zoo import resolve

    command = vllm_command("tiny-random", "0.0.0.0", 8001)
    assert command[1:3] == ["serve", str(resolve("tiny-random"))]
    assert command[-4:] == ["--port", "8001", "--served-model-name", "tiny-random"]


def test_langchain_chat_model_invokes_a_local_model(greedy):
    llm = LiteLLMChatModel(model="local/tiny-random", settings={"temperature": 0, "max_tokens": 10})
    message = llm.invoke("What is 2+2?")
    assert message.content == greedy
    assert message.usage_metadata["output_tokens"] == 10


def test_langchain_chat_model_reaches_a_served_model(server, greedy, arun):
    llm = LiteLLMChatModel.from_settings(
        {
            "model": "openai/tiny",
            "api_base": server.base_url,
            "api_key": "none",
            "temperature": 0,
            "max_tokens": 10,
        }
    )
    assert arun(llm.ainvoke([("human", "What is 2+2?")])).content == greedy


def test_langchain_chat_model_runs_inside_a_langgraph_graph(greedy):
    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, StateGraph

    llm = LiteLLMChatModel(model="local/tiny-random", settings={"temperature": 0, "max_tokens": 10})

    def agent(state: State) -> dict:
        return {"messages": [llm.invoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", END)
    out = graph.compile().invoke({"messages": [HumanMessage("What is 2+2?")]})
    assert [m.type for m in out["messages"]] == ["human", "ai"]
    assert out["messages"][-1].content == greedy


def test_concurrent_http_clients_share_batches(server, greedy):
    from concurrent.futures import ThreadPoolExecutor

    body = {"model": "tiny", "messages": QUESTION, "temperature": 0, "max_tokens": 10}
    before = server.engine.batches_run
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: _http(f"{server.base_url}/chat/completions", body), range(4)))
    assert [payload["choices"][0]["message"]["content"] for _, payload in replies] == [greedy] * 4
    assert server.engine.batches_run - before < 4


def test_token_ids_come_back_over_http_when_the_request_asks(server):
    import litellm

    from colab_graphs.local.provider import local_call_details

    engine = get_engine("tiny-random")
    in_process = engine.generate(build_request(engine, QUESTION, {"temperature": 0, "max_tokens": 6}))
    response = litellm.completion(
        model="openai/tiny",
        api_base=server.base_url,
        api_key="none",
        messages=QUESTION,
        temperature=0,
        max_tokens=6,
        extra_body={"colab_graphs": {"token_ids": True}},
    )
    details = local_call_details(response)
    assert details["prompt_token_ids"] == in_process.prompt_ids
    assert details["completion_token_ids"] == in_process.completion_ids
