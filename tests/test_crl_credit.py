"""Replay credit: bounded whatever the rewards, zero when nothing varies, unbiased without scaling.

The system is simulated: `FakeRunner.areplay` returns re-run outcomes drawn from a known distribution, so
the tests check the credit arithmetic, not a model.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from dataclasses import dataclass, field

import pytest

from colab_graphs.trainers.credit import replay_advantage, replay_scales, turn_advantages


@dataclass
class Turn:
    seat: str
    occurrence: int = 0


@dataclass
class Outcome:
    reward: float | None
    turns: list[Turn] = field(default_factory=lambda: [Turn("a")])

    @property
    def failed(self) -> bool:
        return self.reward is None


class FakeRunner:
    """Re-runs return scripted outcomes: `script[(rollout reward id, turn seat)]` or a sampler."""

    def __init__(self, replays):  # noqa: ANN001 - a callable (rollout, turn, k) -> list of rewards
        self.replays = replays

    async def areplay(self, rollout: Outcome, turn: Turn, samples: int) -> list[Outcome]:
        return [Outcome(r) for r in self.replays(rollout, turn, samples)]


def position(rollouts: list[Outcome], rollout: Outcome) -> int:
    return next(i for i, r in enumerate(rollouts) if r is rollout)


def credit(rollouts: list[Outcome], replays, group: int, scale: str = "group") -> list[list[float]]:  # noqa: ANN001
    return asyncio.run(turn_advantages(FakeRunner(replays), rollouts, group, "replay", 2, scale))


def test_an_equal_reward_group_gets_bounded_replay_credit() -> None:
    """The issue's case: four rollouts that all scored 1; one turn's re-runs give [0, 1], another's [0, 0]."""
    rollouts = [Outcome(1.0) for _ in range(4)]
    scripted = {0: [0.0, 1.0], 1: [0.0, 0.0]}
    advantages = credit(rollouts, lambda r, t, k: scripted.get(position(rollouts, r), [1.0, 1.0]), 4)
    flat = [a for row in advantages for a in row]
    n = 4 + 4 * 2  # four rollouts, one turn each, two re-runs per turn
    assert max(abs(a) for a in flat) <= math.sqrt(2 * (n - 1))
    scale = replay_scales([1.0] * 4, [[0, 1], [0, 0], [1, 1], [1, 1]], 4)[0]
    assert advantages[0][0] == pytest.approx(0.5 / scale)
    assert advantages[1][0] > advantages[0][0] > 0  # the turn whose re-runs all lost mattered most
    assert advantages[2][0] == advantages[3][0] == 0.0  # re-runs ended as the rollout did


def test_replay_credit_is_zero_when_no_outcome_varies() -> None:
    rollouts = [Outcome(0.0) for _ in range(4)]
    assert credit(rollouts, lambda r, t, k: [0.0] * k, 4) == [[0.0]] * 4
    assert replay_advantage(0.0, [0.0, 0.0], 0.0) == 0.0


def test_replay_credit_is_bounded_for_any_rewards() -> None:
    """n pooled outcomes of range d have a std of at least d / sqrt(2 (n - 1)): |A| <= sqrt(2 (n - 1))."""
    rng = random.Random(0)
    for _ in range(200):
        # Nearly equal continuous rewards in the group, wider ones in the re-runs: the old worst case.
        base = rng.random()
        rollouts = [Outcome(base + rng.random() * 1e-6, [Turn("a"), Turn("b")]) for _ in range(4)]
        advantages = credit(rollouts, lambda r, t, k: [rng.random() for _ in range(k)], 4)
        n = 4 + 4 * 2 * 2
        assert max(abs(a) for row in advantages for a in row) <= math.sqrt(2 * (n - 1)) + 1e-9


def test_scaling_never_flips_or_reorders_turn_credit_within_a_prompt() -> None:
    rng = random.Random(1)
    rollouts = [Outcome(float(rng.random() < 0.5), [Turn("a"), Turn("b")]) for _ in range(8)]
    draws = {(i, s): [float(rng.random() < 0.5) for _ in range(2)] for i in range(8) for s in "ab"}

    def replays(r: Outcome, t: Turn, k: int) -> list[float]:
        return draws[(position(rollouts, r), t.seat)]

    raw = credit(rollouts, replays, 4, scale="none")
    scaled = credit(rollouts, replays, 4, scale="group")
    for group in (range(0, 4), range(4, 8)):
        ratios = {round(s / r, 9) for i in group for r, s in zip(raw[i], scaled[i], strict=True) if r}
        assert len(ratios) <= 1 and all(x > 0 for x in ratios)  # one positive factor per prompt
        assert all((r == 0) == (s == 0) for i in group for r, s in zip(raw[i], scaled[i], strict=True))


