"""The play cache: an audit rerun from a full call cache reuses its plays' outcomes instead of playing them.

A rerun whose every call is in the call cache still paid, per play, for the graph run, a copy of each cached
call per seat, the scoring and the log's records built again: about 40% of the first run's CPU at zero
latency. What a play comes to is fixed by what determines it, so it is stored beside the calls (the same
SQLite file, tables `plays` and `play_calls`) under a key of:

- the package's code (every file of `colab_graphs`, hashed: any edit replays every play),
- the protocol's spec over the whole pool and the coalition's own graph (a fitted coalition's fitted spec):
  its prompts, its parameters, its aggregator,
- the pool as reports show it (models, call settings such as the temperature, system prompts) and each
  member's cache identity (which model answers),
- the scorer and the sandbox setting code scores run under,
- the game, the coalition, and the whole example (not only its id).

An example's plays are taken from it together, and only when every one of them is stored and every call they
refer to is still in the call cache (a call dropped with `cache drop` plays its example again); otherwise the
example is played as before and its entries written anew. Each entry carries the sha256 of its text: one that
is cut short or altered is a miss (with a warning naming the file), never a score. What is stored went
through `colab_graphs.redaction.hide_secrets`, like the log it is written to; the key holds no secret (the
pool's public form and identities, which hold none). No call cache (`--no-cache`), no play cache; `cache clear`
empties both. Plays that failed, that an absent member ended, or that made a call that failed are not stored.

A replayed play reaches the log, the accounting and the report as a rerun from the call cache would put it:
its calls all served from the cache (latency and attempts 0), its score, answer and notes those recorded.
The replay runs with no full collection of Python's cyclic garbage collector (`collector_spared`: they were
40% of a 300,000-call rerun's CPU), the caller's collector settings restored after. An audit that replays no
play although the call cache served every call says so once (`CoalitionGame.note_unreplayed`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import inspect
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from colab_graphs.log.records import call_fields
from colab_graphs.log.writer import play_fields
from colab_graphs.models.cache import CallCache
from colab_graphs.models.identity import cache_identity
from colab_graphs.pool import Pool
from colab_graphs.redaction import hide_secrets
from colab_graphs.registry import KINDS, registry_find
from colab_graphs.sandbox import scope
from colab_graphs.spec import GraphSpec
from colab_graphs.tasks.example import Example
from colab_graphs.trace import Call, Play

logger = logging.getLogger("colab_graphs")

VERSION = 1  # of the entries' form; part of every key
_TABLES = (
    "CREATE TABLE IF NOT EXISTS plays (key TEXT PRIMARY KEY, entry TEXT)",
    "CREATE TABLE IF NOT EXISTS play_calls (key TEXT PRIMARY KEY, entry TEXT)",
)
_CHUNK = 500  # keys per statement (SQLite limits a statement's parameters)
_PENDING = 512  # play entries written together
_PUT = "INSERT OR REPLACE INTO {} (key, entry) VALUES (?, ?)"
_DIGEST = 32  # hex characters of sha256 before each entry's text


@functools.cache
def code_digest() -> str:
    """sha256 over every file of the installed `colab_graphs` package (path and bytes), compiled files aside."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(f"{path.relative_to(root)}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def outside_code() -> str | None:
    """sha256 over the source files of the registered protocols, aggregators, routers and tasks that are not
    the package's own (a plugin's, a user graph file's): their code decides plays too. None when the source of
    one cannot be read (defined in a notebook cell, say): then no play is replayed."""
    files: set[str] = set()
    for kind in KINDS:
        for info in registry_find(kind):
            owner = info.obj if inspect.isfunction(info.obj) or inspect.isclass(info.obj) else type(info.obj)
            if owner.__module__.split(".")[0] == "colab_graphs":
                continue
            try:
                source = inspect.getsourcefile(owner)
            except TypeError:
                return None
            if source is None or not os.path.isfile(source):
                return None
            files.add(source)
    digest = hashlib.sha256()
    for source in sorted(files):
        digest.update(source.encode() + b"\0" + Path(source).read_bytes() + b"\0")
    return digest.hexdigest()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _sealed(text: str) -> str:
    return _sha(text)[:_DIGEST] + text


def _opened(entry: object) -> Any:
    """The JSON an entry holds, or None when its text is not the text its digest was made of."""
    if not isinstance(entry, str) or len(entry) <= _DIGEST:
        return None
    text = entry[_DIGEST:]
    if _sha(text)[:_DIGEST] != entry[:_DIGEST]:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


_NO_FULL = 1 << 30  # the oldest generation's threshold during a replay: no full collection


