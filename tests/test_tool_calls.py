"""Tool calls for served models: parsing replies the way models write them (and replies written to fool the
parser), and rendering tools and tool turns through a chat template or the Hermes format."""

from __future__ import annotations

import json

import pytest

import colab_graphs._env  # noqa: F401
from colab_graphs.local.local_engine import LocalEngine
from colab_graphs.local.provider import get_engine
from colab_graphs.serve.openai_api import Message, Tool
from colab_graphs.serve.tool_calls import call_schema, parse_tool_calls, render_chat, supports_tools

CALC = Tool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
)
CLOCK = Tool.model_validate({"type": "function", "function": {"name": "clock"}})
TOOLS = [CALC, CLOCK]
# A tools-aware template, as Qwen's and Llama 3.1's are: it reads `tools` and renders calls and results itself.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATION = [
    Message(role="user", content="What is 12 times 7?"),
    Message.model_validate(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calc", "arguments": '{"expression": "12*7"}'},
                }
            ],
        }
    ),
    Message(role="tool", content="84", tool_call_id="call_1"),
]


def calls_of(text: str, parallel: bool = True) -> list[tuple[str, dict]] | None:
    parsed = parse_tool_calls(text, TOOLS, parallel)
    if parsed is None:
        return None
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed[1]]


def test_hermes_blocks_become_calls_and_the_text_around_them_stays_content():
    text = (
        'I will compute it.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "12*7"}}\n</tool_call>'
    )
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == "I will compute it."
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls_of(text) == [("calc", {"expression": "12*7"})]


def test_several_blocks_are_several_calls_unless_parallel_calls_are_off():
    text = (
        '<tool_call>\n{"name": "calc", "arguments": {"expression": "1+1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "clock", "arguments": {}}\n</tool_call>'
    )
    assert calls_of(text) == [("calc", {"expression": "1+1"}), ("clock", {})]
    assert calls_of(text, parallel=False) == [("calc", {"expression": "1+1"})]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "calc", "arguments": {"expression": "2+2"}}',  # ended at end of turn, unclosed
        '{"name": "calc", "arguments": {"expression": "2+2"}}',  # a bare object
        '```json\n{"name": "calc", "arguments": {"expression": "2+2"}}\n```',  # fenced
        '{"name": "calc", "parameters": {"expression": "2+2"}}',  # Llama 3.1's key
        '{"name": "calc", "arguments": "{\\"expression\\": \\"2+2\\"}"}',  # arguments as a JSON string
    ],
)
def test_the_ways_models_write_one_call_all_parse(text):
    assert calls_of(text) == [("calc", {"expression": "2+2"})]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "calc", "arguments": {"expression": "2+2"}</tool_call>',  # broken JSON
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # a tool nobody declared
        '<tool_call>{"name": "calc", "arguments": ["2+2"]}</tool_call>',  # arguments not an object
        '{"name": "calc", "arguments": "2+2"}',  # arguments a string that is not JSON
        '<tool_call>{"name": "clock", "arguments": {}}</tool_call><tool_call>{"name": "calc"',  # one good, one cut
        'The call would be {"name": "calc", "arguments": {}} but I will not make it.',  # prose around JSON
        '{"answer": 4}',  # JSON, but not a call
        "Four.",
    ],
)
def test_malformed_or_undeclared_calls_leave_the_reply_as_content(text):
    assert parse_tool_calls(text, TOOLS) is None


def test_a_forced_call_schema_lists_each_tool_with_its_own_arguments():
    schema = call_schema(TOOLS)
    assert [b["properties"]["name"] for b in schema["anyOf"]] == [{"const": "calc"}, {"const": "clock"}]
    assert call_schema(TOOLS, "calc")["properties"]["arguments"]["required"] == ["expression"]
    assert call_schema(TOOLS, "clock")["properties"]["arguments"]["additionalProperties"] is False


def test_a_template_without_tools_gets_them_written_in_the_hermes_format():
    engine = get_engine("smollm2-135m")
    assert not supports_tools(engine.tokenizer)
    text = engine.tokenizer.decode(render_chat(engine, CONVERSATION, TOOLS))
    assert "<tools>\n" + json.dumps(CALC.model_dump(exclude_none=True)) in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "calc", "arguments": {"expression": "12*7"}}\n</tool_call>'
        in text
    )
    assert "<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_forced_call_opens_the_call_block_in_the_hermes_format():
    engine = get_engine("smollm2-135m")
    text = engine.tokenizer.decode(render_chat(engine, CONVERSATION[:1], TOOLS, forced=True))
    assert text.endswith("<|im_start|>assistant\n<tool_call>\n")


def test_a_template_that_renders_tools_renders_them_itself():
    from transformers import AutoTokenizer

    from colab_graphs.local.zoo import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve("tiny-random"))
    tokenizer.chat_template = TOOLS_TEMPLATE
    engine = LocalEngine(get_engine("tiny-random").model, tokenizer, name="tiny-tools")
    assert supports_tools(tokenizer)
    text = tokenizer.decode(render_chat(engine, CONVERSATION, TOOLS, forced=True))
    assert text.startswith("<|im_start|>system\nTOOLS:calc;clock;<|im_end|>")
    assert 'CALL calc {"expression": "12*7"}' in text  # arguments handed to the template as an object
    assert "<|im_start|>tool\n84<|im_end|>" in text
    assert "<tool_call>" not in text
