"""Folders written before the log (log version 0), read as logs.

- An audit kept `game.json` (fingerprint, protocol, start time) and `game.jsonl`, one play per line with each
  call as `[key, member, cached, failed, prompt_tokens, completion_tokens, cost_usd]`: no prompt or reply was
  kept, so its call records have none.
- A run kept `run.json`, `traces.jsonl` (every call in full) and `results.jsonl`.
- A study kept `study.json`, whose settings name their audit folders.

They are read for viewing only: an audit or run resumed into such a folder is refused with the version named
(see `colab_graphs.audit.game`), since its plays cannot be shown with their conversations.
"""

from __future__ import annotations

import json
from pathlib import Path

from colab_graphs.log.model import Log
from colab_graphs.log.records import (
    CallRecord,
    CallRef,
    ExampleRecord,
    Header,
    PlayRecord,
    load_json,
    load_jsonl,
)
from colab_graphs.trace import Trace

_CALL_FIELDS = {
    "key",
    "member",
    "model",
    "seat",
    "messages",
    "settings",
    "sample",
    "completion",
    "cost_usd",
    "latency_s",
    "attempts",
    "error",
    "error_type",
}


def read_legacy(folder: Path, kind: str) -> Log:
    reader = {"audit": _audit, "run": _run, "study": _study}[kind]
    return reader(folder)


def _audit(folder: Path) -> Log:
    manifest = load_json(folder / "game.json") or {}
    report = load_json(folder / "report.json") or {}
    header = Header(
        log_version=0,
        kind="audit",
        protocol=report.get("protocol") or manifest.get("protocol"),
        protocol_params=report.get("protocol_params") or {},
        members=report.get("players") or [],
        dataset=report.get("dataset"),
        scorer=report.get("scorer"),
        fingerprint=manifest.get("fingerprint"),
        started_at=manifest.get("started_at"),
    )
    calls: dict[str, CallRecord] = {}
    plays: dict[tuple, PlayRecord] = {}
    for line in load_jsonl(folder / "game.jsonl"):
        refs = []
        for key, member, cached, failed, prompt, completion, cost in line.get("calls", []):
            if key not in calls:
                calls[key] = CallRecord(
                    n=len(calls),
                    key=key,
                    member=member,
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    cost_usd=cost,
                    error="failed" if failed else None,
                )
            refs.append(CallRef(n=calls[key].n, cached=bool(cached)))
        play = PlayRecord(
            game=line["game"],
            members=line["members"],
            example=line["example_id"],
            score=line.get("score"),
            failed=bool(line.get("failed")),
            error=line.get("error"),
            calls=refs,
        )
        plays[(play.game, tuple(play.members), play.example)] = play
    examples = list(dict.fromkeys(p.example for p in plays.values()))
    return Log(
        path=str(folder),
        log_version=0,
        header=header,
        examples=[ExampleRecord(id=i) for i in examples],
        calls={c.n: c for c in calls.values()},
        plays=list(plays.values()),
    )


def _run(folder: Path) -> Log:
    manifest = load_json(folder / "run.json") or {}
    summary = load_json(folder / "summary.json") or {}
    results = {r.get("id"): r for r in load_jsonl(folder / "results.jsonl")}
    calls: dict[str, CallRecord] = {}
    plays = []
    members = summary.get("members") or []
    for line in load_jsonl(folder / "traces.jsonl"):
        try:
            trace = Trace.model_validate(line)
        except ValueError:
            continue
        members = members or trace.coalition
        refs = []
        for c in trace.calls:
            if c.key not in calls:
                data = c.model_dump(include=_CALL_FIELDS)
                calls[c.key] = CallRecord(
                    n=len(calls),
                    prompt_tokens=c.usage.prompt_tokens,
                    completion_tokens=c.usage.completion_tokens,
                    **data,
                )
            refs.append(CallRef(n=calls[c.key].n, cached=c.cached, seat=c.seat))
        result = results.get(trace.example_id, {})
        plays.append(
            PlayRecord(
                game="run",
                members=trace.coalition,
                example=trace.example_id,
                score=trace.score,
                answer=trace.answer,
                output=trace.output if trace.output is not None else result.get("output"),
                failed=trace.failed,
                error=trace.error,
                calls=refs,
            )
        )
    header = Header(
        log_version=0,
        kind="run",
        protocol=summary.get("protocol") or manifest.get("protocol"),
        protocol_params=summary.get("params") or {},
        members=members,
        fingerprint=manifest.get("fingerprint"),
    )
    return Log(
        path=str(folder),
        log_version=0,
        header=header,
        examples=[ExampleRecord(id=p.example) for p in plays],
        calls={c.n: c for c in calls.values()},
        plays=plays,
    )


def _study(folder: Path) -> Log:
    study = json.loads((folder / "study.json").read_text(encoding="utf-8"))
    settings = [
        {
            "key": f"{s['pool']}/{s['protocol']}/{s['dataset']}",
            "pool": s["pool"],
            "protocol": s["protocol"],
            "family": s.get("family"),
            "dataset": s["dataset"],
            "folder": s["audit"],
            "kind": "audit",
        }
        for s in study.get("settings", [])
    ]
    header = Header(log_version=0, kind="study", settings=settings, method=study.get("method"))
    return Log(path=str(folder), log_version=0, header=header, summary=study)
