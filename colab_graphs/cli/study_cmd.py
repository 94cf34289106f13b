"""`colab-graphs study`: pools x protocols x datasets in one command, in process or on a Ray cluster."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from colab_graphs.cli.common import fail, holding_out, make_client
from colab_graphs.cli.options import (
    CacheDirOpt,
    LiteLLMCallbacksOpt,
    NoCacheOpt,
    NoPreflightOpt,
    OutOpt,
    RetriesOpt,
    SandboxOpt,
    StallAfterOpt,
    TraceContentOpt,
    TraceOpt,
    progress_bar,
)


def study(
    config: Annotated[
        Path,
        typer.Option("--config", help="Study YAML: pools, protocols, datasets, method, budget, limit, seed."),
    ],
    out: OutOpt = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Play on a Ray cluster: its ADDRESS (host:port) or 'auto' (needs pip install 'colab-graphs\\[ray]').",
        ),
    ] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", help="Ray workers (default: one per CPU of the cluster).")
    ] = None,
    max_concurrency: Annotated[
        int | None,
        typer.Option(
            "--max-concurrency", help="In-flight calls per endpoint (default: the study file's, else 16)."
        ),
    ] = None,
    cache_dir: CacheDirOpt = None,
    no_cache: NoCacheOpt = False,
    retries: RetriesOpt = 6,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Discard the plays and reports in --out first (calls stay cached)."),
    ] = False,
    no_plots: Annotated[
        bool, typer.Option("--no-plots", help="Do not draw the heatmap and scatter grid.")
    ] = False,
    no_preflight: NoPreflightOpt = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print and write OUT/plan.json (calls, tokens, cost); call nothing."),
    ] = False,
    sandbox: SandboxOpt = None,
    stall_after: StallAfterOpt = None,
    trace: TraceOpt = None,
    trace_content: TraceContentOpt = False,
    litellm_callbacks: LiteLLMCallbacksOpt = None,
) -> None:
    """Audit every protocol over every pool on every dataset; correlate individual and compositional strength.

    Writes DIR/study.json, DIR/study.md (a heatmap and a scatter grid) and one audit folder per setting under DIR/audits/. Run the same command again after a crash to finish it: nothing is played or called twice.
    """
    from colab_graphs.sandbox import SandboxUnavailable, scope
    from colab_graphs.study import StudyConfigError, StudyError, load_study_config, play_study

    try:
        the_config = load_study_config(config)
    except StudyConfigError as err:
        fail(str(err))
    the_config.sandbox = sandbox or the_config.sandbox  # (the study checks it before its first call)
    the_config.stall_after = stall_after
    out = out or Path("studies") / config.stem
    client = make_client(
        cache_dir,
        no_cache,
        max_concurrency or the_config.max_concurrency,
        retries=retries,
        preflight=not no_preflight,
    )
    if dry_run:
        from colab_graphs.cli.plan_view import print_study_plan
        from colab_graphs.study.plan import plan_study

        try:
            the_plan = plan_study(the_config, client)
        except StudyConfigError as err:
            fail(str(err))
        from colab_graphs.files import atomic_write_text

        out.mkdir(parents=True, exist_ok=True)
        with holding_out(out):
            atomic_write_text(out / "plan.json", the_plan.model_dump_json(indent=2) + "\n")
        print_study_plan(the_plan, out / "plan.json")
        return
    progress, task = progress_bar(1, f"study {config.stem}")

    def on_plan(planned: int, recorded: int) -> None:
        progress.update(task, total=planned, completed=recorded)

    def on_progress(n: int) -> None:
        # On Ray the calls are the workers': the driver's client makes none.
        status = "" if ray else f"calls {client.stats.made} made, {client.stats.cached} cached"
        progress.update(task, advance=n, status=status)

    try:
        with holding_out(out), progress:
            report = asyncio.run(
                play_study(
                    the_config,
                    out,
                    client=client,
                    ray_address=ray,
                    workers=workers,
                    plots=False if no_plots else None,
                    overwrite=overwrite,
                    on_plan=on_plan,
                    on_progress=on_progress,
                )
            )
    except SandboxUnavailable as err:
        fail(str(err), code=scope.EXIT_CODE)
    except StudyConfigError as err:
        fail(str(err))
    except StudyError as err:
        fail(str(err), code=3)
    _print_summary(report, out)
    if any(s.failed_examples for s in report.settings):
        raise typer.Exit(3)


def _print_summary(report, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:+.2f}"

    table = Table(title=f"individual vs {report.measure}: rank correlation over (member, protocol, dataset)")
    for column in ("pool", "family", "pairs", "spearman", "kendall", "p-value"):
        table.add_column(column, justify="left" if column in ("pool", "family") else "right")
    for c in report.correlations:
        p = "n/a" if c.p_value is None else f"{c.p_value:.3g}"
        table.add_row(c.pool, c.family, str(c.n_pairs), fmt(c.spearman), fmt(c.kendall), p)
    console = Console()
    console.print(table)
    tested = [c for c in report.correlations if c.family != "all" and c.p_value is not None]
    quiet = sum(1 for c in tested if not c.significant)
    calls = report.calls
    console.print(
        f"{quiet} of {len(tested)} settings (pool x family) show no significant correlation (alpha {report.alpha}); "
        f"{len(report.settings)} audits; calls made {calls.made} (distinct {calls.unique}, cached {calls.cached}, "
        f"failed {calls.failed}); {report.wall_s:.1f}s on {report.backend}"
    )
    if report.sandbox:
        from colab_graphs.sandbox.scope import describe

        console.print(f"code scored in the sandbox: {describe(report.sandbox)}", highlight=False)
    failed = [s for s in report.settings if s.failed_examples]
    if failed:
        console.print(f"[yellow]{len(failed)} setting(s) have failed examples (see their audit folders)[/]")
    console.print(f"study: {out / 'study.md'}")


def register(app: typer.Typer) -> None:
    app.command("study")(study)
