"""Throughput of the local engine: 16 concurrent requests batched vs one at a time, in one process.

Run: ``python bench/local_batching.py [--model smollm2-135m] [--requests 16] [--max-tokens 64]``

Both modes use the same loaded model, greedy decoding and the same prompts, and the script checks that they
produce the same tokens; it prints the wall time and completion tokens per second of each mode and their
ratio. bench/local_engine.py measures the engine itself per batch size (against `generate` and the
machine's memory-bandwidth bound).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import time

from local_engine import prompts  # bench/local_engine.py: the same prompts

import colab_graphs._env  # noqa: F401
from colab_graphs.local.provider import build_request, get_engine


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    import torch

    engine = get_engine(args.model)
    requests = [
        build_request(engine, m, {"temperature": 0, "max_tokens": args.max_tokens})
        for m in prompts(args.requests)
    ]
    engine.generate(requests[0])  # warm-up: first-call allocations are not part of either figure

    started = time.perf_counter()
    sequential = [await engine.agenerate(r) for r in requests]
    sequential_s = time.perf_counter() - started

    batches_before = engine.batches_run
    started = time.perf_counter()
    batched = await asyncio.gather(*[engine.agenerate(r) for r in requests])
    batched_s = time.perf_counter() - started

    tokens = sum(len(r.completion_ids) for r in sequential)
    same = [b.completion_ids for b in batched] == [s.completion_ids for s in sequential]
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads, device {engine.device}"
    )
    print(
        f"date: {datetime.date.today().isoformat()}  model: {args.model}  requests: {args.requests}  "
        f"max_tokens: {args.max_tokens}  completion tokens: {tokens}"
    )
    print(f"one at a time: {sequential_s:7.2f} s  {tokens / sequential_s:7.1f} tok/s")
    print(
        f"batched:       {batched_s:7.2f} s  {tokens / batched_s:7.1f} tok/s  "
        f"({engine.batches_run - batches_before} batch(es))"
    )
    print(f"speed-up: {sequential_s / batched_s:.2f}x  identical outputs: {same}")


if __name__ == "__main__":
    asyncio.run(main())
