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

The result lists every held-out example (`examples`: id, input, the system's answer and score, the scores
without the policy and of the policy alone, and what each seat replied in the whole system's run), so a
reader can check that none was trained on and see what the policy did on each.

The policy generates in eval mode (`eval_mode`): no dropout, whatever mode a trainer left it in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from colab_graphs.pool import Pool
from colab_graphs.spec import GraphSpec
from colab_graphs.tasks.example import Example
from colab_graphs.trainers.rollout import LoopThread, PolicyRouter


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """Generate without dropout, and with a KV cache even when gradient checkpointing is on; the model's
    mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


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
    from colab_graphs.audit.game import CoalitionGame, coalition_id
    from colab_graphs.local.provider import get_engine

    grand = frozenset(spec.members)
    without = grand - {policy_member}
    share = list(examples)
    if processes is not None and processes.num_processes > 1:
        share = share[processes.process_index :: processes.num_processes]
    game = CoalitionGame(spec, pool, share, client=router, scorer=scorer)  # type: ignore[arg-type]
    model = str(pool[policy_member].settings.get("model", ""))
    policy = get_engine(model).model if model.startswith("local/") else None
    if share:
        with eval_mode(policy) if policy is not None else contextlib.nullcontext():
            loop.run(game.evaluate([grand, without], [policy_member]))
    ids = {
        "system": coalition_id("coalition", [m for m in spec.members if m in grand]),
        "without_policy": coalition_id("coalition", [m for m in spec.members if m in without]),
        "policy_solo": coalition_id("solo", [policy_member]),
    }
    rows = [_row(example, game.plays, ids) for example in share]
    if processes is not None and processes.num_processes > 1:
        from accelerate.utils import gather_object

        rows = gather_object(rows)
    order = {e.id: i for i, e in enumerate(examples)}
    rows.sort(key=lambda row: order[row["id"]])
    scored = [row for row in rows if not row["failed"]]
    system, without_policy, policy_solo = (
        _mean([row[k] for row in scored]) for k in ("score", "without_policy", "policy_solo")
    )
    return {
        "n": len(examples),
        "system": system,
        "without_policy": without_policy,
        "loo": system - without_policy,
        "policy_solo": policy_solo,
        "failed": len(rows) - len(scored),
        "examples": rows,
    }


def _row(example: Example, plays: dict, ids: dict[str, str]) -> dict[str, Any]:
    """One held-out example's line: its id and input, the system's answer and every score, each seat's reply."""
    played = {name: plays.get((cid, example.id)) for name, cid in ids.items()}
    score = {name: (p.score or 0.0) if p is not None else 0.0 for name, p in played.items()}
    whole = played["system"]
    return {
        "id": example.id,
        "input": example.input,
        "answer": whole.answer if whole is not None else None,
        "score": score["system"],
        "without_policy": score["without_policy"],
        "policy_solo": score["policy_solo"],
        "failed": any(p is None or p.failed for p in played.values()),
        "replies": {c.seat: c.completion for c in (whole.calls if whole is not None else []) if c.seat},
    }