@contextlib.contextmanager
def collector_spared() -> Iterator[None]:
    """No full collection of Python's cyclic garbage collector until the exit (around a replay).

    Why: a replay makes, per play, a few objects the collector tracks (its entry's parsed JSON, its
    `ServedPlay` and call references) that live until their batch of examples is in the log. Enough of them
    outlive two young collections to set off full collections, and each full collection walks every tracked
    object of the process: the audit's examples, every module loaded, the caller's own data. Their number grows
    with the audit and so does each one's cost: 40% of a 300,000-call rerun's CPU (113 full collections), 21%
    at 30,000 calls. The oldest generation's threshold is raised meanwhile (young collections run as ever);
    `gc.freeze()` would not do here, since undoing it (`gc.unfreeze()`) also thaws what the caller froze,
    as the CLI does with its start-up heap (`colab_graphs.cli.common.freeze_startup_heap`).

    The caller's process gets its collector back as it was: the thresholds are set back in a `finally` (also on
    an exception), unless someone else changed them meanwhile (theirs are kept). Nothing is lost: garbage
    without a cycle is freed as ever, and a cycle that became garbage meanwhile is collected by the first full
    collection after the exit. Left alone when the collector is off (the caller's choice).
    """
    young, middle, oldest = gc.get_threshold()
    if not gc.isenabled() or not young or oldest >= _NO_FULL:
        yield  # off, or already spared (a replay in another thread)
        return
    gc.set_threshold(young, middle, _NO_FULL)
    try:
        yield
    finally:
        if gc.get_threshold() == (young, middle, _NO_FULL):
            gc.set_threshold(young, middle, oldest)


class PlayCacheUnavailable(RuntimeError):
    """What decides this audit's plays cannot all be keyed: its plays are played, none replayed or stored."""


@dataclass(frozen=True, slots=True)
class ServedCall:
    """A call a replayed play got from the cache: what the log's record, the accounting and the progress bar
    read of it (`colab_graphs.accounting.CallUse`)."""

    key: str
    seat: str | None
    member: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    body: str  # the log's call record without its number and seat: `"key":...` up to the closing brace
    cached: bool = True
    error: None = None

    @property
    def usage(self) -> ServedCall:
        # The accounting reads `call.usage.prompt_tokens`: the tokens are this record's own.
        return self


@dataclass(slots=True)
class ServedPlay:
    """A play taken from the play cache: its log line (`line` + its call references + `}`) and what the audit
    keeps of a play (`colab_graphs.audit.plays`)."""

    example_id: str
    game: str
    coalition: list[str]
    score: float | None
    line: str
    calls: list[ServedCall]
    digest: str  # of its entry: what other values of this play are stored under (`PlayCache.values`)
    model_extra: dict[str, Any] = field(default_factory=dict)
    failed: bool = False

    def as_play(self, protocol: str) -> Play:
        """The play as `on_progress` sees it (no copy of its calls' records)."""
        return Play.model_construct(
            example_id=self.example_id, protocol=protocol, game=self.game, coalition=self.coalition,
            score=self.score, calls=self.calls, **self.model_extra,
        )  # fmt: skip


Job = tuple[str, list[str]]  # (game, coalition members in the protocol's order)


