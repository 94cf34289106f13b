"""Writing a log as it happens: each distinct call once, plays by reference.

`LogWriter` is the streaming writer behind runs, audits and studies: `start` writes the header and examples,
`plays_text` turns finished plays into the lines to append (the records of calls this file does not hold yet,
then one line per play referring to its calls by number), and `append` adds them at the end of the file. A
reader can open the file at any moment; at worst its last line is cut short. Every line passes through
`colab_graphs.redaction.hide_secrets` on its way to the file.

`write_log` writes a whole `Log` (read with `read_log`) to a new file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

from colab_graphs.files import atomic_write_text
from colab_graphs.log.records import LOG_FILE, CallRecord, Header, call_fields
from colab_graphs.redaction import hide_secrets
from colab_graphs.trace import Call, Play

if TYPE_CHECKING:
    from colab_graphs.log.model import Log


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)


class ServedCallText(Protocol):
    """A call of a replayed play (served from the cache): its key, seat, and its record's text after the seat."""

    @property
    def key(self) -> str: ...
    @property
    def seat(self) -> str | None: ...
    @property
    def body(self) -> str: ...


class ServedLines(Protocol):
    """A replayed play: its line up to its call references (`"calls":`), and its calls."""

    @property
    def line(self) -> str: ...
    @property
    def calls(self) -> Sequence[ServedCallText]: ...


def _rank(call: Call) -> tuple[bool, bool]:
    """Which of a request's uses its record is made from: a success before a failure, the call made before a
    reuse of its reply."""
    return call.error is not None, call.cached


def _ref(n: int, call: Call, recorded_seat: str | None) -> list[Any]:
    """A play's reference to record `n` (see `CallRef`)."""
    ref: list[Any] = [n, 1 if call.cached else 0]
    return [*ref, call.seat] if call.seat != recorded_seat else ref


def play_fields(play: Play, refs: list[list[Any]]) -> dict[str, Any]:
    """`play` as the log's play record (see `PlayRecord`), its calls given as references `refs`."""
    record: dict[str, Any] = {
        "type": "play",
        "game": play.game,
        "members": play.coalition,
        "example": play.example_id,
        "score": play.score,
    }
    if play.answer is not None:
        record["answer"] = play.answer
    if play.output is not None and play.game == "run":  # an audit's calls hold its coalitions' outputs
        record["output"] = play.output
    if play.failed:
        record["failed"] = True
        record["error"] = play.error
    if play.sandbox is not None:  # code scores: the sandbox that ran the code
        record["sandbox"] = play.sandbox
    record.update(play.model_extra or {})  # fields a later version wrote, kept
    record["calls"] = refs
    return record


