"""Contribution estimators for a cooperative game whose values are per-example scores.

The game v(S) is the score of the protocol run with only the members in coalition S, kept per example (an
array of shape `(n_examples,)`), so every estimate is a mean over examples of a per-example estimate and its
uncertainty comes from a bootstrap over examples.

Work is split in two steps so the game can evaluate every coalition at once, interleaved on one event loop:

1. `plan_coalitions` decides up front which coalitions an estimate needs (and, for sampled Shapley, which
   permutations it uses).
2. `estimate` turns the evaluated values into leave-one-out or Shapley values with confidence intervals.

Example:
    >>> import numpy as np
    >>> plan = plan_coalitions(["a", "b"], "exact")
    >>> values = {frozenset({"a"}): np.array([1.0]), frozenset({"b"}): np.array([0.0]),
    ...           frozenset({"a", "b"}): np.array([1.0])}
    >>> estimate(plan, values).values()
    {'a': 1.0, 'b': 0.0}
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

Method = Literal["loo", "exact", "sampled"]
Coalition = frozenset[str]

METHODS: tuple[str, ...] = ("loo", "exact", "sampled")
_BOOT_CHUNK = 100  # bootstrap replicates drawn at a time, to bound memory on large datasets


@dataclass(frozen=True)
class CoalitionPlan:
    """The coalitions an estimate needs, fixed before any of them is evaluated.

    Attributes:
        players: Member names in pool order.
        method: The estimator the plan was made for.
        coalitions: Every coalition to evaluate, by size then pool order. Every plan holds the grand coalition
            and each leave-one-out coalition, so leave-one-out values are available whatever the method.
        permutations: The orders sampled Shapley averages over (empty for other methods). With antithetic
            sampling a random order is followed by its reverse.
        exhaustive: True when the permutations are all n! orders, each once: the estimate is then exact.
        budget: The number of permutations asked for (sampled only).
        seed: The seed the permutations were drawn with.
        antithetic: Whether permutations were drawn in antithetic pairs.
    """

    players: tuple[str, ...]
    method: Method
    coalitions: tuple[Coalition, ...]
    permutations: tuple[tuple[str, ...], ...] = ()
    exhaustive: bool = False
    budget: int | None = None
    seed: int = 0
    antithetic: bool = False

    def __len__(self) -> int:
        return len(self.coalitions)

    @property
    def complete(self) -> bool:
        """Whether the plan holds every coalition (its Shapley values are then computed exactly)."""
        return len(self.coalitions) == 2 ** len(self.players)


@dataclass(frozen=True)
class PlayerEstimate:
    """One member's contribution: the mean over examples, the per-example values and a bootstrap interval."""

    value: float
    per_example: np.ndarray
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class Estimates:
    """Contributions of every member under one method.

    Attributes:
        method: "loo", "exact" or "sampled".
        players: Member names in pool order.
        per_player: Member name -> its estimate.
        confidence: Level of the percentile bootstrap intervals (e.g. 0.95).
        n_boot: Bootstrap replicates behind the intervals.
        n_permutations: Permutations averaged over (sampled only).
        sampling_error: Member -> half-width of the sampling interval (at `confidence`): how far the
            estimate may be from the exact value on these examples, from the choice of permutations alone.
            None when the estimate is exact.
        exact: True when the values are exact (exact Shapley, or sampled prefixes that cover every coalition).
        simultaneous: the sampling intervals hold all members' values at once with probability `confidence`
            (Bonferroni: each at `member_level`), not each member's alone.
        adjustment: what the stratified estimator subtracted before sampling, chosen from the played
            coalitions (`StratifiedEstimate.model`); None for the other estimators.
    """

    method: Method
    players: tuple[str, ...]
    per_player: Mapping[str, PlayerEstimate]
    confidence: float
    n_boot: int
    n_permutations: int | None = None
    sampling_error: Mapping[str, float] | None = None
    exact: bool = True
    estimator: str | None = None
    simultaneous: bool = False
    adjustment: str | None = None

    @property
    def member_level(self) -> float:
        """The level of each member's sampling interval: `confidence`, or Bonferroni's when simultaneous."""
        return member_level(self.confidence, len(self.players), self.simultaneous)

    def __getitem__(self, player: str) -> PlayerEstimate:
        return self.per_player[player]

    def values(self) -> dict[str, float]:
        """Member -> mean contribution, in pool order."""
        return {p: self.per_player[p].value for p in self.players}

    def intervals(self) -> dict[str, tuple[float, float]]:
        """Member -> (low, high) bootstrap interval, in pool order."""
        return {p: (self.per_player[p].ci_low, self.per_player[p].ci_high) for p in self.players}


