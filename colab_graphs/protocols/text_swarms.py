"""`heterogeneous_swarms` (MoCo's name): the graph of who reads whom, searched on the dev split.

The fitted protocol is a DAG over the coalition's members: a member with no predecessor answers the question
alone; a member with predecessors answers with their responses in front of it; the one member that feeds no one
(the end node) gives the final answer. The fit step searches the DAG by particle swarm on a continuous
adjacency matrix scored on dev (`decode` turns a matrix into a DAG), per coalition, and caches it.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from colab_graphs.builder import GraphBuilder
from colab_graphs.fitting import Fitted
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocols import dev_fit
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.protocols.stages import check_count, check_members
from colab_graphs.protocols.text_fit import mean_score, run_on_dev, unfitted
from colab_graphs.protocols.weight_search import swarm_search
from colab_graphs.registry import protocol
from colab_graphs.spec import END, START, GraphSpec

RELAY = (
    "Previous responses to the question below (some may be wrong or unhelpful: feel free to ignore them):\n\n"
    "{previous}\n\n"
    "Question: {input}\n\n"
    "Answer the question with the help of the previous responses. {answer_format}"
)
FINAL = (
    "Previous responses to the question below (some may be wrong or unhelpful: feel free to ignore them):\n\n"
    "{previous}\n\n"
    "Question: {input}\n\n"
    "Answer the question with the help of the previous responses, and make sure to give a final answer. "
    "{answer_format}"
)

__all__ = ["decode", "dag_spec", "fit_heterogeneous_swarms", "heterogeneous_swarms"]


async def fit_heterogeneous_swarms(
    spec: GraphSpec, pool: Pool, *, client: ModelClient, scorer: str | None = None
) -> Fitted:
    """The fit step: search the coalition's DAG on dev (or find it cached); a coalition of one answers alone.

    Raises:
        FitError: no dev data (a coalition of two or more members needs it), or a dev run failed.
    """
    name, members = spec.name, list(spec.members)
    params = dev_fit.protocol_params(spec)
    prompts = (str(params["prompt"]), str(params["relay_prompt"]), str(params["final_prompt"]))
    if len(members) == 1:
        return Fitted(
            _as_built(spec, {}, prompts), dev_fit.record(members, None, 0.0, 0, {"end": members[0]})
        )
    examples = dev_fit.dev_examples(name, params, members)
    key = dev_fit.fit_key(name, pool, members, examples, scorer, params)

    async def compute() -> dict[str, Any]:
        scores: dict[tuple, float] = {}

        async def score_dag(feeds: dict[int, int]) -> float:
            graph = tuple(sorted(feeds.items()))
            if graph not in scores:
                named = {members[i]: members[j] for i, j in feeds.items()}
                outcomes = await run_on_dev(
                    dag_spec(members, named, *prompts), pool, examples, client=client, scorer=scorer
                )
                scores[graph] = mean_score(outcomes)
            return scores[graph]

        n, population = len(members), int(params["population"])
        rng = random.Random(int(params["seed"]))
        anchors = [np.array([[rng.random() for _ in range(n)] for _ in range(n)]) for _ in range(population)]

        async def score(coordinates: list[float]) -> float:
            return await score_dag(decode(sum(c * m for c, m in zip(coordinates, anchors, strict=True))))

        keys = ("max_iterations", "inertia", "cognitive", "social", "repel", "step_length", "patience")
        found = await swarm_search(
            len(anchors),
            score,
            population=len(anchors),
            restart_patience=int(params["restart_patience"]),
            seed=int(params["seed"]),
            **{k: params[k] for k in keys},
        )
        best = decode(sum(c * m for c, m in zip(found.best, anchors, strict=True)))
        feeds = {members[i]: members[j] for i, j in best.items()}
        return {
            "feeds": feeds,
            "end": next(m for m in members if m not in feeds),
            "dev_score": found.score,
            "graphs_tried": len(scores),
            "iterations": found.iterations,
        }

    result, fitted, fit_s = await dev_fit.cached_fit(name, key, members, compute)
    return Fitted(
        _as_built(spec, result["feeds"], prompts),
        dev_fit.record(members, fitted, fit_s, len(examples), result),
    )


@protocol(
    "heterogeneous_swarms",
    family="text",
    description="Members answer along a DAG (each reads its predecessors' responses; the end node answers) "
    "whose edges a particle swarm searches on the dev split.",
    min_members=1,
    requires=["dev_split"],
    fit=fit_heterogeneous_swarms,
)
def heterogeneous_swarms(
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
    relay_prompt: str = RELAY,
    final_prompt: str = FINAL,
) -> GraphSpec:
    """Heterogeneous Swarms (Feng et al., 2025, "Heterogeneous Swarms: Jointly Optimizing Model Roles and
    Weights for Multi-LLM Systems"): the roles of the members, as a directed acyclic graph, optimised on dev.

    A particle is a continuous adjacency matrix A (n x n, diagonal ignored); `decode` turns it into a DAG as
    MoCo's `graph_decode` does, deterministically (MoCo samples with top-p 0.7): the end node is the member
    with the least out-weight; then, while members remain, the remaining member with the most out-weight joins
    and feeds the already placed member it weighs most. Each distinct DAG is run on dev once; the swarm
    (Model Swarms' update, `colab_graphs.protocols.weight_search.swarm_search`, started from `population`
    random matrices drawn from `seed`) keeps the DAG with the best dev score (ties: the first found). At run
    time members answer along the fitted DAG: a member without predecessors answers alone (`prompt`), the
    others read their predecessors' responses (`relay_prompt`, `final_prompt` for the end node), and the end
    node's answer is extracted by the task. The paper also optimises the members' weights; MoCo and this search
    the roles only.

    Coalitions: the graph is searched over the present members only (a coalition without a member fits
    without it); a coalition of one is that member alone; the empty coalition scores 0. Until the fit step
    has run, the spec is a chain in pool order whose calls fail naming the step; `show` draws that chain.

    Args:
        dev: the dev data DAGs are scored on (a file or source, as --data takes).
        dev_split: the split to read from a file that has several.
        dev_limit: dev examples used (0: all).
        population: particles (random adjacency matrices).
        max_iterations: most swarm iterations.
        inertia: weight of a particle's own velocity.
        cognitive: pull towards the particle's personal best.
        social: pull towards the swarm's global best.
        repel: push away from the swarm's global worst.
        step_length: step size (decays by 0.95 per iteration, down to 0.1).
        patience: iterations without a better global best before the search stops.
        restart_patience: iterations without a better own score before a particle restarts from its best.
        seed: seed of the initial matrices and the swarm's draws.
        prompt: template of members without predecessors.
        relay_prompt: template of members with predecessors; reads `{previous}` (their responses, labelled
            `Node k`, k the member's pool position).
        final_prompt: template of the end node; reads `{previous}`.
    """
    members = check_members(members, "heterogeneous_swarms")
    check_count(population, "heterogeneous_swarms", "population")
    check_count(max_iterations, "heterogeneous_swarms", "max_iterations")
    if dev_limit < 0:
        raise ValueError(f"heterogeneous_swarms: dev_limit must be >= 0, got {dev_limit}")
    chain = dict(zip(members, members[1:], strict=False))
    return unfitted(dag_spec(members, chain, prompt, relay_prompt, final_prompt))


def dag_spec(
    members: list[str], feeds: dict[str, str], prompt: str, relay_prompt: str, final_prompt: str
) -> GraphSpec:
    """The protocol along the DAG `feeds` (member -> the member it feeds; the end node feeds no one).

    A member's predecessors reach it through an `inbox` node that labels each response `Node k` (k: the
    predecessor's position in `members`); reads are optional, so the unfitted chain restricted to a coalition
    (which its fit step then replaces) still validates.
    """
    ends = [m for m in members if m not in feeds]
    if len(ends) != 1:
        raise ValueError(f"heterogeneous_swarms: a graph needs exactly one end node, got {ends or 'none'}")
    b = GraphBuilder(
        "heterogeneous_swarms", members, description="members answer along a DAG searched on dev"
    )
    for m in members:
        seat = f"node_{m}"
        preds = [p for p in members if feeds.get(p) == m]
        if not preds:
            b.seat(seat, member=m, prompt=prompt, writes=f"hswarm:{m}")
            b.edge(START, seat)
            continue
        reads = {f"Node {members.index(p) + 1}": f"hswarm:{p}?" for p in preds}
        b.aggregate(f"inbox_{m}", "inbox", reads=reads, writes=f"hswarm:inbox:{m}")
        b.edge([f"node_{p}" for p in preds], f"inbox_{m}")
        template = final_prompt if m == ends[0] else relay_prompt
        b.seat(seat, member=m, prompt=template, reads={"previous": f"hswarm:inbox:{m}"}, writes=f"hswarm:{m}")
        b.edge(f"inbox_{m}", seat)
    b.aggregate("final", "extract", reads={"answer": f"hswarm:{ends[0]}?"}, writes="final")
    b.edge(f"node_{ends[0]}", "final").edge("final", END)
    return b.output("final").build()


def decode(matrix: Any) -> dict[int, int]:
    """The DAG a continuous adjacency matrix stands for: node -> the node it feeds (the end node is absent).

    MoCo's `graph_decode` with top-p 0 (argmax instead of sampling): the diagonal is ignored; the end node is the
    one with the least total out-weight; then, while nodes remain, the remaining node with the most total
    out-weight joins, feeding the placed node it weighs most. Ties go to the lower index.

    Example:
        >>> decode([[0, 0.9, 0.1], [0.2, 0, 0.1], [0.8, 0.7, 0]])
        {2: 1, 0: 1}
    """
    a = np.array(matrix, dtype=float)
    np.fill_diagonal(a, 0.0)
    out = a.sum(axis=1)
    n = len(a)
    placed = [int(np.argmin(out))]
    feeds: dict[int, int] = {}
    remaining = [i for i in range(n) if i not in placed]
    while remaining:
        node = max(remaining, key=lambda i: (out[i], -i))
        target = max(placed, key=lambda j: (a[node, j], -j))
        feeds[node] = target
        placed.append(node)
        remaining.remove(node)
    return feeds


def _as_built(spec: GraphSpec, feeds: dict[str, str], prompts: tuple[str, str, str]) -> GraphSpec:
    """The coalition's spec along `feeds`, keeping the parameters it was built with."""
    return dag_spec(list(spec.members), feeds, *prompts).model_copy(update={"params": spec.params})
