"""The options every command shares, what `run` and `audit` play (`PlayOptions` -> `resolve_play`), and the
progress bar."""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from colab_graphs.cli.common import fail, load_data, load_pool, parse_params, resolve_protocol

T = TypeVar("T")

PoolOpt = Annotated[Path | None, typer.Option("--pool", help="Pool YAML (default: the embedded local pool).")]
DataOpt = Annotated[
    str | None,
    typer.Option(
        "--data",
        help="JSONL, JSON or CSV file, hf:NAME[:CONFIG] or hf:PATH (save_to_disk folder or data file), or a "
        "named source (gsm8k, builtin:arithmetic, ...); see docs/data.md and docs/data-io.md.",
    ),
]
SplitOpt = Annotated[
    str | None,
    typer.Option(
        "--split", help="The split to read, for data with several (default: test, else the only one)."
    ),
]
InputFieldOpt = Annotated[
    str | None,
    typer.Option(
        "--input-field",
        help="The records' field holding the question (default: input, "
        "question, prompt, problem, query or text).",
    ),
]
AnswerFieldOpt = Annotated[
    str | None,
    typer.Option(
        "--answer-field",
        help="The records' field holding the gold answer (default: answer, output, target or label).",
    ),
]
IdFieldOpt = Annotated[
    str | None,
    typer.Option("--id-field", help="The records' field holding the id (default: id, else SPLIT-INDEX)."),
]
TestFieldOpt = Annotated[
    str | None, typer.Option("--test-field", help="The records' field holding a coding record's test.")
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
        "AI message) | value (the question itself as the app's input: an entrypoint taking `question: str`) | "
        "auto (value when the app's input is a str or a list, messages when it has 'messages' and no 'input').",
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


def _trace_setting(value: str | None) -> str | None:
    """Tracing on now, as `--trace` (or COLAB_GRAPHS_TRACE) says: before any call, or a usage error."""
    from colab_graphs import otel

    if value is None or value.strip().lower() in otel.OFF:
        return None
    value = value.strip().lower()
    try:
        otel.enable_tracing("otlp" if value in ("1", "true", "on", "yes") else value)
    except otel.TracingUnavailable as err:
        raise typer.BadParameter(str(err)) from None
    return value


def _trace_content(value: bool) -> bool:
    if value:
        from colab_graphs import otel

        otel.capture_content()
    return value


TraceOpt = Annotated[
    str | None,
    typer.Option(
        "--trace",
        envvar="COLAB_GRAPHS_TRACE",
        callback=_trace_setting,
        help="OpenTelemetry trace of this command: otlp (to OTEL_EXPORTER_OTLP_ENDPOINT, default "
        "localhost:4318), console, or global (a provider your code set); off by default. Needs "
        "pip install 'colab-graphs\\[otel]'. See docs/tracing.md.",
    ),
]
TraceContentOpt = Annotated[
    bool,
    typer.Option(
        "--trace-content",
        envvar="COLAB_GRAPHS_TRACE_CONTENT",
        callback=_trace_content,
        help="With --trace: put prompts and replies on the call spans (gen_ai.input.messages, "
        "gen_ai.output.messages); off by default.",
    ),
]


def _litellm_callbacks(value: str | None) -> str | None:
    """LiteLLM's callbacks named (comma-separated) registered now: every call then goes through LiteLLM."""
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    if names:
        from colab_graphs.models.client import use_litellm_callbacks

        try:
            use_litellm_callbacks(names)
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
    return value


LiteLLMCallbacksOpt = Annotated[
    str | None,
    typer.Option(
        "--litellm-callbacks",
        envvar="COLAB_GRAPHS_LITELLM_CALLBACKS",
        callback=_litellm_callbacks,
        help="LiteLLM callbacks to register, comma-separated (otel, langfuse_otel, langfuse, ...; each reads "
        "its own environment); with --trace their spans nest under each call's. See docs/tracing.md.",
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


@dataclass(frozen=True)
class PlayOptions:
    """The options that say what `run` and `audit` play: a protocol (`--protocol` / `--graph`, `-P`) or the
    user's LangGraph app (`--app` with its mapping), over a pool and data."""

    protocol: str | None
    graph: str | None
    app: str | None
    input_key: str | None
    answer_key: str | None
    mode: str
    pool: Path | None
    data: str | None
    scorer: str | None
    limit: int | None
    seed: int | None
    param: list[str] | None
    fields: dict[str, str] | None = None
    split: str | None = None


@dataclass(frozen=True)
class Play:
    """What plays: the pool, the examples, the spec, and the user's app object (None for a protocol), with the
    loop it was made on (`loop`), where it plays (`run`)."""

    pool: Any
    examples: list[Any]
    spec: Any
    app: Any | None = None
    loop: Any | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run the command's work: on the app's loop for an app (its async factory's resources are bound to
        it), else on a loop of its own (`run_loop`)."""
        from colab_graphs.models.loops import run_loop

        return self.loop.run(coro) if self.loop is not None else run_loop(coro)


def resolve_play(options: PlayOptions) -> Play:
    """The pool (`api.as_pool`), the app if any, the examples (`api.as_examples`) and the spec, in that order;
    any problem is a usage error (exit 2) naming it, before a call or a client is made."""
    pool = load_pool(options.pool)
    app = _app(options, pool) if options.app else None
    examples = load_data(
        options.data,
        options.limit,
        options.seed,
        scorer=options.scorer,
        fields=options.fields,
        split=options.split,
    )
    if app is not None:
        return Play(pool, examples, app[1], app[0], app[2])
    if options.input_key is not None or options.answer_key is not None or options.mode != "auto":
        fail("--input-key, --answer-key and --mode map an app's state: they need --app")
    spec = resolve_protocol(options.protocol, options.graph, pool.names, parse_params(options.param), pool)
    return Play(pool, examples, spec)


def _app(options: PlayOptions, pool: Any) -> tuple[Any, Any, Any]:
    """(app, AppSpec, loop) of `--app` (see colab_graphs.audit.app), made on the command's loop (an async or
    context-manager factory awaited or entered there, as LangGraph's server does, and exited when the command
    ends), its mapping (`--input-key`, `--answer-key`, `--mode`) checked against the app before any call; a
    detected mode is said on stderr."""
    from rich.console import Console

    from colab_graphs.audit.app_contract import AppIO
    from colab_graphs.audit.app_load import open_app
    from colab_graphs.models.loops import CommandLoop

    if options.protocol or options.graph:
        fail("give --app or a protocol (--protocol / --graph), not both")
    assert options.app is not None
    loop = CommandLoop()
    _opened.append(loop)  # closed when the command ends, whatever it ends with (`close_apps`)
    try:
        io = AppIO(options.input_key, options.answer_key, options.mode)  # type: ignore[arg-type]
        the_app, spec = loop.enter(open_app(options.app, pool.names, io))
    except ValueError as err:  # (AppError among them)
        fail(str(err))
    note = spec.io.note(spec.name)
    if note:
        Console(stderr=True).print(f"[cyan]note:[/] {note}", highlight=False)
    return the_app, spec, loop


_opened: list[Any] = []  # the loops of the apps the running command opened (`_app`)


def close_apps() -> None:
    """Close what the command opened for its app (an async factory's context, then its loop); the CLI's root
    callback has it called when the command ends."""
    while _opened:
        _opened.pop().close()


def field_map(
    input_field: str | None, answer_field: str | None, id_field: str | None, test_field: str | None
) -> dict[str, str] | None:
    """The `--*-field` options as an Example field -> record field mapping (None: nothing mapped)."""
    given = {"input": input_field, "answer": answer_field, "id": id_field, "test": test_field}
    return {k: v for k, v in given.items() if v} or None


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
