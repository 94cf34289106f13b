"""The call path's direct lane (`colab_graphs.models.direct`): plain chat calls to an OpenAI-compatible server
posted without LiteLLM, with the same request, reply, price, failures and audit numbers as through LiteLLM.

Every check sends the same call both ways (`ModelClient(direct=True)` and `ModelClient(direct=False)`) over
real HTTP and compares: what the server received, and what the call path recorded. The scripted server answers
the ordinary shapes; `CannedServer` below serves reply bodies the scripted server never writes (a finish reason
of another provider, no usage, a tool call without an id, error statuses), as servers out there do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from colab_graphs.audit.run import play_audit
from colab_graphs.models.client import CallError, ModelClient
from colab_graphs.models.direct import direct_request, finish_reason, openai_model_name
from colab_graphs.pool import Member, Pool
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.tasks.builtin import builtin_task
from colab_graphs.testing import Reply, ToolCall, arithmetic_solver, echo

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Add 2 and 2.", "name": "ada"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "4"},
    {"role": "user", "content": "And in words? \u00e9\u263a", "name": None},
]  # fmt: skip


def both_lanes(**kwargs: Any) -> tuple[ModelClient, ModelClient]:
    return (
        ModelClient(None, direct=True, backoff_s=0.01, **kwargs),
        ModelClient(None, direct=False, backoff_s=0.01, **kwargs),
    )


def goes_direct(
    client: ModelClient, member: Member, messages: list[dict[str, Any]], **overrides: Any
) -> bool:
    _, kwargs = client.canonical_request(member, messages, overrides=overrides)
    return direct_request(member, {"timeout": client.timeout_s, **kwargs}) is not None


def recorded(call: Any) -> dict[str, Any]:
    """What the call path keeps of a reply (the cache entry and the trace's reply fields)."""
    return {
        k: getattr(call, k)
        for k in ("completion", "tool_calls", "finish_reason", "usage", "cost_usd", "logprobs")
    }


# --- requests ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, messages",
    [
        ({}, QUESTION),
        ({"temperature": 0.0, "max_tokens": 16, "seed": 3, "top_p": 0.9, "stop": ["\n"], "n": 1}, QUESTION),
        ({"logprobs": True, "top_logprobs": 2}, QUESTION),
        ({"tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": False}, CONVERSATION),
        ({"response_format": {"type": "json_object"}}, QUESTION),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}}, QUESTION),
        ({"extra_body": {"top_k": 5, "min_p": 0.1}, "max_completion_tokens": 9}, QUESTION),
        ({"presence_penalty": 0.1, "frequency_penalty": 0.2, "logit_bias": {"1": 2}, "reasoning_effort": "low"}, QUESTION),
        ({"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6, "timeout": 30, "num_retries": 2}, QUESTION),
    ],
    ids=["plain", "sampling", "logprobs", "tools", "json", "schema", "extra-body", "penalties", "priced"],
)  # fmt: skip
def test_a_direct_call_sends_the_request_litellm_sends(scripted_server, arun, settings, messages) -> None:
    server = scripted_server({"m": echo()})
    member = Pool.from_dict({"m": {"model": "openai/m", "api_base": server.base_url, "api_key": "k"}})["m"]
    fast, slow = both_lanes()
    assert goes_direct(fast, member, messages, **settings)
    sent = []
    for client in (fast, slow):
        arun(client.complete(member, messages, overrides=settings))
        request = server.requests[-1]
        sent.append((request.model, request.messages, request.params))
    assert sent[0] == sent[1]


def test_a_direct_call_sends_the_headers_litellm_sends(arun, canned_server) -> None:
    settings = {"extra_headers": {"X-Team": "blue"}, "headers": {"X-Run": "7"}, "organization": "org-1"}
    member = canned_server.member(api_key="sk-direct-key", **settings)
    fast, slow = both_lanes()
    names = ("authorization", "x-team", "x-run", "openai-organization", "content-type")
    seen = []
    for client in (fast, slow):
        arun(client.complete(member, QUESTION))
        headers = {k.lower(): v for k, v in canned_server.received[-1]["headers"].items()}
        seen.append({name: headers.get(name) for name in names})
    assert seen[0] == seen[1] and seen[0]["authorization"] == "Bearer sk-direct-key"


