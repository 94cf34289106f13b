"""An audit's plan before its first call: coalitions, distinct calls per member (exact or a bound), tokens, cost.

A seat that reads nothing sends a request that depends on the example alone, so its cache key is known
without a call (`answers.fixed_request`): those calls are counted exactly, once however many coalitions share
them, and the ones the call cache already holds are free. A seat that reads the state (a debate's later
rounds, a judge) sends a prompt that depends on earlier replies: each of its runs counts as one call, an upper
bound (two coalitions share such a call only when the replies it reads agree). Routes may skip seats, loops
repeat them up to their bound, and a protocol's fit step changes the members' models: the count is then a
bound (`calls_max`) too. Calls the task's scorer makes (an LLM judge) and fit steps' calls on dev data are
not counted.

`CallPlanner` counts as coalitions are added; the sampled estimator asks it what a coalition would add, so a
budget in calls is never passed. `plan_audit` turns a strategy into an `AuditPlan` (`OUT/plan.json`):
tokens estimated from the prompts and `max_tokens`, cost from LiteLLM's price map (`models/pricing.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from colab_graphs.audit.answers import answers_kind, fixed_request
from colab_graphs.audit.report import TokenCount
from colab_graphs.audit.strategy import MAX_SAMPLED_COALITIONS, AuditStrategy
from colab_graphs.coalition import restrict
from colab_graphs.compile import render
from colab_graphs.fitting import fit_step_of
from colab_graphs.models.client import ModelClient
from colab_graphs.models.pricing import completion_allowance, count_prompt_tokens, member_price, price_source
from colab_graphs.pool import Pool
from colab_graphs.spec import Aggregate, GraphSpec, LogitSeat, Seat, is_pattern
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import view_for

PLAN_JSON = "plan.json"


class MemberPlan(BaseModel):
    """One member's planned calls.

    Attributes:
        calls: distinct calls planned, when exact (else None).
        calls_max: an upper bound on them, when they depend on earlier replies (else None).
        cached: of the planned calls, those the call cache already holds (free).
        tokens: estimated tokens of the calls to make (the cached ones excluded).
        cost_usd: their estimated price; None when the member's price is unknown.
        price: where the price comes from: "litellm", "pool", "local" (free) or "unknown".
        tokens_by: how prompt tokens were counted: "tokenizer", "litellm" or "chars/4".
        completion: "max_tokens", or "assumed N" when no max_tokens is set.
    """

    calls: int | None = None
    calls_max: int | None = None
    cached: int = 0
    tokens: TokenCount = Field(default_factory=TokenCount)
    cost_usd: float | None = 0.0
    price: str = "unknown"
    tokens_by: str = "chars/4"
    completion: str = "max_tokens"


class AuditPlan(BaseModel):
    """What an audit will play and spend, written as `plan.json` by `--dry-run` (no call is made).

    `calls` (exact) or `calls_max` (a bound) counts distinct requests, as the report's `calls.unique` does;
    `cached` of them are free, so a run makes `calls - cached` (or at most `calls_max - cached`) calls.
    """

    kind: str = "audit_plan"
    protocol: str
    players: list[str]
    n_examples: int
    method: str
    estimator: str
    coalitions: int = Field(description="coalitions played (for a sampled estimate: its first batch)")
    coalitions_max: int | None = Field(None, description="most coalitions a sampled estimate may play")
    coalitions_valued: int = Field(description="coalitions whose value the report gives")
    solo: list[str] = Field(default_factory=list)
    calls: int | None = None
    calls_max: int | None = None
    cached: int = 0
    tokens: TokenCount = Field(default_factory=TokenCount)
    cost_usd: float | None = 0.0
    per_member: dict[str, MemberPlan] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    # (the CallPlanner, calls later batches may add): for a study's totals, never written.
    counted: Any = Field(None, exclude=True, repr=False)

    @property
    def to_make(self) -> int:
        """Calls a run would send (at most, where only a bound is known)."""
        return (self.calls if self.calls is not None else self.calls_max or 0) - self.cached


def _visits(spec: GraphSpec) -> dict[str, int]:
    """How often each node may run: the bound of the loop it sits in (1 outside loops)."""
    bounded = {r.source: r.max_visits for r in spec.routes if r.max_visits is not None}
    if not bounded:
        return {}
    import networkx as nx

    from colab_graphs.spec import graph_edges

    g = nx.DiGraph([(s, t) for s, t, _ in graph_edges(spec)])
    visits: dict[str, int] = {}
    for cycle in nx.simple_cycles(g):
        bound = max((bounded[n] for n in cycle if n in bounded), default=1)
        for node in cycle:
            visits[node] = max(visits.get(node, 1), bound)
    return visits


class CallPlanner:
    """Counts the distinct calls of an audit's coalitions and solo runs, without making any.

    Args:
        spec: the protocol over the whole pool.
        pool: the members.
        examples: the dataset.
        client: the call path whose request keys (and cache) the count uses.
        scorer: the scorer name, as the game gets it.
    """

    def __init__(
        self,
        spec: GraphSpec,
        pool: Pool,
        examples: Sequence[Example],
        *,
        client: ModelClient,
        scorer: str | None = None,
    ):
        self.spec = spec
        self.pool = pool
        self.client = client
        self.states = [view_for(e, scorer).graph_input() for e in examples]
        # A fit step may change the members' models (a merge, a fine-tune), so the requests too; a protocol
        # that declares independent replies promises its fit does not (slm_mux's dev scores break ties).
        self.fitted = fit_step_of(spec) is not None and answers_kind(spec) is None
        self.requests: dict[str, tuple[str, list, dict]] = {}  # key -> (member, messages, settings)
        self.bounded: dict[str, dict[tuple, int]] = {}  # member -> node identity -> runs
        self.exact = not self.fitted
        self._jobs: dict[tuple[str, frozenset[str]], GraphSpec | None] = {}
        self._seat_keys: dict[tuple, list[tuple[str, list, dict]]] = {}
        self._counted: set[tuple[str, frozenset[str]]] = set()
        self.nodes: dict[tuple, tuple[GraphSpec, Seat | LogitSeat]] = {}

    def _job(self, game: str, members: frozenset[str]) -> GraphSpec | None:
        if (game, members) not in self._jobs:
            if game == "solo":
                from colab_graphs.protocol_registry import build_protocol

                (member,) = members
                job: GraphSpec | None = build_protocol("solo", self.pool.names, member=member)
            else:
                job = restrict(self.spec, members)
            self._jobs[(game, members)] = job
        return self._jobs[(game, members)]

    def _keys_of(self, seat: Seat) -> list[tuple[str, list, dict]]:
        identity = (
            seat.member,
            seat.prompt,
            seat.system,
            seat.sample,
            json.dumps(seat.settings, sort_keys=True),
        )
        if identity not in self._seat_keys:
            self._seat_keys[identity] = [fixed_request(self.client, self.pool, seat, s) for s in self.states]
        return self._seat_keys[identity]

    def _calls(
        self, job: GraphSpec
    ) -> tuple[list[tuple[str, str, list, dict]], list[tuple[str, tuple, int]]]:
        """(fixed requests: key, member, messages, settings; bounded runs: member, node identity, count)."""
        visits = _visits(job)
        fixed: list[tuple[str, str, list, dict]] = []
        bounded: list[tuple[str, tuple, int]] = []
        for node in job.nodes:
            if isinstance(node, Aggregate):
                continue
            member = node.member if isinstance(node, Seat) else node.members[0]
            if isinstance(node, Seat) and not node.reads and not self.fitted:
                fixed += [
                    (key, member, messages, settings) for key, messages, settings in self._keys_of(node)
                ]
            else:
                identity = (job.name, node.name, member)
                self.nodes.setdefault(identity, (job, node))
                bounded.append((member, identity, visits.get(node.name, 1) * len(self.states)))
        return fixed, bounded

    def cost(self, game: str, members: frozenset[str]) -> int:
        """Calls (or their bound) a coalition or solo run would add to those counted so far."""
        if (game, members) in self._counted:
            return 0
        job = self._job(game, members)
        if job is None:
            return 0
        fixed, bounded = self._calls(job)
        return len({key for key, *_ in fixed} - self.requests.keys()) + sum(runs for *_, runs in bounded)

    def add(self, game: str, members: frozenset[str]) -> int:
        """Count a coalition ("coalition") or a member alone ("solo"); returns the calls it added."""
        added = self.cost(game, members)
        if (game, members) in self._counted:
            return 0
        self._counted.add((game, members))
        job = self._job(game, members)
        if job is None:
            return 0
        if job.routes:
            self.exact = False  # a route may skip a seat: its calls are a bound
        fixed, bounded = self._calls(job)
        for key, member, messages, settings in fixed:
            self.requests.setdefault(key, (member, messages, settings))
        for member, identity, runs in bounded:
            self.exact = False
            by_node = self.bounded.setdefault(member, {})
            by_node[identity] = by_node.get(identity, 0) + runs
        return added

    @property
    def total(self) -> int:
        """Distinct calls counted (a bound unless `exact`)."""
        return len(self.requests) + sum(sum(v.values()) for v in self.bounded.values())

    # --- the plan's figures --------------------------------------------------------------------------------

    def _allowance(self, job: GraphSpec, node: Any, depth: int = 0) -> int:
        """Completion tokens a node may write (an aggregate: what it reads, summed)."""
        if isinstance(node, Seat):
            return completion_allowance(self.pool[node.member], node.settings)[0]
        if isinstance(node, LogitSeat):
            return completion_allowance(self.pool[node.members[0]], node.settings)[0]
        return (
            sum(self._read_allowance(job, ref, depth + 1) for ref in node.reads.values()) if depth < 8 else 0
        )

    def _read_allowance(self, job: GraphSpec, ref: str, depth: int = 0) -> int:
        if ref == "input":
            return 0
        if is_pattern(ref):
            writers = [n for n in job.nodes if n.writes.startswith(ref[:-1]) and "#" not in n.writes]
        else:
            writers = [n for n in job.nodes if n.writes == ref.rstrip("?")]
        return sum(self._allowance(job, w, depth) for w in writers)

    def _bounded_tokens(self, identity: tuple) -> tuple[int, int]:
        """(prompt, completion) tokens of one run of a node whose prompt depends on earlier replies: its
        template on the first examples with nothing read, plus what its reads may hold."""
        job, node = self.nodes[identity]
        member = self.pool[node.member if isinstance(node, Seat) else node.members[0]]
        empty = {var: [] if is_pattern(ref) else "" for var, ref in node.reads.items()}
        sample = self.states[:3]
        counted = [
            count_prompt_tokens(
                member, [{"role": "user", "content": render(node.prompt, node.name, s, empty)}]
            )[0]
            for s in sample
        ]
        reads = sum(self._read_allowance(job, ref) for ref in node.reads.values())
        return math.ceil(sum(counted) / len(counted)) + reads, completion_allowance(member, node.settings)[0]

    def fixed_usage(self, key: str) -> tuple[int, int, float | None, str]:
        """(prompt tokens, completion tokens, price or None, how tokens were counted) of a counted request."""
        name, messages, settings = self.requests[key]
        member = self.pool[name]
        prompt, counted_by = count_prompt_tokens(member, messages)
        completion = completion_allowance(member, settings)[0]
        price = member_price(member)
        return prompt, completion, None if price is None else price.of(prompt, completion), counted_by

    def bounded_usage(self, name: str) -> tuple[int, int, int, float | None]:
        """(runs, prompt tokens, completion tokens, price or None) of a member's calls known by a bound."""
        runs = prompt = completion = 0
        for identity, n in self.bounded.get(name, {}).items():
            p, c = self._bounded_tokens(identity)
            prompt, completion, runs = prompt + p * n, completion + c * n, runs + n
        price = member_price(self.pool[name])
        return runs, prompt, completion, None if price is None else price.of(prompt, completion)

    def member_plans(self, cached: set[str] | None = None) -> dict[str, MemberPlan]:
        """Each member's plan (`cached`: the counted requests the call cache holds; default: asks it)."""
        if cached is None:
            cached = (
                self.client.cache.contains(set(self.requests)) if self.client.cache is not None else set()
            )
        plans: dict[str, MemberPlan] = {}
        for name in self.pool.names:
            member = self.pool[name]
            allowance, by_max = completion_allowance(member)
            plan = MemberPlan(
                price=price_source(member), completion="max_tokens" if by_max else f"assumed {allowance}"
            )
            fixed, prompt, completion, cost = 0, 0, 0, 0.0
            for key, (who, _, _) in self.requests.items():
                if who != name:
                    continue
                fixed += 1
                if key in cached:
                    plan.cached += 1
                    continue
                p, c, price, plan.tokens_by = self.fixed_usage(key)
                prompt, completion = prompt + p, completion + c
                cost = None if price is None or cost is None else cost + price
            runs, p, c, price = self.bounded_usage(name)
            if not fixed and not runs:
                continue
            plan.calls, plan.calls_max = (fixed, None) if self.exact else (None, fixed + runs)
            plan.tokens = TokenCount(prompt=prompt + p, completion=completion + c)
            plan.cost_usd = None if cost is None or price is None else round(cost + price, 8)
            plans[name] = plan
        return plans


