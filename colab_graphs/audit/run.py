"""`play_audit`: choose the strategy, play the game, estimate, and write the report.

The steps, each in its own place:

1. `strategy.choose_strategy`: which estimator, and which coalitions are played up front.
2. The game (`CoalitionGame`) plays them; the sampled estimator (`stratified`) asks for batch after batch
   until its target error, its budget or every coalition; the game from answers (`answers`) values every
   coalition from the leave-one-out coalitions' replies.
3. `report.contribution_fields` turns the values into the report; the accounting adds calls and cost.

Spending caps (`max_calls`, `max_cost_usd`) count the upstream calls of this run (cached calls are free): one
that is reached stops the audit before the call that would pass it, and the report is written from the
examples every coalition has finished, with `partial: true`. Run again with a cap, or none: the plays recorded
and the calls cached are not repeated, and the finished report is the one an uncapped run gives.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from colab_graphs import otel
from colab_graphs.accounting import Accounting, Spend
from colab_graphs.audit import answers
from colab_graphs.audit.estimators import (
    Coalition,
    Estimates,
    Method,
    estimates_from,
    ordered_coalitions,
    remembered_bootstraps,
)
from colab_graphs.audit.game import CoalitionGame, Play, coalition_id
from colab_graphs.audit.plan import CallPlanner
from colab_graphs.audit.plays import LoggedPlays
from colab_graphs.audit.plots import plots_available, preload_plots, write_plots
from colab_graphs.audit.report import (
    AuditReport,
    CoalitionUsage,
    MemberUsage,
    TokenCount,
    contribution_fields,
    write_report,
)
from colab_graphs.audit.strategy import MAX_SAMPLED_COALITIONS, AuditStrategy, BudgetUnit, choose_strategy
from colab_graphs.audit.stratified import (
    StratifiedEstimate,
    StratifiedSampler,
    critical_value,
    exact_shapley_table,
    mask_of,
    members_of,
    stratified_shapley,
)
from colab_graphs.fitting import fitting_summary
from colab_graphs.mechanism import warnings
from colab_graphs.models.client import ModelClient
from colab_graphs.models.pricing import member_price
from colab_graphs.models.spend import CapReached, SpendCap
from colab_graphs.pool import Pool
from colab_graphs.sandbox import scope
from colab_graphs.spec import GraphSpec, Seat
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import require_sandbox, task_for, view_for

LISTED_COALITIONS = 4096  # a report lists every coalition valued up to this many (2^12)


class AuditError(RuntimeError):
    pass


class _Audit:
    """One audit's play: the game, what has been asked of it, and the Shapley estimate it leads to."""

    def __init__(
        self,
        strategy: AuditStrategy,
        game: CoalitionGame,
        solo: list[str],
        on_plan: Callable[[int], None] | None,
        on_progress: Callable[[Play], None] | None,
    ):
        self.strategy = strategy
        self.game = game
        self.solo = solo
        self.on_plan = on_plan
        self.on_progress = on_progress
        self.asked: list[Coalition] = []
        self.held: list[int] = []  # the stratified estimator's coalitions as bitmasks, in the order asked
        self.stopped: str | None = None

    async def evaluate(self, coalitions: Sequence[Coalition]) -> None:
        solo = self.solo if not self.asked else []
        self.asked += coalitions
        if self.on_plan:
            self.on_plan((len(self.asked) + len(self.solo)) * len(self.game.examples))
        await self.game.evaluate(coalitions, solo, self.on_progress, planned=self.asked)

    async def play(self) -> None:
        if self.strategy.estimator != "stratified":
            await self.evaluate(self.strategy.coalitions)
            return
        await self.sample()

    async def sample(self) -> None:
        """The stratified estimator's batches (see `strategy` and `stratified`)."""
        s, game = self.strategy, self.game
        players = list(s.players)
        n = len(players)
        by_calls = s.budget_unit == "calls" and s.budget is not None
        if by_calls and not isinstance(game.spec, GraphSpec):
            raise ValueError(
                "an app's calls cannot be counted before it runs (its graph is its own code): give its sampled "
                "audit a budget in coalitions or permutations (--budget-unit), or a --target-error"
            )
        # Only a budget in calls needs the planner (an app's spec has no graph to plan).
        planner = CallPlanner(game.spec, game.pool, game.examples, client=game.client, scorer=game.scorer)
        for coalition in s.coalitions if by_calls else []:
            planner.add("coalition", frozenset(coalition))
        for member in self.solo if by_calls else []:
            planner.add("solo", frozenset({member}))
        if by_calls and planner.total > s.budget:  # type: ignore[operator]
            raise ValueError(
                f"a budget of {s.budget} calls is below the {planner.total} distinct calls the stratified "
                f"estimator's first batch needs for {n} members over {len(game.examples)} examples (its "
                f"{len(s.coalitions)} coalitions{' and the solo runs' if self.solo else ''}); raise --budget, or "
                "audit leave-one-out (--method loo)"
            )
        limit = s.budget if s.budget_unit == "coalitions" and s.budget is not None else MAX_SAMPLED_COALITIONS
        sampler = StratifiedSampler(
            n, seed=s.seed, target_error=s.target_error, max_coalitions=limit, simultaneous=s.simultaneous
        )
        self.held = sampler.held
        await self.evaluate(s.coalitions)
        while True:
            estimate = self.stratified_estimate()
            if estimate is None:
                return
            self.stopped = sampler.stop(estimate)
            if self.stopped == "coalitions" and s.budget_unit == "coalitions":
                self.stopped = "budget"
            if self.stopped:
                return
            if by_calls:
                new = sampler.next_batch(
                    estimate,
                    spend=s.budget - planner.total,  # type: ignore[operator]
                    cost_of=lambda m: planner.cost("coalition", members_of(m, players)),
                )
            else:
                new = sampler.next_batch(estimate)
            if not new:
                self.stopped = "budget"
                return
            if by_calls:
                for mask in new:
                    planner.add("coalition", members_of(mask, players))
            await self.evaluate([members_of(m, players) for m in new])

    # --- results over the examples kept ----------------------------------------------------------------------

    def kept_examples(self) -> list[str]:
        """Examples every coalition asked (and every solo run) finished on, without a failed play."""
        failed = set(self.game.failed_examples())
        return [e for e in self.game.finished_examples(self.asked, self.solo) if e not in failed]

    def excluded(self) -> list[str]:
        kept = set(self.kept_examples())
        return [e.id for e in self.game.examples if e.id not in kept]

    def stratified_estimate(self) -> StratifiedEstimate | None:
        if not self.kept_examples():
            return None
        players = list(self.strategy.players)
        values = self.game.values([members_of(m, players) for m in self.held], exclude=self.excluded())
        matrix = np.vstack([values[members_of(m, players)] for m in self.held])
        return stratified_shapley(len(players), self.held, matrix)


