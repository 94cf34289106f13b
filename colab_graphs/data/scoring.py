"""Scorer registry, answer extraction, and the two scorers every run needs: exact match and numeric.

A scorer is any callable `(output, example) -> Score | float`, sync or async, registered by name. The richer
scorers (math equivalence, multiple choice, code, LLM judge) live in their own modules and register here.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from colab_graphs.data.example import Example


@dataclass(frozen=True)
class Score:
    """A scorer's verdict on one output: a value in [0, 1] and the answer it extracted."""

    value: float
    extracted: str | None = None


ScorerFn = Callable[[str, Example], "Score | float | Awaitable[Score | float]"]

_SCORERS: dict[str, ScorerFn] = {}


def register_scorer(name: str) -> Callable[[ScorerFn], ScorerFn]:
    """Register a scorer under `name` (decorator)."""

    def decorate(fn: ScorerFn) -> ScorerFn:
        _SCORERS[name] = fn
        return fn

    return decorate


def _load_builtin_scorers() -> None:
    # Modules that register more scorers; imported lazily so `import colab_graphs` stays light.
    import importlib

    for module in ("colab_graphs.data.scorers",):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def scorer_names() -> list[str]:
    _load_builtin_scorers()
    return sorted(_SCORERS)


def get_scorer(name: str) -> ScorerFn:
    _load_builtin_scorers()
    try:
        return _SCORERS[name]
    except KeyError:
        raise KeyError(f"unknown scorer {name!r}; known scorers: {', '.join(sorted(_SCORERS))}") from None


def default_scorer_name(example: Example) -> str:
    """The scorer an example's fields call for when the user names none (an explicit `scorer` field wins)."""
    named = example.fields.get("scorer")
    if isinstance(named, str) and named:
        return named
    if example.test is not None:
        return "code"
    if example.fields.get("choices") is not None:
        return "multiple_choice"
    if example.answer is not None and _parse_number(example.answer) is not None:
        return "numeric"
    return "exact"


async def apply_scorer(scorer: ScorerFn, output: str, example: Example) -> Score:
    result: Any = scorer(output, example)
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, Score):
        return result
    return Score(float(result))


# --- answer extraction -------------------------------------------------------------------------------------

_ANSWER_MARK = re.compile(r"(?:final\s+answer|answer)\s*(?:is|:)\s*[:\-]?\s*", re.IGNORECASE)
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def extract_answer(text: str) -> str:
    """The answer a model's output commits to: `\\boxed{}`, then "the answer is X", then the last number.

    Falls back to the last non-empty line, so short outputs ("Paris") are their own answer.
    """
    text = text or ""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    # The last "answer is" / "answer:" wins ("Final answer: The answer is 3." commits to 3).
    for mark in reversed(list(_ANSWER_MARK.finditer(text))):
        rest = text[mark.end() :].strip()
        candidate = rest.splitlines()[0].strip(" .*`\"'") if rest else ""
        if candidate:
            return candidate
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def normalize_answer(answer: str) -> str:
    """Canonical form for comparing answers: case, surrounding punctuation, spacing, numeric formatting."""
    a = (answer or "").strip().strip("$ .*`\"'").lower()
    a = re.sub(r"\s+", " ", a)
    number = _parse_number(a)
    if number is not None:
        return _format_number(number)
    return a


def _parse_number(text: str) -> Decimal | None:
    t = (text or "").strip().strip("$ ").replace(",", "")
    t = t.rstrip(".").removesuffix("%")
    if "/" in t:
        num, _, den = t.partition("/")
        try:
            d = Decimal(den)
            return Decimal(num) / d if d != 0 else None
        except InvalidOperation:
            return None
    try:
        value = Decimal(t)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def _format_number(value: Decimal) -> str:
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


# --- the two scorers a run always has ----------------------------------------------------------------------


@register_scorer("exact")
def exact_match(output: str, example: Example) -> Score:
    """1 when the extracted answer equals the gold answer after normalisation."""
    if example.answer is None:
        raise ValueError(f"example {example.id!r} has no 'answer' field; the 'exact' scorer needs one")
    extracted = extract_answer(output)
    return Score(float(normalize_answer(extracted) == normalize_answer(example.answer)), extracted)


@register_scorer("numeric")
def numeric_match(output: str, example: Example, rel_tol: float = 1e-6) -> Score:
    """1 when the extracted number equals the gold number (thousands commas, `$`, fractions tolerated)."""
    if example.answer is None:
        raise ValueError(f"example {example.id!r} has no 'answer' field; the 'numeric' scorer needs one")
    extracted = extract_answer(output)
    got, want = _parse_number(extracted), _parse_number(example.answer)
    if got is None or want is None:
        return Score(float(normalize_answer(extracted) == normalize_answer(example.answer)), extracted)
    close = abs(got - want) <= Decimal(str(rel_tol)) * max(Decimal(1), abs(want))
    return Score(float(close), extracted)
