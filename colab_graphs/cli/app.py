"""`colab-graphs`: run | audit | study | train | serve | view | compare | protocols | show | models | cache |
doctor.

Heavy modules (litellm, torch, transformers, trl) are imported inside the commands, so `--help` is instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

import colab_graphs._env  # noqa: F401  (offline settings first)
from colab_graphs.cli.common import (
    check_sandbox,
    fail,
    holding_out,
    load_pool,
    make_client,
    parse_params,
    resolve_protocol,
)
from colab_graphs.cli.options import (
    AnswerFieldOpt,
    AnswerKeyOpt,
    AppModeOpt,
    AppOpt,
    CacheDirOpt,
    ConcOpt,
    DataOpt,
    ExampleTimeoutOpt,
    GraphOpt,
    IdFieldOpt,
    InputFieldOpt,
    InputKeyOpt,
    LimitOpt,
    LiteLLMCallbacksOpt,
    NoCacheOpt,
    NoPreflightOpt,
    OutOpt,
    ParamOpt,
    PlayOptions,
    PoolOpt,
    ProtocolOpt,
    RetriesOpt,
    SandboxOpt,
    ScorerOpt,
    SeedOpt,
    SplitOpt,
    StallAfterOpt,
    TestFieldOpt,
    TraceContentOpt,
    TraceOpt,
    close_apps,
    field_map,
    progress_bar,
    resolve_play,
)

app = typer.Typer(
    name="colab-graphs",
    help="Measure and train language models for what they add to a team of models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
cache_app = typer.Typer(help="Inspect, list or drop entries of the call cache.", no_args_is_help=True)


def _print_version(asked: bool) -> None:
    if asked:
        from colab_graphs import __version__

        typer.echo(f"colab-graphs {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Measure and train language models for what they add to a team of models."""
    ctx.call_on_close(close_apps)  # an app's factory opened by the command (--app) is closed when it ends


app.add_typer(cache_app, name="cache")


@app.command()
def run(
    protocol: ProtocolOpt = None,
    graph: GraphOpt = None,
    app: AppOpt = None,
    input_key: InputKeyOpt = None,
    answer_key: AnswerKeyOpt = None,
    mode: AppModeOpt = "auto",
    pool: PoolOpt = None,
    data: DataOpt = None,
    split: SplitOpt = None,
    input_field: InputFieldOpt = None,
    answer_field: AnswerFieldOpt = None,
    id_field: IdFieldOpt = None,
    test_field: TestFieldOpt = None,
    scorer: ScorerOpt = None,
    out: OutOpt = None,
    max_concurrency: ConcOpt = 16,
    cache_dir: CacheDirOpt = None,
    no_cache: NoCacheOpt = False,
    limit: LimitOpt = None,
    param: ParamOpt = None,
    seed: SeedOpt = None,
    retries: RetriesOpt = 6,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Discard an earlier run in --out.")] = False,
    no_preflight: NoPreflightOpt = False,
    sandbox: SandboxOpt = None,
    example_timeout: ExampleTimeoutOpt = None,
    stall_after: StallAfterOpt = None,
    trace: TraceOpt = None,
    trace_content: TraceContentOpt = False,
    litellm_callbacks: LiteLLMCallbacksOpt = None,
) -> None:
    """Run a protocol (or score your LangGraph app, --app) over a dataset; write results.jsonl, traces.jsonl,
    summary.json and log.jsonl."""
    from rich.console import Console
    from rich.markup import escape

    from colab_graphs.redaction import redact
    from colab_graphs.runner import RunError
    from colab_graphs.sandbox import SandboxUnavailable, scope
    from colab_graphs.spec import SpecError

    play = resolve_play(
        PlayOptions(
            protocol,
            graph,
            app,
            input_key,
            answer_key,
            mode,
            pool,
            data,
            scorer,
            limit,
            seed,
            param,
            fields=field_map(input_field, answer_field, id_field, test_field),
            split=split,
        )  # fmt: skip
    )
    the_pool, examples, spec = play.pool, play.examples, play.spec
    check_sandbox(examples, scorer, sandbox)  # code scores: before the first call
    client = make_client(cache_dir, no_cache, max_concurrency, retries=retries, preflight=not no_preflight)
    out = out or Path("runs") / spec.name
    progress, task = progress_bar(len(examples), f"{spec.name}")
    scores: list[float] = []
    failed = 0

    def on_progress(o) -> None:
        nonlocal failed
        if o.failed:
            failed += 1
        elif o.score is not None:
            scores.append(o.score)
        # No example scored yet (or every one failed): no score, not 0.000.
        mean = f"{sum(scores) / len(scores):.3f}" if scores else "none"
        progress.update(task, advance=1, status=f"score {mean}  failed {failed}")

    from colab_graphs.audit.app import run_app
    from colab_graphs.fitting import run_fitted

    options = {
        "client": client,
        "scorer": scorer,
        "out": out,
        "overwrite": overwrite,
        "on_progress": on_progress,
        "example_timeout": example_timeout,
        "stall_after": stall_after,
    }
    try:
        with holding_out(out), progress, scope.using(sandbox):
            outcomes, summary = play.run(
                run_app(play.app, spec, the_pool, examples, **options)
                if play.app is not None
                else run_fitted(spec, the_pool, examples, **options)  # type: ignore[arg-type]
            )
    except SandboxUnavailable as err:
        fail(str(err), code=scope.EXIT_CODE)
    except (RunError, SpecError, ValueError) as err:
        fail(str(err))
    from colab_graphs.audit.report import cost_sentence

    console = Console()
    score = summary["score"]
    calls = summary["calls"]
    console.print(
        f"[bold]{spec.name}[/]: score {'none' if score is None else f'{score:.3f}'} over {summary['scored']} "
        f"example(s); failed {summary['failed']}; calls made {calls['made']}, cached "
        f"{calls['cached']}; {summary['wall_s']:.1f}s -> {out}"
    )
    console.print(
        cost_sentence(summary["cost_usd"], calls["made"], summary["cost_saved_usd"], calls["cached"]),
        highlight=False,
    )
    if summary.get("sandbox"):
        console.print(f"code scored in the sandbox: {scope.describe(summary['sandbox'])}", highlight=False)
    for warning in summary.get("warnings", []):
        console.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False)
    if summary["failed"]:
        first = next(o.error for o in outcomes if o.failed)
        console.print(
            f"[yellow]{summary['failed']} example(s) failed (see {out}/results.jsonl); the first:[/] "
            f"{escape(redact(str(first)))}",
            highlight=False,
        )
        raise typer.Exit(3)