def _check_prices(pool: Pool, members: Sequence[str], max_cost_usd: float | None) -> None:
    if max_cost_usd is None:
        return
    unknown = [m for m in members if member_price(pool[m]) is None]
    if unknown:
        raise ValueError(
            f"--max-cost needs a price for every member; LiteLLM's price map has none for {', '.join(unknown)} "
            "(set input_cost_per_token and output_cost_per_token on them in the pool file)"
        )


async def _answers_table(audit: _Audit, kept: list[str]) -> np.ndarray:
    """Every coalition's per-example values (2^n, kept examples) from the grand coalition's replies, checked
    against the coalitions the game played."""
    game, s = audit.game, audit.strategy
    players = list(s.players)
    grand = coalition_id("coalition", players)
    spec = game.fits[grand].spec if grand in game.fits else game.spec
    by_id = {e.id: e for e in game.examples}
    kind = s.answers_kind or "aggregate"
    # Each example's column is a function of its grand play (its calls' replies), the spec and the scorer: the
    # play cache keeps it under the digest of that play's entry, and a rerun reads it back.
    # Only for the grand plays this run replayed from the play cache or wrote to it: what it holds is theirs.
    cache = game.play_cache()
    table = np.empty((2 ** len(players), len(kept)))
    for start in range(0, len(kept), 500):  # (a few hundred examples' columns held as lists at a time)
        chunk = kept[start : start + 500]
        versions: dict[str, str] = {}
        stored: dict[str, list[float]] = {}
        if cache is not None and isinstance(game.plays, LoggedPlays):
            keys = {
                cache.keys(by_id[e], [("coalition", players)])[0]: e
                for e in game.plays.in_play_cache(grand, chunk)
            }
            versions = {keys[k]: v for k, v in cache.versions(list(keys)).items()}
            stored = cache.values(f"answers-{kind}", list(versions.values()))
        fresh = []
        for j, example_id in enumerate(chunk, start):
            column = stored.get(versions.get(example_id, ""))
            if column is None or len(column) != len(table):
                view = view_for(by_id[example_id], game.scorer)
                replies = answers.seat_replies(
                    spec, game.pool, game.client, view, game.plays[(grand, example_id)].calls
                )
                empty = (
                    (await view.score(spec.empty_fallback)).value if spec.empty_fallback is not None else 0.0
                )
                column = await answers.game_from_answers(spec, kind, replies, view, empty)
                if example_id in versions:
                    fresh.append((versions[example_id], column))
            table[:, j] = column
        if cache is not None and fresh:
            cache.store_values(f"answers-{kind}", fresh)
    played = game.values(audit.asked, exclude=audit.excluded())
    for coalition, scores in played.items():
        if not np.allclose(table[mask_of(coalition, players)], scores):
            raise AuditError(
                f"the game computed from the members' answers disagrees with the played coalition "
                f"{sorted(coalition)} ({float(np.mean(table[mask_of(coalition, players)])):.4f} vs "
                f"{float(np.mean(scores)):.4f}); the protocol's independent_replies declaration does not hold"
            )
    return table


