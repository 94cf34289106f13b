"""The Python API: run, audit, study and train, each in an async form and a sync one.

The sync forms (`run`, `run_audit`, `run_study`, `train`) take exactly the async forms' arguments and work
anywhere, a notebook's running event loop included: the work runs on the package's one background event loop
(LiteLLM keeps per-loop state; one loop serves every call) and the caller waits for it. The async forms
(`arun`, `arun_audit`, `arun_study`, `atrain`) run on the caller's loop. While one writes its `out` folder, the
folder is locked (`colab_graphs.files.OutLock`): a second writer, in this process or another, gets `FolderBusy`.

A pool is a `Pool`, a pool file, or a mapping of member name -> LiteLLM settings; data is a source name or
file (see `load_examples`) or a list of examples (`Example`s or mappings); a protocol is a registered name, a
`GraphSpec`, or a graph reference ``path/to/file.py:NAME``. A run and an audit also take a LangGraph app (an
object, or ``app="path/to/file.py:NAME"`` / ``"module:NAME"`` / ``"langgraph.json:NAME"``) whose model calls use
`member_chat_model` (see `colab_graphs.audit.app`); ``input_key=``, ``answer_key=`` and ``mode=`` ("auto",
"keys", "messages", "value") map its own state (see `colab_graphs.audit.app_contract.AppIO`). An app
named by a graph factory that is async or a context manager is awaited or entered on the loop the work runs
on, as LangGraph's server does, and its context exited when the work ends (`colab_graphs.audit.app_load`).

Progress: `on_progress` is called with a `Progress` as work finishes (from the thread that runs the work);
`progress=True` shows a rich progress bar (in a terminal or a notebook), the default when the output is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from colab_graphs import otel
from colab_graphs.accounting import count_calls
from colab_graphs.files import empty_folder, holding
from colab_graphs.langchain.binding import AbsentRule
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient, background_loop
from colab_graphs.pool import Pool
from colab_graphs.runner import RESULT_COLUMNS, ExampleOutcome
from colab_graphs.spec import GraphSpec
from colab_graphs.tables import html_table, to_dataset, to_pandas
from colab_graphs.tasks.checks import check_examples
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.loaders import load_examples

if TYPE_CHECKING:
    from colab_graphs.audit.report import AuditReport
    from colab_graphs.langchain.member_chat import MemberChatModel
    from colab_graphs.study.report import StudyReport
    from colab_graphs.trainers.config import TrainConfig

T = TypeVar("T")
P = ParamSpec("P")
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

    def rows(self) -> list[dict[str, Any]]:
        """One row per example: id, input, gold, prediction, score, failed, error, output, and `answer` (the
        prediction's deprecated name) (`results.jsonl`'s lines; `colab_graphs.runner.RESULT_COLUMNS`)."""
        return [o.result_line() for o in self.outcomes]

    def to_pandas(self) -> Any:
        """The examples as a `pandas.DataFrame` (one row each; needs the `notebook` extra)."""
        return to_pandas(self.rows(), RESULT_COLUMNS)

    def to_dataset(self) -> Any:
        """The examples as a Hugging Face `datasets.Dataset` (needs the `notebook` extra)."""
        return to_dataset(self.rows(), RESULT_COLUMNS)

    def _repr_html_(self) -> str:
        s = self.summary
        score = "n/a" if s["score"] is None else f"{s['score']:.3f}"
        notes = [
            f"score {score} over {s.get('scored', s['n'])} example(s); failed {s['failed']}; calls made "
            f"{s['calls']['made']}, cached {s['calls']['cached']}"
        ]
        return html_table(f"Run of {s['protocol']}", self.rows(), RESULT_COLUMNS, notes)


@dataclass
class Progress:
    """How far a run, audit or study has got: `done` of `total` units ("example", "play" or "setting play"),
    and the calls of the finished units, made and served without a call of their own (from the cache, or
    from another coalition's identical call); None for a study, whose plays may run elsewhere."""

    description: str
    unit: str
    done: int = 0
    total: int | None = None
    calls_made: int | None = 0
    calls_cached: int | None = 0


@dataclass
class _Reporter:
    """Feeds `on_progress` and, when asked, a rich progress bar (rich renders it in a notebook too). Calls are
    counted from the finished work's own call records, as the report counts them (a call another coalition
    already made counts as cached)."""

    progress: Progress
    callback: Callable[[Progress], None] | None
    show: bool | None
    _bar: Any = field(default=None, init=False)
    _task: Any = field(default=None, init=False)

    def __enter__(self) -> _Reporter:
        from rich.console import Console

        console = Console(stderr=True)
        if self.show or (self.show is None and (console.is_terminal or console.is_jupyter)):
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"),
                console=console,
            )
            self._task = self._bar.add_task(self.progress.description, total=None, status="")
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def plan(self, total: int, done: int = 0) -> None:
        self.progress.total, self.progress.done = total, done
        self._emit()

    def advance(self, n: int = 1, calls: Sequence[Any] | None = None) -> None:
        p = self.progress
        p.done += n
        if calls is not None:
            made, cached = count_calls(calls)
            p.calls_made, p.calls_cached = (p.calls_made or 0) + made, (p.calls_cached or 0) + cached
        self._emit()

    def _emit(self) -> None:
        p = self.progress
        if self._bar is not None:
            status = "" if p.calls_made is None else f"calls {p.calls_made} made, {p.calls_cached} cached"
            self._bar.update(self._task, total=p.total, completed=p.done, status=status)
        if self.callback is not None:
            self.callback(Progress(**p.__dict__))


