"""`colab-graphs serve` under bad input and bad clients: every request is checked before it is batched, one bad
request harms no other, and no client can hold what the others need (threads, connections)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import colab_graphs._env  # noqa: F401
from colab_graphs.local.provider import build_request, get_engine
from colab_graphs.serve.http import ServerLimits
from colab_graphs.serve.server import LocalServer, start_server

QUESTION = [{"role": "user", "content": "What is 2+2?"}]
GOOD = {"model": "tiny", "messages": QUESTION, "temperature": 0, "max_tokens": 8}
# Each bad body, and the field its 400 must name.
BAD = {
    "max_tokens": {**GOOD, "max_tokens": 1e12},  # an 8 TB KV cache, once
    "seed": {**GOOD, "seed": "x"},
    "temperature": {**GOOD, "temperature": float("nan")},
    "n": {**GOOD, "n": "abc"},
    "stream_options": {**GOOD, "stream": True, "stream_options": "x"},
    "top_p": {**GOOD, "top_p": 0},
    "messages[0].role": {**GOOD, "messages": [{"role": "wizard", "content": "hi"}]},
    "frequency_penalty": {**GOOD, "frequency_penalty": 1.5},
    "top_k": {**GOOD, "top_k": -5},  # vLLM's top_k is served; 0 (or absent) is "all tokens"
}


@pytest.fixture(scope="module")
def greedy() -> str:
    engine = get_engine("tiny-random")
    return engine.generate(build_request(engine, QUESTION, {"temperature": 0, "max_tokens": 8})).text


@pytest.fixture(scope="module")
def server():
    with start_server("tiny-random", served_name="tiny") as srv:
        yield srv


def post(base_url: str, body: dict | None = None, raw: bytes | None = None) -> tuple[int, dict]:
    data = (
        raw if raw is not None else json.dumps(body).encode()
    )  # json.dumps writes NaN as NaN, as clients do
    request = urllib.request.Request(
        f"{base_url}/chat/completions", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def raw_exchange(port: int, data: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes, return everything the server sends until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def status_and_error(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def test_good_and_bad_requests_sent_together_each_get_their_own_answer(server, greedy):
    bad_length = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}"
    jobs = [("good", GOOD)] * 6 + list(BAD.items()) + [("Content-Length", None)]
    start = threading.Barrier(len(jobs))

    def send(job: tuple[str, dict | None]) -> tuple[int, dict]:
        start.wait()
        if job[1] is None:
            status, error = status_and_error(raw_exchange(server.port, bad_length))
            return status, {"error": error}
        return post(server.base_url, job[1])

    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(send, jobs))
    for (name, _), (status, payload) in zip(jobs, answers, strict=True):
        if name == "good":
            assert status == 200 and payload["choices"][0]["message"]["content"] == greedy
        elif name == "Content-Length":
            assert status == 400 and "Content-Length" in payload["error"]["message"]
        else:
            assert status == 400, (name, payload)
            assert payload["error"]["param"] == name and payload["error"]["type"] == "invalid_request_error"
            assert name.split("[")[0] in payload["error"]["message"]


def test_explicit_nulls_mean_the_defaults(server, greedy):
    nulls = {
        "n": None,
        "stream": None,
        "logprobs": None,
        "stop": None,
        "seed": None,
        "presence_penalty": None,
    }
    status, payload = post(server.base_url, {**GOOD, **nulls})
    assert status == 200 and payload["choices"][0]["message"]["content"] == greedy


def test_a_request_lists_every_problem_it_has(server):
    status, payload = post(server.base_url, {**GOOD, "seed": "x", "temperature": "hot", "n": 0})
    assert status == 400
    message = payload["error"]["message"]
    assert "seed:" in message and "temperature:" in message and "n:" in message


def test_content_parts_of_no_type_beside_an_image_are_refused_with_a_400_naming_them(server):
    parts = [{"text": "What is 2+2?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    status, payload = post(server.base_url, {**GOOD, "messages": [{"role": "user", "content": parts}]})
    assert status == 400, payload
    assert "text only" in payload["error"]["message"] and "image_url" in payload["error"]["message"]


def test_max_tokens_beyond_what_the_context_leaves_is_refused_with_the_numbers(server):
    status, payload = post(server.base_url, {**GOOD, "max_tokens": 2040})
    assert status == 400 and payload["error"]["code"] == "context_length_exceeded"
    assert "at most 2032 fit" in payload["error"]["message"]  # 2048 positions, a 16-token prompt
    assert "reads 2048 tokens of which the prompt takes 16" in payload["error"]["message"]


def test_max_tokens_beyond_the_server_limit_is_refused():
    with LocalServer(get_engine("tiny-random"), "tiny", "127.0.0.1", 0, max_tokens_limit=32).start() as small:
        assert post(small.base_url, {**GOOD, "max_tokens": 32})[0] == 200
        status, payload = post(small.base_url, {**GOOD, "max_tokens": 33})
    assert status == 400 and "this server writes at most 32 tokens per reply" in payload["error"]["message"]


def test_a_body_that_is_not_json_gets_a_400_in_openai_shape(server):
    status, payload = post(server.base_url, raw=b'{"model": "tiny", "messages": [')
    assert status == 400 and payload["error"]["code"] == "invalid_json"
    assert set(payload["error"]) == {"message", "type", "param", "code"}


def test_a_request_that_fails_while_decoding_fails_alone(greedy):
    engine = get_engine("tiny-random")

    def broken_guide(ids: list[int], logits: object) -> list[int]:
        if len(ids) == 3:
            raise RuntimeError("the guide of this request broke")
        return list(range(int(logits.shape[-1])))  # type: ignore[attr-defined]

    requests = [build_request(engine, QUESTION, {"temperature": 0, "max_tokens": 8}) for _ in range(6)]
    streamed: list[str] = []
    requests[1].on_text = streamed.append
    requests[4].allowed_tokens = broken_guide
    before = engine.batches_run
    saved = engine.max_batch_size, engine.batch_wait_ms
    engine.max_batch_size, engine.batch_wait_ms = len(requests), 60_000  # the batch is exactly these six
    try:
        futures = [engine.submit(request) for request in requests]
        outcomes = [future.exception() or future.result() for future in futures]
    finally:
        engine.max_batch_size, engine.batch_wait_ms = saved
    assert isinstance(outcomes[4], RuntimeError) and "broke" in str(outcomes[4])
    assert [o.text for i, o in enumerate(outcomes) if i != 4] == [greedy] * 5
    assert "".join(streamed) == greedy  # what streamed before the failure is not sent again
    assert engine.batches_run - before == 1 + 6  # the shared batch, then each request alone


def test_200_half_open_connections_hold_no_thread_and_a_good_request_is_still_answered(server, greedy):
    assert post(server.base_url, GOOD)[0] == 200  # a worker thread exists already
    threads_before = threading.active_count()
    half = b'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"model": "ti'
    sockets = []
    try:
        for i in range(200):  # one client: below its own limit of connections
            sock = socket.create_connection(("127.0.0.1", server.port))
            if i % 2:
                sock.sendall(half)
            sockets.append(sock)
        time.sleep(0.3)
        started = time.monotonic()
        status, payload = post(server.base_url, GOOD)
        assert status == 200 and payload["choices"][0]["message"]["content"] == greedy
        assert time.monotonic() - started < 10
        assert server.httpd.open_connections >= 200
        assert threading.active_count() - threads_before <= 1
    finally:
        for sock in sockets:
            sock.close()


def test_a_request_that_does_not_arrive_whole_in_time_gets_a_408():
    limits = ServerLimits(read_timeout_s=0.3)
    with LocalServer(get_engine("tiny-random"), "tiny", "127.0.0.1", 0, limits=limits).start() as slow:
        started = time.monotonic()
        response = raw_exchange(
            slow.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n{"
        )
        waited = time.monotonic() - started
        assert slow.httpd.open_connections == 0
    status, error = status_and_error(response)
    assert status == 408 and "did not arrive whole within 0.3 s" in error["message"]
    assert 0.3 <= waited < 3


def test_an_idle_connection_is_closed_after_the_idle_timeout():
    limits = ServerLimits(idle_timeout_s=0.3)
    served = LocalServer(get_engine("tiny-random"), "tiny", "127.0.0.1", 0, limits=limits)
    with served.start():
        started = time.monotonic()  # before connecting: the server's clock starts as it accepts
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
            assert sock.recv(1) == b""  # closed by the server, with nothing sent
        assert 0.3 <= time.monotonic() - started < 3


def test_connections_beyond_the_limit_get_a_503_and_the_limit_frees_as_they_close(greedy):
    limits = ServerLimits(max_connections=3)
    with LocalServer(get_engine("tiny-random"), "tiny", "127.0.0.1", 0, limits=limits).start() as srv:
        held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(3)]
        while srv.httpd.open_connections < 3:
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as extra:
            response = extra.recv(65536)
        assert b"Retry-After: 1" in response
        status, error = status_and_error(response)
        assert status == 503 and error["code"] == "too_many_connections"
        for sock in held:
            sock.close()
        while srv.httpd.open_connections:
            time.sleep(0.01)
        assert post(srv.base_url, GOOD)[1]["choices"][0]["message"]["content"] == greedy


def test_unknown_routes_and_wrong_methods_get_openai_errors(server):
    status, error = status_and_error(
        raw_exchange(server.port, b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    )
    assert status == 404 and error["code"] == "not_found"
    status, error = status_and_error(
        raw_exchange(
            server.port, b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    )
    assert status == 405 and "takes POST" in error["message"]
    status, error = status_and_error(raw_exchange(server.port, b"BREW /v1/models HTTP/1.1\r\n\r\n"))
    assert status == 400 and error["type"] == "invalid_request_error" and error["code"] == "bad_http"


@pytest.mark.slow
def test_the_cli_serves_and_logs_one_line_per_request_without_bodies_or_keys(tmp_path: Path, greedy):
    command = [sys.executable, "-m", "colab_graphs.cli.app", "serve", "tiny-random", "--port", "0"]
    command += ["--served-name", "tiny", "--max-connections", "16"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
        try:
            assert process.stdout is not None
            base_url = re.search(r"at (http://\S+/v1)", process.stdout.readline()).group(1)  # type: ignore[union-attr]
            body = {**GOOD, "messages": [{"role": "user", "content": "secret-body-marker"}]}
            request = urllib.request.Request(
                f"{base_url}/chat/completions?key=secret-query-key",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json", "Authorization": "Bearer sk-secret-header"},
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                assert response.status == 200
            assert post(base_url, BAD["seed"])[0] == 400
            deadline = time.monotonic() + 30  # a line is written once its response is out: wait for both
            while log.read_text().count("/chat/completions") < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            process.terminate()
            process.wait(timeout=30)
    lines = [line for line in log.read_text().splitlines() if "/chat/completions" in line]
    assert len(lines) == 2
    assert re.search(
        r"POST /v1/chat/completions 200 \d+\.\d{3}s prompt_tokens=\d+ completion_tokens=8$", lines[0]
    )
    assert " 400 " in lines[1]
    assert not any(secret in log.read_text() for secret in ("secret-body", "secret-query", "sk-secret"))
