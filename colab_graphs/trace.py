"""Traces: every model call an example's run made, and what the system answered.

A trace is what the audit reads to count calls and cost, and what the C-RL trainer replays to give credit to
the policy's own turns (the exact token ids it wrote are kept on its calls). Secrets never reach a trace: the
call path records generation settings only, and every line written passes through `colab_graphs.redaction`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from colab_graphs.redaction import hide_secrets


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Call(BaseModel):
    """One model call as the system made it (a cache hit is a call too, flagged `cached`)."""

    node: str | None = None
    seat: str | None = None
    member: str
    model: str
    messages: list[dict[str, Any]]
    settings: dict[str, Any] = Field(default_factory=dict)
    sample: int = 0
    key: str
    completion: str | None = None
    # The reply's tool calls in OpenAI format (`id`, `type`, `function.name`, `function.arguments`), if any.
    tool_calls: list[dict[str, Any]] | None = None
    usage: Usage = Field(default_factory=Usage)
    latency_s: float = 0.0
    cost_usd: float | None = None
    cached: bool = False
    attempts: int = 0
    error: str | None = None
    error_type: str | None = None
    # Exact tokens for in-process local models (the trainer's policy turns); None for API models.
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    # Why generation ended ("stop", "length", ...) where the provider said; None where unknown.
    finish_reason: str | None = None


def _add_cost(total: float | None, cost: float | None) -> float | None:
    """A sum of prices that is unknown (None) as soon as one price is."""
    return None if total is None or cost is None else total + cost


class CallTally:
    """Counts calls as made, served from cache, or failed: the one accounting runs, audits and studies share.

    A call is *made* when it went upstream (not served from the cache, a single flight or a replay); a cached
    call whose key is in `made_since_start` (the cache's write times say this job made it before a kill and
    resume, and no recorded call made it) counts as made once. Tokens and `cost_usd` are those of the calls
    made (0.0 when none was: nothing was spent); `saved_usd` is what the cached calls cost when they were made
    (what serving them saved). Either is None when a price it sums is unknown.

    Example:
        >>> tally = CallTally()
        >>> [tally.add(c) for c in (Call(member="a", model="m", messages=[], key="k"),
        ...                         Call(member="a", model="m", messages=[], key="k", cached=True))]
        ['made', 'cached']
        >>> tally.counts()
        {'made': 1, 'unique': 1, 'cached': 1, 'failed': 0}
    """

    def __init__(self, made_since_start: set[str] | frozenset[str] = frozenset()) -> None:
        self.made_since_start = made_since_start
        self.made = self.cached = self.failed = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.cost_usd: float | None = 0.0
        self.saved_usd: float | None = 0.0
        self.keys: set[str] = set()
        self._resumed: set[str] = set()

    def add(self, call: Call) -> str:
        """Count `call`; returns how it counted: "made", "cached" or "failed"."""
        self.keys.add(call.key)
        if call.error is not None:
            self.failed += 1
            return "failed"
        resumed = call.cached and call.key in self.made_since_start and call.key not in self._resumed
        if call.cached and not resumed:
            self.cached += 1
            self.saved_usd = _add_cost(self.saved_usd, call.cost_usd)
            return "cached"
        if resumed:
            self._resumed.add(call.key)
        self.made += 1
        self.prompt_tokens += call.usage.prompt_tokens
        self.completion_tokens += call.usage.completion_tokens
        self.cost_usd = _add_cost(self.cost_usd, call.cost_usd)
        return "made"

    def counts(self) -> dict[str, int]:
        """`{"made", "unique", "cached", "failed"}`; failed calls count as made (they were attempted)."""
        return {
            "made": self.made + self.failed,
            "unique": len(self.keys),
            "cached": self.cached,
            "failed": self.failed,
        }


class Trace(BaseModel):
    """One example run through one graph (one coalition)."""

    example_id: str
    protocol: str
    coalition: list[str] = Field(default_factory=list)
    calls: list[Call] = Field(default_factory=list)
    output: str | None = None
    answer: str | None = None
    score: float | None = None
    failed: bool = False
    error: str | None = None
    state: dict[str, Any] = Field(default_factory=dict)

    @property
    def cost_usd(self) -> float | None:
        costs = [c.cost_usd for c in self.calls if not c.cached]
        known = [c for c in costs if c is not None]
        return sum(known) if len(known) == len(costs) else None

    @property
    def tokens(self) -> int:
        return sum(c.usage.total_tokens for c in self.calls if not c.cached)


def trace_line(trace: Trace) -> str:
    """One trace as its JSONL line, secrets redacted (an error body that echoed a key, say)."""
    return hide_secrets(trace.model_dump_json(exclude_none=False)) + "\n"


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
