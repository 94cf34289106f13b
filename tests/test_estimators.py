"""Contribution estimators checked against brute force on synthetic games, plus the Shapley axioms."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colab_graphs.audit.estimators import (
    bootstrap_mean_ci,
    estimate,
    plan_coalitions,
    rank_correlation,
    ranks,
)
from colab_graphs.audit.stratified import (
    StratifiedSampler,
    exact_shapley_table,
    members_of,
    next_masks,
    stratified_shapley,
    warmup_masks,
)

NAMES = ["ana", "bo", "cy", "dee", "eli", "fay"]


def all_coalitions(players):
    return [frozenset(c) for k in range(len(players) + 1) for c in itertools.combinations(players, k)]


@st.composite
def games(draw, min_players=1, max_players=5):
    """A random game: per-example values in [0, 1] for every coalition (the empty one sometimes given)."""
    n = draw(st.integers(min_players, max_players))
    n_examples = draw(st.integers(1, 4))
    players = NAMES[:n]
    unit = st.floats(0.0, 1.0, allow_nan=False)
    values = {
        c: np.array(draw(st.lists(unit, min_size=n_examples, max_size=n_examples)))
        for c in all_coalitions(players)
    }
    if not draw(st.booleans()):
        del values[frozenset()]
    return players, values


def value_of(values, coalition, n_examples):
    return values.get(coalition, np.zeros(n_examples))


def brute_force_shapley(players, values):
    """Average marginal contribution over all n! orders, per example: the definition, no weights."""
    n_examples = len(values[frozenset(players)])
    totals = {p: np.zeros(n_examples) for p in players}
    orders = list(itertools.permutations(players))
    for order in orders:
        for k, player in enumerate(order):
            before = frozenset(order[:k])
            totals[player] += value_of(values, before | {player}, n_examples) - value_of(
                values, before, n_examples
            )
    return {p: totals[p] / len(orders) for p in players}


# Brute force


@settings(max_examples=60, deadline=None)
@given(games())
def test_exact_shapley_equals_the_average_over_all_orders(game):
    players, values = game
    estimates = estimate(plan_coalitions(players, "exact"), values, n_boot=10)
    expected = brute_force_shapley(players, values)
    for p in players:
        np.testing.assert_allclose(estimates[p].per_example, expected[p], atol=1e-12)
        assert estimates[p].value == pytest.approx(expected[p].mean(), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(games())
def test_leave_one_out_is_grand_coalition_minus_coalition_without_the_member(game):
    players, values = game
    n_examples = len(values[frozenset(players)])
    estimates = estimate(plan_coalitions(players, "loo"), values, n_boot=10)
    grand = frozenset(players)
    for p in players:
        expected = values[grand] - value_of(values, grand - {p}, n_examples)
        np.testing.assert_allclose(estimates[p].per_example, expected, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(games(max_players=4))
def test_sampled_shapley_with_a_budget_of_all_orders_is_exact(game):
    players, values = game
    plan = plan_coalitions(players, "sampled", budget=math.factorial(len(players)))
    assert plan.exhaustive
    sampled = estimate(plan, values, n_boot=10)
    exact = estimate(plan_coalitions(players, "exact"), values, n_boot=10)
    for p in players:
        np.testing.assert_allclose(sampled[p].per_example, exact[p].per_example, atol=1e-12)


def majority_game(n_examples=40, seed=3):
    """Per example: a weighted-majority game with noise, so contributions differ and interact."""
    rng = np.random.default_rng(seed)
    players = NAMES[:6]
    weights = rng.random((n_examples, 6))
    noise = {c: 0.1 * rng.random(n_examples) for c in all_coalitions(players)}
    values = {}
    for c in all_coalitions(players):
        mask = np.array([p in c for p in players], dtype=float)
        strength = weights @ mask / weights.sum(axis=1)
        values[c] = np.clip(0.9 * (strength > 0.5) + noise[c] * bool(c), 0.0, 1.0)
    return players, values


def best_of_game(n_examples=40, seed=3):
    """Per example, the chance that at least one member solves it: diminishing returns, as in real teams."""
    rng = np.random.default_rng(seed)
    players = NAMES[:6]
    solve = rng.random((n_examples, 6)) * np.array([0.9, 0.7, 0.5, 0.4, 0.3, 0.1])
    values = {
        c: 1.0 - np.prod(1.0 - solve * np.array([p in c for p in players]), axis=1)
        for c in all_coalitions(players)
    }
    return players, values


def max_error(players, values, budget, seeds, antithetic=True):
    exact = estimate(plan_coalitions(players, "exact"), values, n_boot=10).values()
    errors = []
    for seed in seeds:
        plan = plan_coalitions(players, "sampled", budget=budget, seed=seed, antithetic=antithetic)
        sampled = estimate(plan, values, n_boot=10).values()
        errors.append(max(abs(sampled[p] - exact[p]) for p in players))
    return float(np.mean(errors))


def test_sampled_shapley_converges_to_exact_on_a_majority_game():
    players, values = best_of_game()
    plan = plan_coalitions(players, "sampled", budget=200, seed=11)
    assert not plan.exhaustive and len(plan.permutations) == 200
    assert max_error(players, values, budget=200, seeds=[11]) < 0.01


def test_sampled_error_shrinks_as_the_budget_grows():
    players, values = majority_game()
    assert (
        max_error(players, values, 200, seeds=range(5)) < max_error(players, values, 10, seeds=range(5)) / 2
    )


def test_antithetic_pairs_lower_the_error_on_a_diminishing_returns_game():
    players, values = best_of_game()
    plain = max_error(players, values, 100, seeds=range(8), antithetic=False)
    assert max_error(players, values, 100, seeds=range(8), antithetic=True) < plain / 2


def test_sampled_interval_covers_the_exact_value_on_a_majority_game():
    players, values = majority_game()
    exact = estimate(plan_coalitions(players, "exact"), values, n_boot=10).values()
    plan = plan_coalitions(players, "sampled", budget=10, seed=5)
    assert not plan.complete
    sampled = estimate(plan, values)
    assert all(abs(sampled[p].value - exact[p]) <= sampled.sampling_error[p] for p in players)


# Axioms


@settings(max_examples=60, deadline=None)
@given(games())
def test_exact_shapley_is_efficient_per_example(game):
    players, values = game
    n_examples = len(values[frozenset(players)])
    estimates = estimate(plan_coalitions(players, "exact"), values, n_boot=10)
    total = sum(estimates[p].per_example for p in players)
    expected = values[frozenset(players)] - value_of(values, frozenset(), n_examples)
    np.testing.assert_allclose(total, expected, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(games(min_players=2), st.integers(1, 30), st.integers(0, 1000))
def test_sampled_shapley_is_efficient_for_any_budget(game, budget, seed):
    players, values = game
    n_examples = len(values[frozenset(players)])
    estimates = estimate(plan_coalitions(players, "sampled", budget=budget, seed=seed), values, n_boot=10)
    total = sum(estimates[p].per_example for p in players)
    expected = values[frozenset(players)] - value_of(values, frozenset(), n_examples)
    np.testing.assert_allclose(total, expected, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(games(min_players=2))
def test_symmetric_members_get_equal_shapley_values(game):
    players, values = game
    first, second = players[0], players[1]

    def swap(c):
        # The mirror image of a coalition with the two members exchanged.
        return frozenset({first: second, second: first}.get(p, p) for p in c)

    def canonical(c):
        return min(c, swap(c), key=sorted)

    # Make the game symmetric in the two members: v(S) = v(swap(S)).
    symmetric = {c: values[canonical(c)] for c in values if canonical(c) in values}
    estimates = estimate(plan_coalitions(players, "exact"), symmetric, n_boot=10)
    np.testing.assert_allclose(estimates[first].per_example, estimates[second].per_example, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(games(min_players=2))
def test_a_dummy_member_gets_zero_from_every_estimator(game):
    players, values = game
    dummy = players[-1]
    n_examples = len(values[frozenset(players)])
    # v(S) ignores the dummy: adding it never changes the score.
    dummy_game = {c: value_of(values, c - {dummy}, n_examples) for c in all_coalitions(players)}
    for method in ("exact", "loo"):
        estimates = estimate(plan_coalitions(players, method), dummy_game, n_boot=10)
        np.testing.assert_allclose(estimates[dummy].per_example, 0.0, atol=1e-12)


def test_additive_game_gives_each_member_its_own_weight():
    players = NAMES[:4]
    weights = dict(zip(players, [0.1, 0.2, 0.3, 0.35], strict=True))
    values = {c: np.array([sum(weights[p] for p in c)]) for c in all_coalitions(players)}
    for method in ("exact", "loo"):
        assert estimate(plan_coalitions(players, method), values, n_boot=10).values() == pytest.approx(
            weights
        )


def test_empty_coalition_scores_zero_unless_given():
    players = ["a"]
    values = {frozenset({"a"}): np.array([0.75, 0.25])}
    assert estimate(plan_coalitions(players, "exact"), values, n_boot=10)["a"].value == pytest.approx(0.5)
    values[frozenset()] = np.array([0.25, 0.25])
    assert estimate(plan_coalitions(players, "exact"), values, n_boot=10)["a"].value == pytest.approx(0.25)


# Bootstrap intervals


@settings(max_examples=40, deadline=None)
@given(games(), st.sampled_from(["loo", "exact", "sampled"]), st.integers(0, 10_000))
def test_bootstrap_interval_contains_the_point_estimate(game, method, seed):
    players, values = game
    plan = plan_coalitions(players, method, budget=3, seed=seed)
    for p, est in estimate(plan, values, n_boot=200, seed=seed).per_player.items():
        assert est.ci_low - 1e-12 <= est.value <= est.ci_high + 1e-12, p


def test_bootstrap_intervals_are_reproducible_with_a_seed():
    players, values = majority_game()
    plan = plan_coalitions(players, "sampled", budget=20, seed=1)
    first = estimate(plan, values, seed=7).intervals()
    assert estimate(plan, values, seed=7).intervals() == first
    assert estimate(plan, values, seed=8).intervals() != first


def test_sampled_estimates_give_their_sampling_error_apart_from_the_example_interval():
    # One example: resampling examples gives a zero-width interval; the sampling error is what remains.
    players, values = majority_game(n_examples=1)
    estimates = estimate(plan_coalitions(players, "sampled", budget=10, seed=2), values)
    assert all(e.ci_high == e.ci_low for e in estimates.per_player.values())
    assert estimates.sampling_error is not None and max(estimates.sampling_error.values()) > 0
    assert not estimates.exact and estimates.estimator == "permutation"
    exact = estimate(plan_coalitions(players, "exact"), values)
    assert exact.sampling_error is None and exact.exact


def test_intervals_narrow_with_more_examples():
    players, small = majority_game(n_examples=20, seed=5)
    _, large = majority_game(n_examples=500, seed=5)
    plan = plan_coalitions(players, "loo")

    def widths(values):
        return [hi - lo for lo, hi in estimate(plan, values).intervals().values()]

    assert np.mean(widths(large)) < np.mean(widths(small))


def test_bootstrap_mean_ci_of_constant_scores_is_a_point():
    assert bootstrap_mean_ci(np.full(10, 0.4)) == pytest.approx((0.4, 0.4))


def test_bootstrap_mean_ci_brackets_the_mean_of_varied_scores():
    scores = np.array([0.0, 1.0] * 50)
    low, high = bootstrap_mean_ci(scores, n_boot=500, seed=3)
    assert 0.35 < low < 0.5 < high < 0.65


# Plans


def test_loo_plan_holds_the_grand_coalition_and_each_leave_one_out_coalition():
    plan = plan_coalitions(["a", "b", "c"], "loo")
    assert plan.coalitions == (
        frozenset({"a", "b"}),
        frozenset({"a", "c"}),
        frozenset({"b", "c"}),
        frozenset({"a", "b", "c"}),
    )


def test_exact_plan_lists_all_subsets_by_size_then_pool_order():
    plan = plan_coalitions(["b", "a", "c"], "exact")
    assert [sorted(c, key="bac".index) for c in plan.coalitions] == [
        [],
        ["b"],
        ["a"],
        ["c"],
        ["b", "a"],
        ["b", "c"],
        ["a", "c"],
        ["b", "a", "c"],
    ]


def test_exact_refuses_large_pools_unless_forced():
    players = [f"m{i}" for i in range(5)]
    with pytest.raises(ValueError, match="sampled"):
        plan_coalitions(players, "exact", max_exact_players=4)
    assert len(plan_coalitions(players, "exact", max_exact_players=4, force=True)) == 32


def test_sampled_plan_holds_every_prefix_of_its_permutations_and_the_loo_coalitions():
    players = NAMES[:6]
    plan = plan_coalitions(players, "sampled", budget=6, seed=4)
    coalitions = set(plan.coalitions)
    for order in plan.permutations:
        assert all(frozenset(order[:k]) in coalitions for k in range(len(players) + 1))
    grand = frozenset(players)
    assert all(grand - {p} in coalitions for p in players)


def test_antithetic_permutations_come_in_reversed_pairs():
    plan = plan_coalitions(NAMES[:5], "sampled", budget=7, seed=0)
    orders = plan.permutations
    assert len(orders) == 7
    assert all(orders[k + 1] == orders[k][::-1] for k in range(0, 6, 2))


def test_sampled_plans_depend_only_on_the_seed():
    a = plan_coalitions(NAMES, "sampled", budget=10, seed=1)
    assert plan_coalitions(NAMES, "sampled", budget=10, seed=1) == a
    assert plan_coalitions(NAMES, "sampled", budget=10, seed=2).permutations != a.permutations


@pytest.mark.parametrize(
    ("players", "method", "budget", "message"),
    [
        ([], "loo", None, "empty"),
        (["a", "a"], "loo", None, "duplicate"),
        (["a"], "bogus", None, "unknown method"),
        (["a", "b"], "sampled", None, "budget"),
        (["a", "b"], "sampled", 0, "budget"),
    ],
)
def test_plan_rejects_bad_input(players, method, budget, message):
    with pytest.raises(ValueError, match=message):
        plan_coalitions(players, method, budget=budget)


def test_estimate_names_coalitions_that_were_not_evaluated():
    plan = plan_coalitions(["a", "b"], "exact")
    with pytest.raises(ValueError, match=r"not evaluated: \['a'\]"):
        estimate(plan, {frozenset({"b"}): np.ones(2), frozenset({"a", "b"}): np.ones(2)})


def test_estimate_rejects_arrays_of_different_lengths():
    plan = plan_coalitions(["a"], "loo")
    with pytest.raises(ValueError, match="shape"):
        estimate(plan, {frozenset({"a"}): np.ones(2), frozenset(): np.ones(3)})


def test_estimate_rejects_non_finite_scores():
    plan = plan_coalitions(["a"], "loo")
    with pytest.raises(ValueError, match="drop failed examples"):
        estimate(plan, {frozenset({"a"}): np.array([1.0, np.nan])})


def test_every_plan_gives_leave_one_out_but_not_another_method():
    players, values = majority_game()
    sampled = plan_coalitions(players, "sampled", budget=4)
    loo_from_sampled = estimate(sampled, values, method="loo", n_boot=10).values()
    assert loo_from_sampled == estimate(plan_coalitions(players, "loo"), values, n_boot=10).values()
    with pytest.raises(ValueError, match="cannot give 'exact'"):
        estimate(sampled, values, method="exact")


# Ranks and rank correlation


def test_ranks_put_the_best_first_and_share_ranks_on_ties():
    assert ranks({"a": 0.2, "b": 0.9, "c": 0.5, "d": 0.5}) == {"a": 4, "b": 1, "c": 2, "d": 2}


def test_rank_correlation_matches_hand_computed_values_with_ties():
    # Average ranks: individual w=2, x=3.5, y=3.5, z=1; compositional w=4, x=1, y=2.5, z=2.5.
    # Spearman: sum(dx*dy) = -2.25 over sqrt(4.5 * 4.5) = -0.5.
    # Kendall: 1 concordant, 3 discordant, 5 pairs untied on each side: (1 - 3) / sqrt(5 * 5) = -0.4.
    individual = {"w": 1.0, "x": 2.0, "y": 2.0, "z": 0.0}
    compositional = {"w": 3.0, "x": 1.0, "y": 2.0, "z": 2.0}
    result = rank_correlation(individual, compositional)
    assert result["spearman"] == pytest.approx(-0.5)
    assert result["kendall"] == pytest.approx(-0.4)


def test_rank_correlation_is_one_for_the_same_order_and_minus_one_for_the_reverse():
    a = {"p": 0.1, "q": 0.5, "r": 0.7}
    assert rank_correlation(a, {"p": 1.0, "q": 2.0, "r": 30.0}) == pytest.approx(
        {"spearman": 1.0, "kendall": 1.0}
    )
    assert rank_correlation(a, {"p": 3.0, "q": 2.0, "r": 1.0}) == pytest.approx(
        {"spearman": -1.0, "kendall": -1.0}
    )


def test_rank_correlation_is_undefined_for_one_member_or_constant_scores():
    assert rank_correlation({"a": 1.0}, {"a": 2.0}) == {"spearman": None, "kendall": None}
    assert rank_correlation({"a": 1.0, "b": 1.0}, {"a": 0.0, "b": 2.0}) == {"spearman": None, "kendall": None}


def test_rank_correlation_requires_the_same_members():
    with pytest.raises(ValueError, match="different members"):
        rank_correlation({"a": 1.0, "b": 2.0}, {"a": 1.0, "c": 2.0})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=2, max_size=8))
def test_rank_correlation_agrees_with_scipy(pairs):
    stats = pytest.importorskip("scipy.stats")
    a = {f"m{i}": float(x) for i, (x, _) in enumerate(pairs)}
    b = {f"m{i}": float(y) for i, (_, y) in enumerate(pairs)}
    result = rank_correlation(a, b)
    xs, ys = list(a.values()), list(b.values())
    if len(set(xs)) < 2 or len(set(ys)) < 2:
        assert result == {"spearman": None, "kendall": None}
        return
    assert result["spearman"] == pytest.approx(stats.spearmanr(xs, ys).statistic, abs=1e-9)
    assert result["kendall"] == pytest.approx(stats.kendalltau(xs, ys).statistic, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=3, max_size=12),
)
def test_spearman_p_value_agrees_with_scipy(pairs):
    """The study's p-value (t approximation, hand-written incomplete beta) against scipy's on the same rho."""
    stats = pytest.importorskip("scipy.stats")
    from colab_graphs.study.stats import spearman_p_value

    xs, ys = [float(x) for x, _ in pairs], [float(y) for _, y in pairs]
    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return
    expected = stats.spearmanr(xs, ys)
    if abs(expected.statistic) >= 1.0:
        assert spearman_p_value(expected.statistic, len(xs)) == 0.0
        return
    assert spearman_p_value(expected.statistic, len(xs)) == pytest.approx(
        expected.pvalue, rel=1e-6, abs=1e-12
    )


# Stratified sampling with a control variate (colab_graphs.audit.stratified)


def as_table(players, values):
    """Per-example values (2^n, n_examples) indexed by bitmask (the empty coalition 0 unless given)."""
    n_examples = len(values[frozenset(players)])
    return np.stack([value_of(values, members_of(m, players), n_examples) for m in range(1 << len(players))])


@settings(max_examples=40, deadline=None)
@given(games())
def test_exact_shapley_from_a_full_table_equals_the_exact_estimate(game):
    players, values = game
    exact = estimate(plan_coalitions(players, "exact"), values, n_boot=10)
    table = exact_shapley_table(as_table(players, values))
    for i, p in enumerate(players):
        np.testing.assert_allclose(table[:, i], exact[p].per_example, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(games(min_players=2, max_players=4))
def test_the_stratified_estimate_is_exact_once_it_holds_every_coalition(game):
    players, values = game
    n = len(players)
    table = as_table(players, values)
    est = stratified_shapley(n, list(range(1 << n)), table)
    assert est.exact and not est.standard_error.any()
    np.testing.assert_allclose(est.per_example, exact_shapley_table(table), atol=1e-12)


@pytest.mark.parametrize("n", [5, 6, 9, 12])
def test_the_first_batch_holds_and_leaves_out_every_member_at_every_size(n):
    masks = warmup_masks(n, seed=3)
    assert len(set(masks)) == len(masks)
    for size in range(1, n):
        of_size = [m for m in masks if m.bit_count() == size]
        for i in range(n):
            assert any(m >> i & 1 for m in of_size) and any(not m >> i & 1 for m in of_size)
    # The leave-one-out coalitions are among them: leave-one-out comes with every sampled estimate.
    full = (1 << n) - 1
    assert {full, *(full ^ (1 << i) for i in range(n))} <= set(masks)


def stratified_error(players, values, budget, seed):
    n = len(players)
    table = as_table(players, values)
    sampler = StratifiedSampler(n, seed=seed, max_coalitions=budget)
    while True:
        est = stratified_shapley(n, sampler.held, table[sampler.held])
        if sampler.stop(est) or not sampler.next_batch(est):
            break
    exact = exact_shapley_table(table).mean(axis=0)
    return float(np.abs(est.values - exact).max())


def test_the_stratified_error_shrinks_as_it_holds_more_coalitions():
    players, values = majority_game()
    small = np.mean([stratified_error(players, values, 30, s) for s in range(5)])
    large = np.mean([stratified_error(players, values, 120, s) for s in range(5)])
    assert large < small / 2


def test_a_target_error_stops_the_sampler_once_every_interval_is_within_it():
    players, values = majority_game()
    table = as_table(players, values)
    sampler = StratifiedSampler(6, seed=1, target_error=0.03)
    while True:
        est = stratified_shapley(6, sampler.held, table[sampler.held])
        if (reason := sampler.stop(est)) or not sampler.next_batch(est):
            break
    assert reason in ("target_error", "complete")
    assert est.half_width().max() <= 0.03


def test_a_batch_never_spends_more_than_it_may():
    players, values = majority_game()
    table = as_table(players, values)
    held = warmup_masks(6, seed=0)
    est = stratified_shapley(6, held, table[held])
    new = next_masks(
        6, held, est, spend=25.0, cost_of=lambda m: float(m.bit_count()), max_new=100, seed=0, batch=1
    )
    assert new and sum(m.bit_count() for m in new) <= 25
    assert not set(new) & set(held)


def test_the_stratified_estimate_names_a_stratum_without_a_coalition():
    players, values = majority_game()
    table = as_table(players, values)
    with pytest.raises(ValueError, match="no held coalition of size 2"):
        stratified_shapley(6, [0, 1, 2, 4, 8, 16, 32, 63], table[[0, 1, 2, 4, 8, 16, 32, 63]])


@settings(max_examples=30, deadline=None)
@given(games(min_players=3, max_players=3), st.integers(0, 1000))
def test_permutation_prefixes_that_cover_every_coalition_give_the_exact_values(game, seed):
    players, values = game
    plan = plan_coalitions(players, "sampled", budget=4, seed=seed)
    sampled = estimate(plan, values, n_boot=10)
    assert sampled.exact == plan.complete
    if plan.complete:
        exact = estimate(plan_coalitions(players, "exact"), values, n_boot=10)
        for p in players:
            np.testing.assert_allclose(sampled[p].per_example, exact[p].per_example, atol=1e-12)


# The adjustments the estimator chooses from the held coalitions


def run_sampler(table: np.ndarray, n: int, budget: int, seed: int):
    sampler = StratifiedSampler(n, seed=seed, max_coalitions=budget)
    while True:
        est = stratified_shapley(n, sampler.held, table[sampler.held])
        if sampler.stop(est) or not sampler.next_batch(est):
            return est


def pairwise_game(n: int = 8) -> np.ndarray:
    """One example: each member's own worth plus a synergy or a clash with each other member."""
    rng = np.random.default_rng(5)
    own, pair = rng.random(n) / n, np.triu(rng.normal(0.0, 1.0, (n, n)), 1) / n
    bits = ((np.arange(1 << n)[:, None] >> np.arange(n)) & 1).astype(float)
    return (bits @ own + np.einsum("mi,ij,mj->m", bits, pair, bits))[:, None]


