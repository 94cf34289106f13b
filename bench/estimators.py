"""Shapley estimators given the same information: coalitions and distinct calls to reach a target accuracy.

Run: ``python bench/estimators.py [--n 12] [--games vote,debate,weighted,judge,cover] [--runs 40]
[--only NAME,...] [--coverage RUNS] [--json PATH]``

shapiq is optional (its estimators are skipped without it) and is never a dependency of this package. shapiq 1.8
needs Python >= 3.12; give it a venv of its own (xgboost-cpu is RegressionMSR's and ProxySHAP's proxy; the
`xgboost` wheel would pull a CUDA library):

    python3.12 -m venv /tmp/venv-shapiq18
    /tmp/venv-shapiq18/bin/pip install shapiq==1.8.0 xgboost-cpu numpy pydantic pyyaml rich typer networkx
    PYTHONPATH=. /tmp/venv-shapiq18/bin/python bench/estimators.py --json bench-estimators.json

Games (n players, `--examples` questions; the values of all 2^n coalitions on every question are computed once,
so the exact Shapley values are known). An estimator asks for the coalitions it chooses:

- **vote**: majority vote; member i is right with a probability that falls with i and with the question's
  difficulty, plus a noise shared by every member of a question (correlated members); a wrong member gives
  the question's trap answer with probability 0.6, else one of three others (ties: pool order), computed with
  `colab_graphs.audit.answers.vote_values`.
- **debate**: the same first answers, then one revision round in which each member of S adopts S's
  first-round majority answer with a probability that grows with its weakness, then a vote. Distinct calls:
  a coalition costs |S| x 2 calls per question, except first-round answers, which depend only on the member
  and the question and are shared by every coalition (and made once).
- **weighted**, **judge**, **cover** (games the package's estimator was not designed on): a confidence-weighted
  vote of three families of members that make the same mistakes; "the most confident member answers", with
  miscalibrated members; a two-skill cover (a question is solved when S can do both of its steps). See
  `weighted_table`, `judge_table`, `cover_table`.
- **router**, **moa**, **pipeline** (issue 43's games, made alongside the surrogate): a router that sends each
  question to the member of S it rates best on its topic; a mixture of agents whose aggregator's answer
  depends on its own skill and on its proposers'; strong complementarity (a question needs a member of each
  of three roles able on it; nobody scores alone). See `router_table`, `moa_table`, `pipeline_table`.

Information. This package's stratified estimator gets each question's value of every coalition it asks (what
an audit's game returns) and uses it in a per-example control variate (`ControlVariate`), a pairwise
surrogate fitted to the coalitions it played (`Surrogate`) and, for games monotone per example, a completion
of each question's table from the played coalitions (`MonotoneCompletion`), each used where the played
coalitions show it helps (`stratified_shapley`). shapiq's estimators
are run two ways: **plain**, on the mean game v(S) only, and **+ control variate**, given the same per-question
values and the same control variate: they estimate the residual game v - g, and g's exact Shapley values are
added back (`shapiq_estimator`). For a linear estimator (SVARM, KernelSHAP) running it on each question's game
and averaging is the plain estimator, so "+ control variate" is the equal-information form. Ours is also run
with its adjustments forced (issue 32's control variate alone; none).

For each estimator and game, the smallest budget at which at least 90% of `--runs` runs (seeds) reach the
target (max error < 0.01 over members; `--targets tau`: Kendall tau = 1), reported as the 90th percentile of
the coalitions evaluated over those runs (the singletons a control variate needs count), and distinct calls on
the debate. Each budget is found by bisection over a grid; a probe stops as soon as more than 10% of its runs
failed. `--coverage RUNS`: how often ours's sampling intervals hold the exact values, per member and all at
once (`coverage`).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import platform
import sys
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from colab_graphs.audit.answers import vote_values  # noqa: E402
from colab_graphs.audit.estimators import plan_coalitions, rank_correlation  # noqa: E402
from colab_graphs.audit.stratified import (  # noqa: E402
    ControlVariate,
    StratifiedEstimate,
    StratifiedSampler,
    critical_value,
    exact_shapley_table,
    stratified_shapley,
    warmup_masks,
)

ROUNDS = 2


# --- games -----------------------------------------------------------------------------------------------------


def first_answers(n: int, n_examples: int, seed: int) -> np.ndarray:
    """Class ids (examples, n) of the members' first answers: 0 is right, 1 the trap, 2-4 other wrong ones."""
    rng = np.random.default_rng([seed, n])
    skill = np.linspace(1.6, -0.9, n)
    difficulty = rng.normal(0.0, 1.0, n_examples)
    shared = rng.normal(0.0, 1.0, n_examples)
    noise = 0.6 * shared[:, None] + 0.8 * rng.normal(0.0, 1.0, (n_examples, n))
    right = skill[None, :] - difficulty[:, None] + noise > 0
    trap = rng.random((n_examples, n)) < 0.6
    other = rng.integers(2, 5, (n_examples, n))
    return np.where(right, 0, np.where(trap, 1, other))


