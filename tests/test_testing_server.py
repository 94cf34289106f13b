"""The scripted OpenAI-compatible server, seen by real clients: LiteLLM and plain urllib over HTTP."""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import colab_graphs._env  # noqa: F401  (offline settings, before litellm is imported)
from colab_graphs.testing import (
    Member,
    Reply,
    RequestKey,
    ScriptedServer,
    ToolCall,
    answer_key,
    arithmetic_solver,
    echo,
    load_members,
)
from colab_graphs.testing.server import server_for_configs

USER_HI = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def litellm() -> Any:
    import litellm

    litellm.suppress_debug_info = True  # its "Give Feedback" banner on every expected error
    return litellm


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    # One loop for the module: litellm's logging worker complains when asyncio.run() changes loops.
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def acomplete(
    litellm: Any, loop: asyncio.AbstractEventLoop, server: ScriptedServer, name: str, **kwargs: Any
):
    kwargs.setdefault("messages", USER_HI)
    call = litellm.acompletion(**server.litellm_kwargs(name), max_retries=0, **kwargs)
    return loop.run_until_complete(call)


def post(
    server: ScriptedServer, body: dict[str, Any], timeout: float = 10.0
) -> tuple[int, dict[str, str], bytes]:
    """POST a chat request with urllib; returns (status, headers, raw body) for any HTTP status."""
    request = urllib.request.Request(
        server.base_url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def chat(server: ScriptedServer, model: str = "alpha", **fields: Any) -> tuple[int, dict[str, str], bytes]:
    return post(server, {"model": model, "messages": fields.pop("messages", USER_HI), **fields})


# Replies, usage, logprobs, streaming


@pytest.mark.integration
def test_constant_member_replies_through_litellm(litellm, loop):
    with ScriptedServer({"alpha": "The answer is 4."}) as server:
        response = acomplete(litellm, loop, server, "alpha")
    assert response.choices[0].message.content == "The answer is 4."
    assert response.choices[0].finish_reason == "stop"


@pytest.mark.integration
def test_usage_counts_whitespace_tokens(litellm, loop):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is two plus two?"},
    ]
    with ScriptedServer({"alpha": "It is four."}) as server:
        response = acomplete(litellm, loop, server, "alpha", messages=messages)
    assert (response.usage.prompt_tokens, response.usage.completion_tokens, response.usage.total_tokens) == (
        7,
        3,
        10,
    )


@pytest.mark.integration
def test_script_receives_messages_and_sampling_params(litellm, loop):
    seen: list[tuple[list, dict]] = []

    def script(messages: list[dict], params: dict) -> str:
        seen.append((messages, params))
        return f"temperature={params['temperature']}"

    with ScriptedServer({"alpha": script}) as server:
        response = acomplete(litellm, loop, server, "alpha", temperature=0.3, seed=7)
    assert response.choices[0].message.content == "temperature=0.3"
    assert seen == [(USER_HI, {"temperature": 0.3, "seed": 7})]


@pytest.mark.integration
def test_logprobs_carry_the_member_confidence(litellm, loop):
    with ScriptedServer({"unsure": Member("maybe it is 5", confidence=0.25)}) as server:
        response = acomplete(litellm, loop, server, "unsure", logprobs=True, top_logprobs=3)
    tokens = response.choices[0].logprobs.content
    assert "".join(token.token for token in tokens) == "maybe it is 5"
    assert [token.logprob for token in tokens] == pytest.approx([math.log(0.25)] * 4)
    top = tokens[0].top_logprobs
    assert len(top) == 3 and sum(math.exp(option.logprob) for option in top) == pytest.approx(1.0)


@pytest.mark.integration
def test_logprobs_are_absent_unless_asked():
    with ScriptedServer({"alpha": "four"}) as server:
        _, _, body = chat(server)
    assert json.loads(body)["choices"][0]["logprobs"] is None


@pytest.mark.integration
def test_confidence_may_depend_on_the_question(litellm, loop):
    def confidence(messages: list[dict], params: dict) -> float:
        return 0.9 if "easy" in messages[-1]["content"] else 0.1

    with ScriptedServer({"alpha": Member("ok", confidence=confidence)}) as server:
        easy = acomplete(
            litellm, loop, server, "alpha", messages=[{"role": "user", "content": "easy"}], logprobs=True
        )
        hard = acomplete(
            litellm, loop, server, "alpha", messages=[{"role": "user", "content": "hard"}], logprobs=True
        )
    assert easy.choices[0].logprobs.content[0].logprob == pytest.approx(math.log(0.9))
    assert hard.choices[0].logprobs.content[0].logprob == pytest.approx(math.log(0.1))


