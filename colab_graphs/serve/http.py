"""The OpenAI-compatible HTTP core that `colab-graphs serve` and the scripted test server share.

`OpenAIServer` is an HTTP/1.1 server (keep-alive, no Nagle delay) built so that no client can hold what other
clients need:

* One selector thread owns every socket and reads each request *whole* (request line, headers and the
  ``Content-Length`` body) before any worker sees it, so a connection that sends nothing, or half a request,
  costs a file descriptor and no thread. Complete requests go to a bounded pool of worker threads.
* Deadlines: a request must arrive whole within ``read_timeout_s`` of its first byte (else 408), a kept-alive
  connection may sit idle ``idle_timeout_s``, and a response write may block ``write_timeout_s``.
* Limits: at most ``max_connections`` open sockets (the next gets a 503 with ``Retry-After`` and is closed),
  request bodies up to ``max_body_bytes`` (413), headers up to ``max_header_bytes`` (431), a
  ``Content-Length`` that is not a number (400), chunked request bodies (411).
* Every error is OpenAI-shaped JSON: ``{"error": {"message", "type", "param", "code"}}``, malformed HTTP and
  unknown routes included; an exception inside a handler becomes that request's own 500.
* One access-log line per request on the ``colab_graphs.access`` logger (INFO): client, method, path without
  its query string, status, seconds, and token counts when the handler reports them. Never a body or a header:
  they may carry keys.

`OpenAIHandler` routes ``GET /v1/models`` and ``POST /v1/chat/completions``, ``/v1/completions`` and
``/v1/embeddings`` (with or without the ``/v1`` prefix) and writes JSON responses and server-sent event streams
(chunked, ending in ``data: [DONE]``). A server supplies `models()` and `chat(body)` (and `completions(body)`
where it serves them).
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import logging
import re
import selectors
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

MODELS_ROUTES = ("/v1/models", "/models")
CHAT_ROUTES = ("/v1/chat/completions", "/chat/completions")
COMPLETIONS_ROUTES = ("/v1/completions", "/completions")
EMBEDDINGS_ROUTES = ("/v1/embeddings", "/embeddings")
# Keys of a request body that say how to deliver a reply, not which reply: not part of the canonical request.
TRANSPORT_KEYS = frozenset({"model", "messages", "stream", "stream_options", "user"})

access_log = logging.getLogger("colab_graphs.access")
_log = logging.getLogger(__name__)
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_LINGER_S = 2.0  # how long a refused connection is read from before it is closed


@dataclass(frozen=True)
class ServerLimits:
    """What one client may hold of a server.

    Attributes:
        read_timeout_s: Seconds from a request's first byte until it must have arrived whole (408 after).
        idle_timeout_s: Seconds a kept-alive connection may wait for its next request.
        write_timeout_s: Seconds one write of a response may block on a client that does not read.
        max_connections: Open client sockets; the next one gets a 503 and is closed.
        max_workers: Requests handled at once (threads, started as needed); complete requests beyond wait.
        max_body_bytes: Largest request body (413 beyond).
        max_header_bytes: Largest request line plus headers (431 beyond).
    """

    read_timeout_s: float = 30.0
    idle_timeout_s: float = 60.0
    write_timeout_s: float = 60.0
    max_connections: int = 512
    max_workers: int = 64
    max_body_bytes: int = 16 * 2**20
    max_header_bytes: int = 64 * 2**10

    def __post_init__(self) -> None:
        problems = [f"{name} must be > 0, got {value!r}" for name, value in vars(self).items() if value <= 0]
        if problems:
            raise ValueError("; ".join(problems))


class RequestError(Exception):
    """A request the server refuses: raised by a handler, answered as an OpenAI error with `status`."""

    def __init__(
        self, message: str, param: str | None = None, code: str | None = None, status: int = 400
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


def error_body(
    message: str, kind: str | None = None, code: Any = None, status: int = 400, param: str | None = None
) -> dict[str, Any]:
    """An OpenAI error body; `kind` defaults from the status (client or server error)."""
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def shutdown_socket(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the client
        connection.shutdown(socket.SHUT_RDWR)


def _raw_error(status: int, message: str, code: str, headers: Mapping[str, str] | None = None) -> bytes:
    """A complete HTTP error response that closes the connection (sent by the selector thread)."""
    body = json.dumps(error_body(message, code=code, status=status)).encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Connection:
    """One client socket: bytes read so far and the deadline that applies to what it is doing."""

    def __init__(self, sock: socket.socket, address: Any, idle_timeout_s: float) -> None:
        self.sock, self.address = sock, address
        self.buffer = bytearray()
        self.reading = False  # the first byte of a request has arrived, the request is not whole yet
        self.continued = False  # "100 Continue" already sent for the request being read
        self.deadline: float | None = time.monotonic() + idle_timeout_s
        self.request = b""
        self.arrived = 0.0  # when the request being served arrived whole (the access log times from here)


class _Frame:
    """Where a request ends in a connection's buffer, or why it never will."""

    def __init__(self, end: int | None = None, error: tuple[int, str, str] | None = None) -> None:
        self.end, self.error = end, error
        self.expects_continue = False


