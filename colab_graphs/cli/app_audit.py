"""`colab-graphs audit --app FILE.py:NAME`: the game of a user's own LangGraph app (see colab_graphs.audit.app)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from colab_graphs.cli.common import fail


def app_game_for(
    app: str,
    other: str | None,
    pool: Any,
    examples: Any,
    client: Any,
    scorer: str | None,
    out: Path | None,
    data: str | None,
    overwrite: bool,
) -> tuple[Any, Any, Path]:
    """(spec, game, folder) of an app audit (`--app`): the folder is `out` or audits/APP (cleared by
    --overwrite). Any problem with the app reference is a usage error naming it."""
    from colab_graphs.audit.app import AppError, AppGame, resolve_app

    if other:
        fail("give --app or a protocol (--protocol / --graph), not both")
    try:
        the_app, spec = resolve_app(app, pool.names)
        folder = out or Path("audits") / spec.name
        if overwrite and folder.exists():
            shutil.rmtree(folder)
        game = AppGame(
            the_app, spec, pool, examples, client=client, scorer=scorer, store=folder, dataset=data
        )
    except (AppError, ValueError) as err:
        fail(str(err))
        raise
    return spec, game, folder