def synced(async_form: Callable[P, Awaitable[T]]) -> Callable[P, T]:
    """The sync form of an API function: the same signature (for type checkers and `help()` alike), run on the
    background loop and waited for."""

    @functools.wraps(async_form)
    def sync_form(*args: P.args, **kwargs: P.kwargs) -> T:
        return sync(lambda: async_form(*args, **kwargs))

    sync_form.__name__ = sync_form.__qualname__ = async_form.__name__.removeprefix("a")
    sync_form.__doc__ = f"`{async_form.__name__}`, waited for (works inside a running event loop).\n\n" + (
        async_form.__doc__ or ""
    )
    return sync_form


def sync(make: Callable[[], Awaitable[T]]) -> T:
    """Run the coroutine `make()` builds on the background loop and wait for it (works inside a running loop).

    LiteLLM's calls run on the package's call loop whatever loop waits for them (`colab_graphs.models.loops`),
    which stops LiteLLM's logging worker at exit: nothing is left pending on either loop.
    """

    async def main() -> T:
        return await make()

    # (The caller's trace context goes along: a run started inside the user's own span is its child.)
    otel.tracing_from_env()
    return asyncio.run_coroutine_threadsafe(otel.carried(main()), background_loop()).result()


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


def as_examples(
    data: DataLike | None,
    limit: int | None = None,
    seed: int | None = None,
    scorer: Any = None,
    *,
    fields: Mapping[str, str] | None = None,
    split: str | None = None,
) -> list[Example]:
    """Examples from a source name or file (JSONL, JSON, CSV, ``hf:``), a `datasets.Dataset` / `DatasetDict`
    (`split` picks one), a pandas `DataFrame`, or a list of examples or mappings (None: the embedded default),
    checked for what `scorer` (a name; None: each example's default) needs before any call is made.
    `limit` keeps the first `limit` (>= 1; None: all). `fields` maps an Example field to the records' field
    (``{"input": "question", "answer": "label", "id": "uid"}``, as inspect_ai's `FieldSpec`); see
    `colab_graphs.tasks.loaders.load_examples`."""
    named = scorer if isinstance(scorer, str) else None
    field_map = _field_map(fields)
    if data is None:
        from colab_graphs.defaults import DEFAULT_DATA, DEFAULT_LIMIT

        return load_examples(DEFAULT_DATA, limit=limit or DEFAULT_LIMIT, shuffle_seed=seed, scorer=named)
    if isinstance(data, str | os.PathLike) or not isinstance(data, list | tuple) or field_map:
        # (A Dataset and a DataFrame iterate as records and column names: they go to the loader, as files do.)
        rows = list(data) if isinstance(data, list | tuple) else data
        return load_examples(
            rows, split=split, limit=limit, shuffle_seed=seed, field_map=field_map, scorer=named
        )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        from colab_graphs.tasks.example import DatasetError

        raise DatasetError(f"limit must be an integer >= 1 (None: every example), got {limit!r}")
    examples = [e if isinstance(e, Example) else Example.model_validate(e) for e in data]
    examples = examples[:limit] if limit is not None else examples
    if scorer is None or named is not None:
        check_examples(examples, named, "examples given in Python")
    return examples


