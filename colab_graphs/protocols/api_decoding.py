"""Decoding-time collaboration (API level in MoCo's families): one model guides another's decoding, token by token.

`nudging` and `co_llm` (MoCo's names) decide at every token which of two models writes it, from the models'
next-token distributions (nudging: the base model's top-1 probability) or hidden states (Co-LLM: a learned
deferral head). Only in-process `local/` members give those, so each protocol is one logit seat decoded by the
local provider (`colab_graphs.local.guided`); `compile_graph` refuses API members by name before any call (a
chat API returns text, and MoCo runs both methods on local Hugging Face models only, with no text-level
variant to follow; `mentor_collab` is the text-level method in which a mentor steps into a student's answer).

Coalitions: the seat keeps its present members; with one of the two left, that member generates alone; members
other than the two take no part; the empty coalition scores 0.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from colab_graphs.builder import GraphBuilder
from colab_graphs.files import atomic_write_text
from colab_graphs.fitting import Fitted
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocols import dev_fit
from colab_graphs.protocols.logit import REQUIREMENT
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.registry import protocol
from colab_graphs.spec import GraphSpec, LogitSeat

SEAT = "decode"

__all__ = ["SEAT", "co_llm", "fit_co_llm", "nudging"]


def _pair(
    name: str, members: list[str], first: str | None, second: str | None, labels: tuple[str, str]
) -> list[str]:
    """[first, second]: named members, by default the first and second in pool order."""
    if len(members) < 2:
        raise ValueError(f"{name}: needs two members ({labels[0]} and {labels[1]}), got {members}")
    pair = [
        first or members[0],
        second or (members[1] if (first or members[0]) == members[0] else members[0]),
    ]
    unknown = [m for m in pair if m not in members]
    if unknown:
        raise ValueError(
            f"{name}: member(s) {', '.join(map(repr, unknown))} not in the pool ({', '.join(members)})"
        )
    if pair[0] == pair[1]:
        raise ValueError(f"{name}: {labels[0]} and {labels[1]} are both {pair[0]!r}; name two members")
    return pair


def _decoded(
    name: str, members: list[str], pair: list[str], mode: str, prompt: str, description: str, **params: Any
):
    used = [m for m in members if m in pair]  # pool order; the seat's order says who is who
    b = GraphBuilder(name, members=used, description=description)
    b.logit_seat(SEAT, members=pair, mode=mode, prompt=prompt, writes="answer", **params)
    b.aggregate("final", "extract", reads={"answer": "answer"}, writes="final")
    return b.chain(SEAT, "final").output("final").build()


@protocol(
    "nudging",
    family="api",
    description="A base model writes; where it is unsure (top-1 probability below gamma), a nudging model writes "
    "the next word (local members).",
    min_members=2,
    requires=[REQUIREMENT],
)
def nudging(
    members: list[str],
    base: str | None = None,
    nudger: str | None = None,
    gamma: float = 0.4,
    prompt: str = ANSWER,
) -> GraphSpec:
    """Nudging (Fei et al., 2024, "Nudging: Inference-time Alignment of LLMs via Guided Decoding"): a base model is
    nudged by a (usually smaller, aligned) model at the tokens where the base is unsure.

    Token by token: the nudging model writes the first token, then keeps writing while its word is unfinished
    or the base's top-1 next-token probability is below `gamma`; the base writes while it is sure, and hands
    over again when it is not. The members may have different tokenizers (a chosen piece of text is re-encoded
    for the other model). Sampling settings are the base member's. Coalitions: with one of the two left, it
    generates alone; other members take no part; empty: 0.

    Args:
        base: the writing model (default: the first member in pool order; MoCo's `base_model_id` 0).
        nudger: the nudging model (default: the next member; MoCo's `nudging_model_id` 1).
        gamma: top-1 probability of the base below which the nudger writes, in [0, 1].
        prompt: the question template.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"nudging: gamma must be in [0, 1], got {gamma!r}")
    pair = _pair("nudging", members, base, nudger, ("base", "nudger"))
    return _decoded(
        "nudging", members, pair, "nudging", prompt, "a base model nudged where unsure", gamma=gamma
    )


async def fit_co_llm(
    spec: GraphSpec, pool: Pool, *, client: ModelClient, scorer: str | None = None
) -> Fitted:
    """The fit step of `co_llm`: learn the coalition's deferral head on dev (nothing to fit for one member).

    Raises:
        FitError: no dev data, or a dev call failed.
    """
    seat = spec.node(SEAT)
    assert isinstance(seat, LogitSeat)
    if len(seat.members) < 2:
        return Fitted(spec, dev_fit.record(spec.members, None, 0.0, 0, {"alone": seat.members[0]}))
    params = dev_fit.protocol_params(spec)
    members = list(spec.members)
    examples = dev_fit.dev_examples("co_llm", params, members)
    key = dev_fit.fit_key("co_llm", pool, members, examples, scorer, {**params, "order": seat.members})

    async def compute() -> dict[str, Any]:
        outcomes = {
            m: await dev_fit.solo_outcomes(
                pool, m, examples, client=client, scorer=scorer, prompt=seat.prompt, name="co_llm"
            )
            for m in members
        }
        return await asyncio.to_thread(
            _learn_head, spec, seat, pool, client, scorer, examples, outcomes, params
        )

    result, fitted, fit_s = await dev_fit.cached_fit("co_llm", key, members, compute)
    summary = {k: v for k, v in result.items() if k not in ("w", "b")}
    fitted_spec = (
        _with_head(spec, head_file(key, result)) if result.get("w") else _with_head(spec, _never(key))
    )
    return Fitted(fitted_spec, dev_fit.record(members, fitted, fit_s, len(examples), summary))


@protocol(
    "co_llm",
    family="api",
    description="A base model learns on dev at which tokens to defer to a reference model (local members of one "
    "vocabulary).",
    min_members=2,
    requires=[REQUIREMENT, "dev_split"],
    fit=fit_co_llm,
)
def co_llm(
    members: list[str],
    base: str | None = None,
    reference: str | None = None,
    threshold: float = 0.5,
    dev: str | None = None,
    dev_split: str = "dev",
    dev_limit: int = 0,
    weight_balance: float = 8.0,
    epochs: int = 200,
    learning_rate: float = 0.01,
    seed: int = 0,
    prompt: str = ANSWER,
) -> GraphSpec:
    """Co-LLM (Shen et al., 2024, "Learning to Decode Collaboratively with Multiple Language Models", ACL): a
    base model decodes and, at each token, a learned deferral head on its last hidden state decides whether the
    reference model writes that token instead.

    Fit (per coalition with both members): the dev questions are answered by each present member alone; the
    replies the task scores right are the training texts. Teacher-forcing them through both models labels a
    position "defer" when the reference's most probable token is the text's and the base's is not (Co-LLM's
    weak-supervision initialisation, MoCo's init "a"); a logistic head sigmoid(w . h + b) on the base's hidden
    states learns those labels (positives weighted by `weight_balance`; Co-LLM also fine-tunes the base model,
    here it stays frozen). Run: defer when the head's probability exceeds `threshold`. Both models read every
    chosen token, so they must share a vocabulary.

    Coalitions: with one of the two left, it generates alone (no fit); other members take no part; empty: 0.
    With no right reply on dev to learn from, the head never defers (the record says so).

    Args:
        base: the model that decodes and learns to defer (default: the first member; MoCo's generator).
        reference: the model deferred to (default: the next member; MoCo's mentor).
        threshold: deferral probability above which the reference writes the token, in [0, 1].
        dev: the dev data the head learns from (a file or source, as --data takes).
        dev_split: the split to read from a file that has several.
        dev_limit: dev examples used (0: all).
        weight_balance: weight of a "defer" position in the head's loss (MoCo: 8).
        epochs: the head's training steps (full batch, Adam).
        learning_rate: Adam's step size.
        seed: seed of the head's initial weights.
        prompt: the question template.
    """
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"co_llm: threshold must be in [0, 1], got {threshold!r}")
    if dev_limit < 0 or epochs < 1 or weight_balance <= 0:
        raise ValueError("co_llm: dev_limit must be >= 0, epochs >= 1 and weight_balance > 0")
    pair = _pair("co_llm", members, base, reference, ("base", "reference"))
    return _decoded(
        "co_llm",
        members,
        pair,
        "co_llm",
        prompt,
        "a base model deferring tokens",
        threshold=threshold,
        head=None,
    )


