"""Weight-level protocols: a coalition's model is one model merged from its members' weights.

`greedy_soup`, `dare_ties`, `model_swarms`, `lorahub` and `expo` (MoCo's names) merge the weights of in-process
`local/` members of one architecture (LoRA adapters of one base for `lorahub`) into one model that answers
alone. The spec has one seat, held by the first present member in pool order (its sampling settings and persona
apply); the protocol's fit step (`colab_graphs.protocols.fitting`) merges the coalition's members and routes the
seat's calls to the merged model. The coalition game fits each coalition once, before any call; `colab-graphs
run` fits the whole pool. A spec run without its fit step fails at its first call, naming the step.

Fitting. The searched methods (`greedy_soup`, `model_swarms`, `lorahub`, and `expo` choosing among members)
score candidate models on a dev split (`-P dev=SOURCE`, read as `--data` reads it; `dev_split` picks a split of
a file that has several) by running the coalition's own seat over it, so a coalition without a member searches
without it. Candidates live in memory; their dev calls go through the run's client and call cache.

Caching. A fit is stored under `merges_home()/fits/`, keyed by method, the members and the sha256 of their
weights, the dev examples, the scorer, the seat's settings and the parameters; a merged model is a folder under
`merges_home()` keyed by operation, inputs' weights and parameters (`colab_graphs.models.merge`). No audit merges
or fits the same coalition twice; `stats` and `merge.stats` count the work this process did.

Coalition rules: the empty coalition scores 0 (there are no weights to merge); the others are in each
protocol's docstring.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colab_graphs.builder import GraphBuilder
from colab_graphs.data.example import Example
from colab_graphs.models import merge
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocols.fitting import Fitted, declare_fit
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.protocols.registry import get_protocol, protocol
from colab_graphs.protocols.weight_search import es_search, greedy_soup_search, swarm_search
from colab_graphs.spec import GraphSpec, SpecError

SEAT = "merged"
LOCAL_PREFIX = "local/"
REQUIREMENT = "local_weights"
# The seat's model until the fit step routes it: a call fails, and the failure names what is missing.
UNFITTED_MODEL = "local/unfitted-weight-merge(run-the-protocol's-fit-step:colab_graphs.protocols.fitting)"
_DEV_PARAMS = ("dev", "dev_split", "dev_limit")


class WeightPoolError(SpecError):
    """A weight-level protocol was given members whose weights cannot be merged (each named, with why)."""


class FitError(ValueError):
    """A coalition could not be fitted (no dev data, or scoring a candidate on it failed)."""


stats = merge.Work()  # fits this process computed (a fit found in the cache counts nothing)


@dataclass
class Recipe:
    """A model made from weights: `op` over `inputs` (folders) with `params`; or, with `member`, that member's own.

    `like` (the first input) gives the merged folder its config and tokenizer.
    """

    op: str = "member"
    inputs: tuple[Path, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    member: str | None = None

    @property
    def key(self) -> str:
        return f"member:{self.member}" if self.member else merge.merge_key(self.op, self.inputs, self.params)

    @property
    def like(self) -> Path:
        return self.inputs[0]

    def build(self, load: Callable[[Path], merge.State]) -> merge.State:
        """The merged weights (inputs read through `load`, which may cache them)."""
        states = [load(p) for p in self.inputs]
        p = self.params
        if self.op == "linear":
            return merge.linear(states, p["coefficients"])
        if self.op == "dare_ties":
            return merge.dare_ties(
                states[0],
                states[1:],
                p["weights"],
                drop_rate=p["drop_rate"],
                density=p["density"],
                seed=p["seed"],
            )
        if self.op == "extrapolate":
            return merge.extrapolate(states[0], states[1], p["alpha"])
        if self.op == "lora":
            adapter = merge.compose_adapters(states[1:], p["weights"])
            return merge.apply_adapter(states[0], adapter, p)
        raise ValueError(f"unknown merge operation {self.op!r}")


class _Coalition:
    """One coalition of a weight protocol while it is fitted: its members' folders, dev data and scores."""

    def __init__(self, spec: GraphSpec, pool: Pool, client: ModelClient, scorer: str | None, method: _Method):
        self.spec, self.pool, self.client, self.scorer, self.method = spec, pool, client, scorer, method
        self.name = spec.name
        self.params = {**get_protocol(spec.name).params, **spec.params}
        self.members = list(spec.members)
        self.folders = self._member_folders()
        self.extra = method.extra_inputs(self)
        compared = dict(self.folders)
        if not method.adapters:  # an adapter's architecture names its base already
            compared.update({f"{label} ({path.name})": path for label, path in self.extra.items()})
        problems = merge.architecture_problems(compared)
        if problems:
            raise WeightPoolError(
                self.name,
                [
                    f"{self.name} merges weights entry by entry, so its members need one architecture; these "
                    f"differ: {'; '.join(problems)}"
                ],
            )
        self.candidates = 0
        self._states: dict[Path, merge.State] = {}
        self._scores: dict[str, float] = {}
        self._dev: list[Example] | None = None

    def _member_folders(self) -> dict[str, Path]:
        remote = [m for m in self.members if not self.pool[m].model.startswith(LOCAL_PREFIX)]
        if remote:
            listed = ", ".join(f"{m} ({self.pool[m].model})" for m in remote)
            raise WeightPoolError(
                self.name,
                [
                    f"{self.name} merges its members' weights, which only in-process models give: member(s) "
                    f"{listed} are not '{LOCAL_PREFIX}...' models (a zoo name or a model folder)"
                ],
            )
        folders: dict[str, Path] = {}
        problems = []
        for m in self.members:
            ref = self.pool[m].model
            try:
                folder = merge.model_folder(ref)
                if self.method.adapters and not merge.is_adapter(folder):
                    problems.append(
                        f"member {m} ({ref}) is not a LoRA adapter folder ({self.name} composes adapters)"
                    )
                folders[m] = folder if self.method.adapters else merge.served_folder(ref)
            except (FileNotFoundError, merge.MergeError) as err:
                problems.append(f"member {m} ({ref}): {err}")
        if problems:
            raise WeightPoolError(self.name, problems)
        return folders

    # --- dev data and scoring --------------------------------------------------------------------------------

    def dev(self) -> list[Example]:
        if self._dev is None:
            source = self.params.get("dev")
            if not source:
                raise FitError(
                    f"{self.name} fits coalition {self.members} on a dev split: give -P dev=SOURCE (a file or a "
                    "source as --data takes; -P dev_split=NAME picks a split of a file that has several)"
                )
            from colab_graphs.data.loaders import load_examples

            limit = int(self.params.get("dev_limit") or 0) or None
            self._dev = load_examples(source, split=self.params.get("dev_split") or None, limit=limit)
            if not self._dev:
                raise FitError(f"{self.name}: the dev data {source!r} holds no examples")
        return self._dev

    def load(self, folder: Path) -> merge.State:
        if folder not in self._states:
            self._states[folder] = merge.load_state(folder)
        return self._states[folder]

    async def score(self, recipe: Recipe) -> float:
        """The mean dev score of the coalition's seat answering with `recipe`'s model (once per model)."""
        key = recipe.key
        if key in self._scores:
            return self._scores[key]
        from colab_graphs.compile import compile_graph
        from colab_graphs.models.local import set_local_model, unload
        from colab_graphs.runner import run_example

        examples = self.dev()
        served = None
        if recipe.member is not None:
            ref = self.pool[recipe.member].model
        else:
            state = await asyncio.to_thread(recipe.build, self.load)
            model, tokenizer = await asyncio.to_thread(merge.instantiate, recipe.like, state)
            served = f"merge-candidate-{key}"
            set_local_model(served, model, tokenizer)
            ref = LOCAL_PREFIX + served
        try:
            spec = with_model(self.spec, ref)
            graph = compile_graph(spec, self.pool, self.client, fuse=True)
            outcomes = await asyncio.gather(
                *(run_example(graph, spec, self.pool, self.client, e, self.scorer) for e in examples)
            )
        finally:
            if served is not None:
                unload(served)
        failed = [o for o in outcomes if o.failed]
        if failed:
            raise FitError(
                f"{self.name}: scoring a candidate on dev failed on {failed[0].example_id}: {failed[0].error}"
            )
        value = sum(o.score or 0.0 for o in outcomes) / len(outcomes)
        self._scores[key] = value
        self.candidates += 1
        return value

    # --- recipes ---------------------------------------------------------------------------------------------

    def linear(self, coefficients: dict[str, float]) -> Recipe:
        """Σ c_m θ_m over the members (a member's own model when one coefficient is 1 and the others 0)."""
        used = {m: c for m, c in coefficients.items() if c != 0.0}
        if len(used) == 1 and next(iter(used.values())) == 1.0:
            return Recipe(member=next(iter(used)))
        names = [m for m in self.members if m in coefficients]
        return Recipe(
            "linear",
            tuple(self.folders[m] for m in names),
            {"coefficients": [coefficients[m] for m in names]},
        )

    def soup(self, members: list[str]) -> Recipe:
        return self.linear({m: 1.0 / len(members) for m in members})

    # --- fit, cache, merge -----------------------------------------------------------------------------------

    def fit_key(self) -> str:
        seat = self.spec.node(SEAT)
        member = self.pool[seat.member]
        blob = {
            "method": self.name,
            "members": [[m, merge.identity(self.folders[m])] for m in self.members],
            "inputs": {label: merge.identity(p) for label, p in self.extra.items()},
            "params": {k: v for k, v in self.params.items() if k not in _DEV_PARAMS},
            "dev": [e.model_dump() for e in self.dev()],
            "scorer": self.scorer,
            "seat": {
                "prompt": getattr(seat, "prompt", None),
                "system": getattr(seat, "system", None),
                "settings": {k: v for k, v in getattr(seat, "settings", {}).items() if k != "model"},
                "member": {k: v for k, v in member.public_settings().items() if k != "model"},
                "persona": member.system_prompt,
            },
        }
        return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:20]

    async def fit(self) -> tuple[dict[str, Any], bool | None, float, int]:
        """(result, fitted now?, seconds the fit took, candidates it scored); cached by `fit_key`."""
        if not self.method.needs_fit(self):
            return {}, None, 0.0, 0
        path = merge.merges_home() / "fits" / f"{self.name}-{self.fit_key()}.json"
        if path.is_file():
            stored = json.loads(path.read_text())
            return stored["result"], False, stored["fit_s"], stored["candidates"]
        started = time.perf_counter()
        result = await self.method.fit(self)
        fit_s = time.perf_counter() - started
        stats.done += 1
        stats.seconds += fit_s
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"method": self.name, "members": self.members, "result": result, "fit_s": round(fit_s, 3)}
        record.update(candidates=self.candidates, dev_examples=len(self.dev()))
        temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(temp, path)
        return result, True, fit_s, self.candidates

    async def route(self, recipe: Recipe) -> tuple[str, bool | None, float]:
        """The model the seat calls for `recipe` (merging it once), whether it was merged now, and the seconds."""
        if recipe.member is not None:
            return self.pool[recipe.member].model, None, 0.0
        existed = (merge.merged_folder(recipe.op, recipe.inputs, recipe.params) / merge.RECIPE_FILE).is_file()
        folder = await asyncio.to_thread(
            merge.materialise,
            recipe.op,
            recipe.inputs,
            recipe.params,
            lambda: recipe.build(self.load),
            like=recipe.like,
        )
        merge_s = json.loads((folder / merge.RECIPE_FILE).read_text()).get("merge_s", 0.0)
        return LOCAL_PREFIX + str(folder), not existed, merge_s


