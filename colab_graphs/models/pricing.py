"""What a call will cost before it is made: prompt tokens, the completion allowance, and LiteLLM's prices.

Used by an audit's plan (`--dry-run`) and by the spending caps (`--max-cost`), which must both price a call
without making it. Prices come from LiteLLM's price map (`litellm.model_cost`, the bundled copy: see
`colab_graphs._env`), or from a member's own `input_cost_per_token` / `output_cost_per_token` settings (which
LiteLLM also honours when it prices the reply); in-process `local/` models are free. A member LiteLLM has no
price for is "unknown", never free.

Prompt tokens are counted with the member's own tokenizer when it is a `local/` model already on disk (its
chat template applied, as the engine renders it), else with `litellm.token_counter` (the model's tokenizer
where LiteLLM knows it, else tiktoken's cl100k), else as characters / 4. Completion tokens are the call's
`max_tokens`, an upper bound; without one, `DEFAULT_COMPLETION_TOKENS` is assumed and the plan says so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from colab_graphs.pool import Member

DEFAULT_COMPLETION_TOKENS = 256  # assumed per call when neither the member nor the seat sets max_tokens
LOCAL_PREFIX = "local/"


@dataclass(frozen=True)
class Price:
    """USD per prompt token and per completion token."""

    prompt: float
    completion: float

    def of(self, prompt_tokens: int, completion_tokens: int) -> float:
        return self.prompt * prompt_tokens + self.completion * completion_tokens


def _models(member: Member) -> list[str]:
    return [member.model, *(d["model"] for d in member.deployments if d.get("model"))]


@cache
def _bundled_names() -> tuple[str, ...] | None:
    """The last path segment of every model LiteLLM's bundled price map names, lowercased (longest first);
    None where LiteLLM would read another map (`LITELLM_LOCAL_MODEL_COST_MAP` unset) or its file is missing.
    Read as JSON, without importing LiteLLM (seconds of CPU)."""
    if os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP", "").lower() != "true":
        return None
    spec = importlib.util.find_spec("litellm")  # (finding a package does not import it)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model_prices_and_context_window_backup.json"
    try:
        names = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return tuple(sorted({str(k).lower().rsplit("/", 1)[-1] for k in names}, key=len, reverse=True))


def unmapped(model: str) -> bool:
    """Whether LiteLLM's bundled price map certainly has no price for `model`, decided without importing
    LiteLLM (so that a served model with no price starts its first call at once). False where LiteLLM is
    loaded (a price may have been registered with it since) or reads another map: LiteLLM itself decides."""
    return "litellm" not in sys.modules and no_key_matches(model)


def no_key_matches(model: str) -> bool:
    """True when no key of LiteLLM's bundled map can match `model`.

    Every name LiteLLM looks a model up under (`litellm.utils.get_potential_model_names`: the model, with or
    without its provider prefix or region, its dated-snapshot, fine-tune or version suffix stripped) ends in a
    piece of the model's own name, so no key matches unless the last segment of some key occurs in the model's
    name (case-insensitively, as LiteLLM compares). False where the map cannot be read.
    """
    names = _bundled_names()
    if names is None:
        return False
    lowered = model.lower()
    return not any(name in lowered for name in names)


@lru_cache(maxsize=256)
def _litellm_price(model: str) -> Price | None:
    if unmapped(model):
        return None
    import litellm

    import colab_graphs._env  # noqa: F401  (the bundled price map, not a download)

    try:
        info = litellm.get_model_info(model)
    except Exception:  # noqa: BLE001 - LiteLLM raises for a model it has not mapped
        return None
    prompt, completion = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if prompt is None and completion is None:
        return None
    return Price(float(prompt or 0.0), float(completion or 0.0))


def member_price(member: Member) -> Price | None:
    """The member's price per token, or None when it is unknown.

    A member with several deployments is priced at its dearest one (a cap must hold whichever answers).
    """
    own = member.settings.get("input_cost_per_token"), member.settings.get("output_cost_per_token")
    if any(v is not None for v in own):
        return Price(float(own[0] or 0.0), float(own[1] or 0.0))
    prices = []
    for model in _models(member):
        if model.startswith(LOCAL_PREFIX):
            prices.append(Price(0.0, 0.0))
            continue
        price = _litellm_price(model)
        if price is None:
            return None
        prices.append(price)
    return max(prices, key=lambda p: (p.completion, p.prompt))


def price_source(member: Member) -> str:
    """Where the member's price comes from: "pool", "local", "litellm" or "unknown"."""
    if any(member.settings.get(k) is not None for k in ("input_cost_per_token", "output_cost_per_token")):
        return "pool"
    if all(m.startswith(LOCAL_PREFIX) for m in _models(member)):
        return "local"
    return "litellm" if member_price(member) is not None else "unknown"


def completion_allowance(member: Member, settings: dict[str, Any] | None = None) -> tuple[int, bool]:
    """(completion tokens a call may use, whether a max_tokens says so) for the call's settings."""
    merged = {**member.settings, **(settings or {})}
    for key in ("max_tokens", "max_completion_tokens", "max_new_tokens"):
        if merged.get(key) is not None:
            return int(merged[key]), True
    return DEFAULT_COMPLETION_TOKENS, False


def count_prompt_tokens(member: Member, messages: list[dict[str, Any]]) -> tuple[int, str]:
    """(prompt tokens of `messages` for the member, how they were counted: "tokenizer", "litellm", "chars/4")."""
    model = member.model
    if model.startswith(LOCAL_PREFIX):
        from colab_graphs.local.provider import prompt_tokens

        counted = prompt_tokens(model, messages)
        return (counted, "tokenizer") if counted is not None else (_by_chars(messages), "chars/4")
    try:
        import litellm

        return int(litellm.token_counter(model=model, messages=messages)), "litellm"
    except Exception:  # noqa: BLE001 - a tokenizer LiteLLM cannot load offline: fall back to a ratio
        return _by_chars(messages), "chars/4"


def _by_chars(messages: list[dict[str, Any]]) -> int:
    return max(1, sum(len(str(m.get("content", ""))) for m in messages) // 4)


def estimate_cost(
    member: Member, messages: list[dict[str, Any]], settings: dict[str, Any] | None = None
) -> float | None:
    """An upper estimate of one call's price (prompt tokens plus the completion allowance); None if unknown."""
    price = member_price(member)
    if price is None:
        return None
    if price.prompt == 0.0 and price.completion == 0.0:
        return 0.0
    prompt, _ = count_prompt_tokens(member, messages)
    completion, _ = completion_allowance(member, settings)
    return price.of(prompt, completion)
