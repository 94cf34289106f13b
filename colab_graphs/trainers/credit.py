"""Credit assignment: how a rollout's system reward becomes an advantage on each of the policy's turns.

- `uniform` (the paper's choice): every policy turn of rollout r gets the group-relative advantage of r,
  A_r = (R_r - mean_g R_g) / (std_g R_g + 1e-4), as TRL's GRPO computes it (Bessel-corrected std; failed
  rollouts are left out of the group statistics and get 0). The leave-one-out baseline v(N \\ {policy}) is
  the same for every rollout of a prompt, so it cancels in R_r - mean_g R_g: C-RL needs no extra rollouts.
- `replay` (turn-level): for each policy turn t of rollout r, fork the trace at t, resample t K times and
  re-run the rest of the system from there (`RolloutRunner.areplay`); the turn's advantage is the rollout's
  reward minus the mean reward of those K re-runs, A_{r,t} = (R_r - mean_k R'_{r,t,k}) / s.
  A turn whose resamples all end the same as the rollout (a turn that does not matter) gets 0; a turn that
  decided the outcome gets the whole difference.
  Cost: K x (policy turns per rollout) extra system runs per rollout, on top of the G rollouts per prompt;
  calls upstream of the fork (and any call whose inputs the fork did not change) are served from the
  recorded trace, so a replay costs only the calls downstream of the fork.

The replay scale s (`replay_scales`). The numerator R_r - mean_k R'_{r,t,k} is an unbiased estimate of the
turn's advantage Q(s_t, a_t) - V(s_t): R_r continues from the action the policy took, the re-runs from fresh
draws at the same state. Dividing by the *group's* reward std, as `uniform` does, is wrong here: replays see
variance the group did not (four rollouts that all scored 1 while a resampled turn scores 0), so the std is 0
and the advantage was 1/1e-4 = 10,000. Instead s is the sample std of every outcome observed from the prompt,
the G rollouts and all their re-runs pooled (`scale="batch"`: pooled over the batch; `"none"`: 1):

- bounded: n outcomes with range d have a std of at least d / sqrt(2 (n - 1)), and a numerator is at most d,
  so |A| <= sqrt(2 (n - 1)) whatever the rewards (n = 20 for G = 4, two turns, K = 2: at most 6.2);
- zero exactly when nothing varies: if every pooled outcome is equal the numerator is 0 as well, and the
  advantage is 0 (no division by ~0, no epsilon that decides the step);
- unbiased in direction: s is one positive number per prompt, shared by all its turns and rollouts, so it
  never flips the sign of a turn's credit nor reorders turns within a prompt; it sets the prompt's step size
  as GRPO's group scaling does. With `scale_rewards: none` the advantage is the unbiased estimate itself.

Falling back to the batch std (or 1) only when the group std is ~0, as first proposed, leaves the blow-up for
a group std that is small but not ~0 (continuous rewards), and mixes two scales in one batch; pooling uses
every outcome the replays paid for and needs no threshold.

Several processes: groups are whole per process, so group statistics are local; `scale_rewards: batch` is
the std of the *global* batch, as TRL takes it, so each process hands `assign_credit` every process's
outcomes (`batch_outcomes`, gathered by the trainer) as `pooled`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from colab_graphs.trainers.rollout import Rollout, RolloutRunner

EPS = 1e-4


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def reward_scales(
    rewards: Sequence[float | None],
    group_size: int,
    scale: str = "group",
    pooled: Sequence[float] | None = None,
) -> list[float]:
    """The denominator of each rollout's advantage: group std, batch std, or 1 (`scale="none"`), plus EPS.

    `pooled`: for `scale="batch"`, the rewards of the whole batch over all processes (TRL's global std);
    None: this batch's own.
    """
    if scale == "none":
        return [1.0] * len(rewards)
    if scale == "batch":
        values = pooled if pooled is not None else [r for r in rewards if r is not None]
        return [_std(values) + EPS] * len(rewards)
    if scale != "group":
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    out = []
    for start in range(0, len(rewards), group_size):
        group = [r for r in rewards[start : start + group_size] if r is not None]
        out.extend([_std(group) + EPS] * len(rewards[start : start + group_size]))
    return out


def group_advantages(
    rewards: Sequence[float | None],
    group_size: int,
    scale: str = "group",
    pooled: Sequence[float] | None = None,
    baseline: str = "group",
) -> list[float]:
    """Uniform credit: the group-relative advantage of each rollout (groups are consecutive runs of
    `group_size`). A failed rollout (reward None) is left out of its group's statistics and gets 0.
    `pooled` as in `reward_scales`.

    `baseline="batch"` subtracts the mean reward of the whole batch (`pooled`, else these rewards) instead of
    the group's: a group whose rollouts all scored alike still says whether its prompt went better or worse
    than the batch's others (a policy that gives one reply to every prompt is told on which prompts it is
    wrong). It needs a scale that is not the group's std (0 for such a group).

    Example:
        >>> [round(a, 3) for a in group_advantages([1.0, 0.0, 0.0, 1.0], 2, scale="none")]
        [0.5, -0.5, -0.5, 0.5]
        >>> [round(a, 3) for a in group_advantages([1.0, 1.0, 0.0, 0.0], 2, scale="none", baseline="batch")]
        [0.5, 0.5, -0.5, -0.5]
    """
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    if baseline not in ("group", "batch"):
        raise ValueError(f"baseline must be 'group' or 'batch', got {baseline!r}")
    if baseline == "batch" and scale == "group":
        raise ValueError(
            "baseline 'batch' needs scale 'batch' or 'none' (a group that scored alike has std 0)"
        )
    scales = reward_scales(rewards, group_size, scale, pooled)
    everyone = [r for r in (pooled if pooled is not None else rewards) if r is not None]
    out = []
    for start in range(0, len(rewards), group_size):
        chunk = rewards[start : start + group_size]
        present = everyone if baseline == "batch" else [r for r in chunk if r is not None]
        mean = sum(present) / len(present) if present else 0.0
        for i, r in enumerate(chunk):
            out.append(0.0 if r is None else (r - mean) / scales[start + i])
    return out


def replay_advantage(reward: float, resampled: Sequence[float | None], scale: float) -> float | None:
    """Turn-level credit: (reward - mean of the resampled outcomes) / scale; None when every resample failed.

    A zero scale means no outcome varied (see `replay_scales`), so the numerator is 0 too: the credit is 0.
    """
    present = [r for r in resampled if r is not None]
    if not present:
        return None
    difference = reward - sum(present) / len(present)
    return difference / scale if scale > 0 else 0.0


def replay_scales(
    rewards: Sequence[float | None],
    replayed: Sequence[Sequence[float | None]],
    group_size: int,
    scale: str = "group",
    pooled: Sequence[float] | None = None,
) -> list[float]:
    """The replay denominator of each rollout: the std of all outcomes observed from its prompt, pooled.

    Args:
        rewards: each rollout's reward (None: failed), G consecutive rollouts per prompt.
        replayed: per rollout, the rewards of all its re-runs (every turn, every resample).
        group_size: G.
        scale: "group" (pool per prompt), "batch" (pool over the batch) or "none" (1).
        pooled: for "batch", every outcome of the whole batch over all processes (`batch_outcomes` of each
            process, gathered); None: this batch's own.

    Example:
        >>> # Four rollouts that all scored 1: the group std is 0, the replays' outcomes still set a scale.
        >>> [round(s, 3) for s in replay_scales([1, 1, 1, 1], [[0, 1], [1, 1], [1, 1], [1, 1]], 4)]
        [0.289, 0.289, 0.289, 0.289]
    """
    if scale == "none":
        return [1.0] * len(rewards)
    if scale not in ("group", "batch"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    if scale == "batch" and pooled is not None:
        return [_std(pooled)] * len(rewards)
    width = len(rewards) if scale == "batch" else group_size
    out = []
    for start in range(0, len(rewards), width):
        pooled = [
            x
            for i in range(start, min(start + width, len(rewards)))
            for x in [rewards[i], *replayed[i]]
            if x is not None
        ]
        out.extend([_std(pooled)] * len(rewards[start : start + width]))
    return out


Outcomes = dict[tuple[int, int], list[float | None]]
"""(rollout, turn) -> the rewards of that turn's re-runs (replay credit)."""


