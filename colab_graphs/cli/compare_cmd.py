"""`colab-graphs compare A B`: two runs or two audits side by side (`colab_graphs.audit.compare`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from colab_graphs.cli.common import fail

SHOWN = 20  # changed examples listed in the terminal (--json has them all)


def compare(
    a: Annotated[Path, typer.Argument(help="A run or audit folder (the baseline).")],
    b: Annotated[Path, typer.Argument(help="A folder of the same kind to compare with it.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Compare two runs or two audits: scores, members' values, calls and cost side by side, and the examples
    whose score changed (B - A). Exit 2 when they cannot be compared."""
    from colab_graphs.audit.compare import CompareError, compare_folders
    from colab_graphs.log import LogError

    try:
        result = compare_folders(a, b)
    except (CompareError, LogError) as err:
        fail(str(err))
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    _print(result)


def _fmt(v: float | int | None, signed: bool = False) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return f"{v:+d}" if signed else str(v)
    return f"{v:+.3f}" if signed else f"{v:.3f}"


def _cost(v: float | None, signed: bool = False) -> str:
    return "unknown" if v is None else (f"{v:+.4f}" if signed else f"${v:.4f}")


def _print(result) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    a, b = result.a, result.b
    table = Table(title=f"{result.kind}s compared: A = {a.path}, B = {b.path}")
    for column in ("", "A", "B", "B - A"):
        table.add_column(column, justify="left" if not column else "right")
    score = "score" if result.kind == "run" else "v(all members)"
    table.add_row("protocol", a.protocol or "-", b.protocol or "-", "")
    table.add_row(score, _fmt(a.score), _fmt(b.score), _fmt(result.score_delta, True))
    table.add_row("examples (failed)", f"{a.n_examples} ({a.failed})", f"{b.n_examples} ({b.failed})", "")
    for key in ("made", "cached", "failed"):
        x, y = a.calls.get(key), b.calls.get(key)
        diff = None if x is None or y is None else y - x
        table.add_row(f"calls {key}", _fmt(x), _fmt(y), _fmt(diff, True))
    cost_delta = None if a.cost_usd is None or b.cost_usd is None else b.cost_usd - a.cost_usd
    table.add_row("cost", _cost(a.cost_usd), _cost(b.cost_usd), _cost(cost_delta, True))
    console.print(table)
    if result.members:
        members = Table(title="members: A | B | B - A")
        members.add_column("member")
        for measure in ("individual", "loo", "shapley", "calls"):
            members.add_column(measure, justify="right")
        for row in result.members:
            cells = []
            for measure in ("individual", "loo", "shapley", "calls"):
                signed = measure in ("loo", "shapley")
                x, y, d = row.a.get(measure), row.b.get(measure), row.delta.get(measure)
                cells.append(f"{_fmt(x, signed)} | {_fmt(y, signed)} | {_fmt(d, True)}")
            members.add_row(row.member, *cells)
        console.print(members)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    extra = [f"only in A: {len(result.only_in_a)}"] if result.only_in_a else []
    extra += [f"only in B: {len(result.only_in_b)}"] if result.only_in_b else []
    console.print(
        f"{len(result.changed)} of {result.shared_examples} shared example(s) changed score"
        + (f" ({'; '.join(extra)})" if extra else ""),
        highlight=False,
    )
    for change in result.changed[:SHOWN]:
        console.print(
            f"  {change.id}: {_fmt(change.a['score'])} -> {_fmt(change.b['score'])}  (gold {change.gold!r}; "
            f"A predicted {change.a['prediction']!r}, B {change.b['prediction']!r})",
            highlight=False,
            markup=False,
        )
    if len(result.changed) > SHOWN:
        console.print(f"  ... and {len(result.changed) - SHOWN} more (--json lists them all)")


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