class LogWriter:
    """Appends records to one `log.jsonl`, remembering which calls it holds so that each is written once.

    Args:
        path: the log file, or the folder that holds (or will hold) `log.jsonl`.
    """

    def __init__(self, path: str | os.PathLike[str]):
        path = Path(path)
        self.path = path / LOG_FILE if path.suffix != ".jsonl" else path
        self._numbers: dict[str, int] = {}  # key -> the record plays refer to
        self._seats: list[str | None] = []  # n -> the seat in that record
        self._failed: set[str] = set()  # keys whose record is a failure (a later success is written anew)

    def start(
        self, header: Header, examples: Iterable[BaseModel | dict[str, Any]] = (), records: str = ""
    ) -> list[int]:
        """Write a new log (replacing any file there, atomically): the header, the examples, then `records`
        (lines already made, e.g. by `plays_text`). Returns the byte offset of each line of `records`."""
        lines = [header.model_dump_json(exclude_none=True)]
        for example in examples:
            data = example.model_dump(exclude_none=True) if isinstance(example, BaseModel) else example
            lines.append(_dumps({"type": "example", **{k: v for k, v in data.items() if k != "type"}}))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        head, body = hide_secrets("\n".join(lines) + "\n"), hide_secrets(records)
        atomic_write_text(self.path, head + body)
        return _line_offsets(body.encode("utf-8"), len(head.encode("utf-8")))

    def remember(self, calls: Iterable[CallRecord]) -> None:
        """Take the calls of an existing log as written (its plays refer to them; new plays will too)."""
        for record in calls:
            while len(self._seats) <= record.n:
                self._seats.append(None)
            self._seats[record.n] = record.seat
            self._numbers[record.key] = record.n
            if record.error is not None:
                self._failed.add(record.key)
            else:
                self._failed.discard(record.key)

    def plays_text(self, plays: Sequence[Play]) -> str:
        """The lines that record `plays`: the calls this log does not hold yet, then one line per play.

        A call several plays share is recorded from the play that made it (not from one that got it from the
        cache or from another coalition), so its latency and attempts are those of the real call.
        """
        lines: list[str] = []
        numbers, seats, failed = self._numbers, self._seats, self._failed
        fresh: dict[str, Call] = {}
        for play in plays:
            for call in play.calls:
                key = call.key
                if key in numbers and key not in failed:
                    continue
                seen = fresh.get(key)
                if seen is None or _rank(call) < _rank(seen):
                    fresh[key] = call
        for key, call in fresh.items():
            if key in numbers and call.error is not None:
                continue  # the log already holds this failure
            n = len(seats)
            seats.append(call.seat)
            numbers[key] = n
            if call.error is not None:
                failed.add(key)
            else:
                failed.discard(key)
            lines.append(_dumps(call_fields(n, call)))
        for play in plays:
            refs = [_ref(numbers[c.key], c, seats[numbers[c.key]]) for c in play.calls]
            lines.append(_dumps(play_fields(play, refs)))
        return "".join(line + "\n" for line in lines)

    def served_text(self, plays: Sequence[ServedLines]) -> str:
        """The lines that record plays replayed from the play cache (`colab_graphs.audit.play_cache`): as
        `plays_text` would write them had each call been served from the cache, built from the text stored."""
        lines: list[str] = []
        numbers, seats, failed = self._numbers, self._seats, self._failed
        for play in plays:
            for call in play.calls:
                if call.key in numbers and call.key not in failed:
                    continue
                n = len(seats)
                seats.append(call.seat)
                numbers[call.key] = n
                failed.discard(call.key)
                seat = f'"seat":{_dumps(call.seat)},' if call.seat else ""
                lines.append(f'{{"type":"call","n":{n},{seat}{call.body}')
        seat_text: dict[
            str | None, str
        ] = {}  # (the references written as text: a replay's main cost otherwise)
        for play in plays:
            refs = []
            for call in play.calls:
                n = numbers[call.key]
                if call.seat == seats[n]:
                    refs.append(f"[{n},1]")
                    continue
                if call.seat not in seat_text:
                    seat_text[call.seat] = _dumps(call.seat)
                refs.append(f"[{n},1,{seat_text[call.seat]}]")
            lines.append(f"{play.line}[{','.join(refs)}]}}")
        return "".join(line + "\n" for line in lines)

    @property
    def calls_held(self) -> int:
        """How many call records the log holds (the next one is number `calls_held`)."""
        return len(self._seats)

    def append(self, text: str) -> list[int]:
        """Add lines at the end of the log (one write); returns the byte offset of each line written (where a
        reader seeks to read it back)."""
        if not text:
            return []
        data = hide_secrets(text).encode("utf-8")
        with open(self.path, "ab") as fh:
            start = fh.seek(0, os.SEEK_END)
            fh.write(data)
        return _line_offsets(data, start)


def _line_offsets(data: bytes, start: int) -> list[int]:
    """Where each line of `data` (whole lines), written at byte `start` of a file, begins."""
    offsets, at = [], start
    for line in data.split(b"\n")[:-1]:
        offsets.append(at)
        at += len(line) + 1
    return offsets


def write_log(log: Log, path: str | os.PathLike[str]) -> Path:
    """Write `log` as a `log.jsonl` (at `path`, a file or a folder); returns the file written.

    Every record is written in its current form, so this also upgrades a log read from an older version.
    """
    writer = LogWriter(path)
    header = log.header.model_copy(update={"log_version": log.current_version()})
    body = [r.model_dump_json(exclude_none=True) for r in ([log.plan] if log.plan else [])]
    body += [_dumps(c.fields()) for c in sorted(log.calls.values(), key=lambda c: c.n)]
    body += [_dumps(play_fields(p, [_logged_ref(c, log) for c in p.calls])) for p in log.plays]
    body += [s.model_dump_json(exclude_none=True) for s in log.steps]
    body += [e.model_dump_json(exclude_none=True) for e in log.evaluations.values()]
    body += [r.model_dump_json(exclude_none=True) for r in log.rollouts]
    writer.start(header, log.examples, "".join(line + "\n" for line in body))
    return writer.path


def _logged_ref(call: Call, log: Log) -> list[Any]:
    """A read play's reference to the record its call was resolved from."""
    if not isinstance(call, CallRecord):
        raise TypeError(f"a play of a log read back holds its calls' records, not {type(call).__name__}")
    return _ref(call.n, call, log.calls[call.n].seat)
