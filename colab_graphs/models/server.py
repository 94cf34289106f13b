"""OpenAI-compatible HTTP server for a local model (``colab-graphs serve``).

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` (JSON or streaming server-sent events).
Standard library only; each connection gets a thread and all threads feed the same batching engine, so
concurrent clients are decoded together. Any LiteLLM user reaches it with::

    litellm.completion(model="openai/<served-name>", api_base="http://127.0.0.1:8000/v1", api_key="x", ...)

(``hosted_vllm/<served-name>`` works the same way). Each choice also carries the exact token ids and
logprobs under the key ``colab_graphs``, which LiteLLM hands back as
``choices[0].provider_specific_fields["colab_graphs"]``, so ``local_call_details`` reads them as it does
for the in-process provider.

On a GPU machine, vLLM serves the same folder much faster. It cannot share this environment (it pins its
own torch and transformers), so install it in its own environment and point it at the folder that
``colab-graphs models fetch NAME`` printed (or a trained policy's folder)::

    python -m venv ~/vllm-env && ~/vllm-env/bin/pip install vllm
    ~/vllm-env/bin/vllm serve ~/.cache/colab-graphs/models/smollm2-135m --port 8000 \\
        --served-model-name smollm2-135m

``serve(..., backend="auto")`` runs that command itself when a ``vllm`` executable is on PATH and a GPU
is visible.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from colab_graphs.models.local import build_request, get_engine, model_folder, to_model_response
from colab_graphs.models.local_engine import LocalEngine


class LocalServer:
    """A running server; use as a context manager or call :meth:`close`.

    Attributes:
        served_name: The model name clients send.
        base_url: ``http://host:port/v1``.
    """

    def __init__(self, engine: LocalEngine, served_name: str, host: str, port: int) -> None:
        self.engine = engine
        self.served_name = served_name
        handler = type("Handler", (_Handler,), {"server_state": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self.base_url = f"http://{self.host}:{self.port}/v1"
        self._thread: threading.Thread | None = None

    def start(self) -> LocalServer:
        """Serve in a background thread."""
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="colab-graphs-serve", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted."""
        self.httpd.serve_forever()

    def close(self) -> None:
        """Stop serving and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Handler(BaseHTTPRequestHandler):
    server_state: LocalServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise here
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            state = self.server_state
            data = [{"id": state.served_name, "object": "model", "created": 0, "owned_by": "colab-graphs"}]
            self._json(200, {"object": "list", "data": data})
        else:
            self._error(404, f"no route GET {self.path}")

    def do_POST(self) -> None:
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route POST {self.path}")
            return
        try:
            body = self._body()
            state = self.server_state
            if body.get("model") not in (state.served_name, None):
                raise _RequestError(
                    404, f"model {body.get('model')!r} is not served here; use {state.served_name!r}"
                )
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _RequestError(400, "'messages' must be a non-empty list")
            if int(body.get("n") or 1) != 1:
                raise _RequestError(400, "only n=1 is supported")
            request = build_request(state.engine, messages, body)
        except _RequestError as exc:
            self._error(exc.status, str(exc))
            return
        except (ValueError, TypeError, KeyError) as exc:
            self._error(400, f"bad request: {exc}")
            return
        if body.get("stream"):
            self._stream(request, body)
        else:
            result = state.engine.generate(request)
            response = to_model_response(
                state.served_name, state.engine.tokenizer, result, bool(body.get("logprobs"))
            )
            payload = response.model_dump()
            for choice in payload["choices"]:
                # LiteLLM files unknown choice keys under provider_specific_fields: send them flat so the
                # client sees the same provider_specific_fields["colab_graphs"] as in-process callers.
                choice.update(choice.pop("provider_specific_fields", None) or {})
            self._json(200, payload)

    def _stream(self, request: Any, body: dict[str, Any]) -> None:
        pieces: queue.Queue[str | None] = queue.Queue()
        request.on_text = pieces.put
        future = self.server_state.engine.submit(request)
        future.add_done_callback(lambda _: pieces.put(None))
        chunk_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
            return {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.server_state.served_name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **extra,
            }

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        self._event(chunk({"role": "assistant", "content": ""}))
        while (piece := pieces.get()) is not None:
            self._event(chunk({"content": piece}))
        try:
            result = future.result()
        except Exception as exc:  # headers are sent: report the failure in the stream
            self._event({"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error"}})
            self.wfile.write(b"data: [DONE]\n\n")
            return
        self._event(chunk({}, result.finish_reason))
        if (body.get("stream_options") or {}).get("include_usage"):
            n_prompt, n_completion = len(result.prompt_ids), len(result.completion_ids)
            usage = {
                "prompt_tokens": n_prompt,
                "completion_tokens": n_completion,
                "total_tokens": n_prompt + n_completion,
            }
            final = chunk({}, None, usage=usage)
            final["choices"] = []
            self._event(final)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError as exc:
            raise _RequestError(400, f"request body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _RequestError(400, "request body must be a JSON object")
        return body

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        self._json(status, {"error": {"message": message, "type": kind, "code": status}})


def start_server(
    model_ref: str, host: str = "127.0.0.1", port: int = 0, served_name: str | None = None
) -> LocalServer:
    """Load ``model_ref`` and serve it in a background thread (``port=0`` picks a free port)."""
    return LocalServer(get_engine(model_ref), _served_name(model_ref, served_name), host, port).start()


def _served_name(model_ref: str, served_name: str | None) -> str:
    return served_name or model_ref.removeprefix("local/").rstrip("/").split("/")[-1]


def vllm_command(model_ref: str, host: str, port: int, served_name: str | None = None) -> list[str]:
    """The ``vllm serve`` command line for ``model_ref``'s folder."""
    vllm = shutil.which("vllm") or "vllm"
    folder = str(model_folder(model_ref))
    name = _served_name(model_ref, served_name)
    return [vllm, "serve", folder, "--host", host, "--port", str(port), "--served-model-name", name]


def _gpu_present() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def serve(
    model_ref: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_name: str | None = None,
    backend: str = "auto",
) -> None:
    """Serve ``model_ref`` over the OpenAI API until interrupted.

    Args:
        model_ref: Zoo name, model folder or hub id.
        host: Interface to bind.
        port: TCP port.
        served_name: Model name clients send (default: the last path component of ``model_ref``).
        backend: ``"transformers"``, ``"vllm"``, or ``"auto"`` (vLLM when on PATH and a GPU is present).
    """
    if backend not in ("auto", "transformers", "vllm"):
        raise ValueError(f"backend must be 'auto', 'transformers' or 'vllm', got {backend!r}")
    if backend == "vllm" or (backend == "auto" and shutil.which("vllm") and _gpu_present()):
        subprocess.run(vllm_command(model_ref, host, port, served_name), check=True)
        return
    server = LocalServer(get_engine(model_ref), _served_name(model_ref, served_name), host, port)
    print(
        f"serving {server.served_name} at {server.base_url} (transformers backend); Ctrl-C to stop",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