@pytest.mark.parametrize(
    "model, settings, messages",
    [
        ("hosted_vllm/m", {}, QUESTION),  # LiteLLM's vLLM provider rewrites tools and messages
        ("openai/gpt-4o-mini", {}, QUESTION),  # OpenAI's own models: LiteLLM rewrites their parameters
        ("openai/o3", {}, QUESTION),
        ("openai/m", {"top_k": 5}, QUESTION),  # not an OpenAI parameter
        ("openai/m", {"user": "u1"}, QUESTION),
        ("openai/m", {}, [{"role": "developer", "content": "d"}, *QUESTION]),
        ("openai/m", {}, [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
        ("openai/m", {"api_base": "https://api.openai.com/v1"}, QUESTION),
        ("openai/m", {"api_key": None}, QUESTION),
        ("openai/m", {"deployments": [{"api_base": "http://127.0.0.1:9/v1"}]}, QUESTION),
        ("openai/m", {"api_base": "http://user:pass@127.0.0.1:9/v1"}, QUESTION),
        ("openai/m", {"api_base": "http://127.0.0.1:9/v1?key=k"}, QUESTION),
        ("openai/m", {"api_base": "http://10.9.8.7:9/v1"}, QUESTION),  # HTTP_PROXY below applies to it
    ],
    ids=["hosted-vllm", "openai-model", "o-series", "top-k", "user", "developer", "parts", "openai-api", "no-key",
         "router", "url-credentials", "url-query", "proxy"],
)  # fmt: skip
def test_calls_litellm_would_change_go_through_litellm(monkeypatch, model, settings, messages) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    entry = {"model": model, "api_base": "http://127.0.0.1:9/v1", "api_key": "k", **settings}
    deployments = entry.pop("deployments", [])
    member = Member(
        name="m", settings={k: v for k, v in entry.items() if v is not None}, deployments=deployments
    )
    assert not goes_direct(ModelClient(None), member, messages)


def test_every_chat_model_of_litellms_openai_catalogue_goes_through_litellm() -> None:
    import litellm

    catalogue = set(litellm.open_ai_chat_completion_models) | set(litellm.open_ai_text_completion_models)
    chat = {
        n
        for n in catalogue
        if litellm.model_cost.get(n, {}).get("mode") in ("chat", "completion", "responses")
    }
    assert chat and not [name for name in sorted(chat) if not openai_model_name(name)]
    assert not openai_model_name("openai/gpt-oss-20b") and not openai_model_name("Qwen/Qwen2.5-7B-Instruct")


# --- replies -----------------------------------------------------------------------------------------------


def test_a_providers_finish_reason_reads_as_litellm_maps_it() -> None:
    from litellm.litellm_core_utils.core_helpers import _FINISH_REASON_MAP, map_finish_reason

    for reason in [*_FINISH_REASON_MAP, "abort", "eos", "no-such-reason"]:
        assert finish_reason(reason) == map_finish_reason(reason), reason


def completion(message: dict[str, Any], finish: Any = "stop", usage: Any = "default", **choice: Any) -> dict:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish, **choice}
        ],
    }
    if usage == "default":
        body["usage"] = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    elif usage is not None:
        body["usage"] = usage
    return body


CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
REPLIES = {
    "text": completion({"content": "The answer is 4."}),
    "think": completion({"content": "<think>2 + 2 is 4</think>\n\nThe answer is 4."}),
    "think-not-first": completion({"content": " <think>x</think>The answer is 4."}),
    "think-with-reasoning-field": completion({"content": "<think>x</think>4", "reasoning_content": None}),
    "empty-text": completion({"content": ""}),
    "no-usage": completion({"content": "4"}, usage=None),
    "null-finish": completion({"content": "4"}, finish=None),
    "other-finish": completion({"content": "4"}, finish="eos"),
    "length": completion({"content": "4"}, finish="max_tokens"),
    "tool-call": completion({"content": None, "tool_calls": [CALL]}, finish="tool_calls"),
    "tool-call-stop": completion({"content": "", "tool_calls": [CALL]}, finish="stop"),
    "tool-call-no-id": completion({"content": None, "tool_calls": [{"type": "function", "function": CALL["function"]}]}),
    "logprobs": completion({"content": "4"}, logprobs={"content": [{"token": "4", "logprob": -0.25, "bytes": [52], "top_logprobs": []}]}),
    "cached-prompt": completion({"content": "4"}, usage={"prompt_tokens": 100, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 40}}),
}  # fmt: skip


@pytest.mark.parametrize("shape", list(REPLIES))
@pytest.mark.parametrize("priced", [False, True], ids=["unpriced", "priced"])
def test_a_direct_reply_is_recorded_as_litellms(arun, canned_server, shape, priced) -> None:
    canned_server.reply(REPLIES[shape])
    prices = {"input_cost_per_token": 3e-7, "output_cost_per_token": 1.1e-6} if priced else {}
    member = canned_server.member(**prices)
    fast, slow = both_lanes()
    assert goes_direct(fast, member, QUESTION)
    direct, via_litellm = (recorded(arun(client.complete(member, QUESTION))) for client in (fast, slow))
    if shape == "tool-call-no-id":  # LiteLLM names such a call itself, at random, whichever lane it is in
        for reply in (direct, via_litellm):
            assert all(call.pop("id") for call in reply["tool_calls"])
    assert direct == via_litellm
    assert (direct["cost_usd"] is not None) == priced


@pytest.mark.parametrize(
    "prices", [{"input_cost_per_token": 1e-6}, {"output_cost_per_token": 2e-6}, {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0}]
)  # fmt: skip
def test_a_members_own_prices_cost_what_litellm_charges(arun, canned_server, prices) -> None:
    canned_server.reply(completion({"content": "4"}, usage={"prompt_tokens": 1234, "completion_tokens": 567}))
    member = canned_server.member(**prices)
    costs = [arun(client.complete(member, QUESTION)).cost_usd for client in both_lanes()]
    assert costs[0] == costs[1]


def test_a_choiceless_or_unreadable_reply_is_retried_as_malformed(arun, canned_server) -> None:
    for body in ({"id": "x", "choices": []}, b"{not json", completion({"content": None})):
        canned_server.reply(body)
        kinds = []
        for client in both_lanes(retries=1):
            with pytest.raises(CallError) as failed:
                arun(client.complete(canned_server.member(), QUESTION))
            kinds.append((failed.value.kind, failed.value.attempts))
        assert kinds[0] == kinds[1] == ("malformed", 2)


@pytest.mark.parametrize(
    "status, message",
    [
        (429, "Rate limit reached"),
        (500, "boom"),
        (502, "bad gateway"),
        (503, "unavailable"),
        (504, "gateway timeout"),
        (408, "request timeout"),
        (400, "bad request"),
        (400, "This model's maximum context length is 4096 tokens"),
        (400, "rate limit exceeded for this key"),
        (401, "bad key"),
        (403, "forbidden"),
        (404, "no such model"),
        (413, "too large"),
        (422, "unprocessable"),
    ],
)
def test_an_error_status_fails_with_the_kind_and_retries_it_has_through_litellm(
    arun, canned_server, status, message
):
    canned_server.reply({"error": {"message": message, "type": "error"}}, status=status)
    outcomes = []
    for client in both_lanes(retries=1):
        with pytest.raises(CallError) as failed:
            arun(client.complete(canned_server.member(), QUESTION))
        outcomes.append((failed.value.kind, failed.value.attempts))
    assert outcomes[0] == outcomes[1]


