"""The two protocols every audit needs: `solo` (individual strength) and `majority_vote`."""

from __future__ import annotations

from colab_graphs.builder import GraphBuilder
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.registry import protocol
from colab_graphs.spec import END, START, GraphSpec


@protocol(
    "solo",
    family="basic",
    description="One member answers alone; its score is the member's individual strength.",
    min_members=1,
)
def solo(members: list[str], member: str | None = None, prompt: str = ANSWER) -> GraphSpec:
    """One member answers the question.

    Args:
        member: which member answers (default: the first in pool order).
        prompt: the question template (`{input}` and any example field).
    """
    who = member or members[0]
    if who not in members:
        raise ValueError(f"solo: member {who!r} is not in the pool ({', '.join(members)})")
    b = GraphBuilder("solo", members=[who], description="one member answers alone")
    b.seat("answer", member=who, prompt=prompt, writes="answer")
    b.aggregate("final", "extract", reads={"answer": "answer"}, writes="final")
    return b.chain("answer", "final").output("final").build()


@protocol(
    "majority_vote",
    family="text",
    description="Every member answers independently; the most frequent answer wins (ties: pool order).",
    min_members=1,
    independent_replies=True,
)
def majority_vote(members: list[str], samples: int = 1, prompt: str = ANSWER) -> GraphSpec:
    """Every member answers in parallel, then a deterministic majority vote.

    Coalitions: an absent member's seats are dropped and the vote runs over the answers that remain.

    Args:
        samples: answers per member (repeated samples stay distinct in the cache; use temperature > 0).
        prompt: the question template.
    """
    b = GraphBuilder("majority_vote", members=members, description="independent answers, majority vote")
    seats = []
    for m in members:
        for k in range(samples):
            name = f"answer_{m}" + (f"_{k}" if samples > 1 else "")
            b.seat(name, member=m, prompt=prompt, writes=f"answer:{m}:{k}", sample=k)
            seats.append(name)
    b.aggregate("vote", "vote", reads={"answers": "answer:*"}, writes="final")
    b.fan(START, seats, join="vote").edge("vote", END)
    return b.output("final").build()
