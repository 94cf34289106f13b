"""The Python API: run, audit, study and train, each in an async form and a sync one.

The sync forms (`run`, `run_audit`, `run_study`, `train`) work anywhere, a notebook's running event loop
included: the work runs on the package's one background event loop (LiteLLM keeps per-loop state; one loop
serves every call) and the caller waits for it. The async forms (`arun`, `arun_audit`, `arun_study`, `atrain`)
run on the caller's loop.

A pool is a `Pool`, a pool file, or a mapping of member name -> LiteLLM settings; data is a source name or
file (see `load_examples`) or a list of examples (`Example`s or mappings); a protocol is a registered name, a
`GraphSpec`, or a graph reference ``path/to/file.py:NAME``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from colab_graphs.compile import background_loop
from colab_graphs.data.example import Example
from colab_graphs.data.loaders import load_examples
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.runner import ExampleOutcome
from colab_graphs.spec import GraphSpec

if TYPE_CHECKING:
    from colab_graphs.audit.report import AuditReport
    from colab_graphs.study.report import StudyReport
    from colab_graphs.trainers.config import TrainConfig

T = TypeVar("T")
PoolLike = Pool | str | os.PathLike[str] | Mapping[str, Mapping[str, Any]]
DataLike = str | os.PathLike[str] | Sequence[Example | Mapping[str, Any]]


@dataclass
class RunResult:
    """A run's outcomes (one per example, dataset order) and its summary (`summary.json`'s fields)."""

    outcomes: list[ExampleOutcome]
    summary: dict[str, Any]

    @property
    def score(self) -> float | None:
        return self.summary["score"]


def sync(make: Callable[[], Awaitable[T]]) -> T:
    """Run the coroutine `make()` builds on the background loop and wait for it (works inside a running loop)."""

    async def main() -> T:
        return await make()

    return asyncio.run_coroutine_threadsafe(main(), background_loop()).result()


def as_pool(pool: PoolLike | None) -> Pool:
    """A `Pool` from a pool, a pool file, or a mapping of member settings (None: the embedded default)."""
    if pool is None:
        from colab_graphs.defaults import default_pool

        return default_pool()
    if isinstance(pool, Pool):
        return pool
    if isinstance(pool, Mapping):
        return Pool.from_dict(dict(pool.get("models", pool)), source="pool given in Python")
    return Pool.from_yaml(pool)


def as_examples(data: DataLike | None, limit: int | None = None, seed: int | None = None) -> list[Example]:
    """Examples from a source name or file, or a list of examples or mappings (None: the embedded default)."""
    if data is None:
        from colab_graphs.defaults import DEFAULT_DATA, DEFAULT_LIMIT

        return load_examples(DEFAULT_DATA, limit=limit or DEFAULT_LIMIT, shuffle_seed=seed)
    if isinstance(data, str | os.PathLike):
        return load_examples(data, limit=limit, shuffle_seed=seed)
    examples = [e if isinstance(e, Example) else Example.model_validate(e) for e in data]
    return examples[:limit] if limit is not None else examples


def as_spec(
    protocol: str | GraphSpec | None, pool: Pool, params: Mapping[str, Any] | None = None
) -> GraphSpec:
    """The GraphSpec to run over `pool`: a spec as given, a graph reference (``file.py:NAME``) or a name."""
    if isinstance(protocol, GraphSpec):
        return protocol
    from colab_graphs.protocols.resolve import resolve_protocol

    graph = protocol if protocol and ":" in protocol else None
    return resolve_protocol(
        None if graph else protocol, pool.names, dict(params or {}), graph=graph, pool=pool
    )


def as_client(
    client: ModelClient | None, cache_dir: str | os.PathLike[str] | None, max_concurrency: int
) -> ModelClient:
    """The given client, else one with the on-disk call cache (`cache_dir`, default the user cache)."""
    return client or ModelClient(CallCache(cache_dir), max_concurrency=max_concurrency)


async def arun(
    protocol: str | GraphSpec | None = None,
    pool: PoolLike | None = None,
    data: DataLike | None = None,
    *,
    params: Mapping[str, Any] | None = None,
    scorer: str | None = None,
    out: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    seed: int | None = None,
    client: ModelClient | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_concurrency: int = 16,
) -> RunResult:
    """Run a protocol over a dataset (what `colab-graphs run` does); writes the run outputs under `out`."""
    from colab_graphs.protocols.fitting import fit_coalition
    from colab_graphs.runner import run_dataset

    the_pool = as_pool(pool)
    spec = as_spec(protocol, the_pool, params)
    the_client = as_client(client, cache_dir, max_concurrency)
    fitted = await fit_coalition(spec, the_pool, client=the_client, scorer=scorer)
    outcomes, summary = await run_dataset(
        fitted.spec if fitted is not None else spec,
        the_pool,
        as_examples(data, limit, seed),
        client=the_client,
        scorer=scorer,
        out=out,
    )
    return RunResult(outcomes, summary)


def run(
    protocol: str | GraphSpec | None = None,
    pool: PoolLike | None = None,
    data: DataLike | None = None,
    **options: Any,
) -> RunResult:
    """`arun`, waited for (works inside a running event loop)."""
    return sync(lambda: arun(protocol, pool, data, **options))


async def arun_audit(
    protocol: str | GraphSpec | None = None,
    pool: PoolLike | None = None,
    data: DataLike | None = None,
    *,
    method: str = "loo",
    budget: int | None = None,
    budget_unit: str = "calls",
    target_error: float | None = None,
    params: Mapping[str, Any] | None = None,
    scorer: str | None = None,
    out: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    seed: int = 0,
    individual: bool = True,
    plots: bool | None = None,
    force: bool = False,
    max_calls: int | None = None,
    max_cost_usd: float | None = None,
    play_every_coalition: bool = False,
    client: ModelClient | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_concurrency: int = 16,
) -> AuditReport:
    """Audit each member's contribution to a protocol (what `colab-graphs audit` does).

    `method`: "loo" (n + 1 coalitions), "exact" (all 2^n) or "sampled" (`budget` in `budget_unit`: distinct
    calls, coalitions or permutations; or until `target_error`). `max_calls` / `max_cost_usd` cap the audit's
    spending (the report is then `partial`; run again to finish it). Writes report.json, report.md and plots
    under `out` when given.
    """
    from colab_graphs.audit.run import play_audit

    the_pool = as_pool(pool)
    return await play_audit(
        as_spec(protocol, the_pool, params),
        the_pool,
        as_examples(data, limit, seed or None),
        client=as_client(client, cache_dir, max_concurrency),
        method=method,  # type: ignore[arg-type]
        budget=budget,
        budget_unit=budget_unit,  # type: ignore[arg-type]
        target_error=target_error,
        max_calls=max_calls,
        max_cost_usd=max_cost_usd,
        play_every_coalition=play_every_coalition,
        seed=seed,
        scorer=scorer,
        out=out,
        dataset=data if isinstance(data, str) else None,
        force=force,
        individual=individual,
        plots=plots,
    )


def run_audit(
    protocol: str | GraphSpec | None = None,
    pool: PoolLike | None = None,
    data: DataLike | None = None,
    **options: Any,
) -> AuditReport:
    """`arun_audit`, waited for (works inside a running event loop)."""
    return sync(lambda: arun_audit(protocol, pool, data, **options))


async def arun_study(
    config: str | os.PathLike[str] | Any,
    out: str | os.PathLike[str],
    *,
    ray: str | None = None,
    client: ModelClient | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_concurrency: int = 16,
    overwrite: bool = False,
) -> StudyReport:
    """Run a study (pools x protocols x datasets; what `colab-graphs study` does); `ray`: a cluster address."""
    from colab_graphs.study.config import StudyConfig, load_study_config
    from colab_graphs.study.run import play_study

    the_config = config if isinstance(config, StudyConfig) else load_study_config(config)
    return await play_study(
        the_config,
        out,
        client=as_client(client, cache_dir, max_concurrency),
        ray_address=ray,
        overwrite=overwrite,
    )


def run_study(
    config: str | os.PathLike[str] | Any, out: str | os.PathLike[str], **options: Any
) -> StudyReport:
    """`arun_study`, waited for (works inside a running event loop)."""
    return sync(lambda: arun_study(config, out, **options))


def train(
    config: TrainConfig | str | os.PathLike[str] | Mapping[str, Any], **overrides: Any
) -> dict[str, Any]:
    """Train a policy with C-RL (what `colab-graphs train` does): a `TrainConfig`, a YAML file or a mapping;
    `overrides` replace fields. Returns the run's summary (before/after evaluation, paths). Inside a running
    event loop (a notebook) the training runs in a worker thread, which this waits for."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _train(config, overrides)
    with ThreadPoolExecutor(1) as worker:
        return worker.submit(_train, config, overrides).result()


def _train(config: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    from colab_graphs.trainers.config import TrainConfig, config_from_dict, load_config
    from colab_graphs.trainers.pipeline import train as run_training

    if isinstance(config, TrainConfig):
        the_config = config
    elif isinstance(config, Mapping):
        the_config = config_from_dict({**config, **overrides}, where="train config given in Python")
    else:
        the_config = load_config(Path(config), **overrides)
    return run_training(the_config)


async def atrain(
    config: TrainConfig | str | os.PathLike[str] | Mapping[str, Any], **overrides: Any
) -> dict[str, Any]:
    """`train` in a worker thread, awaited (training runs its own event loop for rollouts)."""
    return await asyncio.to_thread(_train, config, overrides)