async def _shapley(audit: _Audit, kept: list[str], seed: int) -> tuple[Estimates | None, dict, list]:
    """(Shapley estimates, coalition values, coalitions listed) for the report; (None, played, asked) for loo
    and permutation plans, whose estimates `contribution_fields` computes from the plan."""
    s = audit.strategy
    players = list(s.players)
    boot = {"seed": seed}
    if s.estimator == "exact_from_answers":
        table = await _answers_table(audit, kept)
        shapley = estimates_from(
            players, exact_shapley_table(table), method=s.method, estimator=s.estimator, exact=True, **boot
        )
        listed_masks = (
            range(len(table))
            if len(table) <= LISTED_COALITIONS
            else [mask_of(c, players) for c in s.coalitions]
        )
        listed = [members_of(m, players) for m in listed_masks]
        return shapley, {members_of(m, players): table[m] for m in listed_masks}, listed
    values = audit.game.values(audit.asked, exclude=audit.excluded())
    if s.estimator != "stratified":
        return None, values, list(s.coalitions)
    sampled = audit.stratified_estimate()
    assert sampled is not None
    shapley = estimates_from(
        players, sampled.per_example, method=s.method, estimator="exact" if sampled.exact else "stratified",
        exact=sampled.exact, sampling_error=sampled.half_width(critical_value(len(players), s.simultaneous)),
        simultaneous=s.simultaneous, adjustment=None if sampled.exact else sampled.model, **boot,
    )  # fmt: skip
    return shapley, values, list(ordered_coalitions(audit.asked, players))


