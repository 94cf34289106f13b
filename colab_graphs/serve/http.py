"""The OpenAI-compatible HTTP core that `colab-graphs serve` and the scripted test server share.

`OpenAIServer` runs aiohttp's low-level server on an event loop in the thread that calls `serve_forever`.
aiohttp parses every request (request line, headers, ``Content-Length`` and chunked framing, with llhttp's
strict checks: a duplicate or non-decimal ``Content-Length``, ``Content-Length`` beside ``Transfer-Encoding``,
control characters in a header are all refused), so no request is framed one way and read another. What
this module adds is what no client may hold of the others:

* Deadlines: a request must arrive whole within ``read_timeout_s`` of its first byte (else 408), a kept-alive
  connection may sit idle ``idle_timeout_s``, one write may wait ``write_timeout_s`` on a client that does not
  read, and a whole response must be out within ``response_timeout_s``.
* Limits: ``max_connections`` open sockets in all and ``max_connections_per_client`` per client address (the
  next gets a 503 with ``Retry-After`` and is closed); ``max_pending`` requests admitted at once, queued or
  running (503 with ``Retry-After`` beyond); request bodies up to ``max_body_bytes`` (413), request lines and
  header fields up to ``max_line_bytes`` each; at most ``max_buffered_bytes`` of request bodies and unsent
  responses held in memory together (503 beyond), and ``max_response_buffer_bytes`` of unsent response per
  connection: a stream whose client stops reading is cut, never buffered without end.
* Handlers run in a bounded pool of worker threads and never write to a socket: what they send goes to the
  event loop, which writes it. A slow reader costs its own connection, never a worker.
* A client that hangs up (or outlives the response deadline) is *abandoned*: the callbacks its handler
  registered with `OpenAIHandler.on_abandon` run at once (the local server cancels the request's rows in the
  engine), and the handler's next write raises `ConnectionError`.
* Every error is OpenAI-shaped JSON: ``{"error": {"message", "type", "param", "code"}}``, malformed HTTP and
  unknown routes included; an exception inside a handler becomes that request's own 500.
* One access-log line per request on the ``colab_graphs.access`` logger (INFO): client, method, path without
  its query string, status, seconds, and token counts when the handler reports them. Never a body or a header:
  they may carry keys.

`OpenAIHandler` routes ``GET /v1/models`` and ``POST /v1/chat/completions``, ``/v1/completions`` and
``/v1/embeddings`` (with or without the ``/v1`` prefix) and writes JSON responses and server-sent event streams
(ending in ``data: [DONE]``). A server supplies `models()` and `chat(body)` (and `completions(body)` where it
serves them).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

MODELS_ROUTES = ("/v1/models", "/models")
CHAT_ROUTES = ("/v1/chat/completions", "/chat/completions")
COMPLETIONS_ROUTES = ("/v1/completions", "/completions")
EMBEDDINGS_ROUTES = ("/v1/embeddings", "/embeddings")
# Keys of a request body that say how to deliver a reply, not which reply: not part of the canonical request.
TRANSPORT_KEYS = frozenset({"model", "messages", "stream", "stream_options", "user"})

access_log = logging.getLogger("colab_graphs.access")
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """What one client may hold of a server.

    Attributes:
        read_timeout_s: Seconds from a request's first byte until it must have arrived whole (408 after).
        idle_timeout_s: Seconds a kept-alive connection may wait for its next request.
        write_timeout_s: Seconds one write of a response may wait on a client that does not read.
        response_timeout_s: Seconds from a request's arrival until its response must be out whole (504, or
            an error event ending a stream that started).
        max_connections: Open client sockets; the next one gets a 503 and is closed.
        max_connections_per_client: Open sockets from one client address; the next one gets a 503.
        max_workers: Requests handled at once (threads, started as needed); admitted requests beyond wait.
        max_pending: Requests admitted at once, waiting or running (503 with Retry-After beyond).
        max_body_bytes: Largest request body (413 beyond).
        max_line_bytes: Longest request line, and longest header field.
        max_buffered_bytes: Request bodies and unsent responses held in memory, all clients together.
        max_response_buffer_bytes: Unsent response held for one connection; beyond, the connection is cut.
    """

    read_timeout_s: float = 30.0
    idle_timeout_s: float = 60.0
    write_timeout_s: float = 60.0
    response_timeout_s: float = 900.0
    max_connections: int = 512
    max_connections_per_client: int = 256
    max_workers: int = 64
    max_pending: int = 256
    max_body_bytes: int = 16 * 2**20
    max_line_bytes: int = 64 * 2**10
    max_buffered_bytes: int = 256 * 2**20
    max_response_buffer_bytes: int = 4 * 2**20

    def __post_init__(self) -> None:
        problems = [f"{name} must be > 0, got {value!r}" for name, value in vars(self).items() if value <= 0]
        if problems:
            raise ValueError("; ".join(problems))


class RequestError(Exception):
    """A request the server refuses: raised by a handler, answered as an OpenAI error with `status`."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status
        self.headers = dict(headers or {})


