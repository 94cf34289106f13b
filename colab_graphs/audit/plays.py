"""An audit's finished plays, held in its log rather than in memory.

A play (one coalition on one example, with every call it made) is written to the audit's `log.jsonl` as soon as
its example's plays are all finished (`colab_graphs.audit.game`), and then let go: what the audit asks of every
play is kept in a few arrays (score, failed, where its line is), and what the report needs of all of them is
kept as running totals (the accounting of calls, tokens and cost, the mechanism notes) as they are recorded.
The memory an audit holds is then set by the plays in flight and the number of coalitions, not by the number
of examples. A play itself (`plays[(coalition id, example id)]`) is read back from the log when asked for; so
are the plays that failed or that an absent member ended, which are few and kept as they were for the report.
"""

from __future__ import annotations

import json
import os
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from pathlib import Path
from typing import IO, Any

import numpy as np

from colab_graphs.accounting import Accounting, Tally
from colab_graphs.audit.play_cache import ServedPlay
from colab_graphs.log import Header, LogWriter, Play
from colab_graphs.log.records import CallRecord, PlayRecord
from colab_graphs.mechanism import NoteTally

PlayKey = tuple[str, str]  # (coalition id, example id)

# A play's state: not played, scored, failed; or scored and, in this run, replayed from the play cache or written
# to it (`play_cache`: what it holds of the play is then this play's).
_NONE, _SCORED, _FAILED, _SERVED, _STORED = 0, 1, 2, 3, 4


class _Column:
    """One coalition's plays, by the example's position in the dataset."""

    def __init__(self, n: int):
        self.score = np.zeros(
            n, dtype=float
        )  # the play's score, 0.0 where it has none (as values() reads it)
        self.state = np.zeros(n, dtype=np.int8)  # _NONE (not played), _SCORED, _FAILED, _SERVED or _STORED
        self.offset = np.zeros(n, dtype=np.int64)  # where its line begins in the log


class _CallsInLog(Mapping[int, CallRecord]):
    """The log's call records by number, each read from its line when asked for (the last few kept: the plays
    of one example share their calls)."""

    KEEP = 256

    def __init__(self, offsets: array, fh: IO[bytes]):
        self.offsets, self.fh = offsets, fh
        self._recent: OrderedDict[int, CallRecord] = OrderedDict()

    def __getitem__(self, n: int) -> CallRecord:
        if n in self._recent:
            return self._recent[n]
        if not 0 <= n < len(self.offsets) or self.offsets[n] < 0:
            raise KeyError(n)  # a line lost to a kill
        record = CallRecord.model_validate(_line_at(self.fh, self.offsets[n]))
        self._recent[n] = record
        if len(self._recent) > self.KEEP:
            self._recent.popitem(last=False)
        return record

    def __iter__(self) -> Iterator[int]:
        return (n for n in range(len(self.offsets)) if self.offsets[n] >= 0)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _line_at(fh: IO[bytes], offset: int) -> dict:
    fh.seek(offset)
    data = json.loads(fh.readline())
    if not isinstance(data, dict):
        raise ValueError(f"{fh.name}: the record at byte {offset} is not a JSON object")
    return data


