"""The OpenAI request bodies `colab-graphs serve` accepts, checked field by field before anything is batched.

Types are strict (``"5"`` is not an integer, ``1e12`` is not an integer, ``NaN`` is not a temperature) and every
problem of a body is reported at once, as one OpenAI error (`RequestError`) whose ``param`` names the first
field at fault (``messages[1].role``). Unknown fields are refused, as OpenAI refuses them; a few known OpenAI
fields that change nothing here are accepted and ignored (`IGNORED`), and known fields the server does not
implement are refused with the reason when set to anything but their neutral value (`UNSUPPORTED`), so a
penalty or a logit bias is never silently dropped.

`SamplingParams` (`colab_graphs.local.sampling`) is the part shared with the in-process provider, which checks
a pool member's settings with it (there, unknown keys are LiteLLM's business and are ignored).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from colab_graphs.local.provider import MemberSampling
from colab_graphs.serve.http import RequestError

MAX_N = 16  # choices per prompt: each is a row of a batch
# Rows per request in all (prompts x n): each is decoded, and a reply holds them all at once.
MAX_CHOICES = 64
# JSON nesting of a request body: deeper bodies are refused before any part is validated (validators and
# guided decoding recurse; OpenAI allows a response schema 10 levels deep).
MAX_DEPTH = 64
# Fields OpenAI defines that ask for nothing this server would do differently.
IGNORED = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier")
# Field -> (values that ask for nothing, why anything else is refused).
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "presence_penalty": ((None, 0, 0.0), "penalties are not implemented by the local engine"),
    "frequency_penalty": ((None, 0, 0.0), "penalties are not implemented by the local engine"),
    "logit_bias": ((None, {}), "logit_bias is not implemented by the local engine"),
    "functions": ((None, []), "the deprecated 'functions' field is not served: send 'tools'"),
    "function_call": ((None,), "the deprecated 'function_call' field is not served: send 'tool_choice'"),
    "audio": ((None,), "this model reads and writes text only"),
    "modalities": ((None, ["text"]), "this model reads and writes text only"),
    "prediction": ((None,), "predicted outputs are not implemented"),
    "web_search_options": ((None,), "this server has no web search"),
    "reasoning_effort": ((None,), "this model has no reasoning effort setting"),
    "verbosity": ((None,), "this model has no verbosity setting"),
    "best_of": ((None, 1), "best_of is not implemented: ask for n choices instead"),
    "suffix": ((None, ""), "suffix (insertion) is not implemented"),
}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None


class Extension(_Strict):
    """The request's ``colab_graphs`` field: what it asks beyond OpenAI's API."""

    token_ids: bool = Field(False, description="return exact token ids and logprobs under colab_graphs")


class _Request(MemberSampling):
    """OpenAI's fields, and the vLLM extensions a trainer needs (vLLM's names and meaning, from its
    ``ChatCompletionRequest`` / ``CompletionRequest``): ``top_k``, ``min_p``, ``repetition_penalty`` (sampling)
    and ``return_token_ids`` (the prompt's and each choice's token ids in the response)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = None
    return_token_ids: bool | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    colab_graphs: Extension = Field(default_factory=Extension)
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    def problems(self) -> list[tuple[str, str]]:
        """What is wrong across fields, as (param, message)."""
        if self.stream_options is not None and not self.stream:
            return [("stream_options", "stream_options are only allowed with stream: true")]
        if self.return_token_ids and self.stream:
            # vLLM streams each chunk's token ids; this server's chunks carry text only
            message = (
                "return_token_ids is served without streaming here; or stream and send colab_graphs.token_ids"
            )
            return [("return_token_ids", message)]
        return []


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    """One chat message; ``developer`` is rendered as ``system``. Content is text (images are refused)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        kinds = [p.get("type") for p in content if isinstance(p, dict)] if isinstance(content, list) else []
        if any(kind != "text" for kind in kinds):
            raise ValueError(
                f"this model reads text only; content parts of type {sorted({str(k) for k in kinds} - {'text'})}"
            )
        return content

    @model_validator(mode="after")
    def _fits_its_role(self) -> Message:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        if self.role != "assistant" and self.tool_calls:
            raise ValueError("only assistant messages carry tool_calls")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        return self

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class FunctionSpec(_Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_when_asked(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema goes with type 'json_schema', and only with it")
        return self


class ChatCompletionRequest(_Request):
    """A ``POST /v1/chat/completions`` body."""

    messages: list[Message] = Field(min_length=1)
    logprobs: bool = False
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None

    def problems(self) -> list[tuple[str, str]]:
        problems = super().problems()
        if self.top_logprobs and not self.logprobs:
            problems.append(("top_logprobs", "top_logprobs needs logprobs: true"))
        names = [tool.function.name for tool in self.tools or []]
        if len(set(names)) < len(names):
            problems.append(("tools", f"tool names must be distinct, got {names}"))
        if self.tool_choice is not None and not self.tools:
            problems.append(("tool_choice", "tool_choice needs tools"))
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            name = self.tool_choice.function.name
            problems.append(
                ("tool_choice", f"tool_choice names {name!r}, which is not among the tools {names}")
            )
        return problems

    @property
    def tool_mode(self) -> str:
        """``none`` (no tools), ``auto``, ``required``, or ``function`` (tool_choice names one)."""
        if not self.tools:
            return "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return "function"
        return self.tool_choice or "auto"


class CompletionRequest(_Request):
    """A legacy ``POST /v1/completions`` body: a prompt string, a list of them, or token ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False

    def problems(self) -> list[tuple[str, str]]:
        problems = super().problems()
        if isinstance(self.prompt, list) and not self.prompt:
            problems.append(("prompt", "prompt must not be empty"))
        if self.top_logprobs is not None or self.max_completion_tokens is not None:
            problems.append(
                (
                    "body",
                    "top_logprobs and max_completion_tokens are chat fields: send logprobs: k, max_tokens",
                )
            )
        if isinstance(self.prompt, list) and self.prompt and len(self.prompts) * self.n > MAX_CHOICES:
            problems.append(
                (
                    "n",
                    f"{len(self.prompts)} prompts x n={self.n} ask for {len(self.prompts) * self.n} choices;"
                    f" this server writes at most {MAX_CHOICES} per request",
                )
            )
        if self.echo and self.logprobs is not None:
            message = "echo with logprobs needs the prompt's logprobs, which this server does not compute"
            problems.append(("echo", message))
        return problems

    @property
    def prompts(self) -> list[str | list[int]]:
        if isinstance(self.prompt, str):
            return [self.prompt]
        token_ids = [p for p in self.prompt if isinstance(p, int)]
        if len(token_ids) == len(self.prompt):  # one prompt as token ids
            return [token_ids]
        return [p for p in self.prompt if not isinstance(p, int)]


