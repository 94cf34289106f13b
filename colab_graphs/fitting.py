"""Per-coalition fitting: protocols whose coalitions must be built, trained or searched before they run.

The fit stage of the pipeline spec -> coalition -> fit -> compile. A protocol declares its fit step where it
is registered, `@protocol(..., fit=step)`; `fit_coalition(spec, pool, ...)` runs it on one coalition's spec
(the protocol restricted to that coalition) and returns the spec to compile, with a record of what fitting did
and cost. The coalition game runs it once per coalition before any call, so a coalition
without a member fits without it; `colab-graphs run` runs it for the whole pool. A step caches its own
artefacts (keyed by protocol, coalition, dev data and parameters), so an audit never fits a coalition that an
earlier run fitted; its record says whether it did the work (`fitted`, `merged`) or found it (`reused`).

A step is `async step(spec, pool, *, client, scorer) -> Fitted` (or None: nothing to fit for these
parameters); the built-in ones are the weight-level merges and the dev-split fits of the trained API- and
text-level protocols.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import get_protocol
from colab_graphs.spec import GraphSpec

if TYPE_CHECKING:
    from colab_graphs.runner import ExampleOutcome
    from colab_graphs.tasks.example import Example


@dataclass
class Fitted:
    """One coalition after fitting: the spec to run and a JSON record of the work.

    The record holds at least `members`; the built-in steps add `fitted` and `merged` (True: done now; False:
    found cached; None: nothing to fit or merge), `fit_s` and `merge_s` (seconds that work took, now or when it
    was cached), `dev_examples`, `candidates` (models scored on dev) and `result`.
    """

    spec: GraphSpec
    record: dict[str, Any] = field(default_factory=dict)


FitStep = Callable[..., Awaitable[Fitted]]


def fit_step_of(spec: GraphSpec) -> FitStep | None:
    """The fit step the registry holds for the protocol `spec` was built from, or None when it has none (a
    user's own graph is not registered: it runs as built)."""
    try:
        return get_protocol(spec.name).fit
    except KeyError:
        return None


async def fit_coalition(
    spec: GraphSpec, pool: Pool, *, client: ModelClient, scorer: str | None = None
) -> Fitted | None:
    """Fit one coalition's spec when its protocol declares a fit step; None when it has none."""
    step = fit_step_of(spec)
    if step is None:
        return None
    return await step(spec, pool, client=client, scorer=scorer)


async def run_fitted(
    spec: GraphSpec,
    pool: Pool,
    examples: Sequence[Example],
    *,
    client: ModelClient,
    scorer: str | None = None,
    **run_options: Any,
) -> tuple[list[ExampleOutcome], dict[str, Any]]:
    """`runner.run_dataset` of `spec` as fitted first when its protocol declares a fit step (a weight merge, a
    search on dev data), else as given: what `colab-graphs run` and `colab_graphs.run` do."""
    from colab_graphs.runner import run_dataset

    fitted = await fit_coalition(spec, pool, client=client, scorer=scorer)
    run_spec = fitted.spec if fitted is not None else spec
    return await run_dataset(run_spec, pool, examples, client=client, scorer=scorer, **run_options)


def fitting_summary(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The audit's `fitting` field: every coalition's record, and the fits and merges made or reused.

    `fit_s` / `merge_s` under `fits` / `merges` are the seconds this run spent; each coalition's own record
    keeps what its fit cost when it was made.
    """
    records = list(records)
    summary: dict[str, Any] = {"coalitions": records}
    for kind, done, seconds in (("fits", "fitted", "fit_s"), ("merges", "merged", "merge_s")):
        involved = [r for r in records if r.get(done) is not None]
        summary[kind] = {
            "made": sum(1 for r in involved if r[done]),
            "reused": sum(1 for r in involved if not r[done]),
            seconds: round(sum(r.get(seconds) or 0.0 for r in involved if r[done]), 3),
        }
    return summary
