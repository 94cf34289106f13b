"""The options every command shares, and its progress bar."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

PoolOpt = Annotated[Path | None, typer.Option("--pool", help="Pool YAML (default: the embedded local pool).")]
DataOpt = Annotated[
    str | None,
    typer.Option("--data", help="JSONL/JSON file or a named source (gsm8k, builtin:arithmetic, ...)."),
]
ProtocolOpt = Annotated[
    str | None, typer.Option("--protocol", help="Built-in protocol name (see `protocols`).")
]
GraphOpt = Annotated[str | None, typer.Option("--graph", help="User graph: path/to/file.py:NAME.")]
ScorerOpt = Annotated[
    str | None, typer.Option("--scorer", help="Scorer name (default: from the data's fields).")
]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Output directory.")]
ConcOpt = Annotated[int, typer.Option("--max-concurrency", help="In-flight calls per endpoint.")]
CacheDirOpt = Annotated[
    Path | None,
    typer.Option("--cache-dir", envvar="COLAB_GRAPHS_CACHE_DIR", help="Call cache directory."),
]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Do not read or write the call cache.")]
LimitOpt = Annotated[
    int | None, typer.Option("--limit", min=1, help="Use only the first K examples (K >= 1).")
]
ParamOpt = Annotated[list[str] | None, typer.Option("-P", "--param", help="Protocol parameter key=value.")]
RetriesOpt = Annotated[
    int,
    typer.Option(
        "--retries", help="Retries per call on 429/5xx/timeouts/malformed replies (backoff doubles)."
    ),
]
NoPreflightOpt = Annotated[
    bool,
    typer.Option(
        "--no-preflight",
        help="Do not check that each HTTP endpoint answers (GET /models) before its first call.",
    ),
]
AppOpt = Annotated[
    str | None,
    typer.Option(
        "--app",
        help="Your LangGraph app: path/to/file.py:NAME, module:NAME or langgraph.json:NAME; its models "
        "colab_graphs.member_chat_model(MEMBER). It reads 'input' and writes 'answer' unless mapped "
        "(--input-key, --answer-key, --mode).",
    ),
]
InputKeyOpt = Annotated[
    str | None,
    typer.Option("--input-key", help="With --app: the state key the question goes in (default: input)."),
]
AnswerKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--answer-key",
        help="With --app: the final state's key holding the answer (default: answer; in messages mode the "
        "last AI message).",
    ),
]
AppModeOpt = Annotated[
    str,
    typer.Option(
        "--mode",
        help="With --app: keys | messages (the question as a HumanMessage in 'messages', the answer the last "
        "AI message) | auto (messages when the app's input has 'messages' and no 'input').",
    ),
]
ExampleTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--example-timeout",
        min=0,
        help="Fail a play (one coalition on one example) not finished within SECONDS, naming what it waits "
        "for (default: 600 for --app, none for a protocol; 0: none).",
    ),
]
StallAfterOpt = Annotated[
    float | None,
    typer.Option(
        "--stall-after",
        min=0,
        help="When no call and no node has finished for SECONDS, print what every play waits for (default 60; "
        "0: never).",
    ),
]
SeedOpt = Annotated[
    int | None, typer.Option("--seed", help="Shuffle the data with this seed before --limit.")
]


def _sandbox_setting(value: str | None) -> str | None:
    from colab_graphs.sandbox.scope import normalize

    try:
        return normalize(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


SandboxOpt = Annotated[
    str | None,
    typer.Option(
        "--sandbox",
        callback=_sandbox_setting,
        help="Where code-scored answers run: auto (the strongest this machine gives), namespaces, landlock, or "
        "unsafe-local (alias unsafe: unconfined, an explicit opt-in recorded in every output). Default: env "
        "COLAB_GRAPHS_SANDBOX, else auto. Refused before any call (exit 6) where it cannot be met; see "
        "`colab-graphs doctor`.",
    ),
]


def progress_bar(total: int, description: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
    )
    task = progress.add_task(description, total=total, status="")
    return progress, task
