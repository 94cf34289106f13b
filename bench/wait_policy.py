"""OpenMP wait policy and thread count of the local engine, on a quiet machine and beside busy processes.

Run: ``python bench/wait_policy.py [--busy 0,2,6] [--batches 1,8] [--max-tokens 32] [--repeats 1]``

The wait policy is read when torch loads, so every variant runs in a child process of its own (this script
again with ``--child``), one after the other; ``--busy N`` first starts N processes that spin forever (the
load a shared machine or CI runner puts on the cores) and waits 30 s for the load average to follow. Variants:
``spin`` (libgomp's default: threads spin at each barrier before sleeping), ``passive`` (``OMP_WAIT_POLICY=
PASSIVE``, this project's default) and ``spin10k`` (``GOMP_SPINCOUNT=10000``), each with every core's thread
and with one. A child prints one JSON line: tokens/s of ``LocalEngine.generate_batch`` per batch size (greedy,
best of 2 after a warm-up), the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

VARIANTS = {
    "spin": {
        "OMP_WAIT_POLICY": ""
    },  # empty: libgomp's default policy (local_engine sets PASSIVE only if unset)
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin10k": {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "10000"},
}


def child(batches: list[int], max_tokens: int) -> None:
    from local_engine import prompts  # bench/local_engine.py: the same prompts as the engine's own bench

    from colab_graphs.local.provider import build_request, get_engine

    engine = get_engine("smollm2-135m")
    messages = prompts(max(batches))
    out: dict = {"load_before": os.getloadavg()[0]}
    for batch in batches:
        requests = [
            build_request(engine, m, {"max_tokens": max_tokens, "temperature": 0}) for m in messages[:batch]
        ]
        engine.generate_batch(requests[:1])
        walls = []
        for _ in range(2):
            start = time.perf_counter()
            results = engine.generate_batch(requests)
            walls.append(time.perf_counter() - start)
        out[f"tok_s_batch_{batch}"] = round(sum(len(r.completion_ids) for r in results) / min(walls), 1)
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--busy", default="0,2,6", help="numbers of spinning processes, one phase each")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per variant (spinning can crawl)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        child(batches, args.max_tokens)
        return
    cores = os.cpu_count() or 1
    for busy in [int(b) for b in args.busy.split(",")]:
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
        try:
            if busy:
                time.sleep(30)
            for rep in range(args.repeats):
                for name, env in VARIANTS.items():
                    for threads in sorted({cores, 1}, reverse=True):
                        child_env = {**os.environ, **env, "COLAB_GRAPHS_LOCAL_THREADS": str(threads)}
                        command = [sys.executable, __file__, "--child", "--batches", args.batches]
                        command += ["--max-tokens", str(args.max_tokens)]
                        try:
                            done = subprocess.run(
                                command, env=child_env, capture_output=True, text=True, timeout=args.timeout
                            )
                            result = json.loads(done.stdout.strip().splitlines()[-1])
                        except subprocess.TimeoutExpired:
                            result = {"timed_out_s": args.timeout}
                        print(
                            json.dumps(
                                {"busy": busy, "rep": rep, "policy": name, "threads": threads, **result}
                            )
                        )
        finally:
            for proc in spinners:
                proc.kill()


if __name__ == "__main__":
    main()
