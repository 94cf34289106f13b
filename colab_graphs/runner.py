"""Run a graph over a dataset: one event loop, bounded concurrency, progress, resume, traces.

Outputs (`--out DIR`): `results.jsonl` (one line per example: id, input, gold, prediction, score, failed, error,
output; see `RESULT_COLUMNS`),
`traces.jsonl` (every call), `summary.json`, and the run's log (`log.jsonl`, see `colab_graphs.log`: header,
examples, each distinct call once, one play per example). Each example's lines are appended the moment it
finishes, so a killed run loses nothing; running the same command again skips finished examples (their calls
are cached anyway) and rewrites the files in dataset order at the end.

A run whose examples are scored by code checks its sandbox setting before the first call
(`colab_graphs.tasks.scoring.require_sandbox`: `SandboxUnavailable` where it cannot be met); each code example's line
of `results.jsonl` then names the backend and isolation that ran its code (`sandbox`), and `summary.json` the
setting, backend and isolation of the run (`sandbox`). A run without code scores has neither key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colab_graphs import otel
from colab_graphs.accounting import account
from colab_graphs.compile import RunContext, TemplateError, compile_graph
from colab_graphs.files import atomic_file, atomic_write_text
from colab_graphs.log import ExampleRecord, Header, LogWriter, PlayRecord, read_records
from colab_graphs.log.diff import refusal
from colab_graphs.mechanism import mechanism_notes, warnings
from colab_graphs.models.client import CallError, ModelClient
from colab_graphs.models.flight import Memo
from colab_graphs.pool import Pool
from colab_graphs.redaction import hide_secrets
from colab_graphs.sandbox import scope
from colab_graphs.spec import GraphSpec
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import ScorerFn, require_sandbox, task_for, view_for
from colab_graphs.tasks.task_types import TaskType, TaskView
from colab_graphs.trace import Trace, read_traces, trace_line, write_traces
from colab_graphs.watch import STALL_S, DeadlinePassed, PlayWatch, Watchdog, watching, within


class RunError(RuntimeError):
    pass


RESULT_COLUMNS = ("id", "input", "gold", "prediction", "score", "failed", "error", "output", "answer")
"""`results.jsonl`'s fields (and `RunResult.to_pandas()`'s columns): `input` the question, `gold` the record's
gold answer (None for a coding record, scored by its test), `prediction` the answer the task extracted from the
system's `output`. `answer` is `prediction` under its old name, kept for one release for readers written
before `prediction` existed (deprecated: it is not the dataset's `answer`, which is `gold`)."""


@dataclass
class ExampleOutcome:
    """One example's run: its play (the `Trace`: calls, output, answer, score), read through, and the example
    it played (None where only the trace is known)."""

    trace: Trace
    example: Example | None = None

    @property
    def example_id(self) -> str:
        return self.trace.example_id

    @property
    def output(self) -> str | None:
        return self.trace.output

    @property
    def answer(self) -> str | None:
        return self.trace.answer

    @property
    def score(self) -> float | None:
        return self.trace.score

    @property
    def failed(self) -> bool:
        return self.trace.failed

    @property
    def error(self) -> str | None:
        return self.trace.error

    def result_line(self) -> dict[str, Any]:
        """The example's line of `results.jsonl` (`RESULT_COLUMNS`; `sandbox` only where code was scored)."""
        example = self.example
        line: dict[str, Any] = {
            "id": self.example_id,
            "input": example.input if example is not None else None,
            "gold": example.answer if example is not None else None,
            "prediction": self.answer,
            "score": self.score,
            "failed": self.failed,
            "error": self.error,
            "output": self.output,
            "answer": self.answer,  # deprecated: `prediction` (see RESULT_COLUMNS)
        }
        if self.trace.sandbox is not None:
            line["sandbox"] = self.trace.sandbox
        return line


def resolve_scorer(name: str | ScorerFn | TaskType | None, example: Example) -> ScorerFn:
    """The scoring function for `example`: the task named (or given), else the one its fields call for."""
    return task_for(example, name).score


async def run_example(
    graph: Any,
    spec: GraphSpec,
    pool: Pool,
    client: ModelClient,
    example: Example,
    scorer: str | ScorerFn | TaskType | None = None,
    *,
    view: TaskView | None = None,
    memo: Memo | None = None,
    timeout_s: float | None = None,
    watchdog: Watchdog | None = None,
    game: str = "run",
) -> ExampleOutcome:
    """Run one example through a compiled graph and score it. A failed model call marks it failed.

    The example's task (`scorer`, else its fields' default; or `view`, the task already bound to it) shapes the
    question the members see, answers their votes and cascades, and scores the final output. `memo` shares
    calls between runs of the same example (see `RunContext.memo`). A run not finished within `timeout_s`
    seconds (None: no deadline) is failed, its error saying what it was waiting for (`colab_graphs.watch`);
    `watchdog` watches it with the other runs in flight. `game` names the play in its trace span ("run", or an
    audit's "coalition" / "solo": `colab_graphs.otel`).
    """
    view = view or view_for(example, scorer)
    trace = Trace(example_id=example.id, protocol=spec.name, coalition=list(spec.members))
    with otel.play_span(game, list(spec.members), example.id, spec.name) as span:
        await _play(
            graph, spec, view, trace, RunContext(client, pool, trace, view, memo), timeout_s, watchdog
        )
        otel.play_result(span, trace.score, trace.failed, trace.error)
    return ExampleOutcome(trace, example)


async def _play(
    graph: Any,
    spec: GraphSpec,
    view: TaskView,
    trace: Trace,
    context: RunContext,
    timeout_s: float | None,
    watchdog: Watchdog | None,
) -> None:
    """Play `graph` on the example of `view` and score it into `trace` (a failed call or deadline fails it)."""
    example = view.example
    watch = PlayWatch(f"example {example.id!r} with {', '.join(spec.members) or 'nobody'}", watchdog)
    try:
        with watching(watch):
            run = graph.ainvoke(view.graph_input(), {"recursion_limit": 200}, context=context)
            state = await within(timeout_s, watch, run)
    except CallError as err:
        trace.failed, trace.error = True, str(err)
        return
    except DeadlinePassed as passed:
        trace.failed, trace.error = True, f"{spec.name!r} {passed}"
        return
    trace.output = str(state.get("answer", ""))
    try:
        verdict = await view.score(trace.output)
    except CallError as err:  # an LLM judge that failed: the example is failed, not wrong
        trace.failed, trace.error = True, str(err)
        return
    trace.answer, trace.score, trace.sandbox = verdict.extracted, verdict.value, verdict.sandbox
    trace.state = dict(state.get("values") or {})


def run_fingerprint(spec: GraphSpec, pool: Pool, examples: Sequence[Example], scorer: str | None) -> str:
    """What must match for a resumed run (or audit) to continue an earlier one: protocol, pool, data, scorer.

    Whole examples, not only ids: an edited example under the same id must not reuse a stored result.
    """
    blob = json.dumps(
        {
            "spec": spec.to_dict(),
            "pool": pool.to_public_dict(),
            "examples": [e.model_dump() for e in examples],
            "scorer": scorer,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def summarize(
    spec: GraphSpec,
    outcomes: Sequence[ExampleOutcome],
    wall_s: float,
    sandbox: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's `summary.json`: its score, the accounting of its calls (`colab_graphs.accounting`), and for
    code scores the sandbox record (`colab_graphs.tasks.scoring.require_sandbox`)."""
    acct = account(o.trace for o in outcomes)
    scored = [o.score for o in outcomes if not o.failed and o.score is not None]
    summary: dict[str, Any] = {
        "protocol": spec.name,
        "params": spec.params,
        "members": spec.members,
        "score": sum(scored) / len(scored) if scored else None,
        "n": len(outcomes),
        "scored": len(scored),
        "failed": sum(o.failed for o in outcomes),
        "calls": {"made": acct.made, "cached": acct.cached, "failed": acct.failed},
        "tokens": {"prompt": acct.prompt_tokens, "completion": acct.completion_tokens},
        "cost_usd": acct.cost_usd,
        "cost_saved_usd": acct.cost_saved_usd,
        "wall_s": round(wall_s, 3),
    }
    if sandbox is not None:
        summary["sandbox"] = sandbox
    notes = mechanism_notes(o.trace for o in outcomes)
    if notes:  # (a run whose protocol found what it decides from everywhere has no `notes`)
        summary["notes"] = notes
        summary["warnings"] = warnings(spec.name, notes)
    return summary


def _check_same_run(out: Path, header: Header, examples: Sequence[Example]) -> bool:
    """Whether `out` holds an earlier run (its log); raises `RunError`, saying what differs, when that run is not
    this one (a different run that never finished an example is no earlier run: it is replaced)."""
    log = out / "log.jsonl"
    if log.exists():
        records, _ = read_records(log, strict=False)
        stored = records[0][1] if records and isinstance(records[0][1], Header) else None
        if stored is None or stored.fingerprint != header.fingerprint:
            if (
                stored is not None
                and stored.kind == "run"
                and not any(isinstance(r, PlayRecord) for _, r in records)
            ):
                return False  # another run that never finished an example (e.g. an app's contract error)
            stored_examples = [r for _, r in records if isinstance(r, ExampleRecord)]
            raise RunError(refusal(out, "run", stored, header, stored_examples, examples))
        return True
    return False


def _load_finished(out: Path, header: Header, examples: Sequence[Example]) -> dict[str, ExampleOutcome]:
    if not _check_same_run(out, header, examples):
        return {}
    finished: dict[str, ExampleOutcome] = {}
    traces_path = out / "traces.jsonl"
    if traces_path.exists():
        try:
            by_id = {e.id: e for e in examples}
            for t in read_traces(traces_path):
                if not t.failed:
                    finished[t.example_id] = ExampleOutcome(t, by_id.get(t.example_id))
        except ValueError:
            pass  # a torn last line from a kill: whatever parsed before it stands, the rest is recomputed
    return finished


async def run_dataset(
    spec: GraphSpec,
    pool: Pool,
    examples: Sequence[Example],
    *,
    client: ModelClient,
    scorer: str | None = None,
    out: str | os.PathLike[str] | None = None,
    max_examples_in_flight: int | None = None,
    overwrite: bool = False,
    on_progress: Callable[[ExampleOutcome], None] | None = None,
    sandbox: str | None = None,
    graph: Any = None,
    example_timeout: float | None = None,
    stall_after: float | None = None,
) -> tuple[list[ExampleOutcome], dict[str, Any]]:
    """Run `spec` over `examples`; write results/traces/summary under `out` when given. Returns (outcomes, summary).

    `sandbox`: the sandbox setting for code scores (`colab_graphs.sandbox.scope`; None: the one in force).
    `graph`: what to run instead of `spec` compiled (a user's app bound to the pool,
    `colab_graphs.audit.app.run_app`); `spec` then only names and identifies the run.
    `example_timeout`: each example's deadline in seconds (None or 0: none), after which it fails with what it
    was waiting for; `stall_after`: the watchdog's time (None: `colab_graphs.watch.STALL_S`; 0: no watchdog).

    Raises:
        SandboxUnavailable: code-scored examples, and the setting cannot be met here (before any call).
    """
    with scope.using(sandbox), otel.root_span("run", spec.name, spec.members, len(examples)) as span:
        for name, value in (("example timeout", example_timeout), ("stall time", stall_after)):
            if value is not None and not value >= 0:
                raise ValueError(f"the {name} must be >= 0 seconds (0: none), got {value}")
        stall_s = STALL_S if stall_after is None else stall_after
        with (
            Watchdog(stall_s, loop=asyncio.get_running_loop()) if stall_s else contextlib.nullcontext() as dog
        ):
            outcomes, summary = await _run_dataset(
                spec, pool, examples, client, scorer, out, max_examples_in_flight, overwrite, on_progress,
                graph, example_timeout or None, dog,
            )  # fmt: skip
        otel.totals(span, summary)
        return outcomes, summary


async def _run_dataset(
    spec: GraphSpec,
    pool: Pool,
    examples: Sequence[Example],
    client: ModelClient,
    scorer: str | None,
    out: str | os.PathLike[str] | None,
    max_examples_in_flight: int | None,
    overwrite: bool,
    on_progress: Callable[[ExampleOutcome], None] | None,
    graph: Any,
    timeout_s: float | None,
    watchdog: Watchdog | None,
) -> tuple[list[ExampleOutcome], dict[str, Any]]:
    started = time.perf_counter()
    sandbox = require_sandbox(examples, scorer)  # fail closed, before the first call
    dupes = sorted(i for i, k in Counter(e.id for e in examples).items() if k > 1)
    if dupes:
        # Results, traces and resume are keyed by id: a repeated id would silently overwrite an outcome.
        raise RunError(f"example ids must be unique; repeated: {', '.join(dupes[:10])}")
    graph = graph if graph is not None else compile_graph(spec, pool, client, fuse=True)
    fingerprint = run_fingerprint(spec, pool, examples, scorer)
    out_dir = Path(out) if out is not None else None
    finished: dict[str, ExampleOutcome] = {}
    log: LogWriter | None = None
    members = list(spec.members)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        if overwrite:
            for name in ("results.jsonl", "traces.jsonl", "summary.json", "log.jsonl"):
                (out_dir / name).unlink(missing_ok=True)
        header = Header(
            kind="run",
            protocol=spec.name,
            protocol_params=spec.params,
            members=members,
            pool=pool.to_public_dict(),
            spec=spec.to_dict(),
            scorer=scorer,
            fingerprint=fingerprint,
        )
        finished = _load_finished(out_dir, header, examples)
        log = LogWriter(out_dir)
        log.start(header, examples, log.plays_text([o.trace for o in finished.values()]))
        # Keep only lines of finished examples, so a resumed file has each example once.
        write_traces(out_dir / "traces.jsonl", [o.trace for o in finished.values()], append=False)
        with open(out_dir / "results.jsonl", "w", encoding="utf-8") as fh:
            for o in finished.values():
                fh.write(hide_secrets(json.dumps(o.result_line())) + "\n")
    for o in finished.values():
        if on_progress:
            on_progress(o)

    limit = asyncio.Semaphore(max_examples_in_flight or max(4 * client.max_concurrency, 8))
    write_lock = asyncio.Lock()

    async def one(example: Example) -> ExampleOutcome:
        async with limit:
            with otel.example_span(example.id):
                outcome = await run_example(
                    graph, spec, pool, client, example, scorer, timeout_s=timeout_s, watchdog=watchdog
                )
        if out_dir is not None:
            async with write_lock:
                with open(out_dir / "results.jsonl", "a", encoding="utf-8") as fh:
                    fh.write(hide_secrets(json.dumps(outcome.result_line())) + "\n")
                write_traces(out_dir / "traces.jsonl", [outcome.trace])
                if log is not None:
                    log.append(log.plays_text([outcome.trace]))
        if on_progress:
            on_progress(outcome)
        return outcome

    todo = [e for e in examples if e.id not in finished]
    if todo:  # (LiteLLM loaded, if at all, before any example's deadline)
        await client.prepare(pool[m] for m in members if m in pool)
    try:
        fresh = await asyncio.gather(*(one(e) for e in todo))
    except TemplateError as err:
        raise RunError(str(err)) from None
    by_id = {**finished, **{o.example_id: o for o in fresh}}
    outcomes = [by_id[e.id] for e in examples]
    summary = summarize(spec, outcomes, time.perf_counter() - started, sandbox)
    if out_dir is not None:
        results = "".join(json.dumps(o.result_line()) + "\n" for o in outcomes)
        atomic_write_text(out_dir / "results.jsonl", hide_secrets(results))
        with atomic_file(out_dir / "traces.jsonl") as traces:
            for o in outcomes:
                traces.write(trace_line(o.trace))
        atomic_write_text(out_dir / "summary.json", hide_secrets(json.dumps(summary, indent=2) + "\n"))
    return outcomes, summary