def vote_table(classes: np.ndarray) -> np.ndarray:
    """v_e(S) for every coalition bitmask and example: (2^n, examples)."""
    n_examples, n = classes.shape
    members = np.arange(n)
    return np.stack([vote_values(c, members, n, (c == 0).astype(float), 0.0, 0.0) for c in classes], axis=1)


def debate_table(classes: np.ndarray, seed: int, persuasion: float = 0.35) -> np.ndarray:
    """The debate game's v_e(S) for every coalition bitmask and example: (2^n, examples).

    In the revision round a wrong member of S is persuaded by S's right members (each persuades with
    probability `persuasion`), else it adopts S's first-round majority answer with a probability that grows
    with its weakness, else it keeps its answer; the revised answers are voted on (ties: pool order). Draws
    are fixed per (question, member), so v is a function of S.
    """
    n_examples, n = classes.shape
    rng = np.random.default_rng([seed, n, 1])
    draws = rng.random((2, n_examples, n))
    conform = np.linspace(0.2, 0.8, n)
    masks = np.arange(1 << n)
    members = np.arange(n)
    present = ((masks[:, None] >> members) & 1).astype(bool)  # (2^n, n)
    out = np.empty((1 << n, n_examples))
    for e in range(n_examples):
        c = classes[e]
        right = c == 0
        winner = vote_values(c, members, n, c.astype(float), -1.0, -1.0).astype(np.int64)
        k_right = present[:, right].sum(axis=1)
        persuaded = draws[0, e][None, :] < 1.0 - (1.0 - persuasion) ** k_right[:, None]
        conforms = draws[1, e][None, :] < conform[None, :]
        revised = np.where(right[None, :], 0, np.where(persuaded, 0, np.where(conforms, winner[:, None], c)))
        counts = np.zeros((1 << n, 5), dtype=np.int64)
        first = np.full((1 << n, 5), n)
        for i in reversed(range(n)):  # the first present member giving a class wins a tie
            rows = np.nonzero(present[:, i])[0]
            counts[rows, revised[rows, i]] += 1
            first[rows, revised[rows, i]] = i
        win = (counts * (n + 1) + (n - first)).argmax(axis=1)
        out[:, e] = (win == 0) & (counts[masks, win] > 0)
        out[0, e] = 0.0
    return out


def debate_calls(masks: set[int] | list[int], n_examples: int) -> int:
    """Distinct calls of a set of coalitions in the debate: later rounds per member of each coalition, first
    answers once per member that appears."""
    masks = set(masks)
    later = sum(m.bit_count() for m in masks) * (ROUNDS - 1)
    first = bin(np.bitwise_or.reduce(np.array(list(masks) or [0]))).count("1")
    return (later + first) * n_examples


def _present(n: int) -> np.ndarray:
    """(2^n, n): whether member i is in coalition bitmask m."""
    return ((np.arange(1 << n)[:, None] >> np.arange(n)) & 1).astype(bool)


