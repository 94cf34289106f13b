"""Where the CPU seconds of README's default audit go, once installed (model converted, call cache empty).

    python bench/audit_profile.py                  # one profiled run: phases as JSON on stdout
    python bench/audit_profile.py --runs 3 --out bench/results/default_audit/profile.json

Each run is `colab-graphs audit --out DIR` in a fresh interpreter (its own empty call cache; the zoo's converted
model in a folder kept across runs, converted by a first unprofiled audit when it is not there yet) with timing
hooks around the phases: the package's imports, the model load (`get_engine`), every forward pass of the engine
(a prompt pass when it sees more than one position, else a decoding step), the rest of the engine's batch loop
(sampling, bookkeeping), the report, the plots and the exit. A phase's figure is the process's CPU seconds (all
threads) while it ran, so on a shared machine the figures compare where wall times would not. The hooks wrap
functions and change no argument or result: the audit's report.json is the one an unprofiled run writes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, functools, atexit
t_start_cpu, t_start = time.process_time(), time.perf_counter()
phases_file = sys.argv[1]
phases = {}
def add(name, cpu, wall, n=1):
    p = phases.setdefault(name, {"cpu_s": 0.0, "wall_s": 0.0, "n": 0})
    p["cpu_s"] += cpu; p["wall_s"] += wall; p["n"] += n

def timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        c, w = time.process_time(), time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            add(name, time.process_time() - c, time.perf_counter() - w)
    return wrapper

c, w = time.process_time(), time.perf_counter()
import colab_graphs.cli.app as app
import colab_graphs.audit.run as run
import colab_graphs.local.engines as engines
import colab_graphs.local.local_engine as le
add("imports (cli, audit)", time.process_time() - c, time.perf_counter() - w)

first_request = []
load = engines.get_engine
def get_engine(*a, **k):
    c, w = time.process_time(), time.perf_counter()
    fresh = not engines._engines
    engine = load(*a, **k)
    if fresh and engines._engines and not getattr(engine, "_profiled", False):
        add("model load (torch, transformers, weights)", time.process_time() - c, time.perf_counter() - w)
        engine._profiled = True
        forward = engine.model.forward
        @functools.wraps(forward)
        def timed_forward(*fa, **fk):
            c, w = time.process_time(), time.perf_counter()
            try:
                return forward(*fa, **fk)
            finally:
                ids = fk.get("input_ids")
                name = "prompt passes" if ids is not None and ids.shape[-1] > 1 else "decoding steps (forward)"
                add(name, time.process_time() - c, time.perf_counter() - w)
                if name.startswith("decoding"):
                    phases.setdefault("rows per step", []).append(int(ids.shape[0]))
        engine.model.forward = timed_forward
    return engine
engines.get_engine = get_engine

batch = le.LocalEngine.generate_batch
def generate_batch(self, *a, **k):
    if not first_request:
        first_request.append(time.perf_counter() - t_start)
        phases["first batch starts at (wall s)"] = round(first_request[0], 2)
    c, w = time.process_time(), time.perf_counter()
    try:
        return batch(self, *a, **k)
    finally:
        add("engine batches (all)", time.process_time() - c, time.perf_counter() - w)
le.LocalEngine.generate_batch = generate_batch
le.draw_tokens = timed("sampling (draw_tokens)", le.draw_tokens)
run.write_plots = timed("plots", run.write_plots)
run.write_report = timed("report files", run.write_report)
import colab_graphs.cli.audit_cmd as audit_cmd
audit_cmd._print_report = timed("report printed", audit_cmd._print_report)

def done():
    phases["in-process total"] = {"cpu_s": time.process_time() - t_start_cpu, "wall_s": time.perf_counter() - t_start}
    with open(phases_file, "w") as fh:
        json.dump(phases, fh)
atexit.register(done)
sys.argv = ["colab-graphs", *sys.argv[2:]]
app.main()
"""


def profiled_run(out: Path, env: dict[str, str]) -> dict:
    """One profiled audit in a fresh interpreter: its phases, with the interpreter's own start and exit."""
    phases_file = out.with_suffix(".phases.json")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(phases_file), "audit", "--out", str(out)],
        env=env, cwd=ROOT, check=False, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the profiled audit exited {done.returncode}:\n{done.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    phases = json.loads(phases_file.read_text())
    inside = phases.pop("in-process total")
    steps = phases.pop("rows per step", [])
    batches = phases.pop("engine batches (all)", {"cpu_s": 0.0, "wall_s": 0.0, "n": 0})
    forward = sum(phases.get(k, {}).get("cpu_s", 0.0) for k in ("prompt passes", "decoding steps (forward)"))
    sampling = phases.get("sampling (draw_tokens)", {}).get("cpu_s", 0.0)
    phases["engine loop besides forward and sampling"] = {"cpu_s": batches["cpu_s"] - forward - sampling}
    named = sum(v["cpu_s"] for v in phases.values() if isinstance(v, dict))
    phases["interpreter start and exit"] = {"cpu_s": cpu - inside["cpu_s"]}
    phases["the rest (plan, plays, scoring, estimators, event loop)"] = {"cpu_s": inside["cpu_s"] - named}
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "load_average_at_start": None,
        "decoding_steps": len(steps),
        "rows_per_step_max": max(steps, default=0),
        "phases": {
            k: (
                {kk: round(vv, 3) if isinstance(vv, float) else vv for kk, vv in v.items()}
                if isinstance(v, dict)
                else v
            )
            for k, v in phases.items()
        },  # fmt: skip
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--home", type=Path, help="zoo folder kept across runs (default: a temporary one)")
    parser.add_argument("--out", type=Path, help="write the runs here as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="audit-profile-") as tmp:
        work = Path(tmp)
        home = args.home or work / "home"
        env = {**os.environ, "COLAB_GRAPHS_HOME": str(home), "COLAB_GRAPHS_CACHE_DIR": str(work / "convert")}
        if not (home / "models" / "smollm2-135m").is_dir():  # convert once, unprofiled
            subprocess.run(
                [sys.executable, "-m", "colab_graphs.cli.app", "audit", "--out", str(work / "convert-audit")],
                env=env, cwd=ROOT, check=True, capture_output=True,
            )  # fmt: skip
        runs = []
        for i in range(args.runs):
            load = os.getloadavg()[0]
            run = profiled_run(
                work / f"audit-{i}", {**env, "COLAB_GRAPHS_CACHE_DIR": str(work / f"cache-{i}")}
            )
            run["load_average_at_start"] = round(load, 2)
            runs.append(run)
            print(json.dumps(run, indent=2), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