def _data_name(data: Any) -> str | None:
    """How a report names the data: the source or file, or the kind of object ("pandas.DataFrame",
    "datasets.Dataset"); None for a list of examples."""
    if data is None or isinstance(data, list | tuple):
        return None
    if isinstance(data, str | os.PathLike):
        return os.fspath(data)
    kind = type(data)
    return f"{kind.__module__.split('.')[0]}.{kind.__name__}"


def _field_map(fields: Any) -> dict[str, str] | None:
    """`fields` as an Example field -> record field mapping: a mapping, or an object with such attributes
    (inspect_ai's `FieldSpec`: `target` is the answer); None when nothing is mapped."""
    if fields is None:
        return None
    if not isinstance(fields, Mapping):
        # inspect_ai's FieldSpec defaults id, choices and target to their own names, optional fields there: a
        # name left at its default maps nothing (an absent "id" column must not refuse the data).
        names = {"input": "input", "answer": "target", "id": "id", "choices": "choices"}
        fields = {
            k: v
            for k, a in names.items()
            if isinstance(v := getattr(fields, a, None), str) and (k == "input" or v != a)
        }
    out = {"answer" if k == "target" else str(k): str(v) for k, v in fields.items() if v is not None}
    return out or None


def as_spec(
    protocol: str | GraphSpec | None, pool: Pool, params: Mapping[str, Any] | None = None
) -> GraphSpec:
    """The GraphSpec to run over `pool`: a spec as given, a graph reference (``file.py:NAME``) or a name."""
    if isinstance(protocol, GraphSpec):
        return protocol
    from colab_graphs.resolve import resolve_protocol

    graph = protocol if protocol and ":" in protocol else None
    return resolve_protocol(
        None if graph else protocol, pool.names, dict(params or {}), graph=graph, pool=pool
    )


def as_client(
    client: ModelClient | None, cache_dir: str | os.PathLike[str] | None, max_concurrency: int
) -> ModelClient:
    """The given client, else one with the on-disk call cache (`cache_dir`, default the user cache) that checks
    each HTTP endpoint answers before its first call (`ModelClient(preflight=True)`)."""
    return client or ModelClient(CallCache(cache_dir), max_concurrency=max_concurrency, preflight=True)


def _is_app(obj: Any) -> bool:
    """A LangGraph app (compiled graph or builder) rather than a protocol name, spec or graph reference."""
    return obj is not None and not isinstance(obj, str | os.PathLike | GraphSpec)


@contextlib.asynccontextmanager
async def _app_of(
    protocol: Any, app: Any, pool: Pool, input_key: str | None, answer_key: str | None, mode: str
) -> AsyncIterator[tuple[Any, Any] | None]:
    """(app, `AppSpec`) when an app is given (`app=`, or an app object for the protocol), made on this loop
    (an async factory awaited, a context manager entered until this context ends: `app_load.open_app`), its
    mapping checked before any call; None for a protocol (then the mapping options must not be given)."""
    if app is None and not _is_app(protocol):
        if input_key is not None or answer_key is not None or mode != "auto":
            raise ValueError("input_key, answer_key and mode map an app's state: give an app (app=...)")
        yield None
        return
    from colab_graphs.audit.app_contract import AppIO
    from colab_graphs.audit.app_load import open_app

    if app is not None and protocol is not None:
        raise ValueError("give a protocol or an app, not both")
    io = AppIO(input_key, answer_key, mode)  # type: ignore[arg-type]
    async with open_app(app if app is not None else protocol, pool.names, io) as opened:
        yield opened


