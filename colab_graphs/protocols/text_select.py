"""Selection among members' own answers (text level): `slm_mux`, MoCo's name for SLM-MUX.

Every member answers several times; the member whose answers agree most with each other is the most confident,
and its majority answer is the system's. Agreement is the task's: answers are extracted and compared by the run's
task (`TaskView.extract`, `TaskView.same`), so code stays code and a letter a letter.
"""

from __future__ import annotations

import hashlib
from typing import Any

from colab_graphs.aggregators import aggregator
from colab_graphs.builder import GraphBuilder
from colab_graphs.fitting import Fitted
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocols import dev_fit
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.protocols.text import check_count, check_members
from colab_graphs.registry import protocol
from colab_graphs.spec import END, START, Aggregate, GraphSpec
from colab_graphs.tasks.task_types import TaskView

TIES = ("model-order", "dev-based", "random")

__all__ = ["consistency", "fit_slm_mux", "slm_mux"]


async def fit_slm_mux(
    spec: GraphSpec, pool: Pool, *, client: ModelClient, scorer: str | None = None
) -> Fitted | None:
    """The fit step of `slm_mux`: each member's dev score alone, for "dev-based" ties (None: nothing to fit)."""
    params = dev_fit.protocol_params(spec)
    members = list(spec.members)
    if params["tie"] != "dev-based":
        return None
    if len(members) == 1:
        return Fitted(spec, dev_fit.record(members, None, 0.0, 0, {}))
    examples = dev_fit.dev_examples("slm_mux", params, members)
    key = dev_fit.fit_key("slm_mux", pool, members, examples, scorer, params)
    prompt = str(params["prompt"])

    async def compute() -> dict[str, Any]:
        scores = {}
        for m in members:
            runs = await dev_fit.solo_outcomes(
                pool, m, examples, client=client, scorer=scorer, prompt=prompt, name="slm_mux"
            )
            scores[m] = sum(r.score for r in runs) / len(runs)
        return {"dev_scores": scores}

    result, fitted, fit_s = await dev_fit.cached_fit("slm_mux", key, members, compute)
    return Fitted(
        _with_dev_scores(spec, result["dev_scores"]),
        dev_fit.record(members, fitted, fit_s, len(examples), result),
    )


@protocol(
    "slm_mux",
    family="text",
    description="Every member answers several times; the most self-consistent member's majority answer wins.",
    min_members=1,
    independent_replies=True,
    fit=fit_slm_mux,
)
def slm_mux(
    members: list[str],
    samples_per_model: int = 5,
    tie: str = "model-order",
    seed: int = 42,
    dev: str | None = None,
    dev_split: str = "dev",
    dev_limit: int = 0,
    prompt: str = ANSWER,
) -> GraphSpec:
    """SLM-MUX (Wang et al., 2026, "SLM-MUX: Orchestrating Small Language Models for Reasoning", ICLR):
    training-free selection among small models by the consistency of their own samples.

    Each member answers `samples_per_model` times (distinct samples: give members a temperature > 0). A
    member's confidence is the share of its answers that agree with its most frequent answer (answers that
    commit to none do not count); the most confident member's majority answer is the system's. Ties between
    members: "model-order" (pool order), "dev-based" (the higher dev score alone, then pool order: MoCo's
    default, which needs `dev` and the protocol's fit step), or "random" (drawn per question from `seed`).

    Coalitions: an absent member's samples are dropped and the selection runs over the others; with
    "dev-based" ties, each coalition's fit scores only its own members on dev; one member left is its own
    majority answer; empty: 0.

    Args:
        samples_per_model: answers per member (MoCo: 5).
        tie: how ties in confidence are broken: "model-order", "dev-based" or "random".
        seed: seed of the "random" tie-break.
        dev: the dev data for "dev-based" ties (a file or source, as --data takes).
        dev_split: the split to read from a file that has several.
        dev_limit: dev examples used (0: all).
        prompt: the question template.
    """
    members = check_members(members, "slm_mux")
    check_count(samples_per_model, "slm_mux", "samples_per_model")
    if tie not in TIES:
        raise ValueError(f"slm_mux: tie must be one of {', '.join(TIES)}, got {tie!r}")
    b = GraphBuilder("slm_mux", members, description="the most self-consistent member's answer")
    seats = []
    for m in members:
        for k in range(samples_per_model):
            seats.append(f"sample_{m}_{k}")
            b.seat(seats[-1], member=m, prompt=prompt, writes=f"mux:{m}:{k}", sample=k)
    # The aggregator reads each member's samples by its own pattern (an absent member's is empty).
    reads = {m: f"mux:{m}:*" for m in members}
    b.aggregate("select", "slm_mux", reads=reads, writes="final", tie=tie, seed=seed, dev_scores=None)
    b.fan(START, seats, join="select").edge("select", END)
    return b.output("final").build()


def consistency(replies: list[str], task: TaskView) -> tuple[str, float]:
    """(the member's majority answer, the share of its committed answers that agree with it); ("", 0) if none."""
    groups: list[list[str]] = []
    for reply in replies:
        answer = task.extract(reply)
        if answer is None or not answer.strip():
            continue
        for group in groups:
            if task.same(group[0], answer):
                group.append(answer)
                break
        else:
            groups.append([answer])
    if not groups:
        return "", 0.0
    best = max(groups, key=len)  # max keeps the first of equals: the answer given first
    return best[0], len(best) / sum(len(g) for g in groups)


@aggregator("slm_mux")
def select(
    inputs: dict[str, Any],
    *,
    task: TaskView,
    tie: str = "model-order",
    seed: int = 42,
    dev_scores: dict[str, float] | None = None,
    **_: Any,
) -> str:
    """The majority answer of the most self-consistent member (inputs: member -> its samples, pool order)."""
    scored = [(m, *consistency(list(replies or []), task)) for m, replies in inputs.items() if replies]
    if not scored:
        return ""
    top = max(c for _, _, c in scored)
    tied = [s for s in scored if abs(s[2] - top) < 1e-9]
    if len(tied) > 1 and tie == "dev-based":
        if dev_scores is None:
            raise dev_fit.FitError(
                "slm_mux with tie=dev-based has no dev scores: run the protocol's fit step with -P dev=SOURCE "
                "(colab_graphs.fitting; `colab-graphs run` and `audit` do)"
            )
        best = max(dev_scores.get(m, 0.0) for m, _, _ in tied)
        tied = [s for s in tied if dev_scores.get(s[0], 0.0) == best]
    elif len(tied) > 1 and tie == "random":
        draw = hashlib.sha256(f"slm_mux\x1f{seed}\x1f{task.example.id}".encode()).digest()
        tied = [tied[int.from_bytes(draw[:8], "big") % len(tied)]]
    return tied[0][1]


def _with_dev_scores(spec: GraphSpec, scores: dict[str, float]) -> GraphSpec:
    nodes = [
        n.model_copy(update={"params": {**n.params, "dev_scores": scores}})
        if isinstance(n, Aggregate) and n.fn == "slm_mux"
        else n
        for n in spec.nodes
    ]
    return spec.model_copy(update={"nodes": nodes})
