"""`LiteLLMChatModel` beyond LangChain's standard tests: its arguments reach the call, its calls take the
package's call path (cache, trace), its key stays secret, and streaming and callbacks behave as specified."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.load import dumpd, dumps, load
from pydantic import BaseModel

from colab_graphs.langchain.chat_model import LiteLLMChatModel
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient

pytestmark = pytest.mark.integration

SECRET = "sk-very-secret-key-1234"


class Recorder(BaseCallbackHandler):
    """Every chat-model event LangChain raises, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.events.append(("start", kwargs.get("invocation_params")))

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.events.append(("token", token))

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        self.events.append(("end", response.generations[0][0].message))


def model_for(server, client: ModelClient | None = None, **fields: Any) -> LiteLLMChatModel:
    return LiteLLMChatModel(
        model="openai/alpha",
        api_base=server.base_url,
        api_key=SECRET,
        client=client or ModelClient(None),
        **fields,
    )


def test_top_level_arguments_reach_the_request(scripted_server) -> None:
    server = scripted_server({"alpha": "The answer is 4."})
    llm = model_for(server, temperature=0, max_tokens=20, seed=7, top_p=0.5, presence_penalty=0.1)
    assert llm.invoke("What is 2 + 2?").content == "The answer is 4."
    (request,) = server.requests
    assert request.params == {
        "temperature": 0,
        "max_tokens": 20,
        "seed": 7,
        "top_p": 0.5,
        "presence_penalty": 0.1,
    }
    assert llm.settings == {"presence_penalty": 0.1}  # a LiteLLM argument without a field of its own


def test_settings_given_the_older_way_land_in_their_fields(scripted_server) -> None:
    server = scripted_server({"alpha": "ok"})
    llm = LiteLLMChatModel(
        model="openai/alpha",
        settings={"temperature": 0, "api_base": server.base_url, "api_key": SECRET},
        client=ModelClient(None),
    )
    assert (llm.temperature, llm.api_base, llm.api_key.get_secret_value()) == (0, server.base_url, SECRET)
    assert llm.settings == {}
    assert llm.invoke("hi").content == "ok"


def test_an_unknown_argument_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="unknown argument.*temprature"):
        LiteLLMChatModel(model="openai/alpha", temprature=0)


def test_from_settings_keeps_the_members_system_prompt(scripted_server) -> None:
    server = scripted_server({"alpha": "ok"})
    llm = LiteLLMChatModel.from_settings(
        {
            "model": "openai/alpha",
            "api_base": server.base_url,
            "api_key": SECRET,
            "system_prompt": "You are terse.",
            "description": "a terse member",
        },
        client=ModelClient(None),
    )
    llm.invoke("hi")
    assert server.requests[0].messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
    ]


def test_the_api_key_is_never_shown_serialised_traced_or_cached(scripted_server, tmp_path) -> None:
    server = scripted_server({"alpha": "ok"})
    client = ModelClient(CallCache(tmp_path / "cache"))  # the cache file and its write-ahead log
    llm = model_for(server, client)
    message = llm.invoke("hi")
    assert SECRET not in repr(llm) and SECRET not in str(llm.dict()) and SECRET not in dumps(llm)
    assert SECRET not in json.dumps(message.response_metadata)
    stored = b"".join(f.read_bytes() for f in (tmp_path / "cache").iterdir()).decode("latin-1")
    assert "openai/alpha" in stored and SECRET not in stored  # the call is cached, its key is not


def test_a_serialised_model_loads_back_with_its_key_from_a_secrets_map(scripted_server) -> None:
    server = scripted_server({"alpha": "ok"})
    llm = model_for(server, temperature=0)
    again = load(
        dumpd(llm),
        allowed_objects=[LiteLLMChatModel],
        valid_namespaces=["colab_graphs"],
        secrets_map={"LITELLM_API_KEY": SECRET},
    )
    assert isinstance(again, LiteLLMChatModel)
    assert (again.model, again.temperature, again.api_base) == ("openai/alpha", 0, server.base_url)
    assert again.api_key.get_secret_value() == SECRET