async def play_audit(
    spec: GraphSpec,
    pool: Pool,
    examples: Sequence[Example],
    *,
    client: ModelClient,
    method: Method = "loo",
    budget: int | None = None,
    budget_unit: BudgetUnit = "calls",
    target_error: float | None = None,
    simultaneous: bool = False,
    seed: int = 0,
    scorer: str | None = None,
    out: str | Path | None = None,
    dataset: str | None = None,
    force: bool = False,
    individual: bool = True,
    plots: bool | None = None,
    max_calls: int | None = None,
    max_cost_usd: float | None = None,
    play_every_coalition: bool = False,
    on_plan: Callable[[int], None] | None = None,
    on_progress: Callable[[Play], None] | None = None,
    game: CoalitionGame | None = None,
    sandbox: str | None = None,
    example_timeout: float | None = None,
    stall_after: float | None = None,
) -> AuditReport:
    """Audit each member's contribution to `spec` on `examples`; write the report under `out` when given.

    Args:
        method: "loo" (n + 1 coalitions), "exact" (2^n) or "sampled" (see `budget`). A protocol that declares
            independent replies gets exact Shapley from its members' answers whatever the method, while that
            is cheap (`strategy`).
        budget: for "sampled": distinct calls, coalitions or permutations (`budget_unit`).
        budget_unit: "calls" (default), "coalitions", or "permutations" (the permutation sampler).
        target_error: for "sampled": stop once every member's 95% sampling interval is within +- this (the
            simultaneous one with `simultaneous`).
        simultaneous: for "sampled": sampling intervals that hold all members' values at once (95%; each
            member's at Bonferroni's 1 - 0.05 / n), not each member's alone; `target_error` then applies to
            them. The report records the kind (`sampling_interval`).
        individual: also run each member alone (`solo`) for its individual strength.
        plots: draw PNGs (default: when matplotlib is installed).
        max_calls, max_cost_usd: spending caps (module docstring); the report is then `partial`.
        play_every_coalition: play each coalition the method needs even where the game can be computed from
            the members' answers (the log then holds every coalition's conversation, for the viewer).
        on_plan: called with the number of (coalition, example) runs planned, for a progress bar (again when
            a sampled audit adds a batch).
        game: the game to play instead of the protocol's own (an app's: `colab_graphs.audit.app.AppGame`,
            whose `spec` is then the one given here).
        sandbox: the sandbox setting for code scores (`colab_graphs.sandbox.scope`; None: the one in force).
            With code-scored examples it is checked before any call (`SandboxUnavailable`), and the report
            names it (`sandbox`).
        example_timeout: each play's deadline in seconds (one coalition on one example), after which it fails
            with what it was waiting for and its example is reported failed, not scored. None: the game's
            default (an app's: `colab_graphs.watch.APP_EXAMPLE_TIMEOUT_S`; a protocol's: none); 0: none.
        stall_after: the watchdog's time: when no call and no node has finished for this many seconds, what
            every play in flight waits for is logged (None: `colab_graphs.watch.STALL_S`; 0: no watchdog).
    """
    with (
        scope.using(sandbox),
        otel.root_span("audit", spec.name, spec.members, len(examples)),
        contextlib.ExitStack() as stack,
    ):
        # The finished plays are held in the audit's log, not in memory (`colab_graphs.audit.plays`): without
        # an output folder, in a temporary one, removed with what it holds once the report is made.
        store = out if out is not None or game is not None else stack.enter_context(_plays_folder())
        return await _play_audit(
            spec, pool, examples, client, method, budget, budget_unit, target_error, simultaneous, seed, scorer,
            out, store, dataset, force, individual, plots, max_calls, max_cost_usd, play_every_coalition,
            on_plan, on_progress, game, example_timeout, stall_after,
        )  # fmt: skip


def _plays_folder() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="colab-graphs-audit-")