# --- Co-LLM's fit step: the deferral head ------------------------------------------------------------------------


def deferral_labels(
    base: Any, reference: Any, base_prompt: list[int], ref_prompt: list[int], target: list[int]
):
    """(hidden states of the base before each target token, labels: 1 where the reference's most probable token
    is the target's and the base's is not), teacher-forcing `target` after each model's own prompt."""
    import torch

    def run(engine: Any, prompt: list[int], hidden: bool) -> Any:
        ids = torch.tensor([prompt + target])
        with engine.lock, torch.inference_mode():
            out = engine.model(input_ids=ids.to(engine.model.device), output_hidden_states=hidden)
        span = slice(len(prompt) - 1, len(prompt) - 1 + len(target))
        states = out.hidden_states[-1][0, span].float().cpu() if hidden else None
        return out.logits[0, span].float().argmax(dim=-1).cpu(), states

    gold = torch.tensor(target)
    base_top, states = run(base, base_prompt, True)
    ref_top, _ = run(reference, ref_prompt, False)
    return states, ((ref_top == gold) & (base_top != gold)).float()


def train_head(
    states: Any, labels: Any, *, weight_balance: float, epochs: int, learning_rate: float, seed: int
):
    """A logistic head (w, b) on `states` for `labels`, positives weighted by `weight_balance`."""
    import torch

    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(states.shape[1], generator=g) * 0.01).requires_grad_()
    b = torch.zeros(1, requires_grad=True)
    optimiser = torch.optim.Adam([w, b], lr=learning_rate)
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor([weight_balance]))
    for _ in range(epochs):
        loss = loss_fn(states @ w + b, labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return [round(float(v), 7) for v in w.detach()], float(b.detach()[0])


def head_file(key: str, result: dict[str, Any]) -> Path:
    """The head's JSON file the provider reads (written from the fit's result when missing)."""
    path = dev_fit.fits_home() / f"co_llm-{key}-head.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"w": result["w"], "b": result["b"]}))
    return path


def _with_head(spec: GraphSpec, head: Path) -> GraphSpec:
    nodes = [
        n.model_copy(update={"params": {**n.params, "head": str(head)}}) if isinstance(n, LogitSeat) else n
        for n in spec.nodes
    ]
    return spec.model_copy(update={"nodes": nodes})


def _never(key: str) -> Path:
    """A head that never defers (no right reply on dev to learn from)."""
    return head_file(f"{key}-never", {"w": [], "b": -1e9})


def _learn_head(spec, seat, pool, client, scorer, examples, outcomes, params) -> dict[str, Any]:
    import torch

    from colab_graphs.compile import render
    from colab_graphs.local.provider import get_engine
    from colab_graphs.tasks.scoring import view_for

    base_name, ref_name = seat.members
    base, reference = get_engine(pool[base_name].model), get_engine(pool[ref_name].model)
    all_states, all_labels, texts = [], [], 0
    for i, example in enumerate(examples):
        state = view_for(example, scorer).graph_input()
        messages = [{"role": "user", "content": render(seat.prompt, SEAT, state, {})}]
        if seat.system:
            messages.insert(0, {"role": "system", "content": render(seat.system, SEAT, state, {})})
        for name in spec.members:
            outcome = outcomes[name][i]
            if outcome.score < 1.0 or not outcome.reply.strip():
                continue
            target = list(base.tokenizer.encode(outcome.reply, add_special_tokens=False))
            if not target:
                continue
            base_prompt = base.render(client.canonical_request(pool[base_name], messages)[0]["messages"])
            ref_prompt = reference.render(client.canonical_request(pool[ref_name], messages)[0]["messages"])
            states, labels = deferral_labels(base, reference, base_prompt, ref_prompt, target)
            all_states.append(states)
            all_labels.append(labels)
            texts += 1
    if not texts:
        return {
            "w": None,
            "b": None,
            "texts": 0,
            "tokens": 0,
            "deferrals": 0,
            "note": "no right dev reply to learn from: never defers",
        }
    states, labels = torch.cat(all_states), torch.cat(all_labels)
    w, b = train_head(
        states,
        labels,
        weight_balance=float(params["weight_balance"]),
        epochs=int(params["epochs"]),
        learning_rate=float(params["learning_rate"]),
        seed=int(params["seed"]),
    )
    with torch.no_grad():
        predicted = (torch.sigmoid(states @ torch.tensor(w) + b) > float(params["threshold"])).float()
    return {
        "w": w,
        "b": b,
        "texts": texts,
        "tokens": int(labels.numel()),
        "deferrals": int(labels.sum()),
        "predicted_deferrals": int(predicted.sum()),
    }
