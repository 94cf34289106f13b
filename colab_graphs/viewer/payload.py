"""What the viewer's page asks for, as JSON-ready dicts built from a `Log`.

`folder_payload` describes one output folder (an audit, run, study or training run; a folder holding several is
listed); `example_payload` gives one example's plays with their conversations resolved. Numbers that a finished
producer wrote to its contract file (report.json, study.json, summary.json) are passed on unchanged, so the
page shows exactly those; while a run or audit is still going, values are computed from the plays logged so far
and marked partial.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from colab_graphs.accounting import account
from colab_graphs.compile import fusion_levels
from colab_graphs.log import LOG_FILE, Log, Turn, find_kind, read_log
from colab_graphs.spec import GraphSpec
from colab_graphs.trace import Trace

MAX_ROLLOUTS = 64  # the most recent sample rollouts a training page shows
INDEX_DEPTH = 4  # how deep a folder that holds several outputs is searched
Stamp = tuple[tuple[str, int, int], ...]  # (file name, mtime ns, size) of each of a folder's files


class ViewerError(Exception):
    """A request the viewer cannot answer; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class LogCache:
    """Logs read recently, read again only when one of their files changed (pages ask for a log repeatedly)."""

    FILES = (LOG_FILE, "report.json", "study.json", "summary.json", "metrics.jsonl", "rollouts.jsonl",
             "eval_before.json", "eval_after.json")  # fmt: skip

    def __init__(self, size: int = 8):
        self.size = size
        self._logs: dict[Path, tuple[Stamp, Log]] = {}
        self._lock = threading.Lock()

    def _stamp(self, folder: Path) -> Stamp:
        stamp = []
        for name in self.FILES:
            try:
                st = os.stat(folder / name)
            except FileNotFoundError:
                continue
            stamp.append((name, st.st_mtime_ns, st.st_size))
        return tuple(stamp)

    def get(self, folder: Path) -> Log:
        stamp = self._stamp(folder)
        with self._lock:
            hit = self._logs.get(folder)
            if hit is not None and hit[0] == stamp:
                return hit[1]
        log = read_log(folder)
        with self._lock:
            self._logs[folder] = (stamp, log)
            while len(self._logs) > self.size:
                self._logs.pop(next(iter(self._logs)))
        return log


def resolve(root: Path, rel: str) -> Path:
    """`rel` under the served folder; anything outside it is refused, and so is a folder whose output files are
    links that lead out of it (``log.jsonl -> /etc/passwd``): the viewer reads only what the folder holds."""
    folder = (root / rel).resolve()
    if not inside(root, folder):
        raise ViewerError(403, f"{rel!r} is outside the folder being viewed")
    if not folder.is_dir():
        raise ViewerError(404, f"no folder {rel!r} under {root}")
    for name in LogCache.FILES:
        path = folder / name
        if path.is_symlink() and not regular_file_inside(root, path):
            raise ViewerError(
                403, f"{rel or '.'}/{name} is a link that leads outside the folder being viewed"
            )
    return folder


def inside(root: Path, path: Path) -> bool:
    """Whether the resolved `path` is `root` or under it (`root` resolved)."""
    return path == root or root in path.parents


def regular_file_inside(root: Path, path: Path) -> bool:
    """Whether `path`, links followed, is a regular file under `root` (what the viewer may serve)."""
    real = path.resolve()
    return inside(root, real) and real.is_file()


def cid(members: list[str]) -> str:
    return ",".join(members)


def folder_payload(root: Path, rel: str, cache: LogCache) -> dict[str, Any]:
    folder = resolve(root, rel)
    kind = find_kind(folder)
    if kind is None:
        return index_payload(root, folder)
    log = cache.get(folder)
    build = {"audit": audit_payload, "run": run_payload, "study": study_payload, "train": train_payload}[kind]
    payload = build(log, root, folder)
    payload.update(kind=kind, path=rel, log_version=log.log_version, complete=log.complete)
    return payload


def index_payload(root: Path, folder: Path) -> dict[str, Any]:
    """A folder that holds outputs further down (e.g. `runs/`): each one, with its kind."""
    found = []
    for dirpath, dirnames, _ in os.walk(folder):
        here = Path(dirpath)
        depth = len(here.relative_to(folder).parts)
        dirnames.sort()
        kind = find_kind(here) if here != folder else None
        if kind is not None:
            found.append({"path": str(here.relative_to(root)), "kind": kind})
            dirnames.clear()  # an output's own sub-folders (a study's audits) are reached from it
        elif depth >= INDEX_DEPTH:
            dirnames.clear()
    rel = str(folder.relative_to(root)) if folder != root else ""
    return {"kind": "index", "path": rel, "outputs": found, "complete": True, "log_version": None}


