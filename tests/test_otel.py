"""OpenTelemetry traces (colab_graphs.otel) of real runs and audits over ARC records, read back as a user's tools
read them: the SDK's in-memory exporter (the API), and a real OTLP/HTTP collector in this process receiving
protobuf (the CLI, in process and as a subprocess, with LiteLLM's own OpenTelemetry callback nesting under the
call spans). Each asserts one trace id per run, the span tree, the GenAI attributes against what the run wrote,
cached calls marked, and that no secret of the pool (key, header) is anywhere in what was exported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import cli_in_process
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import colab_graphs as cg
from colab_graphs import otel
from colab_graphs.pool import Pool
from colab_graphs.testing import ScriptedServer, answer_key
from colab_graphs.trace import read_traces

pytestmark = pytest.mark.integration

ARC = Path(__file__).parent / "fixtures" / "moco" / "arc_challenge.json"
RECORDS = json.loads(ARC.read_text())["test"][:3]
API_KEY = "sk-live-TRACE-0123456789abcdef"
HEADER = "hdr-TRACE-secret-7f3a9c2e"
SECRETS = [API_KEY, HEADER]


def members() -> dict[str, Any]:
    """Members that answer as models do: one right on every record, one always (A), one with prose and (B)."""
    right = {
        r["question"][:60]: f"Looking at the options, the correct option is ({r['answer']})." for r in RECORDS
    }
    return {
        "sage": answer_key(right),
        "guess": "The correct option is (A).",
        "hedge": "It is hard to say, but I lean towards (B) because of the wording.",
    }


def pool_dict(server: ScriptedServer, names: list[str]) -> dict[str, dict[str, Any]]:
    return {
        n: {
            "model": f"openai/{n}",
            "api_base": server.base_url,
            "api_key": API_KEY,
            "extra_headers": {"X-Team-Token": HEADER},
            "temperature": 0.2,
            "max_tokens": 48,
        }
        for n in names
    }


@pytest.fixture
def memory() -> Iterator[InMemorySpanExporter]:
    """Tracing on into the SDK's in-memory exporter (what the API user's own provider would get)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.enable_tracing(tracer_provider=provider)
    yield exporter
    otel.disable_tracing()


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP collector: POST /v1/traces with an ExportTraceServiceRequest (protobuf); keeps every body
    as received and every span decoded."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CollectorHandler)
        self.bodies: list[bytes] = []
        self.spans: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _CollectorHandler(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.bodies.append(body)
        for resource in request.resource_spans:
            service = {a.key: _value(a.value) for a in resource.resource.attributes}.get("service.name")
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.server.spans.append(
                        {
                            "name": span.name,
                            "trace": span.trace_id.hex(),
                            "id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex() or None,
                            "scope": scope.scope.name,
                            "service": service,
                            "status": span.status.message,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                        }
                    )
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    server.thread.start()
    yield server
    server.shutdown()
    server.server_close()


def as_dicts(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    """The exported spans in the collector's shape."""
    return [
        {
            "name": s.name,
            "trace": f"{s.context.trace_id:032x}",
            "id": f"{s.context.span_id:016x}",
            "parent": f"{s.parent.span_id:016x}" if s.parent else None,
            "scope": s.instrumentation_scope.name,
            "status": s.status.description or "",
            "attributes": dict(s.attributes or {}),
        }
        for s in exporter.get_finished_spans()
    ]


def children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in spans if s["parent"] == parent["id"]]


def assert_no_secret(spans: list[dict[str, Any]]) -> None:
    text = json.dumps(spans, default=str)
    for secret in SECRETS:
        assert secret not in text


def check_tree(spans: list[dict[str, Any]], root_name: str, example_ids: list[str]) -> list[dict[str, Any]]:
    """One trace; the root; run > example > coalition > seat > call below it. Returns the call spans."""
    ours = [s for s in spans if s["scope"] == "colab_graphs"]
    assert len({s["trace"] for s in spans}) == 1
    (root,) = [s for s in ours if s["parent"] is None]
    assert root["name"] == root_name
    examples = children(ours, root)
    assert sorted(s["attributes"]["colab_graphs.example.id"] for s in examples) == sorted(example_ids)
    calls = []
    for example in examples:
        assert example["name"] == "example"
        plays = children(ours, example)
        assert plays and all(p["name"].startswith(("coalition ", "solo ")) for p in plays)
        for play in plays:
            for seat in children(ours, play):
                assert seat["name"].startswith("seat ")
                (call,) = children(ours, seat)
                assert call["name"].startswith("chat openai/")
                assert (
                    call["attributes"]["colab_graphs.example.id"]
                    == example["attributes"]["colab_graphs.example.id"]
                )
                assert (
                    call["attributes"]["colab_graphs.coalition"]
                    == play["attributes"]["colab_graphs.coalition"]
                )
                calls.append(call)
    assert len(calls) == len([s for s in ours if s["name"].startswith("chat ")])  # no call outside a seat
    return calls


def test_api_run_is_one_trace_with_genai_attributes_and_cached_reruns(
    scripted_server, memory, tmp_path
) -> None:
    server = scripted_server(members())
    pool = Pool.from_dict(pool_dict(server, ["sage", "guess", "hedge"]))
    options = {"limit": 3, "out": tmp_path / "run", "cache_dir": tmp_path / "cache", "progress": False}
    result = cg.run("majority_vote", pool, str(ARC), **options)
    spans = as_dicts(memory)
    calls = check_tree(spans, "colab_graphs.run majority_vote", [r["id"] for r in RECORDS])
    assert_no_secret(spans)

    # Each call span says what traces.jsonl says of that call: member, model, tokens, finish reason.
    written = {
        (t.example_id, c.member): c for t in read_traces(tmp_path / "run" / "traces.jsonl") for c in t.calls
    }
    assert len(calls) == len(written) == 9
    for span in calls:
        a = span["attributes"]
        call = written[(a["colab_graphs.example.id"], a["colab_graphs.member"])]
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "openai"
        assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == f"openai/{call.member}"
        assert (a["gen_ai.request.temperature"], a["gen_ai.request.max_tokens"]) == (0.2, 48)
        assert a["gen_ai.usage.input_tokens"] == call.prompt_tokens > 0
        assert a["gen_ai.usage.output_tokens"] == call.completion_tokens > 0
        assert tuple(a["gen_ai.response.finish_reasons"]) == ("stop",)
        assert a["colab_graphs.seat"] == call.seat and a["colab_graphs.call.key"] == call.key
        assert (a["colab_graphs.call.cached"], a["colab_graphs.call.served_from"]) == (False, "upstream")
        assert a["server.address"] == "127.0.0.1"
        assert "gen_ai.input.messages" not in a and "gen_ai.output.messages" not in a  # content is opt-in
    # The plays' scores are on their spans, the run's totals on its root.
    root = next(s for s in spans if s["parent"] is None)
    assert root["attributes"]["colab_graphs.calls.made"] == 9
    assert root["attributes"]["colab_graphs.score"] == pytest.approx(result.summary["score"])
    scores = {s["attributes"]["colab_graphs.example.id"]: s["attributes"]["colab_graphs.score"]
              for s in spans if s["name"].startswith("coalition ")}  # fmt: skip
    assert scores == {o.example_id: o.score for o in result.outcomes}

    # The same run again: a new trace, every call served from the cache and marked so.
    memory.clear()
    cg.run("majority_vote", pool, str(ARC), **{**options, "out": tmp_path / "again"})
    again = check_tree(as_dicts(memory), "colab_graphs.run majority_vote", [r["id"] for r in RECORDS])
    assert {(c["attributes"]["colab_graphs.call.cached"], c["attributes"]["colab_graphs.call.served_from"])
            for c in again} == {(True, "cache")}  # fmt: skip
    assert {s["trace"] for s in as_dicts(memory)}.isdisjoint({s["trace"] for s in spans})


def test_api_audit_marks_calls_served_from_other_coalitions(scripted_server, memory, tmp_path) -> None:
    server = scripted_server(members())
    pool = Pool.from_dict(pool_dict(server, ["sage", "guess", "hedge"]))
    report = cg.run_audit("majority_vote", pool, str(ARC), limit=2, method="exact", play_every_coalition=True,
                          out=tmp_path / "audit", cache_dir=tmp_path / "cache", progress=False, plots=False)  # fmt: skip
    spans = as_dicts(memory)
    calls = check_tree(spans, "colab_graphs.audit majority_vote", [r["id"] for r in RECORDS[:2]])
    assert_no_secret(spans)
    plays = [s for s in spans if s["name"].startswith(("coalition ", "solo "))]
    # Exact Shapley over 3 members: the 7 non-empty coalitions and 3 solo runs on each of the 2 examples.
    assert len(plays) == 2 * (7 + 3)
    assert {p["attributes"]["colab_graphs.game"] for p in plays} == {"coalition", "solo"}
    served = [c["attributes"]["colab_graphs.call.served_from"] for c in calls]
    # Each of the 3 members is asked once per example upstream; every other seat takes that call.
    assert served.count("upstream") == report.calls.made == 6
    assert set(served) <= {"upstream", "memo", "single_flight", "cache"} and len(served) > 6
    for call in calls:
        a = call["attributes"]
        assert a["colab_graphs.call.cached"] == (a["colab_graphs.call.served_from"] != "upstream")
        assert a["gen_ai.usage.input_tokens"] > 0 and a["colab_graphs.member"] in pool.names


def test_content_is_recorded_only_when_asked_and_without_secrets(scripted_server, memory, tmp_path) -> None:
    # A member whose reply quotes a pool secret (a model repeating what it was shown): the content is recorded,
    # the secret is not.
    server = scripted_server({"parrot": f"My key is {API_KEY}. The correct option is (C)."})
    pool = Pool.from_dict(pool_dict(server, ["parrot"]))
    otel.capture_content()
    try:
        cg.run("solo", pool, str(ARC), limit=1, cache_dir=tmp_path / "cache", progress=False)
    finally:
        otel._content_asked = False
    spans = as_dicts(memory)
    (call,) = [s for s in spans if s["name"].startswith("chat ")]
    sent = json.loads(call["attributes"]["gen_ai.input.messages"])
    assert RECORDS[0]["question"] in sent[-1]["content"]
    replied = json.loads(call["attributes"]["gen_ai.output.messages"])
    assert replied[0]["role"] == "assistant" and "The correct option is (C)." in replied[0]["content"]
    assert_no_secret(spans)
    assert "[REDACTED]" in replied[0]["content"]


def test_cli_audit_exports_otlp_to_a_collector(scripted_server, collector, tmp_path, monkeypatch) -> None:
    server = scripted_server(members())
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump({"models": pool_dict(server, ["sage", "guess"])}))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-audits")
    try:
        result = cli_in_process("audit", "--protocol", "majority_vote", "--pool", tmp_path / "pool.yaml",
                                "--data", ARC, "--limit", 2, "--out", tmp_path / "audit", "--no-plots",
                                "--cache-dir", tmp_path / "cache", "--trace", "otlp")  # fmt: skip
        otel.flush_tracing()
    finally:
        otel.disable_tracing()
    assert result.returncode == 0, result.stdout + result.stderr
    spans = collector.spans
    check_tree(spans, "colab_graphs.audit majority_vote", [r["id"] for r in RECORDS[:2]])
    assert {s["service"] for s in spans} == {"my-audits"}
    assert all(secret.encode() not in body for body in collector.bodies for secret in SECRETS)


