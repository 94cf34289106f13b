"""The records of a log: one JSON object per line of `log.jsonl`, told apart by `type`.

A log is written as it goes (appended record by record, so a running audit can be read) and read back into
these models. What each record holds is documented in docs/log.md; the rules that keep old and new readers
working together are its version policy:

- every record type and field may gain siblings without a version change: readers ignore record types they do
  not know and keep fields they do not know (`extra="allow"`);
- a change that an older reader would misread (a field renamed, removed or given a new meaning, a new encoding
  of call references) raises `LOG_VERSION`; a reader refuses a log newer than its own version, naming both.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from colab_graphs.trace import Call, Trace

LOG_VERSION = 1
LOG_FILE = "log.jsonl"
Kind = Literal["run", "audit", "study", "train"]


class LogError(ValueError):
    """A log cannot be read: the message names the file (and line) and what is wrong."""


class LogVersionError(LogError):
    """A log of a version this colab-graphs does not read (or, for resuming, does not continue)."""


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("colab-graphs")
    except PackageNotFoundError:
        return "0+unknown"


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")


class Header(_Record):
    """The first record: what produced the log.

    `settings` (studies) lists each setting with its folder, relative to the study folder. `fingerprint` is what
    a resumed run or audit must match (protocol, pool, data, scorer); `started_at` is when it first started
    (seconds since the epoch), kept across resumes.
    """

    type: Literal["header"] = "header"
    log_version: int = LOG_VERSION
    kind: Kind
    package_version: str = Field(default_factory=package_version)
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    protocol: str | None = None
    protocol_params: dict[str, Any] = Field(default_factory=dict)
    members: list[str] = Field(default_factory=list)
    pool: dict[str, dict[str, Any]] = Field(default_factory=dict)
    spec: dict[str, Any] | None = None
    dataset: str | None = None
    scorer: str | None = None
    fingerprint: str | None = None
    started_at: float | None = None
    settings: list[dict[str, Any]] = Field(default_factory=list)


class ExampleRecord(_Record):
    """One example of the dataset, every field kept (`input`, `answer` or `test`, pass-through fields)."""

    type: Literal["example"] = "example"
    id: str
    input: str = ""


class PlanRecord(_Record):
    """What an audit will play: these coalitions (and these members alone) on every example. The last one
    written counts."""

    type: Literal["plan"] = "plan"
    coalitions: list[list[str]]
    solo: list[str] = Field(default_factory=list)
    n_examples: int = 0


class CallRecord(Call):
    """One distinct model call, stored once per log and referred to by its number `n`: the trace's `Call`.

    `key` is the call cache's key (the canonical request); `seat` is the seat that first made the call. A call
    that failed after retries has `error`; if a later attempt at the same request succeeds (a resumed audit),
    the success is stored as a new record and referred to from then on. On disk (`call_fields`) its tokens are
    `prompt_tokens` and `completion_tokens` and empty and default values are left out; whether a play got it
    from the cache is the play's to say (its `CallRef`); its node, token ids, logprobs and finish reason are
    not kept.
    """

    model_config = ConfigDict(extra="allow")

    type: Literal["call"] = "call"
    n: int
    model: str = ""
    messages: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _from_line(cls, data: Any) -> Any:
        if isinstance(data, dict) and "usage" not in data:
            data = dict(data)
            data["usage"] = {k: data.pop(k) for k in ("prompt_tokens", "completion_tokens") if k in data}
        return data

    def fields(self) -> dict[str, Any]:
        """The record as the log writes it, fields a later version wrote kept."""
        return {**call_fields(self.n, self), **(self.model_extra or {})}


_LOGGED = ("model", "seat", "messages", "settings", "sample", "completion", "tool_calls")


def call_fields(n: int, call: Call) -> dict[str, Any]:
    """`call` as the log's record number `n` (see `CallRecord`): empty and default values left out (the reader
    fills them in), a known zero cost kept (an unknown one is None)."""
    record: dict[str, Any] = {"type": "call", "n": n, "key": call.key, "member": call.member}
    optional: dict[str, Any] = {name: getattr(call, name) for name in _LOGGED}
    optional.update(
        prompt_tokens=call.usage.prompt_tokens,
        completion_tokens=call.usage.completion_tokens,
        cost_usd=call.cost_usd,
        latency_s=round(call.latency_s, 4),
        attempts=call.attempts,
        error=call.error,
        error_type=call.error_type,
    )
    for k, v in optional.items():
        if v or (k == "cost_usd" and v is not None):
            record[k] = v
    return record


class CallRef(BaseModel):
    """A play's use of a call: `[n, cached]`, or `[n, cached, seat]` when the seat is not the record's.

    `cached` is 1 when the play got the reply without a model call of its own (the cache, or another
    coalition's identical request)."""

    n: int
    cached: bool = False
    seat: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, data: Any) -> Any:
        if isinstance(data, list | tuple):
            return dict(zip(("n", "cached", "seat"), data, strict=False))
        return data

    @model_serializer
    def _to_list(self) -> list[Any]:
        ref: list[Any] = [self.n, int(self.cached)]
        return [*ref, self.seat] if self.seat is not None else ref

    def call(self, calls: Mapping[int, CallRecord]) -> CallRecord:
        """The call as the play used it: its record, at the play's seat, served again when `cached` (latency
        and attempts 0, as the cache serves it).

        Raises:
            KeyError: the log holds no record `n` (a line lost to a kill).
        """
        record = calls[self.n]
        seat = self.seat if self.seat is not None else record.seat
        if self.cached:
            return record.served_again(seat=seat)
        return record if seat == record.seat else record.model_copy(update={"seat": seat})


