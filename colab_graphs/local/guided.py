"""Guided decoding across two local models, token by token: nudging and Co-LLM deferral.

* :func:`nudging` (Fei et al., 2024, "Nudging: Inference-time Alignment of LLMs via Guided Decoding"): a *base*
  model writes; where its top-1 next-token probability is below ``gamma`` (it is unsure), the *nudging* model
  writes instead, until it has finished a word and the base is sure again. The first token is always the
  nudging model's. Members may have different tokenizers: a chosen piece of text is fed to the other model
  re-encoded by its own tokenizer (as MoCo does).
* :func:`co_llm` (Shen et al., 2024, "Learning to Decode Collaboratively with Multiple Language Models", ACL):
  at each token a learned deferral head on the base model's last hidden state, ``sigmoid(w . h + b)``, says
  whether the *reference* model writes the token instead (``> threshold``); both models read every chosen
  token, so they must share a vocabulary. The head is fitted on a dev split by the ``co_llm`` protocol
  (``colab_graphs.protocols.api_decoding``) and read from a JSON file (``{"w": [...], "b": float}``).

Both run through the ``local/`` provider as logit modes (``colab_graphs={"logit_mode": "nudging" | "co_llm",
"members": [base, other], ...}``), so they share the call path and the call cache of ordinary calls.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from colab_graphs.local.local_engine import GenerationResult, LocalEngine
from colab_graphs.local.logits import VocabularyMismatchError, _Member

MODES = ("nudging", "co_llm")
_TAIL = 16  # tokens of context decoded with a new token to find the text it adds


class _Stream:
    """One model's running forward state (its own chat template, KV cache and token ids)."""

    def __init__(self, engine: LocalEngine, messages: list[dict[str, Any]], hidden: bool = False) -> None:
        self.engine, self.tokenizer = engine, engine.tokenizer
        self.prompt_ids = engine.render(messages)
        self.ids: list[int] = list(self.prompt_ids)
        self._member = _Member(engine, self.prompt_ids, hidden=hidden)

    @property
    def logits(self) -> Any:
        return self._member.logits

    @property
    def state(self) -> Any:
        return self._member.state

    def feed(self, tokens: Sequence[int]) -> None:
        self.ids.extend(tokens)
        self._member.feed_ids(tokens)

    def piece(self, token: int) -> str:
        """The text `token` adds after the ids so far (decoded with a short tail of context)."""
        tail = self.ids[-_TAIL:] if len(self.ids) > len(self.prompt_ids) else []
        old: str = self.tokenizer.decode(tail, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        new: str = self.tokenizer.decode(
            [*tail, token], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if new.startswith(old):
            return new[len(old) :]
        i = 0
        while i < min(len(old), len(new)) and old[i] == new[i]:
            i += 1
        return new[i:]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []


class _Picker:
    """Greedy (temperature 0) or seeded sampling from logits."""

    def __init__(self, temperature: float, seed: int | None) -> None:
        import torch

        self.temperature = temperature
        seed = seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: Any) -> int:
        import torch

        if self.temperature <= 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.cpu() / self.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))


def _engines(models: Sequence[str]) -> list[LocalEngine]:
    from colab_graphs.local.engines import get_engine

    if len(models) != 2:
        raise ValueError(f"guided decoding takes two members [base, other], got {list(models)}")
    return [get_engine(m) for m in models]


def _same_vocabulary(a: LocalEngine, b: LocalEngine) -> bool:
    return a.tokenizer is b.tokenizer or a.tokenizer.get_vocab() == b.tokenizer.get_vocab()


class _Output:
    """The text written so far, with stop strings and the token budget.

    With `exact` (the base read exactly the tokens written: one vocabulary), the final text is the base's
    tokens decoded together, as a model's own reply is; otherwise the pieces joined (a piece may be part of a
    character another piece completes).
    """

    def __init__(self, base: _Stream, max_tokens: int, stop: Sequence[str], exact: bool) -> None:
        self.base, self.max_tokens, self.stop, self.exact = base, max_tokens, [s for s in stop if s], exact
        self.text = ""
        self.logprobs: list[float] = []
        self.steps = 0
        self.finish: str | None = None

    def add(self, text: str, logprob: float) -> None:
        self.text += text
        self.logprobs.append(logprob)
        self.steps += 1
        for s in self.stop:
            cut = self.text.find(s)
            if cut >= 0:
                self.text, self.finish = self.text[:cut], "stop"
        if self.finish is None and self.steps >= self.max_tokens:
            self.finish = "length"

    def result(self) -> GenerationResult:
        completion = self.base.ids[len(self.base.prompt_ids) :]
        if self.exact:
            text = self.base.tokenizer.decode(completion, skip_special_tokens=True)
            for s in self.stop:
                text = text[: text.find(s)] if s in text else text
        else:
            text = self.text
            for token in self.base.engine.eos_ids:  # pieces are decoded with special tokens kept
                marker = self.base.tokenizer.decode([token])
                if marker:
                    text = text.replace(marker, "")
        return GenerationResult(
            prompt_ids=list(self.base.prompt_ids),
            completion_ids=completion,
            logprobs=self.logprobs,
            text=text,
            finish_reason=self.finish or "length",
        )


