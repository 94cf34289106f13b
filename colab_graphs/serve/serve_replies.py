"""What `colab-graphs serve` answers to one checked request: the engine rows it decodes, the OpenAI response.

A reply is built in two steps so that everything that can refuse a request does so before anything is sent:
the constructor renders the prompt, checks the token budget and any schema and builds the engine rows (raising
`RequestError`); `complete()` (a JSON body) or `events()` (stream chunks) then decode. Responses carry OpenAI's
fields only, plus the top-level ``colab_graphs`` key when the request asked for token ids.
"""

from __future__ import annotations

import functools
import queue
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, Protocol

from colab_graphs.local.json_guide import JsonGuide, schema_problems, vocabulary
from colab_graphs.local.local_engine import GenerationRequest, GenerationResult, LocalEngine
from colab_graphs.local.provider import DETAILS_KEY, openai_logprobs, sampling_request
from colab_graphs.serve.http import RequestError
from colab_graphs.serve.openai_api import ChatCompletionRequest, CompletionRequest, NamedToolChoice
from colab_graphs.serve.tool_calls import call_schema, parse_tool_calls, render_chat

CHAT_DEFAULT_MAX_TOKENS = 256
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for legacy completions


class Serving(Protocol):
    """What a reply needs of the server (`colab_graphs.serve.server.LocalServer`)."""

    engine: LocalEngine
    served_name: str
    logprobs_mode: str  # the engine's "raw" or "processed" (vLLM's --logprobs-mode)

    def completion_budget(self, prompt_tokens: int, asked: int | None, default: int, param: str) -> int: ...

    def check_prompt_chars(self, chars: int, param: str) -> None: ...