def with_model(spec: GraphSpec, model: str) -> GraphSpec:
    """`spec` with its merged seat's calls sent to `model`."""
    nodes = [
        n.model_copy(update={"settings": {**n.settings, "model": model}}) if n.name == SEAT else n  # type: ignore[union-attr]
        for n in spec.nodes
    ]
    return spec.model_copy(update={"nodes": nodes})


async def fit_weight_coalition(
    spec: GraphSpec, pool: Pool, *, client: ModelClient, scorer: str | None = None
) -> Fitted:
    """The fit step of every weight protocol: fit (or find) the coalition's merge, make (or find) it, route to it.

    Raises:
        WeightPoolError: members that are not local models, not model (or adapter) folders, or of several
            architectures; each named.
        FitError: a searched method without dev data, or a dev run that failed.
    """
    method = _METHODS[spec.name]
    coalition = _Coalition(spec, pool, client, scorer, method)
    result, fitted, fit_s, candidates = await coalition.fit()
    recipe = method.recipe(coalition, result)
    model, merged, merge_s = await coalition.route(recipe)
    record = {
        "members": coalition.members,
        "model": model,
        "fitted": fitted,
        "fit_s": round(fit_s, 3),
        "merged": merged,
        "merge_s": round(merge_s, 3),
        "candidates": candidates,
        "dev_examples": len(coalition.dev()) if fitted is not None else 0,
        "result": result,
    }
    return Fitted(with_model(spec, model), record)