def _header(log: Log) -> dict[str, Any]:
    return log.header.model_dump(mode="json", exclude={"pool", "spec", "settings"})


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _examples(log: Log) -> list[dict[str, Any]]:
    return [{"id": e.id, "input": e.input[:400], "answer": getattr(e, "answer", None)} for e in log.examples]


def _usage_from_calls(log: Log) -> dict[str, dict[str, Any]]:
    """Calls made per member (a report's `usage`, for an audit still going), from the accounting of the plays
    logged so far: a call a play got from the cache was not made by this audit and costs it nothing."""
    return {
        member: {
            "calls": share.calls,
            "tokens": {
                "prompt": share.prompt_tokens,
                "completion": share.completion_tokens,
                "total": share.prompt_tokens + share.completion_tokens,
            },
            "cost_usd": share.cost_usd,
        }
        for member, share in account(log.plays).per_member.items()
    }


def audit_payload(log: Log, root: Path, folder: Path) -> dict[str, Any]:
    report = log.summary
    members = list(log.header.members or (report or {}).get("players", []))
    scores: dict[str, dict[str, float | None]] = defaultdict(
        dict
    )  # coalition id ("solo:m" alone) -> example -> score
    failed = 0
    for play in log.plays:
        key = cid(play.coalition) if play.game == "coalition" else f"solo:{cid(play.coalition)}"
        scores[key][play.example_id] = None if play.failed else play.score
        failed += play.failed
    planned = None
    if log.plan is not None:
        planned = (len(log.plan.coalitions) + len(log.plan.solo)) * log.plan.n_examples
    if report is not None:
        coalitions = [{"members": c["members"], "value": c["value"]} for c in report["coalitions"]]
        individual, loo, shapley = report.get("individual", {}), report.get("loo", {}), report.get("shapley")
        usage = report.get("usage", {})
    else:  # still being played: means of the plays so far
        seen = {cid(c): c for c in (log.plan.coalitions if log.plan is not None else [])}
        for p in log.plays:
            if p.game == "coalition":
                seen.setdefault(cid(p.coalition), p.coalition)
        coalitions = []
        for members_ in seen.values():
            done = [s for s in scores.get(cid(members_), {}).values() if s is not None]
            if done:
                coalitions.append(
                    {"members": members_, "value": _mean(done), "partial": True, "n": len(done)}
                )
        individual = {}
        for m in members:
            done = [s for s in scores.get(f"solo:{m}", {}).values() if s is not None]
            if done:
                individual[m] = _mean(done)
        loo, shapley, usage = {}, None, _usage_from_calls(log)
    examples = _examples(log)
    for e in examples:
        e["scores"] = {k: v[e["id"]] for k, v in scores.items() if e["id"] in v}
    return {
        "header": _header(log),
        "members": members,
        "report": report,
        "coalitions": coalitions,
        "individual": individual,
        "loo": loo,
        "shapley": shapley,
        "usage": usage,
        "examples": examples,
        "progress": {"plays": len(log.plays), "planned": planned, "failed": failed},
        "images": sorted(p.name for p in folder.glob("*.png")),
    }


def run_payload(log: Log, root: Path, folder: Path) -> dict[str, Any]:
    examples = _examples(log)
    by_id = {p.example_id: p for p in log.plays}
    for e in examples:
        play = by_id.get(e["id"])
        if play is not None:
            e.update(score=play.score, system_answer=play.answer, failed=play.failed)
    if not examples:  # a run from before the log kept no examples: its plays name them
        examples = [
            {"id": p.example_id, "input": "", "score": p.score, "system_answer": p.answer, "failed": p.failed}
            for p in log.plays
        ]
    done = [p.score for p in log.plays if not p.failed and p.score is not None]
    return {
        "header": _header(log),
        "members": log.header.members,
        "summary": log.summary,
        "examples": examples,
        "progress": {"plays": len(log.plays), "planned": len(log.examples) or None,
                     "failed": sum(p.failed for p in log.plays), "score": _mean(done)},
    }  # fmt: skip


