"""No silent wrong numbers: a protocol's mechanism that found nothing to work on says so.

A router decides from something in a reply (a cascade's "Confidence: 0.8", a router's member name). When that
something is missing it falls back (a cascade defers, a router takes its default), which is right for one
reply and wrong for a whole run: a cascade whose members never state a confidence defers at every stage, so
v(all) is the last member's score and the audit measures a protocol that never ran as designed.

Each play records, per routing node, how many decisions it made (`ran`) and how many of them found nothing
(one count per note text) in its `mechanism` field (a trace extra, kept in traces.jsonl and the log).
`mechanism_notes` sums them over plays for `summary.json` / `report.json` (`notes`), and `warnings` words the
ones that fired on every decision, which the CLI prints and report.md lists.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from colab_graphs.trace import Trace

RAN = "ran"


def _counts(trace: Trace, node: str) -> dict[str, int]:
    extra = trace.model_extra if trace.model_extra is not None else {}
    table = extra.setdefault("mechanism", {})
    counts: dict[str, int] = table.setdefault(node, {})
    return counts


def decided(trace: Trace | None, node: str, found_nothing: str | None = None) -> None:
    """Record one decision of routing node `node` in `trace`; `found_nothing`: what it lacked, when it fell
    back for want of it (e.g. "found no confidence in the reply, so it deferred")."""
    if trace is None:
        return
    counts = _counts(trace, node)
    counts[RAN] = counts.get(RAN, 0) + 1
    if found_nothing:
        counts[found_nothing] = counts.get(found_nothing, 0) + 1


def mechanism_notes(plays: Iterable[Trace]) -> list[dict[str, Any]]:
    """Per (node, note): `{"node", "note", "decisions", "of"}`: how many of the node's decisions over `plays`
    found nothing, of how many it made. Nodes in first-seen order; [] when nothing was ever missing."""
    tally = NoteTally()
    for play in plays:
        tally.add(play)
    return tally.notes()


class WithExtra(Protocol):
    """A play as the notes read it (a `Trace`, or a play cache's `ServedPlay`): its extra fields."""

    @property
    def model_extra(self) -> dict[str, Any] | None: ...


class NoteTally:
    """`mechanism_notes` as a running total: plays added as they finish, not kept."""

    def __init__(self) -> None:
        self.ran: dict[str, int] = {}
        self.missing: dict[tuple[str, str], int] = {}

    def add(self, play: WithExtra) -> None:
        table = (play.model_extra or {}).get("mechanism") or {}
        for node, counts in table.items():
            self.ran[node] = self.ran.get(node, 0) + int(counts.get(RAN, 0))
            for note, k in counts.items():
                if note != RAN:
                    self.missing[(node, note)] = self.missing.get((node, note), 0) + int(k)

    def notes(self) -> list[dict[str, Any]]:
        return [
            {"node": node, "note": note, "decisions": k, "of": self.ran.get(node, 0)}
            for (node, note), k in self.missing.items()
        ]


def warnings(protocol: str, notes: Iterable[dict[str, Any]]) -> list[str]:
    """The notes that fired on every decision of their node, in words: the protocol did not work as designed
    on this data (its values measure the fallback)."""
    return [
        f"{protocol}: node {n['node']!r} {n['note']} in every one of its {n['of']} decision(s); the protocol "
        "fell back every time, so its score measures the fallback, not the mechanism"
        for n in notes
        if n["of"] and n["decisions"] >= n["of"]
    ]