def error_body(
    message: str, kind: str | None = None, code: Any = None, status: int = 400, param: str | None = None
) -> dict[str, Any]:
    """An OpenAI error body; `kind` defaults from the status (client or server error)."""
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _error_response(
    status: int, message: str, code: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    body = json.dumps(error_body(message, code=code, status=status))
    return web.Response(status=status, text=body, content_type="application/json", headers=headers)


def _raw_error(status: int, message: str, code: str, headers: Mapping[str, str] | None = None) -> bytes:
    """A complete HTTP error response that closes the connection, for a connection no request was read on."""
    body = json.dumps(error_body(message, code=code, status=status)).encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _client(address: Any) -> str:
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) and len(address) >= 2 else str(address)


class _Protocol(RequestHandler):
    """aiohttp's connection handler, plus the connection limits and the arrival deadlines.

    aiohttp times idle kept-alive connections only after a first response and never times a request that is
    arriving; this times both: `idle_timeout_s` while no byte of a request has come, then `read_timeout_s`
    from its first byte until its head is parsed (the body's own deadline is the dispatcher's).
    """

    def __init__(self, owner: OpenAIServer, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.owner = owner
        self.client: str | None = None
        self.first_byte: float | None = None  # of the request being read; None while idle or busy
        self.awaiting_head = True
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) else str(peer)
        refusal = self.owner._admit_connection(host)
        if refusal is not None:
            access_log.info("%s - - 503 too_many_connections", _client(peer))
            assert isinstance(transport, asyncio.Transport)
            transport.write(_raw_error(503, refusal, "too_many_connections", {"Retry-After": "1"}))
            self.force_close()
            transport.close()  # flushes the 503 first
            return
        self.client = host
        self._arm(self.owner.limits.idle_timeout_s)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        if self.client is not None:
            self.owner._release_connection(self.client)
            self.client = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.awaiting_head and self.first_byte is None and data:
            self.first_byte = time.monotonic()
            self._arm(self.owner.limits.read_timeout_s)
        super().data_received(data)

    def head_arrived(self) -> float:
        """A request's head was parsed: stop the arrival clock; returns when its first byte came."""
        self._disarm()
        self.awaiting_head = False
        first, self.first_byte = self.first_byte or time.monotonic(), None
        return first

    def request_done(self) -> None:
        self.awaiting_head = True
        if self.transport is not None and not self.transport.is_closing():
            self._arm(self.owner.limits.idle_timeout_s)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """Malformed HTTP (aiohttp's parser refused it) as an OpenAI error, not aiohttp's text page."""
        self._disarm()
        # The parser's first line names the fault; the lines after it quote the request, which may hold a key.
        reason = str(message or exc or HTTPStatus(status).phrase).strip().splitlines()[0]
        reason = reason.split(": b'")[0].rstrip(":")
        text = f"malformed HTTP request: {reason}"
        access_log.info("%s - - %d bad_http", request.remote, status)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was sent already: the connection is closed instead")
        response = _error_response(status, text, "bad_http" if status < 500 else "server_error")
        response.force_close()
        return response

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        transport = self.transport
        if transport is None or transport.is_closing() or not self.awaiting_head:
            return
        if self.first_byte is not None:
            seconds = self.owner.limits.read_timeout_s
            message = f"the request did not arrive whole within {seconds:g} s"
            access_log.info("%s - - 408 request_timeout", self.client)
            assert isinstance(transport, asyncio.Transport)
            transport.write(_raw_error(408, message, "request_timeout"))
        self.force_close()
        transport.close()


