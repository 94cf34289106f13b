"""Logit-level protocols: members decode one answer together, token by token (local members only).

Logit fusion averages the members' next-token distributions; contrastive decoding prefers what a strong
member likes more than a weak one does. Both need every member's logits at every step, so they run on the
in-process `local/` provider (`colab_graphs.local.logits`), with members that share a vocabulary. An API
endpoint returns text, not distributions: `check_pool_supports` (`colab_graphs.logit_pool`, run by
`compile_graph`) says which members cannot take part.

Coalitions: a logit seat keeps its present members; with one member left it is that member's plain
generation.
"""

from __future__ import annotations

from colab_graphs.builder import GraphBuilder
from colab_graphs.logit_pool import (  # the checks compile_graph runs, named here for users of this family
    LOCAL_PREFIX,
    LogitPoolError,
    check_pool_supports,
    check_seat_supports,
    unsupported_members,
)
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.registry import protocol
from colab_graphs.spec import GraphSpec

__all__ = [
    "LOCAL_PREFIX",
    "LogitPoolError",
    "check_pool_supports",
    "check_seat_supports",
    "contrastive_decoding",
    "logit_fusion",
    "unsupported_members",
]

REQUIREMENT = "local_logits"


@protocol(
    "logit_fusion",
    family="logit",
    description="Local members that share a vocabulary decode together from their averaged next-token "
    "distributions.",
    min_members=1,
    requires=[REQUIREMENT],
)
def logit_fusion(members: list[str], prompt: str = ANSWER) -> GraphSpec:
    """One answer decoded from the average of every member's next-token distribution, token by token.

    Members must be `local/` models with the same vocabulary (a pool of API models is refused when the graph
    is compiled). Sampling settings (temperature, max_tokens, ...) are the first member's. Coalitions: absent
    members leave the average; one member left generates alone.

    Args:
        prompt: the question template.
    """
    b = GraphBuilder("logit_fusion", members=members, description="average next-token distributions")
    b.logit_seat("fused", members=members, mode="fusion", prompt=prompt, writes="fused")
    b.aggregate("final", "extract", reads={"answer": "fused"}, writes="final")
    return b.chain("fused", "final").output("final").build()


@protocol(
    "contrastive_decoding",
    family="logit",
    description="A strong and a weak local member: tokens the strong one prefers more than the weak one win.",
    min_members=2,
    requires=[REQUIREMENT],
)
def contrastive_decoding(
    members: list[str],
    strong: str | None = None,
    weak: str | None = None,
    alpha: float = 0.1,
    beta: float = 1.0,
    prompt: str = ANSWER,
) -> GraphSpec:
    """Contrastive decoding (Li et al., 2023): score tokens by log p_strong - beta * log p_weak.

    Only tokens with p_strong >= alpha * max p_strong are eligible. Members must be `local/` models with the
    same vocabulary; members other than the strong and weak one take no part. Coalitions: with either one
    absent, the other generates alone.

    Args:
        strong: the expert member (default: the last in pool order).
        weak: the amateur member (default: the first in pool order).
        alpha: plausibility cutoff in (0, 1].
        beta: weight of the weak member's log-probability (0: the strong member's own greedy output).
    """
    strong = strong or members[-1]
    weak = weak or members[0]
    unknown = [m for m in (strong, weak) if m not in members]
    if unknown:
        raise ValueError(
            f"contrastive_decoding: member(s) {', '.join(map(repr, unknown))} not in the pool "
            f"({', '.join(members)})"
        )
    if strong == weak:
        raise ValueError(f"contrastive_decoding: strong and weak are both {strong!r}; name two members")
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"contrastive_decoding: alpha must be in (0, 1], got {alpha!r}")
    used = [m for m in members if m in (strong, weak)]
    b = GraphBuilder("contrastive_decoding", members=used, description="strong minus weak")
    # The provider takes [strong, weak] in that order; the seat's first member is the request's model.
    b.logit_seat(
        "contrast",
        members=[strong, weak],
        mode="contrastive",
        prompt=prompt,
        writes="contrast",
        alpha=alpha,
        beta=beta,
    )
    b.aggregate("final", "extract", reads={"answer": "contrast"}, writes="final")
    return b.chain("contrast", "final").output("final").build()
