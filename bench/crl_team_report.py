"""The C-RL team study's summary, table and figure, from its per-question rows alone (`bench/crl_team.py`).

    python bench/crl_team_report.py runs/crl_team_small                     # a run folder (rows/, manifest.json)
    python bench/crl_team_report.py bench/results/crl_team --readme docs/crl.md --figure docs/images/crl-team.png
    python bench/crl_team_report.py runs/crl_team_small --pack bench/results/crl_team   # ship a run's rows

Reads `rows.jsonl.gz` (or `rows/*.jsonl`), `curves.jsonl.gz` (or `runs/*/metrics.jsonl`), `rollouts.jsonl.gz`
(or `runs/*/rollouts.jsonl`) and `manifest.json` under the folder; writes `summary.json` and `table.md` there
(or under `--pack`), the figure to `--figure`, and with `--readme FILE` replaces the text between FILE's `<!-- crl-team-table -->` and
`<!-- /crl-team-table -->` markers with the table.

Per (setting, arm, seed), over the held-out questions: the team's score; the policy seat's leave-one-out
value (the team minus the team without the policy) and Shapley value (exact, from the question's eight
coalition scores; checked against the audit report's means); the policy alone; the team with the slot order
reversed (position swap); the team minus the best constant policy. Constant policies, computed from the
teammates' answers in the same rows: copy slot 1 (in the gate: always accept), copy slot 2 (always reject),
copy the best teammate (the one right most often on the training questions), an oracle selector (right
whenever a teammate is).

Intervals are over seeds: each arm's seed means, a t-interval (95%, n - 1 degrees of freedom) and a
hierarchical bootstrap (seeds, then questions within each drawn seed; 2,000 resamples). A difference between
two arms is paired: per seed (the same seed means the same prompts and draws), on the same questions.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import sys
from collections import defaultdict
from itertools import combinations
from pathlib import Path
from typing import Any

RESAMPLES = 2000
ARM_ORDER = ("before", "solo", "sft", "uniform", "replay")
ARM_NAMES = {
    "before": "before (untrained)",
    "solo": "solo RL",
    "sft": "collaborative SFT",
    "uniform": "C-RL, uniform credit",
    "replay": "C-RL, replay credit",
}
PLAYERS = ("policy", "adder", "multiplier")
MARKERS = ("<!-- crl-team-table -->", "<!-- /crl-team-table -->")


# --- reading ---------------------------------------------------------------------------------------------------


def _jsonl(text: str, where: str) -> list[dict]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise SystemExit(f"{where}:{n}: not JSON ({err})") from None
    return out


def read_rows(folder: Path) -> list[dict]:
    """Every row of a shipped study (`rows.jsonl.gz`) or of a run folder (`rows/*.jsonl`)."""
    packed = folder / "rows.jsonl.gz"
    if packed.exists():
        return _jsonl(gzip.decompress(packed.read_bytes()).decode(), str(packed))
    files = sorted((folder / "rows").glob("*.jsonl"))
    if not files:
        raise SystemExit(f"{folder}: no rows.jsonl.gz and no rows/*.jsonl")
    return [r for f in files for r in _jsonl(f.read_text(), str(f))]


def _read_runs(folder: Path, packed: str, name: str) -> list[dict]:
    """The lines of each finished training's `name` (or of the pack's `packed`), tagged with its setting, arm and
    seed."""
    if (folder / packed).exists():
        return _jsonl(gzip.decompress((folder / packed).read_bytes()).decode(), str(folder / packed))
    out = []
    for path in sorted((folder / "runs").glob(f"*/{name}")):
        if not (path.parent / "summary.json").exists():
            continue  # a training still running (or stopped): not one of the study's yet
        setting, arm, seed = path.parent.name.rsplit("-", 2)
        out += [
            {"setting": setting, "arm": arm, "seed": int(seed), **m}
            for m in _jsonl(path.read_text(), str(path))
        ]
    return out


def read_curves(folder: Path) -> list[dict]:
    """Each training run's metrics lines, tagged with its setting, arm and seed."""
    return _read_runs(folder, "curves.jsonl.gz", "metrics.jsonl")


def read_rollouts(folder: Path) -> list[dict]:
    """Each training run's rollouts (every turn of the team, what the policy wrote, the reward the update used),
    tagged with its setting, arm and seed."""
    return _read_runs(folder, "rollouts.jsonl.gz", "rollouts.jsonl")