# --- the methods -------------------------------------------------------------------------------------------------


class _Method:
    """How one weight protocol fits a coalition and what it merges; no fit and no extra inputs by default."""

    adapters = False

    def extra_inputs(self, c: _Coalition) -> dict[str, Path]:
        return {}

    def needs_fit(self, c: _Coalition) -> bool:
        return False

    async def fit(self, c: _Coalition) -> dict[str, Any]:
        return {}

    def recipe(self, c: _Coalition, fit: dict[str, Any]) -> Recipe:
        raise NotImplementedError


class _GreedySoup(_Method):
    def needs_fit(self, c: _Coalition) -> bool:
        return len(c.members) > 1

    async def fit(self, c: _Coalition) -> dict[str, Any]:
        async def score(members: list[str]) -> float:
            return await c.score(c.soup(members))

        found = await greedy_soup_search(c.members, score, keep_ties=bool(c.params["keep_ties"]))
        return {"soup": found.soup, "dev_score": found.score, "alone": found.alone, "tried": found.tried}

    def recipe(self, c: _Coalition, fit: dict[str, Any]) -> Recipe:
        return c.soup(fit.get("soup") or c.members)


class _DareTies(_Method):
    def extra_inputs(self, c: _Coalition) -> dict[str, Path]:
        base = c.params.get("base")
        return {"base": merge.served_folder(str(base))} if base else {}

    def recipe(self, c: _Coalition, fit: dict[str, Any]) -> Recipe:
        if "base" in c.extra:
            base, merged = c.extra["base"], c.members
        else:  # MoCo's rule: the coalition's first member is the base the others' task vectors start from
            base, merged = c.folders[c.members[0]], c.members[1:]
            if not merged:
                return Recipe(member=c.members[0])
        weights = c.params.get("weights") or {}
        params = {
            "weights": [float(weights.get(m, 1.0)) for m in merged],
            "drop_rate": float(c.params["drop_rate"]),
            "density": float(c.params["density"]),
            "seed": int(c.params["seed"]),
        }
        return Recipe("dare_ties", (base, *(c.folders[m] for m in merged)), params)


