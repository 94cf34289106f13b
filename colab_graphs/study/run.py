"""`play_study`: play every setting of a study (in process or on Ray), then write its audits and `study.json`.

The study folder holds one audit folder per setting, `audits/POOL/PROTOCOL/DATASET/`, and the solo runs of each
pool on each dataset, `solo/POOL/DATASET/`. Each folder's log (`log.jsonl`) is the setting's ledger: the
driver appends every play the moment it learns of it (a solo play goes to its solo folder and to every audit of that
pool and dataset, which is how one solo run serves all protocols), so a study killed at any point and run again
plays only what is missing, and a setting added to the study file is played while every other is reused. Calls
are never repeated either: they are in the call cache, written as each one succeeds.

When every play is recorded, each audit folder is finished by `play_audit` itself, which finds all its plays
done and writes the standard audit report (`report.json`, `report.md`) without a call; a play that had failed
is retried once more there, as any resumed audit retries failed plays.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from colab_graphs import otel
from colab_graphs.accounting import account, made_since
from colab_graphs.audit.game import CoalitionGame, Play, read_plays
from colab_graphs.audit.run import AuditError, play_audit, plots_available
from colab_graphs.log import LOG_FILE, Header, LogVersionError, LogWriter
from colab_graphs.models.client import ModelClient
from colab_graphs.sandbox import scope
from colab_graphs.study.config import StudyConfig
from colab_graphs.study.plan import Setting, Shard, StudyPlan, build_plan, make_shards, shard_count
from colab_graphs.study.plots import write_plots
from colab_graphs.study.report import (
    STUDY_JSON,
    STUDY_MD,
    StudyReport,
    correlation_rows,
    setting_result,
    write_study,
)
from colab_graphs.study.worker import PlayKey, ShardResult, ShardRunner, play_key
from colab_graphs.tasks.scoring import require_sandbox

STATE_FILE = "study-state.json"


class StudyError(RuntimeError):
    """A study cannot go on: its folder holds another study's setting, or its cluster failed."""


class _Ledgers:
    """Every setting's ledger (a `CoalitionGame` on its folder) and the recording of plays into them."""

    def __init__(self, plan: StudyPlan, out: Path, client: ModelClient):
        self.plan = plan
        self.games: dict[str, CoalitionGame] = {}
        for setting in plan.settings:
            store = out / setting.folder
            try:
                self.games[setting.key] = CoalitionGame(
                    setting.spec,
                    plan.pools[setting.pool],
                    plan.examples[setting.dataset],
                    client=client,
                    scorer=setting.scorer,
                    store=store,
                    dataset=plan.datasets[setting.dataset].source,
                )
            except LogVersionError as err:
                raise StudyError(f"{plan.source}: setting {setting.key}: {err}") from None
            except ValueError:
                raise StudyError(
                    f"{plan.source}: setting {setting.key} was played into {store} with another pool, protocol "
                    "parameters, data or scorer; run with --overwrite to start the study over (calls stay cached)"
                ) from None
        for setting in plan.settings:
            # An audit's ledger also gets its pool's solo plays (see `record_many`): they are part of its plan.
            alone = setting.solo_members if setting.protocol is None else setting.spec.members
            self.games[setting.key].write_plan(setting.coalitions, alone)
        self.audits_of = {
            solo.key: [a.key for a in plan.audits if (a.pool, a.dataset) == (solo.pool, solo.dataset)]
            for solo in plan.solos
        }
        # An audit added to the study takes the solo plays made before.
        self._store(
            [
                (key, play)
                for solo in plan.solos
                for play in self.done(solo)
                for key in self.audits_of[solo.key]
                if play_key(play) not in self.games[key].plays
            ]
        )

    def done(self, setting: Setting) -> list[Play]:
        """The setting's finished plays (an audit's own, not the solo plays it was given)."""
        game = "solo" if setting.protocol is None else "coalition"
        return [p for p in self.games[setting.key].plays.values() if p.game == game]

    def record(self, key: str, play: Play) -> None:
        self.record_many([(key, play)])

    def record_many(self, plays: Sequence[tuple[str, Play]]) -> None:
        """Record plays (setting key, play); a solo play also goes to every audit of its pool and dataset."""
        self._store([(target, play) for key, play in plays for target in (key, *self.audits_of.get(key, ()))])

    def _store(self, placed: list[tuple[str, Play]]) -> None:
        # One append per ledger file: the calls it does not hold yet, then the plays referring to them.
        by_target: dict[str, list[Play]] = {}
        for target, play in placed:
            by_target.setdefault(target, []).append(play)
        for target, plays in by_target.items():
            self.games[target].record(plays)


