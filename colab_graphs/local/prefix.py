"""Prompt passes that compute a prefix several prompts share once (one member's system prompt and the task's
question template, in front of each of an audit's examples).

A batch's prompt pass costs the positions it computes: rows x the longest prompt (left padding included). The
default audit's 36 prompts (1,899 tokens, 2,124 positions padded) start with three prefixes of 20-27 tokens,
one per member; computed once each, the pass is 3 x 27 + 36 x 32 = 1,233 positions. The prefix's keys and
values are copied into each of its rows' cache; the rest of each prompt (its suffix) then runs against them.

The layout of a row's cache columns: the prefix zone (``prefix_width`` columns, the row's prefix at its right
end), then the suffix zone (``suffix_width`` columns, the row's suffix at its right end); the columns between
are masked, as left padding is. Positions count the row's own tokens only, so each token sees the positions
(and the rotary phases) it has in the plain pass; only the order of floating-point sums may differ.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

# A shared prefix shorter than this is not worth a pass of its own (each pass costs the model's per-layer
# overhead once more), and rows that share less stay with the plain pass.
MIN_SHARED = 8
# The shared pass is used when it computes at most this share of the plain pass's positions: it pays a second
# forward call and the copies of the prefix's keys and values into every row.
MAX_SHARE = 0.8


@dataclass(frozen=True)
class SharedPrefixes:
    """How a batch's prompts split into shared prefixes and suffixes.

    Attributes:
        prefixes: The distinct shared prefixes.
        group: Per prompt, the index of its prefix in `prefixes` (-1: it shares none; all of it is suffix).
        suffixes: Per prompt, the tokens after its prefix (at least one: the pass needs its last logits).
    """

    prefixes: list[list[int]]
    group: list[int]
    suffixes: list[list[int]]

    @property
    def prefix_width(self) -> int:
        return max((len(p) for p in self.prefixes), default=0)

    @property
    def suffix_width(self) -> int:
        return max(len(s) for s in self.suffixes)

    @property
    def width(self) -> int:
        """Cache columns the prompts fill: the prefix zone and the suffix zone."""
        return self.prefix_width + self.suffix_width

    def prefix_length(self, row: int) -> int:
        return len(self.prefixes[self.group[row]]) if self.group[row] >= 0 else 0

    @property
    def positions(self) -> int:
        """Positions the two passes compute (padding included)."""
        return len(self.prefixes) * self.prefix_width + len(self.suffixes) * self.suffix_width


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def plan_shared_prefixes(prompts: Sequence[Sequence[int]]) -> SharedPrefixes | None:
    """Group `prompts` by the prefixes they share; None when sharing would not cut the positions computed to at
    most `MAX_SHARE` of the plain pass's (or when ``COLAB_GRAPHS_SHARED_PREFIX=0`` turns it off).

    Prompts sorted in token order put the ones that share a prefix next to each other; a run of neighbours
    whose common prefix stays at least `MIN_SHARED` tokens long is one group.
    """
    if os.environ.get("COLAB_GRAPHS_SHARED_PREFIX", "1") == "0" or len(prompts) < 2:
        return None
    order = sorted(range(len(prompts)), key=lambda i: list(prompts[i]))
    runs: list[tuple[list[int], int]] = []  # (rows, their common prefix length)
    for i in order:
        if runs:
            rows, common = runs[-1]
            shared = _common(prompts[rows[0]][:common], prompts[i])
            if shared >= MIN_SHARED:
                runs[-1] = ([*rows, i], shared)
                continue
        runs.append(([i], len(prompts[i])))
    prefixes: list[list[int]] = []
    group = [-1] * len(prompts)
    for rows, common in runs:
        length = min(common, *(len(prompts[r]) - 1 for r in rows))  # every row keeps a token to pass
        if len(rows) < 2 or length < MIN_SHARED:
            continue
        for r in rows:
            group[r] = len(prefixes)
        prefixes.append(list(prompts[rows[0]][:length]))
    if not prefixes:
        return None
    suffixes = [list(p[len(prefixes[g]) if g >= 0 else 0 :]) for p, g in zip(prompts, group, strict=True)]
    plan = SharedPrefixes(prefixes, group, suffixes)
    plain = len(prompts) * max(len(p) for p in prompts)
    return plan if plan.positions <= MAX_SHARE * plain else None