def pipeline_game(n: int = 9, examples: int = 30) -> np.ndarray:
    """A question is solved when S holds a member of each of three roles able on it: nobody scores alone."""
    rng = np.random.default_rng(6)
    role = np.arange(n) % 3
    able = rng.random((examples, n)) < 0.5
    bits = ((np.arange(1 << n)[:, None] >> np.arange(n)) & 1).astype(np.int64)
    solved = np.ones((1 << n, examples), dtype=bool)
    for r in range(3):
        solved &= bits[:, role == r] @ able[:, role == r].T > 0
    return solved.astype(float)


@pytest.mark.parametrize("seed", range(3))
def test_a_pairwise_game_is_fitted_by_the_surrogate_once_the_samples_outnumber_its_terms(seed):
    table = pairwise_game()
    exact = exact_shapley_table(table).mean(axis=0)
    first = warmup_masks(8, seed)  # 27-30 sampled coalitions for 36 terms: the surrogate is not considered
    assert stratified_shapley(8, first, table[first]).model == "plain"
    sampler = StratifiedSampler(8, seed=seed, max_coalitions=80)
    while not sampler.stop(est := stratified_shapley(8, sampler.held, table[sampler.held])):
        sampler.next_batch(est)
    held = sampler.held
    chosen = stratified_shapley(8, held, table[held])
    bare = stratified_shapley(8, held, table[held], control_variate=False, surrogate=False)
    assert chosen.model == "surrogate" and not chosen.exact
    assert np.abs(chosen.values - exact).max() < np.abs(bare.values - exact).max() / 10


