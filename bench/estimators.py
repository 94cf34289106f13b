"""Shapley estimators on vote and debate games: coalitions and distinct calls to reach a target accuracy.

Run: ``python bench/estimators.py [--n 6,8,10,12,16] [--runs 60] [--examples 100] [--json PATH]``

shapiq is optional (its estimators are skipped without it) and is never a dependency of this package: it
pulls ~740 MB of numba and galois. To compare against it, run the bench with an interpreter that has it:

    python3 -m venv /tmp/venv-shapiq && /tmp/venv-shapiq/bin/pip install shapiq==1.4.1 numpy pydantic pyyaml rich typer
    PYTHONPATH=. /tmp/venv-shapiq/bin/python bench/estimators.py --json bench-estimators.json

Games (values of all 2^n coalitions computed once, so the exact Shapley values are known):

- **vote**: majority vote over `--examples` questions; member i is right with a probability that falls with
  i (skills evenly spread) and with the question's difficulty, plus a noise shared by every member of a
  question (correlated members); a wrong member gives the question's trap answer with probability 0.6 (so
  wrong members agree), else one of three others. v(S) is the mean over questions of the vote's correctness
  (ties: pool order), computed for every coalition with `colab_graphs.audit.answers.vote_values`. Treated as
  a black box: an estimator asks for v(S) of the coalitions it chooses (ours also gets the per-question
  values of those coalitions: that is what an audit's game returns).
- **debate**: the same first answers, then one revision round in which each member of S adopts S's
  first-round majority answer with a probability that grows with its weakness, then a vote. Distinct calls:
  a coalition costs |S| x 2 calls per question, except first-round answers, which depend only on the member
  and the question and are shared by every coalition (and made once).

For each estimator and game, the smallest budget at which at least 90% of `--runs` runs (seeds) reach the
target: max error < 0.01 over members, and Kendall tau = 1 (the exact ranking). Reported as coalitions
evaluated (all games) and distinct calls (debate). Estimators: this package's stratified estimator with its
control variate (`colab_graphs.audit.stratified`; on the debate it allocates by the calls each coalition
costs), its former permutation sampler (antithetic pairs), and shapiq 1.4.1's SVARM, KernelSHAP (paired),
StratifiedSamplingSV and PermutationSamplingSV. Each budget is found by bisection over a grid; a probe stops
as soon as more than 10% of its runs failed.
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
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from colab_graphs.audit.answers import vote_values  # noqa: E402
from colab_graphs.audit.estimators import plan_coalitions, rank_correlation  # noqa: E402
from colab_graphs.audit.stratified import (  # noqa: E402
    StratifiedSampler,
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


# --- estimators: each (table, n, budget, seed) -> (values (n,), coalitions evaluated as bitmasks) ------------


def coalition_calls(seen: int, examples: int, mask: int) -> float:
    """New debate calls of one more coalition: its later rounds, and first answers of members not seen yet."""
    return (mask.bit_count() * (ROUNDS - 1) + (mask & ~seen).bit_count()) * examples


def ours(table: np.ndarray, n: int, budget: int, seed: int, *, calls: bool) -> tuple[np.ndarray, set[int]]:
    """The stratified estimator with its control variate; budget in coalitions, or in debate calls."""
    examples = table.shape[1]
    sampler = StratifiedSampler(n, seed=seed, max_coalitions=None if calls else budget)
    held = sampler.held
    while True:
        est = stratified_shapley(n, held, table[held])
        if sampler.stop(est):
            break
        if calls:
            seen = int(np.bitwise_or.reduce(np.array(held)))
            new = sampler.next_batch(
                est,
                spend=budget - debate_calls(held, examples),
                cost_of=partial(coalition_calls, seen, examples),
            )
        else:
            new = sampler.next_batch(est, spend=budget - len(held))
        if not new:
            break
    return est.values, set(held)


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


def shapiq_estimator(name: str) -> Callable[..., tuple[np.ndarray, set[int]]] | None:
    try:
        import shapiq
    except ImportError:
        return None
    make = {
        "SVARM": lambda n, s: shapiq.SVARM(n=n, random_state=s),
        "KernelSHAP (paired)": lambda n, s: shapiq.KernelSHAP(n=n, pairing_trick=True, random_state=s),
        "StratifiedSamplingSV": lambda n, s: shapiq.StratifiedSamplingSV(n=n, random_state=s),
        "PermutationSamplingSV": lambda n, s: shapiq.PermutationSamplingSV(n=n, random_state=s),
    }[name]

    def run(table: np.ndarray, n: int, budget: int, seed: int) -> tuple[np.ndarray, set[int]]:
        means = table.mean(axis=1)
        asked: set[int] = set()
        weights = 1 << np.arange(n)

        def game(coalitions: np.ndarray) -> np.ndarray:
            masks = np.atleast_2d(coalitions).astype(np.int64) @ weights
            asked.update(int(m) for m in masks)
            return means[masks]

        values = make(n, seed).approximate(budget, game)
        return np.array([values[(i,)] for i in range(n)]), asked

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


def estimators_for(table: np.ndarray, n: int, game: str, examples: int, available: dict) -> dict:
    """Estimator name -> (run(budget, seed), budget grid, budget unit) on one game."""
    total = 1 << n
    estimators: dict[str, tuple[Callable, list[int], str]] = {
        "stratified + control variate (this package)": (
            partial(ours, table, n, calls=False),
            geometric(2 * n + 2, total),
            "coalitions",
        ),
        "permutations, antithetic (this package before)": (
            partial(permutations_old, table, n),
            geometric(2, 4 * total),
            "permutations",
        ),
    }
    if game == "debate":
        full = debate_calls(range(total), examples)
        # The grid starts at the first batch's calls: a smaller budget still holds the first batch.
        first_batch = debate_calls(warmup_masks(n, 0), examples)
        estimators["stratified + control variate, by calls (this package)"] = (
            partial(ours, table, n, calls=True),
            geometric(first_batch, full, ratio=1.05),
            "calls",
        )
    for name, fn in available.items():
        estimators[f"shapiq {name}"] = (partial(fn, table, n), geometric(n + 2, 8 * total), "coalitions")
    return estimators


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", default="6,8,10,12,16")
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--games", default="vote,debate")
    parser.add_argument("--targets", default="max_error,tau")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated substrings: run only estimators named so")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    shapiq_names = ["SVARM", "KernelSHAP (paired)", "StratifiedSamplingSV", "PermutationSamplingSV"]
    available = {name: fn for name in shapiq_names if (fn := shapiq_estimator(name)) is not None}
    if not available:
        print("shapiq is not installed: its estimators are skipped (see the module docstring)")
    rows = []
    for n, game in itertools.product(map(int, args.n.split(",")), args.games.split(",")):
        started = time.perf_counter()
        classes = first_answers(n, args.examples, args.seed)
        table = vote_table(classes) if game == "vote" else debate_table(classes, args.seed)
        exact = exact_shapley_table(table).mean(axis=0)
        build_s = time.perf_counter() - started
        cost = partial(debate_calls, n_examples=args.examples) if game == "debate" else len
        estimators = estimators_for(table, n, game, args.examples, available)
        for target in args.targets.split(","):
            for name, (run, grid, unit) in estimators.items():
                if args.only and not any(part in name for part in args.only.split(",")):
                    continue
                t = time.perf_counter()
                found = smallest_budget(run, exact, grid, args.runs, target, cost)
                row = {
                    "game": game, "n": n, "target": target, "estimator": name, "budget_unit": unit,
                    "budget": found["budget"], game == "debate" and "calls" or "coalitions": found["cost"],
                    "note": found.get("note"), "seconds": round(time.perf_counter() - t, 1),
                }  # fmt: skip
                if game == "debate" and found["budget"] is not None:
                    row["coalitions"] = found["budget"] if unit == "coalitions" else None
                rows.append(row)
                print(json.dumps(row), flush=True)
        print(f"# {game} n={n}: game built in {build_s:.1f}s", flush=True)
    if args.json:
        meta = {
            "date": datetime.date.today().isoformat(),
            "machine": platform.platform(),
            "python": platform.python_version(),
            "shapiq": _shapiq_version(),
            "runs": args.runs,
            "examples": args.examples,
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    return 0


def _shapiq_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("shapiq")
    except Exception:  # noqa: BLE001 - not installed
        return None


if __name__ == "__main__":
    raise SystemExit(main())
