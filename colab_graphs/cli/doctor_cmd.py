"""`colab-graphs doctor`: what this machine gives the code sandbox (`colab_graphs.sandbox.doctor`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the findings as JSON (for tools).")] = False,
) -> None:
    """Say which sandbox backends this machine gives code scores, which `auto` picks, and the interpreter.

    Exits 0 when a safe backend exists (code-scored runs can go ahead), 6 when none does (they are refused).
    """
    from colab_graphs.sandbox import doctor as sandbox_doctor
    from colab_graphs.sandbox.scope import EXIT_CODE

    found = sandbox_doctor.diagnose()
    if as_json:
        typer.echo(json.dumps(found, indent=2))
    else:
        for line in sandbox_doctor.render(found):
            typer.echo(line)
    if not sandbox_doctor.safe_backend(found):
        raise typer.Exit(EXIT_CODE)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
