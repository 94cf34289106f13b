"""What differs between the job an output folder holds and the one about to run in it, in words.

A run or audit resumes only the job its folder's log was written for (the fingerprint: protocol, pool,
data, scorer); refusing another one, it says what changed, so a user can tell a typo in a flag from a
deliberate change: ``protocol parameter rounds: 2 -> 3; pool member 'b': temperature 0 -> 0.7; data: 2
example(s) added (q7, q8)``. Secrets never appear: headers hold the public pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from colab_graphs.log.records import ExampleRecord, Header

MAX_NAMED = 5  # ids named per kind of example change; the rest are counted


def _named(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:MAX_NAMED])
    return shown + (f", ... {len(ids) - MAX_NAMED} more" if len(ids) > MAX_NAMED else "")


def _mapping_changes(what: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        if key not in new:
            out.append(f"{what} {key} removed (was {old[key]!r})")
        elif key not in old:
            out.append(f"{what} {key} added ({new[key]!r})")
        elif old[key] != new[key]:
            out.append(f"{what} {key}: {old[key]!r} -> {new[key]!r}")
    return out


def _example_changes(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> list[str]:
    before = {e["id"]: dict(e) for e in old}
    after = {e["id"]: dict(e) for e in new}
    added = [i for i in after if i not in before]
    removed = [i for i in before if i not in after]
    changed = [i for i in after if i in before and before[i] != after[i]]
    parts = [
        f"{len(ids)} example(s) {verb} ({_named(ids)})"
        for ids, verb in ((added, "added"), (removed, "removed"), (changed, "changed"))
        if ids
    ]
    if not parts and [e["id"] for e in old] != [e["id"] for e in new]:
        parts.append("the examples' order")
    return [f"data: {'; '.join(parts)}"] if parts else []


def differences(
    stored: Header,
    current: Header,
    stored_examples: Sequence[Mapping[str, Any]],
    current_examples: Sequence[Mapping[str, Any]],
) -> list[str]:
    """Each difference between the folder's job (`stored`, its examples) and the current one, in words."""
    out = []
    if stored.protocol != current.protocol:
        out.append(f"protocol {stored.protocol!r} -> {current.protocol!r}")
    out += _mapping_changes("protocol parameter", stored.protocol_params, current.protocol_params)
    same_protocol = stored.protocol == current.protocol and stored.protocol_params == current.protocol_params
    if same_protocol and stored.spec != current.spec:
        out.append("the protocol's graph (same name and parameters, other seats or edges)")
    if stored.members != current.members:
        out.append(f"members {stored.members} -> {current.members}")
    for member in [m for m in current.pool if m in stored.pool]:
        out += _mapping_changes(f"pool member {member!r}", stored.pool[member], current.pool[member])
    if stored.scorer != current.scorer:
        out.append(f"scorer {stored.scorer!r} -> {current.scorer!r}")
    out += _example_changes(stored_examples, current_examples)
    return out


def refusal(
    folder: str | Path,
    kind: str,
    stored: Header | None,
    current: Header,
    stored_examples: Sequence[ExampleRecord | Mapping[str, Any]],
    current_examples: Sequence[Any],
) -> str:
    """The error for a folder that holds another job: what it holds and what differs, and what to do."""

    def plain(examples: Sequence[Any]) -> list[dict[str, Any]]:
        rows = [e.model_dump(exclude_none=True) if hasattr(e, "model_dump") else dict(e) for e in examples]
        return [{k: v for k, v in row.items() if k != "type"} for row in rows]

    if stored is None:
        what = "a log this version cannot read as a header"
    else:
        changes = differences(stored, current, plain(stored_examples), plain(current_examples))
        what = "; ".join(changes) or "the same settings written by another version (its fingerprint differs)"
    return f"{folder} holds a different {kind} ({what}); choose another --out or pass --overwrite"