def weighted_table(n: int, n_examples: int, seed: int) -> np.ndarray:
    """A weighted vote whose members come in three families that make the same mistakes.

    Each family shares most of its per-question noise and, when wrong, its trap answer (members trained on
    the same data); skills are shuffled over the pool, and each member's vote weighs its log-odds of being
    right (a confidence-weighted vote), so a strong family can outvote a larger weak one.
    """
    rng = np.random.default_rng([seed, n, 2])
    family = np.arange(n) % 3
    skill = rng.permutation(np.linspace(1.4, -0.6, n))
    difficulty = rng.normal(0.0, 1.0, n_examples)
    shared = rng.normal(0.0, 1.0, (n_examples, 3))[:, family]
    noise = 0.85 * shared + 0.5 * rng.normal(0.0, 1.0, (n_examples, n))
    right = skill[None, :] - difficulty[:, None] + noise > 0
    trap = 1 + rng.integers(0, 2, (n_examples, 3))[:, family]  # a family's wrong answer: 1 or 2
    stray = rng.random((n_examples, n)) < 0.25
    classes = np.where(right, 0, np.where(stray, rng.integers(3, 6, (n_examples, n)), trap))
    accuracy = np.clip(right.mean(axis=0), 0.05, 0.95)
    weight = np.log(accuracy / (1.0 - accuracy)) + 3.0  # positive; ties between sums have probability 0
    present = _present(n)
    out = np.empty((1 << n, n_examples))
    for e in range(n_examples):
        totals = (present * weight) @ np.eye(6)[classes[e]]  # (2^n, classes): the weight behind each answer
        out[:, e] = totals.argmax(axis=1) == 0
    out[0] = 0.0
    return out


def judge_table(n: int, n_examples: int, seed: int) -> np.ndarray:
    """ "The most confident member answers": a judge takes the answer of the member of S that states the
    highest confidence. Confidence follows being right only loosely, and some weak members are overconfident
    (a bias per member), so a member's worth depends on whom it outranks, not on a count of right members."""
    rng = np.random.default_rng([seed, n, 3])
    skill = rng.permutation(np.linspace(1.5, -1.0, n))
    difficulty = rng.normal(0.0, 1.0, n_examples)
    right = skill[None, :] - difficulty[:, None] + 0.9 * rng.normal(0.0, 1.0, (n_examples, n)) > 0
    bias = rng.normal(0.0, 0.8, n)
    confidence = 1.2 * right + bias[None, :] + rng.normal(0.0, 0.7, (n_examples, n))
    masks = np.arange(1 << n)
    out = np.zeros((1 << n, n_examples))
    for e in range(n_examples):
        answered = np.zeros(1 << n, dtype=bool)
        for i in np.argsort(-confidence[e]):  # the most confident present member answers
            takes = ~answered & ((masks >> i) & 1).astype(bool)
            out[takes, e] = right[e, i]
            answered |= takes
    return out


def cover_table(n: int, n_examples: int, seed: int) -> np.ndarray:
    """A two-skill cover: a question is solved when some member of S can do its first step (skill A) and
    some member its second (skill B). Half the pool are A specialists, half B, a few have a little of both;
    each member's skill varies with the question. Few members solve a question alone, so "right alone" says
    little about what a member adds."""
    rng = np.random.default_rng([seed, n, 4])
    lean = rng.permutation(np.linspace(-1.0, 1.0, n))  # -1: all A, +1: all B
    level = rng.uniform(-0.8, 0.6, n)
    hard = rng.normal(0.0, 1.0, (n_examples, 2))
    logit_a = level - 1.6 * lean - hard[:, [0]] + rng.normal(0.0, 0.8, (n_examples, n))
    logit_b = level + 1.6 * lean - hard[:, [1]] + rng.normal(0.0, 0.8, (n_examples, n))
    has_a, has_b = logit_a > 0.5, logit_b > 0.5
    present = _present(n).astype(np.int64)
    return (((present @ has_a.T) > 0) & ((present @ has_b.T) > 0)).astype(float)


