"""Traces: every model call an example's run made, and what the system answered.

A trace is one play, whatever played it: a run writes it to `traces.jsonl`, a game (an audit, a study) keeps
it as its play and the log records it with its calls by reference, `colab_graphs.accounting` counts calls and
cost over traces, and the C-RL trainer replays it to give credit to the policy's own turns (the exact token
ids it wrote are kept on its calls). Secrets never reach a trace: the call path records generation settings
only, and every line written passes through `colab_graphs.redaction`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from colab_graphs.redaction import hide_secrets


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Reply(BaseModel):
    """What a model answered: the part of a call the call cache stores, and serves for an identical request.

    A call that failed has no reply (`completion` None, no tokens). In the cache (`cache_entry`) the completion
    is `text`, the key every colab-graphs version reads.
    """

    completion: str | None = None
    # The reply's tool calls in OpenAI format (`id`, `type`, `function.name`, `function.arguments`), if any.
    tool_calls: list[dict[str, Any]] | None = None
    # Why generation ended ("stop", "length", "tool_calls", ...) where the provider said; None where unknown.
    finish_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float | None = None
    # Exact tokens for in-process local models (the trainer's policy turns); None for API models.
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None

    @property
    def text(self) -> str:
        """The completion as text ("" when the model answered only with tool calls, or the call failed)."""
        return self.completion or ""

    @property
    def prompt_tokens(self) -> int:
        return self.usage.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return self.usage.completion_tokens

    def cache_entry(self) -> dict[str, Any]:
        """The reply as the call cache stores it (`tool_calls` and `finish_reason` only when there are any)."""
        return {
            "text": self.text,
            "usage": self.usage.model_dump(),
            "cost_usd": self.cost_usd,
            "prompt_token_ids": self.prompt_token_ids,
            "completion_token_ids": self.completion_token_ids,
            "logprobs": self.logprobs,
            **({"tool_calls": self.tool_calls} if self.tool_calls else {}),
            **({"finish_reason": self.finish_reason} if self.finish_reason else {}),
        }

    @classmethod
    def from_cache_entry(cls, entry: Mapping[str, Any]) -> Reply:
        """A cache entry (`cache_entry`) read back. Raises `KeyError` (no `text`) or pydantic's
        `ValidationError` for an entry that is not a reply."""
        return cls.model_validate({**entry, "completion": entry["text"]})


REPLY_FIELDS = tuple(Reply.model_fields)


class Call(Reply):
    """One model call as the system made it or was served it: the request, its reply, and how it was served.

    The client makes this one record per use of a call and appends that same object to the trace; the log
    writes it once per distinct request (`colab_graphs.log.CallRecord` is this model with its number in the
    log), the viewer shows it and `colab_graphs.accounting` counts it. `cached` is True when this use got its
    reply without a call upstream of its own (the call cache, another coalition's identical request, a
    replayed trace; an identical call in flight keeps the owner's `attempts`): its latency is then 0 and it
    cost nothing (`cost_usd` is what the reply cost when it was made). A call that failed after retries has
    `error` and `error_type` and no reply.
    """

    node: str | None = None
    seat: str | None = None
    member: str
    model: str
    messages: list[dict[str, Any]]
    settings: dict[str, Any] = Field(default_factory=dict)
    sample: int = 0
    key: str
    latency_s: float = 0.0
    cached: bool = False
    attempts: int = 0
    error: str | None = None
    error_type: str | None = None

    def answered(self, reply: Reply, **served: Any) -> Self:
        """This request answered by `reply` (a cache entry, or another call's reply: a `Call` is one), served as
        `served` says (`latency_s`, `attempts`, `cached`): a copy; the request's fields are this call's."""
        return self.model_copy(update={**{f: getattr(reply, f) for f in REPLY_FIELDS}, **served})

    def served_again(self, **update: Any) -> Self:
        """This call's reply given to another use of it without a call of its own (a replay, a memo hit)."""
        return self.model_copy(update={"cached": True, "latency_s": 0.0, "attempts": 0, **update})


class Trace(BaseModel):
    """One play: one example run through one graph, with every call it made (or was served) in order.

    `game` says what the play was for: "run" (a run's example), or in an audit's coalition game "coalition"
    (the protocol restricted to `coalition`) or "solo" (the member alone, its individual strength).
    `coalition` is who played, in the protocol's order; `answer` is what the task extracted from `output`, and
    `score` its score. A failed play (a call failed after retries, or a deadline passed) has `error` and no
    score. `sandbox` (code scores only) names the backend and isolation the code ran under
    (`colab_graphs.sandbox.scope`); a trace line has it only then. Fields a later version adds (to a trace
    line, or a log's play record) are kept; so are an app play's own: `absent` (each absent member a call
    asked for: member, node, rule, answered_by, calls) and `ended_by_absent` (the member and node whose
    uncaught `MemberAbsent` ended the play; see `colab_graphs.audit.app`).
    """

    model_config = ConfigDict(extra="allow")

    example_id: str
    protocol: str
    game: str = "run"
    coalition: list[str] = Field(default_factory=list)
    calls: list[Call] = Field(default_factory=list)
    output: str | None = None
    answer: str | None = None
    score: float | None = None
    failed: bool = False
    error: str | None = None
    state: dict[str, Any] = Field(default_factory=dict)
    sandbox: dict[str, Any] | None = None

    @property
    def cost_usd(self) -> float | None:
        costs = [c.cost_usd for c in self.calls if not c.cached]
        known = [c for c in costs if c is not None]
        return sum(known) if len(known) == len(costs) else None

    @property
    def tokens(self) -> int:
        return sum(c.usage.total_tokens for c in self.calls if not c.cached)


Play = Trace
"""A game's word for a trace: one evaluation of one coalition (or one member alone) on one example."""


def trace_line(trace: Trace) -> str:
    """One trace as its JSONL line, secrets redacted (an error body that echoed a key, say)."""
    exclude = {"sandbox"} if trace.sandbox is None else None  # (a line without code scores is as it was)
    return hide_secrets(trace.model_dump_json(exclude_none=False, exclude=exclude)) + "\n"


def write_traces(path: str | os.PathLike[str], traces: Iterable[Trace], append: bool = True) -> None:
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        for trace in traces:
            fh.write(trace_line(trace))


def read_traces(path: str | os.PathLike[str]) -> Iterator[Trace]:
    path = Path(path)
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield Trace.model_validate(json.loads(line))
            except (json.JSONDecodeError, ValueError) as exc:
                # A run killed mid-write leaves a torn last line; anything else is corruption worth naming.
                raise ValueError(f"{path}:{lineno}: not a valid trace record: {exc}") from None