class _ModelSwarms(_Method):
    def needs_fit(self, c: _Coalition) -> bool:
        return len(c.members) > 1

    async def fit(self, c: _Coalition) -> dict[str, Any]:
        async def score(coefficients: list[float]) -> float:
            return await c.score(c.linear(dict(zip(c.members, coefficients, strict=True))))

        keys = ("population", "max_iterations", "inertia", "cognitive", "social", "repel", "step_length")
        keys += ("patience", "restart_patience", "seed")
        found = await swarm_search(len(c.members), score, **{k: c.params[k] for k in keys})
        return {
            "coefficients": dict(zip(c.members, found.best, strict=True)),
            "dev_score": found.score,
            "iterations": found.iterations,
        }

    def recipe(self, c: _Coalition, fit: dict[str, Any]) -> Recipe:
        return c.linear(fit.get("coefficients") or {c.members[0]: 1.0})


class _LoraHub(_Method):
    adapters = True

    def extra_inputs(self, c: _Coalition) -> dict[str, Path]:
        return {"base": merge.adapter_base(c.folders[c.members[0]])}

    def needs_fit(self, c: _Coalition) -> bool:
        return True

    def composed(self, c: _Coalition, weights: list[float]) -> Recipe:
        config = merge.adapter_config(c.folders[c.members[0]])
        params = {"weights": weights, "r": config["r"], "lora_alpha": config.get("lora_alpha", config["r"])}
        params["use_rslora"] = bool(config.get("use_rslora"))
        return Recipe("lora", (c.extra["base"], *(c.folders[m] for m in c.members)), params)

    async def fit(self, c: _Coalition) -> dict[str, Any]:
        l1 = float(c.params["l1"])

        async def objective(weights: list[float]) -> float:
            score = await c.score(self.composed(c, weights))
            return (1.0 - score) + l1 * sum(abs(w) for w in weights) / len(weights)

        found = await es_search(
            len(c.members),
            objective,
            budget=int(c.params["budget"]),
            bound=float(c.params["bound"]),
            seed=int(c.params["seed"]),
        )
        return {"weights": dict(zip(c.members, found.weights, strict=True)), "objective": found.objective}

    def recipe(self, c: _Coalition, fit: dict[str, Any]) -> Recipe:
        return self.composed(c, [float(fit["weights"][m]) for m in c.members])


