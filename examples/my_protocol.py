"""A protocol written from scratch with the DSL: one member drafts, another critiques, the first revises.

Run it like a built-in protocol (the file is imported, so `-P` parameters are typed by the signature):

    colab-graphs run --graph examples/my_protocol.py:draft_critique_revise --pool pool.yaml \
        --data data.jsonl -P rounds=2
    colab-graphs show --graph examples/my_protocol.py:draft_critique_revise

Coalitions: the writer's seats pass to the first present member (`on_absent="substitute"`); an absent
critic's critiques are dropped and the writer revises without one (`critique:r?` reads "" then).
"""

from __future__ import annotations

from colab_graphs import GraphBuilder, GraphSpec, protocol

DRAFT = "{input}\n\n{answer_format}"
CRITIQUE = (
    "Question:\n{input}\n\nDraft answer:\n{draft}\n\n"
    "Point out every mistake in the draft, briefly. If it is right, say so."
)
REVISE = (
    "Question:\n{input}\n\nYour draft:\n{draft}\n\nA reviewer's critique:\n{critique}\n\n"
    "Write the corrected answer. {answer_format}"
)


@protocol(
    "draft_critique_revise",
    family="text",
    description="One member drafts, another critiques, the first revises (rounds times).",
    min_members=1,
)
def draft_critique_revise(members: list[str], critic: str | None = None, rounds: int = 1) -> GraphSpec:
    """Draft, then `rounds` of critique and revision.

    Args:
        critic: the member who critiques (default: the second in pool order, else the first).
        rounds: how many critique-and-revise rounds follow the draft.
    """
    writer = members[0]
    critic = critic or members[min(1, len(members) - 1)]
    b = GraphBuilder("draft_critique_revise", members=members, description="draft, critique, revise")
    b.seat("draft", member=writer, prompt=DRAFT, writes="draft:0", on_absent="substitute")
    path = ["draft"]
    for r in range(rounds):
        draft = {"draft": f"draft:{r}"}
        b.seat(f"critique_{r}", member=critic, prompt=CRITIQUE, reads=draft, writes=f"critique:{r}")
        # `critique:r?` reads "" when a coalition dropped the critic's seat.
        b.seat(
            f"revise_{r}",
            member=writer,
            prompt=REVISE,
            reads={**draft, "critique": f"critique:{r}?"},
            writes=f"draft:{r + 1}",
            on_absent="substitute",
        )
        path += [f"critique_{r}", f"revise_{r}"]
    b.aggregate("final", "extract", reads={"answer": f"draft:{rounds}"}, writes="final")
    return b.chain(*path, "final").output("final").build()
