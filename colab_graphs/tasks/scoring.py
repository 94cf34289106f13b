"""Scorers by name (kind "task" of the one registry: a scorer name names a task type), and which one an example calls for.

A scorer name (`--scorer`, an example's `scorer` field) names a task type (`colab_graphs.tasks.task_types`), which
owns extraction, comparison, prompting and scoring for that kind of task. `register_scorer` also takes a plain
scorer function `(output, example) -> Score | float` (sync or async): it gets short-text extraction.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from colab_graphs.registry import registry_add, registry_lookup, registry_names, source_of
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.task_types import CodeTask, Score, ScorerFn, ScorerTask, TaskType, TaskView

__all__ = [
    "Score",
    "ScorerFn",
    "apply_scorer",
    "default_scorer_name",
    "get_scorer",
    "get_task",
    "register_scorer",
    "register_task",
    "scorer_names",
    "task_for",
    "view_for",
]

# MoCo's `task_type` field (a file-level key its loader copies onto each record) -> scorer name.
MOCO_TASK_TYPES = {"coding": "code", "multiple_choice": "multiple_choice", "f1_match": "f1"}


def register_task(task: TaskType) -> TaskType:
    """Register a task type under its `name`; a name another source registered is a `NameClash` naming both
    (`colab_graphs.registry.registry_add`). The source is the task's class, or a plain scorer's function."""
    source = source_of(task.fn) if isinstance(task, ScorerTask) else None
    registry_add("task", task.name, task, source=source)
    return task


def register_scorer(name: str) -> Callable[[ScorerFn], ScorerFn]:
    """Register a plain scorer function under `name` (decorator); it extracts answers as short text."""

    def decorate(fn: ScorerFn) -> ScorerFn:
        register_task(ScorerTask(name, fn))
        return fn

    return decorate


def scorer_names() -> list[str]:
    return registry_names("task")


def get_task(name: str) -> TaskType:
    task: TaskType = registry_lookup("task", name).obj  # `register_task` stores only TaskType objects
    return task


def get_scorer(name: str) -> ScorerFn:
    """The scoring function of task type `name`: `(output, example) -> Score` (async for `code`)."""
    return get_task(name).score


def default_scorer_name(example: Example) -> str:
    """The scorer an example's fields call for when the user names none.

    An explicit `scorer` field wins; then `test` -> code, `choices` -> multiple_choice; then MoCo's `task_type`
    (exact_match is numeric when the gold answer is a number, exact when it is plain words or symbols, so word
    order counts and a sorted word list or `) ) }` compares as text, else math, which compares by math-verify);
    then a numeric answer -> numeric; else exact.
    """
    named = example.fields.get("scorer")
    if isinstance(named, str) and named:
        return named
    if example.test is not None:
        return "code"
    if example.fields.get("choices") is not None:
        return "multiple_choice"
    from colab_graphs.tasks.answers import is_plain_text, parse_number

    numeric = example.answer is not None and parse_number(example.answer) is not None
    task_type = example.fields.get("task_type")
    if task_type in MOCO_TASK_TYPES:
        return MOCO_TASK_TYPES[task_type]
    if task_type == "exact_match":
        return "numeric" if numeric else "exact" if is_plain_text(example.answer or "") else "math"
    return "numeric" if numeric else "exact"


def task_for(example: Example, scorer: str | ScorerFn | TaskType | None = None) -> TaskType:
    """The task type for `example`: the one named (or a scorer function wrapped), else its fields' default."""
    if isinstance(scorer, TaskType):
        return scorer
    if callable(scorer):
        return ScorerTask(getattr(scorer, "__name__", "custom"), scorer)
    return get_task(scorer or default_scorer_name(example))


def view_for(example: Example, scorer: str | ScorerFn | TaskType | None = None) -> TaskView:
    """`task_for` bound to the example: what a run hands its protocol."""
    return TaskView(task_for(example, scorer), example)


async def apply_scorer(scorer: ScorerFn, output: str, example: Example) -> Score:
    result: Any = scorer(output, example)
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, Score):
        return result
    return Score(float(result))


def scores_code(examples: Iterable[Example], scorer: str | None = None) -> bool:
    """Whether any example is scored by the `code` task (its test runs the reply's code)."""
    return any(isinstance(task_for(e, scorer), CodeTask) for e in examples)


def require_sandbox(
    examples: Iterable[Example], scorer: str | None = None, setting: str | None = None
) -> dict[str, Any] | None:
    """Before the first model call: the sandbox record when any example is scored by code, else None.

    Raises:
        SandboxUnavailable: the setting (`setting`, else the one in force, `colab_graphs.sandbox.scope`) cannot
            be met here, or its backend failed a known-good answer; the message says what is missing and the
            ways out. Nothing has run.
    """
    from colab_graphs.sandbox import scope

    if not scores_code(examples, scorer):
        return None
    return scope.probe(scope.normalize(setting) or scope.current())
