"""Which estimator an audit uses and what it plays, decided before anything runs (for the run and its plan).

- **Computed from answers** (`exact_from_answers`): the protocol declares that its replies do not depend on
  the coalition (`colab_graphs.audit.answers`). Only the leave-one-out coalitions are played (they hold
  every distinct call); every coalition's value is computed from the answers, and Shapley is exact, whatever
  `method` says, while that costs under a few seconds of CPU (`answers.affordable`).
- **loo**: the grand coalition and each leave-one-out coalition.
- **exact**: all 2^n coalitions (refused above `max_exact_players` without `force`).
- **stratified** (`method="sampled"`, a budget in calls or coalitions, or a target error): stratified
  sampling with a control variate, batch after batch until the target sampling error, the budget, or all
  coalitions (`colab_graphs.audit.stratified`).
- **permutation** (`method="sampled"`, `budget_unit="permutations"`): the prefixes of `budget` random
  permutations (antithetic pairs), fixed up front; exact from the held values once they cover every coalition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from colab_graphs.audit import answers
from colab_graphs.audit.estimators import (
    Coalition,
    CoalitionPlan,
    Method,
    ordered_coalitions,
    plan_coalitions,
)
from colab_graphs.audit.stratified import members_of, warmup_masks
from colab_graphs.spec import GraphSpec

Estimator = Literal["loo", "exact", "exact_from_answers", "permutation", "stratified"]
BudgetUnit = Literal["calls", "coalitions", "permutations"]
BUDGET_UNITS: tuple[str, ...] = ("calls", "coalitions", "permutations")
# A sampled audit whose coalitions make no new calls (every request shared) is bounded by its CPU instead.
MAX_SAMPLED_COALITIONS = 4096
# Fewest permutations whose sampling interval covers at the stated level (tests/test_estimators.py).
MIN_PERMUTATIONS = 16


@dataclass(frozen=True)
class AuditStrategy:
    """What an audit will play and how it estimates.

    Attributes:
        method: the method asked for ("loo", "exact", "sampled").
        estimator: how Shapley values are obtained ("loo": none).
        plan: the coalitions played up front (for `stratified`, its first batch) and, for `permutation`, the
            permutations.
        answers_kind: "vote" or "aggregate" when values are computed from answers.
        budget, budget_unit, target_error, seed: the sampled estimator's stopping rule and seed.
        simultaneous: the sampling intervals (and the target error's stop) hold all members at once, not each
            member alone.
    """

    method: Method
    estimator: Estimator
    plan: CoalitionPlan
    answers_kind: str | None = None
    budget: int | None = None
    budget_unit: BudgetUnit = "calls"
    target_error: float | None = None
    seed: int = 0
    simultaneous: bool = False

    @property
    def players(self) -> tuple[str, ...]:
        return self.plan.players

    @property
    def coalitions(self) -> tuple[Coalition, ...]:
        return self.plan.coalitions


def choose_strategy(
    spec: GraphSpec,
    n_examples: int,
    method: Method,
    *,
    budget: int | None = None,
    budget_unit: BudgetUnit = "calls",
    target_error: float | None = None,
    seed: int = 0,
    simultaneous: bool = False,
    force: bool = False,
    max_exact_players: int = 12,
    from_answers: bool = True,
) -> AuditStrategy:
    """The strategy of an audit of `spec` over `n_examples` examples (see the module docstring).

    `from_answers=False` plays every coalition the method needs even where its value could be computed from
    the answers (the log then holds each coalition's conversation). `simultaneous`: a sampled estimate's
    intervals (and its target error) cover all members at once.

    Raises:
        ValueError: an unknown method or budget unit, a sampled audit without a budget or a target error, a
            budget below what the estimator's first batch needs, or exact Shapley over too many players.
    """
    players = list(spec.members)
    n = len(players)
    if budget_unit not in BUDGET_UNITS:
        raise ValueError(f"budget unit must be one of {', '.join(BUDGET_UNITS)}, got {budget_unit!r}")
    if target_error is not None and not target_error > 0:
        raise ValueError(f"target error must be positive, got {target_error}")
    kind = answers.answers_kind(spec) if from_answers else None
    if kind is not None and (answers.affordable(kind, n, n_examples) or (method == "exact" and force)):
        plan = plan_coalitions(players, "loo")
        return AuditStrategy(method, "exact_from_answers", plan, answers_kind=kind, seed=seed)
    if method == "loo":
        return AuditStrategy(method, "loo", plan_coalitions(players, "loo"), seed=seed)
    if method == "exact":
        plan = plan_coalitions(players, "exact", max_exact_players=max_exact_players, force=force)
        return AuditStrategy(method, "exact", plan, seed=seed)
    if method != "sampled":
        plan_coalitions(players, method)  # raises the unknown-method error
    if budget_unit == "permutations":
        if budget is None or budget < MIN_PERMUTATIONS:
            raise ValueError(
                f"sampled Shapley by permutations needs a budget of at least {MIN_PERMUTATIONS} permutations "
                f"(fewer give a sampling interval that does not cover), got budget={budget}"
            )
        if simultaneous:
            # Measured: at 128 permutations its Bonferroni intervals held all 8 members of a weighted voting
            # game at once in 33 of 40 runs; the rarely pivotal members' errors are too skewed for that tail.
            raise ValueError(
                "simultaneous intervals are the stratified estimator's (a budget in calls or coalitions, or a "
                "target error), not the permutation sampler's: its rarely pivotal members' errors are too "
                "skewed for the tail a simultaneous interval needs"
            )
        plan = plan_coalitions(players, "sampled", budget=budget, seed=seed)
        return AuditStrategy(method, "permutation", plan, budget=budget, budget_unit=budget_unit, seed=seed)
    if budget is None and target_error is None:
        raise ValueError(
            "sampled Shapley needs a budget (--budget, in calls or coalitions) or a --target-error"
        )
    warmup = warmup_masks(n, seed)
    if budget is not None and budget_unit == "coalitions" and budget < len(warmup):
        raise ValueError(
            f"a budget of {budget} coalitions is below the {len(warmup)} the stratified estimator's first batch "
            f"needs for {n} members (the leave-one-out ones, the singletons, and each middle size with and "
            "without every member)"
        )
    if budget is not None and budget < 1:
        raise ValueError(f"budget must be positive, got {budget}")
    coalitions = [members_of(m, players) for m in warmup]
    plan = CoalitionPlan(
        tuple(players), "sampled", ordered_coalitions(coalitions, players), seed=seed, budget=budget
    )
    return AuditStrategy(
        method, "stratified", plan, budget=budget, budget_unit=budget_unit, target_error=target_error,
        seed=seed, simultaneous=simultaneous,
    )  # fmt: skip
