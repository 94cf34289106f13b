"""The TRL adapter: a `GRPOTrainer` whose generation step runs the live system and trains on policy segments.

TRL's GRPO batch holds one completion per prompt row. A policy seated in a graph writes a variable number of
turns per rollout, each with its own prompt (debate rounds give the policy a fresh prompt that quotes the
others), so `CRLTrainer` overrides `_generate_and_score_completions` (TRL 1.16 private API; pinned, and
tested directly in tests/test_trainer.py) to return a batch of **segments**:

    one row per policy turn: prompt_ids = the exact tokens the policy saw, completion_ids = the exact tokens
    it wrote, completion_mask = 1 on those tokens only, advantages = that turn's credit.

Everything the other members wrote reaches the policy only inside a segment's prompt, which carries no loss.

How a generation batch becomes gradient, on any number of processes (`batch_layout`):

- the loss is normalised by the policy tokens of the whole generation batch **over all processes**
  (`num_items_in_batch` is gathered; TRL's dapo/cispo divide by it and DDP averages the processes), so one
  process over a global batch and P processes over its parts take the same step;
- processes hold different numbers of segments, so every process pads its batch with fully masked rows to
  the same row count, and runs the same number of forward/backward passes of the same size: the collective
  calls inside TRL's loss (`gather`, `reduce`) and DDP's gradient all-reduce see equal shapes;
- no pass holds more than `per_device_train_batch_size` segments: TRL splits the batch into
  `steps_per_generation` micro-batches, and `compute_loss` runs each micro-batch in passes of at most that
  many rows, accumulating their gradients (DDP syncs only on the last pass), with the columns that are
  padding in every row of a pass cut off first.

With a policy server (`rollout: server`, `colab_graphs.trainers.server_rollout`) the trainer loads its adapter
there before each generation batch (on-policy), checks every policy turn's token ids against its tokenizer,
and corrects the gap between the server's log-probs and its own as TRL corrects vLLM generation (the ratio
goes to TRL's `_compute_loss` as `importance_sampling_ratio`).

`objective="sft"` (the `reward: sft` baseline) keeps the turns of rollouts that scored at least
`sft_min_reward` and trains their mean token cross-entropy through the same machinery: the same optimizer,
schedule, clipping, precision, LoRA, gradient accumulation, checkpoints and processes as the GRPO runs.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from trl import GRPOTrainer

from colab_graphs.log import RolloutRecord
from colab_graphs.redaction import hide_secrets
from colab_graphs.tasks.example import Example
from colab_graphs.trainers.baselines import sft_turns
from colab_graphs.trainers.credit import Outcomes, assign_credit, batch_outcomes, replay_outcomes
from colab_graphs.trainers.evaluate import eval_mode
from colab_graphs.trainers.rollout import LoopThread, PolicyTurn, Rollout, RolloutRunner, check_rollouts
from colab_graphs.trainers.segments import batch_layout, row_passes, segment_batch
from colab_graphs.trainers.server_rollout import (
    PolicyServer,
    check_turn_tokens,
    importance_correction,
    sampling_logps,
)

TRL_VERSION = "1.16.0"
OBJECTIVES = ("grpo", "sft")


def system_reward(
    prompts: list, completions: list, system_reward: list[float] | None = None, **_: Any
) -> list:
    """The reward TRL sees: the system's score of each rollout (computed by the rollout, not here).

    `CRLTrainer` computes rewards while running the graph; this function only names the reward in TRL's
    bookkeeping and returns the values it is handed.
    """
    return list(system_reward) if system_reward is not None else [None] * len(prompts)


def training_segments(
    rollouts: Sequence[Rollout],
    credit: Sequence[Sequence[float]] | None,
    sft_min_reward: float = 1.0,
    mask_truncated: bool = False,
) -> list[tuple[PolicyTurn, float]]:
    """The (turn, weight) segments a generation batch trains on: each turn's credit (GRPO), or 1 for the
    turns SFT keeps (`credit` None).

    A failed rollout's turns are not segments: they carry no credit, and their tokens must not dilute the
    loss's normaliser (the policy tokens of the batch). With `mask_truncated` (TRL's
    `mask_truncated_completions`) neither are turns cut off at the token limit: TRL masks them out of the
    loss and its token count alike.
    """
    if credit is None:
        pairs = [(t, 1.0) for t in sft_turns(rollouts, sft_min_reward)]
    else:
        pairs = [
            (t, a)
            for r, advs in zip(rollouts, credit, strict=True)
            if not r.failed
            for t, a in zip(r.turns, advs, strict=True)
        ]
    if mask_truncated:
        pairs = [(t, a) for t, a in pairs if not t.truncated]
    return pairs


def rollout_summaries(rollouts: Sequence[Rollout]) -> list[dict[str, float | None]]:
    """What the step metrics need of each rollout (small, so processes can exchange them)."""
    return [
        {
            "reward": r.reward,
            "policy_score": r.policy_score,
            "turns": len(r.turns),
            "policy_tokens": sum(len(t.completion_ids) for t in r.turns),
            "system_tokens": r.trace.tokens,
        }
        for r in rollouts
    ]


def rollout_metrics(summaries: Sequence[dict[str, float | None]], group: int) -> dict[str, float]:
    """Per-step means over rollouts: system reward, the policy's own correctness, turns and tokens, and
    `reward_std`, the mean over prompts of the reward std within the prompt's group (as TRL logs it), and
    `groups_varied`, the share of groups whose rewards are not all equal (the others give no advantage)."""
    done = [s for s in summaries if s["reward"] is not None]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    stds = []
    for start in range(0, len(summaries), group):
        rewards = [s["reward"] for s in summaries[start : start + group] if s["reward"] is not None]
        if len(rewards) > 1:
            stds.append(statistics.stdev(rewards))
    return {
        "system_reward": mean([s["reward"] for s in done]),
        "reward_std": mean(stds),
        "groups_varied": mean([float(x > 0) for x in stds]),
        "policy_correct": mean([s["policy_score"] for s in done if s["policy_score"] is not None]),
        "policy_turns": mean([s["turns"] for s in done]),
        "policy_tokens": mean([s["policy_tokens"] for s in done]),
        "system_tokens": mean([s["system_tokens"] for s in done]),
        "failed_rollouts": float(len(summaries) - len(done)),
    }


class CRLTrainer(GRPOTrainer):
    """GRPO on the system's outcome (or SFT on its successful turns), with the policy seated in a live graph.

    Args:
        runner: runs the graph with the policy seated (its policy engine must hold this trainer's model).
        examples: the training examples by id (the dataset rows carry `example_id`).
        objective: "grpo" (credit-weighted policy gradient) or "sft" (cross-entropy on kept turns).
        credit: "uniform" or "replay" (see `colab_graphs.trainers.credit`).
        replay_samples: K for replay credit.
        sft_min_reward: objective "sft": keep the turns of rollouts scoring at least this.
        metrics_path: where a line per logged step is appended (None: no file); main process only. Each
            generation batch's first group of rollouts goes beside it to `rollouts.jsonl` (`colab_graphs.log`
            rollout records: the conversation, the reward, each policy turn's credit).
        loop: the event loop thread rollouts run on (one is made when None).
        on_log: called with each metrics line on the main process (e.g. to print progress).
        policy_server: the server that generates the policy's turns (`rollout: server`), None in process.
        **kwargs: `GRPOTrainer` arguments (model, args, train_dataset, processing_class, peft_config, ...).
    """

    def __init__(
        self,
        *,
        runner: RolloutRunner,
        examples: dict[str, Example],
        objective: str = "grpo",
        credit: str = "uniform",
        replay_samples: int = 2,
        advantage_baseline: str = "group",
        sft_min_reward: float = 1.0,
        metrics_path: str | Path | None = None,
        loop: LoopThread | None = None,
        on_log: Callable[[dict[str, Any]], None] | None = None,
        step_fields: dict[str, Any] | None = None,
        policy_server: PolicyServer | None = None,
        **kwargs: Any,
    ):
        from transformers import PrinterCallback

        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
        kwargs.setdefault("reward_funcs", [system_reward])
        super().__init__(**kwargs)
        self.remove_callback(
            PrinterCallback
        )  # metrics go to metrics.jsonl and `on_log`, not raw dicts on stdout
        self.on_log = on_log
        self.step_fields = dict(step_fields or {})  # on every metrics line (code rewards: the sandbox record)
        self.runner = runner
        self.examples = examples
        self.objective = objective
        self.credit = credit
        self.replay_samples = replay_samples
        self.advantage_baseline = advantage_baseline
        self.sft_min_reward = sft_min_reward
        self.metrics_path = Path(metrics_path) if metrics_path is not None else None
        self.rollouts_path = self.metrics_path.with_name("rollouts.jsonl") if self.metrics_path else None
        self.loop = loop or LoopThread.shared()
        self.last_rollouts: list[Rollout] = []
        self.last_batch: dict[str, torch.Tensor] | None = None
        self.pass_rows = self.args.per_device_train_batch_size
        self._seconds = {"generation": 0.0, "credit": 0.0, "step": 0.0}
        self._logged_step: int | None = None  # set by the first training step (a resumed run starts late)
        self._step_started = time.perf_counter()
        self.policy_server = policy_server
        self._sampling: dict[str, float] = {}  # the gap and correction of the batch being trained on
        self.correct_server = policy_server is not None and objective == "grpo"
        if self.correct_server and self.vllm_importance_sampling_correction:
            # TRL's `_compute_loss` multiplies each token's loss by `importance_sampling_ratio` when `use_vllm`
            # and the correction are on: the policy server plays vLLM's part. (TRL's vLLM client is made in
            # `GRPOTrainer.__init__`, which saw use_vllm false; its generation path is overridden here.)
            self.use_vllm = True

    def policy_module(self) -> torch.nn.Module:
        """The model the rollouts must generate with (adapters applied, wrappers removed)."""
        model = self.accelerator.unwrap_model(self.model)
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    # --- generation: rollouts, credit, the padded segment batch ------------------------------------------

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
        if mode == "train":
            self.sync_server_policy()
        with eval_mode(self.model):
            rollouts, outcomes, seconds = self.loop.run(
                self._rollouts_and_replays(examples, self.rollout_keys(len(examples), group), group)
            )
        if self.policy_server is not None:
            check_turn_tokens(rollouts, sorted(self.runner.router.policy_members), self._tokenizer)
        started = time.perf_counter()
        credit = self._credit(rollouts, outcomes, group)
        seconds["credit"] += time.perf_counter() - started
        segments = self._segments(rollouts, credit)
        device = self.accelerator.device
        rows = None
        if mode == "train":
            counts = self.accelerator.gather(torch.tensor([len(segments)], device=device))
            layout = batch_layout(
                int(counts.max()), self.args.steps_per_generation, self.args.per_device_train_batch_size
            )
            rows, self.pass_rows = layout.rows, layout.pass_rows
        batch = segment_batch(segments, self._tokenizer.pad_token_id, rows, device)
        batch["num_items_in_batch"] = self.accelerator.gather(batch["num_items_in_batch"]).sum()
        batch.update(self._extra_logps(batch, segments, mode))
        self.last_rollouts, self.last_batch = rollouts, batch
        self._record(mode, rollouts, segments, group, seconds)
        if mode == "train":
            self._log_rollouts(rollouts[:group], credit[:group] if credit is not None else None)
        if mode == "train":
            self.state.num_input_tokens_seen += int(
                batch["prompt_mask"].sum() + batch["completion_mask"].sum()
            )
        return batch

    def rollout_keys(self, rollouts: int, group: int) -> list[tuple]:
        """Each rollout's seed key for this generation batch: (step, prompt, generation), the prompt counted
        across processes (see `colab_graphs.trainers.rollout` on seeds)."""
        prompts = rollouts // group
        offset = self.accelerator.process_index * prompts
        step = self.state.global_step
        return [
            ("step", step, "prompt", offset + i // group, "generation", i % group) for i in range(rollouts)
        ]

    async def _rollouts_and_replays(
        self, examples: list[Example], keys: list[tuple], group: int
    ) -> tuple[list[Rollout], Outcomes | None, dict[str, float]]:
        """Run the rollouts, and replay credit's re-runs, in one trip to the rollout loop (each trip costs a
        thread hop)."""
        started = time.perf_counter()
        rollouts = await self.runner.arun(examples, keys)
        check_rollouts(rollouts)
        generated = time.perf_counter()
        outcomes = None
        if self.objective == "grpo" and self.credit == "replay":
            outcomes = await replay_outcomes(self.runner, rollouts, self.replay_samples)
        return (
            rollouts,
            outcomes,
            {"generation": generated - started, "credit": time.perf_counter() - generated},
        )

    def _credit(
        self, rollouts: list[Rollout], outcomes: Outcomes | None, group: int
    ) -> list[list[float]] | None:
        """Each policy turn's advantage (GRPO), or None (SFT); `scale_rewards: batch` pools the outcomes of
        every process, as TRL takes the batch std over the global batch."""
        if self.objective != "grpo":
            return None
        pooled = None
        if self.args.scale_rewards == "batch":
            from accelerate.utils import gather_object

            pooled = gather_object(batch_outcomes(rollouts, outcomes))
        scale = self.args.scale_rewards
        return assign_credit(rollouts, group, self.credit, outcomes, scale, pooled, self.advantage_baseline)

    def _segments(
        self, rollouts: list[Rollout], credit: list[list[float]] | None
    ) -> list[tuple[PolicyTurn, float]]:
        return training_segments(rollouts, credit, self.sft_min_reward, self.args.mask_truncated_completions)

    def _record(
        self,
        mode: str,
        rollouts: list[Rollout],
        segments: list[tuple[PolicyTurn, float]],
        group: int,
        seconds: dict[str, float],
    ) -> None:
        """Step metrics over all processes' rollouts; this process's time split."""
        from accelerate.utils import gather_object

        summaries = gather_object(rollout_summaries(rollouts))
        weights = gather_object([a for _, a in segments])
        metrics = rollout_metrics(summaries, group)
        metrics["segments"] = float(len(weights))
        if self.objective == "grpo":
            metrics["advantage_mean"] = statistics.fmean(weights) if weights else 0.0
            metrics["advantage_abs_max"] = max((abs(a) for a in weights), default=0.0)
        metrics["reward"] = metrics["system_reward"]
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)
        if mode == "train":
            self._seconds["generation"] += seconds["generation"]
            self._seconds["credit"] += seconds["credit"]

    def _log_rollouts(self, rollouts: list[Rollout], credit: list[list[float]] | None) -> None:
        """A sample for the log (main process): rollouts with the credit each policy turn was trained with."""
        if self.rollouts_path is None or not self.accelerator.is_main_process:
            return
        members = self.runner.router.policy_members
        lines = [
            RolloutRecord.from_trace(
                self.state.global_step + 1, r.example, r.trace, r.reward, members,
                credit[i] if credit is not None else None, r.policy_score,
            ).model_dump_json(exclude_none=True)
            for i, r in enumerate(rollouts)
        ]  # fmt: skip
        with open(self.rollouts_path, "a", encoding="utf-8") as fh:
            fh.write(hide_secrets("".join(line + "\n" for line in lines)))

    def sync_server_policy(self) -> None:
        """Load the current adapter on the policy server, once per optimizer step (main process saves and
        loads; every process then asks for it). Nothing without a policy server."""
        server = self.policy_server
        step = self.state.global_step
        if server is None or server.loaded_step == step:
            return
        started = time.perf_counter()
        folder = Path(self.args.output_dir).parent / "server_policy" / f"step-{step}"
        if self.accelerator.is_main_process:
            previous = server.loaded_step
            self.accelerator.unwrap_model(self.model).save_pretrained(folder)
            server.load(folder, step)
            if previous is not None:  # the server read it when it was loaded
                shutil.rmtree(folder.parent / f"step-{previous}", ignore_errors=True)
        self.accelerator.wait_for_everyone()
        server.loaded_step, server.model = step, server.adapter
        self._metrics["train"]["policy_sync_s"].append(time.perf_counter() - started)

    def _extra_logps(
        self, batch: dict[str, torch.Tensor], segments: list[tuple[PolicyTurn, float]], mode: str
    ) -> dict[str, torch.Tensor]:
        """Old-policy logps when a generation batch spans several updates or the server's tokens are
        corrected; reference logps when beta > 0; the server correction's ratio (see `server_rollout`)."""
        out: dict[str, torch.Tensor] = {}
        generate_every = self.args.steps_per_generation * self.num_iterations
        need_old = self.objective == "grpo" and self.args.gradient_accumulation_steps % generate_every != 0
        need_old = need_old or (self.correct_server and self.vllm_importance_sampling_correction)
        if not need_old and self.beta == 0.0 and not self.correct_server:
            return out
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        keep = batch["completion_ids"].size(1)
        size = self.args.per_device_train_batch_size
        with torch.no_grad():
            old = None
            if need_old or self.correct_server:
                old = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention, keep, batch_size=size
                )[0]
            if need_old:
                out["old_per_token_logps"] = old
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
        if self.correct_server:
            rows, width = batch["completion_ids"].shape
            served = sampling_logps([t for t, _ in segments], rows, width, old.device)
            ratio, metrics = importance_correction(
                old,
                served,
                batch["completion_mask"],
                self.vllm_importance_sampling_mode,
                self.vllm_importance_sampling_clip_min,
                self.vllm_importance_sampling_clip_max,
            )
            if self.vllm_importance_sampling_correction:
                out["importance_sampling_ratio"] = ratio
            else:  # the gap is still reported; no ratio is applied
                metrics = {k: v for k, v in metrics.items() if "logp_difference" in k}
            for name, value in metrics.items():
                self._metrics[mode][name].append(value)
            if mode == "train":
                self._sampling = metrics
        return out

    # --- training: bounded passes, one global token normaliser -------------------------------------------

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> torch.Tensor:
        """The micro-batch's loss, trained in passes of at most `per_device_train_batch_size` rows.

        Every pass but the last is backpropagated here (without DDP's gradient sync); the last pass's loss is
        returned for the Trainer to backpropagate, plus the earlier passes' (detached) values, so the logged
        loss is the whole micro-batch's and the gradient is each pass's once.
        """
        if return_outputs:
            raise ValueError("CRLTrainer does not return outputs")
        passes = row_passes(inputs, self.pass_rows)
        if len(passes) == 1:  # (TRL's adaptive entropy controller may update entropy_coef in this call)
            return self._pass_loss(model, passes[0])
        if self.use_adaptive_entropy:
            raise RuntimeError(
                f"use_adaptive_entropy: this micro-batch needs {len(passes)} passes of "
                f"{self.pass_rows} rows and TRL's entropy controller would step once per pass; raise "
                "per_device_train_batch_size to the batch's policy turns, or set a fixed entropy_coef"
            )
        # TRL adds its entropy bonus per call as the mean over that call's tokens: each pass's share is
        # weighted by its tokens, so the micro-batch gets one token mean, however many passes it takes.
        coef = self.entropy_coef
        tokens = [float(piece["completion_mask"].sum()) for piece in passes]
        total = sum(tokens) or 1.0
        earlier = None
        try:
            for piece, count in zip(passes[:-1], tokens[:-1], strict=False):
                self.entropy_coef = coef * count / total
                with self.accelerator.no_sync(model):
                    loss = self._pass_loss(model, piece)
                    self.accelerator.backward(loss)
                earlier = loss.detach() if earlier is None else earlier + loss.detach()
            self.entropy_coef = coef * tokens[-1] / total
            loss = self._pass_loss(model, passes[-1])
        finally:
            self.entropy_coef = coef
        return loss if earlier is None else loss + earlier

    def _pass_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        if self.objective == "sft":
            return self._sft_loss(model, inputs)
        return self._compute_loss(model, inputs)

    def _sft_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """Token cross-entropy of the kept completions, normalised as TRL's dapo loss (global token count)."""
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps = self._get_per_token_logps_and_entropies(
            model, input_ids, attention, inputs["completion_ids"].size(1)
        )[0]
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if self.model.training:
            normalizer = (
                normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            )
        return -(logps * inputs["completion_mask"]).sum() / normalizer

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        started = time.perf_counter()
        if self._logged_step is None:
            self._logged_step = self.state.global_step
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            self._seconds["step"] += time.perf_counter() - started

    # --- logging -------------------------------------------------------------------------------------------

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's logging, plus the time split and a line in `metrics.jsonl` per training log."""
        training = self.model.training and "loss" in logs
        if training:
            steps = max(1, self.state.global_step - (self._logged_step or 0))
            generation, credit, step = (self._seconds[k] for k in ("generation", "credit", "step"))
            logs["generation_s"] = round(generation / steps, 4)
            logs["credit_s"] = round(credit / steps, 4)
            logs["training_s"] = round(max(0.0, step - generation - credit) / steps, 4)
            self._seconds = dict.fromkeys(self._seconds, 0.0)
            self._logged_step = self.state.global_step
            for (
                name,
                value,
            ) in self._sampling.items():  # a step that reuses a generation batch (num_iterations
                logs.setdefault(name, round(value, 6))  # > 1) trains with that batch's correction
        super().log(logs, start_time)
        if not training or not self.accelerator.is_main_process:
            return
        now = time.perf_counter()
        line = {
            "step": self.state.global_step,
            "wall_s": round(now - self._step_started, 3),
            **logs,
            **self.step_fields,
        }
        self._step_started = now
        if self.metrics_path is not None:
            with open(self.metrics_path, "a", encoding="utf-8") as fh:
                fh.write(hide_secrets(json.dumps(line, default=float) + "\n"))
        if self.on_log is not None:
            self.on_log(line)
