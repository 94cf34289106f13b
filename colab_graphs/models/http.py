"""The OpenAI-compatible HTTP core that `colab-graphs serve` and the scripted test server share.

`OpenAIServer` is a threaded HTTP/1.1 server (keep-alive, no Nagle delay, a deep accept queue, connection threads
joined on close, no traceback when a client hangs up); `OpenAIHandler` routes ``GET /v1/models`` and ``POST
/v1/chat/completions`` (with or without the ``/v1`` prefix), reads the JSON body, and writes JSON responses,
OpenAI-shaped errors and server-sent event streams (chunked, ending in ``data: [DONE]``). A server supplies
`models()` and `chat(body)`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import sys
import threading
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODELS_ROUTES = ("/v1/models", "/models")
CHAT_ROUTES = ("/v1/chat/completions", "/chat/completions")
# Keys of a request body that say how to deliver a reply, not which reply: not part of the canonical request.
TRANSPORT_KEYS = frozenset({"model", "messages", "stream", "stream_options", "user"})


def error_body(message: str, kind: str | None = None, code: Any = None, status: int = 400) -> dict[str, Any]:
    """An OpenAI error body; `kind` defaults from the status (client or server error)."""
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def shutdown_socket(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the client
        connection.shutdown(socket.SHUT_RDWR)


class OpenAIServer(ThreadingHTTPServer):
    """A threaded HTTP server for an `OpenAIHandler` subclass; `app` is what the handler serves."""

    request_queue_size = 256  # the default 5 refuses connections when many clients start at once
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[OpenAIHandler], app: Any, name: str) -> None:
        self.app = app
        self.name = name
        self.connection_threads: list[threading.Thread] = []
        self.stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        super().__init__(address, handler)

    def stop(self) -> None:
        """Stop serving, cut open connections (idle keep-alive ones included) and join every thread."""
        with self._lock:
            self.stopping.set()
            connections = list(self._connections)
        self.shutdown()
        for connection in connections:
            shutdown_socket(connection)  # an idle keep-alive connection would otherwise hold server_close
        self.server_close()  # joins the connection threads

    def track(self, connection: socket.socket) -> None:
        with self._lock:
            if not self.stopping.is_set():
                self._connections.add(connection)
                return
        shutdown_socket(connection)  # accepted while stop() was running: it will not see this one

    def untrack(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)

    @property
    def base_url(self) -> str:
        host = self.server_address[0]
        host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        return f"http://{host}:{self.server_address[1]}/v1"

    def process_request(self, request: Any, client_address: Any) -> None:
        # ThreadingMixIn joins only non-daemon threads on close. These are daemons (a server nobody stops
        # must not keep the interpreter alive) that server_close still joins, so stopping leaves none behind.
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"{self.name}:{self.server_port}:connection",
            daemon=True,
        )
        self.connection_threads = [t for t in self.connection_threads if t.is_alive()]
        self.connection_threads.append(thread)
        thread.start()

    def server_close(self) -> None:
        super().server_close()
        for thread in self.connection_threads:
            thread.join()

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can block for seconds without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client hanging up, or a stop closing its socket, is not an error worth a traceback
        super().handle_error(request, client_address)


class OpenAIHandler(BaseHTTPRequestHandler):
    """Routes and response writing; subclasses implement `models()` and `chat(body)`."""

    # HTTP/1.1 keep-alive, as vLLM and OpenAI serve: clients reuse pooled connections.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle's algorithm a keep-alive client then waits
    # for a delayed ACK, about 40 ms per request.
    disable_nagle_algorithm = True
    server: OpenAIServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: one line per request is noise (the scripted server keeps its own request log)."""

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    def do_GET(self) -> None:
        self.begin()
        if self.route in MODELS_ROUTES:
            self.send_json(200, {"object": "list", "data": self.models()})
        else:
            self.send_error_json(404, f"no route GET {self.route}")

    def do_POST(self) -> None:
        self.begin()
        if self.route in CHAT_ROUTES:
            self.chat(self.read_json())
        else:
            self.send_error_json(404, f"no route POST {self.route}")

    # --- what a server supplies ---------------------------------------------------------------------------

    def begin(self) -> None:
        """Called as a request starts (the scripted server times and logs requests)."""

    def models(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def chat(self, body: Any) -> None:
        """Answer a chat request; `body` is the parsed JSON (None when it was not JSON)."""
        raise NotImplementedError

    def responding(self, status: int | None) -> None:
        """Called when a response's status is decided, before its body goes out (None: no response)."""

    # --- reading and writing ------------------------------------------------------------------------------

    def read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            return json.loads(self.rfile.read(length)) if length else None
        except ValueError:
            return None

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
        self.wfile.flush()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
