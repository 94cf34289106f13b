"""The typed log of one output folder (`Log`) and a play's calls as it saw them (`Turn`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from colab_graphs.log.records import (
    LOG_VERSION,
    CallRecord,
    EvaluationRecord,
    ExampleRecord,
    Header,
    PlanRecord,
    PlayRecord,
    RolloutRecord,
    StepRecord,
)


class Turn(BaseModel):
    """One call of a play as the play saw it: who (seat, member), what it was sent and what it replied, its
    tokens and cost, whether it was served without a model call of its own (`cached`: latency 0), and any error."""

    n: int
    key: str
    seat: str | None
    member: str
    model: str = ""
    messages: list[dict[str, Any]] | None = None
    completion: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    latency_s: float = 0.0
    cached: bool = False
    error: str | None = None


class Log(BaseModel):
    """One output folder, typed. `summary` is its contract file (report.json, study.json or summary.json) once
    written: `None` while the run, audit or study is still going. `log_version` is the version of the files read
    (0: a folder written before the log)."""

    path: str
    log_version: int
    header: Header
    examples: list[ExampleRecord] = Field(default_factory=list)
    plan: PlanRecord | None = None
    calls: dict[int, CallRecord] = Field(default_factory=dict)
    plays: list[PlayRecord] = Field(default_factory=list)
    steps: list[StepRecord] = Field(default_factory=list)
    evaluations: dict[str, EvaluationRecord] = Field(default_factory=dict)
    rollouts: list[RolloutRecord] = Field(default_factory=list)
    summary: dict[str, Any] | None = None
    torn: bool = Field(False, description="the last line was cut short (being written, or a kill)")

    @property
    def kind(self) -> str:
        return self.header.kind

    @property
    def complete(self) -> bool:
        return self.summary is not None

    @staticmethod
    def current_version() -> int:
        return LOG_VERSION

    def turns(self, play: PlayRecord) -> list[Turn]:
        """The play's calls in order, each resolved to its record."""
        out = []
        for ref in play.calls:
            c = self.calls[ref.n]
            out.append(
                Turn(
                    n=c.n,
                    key=c.key,
                    seat=ref.seat if ref.seat is not None else c.seat,
                    member=c.member,
                    model=c.model,
                    messages=c.messages,
                    completion=c.completion,
                    tool_calls=c.tool_calls,
                    prompt_tokens=c.prompt_tokens,
                    completion_tokens=c.completion_tokens,
                    cost_usd=c.cost_usd,
                    latency_s=0.0 if ref.cached else c.latency_s,
                    cached=ref.cached,
                    error=c.error,
                )
            )
        return out

    def play(self, example: str, members: list[str] | set[str], game: str | None = None) -> PlayRecord | None:
        """The play of this coalition (any member order) on this example; `game` "coalition", "solo" or "run"."""
        wanted = set(members)
        return next(
            (
                p
                for p in self.plays
                if p.example == example and set(p.members) == wanted and (game is None or p.game == game)
            ),
            None,
        )
