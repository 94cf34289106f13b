"""The exploration sweep of the `pick_brief` study: which setting keeps C-RL exploring, chosen on a dev split.

Each candidate is a study of its own (`bench/crl_team.py --dev-size 60 --arms uniform --seeds 0`, one flag
apart: `--entropy-coef`, `--entropy-target`, `--beta`, `--lr`): C-RL trained on 240 of the 300 training
questions and evaluated on the other 60 (the dev split); the 60 held-out questions are not in its folder. A
candidate whose collapse was plain before its last update was stopped there, to spend the compute on the
arms: its row says at which update, and has no dev score after it.

    python bench/crl_team_sweep.py runs/sweep/ent003 runs/sweep/kl01 ... --pack bench/results/crl_brief_sweep
    python bench/crl_team_sweep.py bench/results/crl_brief_sweep        # the table of a shipped sweep

Per candidate, from its metrics lines, logged replies and dev rows: the dev team score of the untrained
policy and of C-RL at each evaluated update; the share of groups whose rewards differ, TRL's mean token
entropy of the samples and the share of logged replies that name exactly one teammate, each over the first
and the last five updates run; the training team reward over the last five.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import crl_team_graphs as team  # noqa: E402

WINDOW = 5  # updates at the start and at the end of a run the time-course columns average over
NAMES = re.compile(r"\b(" + "|".join(team.PICK_TEAMMATES) + r")\b", re.IGNORECASE)


def _lines(path: Path) -> list[dict]:
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def pack(folder: Path, target: Path) -> None:
    """Ship one candidate (`runs/sweep/NAME`) as `target`: manifest, dev rows, metrics and logged rollouts."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(folder / "manifest.json", target / "manifest.json")
    rows = [r for f in sorted((folder / "rows").glob("*.jsonl")) for r in _lines(f)]
    (run,) = (folder / "runs").iterdir()  # a candidate is one training
    for name, records in (
        ("rows.jsonl.gz", rows),
        ("metrics.jsonl.gz", _lines(run / "metrics.jsonl")),
        ("rollouts.jsonl.gz", _lines(run / "rollouts.jsonl") if (run / "rollouts.jsonl").exists() else []),
    ):
        (target / name).write_bytes(
            gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode(), mtime=0)
        )
    (target / "finished.json").write_text(json.dumps((run / "summary.json").exists()) + "\n")


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def one_name(reply: str) -> bool:
    """Whether a reply names exactly one teammate (what the seat reads as a pick)."""
    return len({m.lower() for m in NAMES.findall(reply)}) == 1


def candidate(folder: Path) -> dict[str, Any]:
    """One shipped candidate's row."""
    manifest = json.loads((folder / "manifest.json").read_text())
    metrics = _lines(folder / "metrics.jsonl.gz")
    rollouts = _lines(folder / "rollouts.jsonl.gz")
    rows = _lines(folder / "rows.jsonl.gz")
    steps = max(m["step"] for m in metrics)
    first = [m for m in metrics if m["step"] <= WINDOW]
    last = [m for m in metrics if m["step"] > steps - WINDOW]

    def replies(window: list[dict]) -> float | None:
        wanted = {m["step"] for m in window}
        return _mean(
            [
                float(one_name(t.get("completion") or ""))
                for r in rollouts
                if r["step"] in wanted
                for t in r["turns"]
                if t.get("policy")
            ]
        )

    def dev(arm: str, step: int | None = None) -> float | None:
        picked = [
            r["score"]
            for r in rows
            if r["arm"] == arm and r["eval"] in ("audit", "curve") and r.get("step") == step
        ]
        return _mean(picked)

    (arm,) = [a for a in manifest["arms"] if a != "before"]
    scores = {0: dev("before")}
    for step in manifest.get("curve_steps", []):
        scores[step] = dev(arm, step)
    scores[manifest["steps"]] = dev(arm)
    return {
        "name": folder.name,
        "flags": {
            k: manifest.get(k)
            for k in ("learning_rate", "entropy_coef", "entropy_target", "beta", "policy", "prompts_per_step")
        },
        "arm": arm,
        "steps_planned": manifest["steps"],
        "steps_run": steps,
        "finished": json.loads((folder / "finished.json").read_text()),
        "dev_floor": dev("floor"),
        "dev_team": {k: v for k, v in scores.items() if v is not None},
        "groups_varied": [
            _mean([m["groups_varied"] for m in w if "groups_varied" in m]) for w in (first, last)
        ],
        "entropy": [_mean([m["entropy"] for m in w if "entropy" in m]) for w in (first, last)],
        "one_name": [replies(first), replies(last)],
        "team_reward_last": _mean([m["system_reward"] for m in last if "system_reward" in m]),
        "picks_by_cue": picks_by_cue([r for r in rows if r["arm"] == arm and r["eval"] == "audit"]),
    }


