"""Member scripts for the scripted server: the `Member` type, ready-made scripts, and member files.

A script is a plain callable `(messages, params) -> reply` where `messages` are the request's OpenAI chat
messages and `params` its sampling settings (`tools` and `tool_choice` among them when the client sent
tools). A reply is the text, or a `Reply` that also calls tools (sent as OpenAI `tool_calls`). Ready-made
scripts are factories returning such callables:

    >>> solver = arithmetic_solver(accuracy=1.0)
    >>> solver([{"role": "user", "content": "What is 6 * 7?"}], {})
    'The answer is 42.'
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class ToolCall:
    """A tool call a scripted member makes: the tool's name and its arguments.

    Attributes:
        name: The function's name.
        arguments: The arguments as a mapping (sent as JSON), or a string sent as it is (to write malformed
            JSON on purpose).
        id: The call's id; None derives one from the request, so equal requests get equal ids.
    """

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class Reply:
    """A scripted reply that may call tools: the text (may be empty) and the tool calls, in order."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


Script = Callable[[Messages, dict[str, Any]], "str | Reply"]
"""A member's script: `(messages, params) -> reply` (text or `Reply`); params are the request's settings."""


def unit_draw(*parts: object) -> float:
    """A reproducible number in [0, 1) from `parts` (sha256, because Python's hash() is salted per process)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message whose content is a string or a list of OpenAI content parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last message with role "user" ("" when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message)
    return ""


def _check_confidence(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value <= 1.0:
        raise ValueError(f"confidence must be a number in (0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Member:
    """A scripted model.

    Attributes:
        reply: The constant reply, or a script `(messages, params) -> str`.
        confidence: Probability the member assigns to each token it writes, in (0, 1], or a function
            `(messages, params) -> float`; returned as logprobs when a request asks for them.
        latency_s: Seconds to wait before answering; None uses the server's `latency_s`.
    """

    reply: str | Script
    confidence: float | Callable[[Messages, dict[str, Any]], float] = 1.0
    latency_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.reply, str) and not callable(self.reply):
            raise TypeError(f"reply must be a string or a callable, got {type(self.reply).__name__}")
        if not callable(self.confidence):
            _check_confidence(self.confidence)
        if self.latency_s is not None and not self.latency_s >= 0:
            raise ValueError(f"latency_s must be >= 0, got {self.latency_s!r}")

    def respond(self, messages: Messages, params: dict[str, Any]) -> tuple[str, float]:
        """The reply's text and the confidence to report for its tokens (see `reply_to` for tool calls)."""
        reply, confidence = self.reply_to(messages, params)
        return reply.content, confidence

    def reply_to(self, messages: Messages, params: dict[str, Any]) -> tuple[Reply, float]:
        """The reply to a request (text and tool calls) and the confidence to report for its tokens."""
        reply = self.reply if isinstance(self.reply, str) else self.reply(messages, params)
        if isinstance(reply, str):
            reply = Reply(reply)
        if not isinstance(reply, Reply):
            raise TypeError(f"script returned {type(reply).__name__}, expected str or Reply")
        confidence = self.confidence(messages, params) if callable(self.confidence) else self.confidence
        return reply, _check_confidence(confidence)


def echo() -> Script:
    """A script that replies with the last user message."""

    def script(messages: Messages, params: dict[str, Any]) -> str:
        return last_user_text(messages)

    return script


def constant(text: str) -> Script:
    """A script that always replies `text`."""

    def script(messages: Messages, params: dict[str, Any]) -> str:
        return text

    return script


def answer_key(mapping: Mapping[str, str], default: str = "I don't know.") -> Script:
    """A script that replies with the value of the first key (in mapping order) found in the last user message.

    Args:
        mapping: Substring of the question -> reply.
        default: The reply when no key occurs in the message.
    """
    items = list(mapping.items())

    def script(messages: Messages, params: dict[str, Any]) -> str:
        text = last_user_text(messages)
        return next((reply for key, reply in items if key in text), default)

    return script


_EXPRESSION = re.compile(r"(-?\d+)\s*([+*-])\s*(-?\d+)")


