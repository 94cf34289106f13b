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

`--sandbox` picks the backend (`namespaces`, `landlock`, ...: env `COLAB_GRAPHS_SANDBOX` for the whole run), so
the same figures compare the backends.

Usage:
    python bench/code_harness.py [--records 20] [--rounds 3] [--sandbox auto] [--json out.json]
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


def _cpu_s() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime + time.process_time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each mode, interleaved")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--sandbox", default="auto", help="the sandbox backend (auto, namespaces, landlock, ...)"
    )
    args = parser.parse_args()
    os.environ["COLAB_GRAPHS_SANDBOX"] = args.sandbox
    backend = sandbox.resolve(args.sandbox).name
    examples = load_examples("humaneval", limit=args.records)
    asyncio.run(_scored(examples[:2], parallel=False))  # warm: namespace probes, the harness source
    modes = {
        "scorer, sequential": lambda: _scored(examples, False),
        "single process, sequential": lambda: _single_process(examples, False),
        "scorer, parallel": lambda: _scored(examples, True),
        "single process, parallel": lambda: _single_process(examples, True),
    }
    samples: dict[str, list[float]] = {name: [] for name in modes}
    cpu: dict[str, float] = dict.fromkeys(modes, 0.0)
    for _ in range(args.rounds):
        for name, run in modes.items():
            before = _cpu_s()
            samples[name] += asyncio.run(run())
            cpu[name] += _cpu_s() - before
    figures = {name: round(statistics.median(ms), 1) for name, ms in samples.items()}
    cpu_ms = {name: round(s * 1000 / (args.rounds * len(examples)), 1) for name, s in cpu.items()}
    ratios = {
        kind: round(figures[f"scorer, {kind}"] / figures[f"single process, {kind}"], 2)
        for kind in ("sequential", "parallel")
    }
    report = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "backend": backend,
        "python": sandbox.sandbox_python(),
        "records": args.records,
        "rounds": args.rounds,
        "parallelism": sandbox.max_parallel(),
        "median_ms_per_score": figures,
        "scorer_over_single_process": ratios,
        "cpu_ms_per_score": cpu_ms,
        "cpu_scorer_over_single_process": round(
            cpu_ms["scorer, sequential"] / cpu_ms["single process, sequential"], 2
        ),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)


if __name__ == "__main__":
    main()
