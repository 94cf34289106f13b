"""`colab-graphs serve` against hostile and careless clients, on loopback with the zoo's tiny model.

One server process takes every attack in turn (malformed framing, smuggling, schema bombs, oversized and
deeply nested bodies, clients that leave mid-request and mid-stream, streams that are never read, a burst)
while a canary client asks for a short chat completion every 0.25 s: the process never exits, nothing
smuggled is answered, every canary request is answered within `CANARY_BOUND_S`, and the server's memory after
the attacks is within `RSS_BOUND_MIB` of where it started. In-process servers show the rest on the engine's
own records: abandoned work stops within one decoding step, a new request joins the running batch, and the
limits (connections per client, pending requests, unread responses, the response deadline) hold.
"""

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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import colab_graphs._env  # noqa: F401
from colab_graphs.local.provider import build_request, get_engine
from colab_graphs.serve.http import ServerLimits
from colab_graphs.serve.server import LocalServer

pytestmark = pytest.mark.slow

# Every canary answer while the attacks run: about 0.05 s on an idle machine; the batch is shared with the
# never-read streams and the burst, so on 2 cores shared with other work each step costs up to ~0.1 s.
CANARY_BOUND_S = 8.0
RSS_BOUND_MIB = 120  # the server's RSS after the attacks, above its RSS before them
QUESTION = [{"role": "user", "content": "What is 2+2?"}]
SHORT = {"model": "tiny", "messages": QUESTION, "temperature": 0, "max_tokens": 4}
LONG = {"model": "tiny", "messages": QUESTION, "temperature": 0, "max_tokens": 1500}  # greedy: no early end
HIDDEN = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"  # a request smuggled inside another one's body
BODY = json.dumps(SHORT).encode()


def head(extra: bytes, body: bytes = b"") -> bytes:
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n" + body


SMUGGLING = {
    "duplicate Content-Length": head(
        b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(BODY), len(BODY) + len(HIDDEN)), BODY + HIDDEN
    ),
    "superscript Content-Length": head("Content-Length: \u00b2\r\n".encode(), BODY + HIDDEN),
    "5,000-digit Content-Length": head(b"Content-Length: " + b"9" * 5000 + b"\r\n", BODY),
    "vertical tab before Content-Length": head(
        b"X-A: a\x0bContent-Length: 5\r\nContent-Length: %d\r\n" % len(BODY), BODY + HIDDEN
    ),
    "Content-Length beside chunked": head(
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n" + HIDDEN
    ),
    "obfuscated Transfer-Encoding": head(b"Transfer-Encoding: xchunked\r\n", BODY + HIDDEN),
    "duplicate non-numeric Content-Length": head(b"Content-Length: x\r\nContent-Length: y\r\n"),
    "bare request line": b"GARBAGE\r\n\r\n",
    "unknown HTTP version": b"GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n",
    "NUL in the path": b"GET /v1/models\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
    "100 KiB request line": b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
}


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


