"""The baselines `colab-graphs train` runs beside C-RL, and what exactly each one is.

Every objective runs through the same `CRLTrainer` (a TRL `GRPOTrainer` subclass) built from the same
`GRPOConfig`: the same optimizer (TRL's default AdamW, weight decay 0), learning-rate schedule (linear decay,
`lr_scheduler_type`, `warmup_steps` to change it), gradient clipping (`max_grad_norm`, 1.0), precision
(`bf16`), LoRA (`lora*`), gradient accumulation, checkpoints, `max_steps` optimizer updates, and number of
processes. They differ only in what is rolled out and what the loss is:

- `reward: system` (C-RL): G rollouts per prompt of the whole system with the policy seated; GRPO's clipped
  policy gradient on the policy's turns, weighted by each turn's credit (`credit: uniform | replay`).
- `reward: solo` (standard RL): G rollouts per prompt of the `solo` protocol, the policy answering alone;
  the same GRPO loss, rewarded by the policy's own score.
- `reward: own` (RL on the policy's own correctness in the seat): G system rollouts per prompt, as C-RL; the
  same GRPO loss, rewarded by the policy's own score there (its last turn scored against the example's
  answer, `Rollout.policy_score`) instead of the system's: what the policy sees is C-RL's, what it is
  rewarded for is its own answer.
- `reward: sft` (collaborative rejection-sampling fine-tuning): G system rollouts per prompt, as C-RL; the
  turns of rollouts scoring at least `sft_min_reward` (`sft_turns`) are kept, and the loss is their mean
  token cross-entropy (log-probabilities at temperature 1, whatever the rollouts' sampling temperature),
  normalised over all kept tokens of the step across processes. A step that keeps no turn has zero loss
  (the optimizer still steps, as it does for a GRPO step whose advantages are all 0).
"""

from __future__ import annotations

from collections.abc import Sequence

from colab_graphs.trainers.rollout import PolicyTurn, Rollout


def sft_turns(rollouts: Sequence[Rollout], min_reward: float) -> list[PolicyTurn]:
    """The policy turns of the rollouts that did not fail and scored at least `min_reward`."""
    return [t for r in rollouts if r.reward is not None and r.reward >= min_reward for t in r.turns]