async def replay_outcomes(runner: RolloutRunner, rollouts: Sequence[Rollout], samples: int) -> Outcomes:
    """Re-run every policy turn of every rollout that did not fail `samples` times; their rewards."""
    import asyncio

    jobs = [(i, t, turn) for i, r in enumerate(rollouts) if not r.failed for t, turn in enumerate(r.turns)]
    results = await asyncio.gather(*(runner.areplay(rollouts[i], turn, samples) for i, _, turn in jobs))
    return {(i, t): [x.reward for x in replays] for (i, t, _), replays in zip(jobs, results, strict=True)}


def batch_outcomes(rollouts: Sequence[Rollout], outcomes: Outcomes | None) -> list[float]:
    """Every outcome this batch observed (the rewards, and the re-runs' with replay credit): what
    `scale_rewards: batch` pools, gathered over processes."""
    values = [r.reward for r in rollouts if r.reward is not None]
    values += [x for resampled in (outcomes or {}).values() for x in resampled if x is not None]
    return values


def assign_credit(
    rollouts: Sequence[Rollout],
    group_size: int,
    credit: str = "uniform",
    outcomes: Outcomes | None = None,
    scale: str = "group",
    pooled: Sequence[float] | None = None,
    baseline: str = "group",
) -> list[list[float]]:
    """The advantage of every policy turn of every rollout (`[rollout][turn]`), from the rollouts' rewards
    and, for "replay", their turns' re-run `outcomes` (`replay_outcomes`). `pooled`: for `scale="batch"`,
    `batch_outcomes` over all processes (None: this batch's own). `baseline`: uniform credit's (see
    `group_advantages`)."""
    scale = {True: "group", False: "none"}.get(scale, scale)  # type: ignore[call-overload]
    rewards = [r.reward for r in rollouts]
    if credit == "uniform":
        uniform = group_advantages(rewards, group_size, scale, pooled, baseline)
        return [[uniform[i]] * len(r.turns) for i, r in enumerate(rollouts)]
    if credit != "replay":
        raise ValueError(f"credit must be 'uniform' or 'replay', got {credit!r}")
    if baseline != "group":
        raise ValueError("credit 'replay' has a baseline of its own (the re-runs): baseline must be 'group'")
    outcomes = outcomes or {}
    uniform = group_advantages(rewards, group_size, scale, pooled)
    replayed: list[list[float | None]] = [[] for _ in rollouts]
    for (i, _), resampled in outcomes.items():
        replayed[i].extend(resampled)
    scales = replay_scales(rewards, replayed, group_size, scale, pooled)
    out = [[0.0] * len(r.turns) for r in rollouts]
    for (i, t), resampled in outcomes.items():
        value = replay_advantage(rollouts[i].reward, resampled, scales[i])  # type: ignore[arg-type]
        # Every re-run failed: nothing is known about this turn alone, so it keeps its rollout's credit.
        out[i][t] = uniform[i] if value is None else value
    return out


async def turn_advantages(
    runner: RolloutRunner,
    rollouts: Sequence[Rollout],
    group_size: int,
    credit: str = "uniform",
    samples: int = 2,
    scale: str = "group",
) -> list[list[float]]:
    """The advantage of every policy turn of every rollout (`[rollout][turn]`), in one process.

    Args:
        runner: what re-runs the system (needed by `replay`).
        rollouts: G consecutive rollouts per prompt.
        group_size: G.
        credit: "uniform" or "replay".
        samples: K, re-runs per turn for "replay".
        scale: "group", "batch" or "none" (as TRL's `scale_rewards`).
    """
    if credit not in ("uniform", "replay"):
        raise ValueError(f"credit must be 'uniform' or 'replay', got {credit!r}")
    outcomes = await replay_outcomes(runner, rollouts, samples) if credit == "replay" else None
    return assign_credit(rollouts, group_size, credit, outcomes, scale)