def _frame(buffer: bytearray, limits: ServerLimits) -> _Frame:
    head_end = _HEAD_END.search(buffer, 0, limits.max_header_bytes + 4)
    if head_end is None:
        if len(buffer) > limits.max_header_bytes:
            return _Frame(
                error=(431, f"request headers exceed {limits.max_header_bytes} bytes", "headers_too_large")
            )
        return _Frame()
    head = bytes(buffer[: head_end.start()]).decode("latin-1").splitlines()[1:]
    fields = {}
    for line in head:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    if "transfer-encoding" in fields:
        return _Frame(
            error=(411, "chunked request bodies are not supported: send Content-Length", "length_required")
        )
    length_text = fields.get("content-length", "0")
    if not length_text.isdigit():
        return _Frame(
            error=(400, f"Content-Length must be a number of bytes, got {length_text!r}", "bad_length")
        )
    length = int(length_text)
    if length > limits.max_body_bytes:
        message = f"the request body is {length} bytes; this server takes at most {limits.max_body_bytes}"
        return _Frame(error=(413, message, "body_too_large"))
    frame = _Frame()
    if len(buffer) >= head_end.end() + length:
        frame.end = head_end.end() + length
    frame.expects_continue = fields.get("expect", "").lower() == "100-continue"
    return frame


