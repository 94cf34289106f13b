"""The TRL adapter: a `GRPOTrainer` whose generation step runs the live system and trains on policy segments.

TRL's GRPO batch holds one completion per prompt row. A policy seated in a graph writes a variable number of
turns per rollout, each with its own prompt (debate rounds give the policy a fresh prompt that quotes the
others), so `CRLTrainer` overrides `_generate_and_score_completions` (TRL 1.16 private API; pinned, and
tested directly in tests/test_trainer.py) to return a batch of **segments**:

    one row per policy turn: prompt_ids = the exact tokens the policy saw, completion_ids = the exact tokens
    it wrote, completion_mask = 1 on those tokens only, advantages = that turn's credit.

Everything the other members wrote reaches the policy only inside a segment's prompt, which carries no loss.
`loss_type="dapo"` (the default) normalises by the number of policy tokens in the batch, so the padding rows
added to make the batch split evenly over `steps_per_generation` change nothing.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from trl import GRPOTrainer

from colab_graphs.data.example import Example
from colab_graphs.trainers.credit import turn_advantages
from colab_graphs.trainers.rollout import LoopThread, PolicyTurn, Rollout, RolloutRunner, check_rollouts

TRL_VERSION = "1.16.0"


def system_reward(
    prompts: list, completions: list, system_reward: list[float] | None = None, **_: Any
) -> list:
    """The reward TRL sees: the system's score of each rollout (computed by the rollout, not here).

    `CRLTrainer` computes rewards while running the graph; this function only names the reward in TRL's
    bookkeeping and returns the values it is handed.
    """
    return list(system_reward) if system_reward is not None else [None] * len(prompts)


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Generate without dropout, and with a KV cache even when gradient checkpointing is on."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def segment_batch(
    segments: Sequence[tuple[PolicyTurn, float]], pad_id: int, multiple: int = 1, device: Any = "cpu"
) -> dict[str, torch.Tensor]:
    """Pad policy segments into TRL's batch layout (prompts left-padded, completions right-padded).

    Rows are added (all-masked, advantage 0) until the row count is a positive multiple of `multiple`.
    """
    rows = [(list(t.prompt_ids), list(t.completion_ids), float(a)) for t, a in segments]
    while not rows or len(rows) % multiple:
        rows.append(([pad_id], [pad_id], None))  # type: ignore[arg-type]
    p_len = max(len(p) for p, _, _ in rows)
    c_len = max(len(c) for _, c, _ in rows)
    prompt_ids = torch.full((len(rows), p_len), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(rows), p_len), dtype=torch.long)
    completion_ids = torch.full((len(rows), c_len), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((len(rows), c_len), dtype=torch.long)
    advantages = torch.zeros(len(rows))
    for i, (p, c, a) in enumerate(rows):
        prompt_ids[i, p_len - len(p) :] = torch.tensor(p)
        prompt_mask[i, p_len - len(p) :] = 1
        completion_ids[i, : len(c)] = torch.tensor(c)
        if a is not None:
            completion_mask[i, : len(c)] = 1
            advantages[i] = a
        else:
            prompt_mask[i] = 0
            prompt_mask[i, -1] = 1  # one attended token keeps the padding row's softmax finite
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
    }
    batch = {k: v.to(device) for k, v in batch.items()}
    batch["num_items_in_batch"] = completion_mask.sum().to(device)
    return batch


def rollout_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Per-step means over rollouts: system reward, the policy's own correctness, turns and tokens."""
    done = [r for r in rollouts if not r.failed]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    own = [r.policy_score for r in done if r.policy_score is not None]
    return {
        "system_reward": mean([r.reward for r in done]),
        "policy_correct": mean(own),
        "policy_turns": mean([len(r.turns) for r in done]),
        "policy_tokens": mean([sum(len(t.completion_ids) for t in r.turns) for r in done]),
        "system_tokens": mean([r.trace.tokens for r in done]),
        "failed_rollouts": float(len(rollouts) - len(done)),
    }


