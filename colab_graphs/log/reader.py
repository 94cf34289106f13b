"""Reading any output folder as one typed `Log`.

`read_log(path)` reads the folder's `log.jsonl` (runs, audits, studies) and attaches its contract file
(`summary.json`, `report.json`, `study.json`) when the producer has finished. A training run keeps no log: its
`metrics.jsonl`, `eval_before.json`, `eval_after.json` and `rollouts.jsonl` are read as one. A log newer than
this colab-graphs is refused with both versions named.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from colab_graphs.log.model import Log
from colab_graphs.log.records import (
    LOG_FILE,
    LOG_VERSION,
    RECORD_TYPES,
    CallRecord,
    EvaluationRecord,
    ExampleRecord,
    Header,
    LogError,
    LogVersionError,
    PlanRecord,
    PlayRecord,
    RolloutRecord,
    StepRecord,
    load_json,
    load_jsonl,
)
from colab_graphs.trace import Trace

SUMMARY_FILES = {
    "audit": "report.json",
    "study": "study.json",
    "run": "summary.json",
    "train": "summary.json",
}
TRAIN_FILES = ("metrics.jsonl", "eval_before.json", "eval_after.json", "rollouts.jsonl")
ROLLOUTS_FILE = "rollouts.jsonl"


# --- records ---------------------------------------------------------------------------------------------------


def read_records(path: str | os.PathLike[str], *, strict: bool = True) -> tuple[list[tuple[int, Any]], bool]:
    """((line number, record) for each line of a log file, whether the last line was cut short).

    Records of types this version does not know are skipped. The last line may be cut short (a writer
    mid-append): it is left out. Any other bad line raises `LogError` naming the file and line, or is skipped
    when not `strict` (a resumed audit plays again what it cannot read). Raises `LogVersionError` for a header
    newer than this colab-graphs reads.
    """
    stream = RecordStream(path, strict=strict)
    records = [(lineno, record) for lineno, _, record in stream]
    return records, stream.torn


class RecordStream:
    """`read_records` one line at a time: iterating yields (line number, byte offset, record), and holds one
    line in memory, however long the log. `torn` says, once iterated, whether the last line was cut short."""

    def __init__(self, path: str | os.PathLike[str], *, strict: bool = True):
        self.path, self.strict, self.torn = Path(path), strict, False

    def __iter__(self) -> Iterator[tuple[int, int, Any]]:
        offset = 0
        with open(self.path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                at, offset = offset, offset + len(raw)
                last = not raw.endswith(b"\n")  # a last line without its newline is still being written
                line = raw.decode("utf-8")
                self.torn = last and bool(line.strip())
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                    if not isinstance(data, dict):
                        raise ValueError("a record is a JSON object")
                    kind = data.get("type")
                    cls = RECORD_TYPES.get(kind) if isinstance(kind, str) else None
                    record = cls.model_validate(data) if cls is not None else None
                except (json.JSONDecodeError, ValidationError, ValueError) as exc:
                    if last:
                        break
                    if self.strict:
                        raise LogError(f"{self.path}:{lineno}: not a valid log record: {exc}") from None
                    continue
                if record is None:
                    continue  # a record type added after this version: readers skip it
                if isinstance(record, Header) and record.log_version > LOG_VERSION:
                    raise LogVersionError(
                        f"{self.path}: log version {record.log_version} was written by a newer colab-graphs (this "
                        f"one reads log versions 0 to {LOG_VERSION}); upgrade colab-graphs to read it"
                    )
                yield lineno, at, record


def _resolved(
    path: Path,
    plays: Iterable[tuple[int, PlayRecord]],
    calls: Mapping[int, CallRecord],
    protocol: str,
    strict: bool,
) -> list[Trace]:
    """The plays, each with its calls resolved to the log's records. One that refers to a call the log does
    not hold (a line lost) raises `LogError` naming its line, or is left out when not `strict`."""
    out = []
    for lineno, record in plays:
        try:
            out.append(record.play(calls, protocol))
        except KeyError as missing:
            if strict:
                raise LogError(
                    f"{path}:{lineno}: the play refers to call {missing}, which the log does not hold"
                ) from None
    return out


def _from_records(path: Path, folder: Path, strict: bool) -> Log:
    records, torn = read_records(path, strict=strict)
    header: Header | None = None
    log: dict[str, Any] = {
        "examples": [],
        "calls": {},
        "plays": {},
        "steps": [],
        "evaluations": {},
        "rollouts": [],
    }
    for lineno, record in records:
        if header is None:
            if not isinstance(record, Header):
                raise LogError(f"{path}:{lineno}: a log starts with its header record, found {record.type!r}")
            header = record
        elif isinstance(record, ExampleRecord):
            log["examples"].append(record)
        elif isinstance(record, CallRecord):
            log["calls"][record.n] = record
        elif isinstance(record, PlayRecord):  # a play recorded again (a retried failure) replaces the first
            log["plays"][(record.game, tuple(record.members), record.example)] = (lineno, record)
        elif isinstance(record, PlanRecord):
            log["plan"] = record
        elif isinstance(record, StepRecord):
            log["steps"].append(record)
        elif isinstance(record, EvaluationRecord):
            log["evaluations"][record.name] = record
        elif isinstance(record, RolloutRecord):
            log["rollouts"].append(record)
    if header is None:
        raise LogError(f"{path}: empty log (no header record)")
    log["plays"] = _resolved(path, log["plays"].values(), log["calls"], header.protocol or "", strict)
    return Log(path=str(folder), log_version=header.log_version, header=header, torn=torn, **log)


# --- folders ---------------------------------------------------------------------------------------------------


def check_overwritable(folder: str | os.PathLike[str], kind: str) -> None:
    """Raise ValueError unless `folder` is absent, empty (but for its lock) or holds what one colab-graphs job
    wrote: `--overwrite` / `overwrite=True` discards an earlier job's outputs, never a folder of other things
    (`out="."`, a folder holding several runs) that a `kind` job would wipe whole."""
    from colab_graphs.files import LOCK_FILE

    folder = Path(folder)
    if not folder.is_dir() or not any(e.name != LOCK_FILE for e in folder.iterdir()):
        return
    if find_kind(folder) is None:
        raise ValueError(
            f"{folder} holds files that no colab-graphs job wrote: not overwritten by this {kind}; pick another"
            " folder"
        )


def find_kind(folder: str | os.PathLike[str]) -> str | None:
    """What the CLI wrote in `folder` ("run", "audit", "study", "train"), or None when nothing it knows."""
    folder = Path(folder)
    if (folder / LOG_FILE).is_file():
        try:
            with open(folder / LOG_FILE, encoding="utf-8") as fh:
                kind = json.loads(fh.readline()).get("kind")
        except (json.JSONDecodeError, AttributeError):
            return None
        return kind if kind in SUMMARY_FILES else None
    summary = load_json(folder / "summary.json") if (folder / "summary.json").is_file() else None
    if any((folder / name).is_file() for name in TRAIN_FILES) or (summary and "reward" in summary):
        return "train"
    return None


def read_log(path: str | os.PathLike[str], *, strict: bool = True) -> Log:
    """Read an output folder (or its `log.jsonl`) written by `run`, `audit`, `study` or `train`.

    Raises:
        FileNotFoundError: nothing colab-graphs writes is there.
        LogVersionError: the log is newer than this colab-graphs reads (the message names both versions).
        LogError: a record is invalid (the message names the file and line).
    """
    path = Path(path)
    folder = path.parent if path.is_file() else path
    kind = find_kind(folder)
    if kind is None:
        raise FileNotFoundError(
            f"{path}: no colab-graphs output here (no {LOG_FILE}, and no training run's metrics.jsonl, "
            "eval_*.json, rollouts.jsonl or summary.json)"
        )
    log = (
        _from_records(folder / LOG_FILE, folder, strict)
        if (folder / LOG_FILE).is_file()
        else _train_view(folder)
    )
    if log.summary is None:
        summary = folder / SUMMARY_FILES[log.kind]
        log.summary = load_json(summary) if summary.is_file() else None
    return log


def _train_view(folder: Path) -> Log:
    """A training run's files as a log: its steps, evaluations and sample rollouts."""
    summary = load_json(folder / "summary.json")
    manifest = load_json(folder / "policy" / "colab_graphs_policy.json") or {}
    config = manifest.get("config") or {}
    header = Header(
        kind="train",
        protocol=(summary or {}).get("protocol") or config.get("protocol"),
        protocol_params=config.get("protocol_params") or {},
        dataset=config.get("dataset"),
        scorer=config.get("scorer"),
        reward=(summary or config).get("reward"),
        credit=(summary or config).get("credit"),
        policy_member=(summary or config).get("policy_member"),
        config=config,
    )
    steps = [
        StepRecord.model_validate(line) for line in load_jsonl(folder / "metrics.jsonl") if "step" in line
    ]
    evaluations = {}
    for name in ("before", "after"):
        data = load_json(folder / f"eval_{name}.json")
        if data is not None:
            evaluations[name] = EvaluationRecord(name=name, **{k: v for k, v in data.items() if k != "name"})
    rollouts = []
    for line in load_jsonl(folder / ROLLOUTS_FILE):
        try:
            rollouts.append(RolloutRecord.model_validate(line))
        except ValidationError:
            continue
    return Log(
        path=str(folder),
        log_version=LOG_VERSION,
        header=header,
        steps=_latest_run(steps),
        evaluations=evaluations,
        rollouts=_latest_run(rollouts),
        summary=summary,
    )


def _latest_run(records: list[Any]) -> list[Any]:
    """Records of the latest training run in a file that several runs appended to: a step lower than the one
    before it starts a new run (from scratch, or resumed from a checkpoint), which replaces the steps it
    repeats."""
    out: list[Any] = []
    for record in records:
        if out and record.step < out[-1].step:
            out = [r for r in out if r.step < record.step]
        out.append(record)
    return out