class PlayCache:
    """An audit's plays by key, in `cache`'s file (see the module docstring).

    Args:
        cache: the call cache the audit's calls go through.
        spec, pool, scorer: the audit's protocol, members and scorer.
        graph_spec: (game, members) -> the spec that coalition plays (None: the empty coalition).
    """

    def __init__(
        self,
        cache: CallCache,
        spec: GraphSpec,
        pool: Pool,
        scorer: str | None,
        graph_spec: Callable[[str, list[str]], GraphSpec | None],
    ):
        self.cache = cache
        self.graph_spec = graph_spec
        self._warned = False
        outside = outside_code()
        if outside is None:
            raise PlayCacheUnavailable("a registered protocol, aggregator, router or task has no source file")
        for statement in _TABLES:
            cache.query(statement)
        self._base = _sha(
            json.dumps(
                {
                    "v": VERSION,
                    "code": code_digest(),
                    "plugins": outside,
                    "spec": spec.to_dict(),
                    "pool": pool.to_public_dict(),
                    "identities": {m.name: cache_identity(m) for m in pool.members},
                    "scorer": scorer,
                    "sandbox": scope.current(),
                },
                sort_keys=True,
                default=str,
            )
        )
        self._coalitions: dict[str, str] = {}
        self._plays: list[tuple[str, str]] = []  # entries `store` made, not written yet (`flush`)
        self._calls: dict[str, str] = {}

    # --- keys ----------------------------------------------------------------------------------------------

    def _coalition(self, game: str, members: list[str]) -> str:
        cid = f"{game}:{','.join(members)}"
        if cid not in self._coalitions:
            graph = self.graph_spec(game, members)
            blob = json.dumps(
                [self._base, game, members, graph.to_dict() if graph is not None else None],
                sort_keys=True,
                default=str,
            )
            self._coalitions[cid] = _sha(blob)
        return self._coalitions[cid]

    def keys(self, example: Example, jobs: Iterable[Job]) -> list[str]:
        """The key of each job's play on `example`."""
        whole = _sha(json.dumps(example.model_dump(mode="json"), sort_keys=True, default=str))
        return [_sha(self._coalition(game, members) + whole) for game, members in jobs]

    # --- reading -------------------------------------------------------------------------------------------

    def served(self, todo: Sequence[tuple[Example, list[Job]]]) -> dict[str, list[ServedPlay]]:
        """Example id -> its plays of `todo`, for the examples whose every play is stored (entries whole) and
        whose every call the call cache holds as the play got it; the other examples are to be played."""
        keyed = [(example, jobs, self.keys(example, jobs)) for example, jobs in todo]
        entries = self._entries("plays", [k for _, _, ks in keyed for k in ks])
        found: list[tuple[Example, list[Job], list[tuple[str, Any]]]] = []
        for example, jobs, keys in keyed:
            stored = [entries.get(k) for k in keys]
            if all(e is not None for e in stored):
                found.append((example, jobs, stored))  # type: ignore[arg-type]
        wanted = {ref[0] for _, _, stored in found for e in stored for ref in _refs(e)}
        calls = self._entries("play_calls", sorted(wanted), held_by_calls=True)
        out: dict[str, list[ServedPlay]] = {}
        made: dict[tuple[str, str | None], ServedCall] = {}  # one per call and seat, shared by the plays
        for example, jobs, stored in found:
            plays = [_served(example.id, job, e, calls, made) for job, e in zip(jobs, stored, strict=True)]
            if all(p is not None for p in plays):
                out[example.id] = plays  # type: ignore[assignment]
        return out

    def _entries(
        self, table: str, keys: list[str], held_by_calls: bool = False
    ) -> dict[str, tuple[str, Any]]:
        """key -> (digest, JSON) of each whole entry of `table` among `keys`. For `play_calls`, only the entries
        of calls the call cache holds as they were stored (the same write of the call: its time)."""
        sql = f"SELECT t.key, t.entry, {'c.created' if held_by_calls else 'NULL'} FROM {table} t"
        sql += " JOIN calls c ON c.key = t.key" if held_by_calls else ""
        out: dict[str, tuple[str, Any]] = {}
        for chunk in chunks(keys, _CHUNK):
            for key, entry, created in self.cache.query(
                f"{sql} WHERE t.key IN ({','.join('?' * len(chunk))})", chunk
            ):
                data = _opened(entry)
                if data is None:
                    self._bad(table, key)
                elif not held_by_calls or (isinstance(data, dict) and data.get("created") == created):
                    out[key] = (entry[:_DIGEST], data)
        return out

    def _bad(self, table: str, key: str) -> None:
        logger.warning(
            "play cache %s: the entry %s of table %s is damaged (its text does not match its digest); its "
            "example is played again%s",
            self.cache.path,
            key[:16],
            table,
            " (further damaged entries are not reported)" if self._warned else "",
        )
        self._warned = True

    # --- writing -------------------------------------------------------------------------------------------

    def store(self, example: Example, jobs: Sequence[Job], plays: Sequence[Play]) -> list[Play]:
        """Keep `plays` (those of `jobs` on `example`, in that order) that can be replayed (module docstring),
        each bound to its calls' writes in the call cache (a call made again later is another reply); returns
        those kept."""
        keep = [
            (key, play)
            for key, play in zip(self.keys(example, jobs), plays, strict=True)
            if not play.failed
            and "ended_by_absent" not in (play.model_extra or {})
            and all(c.error is None for c in play.calls)
        ]
        written = self._written({c.key for _, play in keep for c in play.calls})
        kept = []
        for key, play in keep:
            if not all(c.key in written for c in play.calls):
                continue  # a call the cache did not keep: the play cannot be replayed
            kept.append(play)
            self._plays.append((key, _sealed(hide_secrets(_play_entry(play, written)))))
            for call in play.calls:
                if call.key not in self._calls:
                    self._calls[call.key] = _sealed(hide_secrets(_call_entry(call, written[call.key])))
        if len(self._plays) >= _PENDING:
            self.flush()
        return kept

    def flush(self) -> None:
        """Write the entries `store` keeps (a few hundred at a time: one transaction each, not one per play)."""
        plays, calls = self._plays, list(self._calls.items())
        self._plays, self._calls = [], {}
        if plays:
            self.cache.write_many([(_PUT.format("play_calls"), calls), (_PUT.format("plays"), plays)])

    def _written(self, keys: set[str]) -> dict[str, float]:
        """Call key -> when the call cache stored it, for the keys it holds."""
        out: dict[str, float] = {}
        for chunk in chunks(sorted(keys), _CHUNK):
            marks = ",".join("?" * len(chunk))
            out.update(self.cache.query(f"SELECT key, created FROM calls WHERE key IN ({marks})", chunk))
        return out

    # --- other values of a play (the answers table's column of a grand coalition's play) -------------------

    def versions(self, keys: list[str]) -> dict[str, str]:
        """Play key -> the key and digest of its whole stored entry: what other values of that very play (the
        same key, the same calls' replies, the same score) are stored under (`values`)."""
        return {k: f"{k}:{digest}" for k, (digest, _) in self._entries("plays", keys).items()}

    def values(self, kind: str, versions: list[str]) -> dict[str, list[float]]:
        """Play version (`versions`) -> the numbers of kind `kind` stored for it (whole entries only)."""
        out = {}
        for key, (_, data) in self._entries("plays", [f"{kind}:{v}" for v in versions]).items():
            if isinstance(data, list) and all(isinstance(x, int | float) for x in data):
                out[key.split(":", 1)[1]] = [float(x) for x in data]
        return out

    def store_values(self, kind: str, values: Iterable[tuple[str, Sequence[float]]]) -> None:
        """Keep numbers of kind `kind` for play versions (`versions`)."""
        rows = [(f"{kind}:{version}", _sealed(json.dumps([float(x) for x in v]))) for version, v in values]
        self.cache.write_many([(_PUT.format("plays"), rows)])

    # --- bootstrap intervals (`colab_graphs.audit.estimators.remembered_bootstraps`) ------------------------

    def intervals(self, key: str) -> tuple[np.ndarray, np.ndarray] | None:
        stored = self.values(f"bootstrap-{code_digest()[:16]}", [key]).get(key)
        if stored is None or len(stored) % 2:
            return None
        half = len(stored) // 2
        return np.array(stored[:half]), np.array(stored[half:])

    def keep_intervals(self, key: str, low: np.ndarray, high: np.ndarray) -> None:
        self.store_values(f"bootstrap-{code_digest()[:16]}", [(key, [*low.tolist(), *high.tolist()])])