UNIONS = {
    f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(20)
}
BOMBS: dict[str, bytes] = {
    "cyclic $ref": json.dumps(
        {
            **SHORT,
            "response_format": schema_format(
                {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
            ),
        }
    ).encode(),
    "self-union $ref": json.dumps(
        {
            **SHORT,
            "response_format": schema_format(
                {"$ref": "#/$defs/a", "$defs": {"a": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/a"}]}}}
            ),
        }
    ).encode(),
    "missing $ref": json.dumps({**SHORT, "response_format": schema_format({"$ref": "#/$defs/no"})}).encode(),
    "2^20 unions": json.dumps(
        {**SHORT, "response_format": schema_format({"$ref": "#/$defs/d0", "$defs": {**UNIONS, "d20": {}}})}
    ).encode(),
    "lone surrogate": b'{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "a\\ud800"}]}',
    "100,000-deep JSON": b'{"model": "tiny", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "200-deep schema": json.dumps(
        {**SHORT, "response_format": schema_format(json.loads('{"items": ' * 200 + "{}" + "}" * 200))}
    ).encode(),
    "properties as a list": json.dumps(
        {**SHORT, "response_format": schema_format({"type": "object", "properties": [1]})}
    ).encode(),
}
COMPLETION_BOMBS = {
    "625 prompts x n=16": {"model": "tiny", "prompt": ["hi"] * 625, "n": 16, "max_tokens": 1},
    **{
        f"2 MiB prompt {i}": {"model": "tiny", "prompt": f"{i}" + "x" * 2**21, "max_tokens": 1}
        for i in range(6)
    },
}


def raw_exchange(port: int, data: bytes, timeout: float = 15) -> bytes:
    """Send raw bytes, return everything the server sends until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def post(base_url: str, route: str, data: bytes, timeout: float = 60) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{base_url}/{route}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def open_request(port: int, body: dict, route: str = "chat/completions") -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST /v1/%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (route.encode(), len(data), data)
    )
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    received = b""
    while marker not in received:
        chunk = sock.recv(4096)
        assert chunk, received
        received += chunk
    return received


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


class Canary:
    """A client that asks for a short completion every `period` s and records each answer's latency."""

    def __init__(self, base_url: str, period: float = 0.25) -> None:
        self.base_url, self.period = base_url, period
        self.answers: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                status, _ = post(self.base_url, "chat/completions", BODY, timeout=60)
            except OSError:
                status = 0
            self.answers.append((status, time.monotonic() - started))
            self._stop.wait(self.period)

    def __enter__(self) -> Canary:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[subprocess.Popen[str], str, int]]:
    """`colab-graphs serve` in its own process (its RSS is its own)."""
    command = [sys.executable, "-m", "colab_graphs.cli.app", "serve", "tiny-random", "--port", "0"]
    command += ["--served-name", "tiny", "--no-access-log"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert process.stdout is not None
        base_url = re.search(r"at (http://\S+/v1)", process.stdout.readline()).group(1)  # type: ignore[union-attr]
        yield process, base_url, int(base_url.rsplit(":", 1)[1].split("/")[0])
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_attacks_neither_kill_nor_wedge_nor_smuggle_and_the_canary_stays_within_its_bound(served):
    process, base_url, port = served
    for _ in range(5):  # warm: the first requests load what later ones reuse
        assert post(base_url, "chat/completions", BODY)[0] == 200
    rss_start = rss_mib(process.pid)
    never_read: list[socket.socket] = []
    with Canary(base_url) as canary:
        for name, data in SMUGGLING.items():
            response = raw_exchange(port, data)
            assert response.count(b"HTTP/1.") == 1, name  # one answer: the hidden request never ran
            status = int(response.split()[1])
            error = json.loads(response.partition(b"\r\n\r\n")[2])["error"]
            assert 400 <= status < 500 and set(error) == {"message", "type", "param", "code"}, (name, status)
        for name, data in BOMBS.items():
            status, payload = post(base_url, "chat/completions", data)
            assert status == 400, (name, payload)
        for name, body in COMPLETION_BOMBS.items():
            status, payload = post(base_url, "completions", json.dumps(body).encode())
            assert status == 400, (name, payload)
        for _ in range(20):  # leave mid-request
            sock = open_request(port, LONG)
            time.sleep(0.1)
            sock.close()
        for _ in range(20):  # leave mid-stream
            sock = open_request(port, {**LONG, "stream": True})
            read_until(sock, b"data: ")
            sock.close()
        for _ in range(16):  # streams that are never read (the batch holds 32 rows: room is left)
            never_read.append(open_request(port, {**LONG, "max_tokens": 1000, "stream": True}))
        with ThreadPoolExecutor(32) as pool:  # a burst of good requests
            statuses = list(pool.map(lambda _: post(base_url, "chat/completions", BODY)[0], range(64)))
        assert statuses == [200] * 64
        time.sleep(2)
        for sock in never_read:
            sock.close()
        time.sleep(1)
    assert process.poll() is None  # never exited
    assert [status for status, _ in canary.answers] == [200] * len(canary.answers)
    latencies = sorted(latency for _, latency in canary.answers)
    assert len(latencies) >= 10 and latencies[-1] <= CANARY_BOUND_S, latencies[-5:]
    assert post(base_url, "chat/completions", BODY)[0] == 200
    assert rss_mib(process.pid) - rss_start <= RSS_BOUND_MIB


@pytest.fixture(scope="module")
def local() -> Iterator[LocalServer]:
    with LocalServer(get_engine("tiny-random"), "tiny", "127.0.0.1", 0).start() as server:
        yield server


def wait_for(predicate, seconds: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("stream", [False, True])
def test_work_for_a_client_that_left_stops_within_one_decoding_step(local, stream):
    engine = local.engine
    dropped = len(engine.cancellations)
    sock = open_request(local.port, {**LONG, "stream": stream})
    if stream:
        read_until(sock, b"data: ")  # the stream is under way
    started = engine.steps
    wait_for(lambda: engine.steps >= started + 20)  # decoding
    sock.close()
    wait_for(lambda: len(engine.cancellations) > dropped)
    record = engine.cancellations[-1]
    assert record.dropped_step - record.cancel_step <= 1
    assert 20 <= record.tokens < LONG["max_tokens"]
    wait_for(lambda: local.httpd.pending == 0)


def test_a_new_request_joins_the_running_batch_and_decodes_as_it_would_alone(local):
    engine = local.engine
    greedy = engine.generate(build_request(engine, QUESTION, {"temperature": 0, "max_tokens": 4})).text
    sock = open_request(local.port, {**LONG, "stream": True})
    try:
        steps = engine.steps
        wait_for(lambda: engine.steps >= steps + 5)  # its batch is decoding
        batches, dropped = engine.batches_run, len(engine.cancellations)
        status, payload = post(local.base_url, "chat/completions", BODY)
        assert status == 200 and payload["choices"][0]["message"]["content"] == greedy
        assert engine.batches_run == batches  # no batch of its own: it joined the one running
        assert len(engine.cancellations) == dropped  # and the long one is still decoding
    finally:
        sock.close()


def test_connections_beyond_the_per_client_limit_get_a_503():
    limits = ServerLimits(max_connections_per_client=4)
    with LocalServer(get_engine("tiny-random"), "tiny", "127.0.0.1", 0, limits=limits).start() as server:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
        wait_for(lambda: server.httpd.open_connections == 4)
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as extra:
            response = extra.recv(65536)
        assert b" 503 " in response.split(b"\r\n")[0] and b"Retry-After: 1" in response
        assert b"this client holds its limit of 4 connections" in response
        for sock in held:
            sock.close()
        wait_for(lambda: server.httpd.open_connections == 0)
        assert post(server.base_url, "chat/completions", BODY)[0] == 200


def test_requests_beyond_the_pending_limit_get_a_503_with_retry_after():
    limits = ServerLimits(max_pending=2)
    with LocalServer(get_engine("tiny-random"), "tiny", "127.0.0.1", 0, limits=limits).start() as server:
        held = [open_request(server.port, {**LONG, "stream": True}) for _ in range(2)]
        try:
            wait_for(lambda: server.httpd.pending == 2)
            request = urllib.request.Request(
                f"{server.base_url}/chat/completions", data=BODY, headers={"Content-Type": "application/json"}
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"
            assert json.loads(refused.value.read())["error"]["code"] == "overloaded"
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda: server.httpd.pending == 0)
        assert post(server.base_url, "chat/completions", BODY)[0] == 200


def test_a_stream_that_is_not_read_is_cut_at_its_buffer_limit_and_its_rows_dropped():
    limits = ServerLimits(max_response_buffer_bytes=32 * 1024, write_timeout_s=1)
    with LocalServer(get_engine("tiny-random"), "tiny", "127.0.0.1", 0, limits=limits).start() as server:
        engine = server.engine
        dropped = len(engine.cancellations)
        # 16 choices of 2,000 tokens: megabytes of events, more than the socket buffers hold
        data = json.dumps({**LONG, "max_tokens": 2000, "n": 16, "stream": True}).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
            % (len(data), data)
        )
        try:
            wait_for(lambda: len(engine.cancellations) > dropped, 120)
            assert engine.cancellations[-1].tokens < 2000
            wait_for(lambda: server.httpd.pending == 0 and server.httpd.buffered_bytes == 0)
        finally:
            sock.close()
        assert post(server.base_url, "chat/completions", BODY)[0] == 200


def test_a_response_past_the_deadline_gets_a_504_and_its_rows_are_dropped():
    limits = ServerLimits(response_timeout_s=1)
    with LocalServer(get_engine("tiny-random"), "tiny", "127.0.0.1", 0, limits=limits).start() as server:
        dropped = len(server.engine.cancellations)
        status, payload = post(server.base_url, "chat/completions", json.dumps(LONG).encode())
        assert status == 504 and payload["error"]["code"] == "response_timeout"
        wait_for(lambda: len(server.engine.cancellations) > dropped)
        sock = open_request(server.port, {**LONG, "stream": True})
        sock.settimeout(30)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        sock.close()
        assert b"response_timeout" in received  # the stream ends with an error event