class _SocketWriter(io.BufferedIOBase):
    """``wfile`` for a handler: every write goes out whole (``sendall``), under the write timeout."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.sock.sendall(data)
        return len(data)


class OpenAIServer:
    """An HTTP server for an `OpenAIHandler` subclass; `app` is what the handler serves.

    Call `serve_forever` in one thread and `stop` from any other; `stop` joins every thread it started.
    """

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[OpenAIHandler],
        app: Any,
        name: str,
        limits: ServerLimits | None = None,
    ) -> None:
        self.app, self.name, self.handler = app, name, handler
        self.limits = limits or ServerLimits()
        self.stopping = threading.Event()
        self.socket = socket.create_server(address, backlog=256)  # a deep queue: many clients start at once
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self.server_port = self.server_address[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.socket, selectors.EVENT_READ)
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        self._workers = ThreadPoolExecutor(self.limits.max_workers, f"{name}:{self.server_port}:request")
        self._connections: set[_Connection] = set()
        self._returned: collections.deque[_Connection] = collections.deque()
        self._lingering: dict[socket.socket, float] = {}  # refused sockets, closed once the client is done
        self._lock = threading.Lock()
        self._loop_done = threading.Event()
        self._loop_done.set()  # no loop is running until serve_forever starts one
        self._closed = False

    @property
    def base_url(self) -> str:
        host = self.server_address[0]
        host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        return f"http://{host}:{self.server_port}/v1"

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accept, read and dispatch requests until `stop` is called."""
        self._loop_done.clear()
        try:
            while not self.stopping.is_set():
                for key, _ in self._selector.select(self._select_timeout(poll_interval)):
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.fileobj is self._wake_read:
                        self._drain_wakeups()
                    elif isinstance(key.data, socket.socket):  # a refused connection, registered with itself
                        self._drain_lingering(key.data)
                    else:
                        self._read(key.data)
                self._expire()
        finally:
            self._loop_done.set()

    def stop(self) -> None:
        """Stop serving, cut open connections (idle keep-alive ones included), join every thread; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.stopping.set()
            connections = list(self._connections)
        self._wake()
        self._loop_done.wait()
        for connection in connections:
            shutdown_socket(connection.sock)  # wakes a worker blocked writing to a client that does not read
        self._workers.shutdown(wait=True)
        for sock in [*(c.sock for c in connections), *self._lingering]:
            sock.close()
        self._selector.close()
        for sock in (self.socket, self._wake_read, self._wake_write):
            sock.close()

    # --- the selector thread ------------------------------------------------------------------------------

    def _select_timeout(self, poll_interval: float) -> float:
        with self._lock:
            deadlines = [c.deadline for c in self._connections if c.deadline is not None]
        deadlines += self._lingering.values()
        if not deadlines:
            return poll_interval
        return max(0.0, min(poll_interval, min(deadlines) - time.monotonic()))

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of file descriptors: the queued clients wait until some close
                _log.warning("%s: accept failed (%s)", self.name, exc)
                time.sleep(0.05)  # the listening socket stays readable: do not spin on it
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no delayed-ACK wait on keep-alive
            sock.setblocking(False)
            with self._lock:
                full = len(self._connections) >= self.limits.max_connections
                if not full:
                    connection = _Connection(sock, address, self.limits.idle_timeout_s)
                    self._connections.add(connection)
            if full:
                message = f"the server holds its limit of {self.limits.max_connections} connections; retry"
                self._refuse(sock, address, 503, message, "too_many_connections", {"Retry-After": "1"})
                continue
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _read(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(connection)
            return
        if not connection.reading:
            connection.reading = True
            connection.deadline = time.monotonic() + self.limits.read_timeout_s
        connection.buffer += data
        self._dispatch_if_whole(connection)

    def _dispatch_if_whole(self, connection: _Connection) -> None:
        frame = _frame(connection.buffer, self.limits)
        if frame.error is not None:
            status, message, code = frame.error
            self._selector.unregister(connection.sock)
            self._forget(connection)
            self._refuse(connection.sock, connection.address, status, message, code)
            return
        if frame.end is None:
            if frame.expects_continue and not connection.continued:
                connection.continued = True
                with contextlib.suppress(OSError):
                    connection.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        connection.request, connection.arrived = bytes(connection.buffer[: frame.end]), time.monotonic()
        del connection.buffer[: frame.end]
        connection.reading, connection.continued, connection.deadline = False, False, None
        self._selector.unregister(connection.sock)
        self._workers.submit(self._handle, connection)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            overdue = [c for c in self._connections if c.deadline is not None and c.deadline <= now]
        for connection in overdue:
            self._selector.unregister(connection.sock)
            self._forget(connection)
            if connection.reading:
                message = f"the request did not arrive whole within {self.limits.read_timeout_s:g} s"
                self._refuse(connection.sock, connection.address, 408, message, "request_timeout")
            else:
                connection.sock.close()
        for sock in [sock for sock, deadline in self._lingering.items() if deadline <= now]:
            self._end_lingering(sock)

    def _drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_read.recv(4096):
                pass
        while self._returned:
            connection = self._returned.popleft()
            connection.deadline = time.monotonic() + self.limits.idle_timeout_s
            self._selector.register(connection.sock, selectors.EVENT_READ, connection)
            if connection.buffer:  # a pipelined request arrived with the last one
                connection.reading = True
                connection.deadline = time.monotonic() + self.limits.read_timeout_s
                self._dispatch_if_whole(connection)

    def _refuse(
        self,
        sock: socket.socket,
        address: Any,
        status: int,
        message: str,
        code: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Send an error and close, reading what the client still sends for a moment: closing a socket with
        unread bytes resets the connection, and the client would see the reset instead of the error."""
        access_log.info("%s - - %d %s", _client(address), status, code)
        try:
            sock.send(_raw_error(status, message, code, headers))  # small, into an empty buffer: no blocking
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self._lingering) >= self.limits.max_connections:
            sock.close()
            return
        self._lingering[sock] = time.monotonic() + _LINGER_S
        self._selector.register(sock, selectors.EVENT_READ, sock)

    def _drain_lingering(self, sock: socket.socket) -> None:
        try:
            if sock.recv(65536):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._end_lingering(sock)

    def _end_lingering(self, sock: socket.socket) -> None:
        self._lingering.pop(sock, None)
        self._selector.unregister(sock)
        sock.close()

    def _close(self, connection: _Connection) -> None:
        self._selector.unregister(connection.sock)
        self._forget(connection)
        connection.sock.close()

    def _forget(self, connection: _Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")

    # --- worker threads -----------------------------------------------------------------------------------

    def _handle(self, connection: _Connection) -> None:
        sock = connection.sock
        keep = False
        try:
            sock.settimeout(self.limits.write_timeout_s)
            handler = self.handler(connection, connection.address, self)
            keep = not handler.close_connection and not self.stopping.is_set()
        except OSError:
            pass  # the client hung up, or stop() cut the connection
        except Exception:  # a handler bug: logged; the client got its 500 if nothing had been sent
            _log.exception("%s: request from %s failed", self.name, _client(connection.address))
        with self._lock:
            keep = keep and not self._closed
            if not keep:
                self._connections.discard(connection)
        if not keep:
            shutdown_socket(sock)
            sock.close()
            return
        sock.setblocking(False)
        self._returned.append(connection)
        self._wake()


def _client(address: Any) -> str:
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) and len(address) >= 2 else str(address)


