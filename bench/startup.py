"""Start-up: how long `colab-graphs audit` takes to send its first request, and what follows its last reply.

Run: ``python bench/startup.py [--runs 5] [--examples 20] [--priced] [--fresh-cache] [--trees A,B] [--json PATH]``

A scripted OpenAI-compatible server (threads of this process: its CPU is not the command's) serves five members
(`arithmetic_solver`, no latency); each run starts a fresh ``colab-graphs audit`` of a majority vote over them
(`--examples` arithmetic questions, leave-one-out, plots on) and times, from the moment the process is spawned:

- the first request the server receives (the pre-flight ``GET /models``) and the first chat request;
- the command's own CPU seconds at its first request (read from /proc when that request arrives);
- the last reply, and the command's exit (the report, the plots, the terminal table, the shutdown);
- the command's CPU seconds in all.

Python writes no bytecode where ``PYTHONDONTWRITEBYTECODE`` is set (this project's sessions set it): every
module would then be compiled from source on each start, which no installed package does. So the command runs
with that variable removed and ``PYTHONPYCACHEPREFIX`` in a temporary folder, after one unmeasured warm-up run
that fills it. The runs share one call cache, emptied of calls before each (an audit of new questions with a
cache used before: the prices it looked up in LiteLLM's map are remembered); `--fresh-cache` gives each run
a cache of its own instead (a first run: the first replies wait for LiteLLM to load and price them).
`--priced` gives the members their own prices in the pool file (no lookup at all).
`--trees` runs the command from each of several source trees by turns (a checkout of main and this one: the
before and after). `--bare` adds, by turns with the audits, the baseline a user compares against: a fresh
interpreter that imports the `openai` client and sends one chat request to the same server (the first request
of a script that does nothing else; its `first_request_s` is the floor an audit's start can be judged by).
Each figure is the median over `--runs`; the script prints them and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import colab_graphs
from colab_graphs.models.cache import CallCache
from colab_graphs.testing import ScriptedServer, arithmetic_solver

MEMBERS = [f"m{i}" for i in range(5)]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(
    server: ScriptedServer, pool: Path, work: Path, examples: int, env: dict[str, str], fresh_cache: bool
) -> dict[str, Any]:
    server.reset()
    out = work / f"out-{time.monotonic_ns()}"
    cache = out / "cache" if fresh_cache else work / "cache"
    if not fresh_cache:  # the calls go, what the cache remembers of prices stays (a later audit's case)
        CallCache(cache).clear()
    command = [sys.executable, "-m", "colab_graphs.cli.app", "audit", "--protocol", "majority_vote"]
    command += ["--pool", str(pool), "--data", "builtin:arithmetic", "--limit", str(examples)]
    command += ["--out", str(out), "--cache-dir", str(cache)]
    at_first: dict[str, float] = {}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    # (From a folder of its own: `python -m` puts the working folder first on sys.path, ahead of PYTHONPATH.)
    proc = subprocess.Popen(
        command, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )

    def watch() -> None:  # the command's CPU when its first request arrives
        while proc.poll() is None and not server.requests:
            time.sleep(0.001)
        if server.requests:
            with contextlib.suppress(OSError, IndexError):  # (it has ended already)
                at_first["cpu_s"] = cpu_s(proc.pid)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, stderr = proc.communicate(timeout=600)
    ended = time.time()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    watcher.join(5)
    if proc.returncode != 0:
        raise RuntimeError(f"the audit failed ({proc.returncode}): {stderr[-2000:]}")
    requests = server.requests
    chat = [r for r in requests if "chat" in r.path]
    return {
        "first_request_s": round(requests[0].time - started, 3),
        "first_chat_s": round(chat[0].time - started, 3),
        "cpu_at_first_request_s": round(at_first.get("cpu_s", float("nan")), 3),
        "last_reply_s": round(max(r.time + r.duration_s for r in chat) - started, 3),
        "exit_s": round(ended - started, 3),
        "after_last_reply_s": round(ended - max(r.time + r.duration_s for r in chat), 3),
        "cpu_total_s": round(used.ru_utime + used.ru_stime - children.ru_utime - children.ru_stime, 3),
        "chat_requests": len(chat),
    }


BARE = """
import openai
client = openai.OpenAI(base_url={base!r}, api_key="sk-bench")
client.chat.completions.create(model="m0", messages=[{{"role": "user", "content": "What is 2 + 3?"}}])
"""


def bare_run(server: ScriptedServer, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """The bare client's start: spawn to its first request, and to its exit, with its CPU seconds."""
    server.reset()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    code = BARE.format(base=server.base_url)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    ended = time.time()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or not server.requests:
        raise RuntimeError(f"the bare client failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {
        "first_request_s": round(server.requests[0].time - started, 3),
        "exit_s": round(ended - started, 3),
        "cpu_total_s": round(used.ru_utime + used.ru_stime - children.ru_utime - children.ru_stime, 3),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--examples", type=int, default=20)
    parser.add_argument("--priced", action="store_true", help="members priced in the pool file")
    parser.add_argument(
        "--fresh-cache", action="store_true", help="each run a call cache of its own (a first-ever run)"
    )
    parser.add_argument(
        "--trees",
        help="comma-separated source trees (checkouts) to run by turns, e.g. a main checkout and this one; "
        "default: the colab_graphs this script imports",
    )
    parser.add_argument(
        "--bare", action="store_true", help="also time a bare openai client's first request, by turns"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    trees = args.trees.split(",") if args.trees else [str(Path(colab_graphs.__file__).parents[1])]
    members = {m: arithmetic_solver(accuracy=0.5 + 0.1 * i, seed=i) for i, m in enumerate(MEMBERS)}
    price = ", input_cost_per_token: 1.0e-7, output_cost_per_token: 2.0e-7" if args.priced else ""
    with ScriptedServer(members) as server, tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        work = Path(tmp)
        pool = work / "pool.yaml"
        pool.write_text(
            "models:\n"
            + "".join(
                f"  {m}: {{model: openai/{m}, api_base: '{server.base_url}', api_key: sk-bench{price}}}\n"
                for m in MEMBERS
            )
        )
        envs = {}
        for i, tree in enumerate(trees):
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env |= {"PYTHONPYCACHEPREFIX": str(work / f"pycache-{i}"), "PYTHONPATH": tree}
            envs[tree] = env
            one_run(
                server, pool, work, args.examples, env, args.fresh_cache
            )  # warm-up: compiles the bytecode
        runs: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
        if args.bare:
            bare_env = envs[trees[0]]
            bare_run(server, work, bare_env)  # warm-up: compiles the client's bytecode
            runs["bare openai client"] = []
        for _ in range(args.runs):  # the trees take turns, so load drifting hits them alike
            for tree in trees:
                runs[tree].append(one_run(server, pool, work, args.examples, envs[tree], args.fresh_cache))
            if args.bare:
                runs["bare openai client"].append(bare_run(server, work, bare_env))
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "examples": args.examples,
        "priced": args.priced,
        "fresh_cache": args.fresh_cache,
        "runs": runs,
        "median": {
            tree: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for tree, rs in runs.items()
        },
    }
    if args.bare:
        floor = report["median"]["bare openai client"]["first_request_s"]
        report["first_request_over_bare"] = {
            tree: round(report["median"][tree]["first_request_s"] / floor, 2) for tree in trees
        }
    print(json.dumps(report["median"], indent=2))
    if args.bare:
        print("first request / the bare client's:", report["first_request_over_bare"])
    print(f"{report['machine']}, load {report['load_average']}, {report['date']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
