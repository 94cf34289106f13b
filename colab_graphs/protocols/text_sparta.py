"""`sparta` (MoCo's name): members compete and judge each other; winners' answers become training data.

The fit step runs SPARTA's combat on the dev split: members answer the dev questions, are paired against
opponents of close reputation (`matches`), the members not in a pair judge both answers (`judge_score`), and
reputations move by the judges' reputation-weighted verdicts (`Ratings`). Each pair's winner gives one
training example; every in-process member is fine-tuned on the winners' answers, and the member that scores
best on dev afterwards answers alone at run time.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from colab_graphs.builder import GraphBuilder
from colab_graphs.fitting import Fitted
from colab_graphs.models.client import CallError, ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocols import dev_fit
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.protocols.stages import check_members
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
from colab_graphs.spec import GraphSpec
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import view_for

NAME = "sparta"
SEAT = "best"
JUDGE = (
    "Please judge the following response based on the question and the response to be evaluated.\n"
    "Question: {input}\n"
    "Response to be evaluated: {response}\n\n"
    "Operation: Output ONLY a JSON object with one score in this exact format. Score must be in the range of 1 "
    'to 10.\nYour output should be like this:\n{{"score": score}}'
)
DEFAULT_SCORE = 5.0  # what a judge gives both answers of a pair when it gives a usable score to neither

__all__ = ["Ratings", "combat", "fit_sparta", "judge_score", "matches", "sparta"]


async def fit_sparta(
    spec: GraphSpec, pool: Pool, *, client: ModelClient, scorer: str | None = None
) -> Fitted:
    """The fit step: the combat on dev, fine-tuning on the winners' answers, the best member on dev.

    Raises:
        LocalMembersError: API members without `frozen_api_members` (before any call).
        FitError: no dev data (a coalition of two or more members needs it), or a dev call failed.
    """
    members = list(spec.members)
    params = dev_fit.protocol_params(spec)
    prompt = str(params["prompt"])
    trainable = trainable_members(NAME, pool, members, bool(params["frozen_api_members"]))
    if len(members) == 1:
        plain = _alone(members, members[0], prompt).model_copy(update={"params": spec.params})
        return Fitted(plain, dev_fit.record(members, None, 0.0, 0, {"best": members[0]}))
    examples = dev_fit.dev_examples(NAME, params, members)
    key = dev_fit.fit_key(NAME, pool, members, examples, scorer, params)

    async def compute() -> dict[str, Any]:
        runs = {
            m: await run_on_dev(_solo(members, m, prompt), pool, examples, client=client, scorer=scorer)
            for m in members
        }
        pairs, ratings = await combat(pool, members, examples, runs, params, client=client, scorer=scorer)
        jobs = {}
        for m in trainable:
            groups = []
            for p in pairs:
                if p["winner"] is None:
                    continue
                own, won = (
                    runs[m][p["question"]].trace.calls[0],
                    runs[p["winner"]][p["question"]].trace.calls[0],
                )
                groups.append(
                    [Segment.of_call(own) if p["winner"] == m else Segment.of_call(own, won.completion or "")]
                )
            jobs[m] = (m, groups)
        trained = await finetune_members(pool, jobs, dev_fit.fits_home() / f"{NAME}-{key}", params)
        dev_scores = {m: mean_score(runs[m]) for m in members}
        for m, info in trained.items():  # a trained member is judged by its fine-tuned model
            alone = with_seat_models(_solo(members, m, prompt), {"answer": f"local/{info['folder']}"})
            dev_scores[m] = mean_score(await run_on_dev(alone, pool, examples, client=client, scorer=scorer))
        best = max(members, key=lambda m: dev_scores[m])  # max keeps the first of equals: pool order
        return {
            "best": best,
            "dev_scores": dev_scores,
            "preferences": sum(p["winner"] is not None for p in pairs),
            "pairs": [
                {"question": examples[p["question"]].id, "pair": p["pair"], "winner": p["winner"]}
                for p in pairs
            ],
            "ratings": {m: round(ratings.score[m], 4) for m in members},
            "models": {m: info["folder"] for m, info in trained.items()},
            "train_s": {m: info["train_s"] for m, info in trained.items()},
            "frozen": [m for m in members if m not in trainable],
        }

    result, fitted, fit_s = await dev_fit.cached_fit(NAME, key, members, compute)
    check_models(NAME, result["models"])
    best = result["best"]
    folder = result["models"].get(best)
    run_spec = _alone(members, best, prompt, f"local/{folder}" if folder else None)
    return Fitted(
        run_spec.model_copy(update={"params": spec.params}),
        dev_fit.record(members, fitted, fit_s, len(examples), result),
    )


@protocol(
    NAME,
    family="text",
    description="Members compete pairwise on dev and judge each other; the winners' answers fine-tune the "
    "local members, and the best member on dev then answers alone.",
    min_members=1,
    requires=["dev_split", LOCAL_TRAINING],
    fit=fit_sparta,
)
def sparta(
    members: list[str],
    dev: str | None = None,
    dev_split: str = "dev",
    dev_limit: int = 0,
    random_match_prob: float = 0.2,
    num_opponents: int = 3,
    initial_k: float = 10.0,
    min_k: float = 5.0,
    window_size: int = 10,
    min_deviation: float = 0.1,
    epsilon: float = 0.01,
    decay_rate: float = 0.9,
    decay_steps: int = 10,
    scaling_factor: float = 20.0,
    sft_epochs: int = 1,
    sft_batch_size: int = 4,
    sft_learning_rate: float = 1e-5,
    seed: int = 0,
    frozen_api_members: bool = False,
    prompt: str = ANSWER,
    judge_prompt: str = JUDGE,
) -> GraphSpec:
    """SPARTA alignment (Jiang et al., 2025, "SPARTA ALIGNMENT: Collectively Aligning Multiple Language Models
    through Combat", NeurIPS): models align each other by competing and judging.

    Fit, on the dev questions: every member answers each question alone. The questions are dealt in loops of n
    (one per member, in a shuffled order): the member dealt a question competes on it with an opponent, drawn
    uniformly (probability `random_match_prob`) or among the `num_opponents` members of closest reputation. Every
    member not in the pair judges both answers on 1..10 (`judge_prompt`; a judge that gives either answer no
    usable score gives both 5). Reputations (start 100, deviation 0.5) move after each pair by the Elo-like
    update of `Ratings`, the judges weighted by their own reputation. A pair's winner is the answer with the
    higher reputation-weighted score under the final reputations (ties dropped); every in-process member is
    then fine-tuned on the winners' answers to their questions (SFT through the C-RL trainer; SPARTA and MoCo
    train DPO on (winner, loser) pairs and iterate). Run: the member (fine-tuned where it was) with the best dev
    score answers alone (ties: pool order); its answer is extracted by the task.

    Coalitions: only present members compete, judge and are trained (a coalition without a member fits
    without it); with two members there is no judge, so nothing is learnt and the better of the two on dev
    answers; a coalition of one is that member alone; the empty coalition scores 0. API members have no
    weights to train: they are refused by name, or with `frozen_api_members` compete, judge and may answer
    unchanged.

    Args:
        dev: the dev data the competition runs on (a file or source, as --data takes).
        dev_split: the split to read from a file that has several.
        dev_limit: dev examples used (0: all; MoCo's num_instructions).
        random_match_prob: probability of a uniformly drawn opponent.
        num_opponents: how many members of closest reputation an opponent is drawn from.
        initial_k: the rating update's initial K.
        min_k: K's floor as it decays.
        window_size: rating changes a member's deviation is measured over.
        min_deviation: the deviation's floor.
        epsilon: the smallest win-probability gap an update uses.
        decay_rate: K's decay per `decay_steps` updates.
        decay_steps: updates per decay of K.
        scaling_factor: divides every rating change.
        sft_epochs: passes over the winners' answers.
        sft_batch_size: dev questions per optimizer step.
        sft_learning_rate: the fine-tuning learning rate.
        seed: seed of the draws (order, opponents) and of training.
        frozen_api_members: let API members compete and judge unchanged instead of refusing them.
        prompt: the question template (competition and run).
        judge_prompt: the judge's template; reads `{input}` and `{response}`.
    """
    members = check_members(members, NAME)
    for key, value in (
        ("num_opponents", num_opponents),
        ("window_size", window_size),
        ("decay_steps", decay_steps),
    ):
        if value < 1:
            raise ValueError(f"{NAME}: {key} must be >= 1, got {value}")
    if not 0.0 <= random_match_prob <= 1.0:
        raise ValueError(f"{NAME}: random_match_prob must be in [0, 1], got {random_match_prob}")
    return unfitted(_alone(members, members[0], prompt))


def _alone(members: list[str], who: str, prompt: str, model: str | None = None) -> GraphSpec:
    b = GraphBuilder(NAME, members, description="the best member after the competition answers alone")
    settings = {"model": model} if model else {}
    b.seat(SEAT, member=who, prompt=prompt, writes="answer", settings=settings, on_absent="substitute")
    b.aggregate("final", "extract", reads={"answer": "answer"}, writes="final")
    return b.chain(SEAT, "final").output("final").build()


# --- the combat ----------------------------------------------------------------------------------------------------


def matches(
    n_questions: int,
    members: Sequence[str],
    reputation: dict[str, float],
    rng: random.Random,
    *,
    random_match_prob: float = 0.2,
    num_opponents: int = 3,
) -> list[tuple[int, str, str]]:
    """(question, first member, opponent) for each question, as SPARTA deals them.

    Questions go in loops of len(members), each member first once per loop in a shuffled order; the questions
    left over get a first member drawn uniformly. The opponent is drawn uniformly with probability
    `random_match_prob`, else among the `num_opponents` others closest in reputation (ties: pool order).
    """
    members = list(members)
    n = len(members)

    def opponent(first: str) -> str:
        others = [m for m in members if m != first]
        if rng.random() < random_match_prob:
            return rng.choice(others)
        close = sorted(others, key=lambda m: abs(reputation[first] - reputation[m]))
        return rng.choice(close[: max(1, min(num_opponents, len(close)))])

    firsts: list[str] = []
    for _ in range(n_questions // n):
        firsts.extend(rng.sample(members, n))
    firsts.extend(rng.choice(members) for _ in range(n_questions - len(firsts)))
    return [(q, first, opponent(first)) for q, first in enumerate(firsts)]


_SCORE_PATTERNS = (
    r'{\s*"score"\s*:\s*(\d+)\s*}',
    r'"score"\s*:\s*(\d+)',
    r"score\s*[:=]\s*(\d+)",
    r"Score:\s*(\d+)",
    r"(\d+)\s*/\s*10",
)


def judge_score(text: str) -> int | None:
    """The 1..10 score a judge's reply gives (a JSON object, or a `score: N` / `N/10` pattern), else None."""
    text = (text or "").strip()
    try:
        value = json.loads(text)
        if (
            isinstance(value, dict)
            and isinstance(value.get("score"), int | float)
            and 1 <= value["score"] <= 10
        ):
            return int(value["score"])
    except json.JSONDecodeError:
        pass
    for pattern in _SCORE_PATTERNS:
        for found in re.findall(pattern, text, flags=re.IGNORECASE):
            if 1 <= int(found) <= 10:
                return int(found)
    return None


@dataclass
class Ratings:
    """SPARTA's reputations: a score (start 100, floor 10) and a deviation per member, moved pair by pair.

    For a pair (a, b) with judges' scores (s_a, s_b), d = Σ_j R_j (s_a - s_b) / Σ_j R_j over the judges j; then
    for i = a, b in turn (sign + for a, - for b), with σ = sqrt(σ_i² + σ_j²):

        Δ_i = K · (±d) · tanh(σ_i) · max(|Φ((R_i - R_j)/σ) - Φ((R_j - R_i)/σ)|, ε) / scaling_factor

    K = max(min_k, initial_k · decay_rate^(updates / decay_steps)); a member's deviation is the standard
    deviation of its last `window_size` changes (at least `min_deviation`) once it has two.
    """

    members: Sequence[str]
    initial_k: float = 10.0
    min_k: float = 5.0
    window_size: int = 10
    min_deviation: float = 0.1
    epsilon: float = 0.01
    decay_rate: float = 0.9
    decay_steps: int = 10
    scaling_factor: float = 20.0
    score: dict[str, float] = field(default_factory=dict)
    deviation: dict[str, float] = field(default_factory=dict)
    updates: int = 0
    changes: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for m in self.members:
            self.score.setdefault(m, 100.0)
            self.deviation.setdefault(m, 0.5)
            self.changes.setdefault(m, [])

    def weighted(self, a: str, b: str, judged: dict[str, tuple[float, float]]) -> tuple[float, float] | None:
        """The judges' scores of a and b weighted by the judges' reputations (None: no judge)."""
        judges = [j for j in judged if j not in (a, b)]
        total = sum(self.score[j] for j in judges)
        if not judges or total <= 0:
            return None
        return (
            sum(self.score[j] * judged[j][0] for j in judges) / total,
            sum(self.score[j] * judged[j][1] for j in judges) / total,
        )

    def update(self, a: str, b: str, judged: dict[str, tuple[float, float]]) -> None:
        self.updates += 1
        k = max(self.min_k, self.initial_k * self.decay_rate ** (self.updates / self.decay_steps))
        scores = self.weighted(a, b, judged)
        if scores is None:
            return
        d = scores[0] - scores[1]
        for i, j, sign in ((a, b, 1.0), (b, a, -1.0)):
            r_i, r_j = self.score[i], self.score[j]
            spread = math.sqrt(self.deviation[i] ** 2 + self.deviation[j] ** 2) or 1e-6
            forward = 0.5 * (1.0 + math.erf((r_i - r_j) / (math.sqrt(2.0) * spread)))
            backward = 0.5 * (1.0 + math.erf((r_j - r_i) / (math.sqrt(2.0) * spread)))
            change = k * sign * d * math.tanh(self.deviation[i]) * max(abs(forward - backward), self.epsilon)
            self.score[i] = max(10.0, r_i + change / self.scaling_factor)
            self.changes[i] = (self.changes[i] + [self.score[i] - r_i])[-self.window_size :]
        for i in (a, b):  # deviations move once both scores have
            if len(self.changes[i]) >= 2:
                self.deviation[i] = max(float(np.std(self.changes[i])), self.min_deviation)


# --- the fit step --------------------------------------------------------------------------------------------------


def _solo(members: list[str], member: str, prompt: str) -> GraphSpec:
    from colab_graphs.protocol_registry import build_protocol

    return build_protocol("solo", members, member=member, prompt=prompt)


async def _judge(
    pool: Pool, client: ModelClient, judge: str, template: str, question: str, answers: tuple[str, str]
) -> tuple[float, float]:
    try:
        replies = await asyncio.gather(
            *(
                client.complete(
                    pool[judge], [{"role": "user", "content": template.format(input=question, response=a)}]
                )
                for a in answers
            )
        )
    except CallError as err:
        raise dev_fit.FitError(f"{NAME}: judge {judge} failed: {err}") from None
    scores = [judge_score(r.text) for r in replies]
    if any(s is None for s in scores):
        return DEFAULT_SCORE, DEFAULT_SCORE
    return float(scores[0]), float(scores[1])  # type: ignore[arg-type]


async def combat(
    pool: Pool,
    members: list[str],
    examples: list[Example],
    runs: dict[str, list[Any]],
    params: dict[str, Any],
    *,
    client: ModelClient,
    scorer: str | None,
) -> tuple[list[dict[str, Any]], Ratings]:
    """The judged pairs (question, members, judges' scores, winner or None) and the final reputations."""
    keys = ("initial_k", "min_k", "window_size", "min_deviation", "epsilon", "decay_rate", "decay_steps")
    ratings = Ratings(members, scaling_factor=float(params["scaling_factor"]), **{k: params[k] for k in keys})
    dealt = matches(
        len(examples),
        members,
        dict(ratings.score),
        random.Random(int(params["seed"])),
        random_match_prob=float(params["random_match_prob"]),
        num_opponents=int(params["num_opponents"]),
    )
    template = str(params["judge_prompt"])

    async def judged(q: int, a: str, b: str) -> dict[str, Any]:
        question = view_for(examples[q], scorer).graph_input()["input"]
        answers = (runs[a][q].trace.calls[0].completion or "", runs[b][q].trace.calls[0].completion or "")
        judges = [j for j in members if j not in (a, b)]
        verdicts = await asyncio.gather(
            *(_judge(pool, client, j, template, question, answers) for j in judges)
        )
        return {"question": q, "pair": [a, b], "judges": dict(zip(judges, verdicts, strict=True))}

    pairs = list(await asyncio.gather(*(judged(*deal) for deal in dealt)))
    for p in pairs:
        ratings.update(*p["pair"], p["judges"])
    for p in pairs:
        scores = ratings.weighted(*p["pair"], p["judges"])
        p["winner"] = (
            None if scores is None or scores[0] == scores[1] else p["pair"][0 if scores[0] > scores[1] else 1]
        )
    return pairs, ratings
