"""Trained routers (API level): a router learned on the dev split sends each question to one member.

`trained_router` and `graph_routing` (MoCo's names) are graphs over ordinary seats, so they run on any pool: a
pure-Python router reads the question and picks one member's seat; only that member answers. What the router
knows is fitted per coalition by the protocol's fit step (`colab_graphs.fitting`): every member of the
coalition answers the dev questions alone (`-P dev=SOURCE`), and the router learns from those outcomes which
member answers which kind of question (`colab_graphs.protocols.routing_learn`). The fitted router travels in the
spec (the route's parameters), so a fitted spec runs anywhere; a spec run without its fit step fails naming it.

Coalitions: a coalition's router is trained on its own members' dev outcomes only, so a coalition without a
member fits without it; a coalition of one member needs no router (that member answers everything); the empty
coalition scores 0. Fits are cached by (method, coalition, dev data, scorer, parameters) (see
`colab_graphs.protocols.dev_fit`), so an audit never fits a coalition twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from colab_graphs.aggregators import router
from colab_graphs.builder import GraphBuilder
from colab_graphs.fitting import Fitted
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocols import dev_fit
from colab_graphs.protocols.dev_fit import FitError
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.protocols.routing_learn import (
    best_labels,
    features,
    fit_graph_router,
    fit_softmax,
    graph_scores,
    softmax_scores,
)
from colab_graphs.registry import protocol
from colab_graphs.spec import END, START, GraphSpec

REQUIREMENT = "dev_split"
ROUTER_NODE = "router"

__all__ = ["FitError", "fit_router", "graph_routing", "trained_router"]


def _routed(name: str, members: list[str], prompt: str, router_fn: str, description: str) -> GraphSpec:
    b = GraphBuilder(name, members=members, description=description)
    b.aggregate(ROUTER_NODE, "concat", reads={"question": "input"}, writes="question")
    seats = {m: f"answer_{m}" for m in members}
    for m, seat in seats.items():
        b.seat(seat, member=m, prompt=prompt, writes=f"answer:{m}", role="answer")
        b.edge(seat, "final")
    b.aggregate("final", "first", reads={"answer": "answer:*"}, writes="final", extract=True)
    b.edge(START, ROUTER_NODE).edge("final", END)
    # The route's `members` are the classes the fitted model scores, in its column order; `model` is set by the
    # fit step. A coalition's fitted model knows only its own members.
    b.route(
        ROUTER_NODE, router_fn, seats, key="question", on_target_absent="remove", members=members, model=None
    )
    return b.output("final").build()


def _check(name: str, ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {message}")


async def fit_router(
    spec: GraphSpec, pool: Pool, *, client: ModelClient, scorer: str | None = None
) -> Fitted:
    """The fit step of `trained_router` and `graph_routing`: learn the coalition's router from its dev outcomes.

    Raises:
        FitError: no dev data (a coalition of two or more members needs it), or a dev call failed.
    """
    from colab_graphs.tasks.scoring import view_for

    name, members = spec.name, list(spec.members)
    if len(members) == 1:
        return Fitted(spec, dev_fit.record(members, None, 0.0, 0, {"alone": members[0]}))
    params = dev_fit.protocol_params(spec)
    examples = dev_fit.dev_examples(name, params, members)
    key = dev_fit.fit_key(name, pool, members, examples, scorer, params)
    prompt = str(params["prompt"])

    async def compute() -> dict[str, Any]:
        outcomes = {
            m: await dev_fit.solo_outcomes(
                pool, m, examples, client=client, scorer=scorer, prompt=prompt, name=name
            )
            for m in members
        }
        scores = np.array([[outcomes[m][i].score for m in members] for i in range(len(examples))])
        rows = [features(view_for(e, scorer).graph_input()["input"]) for e in examples]
        if name == "trained_router":
            model = fit_softmax(
                rows,
                best_labels(scores),
                l2=float(params["l2"]),
                epochs=int(params["epochs"]),
                learning_rate=float(params["learning_rate"]),
            )
            routed = [softmax_scores(model, r) for r in rows]
        else:
            described = {**{m: pool[m].description for m in members}, **(params.get("descriptions") or {})}
            model = fit_graph_router(
                rows,
                scores,
                [features(described.get(m) or "") for m in members],
                hidden=int(params["hidden_features"]),
                epochs=int(params["train_epochs"]),
                learning_rate=float(params["learning_rate"]),
                weight_decay=float(params["weight_decay"]),
                mask_rate=float(params["train_mask_rate"]),
                seed=int(params["seed"]),
            )
            routed = [graph_scores(model, r) for r in rows]
        chosen = [int(np.argmax(s)) for s in routed]  # argmax keeps the first of equals: pool order
        return {
            "model": model,
            "alone": {m: float(scores[:, j].mean()) for j, m in enumerate(members)},
            "oracle": float(scores.max(axis=1).mean()),
            "routed_dev_score": float(np.mean([scores[i, j] for i, j in enumerate(chosen)])),
            "routed_to": {m: chosen.count(j) for j, m in enumerate(members)},
        }

    result, fitted, fit_s = await dev_fit.cached_fit(name, key, members, compute)
    summary = {k: v for k, v in result.items() if k != "model"}
    return Fitted(
        with_router(spec, result["model"]), dev_fit.record(members, fitted, fit_s, len(examples), summary)
    )


@protocol(
    "trained_router",
    family="api",
    description="A router trained on the dev split (which member answers which kind of question) sends each "
    "question to one member.",
    min_members=1,
    requires=[REQUIREMENT],
    fit=fit_router,
)
def trained_router(
    members: list[str],
    dev: str | None = None,
    dev_split: str = "dev",
    dev_limit: int = 0,
    epochs: int = 300,
    learning_rate: float = 1.0,
    l2: float = 0.001,
    prompt: str = ANSWER,
) -> GraphSpec:
    """Trained router (MoCo's `trained_router`, after RouteLLM: Ong et al., 2024, "RouteLLM: Learning to Route
    LLMs with Preference Data"): learn on dev which member answers which question.

    Fit: every member of the coalition answers the dev questions alone; each question's label is the member
    with the best dev score (the best ones shared equally on a tie: MoCo breaks ties with a reward model and
    fine-tunes an LLM to name the member, here a multinomial logistic regression over the question's words
    and word pairs learns the same labels). Run: the router sends the question to the member the model scores
    highest (ties: pool order), which answers alone; its answer is extracted by the task.

    Coalitions: the router is trained on the present members only; a coalition of one is that member alone;
    the empty coalition scores 0.

    Args:
        dev: the dev data the router learns from (a file or source, as --data takes).
        dev_split: the split to read from a file that has several (MoCo's JSON files).
        dev_limit: dev examples used (0: all).
        epochs: gradient steps of the logistic regression.
        learning_rate: its step size.
        l2: its L2 penalty.
        prompt: the question template the chosen member answers.
    """
    _check("trained_router", dev_limit >= 0 and epochs >= 1, "dev_limit must be >= 0 and epochs >= 1")
    return _routed(
        "trained_router", members, prompt, "trained_router", "a router trained on dev picks who answers"
    )


@protocol(
    "graph_routing",
    family="api",
    description="A graph neural network over dev questions and members (edges: dev scores) routes each question "
    "to one member.",
    min_members=1,
    requires=[REQUIREMENT],
    fit=fit_router,
)
def graph_routing(
    members: list[str],
    dev: str | None = None,
    dev_split: str = "dev",
    dev_limit: int = 0,
    descriptions: dict | None = None,
    hidden_features: int = 8,
    train_epochs: int = 300,
    learning_rate: float = 0.01,
    weight_decay: float = 0.0001,
    train_mask_rate: float = 0.5,
    seed: int = 0,
    prompt: str = ANSWER,
) -> GraphSpec:
    """GraphRouter (Feng et al., 2025, "GraphRouter: A Graph-based Router for LLM Selections", ICLR): route
    by edge prediction on a graph of questions and models.

    Fit: every member answers the dev questions alone; the dev graph joins each question to each member with
    an edge carrying the dev score. Members are nodes with their description's words (the pool's descriptions,
    or `descriptions`) and an embedding of their own; a member's state aggregates the questions it was seen on,
    with their outcome; an edge scorer reads a question's state and a member's. Training hides a random part of
    the questions (`train_mask_rate`) and predicts their best member from the other edges (MoCo uses sentence
    embeddings and torch_geometric; here hashed word features and a small torch GNN). Run: the question goes
    to the member with the best edge score (ties: pool order), which answers alone.

    Coalitions: the graph holds the present members only; a coalition of one is that member alone; the empty
    coalition scores 0.

    Args:
        dev: the dev data the router learns from (a file or source, as --data takes).
        dev_split: the split to read from a file that has several.
        dev_limit: dev examples used (0: all).
        descriptions: member name -> what it is good at (default: the pool's descriptions). From the CLI as
            JSON: -P 'descriptions={"coder": "writes Python"}'.
        hidden_features: embedding size of the GNN.
        train_epochs: training steps.
        learning_rate: Adam's step size.
        weight_decay: Adam's weight decay.
        train_mask_rate: fraction of the dev questions hidden and predicted at each step.
        seed: seed of the initial weights and the masks.
        prompt: the question template the chosen member answers.
    """
    _check(
        "graph_routing", dev_limit >= 0 and train_epochs >= 1, "dev_limit must be >= 0 and train_epochs >= 1"
    )
    _check(
        "graph_routing",
        0.0 < train_mask_rate <= 1.0,
        f"train_mask_rate must be in (0, 1], got {train_mask_rate}",
    )
    unknown = sorted(set(descriptions or {}) - set(members))
    _check("graph_routing", not unknown, f"descriptions name unknown member(s) {', '.join(unknown)}")
    return _routed(
        "graph_routing", members, prompt, "graph_routing", "a graph router trained on dev picks who answers"
    )


# --- the routers ---------------------------------------------------------------------------------------------------


def _pick(scores: list[float], classes: list[str], path_map: dict[str, str]) -> str:
    """The present member with the highest score; `max` keeps the first of equals, so ties go to pool order."""
    present = [(s, m) for s, m in zip(scores, classes, strict=True) if m in path_map]
    return max(present, key=lambda item: item[0])[1] if present else ""


def _unfitted(name: str) -> FitError:
    return FitError(
        f"{name}: the router is not trained; run the protocol's fit step first "
        "(colab_graphs.fitting.fit_coalition; `colab-graphs run` and `audit` do)"
    )


@router("trained_router")
def trained_router_route(
    view: dict[str, Any], path_map: dict[str, str], members: list[str], model: dict | None = None, **_: Any
) -> str:
    """The member the fitted logistic regression scores highest for the question (one path left: that one)."""
    if len(path_map) == 1:
        return next(iter(path_map))
    if model is None:
        raise _unfitted("trained_router")
    return _pick(softmax_scores(model, features(str(view.get("text") or ""))), members, path_map)


@router("graph_routing")
def graph_routing_route(
    view: dict[str, Any], path_map: dict[str, str], members: list[str], model: dict | None = None, **_: Any
) -> str:
    """The member whose edge to the question the fitted graph router scores highest (one path left: that one)."""
    if len(path_map) == 1:
        return next(iter(path_map))
    if model is None:
        raise _unfitted("graph_routing")
    return _pick(graph_scores(model, features(str(view.get("text") or ""))), members, path_map)


# --- the fit step --------------------------------------------------------------------------------------------------


def with_router(spec: GraphSpec, model: dict[str, Any]) -> GraphSpec:
    """`spec` whose router carries the fitted `model` (its classes: the spec's members, in pool order)."""
    routes = [
        r.model_copy(update={"params": {**r.params, "model": model, "members": list(spec.members)}})
        if r.source == ROUTER_NODE
        else r
        for r in spec.routes
    ]
    return spec.model_copy(update={"routes": routes})
