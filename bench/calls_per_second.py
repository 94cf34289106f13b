"""Calls per second: an audit's distinct calls vs the same calls from bare clients, down to a bare HTTP post.

Run: ``python bench/calls_per_second.py [--calls 10000] [--latency 0] [--concurrency 32] [--rounds 1]
[--modes httpx,aiohttp,openai,litellm,client,client-litellm,audit] [--profile MODE] [--json PATH]``

A scripted OpenAI-compatible server runs in its own process (its CPU is not counted) and answers each request
after `--latency` seconds. An exact-Shapley audit of a majority vote over five scripted members
(`arithmetic_solver`, leave-one-out and Shapley from the members' answers, individual strengths) is played on
`--calls` / 5 arithmetic questions: `--calls` distinct requests. The same requests are then sent by each of
these, one process, `--concurrency` calls in flight in each:

- ``httpx``: one ``httpx.AsyncClient`` posting the JSON (the floor the issue names);
- ``aiohttp``: one ``aiohttp.ClientSession`` posting the JSON (the transport of the call path's direct lane);
- ``openai``: the ``openai`` SDK's ``AsyncOpenAI``;
- ``litellm``: ``litellm.acompletion``;
- ``client``: ``ModelClient.complete`` with a call cache, as the CLI has it (plain calls go direct);
- ``client-litellm``: the same with ``ModelClient(direct=False)``: every call through LiteLLM;
- ``audit``: ``play_audit`` of the audit above (graphs, scoring, the game), with a fresh call cache.

Every mode first sends a few requests of its own (and the audit plays a small audit of other questions), so
imports, connection pools and compiled graphs are ready before it is timed. Each mode records its wall time,
this process's CPU time and the server's; the table gives calls per second, the ratio to the ``httpx`` floor,
and CPU milliseconds per call. With `--rounds` > 1 the modes take turns round after round (load drifting on a
shared machine hits them alike) and each figure is the median over rounds.
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
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from audit_efficiency import distinct_requests, server_cpu_s, start_server

import colab_graphs._env  # noqa: F401  (offline settings before litellm loads)
from colab_graphs.audit.run import play_audit
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.tasks.builtin import builtin_task

MEMBERS = [f"m{i + 1}" for i in range(5)]
MODES = ["httpx", "aiohttp", "openai", "litellm", "client", "client-litellm", "audit"]
WARM_UP_CALLS = 64


class Bench:
    """The server, the pool, the requests of the audit, and one timed run of each mode."""

    def __init__(self, args: argparse.Namespace, base_url: str, server: Any, work: Path):
        self.args, self.base_url, self.server, self.work = args, base_url, server, work
        self.pool = Pool.from_dict(
            {m: {"model": f"openai/{m}", "api_base": base_url, "api_key": "sk-bench"} for m in MEMBERS}
        )
        self.spec = build_protocol("majority_vote", MEMBERS)
        self.requests: list[dict[str, Any]] = []
        self.runs = 0

    def examples(self, count: int, seed: int) -> list[Any]:
        """`count` arithmetic questions, no two alike (the generator repeats itself: more are drawn)."""
        drawn = count
        while True:
            unique = list({e.input: e for e in builtin_task("arithmetic", drawn, seed=seed)}.values())
            if len(unique) >= count:
                return unique[:count]
            drawn *= 2

    async def audit(self, examples: list[Any]) -> int:
        """One audit with a fresh call cache; returns the distinct calls it made (and keeps its requests)."""
        self.runs += 1
        cache_dir = self.work / f"audit-cache-{self.runs}"
        client = ModelClient(CallCache(cache_dir), max_concurrency=self.args.concurrency)
        report = await play_audit(self.spec, self.pool, examples, client=client, method="exact", plots=False)
        assert report.calls.made == report.calls.unique == len(MEMBERS) * len(examples), report.calls
        self.requests = distinct_requests(cache_dir)
        return report.calls.made

    def sender(
        self, mode: str
    ) -> tuple[Callable[[dict[str, Any]], Awaitable[None]], Callable[[], Awaitable[None]]]:
        """(send one request, close) for a bare-client or client mode."""
        base, limit = self.base_url, self.args.concurrency
        if mode == "httpx":
            import httpx

            limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
            http = httpx.AsyncClient(base_url=base, limits=limits, timeout=600)

            async def post_httpx(r: dict[str, Any]) -> None:
                response = await http.post("/chat/completions", json=body(r), headers=AUTH)
                assert response.json()["choices"][0]["message"]["content"] is not None

            return post_httpx, http.aclose
        if mode == "aiohttp":
            import aiohttp

            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit))

            async def post_aiohttp(r: dict[str, Any]) -> None:
                async with session.post(f"{base}/chat/completions", json=body(r), headers=AUTH) as response:
                    assert json.loads(await response.read())["choices"][0]["message"]["content"] is not None

            return post_aiohttp, session.close
        if mode == "openai":
            import openai

            sdk = openai.AsyncOpenAI(base_url=base, api_key="sk-bench", max_retries=0, timeout=600)

            async def create(r: dict[str, Any]) -> None:
                request = body(r)
                reply = await sdk.chat.completions.create(**request)
                assert reply.choices[0].message.content is not None

            return create, sdk.close
        if mode == "litellm":
            import litellm

            async def acompletion(r: dict[str, Any]) -> None:
                reply = await litellm.acompletion(
                    model=r["model"],
                    messages=r["messages"],
                    api_base=base,
                    api_key="sk-bench",
                    **r["settings"],
                )
                assert reply.choices[0].message.content is not None

            return acompletion, _nothing
        cache = CallCache(self.work / f"{mode}-cache-{time.monotonic_ns()}")
        # ("client" is the client as it comes, so that this script also measures an older one.)
        lane = {"direct": False} if mode == "client-litellm" else {}
        client = ModelClient(cache, max_concurrency=limit, **lane)

        async def complete(r: dict[str, Any]) -> None:
            member = self.pool[r["model"].split("/", 1)[1]]
            call = await client.complete(member, r["messages"], overrides=r["settings"] or None)
            assert not call.cached

        async def close() -> None:
            cache.close()

        return complete, close

    async def timed(self, mode: str, profiler: cProfile.Profile | None) -> dict[str, float]:
        """Warm the mode up, then send the audit's requests (or play the audit) and time it."""
        close: Callable[[], Awaitable[None]] = _nothing
        if mode == "audit":
            await self.audit(self.examples(WARM_UP_CALLS // len(MEMBERS), seed=1000 + self.runs))
            examples = self.examples(self.args.calls // len(MEMBERS), seed=0)

            async def run() -> None:
                await self.audit(examples)

        else:
            send, close = self.sender(mode)
            warm = [
                {**r, "messages": [*r["messages"], {"role": "user", "content": "(warm-up)"}]}
                for r in self.requests[:WARM_UP_CALLS]
            ]
            await bounded(warm, self.args.concurrency, send)

            async def run() -> None:
                await bounded(self.requests, self.args.concurrency, send)

        gc.collect()
        cpu, wall, server = time.process_time(), time.perf_counter(), server_cpu_s(self.server)
        if profiler is not None:
            profiler.enable()
        await run()
        if profiler is not None:
            profiler.disable()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        server = server_cpu_s(self.server) - server
        await close()
        n = len(self.requests)
        return {"calls": n, "wall_s": wall, "cpu_s": cpu, "server_cpu_s": server, "calls_per_s": n / wall,
                "cpu_ms_per_call": 1000 * cpu / n}  # fmt: skip


AUTH = {"Authorization": "Bearer sk-bench"}


def body(request: dict[str, Any]) -> dict[str, Any]:
    """The request as an OpenAI chat body (what the direct lane and LiteLLM post)."""
    return {
        "model": request["model"].split("/", 1)[1],
        "messages": request["messages"],
        **request["settings"],
    }


async def _nothing() -> None:
    return None


async def bounded(
    requests: list[dict[str, Any]], limit: int, send: Callable[[dict[str, Any]], Awaitable[None]]
):
    gate = asyncio.Semaphore(limit)

    async def one(r: dict[str, Any]) -> None:
        async with gate:
            await send(r)

    await asyncio.gather(*(one(r) for r in requests))


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import litellm

    litellm.suppress_debug_info = True
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    with tempfile.TemporaryDirectory(prefix="calls-bench-") as tmp:
        work = Path(tmp)
        server, base_url = start_server(MEMBERS, args.latency, work)
        try:
            bench = Bench(args, base_url, server, work)
            await bench.audit(
                bench.examples(args.calls // len(MEMBERS), seed=0)
            )  # the requests every mode sends
            gc.collect()
            gc.freeze()  # (as the CLI does, for every mode alike)
            rows: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
            profiler = cProfile.Profile() if args.profile else None
            for _ in range(args.rounds):
                for mode in modes:
                    rows[mode].append(await bench.timed(mode, profiler if mode == args.profile else None))
                    print(
                        json.dumps({"mode": mode, **{k: round(v, 3) for k, v in rows[mode][-1].items()}}),
                        flush=True,
                    )
        finally:
            server.terminate()
            server.wait(10)
    median = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in rows.items()}
    floor = median.get("httpx")
    for row in median.values():
        row["vs_httpx"] = row["calls_per_s"] / floor["calls_per_s"] if floor else float("nan")
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "latency_s": args.latency,
        "concurrency": args.concurrency,
        "calls": len(bench.requests),
        "rounds": args.rounds,
        "median": median,
        "runs": rows,
    }
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(40)
        report["profile"] = out.getvalue()
    return report


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000, help="distinct requests (5 per question)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds the server waits per reply")
    parser.add_argument("--concurrency", type=int, default=32, help="calls in flight, in every mode")
    parser.add_argument("--rounds", type=int, default=1, help="modes take turns this many times")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--profile", choices=MODES, help="cProfile one mode; print its top functions")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    report = asyncio.run(main(args))
    print(
        f"\n{report['calls']} distinct calls, {report['latency_s']} s per reply, {report['concurrency']} in flight, "
        f"{report['rounds']} round(s); {report['machine']}, load {report['load_average']}, {report['date']}"
    )
    print("| mode | calls/s | vs httpx | CPU ms/call | wall s | server CPU s |\n|---|---|---|---|---|---|")
    for mode, row in report["median"].items():
        print(
            f"| {mode} | {row['calls_per_s']:.0f} | {row['vs_httpx']:.2f} | {row['cpu_ms_per_call']:.2f} | "
            f"{row['wall_s']:.1f} | {row['server_cpu_s']:.1f} |"
        )
    if "profile" in report:
        print(report["profile"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    cli()
