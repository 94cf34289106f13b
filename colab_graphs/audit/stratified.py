"""Stratified Shapley sampling with a per-example control variate: every evaluated coalition is used.

The Shapley value of member i is a difference of strata means (Kolpaczki et al. 2024, "Approximating the
Shapley value without marginal contributions", stratified SVARM):

    phi_i = 1/n sum_{t=1..n} mu+_{i,t}  -  1/n sum_{t=0..n-1} mu-_{i,t}

where mu+_{i,t} is the mean of v(S) over the coalitions of size t that hold i and mu-_{i,t} over those of size t
that do not. An evaluated coalition of size t falls in a stratum of *every* member (the + one of its members,
the - one of the others), so no evaluation is spent on one member only, unlike a marginal contribution. The
strata of sizes 0, 1, n-1 and n are enumerated (2n + 2 coalitions, the leave-one-out ones among them); the
middle sizes are sampled without replacement, allocated where the variance per unit of cost is largest
(Neyman allocation, with the cost of a coalition in calls when it is known).

What shapiq's estimators do not use on the mean game v(S), and this one does (`bench/estimators.py` also gives
them the same control variate; BENCHMARKS.md compares both):

- **The per-example structure.** v(S) is a mean over examples of per-example games v_e(S). Per example, a
  member is *right* when it scores at least 0.5 alone (its singleton, which the estimate holds anyway). The
  surrogate g_e(S) = F(members of S right on e, members of S wrong on e), with F fitted over every held
  (coalition, example) pair, is most of a vote-like game, and its Shapley value is exact in closed form (a
  game of two player types). Only the residual v - g is sampled: a control variate (`ControlVariate`),
  unbiased whatever F is (F is refitted from the held values; its dependence on them is a second-order
  effect). It is most of a vote's variance and little of a game where being right alone says little (a
  cover game: BENCHMARKS.md).
- **A surrogate fitted to the coalitions already played** (`Surrogate`, the regression adjustment of
  RegressionMSR and LeverageSHAP): a pairwise game h(S) = sum a_i + sum b_ij fitted by ridge regression to
  what the control variate leaves (or to v), whose Shapley values are exact in closed form; only v - g - h is
  sampled, and its spread is read from the leave-one-out residuals (in closed form), not the in-sample ones.
- **A completion of each question's table for games monotone per example** (`MonotoneCompletion`): where
  adding a member never lowers a question's score (a cover, a pipeline: an AND of ORs, which a pairwise
  surrogate of the mean game describes badly), the held coalitions bound the others on each question (at
  least any held subset's value, at most any held superset's); a per-example ridge prediction clipped to those
  bounds fills the coalitions not held, the completed table's Shapley values are exact, and only what the
  prediction misses on the coalitions not held is sampled (from leave-one-out residuals).
- **A choice per game from what the played coalitions show**: neither, the control variate, the surrogate,
  both, or the completion, whichever leaves the smallest leave-one-out residuals (`stratified_shapley`),
  refitted at each batch. The control variate is dropped where "right alone" says little (a cover or pipeline
  game), the surrogate where a pairwise fit does not predict unseen coalitions, and the completion where the
  game is not monotone (a vote, a judge, a router: its bounds then mispredict).
- **The coalitions already played.** Every held coalition enters every member's strata, and the allocation
  of the next batch reads the variances of the held ones.
- **The example-level variance.** The sampling error (over the choice of coalitions, for these examples) is
  reported apart from the example noise (a bootstrap over examples): only the first can drive a stop.

The sampling standard error pools the (leave-one-out) residual variance of each size over its coalitions (more stable than
per-stratum variances from a handful of samples, and conservative: it includes the spread between the + and
- strata) and applies the finite-population correction, so a fully enumerated stratum adds none. A sampling
interval is the standard error times a normal quantile, per member or for all members at once
(`critical_value`). Once the held coalitions cover all 2^n, the value is exact and computed from the table
(`exact_shapley_table`).

Coalitions are bitmasks over the players in pool order (bit i: the i-th member).

Example:
    >>> import numpy as np
    >>> table = np.array([[0.0], [1.0], [0.0], [1.0]])  # v({}) = 0, v({a}) = 1, v({b}) = 0, v({a, b}) = 1
    >>> exact_shapley_table(table).round(6).tolist()
    [[1.0, 0.0]]
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from colab_graphs.audit.estimators import member_level

Z_95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval
MIN_CELL = 30  # (coalition, example) pairs a surrogate cell needs before its mean is used


def critical_value(n: int, simultaneous: bool, confidence: float = 0.95) -> float:
    """The normal quantile a sampling interval's half-width is the standard error times.

    Per member (`simultaneous=False`), each member's interval holds its value with probability `confidence`;
    simultaneous, all n intervals hold at once with at least that probability (Bonferroni: each at
    1 - (1 - confidence) / n). Bonferroni needs no model of how the members' estimates are correlated; for
    independent ones the exact max-|z| quantile is barely smaller (n = 12, 95%: 2.858 vs 2.865). Measured
    coverage: BENCHMARKS.md.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    return NormalDist().inv_cdf(0.5 + member_level(confidence, n, simultaneous) / 2.0)