@pytest.mark.integration
def test_max_tokens_truncates_with_finish_reason_length():
    with ScriptedServer({"alpha": "one two three four five"}) as server:
        _, _, body = chat(server, max_tokens=2)
    choice = json.loads(body)["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("one two", "length")


def test_a_stop_sequence_ends_the_reply_before_it():
    with ScriptedServer({"alpha": "Hello! How can I help you today?"}) as server:
        body = json.loads(chat(server, stop=["you", "xyz"])[2])
    assert body["choices"][0]["message"]["content"] == "Hello! How can I help "
    assert body["usage"]["completion_tokens"] == 5


@pytest.mark.integration
def test_streaming_through_litellm_reassembles_the_reply(litellm, loop):
    async def stream(server: ScriptedServer) -> tuple[str, Any]:
        response = await litellm.acompletion(
            **server.litellm_kwargs("alpha"),
            messages=USER_HI,
            max_retries=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in response:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            usage = getattr(chunk, "usage", None) or usage
        return text, usage

    with ScriptedServer({"alpha": "The answer  is 4."}) as server:
        text, usage = loop.run_until_complete(stream(server))
    assert text == "The answer  is 4."
    assert usage.completion_tokens == 4


@pytest.mark.integration
def test_streaming_through_the_openai_sdk_reassembles_the_reply():
    import openai  # the client LangChain's ChatOpenAI streams through

    with ScriptedServer({"alpha": "one two three"}) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        with client.chat.completions.create(model="alpha", messages=USER_HI, stream=True) as stream:
            text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        client.close()
    assert text == "one two three"


def weather_caller(messages: list[dict[str, Any]], params: dict[str, Any]) -> str | Reply:
    """Calls `get_weather` for the city asked about when offered the tool; answers from the tool's result."""
    if messages[-1]["role"] == "tool":
        return f"It is {messages[-1]['content']}."
    if not any(t["function"]["name"] == "get_weather" for t in params.get("tools", [])):
        return "I cannot look that up."
    return Reply("Let me check.", (ToolCall("get_weather", {"city": "Paris"}),))


@pytest.mark.integration
def test_a_tool_call_reply_is_an_openai_tool_call_through_litellm(litellm, loop):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    with ScriptedServer({"alpha": weather_caller}) as server:
        response = acomplete(litellm, loop, server, "alpha", tools=tools)
        without_tools = acomplete(litellm, loop, server, "alpha")
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.id.startswith("call_")
    assert without_tools.choices[0].message.content == "I cannot look that up."


@pytest.mark.integration
def test_a_streamed_tool_call_reassembles_through_the_openai_sdk():
    import openai

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    with ScriptedServer({"alpha": weather_caller}) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        calls: dict[int, dict[str, str]] = {}
        finish = None
        with client.chat.completions.create(
            model="alpha", messages=USER_HI, tools=tools, stream=True
        ) as stream:
            for chunk in stream:
                for delta in chunk.choices[0].delta.tool_calls or []:
                    call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                    call["id"] += delta.id or ""
                    call["name"] += (delta.function.name or "") if delta.function else ""
                    call["arguments"] += (delta.function.arguments or "") if delta.function else ""
                finish = chunk.choices[0].finish_reason or finish
        client.close()
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert calls[0]["id"].startswith("call_")


def test_a_tool_call_id_is_the_same_for_the_same_request():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    with ScriptedServer({"alpha": weather_caller}) as server:
        ids = [json.loads(chat(server, tools=tools)[2])["choices"][0]["message"]["tool_calls"][0]["id"]]
        server.reset()
        ids.append(json.loads(chat(server, tools=tools)[2])["choices"][0]["message"]["tool_calls"][0]["id"])
    assert ids[0] == ids[1]


@pytest.mark.integration
def test_stream_is_server_sent_events_ending_with_done():
    with ScriptedServer({"alpha": "a b"}) as server:
        status, headers, body = chat(server, stream=True)
    events = [line for line in body.decode().split("\n") if line]
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
    assert [chunk["choices"][0]["delta"].get("content") for chunk in chunks] == ["", "a", " b", None]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


# Model names


@pytest.mark.integration
def test_unknown_model_is_404_with_openai_error(litellm, loop):
    with ScriptedServer({"alpha": "x"}) as server:
        status, _, body = chat(server, model="nope")
        with pytest.raises(litellm.NotFoundError):
            acomplete(litellm, loop, server, "nope")
    assert status == 404
    assert json.loads(body)["error"]["code"] == "model_not_found"


@pytest.mark.integration
def test_provider_prefix_reaches_the_member():
    with ScriptedServer({"alpha": "x", "org/beta": "y"}) as server:
        replies = [
            json.loads(chat(server, model=m)[2])["choices"][0]["message"]["content"]
            for m in ("openai/alpha", "org/beta", "hosted_vllm/org/beta")
        ]
        logged = [record.model for record in server.requests]
    assert replies == ["x", "y", "y"]
    assert logged == ["alpha", "org/beta", "org/beta"]


@pytest.mark.integration
def test_models_endpoint_lists_members():
    with (
        ScriptedServer({"alpha": "x", "beta": "y"}) as server,
        urllib.request.urlopen(server.base_url + "/models") as r,
    ):
        listing = json.loads(r.read())
    assert [model["id"] for model in listing["data"]] == ["alpha", "beta"]


# Faults, as a client sees them


@pytest.mark.integration
def test_429_fault_is_a_rate_limit_with_retry_after_zero(litellm, loop):
    with ScriptedServer({"alpha": "ok"}, fail_first=2, fail_first_kind="429") as server:
        status, headers, body = chat(server)
        with pytest.raises(litellm.RateLimitError):
            acomplete(litellm, loop, server, "alpha")
    assert (status, headers["Retry-After"]) == (429, "0")
    assert json.loads(body)["error"]["type"] == "rate_limit_error"


@pytest.mark.integration
def test_500_fault_is_a_server_error(litellm, loop):
    with ScriptedServer({"alpha": "ok"}, fail_first=2, fail_first_kind="500") as server:
        status, _, _ = chat(server)
        with pytest.raises(litellm.InternalServerError):
            acomplete(litellm, loop, server, "alpha")
    assert status == 500


@pytest.mark.integration
def test_malformed_fault_is_a_200_whose_body_is_not_json(litellm, loop):
    with ScriptedServer({"alpha": "ok"}, fail_first=2, fail_first_kind="malformed") as server:
        status, _, body = chat(server)
        with pytest.raises(litellm.InternalServerError):
            acomplete(litellm, loop, server, "alpha")
    assert status == 200
    with pytest.raises(ValueError):
        json.loads(body)


@pytest.mark.integration
def test_drop_fault_closes_the_connection_without_a_response(litellm, loop):
    with ScriptedServer({"alpha": "ok"}, fail_first=2, fail_first_kind="drop") as server:
        with pytest.raises(http.client.RemoteDisconnected):
            chat(server)
        with pytest.raises(litellm.InternalServerError, match="Connection error"):
            acomplete(litellm, loop, server, "alpha")
        logged = [(record.status, record.fault) for record in server.requests]
    assert logged == [(None, "drop"), (None, "drop")]


@pytest.mark.integration
def test_timeout_fault_outlasts_a_short_client_timeout(litellm, loop):
    with ScriptedServer({"alpha": "ok"}, fail_first=1, fail_first_kind="timeout", timeout_hold_s=5) as server:
        started = time.monotonic()
        with pytest.raises(litellm.Timeout):
            acomplete(litellm, loop, server, "alpha", timeout=0.3)
        waited = time.monotonic() - started
        logged = [(record.status, record.fault) for record in server.requests]
    assert waited < 5
    assert logged == [(None, "timeout")]


@pytest.mark.integration
def test_stop_releases_a_connection_held_by_a_timeout_fault():
    server = ScriptedServer(
        {"alpha": "ok"}, fail_first=1, fail_first_kind="timeout", timeout_hold_s=30
    ).start()
    errors: list[BaseException] = []

    def client() -> None:
        try:
            chat(server)
        except Exception as exc:  # the held request ends without a response
            errors.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    while not server.requests:
        time.sleep(0.01)
    started = time.monotonic()
    server.stop()
    thread.join(timeout=5)
    assert time.monotonic() - started < 5
    assert len(errors) == 1 and isinstance(errors[0], http.client.RemoteDisconnected | ConnectionError)


@pytest.mark.integration
def test_down_model_fails_every_attempt_and_others_do_not():
    with ScriptedServer({"alpha": "ok", "beta": "ok"}, down_models=["beta"]) as server:
        statuses = [chat(server, model=model)[0] for model in ("beta", "beta", "beta", "alpha")]
        faults = [record.fault for record in server.requests]
    assert statuses == [500, 500, 500, 200]
    assert faults == ["down", "down", "down", None]


def fault_schedule(seed: int) -> list[tuple[int | None, str | None]]:
    """Statuses and faults of 30 distinct requests, each sent twice, to a server failing half the attempts."""
    faults = ("429", "500", "malformed")
    with ScriptedServer({"alpha": "ok"}, fault_rate=0.5, faults=faults, fault_seed=seed) as server:
        for i in range(30):
            for _ in range(2):
                chat(server, messages=[{"role": "user", "content": f"question {i}"}])
        return [(record.status, record.fault) for record in server.requests]


@pytest.mark.integration
def test_fault_schedule_is_a_function_of_the_seed():
    first, again, other = fault_schedule(seed=1), fault_schedule(seed=1), fault_schedule(seed=2)
    assert first == again
    assert first != other
    kinds = [fault for _, fault in first]
    assert 15 <= sum(kind is not None for kind in kinds) <= 45
    assert set(kinds) == {None, "429", "500", "malformed"}


@pytest.mark.integration
def test_fail_first_fails_exactly_the_first_n_attempts_of_each_request():
    question = [{"role": "user", "content": "q"}]
    with ScriptedServer({"alpha": "ok"}, fail_first=2, fail_first_kind="429") as server:
        statuses = [
            chat(server, messages=messages)[0] for messages in (USER_HI, USER_HI, USER_HI, question, question)
        ]
        attempts = [record.attempt for record in server.requests]
    assert statuses == [429, 429, 200, 429, 429]
    assert attempts == [0, 1, 2, 0, 1]


@pytest.mark.integration
def test_litellm_retries_succeed_on_the_attempt_after_fail_first(litellm, loop):
    with ScriptedServer({"alpha": "ok"}, fail_first=2, fail_first_kind="500") as server:
        response = acomplete(litellm, loop, server, "alpha", num_retries=2)
        statuses = [record.status for record in server.requests]
    assert response.choices[0].message.content == "ok"
    assert statuses == [500, 500, 200]


@pytest.mark.integration
def test_script_error_is_a_500_naming_the_member():
    def broken(messages: list[dict], params: dict) -> str:
        raise KeyError("answer")

    with ScriptedServer({"alpha": broken}) as server:
        status, _, body = chat(server)
    assert status == 500
    assert "script of 'alpha' raised KeyError" in json.loads(body)["error"]["message"]


# The request log


@pytest.mark.integration
def test_request_counts_key_on_the_canonical_request():
    with ScriptedServer({"alpha": "ok"}, fail_first=1) as server:
        chat(server, temperature=0.5, seed=1)
        chat(server, seed=1, temperature=0.5, stream=True)  # same settings in another order, streamed
        chat(server, temperature=0.9)
        counts, successes = server.request_counts(), server.request_counts(successful_only=True)
    messages = json.dumps(USER_HI, sort_keys=True, separators=(",", ":"))
    warm = RequestKey("alpha", messages, '{"seed":1,"temperature":0.5}')
    hot = RequestKey("alpha", messages, '{"temperature":0.9}')
    assert counts == {warm: 2, hot: 1}
    assert successes == {warm: 1}


@pytest.mark.integration
def test_reset_clears_the_log_and_restarts_the_fault_schedule():
    with ScriptedServer({"alpha": "ok"}, fail_first=1) as server:
        before = [chat(server)[0] for _ in range(2)]
        server.reset()
        assert server.requests == []
        after = [chat(server)[0] for _ in range(2)]
    assert before == after == [500, 200]


# Concurrency and shutdown


def max_overlap(server: ScriptedServer) -> int:
    """The largest number of requests the server was serving at one moment."""
    events = sorted(
        [(record.time, 1) for record in server.requests]
        + [(record.time + record.duration_s, -1) for record in server.requests]
    )
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


@pytest.mark.integration
def test_64_concurrent_connections_are_served_in_parallel():
    n, latency = 64, 0.2
    with ScriptedServer({"alpha": "ok"}, latency_s=latency) as server, ThreadPoolExecutor(n) as pool:
        started = time.monotonic()
        statuses = list(
            pool.map(lambda i: chat(server, messages=[{"role": "user", "content": str(i)}])[0], range(n))
        )
        elapsed = time.monotonic() - started
        overlap = max_overlap(server)
    assert statuses == [200] * n
    assert elapsed < 0.25 * n * latency
    assert overlap >= n // 2


@pytest.mark.integration
def test_concurrent_litellm_calls_overlap_their_latency(litellm, loop):
    n, latency = 32, 0.2

    async def burst(server: ScriptedServer) -> list[Any]:
        calls = [
            litellm.acompletion(
                **server.litellm_kwargs("slow"),
                messages=[{"role": "user", "content": f"q{i}"}],
                max_retries=0,
            )
            for i in range(n)
        ]
        return await asyncio.gather(*calls)

    with ScriptedServer({"slow": Member("ok", latency_s=latency)}) as server:
        started = time.monotonic()
        responses = loop.run_until_complete(burst(server))
        elapsed = time.monotonic() - started
    assert [response.choices[0].message.content for response in responses] == ["ok"] * n
    assert elapsed < 0.5 * n * latency


@pytest.mark.integration
def test_stop_joins_threads_and_closes_server_sockets_even_with_idle_keep_alive_clients():
    threads_before = set(threading.enumerate())
    fds_before = len(os.listdir("/proc/self/fd"))
    server = ScriptedServer({"alpha": "ok"}).start()
    client = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    client.request("POST", "/v1/chat/completions", json.dumps({"model": "alpha", "messages": USER_HI}))
    assert client.getresponse().read()  # the connection stays open (keep-alive) and idle
    server.stop()
    server.stop()
    assert set(threading.enumerate()) - threads_before == set()
    assert len(os.listdir("/proc/self/fd")) == fds_before + 1  # only the client's own socket is left
    client.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("head", "body", "status", "says"),
    [
        (b"Content-Length: abc", b"", 400, "Invalid character in Content-Length"),
        (b"Content-Length: 5", b"{bad}", 400, "not JSON"),
        (b"Content-Length: 5\r\nTransfer-Encoding: chunked", b"", 400, "Transfer-Encoding"),
        (b"Content-Length: 5\r\nContent-Length: 6", b"", 400, "Duplicate Content-Length"),
        (b"X-Pad: " + b"x" * 70000, b"", 400, "Got more than 65536 bytes"),
    ],
)
def test_malformed_requests_get_openai_errors_from_the_shared_core(head, body, status, says):
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + head + b"\r\n\r\n" + body
    )
    with (
        ScriptedServer({"alpha": "ok"}) as server,
        socket.create_connection(("127.0.0.1", server.port)) as sock,
    ):
        sock.sendall(request)
        response = b"".join(iter(lambda: sock.recv(65536), b""))
    status_line, _, payload = response.partition(b"\r\n\r\n")
    assert int(status_line.split()[1]) == status
    error = json.loads(payload)["error"]
    assert says in error["message"] and set(error) == {"message", "type", "param", "code"}


