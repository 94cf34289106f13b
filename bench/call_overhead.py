"""Client CPU the call path adds per call, over a bare `litellm.acompletion` loop, against one local server.

Both loops send the same number of distinct chat requests at the same concurrency to a scripted
OpenAI-compatible server running in a separate process (so its CPU is not counted), on one event loop:

- `bare`: `litellm.acompletion(...)` behind an `asyncio.Semaphore`;
- `client`: `ModelClient(cache=None).complete(...)` (single-flight, limit, retries, trace record);
- `client+cache miss`: the same with a fresh SQLite `CallCache` (lookup, then write, per call);
- `cache hit`: the same requests again, served from the cache (no HTTP at all).

Process CPU (`time.process_time`) and wall time are measured per mode; the added CPU per call is the mode's
CPU minus the bare loop's, divided by the number of calls. Target: under 2 ms.

Usage:
    python bench/call_overhead.py [--calls 2000] [--concurrency 32] [--chunks 10] [--json out.json]
    python bench/call_overhead.py --profile client   # cProfile one mode, top functions by own time
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import date
from pathlib import Path
from typing import Any

import colab_graphs._env  # noqa: F401  (offline settings before litellm loads)
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool

REPLY = "The answer is 4."


def start_server(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    """The scripted server in its own process; returns (process, base_url)."""
    members = tmp / "members.json"
    members.write_text(json.dumps({"a": REPLY}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "colab_graphs.testing.server", "--port", "0", "--members", str(members)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "serving ['a'] at http://127.0.0.1:PORT/v1"
    if " at " not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, line.rsplit(" at ", 1)[1].strip()


def messages(i: int, tag: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"[{tag}] question {i}: what is 2 + 2?"}]


async def bounded(n: int, concurrency: int, call: Callable[[int], Awaitable[Any]]) -> None:
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with limit:
            await call(i)

    await asyncio.gather(*(one(i) for i in range(n)))


def measure(loop: asyncio.AbstractEventLoop, work: Awaitable[None]) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) to run `work` on `loop`."""
    cpu, wall = time.process_time(), time.perf_counter()
    loop.run_until_complete(work)
    return time.process_time() - cpu, time.perf_counter() - wall


def run(args: argparse.Namespace) -> dict[str, Any]:
    import litellm

    litellm.suppress_debug_info = True
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        proc, base_url = start_server(tmp)
        try:
            conn = {"model": "openai/a", "api_base": base_url, "api_key": "sk-bench"}
            member = Pool.from_dict({"a": conn})["a"]
            n, conc = args.calls, args.concurrency

            def bare(tag: str, count: int) -> Awaitable[None]:
                async def call(i: int) -> None:
                    r = await litellm.acompletion(
                        **conn, messages=messages(i, tag), max_retries=0, num_retries=0
                    )
                    assert r.choices[0].message.content == REPLY

                return bounded(count, conc, call)

            def via(client: ModelClient, tag: str, count: int) -> Awaitable[None]:
                async def call(i: int) -> None:
                    r = await client.complete(member, messages(i, tag))
                    assert r.text == REPLY

                return bounded(count, conc, call)

            # Warm up both paths (imports, connection pools, litellm's lazy setup) before measuring.
            loop.run_until_complete(bare("warm", 64))
            loop.run_until_complete(via(ModelClient(None, max_concurrency=conc), "warm-client", 64))

            # Modes take turns chunk by chunk, so drift in machine load (shared cores) hits them alike.
            modes: dict[str, list[float]] = {m: [0.0, 0.0] for m in ("bare", "client", "client+cache miss")}
            per_chunk: dict[str, list[float]] = {}  # CPU seconds per call, chunk by chunk
            client = ModelClient(None, max_concurrency=conc)
            cache = CallCache(tmp / "cache")
            cached_client = ModelClient(cache, max_concurrency=conc)
            profiler = cProfile.Profile() if args.profile else None
            size = -(-n // args.chunks)
            for c in range(args.chunks):
                count = min(size, n - c * size)
                runs = {
                    "bare": bare(f"bare{c}", count),
                    "client": via(client, f"client{c}", count),
                    "client+cache miss": via(cached_client, f"cached{c}", count),
                }
                for mode, work in runs.items():
                    if profiler and mode == args.profile:
                        profiler.enable()
                    cpu, wall = measure(loop, work)
                    if profiler and mode == args.profile:
                        profiler.disable()
                    modes[mode][0] += cpu
                    per_chunk.setdefault(mode, []).append(cpu / count)
                    modes[mode][1] += wall
            hits = [0.0, 0.0]
            for c in range(args.chunks):
                count = min(size, n - c * size)
                cpu, wall = measure(loop, via(cached_client, f"cached{c}", count))
                hits[0] += cpu
                hits[1] += wall
            modes["cache hit"] = hits
            assert cached_client.stats.made == n and cached_client.stats.cached == n
            cache.close()
            if profiler:
                pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    loop.close()

    bare_cpu = modes["bare"][0]
    rows = {}
    for mode in modes:
        cpu, wall = modes[mode]
        rows[mode] = {
            "cpu_ms_per_call": round(1000 * cpu / n, 3),
            "wall_s": round(wall, 3),
            "calls_per_s": round(n / wall, 1),
            "added_cpu_ms_per_call": None if mode == "bare" else round(1000 * (cpu - bare_cpu) / n, 3),
            # Median over chunks of (this mode - bare) in the same chunk: robust to load spikes.
            "added_cpu_ms_per_call_median": None
            if mode not in per_chunk or mode == "bare"
            else round(
                1000
                * statistics.median(m - b for m, b in zip(per_chunk[mode], per_chunk["bare"], strict=True)),
                3,
            ),
            "cpu_ratio_to_bare": round(cpu / bare_cpu, 3),
        }
    return {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "litellm": litellm.__version__ if hasattr(litellm, "__version__") else _version("litellm"),
        "calls": n,
        "concurrency": conc,
        "chunks": args.chunks,
        "modes": rows,
    }


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--chunks", type=int, default=10, help="modes alternate in this many chunks")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--profile", choices=["bare", "client", "client+cache miss"], help="cProfile one mode"
    )
    args = parser.parse_args(argv)
    report = run(args)
    print(
        f"{report['calls']} calls at concurrency {report['concurrency']} on {report['machine']}, {report['date']}"
    )
    print(f"{'mode':<20}{'CPU ms/call':>12}{'added ms':>10}{'ratio':>8}{'wall s':>9}{'calls/s':>9}")
    for mode, row in report["modes"].items():
        added = "-" if row["added_cpu_ms_per_call"] is None else f"{row['added_cpu_ms_per_call']:.2f}"
        print(
            f"{mode:<20}{row['cpu_ms_per_call']:>12.2f}{added:>10}{row['cpu_ratio_to_bare']:>8.2f}"
            f"{row['wall_s']:>9.2f}{row['calls_per_s']:>9.1f}"
        )
    for mode in ("client", "client+cache miss"):
        row = report["modes"][mode]
        print(
            f"added CPU per call, {mode}: {row['added_cpu_ms_per_call']:.2f} ms overall, "
            f"{row['added_cpu_ms_per_call_median']:.2f} ms median over chunks (target < 2 ms)"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