def nudging(
    base: str,
    nudger: str,
    messages: list[dict[str, Any]],
    gamma: float = 0.4,
    max_tokens: int = 256,
    temperature: float = 0.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
) -> GenerationResult:
    """Decode with the base model, nudged by `nudger` wherever the base is unsure.

    At each step both models propose a token. In nudging mode the nudger's token is taken while it is the
    first nudging token, or has no space (the word is not finished), or the base's top-1 probability is
    below `gamma`; otherwise the base's token is taken and nudging stops until the base is unsure again
    (top-1 probability below `gamma`), when the nudger takes over for at least one token. The text ends when
    the model whose token would be taken ends its turn.

    Args:
        base: The base (writing) model reference.
        nudger: The nudging model reference (its tokenizer may differ).
        messages: The conversation.
        gamma: Top-1 probability of the base below which it is unsure, in [0, 1].
        max_tokens: Most tokens written (by either model).
        temperature: 0 takes each model's most probable token; otherwise each samples at this temperature.
        seed: Seed for sampling.
        stop: Stop strings.
    """
    import torch

    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"nudging gamma must be in [0, 1], got {gamma}")
    engines = _engines([base, nudger])
    shared = _same_vocabulary(*engines)
    b, n = _Stream(engines[0], messages), _Stream(engines[1], messages)
    pick = _Picker(temperature, seed)
    out = _Output(b, max_tokens, stop, exact=shared)
    nudging_mode, accepted = True, 0
    while out.finish is None:
        base_logp = torch.log_softmax(b.logits, dim=-1)
        top1 = math.exp(float(base_logp.max()))
        b_tok, n_tok = pick(b.logits), pick(n.logits)
        n_text = n.piece(n_tok)
        if nudging_mode and (accepted == 0 or " " not in n_text or top1 < gamma):
            chosen, writer = n_tok, n
            accepted += 1
        elif top1 >= gamma:
            chosen, writer = b_tok, b
            nudging_mode, accepted = False, 0
        else:
            chosen, writer = n_tok, n
            nudging_mode, accepted = True, 1
        if chosen in writer.engine.eos_ids:
            out.finish = "stop"
            break
        text = n_text if writer is n else b.piece(b_tok)
        logprob = float(torch.log_softmax(writer.logits, dim=-1)[chosen])
        other = b if writer is n else n
        writer.feed([chosen])
        other.feed([chosen] if shared else other.encode(text))
        out.add(text, logprob)
    return out.result()


@lru_cache(maxsize=32)
def load_head(path: str) -> tuple[Any, float]:
    """A deferral head `(w, b)` from its JSON file (remembered per path; fit files are never rewritten)."""
    import torch

    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return torch.tensor(data["w"], dtype=torch.float32), float(data["b"])


def defer_probability(head: tuple[Any, float], hidden: Any) -> float:
    """sigmoid(w . h + b) for one hidden state."""
    w, b = head
    z = float(w @ hidden.cpu()) + b if w.numel() else b  # an empty head never defers
    return 1.0 / (1.0 + math.exp(-z)) if z > -60 else 0.0


def co_llm(
    base: str,
    reference: str,
    messages: list[dict[str, Any]],
    head: str,
    threshold: float = 0.5,
    max_tokens: int = 256,
    temperature: float = 0.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
) -> GenerationResult:
    """Decode with the base model, deferring a token to `reference` when the learned head says so.

    Args:
        base: The base model reference (the one whose hidden states the head reads).
        reference: The model deferred to (same vocabulary).
        messages: The conversation.
        head: Path of the deferral head's JSON file (`{"w": [hidden floats], "b": float}`).
        threshold: Defer when the head's probability is above this, in [0, 1] (1: never; 0: always).
        max_tokens: Most new tokens.
        temperature: 0 takes the writing model's most probable token; otherwise it samples.
        seed: Seed for sampling.
        stop: Stop strings.

    Raises:
        VocabularyMismatchError: The two models tokenise differently.
    """
    import torch

    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"co_llm threshold must be in [0, 1], got {threshold}")
    engines = _engines([base, reference])
    if not _same_vocabulary(*engines):
        raise VocabularyMismatchError(
            f"co_llm feeds both models the same tokens, but {base!r} and {reference!r} have different vocabularies"
        )
    weights = load_head(str(head))
    b, r = _Stream(engines[0], messages, hidden=True), _Stream(engines[1], messages)
    pick = _Picker(temperature, seed)
    out = _Output(b, max_tokens, stop, exact=True)
    while out.finish is None:
        width = min(b.logits.shape[-1], r.logits.shape[-1])  # embeddings may be padded past the vocabulary
        writer = r if defer_probability(weights, b.state) > threshold else b
        logits = writer.logits[:width]
        token = pick(logits)
        if token in engines[0].eos_ids:
            out.finish = "stop"
            break
        text = b.piece(token)
        out.add(text, float(torch.log_softmax(logits, dim=-1)[token]))
        b.feed([token])
        r.feed([token])
    return out.result()


def generate_guided(
    mode: str, members: Sequence[str], messages: list[dict[str, Any]], settings: dict[str, Any], **common: Any
) -> GenerationResult:
    """Dispatch a provider request whose logit mode is "nudging" or "co_llm" (`common`: max_tokens,
    temperature, seed, stop)."""
    if len(members) != 2:
        raise ValueError(f"{mode} takes members [base, other], got {list(members)}")
    if mode == "nudging":
        return nudging(members[0], members[1], messages, gamma=float(settings.get("gamma", 0.4)), **common)
    if mode == "co_llm":
        head = settings.get("head")
        if not head:
            raise ValueError(
                "co_llm has no deferral head: the protocol's fit step learns it on the dev split "
                "(colab_graphs.fitting; `colab-graphs run` and `audit` run it)"
            )
        return co_llm(
            members[0],
            members[1],
            messages,
            head=str(head),
            threshold=float(settings.get("threshold", 0.5)),
            **common,
        )
    raise ValueError(f"guided decoding mode must be one of {MODES}, got {mode!r}")