def test_unscaled_replay_credit_is_an_unbiased_estimate_of_the_turns_advantage() -> None:
    """A turn picks a good action (wins 80%) with p = 0.3, else a bad one (wins 20%): E[A | a] = Q(a) - V."""
    rng = random.Random(2)
    q = {"good": 0.8, "bad": 0.2}
    p_good = 0.3
    value = p_good * q["good"] + (1 - p_good) * q["bad"]

    def act() -> str:
        return "good" if rng.random() < p_good else "bad"

    def outcome(action: str) -> float:
        return float(rng.random() < q[action])

    totals = {"good": [0.0, 0], "bad": [0.0, 0]}
    for _ in range(1500):
        actions = [act() for _ in range(4)]
        rollouts = [Outcome(outcome(a)) for a in actions]
        advantages = credit(rollouts, lambda r, t, k: [outcome(act()) for _ in range(k)], 4, scale="none")
        for action, row in zip(actions, advantages, strict=True):
            totals[action][0] += row[0]
            totals[action][1] += 1
    for action in ("good", "bad"):
        mean = totals[action][0] / totals[action][1]
        assert mean == pytest.approx(q[action] - value, abs=0.04), action


def test_batch_scale_takes_the_std_of_every_process_outcomes() -> None:
    """`scale_rewards: batch` over two processes: each scales by the std of the whole batch (TRL's global
    std), not by its own half's."""
    from colab_graphs.trainers.credit import assign_credit, batch_outcomes, group_advantages

    halves = [[Outcome(r) for r in (1.0, 0.0, 1.0, 1.0)], [Outcome(r) for r in (3.0, 0.0, 0.0, 0.0)]]
    pooled = [x for half in halves for x in batch_outcomes(half, None)]  # what gather_object returns
    whole = group_advantages([r.reward for half in halves for r in half], 4, "batch")
    split = [a for half in halves for (a,) in assign_credit(half, 4, "uniform", None, "batch", pooled)]
    assert split == pytest.approx(whole)
    local = [a for half in halves for (a,) in assign_credit(half, 4, "uniform", None, "batch")]
    assert local != pytest.approx(whole)  # each half's own std: a different step


def test_batch_scale_of_replay_credit_pools_every_process_rollouts_and_re_runs() -> None:
    from colab_graphs.trainers.credit import assign_credit, batch_outcomes

    rollouts = [Outcome(1.0), Outcome(0.0)]
    outcomes = {(0, 0): [0.0, 1.0], (1, 0): [0.0, 0.0]}
    other_process = [5.0, 0.0, 5.0]
    pooled = batch_outcomes(rollouts, outcomes) + other_process
    advantages = assign_credit(rollouts, 2, "replay", outcomes, "batch", pooled)
    mean = sum(pooled) / len(pooled)
    std = math.sqrt(sum((x - mean) ** 2 for x in pooled) / (len(pooled) - 1))
    assert advantages == [[pytest.approx((1.0 - 0.5) / std)], [0.0]]


def test_a_batch_baseline_teaches_from_groups_that_all_scored_alike() -> None:
    """`advantage_baseline: batch`: a policy that names the same teammate on every question scores 1, 1, 1, 1
    where that teammate is right and 0, 0, 0, 0 where it is not. The group baseline gives both groups 0 (nothing
    to learn); the batch baseline tells it where it is wrong. Over two processes the baseline is the whole
    batch's mean, as the scale is its std."""
    from colab_graphs.trainers.credit import assign_credit, batch_outcomes, group_advantages

    rewards = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert group_advantages(rewards, 4, "none") == [0.0] * 8
    batch = group_advantages(rewards, 4, "none", baseline="batch")
    assert batch == [0.5] * 4 + [-0.5] * 4
    spread = statistics.stdev(rewards)  # the batch's std (sample), as `scale_rewards: batch` takes it
    scaled = group_advantages(rewards, 4, "batch", baseline="batch")
    assert scaled == pytest.approx([0.5 / spread] * 4 + [-0.5 / spread] * 4, rel=1e-3)
    halves = [[Outcome(r) for r in (1.0, 1.0, 1.0, 1.0)], [Outcome(r) for r in (0.0, 0.0, 0.0, 1.0)]]
    pooled = [x for half in halves for x in batch_outcomes(half, None)]
    split = [
        a for half in halves for (a,) in assign_credit(half, 4, "uniform", None, "batch", pooled, "batch")
    ]
    whole = group_advantages([r.reward for half in halves for r in half], 4, "batch", baseline="batch")
    assert split == pytest.approx(whole) and split[0] > 0 > split[4]
    # A failed rollout keeps 0 and stays out of the mean.
    assert group_advantages([1.0, None, 0.0, 0.0], 2, "none", baseline="batch")[1] == 0.0
    # Refused where it cannot work: with the group's own std (0 for such a group), or with replay credit.
    with pytest.raises(ValueError, match="needs scale"):
        group_advantages(rewards, 4, "group", baseline="batch")
    with pytest.raises(ValueError, match="replay"):
        assign_credit(halves[0], 4, "replay", {}, "batch", None, "batch")
