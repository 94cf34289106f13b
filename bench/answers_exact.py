"""Exact Shapley of a vote computed from the members' answers vs playing every coalition, at n = 16.

Run: ``python bench/answers_exact.py [--members 16] [--examples 100] [--json PATH]``

Sixteen scripted members (arithmetic solvers of falling accuracy, in the scripted server, in process) answer
100 built-in arithmetic questions; `majority_vote` declares independent replies, so `colab-graphs audit
--method exact` plays the leave-one-out coalitions only (17 x 100 runs, every distinct call) and computes all
65,536 coalitions' values from the answers. Measured in one process:

1. **from answers**: the CPU of computing the game from the replies (classes, scores, the vectorised vote of
   every coalition) and exact Shapley from the table, over all examples: the issue's target is under 10 s.
2. **the whole audit** (calls included): wall and CPU of `play_audit`, with a fresh cache.
3. **playing every coalition** (the baseline): the framework's CPU per (coalition, example) run, measured on
   the cached leave-one-out coalitions of the same protocol under another name (so it is played coalition by
   coalition), times 2^16 x 100: what the audit cost before, without its 12-member refusal.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import colab_graphs._env  # noqa: E402, F401  (offline settings before litellm loads)
from colab_graphs.audit import answers  # noqa: E402
from colab_graphs.audit.game import CoalitionGame, coalition_id  # noqa: E402
from colab_graphs.audit.run import play_audit  # noqa: E402
from colab_graphs.audit.stratified import exact_shapley_table  # noqa: E402
from colab_graphs.models.cache import CallCache  # noqa: E402
from colab_graphs.models.client import ModelClient  # noqa: E402
from colab_graphs.pool import Pool  # noqa: E402
from colab_graphs.protocol_registry import build_protocol  # noqa: E402
from colab_graphs.tasks.builtin import builtin_task  # noqa: E402
from colab_graphs.tasks.scoring import view_for  # noqa: E402
from colab_graphs.testing import ScriptedServer, arithmetic_solver  # noqa: E402


class Clock:
    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = round(time.perf_counter() - self.wall, 3)
        self.cpu = round(time.process_time() - self.cpu, 3)


async def measure(n: int, n_examples: int, workdir: Path) -> dict:
    names = [f"m{i}" for i in range(n)]
    examples = builtin_task("arithmetic", n_examples, seed=1)
    members = {m: arithmetic_solver(accuracy=0.85 - 0.5 * i / (n - 1), seed=i) for i, m in enumerate(names)}
    with ScriptedServer(members) as server:
        pool = Pool.from_dict({m: server.litellm_kwargs(m) for m in names})
        spec = build_protocol("majority_vote", names)
        client = ModelClient(CallCache(workdir / "cache"), max_concurrency=32)
        with Clock() as audit:
            report = await play_audit(spec, pool, examples, client=client, method="exact", individual=False)
        assert report.shapley_estimator == "exact_from_answers", report.shapley_estimator
        grand = coalition_id("coalition", names)
        # The grand coalition's replies, as the audit read them (from the cache: no call).
        game = CoalitionGame(spec, pool, examples, client=client)
        await game.evaluate([frozenset(names)], ())
        calls = {e.id: game.plays[(grand, e.id)].calls for e in examples}
        with Clock() as computed:
            columns = []
            for example in examples:
                view = view_for(example)
                replies = answers.seat_replies(spec, pool, client, view, calls[example.id])
                columns.append(await answers.game_from_answers(spec, "vote", replies, view, 0.0))
            exact_shapley_table(np.stack(columns, axis=1))
        played = spec.model_copy(update={"name": "majority_vote_played"})
        with Clock() as baseline:
            loo = await play_audit(played, pool, examples, client=client, method="loo", individual=False)
        runs = len(loo.coalitions) * n_examples
    per_run = baseline.cpu / runs
    return {
        "members": n,
        "examples": n_examples,
        "coalitions": 2**n,
        "calls_made": report.calls.made,
        "from_answers_cpu_s": computed.cpu,
        "audit_wall_s": audit.wall,
        "audit_cpu_s": audit.cpu,
        "played_cpu_per_run_ms": round(1000 * per_run, 3),
        "played_every_coalition_cpu_s_extrapolated": round(per_run * 2**n * n_examples, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(measure(args.members, args.examples, Path(tmp)))
    result.update(date=datetime.date.today().isoformat(), machine=platform.platform())
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