# Ready-made scripts (pure functions: no server needed)


def ask(script: Any, question: str) -> str:
    return script([{"role": "system", "content": "Solve."}, {"role": "user", "content": question}], {})


@pytest.mark.parametrize(
    ("question", "answer"), [("What is 12 + 30?", 42), ("Compute 7-10.", -3), ("-6 * 7 = ?", -42)]
)
def test_arithmetic_solver_with_accuracy_one_is_right(question, answer):
    assert ask(arithmetic_solver(accuracy=1.0), question) == f"The answer is {answer}."


def test_arithmetic_solver_with_accuracy_zero_is_off_by_one_to_nine():
    solver = arithmetic_solver(accuracy=0.0, seed=3, style="{answer}")
    offsets = {int(ask(solver, f"What is {i} + 100?")) - (i + 100) for i in range(60)}
    assert offsets <= set(range(1, 10)) and len(offsets) > 3


def test_arithmetic_solver_is_deterministic_per_seed_and_message():
    questions = [f"What is {i} * 3?" for i in range(200)]
    first = [ask(arithmetic_solver(0.7, seed=1), q) for q in questions]
    again = [ask(arithmetic_solver(0.7, seed=1), q) for q in questions]
    other = [ask(arithmetic_solver(0.7, seed=2), q) for q in questions]
    right = [f"The answer is {i * 3}." for i in range(200)]
    assert first == again != other
    assert 0.6 <= sum(a == b for a, b in zip(first, right, strict=True)) / 200 <= 0.8