class _Exchange:
    """One request's way between its handler (a worker thread) and the event loop that writes its response.

    The handler `put`s the response head and body pieces; the loop writes them. `put` never blocks: a client
    that does not read lets unsent bytes pile up to ``max_response_buffer_bytes``, and then it is abandoned.
    """

    def __init__(self, owner: OpenAIServer, loop: asyncio.AbstractEventLoop) -> None:
        self.owner, self.loop = owner, loop
        self.items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.unsent = 0
        self.gone = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def put(self, kind: str, value: Any = None, size: int = 0) -> None:
        """From the worker thread: hand a piece of the response to the loop."""
        if self.gone.is_set():
            raise ConnectionError("the client is gone")
        limit = self.owner.limits.max_response_buffer_bytes
        with self._lock:
            if size and self.unsent + size > limit:
                self.loop.call_soon_threadsafe(self.abandon)
                raise ConnectionError(f"the client left {self.unsent} bytes unread (limit {limit})")
            if size and not self.owner._reserve(size):
                self.loop.call_soon_threadsafe(self.abandon)
                raise ConnectionError("the server holds its limit of buffered bytes")
            self.unsent += size
        self.loop.call_soon_threadsafe(self.items.put_nowait, (kind, value))

    def sent(self, size: int) -> None:
        with self._lock:
            self.unsent -= size
        self.owner._release(size)

    def on_abandon(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self.gone.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def abandon(self) -> None:
        """The client is gone or out of time: stop the work done for it (any thread)."""
        with self._lock:
            if self.gone.is_set():
                return
            self.gone.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one failing callback must not keep the others from stopping their work
                _log.exception("an abandon callback failed")

    def drop_unsent(self) -> None:
        with self._lock:
            unsent, self.unsent = self.unsent, 0
        self.owner._release(unsent)


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
        self._workers = ThreadPoolExecutor(self.limits.max_workers, f"{name}:{self.server_port}:request")
        self._lock = threading.Lock()
        self._per_client: collections.Counter[str] = collections.Counter()
        self._pending = 0
        self._buffered = 0
        self._exchanges: set[_Exchange] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._loop_done = threading.Event()
        self._loop_done.set()  # no loop is running until serve_forever starts one
        self._ready = threading.Event()
        self._closed = False

    @property
    def base_url(self) -> str:
        host = self.server_address[0]
        host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        return f"http://{host}:{self.server_port}/v1"

    @property
    def open_connections(self) -> int:
        with self._lock:
            return sum(self._per_client.values())

    @property
    def pending(self) -> int:
        """Requests admitted and not yet answered."""
        with self._lock:
            return self._pending

    @property
    def buffered_bytes(self) -> int:
        """Request bodies and unsent responses held now."""
        with self._lock:
            return self._buffered

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until `stop` is called (`poll_interval` is unused: the loop wakes on events)."""
        del poll_interval
        if self.stopping.is_set():
            return
        self._loop_done.clear()
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve(loop))
        finally:
            loop.close()
            self._ready.set()
            self._loop_done.set()

    def stop(self) -> None:
        """Stop serving, cut open connections (idle keep-alive ones included), join every thread; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.stopping.set()
        if not self._loop_done.is_set():
            self._ready.wait()
            loop, event = self._loop, self._stop_event
            if loop is not None and event is not None:
                with contextlib.suppress(RuntimeError):  # the loop ended already
                    loop.call_soon_threadsafe(event.set)
            self._loop_done.wait()
        self._workers.shutdown(wait=True)
        self.socket.close()

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop, self._stop_event = loop, asyncio.Event()
        limits = self.limits
        manager = web.Server(self._dispatch, handler_cancellation=True)
        options = {
            "loop": loop,
            "access_log": None,  # ours is `colab_graphs.access`: one line per request, no headers
            "max_line_size": limits.max_line_bytes,
            "max_field_size": limits.max_line_bytes,
            # The idle clock is `_Protocol`'s; aiohttp's own keep-alive clock only backs it up.
            "keepalive_timeout": limits.idle_timeout_s + limits.read_timeout_s,
            "lingering_time": 2.0,
        }
        server = await loop.create_server(
            lambda: _Protocol(self, manager, **options), sock=self.socket, backlog=256
        )
        self._ready.set()
        try:
            if not self.stopping.is_set():
                await self._stop_event.wait()
        finally:
            server.close()
            for exchange in list(self._exchanges):
                exchange.abandon()
            for connection in manager.connections:
                connection.force_close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(manager.shutdown(1.0), 2.0)
            tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- accounting (any thread) --------------------------------------------------------------------------

    def _admit_connection(self, host: str) -> str | None:
        limits = self.limits
        with self._lock:
            if sum(self._per_client.values()) >= limits.max_connections:
                return f"the server holds its limit of {limits.max_connections} connections; retry"
            if self._per_client[host] >= limits.max_connections_per_client:
                return f"this client holds its limit of {limits.max_connections_per_client} connections"
            self._per_client[host] += 1
        return None

    def _release_connection(self, host: str) -> None:
        with self._lock:
            self._per_client[host] -= 1
            if self._per_client[host] <= 0:
                del self._per_client[host]

    def _reserve(self, size: int) -> bool:
        with self._lock:
            if self._buffered + size > self.limits.max_buffered_bytes:
                return False
            self._buffered += size
            return True

    def _release(self, size: int) -> None:
        with self._lock:
            self._buffered -= size

    # --- the event loop -----------------------------------------------------------------------------------

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        protocol = request.protocol
        assert isinstance(protocol, _Protocol)
        first_byte = protocol.head_arrived()
        try:
            return await self._answer(request, first_byte)
        finally:
            protocol.request_done()

    async def _answer(self, request: web.BaseRequest, first_byte: float) -> web.StreamResponse:
        with self._lock:
            admitted = self._pending < self.limits.max_pending
            self._pending += admitted
        if not admitted:
            message = f"the server holds its limit of {self.limits.max_pending} requests; retry"
            access_log.info("%s %s - 503 overloaded", request.remote, request.method)
            response = _error_response(503, message, "overloaded", {"Retry-After": "1"})
            response.force_close()  # the body, if any, is not read
            return response
        body = b""
        try:
            body = await self._read_body(request, first_byte)
            return await self._respond(request, body)
        except RequestError as exc:
            access_log.info("%s %s - %d %s", request.remote, request.method, exc.status, exc.code)
            response = _error_response(exc.status, exc.message, exc.code or "invalid_request", exc.headers)
            response.force_close()
            return response
        finally:
            self._release(len(body))
            with self._lock:
                self._pending -= 1

    async def _read_body(self, request: web.BaseRequest, first_byte: float) -> bytes:
        limits = self.limits
        length = request.content_length
        if length is not None and length > limits.max_body_bytes:
            message = f"the request body is {length} bytes; this server takes at most {limits.max_body_bytes}"
            raise RequestError(message, code="body_too_large", status=413)
        if not request.can_read_body:
            return b""
        if request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        data = bytearray()
        left = first_byte + limits.read_timeout_s - time.monotonic()
        try:
            async with asyncio.timeout(max(left, 0.0)):
                async for chunk in request.content.iter_any():
                    if len(data) + len(chunk) > limits.max_body_bytes:
                        message = f"the request body exceeds {limits.max_body_bytes} bytes"
                        raise RequestError(message, code="body_too_large", status=413)
                    if not self._reserve(len(chunk)):
                        message = "the server holds its limit of buffered request bytes; retry"
                        raise RequestError(
                            message, code="overloaded", status=503, headers={"Retry-After": "1"}
                        )
                    data += chunk
        except TimeoutError:
            self._release(len(data))
            message = f"the request did not arrive whole within {limits.read_timeout_s:g} s"
            raise RequestError(message, code="request_timeout", status=408) from None
        except BaseException:
            self._release(len(data))
            raise
        return bytes(data)

    async def _respond(self, request: web.BaseRequest, body: bytes) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        exchange = _Exchange(self, loop)
        self._exchanges.add(exchange)
        loop.run_in_executor(self._workers, self._run_handler, exchange, request, body)
        deadline = loop.time() + self.limits.response_timeout_s
        response: web.StreamResponse | None = None
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        kind, value = await exchange.items.get()
                except TimeoutError:
                    exchange.abandon()
                    return await self._out_of_time(request, response)
                if kind == "json":
                    status, data, headers, close = value
                    response = web.Response(status=status, body=data, headers=headers)
                    exchange.sent(len(data))
                    if close:
                        response.force_close()
                    return response
                if kind == "stream":
                    status, headers = value
                    response = web.StreamResponse(status=status, headers=headers)
                    await response.prepare(request)
                elif kind == "data":
                    assert response is not None
                    try:
                        async with asyncio.timeout(self.limits.write_timeout_s):
                            await response.write(value)
                    except TimeoutError:
                        exchange.abandon()
                        if request.transport is not None:  # a client that stopped reading
                            request.transport.abort()
                        raise ConnectionResetError("the client stopped reading") from None
                    exchange.sent(len(value))
                elif kind == "end":
                    assert response is not None
                    await response.write_eof()
                    return response
                else:  # "abort": cut the connection with nothing (more) sent, as a failing upstream does
                    exchange.abandon()
                    if request.transport is not None:
                        request.transport.abort()
                    raise ConnectionResetError("the handler cut the connection")
        except BaseException:
            exchange.abandon()  # the client hung up (this task was cancelled) or the write failed
            raise
        finally:
            exchange.drop_unsent()
            self._exchanges.discard(exchange)

    async def _out_of_time(
        self, request: web.BaseRequest, response: web.StreamResponse | None
    ) -> web.StreamResponse:
        message = f"the response was not complete within {self.limits.response_timeout_s:g} s"
        access_log.info("%s %s %s 504 response_timeout", request.remote, request.method, request.path)
        if response is None:
            error = _error_response(504, message, "response_timeout")
            error.force_close()
            return error
        event = {"error": {"message": message, "type": "server_error", "code": "response_timeout"}}
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(self.limits.write_timeout_s):
                await response.write(f"data: {json.dumps(event)}\n\n".encode())
                await response.write_eof()
        response.force_close()
        return response

    # --- worker threads -----------------------------------------------------------------------------------

    def _run_handler(self, exchange: _Exchange, request: web.BaseRequest, body: bytes) -> None:
        handler = self.handler(self, exchange, request, body)
        try:
            handler.handle()
        except ConnectionError:
            pass  # the client hung up, or stop() cut the connection
        except Exception:  # a handler bug: logged; the client got its 500 if nothing had been sent
            _log.exception("%s: request from %s failed", self.name, request.remote)
        finally:
            if not handler.finished:
                with contextlib.suppress(ConnectionError):
                    exchange.put("abort")
            handler.finish()


class OpenAIHandler:
    """Routes and response writing for one whole request (in a worker thread); subclasses implement
    `models()` and `chat(body)`.

    A handler raises `RequestError` to refuse a request; any other exception becomes a 500 (when no response
    has started) that names the exception.
    """

    server_version = "colab-graphs/1.0"

    def __init__(
        self, server: OpenAIServer, exchange: _Exchange, request: web.BaseRequest, body: bytes
    ) -> None:
        self.server, self.exchange = server, exchange
        self.command = request.method
        self.path = request.raw_path
        self.headers = request.headers
        self.client_address = request.transport.get_extra_info("peername") if request.transport else None
        self.rfile = io.BytesIO(body)
        self.close_connection = False
        self.status: int | None = None
        self.started = time.monotonic()
        self.finished = False  # a whole response was handed to the loop
        self.logged = False
        self.usage: dict[str, int] = {}  # token counts for the access log, when the handler reports them

    def handle(self) -> None:
        method = getattr(self, f"do_{self.command}", None)
        if method is None:
            self.begin()
            self.send_error_json(405, f"{self.command} is not served here", code="method_not_allowed")
            return
        method()

    def finish(self) -> None:
        """The access-log line, once per request: as its whole response is handed over (a client that has
        its answer finds the line written), or when the handler ends without one."""
        if self.logged:
            return
        self.logged = True
        tokens = " ".join(f"{name}={count}" for name, count in self.usage.items())
        access_log.info(
            "%s %s %s %s %.3fs %s",
            _client(self.client_address),
            self.command,
            self.route,
            self.status if self.status is not None else "-",
            time.monotonic() - self.started,
            tokens,
        )

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    @property
    def abandoned(self) -> bool:
        """The client hung up or ran out of time: nothing written now reaches it."""
        return self.exchange.gone.is_set()

    def on_abandon(self, callback: Callable[[], None]) -> None:
        """Run `callback` (from any thread) once the client is gone; at once if it is gone already."""
        self.exchange.on_abandon(callback)

    def abort(self) -> None:
        """Cut the connection without (the rest of) a response, as a failing upstream does."""
        self.finished = True
        self.exchange.put("abort")

    def do_GET(self) -> None:  # noqa: N802 - named after the method, as http.server names them
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        self.begin()
        route = self.route
        post_routes = {
            CHAT_ROUTES: self.chat,
            COMPLETIONS_ROUTES: self.completions,
            EMBEDDINGS_ROUTES: self.embeddings,
            **self.more_post_routes(),
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
        except ConnectionError:
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

    def more_post_routes(self) -> dict[tuple[str, ...], Callable[[Any], None]]:
        """POST routes a server adds (routes -> handler of the parsed JSON body); none by default."""
        return {}

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
        """The request body as JSON (aiohttp framed it; the server bounded its size)."""
        data = self.rfile.read()
        if not data:
            raise RequestError("the request has no body: send a JSON object", code="invalid_json")
        try:
            return json.loads(data)
        except RecursionError:
            raise RequestError("the request body nests JSON too deeply", code="invalid_json") from None
        except ValueError as exc:
            raise RequestError(f"the request body is not JSON: {exc}", code="invalid_json") from None

    def refuse(self, error: RequestError) -> None:
        body = error_body(error.message, code=error.code, status=error.status, param=error.param)
        self.send_json(error.status, body, error.headers)

    def send_text(self, status: int, text: str) -> None:
        self.send_bytes(status, text.encode(), {"Content-Type": "text/plain; charset=utf-8"})

    def send_json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        self.send_bytes(status, json.dumps(body).encode(), headers)

    def send_bytes(self, status: int, data: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.status = status
        fields = {"Content-Type": "application/json", "Server": self.server_version, **(headers or {})}
        self.responding(status)
        self.finished = True
        self.finish()
        self.exchange.put("json", (status, data, fields, self.close_connection), len(data))

    def send_error_json(
        self, status: int, message: str, kind: str | None = None, code: Any = None, **headers: str
    ) -> None:
        self.send_json(status, error_body(message, kind, code, status), headers)

    def send_events(self, events: Iterable[dict[str, Any]]) -> None:
        """A 200 server-sent event stream of `events`, ending with ``data: [DONE]``.

        Events are written as they come, so a generator streams tokens as they are made. When the client is
        gone the generator is closed (its ``finally`` blocks run) and `ConnectionError` is raised.
        """
        self.status = 200
        fields = {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "Server": self.server_version,
        }
        self.responding(200)
        self.exchange.put("stream", (200, fields))
        iterator = iter(events)
        try:
            for event in iterator:
                self._put_data(f"data: {json.dumps(event)}\n\n".encode())
            self._put_data(b"data: [DONE]\n\n")
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()
        self.finished = True
        self.finish()
        self.exchange.put("end")

    def _put_data(self, data: bytes) -> None:
        self.exchange.put("data", data, len(data))
