"""The coalition game: v(S) = mean score of the protocol restricted to S, per example, memoised on disk.

All coalitions of one audit (and each member's `solo` run, its individual strength) are evaluated on one event
loop, interleaved example by example under one concurrency limit, through one `ModelClient`: an upstream call
that several coalitions make identically is made once (single-flight while in flight, the cache after), so the
calls made equal the distinct requests.

The audit's folder holds its log (`log.jsonl`, see `colab_graphs.log`): the header (protocol, pool, data,
fingerprint), the examples, the plan, and each example's plays appended as soon as its coalitions are all
played, every distinct call recorded once (prompt, reply, tokens, cost, latency) and each play referring to
its calls by number. A killed audit rerun with the same command reads the log back and only runs what is
missing (whose finished calls the cache holds anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from colab_graphs import otel
from colab_graphs.accounting import Accounting, account, made_since
from colab_graphs.audit.play_cache import PlayCache, PlayCacheUnavailable, chunks, collector_spared
from colab_graphs.audit.plays import LoggedPlays
from colab_graphs.audit.plays import coalition_id as coalition_id
from colab_graphs.coalition import restrict
from colab_graphs.compile import compile_direct
from colab_graphs.fitting import Fitted, fit_coalition
from colab_graphs.log import (
    CallRecord,
    ExampleRecord,
    Header,
    LogWriter,
    PlanRecord,
    Play,
    PlayRecord,
    RecordStream,
    read_records,
)
from colab_graphs.log.diff import refusal
from colab_graphs.mechanism import mechanism_notes
from colab_graphs.models.client import ModelClient
from colab_graphs.models.flight import Memo
from colab_graphs.models.spend import CapReached
from colab_graphs.pool import Pool
from colab_graphs.runner import run_example, run_fingerprint
from colab_graphs.spec import GraphSpec
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import view_for
from colab_graphs.tasks.task_types import TaskView
from colab_graphs.watch import STALL_S, Watchdog

Coalition = frozenset[str]
logger = logging.getLogger("colab_graphs")


class CoalitionGame:
    """Evaluates coalitions of one protocol (and solo runs) over one dataset, memoised per example.

    Args:
        spec: the protocol over the full pool.
        pool: the members.
        examples: the dataset.
        client: the shared call path (its cache makes reruns free).
        scorer: scorer name, or None for each example's default.
        store: folder for the audit's log (`log.jsonl`, read back to resume), which then holds the finished
            plays (`plays` reads them back: `colab_graphs.audit.plays`); None keeps every play in memory.
        max_in_flight: examples whose coalitions run at once (default: twice the client's concurrency, so that
            the few distinct calls of each example keep every call slot busy).
        dataset: the dataset's name, for the log's header.
    """

    def __init__(
        self,
        spec: GraphSpec,
        pool: Pool,
        examples: Sequence[Example],
        *,
        client: ModelClient,
        scorer: str | None = None,
        store: str | os.PathLike[str] | None = None,
        max_in_flight: int | None = None,
        dataset: str | None = None,
    ):
        self.spec = spec
        self.pool = pool
        self.examples = list(examples)
        self.client = client
        self.scorer = scorer
        self.dataset = dataset
        self.store = Path(store) if store is not None else None
        self.log: LogWriter | None = None
        self.max_in_flight = max_in_flight or max(2 * client.max_concurrency, 4)
        self.plays: dict[tuple[str, str], Play] | LoggedPlays = {}
        # Each play's deadline and the stall watchdog's time (`watch_plays`; None: none).
        self.example_timeout: float | None = self.default_example_timeout
        self.stall_s: float | None = STALL_S
        # When this audit first started (kept across resumes): cache entries written since then are calls this
        # audit made, even where a resumed run found them in the cache.
        self.started_at = time.time()
        self._graphs: dict[str, tuple[GraphSpec | None, Any]] = {}
        self._watchdog: Watchdog | None = None
        self._play_cache: PlayCache | None = None
        # This game's plays so far: played, replayed from the play cache, and the played ones' calls that were
        # sent (not served by a cache) or failed (`note_unreplayed`).
        self._counts = {"played": 0, "replayed": 0, "sent": 0}
        self._unreplayed_noted = False
        # Coalition id -> the coalition fitted by its protocol's fit step (protocols that declare one).
        self.fits: dict[str, Fitted] = {}
        if self.store is not None:
            self._open_store()

    default_example_timeout: float | None = None
    """A protocol's plays have no deadline unless given one (its calls have their own timeouts)."""

    def watch_plays(self, example_timeout: float | None = None, stall_s: float | None = None) -> None:
        """Each play's deadline in seconds (None: this game's default; 0: none) and the watchdog's stall time
        (None: `colab_graphs.watch.STALL_S`; 0: no watchdog); see `colab_graphs.watch`."""
        for name, value in (("example timeout", example_timeout), ("stall time", stall_s)):
            if value is not None and not value >= 0:
                raise ValueError(f"the {name} must be >= 0 seconds (0: none), got {value}")
        default = self.default_example_timeout
        self.example_timeout = default if example_timeout is None else (example_timeout or None)
        self.stall_s = STALL_S if stall_s is None else (stall_s or None)

    # --- persistence ---------------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        return run_fingerprint(self.spec, self.pool, self.examples, self.scorer)

    def _header(self) -> Header:
        return Header(
            kind="audit",
            protocol=self.spec.name,
            protocol_params=self.spec.params,
            members=list(self.spec.members),
            pool=self.pool.to_public_dict(),
            spec=self.spec.to_dict(),
            dataset=self.dataset,
            scorer=self.scorer,
            fingerprint=self.fingerprint(),
            started_at=self.started_at,
        )

    def _open_store(self) -> None:
        assert self.store is not None
        self.store.mkdir(parents=True, exist_ok=True)
        self.log = LogWriter(self.store)
        if not self.log.path.exists():
            self.log.start(self._header(), self.examples)
            self.plays = self._logged()
            return
        stream = RecordStream(self.log.path, strict=False)
        _, _, first = next(iter(stream), (0, 0, None))
        header = first if isinstance(first, Header) else None
        if header is None or header.fingerprint != self.fingerprint():
            records = [r for _, _, r in stream]
            if (
                header is not None
                and header.kind == "audit"
                and not any(isinstance(r, PlayRecord) for r in records)
            ):
                # Another audit that never recorded a play (stopped on its first example, e.g. by an app's
                # contract error): nothing is lost by starting this one afresh in its folder.
                self.log.start(self._header(), self.examples)
                self.plays = self._logged()
                return
            stored_examples = [r for r in records if isinstance(r, ExampleRecord)]
            raise ValueError(
                refusal(self.store, "audit", header, self._header(), stored_examples, self.examples)
            )
        self.started_at = header.started_at or self.started_at
        # Rewritten without the failed plays and torn lines a kill may have left (calls numbered afresh),
        # reading the earlier log one line at a time.
        self.plays = self._logged()
        self.plays.resume(header, self.examples, stream)

    def _logged(self) -> LoggedPlays:
        assert self.log is not None
        return LoggedPlays(self.log, [e.id for e in self.examples], self.spec.name)

    def write_plan(self, coalitions: Sequence[Coalition], solo_members: Sequence[str]) -> None:
        """Record in the log what will be played (a viewer shows progress against it)."""
        if self.log is not None:
            plan = PlanRecord(
                coalitions=[self._ordered(c) for c in coalitions],
                solo=list(solo_members),
                n_examples=len(self.examples),
            )
            self.log.append(plan.model_dump_json() + "\n")

    def record(self, plays: Sequence[Play]) -> None:
        """Keep finished plays (and append them to the log, with the calls it does not hold yet)."""
        if isinstance(self.plays, LoggedPlays):
            self.plays.record(plays)
            return
        for play in plays:
            self.plays[(coalition_id(play.game, play.coalition), play.example_id)] = play
        if self.log is not None:
            self.log.append(self.log.plays_text(plays))

    # --- evaluation ----------------------------------------------------------------------------------------

    def _graph(self, game: str, members: list[str]) -> tuple[GraphSpec | None, Any]:
        cid = coalition_id(game, members)
        if cid not in self._graphs:
            if game == "solo":
                from colab_graphs.protocol_registry import build_protocol

                spec: GraphSpec | None = build_protocol("solo", self.pool.names, member=members[0])
            else:
                fitted = self.fits.get(cid)
                spec = fitted.spec if fitted is not None else restrict(self.spec, members)
            graph = compile_direct(spec, self.pool, self.client) if spec is not None else None
            self._graphs[cid] = (spec, graph)
        return self._graphs[cid]

    async def _play(
        self, game: str, members: list[str], example: Example, view: TaskView, memo: Memo
    ) -> Play:
        spec, graph = self._graph(game, members)
        if spec is None:  # the empty coalition: no member, no call
            score = 0.0
            if self.spec.empty_fallback is not None:
                score = (await view.score(self.spec.empty_fallback)).value
            return Play(
                example_id=example.id, protocol=self.spec.name, game=game, coalition=members, score=score
            )
        outcome = await run_example(
            graph, spec, self.pool, self.client, example, view=view, memo=memo,
            timeout_s=self.example_timeout, watchdog=self._watchdog, game=game,
        )  # fmt: skip
        play = outcome.trace
        # The run's trace is the play; the game keeps its calls and score, not every seat's output.
        play.protocol, play.game, play.coalition, play.state = self.spec.name, game, members, {}
        return play

    async def evaluate(
        self,
        coalitions: Sequence[Coalition],
        solo_members: Sequence[str] = (),
        on_progress: Callable[[Play], None] | None = None,
        on_plays: Callable[[list[Play]], None] | None = None,
        planned: Sequence[Coalition] | None = None,
    ) -> None:
        """Evaluate every coalition (and each member in `solo_members` alone) on every example.

        `on_progress` sees each play as it finishes (finished plays of an earlier run too); `on_plays` gets an
        example's new plays together once they are all finished and recorded. `planned` is what the log's
        plan records (default: `coalitions`; a sampled audit that evaluates batch after batch gives them all).

        A spending cap (`colab_graphs.models.spend`) that refuses a call stops new calls; the examples whose
        plays need none still finish (and are recorded), then `CapReached` is raised.
        """
        jobs: list[tuple[str, list[str]]] = [("coalition", self._ordered(c)) for c in coalitions]
        jobs += [("solo", [m]) for m in solo_members]
        for game, members in sorted(jobs, key=lambda job: -len(job[1])):  # the whole pool's problems first
            await self._fit(game, members)
        for game, members in jobs:
            self._graph(game, members)  # compile (and validate every coalition) before any call
        self.write_plan(coalitions if planned is None else planned, solo_members)

        async def one(game: str, members: list[str], example: Example, view: TaskView, memo: Memo) -> Play:
            play = await self._play(game, members, example, view, memo)
            if on_progress:
                on_progress(play)
            return play

        async def plays_of(example: Example, todo: list[tuple[str, list[str]]]) -> None:
            # An example's coalitions run together (their identical calls meet in flight), with one task view
            # and one seat memo: a request another coalition already made is taken from the memo (as the
            # cache would serve it), and an answer already extracted or scored is not extracted or scored again.
            # They are recorded together, so each call's record comes from the play that made it.
            # The largest coalition plays first: its calls fill the memo, so the others mostly answer from it at
            # once instead of each waiting on the same calls in flight (thousands of waiting tasks per example
            # in a sampled 8-member audit); the calls only they make run together after it.
            # A spending cap stops the example: the plays that finish anyway (their calls were sent) are kept.
            first, *rest = todo  # (ordered by `_play_order`)
            view, memo = view_for(example, self.scorer), Memo()
            with otel.example_span(example.id):
                plays = [await one(*first, example, view, memo)]
                others = await asyncio.gather(
                    *(one(game, members, example, view, memo) for game, members in rest),
                    return_exceptions=True,
                )
            plays += [p for p in others if isinstance(p, Play)]
            self.record(plays)
            self._counts["played"] += len(plays)
            self._counts["sent"] += sum(
                1 for p in plays for c in p.calls if not c.cached or c.error is not None
            )
            if cache is not None:
                assert isinstance(self.plays, LoggedPlays)
                for play in cache.store(example, [(p.game, p.coalition) for p in plays], plays):
                    self.plays.stored(play)
            errors = [e for e in others if isinstance(e, BaseException)]
            if errors:
                raise errors[0]
            if on_plays:
                on_plays(plays)

        cache = self.play_cache()
        work: list[tuple[Example, list[tuple[str, list[str]]]]] = []
        # (no full collection of the cyclic collector meanwhile: see `collector_spared`)
        with collector_spared() if cache is not None else contextlib.nullcontext():
            for chunk in chunks(self.examples, 256):
                todos = []
                for example in chunk:
                    todo = []
                    for game, members in jobs:
                        key = (coalition_id(game, members), example.id)
                        if key not in self.plays:
                            todo.append((game, members))
                        elif on_progress:
                            on_progress(self.plays[key])
                    if todo:
                        todos.append((example, _play_order(todo)))
                # The examples whose plays the play cache holds (every call cached) are not played: their plays
                # are recorded as stored, here, before any other is played.
                served = cache.served(todos) if cache is not None and todos else {}
                for example, todo in todos:
                    plays = served.get(example.id)
                    if plays is None:
                        work.append((example, todo))
                        continue
                    assert isinstance(self.plays, LoggedPlays)
                    self.plays.replay(plays)
                    self._counts["replayed"] += len(plays)
                    if on_progress is not None:
                        for play in plays:
                            on_progress(play.as_play(self.spec.name))
        queue, reached = iter(work), []

        async def worker() -> None:
            # `max_in_flight` workers take the examples in order, one at a time each: the tasks alive (and what
            # they hold) are bounded by the examples in flight, not by the dataset.
            for example, todo in queue:
                try:
                    await plays_of(example, todo)
                except CapReached as err:  # the examples whose plays need no new call still finish
                    reached.append(err)

        workers = [asyncio.ensure_future(worker()) for _ in range(min(self.max_in_flight, len(work)))]
        try:
            if self.stall_s is None or not workers:
                await _settle(workers)
            else:
                with Watchdog(self.stall_s, loop=asyncio.get_running_loop()) as self._watchdog:
                    try:
                        await _settle(workers)
                    finally:
                        self._watchdog = None
        finally:
            if cache is not None:
                cache.flush()  # (the plays noted as stored are in the file before anyone reads it)
        if reached:
            raise reached[0]

    def note_unreplayed(self) -> None:
        """Say once (a warning) that this audit replayed none of its plays from the play cache although the call
        cache served every call its plays made: a rerun that then costs about half its first run's CPU with
        nothing else to show why (the package upgraded or edited since, say)."""
        counts = self._counts
        if self._unreplayed_noted or self._play_cache is None or counts["replayed"] or counts["sent"]:
            return
        if not counts["played"]:
            return
        self._unreplayed_noted = True
        logger.warning(
            "play cache %s: the call cache served every call of this audit, yet none of its %d plays was in "
            "the play cache: each was played again from the cached calls (no request sent) and stored for the "
            "next run. Plays are keyed under a digest of colab_graphs' files (an upgrade or any edit of the "
            "package misses them all), any plugin's source, the protocol, the pool as reports show it (each "
            "member's model, endpoint and settings), the scorer and each example: if this audit ran before, "
            "one of these changed since.",
            self._play_cache.cache.path,
            counts["played"],
        )

    play_cache_allowed = True
    """Whether this game's plays may be replayed from the play cache (an app's graph is its own code: not)."""

    def play_cache(self) -> PlayCache | None:
        """The play cache this game's plays are replayed from and stored in (`colab_graphs.audit.play_cache`):
        none without a call cache, or when the plays are held in memory (a study's worker)."""
        cache = self.client.cache
        if not self.play_cache_allowed or cache is None or not isinstance(self.plays, LoggedPlays):
            return None
        if not (self.scorer is None or isinstance(self.scorer, str)):
            return None  # a scorer function: code the key cannot name
        if self._play_cache is None or self._play_cache.cache is not cache:
            try:
                self._play_cache = PlayCache(
                    cache,
                    self.spec,
                    self.pool,
                    self.scorer,
                    lambda game, members: self._graph(game, members)[0],
                )
            except PlayCacheUnavailable as why:
                logger.info("no play cache for this audit: %s; every play is played", why)
                return None
        return self._play_cache

    async def _fit(self, game: str, members: list[str]) -> None:
        """Run the protocol's fit step for one coalition, once (see `colab_graphs.fitting`)."""
        cid = coalition_id(game, members)
        if game != "coalition" or cid in self.fits or cid in self._graphs:
            return
        spec = restrict(self.spec, members)
        if spec is None:
            return
        fitted = await fit_coalition(spec, self.pool, client=self.client, scorer=self.scorer)
        if fitted is not None:
            self.fits[cid] = fitted

    def _ordered(self, coalition: Coalition) -> list[str]:
        return [m for m in self.spec.members if m in coalition]

    def finished_examples(
        self, coalitions: Sequence[Coalition], solo_members: Sequence[str] = ()
    ) -> list[str]:
        """Ids of the examples (dataset order) on which every coalition and solo run has a play."""
        cids = [coalition_id("coalition", self._ordered(c)) for c in coalitions]
        cids += [coalition_id("solo", [m]) for m in solo_members]
        return [e.id for e in self.examples if all((cid, e.id) in self.plays for cid in cids)]

    # --- results -------------------------------------------------------------------------------------------

    def failed_examples(self) -> list[str]:
        if isinstance(self.plays, LoggedPlays):
            failed = set(self.plays.failed_ids())
        else:
            failed = {eid for (_, eid), p in self.plays.items() if p.failed}
        return [e.id for e in self.examples if e.id in failed]

    def _scores(self, cid: str, ids: Sequence[str]) -> np.ndarray:
        if isinstance(self.plays, LoggedPlays):
            return self.plays.scores(cid, ids)
        return np.array([self.plays[(cid, i)].score or 0.0 for i in ids], dtype=float)

    def values(
        self, coalitions: Sequence[Coalition], exclude: Sequence[str] = ()
    ) -> dict[Coalition, np.ndarray]:
        """Coalition -> per-example scores over the examples not excluded (dataset order)."""
        ids = [e.id for e in self.examples if e.id not in set(exclude)]
        return {c: self._scores(coalition_id("coalition", self._ordered(c)), ids) for c in coalitions}

    def solo_values(self, members: Sequence[str], exclude: Sequence[str] = ()) -> dict[str, np.ndarray]:
        ids = [e.id for e in self.examples if e.id not in set(exclude)]
        return {m: self._scores(coalition_id("solo", [m]), ids) for m in members}

    def noted_plays(self) -> list[Play]:
        """The plays the report names one by one: those that failed and those an absent member ended."""
        if isinstance(self.plays, LoggedPlays):
            return self.plays.kept()
        return [p for p in self.plays.values() if p.failed or (p.model_extra or {}).get("ended_by_absent")]

    def mechanism_notes(self) -> list[dict[str, Any]]:
        """`colab_graphs.mechanism.mechanism_notes` of the coalitions' plays."""
        if isinstance(self.plays, LoggedPlays):
            return self.plays.notes()
        return mechanism_notes(p for p in self.plays.values() if p.game == "coalition")

    def accounting(self) -> Accounting:
        """Calls made / distinct / cached / failed / naive, and tokens and cost per member and per coalition.

        A call made by an earlier, killed run of this audit whose play never finished is a cache hit on
        resume; the cache's write time still says this audit made it (see `colab_graphs.accounting`).
        """
        if isinstance(self.plays, LoggedPlays):
            cache = self.client.cache
            made = cache.written_since(self.plays.cached_keys(), self.started_at) if cache else set()
            return self.plays.accounting(made)
        plays = list(self.plays.values())
        return account(plays, made_since(self.client.cache, plays, self.started_at))


def _play_order(todo: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """The order an example's plays are played and recorded in (coalitions first, the largest first): the order
    of the accounting's totals, which a rerun taking them from the play cache records them in too."""
    return sorted(todo, key=lambda job: (job[0] != "coalition", -len(job[1])))


async def _settle(tasks: list[asyncio.Future]) -> None:
    """Wait for the workers; the first error cancels the rest and is raised (a spending cap is not an error
    here: the workers go on with the examples that need no new call)."""
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                error = task.exception()
                if error is not None:
                    raise error
    finally:
        for task in pending:  # an error, or this audit itself cancelled: its examples stop with it
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


def read_plays(store: str | os.PathLike[str]) -> list[Play]:
    """The plays recorded in an audit folder's log (lines it cannot read left out)."""
    records, _ = read_records(LogWriter(store).path, strict=False)
    calls = {r.n: r for _, r in records if isinstance(r, CallRecord)}
    plays = []
    for _, record in records:
        if isinstance(record, PlayRecord):
            with contextlib.suppress(KeyError):  # a play whose calls' lines were lost is left out
                plays.append(record.play(calls))
    return plays
