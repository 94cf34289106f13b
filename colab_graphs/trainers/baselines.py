"""Baselines run by the same command: `reward: solo` and `reward: sft`.

- `solo` is GRPO with the policy answering alone (standard RL on its own correctness): the pipeline hands
  the trainer the `solo` protocol instead of the system's, nothing else changes.
- `sft` (collaborative fine-tuning): each step runs G system rollouts per prompt, keeps the policy turns of
  rollouts that scored at least `sft_min_reward`, and takes one AdamW step on the mean token cross-entropy of
  those turns' completions given their exact prompts. A step with no successful rollout makes no update.
  With `save_steps`, it checkpoints under `checkpoints/checkpoint-N/` (weights, optimizer, RNG) and
  `resume_from_checkpoint` continues from one, as the GRPO runs do.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
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


SFT_STATE = "sft_state.pt"


def save_sft_checkpoint(folder: Path, model: Any, optimizer: Any, step: int) -> None:
    """Write `folder` whole or not at all (a kill mid-save leaves only a `.tmp` folder, ignored on resume)."""
    import torch

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    torch.save(state, tmp / SFT_STATE)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def load_sft_checkpoint(folder: Path, model: Any, optimizer: Any) -> int:
    """Restore weights, optimizer and RNG from `folder`; returns the step it was saved after."""
    import torch

    from colab_graphs.trainers.config import ConfigError

    path = Path(folder) / SFT_STATE
    if not path.is_file():
        raise ConfigError(f"resume_from_checkpoint: {folder} is not a reward=sft checkpoint (no {SFT_STATE})")
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])


def sft_train(
    config: TrainConfig,
    model: Any,
    tokenizer: Any,
    runner: RolloutRunner,
    examples: Sequence[Example],
    loop: LoopThread,
    metrics_path: Path,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    checkpoints: Path | None = None,
    resume: Path | None = None,
) -> Any:
    """Collaborative fine-tuning for `config.max_steps` steps; returns the trained model.

    Args:
        checkpoints: where `checkpoint-N` folders go every `config.save_steps` steps (None: none).
        resume: a checkpoint folder to continue from (its step's metric lines are already written).
    """
    import torch

    from colab_graphs.trainers.grpo import eval_mode, rollout_metrics

    torch.manual_seed(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    prompts_per_step = max(1, config.per_device_train_batch_size // config.num_generations)
    batches = _batches(examples, prompts_per_step, config.seed)
    done = 0
    if resume is not None:
        done = load_sft_checkpoint(resume, model, optimizer)
        for _ in range(done):  # the same prompts, in the same order, as an uninterrupted run
            next(batches)
    model.train()
    for step in range(done + 1, config.max_steps + 1):
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
        if checkpoints is not None and config.save_steps and step % config.save_steps == 0:
            save_sft_checkpoint(checkpoints / f"checkpoint-{step}", model, optimizer, step)
        if on_step is not None:
            on_step(line)
    return model
