"""Audit efficiency: an audit vs a bare client making only the distinct requests (the floor) vs naive runs.

Run: ``python bench/audit_efficiency.py [--latency 0.05] [--concurrency 32] [--vote-examples 200]
[--debate-examples 100] [--scenarios vote,debate,exact,sampled8] [--skip-naive] [--skip-httpx] [--profile]
[--json PATH]``

A scripted OpenAI-compatible server runs in its own process (so it does not share the client's GIL) and
answers every request after `--latency` seconds. Scenarios, each audit with each member also alone:
`vote` (majority vote over 5 members, leave-one-out, the `colab-graphs audit` default), `debate` (two rounds
over 4 members, leave-one-out), `exact` (majority vote over 5 members, exact Shapley: 32 coalitions) and
`sampled8` (majority vote over 8 members, sampled Shapley with 64 permutations). For each it measures:

1. **audit**: `play_audit` with a fresh call cache, all coalitions interleaved on one loop.
2. **floor (litellm)**: the distinct requests the audit made (read back from its cache), sent with bare
   `litellm.acompletion` under one `asyncio.Semaphore(concurrency)`, all at once, no graph, no cache. It
   ignores that a debate's round 2 must wait for round 1: no real evaluation can beat it.
3. **floor (httpx)**: the same requests posted with one raw `httpx.AsyncClient`, without LiteLLM.
4. **naive**: what a user would otherwise write: each coalition (and each solo run) evaluated on its own with
   `run_dataset`, one after another, with no cache (each run still shares identical in-flight calls).

A fifth phase reruns the audit on its now-full cache (no model call): the framework's own cost (LangGraph
runs of every coalition and example, cache reads, scoring). Each phase records wall time, this process's CPU
time and the server process's CPU time, so a CPU-bound phase on a busy machine can be told from a
latency-bound one. It prints the figures, calls made / distinct / naive, and the ratios; `--json PATH` also
writes them.
Targets (issue 15): exact 5-member vote at 0.5 s per reply within 1.3x of the floor, at 0.1 s within 1.6x;
8 members with sampled Shapley at 0.5 s within 1.5x; calls made = distinct requests.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import gc
import io
import json
import os
import platform
import pstats
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import colab_graphs._env  # noqa: F401  (offline settings before litellm loads)
from colab_graphs.audit.estimators import plan_coalitions
from colab_graphs.audit.run import play_audit
from colab_graphs.coalition import restrict
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.runner import run_dataset
from colab_graphs.tasks.builtin import builtin_task

ACCURACIES = [0.85, 0.75, 0.65, 0.55, 0.45, 0.35, 0.6, 0.5]
SCENARIOS = {  # name -> (protocol, members, method, budget)
    "vote": ("majority_vote", 5, "loo", None),
    "debate": ("debate", 4, "loo", None),
    "exact": ("majority_vote", 5, "exact", None),
    "sampled8": ("majority_vote", 8, "sampled", 64),
}


def start_server(members: list[str], latency_s: float, workdir: Path) -> tuple[subprocess.Popen, str]:
    """The scripted server in a child process; returns (process, base_url)."""
    spec = workdir / "members.json"
    spec.write_text(
        json.dumps(
            {
                m: {"script": "arithmetic_solver", "args": {"accuracy": ACCURACIES[i], "seed": i}}
                for i, m in enumerate(members)
            }
        )
    )
    command = [sys.executable, "-m", "colab_graphs.testing.server", "--port", "0", "--members", str(spec)]
    command += ["--latency", str(latency_s)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    line = server.stdout.readline()  # "serving [...] at http://127.0.0.1:PORT/v1"
    if " at " not in line:
        server.kill()
        raise RuntimeError(f"the scripted server did not start: {line!r}")
    return server, line.rsplit(" at ", 1)[1].strip()


def server_cpu_s(server: subprocess.Popen) -> float:
    """User + system CPU seconds the server process has used (Linux /proc)."""
    fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Phase:
    """Wall time, this process's CPU time and the server's CPU time of one measured phase."""

    def __init__(self, server: subprocess.Popen):
        self.server = server

    def __enter__(self) -> Phase:
        self.wall, self.cpu, self.server_cpu = (
            time.perf_counter(),
            time.process_time(),
            server_cpu_s(self.server),
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = round(time.perf_counter() - self.wall, 2)
        self.cpu = round(time.process_time() - self.cpu, 2)
        self.server_cpu = round(server_cpu_s(self.server) - self.server_cpu, 2)


def distinct_requests(cache_dir: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(cache_dir / "calls.sqlite") as db:
        return [json.loads(r) for (r,) in db.execute("SELECT request FROM calls")]


async def floor_litellm(requests: list[dict[str, Any]], base_url: str, concurrency: int) -> None:
    import litellm

    limit = asyncio.Semaphore(concurrency)

    async def one(r: dict[str, Any]) -> None:
        async with limit:
            response = await litellm.acompletion(
                model=r["model"],
                messages=r["messages"],
                api_base=base_url,
                api_key="sk-bench",
                **r["settings"],
            )
            assert response.choices[0].message.content

    await asyncio.gather(*(one(r) for r in requests))


async def floor_httpx(requests: list[dict[str, Any]], base_url: str, concurrency: int) -> None:
    import httpx

    limit = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as http:

        async def one(r: dict[str, Any]) -> None:
            body = {"model": r["model"].split("/", 1)[1], "messages": r["messages"], **r["settings"]}
            async with limit:
                response = await http.post("/chat/completions", json=body)
            assert response.json()["choices"][0]["message"]["content"]

        await asyncio.gather(*(one(r) for r in requests))


async def naive(spec, pool: Pool, examples, concurrency: int, method: str, budget: int | None) -> int:
    """Every coalition of the plan, then every member alone, each its own run with no cache."""
    plan = plan_coalitions(spec.members, method, budget=budget)
    specs = [restrict(spec, c) for c in plan.coalitions]
    specs += [build_protocol("solo", pool.names, member=m) for m in spec.members]
    made = 0
    for s in specs:
        if s is None:
            continue
        client = ModelClient(None, max_concurrency=concurrency)
        _, summary = await run_dataset(s, pool, examples, client=client)
        made += summary["calls"]["made"]
    return made


async def scenario(
    name: str,
    spec,
    pool: Pool,
    examples,
    server: subprocess.Popen,
    base_url: str,
    args: argparse.Namespace,
    method: str = "loo",
    budget: int | None = None,
) -> dict[str, Any]:
    cache_dir = Path(args.workdir) / f"cache-{name}"
    profiler = cProfile.Profile() if args.profile else None
    # The figures below (and BENCHMARKS.md's) measure coalitions played through the graph, permutations
    # counted as before: a vote's game would otherwise be computed from its answers (bench/answers_exact.py).
    plan = {
        "method": method, "budget": budget, "budget_unit": "permutations", "plots": False,
        "play_every_coalition": True,
    }  # fmt: skip
    with Phase(server) as audit:
        client = ModelClient(CallCache(cache_dir), max_concurrency=args.concurrency)
        if profiler:
            profiler.enable()
        report = await play_audit(spec, pool, examples, client=client, **plan)
        if profiler:
            profiler.disable()
    with Phase(server) as warm:  # the same audit again, every call a cache hit: the framework's own cost
        client = ModelClient(CallCache(cache_dir), max_concurrency=args.concurrency)
        again = await play_audit(spec, pool, examples, client=client, **plan)
    assert again.calls.made == 0 and again.loo == report.loo and again.shapley == report.shapley
    requests = distinct_requests(cache_dir)
    assert len(requests) == report.calls.unique, (len(requests), report.calls)
    with Phase(server) as floor:
        await floor_litellm(requests, base_url, args.concurrency)
    phases = {"audit": audit, "audit_warm": warm, "floor_litellm": floor}
    if not args.skip_httpx:
        with Phase(server) as floor_raw:
            await floor_httpx(requests, base_url, args.concurrency)
        phases["floor_httpx"] = floor_raw
    row: dict[str, Any] = {
        "scenario": name,
        "method": method,
        "latency_s": args.latency,
        "members": len(spec.members),
        "examples": len(examples),
        "runs": len(report.coalitions) + len(spec.members),
        "calls_made": report.calls.made,
        "calls_distinct": report.calls.unique,
        "calls_naive": report.calls.naive,
        "latency_bound_s": round(len(requests) * args.latency / args.concurrency, 2),
    }
    if not args.skip_naive:
        with Phase(server) as naive_phase:
            row["naive_calls_made"] = await naive(spec, pool, examples, args.concurrency, method, budget)
        phases["naive"] = naive_phase
    for key, phase in phases.items():
        row |= {f"{key}_s": phase.wall, f"{key}_cpu_s": phase.cpu, f"{key}_server_cpu_s": phase.server_cpu}
    row["audit_vs_floor"] = round(audit.wall / floor.wall, 2)
    if "floor_httpx" in phases:
        row["audit_vs_httpx_floor"] = round(audit.wall / phases["floor_httpx"].wall, 2)
    row["audit_cpu_ms_per_call"] = round(1000 * audit.cpu / len(requests), 1)
    row["floor_cpu_ms_per_call"] = round(1000 * floor.cpu / len(requests), 1)
    if "naive" in phases:
        row["naive_vs_audit"] = round(phases["naive"].wall / audit.wall, 2)
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(40)
        row["profile_top"] = out.getvalue()
    return row


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    import litellm

    litellm.suppress_debug_info = True
    members = [f"m{i + 1}" for i in range(len(ACCURACIES))]
    rows = []
    with tempfile.TemporaryDirectory(prefix="audit-bench-") as tmp:
        args.workdir = tmp
        server, base_url = start_server(members, args.latency, Path(tmp))
        try:
            pool = Pool.from_dict(
                {m: {"model": f"openai/{m}", "api_base": base_url, "api_key": "sk-bench"} for m in members}
            )
            # Warm-up: LiteLLM's first call builds its clients; no measured phase should pay for that.
            await floor_litellm(
                [
                    {
                        "model": "openai/m1",
                        "messages": [{"role": "user", "content": "What is 1 + 1?"}],
                        "settings": {},
                    }
                ],
                base_url,
                1,
            )
            # As `colab-graphs audit` does (cli/common.py: freeze_startup_heap): the startup heap is frozen
            # out of the cyclic collector's sight. Every phase below, the floor included, runs with it.
            gc.collect()
            gc.freeze()
            for name in args.scenarios.split(","):
                protocol, size, method, budget = SCENARIOS[name]
                params = {"rounds": 2} if protocol == "debate" else {}
                spec = build_protocol(protocol, members[:size], **params)
                n = args.debate_examples if protocol == "debate" else args.vote_examples
                sub = Pool.from_dict({m: pool[m].settings for m in spec.members})
                examples = builtin_task("arithmetic", n, seed=0)
                rows.append(await scenario(name, spec, sub, examples, server, base_url, args, method, budget))
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "profile_top"}), flush=True)
        finally:
            server.terminate()
            server.wait(10)
    return rows


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.05, help="seconds the server waits per reply")
    parser.add_argument("--concurrency", type=int, default=32, help="in-flight calls (audit, floor, naive)")
    parser.add_argument("--vote-examples", type=int, default=200)
    parser.add_argument("--debate-examples", type=int, default=100)
    parser.add_argument("--scenarios", default="vote,debate", help=f"comma-separated: {', '.join(SCENARIOS)}")
    parser.add_argument("--skip-naive", action="store_true", help="skip the (slow) naive evaluation")
    parser.add_argument("--skip-httpx", action="store_true", help="skip the raw httpx floor")
    parser.add_argument("--profile", action="store_true", help="cProfile the audits; print the top functions")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    rows = asyncio.run(main(args))
    print(
        f"\nmachine: {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"date {datetime.date.today().isoformat()}; latency {args.latency}s; concurrency {args.concurrency}"
    )
    columns = ["scenario", "method", "examples", "runs", "audit s", "floor s", "audit/floor", "audit CPU s"]
    columns += ["floor CPU s"]
    columns += ["warm audit s", "made", "distinct", "naive calls", "naive s"]
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for r in rows:
        cells = [r["scenario"], r["method"], r["examples"], r["runs"], r["audit_s"], r["floor_litellm_s"]]
        cells += [r["audit_vs_floor"]]
        cells += [r["audit_cpu_s"], r["floor_litellm_cpu_s"], r["audit_warm_s"], r["calls_made"]]
        cells += [r["calls_distinct"], r.get("naive_calls_made", r["calls_naive"]), r.get("naive_s", "-")]
        print("| " + " | ".join(map(str, cells)) + " |")
        if "profile_top" in r:
            print(r["profile_top"])
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    cli()