RequestModel = TypeVar("RequestModel", bound=BaseModel)


def parse_body(model: type[RequestModel], body: Any) -> RequestModel:
    """`body` as `model`, or a `RequestError` listing every problem (``param``: the first field at fault)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", code="invalid_json")
    fault = body_fault(body)
    if fault is not None:
        raise RequestError(fault[1], param=fault[0], code="invalid_value")
    problems = [
        (name, f"{name}: {reason}", "unsupported_parameter")
        for name, (neutral, reason) in UNSUPPORTED.items()
        if name in body and not _is_neutral(body[name], neutral)
    ]
    # null means "the default", as OpenAI reads it (clients send explicit nulls for fields they leave unset)
    fields = {key: value for key, value in body.items() if key not in UNSUPPORTED and value is not None}
    try:
        parsed = model.model_validate(fields)
    except ValidationError as exc:
        problems += _problems(exc.errors())
    else:
        across = parsed.problems() if isinstance(parsed, _Request) else []
        problems += [(param, f"{param}: {message}", "invalid_value") for param, message in across]
    if problems:
        summary = "; ".join(message for _, message, _ in problems)
        raise RequestError(summary, param=problems[0][0], code=problems[0][2])
    return parsed


def _is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    # bool is an int to Python, but `false` is no penalty of 0
    return any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in neutral)


_CODES = {"extra_forbidden": "unknown_parameter", "missing": "missing_required_parameter"}


def _problems(errors: list[Any]) -> list[tuple[str, str, str]]:
    """One problem per field: a union's branch errors are merged, and an error about a field whose part has
    its own error is left out (``content[0].type: should be 'text'`` says more than ``content: not a string``)."""
    by_param: dict[str, list[Any]] = {}
    for error in errors:
        by_param.setdefault(_field_path(error["loc"]) or "body", []).append(error)
    params = list(by_param)
    problems = []
    for param, group in by_param.items():
        if any(other != param and other.startswith((f"{param}.", f"{param}[")) for other in params):
            continue
        kind = group[0]["type"]
        code = _CODES.get(kind, "invalid_type" if kind.endswith("_type") else "invalid_value")
        if kind == "extra_forbidden":
            problems.append((param, f"{param}: unknown parameter", code))
            continue
        message = " or ".join(dict.fromkeys(e["msg"].removeprefix("Value error, ") for e in group))
        value = group[0].get("input")
        got = "" if kind in _CODES or isinstance(value, dict) else f" (got {_short(value)})"
        problems.append((param, f"{param}: {message}{got}", code))
    return problems


def _field_path(loc: tuple[Any, ...]) -> str:
    """``("messages", 1, "role")`` -> ``messages[1].role``; pydantic's union branch names are left out."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and not _is_branch_name(part):
            path += f".{part}" if path else part
    return path


def _is_branch_name(part: str) -> bool:
    return part in {"str", "int", "float", "bool", "list[str]", "list[int]", "list[list[int]]", "none"} or (
        part.startswith(("list[", "dict[", "literal[", "function-")) or part[:1].isupper()
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def body_fault(body: Any) -> tuple[str, str] | None:
    """The first place where `body` nests deeper than `MAX_DEPTH` or holds a string no tokenizer takes (a
    lone surrogate: JSON's ``\\ud800`` escapes reach Python as text UTF-8 cannot encode), as (param, message).

    Iterative, so no body can exhaust the stack that checks it.
    """
    stack: list[tuple[str, Any, int]] = [("", body, 0)]
    while stack:
        path, value, depth = stack.pop()
        if depth > MAX_DEPTH:
            where = path.split(".")[0].split("[")[0]  # the top-level field: the full path is 64 levels long
            return where, f"{where}: JSON nested deeper than {MAX_DEPTH} levels"
        if isinstance(value, str):
            if not _encodes(value):
                return path or "body", f"{path or 'the body'}: a string holds a lone UTF-16 surrogate"
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _encodes(key):
                    return path or "body", f"{path or 'the body'}: a key holds a lone UTF-16 surrogate"
                stack.append((f"{path}.{key}" if path else key, item, depth + 1))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item, depth + 1) for i, item in enumerate(value))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
