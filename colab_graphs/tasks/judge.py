"""An LLM judge: a model grades an output against the gold answer and/or a rubric.

The judge is asked to reason briefly and end with one verdict line, in one of these forms (the last one in the
reply counts; case and surrounding markdown are ignored):

- ``VERDICT: CORRECT`` -> 1.0, ``VERDICT: PARTIAL`` -> 0.5, ``VERDICT: INCORRECT`` -> 0.0
- ``SCORE: x`` with x a number in [0, 1] (e.g. ``SCORE: 0.75``) -> x

A reply with neither scores 0 and records ``unparseable: <reply>`` in `Score.extracted`, so a run can tell a
judge that failed to follow the format from an answer that was judged wrong. A parsed reply records the
verdict (``CORRECT``, ``SCORE: 0.75``...).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import Score

Complete = Callable[[list[dict[str, Any]]], Awaitable[str]]
JudgeScorer = Callable[[str, Example], Awaitable[Score]]

DEFAULT_RUBRIC = (
    "The response is CORRECT if its final answer means the same as the reference answer (equivalent forms, "
    "units and formatting differences are fine), INCORRECT if it differs or gives no final answer, and "
    "PARTIAL only if it is right in part."
)

_SYSTEM = (
    "You are a strict, impartial grader. Judge only the response's final answer against the reference and "
    "rubric; ignore style and length. Think in at most a few sentences, then end your reply with exactly one "
    "line: 'VERDICT: CORRECT', 'VERDICT: PARTIAL' or 'VERDICT: INCORRECT'."
)

_VERDICT = re.compile(r"VERDICT\s*[:=]\s*\**\s*(CORRECT|INCORRECT|PARTIAL)\b", re.IGNORECASE)
_SCORE = re.compile(r"SCORE\s*[:=]\s*\**\s*([01](?:\.\d+)?|\.\d+)(?!\d)", re.IGNORECASE)
_VALUES = {"CORRECT": 1.0, "PARTIAL": 0.5, "INCORRECT": 0.0}


def make_judge_scorer(complete: Complete, rubric: str | None = None) -> JudgeScorer:
    """An async scorer that asks a model, through `complete`, to grade an output.

    Args:
        complete: sends chat messages (``[{"role": ..., "content": ...}]``) to the judge model and returns its
            reply text; e.g. a pool member's call wrapper.
        rubric: grading instructions; an example's own `rubric` field wins, then this, then `DEFAULT_RUBRIC`.

    Returns:
        `scorer(output, example) -> Score`; see the module docstring for the verdict format.

    Example:
        >>> async def complete(messages): return "Both say 4.\\nVERDICT: CORRECT"
        >>> import asyncio
        >>> asyncio.run(make_judge_scorer(complete)("2+2 is 4", Example(id="1", input="2+2?", answer="4")))
        Score(value=1.0, extracted='CORRECT')
    """

    async def judge(output: str, example: Example) -> Score:
        reply = await complete(judge_messages(output, example, rubric))
        return parse_verdict(reply)

    return judge


def judge_messages(output: str, example: Example, rubric: str | None = None) -> list[dict[str, Any]]:
    """The chat messages the judge receives for one output."""
    criteria = example.fields.get("rubric") or rubric or DEFAULT_RUBRIC
    parts = [f"## Task\n{example.input}"]
    if example.answer is not None:
        parts.append(f"## Reference answer\n{example.answer}")
    parts += [f"## Rubric\n{criteria}", f"## Response to grade\n{output}"]
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def parse_verdict(reply: str) -> Score:
    """The score in a judge's reply: its last VERDICT or SCORE line; 0 (recorded as unparseable) otherwise."""
    reply = reply or ""
    found = [(m.start(), m) for m in _VERDICT.finditer(reply)] + [
        (m.start(), m) for m in _SCORE.finditer(reply)
    ]
    if not found:
        return Score(0.0, f"unparseable: {reply[:500]}")
    match = max(found, key=lambda item: item[0])[1]
    if match.re is _VERDICT:
        verdict = match.group(1).upper()
        return Score(_VALUES[verdict], verdict)
    value = float(match.group(1))
    if not 0.0 <= value <= 1.0:
        return Score(0.0, f"unparseable: {reply[:500]}")
    return Score(value, f"SCORE: {match.group(1)}")
