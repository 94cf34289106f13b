"""Before/after evaluation of the system on held-out examples.

Reports the system score v(N), the score without the policy v(N \\ {policy}) (the protocol restricted with
`colab_graphs.coalition.restrict`), the policy seat's leave-one-out value v(N) - v(N \\ {policy}), and the
policy's individual strength (its `solo` score). Policy calls are never cached (see `PolicyRouter`), so the
evaluation after training sees the trained weights; collaborator calls are, so v(N \\ {policy}) costs
nothing the second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from colab_graphs.data.example import Example
from colab_graphs.pool import Pool
from colab_graphs.spec import GraphSpec
from colab_graphs.trainers.rollout import LoopThread, PolicyRouter


async def _score(
    spec: GraphSpec | None, pool: Pool, examples: Sequence[Example], router: PolicyRouter, scorer: Any
) -> float:
    from colab_graphs.runner import run_dataset

    if spec is None:  # the empty coalition scores its fallback
        return 0.0
    _, summary = await run_dataset(spec, pool, examples, client=router, scorer=scorer)  # type: ignore[arg-type]
    return float(summary["score"] or 0.0)


def evaluate(
    spec: GraphSpec,
    solo: GraphSpec,
    pool: Pool,
    examples: Sequence[Example],
    router: PolicyRouter,
    policy_member: str,
    loop: LoopThread,
    scorer: Any = None,
) -> dict[str, Any]:
    """System score, score without the policy, the policy seat's LOO and its solo score on `examples`."""
    from colab_graphs.coalition import restrict

    others = [m for m in spec.members if m != policy_member]
    without = restrict(spec, others)

    async def run() -> dict[str, Any]:
        system = await _score(spec, pool, examples, router, scorer)
        rest = await _score(without, pool, examples, router, scorer)
        alone = await _score(solo, pool, examples, router, scorer)
        return {
            "n": len(examples),
            "system": system,
            "without_policy": rest,
            "loo": system - rest,
            "policy_solo": alone,
        }

    return loop.run(run())
