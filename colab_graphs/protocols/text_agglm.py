"""`agglm` (MoCo's name): an aggregator seat trained with RL to combine the other members' answers.

The proposers (every member but the aggregator) answer; the aggregator reads their answers and writes the final
solution. The fit step trains the aggregator's weights with the C-RL trainer (`colab_graphs.trainers.train`, the
pipeline behind `colab-graphs train`): the aggregator is the policy seated in this very protocol, and GRPO
rewards the system's outcome on the dev split, on AggLM's balance of hard and easy questions.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
from pathlib import Path
from typing import Any

from colab_graphs.builder import GraphBuilder
from colab_graphs.fitting import Fitted
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocols import dev_fit
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.protocols.stages import check_count, check_members, pick_member
from colab_graphs.protocols.text_fit import (
    LOCAL_TRAINING,
    UNFITTED_MODEL,
    check_models,
    trainable_members,
    with_seat_models,
)
from colab_graphs.registry import aggregator, protocol
from colab_graphs.spec import END, START, GraphSpec, Seat
from colab_graphs.tasks.scoring import view_for
from colab_graphs.tasks.task_types import TaskView

NAME = "agglm"
SEAT = "aggregate"
AGGREGATE = (
    "Given the following problem:\n### Problem begin\n{input}\n### Problem end\n"
    "and these solution attempts:\n{solutions}\n\n"
    "It is possible that any, all, or none of these solutions are correct or complete. Carefully review the "
    "provided solutions, using them as starting points (correcting mistakes, filling in gaps, and/or combining "
    "useful ideas) to produce a final, comprehensive, and correct solution to the problem. {answer_format}"
)

__all__ = ["agglm", "aggregation_graph", "fit_agglm"]


async def fit_agglm(spec: GraphSpec, pool: Pool, *, client: ModelClient, scorer: str | None = None) -> Fitted:
    """The fit step: train the coalition's aggregator on its proposers' answers (or find it trained).

    Raises:
        LocalMembersError: the aggregator is an API member (before any call).
        FitError: no dev data, or a dev call failed.
    """
    members = list(spec.members)
    params = dev_fit.protocol_params(spec)
    seat = next((n for n in spec.nodes if isinstance(n, Seat) and n.name == SEAT), None)
    if seat is None:  # the aggregator member is absent: the proposers vote
        return Fitted(spec, dev_fit.record(members, None, 0.0, 0, {"aggregator": None}))
    agg = seat.member
    proposers = [m for m in members if m != agg]
    own = with_seat_models(spec, {SEAT: pool[agg].model})
    if not proposers:
        return Fitted(own, dev_fit.record(members, None, 0.0, 0, {"aggregator": agg, "proposers": []}))
    remedy = "name an in-process aggregator with -P aggregator=NAME (the proposers may be API members)"
    trainable_members(NAME, pool, [agg], False, remedy)
    examples = dev_fit.dev_examples(NAME, params, members)
    key = dev_fit.fit_key(NAME, pool, members, examples, scorer, params)
    home = dev_fit.fits_home() / f"{NAME}-{key}"

    async def compute() -> dict[str, Any]:
        questions, hard, easy = await _training_questions(
            pool, proposers, examples, params, client=client, scorer=scorer
        )
        result: dict[str, Any] = {"aggregator": agg, "hard": hard, "easy": easy, "trained_on": len(questions)}
        if not questions:
            return {**result, "model": None}
        home.mkdir(parents=True, exist_ok=True)
        data = home / "train.jsonl"
        data.write_text("".join(json.dumps(e.model_dump(exclude_none=True)) + "\n" for e in questions))
        fields = {
            "graph": f"{__name__}:aggregation_graph",
            "protocol_params": {
                "aggregator": agg,
                "prompt": params["prompt"],
                "aggregate_prompt": params["aggregate_prompt"],
            },
            "policy_member": agg,
            "policy_model": str(_served(pool, agg)),
            "data": str(data),
            "scorer": scorer,
            "num_generations": int(params["num_generations"]),
            "per_device_train_batch_size": int(params["num_generations"]),
            "max_steps": len(questions) * int(params["train_epochs"]),
            "learning_rate": float(params["learning_rate"]),
            "max_completion_length": int(params["max_completion_length"]),
            "temperature": float(params["temperature"]),
            "lora": bool(params["lora"]),
            "lora_r": int(params["lora_r"]),
            "lora_alpha": int(params["lora_alpha"]),
            "seed": int(params["seed"]),
            "output_dir": str(home),
            "cache_dir": str(client.cache.directory) if client.cache is not None else None,
            "no_cache": client.cache is None,
            "max_concurrency": client.max_concurrency,
            "trl": {"weight_decay": float(params["weight_decay"]), "lr_scheduler_type": "cosine"},
        }
        summary = await asyncio.to_thread(_train, fields, pool, members)
        return {**result, "model": summary["policy"], "steps": summary["steps"], "train_s": summary["wall_s"]}

    result, fitted, fit_s = await dev_fit.cached_fit(NAME, key, members, compute)
    trained = {SEAT: f"local/{result['model']}"} if result["model"] else {}
    check_models(NAME, {k: v.removeprefix("local/") for k, v in trained.items()})
    return Fitted(
        with_seat_models(own, trained), dev_fit.record(members, fitted, fit_s, len(examples), result)
    )


@protocol(
    NAME,
    family="text",
    description="Proposers (the other members) answer; an aggregator member trained with RL on dev (GRPO on "
    "the system's outcome) combines their answers.",
    min_members=1,
    requires=["dev_split", LOCAL_TRAINING],
    fit=fit_agglm,
)
def agglm(
    members: list[str],
    aggregator: str | None = None,
    dev: str | None = None,
    dev_split: str = "dev",
    dev_limit: int = 0,
    balance: bool = True,
    train_epochs: int = 1,
    num_generations: int = 4,
    learning_rate: float = 1e-4,
    weight_decay: float = 1e-5,
    max_completion_length: int = 512,
    temperature: float = 1.0,
    lora: bool = True,
    lora_r: int = 64,
    lora_alpha: int = 16,
    seed: int = 42,
    prompt: str = ANSWER,
    aggregate_prompt: str = AGGREGATE,
) -> GraphSpec:
    """AggLM (Zhao et al., 2025, "The Majority is not always right: RL training for solution aggregation"):
    a model trained with reinforcement learning to review and combine candidate solutions.

    Every proposer answers (`prompt`); the aggregator seat reads their answers (`aggregate_prompt`,
    `{solutions}`) and its answer, as the task extracts it, is the system's. Fit: the proposers answer the dev
    questions; a question is hard when the proposers' majority answer is wrong (AggLM trains on every hard
    question and as many easy ones, drawn from `seed`; `balance=false`: all of them); the aggregator is then
    trained with the C-RL trainer (`colab_graphs.trainers.train`: GRPO, `num_generations` rollouts of the whole
    system per question, rewarded by the system's score: here the aggregator's answer), `train_epochs` passes,
    LoRA merged into the saved model (MoCo: LoRA r 64, alpha 16, lr 1e-4, cosine schedule, 2 samples per
    proposer; here one). Run: the proposers answer and the trained aggregator combines.

    Coalitions: the proposers are the present members other than the aggregator, and the aggregator is
    trained on their answers only (a coalition without a member fits without it); without the aggregator
    member, the proposers' majority vote is the answer (no fit); the aggregator alone has nothing to
    aggregate and answers from the same prompt untrained; the empty coalition scores 0. The aggregator must
    be an in-process `local/` member (its weights are trained); proposers may be any members.

    Args:
        aggregator: the member in the aggregator seat (default: the first in pool order).
        dev: the dev data the aggregator is trained on (a file or source, as --data takes).
        dev_split: the split to read from a file that has several.
        dev_limit: dev examples used (0: all).
        balance: train on the hard questions and as many easy ones (AggLM), not on all of them.
        train_epochs: passes over the training questions (one question per optimizer step).
        num_generations: rollouts per question (the GRPO group; MoCo's train_batch_size).
        learning_rate: peak learning rate (cosine schedule).
        weight_decay: AdamW's weight decay.
        max_completion_length: most tokens of the aggregator's turn while training.
        temperature: the aggregator's sampling temperature in training rollouts.
        lora: train a LoRA adapter (merged into the saved model) instead of all weights.
        lora_r: LoRA rank.
        lora_alpha: LoRA alpha.
        seed: seed of the easy questions' draw and of training.
        prompt: the proposers' template.
        aggregate_prompt: the aggregator's template; reads `{solutions}` (the proposers' answers, numbered).
    """
    check_members(members, NAME)
    who = pick_member(members, aggregator, NAME, "aggregator")
    check_count(train_epochs, NAME, "train_epochs")
    check_count(num_generations, NAME, "num_generations", minimum=2)
    graph = aggregation_graph(members, aggregator=who, prompt=prompt, aggregate_prompt=aggregate_prompt)
    return with_seat_models(graph, {SEAT: UNFITTED_MODEL})


def aggregation_graph(
    members: list[str], aggregator: str, prompt: str = ANSWER, aggregate_prompt: str = AGGREGATE, **_: Any
) -> GraphSpec:
    """The protocol with the aggregator seat calling the aggregator member's own model: what the C-RL trainer
    seats its policy in (`TrainConfig.graph`), and what the fitted protocol routes to the trained model."""
    b = GraphBuilder(NAME, members, description="proposers answer; a trained aggregator combines them")
    proposals = [f"propose_{m}" for m in members if m != aggregator]
    for seat, m in zip(proposals, [m for m in members if m != aggregator], strict=True):
        b.seat(seat, member=m, prompt=prompt, writes=f"agglm:proposal:{m}")
    b.seat(
        SEAT,
        member=aggregator,
        prompt=aggregate_prompt,
        reads={"solutions": "agglm:proposal:*"},
        writes="agglm:aggregate",
        role="aggregator",
    )
    for seat in proposals:
        b.edge(START, seat)
    b.edge(proposals or START, SEAT)
    reads = {"aggregate": "agglm:aggregate?", "proposals": "agglm:proposal:*"}
    b.aggregate("final", "aggregated_or_vote", reads=reads, writes="final")
    b.edge(SEAT, "final").edge("final", END)
    return b.output("final").build()


@aggregator("aggregated_or_vote")
def aggregated_or_vote(inputs: dict[str, Any], *, task: TaskView, **_: Any) -> str:
    """The answer the aggregator's reply commits to; without the aggregator, the proposals' majority vote."""
    reply = inputs.get("aggregate")
    if isinstance(reply, str) and reply.strip():
        return task.extract(reply) or ""
    return task.vote([str(p) for p in inputs.get("proposals") or []])


# --- the fit step --------------------------------------------------------------------------------------------------


async def _training_questions(
    pool: Pool,
    proposers: list[str],
    examples: list[Any],
    params: dict[str, Any],
    *,
    client: ModelClient,
    scorer: str | None,
) -> tuple[list[Any], int, int]:
    """(the questions to train on, hard count, easy count): hard when the proposers' majority answer is wrong."""
    prompt = str(params["prompt"])
    answers = {
        p: await dev_fit.solo_outcomes(
            pool, p, examples, client=client, scorer=scorer, prompt=prompt, name=NAME
        )
        for p in proposers
    }
    hard, easy = [], []
    for i, example in enumerate(examples):
        task = view_for(example, scorer)
        voted = task.vote([answers[p][i].reply for p in proposers])
        # the majority is as right as the first proposal giving the majority answer (AggLM's rule)
        first = next(
            (
                answers[p][i]
                for p in proposers
                if voted
                and (found := task.extract(answers[p][i].reply)) is not None
                and task.same(found, voted)
            ),
            None,
        )
        right = first is not None and first.score >= 1.0
        (easy if right else hard).append(example)
    if not params["balance"]:
        return list(examples), len(hard), len(easy)
    drawn = random.Random(int(params["seed"])).sample(easy, min(len(easy), len(hard)))
    return hard + drawn, len(hard), len(easy)


