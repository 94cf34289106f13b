"""What would stop a record from being scored, found when its file loads: before any model call is made.

A scoring-time data error (a missing answer, an answer letter that is not among the choices, a coding record
whose test is empty) would otherwise stop a run after its model calls were paid for, or worse score silently:
an empty test passes any code, a gold that normalises to nothing matches every answer. The loaders call
`record_problems` on every record with the scorer it will be scored by (the one named, else the record's
default) and raise one `DatasetError` listing every problem with its file, line or record, and field.

A task type of a plugin may define `problems(example) -> list[str]` to be checked the same way; a plain
scorer function (`register_scorer`) is not checked, since what it reads is its own business.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from colab_graphs.tasks import answers
from colab_graphs.tasks.example import DatasetError, Example
from colab_graphs.tasks.task_types import (
    BUILTIN_TASKS,
    CodeTask,
    MultipleChoiceTask,
    ReasoningGymTask,
    ScorerTask,
    TaskType,
)

_SHOWN = 50  # problems listed in one error; the rest are counted


def task_named(name: str) -> TaskType:
    """The task type registered as `name` (built-ins without loading plugins)."""
    for task in BUILTIN_TASKS:
        if task.name == name:
            return task
    from colab_graphs.tasks.scoring import get_task

    return get_task(name)


def record_problems(example: Example, scorer: str | None = None) -> list[str]:
    """Why `example` could not be scored by `scorer` (None: the scorer its fields call for), as
    ``field 'NAME': what is wrong`` strings; [] when nothing stops it."""
    from colab_graphs.tasks.scoring import default_scorer_name

    name = scorer or default_scorer_name(example)
    try:
        task = task_named(name)
    except KeyError as err:
        return [f"field 'scorer': {err.args[0]}"]
    problems = _tolerance_problems(example)
    own = getattr(task, "problems", None)
    if callable(own):
        return problems + list(own(example))
    if isinstance(task, ScorerTask):
        return problems
    if isinstance(task, CodeTask):
        if example.test is None:
            problems.append("field 'test': missing; the 'code' scorer runs the record's test")
        elif not example.test.strip():
            problems.append("field 'test': empty; a test that checks nothing would pass any code")
        return problems
    if isinstance(task, ReasoningGymTask):
        missing = [f for f in ("rg_entry", "rg_task") if example.fields.get(f) is None]
        return problems + [
            f"field {f!r}: missing; only reasoning-gym's own records score by it" for f in missing
        ]
    if isinstance(task, MultipleChoiceTask):
        return problems + _choice_problems(example)
    if example.answer is None:
        problems.append(f"field 'answer': missing; the {name!r} scorer compares replies with it")
    elif not example.answer.strip():
        problems.append("field 'answer': empty; every reply would be compared with nothing")
    return problems


def _choice_problems(example: Example) -> list[str]:
    choices = example.fields.get("choices")
    if not choices:
        return ["field 'choices': missing; a multiple-choice record needs its options"]
    if not isinstance(choices, Sequence) or isinstance(choices, str):
        return [f"field 'choices': expected a list of options, got {type(choices).__name__}"]
    if len(choices) > len(answers.LETTERS):
        return [
            f"field 'choices': {len(choices)} options; at most {len(answers.LETTERS)} (A-Z) are supported"
        ]
    if example.answer is None:
        return ["field 'answer': missing; a multiple-choice record needs the right option"]
    if answers.choice_letter(example.answer, [str(c) for c in choices]) is None:
        last = answers.LETTERS[len(choices) - 1]
        return [f"field 'answer': {example.answer!r} is not one of its {len(choices)} choices (A-{last})"]
    return []


def _tolerance_problems(example: Example) -> list[str]:
    problems = []
    for field in ("rel_tol", "abs_tol"):
        value = example.fields.get(field)
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not (math.isfinite(number) and number >= 0) or isinstance(value, bool):
            problems.append(f"field {field!r}: {value!r} is not a number >= 0")
    return problems


def check_examples(examples: Sequence[Example], scorer: str | None, source: str) -> None:
    """Raise one `DatasetError` listing every problem of `examples` (see `record_problems`), each naming the
    example's index and id."""
    raise_problems(
        source,
        [
            f"{source} example {i} (id {e.id!r}): {p}"
            for i, e in enumerate(examples)
            for p in record_problems(e, scorer)
        ],
    )


def raise_problems(source: str, problems: list[str]) -> None:
    """Raise one `DatasetError` listing `problems` (each naming its line or record), if there are any."""
    if not problems:
        return
    if len(problems) == 1:
        raise DatasetError(problems[0])
    shown = "\n".join(f"  {p}" for p in problems[:_SHOWN])
    more = f"\n  ... and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
    raise DatasetError(f"{source}: {len(problems)} problems; nothing was run:\n{shown}{more}")
