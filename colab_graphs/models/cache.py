"""Persistent call cache: one SQLite file, keyed by the canonical request plus a sample index.

The key never includes connection settings or secrets, so the same request to the same model is shared across
runs, coalitions and restarts however the endpoint is reached. Entries are written as soon as a call succeeds
(WAL mode, one small transaction each), so a killed process loses no finished call.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

DEFAULT_FILENAME = "calls.sqlite"
MEMORY_ENTRIES = 50_000  # stored calls also kept in memory (a few hundred bytes to a few KB each)
LOCK_TIMEOUT_S = 30.0  # how long opening the cache waits on other processes holding the file


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
    """Key -> finished call result (completion, usage, token ids, cost) in one SQLite file."""

    def __init__(self, directory: str | os.PathLike[str] | None = None):
        self.directory = Path(directory).expanduser() if directory else default_cache_dir()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / DEFAULT_FILENAME
        self._lock = threading.Lock()
        self._recent: dict[str, str] = {}  # key -> stored response JSON, the most recent MEMORY_ENTRIES
        self._conn = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=LOCK_TIMEOUT_S
        )
        self._setup()

    def _setup(self) -> None:
        """WAL mode and the table, retried while another process does the same.

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
                self._conn.execute(
                    "CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, model TEXT, created REAL, "
                    "request TEXT, response TEXT)"
                )
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise sqlite3.OperationalError(f"call cache {self.path}: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def get(self, key: str) -> dict[str, Any] | None:
        blob = self._recent.get(key)
        if blob is None:
            with self._lock:
                row = self._conn.execute("SELECT response FROM calls WHERE key = ?", (key,)).fetchone()
            if row is None:
                return None
            blob = row[0]
            self._remember(key, blob)
        return json.loads(blob)

    def _remember(self, key: str, blob: str) -> None:
        """Keep the entry in memory too: an audit reads each stored call once per coalition that shares it.

        A SQLite read releases the GIL, and getting it back behind LiteLLM's worker threads cost a vote
        audit about 1 s of its main thread (BENCHMARKS.md). Entries never change once written, so a copy in
        memory is always right; the oldest are dropped beyond `MEMORY_ENTRIES`.
        """
        self._recent[key] = blob
        if len(self._recent) > MEMORY_ENTRIES:
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

    def put(self, key: str, model: str, request: dict[str, Any], response: dict[str, Any]) -> None:
        blob = json.dumps(response)
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO calls (key, model, created, request, response) VALUES (?, ?, ?, ?, ?)",
                (key, model, time.time(), json.dumps(request, default=str), blob),
            )
        self._remember(key, blob)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            total = self._conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
            by_model = dict(self._conn.execute("SELECT model, COUNT(*) FROM calls GROUP BY model").fetchall())
        size = sum(p.stat().st_size for p in self.directory.glob(DEFAULT_FILENAME + "*") if p.exists())
        return {"path": str(self.path), "entries": total, "bytes": size, "by_model": by_model}

    def clear(self, model: str | None = None) -> int:
        with self._lock:
            if model is None:
                cur = self._conn.execute("DELETE FROM calls")
            else:
                cur = self._conn.execute("DELETE FROM calls WHERE model = ?", (model,))
            self._conn.execute("VACUUM")
            self._recent.clear()
        return cur.rowcount

    def close(self) -> None:
        with self._lock:
            self._conn.close()
