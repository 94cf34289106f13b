"""A toy cooperative task where the system needs something only the policy can add (tests, benchmarks, demos).

`relay`: every collaborator answers the question; the policy then reads their answers and adds its part;
the final answer is the concatenation. The `toy_marker` scorer counts the system right only when the final
answer holds both the correct number (the collaborators' part) and the marker string `MARKER` (the part the
collaborators lack, the policy's). Alone, a tiny policy never supplies the number, so its own correctness
gives RL no signal; seated in the system, writing the marker is all it must learn.

Use it from a training config with `graph: colab_graphs.trainers.toy:relay` and `scorer: toy_marker`.
"""

from __future__ import annotations

from colab_graphs.builder import GraphBuilder
from colab_graphs.spec import END, START, GraphSpec
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import Score, register_scorer

MARKER = "k"
"""The policy's part: a string the tiny random policy writes in about one answer in five before training."""

POLICY_PROMPT = "{input}\nYour teammates answered:\n{answers}\nAdd the unit."


def relay(members: list[str], policy: str = "policy", prompt: str = "{input}") -> GraphSpec:
    """Collaborators answer in parallel, then `policy` reads their answers and adds its part; all joined.

    Args:
        policy: the member that speaks last.
        prompt: the collaborators' question template.
    """
    if policy not in members:
        raise ValueError(f"relay: policy member {policy!r} is not in the pool ({', '.join(members)})")
    b = GraphBuilder("relay", members=members, description="collaborators answer, the policy adds its part")
    peers = [m for m in members if m != policy]
    for m in peers:
        b.seat(f"answer_{m}", member=m, prompt=prompt, writes=f"answer:{m}")
    b.seat("add", member=policy, prompt=POLICY_PROMPT, reads={"answers": "answer:*"}, writes="part")
    b.aggregate(
        "final", "concat", reads={"answers": "answer:*", "part": "part?"}, writes="final", separator=" "
    )
    if peers:
        b.fan(START, [f"answer_{m}" for m in peers], join="add")
    else:
        b.edge(START, "add")
    b.edge("add", "final").edge("final", END)
    return b.output("final").build()


@register_scorer("toy_marker")
def toy_marker(output: str, example: Example) -> Score:
    """1 when `output` holds the example's answer and the marker (the example's `marker` field, else MARKER)."""
    marker = str(example.fields.get("marker") or MARKER)
    number = str(example.answer or "")
    return Score(float(bool(number) and number in output and marker in output), output)
