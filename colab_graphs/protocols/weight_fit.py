"""How a weight-level coalition is fitted and merged: the fit step of every `colab_graphs.protocols.weight` protocol.

`fit_weight_coalition(spec, pool, client=..., scorer=...)` takes the protocol restricted to one coalition, checks
that its members' weights can be merged (in-process `local/` folders of one architecture; adapters of one base
for `lorahub`), fits the method on the dev split when it searches (`greedy_soup`, `model_swarms`, `lorahub`,
`expo` choosing among members), merges, and returns the spec whose seat calls the merged model.

A `Recipe` names a model made from weights (an operation of `colab_graphs.local.merge` over input folders, or
a member's own model); `_Coalition.score` runs the coalition's seat over the dev examples with a recipe's model
served in memory (its calls through the run's client and cache). A fit is stored under `merges_home()/fits/`,
keyed by method, the members and the sha256 of their weights, the dev examples, the scorer, the seat's settings
and the parameters; the merged model is a folder under `merges_home()`. `stats` counts the fits this process
computed (`merge.stats` the merges).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colab_graphs.files import atomic_write_text
from colab_graphs.fitting import Fitted
from colab_graphs.local import merge
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import get_protocol
from colab_graphs.protocols.weight_search import es_search, greedy_soup_search, swarm_search
from colab_graphs.spec import GraphSpec, SpecError
from colab_graphs.tasks.example import Example

SEAT = "merged"
LOCAL_PREFIX = "local/"
REQUIREMENT = "local_weights"
# The seat's model until the fit step routes it: a call fails, and the failure names what is missing.
UNFITTED_MODEL = "local/unfitted-weight-merge(run-the-protocol's-fit-step:colab_graphs.fitting)"
# Parameters the fit key holds by content instead (the dev examples, the weights of `base` / `reference`).
_BY_CONTENT = ("dev", "dev_split", "dev_limit", "base", "reference")


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
            from colab_graphs.tasks.loaders import load_examples

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
        from colab_graphs.local.provider import set_local_model, unload
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
            "params": {k: v for k, v in self.params.items() if k not in _BY_CONTENT},
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
        atomic_write_text(path, json.dumps(record, indent=2) + "\n")
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
