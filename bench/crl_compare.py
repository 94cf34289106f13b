"""A real policy in a real team: C-RL (uniform and replay credit) vs solo RL vs SFT, on CPU.

The system: prompt routing (`prompt_routing`) over three members, all SmolLM2-135M-Instruct from the zoo
(offline). The trained `policy` sits in the router seat: it reads the question and the candidates' names and
descriptions and ranks them; the first one it names answers alone (itself included: a reply naming nobody
goes to the first candidate, the policy). `careful` and `quick` are the embedded default's personas (greedy;
a step-by-step tutor and a number-only answerer). The task is the built-in arithmetic (numeric answers).
Collaboration matters here: who answers decides the system's score (the tutor answers about half the
questions right, the terse persona almost none), and the policy's own arithmetic matters only for the
questions it keeps. Solo RL trains that arithmetic and never the routing.

Every arm starts from the same policy and takes the same number of policy updates (`--steps` optimizer
steps of 2 prompts x 4 rollouts, sampled at temperature 0.7: at 1.0 this policy mostly writes off-topic
text), with the same optimizer, schedule, clipping and precision (one `CRLTrainer`, see
colab_graphs/trainers/baselines.py; a LoRA adapter, r 16, on every linear layer):

    uniform  reward: system, credit: uniform   (C-RL, the paper's credit)
    replay   reward: system, credit: replay    (C-RL, turn-level credit from K=2 re-runs per turn)
    solo     reward: solo                      (RL on the policy's own correctness, answering alone)
    sft      reward: sft                       (cross-entropy on the policy's turns of rollouts that scored 1)

Reported per arm: the held-out system score, the policy seat's leave-one-out value (without the policy the
first member left, `careful`, routes) and the policy's solo score, before (once: every arm starts from the
same weights, and the evaluation is greedy) and after; the training curves (mean reward of each step's
rollouts: the system's score, except for `solo`, whose rollouts are the policy alone); wall time. Writes
OUT/compare.json and OUT/crl_compare.png; run again with more `--seeds` to add runs to them.

    python bench/crl_compare.py --steps 8 --eval-size 24 --out runs/crl_compare
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import colab_graphs._env  # noqa: F401  (process defaults before transformers / litellm load)
from colab_graphs.defaults import DEFAULT_POOL
from colab_graphs.trainers.config import config_from_dict
from colab_graphs.trainers.pipeline import train

TEMPERATURE = 0.7  # rollouts' sampling temperature: at 1.0 this policy mostly writes off-topic text
ARMS = {
    "uniform": {"reward": "system", "credit": "uniform"},
    "replay": {"reward": "system", "credit": "replay"},
    "solo": {"reward": "solo"},
    "sft": {"reward": "sft"},
}


def settings(args: argparse.Namespace, arm: str, seed: int, out: Path, evaluate_before: bool) -> dict:
    """The training config of one arm (everything but `reward` / `credit` shared by all arms)."""
    return {
        "protocol": "prompt_routing",
        "protocol_params": {
            "router": "policy",
            "descriptions": {
                "policy": "SmolLM2-135M, the router itself",
                "careful": DEFAULT_POOL["careful"]["description"],
                "quick": DEFAULT_POOL["quick"]["description"],
            },
        },
        "pool": {
            "policy": {"max_tokens": args.tokens},
            "careful": DEFAULT_POOL["careful"],
            "quick": DEFAULT_POOL["quick"],
        },
        "policy_model": args.policy,
        "data": "builtin:arithmetic",
        "limit": 400,
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


def plot(report: dict, path: Path) -> None:
    """Training curves (per-step rollout reward, 3-step running mean) and held-out before/after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, bars) = plt.subplots(1, 2, figsize=(11, 4))
    for run in report["runs"]:
        rewards = [x["system_reward"] for x in run["metrics"]]
        smooth = [
            sum(rewards[max(0, i - 2) : i + 1]) / len(rewards[max(0, i - 2) : i + 1])
            for i in range(len(rewards))
        ]
        label = f"{run['arm']} (seed {run['seed']})" + (" - policy alone" if run["arm"] == "solo" else "")
        curves.plot(range(1, len(smooth) + 1), smooth, label=label)
    curves.set_xlabel("policy update")
    curves.set_ylabel("rollout reward (3-step mean)")
    curves.set_title(f"training rollouts (sampled, T={TEMPERATURE})")
    curves.legend(fontsize=8)
    before = report["before"]
    names = ["before"] + [f"{r['arm']}\n(seed {r['seed']})" for r in report["runs"]]
    system = [before["system"]] + [r["after"]["system"] for r in report["runs"]]
    loo = [before["loo"]] + [r["after"]["loo"] for r in report["runs"]]
    xs = range(len(names))
    bars.bar([x - 0.2 for x in xs], system, 0.4, label="system score")
    bars.bar([x + 0.2 for x in xs], loo, 0.4, label="LOO of the policy seat")
    bars.set_xticks(list(xs), names, fontsize=8)
    bars.set_title(f"held-out (n={before['n']}, greedy)")
    bars.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="smollm2-135m", help="zoo name, HF folder or hub id")
    parser.add_argument("--steps", type=int, default=8, help="policy updates per arm")
    parser.add_argument("--eval-size", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=16, help="most tokens per policy turn")
    parser.add_argument("--lr", type=float, default=2e-4, help="learning rate of the LoRA adapter (r 16)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--out", type=Path, default=Path("runs/crl_compare"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "compare.json"
    # Rerunning with more seeds (or arms) adds them: the runs already in OUT/compare.json are kept.
    report: dict = json.loads(saved.read_text()) if saved.exists() else {"before": None, "runs": []}
    report["settings"] = {k: str(v) for k, v in vars(args).items() if k not in ("seeds", "arms")}
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
            report["before"] = report["before"] or summary["eval_before"]
            folder = Path(config.output_dir)
            lines = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
            run = {
                "arm": arm,
                "seed": seed,
                "after": summary["eval_after"],
                "steps": summary["steps"],
                "wall_s": round(time.perf_counter() - started, 1),
                "metrics": lines,
            }
            report["runs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "metrics"}), flush=True)
            saved.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out / "crl_compare.png")
    b = report["before"]
    print(
        f"\nbefore: system {b['system']:.3f}  loo {b['loo']:+.3f}  policy solo {b['policy_solo']:.3f}  (n={b['n']})"
    )
    print("| arm | seed | system after | LOO after | policy solo after | wall s |")
    print("|---|---|---|---|---|---|")
    for r in report["runs"]:
        a = r["after"]
        print(
            f"| {r['arm']} | {r['seed']} | {a['system']:.3f} | {a['loo']:+.3f} | {a['policy_solo']:.3f} | {r['wall_s']} |"
        )


if __name__ == "__main__":
    main()