async def arun(
    protocol: str | GraphSpec | Any | None = None,
    pool: PoolLike | None = None,
    data: DataLike | None = None,
    *,
    app: str | Any | None = None,
    input_key: str | None = None,
    answer_key: str | None = None,
    mode: str = "auto",
    params: Mapping[str, Any] | None = None,
    scorer: str | None = None,
    out: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    limit: int | None = None,
    seed: int | None = None,
    fields: Mapping[str, str] | Any | None = None,
    split: str | None = None,
    client: ModelClient | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_concurrency: int = 16,
    on_progress: Callable[[Progress], None] | None = None,
    progress: bool | None = None,
    sandbox: str | None = None,
    example_timeout: float | None = None,
    stall_after: float | None = None,
) -> RunResult:
    """Run a protocol, or score a LangGraph app once with the whole pool, over a dataset (what `colab-graphs
    run` does); writes the run outputs (results.jsonl, traces.jsonl, summary.json, log.jsonl) under `out`.

    `protocol`: a protocol (name, `GraphSpec`, graph reference) or a LangGraph app object; `app`: an app
    reference instead (``file.py:NAME``, ``module:NAME``, ``langgraph.json:NAME``); `input_key`, `answer_key`,
    `mode`: how the app's state is mapped (`colab_graphs.audit.app_contract.AppIO`). `sandbox`: where
    code-scored answers run (`colab_graphs.sandbox.scope`: auto | namespaces | landlock | unsafe-local; None:
    env, else auto); checked before any call (`SandboxUnavailable`). `example_timeout`, `stall_after`: each
    example's deadline and the stall watchdog's time, as `arun_audit`'s (an app's default deadline: 600 s).
    `data`: see `as_examples` (a source or file, a `datasets.Dataset` / `DatasetDict` with `split`, a pandas
    `DataFrame`, a list); `fields` maps Example fields to the records' (``{"input": "question", "answer":
    "label"}``). `overwrite`: discard an earlier run in `out` (else a run of the same protocol, pool and data
    resumes it, and a different one is refused).
    """
    from colab_graphs.audit.app import run_app
    from colab_graphs.fitting import run_fitted
    from colab_graphs.sandbox import scope
    from colab_graphs.tasks.scoring import require_sandbox

    the_pool = as_pool(pool)
    async with _app_of(protocol, app, the_pool, input_key, answer_key, mode) as the_app:
        spec = the_app[1] if the_app is not None else as_spec(protocol, the_pool, params)
        examples = as_examples(data, limit, seed, scorer, fields=fields, split=split)  # before any call
        require_sandbox(examples, scorer, sandbox)  # code scores: before any call, a fit's included
        the_client = as_client(client, cache_dir, max_concurrency)
        with (
            scope.using(sandbox),
            holding(out, "colab_graphs.run"),
            _Reporter(Progress(f"run {spec.name}", "example"), on_progress, progress) as report,
        ):
            report.plan(len(examples))
            options: dict[str, Any] = {
                "client": the_client,
                "scorer": scorer,
                "out": out,
                "overwrite": overwrite,
                "on_progress": lambda outcome: report.advance(calls=outcome.trace.calls),
                "example_timeout": example_timeout,
                "stall_after": stall_after,
            }
            if the_app is not None:
                outcomes, summary = await run_app(the_app[0], spec, the_pool, examples, **options)
            else:
                outcomes, summary = await run_fitted(spec, the_pool, examples, **options)
    _warn(summary.get("warnings", []))
    return RunResult(outcomes, summary)


def _warn(texts: Sequence[str]) -> None:
    """Say a result's warnings (`colab_graphs.mechanism`) on the "colab_graphs" logger: a value to distrust
    is never returned in silence (the CLI prints them itself)."""
    import logging

    for text in texts:
        logging.getLogger("colab_graphs").warning("%s", text)