def ordered_coalitions(coalitions: Iterable[Coalition], players: Sequence[str]) -> tuple[Coalition, ...]:
    """Distinct coalitions by size, then by their members' pool order."""
    index = {p: i for i, p in enumerate(players)}
    return tuple(sorted(set(coalitions), key=lambda c: (len(c), sorted(index[p] for p in c))))


def _loo_coalitions(players: Sequence[str]) -> list[Coalition]:
    grand = frozenset(players)
    return [grand, *(grand - {p} for p in players)]


def _draw_permutations(
    n: int, budget: int, seed: int, antithetic: bool
) -> tuple[list[tuple[int, ...]], bool]:
    if budget >= math.factorial(n):
        # Enumerating every order costs no more than sampling this many and removes sampling error.
        return list(itertools.permutations(range(n))), True
    rng = np.random.default_rng(seed)
    orders: list[tuple[int, ...]] = []
    while len(orders) < budget:
        order = tuple(int(i) for i in rng.permutation(n))
        orders.append(order)
        if antithetic and len(orders) < budget:
            orders.append(order[::-1])
    return orders, False


def plan_coalitions(
    players: Sequence[str],
    method: Method,
    *,
    budget: int | None = None,
    seed: int = 0,
    antithetic: bool = True,
    max_exact_players: int = 12,
    force: bool = False,
) -> CoalitionPlan:
    """Decide which coalitions an estimate needs.

    Args:
        players: Member names in pool order; distinct and non-empty.
        method: "loo" (the grand coalition and each leave-one-out coalition, n + 1 in all), "exact" (all 2^n
            coalitions) or "sampled" (every prefix of `budget` permutations, plus the leave-one-out coalitions).
        budget: Number of permutations for "sampled". A budget of n! or more enumerates every order once.
        seed: Seed for drawing permutations.
        antithetic: Draw permutations in pairs, an order and its reverse (the pair's marginal contributions
            are negatively correlated, which lowers the variance). An odd budget leaves the last order unpaired.
        max_exact_players: Largest pool for which "exact" runs without `force`.
        force: Allow "exact" beyond `max_exact_players`.

    Returns:
        The plan, with its coalitions ordered by size then pool order.

    Raises:
        ValueError: On duplicate or empty player names, an unknown method, a missing or non-positive budget
            for "sampled", or "exact" over too many players without `force`.
    """
    players = tuple(players)
    if not players:
        raise ValueError("plan_coalitions: players is empty; an audit needs at least one member")
    duplicates = sorted({p for p in players if players.count(p) > 1})
    if duplicates:
        raise ValueError(f"plan_coalitions: duplicate player names {duplicates}")
    if any(not isinstance(p, str) or not p for p in players):
        raise ValueError(f"plan_coalitions: player names must be non-empty strings, got {list(players)}")
    if method not in METHODS:
        raise ValueError(f"plan_coalitions: unknown method {method!r}; expected one of {', '.join(METHODS)}")
    n = len(players)

    if method == "loo":
        return CoalitionPlan(players, method, ordered_coalitions(_loo_coalitions(players), players))

    if method == "exact":
        if n > max_exact_players and not force:
            raise ValueError(
                f"exact Shapley over {n} players needs 2^{n} = {2**n} coalitions (limit: {max_exact_players} "
                f"players); use method 'sampled' with a budget of permutations, or force=True"
            )
        subsets = (frozenset(c) for size in range(n + 1) for c in itertools.combinations(players, size))
        return CoalitionPlan(players, method, ordered_coalitions(subsets, players))

    if budget is None or budget < 1:
        raise ValueError(f"sampled Shapley needs a budget of at least 1 permutation, got budget={budget}")
    orders, exhaustive = _draw_permutations(n, budget, seed, antithetic)
    prefixes = {frozenset(players[i] for i in order[:k]) for order in orders for k in range(n + 1)}
    return CoalitionPlan(
        players,
        method,
        ordered_coalitions(prefixes.union(_loo_coalitions(players)), players),
        permutations=tuple(tuple(players[i] for i in order) for order in orders),
        exhaustive=exhaustive,
        budget=budget,
        seed=seed,
        antithetic=antithetic,
    )