def study_payload(log: Log, root: Path, folder: Path) -> dict[str, Any]:
    study = log.summary
    settings = []
    rows = {s["audit"]: s for s in (study or {}).get("settings", [])}
    for s in log.header.settings:
        child = folder / s["folder"]
        status = _status(child)
        settings.append(
            {**s, "path": str(child.relative_to(root)), **status, "result": rows.get(s["folder"])}
        )
    return {"header": _header(log), "study": study, "settings": settings}


def _status(folder: Path) -> dict[str, Any]:
    """How far a study's setting is: its audit done, or plays logged so far."""
    if (folder / "report.json").is_file():
        return {"status": "done"}
    if not (folder / LOG_FILE).is_file():
        return {"status": "waiting"}
    try:
        log = read_log(folder, strict=False)
    except (ValueError, OSError):
        return {"status": "unreadable"}
    planned = (len(log.plan.coalitions) + len(log.plan.solo)) * log.plan.n_examples if log.plan else None
    return {"status": "playing", "plays": len(log.plays), "planned": planned}


def train_payload(log: Log, root: Path, folder: Path) -> dict[str, Any]:
    return {
        "header": _header(log),
        "summary": log.summary,
        "steps": [s.model_dump(mode="json") for s in log.steps],
        "evaluations": {name: e.model_dump(mode="json") for name, e in log.evaluations.items()},
        "rollouts": [r.model_dump(mode="json") for r in log.rollouts[-MAX_ROLLOUTS:]],
    }


def seat_order(log: Log) -> dict[str, int] | None:
    """Seat -> position in the protocol's logical order (level by level), for protocols whose seats run once;
    None for routed protocols (cascades, loops), whose calls are shown in the order they were made."""
    if not log.header.spec:
        return None
    try:
        levels = fusion_levels(GraphSpec.from_dict(log.header.spec))
    except (KeyError, TypeError, ValueError):
        return None
    if levels is None:
        return None
    return {name: i for i, name in enumerate(n for level in levels for n in level)}


# What the page shows of a call (the record holds more: settings, sample, attempts, ...).
_TURN_FIELDS = {"n", "key", "seat", "member", "model", "messages", "completion", "tool_calls", "cost_usd",
                "latency_s", "cached", "error"}  # fmt: skip


def turn_json(call: Turn) -> dict[str, Any]:
    """A call of a play as the page shows it."""
    return {
        **call.model_dump(mode="json", include=_TURN_FIELDS),
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": call.completion_tokens,
    }


def _play_json(log: Log, play: Trace, order: dict[str, int] | None) -> dict[str, Any]:
    turns = log.turns(play)
    if order is not None:  # seats of one level finish in any order; show them as the protocol declares them
        turns.sort(key=lambda t: order.get(t.seat or "", len(order)))
    return {
        "game": play.game,
        "members": play.coalition,
        "score": play.score,
        "answer": play.answer,
        "output": play.output,
        "failed": play.failed,
        "error": play.error,
        "turns": [turn_json(t) for t in turns],
    }


def compare_payload(root: Path, a: str, b: str, cache: LogCache) -> dict[str, Any]:
    """Two runs or two audits under the served folder side by side (`colab_graphs.audit.compare`); folders that
    cannot be compared are a 422 naming why."""
    from colab_graphs.audit.compare import COMPARABLE, CompareError, compare_logs

    logs = []
    for rel in (a, b):
        folder = resolve(root, rel)
        kind = find_kind(folder)
        if kind not in COMPARABLE:
            raise ViewerError(422, f"{rel or '.'} holds {f'a {kind}' if kind else 'no run or audit'}; compare "
                              "compares two runs or two audits")  # fmt: skip
        logs.append(cache.get(folder))
    try:
        result = compare_logs(logs[0], logs[1], a or ".", b or ".")
    except CompareError as err:
        raise ViewerError(422, str(err)) from None
    return result.model_dump(mode="json")


def example_payload(root: Path, rel: str, example_id: str, cache: LogCache) -> dict[str, Any]:
    folder = resolve(root, rel)
    if find_kind(folder) not in ("audit", "run"):
        raise ViewerError(404, f"{rel!r} is not an audit or a run")
    log = cache.get(folder)
    example = next((e for e in log.examples if e.id == example_id), None)
    order = seat_order(log)
    plays = [_play_json(log, p, order) for p in log.plays if p.example_id == example_id]
    if example is None and not plays:
        raise ViewerError(404, f"no example {example_id!r} in {rel or '.'}")
    fields = example.model_dump(mode="json", exclude={"type"}) if example is not None else {"id": example_id}
    return {"example": fields, "plays": plays, "log_version": log.log_version}
