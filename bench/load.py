"""Load: 10,000 calls through `ModelClient.complete` at concurrency 64; memory stays flat, no fd leak.

Run: ``python bench/load.py [--calls 10000] [--concurrency 64] [--latency 0.0] [--no-cache]``

A scripted OpenAI-compatible server runs in its own process. `--concurrency` worker tasks share one
`ModelClient` (with a call cache in a temporary folder, as the CLI has) and each makes distinct requests until
`--calls` are done, so every call goes the whole way: cache miss, single-flight, concurrency limit, the direct
lane (LiteLLM with `COLAB_GRAPHS_DIRECT=0`), HTTP, cache write. The client process's resident memory (from /proc) and open file descriptors are sampled
every 1,000 calls; it reports peak RSS (`resource.getrusage`), RSS growth after the warm-up (the first 1,000
calls), and the fds open before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import colab_graphs._env  # noqa: F401  (offline settings before litellm loads)
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool

WARM_UP = 1000
SAMPLE_EVERY = 1000


def rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def start_server(latency_s: float, workdir: Path) -> tuple[subprocess.Popen, str]:
    members = workdir / "members.json"
    members.write_text(json.dumps({"solver": {"script": "arithmetic_solver", "args": {"accuracy": 0.8}}}))
    command = [sys.executable, "-m", "colab_graphs.testing.server", "--port", "0", "--members", str(members)]
    server = subprocess.Popen([*command, "--latency", str(latency_s)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    line = server.stdout.readline()  # "serving [...] at http://127.0.0.1:PORT/v1"
    if " at " not in line:
        server.kill()
        raise RuntimeError(f"the scripted server did not start: {line!r}")
    return server, line.rsplit(" at ", 1)[1].strip()


async def load(client: ModelClient, pool: Pool, calls: int, concurrency: int) -> list[dict[str, float]]:
    member = pool["solver"]
    next_call = completed = 0
    samples: list[dict[str, float]] = []
    started = time.perf_counter()

    async def worker() -> None:
        nonlocal next_call, completed
        while next_call < calls:
            i = next_call
            next_call += 1
            result = await client.complete(member, [{"role": "user", "content": f"What is {i} + {i % 97}?"}])
            assert not result.cached, "every request is distinct: none may come from the cache"
            completed += 1
            if completed % SAMPLE_EVERY == 0:
                samples.append(
                    {
                        "calls": completed,
                        "rss_mib": round(rss_mib(), 1),
                        "fds": open_fds(),
                        "elapsed_s": round(time.perf_counter() - started, 1),
                    }
                )

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds the server waits per reply")
    parser.add_argument("--no-cache", action="store_true", help="no call cache (single-flight only)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="load-bench-") as tmp:
        server, base_url = start_server(args.latency, Path(tmp))
        try:
            pool = Pool.from_dict(
                {"solver": {"model": "openai/solver", "api_base": base_url, "api_key": "sk-load"}}
            )
            fds_before, rss_before = open_fds(), rss_mib()
            cache = None if args.no_cache else CallCache(Path(tmp) / "cache")
            client = ModelClient(cache, max_concurrency=args.concurrency, backoff_s=0.05)
            started = time.perf_counter()
            samples = asyncio.run(load(client, pool, args.calls, args.concurrency))
            wall = time.perf_counter() - started
            if cache is not None:
                cache.close()
            gc.collect()
            fds_after, rss_after = open_fds(), rss_mib()
        finally:
            server.terminate()
            server.wait(10)

    warm = next(s for s in samples if s["calls"] >= WARM_UP)
    figures = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "calls": client.stats.made,
        "failed": client.stats.failed,
        "attempts": client.stats.attempts,
        "concurrency": args.concurrency,
        "cache": not args.no_cache,
        "wall_s": round(wall, 1),
        "calls_per_s": round(client.stats.made / wall, 1),
        "rss_before_mib": round(rss_before, 1),
        "rss_after_warm_up_mib": warm["rss_mib"],
        "rss_end_mib": samples[-1]["rss_mib"],
        "rss_growth_after_warm_up_mib": round(samples[-1]["rss_mib"] - warm["rss_mib"], 1),
        "rss_after_close_mib": round(rss_after, 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "fds_before": fds_before,
        "fds_during_max": max(s["fds"] for s in samples),
        "fds_after": fds_after,
        "samples": samples,
    }
    for s in samples:
        print(f"{s['calls']:>6} calls  {s['elapsed_s']:>6.1f}s  RSS {s['rss_mib']:7.1f} MiB  fds {s['fds']}")
    print(json.dumps({k: v for k, v in figures.items() if k != "samples"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
