"""Baselines run by the same command: `reward: solo` and `reward: sft`.

- `solo` is GRPO with the policy answering alone (standard RL on its own correctness): the pipeline hands
  the trainer the `solo` protocol instead of the system's, nothing else changes.
- `sft` (collaborative fine-tuning): each step runs G system rollouts per prompt, keeps the policy turns of
  rollouts that scored at least `sft_min_reward`, and takes one AdamW step on the mean token cross-entropy of
  those turns' completions given their exact prompts. A step with no successful rollout makes no update.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from colab_graphs.data.example import Example
from colab_graphs.trainers.config import TrainConfig
from colab_graphs.trainers.rollout import LoopThread, PolicyTurn, RolloutRunner, check_rollouts


def sft_loss(model: Any, turns: Sequence[PolicyTurn], pad_id: int) -> Any:
    """Mean cross-entropy of the completion tokens of `turns` (prompt tokens carry no loss)."""
    import torch

    from colab_graphs.trainers.grpo import segment_batch

    batch = segment_batch([(t, 0.0) for t in turns], pad_id, device=model.device)
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    labels = input_ids.clone()
    labels[:, : batch["prompt_ids"].size(1)] = -100
    labels[:, batch["prompt_ids"].size(1) :][batch["completion_mask"] == 0] = -100
    return model(input_ids=input_ids, attention_mask=attention, labels=labels).loss


def _batches(examples: Sequence[Example], per_step: int, seed: int):  # noqa: ANN202
    rng = random.Random(seed)
    while True:
        order = list(examples)
        rng.shuffle(order)
        for start in range(0, len(order) - per_step + 1, per_step):
            yield order[start : start + per_step]
        if len(order) < per_step:
            yield order


def sft_train(
    config: TrainConfig,
    model: Any,
    tokenizer: Any,
    runner: RolloutRunner,
    examples: Sequence[Example],
    loop: LoopThread,
    metrics_path: Path,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> Any:
    """Collaborative fine-tuning for `config.max_steps` steps; returns the trained model."""
    import torch

    from colab_graphs.trainers.grpo import eval_mode, rollout_metrics

    torch.manual_seed(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    prompts_per_step = max(1, config.per_device_train_batch_size // config.num_generations)
    batches = _batches(examples, prompts_per_step, config.seed)
    model.train()
    for step in range(1, config.max_steps + 1):
        started = time.perf_counter()
        chosen = [e for e in next(batches) for _ in range(config.num_generations)]
        with eval_mode(model):
            rollouts = loop.run(runner.arun(chosen))
        check_rollouts(rollouts)
        kept = [t for r in rollouts if not r.failed and r.reward >= config.sft_min_reward for t in r.turns]  # type: ignore[operator]
        loss_value = None
        if kept:
            optimizer.zero_grad()
            loss = sft_loss(model, kept, tokenizer.pad_token_id)
            loss.backward()
            optimizer.step()
            loss_value = float(loss.detach())
        line = {
            "step": step,
            "loss": loss_value,
            "kept_turns": len(kept),
            **{k: None if math.isnan(v) else v for k, v in rollout_metrics(rollouts).items()},
            "wall_s": round(time.perf_counter() - started, 3),
        }
        with open(metrics_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
        if on_step is not None:
            on_step(line)
    return model
