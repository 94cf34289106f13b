"""The local engine against `transformers` `generate` and against this machine's memory-bandwidth bound.

Run: ``python bench/local_engine.py [--model smollm2-135m] [--batches 1,8,16] [--max-tokens 32] [--repeats 3]
[--dtypes float32,bfloat16] [--queued] [--profile BATCH] [--json PATH]``

Everything is measured in one process, interleaved, so that the load other jobs put on the machine hits every
figure alike; each repeat measures, for every batch size, in this order (reversed on odd repeats):

1. **bound**: a `torch` copy of a 512 MiB tensor (GB/s = bytes read + written per second, best of 5). A decode
   step reads every weight once (SmolLM2's tied embedding is the LM head, so it too is read whole), so the
   steps/s bound is that bandwidth over the weights' bytes, and the tokens/s bound is that times the batch.
   The KV cache a step also reads (a few MB here) is left out, which makes the bound a little optimistic.
2. **linears only**: every linear layer of the model once on a batch of random rows, best of 3: the step that
   torch's own matmul kernels allow, without attention, norms, sampling or Python.
3. **prompt pass**: the engine with one token per request (prompt pass + first token), to take out of the
   engine's time what is not decoding.
4. **engine**: `LocalEngine.generate_batch` on the batch's prompts, greedy, `--max-tokens` each.
5. **generate**: `model.generate` on the same prompts, left-padded as one batch, greedy, same token budget
   (finished rows keep being padded until all are done, as `generate` does).

Tokens are completion tokens up to and including each row's end-of-turn token; both modes must produce the
same token ids (checked, and printed). Decode steps/s is (steps - 1) over (engine time - prompt pass time).
Wall and CPU time of this process are both recorded: on a loaded machine the CPU seconds say what the work
costs, the wall seconds what a user waits. Every line carries the 1-minute load average. ``--dtypes`` adds
engines loaded in other dtypes (e.g. bfloat16, as a collaborator may be served); ``--queued`` also sends the
largest batch as concurrent requests through the batching worker (one batch expected, same ids);
``--profile BATCH`` prints a cProfile of one engine batch (Python vs torch).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import datetime
import io
import json
import os
import platform
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

import colab_graphs._env  # noqa: F401
from colab_graphs.local.local_engine import GenerationRequest, LocalEngine, decoding_threads
from colab_graphs.local.provider import build_request, get_engine

TOPICS = [
    "the water cycle",
    "photosynthesis",
    "prime numbers",
    "the moon",
    "volcanoes",
    "bees",
    "rainbows",
    "gravity",
    "the internet",
    "clouds",
    "tides",
    "magnets",
    "fractions",
    "the heart",
    "deserts",
    "bridges",
]
COPY_MIB = 512


def prompts(n: int) -> list[list[dict[str, str]]]:
    """``n`` one-question conversations that ask for a few sentences (few end before 32 tokens)."""
    return [
        [{"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]} to a child in three sentences."}]
        for i in range(n)
    ]


def load() -> float:
    return round(os.getloadavg()[0], 2)


def copy_gbps() -> float:
    """Best of 5 copies of a 512 MiB fp32 tensor: (bytes read + bytes written) / seconds, in GB/s."""
    import torch

    src = torch.ones(COPY_MIB * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch of the pages is not part of the figure
    best = 0.0
    for _ in range(5):
        started = time.perf_counter()
        dst.copy_(src)
        best = max(best, 2 * src.numel() * 4 / (time.perf_counter() - started) / 1e9)
    return best


def weight_bytes(model: Any) -> int:
    """Bytes of the model's parameters, each storage once (tied weights are one tensor)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()
    return sum(seen.values())


def linears_step_s(model: Any, batch: int) -> float:
    """Best of 3 passes of every linear layer of ``model`` on ``batch`` rows, one after the other: what a
    decode step's matmuls cost with the kernels torch picks, without attention, norms or Python."""
    import torch

    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(batch, m.in_features, dtype=m.weight.dtype) for m in layers]
    best = float("inf")
    with torch.inference_mode():
        for _ in range(3):
            started = time.perf_counter()
            for m, x in zip(layers, inputs, strict=True):
                torch.nn.functional.linear(x, m.weight, m.bias)
            best = min(best, time.perf_counter() - started)
    return best


