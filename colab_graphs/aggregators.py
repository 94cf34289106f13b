"""Pure-Python aggregators and routers that graph specs name by string.

An aggregator takes the values its node reads (a string for an exact read, a list of strings for a pattern read,
in pool order) and returns the text it writes. A router takes the node's view of the state and returns a key of
its route's `path_map`. Register your own with `@aggregator("name")` / `@router("name")`.

Whatever depends on what an answer is (extracting it from a reply, telling whether two answers are the same)
is asked of the run's task: aggregators receive it as the keyword `task` (a `TaskView`: the task type bound to
the example; see `colab_graphs.tasks.task_types`), routers as `view["task"]`. Code stays code, a letter a letter.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from colab_graphs.registry import aggregator, registry_lookup, router
from colab_graphs.tasks.task_types import TaskView

AggregatorFn = Callable[..., str]
RouterFn = Callable[..., str]

__all__ = ["aggregator", "get_aggregator", "get_router", "router"]


def get_aggregator(name: str) -> AggregatorFn:
    fn: AggregatorFn = registry_lookup("aggregator", name).obj
    return fn


def get_router(name: str) -> RouterFn:
    fn: RouterFn = registry_lookup("router", name).obj
    return fn


def _items(inputs: dict[str, Any]) -> list[str]:
    """All values read, flattened in read order (pattern reads contribute their list)."""
    out: list[str] = []
    for value in inputs.values():
        if isinstance(value, list):
            out.extend(str(v) for v in value)
        elif value is not None:
            out.append(str(value))
    return out


@aggregator("vote")
def vote(inputs: dict[str, Any], *, task: TaskView, **_: Any) -> str:
    """Majority vote over the answers the values read commit to (see `TaskView.vote`; ties: pool order)."""
    return task.vote(_items(inputs))


def _pick(items: list[str], task: TaskView, extract: bool) -> str:
    for item in items:
        if item.strip():
            return (task.extract(item) or "") if extract else item
    return ""


@aggregator("first")
def first(inputs: dict[str, Any], *, task: TaskView, extract: bool = False, **_: Any) -> str:
    """The first non-empty value read (pool order); with `extract`, the answer it commits to ("" if none)."""
    return _pick(_items(inputs), task, extract)


@aggregator("last")
def last(inputs: dict[str, Any], *, task: TaskView, extract: bool = False, **_: Any) -> str:
    """The last non-empty value read; with `extract`, the answer it commits to ("" if none)."""
    return _pick(_items(inputs)[::-1], task, extract)


@aggregator("concat")
def concat(inputs: dict[str, Any], separator: str = "\n\n", **_: Any) -> str:
    """Every value read, joined."""
    return separator.join(i for i in _items(inputs) if i.strip())


@aggregator("extract")
def extract(inputs: dict[str, Any], *, task: TaskView, **_: Any) -> str:
    """The answer the (single, or last) value read commits to, as the task extracts it ("" if none)."""
    items = _items(inputs)
    return (task.extract(items[-1]) or "") if items else ""


@router("match_name")
def match_name(view: dict[str, Any], path_map: dict[str, str], **_: Any) -> str:
    """The path_map key mentioned earliest in the routed text (case-insensitive, whole word); none: "" (the
    route's default), noted as lacking (`colab_graphs.mechanism`)."""
    text = str(view.get("text") or "")
    best: tuple[int, str] | None = None
    for key in path_map:
        m = re.search(rf"(?<![A-Za-z0-9_]){re.escape(key)}(?![A-Za-z0-9_])", text, re.IGNORECASE)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), key)
    if best is None:
        view["lacking"] = "found no route's name in the reply, so it took its default route"
    return best[1] if best else ""


_CONFIDENCE = re.compile(r"confidence\s*[:=]?\s*(\d+(?:\.\d+)?)\s*(%)?", re.IGNORECASE)


def self_reported_confidence(text: str) -> float | None:
    """ "Confidence: 0.8" / "confidence 80%" / "Confidence: 8/10"-style statements, as a number in [0, 1]."""
    m = _CONFIDENCE.search(text or "")
    if not m:
        return None
    value = float(m.group(1))
    if m.group(2) or value > 1:
        value = value / 100 if value > 10 or m.group(2) else value / 10
    return max(0.0, min(1.0, value))


@router("confidence")
def confidence(
    view: dict[str, Any], path_map: dict[str, str], threshold: float = 0.7, signal: str = "auto", **_: Any
) -> str:
    """'accept' when the stage committed to an answer (as the task extracts it) and is confident, else 'defer'.

    `signal` says what confidence is read from: "logprob" (the mean token probability the seat recorded),
    "self_reported" (a "Confidence: 0.8" statement in the text; local models always record logprobs, so a
    self-reporting protocol must say so), or "auto" (logprob when recorded, else self-reported). No signal
    at all defers, and is noted as lacking (`colab_graphs.mechanism`: a cascade that always defers is
    reported).
    """
    import math

    if signal not in ("auto", "logprob", "self_reported"):
        raise ValueError(f"confidence router: signal must be auto, logprob or self_reported, got {signal!r}")
    logprob = view.get("logprob")
    score: float | None = None
    if signal != "self_reported" and logprob is not None:
        score = math.exp(float(logprob))
    elif signal != "logprob":
        score = self_reported_confidence(str(view.get("text") or ""))
    task = view.get("task")
    answered = task is None or task.extract(str(view.get("text") or "")) is not None
    if score is None and answered:
        source = (
            "no confidence statement ('Confidence: 0.8')" if signal == "self_reported" else "no confidence"
        )
        view["lacking"] = f"found {source} in the reply, so it deferred"
    return "accept" if answered and score is not None and score >= threshold else "defer"
