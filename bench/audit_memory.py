"""Audit memory and cached reruns: peak RSS, wall and CPU of an exact audit at growing numbers of calls.

Run: ``python bench/audit_memory.py [--calls 3000,30000] [--concurrency 32] [--json PATH]
[--memory-entries N] [--profile DIR]``

A scripted OpenAI-compatible server answers at once (zero latency) in its own process. For each `--calls` N,
an exact-Shapley audit of a majority vote over five scripted members (`arithmetic_solver`, each member also
alone) is played on N / 5 distinct arithmetic questions, writing its report and log to a folder, as
`colab-graphs audit` does: N distinct calls. Each audit runs in a child process of its own (a fresh
interpreter, so its peak resident memory is its own: `ru_maxrss`; `audit_peak_rss_mb` is the peak from the
moment the questions are drawn, the kernel's `VmHWM` reset then) and what its cyclic garbage collector took
(`gc`: collections per generation, their CPU seconds in all and in full ones), twice: first with an empty
call cache, then again in a new folder from the now-full cache (0 requests). The report's values of the rerun must equal
the first run's. Each line gives the child's peak RSS, wall time and CPU time (user + system): on a shared
machine the wall time is inflated by others' load, the CPU time much less.

`--memory-entries N` keeps N call cache entries in memory instead of the product's 50,000
(`CallCache(memory_entries=...)`): with N well below the calls, a small audit meets the regime of a big one,
its cache past the in-memory copy. `--profile DIR` runs each rerun under cProfile and writes
`DIR/rerun-<calls>.prof`, timed in CPU seconds (its CPU figures then include the profiler's overhead).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from audit_efficiency import server_cpu_s, start_server

MEMBERS = [f"m{i + 1}" for i in range(5)]
# What differs between two runs of one audit: when and how long, and (a rerun from the cache) the calls' split
# between made and cached, with the tokens and price of the calls made. Everything else must be identical.
VOLATILE = ("version", "created_at", "wall_s")
SPENT = ("calls", "tokens", "usage", "cost_usd", "cost_saved_usd", "per_coalition")


def child(args: argparse.Namespace) -> None:
    """One audit in this process; prints a JSON line: peak RSS, wall, CPU, calls and the report's values."""
    import colab_graphs._env  # noqa: F401  (offline settings before litellm loads)
    from colab_graphs.audit.play_cache import code_digest
    from colab_graphs.audit.plays import LoggedPlays
    from colab_graphs.audit.run import play_audit
    from colab_graphs.models.cache import CallCache
    from colab_graphs.models.client import ModelClient
    from colab_graphs.pool import Pool
    from colab_graphs.protocol_registry import build_protocol

    pool = Pool.from_dict(
        {m: {"model": f"openai/{m}", "api_base": args.base_url, "api_key": "sk-bench"} for m in MEMBERS}
    )
    examples = questions(args.child // len(MEMBERS))
    spec = build_protocol("majority_vote", MEMBERS)
    # The audit's own peak apart from drawing the questions (60,000 distinct ones take millions of draws: 1.8 GB
    # and 70 s before a 300,000-call audit starts): the kernel's high-water mark reset here, read after.
    gc.collect()
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    # The play cache's key holds a digest of the package's files, taken once per process (here, before the
    # audit): a file changed between the first run and the rerun (a merge, an edit) makes every play a miss and
    # the rerun an audit from the call cache (0 requests still, at about half the first run's CPU).
    code = code_digest()
    plays = {"played": 0, "replayed": 0}
    record, replay = LoggedPlays.record, LoggedPlays.replay

    def counted(kind: str, method: Any) -> Any:
        def wrapper(self: Any, batch: Any) -> Any:
            plays[kind] += len(batch)
            return method(self, batch)

        return wrapper

    LoggedPlays.record = counted("played", record)  # type: ignore[method-assign]
    LoggedPlays.replay = counted("replayed", replay)  # type: ignore[method-assign]
    cache = CallCache(args.cache, **({"memory_entries": args.memory_entries} if args.memory_entries else {}))
    client = ModelClient(cache, max_concurrency=args.concurrency)
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.process_time)  # CPU: others' load left out
        profiler.enable()
    collector = collector_timer()
    wall, cpu = time.perf_counter(), time.process_time()
    report = asyncio.run(
        play_audit(spec, pool, examples, client=client, method="exact", out=args.out, plots=False)
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    gc.callbacks.remove(collector)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    cache.close()
    data = {k: v for k, v in report.model_dump(mode="json").items() if k not in VOLATILE}
    values = {k: v for k, v in data.items() if k not in SPENT}
    # A coalition's calls and tokens are every call it needed, made or cached; its price is of those made.
    values["per_coalition"] = [{k: v for k, v in c.items() if k != "cost_usd"} for c in data["per_coalition"]]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    collected = {k: round(v, 2) if isinstance(v, float) else v for k, v in collector.stats.items()}
    print(json.dumps({"peak_rss_mb": round(peak_mb, 1), "audit_peak_rss_mb": _high_water_mb(), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                      "calls": data["calls"], "plays": plays, "gc": collected, "code_sha256": code,
                      "code_changed_during_run": code_digest.__wrapped__() != code,
                      "values": json.dumps(values, sort_keys=True), "report": data}))  # fmt: skip


def collector_timer() -> Any:
    """A `gc.callbacks` entry (registered) that counts the cyclic collector's collections per generation and
    times them in CPU seconds (`.stats`): what a run spends in the collector."""
    stats: dict[str, Any] = {"collections": [0, 0, 0], "cpu_s": 0.0, "full_cpu_s": 0.0}
    began = [0.0]

    def timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.process_time()
            return
        spent = time.process_time() - began[0]
        stats["collections"][info["generation"]] += 1
        stats["cpu_s"] += spent
        if info["generation"] == 2:
            stats["full_cpu_s"] += spent

    timer.stats = stats  # type: ignore[attr-defined]
    gc.callbacks.append(timer)
    return timer


def questions(count: int) -> list[Any]:
    """`count` distinct arithmetic questions: the built-in task's (drawn until that many differ, as before),
    then, past the few tens of thousands it can make, sums of three-digit numbers (no built-in question is one;
    the scripted members solve any `a + b`)."""
    from colab_graphs.tasks.builtin import builtin_task
    from colab_graphs.tasks.example import Example

    drawn = count
    while True:  # the generator repeats itself: draw more until `count` questions differ, or 8x as many drawn
        examples = list({e.input: e for e in builtin_task("arithmetic", drawn, seed=0)}.values())
        if len(examples) >= count:
            return examples[:count]
        if drawn >= 8 * count:
            break
        drawn *= 2
    more = range(count - len(examples))
    return examples + [
        Example(
            id=f"sum-{i}",
            input=f"What is {100 + i // 900} + {100 + i % 900}?",
            answer=str(200 + i // 900 + i % 900),
        )
        for i in more
    ]


def _high_water_mb() -> float | None:
    """The process's peak resident memory since the last reset (`VmHWM`), in MB; None where not Linux."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


def run_child(
    calls: int,
    base_url: str,
    cache: Path,
    out: Path,
    concurrency: int,
    memory_entries: int | None = None,
    profile: Path | None = None,
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", str(calls), "--base-url", base_url, "--cache", str(cache)]
    command += ["--out", str(out), "--concurrency", str(concurrency)]
    if memory_entries:
        command += ["--memory-entries", str(memory_entries)]
    if profile:
        command += ["--profile", str(profile)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"the audit of {calls} calls failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = round(time.perf_counter() - started, 2)  # with the interpreter's start
    result["process_cpu_s"] = round(
        (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 2
    )
    return result


def main(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="audit-memory-") as tmp:
        work = Path(tmp)
        server, base_url = start_server(MEMBERS, 0.0, work)
        try:
            for calls in [int(c) for c in args.calls.split(",")]:
                cache = work / f"cache-{calls}"
                server_before = server_cpu_s(server)
                first = run_child(
                    calls, base_url, cache, work / f"first-{calls}", args.concurrency, args.memory_entries
                )
                # (the first run's figures as soon as they are known: the rerun of a long one comes later)
                print(
                    json.dumps(
                        {
                            "calls": calls,
                            "first": {k: v for k, v in first.items() if k not in ("values", "report")},
                        }
                    ),
                    flush=True,
                )
                server_mid = server_cpu_s(server)
                profile = args.profile / f"rerun-{calls}.prof" if args.profile else None
                if profile:
                    profile.parent.mkdir(parents=True, exist_ok=True)
                rerun = run_child(
                    calls,
                    base_url,
                    cache,
                    work / f"rerun-{calls}",
                    args.concurrency,
                    args.memory_entries,
                    profile,
                )
                assert rerun["calls"]["made"] == 0, rerun["calls"]
                if first["code_sha256"] != rerun["code_sha256"] or first["code_changed_during_run"]:
                    raise RuntimeError(
                        "colab_graphs' files changed between the first run and the rerun (a merge or an edit in "
                        "this checkout?): the play cache's key holds their digest, so the rerun replayed "
                        f"{rerun['plays']['replayed']} of {first['plays']['played']} plays; run it again on a "
                        "checkout nobody changes meanwhile"
                    )
                assert rerun["plays"] == {"played": 0, "replayed": first["plays"]["played"]}, (
                    first["plays"],
                    rerun["plays"],
                )
                assert first["calls"]["made"] == calls, first["calls"]
                same = first["values"] == rerun.pop("values")
                report, again = first.pop("report"), rerun.pop("report")
                differs = sorted(k for k in report if k not in SPENT and report[k] != again.get(k))
                row = {
                    "calls": calls,
                    "first": first,
                    "rerun": rerun,
                    "rerun_over_first_wall": round(rerun["wall_s"] / first["wall_s"], 3),
                    "rerun_over_first_cpu": round(rerun["cpu_s"] / first["cpu_s"], 3),
                    "rerun_values_identical": same,
                    "rerun_differs_in": differs,
                    # Equal across versions of the code: the first run's report is the same in every value.
                    "report_sha256": hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest(),
                    "values_sha256": hashlib.sha256(first.pop("values").encode()).hexdigest(),
                    "server_cpu_s": round(server_mid - server_before, 2),
                    "server_cpu_s_rerun": round(server_cpu_s(server) - server_mid, 2),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            server.kill()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "python": platform.python_version(),
        "concurrency": args.concurrency,
        "memory_entries": args.memory_entries,  # None: the product's default (`CallCache`)
        "profiled": bool(args.profile),
        "rows": rows,
    }


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", default="3000,30000")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--memory-entries", type=int, help="call cache entries kept in memory")
    parser.add_argument("--profile", type=Path, help="a folder for each rerun's cProfile stats")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(c) for c in args.calls.split(",")]
    if len(set(sizes)) != len(sizes):
        # (one size's runs share its cache and folders: a second first run would resume the first one's log)
        parser.error(f"--calls {args.calls}: each size once; run the bench again for another sample")
    if args.child:
        child(args)
        return
    result = main(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    cli()
