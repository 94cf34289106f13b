"""Stage helpers of the text-level protocols (conventions in `colab_graphs.protocols.text`): one seat per
member per stage, joins between stages, and the final vote or extraction."""

from __future__ import annotations

from collections.abc import Sequence

from colab_graphs.builder import GraphBuilder
from colab_graphs.spec import END, START, GraphSpec

__all__ = [
    "add_stage",
    "check_count",
    "check_members",
    "finish_with_extract",
    "finish_with_vote",
    "pick_member",
]


def check_members(members: Sequence[str], protocol_name: str) -> list[str]:
    """The members as a list; raise ValueError when there are none or a name would break a state-key pattern."""
    members = list(members)
    if not members:
        raise ValueError(f"{protocol_name}: needs at least one member")
    bad = [m for m in members if ":" in m or "*" in m or "?" in m]
    if bad:
        raise ValueError(
            f"{protocol_name}: member name(s) {', '.join(map(repr, bad))} contain ':', '*' or '?', which "
            "state keys and pattern reads use"
        )
    return members


def pick_member(members: list[str], value: str | None, protocol_name: str, param: str) -> str:
    """The member named by parameter `param` (default: the first in pool order); ValueError if unknown."""
    who = value or members[0]
    if who not in members:
        raise ValueError(f"{protocol_name}: {param}={who!r} is not a member ({', '.join(members)})")
    return who


def check_count(value: int, protocol_name: str, param: str, minimum: int = 1) -> int:
    """`value` when it is an integer >= `minimum` (rounds, layers, top_k); ValueError naming `param` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{protocol_name}: {param} must be an integer >= {minimum}, got {value!r}")
    return value


def add_stage(
    b: GraphBuilder,
    members: list[str],
    stage: str,
    prompt: str,
    key: str,
    after: list[str] | None,
    reads: dict[str, str] | None = None,
    own: str | None = None,
) -> list[str]:
    """One seat per member, `{stage}_{member}`, writing `{key}:{member}`; returns the seat names.

    Each seat starts after every seat in `after` (a join), or at START. `reads` apply to every seat; `own`,
    a key prefix, adds the read `own <- {own}:{member}` (the member's own previous text).
    """
    seats = []
    for m in members:
        name = f"{stage}_{m}"
        seat_reads = dict(reads or {})
        if own is not None:
            seat_reads["own"] = f"{own}:{m}"
        b.seat(name, member=m, prompt=prompt, reads=seat_reads, writes=f"{key}:{m}")
        b.edge(after if after else START, name)
        seats.append(name)
    return seats


def finish_with_vote(b: GraphBuilder, after: list[str], pattern: str) -> GraphSpec:
    """Majority vote (ties: pool order) over the keys matching `pattern`, after a join of `after`."""
    b.aggregate("vote", "vote", reads={"answers": pattern}, writes="final")
    b.edge(after, "vote").edge("vote", END)
    return b.output("final").build()


def finish_with_extract(b: GraphBuilder, seat: str, key: str) -> GraphSpec:
    """The answer extracted from `seat`'s text (`key`)."""
    b.aggregate("final", "extract", reads={"answer": key}, writes="final")
    b.edge(seat, "final").edge("final", END)
    return b.output("final").build()
