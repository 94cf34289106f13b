"""Wall time per training step: C-RL (policy seated in a live graph) vs plain TRL GRPO, same policy and budget.

Both train the tiny random policy (zoo `tiny-random`) on the same prompts with the same GRPO settings: 4
prompts x 4 generations per step, at most 6 completion tokens per turn, CPU. C-RL runs the toy `relay`
system (two scripted collaborators over real HTTP, then the policy) for each rollout and trains on the
policy's segment; plain GRPO generates with TRL's own `model.generate` and scores the completion alone.
The step time is TRL's own `step_time` metric (generation + scoring + forward/backward + optimizer), the
median over the steps after the first (warm-up); the process CPU time per step is reported beside it,
because on a shared machine wall time swings with other load (the C-RL step spans more threads).

    python bench/crl_step.py [--steps 8] [--tokens 6] [--policy tiny-random|smollm2-135m|FOLDER]

With `--policy smollm2-135m` (the zoo's offline SmolLM2-135M) a step takes ~25-35 s on 2 CPU cores.

Measured on 2 CPU cores shared with other jobs (load average 3-5, so wall times swing run to run; 10
steps, two runs each, before = commit 61d12c7, after = the engine/batching changes that followed):

    tokens/turn   C-RL step before -> after     plain GRPO step   ratio before -> after
    6             0.22-0.32 s -> 0.25-0.28 s     0.045-0.058 s     5.0-6.1x -> 4.5-4.7x
    64            0.60-0.75 s -> 0.40-0.55 s     0.23-0.28 s       2.6-2.7x -> 1.7-2.1x

At 64 tokens the policy's turns now decode as one batch per step (the rollouts announce themselves to the
engine, `LocalEngine.expecting`), instead of two (the collaborators' answers arrive one by one, so the
first group's turns started alone and every later one paid all decoding steps again). At 6 tokens the
fixed cost of running the system dominates: per step 16 graph runs (LangGraph, about 30-45 ms unprofiled),
8 collaborator calls over HTTP through LiteLLM (about 45-75 ms; LiteLLM's cost lookup for an unpriced model
is a third of it), the policy's turns (about 20 ms) and a longer training pass than plain GRPO (the
policy's segments quote the collaborators: about 80 ms vs 40 ms). None of that is per-token, so the
ratio falls as turns grow and falls further with a real policy, whose decoding dominates; the 1.5x target
is not met at these tiny budgets on this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import colab_graphs._env  # noqa: F401  (offline settings before transformers loads)


def _settings(out: Path, tokens: int = 6, policy: str = "tiny-random") -> dict:
    return {
        "policy_model": policy,
        "graph": "colab_graphs.trainers.toy:relay",
        "scorer": "toy_marker",
        "pool": {"policy": {"max_tokens": tokens}},
        "scripted_members": {
            "solver_a": {"script": "arithmetic_solver", "args": {"accuracy": 1.0, "seed": 1}},
            "solver_b": {"script": "arithmetic_solver", "args": {"accuracy": 0.5, "seed": 2}},
        },
        "num_generations": 4,
        "per_device_train_batch_size": 16,
        "max_completion_length": tokens,
        "learning_rate": 2e-3,
        "use_cpu": True,
        "output_dir": str(out),
    }


def step_times():  # noqa: ANN201 - a transformers TrainerCallback, defined once transformers may load
    """A callback recording TRL's `step_time` and the policy's completion length per logged step."""
    from transformers import TrainerCallback

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.generation: list[float] = []  # seconds in _generate_and_score_completions, per call
            self.tokens: list[float] = []
            self.cpu: list[float] = []
            self._cpu_mark = time.process_time()

        def on_log(self, args, state, control, logs=None, **kwargs) -> None:  # noqa: ANN001
            logs = logs or {}
            if "step_time" in logs:
                self.times.append(float(logs["step_time"]))
                now = time.process_time()
                self.cpu.append(now - self._cpu_mark)
                self._cpu_mark = now
            for key in ("policy_tokens", "completions/mean_length"):
                if key in logs:
                    self.tokens.append(float(logs[key]))

    return StepTimes()


def time_generation(trainer: Any, recorder: Any) -> None:
    """Record how long each step's rollouts + scoring take (the rest of the step is the training pass)."""
    inner = trainer._generate_and_score_completions

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            recorder.generation.append(time.perf_counter() - started)

    trainer._generate_and_score_completions = timed