@app.command()
def protocols(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
) -> None:
    """List the built-in protocols with their family and parameters."""
    from colab_graphs.protocol_registry import list_protocols

    infos = list_protocols()
    if as_json:
        typer.echo(json.dumps([i.as_dict() for i in infos], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="colab-graphs protocols")
    for col in ("name", "family", "members", "requires", "parameters", "description"):
        table.add_column(col)
    for i in infos:
        members = f"{i.min_members}+" if i.max_members is None else f"{i.min_members}-{i.max_members}"
        params = ", ".join(
            f"{k}={v!r}" for k, v in i.params.items() if k != "prompt" and not k.endswith("_prompt")
        )
        table.add_row(i.name, i.family, members, ", ".join(i.requires), params, i.description)
    Console().print(table)


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="Protocol name (or use --graph).")] = "",
    graph: GraphOpt = None,
    pool: PoolOpt = None,
    members: Annotated[int, typer.Option("--members", help="Placeholder members when no --pool.")] = 3,
    param: ParamOpt = None,
    fmt: Annotated[str, typer.Option("--format", help="mermaid | tree | json | all")] = "all",
) -> None:
    """Draw a protocol's graph (mermaid and a terminal view)."""
    from colab_graphs.show import render_mermaid, render_tree

    names = load_pool(pool).names if pool else [f"m{i}" for i in range(1, members + 1)]
    spec = resolve_protocol(name or None, graph, names, parse_params(param))
    if fmt in ("json",):
        typer.echo(json.dumps(spec.to_dict(), indent=2))
        return
    if fmt in ("tree", "all"):
        from rich.console import Console

        Console().print(render_tree(spec))
    if fmt in ("mermaid", "all"):
        typer.echo(render_mermaid(spec))


def _open_cache(cache_dir: Path | None):
    from colab_graphs.models.cache import CacheError, CallCache

    try:
        return CallCache(cache_dir)
    except CacheError as err:
        fail(str(err))


@cache_app.command("stats")
def cache_stats(cache_dir: CacheDirOpt = None) -> None:
    """Entries, size and per-model and per-member counts of the call cache."""
    typer.echo(json.dumps(_open_cache(cache_dir).stats(), indent=2))


@cache_app.command("list")
def cache_list(
    cache_dir: CacheDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
) -> None:
    """Entries per member, model and identity (the endpoint, deployments, weights or namespace that answered)."""
    import time

    rows = _open_cache(cache_dir).entries()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="call cache entries")
    for column in ("member", "model", "identity", "entries", "last written"):
        table.add_column(column, justify="right" if column == "entries" else "left")
    for r in rows:
        last = (
            time.strftime("%Y-%m-%d %H:%M", time.localtime(r["last_written"])) if r["last_written"] else "-"
        )
        table.add_row(r["member"] or "-", r["model"] or "-", r["identity"] or "-", str(r["entries"]), last)
    Console().print(table)


@cache_app.command("drop")
def cache_drop(
    member: Annotated[str, typer.Option("--member", help="Drop the entries this member wrote.")],
    identity: Annotated[
        str | None, typer.Option("--identity", help="Only those of this identity (see `cache list`).")
    ] = None,
    cache_dir: CacheDirOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Delete one member's cached calls (all of them, or those of one identity), so they are made again."""
    cache = _open_cache(cache_dir)
    what = f"{member!r}" + (f" ({identity})" if identity else "")
    if not yes and not typer.confirm(f"delete the entries of {what} in {cache.path}?"):
        raise typer.Exit(1)
    typer.echo(f"deleted {cache.drop(member=member, identity=identity)} entries of {what} from {cache.path}")


@cache_app.command("clear")
def cache_clear(
    cache_dir: CacheDirOpt = None,
    model: Annotated[str | None, typer.Option("--model", help="Only this model's entries.")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Delete cached calls (all, or one model's)."""
    cache = _open_cache(cache_dir)
    if not yes and not typer.confirm(f"delete {'all' if model is None else model} entries in {cache.path}?"):
        raise typer.Exit(1)
    typer.echo(f"deleted {cache.clear(model)} entries from {cache.path}")


def _register_optional_commands() -> None:
    # Commands whose modules pull in heavier code register themselves here; each import is cheap (lazy inside),
    # and one that fails to import fails the CLI with its name rather than dropping its command.
    # Registering twice would list every command twice: a second call does nothing.
    if any(c.name == "study" for c in app.registered_commands):
        return
    from colab_graphs.cli import (
        audit_cmd,
        compare_cmd,
        doctor_cmd,
        models_cmd,
        study_cmd,
        train_cmd,
        view_cmd,
    )

    for commands in (audit_cmd, models_cmd, train_cmd, study_cmd, view_cmd, compare_cmd, doctor_cmd):
        commands.register(app)


def main() -> None:
    _register_optional_commands()
    app()


if __name__ == "__main__":
    main()
