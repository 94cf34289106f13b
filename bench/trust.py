"""What the trust checks cost: the call cache's open-time corruption check, and the pre-flight's time to an error.

- `cache-open`: a cache file of about `--cache-mb` MB (rows of ~2 KB), opened with SQLite's `quick_check` and
  without it (`QUICK_CHECK_MAX_BYTES` set to 0), best of `--repeat`; the ratio is what the check adds to opening.
- `dead-endpoint`: a leave-one-out audit of a majority vote over two members, one served by the scripted
  server, one at an address where nothing listens; the seconds from the start of `play_audit` (LiteLLM imported
  before the clock starts) to its "every example failed" error, with the pre-flight and without it (the
  client's own retries, 6 with backoff, as the CLI's default).

Usage:
    python bench/trust.py [--cache-mb 250] [--repeat 3] [--skip-dead-endpoint]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import tempfile
import time
from datetime import date
from pathlib import Path

import colab_graphs._env  # noqa: F401  (offline settings before litellm loads)
from colab_graphs.models import cache as cache_module
from colab_graphs.models.cache import CallCache


def fill_cache(directory: Path, megabytes: int) -> int:
    """A cache of about `megabytes` MB; returns its size in bytes."""
    cache = CallCache(directory)
    request = json.dumps({"messages": [{"role": "user", "content": "q" * 500}], "identity": "endpoint:x"})
    response = json.dumps({"text": "x" * 1500, "usage": {"prompt_tokens": 50, "completion_tokens": 300}})
    rows = megabytes * 1024 * 1024 // 4400  # ~4.4 KB a row on disk, index included
    with cache._lock:
        cache._conn.execute("BEGIN")
        cache._conn.executemany(
            "INSERT INTO calls VALUES (?, 'm', 0, ?, ?, 'a', 'endpoint:x')",
            ((f"{i:064d}", request, response) for i in range(rows)),
        )
        cache._conn.execute("COMMIT")
    cache.close()
    return (directory / cache_module.DEFAULT_FILENAME).stat().st_size


def open_seconds(directory: Path, check: bool, repeat: int) -> float:
    cache_module.QUICK_CHECK_MAX_BYTES = 1 << 40 if check else 0
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        CallCache(directory).close()
        best = min(best, time.perf_counter() - started)
    return best


def dead_endpoint_seconds(preflight: bool) -> tuple[float, str]:
    import litellm  # noqa: F401  (its import is not what is measured)

    from colab_graphs.audit.run import AuditError, play_audit
    from colab_graphs.models.client import ModelClient
    from colab_graphs.pool import Pool
    from colab_graphs.protocol_registry import build_protocol
    from colab_graphs.tasks.example import Example
    from colab_graphs.testing import ScriptedServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    examples = [Example(id=f"q{i}", input=f"What is {i} + 1?", answer=str(i + 1)) for i in range(2)]
    with ScriptedServer({"ada": "The answer is 1."}) as live, tempfile.TemporaryDirectory() as tmp:
        pool = Pool.from_dict(
            {
                "ada": {"model": "openai/ada", "api_base": live.base_url, "api_key": "sk-test"},
                "bob": {"model": "openai/bob", "api_base": dead, "api_key": "sk-test"},
            }
        )
        client = ModelClient(CallCache(tmp), retries=6, preflight=preflight)
        spec = build_protocol("majority_vote", pool.names)
        started = time.perf_counter()
        try:
            asyncio.run(play_audit(spec, pool, examples, client=client, out=Path(tmp) / "out", plots=False))
        except AuditError as err:
            return time.perf_counter() - started, str(err)
    raise RuntimeError("the audit did not fail")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache-mb", type=int, default=250)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-dead-endpoint", action="store_true")
    args = parser.parse_args()
    print(f"# {date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        size = fill_cache(Path(tmp), args.cache_mb)
        checked = open_seconds(Path(tmp), True, args.repeat)
        plain = open_seconds(Path(tmp), False, args.repeat)
    print(f"cache open, {size / 1e6:.0f} MB: {checked * 1000:.0f} ms with quick_check, {plain * 1000:.1f} ms "
          f"without ({checked / plain:.0f}x)")  # fmt: skip
    if not args.skip_dead_endpoint:
        for preflight in (True, False):
            seconds, error = dead_endpoint_seconds(preflight)
            print(f"dead endpoint, preflight={preflight}: {seconds:.1f} s to the error: {error[:120]}")


if __name__ == "__main__":
    main()
