"""The `pick` seat's study (`bench/crl_team.py --settings pick`): summary and table from its rows alone.

    python bench/crl_team_pick_report.py runs/crl_pick --pack bench/results/crl_pick   # ship, then report
    python bench/crl_team_pick_report.py bench/results/crl_pick                        # report a shipped study

Per (arm, seed), over the held-out questions: the team's score (primary), the team with the teammates'
display order reversed (position swap), the team minus the question-blind floor (the policy seat's
leave-one-out value: without the policy the first shown teammate's answer stands), how often the policy's own
answer is right, how often it picks the teammate the cue word names, and how it picks (a teammate's number, a
name, nothing). The constants (floor, copy each teammate by name, oracle) are shipped as rows and recomputed
here from the untrained policy's rows; a mismatch stops the report.

The primary comparison, named before the arms ran: the held-out team score at the last update, C-RL (uniform)
minus RL on the policy's own correctness in the seat (`own`), and C-RL minus collaborative SFT (`sft`); paired
by seed, 95% t-interval over seeds. Everything else is secondary. The positive control passes when it closes
at least half the gap from the floor to the oracle.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import crl_team_report as base  # noqa: E402

ARMS = {
    "before": "before (untrained)",
    "control": "positive control: supervised on the oracle's answer",
    "warm": "format warm start (a shown name at random, no skill)",
    "solo": "solo RL (policy alone, no teammates)",
    "own": "RL on the policy's own correctness in the seat",
    "sft": "collaborative SFT (team-rewarded rollouts)",
    "uniform": "C-RL, uniform credit (team reward)",
    "replay": "C-RL, replay credit (team reward)",
}
CONSTANTS = ("floor", "copy-ana", "copy-ben", "copy-cal", "oracle")
PRIMARY = (("uniform", "own"), ("uniform", "sft"))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def per_seed(rows: list[dict], arm: str, key: Any, kind: str = "audit") -> dict[Any, list[float]]:
    """seed -> the values `key(row)` of `arm`'s rows of evaluation `kind`."""
    out: dict[Any, list[float]] = {}
    for r in rows:
        if r["arm"] == arm and r["eval"] == kind:
            out.setdefault(r["seed"], []).append(float(key(r)))
    return out


def check_constants(rows: list[dict]) -> dict[str, float]:
    """Each constant's held-out score, from its shipped rows, after recomputing them from the untrained
    policy's rows (stops on a mismatch)."""
    import crl_team

    before = sorted((r for r in rows if r["arm"] == "before" and r["eval"] == "audit"), key=lambda r: r["id"])
    recomputed = crl_team.pick_constants(before)
    out = {}
    for name in CONSTANTS:
        shipped = {r["id"]: r["score"] for r in rows if r["arm"] == name}
        again = {r["id"]: r["score"] for r in recomputed[name]}
        if shipped != again:
            raise SystemExit(
                f"constant {name}: the shipped rows differ from the ones recomputed from the rows"
            )
        out[name] = _mean(list(shipped.values()))
    return out


def _fmt(stat: tuple[float, float, float], signed: bool = False) -> str:
    mean, low, high = stat
    sign = "+" if signed else ""
    if math.isnan(low):
        return f"{mean:{sign}.3f}"
    return f"{mean:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]"


