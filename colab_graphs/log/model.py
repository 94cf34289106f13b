"""The typed log of one output folder (`Log`) and a play's calls as it saw them (`Turn`: their records)."""

from __future__ import annotations

from typing import Any, cast

from pydantic import BaseModel, Field

from colab_graphs.log.records import (
    LOG_VERSION,
    CallRecord,
    EvaluationRecord,
    ExampleRecord,
    Header,
    PlanRecord,
    RolloutRecord,
    StepRecord,
)
from colab_graphs.trace import Trace

Turn = CallRecord
"""One call of a play as the play saw it: the call's record at the play's seat, `cached` (latency 0) where the
play got the reply without a model call of its own (see `CallRef.call`)."""


class Log(BaseModel):
    """One output folder, typed. `summary` is its contract file (report.json, study.json or summary.json) once
    written: `None` while the run, audit or study is still going. `log_version` is the version of the files read
    (0: a folder written before the log). `plays` are the log's plays (`Trace`s: `game`, `coalition`,
    `example_id`, score, answer), each call resolved to its record as the play saw it."""

    path: str
    log_version: int
    header: Header
    examples: list[ExampleRecord] = Field(default_factory=list)
    plan: PlanRecord | None = None
    calls: dict[int, CallRecord] = Field(default_factory=dict)
    plays: list[Trace] = Field(default_factory=list)
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

    def turns(self, play: Trace) -> list[Turn]:
        """The play's calls in order, each its record as the play saw it (see `CallRef.call`): the plays of a
        log hold their calls' records, as `read_log` resolves them."""
        return cast(list[Turn], list(play.calls))

    def play(self, example: str, members: list[str] | set[str], game: str | None = None) -> Trace | None:
        """The play of this coalition (any member order) on this example; `game` "coalition", "solo" or "run"."""
        wanted = set(members)
        return next(
            (
                p
                for p in self.plays
                if p.example_id == example and set(p.coalition) == wanted and (game is None or p.game == game)
            ),
            None,
        )