def best_teammate(folder: Path) -> str:
    """The teammate right most often on the training questions (the skeptic's "copy the best teammate")."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import crl_team_graphs as team

    path = folder / "data" / "train.jsonl"
    if not path.exists():
        raise SystemExit(f"{path}: missing (the training questions pick the best teammate)")
    records = _jsonl(path.read_text(), str(path))
    right = {
        m: sum(team.specialist_answer(skill, r["input"]) == int(r["answer"]) for r in records)
        for m, skill in zip(team.TEAMMATES, ("add", "mul"), strict=True)
    }
    return max(right, key=lambda m: (right[m], m))


# --- per-question values ------------------------------------------------------------------------------------


def shapley(coalitions: dict[str, float], player: str) -> float:
    """Exact Shapley value of `player` from the scores of every coalition ("" = empty, scored 0)."""
    n = len(PLAYERS)
    others = [p for p in PLAYERS if p != player]

    def value(members: set[str]) -> float:
        return coalitions.get(",".join(p for p in PLAYERS if p in members), 0.0) if members else 0.0

    total = 0.0
    for k in range(n):
        weight = math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
        for subset in combinations(others, k):
            total += weight * (value({*subset, player}) - value(set(subset)))
    return total


def constants(row: dict, best: str) -> dict[str, float]:
    """What each constant policy would make the team score on this question (slots as the row shows them)."""
    right = dict(zip(row["slot_members"], row["slots_right"], strict=True))
    # Two replies of the same text (same phrasing, same answer) name one member twice: either slot is its.
    best_right = right.get(best, row["slots_right"][0])
    return {
        "copy slot 1": float(row["slots_right"][0]),
        "copy slot 2": float(row["slots_right"][1]),
        "copy the best teammate": float(best_right),
        "oracle selector": float(any(row["slots_right"])),
    }


def measures(audit: list[dict], swap: list[dict], best: str, seat: str = "vote") -> dict[str, list[float]]:
    """Per-question values of one evaluation (rows in question order) of a policy in `seat`.

    What the policy did, in the last columns: in the vote, its own answer where the teammates differ (slot 1's,
    slot 2's or neither) and whether it names the right one where exactly one is right; in the gate, its
    verdict on every question (accept, reject, none: the answer stands) and whether the verdict is right where
    exactly one slot is right (accept a right slot 1, reject a wrong one)."""
    by_id = {r["id"]: r for r in swap}
    out: dict[str, list[float]] = defaultdict(list)
    for row in audit:
        c = row["coalitions"]
        const = constants(row, best)
        out["team"].append(row["score"])
        out["loo"].append(row["score"] - c["adder,multiplier"])
        if len(c) == 2 ** len(PLAYERS) - 1:  # the full audit (a transfer evaluation plays two coalitions)
            out["shapley"].append(shapley(c, "policy"))
            out["policy_alone"].append(c["policy"])  # the policy in its seat, no teammate
        if row["id"] in by_id:
            s = by_id[row["id"]]
            out["swap"].append(s["score"])
            out["swap_changed"].append(float(s["score"] != row["score"]))
        decisive = row["slots_right"][0] != row["slots_right"][1]
        slots, mine = row["slots"], row.get("policy_answer", "")
        if seat == "gate":
            verdict = row.get("verdict")
            out["votes_slot1"].append(float(verdict is True))
            out["votes_slot2"].append(float(verdict is False))
            out["votes_own"].append(float(verdict is None))
            if decisive:
                out["picks_right"].append(float((verdict is False) != row["slots_right"][0]))
        else:
            if slots[0] != slots[1]:  # what the policy's own vote was, where the teammates differ
                out["votes_slot1"].append(float(mine == slots[0]))
                out["votes_slot2"].append(float(mine == slots[1]))
                out["votes_own"].append(float(mine not in slots))
            if decisive:
                out["picks_right"].append(float(mine == slots[0 if row["slots_right"][0] else 1]))
        if decisive:
            out["follows_right"].append(row["score"])
        for k, v in const.items():
            out[f"const:{k}"].append(v)
    return dict(out)


MEASURES = (
    "team",
    "loo",
    "shapley",
    "policy_alone",
    "swap",
    "swap_changed",
    "minus_best_constant",
    "follows_right",
    "picks_right",
    "votes_slot1",
    "votes_slot2",
    "votes_own",
)
"""What `summarise` reports per arm (where the evaluation has it: a transfer evaluation has no Shapley value,
policy-alone score or swap)."""


def label(setting: str, where: str) -> str:
    """The summary's name of policies trained in `setting` evaluated in `where` (`SEAT/big`: the transfer
    task in that seat)."""
    if where == setting:
        return setting
    if where == f"{setting}/big":
        return f"{setting} on the transfer task (three-digit operands)"
    return f"{setting} evaluated in {where}"


# --- statistics -----------------------------------------------------------------------------------------------


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): a 95% t-interval over the values (seeds); one value: no interval (nan)."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def hierarchical(per_seed: list[list[float]], seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean by resampling seeds, then questions within each drawn seed."""
    import numpy as np

    rng = np.random.default_rng(seed)
    data = [np.asarray(v, dtype=float) for v in per_seed]
    means = np.empty(RESAMPLES)
    for b in range(RESAMPLES):
        drawn = rng.integers(0, len(data), len(data))
        means[b] = np.mean([data[i][rng.integers(0, len(data[i]), len(data[i]))].mean() for i in drawn])
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def stat(per_seed: list[list[float]]) -> dict[str, Any]:
    """Seed means, their t-interval, and the hierarchical bootstrap interval."""
    seed_means = [sum(v) / len(v) if v else math.nan for v in per_seed]
    mean, low, high = t_interval(seed_means)
    boot = hierarchical(per_seed) if len(per_seed) > 1 else (math.nan, math.nan)
    return {"mean": mean, "t95": [low, high], "boot95": list(boot), "per_seed": seed_means}


