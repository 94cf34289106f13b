"""Where `colab_graphs.otel`'s spans go when it makes the tracer provider: OTLP (HTTP/protobuf, or gRPC where
installed) or the console, every span passing `RedactingExporter` on its way.

Imported only when tracing is turned on (it imports the OpenTelemetry SDK).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Status

from colab_graphs.otel_common import INSTALL_HINT, TracingUnavailable, clean
from colab_graphs.redaction import redact


def make_provider(exporter: str) -> TracerProvider:
    """A provider exporting to "otlp" (batched) or "console" (each span on stderr as it ends). Its resource is the
    standard variables' (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), the service named "colab-graphs"
    unless they name it."""
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "colab-graphs"})
    provider = TracerProvider(resource=resource)
    if exporter == "console":
        provider.add_span_processor(
            SimpleSpanProcessor(RedactingExporter(ConsoleSpanExporter(out=sys.stderr)))
        )
    else:
        provider.add_span_processor(BatchSpanProcessor(RedactingExporter(otlp_exporter())))
    return provider


def otlp_exporter() -> SpanExporter:
    """The OTLP exporter the standard variables ask for: HTTP/protobuf unless ``OTEL_EXPORTER_OTLP_PROTOCOL``
    (or ``..._TRACES_PROTOCOL``) says grpc. It reads its endpoint, headers and timeout from them itself."""
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or ""
    ).strip()
    if protocol == "grpc":
        module = "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
        hint = "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs pip install opentelemetry-exporter-otlp-proto-grpc"
    elif protocol in ("", "http/protobuf"):
        module = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
        hint = f"the OTLP exporter is not installed: {INSTALL_HINT}"
    else:
        raise TracingUnavailable(f"OTLP protocol {protocol!r} is not supported; use http/protobuf or grpc")
    try:
        exporter: SpanExporter = importlib.import_module(module).OTLPSpanExporter()
    except ImportError:
        raise TracingUnavailable(hint) from None
    return exporter


class RedactingExporter(SpanExporter):
    """Hands `inner` each span with every string attribute (the span's and its events') passed through
    `hide_secrets` and its status text through `redact`: what another library wrote on a span (LiteLLM's
    callback, on the call span it is given as parent) is cleaned as surely as what `colab_graphs.otel` wrote."""

    def __init__(self, inner: SpanExporter):
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([redacted(s) for s in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def redacted(span: ReadableSpan) -> ReadableSpan:
    """`span` with its attributes, its events' attributes and its status text cleaned of secrets (the span
    itself when nothing in it changes: what this package wrote is clean already)."""
    status = span.status
    if status.description:
        status = Status(status.status_code, redact(status.description))
    attributes = span.attributes or {}
    if (
        status.description == span.status.description
        and not span.events
        and all(_clean_already(v) for v in attributes.values())
    ):
        return span
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes={k: clean(v) for k, v in (span.attributes or {}).items()},
        events=[
            Event(e.name, {k: clean(v) for k, v in (e.attributes or {}).items()}, e.timestamp)
            for e in span.events
        ],
        links=span.links,
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _clean_already(value: Any) -> bool:
    cleaned = clean(value)
    return bool(cleaned == (tuple(value) if isinstance(value, list | tuple) else value))