class PlayRecord(_Record):
    """One evaluation of one coalition (or a member alone, or a run's system) on one example: a play (a
    `Trace`) as a line of the log, its calls by reference.

    `game` is "coalition" or "solo" (audits) or "run"; `answer` is the answer the task extracted from the
    system's output, `output` the output itself (runs only: an audit keeps the calls, which hold it, rather than
    one copy per coalition). `calls` are in the order the play made them.
    """

    type: Literal["play"] = "play"
    game: str
    members: list[str]
    example: str
    score: float | None = None
    answer: str | None = None
    output: str | None = None
    failed: bool = False
    error: str | None = None
    calls: list[CallRef] = Field(default_factory=list)

    def play(self, calls: Mapping[int, CallRecord], protocol: str = "") -> Trace:
        """The play itself, its calls resolved to the log's records; fields this version does not know are kept.

        Raises:
            KeyError: the play refers to a call the log does not hold (a line lost to a kill).
        """
        return Trace.model_construct(
            example_id=self.example,
            protocol=protocol,
            game=self.game,
            coalition=self.members,
            calls=[ref.call(calls) for ref in self.calls],
            output=self.output,
            answer=self.answer,
            score=self.score,
            failed=self.failed,
            error=self.error,
            state={},
            **(self.model_extra or {}),
        )


class StepRecord(_Record):
    """One logged training step (a line of the trainer's `metrics.jsonl`, every metric kept)."""

    type: Literal["step"] = "step"
    step: int


class EvaluationRecord(_Record):
    """A held-out evaluation of a training run (`eval_before.json` / `eval_after.json`): `system`,
    `without_policy`, `loo`, `policy_solo`, `n`."""

    type: Literal["evaluation"] = "evaluation"
    name: str


class RolloutTurn(BaseModel):
    """One call of a training rollout (a view of its `Call`); policy turns carry the credit (advantage) they
    were trained with."""

    model_config = ConfigDict(extra="allow")

    seat: str | None = None
    member: str
    messages: list[dict[str, Any]] | None = None
    completion: str | None = None
    cached: bool = False
    policy: bool = False
    credit: float | None = None
    error: str | None = None


class RolloutRecord(_Record):
    """A sample rollout of a training step: the system's conversation with the policy seated, its reward, and
    each policy turn's credit (`credit` None: an SFT run, which weighs the turns it keeps alike)."""

    type: Literal["rollout"] = "rollout"
    step: int
    example: str
    input: str | None = None
    reward: float | None = None
    policy_score: float | None = None
    turns: list[RolloutTurn] = Field(default_factory=list)

    @classmethod
    def from_trace(
        cls,
        step: int,
        example: Any,
        trace: Trace,
        reward: float | None,
        policy_members: Collection[str],
        credit: Sequence[float] | None = None,
        policy_score: float | None = None,
    ) -> RolloutRecord:
        """A rollout from its trace: `credit[i]` is the advantage of the i-th policy turn (the policy's i-th
        successful call, as the trainer cuts its segments); `example` has `id` and `input`."""
        turns, i = [], 0
        for call in trace.calls:
            turn = RolloutTurn.model_validate(call, from_attributes=True)
            turn.policy = call.member in policy_members and call.error is None
            if turn.policy and credit is not None and i < len(credit):
                turn.credit = float(credit[i])
            turns.append(turn)
            i += turn.policy
        return cls(
            step=step,
            example=example.id,
            input=example.input,
            reward=reward,
            policy_score=policy_score,
            turns=turns,
        )


RECORD_TYPES: dict[str, type[BaseModel]] = {
    "header": Header,
    "example": ExampleRecord,
    "plan": PlanRecord,
    "call": CallRecord,
    "play": PlayRecord,
    "step": StepRecord,
    "evaluation": EvaluationRecord,
    "rollout": RolloutRecord,
}


def load_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None  # absent, or being replaced at this moment: the next read sees it
    return data if isinstance(data, dict) else None


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if isinstance(data, dict):
            out.append(data)
    return out