def _play_entry(play: Play, written: dict[str, float]) -> str:
    line = json.dumps(play_fields(play, []), separators=(",", ":"), ensure_ascii=False, default=str)
    entry: dict[str, Any] = {
        "line": line.removesuffix("[]}"),  # the references are the log's own numbers, added when replayed
        "score": play.score,
        "calls": [[c.key, c.seat, written[c.key]] for c in play.calls],
    }
    mechanism = (play.model_extra or {}).get("mechanism")
    if mechanism:
        entry["mechanism"] = mechanism
    return json.dumps(entry, separators=(",", ":"), ensure_ascii=False)


def _call_entry(call: Call, created: float) -> str:
    record = call_fields(0, call)
    # The record as a rerun from the call cache writes it: served again, latency and attempts 0 (left out).
    for name in ("type", "n", "seat", "latency_s", "attempts"):
        record.pop(name, None)
    body = json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=str)[1:]
    return json.dumps(
        {
            "member": call.member,
            "p": call.usage.prompt_tokens,
            "c": call.usage.completion_tokens,
            "cost": call.cost_usd,
            "body": body,
            "created": created,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


def _refs(entry: tuple[str, Any]) -> list[Any]:
    calls = entry[1].get("calls") if isinstance(entry[1], dict) else None
    return [r for r in calls if isinstance(r, list) and r] if isinstance(calls, list) else []


def _served(
    example_id: str,
    job: Job,
    entry: tuple[str, Any],
    calls: dict[str, tuple[str, Any]],
    made: dict[tuple[str, str | None], ServedCall],
) -> ServedPlay | None:
    """The play `entry` holds, or None when it or one of its calls is not whole, not held, or not the reply
    the play got (the call cache's write of it is another). `made`: the calls built so far, by key and seat."""
    digest, data = entry
    try:
        uses = []
        for key, seat, created in data["calls"]:
            call = calls[key][1]
            if call["created"] != created:
                return None
            use = made.get((key, seat))
            if use is None:
                use = made[(key, seat)] = ServedCall(
                    key, seat, call["member"], int(call["p"]), int(call["c"]), call["cost"], call["body"]
                )
            uses.append(use)
        line, score = data["line"], data["score"]
        if not isinstance(line, str) or not (score is None or isinstance(score, int | float)):
            return None
        extra = {"mechanism": data["mechanism"]} if "mechanism" in data else {}
        return ServedPlay(example_id, job[0], job[1], score, line, uses, digest, extra)
    except (KeyError, TypeError, ValueError):
        return None


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
