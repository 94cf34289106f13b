"""LangChain chat models whose every call goes through this package's call path (`ModelClient`).

`LiteLLMChatModel` takes LiteLLM's arguments (`model` plus `temperature`, `max_tokens`, `api_base`, `api_key`,
... and any other `litellm.completion` keyword argument), so one class covers zoo models in process
(``local/smollm2-135m``), a served policy (``openai/NAME`` with ``api_base``) and hosted APIs. Its calls are
cached, shared in flight, retried and traced like every other call here. It speaks LangChain's whole chat
model contract: `invoke` / `ainvoke`, token streaming (`stream` / `astream`, with `on_llm_new_token`), tools
(`bind_tools`, tool calls parsed into `AIMessage.tool_calls`, tool call chunks when streaming), structured
output (`with_structured_output` by tool calling, JSON schema or JSON mode), usage metadata and callbacks.

Example:
    >>> from colab_graphs.langchain.chat_model import LiteLLMChatModel
    >>> llm = LiteLLMChatModel(model="local/smollm2-135m", temperature=0, max_tokens=64)
    >>> llm.invoke("What is 2+2?").content  # doctest: +SKIP
    'The answer to this classic math problem is 4.'

A reply served from the call cache (or from an identical call in flight) streams as one chunk: the cache
keeps the reply, not how the model cut it into tokens, and inventing a cut would pretend to timings that
never happened. Every stream ends with an empty chunk carrying the usage (`chunk_position="last"`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from pydantic import ConfigDict, Field, SecretStr, model_validator

import colab_graphs._env  # noqa: F401  (offline settings before litellm loads)
from colab_graphs import otel
from colab_graphs.langchain.lc import ai_message, last_chunk, message_chunk, openai_messages
from colab_graphs.models.cache import request_key
from colab_graphs.models.client import (
    Delta,
    ModelClient,
    background_loop,
    default_client,
    deliver,
    whole_calls,
)
from colab_graphs.models.flight import Memo
from colab_graphs.pool import LITELLM_KWARGS, Member, PoolError, make_member
from colab_graphs.trace import Call, Trace
from colab_graphs.watch import pending_call

# Keyword arguments LangChain hands a model that are about tracing, not the request.
_NOT_SENT = frozenset({"ls_structured_output_format", "structured_output_format", "stream"})
# What a call may set besides LiteLLM's completion arguments: the tool calling ones.
_CALL_KWARGS = LITELLM_KWARGS | {"tools", "tool_choice", "parallel_tool_calls"}


@dataclasses.dataclass
class Target:
    """Where one call goes: the client and member (None: an absent member that answers empty), the trace to
    record it in, a memo shared by the runs of one example (an audit's coalitions), the LangGraph node that
    made it, and the loop that sync calls run on (None: the package's background loop)."""

    client: ModelClient
    member: Member | None
    trace: Trace | None = None
    memo: Memo | None = None
    loop: asyncio.AbstractEventLoop | None = None
    node: str | None = None


class CallPathChatModel(BaseChatModel):
    """What the package's chat models share: LangChain's contract over `ModelClient`. A subclass says where a
    call goes (`_target`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    streaming: bool = False
    """Make `invoke` stream under the hood (callbacks then see every token)."""

    def _target(self, metadata: dict[str, Any] | None, parent: UUID | None = None) -> Target:
        """Where a call goes; `metadata` and `parent` (the run that made it) are the call's (`call_site`)."""
        raise NotImplementedError

    # --- calls ---------------------------------------------------------------------------------------------

    def _call_settings(self, stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        overrides = {k: v for k, v in kwargs.items() if k not in _NOT_SENT}
        unknown = sorted(set(overrides) - _CALL_KWARGS)
        if unknown:
            raise ValueError(
                f"{type(self).__name__}: unknown call argument(s) {', '.join(unknown)}; a call takes LiteLLM "
                "completion arguments (temperature, max_tokens, stop, tools, tool_choice, response_format, ...)"
            )
        if stop:
            overrides["stop"] = list(stop)
        return overrides

    async def _complete(
        self,
        target: Target,
        messages: list[BaseMessage],
        overrides: dict[str, Any],
        on_delta: Callable[[Delta], Any] | None = None,
    ) -> Call | None:
        """The call (None when the target's member is absent and answers empty)."""
        member = target.member
        if member is None:
            return None
        sent = openai_messages(messages)
        options: dict[str, Any] = {"overrides": overrides or None, "node": target.node, "seat": member.name}
        # (A call another run makes counts as this one's; the node that called is the seat of the trace.)
        with pending_call(target.node, member.name), otel.seat_span(target.node, member.name):
            if target.memo is None:
                return await target.client.complete(
                    member, sent, trace=target.trace, on_delta=on_delta, **options
                )
            return await _memoised(target, target.memo, member, sent, overrides, on_delta, options)

    def _model_name(self, target: Target, overrides: dict[str, Any]) -> str:
        return str(overrides.get("model") or (target.member.model if target.member else ""))

    def _result(self, result: Call | None, model: str) -> ChatResult:
        message = AIMessage(content="") if result is None else ai_message(result, model)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        target = self._target(*call_site(run_manager))
        overrides = self._call_settings(stop, kwargs)
        result = run_on(target.loop, self._complete(target, messages, overrides))
        return self._result(result, self._model_name(target, overrides))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        target = self._target(*call_site(run_manager))
        overrides = self._call_settings(stop, kwargs)
        result = await self._complete(target, messages, overrides)
        return self._result(result, self._model_name(target, overrides))

    async def _chunks(
        self, target: Target, messages: list[BaseMessage], overrides: dict[str, Any]
    ) -> AsyncIterator[ChatGenerationChunk]:
        """The reply's chunks as they arrive, then the last one (usage, `chunk_position="last"`)."""
        pieces: asyncio.Queue[Delta | None] = asyncio.Queue()
        call = asyncio.ensure_future(self._complete(target, messages, overrides, pieces.put_nowait))
        call.add_done_callback(lambda _: pieces.put_nowait(None))
        try:
            while (delta := await pieces.get()) is not None:
                yield message_chunk(delta)
            result = call.result()
        finally:
            if not call.done():  # the consumer stopped early: the call's owner lets go (waiters take it over)
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call
        yield last_chunk(result, self._model_name(target, overrides))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        target = self._target(*call_site(run_manager))
        async for chunk in self._chunks(target, messages, self._call_settings(stop, kwargs)):
            if run_manager is not None:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        target = self._target(*call_site(run_manager))
        chunks = self._chunks(target, messages, self._call_settings(stop, kwargs))
        for chunk in iterate_on(target.loop, chunks):
            if run_manager is not None:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    # --- tools and structured output -----------------------------------------------------------------------

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | bool | dict[str, Any] | None = None,
        strict: bool | None = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        """Offer `tools` (LangChain tools, functions, pydantic models or OpenAI tool dicts) with every call.

        `tool_choice`: "auto", "none", "required" (or "any" / True), or a tool's name to force that tool.
        """
        from langchain_core.utils.function_calling import convert_to_openai_tool

        formatted = [convert_to_openai_tool(tool, strict=strict) for tool in tools]
        if tool_choice is not None and tool_choice is not False:
            kwargs["tool_choice"] = _tool_choice(tool_choice, formatted)
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
        return super().bind(tools=formatted, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        include_raw: bool = False,
        method: Literal["function_calling", "json_schema", "json_mode"] = "function_calling",
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, dict[str, Any] | Any]:
        """Replies parsed into `schema` (a pydantic model, a TypedDict or a JSON schema).

        `method`: "function_calling" (the schema as the one tool the model must call), "json_schema" (LiteLLM's
        `response_format` with the schema: guided decoding where the server supports it) or "json_mode"
        (`response_format={"type": "json_object"}`; the prompt must ask for the fields).
        """
        if kwargs:
            raise ValueError(f"with_structured_output: unsupported argument(s) {sorted(kwargs)}")
        from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
        from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
        from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
        from langchain_core.utils.pydantic import is_basemodel_subclass

        # `pydantic`: a pydantic (v2 or v1) model class. mypy does not narrow `schema` through the flag (the
        # two `type: ignore`s below); testing both bases here instead would import pydantic.v1.
        pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        trace_format = {"kwargs": {"method": method}, "schema": schema}
        if method == "function_calling":
            name = convert_to_openai_tool(schema)["function"]["name"]
            llm = self.bind_tools(
                [schema], tool_choice=name, strict=strict, ls_structured_output_format=trace_format
            )
            parser: Runnable[Any, Any] = (
                PydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
                if pydantic
                else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
            )
        elif method in ("json_schema", "json_mode"):
            if method == "json_schema":
                json_schema = convert_to_json_schema(schema)
                spec = {"name": json_schema.get("title", "output"), "schema": json_schema}
                if strict is not None:
                    spec["strict"] = strict
                response_format: dict[str, Any] = {"type": "json_schema", "json_schema": spec}
            else:
                response_format = {"type": "json_object"}
            llm = self.bind(response_format=response_format, ls_structured_output_format=trace_format)
            parser = PydanticOutputParser(pydantic_object=schema) if pydantic else JsonOutputParser()  # type: ignore[arg-type]
        else:
            raise ValueError(f"method must be function_calling, json_schema or json_mode, got {method!r}")
        if not include_raw:
            return llm | parser
        from langchain_core.runnables import RunnableMap, RunnablePassthrough

        parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
        failed = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([failed], exception_key="parsing_error")


def _tool_choice(choice: str | bool | dict[str, Any], tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    """LangChain's tool choices in OpenAI's words: "any" / True -> "required", a tool name -> that tool."""
    if isinstance(choice, dict):
        return choice
    if choice is True or choice == "any":
        return "required"
    if choice in ("auto", "none", "required"):
        return choice
    names = [t["function"]["name"] for t in tools]
    if choice not in names:
        raise ValueError(f"tool_choice {choice!r} names no bound tool; tools: {', '.join(names)}")
    return {"type": "function", "function": {"name": choice}}


async def _memoised(
    target: Target,
    memo: Memo,
    member: Member,
    messages: list[dict[str, Any]],
    overrides: dict[str, Any],
    on_delta: Callable[[Delta], Any] | None,
    options: dict[str, Any],
) -> Call:
    """The call, shared through the target's memo with the other runs of the example (an audit's coalitions):
    a request another run made is taken from the memo and recorded as served again (what the client's cache
    would serve, without its lookup); one in flight is waited for."""
    request, _ = target.client.canonical_request(member, messages, 0, overrides or None)

    async def make() -> Call:
        return await target.client.complete(
            member, messages, trace=target.trace, on_delta=on_delta, **options
        )

    call, shared = await memo.calls.run(request_key(request), make)
    if not shared:
        return call
    again = call.served_again(node=target.node)
    if target.trace is not None:
        target.trace.calls.append(again)
    otel.replayed_call(again)
    if on_delta is not None:
        await deliver(on_delta, Delta(again.text, whole_calls(again.tool_calls)))
    return again


def call_site(run_manager: Any) -> tuple[dict[str, Any], UUID | None]:
    """The metadata (LangGraph's node among it) and parent run of a call: its run manager's, else the runnable
    config's in context. langchain-core calls `_stream` / `_astream` without a run manager (`model.stream()` in a
    node), where only the config LangGraph set around the node tells where the call is."""
    if run_manager is not None:
        return dict(run_manager.metadata or {}), run_manager.parent_run_id
    from langchain_core.runnables.config import var_child_runnable_config

    config = var_child_runnable_config.get() or {}
    return dict(config.get("metadata") or {}), getattr(config.get("callbacks"), "parent_run_id", None)


def run_on(loop: asyncio.AbstractEventLoop | None, coro: Any) -> Any:
    """Wait, from sync code, for `coro` run on `loop` (default: the package's background loop)."""
    target = loop or background_loop()
    if _running_loop() is target:
        coro.close()
        raise RuntimeError(
            "a sync call (invoke, stream) from the event loop that runs the model calls would wait for itself: "
            "use ainvoke / astream in async code"
        )
    # (The loop's tasks do not copy this thread's context: a trace's current span is carried over.)
    return asyncio.run_coroutine_threadsafe(otel.carried(coro), target).result()


def iterate_on(loop: asyncio.AbstractEventLoop | None, items: AsyncIterator[Any]) -> Iterator[Any]:
    """Iterate, from sync code, over an async iterator run on `loop` (default: the background loop)."""
    target = loop or background_loop()
    if _running_loop() is target:
        raise RuntimeError("a sync stream from the event loop that runs the model calls: use astream instead")
    handoff: queue.Queue[tuple[str, Any]] = queue.Queue()

    async def pump() -> None:
        try:
            async for item in items:
                handoff.put(("item", item))
        except BaseException as exc:  # noqa: BLE001 - handed to the sync side, which raises it
            handoff.put(("error", exc))
        else:
            handoff.put(("done", None))

    pumping = asyncio.run_coroutine_threadsafe(otel.carried(pump()), target)
    try:
        while True:
            kind, value = handoff.get()
            if kind == "done":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        pumping.cancel()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# The constructor arguments with a field of their own; every other LiteLLM argument goes into `settings`.
_GENERATION_FIELDS = ("temperature", "max_tokens", "top_p", "seed", "stop", "timeout", "api_base")


class LiteLLMChatModel(CallPathChatModel):
    """A LangChain chat model over LiteLLM, called through the package's call path.

    Attributes:
        model: LiteLLM model string (``local/...``, ``openai/...``, ``hosted_vllm/...``, ...).
        temperature, max_tokens, top_p, seed, stop, timeout, api_base: LiteLLM's arguments of those names.
        api_key: The API key (kept as a secret: never in repr, traces, caches or serialised forms).
        system_prompt: A system message put before every conversation (merged into a conversation's own).
        settings: Any other `litellm.completion` argument (also accepted as top-level keyword arguments);
            `max_retries` (LangChain's name) becomes `num_retries`, the call path's retries for this model.
        member_name: The name calls are recorded under in traces.
        client: The call path (default: the process-wide client with the on-disk cache).
    """

    model: str
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    timeout: float | None = None
    api_base: str | None = None
    api_key: SecretStr | None = None
    system_prompt: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    member_name: str = "chat"
    # Headers may carry credentials: kept out of repr and serialised forms.
    extra_headers: dict[str, str] | None = Field(default=None, repr=False, exclude=True)
    client: ModelClient | None = Field(default=None, exclude=True, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _gather_settings(cls, values: Any) -> Any:
        """Top-level LiteLLM arguments without a field go to `settings`; declared ones given in `settings`
        (an older way of passing them) come out to their fields, so each setting has one place."""
        if not isinstance(values, dict):
            return values
        values = dict(values)
        if "max_retries" in values:  # LangChain's name for it; the call path retries (see ModelClient)
            values.setdefault("settings", {})
            values["settings"] = {**values["settings"], "num_retries": values.pop("max_retries")}
        if values.get("stop") == []:
            values["stop"] = None
        names = set(cls.model_fields)
        extra = {k: values.pop(k) for k in list(values) if k not in names}
        unknown = sorted(set(extra) - LITELLM_KWARGS)
        if unknown:
            raise ValueError(
                f"LiteLLMChatModel: unknown argument(s) {', '.join(unknown)}; it takes LiteLLM's completion "
                "arguments (model, temperature, max_tokens, api_base, api_key, ...) and system_prompt"
            )
        settings = {**dict(values.get("settings") or {}), **extra}
        for name in (*_GENERATION_FIELDS, "api_key", "extra_headers"):
            if name in settings:
                values.setdefault(name, settings.pop(name))
        if "model" in settings:
            values.setdefault("model", settings.pop("model"))
        values["settings"] = settings
        return values

    @classmethod
    def from_settings(cls, settings: dict[str, Any], **options: Any) -> LiteLLMChatModel:
        """Build from a pool member's settings mapping (``model``, LiteLLM arguments, ``system_prompt``);
        `options` are other fields (``client``, ``member_name``)."""
        if "model" not in settings:
            raise ValueError(f"member settings need a 'model' key, got keys {sorted(settings)}")
        if settings.get("deployments"):
            raise ValueError(
                "a member with deployments is called through its Router: use "
                "colab_graphs.member_chat_model(NAME, pool=...) for it"
            )
        rest = {k: v for k, v in settings.items() if k not in ("description", "deployments", "router")}
        return cls(**rest, **options)

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        """The module LangChain's `load` imports the class from: this package's (a payload dumped before the
        LangChain adapters had a package of their own names the call path's folder, whose id an allowlist of
        this class no longer matches: dump it again)."""
        return ["colab_graphs", "langchain", "chat_model"]

    @property
    def lc_secrets(self) -> dict[str, str]:
        return {"api_key": "LITELLM_API_KEY"}

    @property
    def _llm_type(self) -> str:
        return "colab-graphs-litellm"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        from colab_graphs.redaction import public_settings

        # LangChain writes these to its tracers (LangSmith, callbacks): no key, header or URL secret.
        fields = {k: getattr(self, k) for k in _GENERATION_FIELDS if getattr(self, k) is not None}
        return {"model": self.model, **public_settings({**fields, **self.settings}, {})}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        from colab_graphs.langchain.lc import provider

        params = super()._get_ls_params(stop=stop, **kwargs)
        model = kwargs.get("model") or self.model
        params["ls_provider"] = provider(model)
        params["ls_model_name"] = model
        return params

    def member(self) -> Member:
        """The pool member this model calls as (what the call path caches and traces)."""
        settings: dict[str, Any] = {"model": self.model, **self.settings}
        settings.update({k: getattr(self, k) for k in _GENERATION_FIELDS if getattr(self, k) is not None})
        if self.api_key is not None:
            settings["api_key"] = self.api_key.get_secret_value()
        if self.extra_headers:
            settings["extra_headers"] = self.extra_headers
        if self.system_prompt:
            settings["system_prompt"] = self.system_prompt
        try:
            return make_member(self.member_name, settings, where="LiteLLMChatModel")
        except PoolError as err:
            raise ValueError(str(err)) from None

    def _target(self, metadata: dict[str, Any] | None, parent: UUID | None = None) -> Target:
        node = (metadata or {}).get("langgraph_node")
        return Target(self.client or default_client(), self.member(), node=node)
