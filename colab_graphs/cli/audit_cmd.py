"""`colab-graphs audit`: each member's compositional strength (LOO, Shapley) next to its individual strength."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from colab_graphs.accounting import count_calls
from colab_graphs.cli.common import check_sandbox, fail, holding_out, make_client
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
    field_map,
    progress_bar,
    resolve_play,
)
from colab_graphs.files import empty_folder


def audit(
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
    method: Annotated[str, typer.Option("--method", help="loo | exact | sampled")] = "loo",
    budget: Annotated[
        int | None, typer.Option("--budget", help="For --method sampled: distinct calls (see --budget-unit).")
    ] = None,
    budget_unit: Annotated[
        str,
        typer.Option("--budget-unit", help="calls | coalitions | permutations (the permutation sampler)."),
    ] = "calls",
    target_error: Annotated[
        float | None,
        typer.Option(
            "--target-error", help="For --method sampled: stop when every 95% sampling interval is +- E."
        ),
    ] = None,
    simultaneous: Annotated[
        bool,
        typer.Option(
            "--simultaneous",
            help="For --method sampled: sampling intervals that hold all members at once (95%, Bonferroni), "
            "not each member alone; --target-error then applies to them.",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print and write OUT/plan.json (calls, tokens, cost); call nothing."),
    ] = False,
    max_calls: Annotated[
        int | None,
        typer.Option(
            "--max-calls", help="Stop before this run's new calls pass N (exit 4; rerun to resume)."
        ),
    ] = None,
    max_cost: Annotated[
        float | None,
        typer.Option("--max-cost", help="Stop before this run's cost passes USD (exit 4; rerun to resume)."),
    ] = None,
    scorer: ScorerOpt = None,
    out: OutOpt = None,
    max_concurrency: ConcOpt = 16,
    cache_dir: CacheDirOpt = None,
    no_cache: NoCacheOpt = False,
    limit: LimitOpt = None,
    param: ParamOpt = None,
    seed: SeedOpt = None,
    retries: RetriesOpt = 6,
    force: Annotated[bool, typer.Option("--force", help="Allow exact Shapley over many members.")] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Discard an earlier audit in --out.")
    ] = False,
    no_individual: Annotated[bool, typer.Option("--no-individual", help="Skip the solo runs.")] = False,
    no_plots: Annotated[bool, typer.Option("--no-plots", help="Do not draw PNG plots.")] = False,
    no_preflight: NoPreflightOpt = False,
    example_timeout: ExampleTimeoutOpt = None,
    stall_after: StallAfterOpt = None,
    play_every_coalition: Annotated[
        bool,
        typer.Option(
            "--play-every-coalition",
            help="Play each coalition even where its value follows from the members' answers (a vote's).",
        ),
    ] = False,
    sandbox: SandboxOpt = None,
    trace: TraceOpt = None,
    trace_content: TraceContentOpt = False,
    litellm_callbacks: LiteLLMCallbacksOpt = None,
) -> None:
    """Audit how much each member adds to a protocol: writes report.json, report.md and PNG plots."""
    from colab_graphs.audit.run import AuditError, play_audit
    from colab_graphs.audit.strategy import BUDGET_UNITS, choose_strategy
    from colab_graphs.sandbox import SandboxUnavailable, scope
    from colab_graphs.spec import SpecError

    if method not in ("loo", "exact", "sampled"):
        fail(f"--method must be loo, exact or sampled, got {method!r}")
    if budget_unit not in BUDGET_UNITS:
        fail(f"--budget-unit must be one of {', '.join(BUDGET_UNITS)}, got {budget_unit!r}")
    if method != "sampled" and (budget is not None or target_error is not None or simultaneous):
        fail("--budget, --target-error and --simultaneous apply to --method sampled")
    if method == "sampled" and not budget and target_error is None:
        fail("--method sampled needs --budget (distinct calls, see --budget-unit) or --target-error")
    for name, cap in (("--max-calls", max_calls), ("--max-cost", max_cost)):
        if cap is not None and cap < 0:
            fail(f"{name} must not be negative, got {cap}")
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
    if not dry_run:  # (a plan calls nothing)
        check_sandbox(examples, scorer, sandbox)  # code scores: before the first call, apps' audits too
    client = make_client(cache_dir, no_cache, max_concurrency, retries=retries, preflight=not no_preflight)
    out = out or Path("audits") / spec.name
    make_game = _app_game(play, client, scorer, out, data) if play.app is not None else None
    if dry_run:
        if make_game is not None:
            fail(
                "--dry-run plans a protocol's calls; an app's graph is its own code, so its calls cannot be "
                "counted before it runs (audit it with --max-calls / --max-cost to cap what it spends)"
            )
        from colab_graphs.audit.plan import plan_audit, write_plan
        from colab_graphs.cli.plan_view import print_plan

        try:
            strategy = choose_strategy(
                spec, len(examples), method, budget=budget, budget_unit=budget_unit,  # type: ignore[arg-type]
                target_error=target_error, seed=seed or 0, simultaneous=simultaneous, force=force,
                from_answers=not play_every_coalition,
            )  # fmt: skip
            the_plan = plan_audit(
                spec, the_pool, examples, strategy, client=client, scorer=scorer, individual=not no_individual
            )
        except (SpecError, ValueError) as err:
            fail(str(err).replace("or force=True", "or pass --force"))
        with holding_out(out):  # (plan.json goes beside the report another audit may be writing)
            print_plan(the_plan, write_plan(the_plan, out))
        return
    progress, task = progress_bar(1, f"audit {spec.name} ({method})")

    def on_plan(total: int) -> None:
        progress.update(task, total=total)

    calls = {
        "made": 0,
        "cached": 0,
    }  # as the report counts them: another coalition's identical call is cached

    def on_progress(play) -> None:
        made, cached = count_calls(play.calls)
        calls["made"] += made
        calls["cached"] += cached
        progress.update(task, advance=1, status=f"calls {calls['made']} made, {calls['cached']} cached")

    try:
        with holding_out(out):
            if overwrite:
                from colab_graphs.log.reader import check_overwritable

                try:
                    check_overwritable(out, "audit")
                except ValueError as err:
                    fail(str(err))
                empty_folder(out)
            with progress:
                report = play.run(
                    play_audit(
                        spec,
                        the_pool,
                        examples,
                        client=client,
                        method=method,  # type: ignore[arg-type]
                        budget=budget,
                        budget_unit=budget_unit,  # type: ignore[arg-type]
                        target_error=target_error,
                        simultaneous=simultaneous,
                        max_calls=max_calls,
                        max_cost_usd=max_cost,
                        play_every_coalition=play_every_coalition,
                        seed=seed or 0,
                        scorer=scorer,
                        out=out,
                        dataset=data or "builtin:arithmetic",
                        force=force,
                        individual=not no_individual,
                        plots=False if no_plots else None,
                        on_plan=on_plan,
                        on_progress=on_progress,
                        game=make_game() if make_game is not None else None,
                        sandbox=sandbox,
                        example_timeout=example_timeout,
                        stall_after=stall_after,
                    )
                )
    except SandboxUnavailable as err:
        fail(str(err), code=scope.EXIT_CODE)
    except AuditError as err:  # every example failed: a failed audit, not a usage error
        fail(str(err), code=3)
    except (SpecError, ValueError) as err:
        fail(str(err).replace("or force=True", "or pass --force"))
    _print_report(report, out)
    if report.partial:
        raise typer.Exit(4)
    if report.failed_examples:
        raise typer.Exit(3)


def _app_game(play, client, scorer: str | None, out: Path, data: str | None):
    """`make_game()` of an app audit (`--app`, colab_graphs.audit.app): the game is made once the caller holds
    (and, for --overwrite, has emptied) the folder `out`, since the game opens the folder's log."""
    from colab_graphs.audit.app import AppGame

    def make_game():
        return AppGame(
            play.app,
            play.spec,
            play.pool,
            play.examples,
            client=client,
            scorer=scorer,
            store=out,
            dataset=data,
        )

    return make_game