class _Expo(_Method):
    def extra_inputs(self, c: _Coalition) -> dict[str, Path]:
        reference = c.params.get("reference")
        if not reference:
            raise FitError(
                "expo extrapolates away from the checkpoint the members were aligned from: give "
                "-P reference=MODEL (a zoo name or model folder)"
            )
        return {"reference": merge.served_folder(str(reference))}

    def needs_fit(self, c: _Coalition) -> bool:
        return len(c.members) > 1 or bool(c.params.get("alpha_candidates"))

    def extrapolated(self, c: _Coalition, aligned: str, alpha: float) -> Recipe:
        if alpha == 0.0:
            return Recipe(member=aligned)
        return Recipe("extrapolate", (c.folders[aligned], c.extra["reference"]), {"alpha": alpha})

    async def fit(self, c: _Coalition) -> dict[str, Any]:
        alone = {m: await c.score(Recipe(member=m)) for m in c.members} if len(c.members) > 1 else {}
        aligned = max(c.members, key=lambda m: alone.get(m, 0.0))  # max keeps the first of equals: pool order
        alpha, tried = float(c.params["alpha"]), {}
        for candidate in c.params.get("alpha_candidates") or []:
            tried[str(candidate)] = await c.score(self.extrapolated(c, aligned, float(candidate)))
        if tried:
            alpha = float(max(tried, key=lambda a: tried[a]))
        return {"aligned": aligned, "alpha": alpha, "alone": alone, "alphas": tried}

    def recipe(self, c: _Coalition, fit: dict[str, Any]) -> Recipe:
        return self.extrapolated(
            c, fit.get("aligned") or c.members[0], float(fit.get("alpha", c.params["alpha"]))
        )


_METHODS: dict[str, _Method] = {
    "greedy_soup": _GreedySoup(),
    "dare_ties": _DareTies(),
    "model_swarms": _ModelSwarms(),
    "lorahub": _LoraHub(),
    "expo": _Expo(),
}


# --- the protocols -----------------------------------------------------------------------------------------------


def _merged_model(name: str, members: list[str], prompt: str, description: str) -> GraphSpec:
    b = GraphBuilder(name, members=members, description=description)
    b.seat(
        SEAT,
        member=members[0],
        prompt=prompt,
        writes="answer",
        settings={"model": UNFITTED_MODEL},
        on_absent="substitute",  # the first present member holds the seat; the fit step gives it the merge
        role=f"the {name} of the coalition's weights",
    )
    b.aggregate("final", "extract", reads={"answer": "answer"}, writes="final")
    return b.chain(SEAT, "final").output("final").build()


