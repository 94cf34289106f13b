"""Persistent call cache: one SQLite file, keyed by the canonical request, the answering model's identity and a
sample index.

The key never includes secrets or how an endpoint is reached (keys, timeouts, headers), so the same request to
the same model is shared across runs, coalitions and restarts; it does include which model answers (see
`colab_graphs.models.identity`), so a reply is never served for another endpoint that happens to use the same
model name. Entries are written as soon as a call succeeds (WAL mode, one small transaction each), so a killed
process loses no finished call. Each row also records the member that wrote it, for `colab-graphs cache list`
and `cache drop --member`.

A file this package cannot trust is never used silently: a corrupt one (not a database, truncated, a damaged
page) is found when it is opened (SQLite's `quick_check`, for files up to `QUICK_CHECK_MAX_BYTES`), renamed to
``calls.sqlite.corrupt-<time>`` and replaced by a fresh one, with a warning naming both; a stored reply that is
not JSON is a miss (the call is made again and overwrites it), with a warning naming the file; entries written
before the key held the model's identity (schema 0) are dropped with a warning saying why, since nothing tells
which endpoint answered them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from colab_graphs.redaction import hide_secrets
from colab_graphs.trace import Reply

logger = logging.getLogger("colab_graphs")

DEFAULT_FILENAME = "calls.sqlite"
MEMORY_ENTRIES = 50_000  # stored calls also kept in memory (a few hundred bytes to a few KB each)
LOCK_TIMEOUT_S = 30.0  # how long opening the cache waits on other processes holding the file
SCHEMA_VERSION = 1  # PRAGMA user_version; 0: before rows recorded the answering model's identity
QUICK_CHECK_MAX_BYTES = 512 * 1024 * 1024  # larger files skip the open-time check (it reads every page)
_COLUMNS = (
    "key TEXT PRIMARY KEY, model TEXT, created REAL, request TEXT, response TEXT, member TEXT, identity TEXT"
)


# Tables other parts keep in this file (`colab_graphs.audit.play_cache`): emptied with the calls by `clear`.
_SIDE_TABLES = ("plays", "play_calls")

_PRICE_COLUMNS = (
    "model TEXT, source TEXT, prompt REAL, completion REAL, known INTEGER, PRIMARY KEY (model, source)"
)


class CacheError(RuntimeError):
    """A cache file this version cannot use; the message names the file and what to do."""


def default_cache_dir() -> Path:
    """`$COLAB_GRAPHS_CACHE_DIR`, else `$XDG_CACHE_HOME/colab-graphs`, else `~/.cache/colab-graphs`."""
    env = os.environ.get("COLAB_GRAPHS_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "colab-graphs"


def request_key(request: dict[str, Any]) -> str:
    """Stable hash of a canonical request (sorted keys, compact JSON)."""
    blob = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class CallCache:
    """Key -> finished call result (completion, usage, token ids, cost) in one SQLite file.

    Args:
        directory: the folder of the file (default: `default_cache_dir`).
        memory_entries: how many stored replies are also kept in memory (the most recent; `_remember`);
            default `MEMORY_ENTRIES`.

    Raises:
        CacheError: the file was written by a newer colab-graphs, or cannot be opened at all.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, memory_entries: int | None = None):
        self.directory = Path(directory).expanduser() if directory else default_cache_dir()
        if self.directory.exists() and not self.directory.is_dir():
            raise CacheError(f"call cache directory {self.directory} is a file; pass a folder as --cache-dir")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / DEFAULT_FILENAME
        self._lock = threading.Lock()
        self.memory_entries = MEMORY_ENTRIES if memory_entries is None else memory_entries
        self._recent: dict[str, str] = {}  # key -> stored response JSON, the most recent `memory_entries`
        self._warned_bad_rows = False
        self._conn = self._open_checked()
        self._setup()

    # --- opening -------------------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=LOCK_TIMEOUT_S
        )

    def _open_checked(self) -> sqlite3.Connection:
        """A connection to a file that passed the corruption check (a corrupt one is set aside first)."""
        conn = self._connect()
        problem = self._problem(conn)
        if problem is None:
            return conn
        conn.close()
        # One process sets the file aside; the others, waiting here, find the fresh file it started.
        with open(self.path.with_name(f".{self.path.name}.lock"), "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            conn = self._connect()
            problem = self._problem(conn)
            if problem is None:
                return conn
            conn.close()
            aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
            n = 1
            while aside.exists():  # set aside twice within a second: keep both
                n += 1
                aside = aside.with_name(f"{aside.name.split('~')[0]}~{n}")
            for suffix in ("", "-wal", "-shm"):
                source = Path(f"{self.path}{suffix}")
                if source.exists():
                    os.replace(source, Path(f"{aside}{suffix}"))
            logger.warning(
                "call cache %s is corrupt (%s): set aside as %s and a fresh cache started; calls it held will be "
                "made again",
                self.path,
                problem,
                aside,
            )
            return self._connect()

    def _problem(self, conn: sqlite3.Connection) -> str | None:
        """Why the file cannot be trusted, or None. Busy files are not corrupt: those errors pass through."""
        if not self.path.exists():
            return None
        try:
            if self.path.stat().st_size <= QUICK_CHECK_MAX_BYTES:
                rows = conn.execute("PRAGMA quick_check(5)").fetchall()
                if [r[0] for r in rows] != ["ok"]:
                    return "; ".join(str(r[0]) for r in rows)
            else:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return None
            return str(exc)
        return None

    def _setup(self) -> None:
        """WAL mode, the table and the schema version, retried while another process does the same.

        Processes that open one new cache file at once (the ranks of `accelerate launch`, study workers on one
        machine, two CLI runs) race to switch it to WAL; SQLite answers the loser "database is locked" at once,
        without waiting on its busy timeout (18 of 120 opens failed so in a test of 60 pairs).
        """
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        delay = 0.01
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("PRAGMA synchronous=NORMAL")
                self._migrate()
                # (A table older versions never read: the file stays theirs to open.)
                self._conn.execute(f"CREATE TABLE IF NOT EXISTS prices ({_PRICE_COLUMNS})")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise CacheError(f"call cache {self.path}: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            except sqlite3.DatabaseError as exc:
                raise CacheError(
                    f"call cache {self.path}: {exc}; move the file away (or delete it) to start a fresh cache"
                ) from exc

    def _migrate(self) -> None:
        """Create the table, or bring a file of schema 0 to this schema (in one transaction)."""
        conn = self._conn
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise CacheError(
                f"call cache {self.path} has schema {version}, written by a newer colab-graphs (this one reads "
                f"{SCHEMA_VERSION}); upgrade colab-graphs, or pass another --cache-dir"
            )
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                conn.execute("COMMIT")  # another process migrated it while this one waited
                return
            old = conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'calls'").fetchone()[0]
            dropped = conn.execute("SELECT count(*) FROM calls").fetchone()[0] if old else 0
            conn.execute("DROP TABLE IF EXISTS calls")
            conn.execute(f"CREATE TABLE calls ({_COLUMNS})")
            conn.execute("CREATE INDEX calls_member ON calls (member)")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if dropped:
            logger.warning(
                "call cache %s: dropped %d entries written by an older colab-graphs: their keys do not say which "
                "endpoint answered, so serving them could answer for another model; those calls will be made again",
                self.path,
                dropped,
            )

    # --- entries -------------------------------------------------------------------------------------------

    def get(self, key: str) -> dict[str, Any] | None:
        blob = self._recent.get(key)
        if blob is None:
            try:
                with self._lock:
                    row = self._conn.execute("SELECT response FROM calls WHERE key = ?", (key,)).fetchone()
            except sqlite3.DatabaseError as exc:
                self._bad_row(key, f"cannot be read ({exc})")
                return None
            if row is None:
                return None
            blob = row[0]
            self._remember(key, blob)
        try:
            entry: dict[str, Any] = json.loads(blob)
            return entry
        except (TypeError, ValueError) as exc:
            self._recent.pop(key, None)
            self._bad_row(key, f"is not JSON ({exc})")
            return None

    def reply(self, key: str) -> Reply | None:
        """The stored reply for `key` (see `Reply.cache_entry`), or None: absent, or not a reply (a miss)."""
        entry = self.get(key)
        if entry is None:
            return None
        try:
            return Reply.from_cache_entry(entry)
        except (KeyError, TypeError, ValidationError) as exc:
            self._recent.pop(key, None)
            self._bad_row(key, f"is not a reply ({type(exc).__name__}: {exc})")
            return None

    def _bad_row(self, key: str, why: str) -> None:
        """A stored reply that cannot be used is a miss: the call is made again (and its row overwritten)."""
        logger.warning(
            "call cache %s: the entry %s %s; treated as a miss, the call is made again%s",
            self.path,
            key[:16],
            why,
            "" if not self._warned_bad_rows else " (further bad entries are not reported)",
        )
        self._warned_bad_rows = True

    def _remember(self, key: str, blob: str) -> None:
        """Keep the entry in memory too: an audit reads each stored call once per coalition that shares it.

        A SQLite read releases the GIL, and getting it back behind LiteLLM's worker threads cost a vote
        audit about 1 s of its main thread (BENCHMARKS.md). Entries never change once written, so a copy in
        memory is always right; the oldest are dropped beyond `memory_entries`.
        """
        self._recent[key] = blob
        if len(self._recent) > self.memory_entries:
            del self._recent[next(iter(self._recent))]

    def contains(self, keys: set[str]) -> set[str]:
        """Which of `keys` the cache holds (an audit's plan counts them as free)."""
        found = {k for k in keys if k in self._recent}
        rest = sorted(keys - found)
        with self._lock:
            for start in range(0, len(rest), 500):  # SQLite limits the parameters of one statement
                chunk = rest[start : start + 500]
                marks = ",".join("?" * len(chunk))
                found.update(
                    k for (k,) in self._conn.execute(f"SELECT key FROM calls WHERE key IN ({marks})", chunk)
                )
        return found

    def written_since(self, keys: set[str], since: float) -> set[str]:
        """Which of `keys` were stored at or after time `since` (seconds since the epoch)."""
        with self._lock:
            rows = self._conn.execute("SELECT key FROM calls WHERE created >= ?", (since,)).fetchall()
        return {k for (k,) in rows if k in keys}

    def put(
        self,
        key: str,
        model: str,
        request: dict[str, Any],
        response: dict[str, Any],
        member: str | None = None,
    ) -> None:
        """Store a finished call; `request` is kept (secrets redacted) for inspection, `member` for `list`."""
        blob = json.dumps(response)
        stored_request = hide_secrets(json.dumps(request, default=str))
        identity = hide_secrets(str(request.get("identity") or ""))
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO calls (key, model, created, request, response, member, identity) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, model, time.time(), stored_request, blob, member, identity),
            )
        self._remember(key, blob)

    def price(self, model: str, source: str) -> tuple[bool, tuple[float, float] | None]:
        """(True, (prompt, completion) USD per token, or None for no price) when `source` priced `model`
        before (`put_price`), else (False, None)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT prompt, completion, known FROM prices WHERE model = ? AND source = ?", (model, source)
            ).fetchone()
        if row is None:
            return False, None
        return True, (row[0], row[1]) if row[2] else None

    def put_price(self, model: str, source: str, price: tuple[float, float] | None) -> None:
        """Remember what `source` (a price map, e.g. LiteLLM's of one version) says `model` costs per token."""
        prompt, completion = price if price is not None else (None, None)
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO prices (model, source, prompt, completion, known) VALUES (?, ?, ?, ?, ?)",
                (model, source, prompt, completion, int(price is not None)),
            )

    def entries(self) -> list[dict[str, Any]]:
        """One row per (member, model, identity): how many entries, and when the last was written."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT member, model, identity, COUNT(*), MAX(created) FROM calls "
                "GROUP BY member, model, identity ORDER BY member, model, identity"
            ).fetchall()
        return [
            {"member": m, "model": model, "identity": ident, "entries": n, "last_written": last}
            for m, model, ident, n, last in rows
        ]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            total = self._conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
            by_model = dict(self._conn.execute("SELECT model, COUNT(*) FROM calls GROUP BY model").fetchall())
            by_member = dict(
                self._conn.execute("SELECT member, COUNT(*) FROM calls GROUP BY member").fetchall()
            )
        files = [Path(f"{self.path}{suffix}") for suffix in ("", "-wal", "-shm")]
        size = sum(p.stat().st_size for p in files if p.is_file())
        return {
            "path": str(self.path),
            "entries": total,
            "bytes": size,
            "by_model": by_model,
            "by_member": by_member,
        }

    def drop(
        self, *, member: str | None = None, model: str | None = None, identity: str | None = None
    ) -> int:
        """Delete the entries matching every condition given (at least one); returns how many went."""
        conditions = {"member": member, "model": model, "identity": identity}
        given = {k: v for k, v in conditions.items() if v is not None}
        if not given:
            raise ValueError("drop needs a member, a model or an identity (clear() deletes everything)")
        where = " AND ".join(f"{k} = ?" for k in given)
        with self._lock:
            cur = self._conn.execute(f"DELETE FROM calls WHERE {where}", tuple(given.values()))
            self._conn.execute("VACUUM")
            self._recent.clear()
        return cur.rowcount

    def clear(self, model: str | None = None) -> int:
        if model is not None:
            return self.drop(model=model)
        with self._lock:
            cur = self._conn.execute("DELETE FROM calls")
            for table in (
                _SIDE_TABLES
            ):  # plays replayed from calls that are gone (see `colab_graphs.audit.play_cache`)
                self._conn.execute(f"DROP TABLE IF EXISTS {table}")
            self._conn.execute("VACUUM")
            self._recent.clear()
        return cur.rowcount

    def query(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of one statement on this cache's file (the play cache's tables live beside the calls)."""
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def write_many(self, statements: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        """Each statement over its rows, all in one transaction (everything stored, or nothing)."""
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                for sql, rows in statements:
                    self._conn.executemany(sql, rows)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._conn.close()