async def arun_audit(
    protocol: str | GraphSpec | Any | None = None,
    pool: PoolLike | None = None,
    data: DataLike | None = None,
    *,
    app: str | Any | None = None,
    input_key: str | None = None,
    answer_key: str | None = None,
    mode: str = "auto",
    method: str = "loo",
    budget: int | None = None,
    budget_unit: str = "calls",
    target_error: float | None = None,
    simultaneous: bool = False,
    params: Mapping[str, Any] | None = None,
    scorer: str | None = None,
    out: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    limit: int | None = None,
    seed: int = 0,
    fields: Mapping[str, str] | Any | None = None,
    split: str | None = None,
    individual: bool = True,
    plots: bool | None = None,
    force: bool = False,
    max_calls: int | None = None,
    max_cost_usd: float | None = None,
    play_every_coalition: bool = False,
    client: ModelClient | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_concurrency: int = 16,
    example_timeout: float | None = None,
    stall_after: float | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    progress: bool | None = None,
    sandbox: str | None = None,
) -> AuditReport:
    """Audit each member's contribution to a protocol or a LangGraph app (what `colab-graphs audit` does).

    `protocol`: a protocol (name, `GraphSpec`, graph reference) or a LangGraph app object; `app`: an app
    reference ``path/to/file.py:NAME`` / ``module:NAME`` / ``langgraph.json:NAME`` instead; `input_key`,
    `answer_key`, `mode` ("auto", "keys", "messages", "value"): how the app's state is mapped
    (`colab_graphs.audit.app_contract.AppIO`; checked against the app before any call). `method`: "loo" (n + 1 coalitions), "exact"
    (all 2^n) or "sampled" (`budget` in `budget_unit`: distinct calls, coalitions or permutations; or until
    `target_error`); `simultaneous`: its sampling intervals (and `target_error`) hold all members at once, not
    each alone. `max_calls` / `max_cost_usd` cap the audit's spending (the report is then `partial`; run
    again to finish it). `sandbox`: where code-scored answers run (as `arun`). `example_timeout`: each play's
    deadline in seconds, after which it fails saying what
    it waited for (None: 600 for an app, none for a protocol; 0: none); `stall_after`: log what every play
    waits for when no call and no node has finished for that long (None: 60; 0: never). Writes report.json,
    report.md and plots under `out` when given; `overwrite` discards an earlier audit there first. `data`,
    `fields`, `split`: as `arun`'s.
    """
    from colab_graphs.audit.run import play_audit

    the_pool = as_pool(pool)
    the_client = as_client(client, cache_dir, max_concurrency)
    examples = as_examples(data, limit, seed or None, scorer, fields=fields, split=split)
    dataset = _data_name(data)
    game = None
    async with _app_of(protocol, app, the_pool, input_key, answer_key, mode) as the_app:
        spec = the_app[1] if the_app is not None else as_spec(protocol, the_pool, params)
        with (
            holding(out, "colab_graphs.run_audit"),
            _Reporter(Progress(f"audit {spec.name}", "play"), on_progress, progress) as report,
        ):
            if overwrite and out is not None:
                from colab_graphs.log.reader import check_overwritable

                check_overwritable(out, "audit")
                empty_folder(out)
            if the_app is not None:  # (made in the held folder: an app's game opens its log)
                from colab_graphs.audit.app import AppGame

                game = AppGame(
                    the_app[0],
                    spec,
                    the_pool,
                    examples,
                    client=the_client,
                    scorer=scorer,
                    store=out,
                    dataset=dataset,
                )
            audited = await play_audit(
                spec,  # type: ignore[arg-type]
                the_pool,
                examples,
                client=the_client,
                method=method,  # type: ignore[arg-type]
                budget=budget,
                budget_unit=budget_unit,  # type: ignore[arg-type]
                target_error=target_error,
                simultaneous=simultaneous,
                max_calls=max_calls,
                max_cost_usd=max_cost_usd,
                play_every_coalition=play_every_coalition,
                seed=seed,
                scorer=scorer,
                out=out,
                dataset=dataset,
                force=force,
                individual=individual,
                plots=plots,
                on_plan=report.plan,
                on_progress=lambda play: report.advance(calls=play.calls),
                game=game,
                sandbox=sandbox,
                example_timeout=example_timeout,
                stall_after=stall_after,
            )
    _warn(audited.warnings)
    return audited


