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

Responses carry OpenAI's fields only, unless asked for more. vLLM's own extensions, taken from its source
(``vllm/entrypoints/openai/chat_completion/protocol.py``, ``.../completion/protocol.py``): a request with
``"return_token_ids": true`` gets the prompt's token ids (chat: top-level ``prompt_token_ids``; completions:
each choice's ``prompt_token_ids``) and each choice's generated ``token_ids``; ``top_k``, ``min_p`` and
``repetition_penalty`` are sampling fields as in vLLM. ``logprobs`` are those of the model's distribution
(vLLM's default ``--logprobs-mode raw_logprobs``) or, with ``logprobs_mode="processed_logprobs"``
(``--logprobs-mode``), of the distribution each token was drawn from (temperature, top-k, top-p, min-p and
the repetition penalty applied), which a trainer's importance-sampling correction needs. The package's own
form, ``"colab_graphs": {"token_ids": true}`` (LiteLLM: ``extra_body=...``), still answers under the
top-level key ``colab_graphs``: ``{"choices": [{"index", "prompt_token_ids", "completion_token_ids",
"logprobs"}]}`` (streamed: in the last chunk); ``local_call_details`` reads them.

LoRA adapters are loaded and unloaded at run time with vLLM's ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` when the server was started with ``enable_lora`` (`colab_graphs.serve.adapters`);
a request whose ``model`` names a loaded adapter decodes with it.

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
from pathlib import Path
from typing import Any

from colab_graphs.local.engines import get_engine
from colab_graphs.local.local_engine import GenerationCancelled, LocalEngine
from colab_graphs.local.provider import model_folder
from colab_graphs.serve.adapters import (
    DEFAULT_MAX_ADAPTERS,
    Adapters,
    LoadLoRAAdapterRequest,
    UnloadLoRAAdapterRequest,
)
from colab_graphs.serve.http import OpenAIHandler, OpenAIServer, RequestError, ServerLimits
from colab_graphs.serve.openai_api import ChatCompletionRequest, CompletionRequest, parse_body
from colab_graphs.serve.serve_replies import ChatReply, CompletionReply

DEFAULT_MAX_TOKENS_LIMIT = 4096
LOGPROBS_MODES = {"raw_logprobs": "raw", "processed_logprobs": "processed"}
"""vLLM's ``--logprobs-mode`` names (the logit and processed-logit modes are not served) -> the engine's."""
LORA_LOAD_ROUTES = ("/v1/load_lora_adapter",)
LORA_UNLOAD_ROUTES = ("/v1/unload_lora_adapter",)
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
        logprobs_mode: ``raw_logprobs`` (vLLM's default) or ``processed_logprobs``.
        enable_lora: Serve vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``.
        model_folder: The served model's folder (adapters are checked against it; None refuses them).
        max_adapters: Most adapters held at once.

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
        logprobs_mode: str = "raw_logprobs",
        enable_lora: bool = False,
        model_folder: Path | None = None,
        max_adapters: int = DEFAULT_MAX_ADAPTERS,
    ) -> None:
        if max_tokens_limit < 1:
            raise ValueError(f"max_tokens_limit must be at least 1, got {max_tokens_limit}")
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {logprobs_mode!r}"
            )
        self.engine = engine
        self.served_name = served_name
        self.max_tokens_limit = max_tokens_limit
        self.logprobs_mode = LOGPROBS_MODES[logprobs_mode]
        self.enable_lora = enable_lora
        self.adapters = Adapters(engine, served_name, model_folder, max_adapters)
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
        self.adapters.close()

    def target(self, model: str | None) -> _Target:
        """What a request naming `model` decodes with: the served model, or a loaded adapter (404 otherwise)."""
        if model in (self.served_name, None):
            return _Target(self, self.engine, self.served_name)
        adapter = self.adapters.get(model)
        if adapter is None:
            known = [self.served_name, *(a.name for a in self.adapters.listed())]
            # vLLM: "The model `NAME` does not exist." (OpenAIModelRegistry.check_model)
            message = f"The model `{model}` does not exist; served here: {', '.join(map(repr, known))}"
            raise RequestError(message, param="model", code="model_not_found", status=404)
        return _Target(self, adapter.engine, adapter.name)

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


class _Target:
    """The server as one request sees it: the engine and name of the model (or adapter) it asked for."""

    def __init__(self, server: LocalServer, engine: LocalEngine, name: str) -> None:
        self.server, self.engine, self.served_name = server, engine, name
        self.logprobs_mode = server.logprobs_mode

    def completion_budget(self, prompt_tokens: int, asked: int | None, default: int, param: str) -> int:
        return self.server.completion_budget(prompt_tokens, asked, default, param)

    def check_prompt_chars(self, chars: int, param: str) -> None:
        self.server.check_prompt_chars(chars, param)