def summarise(rows: list[dict], curves: list[dict], setting: str = "pick") -> dict[str, Any]:
    """Every figure of the table, from the rows (and the trainings' metrics lines for the training curve)."""
    rows = [r for r in rows if r.get("setting") == setting]
    constants = check_constants(rows)
    floor, oracle = constants["floor"], constants["oracle"]
    measures = {
        "team": ("audit", lambda r: r["score"]),
        "swap": ("swap", lambda r: r["score"]),
        "loo": ("audit", lambda r: r["score"] - float(r["slots_right"][0])),
        "own": ("audit", lambda r: r["own"]),
        "owner": ("audit", lambda r: r["picked_by"] != "none" and r["picked"] == r["kind"]),
        "by_number": ("audit", lambda r: r["picked_by"] == "number"),
        "by_name": ("audit", lambda r: r["picked_by"] == "name"),
        "by_none": ("audit", lambda r: r["picked_by"] == "none"),
    }
    arms: dict[str, Any] = {}
    for arm in ARMS:
        team = per_seed(rows, arm, measures["team"][1])
        if not team:
            continue
        seeds = sorted(team, key=lambda s: -1 if s is None else s)
        entry: dict[str, Any] = {"seeds": seeds}
        for name, (kind, key) in measures.items():
            values = per_seed(rows, arm, key, kind)
            entry[name] = base.t_interval([_mean(values[s]) for s in seeds if s in values])
            entry[f"{name}_per_seed"] = [_mean(values[s]) for s in seeds if s in values]
        # What a policy learnt, cue by cue: the cue words all of whose held-out questions the team got right,
        # and the teammates it named (a policy that never names one cannot reach the oracle).
        audits = [r for r in rows if r["arm"] == arm and r["eval"] == "audit"]
        cues = sorted({r["cue"] for r in audits if "cue" in r})
        entry["cues"] = len(cues)
        entry["cues_learnt_per_seed"] = [
            sum(all(r["score"] for r in audits if r["seed"] == s and r["cue"] == c) for c in cues)
            for s in seeds
        ]
        entry["named_per_seed"] = [
            {m: sum(r["picked"] == m for r in audits if r["seed"] == s) for m in ("ana", "ben", "cal")}
            for s in seeds
        ]
        gap = [(m - floor) / (oracle - floor) for m in entry["team_per_seed"]]
        entry["gap_closed"] = base.t_interval(gap)
        arms[arm] = entry
    pairs = {}
    for a, b in [*PRIMARY, *((a, "before") for a in arms if a != "before")]:
        if a not in arms or b not in arms:
            continue
        ta, tb = per_seed(rows, a, measures["team"][1]), per_seed(rows, b, measures["team"][1])
        if b == "before":
            common = [s for s in ta]
            diffs = [_mean(ta[s]) - _mean(tb[None]) for s in common]
        else:
            common = [s for s in ta if s in tb]
            diffs = [_mean(ta[s]) - _mean(tb[s]) for s in common]
        if diffs:
            pairs[f"{a} - {b}"] = {"seeds": common, "diff": base.t_interval(diffs), "per_seed": diffs}
    thirds: dict[str, list[float]] = {}
    for arm in arms:
        lines = [c for c in curves if c.get("setting") == setting and c["arm"] == arm and "reward" in c]
        steps = max((c["step"] for c in lines), default=0)
        if steps >= 3:
            thirds[arm] = [
                _mean([c["reward"] for c in lines if lo <= c["step"] <= hi]) for lo, hi in base._thirds(steps)
            ]
    return {
        "constants": constants,
        "arms": arms,
        "pairs": pairs,
        "training_reward_thirds": thirds,
        "curves": held_out_curves(rows, arms),
        "training": training_lines(curves, setting, arms),
    }


def held_out_curves(rows: list[dict], arms: dict[str, Any]) -> dict[str, dict[int, Any]]:
    """arm -> update -> the held-out team score over seeds at that update (`crl_team_curve.py`'s rows; update
    0 is the untrained policy, the last the final policy's evaluation): every arm at matched rollouts."""
    out: dict[str, dict[int, Any]] = {}
    last = max((r["step"] for r in rows if r["eval"] == "curve"), default=None)
    if last is None:
        return out
    for arm, entry in arms.items():
        if arm == "before":
            continue
        points: dict[int, list[float]] = {0: [arms["before"]["team"][0]]}  # one untrained policy
        for step in sorted({r["step"] for r in rows if r["eval"] == "curve" and r["arm"] == arm}):
            values = per_seed([r for r in rows if r.get("step") == step], arm, lambda r: r["score"], "curve")
            points[step] = [_mean(values[s]) for s in entry["seeds"] if s in values]
        points[-1] = entry["team_per_seed"]  # the final policy (its update: the manifest's steps)
        out[arm] = {k: {"seeds": len(v), "team": base.t_interval(v)} for k, v in points.items()}
    return out


