"""Traces: every model call an example's run made, and what the system answered.

A trace is what the audit reads to count calls and cost, and what the C-RL trainer replays to give credit to
the policy's own turns (the exact token ids it wrote are kept on its calls). API keys never reach a trace: the
call path records generation settings only.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

_SECRET_PATTERNS = [
    re.compile(r"sk-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"AKIA[0-9A-Z]{16}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._\-]{8,}"),
]


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Remove known secret values and key-shaped strings from free text (error messages, mostly)."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "[REDACTED]")
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + "[REDACTED]", text)
    return text


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


class CallTally:
    """Counts calls as made, served from cache, or failed: the one accounting runs, audits and studies share.

    A call is *made* when it went upstream (not served from the cache, a single flight or a replay); a cached
    call whose key is in `made_since_start` (the cache's write times say this job made it before a kill and
    resume, and no recorded call made it) counts as made once. Tokens and cost are those of the calls made.

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
            return "cached"
        if resumed:
            self._resumed.add(call.key)
        self.made += 1
        self.prompt_tokens += call.usage.prompt_tokens
        self.completion_tokens += call.usage.completion_tokens
        self.cost_usd = (
            None if call.cost_usd is None or self.cost_usd is None else self.cost_usd + call.cost_usd
        )
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
        if any(c is None for c in costs):
            return None
        return sum(costs)  # type: ignore[arg-type]

    @property
    def tokens(self) -> int:
        return sum(c.usage.total_tokens for c in self.calls if not c.cached)


def write_traces(path: str | os.PathLike[str], traces: Iterable[Trace], append: bool = True) -> None:
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        for trace in traces:
            fh.write(trace.model_dump_json(exclude_none=False) + "\n")


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
