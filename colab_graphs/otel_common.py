"""What `colab_graphs.otel` (spans, no SDK import while tracing is off) and `colab_graphs.otel_export` (the
SDK's exporters) share, apart so that neither imports the other back."""

from __future__ import annotations

from typing import Any

from colab_graphs.redaction import hide_secrets

INSTALL_HINT = "pip install 'colab-graphs[otel]'"


class TracingUnavailable(ValueError):
    """Tracing was asked for and cannot be given (the `otel` extra missing, an unknown exporter): said before
    any call, never skipped in silence."""


def clean(value: Any) -> Any:
    """An attribute value as a span may carry it: strings (alone or in a list) without registered secrets."""
    if isinstance(value, str):
        return hide_secrets(value)
    if isinstance(value, tuple | list):
        return tuple(hide_secrets(v) if isinstance(v, str) else v for v in value)
    return value
