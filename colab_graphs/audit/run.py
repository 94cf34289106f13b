"""`play_audit`: plan the coalitions, play the game, estimate, and write the report."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from colab_graphs.audit.estimators import Method, plan_coalitions
from colab_graphs.audit.game import CoalitionGame, Play
from colab_graphs.audit.plots import plots_available, write_plots
from colab_graphs.audit.report import (
    AuditReport,
    CoalitionUsage,
    MemberUsage,
    TokenCount,
    contribution_fields,
    write_report,
)
from colab_graphs.data.example import Example
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocols.fitting import fitting_summary
from colab_graphs.spec import GraphSpec


class AuditError(RuntimeError):
    pass


async def play_audit(
    spec: GraphSpec,
    pool: Pool,
    examples: Sequence[Example],
    *,
    client: ModelClient,
    method: Method = "loo",
    budget: int | None = None,
    seed: int = 0,
    scorer: str | None = None,
    out: str | Path | None = None,
    dataset: str | None = None,
    force: bool = False,
    individual: bool = True,
    plots: bool | None = None,
    on_plan: Callable[[int], None] | None = None,
    on_progress: Callable[[Play], None] | None = None,
    game: CoalitionGame | None = None,
) -> AuditReport:
    """Audit each member's contribution to `spec` on `examples`; write the report under `out` when given.

    Args:
        method: "loo" (n + 1 coalitions), "exact" (2^n) or "sampled" (`budget` permutations).
        individual: also run each member alone (`solo`) for its individual strength.
        plots: draw PNGs (default: when matplotlib is installed).
        on_plan: called with the number of (coalition, example) runs planned, for a progress bar.
        game: the game to play instead of the protocol's own (an app's: `colab_graphs.audit.app.AppGame`,
            whose `spec` is then the one given here).
    """
    started = time.perf_counter()
    players = list(spec.members)
    plan = plan_coalitions(players, method, budget=budget, seed=seed, force=force)
    game = game or CoalitionGame(
        spec, pool, examples, client=client, scorer=scorer, store=out, dataset=dataset
    )
    solo_members = players if individual else []
    if on_plan:
        on_plan((len(plan.coalitions) + len(solo_members)) * len(examples))
    await game.evaluate(plan.coalitions, solo_members, on_progress)

    failed = game.failed_examples()
    if len(failed) == len(examples):
        raise AuditError(
            f"every example failed (first error: {_first_error(game)}); no contribution can be estimated"
        )
    values = game.values(plan.coalitions, exclude=failed)
    solo = game.solo_values(solo_members, exclude=failed) if individual else None
    fields = contribution_fields(plan, values, solo, seed=seed)
    acct = game.accounting()
    usage = {
        m: MemberUsage(
            calls=u["calls"],
            tokens=TokenCount(prompt=u["prompt"], completion=u["completion"]),
            cost_usd=u["cost_usd"],
        )
        for m, u in acct["per_member"].items()
    }
    per_coalition = [
        CoalitionUsage(
            members=pc["members"],
            calls=pc["calls"],
            tokens=TokenCount(prompt=pc["prompt"], completion=pc["completion"]),
            cost_usd=pc["cost_usd"],
        )
        for pc in acct["per_coalition"].values()
        if pc["game"] == "coalition"
    ]
    costs = [u.cost_usd for u in usage.values()]
    # Protocols whose coalitions are fitted first (weight merges, searches on dev) report what that cost.
    fitting = {"fitting": fitting_summary(f.record for f in game.fits.values())} if game.fits else {}
    report = AuditReport(
        protocol=spec.name,
        protocol_params=spec.params,
        players=players,
        scorer=scorer,
        dataset=dataset,
        failed_examples=failed,
        calls=acct["calls"],
        tokens=TokenCount(
            prompt=sum(u.tokens.prompt for u in usage.values()),
            completion=sum(u.tokens.completion for u in usage.values()),
        ),
        cost_usd=None if any(c is None for c in costs) else sum(costs),  # type: ignore[arg-type]
        cost_saved_usd=acct["cost_saved_usd"],
        usage=usage,
        per_coalition=per_coalition,
        wall_s=round(time.perf_counter() - started, 3),
        **fields,
        **fitting,
    )
    if out is not None:
        images = write_plots(report, out) if (plots_available() if plots is None else plots) else {}
        write_report(report, out, images=images)
    return report


def _first_error(game: CoalitionGame) -> Any:
    return next((p.error for p in game.plays.values() if p.failed), None)
