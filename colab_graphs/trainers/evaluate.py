"""Before/after evaluation of the system on held-out examples.

Reports the system score v(N), the score without the policy v(N \\ {policy}) (the protocol restricted with
`colab_graphs.coalition.restrict`), the policy seat's leave-one-out value v(N) - v(N \\ {policy}), and the
policy's individual strength (its `solo` score). Policy calls are never cached (see `PolicyRouter`), so the
evaluation after training sees the trained weights; collaborator calls are, so v(N \\ {policy}) costs
nothing the second time.

Under several processes (`accelerate launch`) each process evaluates its share of the examples and the
scores are pooled, so the numbers are those of one process evaluating them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from colab_graphs.data.example import Example
from colab_graphs.pool import Pool
from colab_graphs.spec import GraphSpec
from colab_graphs.trainers.rollout import LoopThread, PolicyRouter

SETTINGS = ("system", "without_policy", "policy_solo")


async def _scores(
    spec: GraphSpec | None, pool: Pool, examples: Sequence[Example], router: PolicyRouter, scorer: Any
) -> list[float | None]:
    """Each example's score (None: failed); the empty coalition scores its fallback, 0."""
    from colab_graphs.runner import run_dataset

    if spec is None:
        return [0.0] * len(examples)
    if not examples:
        return []
    outcomes, _ = await run_dataset(spec, pool, examples, client=router, scorer=scorer)  # type: ignore[arg-type]
    return [None if o.failed else float(o.score or 0.0) for o in outcomes]


def _mean(scores: Sequence[float | None]) -> float:
    done = [s for s in scores if s is not None]
    return sum(done) / len(done) if done else 0.0


def evaluate(
    spec: GraphSpec,
    solo: GraphSpec,
    pool: Pool,
    examples: Sequence[Example],
    router: PolicyRouter,
    policy_member: str,
    loop: LoopThread,
    scorer: Any = None,
    processes: Any = None,
) -> dict[str, Any]:
    """System score, score without the policy, the policy seat's LOO and its solo score on `examples`.

    Args:
        processes: an `accelerate.PartialState` to share the examples among (None: this process does all).
    """
    from colab_graphs.coalition import restrict

    others = [m for m in spec.members if m != policy_member]
    without = restrict(spec, others)
    share = list(examples)
    if processes is not None and processes.num_processes > 1:
        share = share[processes.process_index :: processes.num_processes]

    async def run() -> list[tuple[float | None, ...]]:
        columns = [await _scores(s, pool, share, router, scorer) for s in (spec, without, solo)]
        return list(zip(*columns, strict=True))

    rows = loop.run(run())
    if processes is not None and processes.num_processes > 1:
        from accelerate.utils import gather_object

        rows = gather_object(rows)
    means = {name: _mean([row[i] for row in rows]) for i, name in enumerate(SETTINGS)}
    return {
        "n": len(examples),
        "system": means["system"],
        "without_policy": means["without_policy"],
        "loo": means["system"] - means["without_policy"],
        "policy_solo": means["policy_solo"],
    }
