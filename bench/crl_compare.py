"""C-RL (uniform and replay credit) vs solo RL vs collaborative SFT, where the policy's job is collaborative.

The system (`bench/crl_judge.py:judge`): two teammates, the embedded default's SmolLM2-135M personas `careful`
(a step-by-step tutor) and `quick` (answers with a number only), both greedy, answer a built-in arithmetic
question; the task extracts their answers; the trained `policy` (SmolLM2-135M-Instruct from the zoo, offline,
with a LoRA adapter) reads the two answers, unnamed ("Teammate 1: 42 / Teammate 2: 17"), and writes the final
one. On the 150 held-out questions `careful` alone is right on 0.37 and `quick` on 0.11, at least one of them
on 0.38 (the most a judge that only copies can score), exactly one on 42; the untrained judge copies `quick`
half the time (0.51) and the right teammate on 14 of those 42. What the system needs of the policy is to trust
the right teammate; what solo RL trains is the policy's own arithmetic.

Every arm starts from the same policy and takes the same `--steps` optimizer updates of 2 prompts x 4
rollouts (temperature 0.7), with the same optimizer, schedule, clipping, LoRA (r 16) and seed: one
`CRLTrainer` (colab_graphs/trainers/baselines.py). Runs with one seed sample the same prompts in the same
order and draw the same random numbers wherever they make the same call (the seed's contract):

    uniform  reward: system, credit: uniform   (C-RL, the paper's credit)
    replay   reward: system, credit: replay    (C-RL, turn-level credit from K=2 re-runs of the judge turn)
    solo     reward: solo                      (RL on the policy's own correctness, answering alone)
    sft      reward: sft                       (cross-entropy on the judge turns of rollouts that scored 1)

Held out: the last `--eval-size` distinct questions of the data, none of them a training question (the
split drops training examples that repeat one). Evaluated greedily, before (once: every arm starts from the
same weights) and after each run:

- in the judge protocol: the system score, the policy seat's leave-one-out value (without the judge the
  first teammate's answer stands, so LOO = what the judge adds over taking `careful`'s word), the policy's
  solo score, and the behaviour behind them: how often the judge's answer is `careful`'s, `quick`'s or its
  own, and on the questions where exactly one teammate is right, how often it follows that one;
- in a protocol it was not trained in (the paper's second claim): `mixture_of_agents` (one layer) with the
  policy proposing beside the two personas and aggregating the three proposals; the same measures.

Intervals are 95% bootstrap intervals over held-out questions (2,000 resamples; each question's value
averaged over the seeds), and for the difference of two arms the paired bootstrap of that difference.

    python bench/crl_compare.py --steps 12 --eval-size 150 --seeds 0 1 2 --out runs/crl_compare \
        --figure docs/images/crl-compare.png

Writes OUT/compare.json (resumable: a rerun adds the runs it lacks), OUT/summary.json, OUT/table.md and
OUT/crl_compare.png (and `--figure`). About 25 min a seed for the four arms on 2 quiet cores.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import colab_graphs._env  # noqa: F401  (process defaults before transformers / litellm load)
from colab_graphs.defaults import DEFAULT_POOL
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import view_for
from colab_graphs.trainers import system
from colab_graphs.trainers.config import config_from_dict
from colab_graphs.trainers.pipeline import train

BENCH = Path(__file__).resolve().parent
TEMPERATURE = 0.7  # rollouts' sampling temperature: at 1.0 this policy mostly writes off-topic text
ARMS = {
    "uniform": {"reward": "system", "credit": "uniform"},
    "replay": {"reward": "system", "credit": "replay"},
    "solo": {"reward": "solo"},
    "sft": {"reward": "sft"},
}
TEAMMATES = ("careful", "quick")
SEATS = {  # the seats whose replies the behaviour is read from, per protocol
    "judge": {"careful": "answer_careful", "quick": "answer_quick"},
    "mixture_of_agents": {"careful": "l1_careful", "quick": "l1_quick"},
}
RESAMPLES = 2000


def settings(args: argparse.Namespace, arm: str, seed: int, out: Path, evaluate_before: bool) -> dict:
    """The training config of one arm (everything but `reward` / `credit` shared by all arms)."""
    return {
        "graph": f"{BENCH / 'crl_judge.py'}:judge",
        "pool": pool(args.tokens),
        "policy_model": args.policy,
        "data": "builtin:arithmetic",
        "limit": args.limit,
        "eval_size": args.eval_size,
        "eval_before": evaluate_before,
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_steps": args.steps,
        "learning_rate": args.lr,
        "lora": True,
        "lora_r": 16,
        "lora_alpha": 32,
        "max_completion_length": args.tokens,
        "temperature": TEMPERATURE,
        "replay_samples": 2,
        "seed": seed,
        "save_steps": 0,
        "use_cpu": True,
        "max_concurrency": 32,
        "output_dir": str(out / f"{arm}-{seed}"),
        "cache_dir": str(out / "cache"),
        **ARMS[arm],
    }


def pool(tokens: int, policy_model: str | None = None) -> dict:
    policy = {"max_tokens": tokens} | ({"model": policy_model} if policy_model else {})
    return {"policy": policy, **{m: DEFAULT_POOL[m] for m in TEAMMATES}}


# --- what the policy did -------------------------------------------------------------------------------------


def behaviour(rows: list[dict], examples: dict[str, Example], protocol: str) -> list[dict[str, float]]:
    """Per held-out question: the system's score and, from the seats' replies, whether the final answer is
    `careful`'s, `quick`'s or neither, and (where exactly one teammate is right) whether it is the right one's.

    Answers are compared as the task compares them (numbers); a reply that commits to no answer matches none.
    """
    out = []
    for row in rows:
        example = examples[row["id"]]
        view = view_for(example)
        final = row["answer"] or ""
        said = {m: view.extract(row["replies"].get(seat) or "") or "" for m, seat in SEATS[protocol].items()}
        right = {m: bool(a) and view.same(a, example.answer) for m, a in said.items()}
        follows = {m: bool(a) and bool(final) and view.same(final, a) for m, a in said.items()}
        decisive = right["careful"] != right["quick"]
        out.append(
            {
                "score": row["score"],
                "loo": row["score"] - row["without_policy"],
                "copies_careful": float(follows["careful"] and not follows["quick"]),
                "copies_quick": float(follows["quick"] and not follows["careful"]),
                "own": float(not follows["careful"] and not follows["quick"]),
                "decisive": float(decisive),
                "follows_right": float(decisive and follows["careful" if right["careful"] else "quick"]),
                "careful_right": float(right["careful"]),
                "quick_right": float(right["quick"]),
            }
        )
    return out


def bootstrap(values: list[float], seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95% bootstrap interval."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), (RESAMPLES, len(data)))].mean(axis=1)
    return float(data.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def teammates(rows: list[dict]) -> dict[str, Any]:
    """What the judge has to work with on the held-out questions (one protocol's rows, before training: the
    teammates are greedy, so every arm sees the same answers): each teammate alone, either one right (the most
    a judge that only copies can score), and how many questions have exactly one right teammate."""
    either = [max(x["careful_right"], x["quick_right"]) for x in rows]
    return {
        "careful": bootstrap([x["careful_right"] for x in rows]),
        "quick": bootstrap([x["quick_right"] for x in rows]),
        "either": bootstrap(either),
        "only_careful": sum(x["careful_right"] > x["quick_right"] for x in rows),
        "only_quick": sum(x["quick_right"] > x["careful_right"] for x in rows),
        "n": len(rows),
    }


def per_question(runs: list[dict], key: str, protocol: str) -> list[float]:
    """Each held-out question's `key`, averaged over the runs (seeds) given."""
    tables = [r[protocol] for r in runs]
    return [sum(t[i][key] for t in tables) / len(tables) for i in range(len(tables[0]))]