def test_the_control_variate_is_dropped_where_nobody_scores_alone():
    table = pipeline_game()
    assert not table[[1 << i for i in range(9)]].any()  # "right alone" says nothing here
    est = run_sampler(table, 9, 150, seed=0)
    assert "control variate" not in est.model


def test_forced_adjustments_are_the_ones_used():
    table = pipeline_game()
    held = warmup_masks(9, 0)
    assert stratified_shapley(9, held, table[held], control_variate=True, surrogate=False).model == (
        "control variate"
    )
    assert stratified_shapley(9, held, table[held], control_variate=False, surrogate=False).model == "plain"


@pytest.mark.parametrize("game", [pairwise_game, pipeline_game])
def test_the_chosen_estimate_s_simultaneous_intervals_hold_all_members_in_90_percent_of_runs(game):
    from colab_graphs.audit.stratified import critical_value

    table = game()
    n = table.shape[0].bit_length() - 1
    exact = exact_shapley_table(table).mean(axis=0)
    held = []
    for seed in range(30):
        est = run_sampler(table, n, 2 * len(warmup_masks(n, 0)), seed)
        held.append(
            bool((np.abs(est.values - exact) <= est.half_width(critical_value(n, True)) + 1e-9).all())
        )
    assert np.mean(held) >= 0.9


