"""Before/after evaluation of the system on held-out examples, played as an audit plays its coalitions.

Reports the system score v(N), the score without the policy v(N \\ {policy}), the policy seat's leave-one-out
value v(N) - v(N \\ {policy}), and the policy's individual strength (its `solo` score), over the examples none
of whose plays failed (`failed` counts the others). The plays are the audit's own
(`colab_graphs.audit.game.CoalitionGame`): a coalition is the protocol restricted to it, the empty coalition
scores the protocol's `empty_fallback`, a protocol with a fit step is fitted per coalition, and an example's
plays share their seat memo. Policy calls are never cached (see `PolicyRouter`), so the evaluation after
training sees the trained weights; collaborator calls are, so v(N \\ {policy}) costs nothing the second time.

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


def _mean(scores: Sequence[float]) -> float:
    return sum(scores) / len(scores) if scores else 0.0


def evaluate(
    spec: GraphSpec,
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
    from colab_graphs.audit.game import CoalitionGame

    grand = frozenset(spec.members)
    without = grand - {policy_member}
    share = list(examples)
    if processes is not None and processes.num_processes > 1:
        share = share[processes.process_index :: processes.num_processes]
    game = CoalitionGame(spec, pool, share, client=router, scorer=scorer)  # type: ignore[arg-type]
    if share:
        loop.run(game.evaluate([grand, without], [policy_member]))
    failed = game.failed_examples()
    values = game.values([grand, without], exclude=failed)
    solo = game.solo_values([policy_member], exclude=failed)[policy_member]
    rows = list(zip(values[grand].tolist(), values[without].tolist(), solo.tolist(), strict=True))
    if processes is not None and processes.num_processes > 1:
        from accelerate.utils import gather_object

        rows = gather_object(rows)
        failed = gather_object(failed)
    system, without_policy, policy_solo = (_mean([row[i] for row in rows]) for i in range(3))
    return {
        "n": len(examples),
        "system": system,
        "without_policy": without_policy,
        "loo": system - without_policy,
        "policy_solo": policy_solo,
        "failed": len(failed),
    }
