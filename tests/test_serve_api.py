"""`colab-graphs serve` speaks the OpenAI API a tool-using agent needs: the openai SDK, LiteLLM and a LangGraph
ReAct agent against served zoo models (tiny-random for exact comparisons, SmolLM2-135M for real text)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import colab_graphs._env  # noqa: F401
from colab_graphs.local.local_engine import GenerationRequest, LocalEngine
from colab_graphs.local.provider import get_engine, local_call_details
from colab_graphs.serve.server import LocalServer, start_server

openai = pytest.importorskip("openai")

QUESTION = [{"role": "user", "content": "What is 2+2?"}]
CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression such as 12 * 7.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "the arithmetic expression"}},
            "required": ["expression"],
        },
    },
}
# tiny-random writes byte soup: a bounded expression makes its forced call end within the token budget
TINY_CALC = {
    "type": "function",
    "function": {
        **CALC["function"],
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "maxLength": 12}},
            "required": ["expression"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "clock", "description": "The time now."}}
FORCE_CALC = {"type": "function", "function": {"name": "calc"}}
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tiny():
    with start_server("tiny-random", served_name="tiny") as server:
        yield openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def smol():
    with start_server("smollm2-135m", served_name="smol") as server:
        yield server


@pytest.fixture(scope="module")
def smol_client(smol):
    return openai.OpenAI(base_url=smol.base_url, api_key="none", max_retries=0, timeout=300)


def test_a_chat_completion_carries_openai_fields_only(tiny):
    response = tiny.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=4)
    assert set(response.model_dump(exclude_unset=True)) == {
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
    }
    assert set(response.choices[0].model_dump(exclude_unset=True)) == {
        "index",
        "message",
        "logprobs",
        "finish_reason",
    }
    assert local_call_details(response) is None


def test_token_ids_come_back_under_the_colab_graphs_key_when_asked(tiny):
    engine = get_engine("tiny-random")
    response = tiny.chat.completions.create(
        model="tiny",
        messages=QUESTION,
        temperature=0,
        max_tokens=4,
        extra_body={"colab_graphs": {"token_ids": True}},
    )
    details = local_call_details(response)
    assert details["prompt_token_ids"] == engine.render(QUESTION)
    assert engine.tokenizer.decode(details["completion_token_ids"]) == response.choices[0].message.content


def test_an_unknown_role_is_a_400_naming_the_field(tiny):
    with pytest.raises(openai.BadRequestError) as caught:
        tiny.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "hi"}])
    assert caught.value.param == "messages[0].role"
    assert "'wizard'" in caught.value.message


def test_embeddings_get_a_404_that_says_what_is_served(tiny):
    with pytest.raises(openai.NotFoundError, match="serves no embedding model"):
        tiny.embeddings.create(model="tiny", input="hello")


def test_legacy_completions_match_in_process_generation(tiny):
    engine = get_engine("tiny-random")
    prompts = ["The capital of France is", "2 + 2 ="]
    response = tiny.completions.create(model="tiny", prompt=prompts, max_tokens=5, temperature=0, logprobs=2)
    for choice, prompt in zip(response.choices, prompts, strict=True):
        ids = engine.tokenizer(prompt)["input_ids"]
        expected = engine.generate(GenerationRequest(ids, max_tokens=5, temperature=0, top_logprobs=2))
        assert choice.text == expected.text
        assert choice.logprobs.token_logprobs == pytest.approx(
            expected.logprobs, abs=1e-4
        )  # batch-2 rounding
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
    assert response.usage.completion_tokens == 10


def test_legacy_completions_echo_the_prompt_and_stream(tiny):
    echoed = tiny.completions.create(model="tiny", prompt="Hello", max_tokens=3, temperature=0, echo=True)
    plain = tiny.completions.create(model="tiny", prompt="Hello", max_tokens=3, temperature=0)
    assert echoed.choices[0].text == "Hello" + plain.choices[0].text
    chunks = list(
        tiny.completions.create(model="tiny", prompt="Hello", max_tokens=3, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text


def test_n_choices_with_a_seed_repeat_and_differ_from_each_other(tiny):
    def draw() -> list[str]:
        response = tiny.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=8, n=3, seed=7)
        return [choice.message.content for choice in response.choices]

    first = draw()
    assert draw() == first and len(set(first)) == 3


def forced_call(client: Any, model: str = "tiny", **fields: Any) -> Any:
    """A greedy chat request that forces a call to `calc` (fields override)."""
    body = {
        "messages": QUESTION,
        "tools": [TINY_CALC],
        "tool_choice": FORCE_CALC,
        "temperature": 0,
        "max_tokens": 64,
    }
    return client.chat.completions.create(model=model, **{**body, **fields})


def test_a_named_tool_choice_forces_a_call_whose_arguments_match_the_tool_schema(tiny):
    response = forced_call(tiny)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "calc" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"expression"} and isinstance(arguments["expression"], str)


def test_a_required_tool_choice_calls_one_of_the_tools(tiny):
    response = forced_call(tiny, tools=[TINY_CALC, CLOCK], tool_choice="required")
    (call,) = response.choices[0].message.tool_calls
    assert call.function.name in ("calc", "clock")


def test_a_streamed_forced_call_arrives_as_tool_call_deltas(tiny):
    stream = forced_call(tiny, stream=True)
    calls, finish = [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        calls += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls[0].function.name == "calc" and "expression" in json.loads(calls[0].function.arguments)


def test_a_schema_guided_decoding_cannot_enforce_is_refused(tiny):
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[0-9]+$"}}}
    with pytest.raises(openai.BadRequestError, match="'pattern' cannot be enforced") as caught:
        tiny.chat.completions.create(
            model="tiny",
            messages=QUESTION,
            response_format={"type": "json_schema", "json_schema": {"name": "ids", "schema": schema}},
        )
    assert caught.value.param == "response_format.json_schema.schema"


def test_a_template_that_renders_tools_is_used_for_them():
    from transformers import AutoTokenizer

    from colab_graphs.local.zoo import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve("tiny-random"))
    tokenizer.chat_template = TOOLS_TEMPLATE
    engine = LocalEngine(get_engine("tiny-random").model, tokenizer, name="tiny-tools")
    with LocalServer(engine, "tiny-tools", "127.0.0.1", 0).start() as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
        response = forced_call(client, "tiny-tools", extra_body={"colab_graphs": {"token_ids": True}})
    prompt = tokenizer.decode(local_call_details(response)["prompt_token_ids"])
    assert prompt.startswith("<|im_start|>system\nTOOLS:calc;") and "<tool_call>" not in prompt
    assert response.choices[0].message.tool_calls[0].function.name == "calc"


def test_a_json_schema_reply_of_a_real_model_parses_and_matches(smol_client):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "population": {"type": "integer", "minimum": 0},
        },
        "required": ["city", "population"],
    }
    response = smol_client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Give the largest city of France and its population."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
        temperature=0,
        max_tokens=40,
    )
    assert response.choices[0].finish_reason == "stop"
    reply = json.loads(response.choices[0].message.content)
    assert set(reply) == {"city", "population"}
    assert (
        isinstance(reply["city"], str) and isinstance(reply["population"], int) and reply["population"] >= 0
    )


def test_litellm_gets_the_tool_calls_of_a_served_model(smol):
    import litellm

    response = litellm.completion(
        model="openai/smol",
        api_base=smol.base_url,
        api_key="none",
        messages=[{"role": "user", "content": "Compute 12*7 with the calculator."}],
        tools=[CALC],
        tool_choice=FORCE_CALC,
        temperature=0,
        max_tokens=40,
    )
    (call,) = response.choices[0].message.tool_calls
    assert call.function.name == "calc" and "expression" in json.loads(call.function.arguments)


def example_calculator() -> Any:
    """The calculator tool of `examples/react_critic_app.py` (arithmetic only), as an app hands it to a model."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "react_critic_app.py"
    spec = importlib.util.spec_from_file_location("react_critic_app", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.calculator.func


def test_a_langgraph_react_agent_calls_a_calculator_through_the_served_model(smol_client):
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, convert_to_openai_messages
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    evaluate = example_calculator()

    @tool
    def calc(expression: str) -> str:
        """Evaluate an arithmetic expression such as 12 * 7."""
        return evaluate(expression)

    sent: list[list[dict[str, Any]]] = []

    def agent(state: MessagesState) -> dict:
        # The agent decides to use the calculator first (a forced call), then answers from its result.
        answered = any(isinstance(m, ToolMessage) for m in state["messages"])
        messages = convert_to_openai_messages(state["messages"])
        sent.append(messages)
        reply = (
            smol_client.chat.completions.create(
                model="smol",
                messages=messages,
                tools=[convert_to_openai_tool(calc)],
                tool_choice="none" if answered else FORCE_CALC,
                temperature=0,
                max_tokens=40,
            )
            .choices[0]
            .message
        )
        calls = [
            {"name": c.function.name, "args": json.loads(c.function.arguments), "id": c.id}
            for c in reply.tool_calls or []
        ]
        return {"messages": [AIMessage(content=reply.content or "", tool_calls=calls)]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([calc]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    final = graph.compile().invoke({"messages": [HumanMessage("Compute 12*7 with the calculator.")]})

    human, call, result, answer = final["messages"]
    assert isinstance(call, AIMessage) and call.tool_calls[0]["name"] == "calc"
    assert isinstance(result, ToolMessage) and result.tool_call_id == call.tool_calls[0]["id"]
    assert result.content == evaluate(call.tool_calls[0]["args"]["expression"])
    assert isinstance(answer, AIMessage) and answer.content and not answer.tool_calls
    roles = [m["role"] for m in sent[-1]]
    assert roles == ["user", "assistant", "tool"]  # the served model read its own call and the result