class _Handler(OpenAIHandler):
    server_version = "colab-graphs-serve/1.0"

    @property
    def state(self) -> LocalServer:
        state: LocalServer = self.server.app
        return state

    def models(self) -> list[dict[str, Any]]:
        served = self.state.served_name
        card = {"object": "model", "created": 0, "owned_by": "colab-graphs"}
        # As vLLM lists them: the base model, then each adapter with its folder (root) and its base (parent).
        return [
            {"id": served, **card, "root": served, "parent": None},
            *({"id": a.name, **card, "root": a.path, "parent": served} for a in self.state.adapters.listed()),
        ]

    def chat(self, body: Any) -> None:
        request = parse_body(ChatCompletionRequest, body)
        self._answer(ChatReply(self.state.target(request.model), request))

    def completions(self, body: Any) -> None:
        request = parse_body(CompletionRequest, body)
        self._answer(CompletionReply(self.state.target(request.model), request))

    def more_post_routes(self) -> dict[tuple[str, ...], Any]:
        if not self.state.enable_lora:  # as vLLM without VLLM_ALLOW_RUNTIME_LORA_UPDATING: no such routes
            return {}
        return {LORA_LOAD_ROUTES: self.load_lora_adapter, LORA_UNLOAD_ROUTES: self.unload_lora_adapter}

    def load_lora_adapter(self, body: Any) -> None:
        self.send_text(200, self.state.adapters.load(parse_body(LoadLoRAAdapterRequest, body)))

    def unload_lora_adapter(self, body: Any) -> None:
        self.send_text(200, self.state.adapters.unload(parse_body(UnloadLoRAAdapterRequest, body)))

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
    **options: Any,
) -> LocalServer:
    """Load ``model_ref`` and serve it in a background thread (``port=0`` picks a free port); `options` are
    `LocalServer`'s (``logprobs_mode``, ``enable_lora``, ``max_adapters``)."""
    return _local_server(model_ref, host, port, served_name, max_tokens_limit, limits, **options).start()


def _local_server(
    model_ref: str,
    host: str,
    port: int,
    served_name: str | None,
    max_tokens_limit: int,
    limits: ServerLimits | None,
    **options: Any,
) -> LocalServer:
    engine = get_engine(model_ref)
    name = _served_name(model_ref, served_name)
    folder = model_folder(model_ref)
    return LocalServer(engine, name, host, port, max_tokens_limit, limits, model_folder=folder, **options)


def _served_name(model_ref: str, served_name: str | None) -> str:
    return served_name or model_ref.removeprefix("local/").rstrip("/").split("/")[-1]


def vllm_command(
    model_ref: str,
    host: str,
    port: int,
    served_name: str | None = None,
    logprobs_mode: str | None = None,
    enable_lora: bool = False,
) -> list[str]:
    """The ``vllm serve`` command line for ``model_ref``'s folder (with ``enable_lora``, vLLM also needs
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in its environment: `vllm_env`)."""
    vllm = shutil.which("vllm") or "vllm"
    folder = str(model_folder(model_ref))
    name = _served_name(model_ref, served_name)
    command = [vllm, "serve", folder, "--host", host, "--port", str(port), "--served-model-name", name]
    if logprobs_mode is not None:
        command += ["--logprobs-mode", logprobs_mode]
    if enable_lora:
        command += ["--enable-lora"]
    return command


def vllm_env(enable_lora: bool) -> dict[str, str]:
    """The environment `vllm_command` runs in: runtime adapter loading is an opt-in of vLLM's environment."""
    import os

    return {**os.environ, **({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"} if enable_lora else {})}


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
    **options: Any,
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
        options: `LocalServer`'s ``logprobs_mode``, ``enable_lora``, ``max_adapters`` (the transformers backend;
            give vLLM its own ``--logprobs-mode`` / ``--enable-lora``).
    """
    if backend not in ("auto", "transformers", "vllm"):
        raise ValueError(f"backend must be 'auto', 'transformers' or 'vllm', got {backend!r}")
    if backend == "vllm" or (backend == "auto" and shutil.which("vllm") and _gpu_present()):
        lora = bool(options.get("enable_lora"))
        command = vllm_command(model_ref, host, port, served_name, options.get("logprobs_mode"), lora)
        subprocess.run(command, check=True, env=vllm_env(lora))
        return
    if access_log:
        _log_to_stderr()
    server = _local_server(model_ref, host, port, served_name, max_tokens_limit, limits, **options)
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