def test_dropped_connections_and_timeouts_are_retried(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "4"}, fail_first=2, fail_first_kind="drop")
    assert arun(both_lanes()[0].complete(pool_for(server, ["a"])["a"], QUESTION)).attempts == 3
    slow = scripted_server({"a": "4"}, fail_first=1, fail_first_kind="timeout", timeout_hold_s=5.0)
    client = ModelClient(None, direct=True, backoff_s=0.01, timeout_s=0.5)
    assert arun(client.complete(pool_for(slow, ["a"])["a"], QUESTION)).attempts == 2


def test_a_tool_calling_reply_from_the_scripted_server_is_the_same_either_way(
    scripted_server, pool_for, arun
):
    calls = Reply("", (ToolCall("add", {"a": 2, "b": 2}), ToolCall("add", {"a": 1, "b": 1})))
    server = scripted_server({"a": lambda messages, params: calls})
    member = pool_for(server, ["a"])["a"]
    replies = []
    for client in both_lanes():
        server.reset()  # (the scripted server names tool calls after the attempt: each lane's is the first)
        replies.append(recorded(arun(client.complete(member, CONVERSATION, overrides={"tools": [TOOL]}))))
    assert replies[0] == replies[1] and len(replies[0]["tool_calls"] or []) == 2


# --- LiteLLM's callbacks and the audit's numbers -------------------------------------------------------------


def test_a_litellm_callback_sees_every_call_while_it_is_set(scripted_server, pool_for, arun) -> None:
    import litellm
    from litellm.integrations.custom_logger import CustomLogger

    class Counter(CustomLogger):
        def __init__(self) -> None:
            super().__init__()
            self.succeeded: list[str] = []
            self.failed = 0

        async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
            self.succeeded.append(kwargs["messages"][-1]["content"])

        async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
            self.failed += 1

    server = scripted_server({"a": echo()}, down_models=["down"])
    pool = pool_for(server, ["a", "down"])
    client = ModelClient(None, backoff_s=0.01, retries=0)  # the default: direct where it can
    counter = Counter()
    litellm.callbacks.append(counter)
    try:
        for i in range(5):
            arun(client.complete(pool["a"], [{"role": "user", "content": f"q{i}"}]))
        with pytest.raises(CallError):
            arun(client.complete(pool["down"], QUESTION))
        arun(_logged(lambda: len(counter.succeeded) == 5 and counter.failed == 1))
    finally:  # (LiteLLM files a callback in its lists of async callbacks too)
        for hooks in (litellm.callbacks, litellm._async_success_callback, litellm._async_failure_callback):
            while counter in hooks:
                hooks.remove(counter)
    assert sorted(counter.succeeded) == [f"q{i}" for i in range(5)] and counter.failed == 1


async def _logged(done: Callable[[], bool], within_s: float = 60.0) -> None:
    """Wait until LiteLLM's logging worker (on the call loop) has handed out what `done` waits for."""
    import asyncio

    from colab_graphs.models.loops import on_call_loop

    waited = 0.0
    while not done() and waited < within_s:
        await on_call_loop(asyncio.sleep(0.05))
        waited += 0.05


def test_an_audit_reports_the_same_numbers_either_way(scripted_server, arun) -> None:
    members = [f"m{i}" for i in range(4)]
    server = scripted_server(
        {m: arithmetic_solver(accuracy=0.5 + 0.1 * i, seed=i) for i, m in enumerate(members)}
    )
    priced = {"input_cost_per_token": 2e-7, "output_cost_per_token": 8e-7}
    pool = Pool.from_dict(
        {m: {"model": f"openai/{m}", "api_base": server.base_url, "api_key": "k", **(priced if i % 2 else {})} for i, m in enumerate(members)}
    )  # fmt: skip
    spec = build_protocol("majority_vote", members)
    examples = builtin_task("arithmetic", 12, seed=0)
    reports = []
    for client in both_lanes():
        report = arun(play_audit(spec, pool, examples, client=client, method="exact", plots=False))
        reports.append(report.model_dump(mode="json", exclude={"created_at", "wall_s"}))
    assert reports[0] == reports[1]
    assert reports[0]["calls"]["made"] == len(members) * len(examples)