def router_table(n: int, n_examples: int, seed: int) -> np.ndarray:
    """A router: each question has one of four topics, and the router sends it to the member of S it rates
    best on that topic; the answer is that member's. Members are specialists (a skill per topic), and the
    router's ratings are its own noisy estimates of those skills, so it sometimes routes to a worse member and
    a member adds value only on the topics where it is (rated) the best present."""
    rng = np.random.default_rng([seed, n, 5])
    topic = rng.integers(0, 4, n_examples)
    skill = rng.normal(0.0, 1.0, (4, n)) + np.linspace(0.8, -0.8, n)[None, :]
    rating = skill + rng.normal(0.0, 0.7, (4, n))
    difficulty = rng.normal(0.0, 1.0, n_examples)
    right = skill[topic] - difficulty[:, None] + 0.6 * rng.normal(0.0, 1.0, (n_examples, n)) > 0
    masks = np.arange(1 << n)
    out = np.zeros((1 << n, n_examples))
    for e in range(n_examples):
        answered = np.zeros(1 << n, dtype=bool)
        for i in np.argsort(-rating[topic[e]]):  # the best-rated present member answers
            takes = ~answered & ((masks >> i) & 1).astype(bool)
            out[takes, e] = right[e, i]
            answered |= takes
    return out


def moa_table(n: int, n_examples: int, seed: int) -> np.ndarray:
    """Mixture of agents: the member of S with the best aggregation skill aggregates, the others propose. The
    aggregator is right with a probability that rises with its own skill and with the lead of right over wrong
    proposals (a proposal is a member's first answer); alone, a member gives its own answer. A good aggregator
    with good proposers is worth far more than either, and a strong aggregator raises what weak proposers add."""
    rng = np.random.default_rng([seed, n, 6])
    skill = rng.permutation(np.linspace(1.2, -1.0, n))
    aggregation = rng.permutation(np.linspace(1.0, -1.0, n))
    difficulty = rng.normal(0.0, 1.0, n_examples)
    right = skill[None, :] - difficulty[:, None] + 0.8 * rng.normal(0.0, 1.0, (n_examples, n)) > 0
    draw = rng.random(n_examples)
    present = _present(n)
    aggregator = np.where(present, aggregation[None, :], -np.inf).argmax(axis=1)  # (2^n,)
    out = np.zeros((1 << n, n_examples))
    sizes = present.sum(axis=1)
    for e in range(n_examples):
        signs = np.where(right[e], 1.0, -1.0)
        lead = present @ signs - signs[aggregator]  # right minus wrong proposals (the aggregator excluded)
        logit = 0.8 * aggregation[aggregator] - difficulty[e] + 0.9 * lead
        out[:, e] = np.where(sizes == 1, right[e, aggregator], 1.0 / (1.0 + np.exp(-logit)) > draw[e])
    out[0] = 0.0
    return out


def pipeline_table(n: int, n_examples: int, seed: int) -> np.ndarray:
    """Strong complementarity: a question needs a plan, code and a check, three roles held by a third of the
    pool each; it is solved when S holds a member of every role able to do its step on that question. No
    member solves anything alone and no pair of one role does, so "right alone" is always 0 and a member's
    worth lies entirely in the coalitions that hold the other two roles."""
    rng = np.random.default_rng([seed, n, 7])
    role = rng.permutation(np.arange(n) % 3)
    level = rng.normal(0.0, 0.7, n)
    hard = rng.normal(0.0, 1.0, (n_examples, 3))
    able = level[None, :] - hard[:, role] + 0.8 * rng.normal(0.0, 1.0, (n_examples, n)) > 0  # (examples, n)
    present = _present(n).astype(np.int64)
    solved = np.ones((1 << n, n_examples), dtype=bool)
    for r in range(3):
        solved &= present[:, role == r] @ able[:, role == r].T > 0
    return solved.astype(float)


GAMES = ("vote", "debate", "weighted", "judge", "cover", "router", "moa", "pipeline")