def _print_report(report, out: Path) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from colab_graphs.audit.report import cost_sentence, describe_sampling
    from colab_graphs.sandbox.scope import describe

    def fmt(v: float | None, signed: bool = False) -> str:
        return "-" if v is None else (f"{v:+.3f}" if signed else f"{v:.3f}")

    console = Console()
    if report.partial:
        cap = report.cap or {}
        console.print(
            f"[yellow]partial: {cap.get('cap', 'a cap')} {cap.get('limit')} reached; values over the "
            f"{report.n_examples} of {report.examples_planned} examples finished. Run the same command with a "
            "higher cap (or none) to finish it: nothing recorded is called again.[/]"
        )
        if not report.n_examples:
            console.print(f"report: {out / 'report.md'}")
            return

    table = Table(title=f"{report.protocol}: contributions over {report.n_examples} example(s)")
    table.add_column("member")
    table.add_column("individual", justify="right")
    table.add_column("LOO", justify="right")
    table.add_column(f"LOO {report.confidence:.0%} CI", justify="right")
    if report.shapley is not None:
        table.add_column(f"Shapley ({report.shapley_estimator or report.shapley_method})", justify="right")
        table.add_column(f"Shapley {report.confidence:.0%} CI", justify="right")
    if report.sampling_error is not None:
        table.add_column("sampling +-", justify="right")

    def interval(member: str, measure: str) -> str:
        lo, hi = report.ci.get(member, {}).get(measure, (None, None))
        return f"[{fmt(lo, True)}, {fmt(hi, True)}]"

    for m in report.players:
        row = [m, fmt(report.individual.get(m)), fmt(report.loo[m], True), interval(m, "loo")]
        if report.shapley is not None:
            row += [fmt(report.shapley[m], True), interval(m, "shapley")]
        if report.sampling_error is not None:
            row.append(fmt(report.sampling_error[m]))
        table.add_row(*row)
    console.print(table)
    if report.stopped:
        console.print(
            f"sampled: {len(report.coalitions)} coalitions, stopped by {report.stopped}; 'sampling +-' is "
            f"{describe_sampling(report.sampling_interval)}, the LOO CI the example noise",
            highlight=False,
        )
    grand = report.value_of(report.players)
    c = report.calls
    console.print(
        f"v(all) = {fmt(grand)}; calls made {c.made} (distinct requests {c.unique}, cached {c.cached}, failed "
        f"{c.failed}; naive evaluation: {c.naive}); {report.wall_s:.1f}s"
    )
    console.print(cost_sentence(report.cost_usd, c.made, report.cost_saved_usd, c.cached), highlight=False)
    if report.sandbox:
        console.print(f"code scored in the sandbox: {describe(report.sandbox)}", highlight=False)
    fitting = getattr(report, "fitting", None)  # protocols whose coalitions are fitted first
    if fitting:
        fits, merges = fitting["fits"], fitting["merges"]
        console.print(
            f"fitting: {len(fitting['coalitions'])} coalition(s); fits made {fits['made']} ({fits['fit_s']:.1f}s), "
            f"reused {fits['reused']}; merges made {merges['made']} ({merges['merge_s']:.1f}s), reused "
            f"{merges['reused']}"
        )
    for name, corr in report.rank_correlation.items():
        console.print(
            f"rank correlation, individual vs {name}: spearman {fmt(corr.spearman)}, kendall {fmt(corr.kendall)}"
        )
    for entry in report.ended_by_absent:
        where = f" at node {entry['node']!r}" if entry.get("node") else ""
        console.print(
            f"[yellow]{entry['plays']} play(s) ended by absent member {entry['member']!r}{where} (uncaught "
            "MemberAbsent; scored as empty answers)[/]",
            highlight=False,
        )
    for warning in report.warnings:
        console.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False)
    if report.failed_examples:
        console.print(f"[yellow]{len(report.failed_examples)} example(s) failed and were left out[/]")
        for example, error in list(report.errors.items())[:3]:
            console.print(f"  {example}: {error}", highlight=False, markup=False)
    console.print(f"report: {out / 'report.md'}")


def register(app: typer.Typer) -> None:
    app.command("audit")(audit)