def picks_by_cue(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per cue word, the share of the policy's dev replies that pick each teammate (or nobody)."""
    out: dict[str, dict[str, float]] = {}
    for cue in sorted({r["cue"] for r in rows}):
        picked = [r["picked"] or "none" for r in rows if r["cue"] == cue]
        out[cue] = {m: picked.count(m) / len(picked) for m in [*team.PICK_TEAMMATES, "none"]}
    return out


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def setting_text(flags: dict[str, Any]) -> str:
    """A candidate's setting in words."""
    parts = [f"lr {flags['learning_rate']:g}"]
    if flags.get("arm") == "warm":
        parts.insert(0, "format warm start (SFT on a shown name drawn at random)")
    elif flags.get("policy") not in (None, "smollm2-135m"):
        parts.insert(0, "C-RL from the warm start")
    if flags.get("entropy_target") is not None:
        parts.append(
            f"entropy floor {flags['entropy_target']:g} (TRL's adaptive bonus, at least "
            f"{flags.get('entropy_coef') or 0:g} below it)"
        )
    elif flags.get("entropy_coef"):
        parts.append(f"entropy bonus {flags['entropy_coef']:g}")
    if flags.get("beta"):
        parts.append(f"KL to the initial policy, beta {flags['beta']:g}")
    if flags.get("prompts_per_step") not in (None, 2):
        parts.append(f"{flags['prompts_per_step']} questions x 4 rollouts an update")
    return ", ".join(parts)


def table(rows: list[dict[str, Any]]) -> str:
    """The sweep's markdown table."""
    evaluated = sorted({k for r in rows for k in r["dev_team"] if k > 0})
    head = "".join(f"dev at {k} | " for k in evaluated)
    lines = [
        "| candidate | setting | updates run | dev untrained | " + head + "groups varied (first 5 -> last "
        "5 updates) | entropy | replies naming one teammate | team reward, last 5 |",
        "|---|---|---|---|" + "---|" * len(evaluated) + "---|---|---|---|",
    ]
    for r in rows:
        run = f"{r['steps_run']} of {r['steps_planned']}" + ("" if r["finished"] else " (stopped)")
        cells = "".join(f"{_f(r['dev_team'].get(k))} | " for k in evaluated)
        pair = lambda xs: f"{_f(xs[0])} -> {_f(xs[1])}"  # noqa: E731
        lines.append(
            f"| {r['name']} | {setting_text({**r['flags'], 'arm': r['arm']})} | {run} | {_f(r['dev_team'].get(0))} | {cells}"
            f"{pair(r['groups_varied'])} | {pair(r['entropy'])} | {pair(r['one_name'])} | "
            f"{_f(r['team_reward_last'])} |"
        )
    floor = {_f(r["dev_floor"]) for r in rows}
    lines += ["", f"Dev floor (the first shown teammate): {', '.join(sorted(floor))}; oracle 1.00."]
    for r in rows:
        if r["name"] != "warm":
            continue
        names = [*team.PICK_TEAMMATES, "none"]
        lines += [
            "",
            "Picks of the format warm start on the dev split, by cue word (share of that cue's questions; the "
            "cue's owner in brackets): ",
            "",
            "| cue | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        for cue, shares in r["picks_by_cue"].items():
            owner = team.OWNER[cue]
            lines.append(f"| {cue} ({owner}) | " + " | ".join(f"{shares[m]:.2f}" for m in names) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+", help="candidate runs, or one shipped sweep")
    parser.add_argument("--pack", type=Path, help="ship the candidates here first, then report from them")
    args = parser.parse_args(argv)
    if args.pack:
        for folder in args.folders:
            pack(folder, args.pack / folder.name)
        shipped = [args.pack / f.name for f in args.folders]
    else:
        shipped = sorted(p.parent for p in args.folders[0].glob("*/manifest.json"))
    # In the order they were run (then by name): the table reads as the sweep went.
    started = {f: json.loads((f / "manifest.json").read_text()).get("started", "") for f in shipped}
    rows = [candidate(f) for f in sorted(shipped, key=lambda f: (started[f], f.name))]
    text = table(rows)
    root = args.pack or args.folders[0]
    (root / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    (root / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
