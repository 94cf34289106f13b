"""A `crl_team.py` study with one process per (arm, seed), all at once, merged into one study folder.

Made for a machine with many cores and one GPU (every process trains its own policy on the same device): the
trainings of a study are independent, so their wall time is the longest one's, not their sum. Each part is an
ordinary `crl_team.py` study folder of one arm and one seed (`OUT/parts/ARM-SEED`, its log in
`OUT/logs/ARM-SEED.log`); once they have all ended (or the deadline has passed: the ones still running are
stopped, and their trainings left out), the parts are merged into `OUT/study`, which
`crl_team_pick_report.py` (or `crl_team_report.py`) reads and packs like any study folder.

    python bench/crl_team_parallel.py --out runs/gpu --jobs uniform:0-5 sft:0-5 own:0-2 --deadline-s 420 \
        -- --settings pick_brief --steps 100 --device cuda ...   # everything after -- goes to crl_team.py

The merge refuses parts whose question files differ (every part must have drawn the same questions). Rows a
part wrote that another part also wrote (the untrained policy's evaluation, done by every part) are taken
from the first part; how many of them differ between parts is recorded in `OUT/study/merge.json` (a greedy
bf16 answer may depend on what it was batched with), as are the parts, their exit status and wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def parse_job(text: str) -> list[tuple[str, int]]:
    """`arm:0-5` or `arm:0,2` or `arm:3` -> [(arm, seed), ...]."""
    arm, sep, seeds = text.partition(":")
    if not (arm and sep and seeds):
        raise argparse.ArgumentTypeError(f"expected ARM:SEEDS (uniform:0-5, sft:0,1), got {text!r}")
    out: list[tuple[str, int]] = []
    for piece in seeds.split(","):
        first, _, last = piece.partition("-")
        try:
            out += [(arm, s) for s in range(int(first), int(last or first) + 1)]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: seeds must be integers (0-5, 0,2)") from None
    return out


def run_parts(
    out: Path, jobs: list[tuple[str, int]], study_args: list[str], deadline_s: float, threads: int
) -> list[dict[str, Any]]:
    """Start one `crl_team.py` per (arm, seed); wait for them all or until the deadline; their outcomes."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        **{k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
        "PYTHONUNBUFFERED": "1",
    }
    started = time.monotonic()
    procs = []
    for arm, seed in jobs:
        name = f"{arm}-{seed}"
        cmd = [
            sys.executable,
            str(BENCH / "crl_team.py"),
            "--out",
            str(out / "parts" / name),
            "--arms",
            arm,
            "--seeds",
            str(seed),
            *study_args,
        ]
        log = open(out / "logs" / f"{name}.log", "w")  # noqa: SIM115  (closed once the part ends)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        procs.append({"part": name, "arm": arm, "seed": seed, "proc": proc, "log": log, "cmd": cmd})
        print(json.dumps({"started": name, "pid": proc.pid}), flush=True)
    while any(p["proc"].poll() is None for p in procs):
        for p in procs:  # each part's own end (not when the last one ended)
            if "ended" not in p and p["proc"].poll() is not None:
                p["ended"] = time.monotonic() - started
        if time.monotonic() - started > deadline_s:
            for p in procs:
                if p["proc"].poll() is None:
                    os.killpg(p["proc"].pid, signal.SIGTERM)
                    p["stopped"] = True
            time.sleep(10)
            for p in procs:
                if p["proc"].poll() is None:
                    os.killpg(p["proc"].pid, signal.SIGKILL)
            break
        time.sleep(2)
    outcomes = []
    for p in procs:
        rc = p["proc"].wait()
        p["log"].close()
        outcome = {
            "part": p["part"],
            "arm": p["arm"],
            "seed": p["seed"],
            "rc": rc,
            "stopped_at_deadline": p.get("stopped", False),
            "ended_after_s": round(p.get("ended", time.monotonic() - started)),
            "command": " ".join(p["cmd"][1:]),
        }
        outcomes.append(outcome)
        print(json.dumps(outcome), flush=True)
    return outcomes


def merge(out: Path, outcomes: list[dict[str, Any]], threads: int = 1) -> Path:
    """The parts merged into `out/study`; what was merged in `out/study/merge.json`."""
    study = out / "study"
    parts = [
        out / "parts" / o["part"] for o in outcomes if (out / "parts" / o["part"] / "manifest.json").exists()
    ]
    if not parts:
        raise SystemExit(f"{out}/parts: no part wrote a manifest; nothing to merge (see {out}/logs)")
    (study / "data").mkdir(parents=True, exist_ok=True)
    for name in ("train.jsonl", "eval.jsonl", "transfer.jsonl"):
        texts = {p: (p / "data" / name).read_bytes() for p in parts if (p / "data" / name).exists()}
        if len(set(texts.values())) > 1:
            raise SystemExit(
                f"data/{name}: the parts drew different questions ({', '.join(map(str, texts))})"
            )
        if texts:
            (study / "data" / name).write_bytes(next(iter(texts.values())))
    duplicates: dict[str, int] = {}
    for sub in ("rows", "audits"):
        (study / sub).mkdir(exist_ok=True)
        for part in parts:
            for path in sorted((part / sub).glob("*")):
                dest = study / sub / path.name
                if not dest.exists():
                    shutil.copyfile(path, dest)
                elif dest.read_bytes() != path.read_bytes():
                    duplicates[path.name] = duplicates.get(path.name, 0) + 1
    (study / "runs").mkdir(exist_ok=True)
    finished = []
    for part in parts:
        for run in sorted((part / "runs").glob("*")):
            if (run / "summary.json").exists() and not (study / "runs" / run.name).exists():
                (study / "runs" / run.name).symlink_to(run.resolve())
                finished.append(run.name)
    manifests = [json.loads((p / "manifest.json").read_text()) for p in parts]
    manifest = dict(manifests[0])
    manifest["arms"] = ["before", *sorted({a for m in manifests for a in m["arms"] if a != "before"})]
    manifest["seeds"] = sorted({s for m in manifests for s in m["seeds"]})
    manifest["processes"] = [p for m in manifests for p in m.get("processes", [])]
    manifest["command"] = "bench/crl_team_parallel.py " + " ".join(sys.argv[1:])
    manifest["part_commands"] = [m["command"] for m in manifests]
    manifest["wall_s"] = max(m.get("wall_s", 0) for m in manifests)
    manifest["threads_per_part"] = threads
    (study / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    record = {
        "parts": outcomes,
        "trainings_finished": finished,
        "rows_differing_between_parts": duplicates,
    }
    (study / "merge.json").write_text(json.dumps(record, indent=1) + "\n")
    return study


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    own, study_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--jobs", nargs="+", type=parse_job, required=True, help="ARM:SEEDS, e.g. uniform:0-5"
    )
    parser.add_argument("--deadline-s", type=float, default=float("inf"), help="stop the parts still running")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per part (OMP_NUM_THREADS)")
    args = parser.parse_args(own)
    for flag in ("--out", "--arms", "--seeds"):
        if flag in study_args:
            raise SystemExit(f"{flag}: set by crl_team_parallel.py for each part; leave it out after --")
    jobs = [j for group in args.jobs for j in group]
    outcomes = run_parts(args.out, jobs, study_args, args.deadline_s, args.threads)
    study = merge(args.out, outcomes, args.threads)
    print(json.dumps({"merged": str(study), **json.loads((study / "merge.json").read_text())}, indent=1))


if __name__ == "__main__":
    main()
