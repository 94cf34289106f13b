"""Two runs, or two audits, side by side: what `colab-graphs compare A B` prints and the viewer's compare page
shows.

Each side is read from its output folder's log (`colab_graphs.log.read_log`) and contract file (summary.json,
report.json): its protocol, data, score, calls and cost; for audits each member's individual strength, LOO and
Shapley value (and its calls and cost); and, per example, the system's score and prediction (a run's play, an
audit's play of the full team). An example *changed* when the two scores differ (by more than
`colab_graphs.audit.estimators.TIE_TOL`, or one side failed where the other scored). Only examples both sides
played are compared; the others are counted. A run and an audit (or a study, a training run) measure different
things: comparing them is refused (`CompareError`), as is a folder that holds neither.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from colab_graphs.accounting import account
from colab_graphs.audit.estimators import TIE_TOL
from colab_graphs.log import Log, find_kind, read_log
from colab_graphs.trace import Trace

COMPARABLE = ("run", "audit")
MEASURES = ("individual", "loo", "shapley")


class CompareError(ValueError):
    """The two folders cannot be compared (kinds differ, or one is not a run or an audit)."""


class Side(BaseModel):
    """One folder's headline: what it ran and what it found."""

    path: str
    kind: str
    protocol: str | None = None
    members: list[str] = Field(default_factory=list)
    dataset: str | None = None
    scorer: str | None = None
    complete: bool = True
    score: float | None = Field(None, description="a run's score, an audit's v(all members)")
    n_examples: int = 0
    failed: int = 0
    calls: dict[str, int] = Field(default_factory=dict)
    cost_usd: float | None = None


class MemberRow(BaseModel):
    """A member's values on both sides (None where a side lacks the member or the measure) and B - A."""

    member: str
    a: dict[str, int | float | None]  # (int first: a count of calls stays a count)
    b: dict[str, int | float | None]
    delta: dict[str, int | float | None]


class ExampleChange(BaseModel):
    """An example whose score differs: the system's score and prediction on each side."""

    id: str
    input: str | None = None
    gold: str | None = None
    a: dict[str, Any]
    b: dict[str, Any]


class Comparison(BaseModel):
    """A compared with B (see the module docstring)."""

    kind: str
    a: Side
    b: Side
    score_delta: float | None = None
    members: list[MemberRow] = Field(default_factory=list)
    shared_examples: int = 0
    only_in_a: list[str] = Field(default_factory=list)
    only_in_b: list[str] = Field(default_factory=list)
    changed: list[ExampleChange] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="what differs between the two set-ups")


