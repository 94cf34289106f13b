"""LangChain's view of calls made on the call path: messages, replies, stream chunks and callback events.

The LangChain chat models (`colab_graphs.langchain.chat_model`) and the seats of compiled protocols make their
calls through `ModelClient`; this module turns LangChain messages into the OpenAI messages the client sends,
a call's record (`Call`) into the `AIMessage` LangChain expects (text, parsed tool calls, usage), a streamed
`Delta` into an `AIMessageChunk`, and raises the chat-model callback events (`on_chat_model_start`, `on_llm_new_token`,
`on_llm_end`, `on_llm_error`) for a call made outside a chat model, so LangSmith-style tracers and LangGraph's
`stream_mode="messages"` see seat calls as they see any chat model's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from colab_graphs.models.client import Delta
from colab_graphs.pool import Member
from colab_graphs.trace import Call

if TYPE_CHECKING:
    from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
    from langchain_core.messages import AIMessage, BaseMessage
    from langchain_core.messages.ai import UsageMetadata
    from langchain_core.outputs import ChatGenerationChunk

# LangChain's messages package costs about half a second to import; compile.py imports this module, and a
# protocol run without callbacks never needs it, so each function imports what it uses.


def openai_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as the OpenAI chat messages LiteLLM sends (tool calls and tool results included)."""
    from langchain_core.messages import convert_to_openai_messages

    converted = convert_to_openai_messages(list(messages))
    return converted if isinstance(converted, list) else [converted]


def provider(model: str) -> str:
    """The provider part of a LiteLLM model string ("openai/x" -> "openai"), what tracers report."""
    return model.split("/", 1)[0] if "/" in model else "openai"


def parsed_tool_calls(raw: list[dict[str, Any]] | None) -> tuple[list[Any], list[Any]]:
    """OpenAI tool calls -> (LangChain tool calls, invalid tool calls). Arguments that are not a JSON object
    make an invalid tool call that keeps the raw text, as LangChain's own OpenAI parser does."""
    from langchain_core.messages.tool import invalid_tool_call, tool_call

    calls, invalid = [], []
    for call in raw or []:
        function = call.get("function") or {}
        name, arguments = function.get("name"), function.get("arguments") or ""
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            invalid.append(invalid_tool_call(name=name, args=arguments, id=call.get("id"), error=str(exc)))
            continue
        if not isinstance(args, dict):
            error = f"arguments must be a JSON object, got {type(args).__name__}"
            invalid.append(invalid_tool_call(name=name, args=arguments, id=call.get("id"), error=error))
            continue
        calls.append(tool_call(name=name or "", args=args, id=call.get("id")))
    return calls, invalid


def usage_metadata(result: Call) -> UsageMetadata:
    usage = result.usage
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def response_metadata(result: Call, model: str) -> dict[str, Any]:
    """What a reply says about itself: model, provider, why it stopped, and the call path's view of it
    (served from the cache, the cache key, the cost; None where unknown)."""
    return {
        "model_name": model,
        "model_provider": provider(model),
        "finish_reason": result.finish_reason,
        "cached": result.cached,
        "cache_key": result.key,
        "cost_usd": result.cost_usd,
    }


def ai_message(result: Call, model: str) -> AIMessage:
    """The reply as LangChain's `AIMessage`: text, parsed tool calls, usage and metadata."""
    from langchain_core.messages import AIMessage

    calls, invalid = parsed_tool_calls(result.tool_calls)
    return AIMessage(
        content=result.text,
        tool_calls=calls,
        invalid_tool_calls=invalid,
        usage_metadata=usage_metadata(result),
        response_metadata=response_metadata(result, model),
    )


def message_chunk(delta: Delta) -> ChatGenerationChunk:
    """A streamed piece as LangChain's chunk (tool call pieces as `tool_call_chunks`, merged by index)."""
    from langchain_core.messages import AIMessageChunk
    from langchain_core.messages.tool import tool_call_chunk
    from langchain_core.outputs import ChatGenerationChunk

    chunks = [
        tool_call_chunk(
            name=(piece.get("function") or {}).get("name"),
            args=(piece.get("function") or {}).get("arguments"),
            id=piece.get("id"),
            index=piece.get("index"),
        )
        for piece in delta.tool_calls or []
    ]
    return ChatGenerationChunk(message=AIMessageChunk(content=delta.text, tool_call_chunks=chunks))


def last_chunk(result: Call | None, model: str) -> ChatGenerationChunk:
    """The chunk that ends a stream: no text, the usage and metadata, `chunk_position="last"` (which turns the
    aggregated tool call chunks into tool calls). None: an absent member's empty answer."""
    from langchain_core.messages import AIMessageChunk
    from langchain_core.outputs import ChatGenerationChunk

    if result is None:
        message = AIMessageChunk(content="", response_metadata={"model_name": model}, chunk_position="last")
    else:
        message = AIMessageChunk(
            content="",
            usage_metadata=usage_metadata(result),
            response_metadata=response_metadata(result, model),
            chunk_position="last",
        )
    return ChatGenerationChunk(message=message)


class ChatRun:
    """The callback events of one call made outside a chat model (a protocol's seat), under a LangGraph node.

    `start` opens the run with the node's `RunnableConfig` (its callbacks, tags and metadata, as LangGraph
    hands them to the node) and returns None when nobody listens, so a graph run without callbacks pays
    nothing. Events carry the member's model as `ls_model_name` and the seat's name as the run's name.
    """

    def __init__(self, manager: AsyncCallbackManagerForLLMRun, model: str) -> None:
        self.manager = manager
        self.model = model

    @classmethod
    async def start(
        cls,
        config: Any,
        name: str,
        member: Member,
        messages: list[dict[str, Any]],
        settings: dict[str, Any] | None = None,
    ) -> ChatRun | None:
        callbacks = (config or {}).get("callbacks")
        # LangGraph hands every node a callback manager, empty when nobody listens.
        if not callbacks or not getattr(callbacks, "handlers", callbacks):
            return None
        from langchain_core.callbacks import AsyncCallbackManager
        from langchain_core.messages import convert_to_messages

        params = {**member.generation_settings(), **(settings or {})}
        metadata = {
            "ls_provider": provider(member.model),
            "ls_model_name": params.get("model", member.model),
            "ls_model_type": "chat",
            "ls_temperature": params.get("temperature"),
            "ls_max_tokens": params.get("max_tokens"),
            "colab_graphs_member": member.name,
        }
        manager = AsyncCallbackManager.configure(
            inheritable_callbacks=config.get("callbacks"),
            inheritable_tags=config.get("tags"),
            inheritable_metadata=config.get("metadata"),
            local_metadata={k: v for k, v in metadata.items() if v is not None},
        )
        serialized = {"lc": 1, "type": "not_implemented", "id": ["colab_graphs", "Seat"], "name": name}
        (run,) = await manager.on_chat_model_start(
            serialized, [convert_to_messages(messages)], invocation_params=params, name=name
        )
        return cls(run, params.get("model", member.model))

    async def end(self, result: Call) -> None:
        from langchain_core.outputs import ChatGeneration, LLMResult

        message = ai_message(result, self.model)
        await self.manager.on_llm_end(LLMResult(generations=[[ChatGeneration(message=message)]]))

    async def error(self, exc: BaseException) -> None:
        await self.manager.on_llm_error(exc)
