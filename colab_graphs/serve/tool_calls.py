"""Tools for a served model: how tool definitions and tool turns reach the prompt, how calls come back out.

Rendering. A chat template that knows tools (one that reads ``tools``, such as Qwen's or Llama 3.1's) renders
them itself: ``tokenizer.apply_chat_template(messages, tools=...)``, assistant ``tool_calls`` and ``tool``
messages included. Templates that do not (SmolLM2's, plain ChatML, the plain fallback) get the Hermes / Qwen 2.5
format written out: a system prompt listing the tools as JSON inside ``<tools></tools>`` and asking for each
call as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; earlier calls are written back the same way
and tool results go in a user turn as ``<tool_response>...</tool_response>``.

Parsing (`parse_tool_calls`). A reply calls tools when it holds ``<tool_call>`` blocks whose JSON names a
declared tool and carries an ``arguments`` (or ``parameters``) object (the text around the blocks stays
content), or when the whole reply is such a JSON object (or a list of them), bare or in a code fence. Anything
else (a block of broken JSON, an undeclared name, arguments that are not an object) leaves the whole reply as
content with ``finish_reason: "stop"``: a malformed call is never half-executed.

Forced calls (`call_schema`): ``tool_choice: "required"`` or a named function turn into a JSON schema for
guided decoding, ``{"name": <a tool's name>, "arguments": <that tool's parameters>}``, so the call is
well-formed and its arguments match the tool's schema whatever the model would have written.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from colab_graphs.local.local_engine import LocalEngine
from colab_graphs.serve.openai_api import Message, Tool

CALL_OPEN = "<tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)
_FENCE = re.compile(r"\A```(?:json)?\s*(.*?)\s*```\Z", re.S)
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def tools_prompt(tools: list[Tool]) -> str:
    """The Hermes / Qwen 2.5 tool-use instructions, for templates that do not render tools themselves."""
    listed = "\n".join(json.dumps(tool.model_dump(exclude_none=True)) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>"
        "\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders ``tools`` (a ``tool_use`` template, or one reading them)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "tool_use" in template
    return isinstance(template, str) and "tools" in template


def render_chat(
    engine: LocalEngine, messages: list[Message], tools: list[Tool] | None, forced: bool = False
) -> list[int]:
    """Prompt token ids for `messages` (and `tools`, when given), ending where the assistant writes.

    `forced` (a call is forced by guided decoding) opens the call in the written-out format, so the model
    writes the JSON where it would after ``<tool_call>``.
    """
    uses_tools = bool(tools) or any(m.role == "tool" or m.tool_calls for m in messages)
    if not uses_tools:  # the engine's own rendering, cached across requests
        return engine.render([{"role": _role(m), "content": m.text} for m in messages])
    tokenizer = engine.tokenizer
    if supports_tools(tokenizer):
        text = tokenizer.apply_chat_template(
            [_template_message(m) for m in messages],
            tools=[tool.model_dump(exclude_none=True) for tool in tools or []] or None,
            tokenize=False,
            add_generation_prompt=True,
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    ids = engine.render(_written_out(messages, tools))
    if forced:
        ids += tokenizer.encode(f"{CALL_OPEN}\n", add_special_tokens=False)
    return ids


def _role(message: Message) -> str:
    return "system" if message.role == "developer" else message.role


def _arguments(call: Any) -> Any:
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments


def _template_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": _role(message), "content": message.text}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": _arguments(c)},
            }
            for c in message.tool_calls
        ]
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
    return out


def _written_out(messages: list[Message], tools: list[Tool] | None) -> list[dict[str, str]]:
    """Messages in the Hermes format, as plain role/content turns any template renders."""
    out: list[dict[str, str]] = []
    after_tool = False
    for message in messages:
        if message.role == "tool":
            response = f"<tool_response>\n{message.text}\n</tool_response>"
            if after_tool:
                out[-1]["content"] += "\n" + response  # consecutive results share one turn, as Qwen's do
            else:
                out.append({"role": "user", "content": response})
            after_tool = True
            continue
        after_tool = False
        text = message.text
        for call in message.tool_calls or []:
            block = json.dumps({"name": call.function.name, "arguments": _arguments(call)})
            text = f"{text}\n{CALL_OPEN}\n{block}\n</tool_call>".lstrip("\n")
        out.append({"role": _role(message), "content": text})
    if tools:
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{tools_prompt(tools)}"
        else:
            out.insert(0, {"role": "system", "content": tools_prompt(tools)})
    return out


def parse_tool_calls(
    text: str, tools: list[Tool], parallel: bool = True
) -> tuple[str | None, list[dict[str, Any]]] | None:
    """``(content, tool_calls)`` from a reply that calls tools (see the module docstring), else None."""
    names = {tool.function.name for tool in tools}
    if CALL_OPEN in text:
        calls = [_call(block, names) for block in _BLOCK.findall(text)]
        content = _BLOCK.sub("", text).strip() or None
    else:
        body = text.strip()
        fenced = _FENCE.match(body)
        try:
            parsed = json.loads(fenced.group(1) if fenced else body)
        except ValueError:
            return None
        calls = [_call(item, names) for item in (parsed if isinstance(parsed, list) else [parsed])]
        content = None
    if not calls or any(call is None for call in calls):
        return None
    return content, [c for c in calls if c is not None][: None if parallel else 1]


def _call(block: Any, names: set[str]) -> dict[str, Any] | None:
    if isinstance(block, str):
        try:
            block = json.loads(block)
        except ValueError:
            return None
    if not isinstance(block, dict) or block.get("name") not in names:
        return None
    arguments = block.get("arguments", block.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    function = {"name": block["name"], "arguments": json.dumps(arguments)}
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": function}


def call_schema(tools: list[Tool], name: str | None = None) -> dict[str, Any]:
    """The JSON schema of one call to `name` (or to any of `tools`), for guided decoding.

    The tools' ``$defs`` / ``definitions`` are lifted to the top, where their local references point.
    """
    chosen = [tool for tool in tools if name is None or tool.function.name == name]
    branches = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool.function.name},
                "arguments": tool.function.parameters or _NO_PARAMETERS,
            },
            "required": ["name", "arguments"],
        }
        for tool in chosen
    ]
    schema: dict[str, Any] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    for key in ("$defs", "definitions"):
        lifted = {
            k: v for tool in chosen for k, v in ((tool.function.parameters or {}).get(key) or {}).items()
        }
        if lifted:
            schema = {**schema, key: lifted}
    return schema