def compare_folders(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> Comparison:
    """Compare the runs or audits in folders `a` and `b`.

    Raises:
        CompareError: a folder holds no run or audit, or one holds a run and the other an audit.
    """
    return compare_logs(_read(Path(a)), _read(Path(b)), str(a), str(b))


def _read(folder: Path) -> Log:
    if not folder.is_dir():
        raise CompareError(f"{folder}: no such folder")
    kind = find_kind(folder)
    if kind not in COMPARABLE:
        what = f"a {kind}" if kind else "no run or audit (no log.jsonl)"
        raise CompareError(f"{folder} holds {what}; compare compares two runs or two audits")
    return read_log(folder)


def compare_logs(a: Log, b: Log, a_name: str = "A", b_name: str = "B") -> Comparison:
    """`compare_folders` over logs already read."""
    for log, name in ((a, a_name), (b, b_name)):
        if log.kind not in COMPARABLE:
            raise CompareError(f"{name} holds a {log.kind}; compare compares two runs or two audits")
    if a.kind != b.kind:
        raise CompareError(
            f"{a_name} holds a {a.kind} and {b_name} a {b.kind}: they measure different things; compare two "
            "runs (scores, calls, cost, examples) or two audits (members' values as well)"
        )
    side_a, side_b = _side(a, a_name), _side(b, b_name)
    plays_a, plays_b = _system_plays(a), _system_plays(b)
    shared = [e for e in plays_a if e in plays_b]
    examples = {e.id: e for e in [*b.examples, *a.examples]}
    changed = []
    for example_id in shared:
        pa, pb = plays_a[example_id], plays_b[example_id]
        if _differ(_score(pa), _score(pb)):
            record = examples.get(example_id)
            changed.append(
                ExampleChange(
                    id=example_id,
                    input=record.input if record is not None else None,
                    gold=getattr(record, "answer", None) if record is not None else None,
                    a=_outcome(pa),
                    b=_outcome(pb),
                )
            )
    return Comparison(
        kind=a.kind,
        a=side_a,
        b=side_b,
        score_delta=_delta(side_a.score, side_b.score),
        members=_member_rows(a, b) if a.kind == "audit" else [],
        shared_examples=len(shared),
        only_in_a=[e for e in plays_a if e not in plays_b],
        only_in_b=[e for e in plays_b if e not in plays_a],
        changed=changed,
        notes=_notes(side_a, side_b),
    )


def _side(log: Log, path: str) -> Side:
    summary = log.summary or {}
    members = list(log.header.members or summary.get("players", []))
    plays = list(_system_plays(log).values())
    if log.kind == "run" and summary:
        score = summary.get("score")
    else:  # an audit's v(all): the report's coalition value, else the mean of the plays so far
        score = next(
            (c["value"] for c in summary.get("coalitions", []) if set(c["members"]) == set(members)), None
        )
        if score is None:
            scores = [s for s in map(_score, plays) if s is not None]
            score = sum(scores) / len(scores) if scores else None
    calls = summary.get("calls")
    cost = summary.get("cost_usd")
    if calls is None:  # still going: what its plays so far made
        acct = account(log.plays)
        calls, cost = {"made": acct.made, "cached": acct.cached, "failed": acct.failed}, acct.cost_usd
    return Side(
        path=path,
        kind=log.kind,
        protocol=log.header.protocol,
        members=members,
        dataset=log.header.dataset,
        scorer=log.header.scorer,
        complete=log.complete,
        score=score,
        n_examples=len(plays),
        failed=sum(p.failed for p in plays),
        calls={k: int(v) for k, v in calls.items() if isinstance(v, int)},
        cost_usd=cost,
    )


def _system_plays(log: Log) -> dict[str, Trace]:
    """Example id -> the system's play: a run's, or an audit's play of its full team (dataset order)."""
    team = set(log.header.members)
    wanted = "run" if log.kind == "run" else "coalition"
    plays = {
        p.example_id: p
        for p in log.plays
        if p.game == wanted and (wanted == "run" or set(p.coalition) == team)
    }
    order = [e.id for e in log.examples if e.id in plays]
    return {e: plays[e] for e in order + [e for e in plays if e not in set(order)]}


def _score(play: Trace) -> float | None:
    return None if play.failed else play.score


def _outcome(play: Trace) -> dict[str, Any]:
    return {"score": _score(play), "prediction": play.answer, "failed": play.failed}


def _differ(x: float | None, y: float | None) -> bool:
    if x is None or y is None:
        return (x is None) != (y is None)
    return abs(x - y) > TIE_TOL


def _delta(x: float | None, y: float | None) -> float | None:
    return None if x is None or y is None else y - x


def _member_values(log: Log) -> dict[str, dict[str, float | None]]:
    report = log.summary or {}
    usage = report.get("usage", {})
    out: dict[str, dict[str, float | None]] = {}
    for m in log.header.members or report.get("players", []):
        values: dict[str, float | None] = {k: (report.get(k) or {}).get(m) for k in MEASURES}
        # (A member absent from a report's usage made no call of its own: every one was served.)
        spent = usage.get(m) or ({"calls": 0, "cost_usd": 0.0} if report else {})
        values["calls"] = spent.get("calls")
        values["cost_usd"] = spent.get("cost_usd")
        out[m] = values
    return out


def _member_rows(a: Log, b: Log) -> list[MemberRow]:
    va, vb = _member_values(a), _member_values(b)
    empty: dict[str, float | None] = dict.fromkeys((*MEASURES, "calls", "cost_usd"))
    rows = []
    for m in [*va, *(m for m in vb if m not in va)]:
        x, y = va.get(m, empty), vb.get(m, empty)
        rows.append(MemberRow(member=m, a=x, b=y, delta={k: _delta(x[k], y[k]) for k in x}))
    return rows


def _notes(a: Side, b: Side) -> list[str]:
    notes = []
    for field, what in (("protocol", "protocols"), ("dataset", "data"), ("scorer", "scorers")):
        x, y = getattr(a, field), getattr(b, field)
        if x != y:
            notes.append(f"different {what}: {x or 'n/a'} vs {y or 'n/a'}")
    if a.members != b.members:
        notes.append(f"different members: {', '.join(a.members)} vs {', '.join(b.members)}")
    for side in (a, b):
        if not side.complete:
            notes.append(f"{side.path} is not finished: its values are over the plays so far")
    return notes