def test_arithmetic_solver_does_not_depend_on_the_hash_seed():
    code = "from colab_graphs.testing import arithmetic_solver as s; f = s(0.5, seed=4); print([f([{'role': 'user', 'content': f'{i} + 1'}], {}) for i in range(20)])"
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(Path(__file__).parents[1])}
    printed = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    solver = arithmetic_solver(0.5, seed=4)
    assert printed.strip() == str([ask(solver, f"{i} + 1") for i in range(20)])


def test_arithmetic_solver_says_so_when_there_is_no_problem():
    assert ask(arithmetic_solver(), "What is the capital of France?") == "I see no arithmetic problem."


def test_answer_key_replies_by_the_first_key_found_in_the_last_user_message():
    script = answer_key({"France": "Paris", "Italy": "Rome"}, default="?")
    assert [ask(script, q) for q in ("Capital of Italy?", "France or Italy?", "Spain?")] == [
        "Rome",
        "Paris",
        "?",
    ]


def test_echo_replies_with_the_last_user_message():
    assert ask(echo(), "repeat me") == "repeat me"


def test_member_rejects_confidence_outside_zero_one():
    with pytest.raises(ValueError, match="confidence"):
        Member("x", confidence=0.0)


# Member files and the command line

MEMBERS_YAML = """\
members:
  paris: "The capital of France is Paris."
  solver: {script: arithmetic_solver, args: {accuracy: 1.0}, confidence: 0.5}
  slow: {reply: "ok", latency_s: 0.01}
"""


