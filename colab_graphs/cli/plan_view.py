"""The `--dry-run` table: an audit's (or a study's) planned calls, tokens and cost per member."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _calls(calls: int | None, calls_max: int | None) -> str:
    return f"{calls:,}" if calls is not None else f"<= {calls_max or 0:,}"


def _cost(cost: float | None) -> str:
    return "unknown" if cost is None else f"${cost:,.4f}"


def print_plan(plan: Any, path: Path | None = None, title: str | None = None) -> None:
    """Print `plan` (an `AuditPlan`, or a study's plan with the same fields) as a rich table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=title or f"plan: {plan.protocol} ({plan.estimator}) over {plan.n_examples} example(s)"
    )
    for column in ("member", "calls", "cached (free)", "prompt tokens", "completion tokens", "cost", "price"):
        table.add_column(column, justify="left" if column in ("member", "price") else "right")
    for name, m in plan.per_member.items():
        table.add_row(
            name,
            _calls(m.calls, m.calls_max),
            f"{m.cached:,}",
            f"{m.tokens.prompt:,} ({m.tokens_by})",
            f"{m.tokens.completion:,} ({m.completion})",
            _cost(m.cost_usd),
            m.price,
        )
    table.add_row(
        "[bold]total",
        _calls(plan.calls, plan.calls_max),
        f"{plan.cached:,}",
        f"{plan.tokens.prompt:,}",
        f"{plan.tokens.completion:,}",
        _cost(plan.cost_usd),
        "",
    )
    console = Console()
    console.print(table)
    coalitions = f"{plan.coalitions:,}" + (f" (up to {plan.coalitions_max:,})" if plan.coalitions_max else "")
    exact = "exact" if plan.calls is not None else "an upper bound (later calls depend on earlier replies)"
    console.print(
        f"coalitions played: {coalitions}; valued: {plan.coalitions_valued:,}; calls are {exact}; "
        f"to send: {'<= ' if plan.calls is None else ''}{plan.to_make:,}. No call was made."
    )
    for note in plan.notes:
        console.print(f"note: {note}")
    if path is not None:
        console.print(f"plan: {path}")


def print_study_plan(plan: Any, path: Path | None = None) -> None:
    """Print a study's plan (`study.plan.StudyDryRun`): a row per setting, then the study's totals."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"plan: {len(plan.settings)} audit setting(s)")
    for column in ("setting", "estimator", "coalitions", "calls", "cached (free)", "cost"):
        table.add_column(column, justify="left" if column in ("setting", "estimator") else "right")
    for key, setting in plan.settings.items():
        coalitions = f"{setting.coalitions:,}" + (
            f" (<= {setting.coalitions_max:,})" if setting.coalitions_max else ""
        )
        table.add_row(
            key, setting.estimator, coalitions, _calls(setting.calls, setting.calls_max), f"{setting.cached:,}",
            _cost(setting.cost_usd),
        )  # fmt: skip
    table.add_row(
        "[bold]study (distinct)",
        "",
        "",
        _calls(plan.calls, plan.calls_max),
        f"{plan.cached:,}",
        _cost(plan.cost_usd),
    )
    console = Console()
    console.print(table)
    console.print(
        f"tokens: {plan.tokens.prompt:,} prompt, {plan.tokens.completion:,} completion (estimated). No call was made."
    )
    for note in plan.notes:
        console.print(f"note: {note}")
    if path is not None:
        console.print(f"plan: {path}")