class CRLTrainer(GRPOTrainer):
    """GRPO on the system's outcome, with the policy seated in a live graph.

    Args:
        runner: runs the graph with the policy seated (its policy engine must hold this trainer's model).
        examples: the training examples by id (the dataset rows carry `example_id`).
        credit: "uniform" or "replay" (see `colab_graphs.trainers.credit`).
        replay_samples: K for replay credit.
        metrics_path: where a line per logged step is appended (None: no file).
        loop: the event loop thread rollouts run on (one is made when None).
        on_log: called with each metrics line (e.g. to print progress).
        **kwargs: `GRPOTrainer` arguments (model, args, train_dataset, processing_class, peft_config, ...).
    """

    def __init__(
        self,
        *,
        runner: RolloutRunner,
        examples: dict[str, Example],
        credit: str = "uniform",
        replay_samples: int = 2,
        metrics_path: str | Path | None = None,
        loop: LoopThread | None = None,
        on_log: Callable[[dict[str, Any]], None] | None = None,
        **kwargs: Any,
    ):
        from transformers import PrinterCallback

        kwargs.setdefault("reward_funcs", [system_reward])
        super().__init__(**kwargs)
        self.remove_callback(
            PrinterCallback
        )  # metrics go to metrics.jsonl and `on_log`, not raw dicts on stdout
        self.on_log = on_log
        self.runner = runner
        self.examples = examples
        self.credit = credit
        self.replay_samples = replay_samples
        self.metrics_path = Path(metrics_path) if metrics_path is not None else None
        self.loop = loop or LoopThread.shared()
        self.last_rollouts: list[Rollout] = []
        self.last_batch: dict[str, torch.Tensor] | None = None
        self._step_started = time.perf_counter()

    def policy_module(self) -> torch.nn.Module:
        """The model the rollouts must generate with (adapters applied, wrappers removed)."""
        model = self.accelerator.unwrap_model(self.model)
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else self.num_generations_eval
        ids = [row["example_id"] for row in inputs]
        for start in range(0, len(ids), group):
            if len(set(ids[start : start + group])) != 1:
                # Group statistics are computed per process: a group split across processes cannot be scored.
                raise RuntimeError(
                    f"this process's generation batch is not in whole groups of {group} rollouts per prompt "
                    f"({ids}); make per_device_train_batch_size a multiple of num_generations"
                )
        examples = [self.examples[i] for i in ids]
        with eval_mode(self.model):
            rollouts, credit = self.loop.run(self._rollouts_and_credit(examples, group))
        segments = [
            (t, a)
            for r, advs in zip(rollouts, credit, strict=True)
            for t, a in zip(r.turns, advs, strict=True)
        ]
        multiple = self.args.steps_per_generation if mode == "train" else 1
        batch = segment_batch(segments, self._tokenizer.pad_token_id, multiple, self.accelerator.device)
        batch.update(self._extra_logps(batch))
        self.last_rollouts, self.last_batch = rollouts, batch
        for name, value in rollout_metrics(rollouts).items():
            self._metrics[mode][name].append(value)
        self._metrics[mode]["segments"].append(float(len(segments)))
        self._metrics[mode]["reward"].append(self._metrics[mode]["system_reward"][-1])
        if mode == "train":
            self.state.num_input_tokens_seen += int(
                batch["prompt_mask"].sum() + batch["completion_mask"].sum()
            )
        return batch

    async def _rollouts_and_credit(
        self, examples: list[Example], group: int
    ) -> tuple[list[Rollout], list[list[float]]]:
        """Run the rollouts and assign credit in one trip to the rollout loop (each trip costs a thread hop)."""
        rollouts = await self.runner.arun(examples)
        check_rollouts(rollouts)
        credit = await turn_advantages(
            self.runner, rollouts, group, self.credit, self.replay_samples, self.args.scale_rewards
        )
        return rollouts, credit

    def _extra_logps(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Old-policy logps when a generation batch spans several updates; reference logps when beta > 0."""
        out: dict[str, torch.Tensor] = {}
        generate_every = self.args.steps_per_generation * self.num_iterations
        need_old = self.args.gradient_accumulation_steps % generate_every != 0
        if not need_old and self.beta == 0.0:
            return out
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        keep = batch["completion_ids"].size(1)
        size = self.args.per_device_train_batch_size
        with torch.no_grad():
            if need_old:
                out["old_per_token_logps"] = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention, keep, batch_size=size
                )[0]
            if self.beta != 0.0:
                if self.ref_model is not None:
                    ref = self._get_per_token_logps_and_entropies(
                        self.ref_model, input_ids, attention, keep, size
                    )
                else:
                    model = self.accelerator.unwrap_model(self.model)
                    with model.disable_adapter():
                        ref = self._get_per_token_logps_and_entropies(
                            self.model, input_ids, attention, keep, size
                        )
                out["ref_per_token_logps"] = ref[0]
        return out

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's logging, plus a line in `metrics.jsonl` per training log."""
        training = self.model.training
        super().log(logs, start_time)
        if not training or "loss" not in logs:
            return
        now = time.perf_counter()
        line = {"step": self.state.global_step, "wall_s": round(now - self._step_started, 3), **logs}
        self._step_started = now
        if self.metrics_path is not None:
            with open(self.metrics_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, default=float) + "\n")
        if self.on_log is not None:
            self.on_log(line)
