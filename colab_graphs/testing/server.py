"""A scripted OpenAI-compatible chat server for tests and benchmarks.

Each model name served is a *member* whose reply is scripted (a constant, a function of the conversation, or
one of the ready-made scripts of `colab_graphs.testing.scripts`). The server speaks the real HTTP protocol that LiteLLM, the OpenAI SDK
and LangChain clients use (JSON and SSE streaming, logprobs), logs every request it receives, and injects
faults reproducibly, so retry, caching and failure handling can be tested exactly and benchmarked offline.

Example:
    >>> from colab_graphs.testing import ScriptedServer, arithmetic_solver
    >>> with ScriptedServer({"alpha": "Paris.", "solver": arithmetic_solver(accuracy=0.8, seed=1)}) as server:
    ...     # litellm.acompletion(model="openai/alpha", api_base=server.base_url, api_key="sk-test", ...)
    ...     url = server.base_url

Run it as a process for benchmarks:
    python -m colab_graphs.testing.server --port 8011 --members members.yaml --latency 0.05
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import math
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from colab_graphs.serve.http import (
    TRANSPORT_KEYS,
    OpenAIHandler,
    OpenAIServer,
    ServerLimits,
)
from colab_graphs.testing.scripts import (
    Member,
    Messages,
    Reply,
    Script,
    load_members,
    member_from_config,
    message_text,
    unit_draw,
)

FAULT_KINDS = ("429", "500", "malformed", "timeout", "drop")
_MALFORMED_BODY = b'{"id": "chatcmpl-malformed", "object": "chat.completion", "choices": [{"index": 0, "mess'


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _split_tokens(text: str) -> list[str]:
    # One piece per whitespace-separated word, each carrying the whitespace before it (and the last one the
    # whitespace after it), so the pieces concatenate back to the text, as OpenAI's streamed tokens do.
    return re.findall(r"\s*\S+\s*$|\s*\S+", text)


class RequestKey(NamedTuple):
    """A canonical chat request: member name, messages and sampling settings as canonical JSON."""

    model: str
    messages: str
    params: str


@dataclass(frozen=True)
class RequestRecord:
    """One HTTP request the server received and what it did with it.

    Attributes:
        path: The request path.
        model: The member the request resolved to (the model name as sent when it resolved to none).
        messages: The request's messages.
        params: Its sampling settings (the body without model, messages and delivery options).
        status: The HTTP status returned; None when no response was sent ("timeout", "drop").
        fault: The injected fault kind ("429", "500", "malformed", "timeout", "drop", "down") or None.
        attempt: How many times the same canonical request was seen before this one.
        stream: Whether a streamed reply was asked for.
        time: When the request arrived (seconds since the epoch).
        duration_s: Seconds spent serving it.
    """

    path: str
    model: str
    messages: Messages
    params: dict[str, Any]
    status: int | None
    fault: str | None
    attempt: int | None
    stream: bool
    time: float
    duration_s: float

    @property
    def key(self) -> RequestKey:
        return RequestKey(self.model, _canonical_json(self.messages), _canonical_json(self.params))


def _as_member(name: str, spec: Member | str | Script) -> Member:
    if isinstance(spec, Member):
        return spec
    if isinstance(spec, str) or callable(spec):
        return Member(spec)
    raise TypeError(f"member {name!r}: expected a Member, a string or a callable, got {type(spec).__name__}")


class _Handler(OpenAIHandler):
    server_version = "ScriptedServer/1.0"

    @property
    def scripted(self) -> ScriptedServer:
        app: ScriptedServer = self.server.app  # the ScriptedServer that started this handler's server
        return app

    def begin(self) -> None:
        self._started = time.time()
        self._fault: str | None = None
        self._fields: dict[str, Any] = {
            "model": "",
            "messages": [],
            "params": {},
            "attempt": None,
            "stream": False,
        }

    def responding(self, status: int | None) -> None:
        # Logged before the client can read the response: a client that has its answer finds it in the log.
        duration_s = time.time() - self._started
        record = RequestRecord(
            self.route,
            status=status,
            fault=self._fault,
            time=self._started,
            duration_s=duration_s,
            **self._fields,
        )
        self.scripted._log(record)

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        if self.scripted.echo_errors:
            self._echo_error()
        else:
            super().do_GET()

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        if self.scripted.echo_errors:
            self._echo_error()
        else:
            super().do_POST()

    def _echo_error(self) -> None:
        """A 400 whose message quotes the request line and every header, as careless providers do."""
        self.begin()
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = "; ".join(f"{name}: {value}" for name, value in self.headers.items())
        self.send_error_json(400, f"rejected {self.command} {self.path} with headers {headers}")

    def models(self) -> list[dict[str, Any]]:
        created = int(self.scripted.started_at)
        return [
            {"id": name, "object": "model", "created": created, "owned_by": "scripted"}
            for name in self.scripted.members
        ]

    def chat(self, body: Any) -> None:
        scripted = self.scripted
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            self.send_error_json(
                400, "the body must be a JSON object with a string 'model' and a list 'messages'"
            )
            return
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            self.send_error_json(400, "'messages' must be a list of message objects", code="messages")
            return
        params = {key: value for key, value in body.items() if key not in TRANSPORT_KEYS}
        name = scripted._resolve(body["model"])
        self._fields.update(model=name or body["model"], messages=messages, params=params)
        self._fields["stream"] = bool(body.get("stream"))
        if name in scripted.down_models:
            self._fault = "down"
            self.send_error_json(500, f"model {name!r} is down (scripted)", code="model_down")
            return
        if name is None:
            self.send_error_json(404, f"The model '{body['model']}' does not exist", code="model_not_found")
            return
        key = RequestKey(name, _canonical_json(messages), _canonical_json(params))
        attempt, fault = scripted._next_attempt(key)
        self._fields["attempt"] = attempt
        if fault is not None:
            self._inject(fault)
            return
        member = scripted.members[name]
        latency = scripted.latency_s if member.latency_s is None else member.latency_s
        if latency > 0:
            self.server.stopping.wait(latency)  # an event, not sleep: stop() need not wait for it
        try:
            scripted_reply, confidence = member.reply_to(messages, params)
        except Exception as exc:  # a script's bug reaches the client as a server error, as a real bug would
            message = f"script of {name!r} raised {type(exc).__name__}: {exc}"
            self.send_error_json(500, message, code="script_error")
            return
        reply = _Reply(key, attempt, body["model"], scripted_reply, confidence, params, messages)
        if self._fields["stream"]:
            self.send_events(reply.chunks(bool((body.get("stream_options") or {}).get("include_usage"))))
        else:
            self.send_json(200, reply.completion())

    def _inject(self, fault: str) -> None:
        self._fault = fault
        if fault == "429":
            message = "Rate limit reached (injected fault)"
            headers = {"Retry-After": "0"}
            self.send_error_json(429, message, "rate_limit_error", "rate_limit_exceeded", **headers)
        elif fault == "500":
            self.send_error_json(500, "Internal error (injected fault)")
        elif fault == "malformed":
            self.send_bytes(200, _MALFORMED_BODY)
        else:
            self.responding(None)
            if fault == "timeout":
                self.server.stopping.wait(self.scripted.timeout_hold_s)
            self.abort()


class _Reply:
    """A member's reply to one request, rendered as an OpenAI completion or as stream chunks.

    Tool calls go out as OpenAI `tool_calls` (finish reason "tool_calls"); streamed, each call's id and name
    come in its first chunk and its JSON arguments in pieces after it, as OpenAI streams them.
    """

    def __init__(
        self,
        key: RequestKey,
        attempt: int,
        model: str,
        reply: Reply,
        confidence: float,
        params: Mapping[str, Any],
        messages: Messages,
    ) -> None:
        self.id = "chatcmpl-" + hashlib.sha256(f"{key}|{attempt}".encode()).hexdigest()[:24]
        self.created = int(time.time())
        self.model = model
        self.pieces = _split_tokens(reply.content)
        self.text = reply.content
        self.tool_calls: list[dict[str, Any]] = [
            {
                "id": call.id or f"call_{hashlib.sha256(f'{key}|{attempt}|{i}'.encode()).hexdigest()[:24]}",
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": call.arguments
                    if isinstance(call.arguments, str)
                    else json.dumps(dict(call.arguments), ensure_ascii=False),
                },
            }
            for i, call in enumerate(reply.tool_calls)
        ]
        self.finish_reason = "tool_calls" if self.tool_calls else "stop"
        stops = params.get("stop")
        stops = [stops] if isinstance(stops, str) else [s for s in stops or [] if isinstance(s, str) and s]
        cut = min((i for i in (self.text.find(s) for s in stops) if i >= 0), default=None)
        if (
            cut is not None
        ):  # as OpenAI does: the reply ends before the first stop sequence, which is not sent
            self.text = self.text[:cut]
            self.pieces = _split_tokens(self.text)
        limit = params.get("max_completion_tokens") or params.get("max_tokens")
        if isinstance(limit, int) and 0 < limit < len(self.pieces):
            self.pieces = self.pieces[:limit]
            self.text = "".join(self.pieces)
            self.finish_reason = "length"
        n = params.get("n")
        self.n = n if isinstance(n, int) and n > 0 else 1
        self.logprob = math.log(confidence)
        self.top = int(params.get("top_logprobs") or 0) if params.get("logprobs") else None
        prompt_tokens = sum(len(message_text(message).split()) for message in messages)
        call_tokens = sum(len(_split_tokens(c["function"]["arguments"])) + 1 for c in self.tool_calls)
        completion_tokens = (len(self.pieces) + call_tokens) * self.n
        self.usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _token_logprob(self, piece: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"token": piece, "logprob": self.logprob, "bytes": list(piece.encode())}
        if self.top:
            # The rest of the probability mass goes evenly to made-up alternatives, ranked below when the
            # member is confident and above when it is not, as a real model's alternatives would be.
            rest = -math.expm1(self.logprob)
            alt = math.log(rest / (self.top - 1)) if rest > 0 and self.top > 1 else -9999.0
            options = [(piece, self.logprob)] + [(f"<alt{i}>", alt) for i in range(1, self.top)]
            options.sort(key=lambda option: -option[1])
            entry["top_logprobs"] = [
                {"token": token, "logprob": logprob, "bytes": list(token.encode())}
                for token, logprob in options
            ]
        else:
            entry["top_logprobs"] = []
        return entry

    def _logprobs(self, pieces: list[str]) -> dict[str, Any] | None:
        if self.top is None:
            return None
        return {"content": [self._token_logprob(piece) for piece in pieces], "refusal": None}

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            message = {"role": "assistant", "content": self.text or None, "tool_calls": self.tool_calls}
        choices = [
            {
                "index": i,
                "message": message,
                "logprobs": self._logprobs(self.pieces),
                "finish_reason": self.finish_reason,
            }
            for i in range(self.n)
        ]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage,
        }

    def chunks(self, include_usage: bool) -> list[dict[str, Any]]:
        head = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }

        def chunk(delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return {**head, "choices": [choice]}

        out = [chunk({"role": "assistant", "content": ""})]
        out += [chunk({"content": piece}, self._logprobs([piece])) for piece in self.pieces]
        for index, call in enumerate(self.tool_calls):
            head_call = {"index": index, "id": call["id"], "type": "function"}
            out.append(chunk({"tool_calls": [{**head_call, "function": {"name": call["function"]["name"]}}]}))
            out += [
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                for piece in _split_tokens(call["function"]["arguments"])
            ]
        out.append(chunk({}, finish=self.finish_reason))
        if include_usage:
            out.append({**head, "choices": [], "usage": self.usage})
        return out


class ScriptedServer:
    """An OpenAI-compatible chat server whose models are scripts, run in a background thread.

    Args:
        members: Model name -> `Member`, constant reply, or script `(messages, params) -> str`. A request
            may name a model with a provider prefix ("openai/alpha" reaches "alpha").
        latency_s: Seconds every reply waits (a member's own `latency_s` wins). Waits overlap: each
            connection has its own thread.
        fault_rate: Probability that an attempt fails with one of `faults`. Whether attempt k of a canonical
            request fails, and how, is a function of (fault_seed, request, k): runs are reproducible.
        faults: The kinds drawn from, uniformly: "429" (with Retry-After: 0), "500", "malformed" (200 with
            a body that is not JSON), "timeout" (hold the connection `timeout_hold_s`, then close it without
            a response), "drop" (close the connection without a response).
        fault_seed: Seed of the fault schedule.
        down_models: Models whose every request gets a 500.
        fail_first: The first `fail_first` attempts of every distinct request fail with `fail_first_kind`
            (before `fault_rate` applies), so a retry test knows exactly what happens.
        fail_first_kind: A fault kind, see `faults`.
        timeout_hold_s: How long a "timeout" fault holds the connection; keep it above the client's timeout.
        echo_errors: Answer every request with a 400 whose message echoes the request line (its query string
            included) and every header (keys, extra headers): a provider that leaks what it was sent.
        host: Interface to listen on.
        port: Port to listen on; 0 picks a free one.

    Example:
        >>> with ScriptedServer({"alpha": "42"}, fail_first=1) as server:
        ...     base_url = server.base_url  # first attempt of each request gets a 500, the second "42"
    """

    def __init__(
        self,
        members: Mapping[str, Member | str | Script] | None = None,
        *,
        latency_s: float = 0.0,
        fault_rate: float = 0.0,
        faults: Sequence[str] = ("429", "500", "malformed"),
        fault_seed: int = 0,
        down_models: Iterable[str] = (),
        fail_first: int = 0,
        fail_first_kind: str = "500",
        timeout_hold_s: float = 30.0,
        echo_errors: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.members: dict[str, Member] = {
            name: _as_member(name, spec) for name, spec in (members or {}).items()
        }
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError(f"fault_rate must be in [0, 1], got {fault_rate!r}")
        unknown = [kind for kind in [*faults, fail_first_kind] if kind not in FAULT_KINDS]
        if unknown:
            raise ValueError(f"unknown fault kind(s) {unknown}; known: {list(FAULT_KINDS)}")
        if fault_rate > 0 and not faults:
            raise ValueError("fault_rate > 0 needs at least one fault kind in faults")
        if latency_s < 0 or timeout_hold_s < 0 or fail_first < 0:
            raise ValueError("latency_s, timeout_hold_s and fail_first must be >= 0")
        self.latency_s = latency_s
        self.fault_rate = fault_rate
        self.faults = tuple(faults)
        self.fault_seed = fault_seed
        self.down_models = frozenset(down_models)
        self.fail_first = fail_first
        self.fail_first_kind = fail_first_kind
        self.timeout_hold_s = timeout_hold_s
        self.echo_errors = echo_errors
        self.host = host
        self.port = port
        self.started_at = time.time()
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []
        self._attempts: collections.Counter[RequestKey] = collections.Counter()
        self._httpd: OpenAIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. "http://127.0.0.1:PORT/v1" (the `api_base` LiteLLM takes)."""
        if self._httpd is None:
            raise RuntimeError("the server is not started; call start() or use it as a context manager")
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return f"http://{host}:{self.port}/v1"

    def litellm_kwargs(self, name: str) -> dict[str, Any]:
        """Keyword arguments for `litellm.acompletion` that reach member `name` on this server."""
        return {"model": f"openai/{name}", "api_base": self.base_url, "api_key": "sk-test"}

    @property
    def requests(self) -> list[RequestRecord]:
        """Every HTTP request received so far, in arrival-completion order (a copy)."""
        with self._lock:
            return list(self._records)

    @property
    def chat_requests(self) -> list[RequestRecord]:
        """The chat-completion requests received so far (the calls; not a client's `GET /models` pre-flight)."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def request_counts(self, successful_only: bool = False) -> collections.Counter[RequestKey]:
        """How many times each canonical chat request was received.

        Args:
            successful_only: Count only requests answered with a reply (status 200, no fault).
        """
        return collections.Counter(
            record.key
            for record in self.requests
            if record.path.endswith("/chat/completions")
            and record.model
            and (not successful_only or (record.status == 200 and record.fault is None))
        )

    def reset(self) -> None:
        """Forget the request log and the attempt counts: the fault schedule starts over."""
        with self._lock:
            self._records.clear()
            self._attempts.clear()

    def start(self) -> ScriptedServer:
        """Bind the port and serve in a daemon thread; returns self."""
        if self._httpd is not None:
            raise RuntimeError("a ScriptedServer starts once; make a new one to serve again")
        # Scripted latency holds a worker per request: room for the concurrency the benchmarks drive.
        limits = ServerLimits(max_workers=256)
        self._httpd = OpenAIServer((self.host, self.port), _Handler, self, "ScriptedServer", limits)
        self.port = self._httpd.server_address[1]
        self.started_at = time.time()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"ScriptedServer:{self.port}",
        )
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, cut open connections and join every thread; calling it again does nothing."""
        if self._httpd is None or self._httpd.stopping.is_set():
            return
        self._httpd.stop()  # wakes latency waits and "timeout" holds, cuts connections, joins threads
        assert self._thread is not None
        self._thread.join()

    def __enter__(self) -> ScriptedServer:
        return self if self._httpd is not None else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _resolve(self, model: str) -> str | None:
        # LiteLLM strips "openai/" before sending, raw clients may not; names may contain "/" themselves.
        candidates = [model, model.split("/", 1)[1]] if "/" in model else [model]
        return next((name for name in candidates if name in self.members or name in self.down_models), None)

    def _next_attempt(self, key: RequestKey) -> tuple[int, str | None]:
        with self._lock:
            attempt = self._attempts[key]
            self._attempts[key] += 1
        if attempt < self.fail_first:
            return attempt, self.fail_first_kind
        if self.fault_rate > 0 and unit_draw("fault", self.fault_seed, *key, attempt) < self.fault_rate:
            index = int(unit_draw("kind", self.fault_seed, *key, attempt) * len(self.faults))
            return attempt, self.faults[index]
        return attempt, None

    def _log(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)


def server_for_configs(
    configs: Mapping[str, Any] | None, field: str = "members"
) -> ScriptedServer | contextlib.nullcontext[None]:
    """A server for members given as configs (`member_from_config`), not started: enter it with `with`; a null
    context when there are none. A config file can thus name scripted members (the train config's
    `scripted_members`) without its reader knowing this module.

    Raises:
        ValueError: a malformed config, named `field.member`, before anything starts.
    """
    if not configs:
        return contextlib.nullcontext()
    return ScriptedServer(
        {name: member_from_config(spec, f"{field}.{name}") for name, spec in configs.items()}
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Serve scripted members until interrupted (SIGINT or SIGTERM)."""
    parser = argparse.ArgumentParser(
        prog="python -m colab_graphs.testing.server", description="Serve scripted OpenAI-compatible models."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011, help="0 picks a free port")
    parser.add_argument("--members", type=Path, help="YAML/JSON file: model name -> reply or script")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="probability that an attempt fails")
    parser.add_argument(
        "--faults", default="429,500,malformed", help=f"comma-separated, of {','.join(FAULT_KINDS)}"
    )
    parser.add_argument("--fault-seed", type=int, default=0)
    parser.add_argument("--fail-first", type=int, default=0, help="fail the first N attempts of each request")
    parser.add_argument("--fail-first-kind", default="500", choices=FAULT_KINDS)
    parser.add_argument(
        "--down", action="append", default=[], metavar="MODEL", help="a model that always fails"
    )
    parser.add_argument("--timeout-hold", type=float, default=30.0, help="seconds a 'timeout' fault holds")
    args = parser.parse_args(argv)
    try:
        members = load_members(args.members) if args.members else {}
        server = ScriptedServer(
            members,
            latency_s=args.latency,
            fault_rate=args.fault_rate,
            faults=[kind for kind in args.faults.split(",") if kind],
            fault_seed=args.fault_seed,
            down_models=args.down,
            fail_first=args.fail_first,
            fail_first_kind=args.fail_first_kind,
            timeout_hold_s=args.timeout_hold,
            host=args.host,
            port=args.port,
        )
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with server.start():
        print(f"serving {sorted(server.members)} at {server.base_url}", flush=True)
        try:
            while not done.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
