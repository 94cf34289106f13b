"""Mentor collaboration (API level): a mentor steps into a student's answer at decision points.

`mentor_collab` (MoCo's name) has a student write an answer part by part; at some parts (a `decision_proportion`
of them) the mentor proposes its own next part too, and when the two differ the student chooses which one to
continue from. MoCo runs it word by word on local models (MentorCollab's free mode: at a random quarter of the
words, a 16-token patch from each, chosen by the generator); over chat endpoints a part is a step the model
writes when asked to continue the answer so far, so the same protocol runs on any pool.

Coalitions: without the mentor, the student writes every part alone (no decision points); without the student,
the mentor writes every part (it takes the student's seats; at a decision point both proposals are the same
request, so there is nothing to choose); members other than the two take no part; the empty coalition scores 0.
"""

from __future__ import annotations

import re
from typing import Any

from colab_graphs.aggregators import aggregator, router
from colab_graphs.builder import GraphBuilder
from colab_graphs.registry import protocol
from colab_graphs.spec import END, START, GraphSpec

DONE = "[DONE]"

STEP_PROMPT = (
    "{input}\n\n"
    "You are writing the answer to this step by step. The answer so far:\n"
    "---\n{partial}\n---\n"
    "Write only the next step; do not repeat what is written. If your step completes the answer, finish it as "
    "asked ({answer_format}) and end with a line of its own: " + DONE
)

CHOICE_PROMPT = (
    "{input}\n\n"
    "The answer so far:\n---\n{partial}\n---\n"
    "Two candidates for its next step:\nOption (A):\n{a}\n\nOption (B):\n{b}\n\n"
    "Which option is more likely to lead to the correct answer? Reply with one line: Option (A) or Option (B)."
)

_OPTION = re.compile(r"\boption\s*\(?\s*([AB])\s*\)?(?![A-Za-z0-9])", re.IGNORECASE)
_BARE = re.compile(r"^\(?([AB])\)?[.!]?$")


def chosen_option(reply: str) -> str | None:
    """The option the reply commits to, "A" or "B" ("Option (B)", "option A", a reply that is just "B."), or None.

    Only an explicit commitment counts: a letter somewhere in prose is not a choice.
    """
    found = {m.upper() for m in _OPTION.findall(reply or "")}
    if len(found) == 1:
        return found.pop()
    bare = _BARE.match((reply or "").strip())
    return bare.group(1) if bare and not found else None


def _decisions(steps: int, proportion: float) -> list[bool]:
    """Which steps are decision points: evenly spread, the first one included (`proportion` of them, rounded up)."""
    if proportion <= 0:
        return [False] * steps
    return [k == 0 or int(k * proportion) > int((k - 1) * proportion) for k in range(steps)]


