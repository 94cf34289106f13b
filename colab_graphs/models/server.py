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

import queue
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from colab_graphs.models.http import OpenAIHandler, OpenAIServer
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
        self.httpd = OpenAIServer((host, port), _Handler, self, "colab-graphs-serve")
        self.host, self.port = self.httpd.server_address[:2]
        self.base_url = self.httpd.base_url
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
        """Stop serving, close open connections and release the port."""
        self.httpd.stop()

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Handler(OpenAIHandler):
    server_version = "colab-graphs-serve/1.0"

    @property
    def state(self) -> LocalServer:
        return self.server.app

    def models(self) -> list[dict[str, Any]]:
        return [{"id": self.state.served_name, "object": "model", "created": 0, "owned_by": "colab-graphs"}]

    def chat(self, body: Any) -> None:
        state = self.state
        if not isinstance(body, dict):
            self.send_error_json(400, "request body must be a JSON object")
            return
        if body.get("model") not in (state.served_name, None):
            self.send_error_json(
                404, f"model {body.get('model')!r} is not served here; use {state.served_name!r}"
            )
            return
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            self.send_error_json(400, "'messages' must be a non-empty list")
            return
        if int(body.get("n") or 1) != 1:
            self.send_error_json(400, "only n=1 is supported")
            return
        try:
            request = build_request(state.engine, messages, body)
        except (ValueError, TypeError, KeyError) as exc:
            self.send_error_json(400, f"bad request: {exc}")
            return
        if body.get("stream"):
            self.send_events(self._stream(request, body))
            return
        result = state.engine.generate(request)
        response = to_model_response(
            state.served_name, state.engine.tokenizer, result, bool(body.get("logprobs"))
        )
        payload = response.model_dump()
        for choice in payload["choices"]:
            # LiteLLM files unknown choice keys under provider_specific_fields: send them flat so the
            # client sees the same provider_specific_fields["colab_graphs"] as in-process callers.
            choice.update(choice.pop("provider_specific_fields", None) or {})
        self.send_json(200, payload)

    def _stream(self, request: Any, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Chunks as the engine writes the text, then the finish reason (and usage when asked)."""
        pieces: queue.Queue[str | None] = queue.Queue()
        request.on_text = pieces.put
        future = self.state.engine.submit(request)
        future.add_done_callback(lambda _: pieces.put(None))
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.state.served_name,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        yield chunk({"role": "assistant", "content": ""})
        while (piece := pieces.get()) is not None:
            yield chunk({"content": piece})
        try:
            result = future.result()
        except Exception as exc:  # the status is sent: report the failure in the stream
            yield {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error"}}
            return
        yield chunk({}, result.finish_reason)
        if (body.get("stream_options") or {}).get("include_usage"):
            n_prompt, n_completion = len(result.prompt_ids), len(result.completion_ids)
            usage = {
                "prompt_tokens": n_prompt,
                "completion_tokens": n_completion,
                "total_tokens": n_prompt + n_completion,
            }
            yield {**head, "choices": [], "usage": usage}


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
        server.httpd.stop()