def decisive_rate(runs: list[dict], protocol: str) -> tuple[float, float, float]:
    """How often the final answer is the right teammate's, over the questions where exactly one is right."""
    keep = [i for i, x in enumerate(runs[0][protocol]) if x["decisive"]]
    values = per_question(runs, "follows_right", protocol)
    return bootstrap([values[i] for i in keep])


def held_out_rows(path: Path) -> list[dict]:
    """The per-question rows of an `eval_before.json` / `eval_after.json`."""
    return json.loads(path.read_text())["examples"]


# --- the protocol the policy was not trained in -------------------------------------------------------------


def transfer(
    folder: str, args: argparse.Namespace, held: list[Example], seed: int, cache: Path
) -> list[dict]:
    """The policy in `folder` (a HF folder or zoo name) as proposer and aggregator of `mixture_of_agents`."""
    from colab_graphs.local.provider import set_local_model
    from colab_graphs.models.cache import CallCache
    from colab_graphs.models.client import ModelClient
    from colab_graphs.pool import Pool
    from colab_graphs.protocol_registry import build_protocol
    from colab_graphs.trainers.evaluate import evaluate
    from colab_graphs.trainers.rollout import LoopThread, PolicyRouter

    model, tokenizer = system.load_policy(folder, "cpu")
    set_local_model("crl-compare-transfer", model, tokenizer)
    members = Pool.from_dict(pool(args.tokens, "local/crl-compare-transfer"))
    spec = build_protocol("mixture_of_agents", members.names, layers=1, aggregator="policy")
    client = ModelClient(CallCache(cache), max_concurrency=32)
    router = PolicyRouter(client, ["policy"], {"temperature": 0.0, "max_tokens": args.tokens}, seed, "eval")
    result = evaluate(spec, members, held, router, "policy", LoopThread.shared())
    return result["examples"]