def plan_audit(
    spec: GraphSpec,
    pool: Pool,
    examples: Sequence[Example],
    strategy: AuditStrategy,
    *,
    client: ModelClient,
    scorer: str | None = None,
    individual: bool = True,
) -> AuditPlan:
    """The plan of an audit with `strategy` (`strategy.choose_strategy`); no call is made.

    The plan keeps its `CallPlanner` (`plan.counted`, not written to plan.json), so a study can count a
    request several of its audits make once.
    """
    planner = CallPlanner(spec, pool, examples, client=client, scorer=scorer)
    for coalition in strategy.coalitions:
        planner.add("coalition", frozenset(coalition))
    for member in spec.members if individual else []:
        planner.add("solo", frozenset({member}))
    notes: list[str] = []
    coalitions_max, extra = None, 0
    if strategy.estimator == "stratified":
        space = min(2 ** len(strategy.players), MAX_SAMPLED_COALITIONS)
        if strategy.budget_unit == "coalitions" and strategy.budget is not None:
            space = min(space, strategy.budget)
        coalitions_max = max(space, len(strategy.coalitions))
        if strategy.budget_unit == "calls" and strategy.budget is not None:
            extra = max(0, strategy.budget - planner.total)
            bound = "the budget"
        else:
            extra = _one_coalition(planner, strategy) * max(0, coalitions_max - len(strategy.coalitions))
            bound = "the coalitions left"
        notes.append(
            f"sampled: the first batch ({len(strategy.coalitions)} coalitions) is planned exactly; later "
            f"batches add at most {extra} calls ({bound})"
        )
    if fit_step_of(spec) is not None:
        notes.append("the protocol fits each coalition first: its calls on dev data are not counted")
    per_member = planner.member_plans()
    exact = planner.exact and extra == 0
    fixed = sum(p.calls or p.calls_max or 0 for p in per_member.values())
    cached = sum(p.cached for p in per_member.values())
    costs = [p.cost_usd for p in per_member.values()]
    cost = None if any(c is None for c in costs) else sum(costs)  # type: ignore[arg-type]
    if extra and cost is not None and fixed > cached:
        cost += cost / (fixed - cached) * extra  # later batches priced at the first batch's mean call
        notes.append("the cost of later batches is estimated at the first batch's mean price per call")
    n = len(strategy.players)
    return AuditPlan(
        protocol=spec.name,
        players=list(strategy.players),
        n_examples=len(examples),
        method=strategy.method,
        estimator=strategy.estimator,
        coalitions=len(strategy.coalitions),
        coalitions_max=coalitions_max,
        coalitions_valued=2**n if strategy.estimator == "exact_from_answers" else len(strategy.coalitions),
        solo=list(spec.members) if individual else [],
        calls=fixed if exact else None,
        calls_max=None if exact else fixed + extra,
        cached=cached,
        tokens=TokenCount(
            prompt=sum(p.tokens.prompt for p in per_member.values()),
            completion=sum(p.tokens.completion for p in per_member.values()),
        ),
        cost_usd=None if cost is None else round(cost, 8),
        per_member=per_member,
        notes=notes,
        counted=(planner, extra),
    )


def _one_coalition(planner: CallPlanner, strategy: AuditStrategy) -> int:
    """Calls one more coalition may add at most: the grand coalition's, counted afresh."""
    fresh = CallPlanner(planner.spec, planner.pool, [], client=planner.client)
    fresh.states = planner.states
    return fresh.cost("coalition", frozenset(strategy.players))


def write_plan(plan: AuditPlan, out: str | Path) -> Path:
    """Write `plan.json` into `out` (created if missing); returns its path."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PLAN_JSON
    path.write_text(plan.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return path
