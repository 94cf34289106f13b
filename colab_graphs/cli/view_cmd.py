"""`colab-graphs view PATH`: browse an output folder in a local web app."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from colab_graphs.cli.common import fail


def view(
    path: Annotated[
        Path, typer.Argument(help="An output folder (audit, run, study, training run), or a folder of them.")
    ],
    port: Annotated[int, typer.Option("--port", help="Port to serve on (0: any free port).")] = 7575,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (the default keeps it to this machine).")
    ] = "127.0.0.1",
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            help="Also answer requests whose Host header is NAME (repeatable; '*' answers any: only on a "
            "network you trust).",
        ),
    ] = None,
) -> None:
    """Serve a local, offline web viewer of PATH; reload the page to follow a run that is still writing."""
    from colab_graphs.viewer import ViewerServer

    if not path.is_dir():
        fail(f"{path}: no such folder")
    try:
        server = ViewerServer(path, host=host, port=port, allow_hosts=allow_host or ())
    except OSError as err:
        fail(f"cannot serve on {host}:{port}: {err.strerror or err}")
    typer.echo(f"viewing {path} at {server.url} (Ctrl-C to stop)", err=False)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def register(app: typer.Typer) -> None:
    app.command("view")(view)