def timed(fn: Any) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def until_eos(ids: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


def run_generate(engine: LocalEngine, requests: list[GenerationRequest], max_tokens: int) -> list[list[int]]:
    """`model.generate` on the requests' prompts as one left-padded batch; each row's ids up to its EOS."""
    import torch

    width = max(len(r.prompt_ids) for r in requests)
    ids = torch.full((len(requests), width), engine.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(requests):
        ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        mask[i, width - len(r.prompt_ids) :] = 1
    eos = engine.eos_ids
    with torch.inference_mode():
        out = engine.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            pad_token_id=engine.pad_id,
            eos_token_id=sorted(eos),
        )
    return [until_eos(row[width:].tolist(), eos) for row in out]


def measure(engine: LocalEngine, requests: list[GenerationRequest], generate: bool, rep: int) -> dict:
    """One interleaved measurement of bound, linears, engine (and its prompt pass) and generate."""
    batch, max_tokens = len(requests), max(r.max_tokens for r in requests)
    order = ["bound", "linears", "prefill", "engine", "generate"]
    row: dict[str, Any] = {"batch": batch, "repeat": rep, "load_before": load()}
    for what in order if rep % 2 == 0 else order[::-1]:
        if what == "bound":
            row["copy_gbps"] = copy_gbps()
        elif what == "linears":
            with decoding_threads():  # the thread count the engine would choose now
                row["linears_step_s"] = linears_step_s(engine.model, batch)
        elif what == "prefill":  # the prompt pass and one token: what the decode figures leave out
            one = [dataclasses.replace(r, max_tokens=1) for r in requests]
            _, row["prefill_wall_s"], _ = timed(lambda one=one: engine.generate_batch(one))
        elif what == "engine":
            results, wall, cpu = timed(lambda: engine.generate_batch(requests))
            with decoding_threads() as threads:  # the count the engine decoded with
                row["engine_threads"] = threads
            row["engine_ids"] = [r.completion_ids for r in results]
            row["engine_tokens"] = sum(len(r.completion_ids) for r in results)
            row["engine_steps"] = max(len(r.completion_ids) for r in results)
            row["engine_wall_s"], row["engine_cpu_s"] = wall, cpu
        elif generate:
            with decoding_threads() as threads:  # the thread count the engine would choose now
                ids, wall, cpu = timed(lambda: run_generate(engine, requests, max_tokens))
            row["generate_threads"] = threads
            row["generate_ids"] = ids
            row["generate_tokens"] = sum(len(x) for x in ids)
            row["generate_wall_s"], row["generate_cpu_s"] = wall, cpu
    row["load_after"] = load()
    return row


def queued(engine: LocalEngine, requests: list[GenerationRequest]) -> dict:
    """The same requests sent concurrently through the batching worker (as the provider sends them)."""

    async def all_at_once() -> list:
        return await asyncio.gather(*[engine.agenerate(r) for r in requests])

    before = engine.batches_run
    results, wall, cpu = timed(lambda: asyncio.run(all_at_once()))
    return {
        "batch": len(requests),
        "batches_run": engine.batches_run - before,
        "tokens": sum(len(r.completion_ids) for r in results),
        "wall_s": wall,
        "cpu_s": cpu,
        "ids": [r.completion_ids for r in results],
        "load": load(),
    }


def profile(engine: LocalEngine, requests: list[GenerationRequest]) -> str:
    """cProfile of one engine batch: the functions with the most own time, and the torch share of all."""
    prof = cProfile.Profile()
    prof.enable()
    results = engine.generate_batch(requests)
    prof.disable()
    stats = pstats.Stats(prof)
    total = sum(v[2] for v in stats.stats.values())  # own time of every function
    torch_own = sum(
        v[2] for k, v in stats.stats.items() if k[0] == "~" and ("torch" in k[2] or "Tensor" in k[2])
    )
    steps = max(len(r.completion_ids) for r in results)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    head = (
        f"profile, batch {len(requests)}: {steps} steps, {total:.2f} s own time, of which torch built-ins "
        f"{torch_own:.2f} s ({torch_own / total:.0%}); "
        f"Python {(total - torch_own) / steps * 1000:.1f} ms/step; "
        f"load {load()}\n"
    )
    return head + out.getvalue()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise(rows: list[dict], weights: int) -> list[dict]:
    """Medians over the repeats of each batch size; ratios are taken within a repeat, then the median."""
    table = []
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch]
        bound_steps = [r["copy_gbps"] * 1e9 / weights for r in mine]
        eng = [r["engine_tokens"] / r["engine_wall_s"] for r in mine]
        # Decode steps per second: the steps after the first token, over the time after the prompt pass.
        decode = [(r["engine_steps"] - 1) / max(r["engine_wall_s"] - r["prefill_wall_s"], 1e-9) for r in mine]
        line = {
            "batch": batch,
            "copy_gbps": median([r["copy_gbps"] for r in mine]),
            "bound_steps_s": median(bound_steps),
            "bound_tok_s": median([b * batch for b in bound_steps]),
            "linears_steps_s": median([1 / r["linears_step_s"] for r in mine]),
            "engine_tok_s": median(eng),
            "engine_tok_per_cpu_s": median([r["engine_tokens"] / r["engine_cpu_s"] for r in mine]),
            "engine_decode_steps_s": median(decode),
            "prefill_share": median([r["prefill_wall_s"] / r["engine_wall_s"] for r in mine]),
            "decode_of_bound": median([d / b for d, b in zip(decode, bound_steps, strict=True)]),
            "decode_of_linears": median([d * r["linears_step_s"] for d, r in zip(decode, mine, strict=True)]),
            "loads": sorted({r["load_before"] for r in mine} | {r["load_after"] for r in mine}),
        }
        if "generate_tokens" in mine[0]:
            gen = [r["generate_tokens"] / r["generate_wall_s"] for r in mine]
            line["generate_tok_s"] = median(gen)
            line["generate_tok_per_cpu_s"] = median(
                [r["generate_tokens"] / r["generate_cpu_s"] for r in mine]
            )
            line["engine_over_generate"] = median([e / g for e, g in zip(eng, gen, strict=True)])
            line["same_ids"] = all(r["engine_ids"] == r["generate_ids"] for r in mine)
        table.append(line)
    return table