async def _play_audit(
    spec: GraphSpec,
    pool: Pool,
    examples: Sequence[Example],
    client: ModelClient,
    method: Method,
    budget: int | None,
    budget_unit: BudgetUnit,
    target_error: float | None,
    simultaneous: bool,
    seed: int,
    scorer: str | None,
    out: str | Path | None,
    store: str | Path | None,
    dataset: str | None,
    force: bool,
    individual: bool,
    plots: bool | None,
    max_calls: int | None,
    max_cost_usd: float | None,
    play_every_coalition: bool,
    on_plan: Callable[[int], None] | None,
    on_progress: Callable[[Play], None] | None,
    game: CoalitionGame | None,
    example_timeout: float | None,
    stall_after: float | None,
) -> AuditReport:
    started = time.perf_counter()
    sandbox = require_sandbox(examples, scorer)  # fail closed, before the first call
    players = list(spec.members)
    strategy = choose_strategy(
        spec, len(examples), method, budget=budget, budget_unit=budget_unit, target_error=target_error,
        seed=seed, simultaneous=simultaneous, force=force, from_answers=not play_every_coalition,
    )  # fmt: skip
    _check_prices(pool, players, max_cost_usd)
    game = game or CoalitionGame(
        spec, pool, examples, client=client, scorer=scorer, store=store, dataset=dataset
    )
    game.watch_plays(example_timeout, stall_after)
    draw = out is not None and (plots_available() if plots is None else plots)
    if draw:
        on_progress = _preloading_plots(on_progress)
    audit = _Audit(strategy, game, players if individual else [], on_plan, on_progress)
    reached: CapReached | None = None
    outer = client.cap
    spend = SpendCap(max_calls, max_cost_usd) if max_calls is not None or max_cost_usd is not None else None
    if spend is not None:
        client.cap = spend
    await client.prepare(pool[m] for m in players)  # (LiteLLM loaded, if at all, before any play's deadline)
    try:
        await audit.play()
    except CapReached as err:
        reached = err
    finally:
        client.cap = outer
    game.note_unreplayed()

    kept = audit.kept_examples()
    if not kept and reached is None:
        raise AuditError(
            f"every example failed (first error: {_first_error(game)}); no contribution can be estimated"
        )
    fields: dict[str, Any] = {"n_examples": 0, "coalitions": [], "loo": {}, "method": method}
    if kept:
        with remembered_bootstraps(game.play_cache()):
            shapley, values, listed = await _shapley(audit, kept, seed)
            solo = game.solo_values(audit.solo, exclude=audit.excluded()) if individual else None
            fields = contribution_fields(
                strategy.plan, values, solo, shapley=shapley, listed=listed, seed=seed
            )
        fields["method"] = method
        if strategy.estimator == "exact_from_answers" and len(listed) < 2 ** len(players):
            fields["coalitions_valued"] = 2 ** len(players)
    if strategy.estimator == "stratified":
        fields.update(
            budget=budget, budget_unit=budget_unit, target_error=target_error, stopped=audit.stopped
        )
    elif strategy.estimator == "permutation":
        fields.update(budget=budget, budget_unit=budget_unit)
    if reached is not None and spend is not None:
        fields.update(
            partial=True,
            # What this run sent (a play cut short by the cap is not in the log, its calls are in the cache).
            cap={
                "cap": reached.cap,
                "limit": reached.limit,
                "calls": spend.calls,
                "cost_usd": round(spend.cost, 8),
            },
            examples_planned=len(examples),
        )
    if sandbox is not None:
        fields["sandbox"] = sandbox
    report = _report(spec, game, scorer, dataset, fields, started)
    if out is not None:
        images = write_plots(report, out) if kept and draw else {}
        write_report(report, out, images=images)
    return report


def _preloading_plots(on_progress: Callable[[Play], None] | None) -> Callable[[Play], None]:
    """`on_progress` that also starts loading the plotting library once a play with a call made upstream is
    done: the import then runs while the audit waits on replies, not after the last one, and never before the
    first request."""
    started: list[bool] = []

    def progress(play: Play) -> None:
        if not started and any(not call.cached for call in play.calls):
            started.append(True)
            preload_plots()
        if on_progress is not None:
            on_progress(play)

    return progress