def _check(name: str, ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {message}")


@protocol(
    "greedy_soup",
    family="weight",
    description="One model: the uniform average of the members a greedy search on dev keeps (local members "
    "of one architecture).",
    requires=[REQUIREMENT],
)
def greedy_soup(
    members: list[str],
    dev: str | None = None,
    dev_split: str = "dev",
    dev_limit: int = 0,
    keep_ties: bool = False,
    prompt: str = ANSWER,
) -> GraphSpec:
    """Greedy model soup (Wortsman et al., 2022, "Model soups", ICML): average the weights of members that help.

    Members are ranked by their dev score alone; starting from the best, each next member joins when the
    uniform average with it scores higher on dev than without it. Coalitions: the search runs over the present
    members only; a coalition of one is that member; the empty coalition scores 0.

    Args:
        dev: the dev data the search scores on (a file or source, as --data takes).
        dev_split: the split to read from a file that has several (MoCo's JSON files).
        dev_limit: dev examples used (0: all).
        keep_ties: also add a member whose soup scores as well as the soup without it (MoCo's rule).
        prompt: the question template.
    """
    _check("greedy_soup", dev_limit >= 0, f"dev_limit must be >= 0, got {dev_limit}")
    return _merged_model("greedy_soup", members, prompt, "a greedy soup of the members' weights")


@protocol(
    "dare_ties",
    family="weight",
    description="One model: the members' task vectors randomly dropped and rescaled (DARE), then merged with "
    "sign consensus (TIES).",
    requires=[REQUIREMENT],
)
def dare_ties(
    members: list[str],
    base: str | None = None,
    drop_rate: float = 0.5,
    density: float = 1.0,
    weights: dict[str, float] | None = None,
    seed: int = 0,
    prompt: str = ANSWER,
) -> GraphSpec:
    """DARE (Yu et al., 2024, "Language Models are Super Mario", ICML) then TIES merging (Yadav et al., 2023,
    NeurIPS) of the members' task vectors τ_i = θ_i - θ_base.

    Each τ_i loses each entry with probability `drop_rate` (the rest rescaled by 1 / (1 - drop_rate)), keeps its
    `density` fraction of largest magnitudes, and the entries whose sign agrees with the sign of Σ w_i τ_i are
    averaged (weights `weights`) onto the base. Coalitions: without `base`, the coalition's first member is the
    base (MoCo's mergekit configuration), so a coalition of one is that member; with `base`, a coalition of
    one is the base plus that member's sparsified task vector. The empty coalition scores 0.

    Args:
        base: the model the members were fine-tuned from (a zoo name or folder); default: the first member.
        drop_rate: DARE's drop probability, in [0, 1) (0: TIES alone).
        density: fraction of each task vector TIES keeps by magnitude, in (0, 1] (1: all; mergekit's default).
        weights: member -> weight in the sign election and the mean (default 1 each).
        seed: seed of DARE's draw.
        prompt: the question template.
    """
    _check("dare_ties", 0.0 <= drop_rate < 1.0, f"drop_rate must be in [0, 1), got {drop_rate}")
    _check("dare_ties", 0.0 < density <= 1.0, f"density must be in (0, 1], got {density}")
    unknown = sorted(set(weights or {}) - set(members))
    _check("dare_ties", not unknown, f"weights name unknown member(s) {', '.join(unknown)}")
    return _merged_model("dare_ties", members, prompt, "a DARE-TIES merge of the members' weights")


@protocol(
    "model_swarms",
    family="weight",
    description="One model: the best particle of a swarm search over combinations of the members' weights, "
    "scored on dev.",
    requires=[REQUIREMENT],
)
def model_swarms(
    members: list[str],
    dev: str | None = None,
    dev_split: str = "dev",
    dev_limit: int = 0,
    population: int = 5,
    max_iterations: int = 5,
    inertia: float = 0.2,
    cognitive: float = 0.3,
    social: float = 0.4,
    repel: float = 0.05,
    step_length: float = 0.5,
    patience: int = 5,
    restart_patience: int = 3,
    seed: int = 0,
    prompt: str = ANSWER,
) -> GraphSpec:
    """Model Swarms (Feng et al., 2024, "Model Swarms: Collaborative Search to Adapt LLM Experts via Swarm
    Intelligence"): particle swarm optimisation in weight space, starting from the members.

    Particles move towards their own best, the swarm's best and away from its worst, each scored on dev (see
    `colab_graphs.protocols.weight_search.swarm_search`, run in the exact coordinates of the members' weights).
    Coalitions: the swarm starts from the present members only; a coalition of one is that member (a swarm
    of one model cannot move); the empty coalition scores 0.

    Args:
        dev: the dev data particles are scored on (a file or source, as --data takes).
        dev_split: the split to read from a file that has several.
        dev_limit: dev examples used (0: all).
        population: particles (at least the number of members; crossovers fill the rest).
        max_iterations: most swarm iterations.
        inertia: weight of a particle's own velocity.
        cognitive: pull towards the particle's personal best.
        social: pull towards the swarm's global best.
        repel: push away from the swarm's global worst.
        step_length: step size (decays by 0.95 per iteration, down to 0.1).
        patience: iterations without a better global best before the search stops.
        restart_patience: iterations without a better own score before a particle restarts from its best.
        seed: seed of the swarm's random draws.
        prompt: the question template.
    """
    _check(
        "model_swarms", population >= 1 and max_iterations >= 1, "population and max_iterations must be >= 1"
    )
    _check("model_swarms", dev_limit >= 0, f"dev_limit must be >= 0, got {dev_limit}")
    return _merged_model(
        "model_swarms", members, prompt, "a swarm-searched combination of the members' weights"
    )


@protocol(
    "lorahub",
    family="weight",
    description="One model: the base with the members' LoRA adapters composed by weights searched on dev "
    "(adapters of one base).",
    requires=[REQUIREMENT],
)
def lorahub(
    members: list[str],
    dev: str | None = None,
    dev_split: str = "dev",
    dev_limit: int = 5,
    budget: int = 20,
    bound: float = 1.5,
    l1: float = 0.05,
    seed: int = 0,
    prompt: str = ANSWER,
) -> GraphSpec:
    """LoraHub (Huang et al., 2024, "LoraHub: Efficient Cross-Task Generalization via Dynamic LoRA
    Composition", COLM): members are LoRA adapters of one base; the merged adapter is A = Σ w_i A_i,
    B = Σ w_i B_i, with w searched gradient-free on dev to minimise (1 - score) + l1 · mean |w|.

    Members are pool entries whose model is an adapter folder (`local/path/to/adapter`; alone, each runs as its
    base with the adapter merged). Coalitions: only the present members' adapters are composed, with weights
    searched for that coalition; a coalition of one is the base plus w times that adapter, w searched; the
    empty coalition scores 0.

    Args:
        dev: the dev data the weights are scored on (a file or source, as --data takes).
        dev_split: the split to read from a file that has several.
        dev_limit: dev examples used (0: all; MoCo uses 5).
        budget: candidate weight vectors scored (the search starts from all zeros: the base model).
        bound: each weight stays in [-bound, bound].
        l1: weight of the L1 penalty on the weights.
        seed: seed of the search.
        prompt: the question template.
    """
    _check("lorahub", budget >= 1 and bound > 0, "budget must be >= 1 and bound > 0")
    _check("lorahub", dev_limit >= 0, f"dev_limit must be >= 0, got {dev_limit}")
    return _merged_model("lorahub", members, prompt, "the base with the members' LoRA adapters composed")


@protocol(
    "expo",
    family="weight",
    description="One model: the best member on dev extrapolated away from a reference checkpoint (ExPO).",
    requires=[REQUIREMENT],
)
def expo(
    members: list[str],
    reference: str | None = None,
    alpha: float = 0.3,
    alpha_candidates: list[float] | None = None,
    dev: str | None = None,
    dev_split: str = "dev",
    dev_limit: int = 0,
    prompt: str = ANSWER,
) -> GraphSpec:
    """ExPO (Zheng et al., 2025, "Model Extrapolation Expedites Alignment", ACL): θ = θ_aligned + α (θ_aligned
    - θ_reference), the aligned model pushed further from the checkpoint it was aligned from.

    Each member is an aligned model of the one `reference` (MoCo's SFT/DPO pairs with a shared SFT side); as in
    MoCo, the member with the best dev score is extrapolated, and with `alpha_candidates` the α with the best
    dev score is chosen. Coalitions: the best member is chosen among the present ones; a coalition of one
    extrapolates that member (no dev data needed unless α is searched); the empty coalition scores 0.

    Args:
        reference: the checkpoint the members were aligned from (a zoo name or folder); required.
        alpha: the extrapolation coefficient (0: the aligned member itself).
        alpha_candidates: α values to choose from on dev (empty: use `alpha`).
        dev: the dev data members (and α) are chosen on (a file or source, as --data takes).
        dev_split: the split to read from a file that has several.
        dev_limit: dev examples used (0: all).
        prompt: the question template.
    """
    _check("expo", dev_limit >= 0, f"dev_limit must be >= 0, got {dev_limit}")
    return _merged_model("expo", members, prompt, "the best member extrapolated from a reference")


for _builder in (greedy_soup, dare_ties, model_swarms, lorahub, expo):
    declare_fit(_builder, fit_weight_coalition)