def game_table(game: str, n: int, n_examples: int, seed: int) -> np.ndarray:
    """v_e(S) of every coalition bitmask and example of a game of `GAMES`: (2^n, examples)."""
    if game in ("vote", "debate"):
        classes = first_answers(n, n_examples, seed)
        return vote_table(classes) if game == "vote" else debate_table(classes, seed)
    tables = {
        "weighted": weighted_table, "judge": judge_table, "cover": cover_table, "router": router_table,
        "moa": moa_table, "pipeline": pipeline_table,
    }  # fmt: skip
    return tables[game](n, n_examples, seed)


# --- estimators: each (table, n, budget, seed) -> (values (n,), coalitions evaluated as bitmasks) ------------


def coalition_calls(seen: int, examples: int, mask: int) -> float:
    """New debate calls of one more coalition: its later rounds, and first answers of members not seen yet."""
    return (mask.bit_count() * (ROUNDS - 1) + (mask & ~seen).bit_count()) * examples


def stratified_run(
    table: np.ndarray,
    n: int,
    seed: int,
    *,
    budget: int | None = None,
    calls: bool = False,
    target_error: float | None = None,
    control_variate: bool | None = None,
    surrogate: bool | None = None,
    simultaneous: bool = False,
) -> tuple[StratifiedEstimate, set[int]]:
    """The stratified estimator until its budget (coalitions, or debate calls with `calls`) or target error:
    (the last estimate, the coalitions it evaluated). `control_variate`, `surrogate`: None lets the estimator
    choose from the held coalitions (the package's default); True / False forces one on / off."""
    examples = table.shape[1]
    sampler = StratifiedSampler(
        n, seed=seed, target_error=target_error, max_coalitions=None if calls else budget,
        simultaneous=simultaneous,
    )  # fmt: skip
    held = sampler.held
    spend = math.inf if budget is None else budget
    while True:
        est = stratified_shapley(n, held, table[held], control_variate=control_variate, surrogate=surrogate)
        if sampler.stop(est):
            break
        if calls:
            seen = int(np.bitwise_or.reduce(np.array(held)))
            new = sampler.next_batch(
                est,
                spend=spend - debate_calls(held, examples),
                cost_of=partial(coalition_calls, seen, examples),
            )
        else:
            new = sampler.next_batch(est, spend=spend - len(held))
        if not new:
            break
    return est, set(held)


def ours(
    table: np.ndarray,
    n: int,
    budget: int,
    seed: int,
    *,
    calls: bool = False,
    control_variate: bool | None = None,
    surrogate: bool | None = None,
) -> tuple[np.ndarray, set[int]]:
    """The stratified estimator (its adjustments chosen per game unless forced); budget in coalitions or
    calls."""
    est, held = stratified_run(
        table, n, seed, budget=budget, calls=calls, control_variate=control_variate, surrogate=surrogate
    )
    return est.values, held


def permutations_old(table: np.ndarray, n: int, budget: int, seed: int) -> tuple[np.ndarray, set[int]]:
    """This package's former sampler: the permutations `plan_coalitions` draws (antithetic pairs), the mean
    marginal gain along them (what `estimate` computed, here on bitmasks to keep the bench quick)."""
    players = [f"p{i}" for i in range(n)]
    plan = plan_coalitions(players, "sampled", budget=budget, seed=seed)
    index = {p: i for i, p in enumerate(players)}
    orders = np.array([[index[p] for p in order] for order in plan.permutations])  # (P, n)
    prefixes = np.concatenate(
        [np.zeros((len(orders), 1), dtype=np.int64), np.cumsum(1 << orders, axis=1)], axis=1
    )
    means = table.mean(axis=1)
    gains = np.diff(means[prefixes], axis=1)  # (P, n): the gain of the member joining at each step
    values = np.zeros(n)
    np.add.at(values, orders, gains)
    masks = {sum(1 << index[p] for p in c) for c in plan.coalitions}
    if plan.complete or plan.exhaustive:
        return exact_shapley_table(table).mean(axis=0), masks
    return values / len(orders), masks


