"""A CPU-bound scripted study in process vs on a local Ray cluster: wall time, the ratio, and what one worker does.

Run: ``python bench/study_ray.py [--examples 100] [--latency 0.005] [--workers 2] [--concurrency 16]
[--ray ADDRESS] [--json PATH]``

The study: two pools of four scripted members (`arithmetic_solver`, two members shared by both pools) x two
protocols (majority_vote, a two-round debate) x two built-in datasets (arithmetic, word problems; `--examples`
each), leave-one-out plus each member alone: 4 audits per pool. The scripted server runs in its own process and
answers after `--latency` seconds, so the study is bound by the client's CPU (graph runs, LiteLLM, scoring),
which is what spreading over workers can win back.

Each backend runs `colab-graphs study` in a child process with a fresh call cache: in process, and with
`--ray ADDRESS --workers N` (a local head with N CPUs is started, and stopped after, unless `--ray` is given).
A one-example study on each backend first measures the fixed cost (process start, LiteLLM import, Ray actors
starting and importing it), so the play phase can be told apart (on Ray after one uncounted warm-up study). The two study.json files must agree (values,
correlations, calls). Reported: wall time of each run, the driver's and the server's CPU seconds, calls made,
calls/s per worker in the play phase and per CPU-second of the workers, and the driver's work per example (the
bytes of plays a worker sends back, and of cache entries from a worker on another machine; the time to record the
one and merge the other): the figures the 100-machine estimate in BENCHMARKS.md starts from.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pickle
import platform
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from colab_graphs.audit.game import read_plays
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.study.config import load_study_config
from colab_graphs.study.distributed import local_cluster
from colab_graphs.study.plan import build_plan
from colab_graphs.study.report import StudyReport
from colab_graphs.study.run import _Ledgers

sys.path.insert(0, str(Path(__file__).parent))
from audit_efficiency import start_server  # noqa: E402

MEMBERS = [f"m{i}" for i in range(6)]


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a live process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_study(folder: Path, base_url: str, examples: int) -> Path:
    def pool(names: list[str]) -> dict:
        return {
            "models": {
                m: {"model": f"openai/{m}", "api_base": base_url, "api_key": "sk-bench"} for m in names
            }
        }

    study = {
        "pools": {"A": pool(MEMBERS[:4]), "B": pool(MEMBERS[2:])},
        "protocols": ["majority_vote", {"name": "debate", "params": {"rounds": 2}}],
        "datasets": [
            {"source": "builtin:arithmetic", "limit": examples},
            {"source": "builtin:word_problems", "limit": examples},
        ],
        "method": "loo",
    }
    path = folder / f"study-{examples}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def run_cli(
    config: Path, out: Path, cache: Path, concurrency: int, server_pid: int, *ray: str
) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_cpu = process_cpu(server_pid)
    started = time.perf_counter()
    command = [sys.executable, "-m", "colab_graphs.cli.app", "study", "--config", str(config), "--out", str(out),
               "--cache-dir", str(cache), "--max-concurrency", str(concurrency), "--no-plots", *ray]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"study failed ({done.returncode}): {done.stderr[-2000:]}")
    study = json.loads((out / "study.json").read_text())
    return {
        "wall_s": round(wall, 2),
        "study_wall_s": study["wall_s"],
        "driver_cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 2),
        "server_cpu_s": round(process_cpu(server_pid) - server_cpu, 2),
        "calls": study["calls"],
        "workers": study["workers"],
        "shards": study["shards"],
        "worker_cpu_s": study.get("worker_cpu_s"),
        "study": study,
    }


def comparable(study: dict) -> dict:
    return {
        k: v
        for k, v in study.items()
        if k not in {"version", "created_at", "backend", "workers", "shards", "wall_s"}
    }


def per_cpu_s(runs: dict[str, dict], name: str, cpu: str) -> float:
    full, fixed = runs[name], runs[f"fixed {name}"]
    calls = full["calls"]["made"] - fixed["calls"]["made"]
    return round(calls / (full[cpu] - fixed[cpu]), 1)


def driver_costs(config: Path, out: Path, cache: Path, n_examples: int, shards: int) -> dict[str, float]:
    """What the driver does per example of a Ray study, measured on this run's own results: unpickling and
    recording the plays a worker sends back (the study's `_Ledgers.record`, into a fresh folder) and merging the
    cache entries a worker on another machine sends back (`CallCache.put`, into a fresh cache)."""
    plan = build_plan(load_study_config(config))
    plays = []
    for setting in plan.settings:
        kind = "solo" if setting.protocol is None else "coalition"
        for play in read_plays(out / setting.folder):
            if play.game == kind:
                plays.append((setting.key, play))
    blob = pickle.dumps([plays[i::shards] for i in range(shards)])  # as if from `shards` shards
    with sqlite3.connect(cache / "calls.sqlite") as db:
        rows = db.execute("SELECT key, model, request, response FROM calls").fetchall()
    entries = [(k, m, json.loads(req), json.loads(resp)) for k, m, req, resp in rows]
    entries_blob = pickle.dumps(entries)
    with tempfile.TemporaryDirectory() as fresh:
        ledgers = _Ledgers(plan, Path(fresh) / "study", ModelClient(None))
        merged_into = CallCache(Path(fresh) / "cache")
        started = time.perf_counter()
        for chunk in pickle.loads(blob):  # what arrives from the workers, a shard at a time, then recorded
            ledgers.record_many(chunk)
        recorded = time.perf_counter()
        for entry in pickle.loads(entries_blob):
            merged_into.put(*entry)
        merged = time.perf_counter()
        merged_into.close()
    per_play = (recorded - started) / len(plays)
    per_entry = (merged - recorded) / max(1, len(entries))
    plays_per_example, entries_per_example = len(plays) / n_examples, len(entries) / n_examples
    return {
        "plays_per_example": round(plays_per_example, 1),
        "entries_per_example": round(entries_per_example, 1),
        "pickled_plays_bytes_per_example": round(len(blob) / n_examples),
        "pickled_entries_bytes_per_example": round(len(entries_blob) / n_examples),
        "record_us_per_play": round(1e6 * per_play, 1),
        "merge_us_per_entry": round(1e6 * per_entry, 1),
        "driver_examples_per_s_shared_cache": round(1 / (plays_per_example * per_play), 1),
        "driver_examples_per_s_merging": round(
            1 / (plays_per_example * per_play + entries_per_example * per_entry), 1
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100, help="examples per dataset (two datasets)")
    parser.add_argument("--latency", type=float, default=0.005, help="seconds per scripted reply")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--concurrency", type=int, default=16, help="in-flight calls per endpoint per process"
    )
    parser.add_argument("--ray", help="an existing cluster's address (default: start a local one)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (studies, caches)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="study-bench-"))
    server, base_url = start_server(MEMBERS, args.latency, work)
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPU cores, {platform.python_implementation()} {platform.python_version()}",
        "load_before": os.getloadavg()[0],
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    try:
        small, full = write_study(work, base_url, 1), write_study(work, base_url, args.examples)
        conc = args.concurrency
        runs: dict[str, dict] = {}
        runs["fixed in process"] = run_cli(small, work / "s-in", work / "c-s-in", conc, server.pid)
        runs["in process"] = run_cli(full, work / "in", work / "c-in", conc, server.pid)
        with contextlib.ExitStack() as stack:
            address = args.ray or stack.enter_context(local_cluster(args.workers))[0]
            ray = ("--ray", address, "--workers", str(args.workers))
            # The cluster's first workers start slower (worker pool, first imports): warm it, do not count it.
            run_cli(small, work / "w-ray", work / "c-w-ray", conc, server.pid, *ray)
            runs["fixed on ray"] = run_cli(small, work / "s-ray", work / "c-s-ray", conc, server.pid, *ray)
            runs["on ray"] = run_cli(full, work / "ray", work / "c-ray", conc, server.pid, *ray)
        same = StudyReport.model_validate(runs["in process"]["study"]).comparable() == (
            StudyReport.model_validate(runs["on ray"]["study"]).comparable()
        )
        n_examples = 2 * args.examples
        made = runs["on ray"]["calls"]["made"]
        play = {
            k: runs[k]["study_wall_s"] - runs[f"fixed {k}"]["study_wall_s"] for k in ("in process", "on ray")
        }
        results.update(
            {
                "runs": {k: {kk: vv for kk, vv in v.items() if kk != "study"} for k, v in runs.items()},
                "same_study_json": same,
                "ratio_wall": round(runs["in process"]["wall_s"] / runs["on ray"]["wall_s"], 2),
                "ratio_play_phase": round(play["in process"] / play["on ray"], 2),
                "play_phase_s": {k: round(v, 2) for k, v in play.items()},
                "calls_per_s_per_worker": round(made / play["on ray"] / runs["on ray"]["workers"], 1),
                "calls_per_s_in_process": round(made / play["in process"], 1),
                # Per CPU-second beyond the one-example study (imports, actor start): what a worker with a
                # core of its own makes, whatever else loads the machine.
                "calls_per_worker_cpu_s": per_cpu_s(runs, "on ray", "worker_cpu_s"),
                "calls_per_driver_cpu_s_in_process": per_cpu_s(runs, "in process", "driver_cpu_s"),
                "driver_cpu_s_per_1000_calls_on_ray": round(
                    1000 / per_cpu_s(runs, "on ray", "driver_cpu_s"), 3
                ),
                "driver": driver_costs(
                    full, work / "ray", work / "c-ray", n_examples, runs["on ray"]["shards"]
                ),
                "load_after": os.getloadavg()[0],
            }
        )
    finally:
        server.terminate()
        server.wait(timeout=10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"{'run':<18} {'wall s':>8} {'study s':>8} {'driver CPU s':>12} {'server CPU s':>12} {'made':>6} {'shards':>6}"
    )
    for name, r in results["runs"].items():
        print(f"{name:<18} {r['wall_s']:>8} {r['study_wall_s']:>8} {r['driver_cpu_s']:>12} {r['server_cpu_s']:>12} "
              f"{r['calls']['made']:>6} {r['shards']:>6}")  # fmt: skip
    keys = ("same_study_json", "ratio_wall", "ratio_play_phase", "play_phase_s", "calls_per_s_per_worker",
            "calls_per_s_in_process", "calls_per_worker_cpu_s", "calls_per_driver_cpu_s_in_process",
            "driver_cpu_s_per_1000_calls_on_ray", "driver", "load_before", "load_after")  # fmt: skip
    for key in keys:
        print(f"{key}: {results[key]}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
