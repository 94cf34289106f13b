"""What a study plays: one setting per (pool, protocol, dataset), one solo setting per (pool, dataset), and shards.

A setting is everything a worker needs to evaluate its plays on some examples: the protocol's spec over the
pool, the coalitions its estimate needs, the members that play alone, and the scorer. Shards cut the examples
of every dataset into groups, each carried with every setting: the requests several settings make identically
(coalitions of one protocol, protocols sharing the members' first answers, pools sharing a member) are made
for the same example, so they stay on one worker. Examples with the same input go to the same shard, so even
two datasets that ask the same question make its requests once.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from colab_graphs.audit.estimators import Coalition
from colab_graphs.audit.plan import AuditPlan, CallPlanner
from colab_graphs.audit.report import TokenCount
from colab_graphs.audit.strategy import choose_strategy
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.spec import GraphSpec
from colab_graphs.study.config import DatasetEntry, ProtocolEntry, StudyConfig, StudyConfigError
from colab_graphs.tasks.example import Example

SOLO = "solo"


@dataclass(frozen=True)
class Setting:
    """One game of the study, played per example by workers and recorded by the driver.

    Attributes:
        key: "POOL/PROTOCOL/DATASET" for an audit, "POOL/solo/DATASET" for the solo runs of a pool.
        pool: Pool name.
        protocol: Protocol label (its folder), or None for solo runs.
        dataset: Dataset label.
        spec: The protocol over the whole pool (the `solo` protocol for solo runs).
        coalitions: The coalitions played up front (none for solo runs; a sampled estimate plays its first
            batch here and the rest when its audit is finished, `play_audit`).
        solo_members: Members that play alone (every member for solo runs, none for audits).
        scorer: Scorer name, or None for each example's default.
        family: The protocol's family (None for solo runs).
        params: The protocol parameters as given in the study file.
    """

    key: str
    pool: str
    protocol: str | None
    dataset: str
    spec: GraphSpec
    coalitions: tuple[Coalition, ...]
    solo_members: tuple[str, ...]
    scorer: str | None
    family: str | None = None
    params: dict = field(default_factory=dict)

    @property
    def folder(self) -> str:
        """Where its plays are kept, relative to the study folder: audits/POOL/PROTOCOL/DATASET or solo/..."""
        if self.protocol is None:
            return f"solo/{self.pool}/{self.dataset}"
        return f"audits/{self.pool}/{self.protocol}/{self.dataset}"


@dataclass
class StudyPlan:
    """The settings of a study, its pools and its examples by dataset label."""

    pools: dict[str, Pool]
    audits: list[Setting]
    solos: list[Setting]
    examples: dict[str, list[Example]]
    datasets: dict[str, DatasetEntry]
    source: str = "study"
    sandbox: str | None = None  # code scores' sandbox setting: every worker plays under it
    # The stall watchdog's time for every worker's plays (`colab_graphs.watch`; None: its default; 0: none).
    stall_after: float | None = None

    @property
    def settings(self) -> list[Setting]:
        """Every setting a worker plays: solo runs first (their answers are the protocols' first answers)."""
        return [*self.solos, *self.audits]

    def solo_of(self, audit: Setting) -> Setting:
        return next(s for s in self.solos if s.pool == audit.pool and s.dataset == audit.dataset)

    def plays_planned(self) -> int:
        """(coalition or solo member, example) plays in the whole study."""
        return sum(
            (len(s.coalitions) + len(s.solo_members)) * len(self.examples[s.dataset]) for s in self.settings
        )


@dataclass(frozen=True)
class Shard:
    """Examples of one or more datasets that a worker plays with every setting."""

    index: int
    examples: dict[str, list[Example]]

    def size(self) -> int:
        return sum(len(v) for v in self.examples.values())


def build_plan(config: StudyConfig) -> StudyPlan:
    """Load every dataset and build every setting's spec and coalitions; errors name the study file's key.

    Raises:
        StudyConfigError: a dataset that cannot be read or has repeated ids, a protocol that cannot be built
            over a pool (its parameters, its member count), or an estimate that cannot be planned.
    """
    from colab_graphs.protocol_registry import build_protocol, get_protocol
    from colab_graphs.spec import SpecError

    where = config.path
    examples: dict[str, list[Example]] = {}
    for i, entry in enumerate(config.datasets, 1):
        examples[entry.label] = _load(entry, config.seed, f"{where}: datasets[{i}]")

    audits: list[Setting] = []
    solos: list[Setting] = []
    for pool_name, pool in config.pools.items():
        for dataset in config.datasets:
            spec = build_protocol(SOLO, pool.names, member=pool.names[0])
            key = f"{pool_name}/{SOLO}/{dataset.label}"
            solos.append(
                Setting(key, pool_name, None, dataset.label, spec, (), tuple(pool.names), dataset.scorer)
            )
        for i, entry in enumerate(config.protocols, 1):
            info = get_protocol(entry.name)
            try:
                spec = build_protocol(entry.name, pool.names, **_with_descriptions(entry, info.params, pool))
                # Per dataset: whether the game is computed from answers depends on the number of examples.
                strategies = [
                    choose_strategy(
                        spec,
                        len(examples[dataset.label]),
                        config.method,  # type: ignore[arg-type]
                        budget=config.budget,
                        budget_unit=config.budget_unit,  # type: ignore[arg-type]
                        target_error=config.target_error,
                        seed=config.seed or 0,
                        force=config.force,
                    )
                    for dataset in config.datasets
                ]
            except (KeyError, ValueError, SpecError) as err:
                message = err.args[0] if isinstance(err, KeyError) else str(err)
                raise StudyConfigError(f"{where}: protocols[{i}] over pools.{pool_name}: {message}") from None
            for dataset, strategy in zip(config.datasets, strategies, strict=True):
                audits.append(
                    Setting(
                        f"{pool_name}/{entry.label}/{dataset.label}",
                        pool_name,
                        entry.label,
                        dataset.label,
                        spec,
                        strategy.coalitions,
                        (),
                        dataset.scorer,
                        info.family,
                        dict(entry.params),
                    )
                )
    datasets = {d.label: d for d in config.datasets}
    return StudyPlan(dict(config.pools), audits, solos, examples, datasets, str(config.path), config.sandbox)


def _with_descriptions(entry: ProtocolEntry, defaults: dict, pool: Pool) -> dict:
    """Pool member descriptions fill a protocol's `descriptions` parameter, as `colab-graphs audit` does."""
    params = dict(entry.params)
    if "descriptions" in defaults and "descriptions" not in params:
        described = {m.name: m.description for m in pool if m.description}
        if described:
            params["descriptions"] = described
    return params


def _load(entry: DatasetEntry, seed: int | None, where: str) -> list[Example]:
    from colab_graphs.tasks.loaders import load_examples

    try:
        examples = load_examples(
            entry.location or entry.source,
            split=entry.split,
            limit=entry.limit,
            shuffle_seed=seed,
            field_map=entry.fields,
            scorer=entry.scorer,
        )
    except (ValueError, FileNotFoundError, ImportError, KeyError) as err:
        raise StudyConfigError(f"{where}: {entry.source}: {err}") from None
    if not examples:
        raise StudyConfigError(f"{where}: {entry.source}: no examples")
    repeated = sorted(i for i, n in Counter(e.id for e in examples).items() if n > 1)
    if repeated:
        # Plays are kept by example id: a repeated id would let one example's result stand for another's.
        raise StudyConfigError(f"{where}: {entry.source}: repeated example ids {', '.join(repeated[:5])}")
    return examples


def make_shards(examples: dict[str, list[Example]], n_shards: int) -> list[Shard]:
    """Cut the examples into at most `n_shards` shards; examples with the same input share a shard.

    Inputs are dealt round-robin in order of first appearance, so shards are of similar size and the split is
    the same on every run of the same study.

    Example:
        >>> ex = {"d": [Example(id=str(i), input=f"q{i % 3}", answer="1") for i in range(6)]}
        >>> [sorted(e.id for e in s.examples["d"]) for s in make_shards(ex, 2)]
        [['0', '2', '3', '5'], ['1', '4']]
    """
    buckets: dict[str, int] = {}
    for items in examples.values():
        for example in items:
            digest = hashlib.sha256(example.input.encode("utf-8")).hexdigest()
            buckets.setdefault(digest, len(buckets))
    n = max(1, min(n_shards, len(buckets)))
    grouped: list[dict[str, list[Example]]] = [{} for _ in range(n)]
    for label, items in examples.items():
        for example in items:
            index = buckets[hashlib.sha256(example.input.encode("utf-8")).hexdigest()] % n
            grouped[index].setdefault(label, []).append(example)
    return [Shard(i, g) for i, g in enumerate(grouped) if g]


def shard_count(plan: StudyPlan, workers: int, shard_size: int | None) -> int:
    """Shards for `workers`: `shard_size` examples each when given, else four per worker (a killed worker
    costs its shard's calls again, so shards stay small; several per worker keep every worker busy)."""
    total = sum(len(v) for v in plan.examples.values())
    if shard_size:
        return max(1, math.ceil(total / shard_size))
    return max(1, 4 * workers)


def plan_study(config: StudyConfig, client: ModelClient) -> StudyDryRun:
    """Every setting's audit plan and the study's totals (a request several settings make counts once); no
    call is made (`colab-graphs study --dry-run`).

    Raises:
        StudyConfigError: as `build_plan`.
    """
    from colab_graphs.audit.plan import plan_audit

    plan = build_plan(config)
    settings: dict[str, AuditPlan] = {}
    requests: dict[str, CallPlanner] = {}
    bounded = extra = 0
    costs: list[float | None] = []
    exact = True
    for setting in plan.audits:
        pool, examples = plan.pools[setting.pool], plan.examples[setting.dataset]
        strategy = choose_strategy(
            setting.spec, len(examples), config.method,  # type: ignore[arg-type]
            budget=config.budget, budget_unit=config.budget_unit,  # type: ignore[arg-type]
            target_error=config.target_error, seed=config.seed or 0, force=config.force,
        )  # fmt: skip
        settings[setting.key] = plan_audit(
            setting.spec, pool, examples, strategy, client=client, scorer=setting.scorer
        )
        planner, more = settings[setting.key].counted
        exact = exact and planner.exact and not more
        extra += more
        for key in planner.requests:
            requests.setdefault(key, planner)
        for name in pool.names:
            runs, _, _, cost = planner.bounded_usage(name)
            bounded += runs
            costs.append(cost)
    cached = client.cache.contains(set(requests)) if client.cache is not None else set()
    prompt = completion = 0
    for key, planner in requests.items():
        if key not in cached:
            p, c, cost, _ = planner.fixed_usage(key)
            prompt, completion = prompt + p, completion + c
            costs.append(cost)
    total = len(requests) + bounded + extra
    return StudyDryRun(
        settings=settings,
        calls=total if exact else None,
        calls_max=None if exact else total,
        cached=len(cached),
        tokens=TokenCount(prompt=prompt, completion=completion),
        cost_usd=None if any(c is None for c in costs) else round(sum(costs), 8),  # type: ignore[arg-type]
        notes=["calls and cost of the study count a request that several settings make once"]
        + (["later batches of sampled settings are priced in their own plans only"] if extra else []),
    )


class StudyDryRun(BaseModel):
    """A study's plan (`OUT/plan.json` of `colab-graphs study --dry-run`): each setting's `AuditPlan`, and
    the study's distinct calls (`calls`, or a bound `calls_max`), those cached, tokens and cost."""

    kind: str = "study_plan"
    settings: dict[str, AuditPlan]
    calls: int | None = None
    calls_max: int | None = None
    cached: int = 0
    tokens: TokenCount = Field(default_factory=TokenCount)
    cost_usd: float | None = 0.0
    notes: list[str] = Field(default_factory=list)
