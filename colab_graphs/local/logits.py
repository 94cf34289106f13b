"""Logit-level generation across local models that share a vocabulary.

* :func:`logit_fusion` mixes the members' next-token distributions, ``p = sum_i w_i p_i``, token by token.
* :func:`contrastive_decoding` (Li et al., 2023) scores tokens by ``log p_strong - beta * log p_weak`` over
  the plausible set ``{x : p_strong(x) >= alpha * max p_strong}``.

Each member renders the conversation with its own chat template, keeps its own KV cache, and is fed every
chosen token. Both run through the ``local/`` provider, so they share the call path and cache of ordinary
calls::

    await litellm.acompletion(
        model="local/smollm2-135m", messages=msgs, temperature=0,
        colab_graphs={"logit_mode": "fusion", "members": ["smollm2-135m", "my-tuned-smollm2"]},
    )
    await litellm.acompletion(
        model="local/big", messages=msgs,
        colab_graphs={"logit_mode": "contrastive", "members": ["big", "small"], "alpha": 0.1, "beta": 1.0},
    )

The first member is the request's model. The reported logprobs are those of the combined distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from colab_graphs.local.local_engine import (
    GenerationRequest,
    GenerationResult,
    LocalEngine,
    _Row,
    cache_kwarg,
    decoding_threads,
    output_cache,
)


class VocabularyMismatchError(ValueError):
    """Logit-level protocols need members whose tokenizers map the same strings to the same ids."""


def _engines(models: Sequence[str]) -> list[LocalEngine]:
    from colab_graphs.local.engines import get_engine

    if not models:
        raise ValueError("logit-level generation needs at least one member model")
    engines = [get_engine(m) for m in models]
    base = engines[0].tokenizer.get_vocab()
    for ref, engine in zip(models[1:], engines[1:], strict=True):
        if engine.tokenizer is engines[0].tokenizer:
            continue
        vocab = engine.tokenizer.get_vocab()
        if vocab != base:
            raise VocabularyMismatchError(
                f"logit-level generation needs members that share a vocabulary, but {models[0]!r} "
                f"({len(base)} tokens) and {ref!r} ({len(vocab)} tokens) differ"
            )
    return engines


class _Member:
    """One model's running forward state during a logit-level decode (with `hidden`, also the last layer's
    hidden state at the last position, for deferral heads: see `colab_graphs.local.guided`)."""

    def __init__(self, engine: LocalEngine, prompt_ids: list[int], hidden: bool = False) -> None:
        import torch

        self.engine = engine
        self.cache: Any = None
        self.position = 0
        self.hidden = hidden
        self.state: Any = None
        self.logits = self._forward(torch.tensor([prompt_ids]))

    def _forward(self, ids: Any) -> Any:
        import torch

        model = self.engine.model
        positions = torch.arange(self.position, self.position + ids.shape[1]).unsqueeze(0)
        extra = {cache_kwarg(model): self.cache} if self.cache is not None else {}
        with self.engine.lock, torch.inference_mode(), decoding_threads():
            out = model(
                input_ids=ids.to(model.device),
                position_ids=positions.to(model.device),
                use_cache=True,
                output_hidden_states=self.hidden,
                **extra,
            )
        self.cache = output_cache(out)
        self.position += ids.shape[1]
        if self.hidden:
            self.state = out.hidden_states[-1][0, -1, :].float()
        return out.logits[0, -1, :].float()

    def feed(self, token: int) -> None:
        self.feed_ids([token])

    def feed_ids(self, tokens: Sequence[int]) -> None:
        import torch

        if tokens:
            self.logits = self._forward(torch.tensor([list(tokens)]))


def _decode(
    models: Sequence[str],
    messages: list[dict[str, Any]],
    combine: Callable[[list[Any]], Any],
    *,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    stop: Sequence[str],
) -> GenerationResult:
    engines = _engines(models)
    members = [_Member(e, e.render(messages)) for e in engines]
    request = GenerationRequest(
        prompt_ids=engines[0].render(messages),
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop=stop,
    )
    row = _Row(request, engines[0])
    while row.finish is None:
        width = min(m.logits.shape[-1] for m in members)  # embeddings may be padded past the vocabulary
        token = row.choose(combine([m.logits[:width] for m in members]))
        row.update(token)
        if row.finish is None:
            for m in members:
                m.feed(token)
    return row.result()


def logit_fusion(
    models: Sequence[str],
    messages: list[dict[str, Any]],
    weights: Sequence[float] | None = None,
    max_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
) -> GenerationResult:
    """Generate from the weighted mixture of the members' next-token distributions.

    Args:
        models: Member references (zoo names, folders, ``set_local_model`` names).
        messages: The conversation.
        weights: Mixture weights (normalised); equal by default.
        max_tokens: Most new tokens.
        temperature: 0 picks the most probable token of the mixture.
        top_p: Nucleus sampling mass.
        seed: Seed for sampling.
        stop: Stop strings.

    Raises:
        VocabularyMismatchError: Two members tokenise differently.
    """
    import torch

    w = [1.0] * len(models) if weights is None else [float(x) for x in weights]
    if len(w) != len(models) or any(x < 0 for x in w) or sum(w) <= 0:
        raise ValueError(
            f"fusion weights {list(w)} must be {len(models)} non-negative numbers with a positive sum"
        )
    total = sum(w)

    def combine(logits: list[Any]) -> Any:
        logps = torch.stack(
            [
                torch.log_softmax(x, -1) + math.log(wi / total)
                for x, wi in zip(logits, w, strict=True)
                if wi > 0
            ]
        )
        return torch.logsumexp(logps, dim=0)

    return _decode(
        models,
        messages,
        combine,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop=stop,
    )


def contrastive_decoding(
    strong: str,
    weak: str,
    messages: list[dict[str, Any]],
    alpha: float = 0.1,
    beta: float = 1.0,
    max_tokens: int = 256,
    temperature: float = 0.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
) -> GenerationResult:
    """Generate with contrastive decoding: prefer what the strong model likes more than the weak one does.

    Args:
        strong: The expert model reference.
        weak: The amateur model reference (same vocabulary).
        messages: The conversation.
        alpha: Plausibility cutoff: only tokens with ``p_strong >= alpha * max p_strong`` are eligible.
        beta: Weight of the weak model's log-probability.
        max_tokens: Most new tokens.
        temperature: 0 picks the best contrastive score; otherwise samples from its softmax.
        seed: Seed for sampling.
        stop: Stop strings.

    Raises:
        VocabularyMismatchError: The two models tokenise differently.
    """
    import torch

    if not 0 < alpha <= 1:
        raise ValueError(f"contrastive alpha must be in (0, 1], got {alpha}")
    cutoff = math.log(alpha)

    def combine(logits: list[Any]) -> Any:
        strong_lp, weak_lp = (torch.log_softmax(x, -1) for x in logits)
        score = strong_lp - beta * weak_lp
        return score.masked_fill(strong_lp < strong_lp.max() + cutoff, float("-inf"))

    return _decode(
        [strong, weak],
        messages,
        combine,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=1.0,
        seed=seed,
        stop=stop,
    )