def crl(steps: int, out: Path, tokens: int, policy: str = "tiny-random") -> Any:
    from datasets import Dataset

    from colab_graphs.models.client import ModelClient
    from colab_graphs.tasks.builtin import builtin_task
    from colab_graphs.testing.server import server_for_configs
    from colab_graphs.trainers import system
    from colab_graphs.trainers.config import config_from_dict
    from colab_graphs.trainers.grpo import CRLTrainer
    from colab_graphs.trainers.pipeline import grpo_args
    from colab_graphs.trainers.rollout import LoopThread, PolicyRouter, RolloutRunner

    config = config_from_dict({**_settings(out, tokens, policy), "max_steps": steps})
    examples = builtin_task("arithmetic", n=64)
    recorder = step_times()
    with server_for_configs(config.scripted_members, "scripted_members") as server:
        pool = system.build_pool(config, server)
        spec = system.build_spec(config, pool)
        model, tokenizer = system.load_policy(config.policy_model, "cpu")
        router = PolicyRouter(ModelClient(None), ["policy"], system.policy_overrides(config))
        loop = LoopThread.shared()
        trainer = CRLTrainer(
            runner=RolloutRunner(spec, pool, router, config.scorer),
            examples={e.id: e for e in examples},
            loop=loop,
            model=model,
            args=grpo_args(config, out),
            train_dataset=Dataset.from_list([{"prompt": e.input, "example_id": e.id} for e in examples]),
            processing_class=tokenizer,
            callbacks=[recorder],
        )
        system.seat_policy(config, trainer.policy_module(), tokenizer)
        time_generation(trainer, recorder)
        trainer.train()
    return recorder


def plain(steps: int, out: Path, tokens: int, policy: str = "tiny-random") -> Any:
    from datasets import Dataset
    from trl import GRPOTrainer

    from colab_graphs.tasks.builtin import builtin_task
    from colab_graphs.trainers import system
    from colab_graphs.trainers.config import config_from_dict
    from colab_graphs.trainers.pipeline import grpo_args
    from colab_graphs.trainers.toy import MARKER

    config = config_from_dict({**_settings(out, tokens, policy), "max_steps": steps})
    examples = builtin_task("arithmetic", n=64)
    model, tokenizer = system.load_policy(config.policy_model, "cpu")

    def marker(completions, **_):  # noqa: ANN001, ANN202 - TRL's reward function signature
        return [float(MARKER in c[0]["content"]) for c in completions]

    recorder = step_times()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[marker],
        args=grpo_args(config, out),
        train_dataset=Dataset.from_list(
            [{"prompt": [{"role": "user", "content": e.input}]} for e in examples]
        ),
        processing_class=tokenizer,
        callbacks=[recorder],
    )
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    time_generation(trainer, recorder)
    trainer.train()
    return recorder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=6, help="max tokens per policy turn")
    parser.add_argument(
        "--policy", default="tiny-random", help="zoo name or folder of the policy (e.g. smollm2-135m)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            "crl": crl(args.steps, Path(tmp) / "crl", args.tokens, args.policy),
            "plain_grpo": plain(args.steps, Path(tmp) / "plain", args.tokens, args.policy),
        }
    report: dict = {"policy": args.policy, "max_tokens_per_turn": args.tokens}
    for name, rec in results.items():
        report[name] = {
            "median_step_s": round(statistics.median(rec.times[1:]), 3),
            "first_step_s": round(rec.times[0], 3),
            "median_cpu_s_per_step": round(statistics.median(rec.cpu[1:]), 3),
            # rollouts + scoring (C-RL: the whole system's runs), and what is left: loss, backward, optimizer
            "median_generation_s": round(statistics.median(rec.generation[1:]), 3),
            "median_train_s": round(
                statistics.median(t - g for t, g in zip(rec.times[1:], rec.generation[1:], strict=False)), 3
            ),
            "policy_tokens_per_rollout": round(statistics.mean(rec.tokens), 2) if rec.tokens else None,
        }
    report["ratio"] = round(report["crl"]["median_step_s"] / report["plain_grpo"]["median_step_s"], 2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