def judge_game(n: int = 9, examples: int = 30) -> np.ndarray:
    """The most confident member of S answers: adding a confident wrong member lowers the score (not
    monotone), so the completion's bounds would be wrong."""
    rng = np.random.default_rng(7)
    right = rng.random((examples, n)) < np.linspace(0.8, 0.3, n)
    confidence = right + rng.normal(0.0, 0.8, (examples, n))
    masks = np.arange(1 << n)
    out = np.zeros((1 << n, examples))
    for e in range(examples):
        answered = np.zeros(1 << n, dtype=bool)
        for i in np.argsort(-confidence[e]):
            takes = ~answered & ((masks >> i) & 1).astype(bool)
            out[takes, e] = right[e, i]
            answered |= takes
    return out


def test_a_game_monotone_per_example_is_completed_and_the_completion_beats_the_other_fits():
    table = pipeline_game()
    exact = exact_shapley_table(table).mean(axis=0)
    chosen, others = [], []
    for seed in range(5):
        held = StratifiedSampler(9, seed=seed).held
        sampler = StratifiedSampler(9, seed=seed, max_coalitions=150)
        while not sampler.stop(est := stratified_shapley(9, sampler.held, table[sampler.held])):
            sampler.next_batch(est)
        held = sampler.held
        assert est.model == "monotone completion"
        chosen.append(np.abs(est.values - exact).max())
        other = stratified_shapley(9, held, table[held], completion=False)
        others.append(np.abs(other.values - exact).max())
    assert np.mean(chosen) < np.mean(others) / 2