class _Reply:
    """The rows of one request and how their results are gathered."""

    object_name = ""
    id_prefix = ""

    def __init__(self, state: Serving, request: ChatCompletionRequest | CompletionRequest) -> None:
        self.state, self.engine = state, state.engine
        self.stream = request.stream
        self.include_usage = bool(request.stream_options and request.stream_options.include_usage)
        self.token_ids = request.colab_graphs.token_ids
        self.return_token_ids = bool(request.return_token_ids)  # vLLM's fields: prompt_token_ids, token_ids
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.rows: list[GenerationRequest] = []
        self.prompt_tokens = 0
        self.usage_counts: dict[str, int] = {}

    def cancel(self) -> None:
        """The client left: drop every row of this reply at the engine's next step (any thread)."""
        for row in self.rows:
            self.engine.cancel(row)

    def _submit(self) -> list[Future[GenerationResult]]:
        for row in self.rows:
            row.logprobs_mode = self.state.logprobs_mode
        return [self.engine.submit(row) for row in self.rows]

    def _results(self) -> list[GenerationResult]:
        return [future.result() for future in self._submit()]

    def _pieces(self) -> Iterator[tuple[int, str | None, GenerationResult | BaseException | None]]:
        """``(row, text, None)`` as rows write, then ``(row, None, result or exception)`` as each ends."""
        events: queue.Queue[tuple[int, str | None, GenerationResult | BaseException | None]] = queue.Queue()

        def ended(i: int, future: Future[GenerationResult]) -> None:
            events.put((i, None, future.exception() or future.result()))

        for i, row in enumerate(self.rows):
            row.on_text = lambda piece, i=i: events.put((i, piece, None))
        futures = self._submit()
        for i, future in enumerate(futures):
            future.add_done_callback(functools.partial(ended, i))
        left = len(futures)
        while left:
            event = events.get()
            left -= event[1] is None
            yield event

    def _usage(self, results: list[GenerationResult]) -> dict[str, int]:
        completion = sum(len(result.completion_ids) for result in results)
        # updated in place: the handler holds this dict for its access-log line
        self.usage_counts.update(prompt_tokens=self.prompt_tokens, completion_tokens=completion)
        return {**self.usage_counts, "total_tokens": self.prompt_tokens + completion}

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.object_name,
            "created": self.created,
            "model": self.state.served_name,
        }

    def _details(self, results: list[GenerationResult]) -> dict[str, Any]:
        return {
            "choices": [
                {
                    "index": i,
                    "prompt_token_ids": result.prompt_ids,
                    "completion_token_ids": result.completion_ids,
                    "logprobs": result.logprobs,
                }
                for i, result in enumerate(results)
            ]
        }

    def _tail(self, results: list[GenerationResult | None], head: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The closing chunk of a stream: usage and token ids, when asked."""
        done = [result for result in results if result is not None]
        tail: dict[str, Any] = {}
        if self.include_usage:
            tail["usage"] = self._usage(done)
        else:
            self._usage(done)
        if self.token_ids:
            tail[DETAILS_KEY] = self._details(done)
        if tail:
            yield {**head, "choices": [], **tail}


def _stream_error(exc: BaseException) -> dict[str, Any]:
    return {"error": {"message": f"generation failed: {type(exc).__name__}: {exc}", "type": "server_error"}}


class ChatReply(_Reply):
    """The reply to a chat completion request."""

    object_name = "chat.completion"
    id_prefix = "chatcmpl"

    def __init__(self, state: Serving, request: ChatCompletionRequest) -> None:
        super().__init__(state, request)
        self.request = request
        mode = request.tool_mode
        forced = mode in ("required", "function")
        schema, param = self._schema(request, forced)
        problems = schema_problems(schema) if schema is not None else []
        if problems:
            raise RequestError("; ".join(problems), param=param, code="unsupported_schema")
        # The messages' text is part of the prompt: what cannot fit is refused before it is tokenized.
        state.check_prompt_chars(sum(len(m.text) for m in request.messages), "messages")
        # tool_choice "none": the tools are not shown, and nothing is parsed as a call
        shown = request.tools if mode != "none" else None
        prompt = _render(self.engine, request, shown, forced)
        self.prompt_tokens = len(prompt)
        budget = state.completion_budget(
            len(prompt), request.completion_limit, CHAT_DEFAULT_MAX_TOKENS, "messages"
        )
        self.rows = [sampling_request(prompt, request, budget, choice=i) for i in range(request.n)]
        if schema is not None:
            vocab = vocabulary(self.engine.tokenizer)
            for row in self.rows:
                row.allowed_tokens = JsonGuide(
                    schema, vocab, self.engine.eos_ids, greedy=row.temperature <= 0
                )
        # With a response_format and tool_choice "auto" the reply is the JSON asked for, not a call.
        self.parse_tools = forced or (mode == "auto" and schema is None)

    @staticmethod
    def _schema(request: ChatCompletionRequest, forced: bool) -> tuple[dict[str, Any] | None, str]:
        if forced:
            assert request.tools is not None
            choice = request.tool_choice
            named = choice.function.name if isinstance(choice, NamedToolChoice) else None
            return call_schema(request.tools, named), "tools"
        response_format = request.response_format
        if response_format is None or response_format.type == "text":
            return None, ""
        if response_format.type == "json_object":
            return {"type": "object"}, "response_format"
        assert response_format.json_schema is not None
        return response_format.json_schema.schema_ or {}, "response_format.json_schema.schema"

    def _message(self, result: GenerationResult) -> tuple[dict[str, Any], str]:
        """The assistant message and finish reason of one result (tool calls parsed out when they apply)."""
        if self.parse_tools and result.finish_reason != "length":
            assert self.request.tools is not None
            parsed = parse_tool_calls(result.text, self.request.tools, self.request.parallel_tool_calls)
            if parsed is not None:
                content, calls = parsed
                return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"
        return {"role": "assistant", "content": result.text}, result.finish_reason

    def _logprobs(self, result: GenerationResult) -> dict[str, Any] | None:
        return openai_logprobs(self.engine.tokenizer, result) if self.request.logprobs else None

    def complete(self) -> dict[str, Any]:
        results = self._results()
        choices = []
        for i, result in enumerate(results):
            message, finish = self._message(result)
            choice = {
                "index": i,
                "message": message,
                "logprobs": self._logprobs(result),
                "finish_reason": finish,
            }
            if self.return_token_ids:
                choice["token_ids"] = result.completion_ids
            choices.append(choice)
        payload = {**self._head(), "choices": choices, "usage": self._usage(results)}
        if self.return_token_ids:
            payload["prompt_token_ids"] = results[0].prompt_ids if results else None
        if self.token_ids:
            payload[DETAILS_KEY] = self._details(results)
        return payload

    def events(self) -> Iterator[dict[str, Any]]:
        head = {**self._head(), "object": "chat.completion.chunk"}

        def chunk(
            i: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None
        ) -> dict[str, Any]:
            return {
                **head,
                "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
            }

        for i in range(len(self.rows)):
            yield chunk(i, {"role": "assistant", "content": ""})
        results: list[GenerationResult | None] = [None] * len(self.rows)
        for i, piece, outcome in self._pieces():
            if piece is not None:
                if not self.parse_tools:  # a call is known only at the end: its text is held back
                    yield chunk(i, {"content": piece})
                continue
            if isinstance(outcome, BaseException):
                yield _stream_error(outcome)
                return
            assert outcome is not None
            results[i] = outcome
            message, finish = self._message(outcome)
            if self.parse_tools:
                if message["content"]:
                    yield chunk(i, {"content": message["content"]})
                for k, call in enumerate(message.get("tool_calls") or []):
                    yield chunk(i, {"tool_calls": [{"index": k, **call}]})
            yield chunk(i, {}, finish, self._logprobs(outcome))
        yield from self._tail(results, head)


def _render(engine: Any, request: ChatCompletionRequest, tools: Any, forced: bool) -> list[int]:
    from jinja2 import TemplateError

    try:
        return render_chat(engine, request.messages, tools, forced)
    except TemplateError as exc:
        raise RequestError(
            f"the model's chat template refused these messages: {exc}", param="messages"
        ) from None


class CompletionReply(_Reply):
    """The reply to a legacy text completion request: n choices per prompt, choice k = prompt k // n."""

    object_name = "text_completion"
    id_prefix = "cmpl"

    def __init__(self, state: Serving, request: CompletionRequest) -> None:
        super().__init__(state, request)
        self.request = request
        tokenizer = self.engine.tokenizer
        self.echoes: list[str] = []
        for p, prompt in enumerate(request.prompts):
            ids = self._prompt_ids(prompt, p)
            budget = state.completion_budget(
                len(ids), request.completion_limit, COMPLETION_DEFAULT_MAX_TOKENS, "prompt"
            )
            self.prompt_tokens += len(ids)
            echo = (prompt if isinstance(prompt, str) else tokenizer.decode(ids)) if request.echo else ""
            for j in range(request.n):
                row = sampling_request(ids, request, budget, choice=j)
                row.top_logprobs = request.logprobs or 0
                self.rows.append(row)
                self.echoes.append(echo)

    def _prompt_ids(self, prompt: str | list[int], index: int) -> list[int]:
        tokenizer = self.engine.tokenizer
        if isinstance(prompt, str):
            self.state.check_prompt_chars(len(prompt), f"prompt[{index}]")
            ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
        else:
            ids = prompt
            wrong = [t for t in ids if not 0 <= t < len(tokenizer)]
            if wrong:
                message = (
                    f"prompt[{index}] holds token ids outside the vocabulary of {len(tokenizer)}: {wrong[:5]}"
                )
                raise RequestError(message, param="prompt", code="invalid_value")
        if not ids:
            raise RequestError(f"prompt[{index}] has no tokens", param="prompt", code="invalid_value")
        return ids

    def _logprobs(self, result: GenerationResult, offset: int) -> dict[str, Any] | None:
        if self.request.logprobs is None:
            return None
        decode = self.engine.tokenizer.decode
        tokens = [decode([token]) for token in result.completion_ids]
        offsets, at = [], offset
        for token in tokens:
            offsets.append(at)
            at += len(token)
        tops = (
            [{decode([t]): lp for t, lp in top} for top in result.top_logprobs]
            if self.request.logprobs
            else None
        )
        return {
            "tokens": tokens,
            "token_logprobs": result.logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def complete(self) -> dict[str, Any]:
        results = self._results()
        choices = [
            {
                "text": self.echoes[k] + result.text,
                "index": k,
                "logprobs": self._logprobs(result, len(self.echoes[k])),
                "finish_reason": result.finish_reason,
                **(
                    {"prompt_token_ids": result.prompt_ids, "token_ids": result.completion_ids}
                    if self.return_token_ids
                    else {}
                ),
            }
            for k, result in enumerate(results)
        ]
        payload = {**self._head(), "choices": choices, "usage": self._usage(results)}
        if self.token_ids:
            payload[DETAILS_KEY] = self._details(results)
        return payload

    def events(self) -> Iterator[dict[str, Any]]:
        head = self._head()

        def chunk(k: int, text: str, finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
            return {
                **head,
                "choices": [{"text": text, "index": k, "logprobs": logprobs, "finish_reason": finish}],
            }

        for k, echo in enumerate(self.echoes):
            if echo:
                yield chunk(k, echo)
        results: list[GenerationResult | None] = [None] * len(self.rows)
        for k, piece, outcome in self._pieces():
            if piece is not None:
                yield chunk(k, piece)
            elif isinstance(outcome, BaseException):
                yield _stream_error(outcome)
                return
            else:
                assert outcome is not None
                results[k] = outcome
                yield chunk(k, "", outcome.finish_reason, self._logprobs(outcome, len(self.echoes[k])))
        yield from self._tail(results, head)