# --- the lane's process --------------------------------------------------------------------------------------

CALL_IN_A_FRESH_PROCESS = textwrap.dedent(
    """
    import asyncio, json, sys
    from colab_graphs import Member, ModelClient
    from colab_graphs.models.cache import CallCache
    from colab_graphs.testing import ScriptedServer

    priced, cache_dir, model = sys.argv[1] == "priced", sys.argv[2], sys.argv[3]
    prices = {"input_cost_per_token": 1e-6, "output_cost_per_token": 1e-6} if priced else {}

    async def main():
        with ScriptedServer({model: "The answer is 42."}) as server:
            member = Member(name="a", settings={**server.litellm_kwargs(model), **prices})
            client = ModelClient(CallCache(cache_dir) if cache_dir else None)
            return await client.complete(member, [{"role": "user", "content": "6 x 7?"}])

    call = asyncio.run(main())
    print(json.dumps({"text": call.text, "cost": call.cost_usd, "litellm": "litellm" in sys.modules}))
    """
)


def call_in_a_fresh_process(
    priced: bool, cache_dir: str = "", direct: str | None = None, model: str = "alpha"
) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "COLAB_GRAPHS_DIRECT"}
    if direct is not None:
        env["COLAB_GRAPHS_DIRECT"] = direct
    command = [
        sys.executable,
        "-c",
        CALL_IN_A_FRESH_PROCESS,
        "priced" if priced else "unpriced",
        cache_dir,
        model,
    ]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Unclosed" not in proc.stderr and "Traceback" not in proc.stderr  # the session closed at exit
    found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found.pop("text") == "The answer is 42."
    return found


@pytest.mark.parametrize("direct, through_litellm", [(None, False), ("0", True)], ids=["default", "off"])
def test_a_process_whose_calls_go_direct_never_loads_litellm(direct, through_litellm) -> None:
    found = call_in_a_fresh_process(priced=True, direct=direct)
    assert found == {"cost": pytest.approx(7e-6), "litellm": through_litellm}  # 3 prompt + 4 reply words


def test_a_price_looked_up_in_litellms_map_is_remembered_in_the_cache_for_the_next_process(tmp_path) -> None:
    # "alpha-chat" ends in a piece of names the bundled map prices ("chat"): only LiteLLM can say it has none.
    first = call_in_a_fresh_process(priced=False, cache_dir=str(tmp_path / "cache"), model="alpha-chat")
    again = call_in_a_fresh_process(priced=False, cache_dir=str(tmp_path / "cache"), model="alpha-chat")
    assert first == {"cost": None, "litellm": True}  # LiteLLM was loaded to look the price up: it has none
    assert again == {"cost": None, "litellm": False}


def test_a_model_the_bundled_map_names_nowhere_is_unpriced_without_loading_litellm() -> None:
    assert call_in_a_fresh_process(priced=False) == {"cost": None, "litellm": False}


# --- a server that serves canned bodies -----------------------------------------------------------------------


class CannedServer:
    """An HTTP server that answers every POST with the body and status set last (`reply`), and keeps each
    request's headers and JSON body (`received`)."""

    def __init__(self) -> None:
        self.body = json.dumps(REPLIES["text"]).encode()
        self.status = 200
        self.received: list[dict[str, Any]] = []
        canned = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the base class's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                canned.received.append({"headers": dict(self.headers), "body": json.loads(raw)})
                self.send_response(canned.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(canned.body)))
                self.end_headers()
                self.wfile.write(canned.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.http.server_port}/v1"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def reply(self, body: dict[str, Any] | bytes, status: int = 200) -> None:
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.status = status

    def member(self, **settings: Any) -> Member:
        entry = {"model": "openai/m", "api_base": self.base_url, "api_key": "sk-canned", **settings}
        return Pool.from_dict({"m": entry})["m"]


@pytest.fixture
def canned_server() -> Iterator[CannedServer]:
    server = CannedServer()
    yield server
    server.http.shutdown()
    server.http.server_close()
