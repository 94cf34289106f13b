"""OpenAI-compatible HTTP server for a local model (``colab-graphs serve``).

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions`` (JSON, or server-sent
events with ``stream: true``); ``/v1/embeddings`` answers a 404 in OpenAI's error shape. Any OpenAI client
reaches it; from LiteLLM::

    litellm.completion(model="openai/<served-name>", api_base="http://127.0.0.1:8000/v1", api_key="x", ...)

(``hosted_vllm/<served-name>`` works the same way).

Every request is checked whole before it reaches the batching engine (`colab_graphs.serve.openai_api`): a
bad field gets its own 400 naming it, ``max_tokens`` must fit the model's context after the prompt and the
server's own limit (``max_tokens_limit``), and a request that fails while decoding fails alone (a 500 with the
reason) while the requests batched with it complete. Connections, timeouts, limits and the access log are the
HTTP core's (`colab_graphs.serve.http`); a client that hangs up has its rows dropped at the engine's next step,
and a new request joins the batch that is decoding (docs/serve.md).

Tools: ``tools`` / ``tool_choice`` and ``tool`` messages are rendered by the model's chat template when it
renders tools, else in the Hermes / Qwen 2.5 format; calls are parsed back into ``tool_calls`` (see
`colab_graphs.serve.tool_calls`). ``tool_choice: "required"`` or a named function forces a call by guided
decoding, so its arguments match the tool's schema. ``response_format`` ``json_object`` / ``json_schema`` is
guided decoding too (`colab_graphs.local.json_guide`).

Responses carry OpenAI's fields only. The exact token ids and logprobs of each choice come back when the
request asks with ``"colab_graphs": {"token_ids": true}`` (LiteLLM: ``extra_body=...``), under the top-level
key ``colab_graphs``: ``{"choices": [{"index", "prompt_token_ids", "completion_token_ids", "logprobs"}]}``
(streamed: in the last chunk); ``local_call_details`` reads them.

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

import functools
import logging
import shutil
import subprocess
import sys
import threading
from typing import Any

from colab_graphs.local.engines import get_engine
from colab_graphs.local.local_engine import GenerationCancelled, LocalEngine
from colab_graphs.local.provider import model_folder
from colab_graphs.serve.http import OpenAIHandler, OpenAIServer, RequestError, ServerLimits
from colab_graphs.serve.openai_api import ChatCompletionRequest, CompletionRequest, parse_body
from colab_graphs.serve.serve_replies import ChatReply, CompletionReply

DEFAULT_MAX_TOKENS_LIMIT = 4096
UNKNOWN_CONTEXT = 2**17  # positions assumed of a model whose config names none (prompt length checks)


class LocalServer:
    """A running server; use as a context manager or call :meth:`close`.

    Args:
        engine: The batching engine of the served model.
        served_name: The model name clients send.
        host: Interface to bind.
        port: TCP port (0 picks a free one).
        max_tokens_limit: Most tokens one choice may ask to generate (beside the model's context).
        limits: Connection limits and timeouts of the HTTP core.

    Attributes:
        base_url: ``http://host:port/v1``.
    """

    def __init__(
        self,
        engine: LocalEngine,
        served_name: str,
        host: str,
        port: int,
        max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT,
        limits: ServerLimits | None = None,
    ) -> None:
        if max_tokens_limit < 1:
            raise ValueError(f"max_tokens_limit must be at least 1, got {max_tokens_limit}")
        self.engine = engine
        self.served_name = served_name
        self.max_tokens_limit = max_tokens_limit
        self.httpd = OpenAIServer((host, port), _Handler, self, "colab-graphs-serve", limits)
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
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def context_length(self) -> int | None:
        """Positions the served model reads (prompt plus reply), from its config; None when it says none."""
        config = getattr(self.engine.model, "config", None)
        if config is not None and hasattr(config, "get_text_config"):
            config = config.get_text_config(decoder=True)
        value = getattr(config, "max_position_embeddings", None)
        return int(value) if isinstance(value, int) and value > 0 else None

    @property
    def longest_token_chars(self) -> int:
        """Characters of the longest token text in the vocabulary (byte-level tokens count their bytes): a
        prompt of C characters is at least C / this many tokens."""
        return _longest_token_chars(self.engine.tokenizer)

    def check_prompt_chars(self, chars: int, param: str) -> None:
        """Refuse, before tokenizing, a prompt of `chars` characters that cannot fit the context whatever
        its tokens (tokenizing megabytes costs seconds and memory the tokenizer keeps)."""
        context = self.context_length or UNKNOWN_CONTEXT
        most = context * self.longest_token_chars
        if chars > most:
            message = (
                f"the prompt is {chars} characters; {self.served_name} reads {context} tokens of at most"
                f" {self.longest_token_chars} characters each"
            )
            raise RequestError(message, param=param, code="context_length_exceeded")

    def completion_budget(self, prompt_tokens: int, asked: int | None, default: int, param: str) -> int:
        """Tokens a choice may generate after a `prompt_tokens` prompt, or the `RequestError` that says why not.

        `asked` is the request's ``max_tokens`` (None: `default`, shortened to what fits).
        """
        context = self.context_length
        room = (
            self.max_tokens_limit if context is None else min(self.max_tokens_limit, context - prompt_tokens)
        )
        if room < 1:
            message = f"the prompt is {prompt_tokens} tokens; {self.served_name} reads at most {context}"
            raise RequestError(message, param=param, code="context_length_exceeded")
        if asked is None:
            return min(default, room)
        if asked > room:
            why = f"this server writes at most {self.max_tokens_limit} tokens per reply"
            if context is not None:
                why += f", and {self.served_name} reads {context} tokens of which the prompt takes {prompt_tokens}"
            raise RequestError(
                f"max_tokens is {asked}, but at most {room} fit: {why}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return asked


class _Handler(OpenAIHandler):
    server_version = "colab-graphs-serve/1.0"

    @property
    def state(self) -> LocalServer:
        state: LocalServer = self.server.app
        return state

    def models(self) -> list[dict[str, Any]]:
        return [{"id": self.state.served_name, "object": "model", "created": 0, "owned_by": "colab-graphs"}]

    def chat(self, body: Any) -> None:
        request = parse_body(ChatCompletionRequest, body)
        self._check_model(request.model)
        self._answer(ChatReply(self.state, request))

    def completions(self, body: Any) -> None:
        request = parse_body(CompletionRequest, body)
        self._check_model(request.model)
        self._answer(CompletionReply(self.state, request))

    def _check_model(self, model: str | None) -> None:
        served = self.state.served_name
        if model not in (served, None):
            message = f"the model {model!r} is not served here; use {served!r}"
            raise RequestError(message, param="model", code="model_not_found", status=404)

    def _answer(self, reply: ChatReply | CompletionReply) -> None:
        self.usage = reply.usage_counts  # filled in as the reply ends, before the access-log line is written
        self.on_abandon(reply.cancel)  # a client that leaves stops its rows at the engine's next step
        if reply.stream:
            self.send_events(reply.events())
        else:
            try:
                payload = reply.complete()
            except GenerationCancelled:
                raise ConnectionError("the client left; its rows were dropped") from None
            except Exception as exc:  # this request failed while decoding; the ones batched with it did not
                logging.getLogger(__name__).warning("generation failed: %s: %s", type(exc).__name__, exc)
                raise RequestError(
                    f"generation failed: {type(exc).__name__}: {exc}", code="generation_failed", status=500
                ) from None
            self.send_json(200, payload)


@functools.lru_cache(maxsize=8)
def _longest_token_chars(tokenizer: Any) -> int:
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return max((len(t) for t in tokens if isinstance(t, str)), default=1)


def start_server(
    model_ref: str,
    host: str = "127.0.0.1",
    port: int = 0,
    served_name: str | None = None,
    max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT,
    limits: ServerLimits | None = None,
) -> LocalServer:
    """Load ``model_ref`` and serve it in a background thread (``port=0`` picks a free port)."""
    engine = get_engine(model_ref)
    return LocalServer(
        engine, _served_name(model_ref, served_name), host, port, max_tokens_limit, limits
    ).start()


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
    max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT,
    limits: ServerLimits | None = None,
    access_log: bool = True,
) -> None:
    """Serve ``model_ref`` over the OpenAI API until interrupted.

    Args:
        model_ref: Zoo name, model folder or hub id.
        host: Interface to bind.
        port: TCP port.
        served_name: Model name clients send (default: the last path component of ``model_ref``).
        backend: ``"transformers"``, ``"vllm"``, or ``"auto"`` (vLLM when on PATH and a GPU is present).
        max_tokens_limit: Most tokens one choice may ask to generate.
        limits: Connection limits and timeouts (`ServerLimits`).
        access_log: One line per request on stderr.
    """
    if backend not in ("auto", "transformers", "vllm"):
        raise ValueError(f"backend must be 'auto', 'transformers' or 'vllm', got {backend!r}")
    if backend == "vllm" or (backend == "auto" and shutil.which("vllm") and _gpu_present()):
        subprocess.run(vllm_command(model_ref, host, port, served_name), check=True)
        return
    if access_log:
        _log_to_stderr()
    engine = get_engine(model_ref)
    server = LocalServer(engine, _served_name(model_ref, served_name), host, port, max_tokens_limit, limits)
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


def _log_to_stderr() -> None:
    logger = logging.getLogger("colab_graphs.access")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