class LoggedPlays(Mapping[PlayKey, Play]):
    """The finished plays of one audit, written to `writer`'s log: `(coalition id, example id)` -> the play.

    Args:
        writer: the audit's log, started (header and examples written).
        example_ids: the dataset's example ids, in order (a play of another example is refused).
        protocol: the protocol's name, which plays read back carry.
    """

    def __init__(self, writer: LogWriter, example_ids: Sequence[str], protocol: str):
        self.writer = writer
        self.protocol = protocol
        self._position = {eid: i for i, eid in enumerate(example_ids)}
        self._ids = list(example_ids)
        self._columns: dict[str, _Column] = {}
        self._calls = array("q")  # call record n -> where its line begins
        self._tally = Tally()
        self._notes = NoteTally()
        self._kept: dict[
            PlayKey, Play
        ] = {}  # the failed plays and those an absent member ended, as they were

    # --- recording ---------------------------------------------------------------------------------------------

    def record(self, plays: Sequence[Play]) -> None:
        """Append `plays` to the log (with the calls it does not hold yet) and keep what is asked of them."""
        if not plays:
            return
        before = self.writer.calls_held
        self._index(plays, before, self.writer.append(self.writer.plays_text(plays)))

    def replay(self, plays: Sequence[ServedPlay]) -> None:
        """Append plays taken from the play cache to the log, and keep what is asked of them, as `record`."""
        if not plays:
            return
        before = self.writer.calls_held
        self._index(plays, before, self.writer.append(self.writer.served_text(plays)))

    def resume(
        self, header: Header, examples: Sequence[object], records: Iterable[tuple[int, int, Any]]
    ) -> None:
        """Write the log afresh from the earlier run's (`records`: its lines streamed, with their byte offsets):
        with the plays that finished, read one example at a time, and without the failed plays (they are
        played again), the torn lines a kill may have left, and the plays whose calls' lines were lost; calls
        numbered afresh. The earlier log stays whole until the new one, complete, replaces it."""
        path = self.writer.path
        fresh = path.with_name(f".{path.stem}.resumed{path.suffix}")
        self.writer.path = fresh
        self._calls = array("q")
        self._index([], 0, self.writer.start(header, examples))  # type: ignore[arg-type]
        earlier = array("q")  # the earlier log's call numbers -> where their lines begin (-1: lost)
        with open(path, "rb") as fh:
            calls = _CallsInLog(earlier, fh)
            batch: list[Play] = []
            for _, offset, record in records:
                if isinstance(record, CallRecord):
                    earlier.extend([-1] * (record.n + 1 - len(earlier)))
                    earlier[record.n] = offset
                elif isinstance(record, PlayRecord) and not record.failed:
                    try:
                        play = record.play(calls, self.protocol)
                    except KeyError:
                        continue  # one of its calls' lines was lost: the play runs again
                    if batch and batch[-1].example_id != play.example_id:
                        self.record(batch)  # an example's plays together, as they were recorded
                        batch = []
                    if (coalition_id(play.game, play.coalition), play.example_id) not in self:
                        batch.append(play)
            self.record(batch)
        with open(fresh, "rb") as out:
            os.fsync(out.fileno())
        os.replace(fresh, path)
        self.writer.path = path

    def _index(
        self, plays: Sequence[Play] | Sequence[ServedPlay], calls_before: int, offsets: list[int]
    ) -> None:
        new_calls = self.writer.calls_held - calls_before
        if len(self._calls) != calls_before or len(offsets) != new_calls + len(plays):
            raise RuntimeError(
                f"{self.writer.path}: the log's lines are not those written (a second writer?)"
            )
        self._calls.extend(offsets[:new_calls])
        for play, offset in zip(plays, offsets[new_calls:], strict=True):
            self._add(play, offset)

    def _add(self, play: Play | ServedPlay, offset: int) -> None:
        cid = coalition_id(play.game, play.coalition)
        if play.example_id not in self._position:
            raise KeyError(f"a play of example {play.example_id!r}, which is not in this audit's dataset")
        i = self._position[play.example_id]
        column = self._columns.get(cid)
        if column is None:  # (not `setdefault`: that would make the arrays of every play, to throw them away)
            column = self._columns[cid] = _Column(len(self._ids))
        if column.state[i] != _NONE:
            # The game never plays a coalition twice on one example; the running totals would count both.
            raise RuntimeError(f"the play of {cid} on example {play.example_id!r} was recorded twice")
        column.score[i] = play.score or 0.0
        served = isinstance(play, ServedPlay)
        column.state[i] = _FAILED if play.failed else _SERVED if served else _SCORED
        column.offset[i] = offset
        self._tally.add(play)
        if play.game == "coalition":
            self._notes.add(play)
        if isinstance(play, Play) and (play.failed or (play.model_extra or {}).get("ended_by_absent")):
            self._kept[(cid, play.example_id)] = play

    # --- what the audit asks of every play ---------------------------------------------------------------------

    def scores(self, cid: str, example_ids: Sequence[str]) -> np.ndarray:
        """The coalition's scores on these examples (0.0 for a play without one), each example played."""
        column = self._columns.get(cid)
        index = [self._position[e] for e in example_ids]
        if column is None or (len(index) and not np.all(column.state[index] != _NONE)):
            missing = next(e for e in example_ids if column is None or not column.state[self._position[e]])
            raise KeyError((cid, missing))
        return column.score[index].copy()

    def stored(self, play: Play) -> None:
        """Note that the play cache now holds `play` (recorded in this run) as it is."""
        column, i = self._columns[coalition_id(play.game, play.coalition)], self._position[play.example_id]
        if column.state[i] == _SCORED:
            column.state[i] = _STORED

    def in_play_cache(self, cid: str, example_ids: Sequence[str]) -> list[str]:
        """The examples among `example_ids` whose play of `cid` the play cache holds as this audit has it."""
        column = self._columns.get(cid)
        if column is None:
            return []
        return [e for e in example_ids if column.state[self._position[e]] in (_SERVED, _STORED)]

    def failed_ids(self) -> Set[str]:
        return {eid for (_, eid), play in self._kept.items() if play.failed}

    def kept(self) -> list[Play]:
        """The failed plays and those an absent member ended, in the order recorded."""
        return list(self._kept.values())

    def notes(self) -> list[dict]:
        """`colab_graphs.mechanism.mechanism_notes` of the coalition plays."""
        return self._notes.notes()

    def accounting(self, made_before: Set[str]) -> Accounting:
        """`colab_graphs.accounting.account` of every play; `made_before` as there (see `cached_keys`)."""
        resumable = set(made_before) - self._tally.made_keys
        if not resumable:
            return self._tally.result()
        # A resumed audit found calls of its own earlier run in the cache: which use of each counts as made
        # depends on the order the plays were recorded, so they are counted again, in that order, from the log.
        tally = Tally(resumable)
        for key in self._in_log_order():
            tally.add(self[key])
        return tally.result()

    def cached_keys(self) -> set[str]:
        """The keys of the calls the plays only got from a cache: the ones `made_before` can hold."""
        return self._tally.keys - self._tally.made_keys

    # --- the plays themselves, read back -----------------------------------------------------------------------

    def __getitem__(self, key: PlayKey) -> Play:
        cid, eid = key
        column, i = self._columns.get(cid), self._position.get(eid)
        if column is None or i is None or column.state[i] == _NONE:
            raise KeyError(key)
        with open(self.writer.path, "rb") as fh:
            return self._read(fh, int(column.offset[i]))

    def _read(self, fh: IO[bytes], offset: int) -> Play:
        record = PlayRecord.model_validate(_line_at(fh, offset))
        return record.play(_CallsInLog(self._calls, fh), self.protocol)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        column, i = self._columns.get(key[0]), self._position.get(key[1])
        return column is not None and i is not None and column.state[i] != _NONE

    def __iter__(self) -> Iterator[PlayKey]:
        for cid, column in self._columns.items():
            for i in np.flatnonzero(column.state):
                yield cid, self._ids[i]

    def __len__(self) -> int:
        return sum(int(np.count_nonzero(c.state)) for c in self._columns.values())

    def _in_log_order(self) -> list[PlayKey]:
        keys = list(self)
        offsets = [int(self._columns[cid].offset[self._position[eid]]) for cid, eid in keys]
        return [keys[i] for i in np.argsort(offsets, kind="stable")]

    @property
    def path(self) -> Path:
        return self.writer.path


def coalition_id(game: str, members: Sequence[str]) -> str:
    return f"{game}:" + ",".join(members)