def test_a_game_that_is_not_monotone_is_not_completed():
    table = judge_game()
    exact = exact_shapley_table(table).mean(axis=0)
    assert (table[3] < table[1]).any()  # a second member lowers the score on some question
    for seed in range(3):
        est = run_sampler(table, 9, 150, seed)
        assert est.model != "monotone completion" and np.abs(est.values - exact).max() < 0.05


def test_the_completion_is_not_tried_on_few_examples_unless_forced():
    table = pipeline_game(examples=30)[:, :5]  # five questions: the residuals are too few values to trust
    held = run_sampler(table, 9, 150, seed=0)
    assert held.model != "monotone completion"
    masks = StratifiedSampler(9, seed=0).held
    assert stratified_shapley(9, masks, table[masks], completion=True).model == "monotone completion"


def test_a_completed_estimate_held_to_all_but_one_coalition_misses_by_that_coalition_s_weight_at_most():
    table = pipeline_game(n=6, examples=30)
    exact = exact_shapley_table(table).mean(axis=0)
    missing = 0b000111
    almost = [m for m in range(1 << 6) if m != missing]
    est = stratified_shapley(6, almost, table[almost], completion=True)
    assert est.model == "monotone completion" and not est.exact
    # The one coalition not held moves each member's value by its Shapley weight (1 / (n C(n-1, s))) times
    # what the prediction misses on it (at most 1 here): every other coalition's value is used as it is.
    weight = 1.0 / (6 * math.comb(5, 2))
    assert np.abs(est.values - exact).max() <= weight + 1e-12