def arithmetic_solver(
    accuracy: float = 1.0,
    seed: int = 0,
    style: str = "The answer is {answer}.",
    no_problem: str = "I see no arithmetic problem.",
) -> Script:
    """A script that solves the first integer expression `A op B` (op in + - *) of the last user message.

    It is right with probability `accuracy`, decided per (seed, message) from sha256, so the same question
    always gets the same answer; a wrong answer is the right one plus 1..9, also fixed per (seed, message).
    Different seeds make independent solvers of the same accuracy (useful for voting and audits).

    Args:
        accuracy: Probability of a right answer, in [0, 1].
        seed: Which solver of that accuracy this is.
        style: The reply, formatted with `answer`.
        no_problem: The reply when the message holds no expression.
    """
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy must be in [0, 1], got {accuracy!r}")

    def script(messages: Messages, params: dict[str, Any]) -> str:
        text = last_user_text(messages)
        match = _EXPRESSION.search(text)
        if match is None:
            return no_problem
        a, op, b = int(match[1]), match[2], int(match[3])
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        if unit_draw("arithmetic", seed, text, "right") >= accuracy:
            answer += 1 + int(unit_draw("arithmetic", seed, text, "offset") * 9)
        return style.format(answer=answer)

    return script


SCRIPTS: dict[str, Callable[..., Script]] = {
    "echo": echo,
    "constant": constant,
    "answer_key": answer_key,
    "arithmetic_solver": arithmetic_solver,
}
"""Ready-made scripts by name, for member files: `{script: arithmetic_solver, args: {accuracy: 0.7}}`."""


def member_from_config(spec: Any, where: str = "member") -> Member:
    """Build a member from its config: a constant reply, or a mapping with `reply` or `script` (+ `args`).

    Args:
        spec: `"text"`, `{reply: "text"}` or `{script: NAME, args: {...}}`, each mapping optionally with
            `confidence` and `latency_s`. NAME is a key of `SCRIPTS`.
        where: Where the spec came from, for error messages (e.g. "members.yaml: beta").

    Raises:
        ValueError: The spec is malformed; the message names `where` and the field.
    """
    if isinstance(spec, str):
        return Member(spec)
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: expected a reply string or a mapping, got {type(spec).__name__}")
    unknown = set(spec) - {"reply", "script", "args", "confidence", "latency_s"}
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
    if ("reply" in spec) == ("script" in spec):
        raise ValueError(f"{where}: give exactly one of 'reply' and 'script'")
    if "script" in spec:
        factory = SCRIPTS.get(spec["script"])
        if factory is None:
            raise ValueError(f"{where}.script: unknown script {spec['script']!r}; known: {sorted(SCRIPTS)}")
        args = spec.get("args") or {}
        if not isinstance(args, Mapping):
            raise ValueError(f"{where}.args: expected a mapping, got {type(args).__name__}")
        try:
            reply: str | Script = factory(**args)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}.args: {exc}") from exc
    elif isinstance(spec["reply"], str):
        reply = spec["reply"]
    else:
        raise ValueError(f"{where}.reply: expected a string, got {type(spec['reply']).__name__}")
    try:
        return Member(reply, spec.get("confidence", 1.0), spec.get("latency_s"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from exc


def load_members(path: str | Path) -> dict[str, Member]:
    """Read members from a YAML or JSON file: a mapping (optionally under `members:`) of name -> config; or,
    for scripts written in Python (tool-calling agents), ``path/to/file.py:NAME`` naming a mapping of
    name -> `Member`, reply or script in that file.

    Example file:
        members:
          paris: "The capital of France is Paris."
          solver: {script: arithmetic_solver, args: {accuracy: 0.7, seed: 3}, confidence: 0.6}
          slow: {reply: "ok", latency_s: 0.5}
    """
    where, sep, name = str(path).rpartition(":")
    if sep and where.endswith(".py"):
        return _python_members(Path(where), name)
    path = Path(path)
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml  # lazy: only the CLI and member files need it

        data = yaml.safe_load(text)
    if isinstance(data, Mapping) and set(data) == {"members"}:
        data = data["members"]
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping of model names to replies, got {type(data).__name__}")
    return {str(name): member_from_config(spec, f"{path}: {name}") for name, spec in data.items()}


def _python_members(path: Path, name: str) -> dict[str, Member]:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"colab_graphs_members_{path.stem}", path)
    if not path.is_file() or spec is None or spec.loader is None:
        raise ValueError(f"{path}: no such Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    members = getattr(module, name, None)
    if not isinstance(members, Mapping):
        raise ValueError(f"{path}: {name!r} is not a mapping of member names to scripts")
    return {
        str(n): m if isinstance(m, Member) else Member(m)  # type: ignore[arg-type]
        for n, m in members.items()
    }