def _read_state(out: Path) -> float:
    """When this study first started (kept across resumes): calls cached since then were made by it."""
    path = out / STATE_FILE
    if path.exists():
        return float(json.loads(path.read_text())["started_at"])
    started = time.time()
    path.write_text(json.dumps({"started_at": started}) + "\n")
    return started


def _write_header(plan: StudyPlan, config: StudyConfig, out: Path) -> None:
    """The study's own log: a header naming every setting's folder (its audits' logs hold the plays)."""
    settings = [
        {
            "key": s.key,
            "pool": s.pool,
            "protocol": s.protocol,
            "family": s.family,
            "dataset": s.dataset,
            "folder": s.folder,
            "kind": "solo" if s.protocol is None else "audit",
        }
        for s in plan.settings
    ]
    header = Header(
        kind="study",
        settings=settings,
        method=config.method,
        pools={name: pool.names for name, pool in plan.pools.items()},
        source=str(plan.source),
    )
    LogWriter(out).start(header)


def _discard(out: Path) -> None:
    for name in ("audits", "solo"):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in (STATE_FILE, STUDY_JSON, STUDY_MD, LOG_FILE):
        (out / name).unlink(missing_ok=True)


async def play_study(
    config: StudyConfig,
    out: str | Path,
    *,
    client: ModelClient,
    ray_address: str | None = None,
    workers: int | None = None,
    share_cache: bool = True,
    plots: bool | None = None,
    overwrite: bool = False,
    on_plan: Callable[[int, int], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> StudyReport:
    """Run a study and write its folder (see the module docstring); returns the study report.

    Args:
        config: The checked study file (`load_study_config`).
        out: The study folder.
        client: The call path of the driver (and, in process, of every play); its cache is the study's.
        ray_address: Play on the Ray cluster at this address ("auto": the running one) instead of in process.
        workers: Ray workers (default: one per CPU of the cluster).
        share_cache: Ray workers on the driver's machine use the study's cache file; False gives each a cache
            of its own whose entries come back with its shards, as on other machines.
        plots: Draw the study's heatmap and scatter grid (default: when matplotlib is installed).
        overwrite: Discard the study folder's plays and reports first (the call cache stays).
        on_plan: Called with (plays planned, plays already recorded) before any play.
        on_progress: Called with the number of plays finished since its last call.

    Raises:
        StudyConfigError: A dataset or protocol of the study file cannot be used (names the file and key).
        StudyError: The folder holds a setting of a different study, or the cluster failed.
        SandboxUnavailable: A dataset is scored by code and the study's `sandbox` setting cannot be met here
            (checked before any call; the study then names it in `study.json` and each audit's report).
    """
    protocols = [p.name for p in config.protocols]
    with scope.using(config.sandbox), otel.root_span("study", ",".join(protocols), [], 0):
        return await _play_study(
            config, out, client, ray_address, workers, share_cache, plots, overwrite, on_plan, on_progress
        )


async def _play_study(
    config: StudyConfig,
    out: str | Path,
    client: ModelClient,
    ray_address: str | None,
    workers: int | None,
    share_cache: bool,
    plots: bool | None,
    overwrite: bool,
    on_plan: Callable[[int, int], None] | None,
    on_progress: Callable[[int], None] | None,
) -> StudyReport:
    started = time.perf_counter()
    out = Path(out)
    plan = build_plan(config)
    sandbox = code_sandbox(plan)  # fail closed, before the first call
    plan.sandbox = scope.current()  # Ray workers play under the driver's setting, whatever their env says
    plan.stall_after = config.stall_after
    if overwrite:
        _discard(out)
    out.mkdir(parents=True, exist_ok=True)
    started_at = _read_state(out)
    _write_header(plan, config, out)
    ledgers = _Ledgers(plan, out, client)
    done = {s.key: ledgers.done(s) for s in plan.settings}
    if on_plan is not None:
        on_plan(plan.plays_planned(), sum(len(v) for v in done.values()))

    backend: dict[str, Any] = {"backend": "in-process", "workers": 1, "shards": 1}
    if ray_address is None:
        runner = ShardRunner(plan, client)

        def on_plays(plays: list[tuple[str, Play]]) -> None:
            ledgers.record_many(plays)
            if on_progress is not None:
                on_progress(len(plays))

        # (LiteLLM loaded, if at all, before any play's deadline.)
        await client.prepare(member for pool in plan.pools.values() for member in pool)
        await runner.run(Shard(0, plan.examples), done, on_plays)
    else:
        # Blocking: the driver only waits for shards (Ray wants its driver calls on the main thread).
        backend = _play_on_ray(
            ray_address, plan, config, done, ledgers, client, workers, share_cache, on_progress
        )

    rows = []
    for setting in plan.audits:
        dataset = plan.datasets[setting.dataset]
        try:
            report = await play_audit(
                setting.spec,
                plan.pools[setting.pool],
                plan.examples[setting.dataset],
                client=client,
                method=config.method,  # type: ignore[arg-type]
                budget=config.budget,
                budget_unit=config.budget_unit,  # type: ignore[arg-type]
                target_error=config.target_error,
                seed=config.seed or 0,
                scorer=setting.scorer,
                out=out / setting.folder,
                dataset=dataset.source,
                force=config.force,
                plots=False,
            )
            error = None
        except AuditError as err:
            report, error = None, str(err)
        rows.append(setting_result(setting, report, len(plan.examples[setting.dataset]), error))

    measure = "loo" if config.method == "loo" else "shapley"
    study = StudyReport(
        method=config.method,  # type: ignore[arg-type]
        measure=measure,
        pools={name: pool.names for name, pool in plan.pools.items()},
        protocols=[{"name": p.name, "label": p.label, "params": p.params} for p in config.protocols],
        datasets=[
            {
                "source": d.source,
                "label": d.label,
                "split": d.split,
                "scorer": d.scorer,
                "n_examples": len(plan.examples[d.label]),
            }
            for d in config.datasets
        ],  # fmt: skip
        settings=rows,
        correlations=correlation_rows(rows, measure),
        calls=_study_calls(plan, out, client, started_at),
        wall_s=round(time.perf_counter() - started, 3),
        **backend,
        **({"sandbox": sandbox} if sandbox is not None else {}),
    )
    images = write_plots(study, out) if (plots_available() if plots is None else plots) else {}
    write_study(study, out, images=images)
    return study


def code_sandbox(plan: StudyPlan) -> dict[str, Any] | None:
    """The sandbox record of the study's code scores (`colab_graphs.tasks.scoring.require_sandbox`), None without any."""
    records = [require_sandbox(plan.examples[label], d.scorer) for label, d in plan.datasets.items()]
    return next((r for r in records if r is not None), None)


def _play_on_ray(
    address: str,
    plan: StudyPlan,
    config: StudyConfig,
    done: dict[str, list[Play]],
    ledgers: _Ledgers,
    client: ModelClient,
    workers: int | None,
    share_cache: bool,
    on_progress: Callable[[int], None] | None,
) -> dict[str, Any]:
    from colab_graphs.study import distributed

    try:
        ray, connected = distributed.connect(address)
    except distributed.DistributedError as err:
        raise StudyError(str(err)) from None
    try:
        distributed.wait_for_workers(ray)
        n_workers = workers or distributed.cluster_cpus(ray)
        shards = make_shards(plan.examples, shard_count(plan, n_workers, config.shard_size))

        def done_for(shard: Shard) -> dict[str, list[Play]]:
            ids = {label: {e.id for e in examples} for label, examples in shard.examples.items()}
            return {
                s.key: [p for p in done[s.key] if p.example_id in ids.get(s.dataset, ())]
                for s in plan.settings
            }

        def on_result(result: ShardResult) -> None:
            # Cache entries first: a driver killed between the two replays the plays from the cache.
            if client.cache is not None:
                for key, model, request, response, member in result.entries:
                    client.cache.put(key, model, request, response, member)
            ledgers.record_many(result.plays)

        options = {
            "max_concurrency": client.max_concurrency,
            "retries": client.retries,
            "backoff_s": client.backoff_s,
            "backoff_max_s": client.backoff_max_s,
            "timeout_s": client.timeout_s,
            "preflight": client.preflight,
        }
        cache_dir = str(client.cache.directory) if client.cache is not None else None
        run = distributed.play_on_ray(
            ray, plan, shards, done_for, workers=n_workers, client_options=options, cache_dir=cache_dir,
            share_cache=share_cache, on_result=on_result, on_progress=on_progress,
        )  # fmt: skip
    except distributed.DistributedError as err:
        raise StudyError(str(err)) from None
    finally:
        if connected:
            ray.shutdown()
    return {
        "backend": f"ray ({address})",
        "workers": run.workers,
        "shards": run.shards,
        "worker_cpu_s": run.worker_cpu_s,
        "retried_shards": run.retried_shards,
    }


def _study_calls(plan: StudyPlan, out: Path, client: ModelClient, started_at: float) -> dict[str, Any]:
    """Calls of the whole study: the accounting of every play of every setting (each play once: the last one
    recorded, as an audit resumes from it)."""
    plays: dict[tuple[str, PlayKey], Play] = {}
    for setting in plan.settings:
        kind = "solo" if setting.protocol is None else "coalition"
        for play in read_plays(out / setting.folder):
            if play.game == kind:
                plays[(setting.key, play_key(play))] = play
    everything = list(plays.values())
    return account(everything, made_since(client.cache, everything, started_at)).calls()