@protocol(
    "mentor_collab",
    family="api",
    description="A student writes an answer step by step; at decision points a mentor proposes its own next step "
    "and the student chooses which to keep.",
    min_members=1,
)
def mentor_collab(
    members: list[str],
    student: str | None = None,
    mentor: str | None = None,
    max_steps: int = 6,
    decision_proportion: float = 0.25,
    patch_size: int = 0,
    prompt: str = STEP_PROMPT,
    choice_prompt: str = CHOICE_PROMPT,
) -> GraphSpec:
    """MentorCollab (Wang et al., 2026, "MentorCollab: Selective Large-to-Small Inference-Time Guidance for
    Efficient Reasoning"): a mentor intervenes in a student's generation only at some points, and the student
    decides whether to follow it.

    Step k: the student writes the next step of the answer so far; at a decision step the mentor writes its
    own next step from the same answer so far, and when the two differ the student is shown both (Option A:
    its own, Option B: the mentor's) and chooses (no explicit choice: its own). The answer ends when a step
    ends with "[DONE]" or after `max_steps`; the task extracts the answer from the steps written. Decision
    steps are spread evenly, the first step included (MoCo draws them at random).

    Coalitions: without the mentor the student writes alone; without the student the mentor writes alone;
    other members take no part; empty: 0.

    Args:
        student: the member that writes and chooses (default: the first in pool order; MoCo's generator).
        mentor: the member that proposes at decision steps (default: the next one; MoCo's mentor).
        max_steps: most steps in an answer.
        decision_proportion: fraction of the steps at which the mentor proposes, in [0, 1] (MoCo: 25%).
        patch_size: most tokens of a step (0: the model ends its step; MoCo's patches are 16 tokens).
        prompt: the step template; `{partial}` is the answer so far.
        choice_prompt: the student's choice template; `{a}` its own step, `{b}` the mentor's.
    """
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"mentor_collab: max_steps must be an integer >= 1, got {max_steps!r}")
    if not 0.0 <= decision_proportion <= 1.0:
        raise ValueError(f"mentor_collab: decision_proportion must be in [0, 1], got {decision_proportion!r}")
    if patch_size < 0:
        raise ValueError(f"mentor_collab: patch_size must be >= 0, got {patch_size!r}")
    student = student or members[0]
    if mentor is None:
        mentor = next((m for m in members if m != student), student)
    unknown = [m for m in (student, mentor) if m not in members]
    if unknown:
        raise ValueError(
            f"mentor_collab: member(s) {', '.join(map(repr, unknown))} not in the pool ({', '.join(members)})"
        )
    pair = [student] if mentor == student else [student, mentor]
    b = GraphBuilder(
        "mentor_collab", members=[m for m in members if m in pair], description="a mentor steps in"
    )
    settings = {"max_tokens": patch_size} if patch_size else {}
    decisions = _decisions(max_steps, decision_proportion) if len(pair) == 2 else [False] * max_steps
    b.edge(START, "draft_0")
    for k, decision in enumerate(decisions):
        draft, part, own, other = f"draft_{k}", f"part_{k}", f"cand:{k:03d}:a", f"cand:{k:03d}:b"
        b.aggregate(draft, "concat", reads={"parts": "part:*"}, writes=f"draft:{k}", separator="\n")
        step = {"prompt": prompt, "reads": {"partial": f"draft:{k}"}, "settings": settings}
        # Without the student, the mentor takes its seats (and its proposals are then the same requests).
        b.seat(
            f"student_{k}", member=student, writes=own, on_absent="substitute", substitutes=[mentor], **step
        )
        b.aggregate(
            part,
            "mentor_pick",
            reads={"choice": f"choice:{k}?", "a": own, "b": f"{other}?"},
            writes=f"part:{k:03d}",
        )
        b.edge(draft, f"student_{k}")
        if decision:
            b.seat(f"mentor_{k}", member=mentor, writes=other, **step)
            b.seat(
                f"choose_{k}",
                member=student,
                prompt=choice_prompt,
                reads={"partial": f"draft:{k}", "a": own, "b": f"{other}?"},
                writes=f"choice:{k}",
                role="student's choice",
            )
            b.aggregate(f"compare_{k}", "concat", reads={"a": own, "b": f"{other}?"}, writes=f"compare:{k}")
            b.edge(draft, f"mentor_{k}").edge([f"student_{k}", f"mentor_{k}"], f"compare_{k}")
            b.route(f"compare_{k}", "mentor_options", {"choose": f"choose_{k}", "keep": part}, a=own, b=other)
            b.edge(f"choose_{k}", part)
        else:
            b.edge(f"student_{k}", part)
        if k + 1 < max_steps:
            b.route(
                part, "mentor_done", {"done": "answer", "more": f"draft_{k + 1}"}, default=f"draft_{k + 1}"
            )
        else:
            b.edge(part, "answer")
    b.aggregate("answer", "mentor_answer", reads={"parts": "part:*"}, writes="answer")
    b.aggregate("final", "extract", reads={"answer": "answer"}, writes="final")
    b.edge("answer", "final").edge("final", END)
    return b.output("final").build()


def _clean(text: str) -> str:
    return (text or "").replace(DONE, "").rstrip()


@router("mentor_options")
def mentor_options(view: dict[str, Any], path_map: dict[str, str], a: str, b: str, **_: Any) -> str:
    """'choose' when both proposals were written and differ; 'keep' (the student's) otherwise."""
    values = view.get("values") or {}
    own, other = str(values.get(a) or "").strip(), str(values.get(b) or "").strip()
    return "choose" if own and other and own != other else "keep"


@router("mentor_done")
def mentor_done(view: dict[str, Any], path_map: dict[str, str], **_: Any) -> str:
    """'done' when the last step written ends the answer ("[DONE]") or adds nothing, else 'more'."""
    values = view.get("values") or {}
    parts = sorted(k for k in values if k.startswith("part:"))
    last = str(values[parts[-1]]) if parts else ""
    return "done" if DONE in last or not last.strip() else "more"


@aggregator("mentor_pick")
def mentor_pick(inputs: dict[str, Any], **_: Any) -> str:
    """The step kept: the mentor's ("b") when the student chose Option B and the mentor wrote one, else its own."""
    own, other = str(inputs.get("a") or ""), str(inputs.get("b") or "")
    return other if other.strip() and chosen_option(str(inputs.get("choice") or "")) == "B" else own


@aggregator("mentor_answer")
def mentor_answer(inputs: dict[str, Any], **_: Any) -> str:
    """The steps written, in order, joined by newlines, without the "[DONE]" marker."""
    parts = inputs.get("parts") or []
    return "\n".join(_clean(p) for p in parts if _clean(p).strip())
