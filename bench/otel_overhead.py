"""What OpenTelemetry tracing (`colab_graphs.otel`) costs a run: client CPU per call with tracing off and on.

A protocol run (`majority_vote` over 3 members: 3 seats, 3 calls per example) over builtin arithmetic examples,
against the scripted OpenAI-compatible server in its own process (so its CPU is not counted), in one process,
the modes taking turns chunk after chunk so that load on the shared machine hits them alike:

- `off`: tracing never turned on in this mode (the span helpers return one shared no-op context);
- `on`: tracing on, every span (per example: example, coalition, 3 seats, 3 calls; one run span) recorded by
  the SDK, batched, passed through `RedactingExporter` and encoded to OTLP protobuf as the OTLP exporter would
  send it (then dropped: no collector's CPU is counted, only this process's);
- the same two modes again with every call served from a warm call cache (no HTTP): the framework's own CPU
  per call is then smallest, so tracing's share of it is largest.

Reported: process CPU (`time.process_time`) per call in each mode, the ratio on / off over all chunks and the
median of the chunks' ratios. Target: off costs nothing measurable (the helpers are a function call each); on
has no target: it is what the SDK charges per span, reported as measured.

Usage:
    python bench/otel_overhead.py [--examples 200] [--chunks 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import colab_graphs._env  # noqa: F401  (offline settings before litellm loads)
from colab_graphs import otel
from colab_graphs.api import as_examples
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.otel_export import RedactingExporter
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.runner import run_dataset

MEMBERS = ["a", "b", "c"]


def start_server(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    """The scripted server in its own process; returns (process, base_url)."""
    members = tmp / "members.json"
    members.write_text(json.dumps({m: f"Let me compute. The answer is {i}." for i, m in enumerate(MEMBERS)}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "colab_graphs.testing.server", "--port", "0", "--members", str(members)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "serving [...] at http://127.0.0.1:PORT/v1"
    if " at " not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, line.rsplit(" at ", 1)[1].strip()


class EncodeAndDrop(SpanExporter):
    """A span exporter that does the OTLP exporter's work in this process (encode to protobuf) and sends
    nothing."""

    def __init__(self) -> None:
        self.spans = 0
        self.bytes = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.bytes += len(encode_spans(spans).SerializeToString())
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def provider(exporter: EncodeAndDrop) -> TracerProvider:
    """What `--trace otlp` makes, with `exporter` in place of the OTLP one."""
    made = TracerProvider()
    made.add_span_processor(BatchSpanProcessor(RedactingExporter(exporter)))
    return made


def off_path_ns() -> float:
    """Nanoseconds the span helpers cost one call with tracing off: what every call, seat and play runs."""
    assert not otel.tracing_enabled()
    n = 200_000
    start = time.process_time_ns()  # (CPU time: wall time on a loaded machine counts others' turns)
    for _ in range(n):
        with (
            otel.play_span("run", MEMBERS, "id", "p") as span,
            otel.seat_span("s", "a"),
            otel.call_span(None, {}),
        ):
            otel.served(span, "cache")
            otel.play_result(span, 1.0, False, None)
    return (time.process_time_ns() - start) / n


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        server, base = start_server(Path(tmp))
        try:
            pool = Pool.from_dict(
                {m: {"model": f"openai/{m}", "api_base": base, "api_key": "sk-x"} for m in MEMBERS}
            )
            spec = build_protocol("majority_vote", pool.names)
            examples = as_examples("builtin:arithmetic", limit=args.examples)
            exporter = EncodeAndDrop()
            traced = provider(exporter)
            loop = asyncio.new_event_loop()
            cache = CallCache(Path(tmp) / "warm")
            # Warm the cache, and load everything once (tracing's modules included), outside the measure.
            otel.enable_tracing(tracer_provider=traced)
            loop.run_until_complete(
                run_dataset(spec, pool, examples, client=ModelClient(cache), stall_after=0)
            )
            traced.force_flush()
            otel.disable_tracing()
            cpu: dict[str, list[float]] = {m: [] for m in ("off", "on", "cached off", "cached on")}
            calls = 0
            for _ in range(args.chunks):
                for mode in cpu:
                    if mode.endswith("on"):
                        otel.enable_tracing(tracer_provider=traced)
                    client = ModelClient(cache if mode.startswith("cached") else None)
                    start = time.process_time()
                    outcomes, _ = loop.run_until_complete(
                        run_dataset(spec, pool, examples, client=client, stall_after=0)
                    )
                    traced.force_flush()
                    cpu[mode].append(time.process_time() - start)
                    otel.disable_tracing()
                    calls = sum(len(o.trace.calls) for o in outcomes)
            loop.close()
        finally:
            server.terminate()
            server.wait()
    per_call = {m: 1000 * sum(v) / (len(v) * calls) for m, v in cpu.items()}
    return {
        "date": str(date.today()),
        "machine": f"{os.cpu_count()} CPU, {platform.python_version()}, load {os.getloadavg()[0]:.1f}",
        "examples": args.examples,
        "calls_per_run": calls,
        "chunks": args.chunks,
        "cpu_ms_per_call": {m: round(v, 3) for m, v in per_call.items()},
        "ratio_on_off": round(per_call["on"] / per_call["off"], 3),
        "ratio_on_off_cached": round(per_call["cached on"] / per_call["cached off"], 3),
        "median_chunk_ratio": median_ratio(cpu["on"], cpu["off"]),
        "median_chunk_ratio_cached": median_ratio(cpu["cached on"], cpu["cached off"]),
        "off_helpers_ns_per_call": round(off_path_ns(), 1),
        "spans_exported": exporter.spans,
        "otlp_bytes_per_span": round(exporter.bytes / max(exporter.spans, 1), 1),
    }


def median_ratio(on: list[float], off: list[float]) -> float:
    return round(statistics.median(a / b for a, b in zip(on, off, strict=True)), 3)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--chunks", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
