"""The judge protocol of bench/crl_compare.py: teammates answer, a judge reads their extracted answers.

`judge(members, judge="policy")`: every other member answers the question (`ANSWER`: the question and the
task's answer instruction); the task extracts each one's answer; the judge reads those answers (numbered in
pool order, without names) and writes the final answer. The system's answer is the one the judge's text
commits to ("" when it commits to none: a judge that cannot answer is wrong).

Coalitions: an absent teammate's seat is dropped (the judge sees "(none)" in its place); without the judge,
the first teammate's extracted answer (pool order) is the system's answer, so the judge's leave-one-out
value is what it adds over taking the first teammate's word. Empty coalition: 0.

Use it from a training config with `graph: bench/crl_judge.py:judge`.
"""

from __future__ import annotations

from colab_graphs.builder import GraphBuilder
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.spec import END, START, GraphSpec

JUDGE = "{input}\n\nYour teammates answered:\n{candidates}\n\nWhat is the correct answer? {answer_format}"


def judge(members: list[str], judge: str = "policy", prompt: str = ANSWER) -> GraphSpec:
    """Teammates answer in parallel; `judge` reads their extracted answers and gives the final answer."""
    if judge not in members:
        raise ValueError(f"judge: {judge!r} is not in the pool ({', '.join(members)})")
    teammates = [m for m in members if m != judge]
    if not teammates:
        raise ValueError("judge: needs at least one teammate besides the judge")
    b = GraphBuilder("judge", members=members, description="teammates answer; a judge picks the final answer")
    lines = []
    for i, m in enumerate(teammates, 1):
        b.seat(f"answer_{m}", member=m, prompt=prompt, writes=f"answer:{m}")
        b.aggregate(f"extract_{m}", "extract", reads={"answer": f"answer:{m}?"}, writes=f"extracted:{m}")
        b.edge(START, f"answer_{m}").edge(f"answer_{m}", f"extract_{m}")
        lines.append(f"Teammate {i}: {{t{i}}}")
    reads = {f"t{i}": f"extracted:{m}?" for i, m in enumerate(teammates, 1)}
    template = JUDGE.replace("{candidates}", "\n".join(lines))
    b.seat("judge", member=judge, prompt=template, reads=reads, writes="verdict")
    b.edge([f"extract_{m}" for m in teammates], "judge")
    b.aggregate(
        "final",
        "first",
        reads={"verdict": "verdict?", "teammates": "extracted:*"},
        writes="final",
        extract=True,
    )
    b.edge("judge", "final").edge("final", END)
    return b.output("final").build()