class OpenAIHandler(BaseHTTPRequestHandler):
    """Routes and response writing for one whole request; subclasses implement `models()` and `chat(body)`.

    A handler raises `RequestError` to refuse a request; any other exception becomes a 500 (when no response
    has started) that names the exception.
    """

    # HTTP/1.1 keep-alive, as vLLM and OpenAI serve: clients reuse pooled connections.
    protocol_version = "HTTP/1.1"
    # socketserver types a handler's server as its BaseServer; this handler is driven by OpenAIServer alone.
    server: OpenAIServer  # type: ignore[assignment]
    request: _Connection

    def __init__(self, connection: _Connection, address: Any, server: OpenAIServer) -> None:
        """What `BaseRequestHandler.__init__` does, typed for this server: the request is a connection whose
        request was read whole (`setup` reads it from there), not a socket handed over by socketserver."""
        self.request, self.client_address, self.server = connection, address, server
        self.setup()
        try:
            self.handle()
        finally:
            self.finish()

    def setup(self) -> None:
        self.connection = self.request.sock
        self.rfile = io.BytesIO(self.request.request)
        self.wfile = _SocketWriter(self.connection)
        self.status: int | None = None
        self.started = self.request.arrived
        self.usage: dict[str, int] = {}  # token counts for the access log, when the handler reports them

    def handle(self) -> None:
        """One request (the server reads the next one whole before handing it to a worker)."""
        self.close_connection = True
        self.handle_one_request()

    def finish(self) -> None:
        if self.status is not None or getattr(self, "command", None):
            tokens = " ".join(f"{name}={count}" for name, count in self.usage.items())
            access_log.info(
                "%s %s %s %s %.3fs %s",
                _client(self.client_address),
                getattr(self, "command", None) or "-",
                self.route if getattr(self, "path", None) else "-",
                self.status if self.status is not None else "-",
                time.monotonic() - self.started,
                tokens,
            )

    def handle_expect_100(self) -> bool:
        return True  # the selector thread answered "100 Continue" while the body was on its way

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the access log (`colab_graphs.access`) has one line per request instead."""

    def send_response(self, code: int, message: str | None = None) -> None:
        self.status = code
        super().send_response(code, message)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Malformed HTTP (a bad request line, too many headers, an unknown method) as an OpenAI error."""
        self.close_connection = True
        text = message or HTTPStatus(code).phrase
        message = text if not explain else f"{text}: {explain}"
        self.send_error_json(code, message, "invalid_request_error", code="bad_http")  # the client's doing

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        self.begin()
        route = self.route
        post_routes = {
            CHAT_ROUTES: self.chat,
            COMPLETIONS_ROUTES: self.completions,
            EMBEDDINGS_ROUTES: self.embeddings,
        }
        try:
            if route in MODELS_ROUTES:
                if method != "GET":
                    raise RequestError(
                        f"{route} takes GET, not {method}", code="method_not_allowed", status=405
                    )
                self.send_json(200, {"object": "list", "data": self.models()})
                return
            for routes, answer in post_routes.items():
                if route in routes:
                    if method != "POST":
                        raise RequestError(
                            f"{route} takes POST, not {method}", code="method_not_allowed", status=405
                        )
                    answer(self.read_json())
                    return
            raise RequestError(f"no route {method} {route}", code="not_found", status=404)
        except RequestError as exc:
            self.refuse(exc)
        except OSError:
            raise  # the client hung up: nothing to answer
        except Exception as exc:
            if self.status is not None:
                raise  # the response has started: all that is left is to close the connection
            _log.exception("%s %s failed", method, route)
            self.close_connection = True
            self.send_error_json(500, f"the server failed on this request: {type(exc).__name__}: {exc}")

    # --- what a server supplies ---------------------------------------------------------------------------

    def begin(self) -> None:
        """Called as a request starts (the scripted server times and logs requests)."""

    def models(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def chat(self, body: Any) -> None:
        """Answer a chat request; `body` is the parsed JSON."""
        raise NotImplementedError

    def completions(self, body: Any) -> None:
        """Answer a legacy text completion request; this server serves none unless a subclass says so."""
        raise RequestError(
            "this server does not serve /v1/completions; use /v1/chat/completions",
            code="not_found",
            status=404,
        )

    def embeddings(self, body: Any) -> None:
        raise RequestError(
            "this server serves no embedding model: it answers /v1/chat/completions",
            code="not_found",
            status=404,
        )

    def responding(self, status: int | None) -> None:
        """Called when a response's status is decided, before its body goes out (None: no response)."""

    # --- reading and writing ------------------------------------------------------------------------------

    def read_json(self) -> Any:
        """The request body as JSON (the server checked Content-Length while reading it)."""
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length)
        if not data:
            raise RequestError("the request has no body: send a JSON object", code="invalid_json")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise RequestError(f"the request body is not JSON: {exc}", code="invalid_json") from None

    def refuse(self, error: RequestError) -> None:
        self.send_json(
            error.status, error_body(error.message, code=error.code, status=error.status, param=error.param)
        )

    def send_json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        self.send_bytes(status, json.dumps(body).encode(), headers)

    def send_bytes(self, status: int, data: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.responding(status)
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(
        self, status: int, message: str, kind: str | None = None, code: Any = None, **headers: str
    ) -> None:
        self.send_json(status, error_body(message, kind, code, status), headers)

    def send_events(self, events: Iterable[dict[str, Any]]) -> None:
        """A 200 server-sent event stream of `events` (chunked), ending with ``data: [DONE]``.

        Events are written as they come, so a generator streams tokens as they are made.
        """
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.responding(200)
        self.end_headers()
        for event in events:
            self._write_chunk(f"data: {json.dumps(event)}\n\n".encode())
        self._write_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