@lru_cache(maxsize=8)
def popcounts(n: int) -> np.ndarray:
    """Size of every coalition bitmask 0 .. 2^n - 1."""
    masks = np.arange(1 << n)
    sizes = np.zeros(1 << n, dtype=np.int64)
    for i in range(n):
        sizes += (masks >> i) & 1
    return sizes


def mask_of(coalition: Iterable[str], players: Sequence[str]) -> int:
    index = {p: i for i, p in enumerate(players)}
    return sum(1 << index[p] for p in coalition)


def members_of(mask: int, players: Sequence[str]) -> frozenset[str]:
    return frozenset(p for i, p in enumerate(players) if mask >> i & 1)


def _bits(masks: np.ndarray, n: int) -> np.ndarray:
    return ((masks[:, None] >> np.arange(n)) & 1).astype(bool)


def exact_shapley_table(table: np.ndarray) -> np.ndarray:
    """Exact Shapley values per example from the values of all 2^n coalitions.

    Args:
        table: shape (2^n, n_examples); row `mask` is v(coalition with those bits).

    Returns:
        shape (n_examples, n): member i's Shapley value on each example.
    """
    rows, n_examples = table.shape
    n = rows.bit_length() - 1
    if rows != 1 << n:
        raise ValueError(f"exact_shapley_table: expected 2^n rows, got {rows}")
    sizes = popcounts(n)
    weight = np.array([1.0 / (n * math.comb(n - 1, s)) for s in range(n)])
    masks = np.arange(rows)
    out = np.empty((n_examples, n))
    for i in range(n):
        without = masks[((masks >> i) & 1) == 0]
        out[:, i] = weight[sizes[without]] @ (table[without | (1 << i)] - table[without])
    return out


def border_masks(n: int) -> list[int]:
    """The enumerated strata: the empty and grand coalitions, the singletons and the leave-one-out ones."""
    full = (1 << n) - 1
    masks = [0, full, *(1 << i for i in range(n)), *(full ^ (1 << i) for i in range(n))]
    return list(dict.fromkeys(masks))


def warmup_masks(n: int, seed: int) -> list[int]:
    """The first batch: the border strata, then for each middle size coalitions that hold every member at
    least once and leave every member out at least once (chunks of a random order), and at least two
    coalitions of each size, so every stratum has a mean and every size a variance. Up to 4 players, every
    coalition (16 at most: a middle size of 6 coalitions sampled 4 times says little about its spread)."""
    if n <= 4:
        return list(range(1 << n))
    rng = np.random.default_rng([seed, 0])
    masks = border_masks(n)
    held = set(masks)
    full = (1 << n) - 1
    for s in range(2, n - 1):
        of_size: list[int] = []
        for width, complement in ((s, False), (n - s, True)):
            order = rng.permutation(n)
            for start in range(0, n, width):
                chunk = sum(1 << int(order[(start + j) % n]) for j in range(width))
                of_size.append(full ^ chunk if complement else chunk)
        while len(set(of_size)) < min(2, math.comb(n, s)):
            of_size.append(sum(1 << int(i) for i in rng.choice(n, s, replace=False)))
        for mask in of_size:
            if mask not in held:
                held.add(mask)
                masks.append(mask)
    return masks


@dataclass(frozen=True)
class StratifiedEstimate:
    """A stratified Shapley estimate.

    Attributes:
        per_example: shape (n_examples, n): each member's estimated Shapley value on each example.
        standard_error: shape (n,): the sampling standard error of each member's mean value (0 when exact).
        size_variance: residual variance of the held coalitions of each size (0 .. n), for allocation.
        exact: True when the held coalitions are all 2^n (the values are then exact).
        n_coalitions: coalitions the estimate used.
        model: what was subtracted before sampling: "control variate", "surrogate", both ("control variate +
            surrogate"), "plain" (neither), "monotone completion" (`MonotoneCompletion`), or "exact".
    """

    per_example: np.ndarray
    standard_error: np.ndarray
    size_variance: np.ndarray
    exact: bool
    n_coalitions: int
    model: str = "plain"

    @property
    def values(self) -> np.ndarray:
        return self.per_example.mean(axis=0)

    def half_width(self, z: float = Z_95) -> np.ndarray:
        """Half-width of each member's sampling interval: the standard error times `z` (95% per member by
        default; `critical_value` gives the simultaneous one)."""
        return z * self.standard_error