def _report(
    spec: GraphSpec,
    game: CoalitionGame,
    scorer: str | None,
    dataset: str | None,
    fields: dict,
    started: float,
) -> AuditReport:
    """The report: the contribution fields and the game's accounting of calls, tokens and cost."""
    acct = game.accounting()
    if fields.get("shapley_estimator") == "exact_from_answers":
        # Naive evaluation plays every coalition: each seat runs in the 2^(n-1) coalitions holding its member.
        seats = sum(1 for node in spec.nodes if isinstance(node, Seat))
        solo = sum(share.calls for (kind, _), share in acct.per_coalition.items() if kind == "solo")
        acct.naive = seats * 2 ** (len(spec.members) - 1) * len(game.examples) + solo
    usage = {
        m: MemberUsage(calls=share.calls, tokens=_tokens(share), cost_usd=share.cost_usd)
        for m, share in acct.per_member.items()
    }
    per_coalition = [
        CoalitionUsage(
            members=list(members), calls=share.calls, tokens=_tokens(share), cost_usd=share.cost_usd
        )
        for (kind, members), share in acct.per_coalition.items()
        if kind == "coalition"
    ]
    # Protocols whose coalitions are fitted first (weight merges, searches on dev) report what that cost.
    fitting = {"fitting": fitting_summary(f.record for f in game.fits.values())} if game.fits else {}
    notes = game.mechanism_notes()
    return AuditReport(
        protocol=spec.name,
        protocol_params=spec.params,
        players=list(spec.members),
        scorer=scorer,
        scored_by=sorted({task_for(e, scorer).name for e in game.examples}),
        notes=notes,
        warnings=warnings(spec.name, notes),
        dataset=dataset,
        failed_examples=game.failed_examples(),
        errors=_errors(game),
        ended_by_absent=_ended_by_absent(game),
        calls=acct.calls(),
        tokens=_tokens(acct),
        cost_usd=acct.cost_usd,
        cost_saved_usd=acct.cost_saved_usd,
        usage=usage,
        per_coalition=per_coalition,
        wall_s=round(time.perf_counter() - started, 3),
        **fields,
        **fitting,
    )


def _tokens(spent: Spend | Accounting) -> TokenCount:
    return TokenCount(prompt=spent.prompt_tokens, completion=spent.completion_tokens)


def _first_error(game: CoalitionGame) -> Any:
    return next((p.error for p in game.noted_plays() if p.failed), None)


def _errors(game: CoalitionGame) -> dict[str, str]:
    """Failed example -> the error of its first failed play (coalitions before solo runs, larger first)."""
    failed = sorted(
        (p for p in game.noted_plays() if p.failed),
        key=lambda p: (p.game != "coalition", -len(p.coalition), p.coalition),
    )
    errors: dict[str, str] = {}
    for play in failed:
        errors.setdefault(play.example_id, str(play.error))
    return {e.id: errors[e.id] for e in game.examples if e.id in errors}


def _ended_by_absent(game: CoalitionGame) -> list[dict[str, Any]]:
    """The plays an uncaught `MemberAbsent` ended, by member and node (see `colab_graphs.audit.app`)."""
    ended: dict[tuple[str, str | None], list[list[str]]] = {}
    for play in game.noted_plays():
        where = (play.model_extra or {}).get("ended_by_absent")
        if isinstance(where, dict) and where.get("member"):
            ended.setdefault((where["member"], where.get("node")), []).append(list(play.coalition))
    return [
        {
            "member": member,
            "node": node,
            "plays": len(plays),
            "coalitions": sorted(map(list, {tuple(c) for c in plays})),
        }
        for (member, node), plays in sorted(ended.items(), key=lambda item: (item[0][0], item[0][1] or ""))
    ]