SHAPIQ_NAMES = (
    "SVARM", "KernelSHAP (paired)", "LeverageSHAP", "RegressionMSR", "OddSHAP", "ProxySHAP",
    "StratifiedSamplingSV", "PermutationSamplingSV",
)  # fmt: skip
# Run only when named in --only: the permutation samplers (far behind at n = 12, and slow to bisect).
NOT_BY_DEFAULT = ("StratifiedSamplingSV", "PermutationSamplingSV", "ours before")


def shapiq_estimator(name: str, control_variate: bool) -> Callable[..., tuple[np.ndarray, set[int]]] | None:
    """shapiq's estimator `name` as (table, n, budget, seed) -> (values, coalitions asked); None without
    shapiq or where this shapiq has no such class.

    Plain, it sees the mean game v(S) only. With `control_variate` it gets the per-example information ours
    gets, used exactly as ours uses it: it runs on the residual game v - g, with g this package's control
    variate (`ControlVariate`) fitted on the (coalition, example) values of the coalitions it asked and the
    singletons (which give each member's type on each example, and count as asked), and g's exact Shapley
    values are added back. Every shapiq estimator here asks for its coalitions in one call, before it sees a
    value, so g is fitted on everything it asked, as ours refits it on everything held.
    """
    try:
        import shapiq
    except ImportError:
        return None
    makers = {
        "SVARM": lambda n, s: shapiq.SVARM(n=n, random_state=s),
        "KernelSHAP (paired)": lambda n, s: shapiq.KernelSHAP(n=n, pairing_trick=True, random_state=s),
        "StratifiedSamplingSV": lambda n, s: shapiq.StratifiedSamplingSV(n=n, random_state=s),
        "PermutationSamplingSV": lambda n, s: shapiq.PermutationSamplingSV(n=n, random_state=s),
        # shapiq 1.8: Leverage SHAP (Musco and Witter 2025), regression-adjusted MSR with an XGBoost proxy
        # (Witter et al. 2025), OddSHAP (odd Fourier regression with a tree surrogate), and ProxySHAP (the
        # XGBoost proxy's Shapley values read out exactly, without RegressionMSR's residual adjustment).
        "LeverageSHAP": lambda n, s: shapiq.LeverageSHAP(n=n, random_state=s),
        "RegressionMSR": lambda n, s: shapiq.RegressionMSR(n=n, index="SV", random_state=s),
        "OddSHAP": lambda n, s: shapiq.OddSHAP(n=n, random_state=s),
        "ProxySHAP": lambda n, s: shapiq.ProxySHAP(n=n, index="SV", max_order=1, random_state=s),
    }
    if not hasattr(shapiq, name.split()[0]):
        return None
    make = makers[name]

    def run(table: np.ndarray, n: int, budget: int, seed: int) -> tuple[np.ndarray, set[int]]:
        asked: set[int] = set()
        weights = 1 << np.arange(n)
        added = np.zeros(n)

        def game(coalitions: np.ndarray) -> np.ndarray:
            nonlocal added
            masks = np.atleast_2d(coalitions).astype(np.int64) @ weights
            asked.update(int(m) for m in masks)
            if not control_variate:
                return table[masks].mean(axis=1)
            asked.update(1 << i for i in range(n))
            held = sorted(asked)
            control = ControlVariate.fit(n, held, table[held])
            added = control.shapley().mean(axis=0)
            return (table[masks] - control.values(masks)).mean(axis=1)

        with warnings.catch_warnings():  # sklearn / xgboost chatter on tiny fits
            warnings.simplefilter("ignore")
            values = make(n, seed).approximate(budget, game)
        return np.array([values[(i,)] for i in range(n)]) + added, asked

    return run


# --- the search ---------------------------------------------------------------------------------------------


def passes(estimates: np.ndarray, exact: np.ndarray, target: str) -> bool:
    if target == "max_error":
        return float(np.abs(estimates - exact).max()) < 0.01
    names = [str(i) for i in range(len(exact))]
    tau = rank_correlation(dict(zip(names, exact, strict=True)), dict(zip(names, estimates, strict=True)))[
        "kendall"
    ]
    return tau is not None and tau > 1 - 1e-9