def test_members_given_as_configs_are_served_over_http():
    with server_for_configs({"paris": "The capital of France is Paris."}, "scripted_members") as server:
        status, _, body = chat(server, "paris")
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == "The capital of France is Paris."


def test_a_bad_member_config_is_named_by_field_and_member_before_a_server_starts():
    with pytest.raises(ValueError, match=r"scripted_members\.m\.script: unknown script 'nope'"):
        server_for_configs({"m": {"script": "nope"}}, "scripted_members")


def test_no_member_configs_start_no_server():
    with server_for_configs(None) as server:
        assert server is None


def test_member_file_builds_constant_and_scripted_members(tmp_path):
    path = tmp_path / "members.yaml"
    path.write_text(MEMBERS_YAML)
    members = load_members(path)
    assert list(members) == ["paris", "solver", "slow"]
    assert members["solver"].respond([{"role": "user", "content": "2 + 2"}], {}) == ("The answer is 4.", 0.5)
    assert members["slow"].latency_s == 0.01


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("{m: {script: nope}}", r"members.yaml: m.script: unknown script 'nope'"),
        ("{m: {script: arithmetic_solver, args: {accurcy: 1}}}", r"members.yaml: m.args: .*accurcy"),
        ("{m: {reply: x, confidence: 2}}", r"members.yaml: m: confidence must be"),
        ("{m: {reply: x, colour: red}}", r"members.yaml: m: unknown field\(s\) \['colour'\]"),
        ("[a, b]", r"members.yaml: expected a mapping"),
    ],
)
def test_member_file_errors_name_the_file_and_field(tmp_path, spec, error):
    path = tmp_path / "members.yaml"
    path.write_text(spec)
    with pytest.raises(ValueError, match=error):
        load_members(path)


@pytest.mark.integration
def test_command_line_serves_a_member_file_until_terminated(tmp_path):
    path = tmp_path / "members.yaml"
    path.write_text(MEMBERS_YAML)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    command = [sys.executable, "-m", "colab_graphs.testing.server", "--port", "0", "--members", str(path)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base_url = process.stdout.readline().split(" at ")[-1].strip()
        body = json.dumps({"model": "paris", "messages": USER_HI}).encode()
        request = urllib.request.Request(
            base_url + "/chat/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            reply = json.loads(response.read())["choices"][0]["message"]["content"]
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert reply == "The capital of France is Paris."
    assert process.returncode == 0 and stderr == ""