@pytest.mark.parametrize("target", [0.03, 0.015])
def test_completed_simultaneous_intervals_hold_all_members_when_a_target_error_stops_the_sampler(target):
    from colab_graphs.audit.stratified import critical_value

    table = pipeline_game()
    exact = exact_shapley_table(table).mean(axis=0)
    held, models = [], set()
    for seed in range(30):
        sampler = StratifiedSampler(9, seed=seed, target_error=target, simultaneous=True)
        while not sampler.stop(est := stratified_shapley(9, sampler.held, table[sampler.held])):
            if not sampler.next_batch(est):
                break
        models.add(est.model)
        held.append(
            bool((np.abs(est.values - exact) <= est.half_width(critical_value(9, True)) + 1e-9).all())
        )
    assert "monotone completion" in models and np.mean(held) >= 0.9


def test_the_completion_is_not_tried_where_its_table_would_be_too_large(monkeypatch):
    from colab_graphs.audit import stratified

    table = pipeline_game()
    assert run_sampler(table, 9, 150, seed=0).model == "monotone completion"
    monkeypatch.setattr(stratified, "MAX_COMPLETION_CELLS", table.size - 1)  # 2^9 x 30 cells: one too many
    assert run_sampler(table, 9, 150, seed=0).model != "monotone completion"