def probe(run, exact, budget: int, runs: int, target: str, cost) -> tuple[bool, float]:
    """(at least 90% of runs pass, the 90th percentile of their cost)."""
    allowed = runs - math.ceil(0.9 * runs)
    failures, costs = 0, []
    for seed in range(runs):
        values, masks = run(budget, seed)
        costs.append(cost(masks))
        if not passes(values, exact, target):
            failures += 1
            if failures > allowed:
                return False, float(np.quantile(costs, 0.9))
    return True, float(np.quantile(costs, 0.9))


def smallest_budget(run, exact, grid: list[int], runs: int, target: str, cost) -> dict:
    """The smallest budget of `grid` that passes: doubling the grid index from the cheapest budget until one
    passes, then bisecting below it (a failing probe stops early, so failures are cheap)."""
    failed, index = -1, 0
    while True:
        ok, spent = probe(run, exact, grid[index], runs, target, cost)
        if ok:
            break
        if index == len(grid) - 1:
            return {"budget": None, "cost": None, "note": f"not reached at {grid[-1]}"}
        failed, index = index, min(len(grid) - 1, 2 * index + 1)
    best = (grid[index], spent)
    lo, hi = failed + 1, index
    while lo < hi:
        mid = (lo + hi) // 2
        ok, spent = probe(run, exact, grid[mid], runs, target, cost)
        if ok:
            hi, best = mid, (grid[mid], spent)
        else:
            lo = mid + 1
    return {"budget": best[0], "cost": best[1]}


def geometric(low: int, high: int, ratio: float = 1.12) -> list[int]:
    grid = [low]
    while grid[-1] < high:
        grid.append(min(high, max(grid[-1] + 1, int(grid[-1] * ratio))))
    return grid


OURS = "ours: stratified with adjustments chosen per game"
OURS_CV = "ours (issue 32): stratified + control variate"
OURS_SURROGATE = "ours: stratified + control variate + surrogate (forced)"
OURS_PLAIN = "ours: stratified with no adjustment"
OURS_CALLS = "ours: stratified with adjustments chosen per game by calls"
OURS_BEFORE = "ours before: antithetic permutations"
PLAIN, WITH_CONTROL = "", " + control variate"


def estimators_for(table: np.ndarray, n: int, game: str, examples: int) -> dict:
    """Estimator name -> (run(budget, seed), budget grid, budget unit) on one game."""
    total = 1 << n
    first_batch = len(warmup_masks(n, 0))
    estimators: dict[str, tuple[Callable, list[int], str]] = {
        OURS: (partial(ours, table, n), geometric(first_batch, total), "coalitions"),
        OURS_CV: (
            partial(ours, table, n, control_variate=True, surrogate=False),
            geometric(first_batch, total),
            "coalitions",
        ),
        OURS_SURROGATE: (
            partial(ours, table, n, control_variate=True, surrogate=True),
            geometric(first_batch, total),
            "coalitions",
        ),
        OURS_PLAIN: (
            partial(ours, table, n, control_variate=False, surrogate=False),
            geometric(first_batch, total),
            "coalitions",
        ),
        OURS_BEFORE: (partial(permutations_old, table, n), geometric(2, 4 * total), "permutations"),
    }
    if game == "debate":
        full = debate_calls(range(total), examples)
        # The grid starts at the first batch's calls: a smaller budget still holds the first batch.
        first_calls = debate_calls(warmup_masks(n, 0), examples)
        estimators[OURS_CALLS] = (
            partial(ours, table, n, calls=True), geometric(first_calls, full, ratio=1.05), "calls"
        )  # fmt: skip
    for name in SHAPIQ_NAMES:
        for suffix in (PLAIN, WITH_CONTROL):
            fn = shapiq_estimator(name, control_variate=suffix == WITH_CONTROL)
            if fn is not None:
                estimators[f"shapiq {name}{suffix}"] = (
                    partial(fn, table, n),
                    geometric(n + 2, total),
                    "coalitions",
                )
    return estimators


