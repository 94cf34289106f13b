"""Sampling intervals mean what they say: simulated over seeds on games whose Shapley values are known.

For each game and each budget the CLI accepts (from the smallest: the stratified estimator's first batch, or
`MIN_PERMUTATIONS`, to most coalitions, where the finite-population correction does most; in coalitions, in
calls, or a target error), the 95% sampling interval must hold the exact value in at least 90% of (seed,
member) pairs. Games: glove, weighted voting, airport, random additive + pairwise interaction (one example
each), and a majority vote over correlated members (many examples: the control variate at work).

The stratified estimator's simultaneous intervals (`simultaneous=True`) must hold every member's exact value at
once in at least 90% of seeds, at the same kinds of budgets.

The example interval (the bootstrap over examples, `ci[member]["shapley"]`) is checked apart: on examples
drawn from a population whose values are known, it must hold the population's value as often.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from colab_graphs.audit.answers import vote_values
from colab_graphs.audit.estimators import estimate, estimates_from, plan_coalitions
from colab_graphs.audit.strategy import MIN_PERMUTATIONS
from colab_graphs.audit.stratified import (
    StratifiedSampler,
    critical_value,
    exact_shapley_table,
    members_of,
    stratified_shapley,
    warmup_masks,
)

N = 8
SEEDS = range(40)


def table_of(n: int, value) -> np.ndarray:
    return np.array([[value([i for i in range(n) if m >> i & 1])] for m in range(1 << n)], dtype=float)


def glove(n: int = N) -> np.ndarray:
    """Left gloves are the first half: a coalition is worth its pairs."""
    return table_of(n, lambda s: min(sum(i < n // 2 for i in s), sum(i >= n // 2 for i in s)) / (n // 2))


def weighted_voting(n: int = N) -> np.ndarray:
    weights = np.random.default_rng(1).integers(1, 10, n)
    return table_of(n, lambda s: float(weights[s].sum() >= weights.sum() / 2) if s else 0.0)


def airport(n: int = N) -> np.ndarray:
    """The runway a coalition needs is its largest plane's."""
    costs = np.sort(np.random.default_rng(2).random(n))
    return table_of(n, lambda s: max((costs[i] for i in s), default=0.0))


def additive_interaction(n: int = N) -> np.ndarray:
    rng = np.random.default_rng(3)
    own, pairs = rng.random(n) / n, rng.normal(0.0, 1.0, (n, n)) / n**2
    return table_of(n, lambda s: own[s].sum() + sum(pairs[i, j] for i, j in itertools.combinations(s, 2)))


def correlated_vote(n: int = N, examples: int = 40) -> np.ndarray:
    """Per example: members right with falling skill and a shared noise, wrong ones often agreeing."""
    rng = np.random.default_rng(4)
    noise = 0.6 * rng.normal(size=(examples, 1)) + 0.8 * rng.normal(size=(examples, n))
    right = np.linspace(1.5, -1.0, n) - rng.normal(size=(examples, 1)) + noise > 0
    classes = np.where(
        right, 0, np.where(rng.random((examples, n)) < 0.6, 1, rng.integers(2, 5, (examples, n)))
    )
    return np.stack([vote_values(c, np.arange(n), n, (c == 0) * 1.0, 0.0, 0.0) for c in classes], axis=1)


GAMES = {
    "glove": glove,
    "weighted voting": weighted_voting,
    "airport": airport,
    "additive + interaction": additive_interaction,
    "correlated vote": correlated_vote,
}


def stratified_run(
    table: np.ndarray, n: int, seed: int, budget: int | None, target: float | None, simultaneous: bool = False
):
    sampler = StratifiedSampler(
        n, seed=seed, target_error=target, max_coalitions=budget, simultaneous=simultaneous
    )
    while True:
        est = stratified_shapley(n, sampler.held, table[sampler.held])
        if sampler.stop(est) or not sampler.next_batch(est):
            return est.values, est.half_width(critical_value(n, simultaneous))