# --- the report ----------------------------------------------------------------------------------------------


def summarise(report: dict) -> dict[str, Any]:
    """Per arm (and before): means with intervals of every measure, in both protocols; paired differences."""
    arms = ["before", *[a for a in ARMS if any(r["arm"] == a for r in report["runs"])]]
    groups = {
        "before": [report["before"]],
        **{a: [r for r in report["runs"] if r["arm"] == a] for a in arms[1:]},
    }
    out: dict[str, Any] = {}
    for arm, runs in groups.items():
        entry: dict[str, Any] = {"seeds": [r.get("seed") for r in runs]}
        for protocol in SEATS:
            measures = {
                key: bootstrap(per_question(runs, key, protocol))
                for key in ("score", "loo", "copies_careful", "copies_quick", "own")
            }
            measures["follows_right"] = decisive_rate(runs, protocol)
            measures["score_by_seed"] = [
                sum(x["score"] for x in r[protocol]) / len(r[protocol]) for r in runs
            ]
            entry[protocol] = measures
        out[arm] = entry
    for arm in arms[1:]:
        for base in ("solo", "sft", "before"):
            if base == arm or base not in groups:
                continue
            for protocol in SEATS:
                mine, theirs = (
                    per_question(groups[arm], "score", protocol),
                    per_question(groups[base], "score", protocol),
                )
                out[arm][protocol][f"minus_{base}"] = bootstrap(
                    [a - b for a, b in zip(mine, theirs, strict=True)]
                )
    if "careful_right" in report["before"]["judge"][0]:
        out["before"]["teammates"] = teammates(report["before"]["judge"])
    return out


