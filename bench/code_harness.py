"""What one scored code answer costs: the judged harness against a single-process run in the same sandbox.

Scores the canonical solutions of the first N HumanEval records through the public scorer path
(`apply_scorer(get_scorer("code"), ...)`, which runs the judge and the candidate as two processes) and, as the
baseline in the same process, the design it replaced: one sandboxed program that runs the solution and then the
tests in one namespace (`run_code`, the same sandbox). Both sequentially (one at a time: the latency of one
score) and at the scorer's default parallelism (`sandbox.max_parallel()`, all N submitted at once: throughput).
Every score must be 1 (a wrong verdict would make the timing meaningless). Besides wall time (noisy on a
shared machine), the CPU time of a score: the sandbox's processes (`RUSAGE_CHILDREN`) plus this process's own
(the reader threads, extraction), per score.

The same script runs against an older checkout (`PYTHONPATH=OLD python bench/code_harness.py`): its scorer
path is then the old harness, which is how BENCHMARKS.md compares before and after.

`--sandbox` picks the backend (`namespaces`, `landlock`, ...: env `COLAB_GRAPHS_SANDBOX` while it is measured);
a comma-separated list measures each in the same process, interleaved round by round, and gives each one's CPU
per score over the first's (one machine, one load: the ratio is the figure to read when the load moves).
`--multiprocessing N` adds a mode: N sandboxed runs of a program that shares state between processes (a fork
`Pool`, a `Queue`, a `Lock`, a `Value` and a `shared_memory` segment: semaphores and segments on the run's own
/dev/shm, a tmpfs under namespaces and `colab_graphs.sandbox.private_shm` under landlock).

Usage:
    python bench/code_harness.py [--records 20] [--rounds 3] [--sandbox auto|B1,B2] [--multiprocessing 0]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import time
from datetime import date

from colab_graphs.sandbox import runner as sandbox
from colab_graphs.tasks.loaders import load_examples
from colab_graphs.tasks.scoring import apply_scorer, get_scorer

_SINGLE_PROCESS = """\
_ns = {{"__name__": "solution"}}
exec(compile({candidate!r}, "solution.py", "exec"), _ns)
exec(compile({test!r}, "test.py", "exec"), _ns)
"""


def _reply(example) -> str:  # noqa: ANN001
    return f"Here it is:\n```python\n{example.fields['prompt']}{example.fields['canonical_solution']}```\n"


async def _timed(one, examples: list, parallel: bool) -> list[float]:  # noqa: ANN001
    """Wall ms of each call of `one` (sequential) or of the whole batch divided by N (parallel)."""
    if not parallel:
        return [await one(e) for e in examples]
    start = time.perf_counter()
    await asyncio.gather(*(one(e) for e in examples))
    return [(time.perf_counter() - start) * 1000 / len(examples)]


async def _scored(examples: list, parallel: bool) -> list[float]:
    code = get_scorer("code")

    async def one(example) -> float:  # noqa: ANN001
        start = time.perf_counter()
        verdict = await apply_scorer(code, _reply(example), example)
        assert verdict.value == 1.0, (example.id, verdict)
        return (time.perf_counter() - start) * 1000

    return await _timed(one, examples, parallel)


async def _single_process(examples: list, parallel: bool) -> list[float]:
    async def one(example) -> float:  # noqa: ANN001
        program = _SINGLE_PROCESS.format(
            candidate=example.fields["prompt"] + example.fields["canonical_solution"], test=example.test
        )
        start = time.perf_counter()
        result = await sandbox.arun_code(program)
        assert result.passed, (example.id, result.stderr[-500:])
        return (time.perf_counter() - start) * 1000

    return await _timed(one, examples, parallel)


_SHARED_STATE = """\
import multiprocessing
from multiprocessing import shared_memory

def square(x):
    return x * x

def add(total, lock, queue, name):
    segment = shared_memory.SharedMemory(name=name)
    with lock:
        total.value += sum(segment.buf[:4])
    segment.close()
    queue.put(True)