def test_calls_take_the_call_path_so_a_repeat_is_served_from_the_cache(scripted_server, tmp_cache) -> None:
    server = scripted_server({"alpha": "The answer is 4."})
    llm = model_for(server, ModelClient(tmp_cache))
    first, second = llm.invoke("What is 2 + 2?"), llm.invoke("What is 2 + 2?")
    assert len(server.requests) == 1
    assert (first.response_metadata["cached"], second.response_metadata["cached"]) == (False, True)
    assert second.content == first.content and second.usage_metadata == first.usage_metadata


def test_streaming_yields_a_chunk_per_token_and_a_last_chunk_with_the_usage(scripted_server) -> None:
    server = scripted_server({"alpha": "The answer is 4."})
    recorder = Recorder()
    chunks = list(model_for(server).stream("What is 2 + 2?", config={"callbacks": [recorder]}))
    assert [c.content for c in chunks] == ["The", " answer", " is", " 4.", ""]
    assert chunks[-1].chunk_position == "last" and chunks[-1].usage_metadata["output_tokens"] == 4
    assert [t for kind, t in recorder.events if kind == "token"] == ["The", " answer", " is", " 4.", ""]
    assert server.requests[0].stream


def test_a_cached_reply_streams_as_one_chunk(scripted_server, tmp_cache) -> None:
    server = scripted_server({"alpha": "The answer is 4."})
    llm = model_for(server, ModelClient(tmp_cache))
    llm.invoke("What is 2 + 2?")
    chunks = list(llm.stream("What is 2 + 2?"))
    assert [c.content for c in chunks] == ["The answer is 4.", ""]
    assert chunks[-1].response_metadata["cached"] is True


def test_async_streaming_raises_a_token_event_per_chunk(scripted_server, arun) -> None:
    server = scripted_server({"alpha": "one two three"})
    recorder = Recorder()

    async def stream() -> list[str]:
        llm = model_for(server)
        return [c.content async for c in llm.astream("count", config={"callbacks": [recorder]})]

    assert arun(stream()) == ["one", " two", " three", ""]
    assert [kind for kind, _ in recorder.events] == ["start", "token", "token", "token", "token", "end"]


def test_callbacks_see_the_call_start_and_end_with_usage(scripted_server) -> None:
    server = scripted_server({"alpha": "The answer is 4."})
    recorder = Recorder()
    model_for(server, temperature=0).invoke("What is 2 + 2?", config={"callbacks": [recorder]})
    (start, params), (end, message) = recorder.events
    assert (start, end) == ("start", "end")
    assert params["model"] == "openai/alpha" and params["temperature"] == 0
    assert message.usage_metadata == {"input_tokens": 5, "output_tokens": 4, "total_tokens": 9}  # words


class Answer(BaseModel):
    """An answer with the reasoning behind it."""

    answer: int
    reasoning: str


def test_json_schema_structured_output_sends_the_schema_as_response_format(scripted_server) -> None:
    server = scripted_server({"alpha": '{"answer": 4, "reasoning": "two and two make four"}'})
    result = model_for(server).with_structured_output(Answer, method="json_schema").invoke("2 + 2?")
    assert result == Answer(answer=4, reasoning="two and two make four")
    sent = server.requests[0].params["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "Answer"
    assert sent["json_schema"]["schema"]["required"] == ["answer", "reasoning"]


def test_tool_choice_by_name_forces_that_tool(scripted_server) -> None:
    server = scripted_server({"alpha": "ok"})

    def lookup(city: str) -> str:
        """Look a city up."""
        return city

    model_for(server).bind_tools([lookup], tool_choice="lookup").invoke("hi")
    params = server.requests[0].params
    assert params["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert params["tools"][0]["function"]["name"] == "lookup"


def test_a_tool_choice_naming_no_bound_tool_is_refused(scripted_server) -> None:
    def lookup(city: str) -> str:
        """Look a city up."""
        return city

    with pytest.raises(ValueError, match="'search' names no bound tool; tools: lookup"):
        LiteLLMChatModel(model="openai/alpha").bind_tools([lookup], tool_choice="search")