def _pool_file(pool: Pool, members: list[str], folder: Path) -> Path:
    """The coalition's members as a pool file the trainer reads (secrets included: it lives in a private
    temporary folder removed after training, so they never reach the fit's saved record)."""
    import yaml

    models = {}
    for m in members:
        member = pool[m]
        entry: dict[str, Any] = dict(member.settings)
        for key in ("description", "system_prompt", "router"):
            if getattr(member, key, None):
                entry[key] = getattr(member, key)
        if member.deployments:
            entry["deployments"] = [dict(d) for d in member.deployments]
        models[m] = entry
    path = folder / "pool.yaml"
    path.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    return path


def _train(config_fields: dict[str, Any], pool: Pool, members: list[str]) -> dict[str, Any]:
    """Run the C-RL pipeline (blocking) with the coalition as its pool."""
    import torch

    from colab_graphs.trainers import TrainConfig, train

    with tempfile.TemporaryDirectory(prefix="agglm-pool-") as private:
        config = TrainConfig(
            pool=str(_pool_file(pool, members, Path(private))),
            use_cpu=not torch.cuda.is_available(),
            eval_size=0,
            eval_before=False,
            reward="system",
            **config_fields,
        )
        return train(config)


def _served(pool: Pool, member: str) -> Path:
    from colab_graphs.local import merge

    return merge.served_folder(pool[member].model.removeprefix("local/"))