def training_lines(curves: list[dict], setting: str, arms: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per arm, from the trainings' metrics lines: the share of GRPO groups whose rewards differ (the others
    give no advantage), over all updates and over the first and last tenth, and the median seconds an update
    took."""
    import statistics

    out: dict[str, dict[str, float]] = {}
    for arm in arms:
        lines = [c for c in curves if c.get("setting") == setting and c["arm"] == arm]
        if not lines:
            continue
        steps = max(c["step"] for c in lines)
        tenth = max(1, steps // 10)
        entry = {"step_time_median_s": statistics.median(c["step_time"] for c in lines)}
        sampled = [c for c in lines if "entropy" in c]
        if sampled:  # the entropy of the policy's samples (TRL's, over its completion tokens)
            entry["entropy_first"] = _mean([c["entropy"] for c in sampled if c["step"] <= tenth])
            entry["entropy_last"] = _mean([c["entropy"] for c in sampled if c["step"] > steps - tenth])
        varied = [c for c in lines if "groups_varied" in c]
        if varied:
            entry["groups_varied"] = _mean([c["groups_varied"] for c in varied])
            entry["groups_varied_first"] = _mean([c["groups_varied"] for c in varied if c["step"] <= tenth])
            entry["groups_varied_last"] = _mean(
                [c["groups_varied"] for c in varied if c["step"] > steps - tenth]
            )
        out[arm] = entry
    return out


def _sampling(manifest: dict[str, Any]) -> str:
    """The rollouts' temperature and the RL arms' advantage baseline, where the manifest records them."""
    if "temperature" not in manifest:  # a study from before either was an option
        return ""
    baseline = {"group": "each question's group mean (GRPO)", "batch": "the whole update's mean"}
    terms = []
    if manifest.get("entropy_target") is not None:
        terms.append(
            f"an entropy floor {manifest['entropy_target']:g} (bonus at least {manifest.get('entropy_coef') or 0:g} "
            "at or below it)"
        )
    elif manifest.get("entropy_coef"):
        terms.append(f"an entropy bonus {manifest['entropy_coef']:g}")
    if manifest.get("beta"):
        terms.append(f"a KL to the initial policy, beta {manifest['beta']:g}")
    return (
        f", rollouts at temperature {manifest['temperature']}, the RL arms' advantage baseline "
        f"{baseline[manifest.get('baseline', 'group')]}"
        + (f", the RL arms with {' and '.join(terms)}" if terms else "")
    )


def table(summary: dict[str, Any], manifest: dict[str, Any]) -> str:
    """The markdown table (and the lines around it) of `summary`."""
    c = summary["constants"]
    names = dict(ARMS)
    warm = manifest.get("policy") not in (None, "smollm2-135m")
    if warm:  # every arm starts from another policy than the zoo's: the study's "before" is that policy
        names["before"] = "before: the format warm start every arm starts from"
    n = manifest.get("eval_size")
    lines = [
        f"Setting `{manifest['settings'][-1]}`: {n} held-out questions (never trained on), {manifest.get('steps')} updates of "
        f"{manifest.get('prompts_per_step')} prompts x {manifest.get('rollouts_per_prompt')} rollouts per arm, "
        f"policy {'smollm2-135m after the format warm start' if warm else manifest.get('policy')} (LoRA r 16), "
        f"learning rate {manifest.get('learning_rate')} "
        f"({manifest.get('lr_schedule', 'linear')}){_sampling(manifest)}. Intervals: 95% t over seeds; one seed: "
        "no interval.",
        "",
        f"Constants (per-question rows, recomputed from the rows): question-blind floor (the first shown "
        f"teammate) {c['floor']:.3f}; copy Ana {c['copy-ana']:.3f}, copy Ben {c['copy-ben']:.3f}, copy Cal "
        f"{c['copy-cal']:.3f} (each needs the names, not the question); oracle {c['oracle']:.3f}.",
        "",
        *(
            [
                "Every arm starts from a question-blind format warm start (a shown name at random, "
                "`crl_team.py --arms warm`), not from the zoo's policy.",
                "",
            ]
            if warm
            else []
        ),
        "| arm | seeds | team score | per seed | gap closed (floor -> oracle) | team - floor (LOO) | position "
        "swap | policy's own answer right | picks the cue's teammate | picks by number / name / none |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, e in summary["arms"].items():
        seeds = ",".join("-" if s is None else str(s) for s in e["seeds"])
        picks = " / ".join(f"{e[k][0]:.2f}" for k in ("by_number", "by_name", "by_none"))
        lines.append(
            f"| {names[arm]} | {seeds} | {_fmt(e['team'])} | "
            f"{' / '.join(f'{v:.3f}' for v in e['team_per_seed'])} | {_fmt(e['gap_closed'], True)} | "
            f"{_fmt(e['loo'], True)} | {_fmt(e['swap'])} | {_fmt(e['own'])} | {_fmt(e['owner'])} | {picks} |"
        )
    lines += [
        "",
        "| paired difference of the team score | seeds | mean [t 95%] | per seed | |",
        "|---|---|---|---|---|",
    ]
    for name, p in summary["pairs"].items():
        a, b = name.split(" - ")
        tag = "**primary**" if (a, b) in PRIMARY else "secondary"
        lines.append(
            f"| {names[a]} minus {names[b]} | {len(p['seeds'])} | {_fmt(p['diff'], True)} | "
            f"{' / '.join(f'{v:+.3f}' for v in p['per_seed'])} | {tag} |"
        )
    learnt = {a: e for a, e in summary["arms"].items() if e.get("cues")}
    if learnt:
        parts = [
            f"{names[a]} {' / '.join(str(n) for n in e['cues_learnt_per_seed'])} (named Ana / Ben / Cal: "
            + "; ".join(f"{d['ana']} / {d['ben']} / {d['cal']}" for d in e["named_per_seed"])
            + ")"
            for a, e in learnt.items()
        ]
        lines += [
            "",
            f"Cue words learnt per seed (of {max(e['cues'] for e in learnt.values())}: every held-out question of "
            "the cue right), and how often the policy named each teammate on the held-out questions: "
            + "; ".join(parts)
            + ".",
        ]
    if summary["training_reward_thirds"]:
        parts = [
            f"{names[a]} {' / '.join(f'{v:.2f}' for v in t)}"
            for a, t in summary["training_reward_thirds"].items()
        ]
        lines += [
            "",
            "Training reward by thirds of the updates (seed means; each arm's own reward: the team's for C-RL "
            "and SFT, the policy's own correctness for `own`, the policy alone for solo; the control's is its "
            "loss, not shown): " + "; ".join(parts) + ".",
        ]
    if summary.get("curves"):
        steps = sorted({k for c in summary["curves"].values() for k in c if k >= 0})
        final = manifest.get("steps")
        per = int(manifest.get("prompts_per_step", 2)) * int(manifest.get("rollouts_per_prompt", 4))
        head = [f"{k} ({k * per})" for k in steps] + [f"{final} ({final * per}, final)"]
        lines += [
            "",
            f"Held-out team score at matched numbers of updates (rollouts, {per} an update; the control's: "
            "supervised sequences), mean over seeds [95% t]; update 0 is the "
            + ("warm start every arm starts from:" if warm else "untrained policy:"),
            "",
            "| arm | " + " | ".join(head) + " |",
            "|---|" + "---|" * len(head),
        ]
        for arm, points in summary["curves"].items():
            cells = [_fmt(points[k]["team"]) if k in points else "-" for k in [*steps, -1]]
            lines.append(f"| {names[arm]} | " + " | ".join(cells) + " |")
    varied = {a: t for a, t in summary.get("training", {}).items() if "groups_varied" in t}
    if varied:
        parts = [
            f"{names[a]} {t['groups_varied']:.2f} ({t['groups_varied_first']:.2f} in the first tenth of the "
            f"updates, {t['groups_varied_last']:.2f} in the last"
            + (
                f"; the entropy of its samples {t['entropy_first']:.2f} -> {t['entropy_last']:.2f})"
                if "entropy_first" in t
                else ")"
            )
            for a, t in varied.items()
        ]
        lines += [
            "",
            "Share of groups (a question's 4 rollouts) whose rewards differ, over every update of every seed "
            + (
                "(under the batch baseline, which these RL arms had, a rollout's advantage is its reward minus "
                "the whole update's mean, so a group of identical rewards still teaches unless the whole update "
                "scored alike; SFT trains on whichever rollouts scored 1): "
                if manifest.get("baseline") == "batch"
                else "(under the group baseline a group of identical rewards has no advantage and teaches "
                "nothing; SFT trains on whichever rollouts scored 1): "
            )
            + "; ".join(parts)
            + ".",
        ]
        # (the studies before `groups_varied` was logged ran under other loads: their cost is in BENCHMARKS.md)
        parts = [f"{names[a]} {t['step_time_median_s']:.1f} s" for a, t in summary["training"].items()]
        # The 2-prompt studies ran two trainings at once, one thread each; the larger updates one at a time;
        # a study on a GPU (`crl_team_parallel.py`), every training at once, one thread each.
        if manifest.get("part_commands"):  # crl_team_parallel.py: every training of the study at once
            threads = manifest.get("threads_per_part", 1)
            how = (
                f"all {len(manifest['part_commands'])} trainings at once, {threads} CPU thread"
                f"{'s' if threads != 1 else ''} each{', on one GPU' if manifest.get('device') == 'cuda' else ''}; "
                f"{manifest.get('machine', 'machine not recorded')}"
            )
        elif int(manifest.get("prompts_per_step", 2)) == 2:
            how = "two trainings at once, one thread each, 2 cores"
        else:
            how = "one training at a time, two threads, 2 cores"
        lines += ["", f"Median seconds an update took ({how}): "]
        lines[-1] += "; ".join(parts) + "."
    return "\n".join(lines) + "\n"


def build(folder: Path) -> tuple[dict[str, Any], str]:
    """(summary, table) of the study in `folder`; writes summary.json and table.md there."""
    manifest = json.loads((folder / "manifest.json").read_text())
    summary = summarise(base.read_rows(folder), base.read_curves(folder), manifest["settings"][-1])
    text = table(summary, manifest)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (folder / "table.md").write_text(text)
    return summary, text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--pack", type=Path, help="first ship the run's rows here, then report from them")
    parser.add_argument(
        "--doc", type=Path, help="replace this file's <!-- crl-SETTING-table --> block with the table"
    )
    args = parser.parse_args(argv)
    folder = args.folder
    if args.pack:
        base.pack(folder, args.pack)
        folder = args.pack
    _, text = build(folder)
    if args.doc:
        manifest = json.loads((folder / "manifest.json").read_text())
        args.doc.write_text(replace_block(args.doc.read_text(), text, manifest, str(args.doc)))
    print(text)


def markers(manifest: dict[str, Any]) -> tuple[str, str]:
    """The markers of a study's table in a page (docs/crl-study.md): one block per setting, and one of its own
    for a study whose arms start from the format warm start (`--policy` a warm start's folder; `-qN` added at
    N questions an update other than 2), whose RL arms had an exploration term (`--entropy-coef`,
    `--entropy-target`, `--beta`) or took the batch's mean as their baseline (`--baseline batch`), the first
    that applies."""
    name = manifest["settings"][-1].replace("_", "-")
    if manifest.get("device") == "cuda":  # the study on a GPU (crl_team_parallel.py, bench/gpu_study.sh)
        return f"<!-- crl-{name}-gpu-table -->", f"<!-- /crl-{name}-gpu-table -->"
    if manifest.get("policy") not in (None, "smollm2-135m"):
        name += "-warm"
        if (
            int(manifest.get("prompts_per_step", 2)) != 2
        ):  # the warm start's study at more questions an update
            name += f"-q{manifest['prompts_per_step']}"
    elif manifest.get("entropy_coef") or manifest.get("entropy_target") is not None or manifest.get("beta"):
        name += "-explore"
    elif manifest.get("baseline", "group") == "batch":
        name += "-batch"
    return f"<!-- crl-{name}-table -->", f"<!-- /crl-{name}-table -->"


def replace_block(text: str, block: str, manifest: dict[str, Any], where: str) -> str:
    """`text` with the part between the study's markers replaced by `block`."""
    start, end = markers(manifest)
    if start not in text or end not in text:
        raise SystemExit(f"{where}: no {start} ... {end} block")
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{block}{end}{rest.split(end, 1)[1]}"


if __name__ == "__main__":
    main()