SUBPROCESS_RUN = """
import sys

class NoOpenTelemetry:  # the `otel` extra not installed (langsmith, which langchain-core loads, then goes without)
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(name)

if sys.argv[4] == "without-otel":
    sys.meta_path.insert(0, NoOpenTelemetry())
import colab_graphs as cg
from colab_graphs import otel
from colab_graphs.pool import Pool
pool = Pool.from_yaml(sys.argv[1])
try:
    cg.run("majority_vote", pool, sys.argv[2], limit=1, cache_dir=sys.argv[3], progress=False)
except otel.TracingUnavailable as err:
    print("refused:", err)
print("tracing", otel.tracing_enabled(), "colab_graphs.otel_export" in sys.modules)
"""


@pytest.mark.slow  # (subprocesses)
def test_off_by_default_needs_no_sdk_and_the_environment_turns_it_on(
    scripted_server, collector, tmp_path
) -> None:
    server = scripted_server(members())
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump({"models": pool_dict(server, ["sage", "guess"])}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLAB_GRAPHS_TRACE", "OTEL_"))}

    def play(env: dict[str, str], cache: str, sdk: str) -> list[str]:
        args = [sys.executable, "-c", SUBPROCESS_RUN, tmp_path / "pool.yaml", ARC, tmp_path / cache, sdk]
        done = subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    # Off: runs without the SDK at all, and nothing of ours is loaded or exported.
    assert play(env, "c1", "without-otel") == ["tracing False False"]
    assert collector.spans == []
    # Asked for without the SDK: refused before any call, saying what to install.
    asked = env | {"COLAB_GRAPHS_TRACE": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint}
    calls_before = len(server.requests)
    refused = play(asked, "c2", "without-otel")
    assert refused[0] == "refused: tracing needs the OpenTelemetry SDK: pip install 'colab-graphs[otel]'"
    assert len(server.requests) == calls_before
    # The environment alone turns it on (the batch exporter sends at exit).
    assert play(asked, "c3", "with-otel") == ["tracing True True"]
    calls = check_tree(collector.spans, "colab_graphs.run majority_vote", [RECORDS[0]["id"]])
    assert len(calls) == 2


@pytest.mark.slow  # (subprocesses)
def test_cli_run_with_litellm_callback_nests_its_spans_and_leaks_nothing(
    scripted_server, collector, tmp_path
) -> None:
    # A subprocess: LiteLLM's callback reads the process's global tracer provider, which `--trace otlp` sets.
    ok = scripted_server(members())
    leaky = scripted_server({}, echo_errors=True)  # a provider that quotes every header it was sent
    models = {**pool_dict(ok, ["sage", "guess"]), **{"leaky": pool_dict(leaky, ["leaky"])["leaky"]}}
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump({"models": models}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLAB_GRAPHS_TRACE", "OTEL_"))}
    env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "COLUMNS": "200"}
    command = [sys.executable, "-m", "colab_graphs.cli.app", "run", "--protocol", "majority_vote",
               "--pool", str(tmp_path / "pool.yaml"), "--data", str(ARC), "--limit", "2",
               "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--retries", "0",
               "--trace", "otlp", "--trace-content", "--litellm-callbacks", "otel"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr  # the leaky member's calls failed: examples failed
    spans = collector.spans
    ours = [s for s in spans if s["scope"] == "colab_graphs"]
    assert len({s["trace"] for s in spans}) == 1
    # LiteLLM's own spans are children of the call spans they belong to.
    by_id = {s["id"]: s for s in spans}
    litellm = [s for s in spans if s["scope"] != "colab_graphs"]
    assert litellm and all(
        by_id[s["parent"]]["name"].startswith(("chat openai/", "litellm")) for s in litellm
    )
    # The leaky member's calls failed with its echo of the request's headers, on the span, redacted.
    failed = [s for s in ours if s["name"] == "chat openai/leaky"]
    assert failed and all(s["attributes"]["error.type"] in ("bad_request", "malformed") for s in failed)
    assert all("rejected POST" in s["status"] and "[REDACTED]" in s["status"] for s in failed)
    content = [
        s["attributes"].get("gen_ai.input.messages", "") for s in ours if s["name"] == "chat openai/sage"
    ]
    assert content and all(
        RECORDS[0]["question"][:40] in c or RECORDS[1]["question"][:40] in c for c in content
    )
    assert all(secret.encode() not in body for body in collector.bodies for secret in SECRETS)


def test_api_study_is_one_trace_with_its_settings_and_audits(scripted_server, memory, tmp_path) -> None:
    server = scripted_server(members())
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump({"models": pool_dict(server, ["sage", "guess"])}))
    study = {"pools": {"p": "pool.yaml"}, "protocols": ["majority_vote"], "datasets": [str(ARC)], "limit": 2}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    cg.run_study(tmp_path / "study.yaml", tmp_path / "study", cache_dir=tmp_path / "cache", progress=False)
    spans = as_dicts(memory)
    assert len({s["trace"] for s in spans}) == 1
    (root,) = [s for s in spans if s["parent"] is None]
    assert root["name"] == "colab_graphs.study majority_vote"
    below = children(spans, root)
    settings = [s for s in below if s["name"].startswith("colab_graphs.setting ")]
    audits = [s for s in below if s["name"].startswith("colab_graphs.audit ")]
    keys = {s["attributes"]["colab_graphs.setting"] for s in settings}
    assert keys == {"p/majority_vote/arc_challenge", "p/solo/arc_challenge"}
    assert audits and {a["name"] for a in audits} == {"colab_graphs.audit majority_vote"}
    for setting in settings:  # each setting's plays: example > coalition > seat > call
        examples = children(spans, setting)
        assert sorted(e["attributes"]["colab_graphs.example.id"] for e in examples) == sorted(
            r["id"] for r in RECORDS[:2]
        )
        for example in examples:
            for play in children(spans, example):
                for seat in children(spans, play):
                    assert [c["name"] for c in children(spans, seat)][0].startswith("chat openai/")
    assert_no_secret(spans)


EXAMPLES = Path(__file__).parent.parent / "examples"


def test_an_apps_sync_nodes_nest_under_the_users_own_span(scripted_server, memory, tmp_path) -> None:
    # The ReAct agent + critic app of examples/ (sync nodes, LangGraph's prebuilt agent): its calls are made from
    # executor threads through the background loop; each still lands under its play, inside the user's span.
    import importlib.util

    from colab_graphs.testing.scripts import load_members

    server = scripted_server(load_members(f"{EXAMPLES}/agent_members.py:CRITIC_TEAM"))
    pool = Pool.from_dict(pool_dict(server, ["solver", "critic"]))
    spec = importlib.util.spec_from_file_location("react_critic_app", EXAMPLES / "react_critic_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tracer = otel._state.tracer  # the provider the user gave
    with tracer.start_as_current_span("my service"):
        cg.run(module.app, pool, str(EXAMPLES / "calculator_questions.jsonl"), limit=2,
               cache_dir=tmp_path / "cache", progress=False)  # fmt: skip
    spans = as_dicts(memory)
    assert len({s["trace"] for s in spans}) == 1
    (mine,) = [s for s in spans if s["parent"] is None]
    assert mine["name"] == "my service"
    (run,) = children(spans, mine)
    assert run["name"].startswith("colab_graphs.run ")
    calls = [s for s in spans if s["name"].startswith("chat ")]
    made = sum(server.request_counts().values())
    assert len(calls) == made > 2
    by_id = {s["id"]: s for s in spans}
    for call in calls:  # call < seat (the node that called) < coalition < example < run
        seat = by_id[call["parent"]]
        assert seat["name"] == f"seat {call['attributes']['colab_graphs.node']}"
        assert by_id[seat["parent"]]["name"].startswith("coalition ")
        assert call["attributes"]["colab_graphs.member"] in ("solver", "critic")
    assert "critique" in {c["attributes"]["colab_graphs.node"] for c in calls}  # the critic's node
    assert_no_secret(spans)


def test_cli_refuses_an_unknown_exporter_or_callback_before_anything_runs(tmp_path) -> None:
    bad = cli_in_process("run", "--protocol", "solo", "--data", ARC, "--limit", 1, "--trace", "jaeger")
    assert bad.returncode == 2 and "unknown trace exporter 'jaeger'" in bad.stdout + bad.stderr
    assert not otel.tracing_enabled()
    wrong = cli_in_process(
        "audit", "--protocol", "solo", "--litellm-callbacks", "langfuze", "--out", tmp_path
    )
    assert wrong.returncode == 2 and "LiteLLM has no callback named 'langfuze'" in wrong.stdout + wrong.stderr


def test_the_exporter_cleans_what_other_libraries_write_on_spans(scripted_server) -> None:
    # What LiteLLM's callback (or any library) writes on a span reaches the exporter cleaned: strings, lists,
    # events and the status text; a span with nothing to clean is passed as it is.
    from opentelemetry.trace import Status, StatusCode

    from colab_graphs.otel_export import RedactingExporter

    Pool.from_dict(pool_dict(scripted_server({}), ["sage"]))  # registers the pool's secrets, as loading does
    inner = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(RedactingExporter(inner)))
    tracer = provider.get_tracer("another library")
    with tracer.start_as_current_span("leaky") as span:
        span.set_attribute(
            "hidden_params", json.dumps({"api_key": API_KEY, "headers": {"X-Team-Token": HEADER}})
        )
        span.set_attribute("llm.headers", [f"Authorization: Bearer {API_KEY}", "x"])
        span.add_event("request", {"body": f"key={API_KEY}"})
        span.set_status(Status(StatusCode.ERROR, f"401 for key {API_KEY}"))
    with tracer.start_as_current_span("clean") as span:
        span.set_attribute("gen_ai.request.model", "openai/sage")
    leaky, clean = inner.get_finished_spans()
    text = json.dumps(
        [dict(leaky.attributes), [dict(e.attributes) for e in leaky.events], leaky.status.description]
    )
    assert API_KEY not in text and HEADER not in text and text.count("[REDACTED]") == 5
    assert clean.attributes["gen_ai.request.model"] == "openai/sage"


def test_a_priced_call_carries_its_cost(scripted_server, memory, tmp_path) -> None:
    # A member that is a model LiteLLM's price table knows, served by the scripted server under that name.
    server = scripted_server({"gpt-4o-mini": "Between the options, the correct option is (C)."})
    pool = Pool.from_dict({"mini": {**pool_dict(server, ["x"])["x"], "model": "openai/gpt-4o-mini"}})
    result = cg.run("solo", pool, str(ARC), limit=1, cache_dir=tmp_path / "cache", progress=False)
    (call,) = [s for s in as_dicts(memory) if s["name"] == "chat openai/gpt-4o-mini"]
    (made,) = result.outcomes[0].trace.calls
    assert made.cost_usd and call["attributes"]["colab_graphs.call.cost_usd"] == pytest.approx(made.cost_usd)
    assert call["attributes"]["colab_graphs.member"] == "mini"
