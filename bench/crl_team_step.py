"""Cost of one update of the C-RL team study (`bench/crl_team.py`'s config): wall time, its split, how many
batches the policy's turns decoded in, and the policy's decoding speed.

One training of `--steps` updates (arm `uniform`, SmolLM2-135M, LoRA) in the given setting; the first update
is warm-up and left out of the medians. Per update it reports TRL's `step_time`, the trainer's split
(`generation_s`: the rollouts; `training_s`: forward and backward), the number of batches the policy engine
ran (one batch = the step's rollouts all in flight at once: its decoding costs one pass per token, not one
per rollout) and the policy's tokens per second (completion tokens over the seconds the engine spent
decoding).

    python bench/crl_team_step.py --setting vote --steps 5 --bf16                      # the engine's default
    COLAB_GRAPHS_EXPECT_WAIT_MS=100 python bench/crl_team_step.py --setting vote ...   # the old grouping
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

    seen: dict[str, list[float]] = {"size": [], "seconds": [], "tokens": []}
    inner = LocalEngine.generate_batch

    def timed(self: LocalEngine, requests: Any) -> Any:
        started = time.perf_counter()
        results = inner(self, requests)
        seen["seconds"].append(time.perf_counter() - started)
        seen["size"].append(len(requests))
        seen["tokens"].append(sum(len(r.completion_ids) for r in results))
        return results

    LocalEngine.generate_batch = timed  # type: ignore[method-assign]
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", default="vote", choices=list(crl_team.SETTINGS))
    parser.add_argument("--arm", default="uniform", choices=list(crl_team.ARMS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=10)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--policy", default="smollm2-135m")
    args = parser.parse_args()
    seen = instrument()
    lines: list[dict[str, Any]] = []
    marks: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        study = argparse.Namespace(
            out=Path(tmp),
            tokens=args.tokens,
            policy=args.policy,
            prompts=args.prompts,
            steps=args.steps,
            lr=3e-4,
            lr_schedule="constant",
            save_steps=0,
            bf16=args.bf16,
        )
        data = crl_team.write_data(study.out, 200, 20, [args.setting])
        from colab_graphs.trainers.config import config_from_dict
        from colab_graphs.trainers.pipeline import train

        values = crl_team.settings(study, args.setting, args.arm, 0, data)

        def on_step(line: dict[str, Any]) -> None:
            lines.append(line)
            marks.append(len(seen["size"]))

        train(config_from_dict(values), on_step=on_step)
    per_step = []
    start = 0
    for line, end in zip(lines, marks, strict=True):
        per_step.append(
            {
                "step_time": line["step_time"],
                "generation_s": line["generation_s"],
                "training_s": line["training_s"],
                "batches": end - start,
                "rows": sum(seen["size"][start:end]),
                "tokens": sum(seen["tokens"][start:end]),
                "decode_s": sum(seen["seconds"][start:end]),
            }
        )
        start = end
    warm = per_step[1:] or per_step

    def median(key: str) -> float:
        return round(statistics.median(s[key] for s in warm), 3)

    tokens, seconds = sum(s["tokens"] for s in warm), sum(s["decode_s"] for s in warm)
    print(
        json.dumps(
            {
                "setting": args.setting,
                "arm": args.arm,
                "expect_wait_ms": os.environ.get("COLAB_GRAPHS_EXPECT_WAIT_MS", "default"),
                "steps": len(per_step),
                "step_time_median_s": median("step_time"),
                "generation_median_s": median("generation_s"),
                "training_median_s": median("training_s"),
                "batches_per_update": [s["batches"] for s in per_step],
                "policy_tokens_per_s": round(tokens / seconds, 1) if seconds else None,
                "load_average": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
