"""`colab-graphs audit --app FILE.py:NAME`: the game of a user's own LangGraph app (see colab_graphs.audit.app)."""

from __future__ import annotations

from collections.abc import Callable
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
) -> tuple[Any, Callable[[], Any], Path]:
    """(spec, make_game, folder) of an app audit (`--app`): the folder is `out` or audits/APP. The game is
    made by `make_game()` once the caller holds (and, for --overwrite, has emptied) the folder, since the game
    opens the folder's log. Any problem with the app reference is a usage error naming it."""
    from colab_graphs.audit.app import AppError, AppGame, resolve_app

    if other:
        fail("give --app or a protocol (--protocol / --graph), not both")
    try:
        the_app, spec = resolve_app(app, pool.names)
        folder = out or Path("audits") / spec.name
    except (AppError, ValueError) as err:
        fail(str(err))

    def make_game() -> Any:
        return AppGame(
            the_app, spec, pool, examples, client=client, scorer=scorer, store=folder, dataset=data
        )

    return spec, make_game, folder