class _ValueTable:
    """Per-example values of the needed coalitions, stacked in one matrix for vectorised lookups."""

    def __init__(self, players: Sequence[str], needed: Sequence[Coalition], values: Mapping) -> None:
        known = set(players)
        given: dict[Coalition, np.ndarray] = {}
        for key, value in values.items():
            if isinstance(key, str):
                raise TypeError(
                    f"values: coalition keys must be frozensets of member names, got string {key!r}"
                )
            coalition = frozenset(key)
            unknown = sorted(coalition - known)
            if unknown:
                raise ValueError(f"values: coalition {sorted(coalition)} names unknown members {unknown}")
            given[coalition] = np.asarray(value, dtype=float)

        missing = [sorted(c) for c in needed if c and c not in given]
        if missing:
            shown = ", ".join(str(m) for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(f"values: {len(missing)} coalition(s) of the plan were not evaluated: {shown}")
        first_with_shape: dict[tuple[int, ...], list[str]] = {}
        for c in needed:
            if c in given:
                first_with_shape.setdefault(given[c].shape, sorted(c))
        if len(first_with_shape) != 1:
            raise ValueError(f"values: coalitions disagree on the array shape: {first_with_shape}")
        (shape,) = first_with_shape
        if len(shape) != 1 or shape[0] == 0:
            raise ValueError(f"values: expected 1-D arrays with at least one example, got shape {shape}")
        self.n_examples = shape[0]
        # The empty coalition scores zero unless the game supplied a value for it.
        self.rows = {c: row for row, c in enumerate(needed)}
        self.matrix = np.vstack([given[c] if c in given else np.zeros(shape) for c in needed])
        if not np.isfinite(self.matrix).all():
            bad = [sorted(c) for c, r in self.rows.items() if not np.isfinite(self.matrix[r]).all()]
            raise ValueError(
                f"values: non-finite scores for coalitions {bad[:5]}; drop failed examples from every "
                f"coalition before estimating"
            )

    def __call__(self, coalitions: Sequence[Coalition]) -> np.ndarray:
        return self.matrix[[self.rows[c] for c in coalitions]]


def _bootstrap_counts(rng: np.random.Generator, size: int, n_boot: int) -> Iterable[np.ndarray]:
    # Multinomial counts are a resample's weights: counts @ x / size is the mean of the resample.
    uniform = np.full(size, 1.0 / size)
    for start in range(0, n_boot, _BOOT_CHUNK):
        yield rng.multinomial(size, uniform, size=min(_BOOT_CHUNK, n_boot - start)).astype(float)


def _percentiles(replicates: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(replicates, [tail, 100.0 - tail], axis=0)
    return low, high


def _check_bootstrap(n_boot: int, confidence: float) -> None:
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, got {n_boot}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")


class BootstrapMemo(Protocol):
    """Where intervals already computed are kept (an audit's play cache): by a key of everything they depend
    on (`remembered_bootstraps`)."""

    def intervals(self, key: str) -> tuple[np.ndarray, np.ndarray] | None: ...
    def keep_intervals(self, key: str, low: np.ndarray, high: np.ndarray) -> None: ...


_MEMO: ContextVar[BootstrapMemo | None] = ContextVar("bootstrap_memo", default=None)


@contextlib.contextmanager
def remembered_bootstraps(memo: BootstrapMemo | None) -> Iterator[None]:
    """Inside the block, each bootstrap's intervals are looked up in `memo` first and kept there after: a rerun
    of an audit resamples nothing (1,000 resamples of every example, a few percent of a first run at zero
    latency). The key is the data's bytes and shape, the replicates, the level and the seed: the intervals
    are a function of these alone (the memo's own key adds the code)."""
    token = _MEMO.set(memo)
    try:
        yield
    finally:
        _MEMO.reset(token)


def _example_bootstrap(
    per_example: np.ndarray, *, n_boot: int, confidence: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile intervals of column means, resampling the rows (examples) of `per_example` (E, k)."""
    memo, key = _MEMO.get(), ""
    if memo is not None:
        data = np.ascontiguousarray(per_example, dtype=float)
        key = hashlib.sha256(
            f"{data.shape}:{n_boot}:{confidence!r}:{seed}:".encode() + data.tobytes()
        ).hexdigest()
        known = memo.intervals(key)
        if known is not None:
            return known
    n_examples = per_example.shape[0]
    rng = np.random.default_rng(seed)
    replicates = np.vstack(
        [counts @ per_example / n_examples for counts in _bootstrap_counts(rng, n_examples, n_boot)]
    )
    low, high = _percentiles(replicates, confidence)
    if memo is not None:
        memo.keep_intervals(key, low, high)
    return low, high


def bootstrap_mean_ci(
    per_example: np.ndarray, *, n_boot: int = 1000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of a mean over examples.

    Used for individual strengths; with the same seed it resamples the same examples as `estimate`.

    Args:
        per_example: Scores of shape (n_examples,).
        n_boot: Bootstrap replicates.
        confidence: Interval level.
        seed: Seed of the resampling.

    Returns:
        (low, high).
    """
    _check_bootstrap(n_boot, confidence)
    scores = np.asarray(per_example, dtype=float)
    if scores.ndim != 1 or scores.size == 0:
        raise ValueError(f"bootstrap_mean_ci: expected a non-empty 1-D array, got shape {scores.shape}")
    low, high = _example_bootstrap(scores[:, None], n_boot=n_boot, confidence=confidence, seed=seed)
    return float(low[0]), float(high[0])


def _loo(plan: CoalitionPlan, table: _ValueTable) -> np.ndarray:
    grand = frozenset(plan.players)
    rows = table([grand, *(grand - {p} for p in plan.players)])
    return (rows[0] - rows[1:]).T


def _exact(plan: CoalitionPlan, table: _ValueTable) -> np.ndarray:
    players = plan.players
    n = len(players)
    # Weight of a coalition S of size s not containing i: s! (n - s - 1)! / n!.
    weight = np.array([1.0 / (n * math.comb(n - 1, s)) for s in range(n)])
    shapley = np.zeros((table.n_examples, n))
    for i, player in enumerate(players):
        others = [p for p in players if p != player]
        without = [frozenset(c) for size in range(n) for c in itertools.combinations(others, size)]
        gains = table([c | {player} for c in without]) - table(without)
        shapley[:, i] = weight[[len(c) for c in without]] @ gains
    return shapley


def _marginals(plan: CoalitionPlan, table: _ValueTable) -> np.ndarray:
    """Marginal contributions (n_players, n_permutations, n_examples) along each sampled order."""
    index = {p: i for i, p in enumerate(plan.players)}
    n, n_perm = len(plan.players), len(plan.permutations)
    gains = np.empty((n, n_perm, table.n_examples))
    for k, order in enumerate(plan.permutations):
        prefixes = [frozenset(order[:j]) for j in range(n + 1)]
        steps = np.diff(table(prefixes), axis=0)
        gains[[index[p] for p in order], k] = steps
    return gains


def _permutation_units(plan: CoalitionPlan) -> list[list[int]]:
    # Antithetic pairs are resampled together: they were drawn together.
    step = 2 if plan.antithetic else 1
    return [
        list(range(s, min(s + step, len(plan.permutations)))) for s in range(0, len(plan.permutations), step)
    ]


def member_level(confidence: float, n: int, simultaneous: bool) -> float:
    """The level each of n members' intervals needs for them to hold together at `confidence` (Bonferroni:
    1 - (1 - confidence) / n), or `confidence` itself per member."""
    return 1.0 - (1.0 - confidence) / n if simultaneous else confidence


def t_quantile(confidence: float, df: int) -> float:
    """Two-sided Student t quantile (Cornish-Fisher expansion; within 1% of the exact value from df = 3)."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    if df <= 0:
        return math.inf
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def _permutation_error(plan: CoalitionPlan, gains: np.ndarray, confidence: float) -> np.ndarray:
    """Half-width of each member's sampling interval: Student t over the permutation units (an antithetic
    pair is one unit: its two orders were drawn together), averaged over examples.

    Each member's variance is shrunk toward the largest member's (two units' worth): a member that is
    rarely pivotal shows no spread in a few permutations although its value is not certain (a weighted
    voting game's light members), and its interval would not cover.
    """
    units = _permutation_units(plan)
    means = np.stack([gains[:, u, :].mean(axis=(1, 2)) for u in units], axis=1)  # (n, U)
    if len(units) < 2:
        return np.full(len(plan.players), math.inf)
    own = means.var(axis=1, ddof=1)
    shrunk = (len(units) * own + 2.0 * own.max()) / (len(units) + 2.0)
    return t_quantile(confidence, len(units) - 1) * np.sqrt(shrunk / len(units))


def estimate(
    plan: CoalitionPlan,
    values: Mapping[Coalition, np.ndarray],
    *,
    method: Method | None = None,
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimates:
    """Estimate each member's contribution from the evaluated coalitions.

    Args:
        plan: The plan the values were evaluated for.
        values: Coalition -> per-example scores, shape (n_examples,), the same examples in the same order for
            every coalition. The empty coalition scores zero unless given.
        method: "loo" works with every plan; otherwise it must be the plan's own method. Defaults to it.
        n_boot: Bootstrap replicates for the intervals.
        confidence: Interval level.
        seed: Seed of the bootstrap; the same seed gives the same intervals.

    Returns:
        Per-member estimates. Leave-one-out is v(N) - v(N minus i); exact Shapley is the weighted average of
        marginal contributions over all coalitions; sampled Shapley is the mean marginal contribution over the
        plan's permutations, or exact when their prefixes cover every coalition. Each is computed per
        example, then averaged. Intervals resample examples (the example noise); a sampled estimate also
        gives its sampling error (over the choice of permutations, for these examples), apart.

    Raises:
        ValueError: When a coalition the method needs is missing, arrays differ in shape or are not finite,
            or the method does not match the plan.
    """
    method = method or plan.method
    if method not in METHODS:
        raise ValueError(f"estimate: unknown method {method!r}; expected one of {', '.join(METHODS)}")
    if method != "loo" and method != plan.method:
        raise ValueError(
            f"estimate: a {plan.method!r} plan cannot give {method!r} estimates (only 'loo' or its own)"
        )
    _check_bootstrap(n_boot, confidence)
    needed = _loo_coalitions(plan.players) if method == "loo" else plan.coalitions
    table = _ValueTable(plan.players, needed, values)

    n_permutations = None
    error = None
    if method == "loo":
        per_example = _loo(plan, table)
    elif method == "exact" or plan.complete:
        per_example = _exact(plan, table)
        n_permutations = len(plan.permutations) or None
    else:
        gains = _marginals(plan, table)
        per_example = gains.mean(axis=1).T
        n_permutations = len(plan.permutations)
        if not plan.exhaustive:
            error = dict(
                zip(plan.players, map(float, _permutation_error(plan, gains, confidence)), strict=True)
            )
    low, high = _example_bootstrap(per_example, n_boot=n_boot, confidence=confidence, seed=seed)

    per_player = {
        p: PlayerEstimate(
            value=float(per_example[:, i].mean()),
            per_example=per_example[:, i].copy(),
            ci_low=float(low[i]),
            ci_high=float(high[i]),
        )
        for i, p in enumerate(plan.players)
    }
    exact = method != "sampled" or plan.complete or plan.exhaustive
    estimator = None if method == "loo" else "exact" if method == "exact" else "permutation"
    return Estimates(
        method, plan.players, per_player, confidence, n_boot, n_permutations, error, exact, estimator
    )


def estimates_from(
    players: Sequence[str],
    per_example: np.ndarray,
    *,
    method: Method,
    estimator: str,
    exact: bool,
    sampling_error: Sequence[float] | None = None,
    simultaneous: bool = False,
    adjustment: str | None = None,
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimates:
    """`Estimates` from per-example values (n_examples, n) an estimator computed (stratified, from answers),
    with example-bootstrap intervals and, unless exact, the sampling error's half-widths (at `confidence`
    per member, or for all members at once when `simultaneous`)."""
    _check_bootstrap(n_boot, confidence)
    low, high = _example_bootstrap(per_example, n_boot=n_boot, confidence=confidence, seed=seed)
    per_player = {
        p: PlayerEstimate(
            float(per_example[:, i].mean()), per_example[:, i].copy(), float(low[i]), float(high[i])
        )
        for i, p in enumerate(players)
    }
    error = (
        None
        if exact or sampling_error is None
        else dict(zip(players, map(float, sampling_error), strict=True))
    )
    return Estimates(
        method, tuple(players), per_player, confidence, n_boot, None, error, exact, estimator,
        simultaneous=error is not None and simultaneous, adjustment=adjustment,
    )  # fmt: skip


TIE_TOL = 1e-9
"""Scores closer than this are equal when ranked: a mean over examples, or a Shapley value summed in another
order, differs from an equal one by float noise (1e-16), which must not rank two equal members apart."""


def ranks(scores: Mapping[str, float]) -> dict[str, int]:
    """Rank members by score, 1 = best; tied members (within `TIE_TOL`) share the best rank of their group
    (1, 2, 2, 4).

    Args:
        scores: Member -> score; higher is better.

    Returns:
        Member -> rank, in the order of `scores`.

    Example:
        >>> ranks({"a": 0.1 + 0.2, "b": 0.3, "c": 0.1})
        {'a': 1, 'b': 1, 'c': 3}
    """
    values = list(scores.values())
    return {name: 1 + sum(other > value + TIE_TOL for other in values) for name, value in scores.items()}


def _average_ranks(values: Sequence[float]) -> np.ndarray:
    # Ascending ranks from 1; a tied group gets the mean of the positions it spans.
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = np.empty(len(values))
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] - values[order[start]] <= TIE_TOL:
            end += 1
        result[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return result


def _spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    rx, ry = _average_ranks(x), _average_ranks(y)
    dx, dy = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return float(dx @ dy) / denominator if denominator > 0 else None


def _order(u: float, v: float) -> int:
    """1, -1, or 0 for a tie (within `TIE_TOL`)."""
    return 0 if abs(u - v) <= TIE_TOL else (1 if u > v else -1)


def _kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    concordant_minus_discordant = 0
    pairs_untied_x = pairs_untied_y = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        sx, sy = _order(x[i], x[j]), _order(y[i], y[j])
        concordant_minus_discordant += sx * sy
        pairs_untied_x += sx != 0
        pairs_untied_y += sy != 0
    denominator = math.sqrt(pairs_untied_x * pairs_untied_y)
    return concordant_minus_discordant / denominator if denominator > 0 else None


def rank_correlation(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float | None]:
    """Spearman's rho and Kendall's tau-b between two scorings of the same members.

    Ties take average ranks (Spearman) or drop out of the tau-b denominator (Kendall), as in scipy.

    Args:
        a: Member -> score (e.g. individual strength).
        b: Member -> score over the same members (e.g. Shapley value).

    Returns:
        {"spearman": rho, "kendall": tau}; each is None when there are fewer than two members or a side is
        constant, where the correlation is undefined.

    Raises:
        ValueError: When `a` and `b` score different members.
    """
    if set(a) != set(b):
        raise ValueError(
            f"rank_correlation: the two scorings name different members: only in first {sorted(set(a) - set(b))}, "
            f"only in second {sorted(set(b) - set(a))}"
        )
    names = list(a)
    x = [float(a[m]) for m in names]
    y = [float(b[m]) for m in names]
    if len(names) < 2:
        return {"spearman": None, "kendall": None}
    return {"spearman": _spearman(x, y), "kendall": _kendall_tau_b(x, y)}
