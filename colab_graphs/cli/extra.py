"""Commands beyond run/protocols/show/cache: audit, train, serve, models. Each imports its module lazily."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    for module in ("colab_graphs.cli.audit_cmd", "colab_graphs.cli.models_cmd", "colab_graphs.cli.train_cmd"):
        try:
            mod = __import__(module, fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        mod.register(app)