def print_table(title: str, table: list[dict]) -> None:
    nan = float("nan")
    print(f"\n{title}")
    print(
        "| batch | engine tok/s | generate tok/s | engine / generate | bound tok/s | engine decode steps/s | "
        "linears-only steps/s | bound steps/s | decode / bound | decode / linears | prompt pass share | "
        "engine tok per CPU-s | generate tok per CPU-s | same ids | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for t in table:
        print(
            f"| {t['batch']} | {t['engine_tok_s']:.1f} | {t.get('generate_tok_s', nan):.1f} | "
            f"{t.get('engine_over_generate', nan):.2f} | {t['bound_tok_s']:.0f} | "
            f"{t['engine_decode_steps_s']:.2f} | {t['linears_steps_s']:.2f} | {t['bound_steps_s']:.1f} | "
            f"{t['decode_of_bound']:.0%} | {t['decode_of_linears']:.0%} | {t['prefill_share']:.0%} | "
            f"{t['engine_tok_per_cpu_s']:.1f} | {t.get('generate_tok_per_cpu_s', nan):.1f} | "
            f"{t.get('same_ids', '-')} | {min(t['loads']):.1f}-{max(t['loads']):.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batches", default="1,8,16")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--dtypes", default="float32", help="comma-separated; the first is compared with generate"
    )
    parser.add_argument("--no-generate", dest="generate", action="store_false")
    parser.add_argument("--queued", action="store_true")
    parser.add_argument("--profile", type=int, default=0, metavar="BATCH")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    batches = [int(b) for b in args.batches.split(",")]
    dtypes = args.dtypes.split(",")
    engines = {dtype: get_engine(args.model, dtype=dtype) for dtype in dtypes}
    first = engines[dtypes[0]]
    requests = [
        build_request(first, m, {"temperature": 0, "max_tokens": args.max_tokens})
        for m in prompts(max(batches))
    ]
    for engine in engines.values():
        engine.generate_batch(requests[:2])  # warm-up: first-call allocations are not part of any figure
    weights = {dtype: weight_bytes(e.model) for dtype, e in engines.items()}

    header = {
        "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs".strip(),
        "cpu": _cpu_name(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "date": datetime.datetime.now().isoformat(timespec="minutes"),
        "model": args.model,
        "max_tokens": args.max_tokens,
        "weight_bytes": weights,
    }
    print(json.dumps(header))
    rows: dict[str, list[dict]] = {dtype: [] for dtype in dtypes}
    for rep in range(args.repeats):
        for batch in batches:
            for dtype, engine in engines.items():
                row = measure(engine, requests[:batch], args.generate and dtype == dtypes[0], rep)
                rows[dtype].append(row)
                print(
                    f"rep {rep} {dtype} batch {batch}: "
                    f"engine {row['engine_tokens'] / row['engine_wall_s']:.1f} "
                    f"tok/s"
                    + (
                        f", generate {row['generate_tokens'] / row['generate_wall_s']:.1f} tok/s"
                        if "generate_tokens" in row
                        else ""
                    )
                    + f", copy {row['copy_gbps']:.1f} GB/s, load {row['load_before']}-{row['load_after']}",
                    flush=True,
                )
    tables = {dtype: summarise(rows[dtype], weights[dtype]) for dtype in dtypes}
    for dtype in dtypes:
        print_table(f"{args.model} {dtype}, weights {weights[dtype] / 1e6:.0f} MB", tables[dtype])
    if len(dtypes) > 1:
        base = rows[dtypes[0]]
        for dtype in dtypes[1:]:
            same = sum(
                a == b
                for x, y in zip(base, rows[dtype], strict=True)
                for a, b in zip(x["engine_ids"], y["engine_ids"], strict=True)
            )
            total = sum(len(x["engine_ids"]) for x in base)
            print(f"{dtype} rows with the same greedy ids as {dtypes[0]}: {same}/{total}")
    extra: dict[str, Any] = {}
    if args.queued:
        extra["queued"] = queued(first, requests[: max(batches)])
        direct = next(r for r in rows[dtypes[0]] if r["batch"] == max(batches))
        q = extra["queued"]
        print(
            f"\nqueued: {q['batch']} concurrent requests -> {q['batches_run']} batch(es), "
            f"{q['tokens'] / q['wall_s']:.1f} tok/s, "
            f"same ids as generate_batch: {q['ids'] == direct['engine_ids']}, "
            f"load {q['load']}"
        )
    if args.profile:
        extra["profile"] = profile(first, requests[: args.profile])
        print("\n" + extra["profile"])
    if args.json:
        args.json.write_text(
            json.dumps({**header, "tables": tables, "rows": rows, **extra}, indent=1, default=str)
        )


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
