"""`multiagent_finetuning` (MoCo's name): members fine-tuned on their own debate transcripts, then a debate.

The fit step runs the coalition's debate on the dev split, keeps each member's turns that agree with the
debate's consensus (`select_turns`), and fine-tunes each in-process member twice, as the paper does: a
generation model on its first-round answers and a critic model on its later-round answers
(`colab_graphs.protocols.text_fit.finetune`: the C-RL trainer's SFT objective). At run time the coalition
debates again, each member's first-round seat calling its generation model and its later seats its critic model.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from colab_graphs.fitting import Fitted
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocols import dev_fit
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.protocols.stages import check_count
from colab_graphs.protocols.text import DEBATE_REVISE, debate
from colab_graphs.protocols.text_fit import (
    LOCAL_TRAINING,
    Segment,
    check_models,
    finetune_members,
    mean_score,
    run_on_dev,
    trainable_members,
    unfitted,
    with_seat_models,
)
from colab_graphs.registry import protocol
from colab_graphs.runner import ExampleOutcome
from colab_graphs.spec import GraphSpec
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import view_for

NAME = "multiagent_finetuning"
KEEP = ("consensus", "correct")

__all__ = ["Kept", "fit_multiagent_finetuning", "multiagent_finetuning", "select_turns"]


async def fit_multiagent_finetuning(
    spec: GraphSpec, pool: Pool, *, client: ModelClient, scorer: str | None = None
) -> Fitted:
    """The fit step: debate on dev, keep each member's agreeing turns, fine-tune the in-process members.

    Raises:
        LocalMembersError: API members without `frozen_api_members` (before any call).
        FitError: no dev data, or a dev debate failed.
    """
    members = list(spec.members)
    params = dev_fit.protocol_params(spec)
    rounds = int(params["rounds"])
    trainable = trainable_members(NAME, pool, members, bool(params["frozen_api_members"]))
    plain = _debate(members, rounds, str(params["prompt"]), str(params["revise_prompt"]))
    plain = plain.model_copy(update={"params": spec.params})
    if not trainable:
        return Fitted(plain, dev_fit.record(members, None, 0.0, 0, {"frozen": members}))
    examples = dev_fit.dev_examples(NAME, params, members)
    key = dev_fit.fit_key(NAME, pool, members, examples, scorer, params)

    async def compute() -> dict[str, Any]:
        outcomes = await run_on_dev(plain, pool, examples, client=client, scorer=scorer)
        kept = select_turns(
            outcomes,
            examples,
            trainable,
            rounds,
            scorer=scorer,
            w=float(params["w"]),
            keep=str(params["keep"]),
            seed=int(params["seed"]),
        )
        jobs = {}
        for m in trainable:
            jobs[f"{m}-generation"] = (m, kept[m].generation)
            jobs[f"{m}-critic"] = (m, kept[m].critic)
        trained = await finetune_members(pool, jobs, dev_fit.fits_home() / f"{NAME}-{key}", params)
        return {
            "debate_dev_score": mean_score(outcomes),
            "segments": {label: sum(map(len, groups)) for label, (_, groups) in jobs.items()},
            "models": {label: info["folder"] for label, info in trained.items()},
            "train_s": {label: info["train_s"] for label, info in trained.items()},
            "frozen": [m for m in members if m not in trainable],
        }

    result, fitted, fit_s = await dev_fit.cached_fit(NAME, key, members, compute)
    check_models(NAME, result["models"])
    models = {}
    for m in trainable:
        for r in range(1, rounds + 1):
            folder = result["models"].get(f"{m}-{'generation' if r == 1 else 'critic'}")
            if folder is not None:
                models[f"r{r}_{m}"] = f"local/{folder}"
    return Fitted(
        with_seat_models(plain, models), dev_fit.record(members, fitted, fit_s, len(examples), result)
    )


@protocol(
    NAME,
    family="text",
    description="Members fine-tuned on their own debate transcripts on dev (a generation and a critic model "
    "each), then a debate; majority vote over the last round.",
    min_members=1,
    requires=["dev_split", LOCAL_TRAINING],
    fit=fit_multiagent_finetuning,
)
def multiagent_finetuning(
    members: list[str],
    dev: str | None = None,
    dev_split: str = "dev",
    dev_limit: int = 0,
    rounds: int = 2,
    w: float = 0.5,
    keep: str = "consensus",
    sft_epochs: int = 1,
    sft_batch_size: int = 4,
    sft_learning_rate: float = 1e-5,
    seed: int = 0,
    frozen_api_members: bool = False,
    prompt: str = ANSWER,
    revise_prompt: str = DEBATE_REVISE,
) -> GraphSpec:
    """Multiagent fine-tuning (Subramaniam et al., 2025, "Multiagent Finetuning: Self Improvement with Diverse
    Reasoning Chains", ICLR): each member specialises on its own reasoning chains from a debate.

    Fit: the coalition debates each dev question (`debate`: round 1 alone, then `rounds` - 1 revisions seeing
    all answers; the consensus is the majority vote of the last round). A member's generation data are its
    round-1 replies that agree with the consensus; its critic data are its last-round replies that agree with
    it, split as in the paper into DC- (its round-1 answer disagreed: it was persuaded) and DC+ (it agreed all
    along) and sampled a `w` share of DC- and a 1 - `w` share of DC+ (at least one of each kind present; seeded
    by `seed`). With `keep="correct"` only debates whose answer the task scores right count (MoCo and the paper
    use the consensus alone; no gold answer). Each in-process member is fine-tuned on each kind of data it
    has (two models; a member without data keeps its weights in that role), on the exact prompts and tokens of
    its own turns. MoCo iterates this `iterations` times and trains LoRA adapters; here one iteration, all
    weights. Run: the coalition debates with the fine-tuned models (round 1: generation models; later rounds:
    critic models); majority vote.

    Coalitions: the debate on dev and the fine-tuning use the present members only (a member is fine-tuned on
    the transcripts of its own coalition); a coalition of one fine-tunes that member on its self-refinement;
    the empty coalition scores 0. API members have no weights to train: they are refused by name, or with
    `frozen_api_members` debate unchanged. Fits (the fine-tuned models included) are cached per coalition.

    Args:
        dev: the dev data the debate runs on (a file or source, as --data takes).
        dev_split: the split to read from a file that has several.
        dev_limit: dev examples used (0: all).
        rounds: debate rounds, including the first independent one (MoCo: 2).
        w: share of the critic data drawn from DC- (persuaded) turns; 1 - w from DC+.
        keep: "consensus" (turns agreeing with the debate's majority) or "correct" (also the debate was right).
        sft_epochs: passes over each member's data.
        sft_batch_size: dev questions per optimizer step.
        sft_learning_rate: the fine-tuning learning rate.
        seed: seed of the critic-data draw and of training.
        frozen_api_members: let API members debate unchanged instead of refusing them.
        prompt: round-1 template.
        revise_prompt: template of later rounds; reads `{previous}` and `{own}` (see `debate`).
    """
    check_count(rounds, NAME, "rounds")
    if keep not in KEEP:
        raise ValueError(f"{NAME}: keep must be one of {', '.join(KEEP)}, got {keep!r}")
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"{NAME}: w must be in [0, 1], got {w}")
    return unfitted(_debate(members, rounds, prompt, revise_prompt))


def _debate(members: list[str], rounds: int, prompt: str, revise_prompt: str) -> GraphSpec:
    spec = debate(members, rounds=rounds, prompt=prompt, revise_prompt=revise_prompt)
    return spec.model_copy(update={"name": NAME, "description": "a debate of members fine-tuned on debates"})


@dataclass
class Kept:
    """A member's training data from the dev debates: one list of segments per dev question."""

    generation: list[list[Segment]] = field(default_factory=list)
    critic: list[list[Segment]] = field(default_factory=list)


def select_turns(
    outcomes: Sequence[ExampleOutcome],
    examples: Sequence[Example],
    members: Sequence[str],
    rounds: int,
    *,
    scorer: str | None = None,
    w: float = 0.5,
    keep: str = "consensus",
    seed: int = 0,
) -> dict[str, Kept]:
    """Each member's generation and critic data from the dev debates (see `multiagent_finetuning`).

    A debate's consensus is its voted answer; a turn agrees with it when the task finds the same answer in it.
    """
    kept = {m: Kept() for m in members}
    persuaded: dict[str, list[list[Segment]]] = {m: [] for m in members}
    steadfast: dict[str, list[list[Segment]]] = {m: [] for m in members}
    for outcome, example in zip(outcomes, examples, strict=True):
        consensus = outcome.output or ""
        if not consensus.strip() or (keep == "correct" and (outcome.score or 0.0) < 1.0):
            continue
        task = view_for(example, scorer)
        calls = {c.seat: c for c in outcome.trace.calls if c.error is None}
        for m in members:
            first, last = calls.get(f"r1_{m}"), calls.get(f"r{rounds}_{m}")
            first_agrees = first is not None and _agrees(task, first, consensus)
            if first_agrees:
                kept[m].generation.append([Segment.of_call(first)])
            if rounds > 1 and last is not None and _agrees(task, last, consensus):
                (steadfast if first_agrees else persuaded)[m].append([Segment.of_call(last)])
    for m in members:
        rng = random.Random(seed)
        for share, turns in ((w, persuaded[m]), (1.0 - w, steadfast[m])):
            if turns and share > 0:
                kept[m].critic.extend(rng.sample(turns, min(len(turns), max(1, int(len(turns) * share)))))
    return kept


def _agrees(task: Any, call: Any, consensus: str) -> bool:
    answer = task.extract(call.completion or "")
    return answer is not None and task.same(answer, consensus)