def stratified_run_by_calls(table: np.ndarray, n: int, seed: int, budget: int):
    """A budget in calls, a coalition costing one call per member and one more (a debate's rounds)."""

    def cost(mask: int) -> float:
        return float(mask.bit_count() + 1)

    sampler = StratifiedSampler(n, seed=seed)
    while True:
        est = stratified_shapley(n, sampler.held, table[sampler.held])
        spend = budget - sum(cost(m) for m in sampler.held)
        if sampler.stop(est) or not sampler.next_batch(est, spend=spend, cost_of=cost):
            return est.values, est.half_width()


def coverage(table: np.ndarray, runs) -> float:
    exact = exact_shapley_table(table).mean(axis=0)
    hits = [np.abs(values - exact) <= half + 1e-9 for values, half in runs]
    return float(np.mean(hits))


def all_at_once(table: np.ndarray, runs) -> float:
    """The share of runs whose intervals hold every member's exact value."""
    exact = exact_shapley_table(table).mean(axis=0)
    return float(np.mean([(np.abs(values - exact) <= half + 1e-9).all() for values, half in runs]))


@pytest.mark.parametrize("game", GAMES)
@pytest.mark.parametrize(
    "budget", ["smallest", "twice the smallest", "most coalitions", "target 0.05", "target 0.02", "600 calls"]
)
def test_stratified_sampling_interval_covers_at_least_90_percent(game, budget):
    table = GAMES[game]()
    if budget.endswith("calls"):
        runs = [stratified_run_by_calls(table, N, seed, int(budget.split()[0])) for seed in SEEDS]
    else:
        smallest = len(warmup_masks(N, 0))
        sizes = {"smallest": smallest, "twice the smallest": 2 * smallest, "most coalitions": 200}  # of 256
        size = sizes.get(budget)
        target = None if size is not None else float(budget.split()[-1])
        runs = [stratified_run(table, N, seed, size, target) for seed in SEEDS]
    assert coverage(table, runs) >= 0.9


@pytest.mark.parametrize("n", [5, 6, 7])
def test_stratified_sampling_interval_covers_on_small_pools(n):
    table = weighted_voting(n)
    runs = [stratified_run(table, n, seed, len(warmup_masks(n, seed)), None) for seed in SEEDS]
    assert coverage(table, runs) >= 0.9


@pytest.mark.parametrize("game", GAMES)
@pytest.mark.parametrize("permutations", [MIN_PERMUTATIONS, 2 * MIN_PERMUTATIONS, 8 * MIN_PERMUTATIONS])
def test_permutation_sampling_interval_covers_at_least_90_percent(game, permutations):
    table = GAMES[game]()
    players = [f"p{i}" for i in range(N)]
    values = {members_of(m, players): table[m] for m in range(1 << N)}
    runs = []
    for seed in SEEDS:
        est = estimate(plan_coalitions(players, "sampled", budget=permutations, seed=seed), values, n_boot=1)
        half = [0.0] * N if est.sampling_error is None else [est.sampling_error[p] for p in players]
        runs.append((np.array([est[p].value for p in players]), np.array(half)))
    assert coverage(table, runs) >= 0.9


@pytest.mark.parametrize("game", GAMES)
@pytest.mark.parametrize("budget", ["smallest", "most coalitions", "target 0.02"])
def test_simultaneous_stratified_intervals_hold_all_members_at_once_in_90_percent_of_runs(game, budget):
    table = GAMES[game]()
    size = {"smallest": len(warmup_masks(N, 0)), "most coalitions": 200}.get(budget)
    target = None if size is not None else float(budget.split()[-1])
    runs = [stratified_run(table, N, seed, size, target, simultaneous=True) for seed in SEEDS]
    assert all_at_once(table, runs) >= 0.9


@pytest.mark.parametrize("n_examples", [20, 100])
def test_the_example_interval_covers_the_population_value_at_least_90_percent(n_examples):
    population = exact_shapley_table(correlated_vote(6, examples=4000))  # per-example values (4000, 6)
    truth = population.mean(axis=0)
    players = [f"p{i}" for i in range(6)]
    hits = []
    for seed in range(100):
        drawn = population[np.random.default_rng([seed, 9]).integers(0, len(population), n_examples)]
        est = estimates_from(players, drawn, method="exact", estimator="exact", exact=True, seed=seed)
        hits += [est[p].ci_low <= truth[i] <= est[p].ci_high for i, p in enumerate(players)]
    assert np.mean(hits) >= 0.9
