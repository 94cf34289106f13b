"""Weight-level protocols: a coalition's model is one model merged from its members' weights.

`greedy_soup`, `dare_ties`, `model_swarms`, `lorahub` and `expo` (MoCo's names) merge the weights of in-process
`local/` members of one architecture (LoRA adapters of one base for `lorahub`) into one model that answers
alone. The spec has one seat, held by the first present member in pool order (its sampling settings and persona
apply); the protocol's fit step (`colab_graphs.fitting`) merges the coalition's members and routes the
seat's calls to the merged model. The coalition game fits each coalition once, before any call; `colab-graphs
run` fits the whole pool. A spec run without its fit step fails at its first call, naming the step.

Fitting. The searched methods (`greedy_soup`, `model_swarms`, `lorahub`, and `expo` choosing among members)
score candidate models on a dev split (`-P dev=SOURCE`, read as `--data` reads it; `dev_split` picks a split of
a file that has several) by running the coalition's own seat over it, so a coalition without a member searches
without it. Candidates live in memory; their dev calls go through the run's client and call cache.

Caching. A fit is stored under `merges_home()/fits/`, keyed by method, the members and the sha256 of their
weights, the dev examples, the scorer, the seat's settings and the parameters; a merged model is a folder under
`merges_home()` keyed by operation, inputs' weights and parameters (`colab_graphs.local.merge`). No audit merges
or fits the same coalition twice; `stats` and `merge.stats` count the work this process did.

Coalition rules: the empty coalition scores 0 (there are no weights to merge); the others are in each
protocol's docstring.
"""

from __future__ import annotations

from colab_graphs.builder import GraphBuilder
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.protocols.weight_fit import (
    REQUIREMENT,
    SEAT,
    UNFITTED_MODEL,
    FitError,
    WeightPoolError,
    fit_weight_coalition,
    stats,
    with_model,
)
from colab_graphs.registry import protocol
from colab_graphs.spec import GraphSpec

__all__ = [
    "SEAT",
    "UNFITTED_MODEL",
    "FitError",
    "WeightPoolError",
    "dare_ties",
    "expo",
    "fit_weight_coalition",
    "greedy_soup",
    "lorahub",
    "model_swarms",
    "stats",
    "with_model",
]

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
    fit=fit_weight_coalition,
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
    fit=fit_weight_coalition,
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
    averaged (weights `weights`) onto the base; with `drop_rate` 0 this is TIES. (mergekit's `dare_ties`, which
    MoCo calls, sums the agreeing entries unless `normalize: true`.) Coalitions: without `base`, the
    coalition's first member is the base (MoCo's mergekit configuration), so a coalition of one is that member;
    with `base`, a coalition of one is the base plus that member's sparsified task vector. The empty coalition
    scores 0.

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
    fit=fit_weight_coalition,
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
    fit=fit_weight_coalition,
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
    fit=fit_weight_coalition,
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
