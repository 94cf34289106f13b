"""The viewer's HTTP server: the page and its assets from the package, and JSON read from the folder on request.

Standard library only (`http.server`), so `colab-graphs view` needs nothing beyond the package, and nothing is
fetched from anywhere but this server: the page works offline. Every request reads the folder again (through a
cache that notices changed files), so reloading the page shows how far a running audit has got. It serves only
regular files whose real path lies inside the folder, and only to requests whose Host header names it.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from colab_graphs.log import LogError, LogVersionError
from colab_graphs.viewer.payload import (
    LogCache,
    ViewerError,
    compare_payload,
    example_payload,
    folder_payload,
    regular_file_inside,
    resolve,
)

ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
    "/favicon.ico": ("favicon.svg", "image/svg+xml"),
}


def asset(name: str) -> bytes:
    return (resources.files("colab_graphs.viewer") / "static" / name).read_bytes()


class _Handler(BaseHTTPRequestHandler):
    server: ViewerServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        self._send(status, json.dumps(data, allow_nan=False, default=str).encode(), "application/json")

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        if not self.server.host_allowed(self.headers.get("Host")):
            # A page elsewhere that rebinds its own name to 127.0.0.1 (DNS rebinding) reaches this server
            # with its name in the Host header: refused, so no page but the viewer's own reads the folder.
            self._json(HTTPStatus.FORBIDDEN, {"error": f"host {self.headers.get('Host')!r} is not allowed"})
            return
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path in ASSETS:
            name, content_type = ASSETS[url.path]
            self._send(HTTPStatus.OK, asset(name), content_type)
            return
        try:
            if url.path == "/file":
                self._send(HTTPStatus.OK, self._image(query), "image/png")
                return
            if url.path == "/api/log":
                data = folder_payload(self.server.root, query.get("path", ""), self.server.cache)
            elif url.path == "/api/compare":
                if "a" not in query or "b" not in query:
                    raise ViewerError(400, "api/compare needs ?a=FOLDER&b=FOLDER")
                data = compare_payload(self.server.root, query["a"], query["b"], self.server.cache)
            elif url.path == "/api/example":
                if "id" not in query:
                    raise ViewerError(400, "api/example needs ?id=EXAMPLE")
                data = example_payload(
                    self.server.root, query.get("path", ""), query["id"], self.server.cache
                )
            else:
                raise ViewerError(404, f"no page {url.path}")
        except ViewerError as err:
            self._json(err.status, {"error": str(err)})
        except LogVersionError as err:
            self._json(HTTPStatus.CONFLICT, {"error": str(err)})
        except (LogError, FileNotFoundError) as err:
            self._json(HTTPStatus.UNPROCESSABLE_ENTITY, {"error": str(err)})
        else:
            self._json(HTTPStatus.OK, _finite(data))

    def _image(self, query: dict[str, str]) -> bytes:
        """A PNG the producer drew in the folder (an audit's plots, a study's heatmap)."""
        name = query.get("name", "")
        folder = resolve(self.server.root, query.get("path", ""))
        if "/" in name or "\\" in name or not name.endswith(".png"):
            raise ViewerError(404, f"no image {name!r}")
        if not regular_file_inside(self.server.root, folder / name):
            raise ViewerError(
                404, f"no image {name!r} in the folder (a link that leads outside it is not served)"
            )
        return (folder / name).read_bytes()


def _finite(data: Any) -> Any:
    """JSON has no NaN or infinity: they are sent as null (a score that could not be computed)."""
    if isinstance(data, float):
        return data if data == data and abs(data) != float("inf") else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_finite(v) for v in data]
    return data


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ANY_ADDRESS = ("0.0.0.0", "::", "")


class ViewerServer(ThreadingHTTPServer):
    """Serves the viewer for the output folder `root` at `url` (port 0: a free port).

    Requests must name this server in their Host header: a loopback name (localhost, 127.0.0.1, [::1]), the
    address it is bound to, this machine's host name when bound to every interface, or one of `allow_hosts`
    (``"*"``: any). Anything else gets 403, so a web page that rebinds its own domain to 127.0.0.1 cannot read
    the folder through a browser on this machine.
    """

    daemon_threads = True

    def __init__(
        self,
        root: str | Path,
        host: str = "127.0.0.1",
        port: int = 0,
        verbose: bool = False,
        allow_hosts: Sequence[str] = (),
    ):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"{root}: no such folder")
        self.cache = LogCache()
        self.verbose = verbose
        names = {*LOOPBACK_NAMES, host, *allow_hosts}
        if host in ANY_ADDRESS:
            names.add(socket.gethostname())
        self.allowed_hosts = {n.lower().strip("[]") for n in names if n}
        super().__init__((host, port), _Handler)

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request's Host header names this server (no header: an HTTP/1.0 client, allowed)."""
        if header is None or "*" in self.allowed_hosts:
            return True
        name = header.strip().lower()
        if name.startswith("["):  # [::1]:7575
            name, _, rest = name[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            name, _, port = name.partition(":")
        return name in self.allowed_hosts and port in ("", str(self.server_address[1]))

    @property
    def url(self) -> str:
        # The bound address, as server_address holds it (which typeshed types str | bytes for any family).
        host, port = self.socket.getsockname()[:2]
        return f"http://{host}:{port}/"

    def start(self) -> ViewerServer:
        """Serve from a background thread (tests, notebooks); `shutdown()` stops it."""
        threading.Thread(target=self.serve_forever, name="colab-graphs-view", daemon=True).start()
        return self