# --- the summary -------------------------------------------------------------------------------------------------


def _thirds(steps: int) -> list[tuple[int, int]]:
    """Updates 1..steps cut into thirds, as (first, last) of each."""
    return [(1, steps // 3), (steps // 3 + 1, 2 * steps // 3), (2 * steps // 3 + 1, steps)]


def plateau(curves: list[dict], setting: str, arm: str) -> dict[str, Any] | None:
    """The rollout reward of an arm's trainings by thirds of its updates (seed means of each third's mean),
    and the last third minus the middle one per seed with its t-interval: an interval that includes zero
    finds no rise in the last third (a plateau, as far as this many rollouts can tell)."""
    per_seed: dict[Any, dict[int, float]] = defaultdict(dict)
    for m in curves:
        if m["setting"] == setting and m["arm"] == arm:
            per_seed[m["seed"]][m["step"]] = m["system_reward"]
    if not per_seed:
        return None
    steps = min(max(v) for v in per_seed.values())
    if steps < 3:
        return None
    thirds = [
        [sum(v.get(i, 0.0) for i in range(a, b + 1)) / (b - a + 1) for v in per_seed.values()]
        for a, b in _thirds(steps)
    ]
    mean, low, high = t_interval([last - middle for middle, last in zip(thirds[1], thirds[2], strict=True)])
    return {
        "updates": steps,
        "thirds": [sum(t) / len(t) for t in thirds],
        "last_minus_middle": {
            "mean": mean,
            "t95": [low, high],
            "per_seed": [c - b for b, c in zip(*thirds[1:], strict=True)],
        },
    }


def flat_groups(rollouts: list[dict], setting: str, arm: str) -> list[float] | None:
    """The share of an arm's logged rollout groups (one prompt's rollouts in one update: the trainer logs each
    update's first group) whose rewards are all equal, by thirds of the updates (seed means). GRPO's advantage is zero in such a group: it moves nothing, so a
    rising share is a training that has stopped learning whatever its reward."""
    per_seed: dict[Any, dict[tuple, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rollouts:
        if r["setting"] == setting and r["arm"] == arm and r.get("type", "rollout") == "rollout":
            per_seed[r["seed"]][(r["step"], r["example"])].append(r["reward"])
    if not per_seed:
        return None
    steps = min(max(step for step, _ in groups) for groups in per_seed.values())
    if steps < 3:
        return None
    thirds = []
    for a, b in _thirds(steps):
        shares = []
        for groups in per_seed.values():
            flat = [len(set(v)) == 1 for (step, _), v in groups.items() if a <= step <= b]
            shares.append(sum(flat) / len(flat) if flat else math.nan)
        thirds.append(sum(shares) / len(shares))
    return thirds


def held_out_curve(
    checkpoints: list[dict],
    setting: str,
    before: list[float],
    final: dict[str, dict[Any, list[float]]],
    steps: int | None,
) -> dict[str, Any]:
    """Per arm with checkpoint rows (`crl_team_curve.py`): the held-out team score at each evaluated update
    (0: the untrained policy; `steps`: the final policy) over the seeds that have every point, and the last
    update minus the one before it per seed (its t-interval: no change detected when it holds zero)."""
    per: dict[str, dict[int, dict[Any, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for r in checkpoints:
        if r["setting"] == setting:
            per[r["arm"]][r["step"]][r["seed"]].append(r["score"])
    out: dict[str, Any] = {}
    for arm, at in per.items():
        if steps is None:
            continue
        series: dict[int, dict[Any, list[float]]] = {k: dict(v) for k, v in at.items()}
        series[steps] = final.get(arm, {})
        seeds = sorted(set.intersection(*(set(v) for v in series.values())), key=str)
        if not seeds:
            continue
        series[0] = {seed: before for seed in seeds}
        points = sorted(series)
        out[arm] = {
            "seeds": seeds,
            "updates": points,
            "team": {str(k): stat([series[k][seed] for seed in seeds]) for k in points},
            "last_minus_previous": stat(
                [
                    [a - b for a, b in zip(series[points[-1]][seed], series[points[-2]][seed], strict=True)]
                    for seed in seeds
                ]
            ),
        }
    return out


def summarise(
    rows: list[dict],
    best: str,
    manifest: dict,
    curves: list[dict] | None = None,
    rollouts: list[dict] | None = None,
) -> dict[str, Any]:
    """Per setting (as trained and evaluated): constants, each arm's measures over seeds, paired differences."""
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    reports: dict[tuple, dict] = {}
    checkpoints = [r for r in rows if r["eval"] == "curve"]
    rows = [r for r in rows if r["eval"] != "curve"]
    for r in rows:
        key = (r["setting"], r["evaluated_in"], r["arm"], r["seed"])
        if r["eval"] == "report":
            reports[key] = r
        else:
            groups[key][r["eval"]].append(r)
    per: dict[tuple, dict[str, list[float]]] = {}
    for key, evals in groups.items():
        order = {r["id"]: i for i, r in enumerate(evals["audit"])}
        audit = sorted(evals["audit"], key=lambda r: order[r["id"]])
        per[key] = measures(audit, evals.get("swap", []), best, key[1].split("/")[0])
        report = reports.get(key)
        if report is not None:  # the audit's own means must be the rows' (the same plays)
            for name, ours in (("shapley", per[key]["shapley"]), ("loo", per[key]["loo"])):
                theirs = report[name]["policy"]
                if abs(theirs - sum(ours) / len(ours)) > 1e-9:
                    raise SystemExit(
                        f"{key}: the audit's {name} {theirs} is not the rows' {sum(ours) / len(ours)}"
                    )
    finished = sorted({k[3] for k in per if k[3] is not None})
    out: dict[str, Any] = {
        "best_teammate": best,
        "seeds": finished,  # the seeds with results (a study stopped early has fewer than it planned)
        "planned_seeds": manifest.get("seeds"),
        "settings": {},
    }

    def seat_order(pair: tuple[str, str]) -> tuple[int, str, int]:
        """The proposer seat first; in each, its own seat, then the other seat, then the transfer task."""
        setting, where = pair
        return (setting != "vote", setting, 0 if where == setting else 2 if where.endswith("/big") else 1)

    for setting, where in sorted({(k[0], k[1]) for k in per}, key=seat_order):
        keys = {k[2:]: v for k, v in per.items() if k[:2] == (setting, where)}
        if (
            "before",
            None,
        ) not in keys:  # the untrained policy is one policy, whichever seat it was listed in
            found = [v for k, v in per.items() if k[1] == where and k[2] == "before"]
            if found:
                keys[("before", None)] = found[0]
        before = next((v for (arm, _), v in keys.items() if arm == "before"), None)
        if before is None:
            continue
        n = len(before["team"])
        # The best constant policy is one policy (the best mean on these questions, the oracle aside), not the
        # best one per question; the teammates' answers are every arm's, so it is the same for every arm.
        means = {k: sum(v) / n for k, v in before.items() if k.startswith("const:") and "oracle" not in k}
        best_constant = max(means, key=lambda k: means[k])
        for values in keys.values():
            values["minus_best_constant"] = [
                t - c for t, c in zip(values["team"], values[best_constant], strict=True)
            ]
        entry: dict[str, Any] = {
            "seat": where.split("/")[0],
            "n_questions": n,
            "constants": {k[6:]: sum(v) / n for k, v in before.items() if k.startswith("const:")},
            "best_constant": best_constant[6:],
            "arms": {},
            "differences": {},
        }
        if where == setting:
            entry["curves"] = {
                arm: p for arm in ARM_ORDER if (p := plateau(curves or [], setting, arm)) is not None
            }
            for arm, p in entry["curves"].items():  # SFT's update uses no advantage: not its measure
                if arm != "sft" and (flat := flat_groups(rollouts or [], setting, arm)) is not None:
                    p["flat_groups"] = flat
            final = {a: {seed: v["team"] for (arm, seed), v in keys.items() if arm == a} for a in ARM_ORDER}
            entry["held_out_curve"] = held_out_curve(
                checkpoints, setting, before["team"], final, manifest.get("steps")
            )
        names = [a for a in ARM_ORDER if any(arm == a for arm, _ in keys)]
        by_arm = {a: {s: v for (arm, s), v in keys.items() if arm == a} for a in names}
        for arm in names:
            seeds = sorted(by_arm[arm], key=lambda s: -1 if s is None else s)
            entry["arms"][arm] = {
                "seeds": seeds,
                **{
                    m: stat([by_arm[arm][s][m] for s in seeds])
                    for m in MEASURES
                    if all(by_arm[arm][s].get(m) for s in seeds)
                },
            }
        for arm in names[1:]:
            for base in ("before", "solo", "sft"):
                if base == arm or base not in by_arm:
                    continue
                seeds = [s for s in sorted(by_arm[arm]) if base == "before" or s in by_arm[base]]
                if not seeds:
                    continue
                diffs = [
                    [
                        a - b
                        for a, b in zip(
                            by_arm[arm][s]["team"],
                            (by_arm[base][None] if base == "before" else by_arm[base][s])["team"],
                            strict=True,
                        )
                    ]
                    for s in seeds
                ]
                entry["differences"][f"{arm} - {base}"] = {"seeds": seeds, **stat(diffs)}
        out["settings"][label(setting, where)] = entry
    return out


# --- the table ---------------------------------------------------------------------------------------------------


def _ci(s: dict, signed: bool = False) -> str:
    f = (lambda x: f"{x:+.3f}") if signed else (lambda x: f"{x:.3f}")
    low, high = s["t95"]
    if math.isnan(low):
        return f(s["mean"])
    return f"{f(s['mean'])} [{f(low)}, {f(high)}]"


def _cell(arm: dict, key: str, signed: bool = False) -> str:
    """`_ci` of the arm's measure `key`, or "-" where the evaluation has none (a transfer has no Shapley)."""
    return _ci(arm[key], signed) if key in arm else "-"


def _excludes(s: dict) -> str:
    low, high = s["t95"]
    if math.isnan(low):
        return "one seed: no interval"
    if low > 0:
        return "the interval over seeds excludes zero (above)"
    if high < 0:
        return "the interval over seeds excludes zero (below)"
    return "the interval over seeds includes zero"


def table(summary: dict, manifest: dict) -> str:
    """Markdown: per setting, the constants, the arms, the paired differences with a sentence each."""
    seeds = summary.get("seeds") or []
    planned = summary.get("planned_seeds") or seeds
    processes = manifest.get("processes") or [manifest]
    commits: dict[str, list[int]] = {}
    for n, p in enumerate(processes, 1):
        commits.setdefault(
            str(p.get("commit", ""))[:10] + (" (tree with uncommitted changes)" * bool(p.get("tree_dirty"))),
            [],
        ).append(n)
    code = "; ".join(
        f"{c} ({'process' if len(ns) == 1 else 'processes'} {', '.join(map(str, ns))})"
        for c, ns in commits.items()
    )
    lines = [
        f"Run: {len(seeds)} seeds with results ({', '.join(map(str, seeds))})"
        + (f" of the {len(planned)} planned ({', '.join(map(str, planned))})" if planned != seeds else "")
        + f", {_count(manifest.get('steps'), 'update')} of {_count(manifest.get('prompts_per_step'), 'prompt')} "
        f"x {_count(manifest.get('rollouts_per_prompt'), 'rollout')} per arm, "
        f"policy {manifest.get('policy')} (LoRA r 16{', bf16' if manifest.get('bf16') else ''}); "
        f"{len(processes)} {'process' if len(processes) == 1 else 'processes'} on commits {code}. "
        "Intervals: 95% t-intervals over seeds (seed means); paired by seed.",
        "",
    ]
    for setting, entry in summary["settings"].items():
        const = entry["constants"]
        lines += [
            f"**{setting}** ({entry['n_questions']} held-out questions never trained on). Constant policies: "
            + ", ".join(f"{k} {v:.3f}" for k, v in const.items())
            + f" (best teammate on the training questions: {summary['best_teammate']}; the best constant here: "
            f"{entry['best_constant']}).",
            "",
            "| arm | seeds | team score | per seed | LOO of the policy seat | Shapley of the policy seat "
            "| team - best constant | position swap | policy alone | team on decisive questions "
            + (
                "| verdict right (decisive) | verdict: accept / reject / none |"
                if entry.get("seat") == "gate"
                else "| policy names the right one (decisive) | policy's answer: slot 1 / slot 2 / neither |"
            ),
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for arm, a in entry["arms"].items():
            seeds_text = ",".join("-" if s is None else str(s) for s in a["seeds"])
            per_seed = " / ".join(f"{x:.3f}" for x in a["team"]["per_seed"])
            votes = " / ".join(
                f"{a[k]['mean']:.2f}" if k in a else "-" for k in ("votes_slot1", "votes_slot2", "votes_own")
            )
            lines.append(
                f"| {ARM_NAMES.get(arm, arm)} | {seeds_text} | {_ci(a['team'])} | {per_seed} | {_cell(a, 'loo', True)} "
                f"| {_cell(a, 'shapley', True)} | {_cell(a, 'minus_best_constant', True)} | {_cell(a, 'swap')} "
                f"| {_cell(a, 'policy_alone')} | {_cell(a, 'follows_right')} | {_cell(a, 'picks_right')} "
                f"| {votes} |"
            )
        lines += [
            "",
            "| paired difference of the team score | seeds | mean [t 95%] | per seed | hierarchical bootstrap | |",
            "|---|---|---|---|---|---|",
        ]
        for name, d in entry["differences"].items():
            arm, base = name.split(" - ")
            per_seed = " / ".join(f"{x:+.3f}" for x in d["per_seed"])
            boot = d["boot95"]
            boot_text = "" if math.isnan(boot[0]) else f"[{boot[0]:+.3f}, {boot[1]:+.3f}]"
            lines.append(
                f"| {ARM_NAMES.get(arm, arm)} minus {ARM_NAMES.get(base, base)} | {len(d['seeds'])} | {_ci(d, True)} "
                f"| {per_seed} | {boot_text} | {_excludes(d)} |"
            )
        lines += [
            "",
            "Team minus the best constant policy: "
            + "; ".join(
                f"{ARM_NAMES.get(arm, arm)} {_ci(a['minus_best_constant'], True)} ({_excludes(a['minus_best_constant'])})"
                for arm, a in entry["arms"].items()
                if arm != "before"
            )
            + ".",
            "",
        ]
        for arm, c in (entry.get("held_out_curve") or {}).items():
            lines += [
                f"Held-out team score of {ARM_NAMES.get(arm, arm)} by update ({len(c['seeds'])} seeds; checkpoints "
                "evaluated by `crl_team_curve.py`): "
                + ", ".join(f"{k}: {_ci(v)}" for k, v in c["team"].items())
                + f"; the last update minus the one before: {_ci(c['last_minus_previous'], True)} "
                f"({_plateau_words(c['last_minus_previous'])}).",
                "",
            ]
        if entry.get("curves"):
            lines += [
                "Rollout reward by thirds of the updates (seed means; solo RL: the policy alone), and the last "
                "third minus the middle one: "
                + "; ".join(
                    f"{ARM_NAMES.get(arm, arm)} {' / '.join(f'{x:.2f}' for x in c['thirds'])}, "
                    f"{_ci(c['last_minus_middle'], True)} ({_plateau_words(c['last_minus_middle'])})"
                    for arm, c in entry["curves"].items()
                )
                + ".",
                "",
            ]
            flat = {arm: c["flat_groups"] for arm, c in entry["curves"].items() if "flat_groups" in c}
            if flat:
                lines += [
                    "Rollout groups whose rewards were all equal (GRPO's advantage is zero there, so they move "
                    "nothing; each update's first group, the one its training logs), by thirds of the updates "
                    "(seed means): "
                    + "; ".join(
                        f"{ARM_NAMES.get(arm, arm)} {' / '.join(f'{x:.2f}' for x in f)}"
                        for arm, f in flat.items()
                    )
                    + ".",
                    "",
                ]
    return "\n".join(lines)


def _count(n: Any, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _plateau_words(s: dict) -> str:
    low, high = s["t95"]
    if math.isnan(low):
        return "one seed: no interval"
    if low > 0:
        return "still rising"
    if high < 0:
        return "falling"
    return "no rise detected"


# --- the figure ----------------------------------------------------------------------------------------------------


def _dots(ax: Any, arms: dict, keys: tuple) -> None:  # noqa: ANN401
    """Each arm's seed values as dots and their mean with its t-interval, for each (key, offset, colour)."""
    for i, arm in enumerate(arms):
        for key, dx, color in keys:
            if key not in arms[arm]:
                continue
            s = arms[arm][key]
            ax.scatter([i + dx] * len(s["per_seed"]), s["per_seed"], s=12, color=color, alpha=0.6)
            low, high = s["t95"]
            if not math.isnan(low):
                yerr = [[s["mean"] - low], [high - s["mean"]]]
                ax.errorbar(i + dx, s["mean"], yerr=yerr, fmt="_", color=color, capsize=4)


def plot(summary: dict, curves: list[dict], path: Path) -> None:
    """Per setting: team score per arm (seed dots, t-interval) with the constants; LOO and Shapley of the
    policy seat; paired differences; the rollouts' team reward per update."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = [s for s in summary["settings"] if s in ("vote", "gate")]
    transfers = [s for s in summary["settings"] if s not in settings]
    rows = len(settings) + (1 if transfers else 0)
    fig, axes = plt.subplots(rows, 4, figsize=(18, 4 * rows), squeeze=False)
    for k, setting in enumerate(transfers[:4]):  # the last row: each transfer evaluation's team score
        entry = summary["settings"][setting]
        ax = axes[rows - 1][k]
        _dots(ax, entry["arms"], (("team", 0.0, "C0"),))
        best = entry["best_constant"]
        ax.axhline(entry["constants"][best], ls="--", color="grey", lw=0.8, label=f"best constant ({best})")
        ax.set_xticks(range(len(entry["arms"])), list(entry["arms"]), fontsize=8)
        ax.set_title(f"transfer: {setting}", fontsize=8)
        ax.legend(fontsize=6)
    if transfers:
        for ax in axes[rows - 1][len(transfers[:4]) :]:
            ax.set_axis_off()  # a row with fewer transfer evaluations than columns
    for row, setting in enumerate(settings):
        entry = summary["settings"][setting]
        arms = list(entry["arms"])
        ax = axes[row][0]
        _dots(ax, entry["arms"], (("team", -0.15, "C0"), ("swap", 0.15, "C1")))
        for k, (name, value) in enumerate(entry["constants"].items()):
            ax.axhline(value, ls=(":", "--", "-.", "-")[k % 4], color="grey", lw=0.8, label=name)
        ax.scatter([], [], color="C0", label="team score")
        ax.scatter([], [], color="C1", label="position swap")
        ax.set_xticks(range(len(arms)), arms, fontsize=8)
        ax.set_title(f"{setting}: team score (dots: seeds; bars: t 95%)", fontsize=9)
        ax.legend(fontsize=6)
        ax = axes[row][1]
        _dots(ax, entry["arms"], (("loo", -0.15, "C2"), ("shapley", 0.15, "C3")))
        ax.scatter([], [], color="C2", label="LOO of the policy seat")
        ax.scatter([], [], color="C3", label="Shapley of the policy seat")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xticks(range(len(arms)), arms, fontsize=8)
        ax.set_title("the policy seat's value", fontsize=9)
        ax.legend(fontsize=6)
        ax = axes[row][2]
        diffs = entry["differences"]
        for i, d in enumerate(diffs.values()):
            ax.scatter([i] * len(d["per_seed"]), d["per_seed"], s=12, color="C4", alpha=0.6)
            low, high = d["t95"]
            if not math.isnan(low):
                ax.errorbar(
                    i, d["mean"], yerr=[[d["mean"] - low], [high - d["mean"]]], fmt="_", color="C4", capsize=4
                )
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xticks(range(len(diffs)), [n.replace(" - ", "\n- ") for n in diffs], fontsize=6)
        ax.set_title("paired differences of the team score (per seed, t 95%)", fontsize=9)
        ax = axes[row][3]
        base = setting.split(" ")[0]
        for k, arm in enumerate(a for a in ARM_ORDER if a != "before"):
            runs = defaultdict(list)
            for m in curves:
                if m["setting"] == base and m["arm"] == arm:
                    runs[m["seed"]].append((m["step"], m["system_reward"]))
            if not runs:
                continue
            for points in runs.values():
                points.sort()
                ax.plot([p[0] for p in points], [p[1] for p in points], color=f"C{k}", lw=0.6, alpha=0.35)
            steps = sorted({p[0] for v in runs.values() for p in v})
            mean = [sum(dict(v).get(s, 0) for v in runs.values()) / len(runs) for s in steps]
            window = 6  # a running mean: one update is 8 rollouts, far too few to read alone
            smooth = [
                sum(mean[max(0, i - window + 1) : i + 1]) / len(mean[max(0, i - window + 1) : i + 1])
                for i in range(len(mean))
            ]
            ax.plot(steps, smooth, color=f"C{k}", lw=2, label=f"{arm} (seed mean, running mean of {window})")
        for k, arm in enumerate(a for a in ARM_ORDER if a != "before"):
            c = (entry.get("held_out_curve") or {}).get(arm)
            if c:
                xs = [int(u) for u in c["team"]]
                ax.plot(xs, [c["team"][str(u)]["mean"] for u in xs], "o--", color=f"C{k}", lw=1.2, ms=4,
                        label=f"{arm}: held-out team score ({len(c['seeds'])} seeds)")  # fmt: skip
        ax.set_xlabel("policy update")
        ax.set_title("rollout reward (team; solo RL: the policy alone); held-out team score", fontsize=9)
        if ax.get_legend_handles_labels()[0]:  # an untrained-only seat has no curves
            ax.legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


# --- main ----------------------------------------------------------------------------------------------------------


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value


def read_trainings(folder: Path) -> list[dict]:
    """Each finished training's summary.json, tagged with its setting, arm and seed."""
    packed = folder / "trainings.jsonl.gz"
    if packed.exists():
        return _jsonl(gzip.decompress(packed.read_bytes()).decode(), str(packed))
    out = []
    for path in sorted((folder / "runs").glob("*/summary.json")):
        setting, arm, seed = path.parent.name.rsplit("-", 2)
        out.append(
            {"setting": setting, "arm": arm, "seed": int(seed), "summary": json.loads(path.read_text())}
        )
    return out


def _gzip_lines(path: Path, records: list[dict]) -> None:
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode(), mtime=0))


def pack(folder: Path, target: Path) -> None:
    """Ship a run's rows, curves, rollouts, trainings' summaries, data, audits and manifest under `target`
    (compressed): all a report needs, and all `crl_team.py --resume-from` needs to go on with the study
    elsewhere without redoing a finished policy."""
    target.mkdir(parents=True, exist_ok=True)
    rows = read_rows(folder)
    # A training is shipped with its policy's evaluation (a policy trained while the pack is made waits).
    evaluated = {(r["setting"], r["arm"], r["seed"]) for r in rows if r["evaluated_in"] == r["setting"]}
    _gzip_lines(target / "rows.jsonl.gz", rows)
    for name, read in (
        ("curves.jsonl.gz", read_curves),
        ("trainings.jsonl.gz", read_trainings),
        ("rollouts.jsonl.gz", read_rollouts),
    ):
        _gzip_lines(
            target / name, [t for t in read(folder) if (t["setting"], t["arm"], t["seed"]) in evaluated]
        )
    (target / "data").mkdir(exist_ok=True)
    for name in ("train.jsonl", "eval.jsonl", "transfer.jsonl"):
        if (folder / "data" / name).exists():
            (target / "data" / name).write_bytes((folder / "data" / name).read_bytes())
    (target / "manifest.json").write_bytes((folder / "manifest.json").read_bytes())


def replace_block(text: str, block: str, where: str) -> str:
    """`text` with the part between the markers replaced by `block`."""
    start, end = (re.escape(m) for m in MARKERS)
    pattern = re.compile(f"{start}\n.*?{end}", re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{where}: no {MARKERS[0]} ... {MARKERS[1]} block")
    return pattern.sub(lambda _: f"{MARKERS[0]}\n{block}{MARKERS[1]}", text, count=1)


def build(folder: Path, figure: Path | None = None) -> tuple[dict, str]:
    """(summary, table) of the study in `folder`; writes summary.json and table.md there, and the figure."""
    manifest_path = folder / "manifest.json"
    if not manifest_path.exists():
        raise SystemExit(f"{manifest_path}: missing")
    manifest = json.loads(manifest_path.read_text())
    summary = _nan_to_none(
        summarise(
            read_rows(folder), best_teammate(folder), manifest, read_curves(folder), read_rollouts(folder)
        )
    )
    text = table(_nan_to_floats(summary), manifest)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (folder / "table.md").write_text(text)
    if figure is not None:
        plot(_nan_to_floats(summary), read_curves(folder), figure)
    return summary, text


def _nan_to_floats(value: Any) -> Any:
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {k: v if k == "seeds" else _nan_to_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_floats(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a run folder or a shipped study (bench/results/crl_team)")
    parser.add_argument("--pack", type=Path, help="first ship the run's rows here, then report from them")
    parser.add_argument("--figure", type=Path)
    parser.add_argument("--readme", type=Path, help="replace this file's crl-team-table block with the table")
    args = parser.parse_args(argv)
    folder = args.folder
    if args.pack:
        pack(folder, args.pack)
        folder = args.pack
    _, text = build(folder, args.figure)
    if args.readme:
        args.readme.write_text(replace_block(args.readme.read_text(), text, str(args.readme)))
    print(text)


if __name__ == "__main__":
    main()