if __name__ == "__main__":
    with multiprocessing.Pool(2) as pool:
        assert pool.map(square, range(8)) == [x * x for x in range(8)]
    total, lock, queue = multiprocessing.Value("i", 0), multiprocessing.Lock(), multiprocessing.Queue()
    segment = shared_memory.SharedMemory(create=True, size=4)
    segment.buf[:4] = bytes([1, 2, 3, 4])
    workers = [multiprocessing.Process(target=add, args=(total, lock, queue, segment.name)) for _ in range(2)]
    for worker in workers:
        worker.start()
    assert [queue.get(timeout=20) for _ in workers] == [True, True]
    for worker in workers:
        worker.join()
    assert total.value == 20
    segment.close()
    segment.unlink()
"""


async def _shared_state(count: int) -> list[float]:
    """Wall ms of each of `count` sandboxed runs of `_SHARED_STATE` (each must pass)."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        result = await sandbox.arun_code(_SHARED_STATE, timeout_s=60, cpu_s=60)
        assert result.passed, result.stderr[-500:]
        times.append((time.perf_counter() - start) * 1000)
    return times


def _cpu_s() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime + time.process_time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each mode, interleaved")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--sandbox",
        default="auto",
        help="the sandbox backend(s), comma-separated (auto, namespaces, landlock, ...)",
    )
    parser.add_argument(
        "--multiprocessing",
        type=int,
        default=0,
        help="runs per round of a program sharing state between processes",
    )
    args = parser.parse_args()
    backends = [sandbox.resolve(name.strip()).name for name in args.sandbox.split(",")]
    examples = load_examples("humaneval", limit=args.records)
    modes = {
        "scorer, sequential": (lambda: _scored(examples, False), len(examples)),
        "single process, sequential": (lambda: _single_process(examples, False), len(examples)),
        "scorer, parallel": (lambda: _scored(examples, True), len(examples)),
        "single process, parallel": (lambda: _single_process(examples, True), len(examples)),
    }
    if args.multiprocessing:
        modes["shared state between processes"] = (
            lambda: _shared_state(args.multiprocessing),
            args.multiprocessing,
        )
    for backend in backends:  # warm: namespace probes, the harness source, the view of the interpreter
        os.environ["COLAB_GRAPHS_SANDBOX"] = backend
        asyncio.run(_scored(examples[:2], parallel=False))
    samples: dict[str, dict[str, list[float]]] = {b: {name: [] for name in modes} for b in backends}
    cpu: dict[str, dict[str, float]] = {b: dict.fromkeys(modes, 0.0) for b in backends}
    for _ in range(args.rounds):
        for backend in backends:
            os.environ["COLAB_GRAPHS_SANDBOX"] = backend
            for name, (run, _) in modes.items():
                before = _cpu_s()
                samples[backend][name] += asyncio.run(run())
                cpu[backend][name] += _cpu_s() - before
    per_backend = {}
    for backend in backends:
        figures = {name: round(statistics.median(ms), 1) for name, ms in samples[backend].items()}
        cpu_ms = {
            name: round(s * 1000 / (args.rounds * modes[name][1]), 1) for name, s in cpu[backend].items()
        }
        ratios = {
            kind: round(figures[f"scorer, {kind}"] / figures[f"single process, {kind}"], 2)
            for kind in ("sequential", "parallel")
        }
        per_backend[backend] = {
            "median_ms_per_score": figures,
            "scorer_over_single_process": ratios,
            "cpu_ms_per_score": cpu_ms,
            "cpu_scorer_over_single_process": round(
                cpu_ms["scorer, sequential"] / cpu_ms["single process, sequential"], 2
            ),
        }
    first = per_backend[backends[0]]["cpu_ms_per_score"]
    report = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "python": sandbox.sandbox_python(),
        "records": args.records,
        "rounds": args.rounds,
        "parallelism": sandbox.max_parallel(),
        **(per_backend[backends[0]] if len(backends) == 1 else {}),
        "backend": backends[0] if len(backends) == 1 else backends,
        "backends": per_backend,
        f"cpu_over_{backends[0]}": {
            backend: {
                name: round(ms / first[name], 2)
                for name, ms in per_backend[backend]["cpu_ms_per_score"].items()
            }
            for backend in backends[1:]
        },
    }
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)


if __name__ == "__main__":
    main()