def table(summary: dict, n: int) -> str:
    """The README tables: what the teammates score; each arm in the judge protocol and in mixture-of-agents;
    the paired differences of the system score."""
    fmt = lambda m: f"{m[0]:.3f} [{m[1]:.3f}, {m[2]:.3f}]"  # noqa: E731
    signed = lambda m: f"{m[0]:+.3f} [{m[1]:+.3f}, {m[2]:+.3f}]"  # noqa: E731
    lines = [
        f"Held-out n = {n} questions never trained on; an arm's value is the mean over its seeds, with the 95% "
        "bootstrap interval over questions (each question's value averaged over the seeds).",
        "",
    ]
    mates = summary["before"].get("teammates")
    if mates:
        lines += [
            f"Teammates alone (greedy, the same answers for every arm): careful {fmt(mates['careful'])}, quick "
            f"{fmt(mates['quick'])}, at least one right {fmt(mates['either'])}; exactly one right on "
            f"{mates['only_careful'] + mates['only_quick']} questions (careful {mates['only_careful']}, quick "
            f"{mates['only_quick']}).",
            "",
        ]
    lines += [
        "| arm | seeds | system (judge) | per seed | LOO of the judge | follows the right teammate "
        "| copies careful / quick / own | system (MoA, not trained in) | LOO (MoA) | follows right (MoA) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, s in summary.items():
        j, m = s["judge"], s["mixture_of_agents"]
        seeds = ",".join(str(x) for x in s["seeds"] if x is not None) or "-"
        per_seed = " / ".join(f"{x:.3f}" for x in j["score_by_seed"])
        lines.append(
            f"| {arm} | {seeds} | {fmt(j['score'])} | {per_seed} | {signed(j['loo'])} | {fmt(j['follows_right'])} "
            f"| {j['copies_careful'][0]:.2f} / {j['copies_quick'][0]:.2f} / {j['own'][0]:.2f} "
            f"| {fmt(m['score'])} | {signed(m['loo'])} | {fmt(m['follows_right'])} |"
        )
    lines += [
        "",
        "Paired differences of the system score (the same questions; the LOO differences are the same numbers, "
        "every arm's system without the judge being the same):",
        "",
        "| arm | minus before (judge) | minus solo RL (judge) | minus SFT (judge) | minus before (MoA) "
        "| minus solo RL (MoA) |",
        "|---|---|---|---|---|---|",
    ]
    for arm, s in summary.items():
        if arm == "before":
            continue
        j, m = s["judge"], s["mixture_of_agents"]
        cell = lambda d, key: signed(d[key]) if key in d else ""  # noqa: E731
        lines.append(
            f"| {arm} | {cell(j, 'minus_before')} | {cell(j, 'minus_solo')} | {cell(j, 'minus_sft')} "
            f"| {cell(m, 'minus_before')} | {cell(m, 'minus_solo')} |"
        )
    return "\n".join(lines) + "\n"


def plot(report: dict, summary: dict, path: Path) -> None:
    """Four panels: system score and LOO (judge), following the right teammate (judge), the MoA transfer,
    each arm's mean with its interval; plus the training curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    arms = list(summary)
    xs = range(len(arms))

    def bars(ax, keys: list[tuple[str, str, str]], title: str) -> None:  # noqa: ANN001
        width = 0.8 / len(keys)
        for k, (protocol, key, label) in enumerate(keys):
            values = [summary[a][protocol][key] for a in arms]
            mean = [v[0] for v in values]
            err = [[v[0] - v[1] for v in values], [v[2] - v[0] for v in values]]
            ax.bar(
                [x + (k - (len(keys) - 1) / 2) * width for x in xs],
                mean,
                width,
                yerr=err,
                capsize=3,
                label=label,
            )
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xticks(list(xs), arms, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)

    bars(
        axes[0],
        [("judge", "score", "system score"), ("judge", "loo", "LOO of the judge")],
        "judge protocol (trained)",
    )
    mates = summary["before"].get("teammates")
    if mates:  # what copying one teammate scores, and the most copying the right one could
        for key, style, label in (
            ("careful", ":", "careful alone"),
            ("either", "--", "either teammate right"),
        ):
            axes[0].axhline(mates[key][0], color="black", ls=style, lw=0.8, label=label)
        axes[0].legend(fontsize=7)
    bars(
        axes[1],
        [
            ("judge", "follows_right", "follows the right teammate"),
            ("judge", "copies_careful", "copies careful"),
        ],
        "what the judge does",
    )
    bars(
        axes[2],
        [("mixture_of_agents", "score", "system score"), ("mixture_of_agents", "loo", "LOO of the policy")],
        "mixture-of-agents (not trained in)",
    )

    def smooth(values: list[float]) -> list[float]:
        return [
            sum(values[max(0, i - 3) : i + 1]) / len(values[max(0, i - 3) : i + 1])
            for i in range(len(values))
        ]

    for k, arm in enumerate(a for a in ARMS if any(r["arm"] == a for r in report["runs"])):
        curves = [[x["system_reward"] for x in r["metrics"]] for r in report["runs"] if r["arm"] == arm]
        for curve in curves:
            axes[3].plot(range(1, len(curve) + 1), smooth(curve), lw=0.6, alpha=0.35, color=f"C{k}")
        mean = [sum(c[i] for c in curves) / len(curves) for i in range(min(map(len, curves)))]
        axes[3].plot(range(1, len(mean) + 1), smooth(mean), lw=2, color=f"C{k}", label=f"{arm} (seed mean)")
    axes[3].set_xlabel("policy update")
    axes[3].set_title(f"rollout reward (4-step mean, T={TEMPERATURE}; solo: alone)", fontsize=10)
    axes[3].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="smollm2-135m", help="zoo name, HF folder or hub id")
    parser.add_argument("--steps", type=int, default=12, help="policy updates per arm")
    parser.add_argument("--eval-size", type=int, default=150)
    parser.add_argument("--limit", type=int, default=600, help="built-in arithmetic items (train + held out)")
    parser.add_argument("--tokens", type=int, default=12, help="most tokens per policy turn")
    parser.add_argument("--lr", type=float, default=3e-4, help="learning rate of the LoRA adapter (r 16)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--out", type=Path, default=Path("runs/crl_compare"))
    parser.add_argument(
        "--figure", type=Path, help="also write the figure here (README's: docs/images/crl-compare.png)"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "compare.json"
    # Rerunning with more seeds (or arms) adds them: the runs already in OUT/compare.json are kept.
    report: dict = json.loads(saved.read_text()) if saved.exists() else {"before": None, "runs": []}
    report["settings"] = {k: str(v) for k, v in vars(args).items() if k not in ("seeds", "arms")}
    held = system.load_split(config_from_dict(settings(args, "uniform", 0, args.out, False))).eval
    examples = {e.id: e for e in held}
    done = {(r["arm"], r["seed"]) for r in report["runs"]}
    for seed in args.seeds:
        for arm in args.arms:
            if (arm, seed) in done:
                continue
            started = time.perf_counter()
            config = config_from_dict(settings(args, arm, seed, args.out, report["before"] is None))
            summary = train(
                config, on_step=lambda line, a=arm: print(a, json.dumps(line, default=str), flush=True)
            )
            folder = Path(config.output_dir)
            if report["before"] is None:
                rows = held_out_rows(folder / "eval_before.json")
                moa = transfer(args.policy, args, held, seed, args.out / "cache")
                report["before"] = {
                    "judge": behaviour(rows, examples, "judge"),
                    "mixture_of_agents": behaviour(moa, examples, "mixture_of_agents"),
                    "split": summary["split"],
                }
            rows = held_out_rows(folder / "eval_after.json")
            moa = transfer(str(folder / "policy"), args, held, seed, args.out / "cache")
            run = {
                "arm": arm,
                "seed": seed,
                "judge": behaviour(rows, examples, "judge"),
                "mixture_of_agents": behaviour(moa, examples, "mixture_of_agents"),
                "steps": summary["steps"],
                "wall_s": round(time.perf_counter() - started, 1),
                "metrics": [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()],
            }
            report["runs"].append(run)
            print(json.dumps({k: run[k] for k in ("arm", "seed", "steps", "wall_s")}), flush=True)
            saved.write_text(json.dumps(report) + "\n")
    first = report["runs"][0]
    if "careful_right" not in report["before"]["judge"][0]:  # a compare.json from before that column
        rows = held_out_rows(args.out / f"{first['arm']}-{first['seed']}" / "eval_before.json")
        report["before"]["judge"] = behaviour(rows, examples, "judge")
        saved.write_text(json.dumps(report) + "\n")
    result = summarise(report)
    (args.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    text = table(result, len(held))
    (args.out / "table.md").write_text(text)
    plot(report, result, args.out / "crl_compare.png")
    if args.figure:
        plot(report, result, args.figure)
    print(text)


if __name__ == "__main__":
    main()
