"""Fitting on a dev split, shared by the API-level methods that learn something per coalition.

`trained_router` and `graph_routing` (`colab_graphs.protocols.api_trained`), `co_llm`
(`colab_graphs.protocols.api_decoding`) and `slm_mux`'s dev-based tie-break (`colab_graphs.protocols.text_select`)
learn from how the coalition's own members do on a dev split (`-P dev=SOURCE`, read as `--data` reads it). Their
fit steps (`colab_graphs.fitting`) use three things from here:

- `dev_examples`: the dev data the protocol's parameters name;
- `solo_outcomes`: one member's replies to the dev questions and their scores (the member answering alone
  through the run's client and call cache, remembered in this process, so the coalitions of an audit that share a
  member ask it once);
- `cached_fit`: a fit stored as JSON under `fits_home()`, keyed by method, the members (their generation settings,
  persona, and for local folders the sha256 of their weights), the dev examples, the scorer and the parameters, so
  no audit fits the same coalition twice. `stats` counts the fits this process computed.

Fit records (the audit report's `fitting.coalitions`) hold `members`, `fitted` (True: computed now; False: found;
None: nothing to fit), `fit_s`, `dev_examples` and `result`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colab_graphs.files import atomic_write_text
from colab_graphs.local.merge import Work, merges_home
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.tasks.example import Example

LOCAL_PREFIX = "local/"
BY_CONTENT = ("dev", "dev_split", "dev_limit")  # the fit key holds the dev examples themselves instead


class FitError(ValueError):
    """A coalition could not be fitted (no dev data, or a dev call failed)."""


stats = Work()  # fits this process computed (a fit found on disk counts nothing) and their seconds


@dataclass(frozen=True)
class DevOutcome:
    """A member's reply to one dev question and the task's score of it."""

    reply: str
    score: float


def fits_home() -> Path:
    """Where fits live: `fits/` under the merge folder (`$COLAB_GRAPHS_MERGE_DIR`), beside the weight-level fits."""
    return merges_home() / "fits"


def protocol_params(spec: Any) -> dict[str, Any]:
    """The protocol's parameters as built (registered defaults overridden by the spec's own)."""
    from colab_graphs.protocol_registry import get_protocol

    return {**get_protocol(spec.name).params, **spec.params}


def dev_examples(name: str, params: dict[str, Any], members: list[str]) -> list[Example]:
    """The dev examples `-P dev=SOURCE` names (split `dev_split`, at most `dev_limit`; 0: all).

    Raises:
        FitError: no dev source given, or it holds no examples.
    """
    source = params.get("dev")
    if not source:
        raise FitError(
            f"{name} fits coalition {members} on a dev split: give -P dev=SOURCE (a file or a source as --data "
            "takes; -P dev_split=NAME picks a split of a file that has several)"
        )
    from colab_graphs.tasks.loaders import load_examples

    limit = int(params.get("dev_limit") or 0) or None
    examples = load_examples(source, split=params.get("dev_split") or None, limit=limit)
    if not examples:
        raise FitError(f"{name}: the dev data {source!r} holds no examples")
    return examples


def member_identity(pool: Pool, name: str) -> dict[str, Any]:
    """What makes a member's replies what they are: generation settings, persona, and a local folder's weights."""
    member = pool[name]
    out: dict[str, Any] = {"settings": member.generation_settings(), "persona": member.system_prompt}
    if member.model.startswith(LOCAL_PREFIX):
        from colab_graphs.local import merge

        # A name served from memory (set_local_model) has no folder: its settings are all there is to key on.
        with contextlib.suppress(FileNotFoundError, merge.MergeError):
            out["weights"] = merge.identity(merge.served_folder(member.model.removeprefix(LOCAL_PREFIX)))
    return out


def digest(blob: Any) -> str:
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:20]


def dev_digest(examples: list[Example]) -> str:
    return digest([e.model_dump() for e in examples])


_outcomes: dict[str, list[DevOutcome]] = {}


async def solo_outcomes(
    pool: Pool,
    member: str,
    examples: list[Example],
    *,
    client: ModelClient,
    scorer: str | None,
    prompt: str,
    name: str,
) -> list[DevOutcome]:
    """`member`'s replies to the dev examples (alone, with `prompt`) and their scores, in dataset order.

    Raises:
        FitError: a dev call failed after retries (the message names the protocol, member and example).
    """
    key = digest([member_identity(pool, member), prompt, dev_digest(examples), scorer])
    if key in _outcomes:
        return _outcomes[key]
    from colab_graphs.compile import compile_graph
    from colab_graphs.protocol_registry import build_protocol
    from colab_graphs.runner import run_example

    spec = build_protocol("solo", pool.names, member=member, prompt=prompt)
    graph = compile_graph(spec, pool, client, fuse=True)
    runs = await asyncio.gather(*(run_example(graph, spec, pool, client, e, scorer) for e in examples))
    failed = [o for o in runs if o.failed]
    if failed:
        raise FitError(f"{name}: {member} failed on dev example {failed[0].example_id}: {failed[0].error}")
    _outcomes[key] = [DevOutcome(str(o.trace.state.get("answer", "")), float(o.score or 0.0)) for o in runs]
    return _outcomes[key]


def fit_key(
    name: str, pool: Pool, members: list[str], examples: list[Example], scorer: str | None, params: dict
) -> str:
    """The key a coalition's fit is stored under."""
    return digest(
        {
            "method": name,
            "members": [[m, member_identity(pool, m)] for m in members],
            "params": {k: v for k, v in params.items() if k not in BY_CONTENT},
            "dev": dev_digest(examples),
            "scorer": scorer,
        }
    )


async def cached_fit(
    name: str, key: str, members: list[str], compute: Callable[[], Awaitable[dict[str, Any]]]
) -> tuple[dict[str, Any], bool, float]:
    """(result, fitted now?, seconds the fit took): the stored fit under `key`, else `compute()` stored."""
    path = fits_home() / f"{name}-{key}.json"
    if path.is_file():
        stored = json.loads(path.read_text())
        return stored["result"], False, float(stored["fit_s"])
    started = time.perf_counter()
    result = await compute()
    fit_s = time.perf_counter() - started
    stats.done += 1
    stats.seconds += fit_s
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"method": name, "members": members, "result": result, "fit_s": round(fit_s, 3)}
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return result, True, fit_s


def record(
    members: list[str], fitted: bool | None, fit_s: float, dev: int, result: dict[str, Any]
) -> dict[str, Any]:
    """A coalition's fit record for the audit report (see `colab_graphs.fitting.Fitted`)."""
    return {
        "members": list(members),
        "fitted": fitted,
        "fit_s": round(fit_s, 3),
        "dev_examples": dev,
        "result": result,
    }