def _types(n: int, masks: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per example and member: right (1) when the member scores at least 0.5 alone."""
    rows = {int(m): r for r, m in enumerate(masks)}
    right = np.zeros((values.shape[1], n), dtype=np.int64)
    for i in range(n):
        if (1 << i) in rows:
            right[:, i] = values[rows[1 << i]] >= 0.5
    return right


def _surrogate_table(
    n: int, right_count: np.ndarray, wrong_count: np.ndarray, values: np.ndarray
) -> np.ndarray:
    """F[k, w]: the mean value of held (coalition, example) pairs with k right and w wrong members.

    A cell with fewer than `MIN_CELL` pairs takes the mean over the cells of its lead k - w, and with fewer
    than that there, 0 (no control). A mean over a few pairs would fit them, shrinking the residuals the
    sampling error is estimated from (a game of one example, whose coalitions are its only pairs, would
    report intervals that do not cover).
    """
    sums = np.zeros((n + 1, n + 1))
    counts = np.zeros((n + 1, n + 1))
    np.add.at(sums, (right_count.ravel(), wrong_count.ravel()), values.ravel())
    np.add.at(counts, (right_count.ravel(), wrong_count.ravel()), 1.0)
    k, w = np.indices((n + 1, n + 1))
    lead = k - w
    lead_sums = np.zeros(2 * n + 1)
    lead_counts = np.zeros(2 * n + 1)
    np.add.at(lead_sums, lead.ravel() + n, sums.ravel())
    np.add.at(lead_counts, lead.ravel() + n, counts.ravel())
    by_lead = np.where(lead_counts >= MIN_CELL, lead_sums / np.maximum(lead_counts, 1.0), 0.0)
    return np.where(counts >= MIN_CELL, sums / np.maximum(counts, 1.0), by_lead[lead + n])


@lru_cache(maxsize=8)
def _type_weights(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Shapley weights of the two-type game: for c right members, the weight of each (k, w) of the others.

    right[c, k, w]: for a right member, C(c-1, k) C(n-c, w) / (n C(n-1, k+w)); wrong[c, k, w] likewise for a
    wrong member (C(c, k) C(n-c-1, w)). Zero where the counts are impossible.
    """
    right = np.zeros((n + 1, n + 1, n + 1))
    wrong = np.zeros((n + 1, n + 1, n + 1))
    for c in range(n + 1):
        for k in range(n + 1):
            for w in range(n + 1):
                if k + w > n - 1:
                    continue
                base = n * math.comb(n - 1, k + w)
                if c >= 1 and k <= c - 1 and w <= n - c:
                    right[c, k, w] = math.comb(c - 1, k) * math.comb(n - c, w) / base
                if c <= n - 1 and k <= c and w <= n - c - 1:
                    wrong[c, k, w] = math.comb(c, k) * math.comb(n - c - 1, w) / base
    return right, wrong


def _surrogate_shapley(n: int, table: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Exact Shapley values (n_examples, n) of the per-example surrogates F(right in S, wrong in S)."""
    w_right, w_wrong = _type_weights(n)
    padded = np.zeros((n + 2, n + 2))
    padded[: n + 1, : n + 1] = table
    gain_right = padded[1 : n + 2, : n + 1] - padded[: n + 1, : n + 1]  # F[k+1, w] - F[k, w]
    gain_wrong = padded[: n + 1, 1 : n + 2] - padded[: n + 1, : n + 1]  # F[k, w+1] - F[k, w]
    by_count_right = np.einsum("ckw,kw->c", w_right, gain_right)
    by_count_wrong = np.einsum("ckw,kw->c", w_wrong, gain_wrong)
    c = right.sum(axis=1)
    return np.where(right == 1, by_count_right[c][:, None], by_count_wrong[c][:, None])


@dataclass(frozen=True)
class ControlVariate:
    """The per-example surrogate g_e(S) = F(members of S right on e, members of S wrong on e) (module docstring).

    Attributes:
        table: F, shape (n + 1, n + 1): F[k, w] for k right and w wrong members.
        right: shape (n_examples, n): 1 where the member scores at least 0.5 alone on the example.
    """

    table: np.ndarray
    right: np.ndarray

    @classmethod
    def fit(cls, n: int, masks: Sequence[int], values: np.ndarray) -> ControlVariate:
        """F fitted over the held (coalition, example) pairs: `masks` (bitmasks) and their per-example values
        (len(masks), n_examples). A member whose singleton is not among them counts as wrong everywhere."""
        masks_arr = np.asarray(masks, dtype=np.int64)
        right = _types(n, masks_arr, values)
        right_count, wrong_count = _counts(masks_arr, right)
        return cls(_surrogate_table(n, right_count, wrong_count, values), right)

    def values(self, masks: Sequence[int]) -> np.ndarray:
        """g_e(S) of each coalition (bitmasks) on each example: (len(masks), n_examples)."""
        right_count, wrong_count = _counts(np.asarray(masks, dtype=np.int64), self.right)
        return self.table[right_count, wrong_count]

    def shapley(self) -> np.ndarray:
        """g's exact Shapley values per example: (n_examples, n)."""
        return _surrogate_shapley(self.right.shape[1], self.table, self.right)


def _counts(masks: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Right and wrong members of each coalition on each example: two (coalitions, examples) arrays."""
    bits = _bits(masks, right.shape[1]).astype(np.int64)
    right_count = bits @ right.T
    return right_count, bits.sum(axis=1)[:, None] - right_count


@dataclass(frozen=True)
class Surrogate:
    """A pairwise surrogate of the mean residual game: h(S) = sum_{i in S} a_i + sum_{i<j in S} b_ij.

    Fitted by ridge regression to the held coalitions' mean residuals within each size (a size's mean is the
    strata's own business), it is the regression adjustment of RegressionMSR and LeverageSHAP in the one form
    whose Shapley value is exact in closed form for any n: phi_i(h) = a_i + 1/2 sum_j b_ij.

    Attributes:
        linear: a, shape (n,).
        pairs: b, shape (n, n), upper triangular.
    """

    linear: np.ndarray
    pairs: np.ndarray

    def values(self, masks: Sequence[int]) -> np.ndarray:
        """h(S) of each coalition (bitmasks): (len(masks),)."""
        bits = _bits(np.asarray(masks, dtype=np.int64), len(self.linear)).astype(float)
        return bits @ self.linear + np.einsum("mi,ij,mj->m", bits, self.pairs, bits)

    def shapley(self) -> np.ndarray:
        """h's exact Shapley values: (n,)."""
        return self.linear + (self.pairs.sum(axis=0) + self.pairs.sum(axis=1)) / 2.0


RIDGE_PENALTIES = (0.03, 0.3, 3.0, 30.0)  # tried in turn; the one with the least leave-one-out error is kept
MAX_PAIRWISE_PLAYERS = (
    24  # above, the surrogate is linear (n (n - 1) / 2 pair features would outgrow the samples)
)


def _within_sizes(matrix: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """`matrix` (rows: coalitions) minus the mean of its rows of the same size."""
    out = np.array(matrix, dtype=float)
    for t in np.unique(sizes):
        rows = sizes == t
        out[rows] -= out[rows].mean(axis=0)
    return out


@dataclass(frozen=True)
class _RidgeFit:
    score: float
    coef: np.ndarray  # (features, columns)
    loo: np.ndarray  # (coalitions, columns): leave-one-out residuals of size means and surrogate together
    optimism: np.ndarray  # (coalitions, columns): what the leave-one-out residual adds to the in-sample one


def _ridge(features: np.ndarray, sizes: np.ndarray, target: np.ndarray) -> _RidgeFit:
    """Ridge regression of `target` (held coalitions x columns) on `features` within sizes, its penalty chosen
    by the leave-one-out error of the columns' mean (`RIDGE_PENALTIES`).

    The features are centred within each size, so the unpenalized size means and the penalized surrogate are
    orthogonal and their leverages add; the leave-one-out residuals are in closed form (the residual over one
    minus the leverage)."""
    centred, y = _within_sizes(features, sizes), _within_sizes(target, sizes)
    counts = np.bincount(sizes, minlength=int(sizes.max()) + 1)[sizes]
    u, singular, vt = np.linalg.svd(centred, full_matrices=False)
    uy = u.T @ y
    best: _RidgeFit | None = None
    for penalty in RIDGE_PENALTIES:
        shrink = singular**2 / (singular**2 + penalty)
        leverage = (u**2) @ shrink
        error = y - u @ (shrink[:, None] * uy)
        loo = error / np.maximum(1.0 - leverage - 1.0 / counts, 1e-6)[:, None]
        score = float(np.sum(loo.mean(axis=1) ** 2))
        if best is None or score < best.score:
            coef = vt.T @ ((singular / (singular**2 + penalty))[:, None] * uy)
            optimism = error / np.maximum(1.0 - leverage, 1e-6)[:, None] - error
            best = _RidgeFit(score, coef, loo, optimism)
    assert best is not None
    return best


def _pair_features(n: int, bits: np.ndarray) -> np.ndarray:
    """Each coalition's members and (up to `MAX_PAIRWISE_PLAYERS`) pairs of members, as 0 / 1 columns."""
    x = bits.astype(float)
    upper = _upper(n)
    return np.hstack([x, x[:, upper[0]] * x[:, upper[1]]])


def _upper(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(n, 1) if n <= MAX_PAIRWISE_PLAYERS else (np.array([], int), np.array([], int))


def fit_surrogate(n: int, bits: np.ndarray, target: np.ndarray) -> tuple[Surrogate, np.ndarray, np.ndarray]:
    """The ridge-fitted `Surrogate` of `target` (one value per held coalition, `bits` their members), the
    leave-one-out residuals of the whole fit (size means and surrogate: what each coalition's value is off by
    when the fit has not seen it), and what the surrogate's leave-one-out residual adds to its in-sample one
    (the fit's optimism, coalition by coalition)."""
    fit = _ridge(_pair_features(n, bits), bits.sum(axis=1), target[:, None])
    pairs = np.zeros((n, n))
    pairs[_upper(n)] = fit.coef[n:, 0]
    return Surrogate(fit.coef[:n, 0], pairs), fit.loo[:, 0], fit.optimism[:, 0]


# 2^n x examples of a completed table; above, the completion is not tried. The fit holds about six such arrays:
# 14 members over 500 examples (2^23 cells) took 2.5 CPU s per estimate and peaked at 410 MB.
MAX_COMPLETION_CELLS = 1 << 22
# Fewer examples and a completion is not tried: on one 0 / 1 example most leave-one-out residuals are exactly 0
# (the bounds decide), and a normal interval from the few others undercovers once a target error picks when
# to stop (a weighted-voting game of 8 members at target 0.02: 87.8% of member intervals held; 95% without).
MIN_COMPLETION_EXAMPLES = 20


@dataclass(frozen=True)
class MonotoneCompletion:
    """Every coalition's per-example value predicted from the held ones, for games monotone per example.

    Where adding a member never lowers a question's score (a cover, a pipeline: an AND of ORs, which no
    pairwise surrogate of the mean game describes), the held coalitions bound every other one on each
    question: S scores at least what any held subset of S scores and at most what any held superset does.
    A coalition not held gets the per-example pairwise ridge prediction (size means and pairs, fitted to each
    question's values at once) clipped to those bounds and to the values seen on the question; a held one
    keeps its value. The completed table's Shapley values are exact (2^n coalitions, so n is small); what the
    prediction misses on the coalitions not held is estimated from the leave-one-out residuals of the held
    ones (each predicted without its own value: bounds from its strict subsets and supersets, the ridge's
    closed-form leave-one-out), scaled by the share of each stratum not held. A game that is not monotone
    leaves large leave-one-out residuals, and the choice in `stratified_shapley` drops the completion.

    Attributes:
        table: (2^n, n_examples): the held values, the predictions elsewhere.
        held_prediction: (held coalitions, n_examples): each held coalition's leave-one-out prediction.
    """

    table: np.ndarray
    held_prediction: np.ndarray

    @classmethod
    def fit(cls, n: int, masks: np.ndarray, values: np.ndarray) -> MonotoneCompletion:
        """The completion from the held coalitions (bitmasks, distinct) and their per-example values."""
        bits = _bits(masks, n)
        sizes = bits.sum(axis=1)
        features = _pair_features(n, bits)
        fit = _ridge(features, sizes, values)
        everything = np.arange(1 << n)
        all_sizes = popcounts(n)
        table = np.zeros((1 << n, values.shape[1]))
        for t in np.unique(sizes):  # every size is held (the strata need it)
            rows, of_size = all_sizes == t, sizes == t
            centred = _pair_features(n, _bits(everything[rows], n)) - features[of_size].mean(axis=0)
            table[rows] = centred @ fit.coef + values[of_size].mean(axis=0)
        low, high = values.min(axis=0), values.max(axis=0)
        table = np.clip(table, low, high)
        held_prediction = np.clip(values - fit.loo, low, high)
        below = np.full_like(table, -np.inf)
        above = np.full_like(table, np.inf)
        for mask, value in zip(masks.tolist(), values, strict=True):
            supersets = (everything & mask) == mask
            below[supersets] = np.maximum(below[supersets], value)
            subsets = (everything | mask) == mask
            above[subsets] = np.minimum(above[subsets], value)
        table = np.clip(table, below, above)
        table[masks] = values
        inside = (masks[None, :] & masks[:, None]) == masks[None, :]  # [k, j]: coalition j within k
        np.fill_diagonal(inside, False)
        for k in range(len(masks)):
            if inside[k].any():
                held_prediction[k] = np.maximum(held_prediction[k], values[inside[k]].max(axis=0))
            if inside[:, k].any():
                held_prediction[k] = np.minimum(held_prediction[k], values[inside[:, k]].min(axis=0))
        return cls(table, held_prediction)


def _surrogate_terms(n: int) -> int:
    return n + (n * (n - 1) // 2 if n <= MAX_PAIRWISE_PLAYERS else 0)


def _no_control(n: int, n_examples: int) -> ControlVariate:
    return ControlVariate(np.zeros((n + 1, n + 1)), np.zeros((n_examples, n), dtype=np.int64))


def _size_loo(means: np.ndarray, sizes: np.ndarray, n: int) -> np.ndarray:
    """Leave-one-out residuals of the size means alone (no surrogate)."""
    counts = np.bincount(sizes, minlength=n + 1)[sizes].astype(float)
    return _within_sizes(means[:, None], sizes)[:, 0] * counts / np.maximum(counts - 1.0, 1.0)


def stratified_shapley(
    n: int,
    masks: Sequence[int],
    values: np.ndarray,
    *,
    control_variate: bool | None = None,
    surrogate: bool | None = None,
    completion: bool | None = None,
) -> StratifiedEstimate:
    """Estimate Shapley values from held coalitions (see the module docstring).

    Two adjustments may be subtracted before the residual is sampled, each with its exact Shapley values added
    back: the per-example control variate (`ControlVariate`) and a pairwise surrogate of what remains
    (`Surrogate`). By default (None) each is used when the held coalitions say it helps: of the (up to four)
    combinations, the one whose leave-one-out residuals over the sampled sizes are smallest is kept, so a game
    where "right alone" says little drops the control variate, and a game a pairwise fit does not describe
    drops the surrogate (never considered, unless forced, while it has more terms than sampled coalitions). The
    point estimate samples v - g - h for the fitted h; its standard error is computed from the leave-one-out
    residuals, so the interval is not narrowed by a fit to the very coalitions it is checked on. A fifth
    candidate, for games monotone per example, completes each question's table from the held coalitions
    (`MonotoneCompletion`); it too is kept only when its leave-one-out residuals are the smallest.

    Args:
        n: number of players.
        masks: the held coalitions as bitmasks, distinct; they must include the border strata and, for each
            middle size, a coalition with and one without every member (`warmup_masks` gives both).
        values: shape (len(masks), n_examples): each held coalition's per-example values.
        control_variate: True / False forces the control variate on / off (False: the ablation
            `bench/estimators.py` measures); None chooses.
        surrogate: likewise for the pairwise surrogate.
        completion: True uses the monotone completion alone, False never; None considers it when neither
            adjustment is forced, there are enough examples (`MIN_COMPLETION_EXAMPLES`) and the completed
            table is small (`MAX_COMPLETION_CELLS`).

    Raises:
        ValueError: a stratum without a coalition, or values whose shape does not match the masks.
    """
    masks_arr = np.asarray(masks, dtype=np.int64)
    values = np.asarray(values, dtype=float)
    if values.ndim != 2 or values.shape[0] != len(masks_arr):
        raise ValueError(
            f"stratified_shapley: values of shape {values.shape} for {len(masks_arr)} coalitions"
        )
    if len(set(masks_arr.tolist())) != len(masks_arr):
        raise ValueError("stratified_shapley: coalitions are repeated")
    if len(masks_arr) == 1 << n:
        table = np.empty_like(values)
        table[masks_arr] = values
        per_example = exact_shapley_table(table)
        return StratifiedEstimate(per_example, np.zeros(n), np.zeros(n + 1), True, len(masks_arr), "exact")

    bits = _bits(masks_arr, n)
    sizes = bits.sum(axis=1)
    sampled = (sizes >= 2) & (sizes <= n - 2)
    best: tuple[float, np.ndarray, np.ndarray, np.ndarray, str] | None = None
    # A fit with more terms than sampled coalitions is not considered unless forced: its leave-one-out
    # residuals are unreliable there (a six-member debate at 30 of 64 coalitions: the chosen surrogate's
    # simultaneous intervals held in 7 of 10 audits).
    # Nor once half the sampled sizes' coalitions are held: the finite-population correction then shrinks the
    # interval faster than the bias of a fit to the same coalitions (a correlated vote at 200 of 256
    # coalitions: all members held at once in 35 of 40 runs).
    middle = sum(math.comb(n, t) for t in range(2, n - 1))
    fits = _surrogate_terms(n) <= int(sampled.sum()) < middle / 2
    # The simpler adjustment first: a later one must do strictly better to be kept.
    for use_control in () if completion else (False, True) if control_variate is None else (control_variate,):
        control = ControlVariate.fit(n, masks_arr, values) if use_control else _no_control(n, values.shape[1])
        residual = values - control.values(masks_arr)
        means = residual.mean(axis=1)
        for use_surrogate in ((False, True) if fits else (False,)) if surrogate is None else (surrogate,):
            per_example = control.shapley()
            if use_surrogate:
                fitted, loo, optimism = fit_surrogate(n, bits, means)
                # The point estimate samples v - g - h for the fitted h (design-unbiased for a fixed h, and exact
                # once every coalition is held: a leave-one-out residual there broke the finite-population
                # correction, the airport game at 200 of 256 coalitions covering 74%); its spread is the
                # leave-one-out one, so the interval is not narrowed by h having been fitted to these coalitions.
                shifted = residual - fitted.values(masks_arr)[:, None]
                spread = shifted.mean(axis=1) + optimism
                per_example = per_example + fitted.shapley()[None, :]
            else:
                loo, shifted = _size_loo(means, sizes, n), residual
                spread = means
            score = float(np.mean(loo[sampled] ** 2)) if sampled.any() else 0.0
            if best is None or score < best[0]:
                model = " + ".join(
                    name
                    for name, used in (("control variate", use_control), ("surrogate", use_surrogate))
                    if used
                )
                best = (score, shifted, spread, per_example, model or "plain")
    if completion or (completion is None and control_variate is None and surrogate is None):
        examples = values.shape[1]
        small = examples >= MIN_COMPLETION_EXAMPLES and (1 << n) * examples <= MAX_COMPLETION_CELLS
        if completion or (fits and small):
            completed = MonotoneCompletion.fit(n, masks_arr, values)
            residual = values - completed.held_prediction
            means = residual.mean(axis=1)
            score = float(np.mean(means[sampled] ** 2)) if sampled.any() else 0.0
            if completion or best is None or score < best[0]:
                per_example = exact_shapley_table(completed.table)
                return _stratified(
                    n, bits, sizes, residual, means, per_example, "monotone completion", unheld_only=True
                )
    assert best is not None
    _, residual, spread, per_example, model = best
    return _stratified(n, bits, sizes, residual, spread, per_example, model)


def _stratified(
    n: int,
    bits: np.ndarray,
    sizes: np.ndarray,
    residual: np.ndarray,
    means: np.ndarray,
    per_example: np.ndarray,
    model: str,
    *,
    unheld_only: bool = False,
) -> StratifiedEstimate:
    """The stratified estimate of the residual's Shapley values added to `per_example` (the adjustments'), its
    variance from `means` (each held coalition's residual over examples, as the sampling error should see it).
    `unheld_only`: the adjustments already hold the held coalitions' own values (`MonotoneCompletion`), so the
    residual's stratum mean stands for the coalitions not held only and is scaled by their share."""
    n_examples = residual.shape[1]
    per_example = per_example.copy()
    sampled = (sizes >= 2) & (sizes <= n - 2)
    overall = float(means[sampled].var(ddof=1)) if sampled.sum() > 1 else 0.0
    variance = np.zeros(n)
    size_variance = np.zeros(n + 1)
    for t in range(n + 1):
        rows = sizes == t
        m_t = int(rows.sum())
        in_t = bits[rows].astype(float)  # (m_t, n)
        r_t = residual[rows]  # (m_t, E)
        sum_in = in_t.T @ r_t if m_t else np.zeros((n, n_examples))
        count_in = in_t.sum(axis=0)
        sum_out = r_t.sum(axis=0)[None, :] - sum_in
        count_out = m_t - count_in
        mean_t = means[rows]
        if m_t > 1:
            size_variance[t] = float(mean_t.var(ddof=1))
        # A size's variance from a few coalitions is shrunk toward the variance over all sampled sizes (two
        # pseudo-coalitions' worth): a size whose few samples happened to agree is not certain.
        pooled = (m_t * size_variance[t] + 2.0 * overall) / (m_t + 2.0)
        square_in = in_t.T @ mean_t**2
        linear_in = in_t.T @ mean_t
        for sign, total, counts, sums, square, linear, needed in (
            (1.0, math.comb(n - 1, t - 1) if t >= 1 else 0, count_in, sum_in, square_in, linear_in, t >= 1),
            (
                -1.0, math.comb(n - 1, t) if t <= n - 1 else 0, count_out, sum_out,
                float(mean_t @ mean_t) - square_in, float(mean_t.sum()) - linear_in, t <= n - 1,
            ),
        ):  # fmt: skip
            if not needed:
                continue
            if (counts == 0).any():
                empty = [i for i in range(n) if counts[i] == 0]
                raise ValueError(
                    f"stratified_shapley: no held coalition of size {t} {'holds' if sign > 0 else 'lacks'} "
                    f"player(s) {empty}; start from warmup_masks"
                )
            share = 1.0 - counts / total if unheld_only else 1.0
            per_example += sign * (share * (sums / counts[:, None]).T) / n
            # The stratum's own variance where it is larger (its members differ from the size's others).
            own = (square - linear**2 / np.maximum(counts, 1.0)) / np.maximum(counts - 1.0, 1.0)
            spread = np.maximum(pooled, np.where(counts > 1, own, 0.0))
            variance += spread * np.maximum(1.0 / counts - 1.0 / total, 0.0) / n**2
    return StratifiedEstimate(per_example, np.sqrt(variance), size_variance, False, len(bits), model)


def _random_new(n: int, size: int, held: set[int], held_of_size: int, rng: np.random.Generator) -> int | None:
    """A coalition of `size` not held (`held_of_size` of them are), uniformly among those; None when all are."""
    total = math.comb(n, size)
    if held_of_size >= total:
        return None
    if held_of_size > total // 2:
        free = [
            sum(1 << i for i in c)
            for c in itertools.combinations(range(n), size)
            if sum(1 << i for i in c) not in held
        ]
        return int(free[rng.integers(len(free))])
    while True:
        mask = int((1 << rng.choice(n, size, replace=False)).sum())
        if mask not in held:
            return mask


def next_masks(
    n: int,
    held: Iterable[int],
    estimate: StratifiedEstimate,
    *,
    spend: float,
    cost_of: Callable[[int], float],
    max_new: int,
    seed: int,
    batch: int,
) -> list[int]:
    """The next coalitions to evaluate: greedily where a unit of cost lowers the sampling variance most.

    Adding a coalition of size s lowers the variance of every member's estimate by about
    sigma^2_s (n/s + n/(n-s)) (1/m_s - 1/(m_s + 1)) / n^2, with sigma^2_s the residual variance of size s
    (floored at a tenth of the mean, so a size whose few samples agreed is not starved) and m_s the
    coalitions of that size held; it is divided by what the coalition costs.

    Args:
        n: players.
        held: the coalitions held (bitmasks).
        estimate: the estimate from the held coalitions (its `size_variance`).
        spend: the cost the batch may add in all, in the unit of `cost_of`.
        cost_of: what one more coalition (a bitmask) costs: 1 per coalition, or the new calls it makes.
        max_new: most coalitions the batch may add.
        seed, batch: the draw of batch number `batch` is the same whatever ran before it.

    Returns:
        New coalitions (possibly none: every middle size held entirely, or nothing fits the spend).
    """
    held = set(held)
    rng = np.random.default_rng([seed, batch])
    middle = list(range(2, n - 1))
    sizes = Counter(m.bit_count() for m in held)
    held_by_size = {s: sizes[s] for s in middle}
    floor = 0.1 * float(np.mean([estimate.size_variance[s] for s in middle])) if middle else 0.0
    candidates: dict[int, tuple[int, float]] = {}  # size -> (a coalition not held, its cost)
    chosen: list[int] = []
    spent = 0.0
    while len(chosen) < max_new:
        best, best_gain = None, -1.0
        for s in middle:
            if held_by_size[s] >= math.comb(n, s):
                continue
            if s not in candidates:
                mask = _random_new(n, s, held, held_by_size[s], rng)
                assert mask is not None  # the size is not full
                candidates[s] = (mask, float(cost_of(mask)))
            cost = candidates[s][1]
            if spent + cost > spend:
                continue
            sigma2 = max(float(estimate.size_variance[s]), floor, 1e-12)
            m_s = max(held_by_size[s], 1)
            gain = sigma2 * (n / s + n / (n - s)) * (1.0 / m_s - 1.0 / (m_s + 1))
            gain /= max(cost, 1e-9)
            if gain > best_gain:
                best, best_gain = s, gain
        if best is None:
            return chosen
        mask, cost = candidates.pop(best)
        held.add(mask)
        chosen.append(mask)
        held_by_size[best] += 1
        spent += cost
    return chosen


class StratifiedSampler:
    """The stratified estimator's batches: the warm-up first, then batch after batch until a stop.

    The caller evaluates each batch and hands back the estimate from everything held; `stop` says whether to
    go on and `next_batch` draws the next batch within what the caller may still spend. A batch adds at most
    half the coalitions held (at least n), or, with a target error, about what the variance says the target
    needs (the variance falls as one over the sampled coalitions), so a stop comes soon after it is earned.

    Args:
        n: players.
        seed: the draws' seed (the same seed, values and budget give the same batches, so a resumed audit
            replays the same plan).
        target_error: stop once every member's 95% sampling interval (simultaneous or not) is within +- this.
        max_coalitions: stop once this many coalitions are held.
        simultaneous: the target error holds for the intervals that cover all members at once
            (`critical_value`), not each member's own.
    """

    def __init__(
        self,
        n: int,
        *,
        seed: int = 0,
        target_error: float | None = None,
        max_coalitions: int | None = None,
        simultaneous: bool = False,
    ):
        self.n = n
        self.seed = seed
        self.target_error = target_error
        self.max_coalitions = max_coalitions or (1 << n)
        self.z = critical_value(n, simultaneous)
        self.held: list[int] = warmup_masks(n, seed)
        self.batches = 0

    def stop(self, estimate: StratifiedEstimate) -> str | None:
        """ "complete" (every coalition held: exact), "target_error", "coalitions" (max_coalitions), or None."""
        if estimate.exact:
            return "complete"
        if self.target_error is not None and float(estimate.half_width(self.z).max()) <= self.target_error:
            return "target_error"
        if len(self.held) >= self.max_coalitions:
            return "coalitions"
        return None

    def next_batch(
        self,
        estimate: StratifiedEstimate,
        *,
        spend: float = math.inf,
        cost_of: Callable[[int], float] | None = None,
    ) -> list[int]:
        """The next coalitions (appended to `held`); none when nothing fits `spend` (in `cost_of`'s unit,
        1 per coalition by default) or every coalition is held."""
        n = self.n
        growth = max(n, len(self.held) // 2)
        if self.target_error is not None:
            sampled = max(1, len(self.held) - 2 * n - 2)
            needed = sampled * (float(estimate.half_width(self.z).max()) / self.target_error) ** 2 - sampled
            growth = int(min(growth, max(n, needed)))
        growth = min(growth, self.max_coalitions - len(self.held))
        self.batches += 1
        new = next_masks(
            n, self.held, estimate, spend=spend, cost_of=cost_of or (lambda _: 1.0), max_new=growth,
            seed=self.seed, batch=self.batches,
        )  # fmt: skip
        self.held += new
        return new
