"""OpenTelemetry traces of runs, audits and studies, for the user's own tools (any OTLP collector, Langfuse).

Off by default, and then free: nothing here imports `opentelemetry` until tracing is turned on, and every span
helper below returns one shared no-op context at the cost of a function call. Turned on by the CLI's
`--trace otlp|console|global` (`--trace-content` adds prompts and replies), by the environment
(``COLAB_GRAPHS_TRACE=otlp|console|global``, read when a run, audit or study starts) or by `enable_tracing`.
It needs the ``otel`` extra (``pip install 'colab-graphs[otel]'``): asked for without it, it fails before any
call, saying so.

One trace per run, audit or study (a study's audits nest under it), its spans nested as the work is:

    colab_graphs.run | colab_graphs.audit | colab_graphs.study
      example                    (one dataset example: an audit plays all its coalitions under it)
        coalition a,b            (one play: the protocol restricted to the coalition; `solo a` alone)
          seat NAME              (one graph node's turn; a seat of a user's app is the node that called)
            chat MODEL           (one model call: GenAI semantic-convention attributes)

A span follows the work through asyncio because OpenTelemetry keeps the current span in a `contextvars`
variable, which every task created inside the span copies (LangGraph's node tasks, the runner's `gather`); the
call loop, where model calls are sent from another thread, is handed the caller's context explicitly
(`colab_graphs.models.loops.on_call_loop`), and a call through LiteLLM names its call span as LiteLLM's parent
(`metadata["litellm_parent_otel_span"]`), so LiteLLM's own OpenTelemetry or Langfuse callbacks nest under it.

The call span carries the GenAI conventions' attributes (``gen_ai.operation.name`` "chat",
``gen_ai.provider.name`` and the older ``gen_ai.system``, ``gen_ai.request.*``, ``gen_ai.response.model``,
``gen_ai.usage.input_tokens`` / ``output_tokens``, ``gen_ai.response.finish_reasons``) and colab-graphs' own
(``colab_graphs.member``, ``.seat``, ``.node``, ``.example.id``, ``.coalition``, ``.call.cached``,
``.call.served_from``: upstream, cache, single_flight or memo, ``.call.cost_usd``). Prompts and replies
(``gen_ai.input.messages`` / ``gen_ai.output.messages``) only when asked (`content`, ``--trace-content``,
``COLAB_GRAPHS_TRACE_CONTENT=1`` or the conventions' ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``).

Secrets never reach a span: no attribute holds a key, a header or a URL's userinfo or query (a server is named
by its host and port), error texts pass through `colab_graphs.redaction.redact`, content through
`hide_secrets`, and the exporters set up here pass every string attribute of every span they export (LiteLLM's
included) through `hide_secrets` once more.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from colab_graphs.otel_common import INSTALL_HINT, TracingUnavailable, clean
from colab_graphs.redaction import hide_secrets, redact

T = TypeVar("T")

ENV_SWITCH = "COLAB_GRAPHS_TRACE"
ENV_CONTENT = "COLAB_GRAPHS_TRACE_CONTENT"
SEMCONV_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
EXPORTERS = ("otlp", "console", "global")
OFF = ("", "0", "off", "none", "false", "no")
TRACER_NAME = "colab_graphs"

# LiteLLM provider prefixes -> the GenAI conventions' `gen_ai.provider.name` (other prefixes are kept as they are).
_PROVIDERS = {
    "openai": "openai",
    "text-completion-openai": "openai",
    "anthropic": "anthropic",
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock",
    "vertex_ai": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
    "mistral": "mistral_ai",
    "xai": "x_ai",
    "watsonx": "ibm.watsonx.ai",
    "local": "colab_graphs.local",
}
# Generation settings -> their `gen_ai.request.*` attribute.
_REQUEST_SETTINGS = {
    "temperature": "gen_ai.request.temperature",
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "seed": "gen_ai.request.seed",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "n": "gen_ai.request.choice.count",
}


@dataclass
class _Tracing:
    tracer: Any
    # The provider this module made (flushed and shut down here); None: the global one, or one given.
    provider: Any
    content: bool


_state: _Tracing | None = None
_explicit = False  # enable_tracing / disable_tracing called: the environment is no longer read
_env_value = ""  # COLAB_GRAPHS_TRACE as last read
_content_asked = False  # `capture_content()`: prompts and replies on, whenever tracing is
# The play being run (example id, coalition, game): what each call span under it repeats, so that a collector
# can filter calls by example and coalition without walking up the tree.
_play: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "colab_graphs_play", default=None
)
_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() not in OFF


def enable_tracing(
    exporter: str = "otlp", *, content: bool | None = None, tracer_provider: Any = None
) -> None:
    """Turn tracing on for this process (again: replaces the earlier setting, flushing it).

    Args:
        exporter: "otlp" (OTLP over HTTP/protobuf, configured by the standard ``OTEL_EXPORTER_OTLP_*``
            variables: endpoint, headers, timeout; ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` takes the gRPC exporter
            where it is installed), "console" (spans printed on stderr), or "global" (the tracer provider the
            process has already set: the user's own, Langfuse's, Logfire's). For "otlp" and "console" a provider
            is made (resource from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, default service name
            "colab-graphs") and set as the global one when none is, so LiteLLM's OpenTelemetry callback exports
            through it too.
        content: record prompts and replies on call spans (default: the environment's
            ``COLAB_GRAPHS_TRACE_CONTENT`` or ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``, else off).
        tracer_provider: a provider to use instead (an SDK `TracerProvider`, e.g. with an in-memory exporter).

    Raises:
        TracingUnavailable: the ``otel`` extra is not installed, or `exporter` is not one of the above.
    """
    global _explicit
    _set(_tracing(exporter, content, tracer_provider))
    _explicit = True


def _tracing(exporter: str, content: bool | None, tracer_provider: Any) -> _Tracing:
    if content is None:
        content = _truthy(os.environ.get(ENV_CONTENT)) or _truthy(os.environ.get(SEMCONV_CONTENT))
    try:
        from opentelemetry import trace
    except ImportError:
        raise TracingUnavailable(f"tracing needs the OpenTelemetry SDK: {INSTALL_HINT}") from None
    provider, owned = tracer_provider, None
    if provider is None:
        if exporter == "global":
            provider = trace.get_tracer_provider()
        elif exporter in EXPORTERS:
            provider = owned = _make_provider(exporter)
            if not _global_set(trace):
                trace.set_tracer_provider(provider)
        else:
            raise TracingUnavailable(
                f"unknown trace exporter {exporter!r}; use one of {', '.join(EXPORTERS)}"
            )
    return _Tracing(provider.get_tracer(TRACER_NAME), owned, bool(content or _content_asked))


def _set(tracing: _Tracing | None) -> None:
    """`tracing` in force (None: off); the one it replaces is flushed, and shut down if made here."""
    global _state
    old, _state = _state, tracing
    provider: Any = old.provider if old is not None else None
    if provider is not None:
        from opentelemetry import trace

        # The global provider stays usable (LiteLLM's callback may hold it); one of ours alone is shut down.
        global_one = provider is trace.get_tracer_provider()
        provider.force_flush() if global_one else provider.shutdown()


def capture_content() -> None:
    """Record prompts and replies on call spans (the CLI's ``--trace-content``), now or once tracing is on."""
    global _content_asked
    _content_asked = True
    if _state is not None:
        _state.content = True


def disable_tracing() -> None:
    """Turn tracing off (what was recorded is flushed; a provider made here is shut down); the environment's
    ``COLAB_GRAPHS_TRACE`` is then not read either."""
    global _explicit
    _set(None)
    _explicit = True


def tracing_enabled() -> bool:
    return _state is not None


def flush_tracing(timeout_ms: int = 30_000) -> None:
    """Export what is recorded now (a batch exporter otherwise sends every few seconds, and a provider made
    here flushes at the process's exit)."""
    if _state is None:
        return
    provider = _state.provider
    if provider is None:
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
    flush = getattr(provider, "force_flush", None)
    if flush is not None:
        flush(timeout_ms)


def tracing_from_env() -> None:
    """Tracing as ``COLAB_GRAPHS_TRACE`` says now ("1" / "true" / "on" mean "otlp"; ``OTEL_SDK_DISABLED=true``
    keeps it off), unless `enable_tracing` or `disable_tracing` was called: an explicit setting wins. Read at
    the start of each run, audit and study (one lookup), so a notebook that sets the variable is heard."""
    global _env_value
    if _explicit:
        return
    value = (os.environ.get(ENV_SWITCH) or "").strip().lower()
    if (os.environ.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
        value = ""
    if value == _env_value:
        return
    if value in OFF:
        _set(None)
    else:
        _set(_tracing("otlp" if value in ("1", "true", "on", "yes") else value, None, None))
    _env_value = value


def _global_set(trace: Any) -> bool:
    return not type(trace.get_tracer_provider()).__name__.startswith(("Proxy", "NoOp"))


def _make_provider(exporter: str) -> Any:
    from colab_graphs.otel_export import make_provider

    return make_provider(exporter)


# --- spans ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _span(name: str, attributes: Mapping[str, Any], kind: Any = None) -> Iterator[Any]:
    """A span current while the block runs. An exception ends it with an ERROR status whose text is redacted
    (the SDK's own recording would write the exception's text and stack as they are)."""
    from opentelemetry.trace import Status, StatusCode

    assert _state is not None
    options = {"kind": kind} if kind is not None else {}
    clean_values = {k: clean(v) for k, v in attributes.items() if v is not None}
    with _state.tracer.start_as_current_span(
        name, attributes=clean_values, record_exception=False, set_status_on_exception=False, **options
    ) as span:
        try:
            yield span
        except BaseException as exc:
            if span.is_recording() and not span.status.description:
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, redact(f"{type(exc).__name__}: {exc}")[:2000]))
            raise


def root_span(
    kind: str, protocol: str, members: Sequence[str], n_examples: int, setting: str | None = None
) -> Any:
    """The trace of one run, audit or study ("run" / "audit" / "study"; a study's "setting": one protocol, pool
    and dataset played); reads ``COLAB_GRAPHS_TRACE`` first. Inside another span (a study's audit, the user's
    own span) it is that span's child."""
    tracing_from_env()
    if _state is None:
        return _NULL
    attributes = {
        "colab_graphs.kind": kind,
        "colab_graphs.setting": setting,
        "colab_graphs.protocol": protocol or None,
        "colab_graphs.members": list(members) or None,
        "colab_graphs.examples": n_examples or None,
    }
    return _span(f"colab_graphs.{kind}" + (f" {protocol}" if protocol else ""), attributes)


def example_span(example_id: str) -> Any:
    if _state is None:
        return _NULL
    return _span("example", {"colab_graphs.example.id": example_id})


@contextlib.contextmanager
def _play_span(game: str, members: Sequence[str], example_id: str, protocol: str) -> Iterator[Any]:
    coalition = ",".join(members)
    play = {
        "colab_graphs.example.id": example_id,
        "colab_graphs.coalition": coalition,
        "colab_graphs.game": game,
    }
    name = f"{'solo' if game == 'solo' else 'coalition'} {coalition}"
    with _span(name, {**play, "colab_graphs.protocol": protocol}) as span:
        token = _play.set(play)
        try:
            yield span
        finally:
            _play.reset(token)


def play_span(game: str, members: Sequence[str], example_id: str, protocol: str) -> Any:
    """One play: `members` (the coalition) run on one example; yields the span (None when off)."""
    if _state is None:
        return _NULL
    return _play_span(game, members, example_id, protocol)


def play_result(span: Any, score: float | None, failed: bool, error: str | None) -> None:
    """What the play scored (or why it failed) on its span."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("colab_graphs.failed", failed)
    if score is not None:
        span.set_attribute("colab_graphs.score", float(score))
    if failed:
        span.set_status(Status(StatusCode.ERROR, redact(error or "failed")))


def seat_span(seat: str | None, member: str | None) -> Any:
    """One seat's turn (a graph node); its calls nest under it."""
    if _state is None:
        return _NULL
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": seat,
        "colab_graphs.seat": seat,
        "colab_graphs.member": member,
        **(_play.get() or {}),
    }
    return _span(f"seat {seat or member}", attributes)


def _provider(model: str) -> str:
    prefix = model.split("/", 1)[0] if "/" in model else "openai"
    return _PROVIDERS.get(prefix, prefix)


def _server(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The server a call goes to, by host and port only (no userinfo, no query: they can hold secrets)."""
    base = settings.get("api_base") or settings.get("base_url")
    if not isinstance(base, str):
        return {}
    try:
        parts = urlsplit(base)
        return {"server.address": parts.hostname, "server.port": parts.port}
    except ValueError:
        return {}


class CallSpan:
    """The span of one model call, while it is in progress: `served` says where its reply came from, `done`
    and `failed` finish its attributes."""

    def __init__(self, span: Any, content: bool):
        self.span = span
        self.content = content
        self.served_from = "upstream"

    def done(self, call: Any) -> None:
        span = self.span
        span.set_attribute("gen_ai.response.model", call.model)
        span.set_attribute("gen_ai.usage.input_tokens", call.usage.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", call.usage.completion_tokens)
        if call.finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [call.finish_reason])
        span.set_attribute("colab_graphs.call.cached", bool(call.cached))
        span.set_attribute("colab_graphs.call.served_from", self.served_from if call.cached else "upstream")
        span.set_attribute("colab_graphs.call.attempts", call.attempts)
        if call.cost_usd is not None:
            span.set_attribute("colab_graphs.call.cost_usd", float(call.cost_usd))
        if self.content:
            output = {"role": "assistant", "content": call.text}
            if call.tool_calls:
                output["tool_calls"] = call.tool_calls
            span.set_attribute("gen_ai.output.messages", hide_secrets(json.dumps([output], default=str)))

    def failed(self, kind: str, detail: str, attempts: int) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("error.type", kind)
        self.span.set_attribute("colab_graphs.call.attempts", attempts)
        self.span.set_status(Status(StatusCode.ERROR, redact(detail)[:2000]))


@contextlib.contextmanager
def _call_span(asked: Any, settings: Mapping[str, Any]) -> Iterator[CallSpan]:
    from opentelemetry.trace import SpanKind

    assert _state is not None
    model = str(asked.model)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": _provider(model),
        "gen_ai.system": _provider(model),
        "gen_ai.request.model": model,
        **_server(settings),
        "colab_graphs.member": asked.member,
        "colab_graphs.seat": asked.seat,
        "colab_graphs.node": asked.node,
        "colab_graphs.call.key": asked.key,
        "colab_graphs.call.sample": asked.sample or None,
        **(_play.get() or {}),
    }
    for setting, value in asked.settings.items():
        name = _REQUEST_SETTINGS.get(setting)
        if name is not None and isinstance(value, int | float) and not isinstance(value, bool):
            attributes[name] = value
    stop = asked.settings.get("stop")
    if isinstance(stop, str | list):
        attributes["gen_ai.request.stop_sequences"] = (
            [stop] if isinstance(stop, str) else [str(s) for s in stop]
        )
    if _state.content:
        attributes["gen_ai.input.messages"] = hide_secrets(json.dumps(asked.messages, default=str))
    with _span(f"chat {model}", attributes, SpanKind.CLIENT) as span:
        yield CallSpan(span, _state.content)


def call_span(asked: Any, settings: Mapping[str, Any]) -> Any:
    """One model call (`asked`: the `colab_graphs.trace.Call` as asked: member, model, messages, generation
    settings, cache key); yields a `CallSpan` (None when off). `settings` are the member's, read only for the
    server's host and port."""
    if _state is None:
        return _NULL
    return _call_span(asked, settings)


def served(span: CallSpan | None, source: str) -> None:
    """Where a cached call's reply came from: "cache" or "single_flight" (an identical call in flight)."""
    if span is not None:
        span.served_from = source


def replayed_call(call: Any) -> None:
    """A call served again from the example's memo (another coalition made it), inside its seat's span: an
    instant call span, marked cached and served from "memo"."""
    if _state is None:
        return
    with _call_span(call, {}) as span:
        span.served_from = "memo"
        span.done(call)


def litellm_parented(kwargs: dict[str, Any]) -> dict[str, Any]:
    """LiteLLM's kwargs naming the call span in progress as the parent of LiteLLM's own spans (its ``otel``
    and ``langfuse_otel`` callbacks read ``metadata["litellm_parent_otel_span"]``); unchanged when off."""
    if _state is None:
        return kwargs
    from opentelemetry import trace

    span = trace.get_current_span()
    if not span.is_recording():
        return kwargs
    metadata = {**(kwargs.get("metadata") or {}), "litellm_parent_otel_span": span}
    return {**kwargs, "metadata": metadata}


def carried(coro: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    """`coro` run, wherever it runs, in the OpenTelemetry context of the caller (for the call loop, another
    thread's loop, whose tasks do not copy this one's context); unchanged when off."""
    if _state is None:
        return coro
    from opentelemetry import context

    captured = context.get_current()

    async def run() -> T:
        token = context.attach(captured)
        try:
            return await coro
        finally:
            context.detach(token)

    return run()


def totals(span: Any, summary: Mapping[str, Any]) -> None:
    """A run's (or an audit's) score, calls and cost on its root span (`span` None: off, nothing to do)."""
    if span is None or not hasattr(span, "set_attribute"):
        return
    calls = summary.get("calls") or {}
    values = {
        "colab_graphs.score": summary.get("score"),
        "colab_graphs.failed_examples": summary.get("failed"),
        "colab_graphs.calls.made": calls.get("made"),
        "colab_graphs.calls.cached": calls.get("cached"),
        "colab_graphs.calls.failed": calls.get("failed"),
        "colab_graphs.cost_usd": summary.get("cost_usd"),
    }
    for name, value in values.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            span.set_attribute(name, value)
