"""`colab-graphs audit --app` / `run --app`: a user's own LangGraph app (see colab_graphs.audit.app)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from colab_graphs.cli.common import fail


def cli_app(
    app: str, other: str | None, pool: Any, input_key: str | None, answer_key: str | None, mode: str
) -> tuple[Any, Any]:
    """(app, AppSpec) of `--app`, its mapping (`--input-key`, `--answer-key`, `--mode`) checked against the app
    before any call; a detected MessagesState app is said on stderr. Any problem is a usage error naming it."""
    from rich.console import Console

    from colab_graphs.audit.app import resolve_app
    from colab_graphs.audit.app_contract import AppIO

    if other:
        fail("give --app or a protocol (--protocol / --graph), not both")
    try:
        the_app, spec = resolve_app(app, pool.names, AppIO(input_key, answer_key, mode))  # type: ignore[arg-type]
    except ValueError as err:  # (AppError among them)
        fail(str(err))
    note = spec.io.note(spec.name)
    if note:
        Console(stderr=True).print(f"[cyan]note:[/] {note}", highlight=False)
    return the_app, spec


def no_app_options(input_key: str | None, answer_key: str | None, mode: str) -> None:
    """Refuse the app mapping options without --app."""
    if input_key is not None or answer_key is not None or mode != "auto":
        fail("--input-key, --answer-key and --mode map an app's state: they need --app")


def app_game_for(
    the_app: Any,
    spec: Any,
    pool: Any,
    examples: Any,
    client: Any,
    scorer: str | None,
    out: Path | None,
    data: str | None,
) -> tuple[Callable[[], Any], Path]:
    """(make_game, folder) of an app audit (`--app`): the folder is `out` or audits/APP. The game is made by
    `make_game()` once the caller holds (and, for --overwrite, has emptied) the folder, since the game opens
    the folder's log."""
    from colab_graphs.audit.app import AppGame

    folder = out or Path("audits") / spec.name

    def make_game() -> Any:
        return AppGame(
            the_app, spec, pool, examples, client=client, scorer=scorer, store=folder, dataset=data
        )

    return make_game, folder