def coverage(table: np.ndarray, n: int, runs: int) -> list[dict]:
    """How often ours's sampling intervals hold the exact values: each member's (the per-member 95% interval,
    over (run, member) pairs), and all members at once (over runs) with the per-member intervals and with the
    simultaneous ones (`critical_value`), at a few budgets and target errors. `needed_z`: the 95th percentile
    over runs of max over members of |error| / standard error, the z a simultaneous interval needs here."""
    exact = exact_shapley_table(table).mean(axis=0)
    first_batch = len(warmup_masks(n, 0))
    z_member, z_all = critical_value(n, False), critical_value(n, True)
    settings = {
        "first batch": {"budget": first_batch},
        "twice the first batch": {"budget": 2 * first_batch},
        "500 coalitions": {"budget": 500},
        "target 0.01 (per member)": {"target_error": 0.01},
        "target 0.01 (simultaneous)": {"target_error": 0.01, "simultaneous": True},
    }
    rows = []
    for setting, options in settings.items():
        started = time.process_time()
        ratios, sizes = [], []
        for seed in range(runs):
            est, held = stratified_run(table, n, seed, **options)  # type: ignore[arg-type]
            ratios.append(np.abs(est.values - exact) / np.maximum(est.standard_error, 1e-12))
            sizes.append(len(held))
        ratio = np.array(ratios)  # (runs, n)
        rows.append({
            "setting": setting,
            "coalitions_mean": round(float(np.mean(sizes)), 1),
            "member": round(float((ratio <= z_member).mean()), 3),
            "all_members_per_member_intervals": round(float((ratio <= z_member).all(axis=1).mean()), 3),
            "all_members_simultaneous": round(float((ratio <= z_all).all(axis=1).mean()), 3),
            "needed_z": round(float(np.quantile(ratio.max(axis=1), 0.95)), 2),
            "cpu_s": round(time.process_time() - started, 1),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", default="12")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--games", default=",".join(GAMES))
    parser.add_argument("--targets", default="max_error")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only", default="", help="comma-separated names: run only these estimators (default: all but the "
        "permutation samplers)",
    )  # fmt: skip
    parser.add_argument("--coverage", type=int, default=0, help="runs of the interval coverage (0: none)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if shapiq_estimator("SVARM", False) is None:
        print("shapiq is not installed: its estimators are skipped (see the module docstring)")
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    rows, covered = [], []
    for n, game in itertools.product(map(int, args.n.split(",")), args.games.split(",")):
        started = time.process_time()
        table = game_table(game, n, args.examples, args.seed)
        exact = exact_shapley_table(table).mean(axis=0)
        print(f"# {game} n={n}: game built in {time.process_time() - started:.1f}s CPU", flush=True)
        cost = partial(debate_calls, n_examples=args.examples) if game == "debate" else len
        for target in args.targets.split(",") if args.runs else []:
            for name, (run, grid, unit) in estimators_for(table, n, game, args.examples).items():
                if name not in only if only else any(part in name for part in NOT_BY_DEFAULT):
                    continue
                t = time.process_time()
                found = smallest_budget(run, exact, grid, args.runs, target, cost)
                row = {
                    "game": game, "n": n, "target": target, "estimator": name, "budget_unit": unit,
                    "budget": found["budget"], "calls" if game == "debate" else "coalitions": found["cost"],
                    "note": found.get("note"), "cpu_s": round(time.process_time() - t, 1),
                }  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
        if args.coverage:
            for row in coverage(table, n, args.coverage):
                covered.append({"game": game, "n": n, **row})
                print(json.dumps(covered[-1]), flush=True)
    if args.json:
        meta = {
            "date": datetime.date.today().isoformat(),
            "machine": platform.platform(),
            "python": platform.python_version(),
            "shapiq": _shapiq_version(),
            "runs": args.runs,
            "coverage_runs": args.coverage,
            "examples": args.examples,
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows, "coverage": covered}, indent=2) + "\n")
    return 0


def _shapiq_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("shapiq")
    except Exception:  # noqa: BLE001 - not installed
        return None


if __name__ == "__main__":
    raise SystemExit(main())