async def arun_study(
    config: str | os.PathLike[str] | Any,
    out: str | os.PathLike[str],
    *,
    ray: str | None = None,
    client: ModelClient | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_concurrency: int = 16,
    overwrite: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
    progress: bool | None = None,
    sandbox: str | None = None,
    stall_after: float | None = None,
) -> StudyReport:
    """Run a study (pools x protocols x datasets; what `colab-graphs study` does); `ray`: a cluster address.

    `sandbox`: where code-scored answers run (as `arun`; default: the study file's `sandbox:`); `stall_after`:
    the stall watchdog's time, as `arun_audit`'s."""
    import dataclasses

    from colab_graphs.sandbox.scope import normalize
    from colab_graphs.study.config import StudyConfig, load_study_config
    from colab_graphs.study.run import play_study

    the_config = config if isinstance(config, StudyConfig) else load_study_config(config)
    if sandbox is not None:
        the_config = dataclasses.replace(the_config, sandbox=normalize(sandbox))
    if stall_after is not None:
        the_config = dataclasses.replace(the_config, stall_after=stall_after)
    the_client = as_client(client, cache_dir, max_concurrency)
    # The study reports finished plays by number only (they may run on Ray workers): no call counts.
    counting = Progress("study", "setting play", calls_made=None, calls_cached=None)
    with holding(out, "colab_graphs.run_study"), _Reporter(counting, on_progress, progress) as report:
        return await play_study(
            the_config,
            out,
            client=the_client,
            ray_address=ray,
            overwrite=overwrite,
            on_plan=report.plan,
            on_progress=report.advance,
        )


def member_chat_model(
    name: str,
    *,
    on_absent: AbsentRule = "raise",
    substitute: str | None = None,
    pool: Pool | None = None,
    client: ModelClient | None = None,
    **options: Any,
) -> MemberChatModel:
    """Pool member `name` as a LangChain chat model, to use anywhere in a LangGraph app.

    Its calls go through the call path as that member's (cached, single-flight, traced, counted). Under an
    app audit (`colab_graphs.run_audit(app, pool, data)`, `colab-graphs audit --app FILE.py:NAME`) the
    audit's pool, client and coalition apply; a member outside the coalition follows `on_absent` ("raise"
    `MemberAbsent`, answer "empty", or "substitute" another member). Outside an audit, `pool` (and `client`,
    default the process-wide one) say where calls go.

    Example:
        >>> import colab_graphs as cg
        >>> coder = cg.member_chat_model("coder")                  # doctest: +SKIP
        >>> coder.bind_tools([run_python]).invoke("Print 2 + 2")   # doctest: +SKIP
    """
    # LangChain's chat model base loads here, not when the package is imported.
    from colab_graphs.langchain.member_chat import MemberChatModel

    return MemberChatModel(
        member_name=name, on_absent=on_absent, substitute=substitute, pool=pool, client=client, **options
    )


@contextlib.contextmanager
def use_pool(pool: PoolLike, client: ModelClient | None = None) -> Iterator[Pool]:
    """Where `member_chat_model` calls go in this block (and the tasks and threads it starts): `pool`'s
    members, through `client` (default: the process-wide client with the on-disk cache). For running an app
    yourself; an audit binds its own pool, client and coalition around each run.

    Example:
        >>> with cg.use_pool("pool.yaml"):                                   # doctest: +SKIP
        ...     print(asyncio.run(app.ainvoke({"input": "What is 2 + 3?"}))["answer"])
    """
    from colab_graphs.langchain.binding import MemberBinding, bind_members
    from colab_graphs.models.client import default_client

    the_pool = as_pool(pool)
    with bind_members(MemberBinding(the_pool, client or default_client())):
        yield the_pool


run = synced(arun)
run_audit = synced(arun_audit)
run_study = synced(arun_study)


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
