"""Cost of one update of the C-RL team study (`bench/crl_team.py`'s config): wall time, its split, the
batches the policy's turns decoded in, and the policy's decoding speed; configs before and after, one after
another in one process.

Per config, one training of `--steps` updates (arm `uniform`, SmolLM2-135M, LoRA); the first update is warm-up
and left out of the medians. Per update it reports TRL's `step_time`, the trainer's split (`generation_s`: the
rollouts; `training_s`: forward and backward), the rows of each batch the policy engine decoded (one batch of
8 = the update's rollouts all in flight at once: its decoding costs one pass per token, not one per rollout),
the policy's prompt length and its tokens per second (completion tokens over the seconds the engine spent
decoding, prefill included).

    OMP_NUM_THREADS=2 python bench/crl_team_step.py --runs pick:8:0.7 pick_brief:4:1.0 --steps 6 --bf16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import crl_team  # noqa: E402  (sets the process defaults first)


def instrument() -> dict[str, list[float]]:
    """Record each batch the policy engine decodes: its size, seconds and completion tokens."""
    from colab_graphs.local.local_engine import LocalEngine

    seen: dict[str, list[float]] = {"size": [], "seconds": [], "tokens": [], "prompt": []}
    inner = LocalEngine.generate_batch

    def timed(self: LocalEngine, requests: Any, *rest: Any) -> Any:
        started = time.perf_counter()
        results = inner(self, requests, *rest)
        seen["seconds"].append(time.perf_counter() - started)
        seen["size"].append(len(results))  # the batch's rows, the ones that joined it while it ran included
        seen["tokens"].append(sum(len(r.completion_ids) for r in results))
        seen["prompt"].append(sum(len(r.prompt_ids) for r in results))
        return results

    LocalEngine.generate_batch = timed  # type: ignore[method-assign]
    return seen


def measure(args: argparse.Namespace, setting: str, tokens: int, seen: dict[str, list[float]]) -> dict:
    """One training of `args.steps` updates in `setting` with at most `tokens` a policy turn: the medians over
    the updates after the first (warm-up)."""
    lines: list[dict[str, Any]] = []
    marks: list[int] = []
    first = len(seen["size"])
    with tempfile.TemporaryDirectory() as tmp:
        study = argparse.Namespace(
            out=Path(tmp),
            tokens=tokens,
            policy=args.policy,
            prompts=args.prompts,
            steps=args.steps,
            lr=1e-3,
            lr_schedule="constant",
            temperature=args.temperature,
            baseline="group",
            save_steps=0,
            bf16=args.bf16,
        )
        data = crl_team.write_data(study.out, 200, 20, [setting])
        from colab_graphs.trainers.config import config_from_dict
        from colab_graphs.trainers.pipeline import train

        values = crl_team.settings(study, setting, args.arm, 0, data)

        def on_step(line: dict[str, Any]) -> None:
            lines.append(line)
            marks.append(len(seen["size"]))

        train(config_from_dict(values), on_step=on_step)
    per_step = []
    start = first
    for line, end in zip(lines, marks, strict=True):
        per_step.append(
            {
                "step_time": line["step_time"],
                "generation_s": line["generation_s"],
                "training_s": line["training_s"],
                "batch_sizes": seen["size"][start:end],
                "prompt_tokens": sum(seen["prompt"][start:end]) / max(1, sum(seen["size"][start:end])),
                "tokens": sum(seen["tokens"][start:end]),
                "decode_s": sum(seen["seconds"][start:end]),
            }
        )
        start = end
    warm = per_step[1:] or per_step

    def median(key: str) -> float:
        return round(statistics.median(s[key] for s in warm), 3)

    tokens_out, seconds = sum(s["tokens"] for s in warm), sum(s["decode_s"] for s in warm)
    return {
        "setting": setting,
        "tokens": tokens,
        "arm": args.arm,
        "temperature": args.temperature,
        "threads": os.environ.get("OMP_NUM_THREADS", "default"),
        "expect_wait_ms": os.environ.get("COLAB_GRAPHS_EXPECT_WAIT_MS", "default"),
        "steps": len(per_step),
        "step_time_median_s": median("step_time"),
        "generation_median_s": median("generation_s"),
        "training_median_s": median("training_s"),
        "policy_prompt_tokens": median("prompt_tokens"),
        "batch_sizes_per_update": [s["batch_sizes"] for s in per_step],
        "policy_tokens_per_s": round(tokens_out / seconds, 1) if seconds else None,
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs",
        nargs="+",
        default=["pick:8:0.7", "pick_brief:4:1.0"],
        help="SETTING:TOKENS[:TEMPERATURE] configs measured one after another in this process (before, after)",
    )
    parser.add_argument("--arm", default="uniform", choices=list(crl_team.ARMS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=crl_team.TEMPERATURE)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--policy", default="smollm2-135m")
    args = parser.parse_args()
    seen = instrument()
    for run in args.runs:
        setting, tokens, *temperature = run.split(":")
        config = (
            argparse.Namespace(**{**vars(args), "temperature": float(temperature[0])})
            if temperature
            else args
        )
        print(json.dumps(measure(config, setting, int(tokens), seen)), flush=True)


if __name__ == "__main__":
    main()
