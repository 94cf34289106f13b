"""The one call path: cache -> single-flight -> per-endpoint concurrency limit -> the direct lane or LiteLLM, with
retries -> trace.

Every model call in the package (protocol seats, judges, audits, rollouts, the LangChain chat model) goes through
`ModelClient.complete`, which returns the call's one record, a `colab_graphs.trace.Call` (the request, its
`Reply`, and how it was served), and appends that same object to the trace it is given. A reply is text and,
when the request offered tools, OpenAI `tool_calls`; a caller that passes `on_delta` gets the reply as LiteLLM
streams it. A member with `deployments` is called through a `litellm.Router` of its own (built once per event
loop), which picks a deployment, retries on another one and cools a failing one down; the cache key is the
member's request and its deployments together, so which replica answered never changes a value or a count. A
plain chat call to an OpenAI-compatible server is posted by the direct lane (`colab_graphs.models.direct`: the
request LiteLLM would send, the reply as LiteLLM reads it, without LiteLLM's own work per call); every other
call, and every call while a LiteLLM callback is set, goes through LiteLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from colab_graphs import otel
from colab_graphs.models import direct
from colab_graphs.models.cache import CallCache, request_key
from colab_graphs.models.direct import direct_enabled
from colab_graphs.models.flight import SingleFlight
from colab_graphs.models.identity import cache_identity
from colab_graphs.models.loops import DaemonThreads, new_loop_thread, on_call_loop
from colab_graphs.models.spend import SpendCap
from colab_graphs.pool import CONNECTION_KEYS, Member
from colab_graphs.redaction import public_url, redact
from colab_graphs.trace import Call, Reply, Trace, Usage
from colab_graphs.watch import pending_call

logger = logging.getLogger("colab_graphs")


class CallError(Exception):
    """A model call that failed after retries (or could never succeed). `kind` says why."""

    def __init__(self, kind: str, message: str, member: str, attempts: int):
        super().__init__(f"{member}: {kind} after {attempts} attempt(s): {message}")
        self.kind = kind
        self.member = member
        self.attempts = attempts
        self.detail = message


@dataclass
class Delta:
    """A piece of a streamed reply: text, and/or pieces of tool calls as OpenAI streams them (each with its
    `index`; the first piece of a call carries its `id` and name, later ones more of its JSON arguments)."""

    text: str = ""
    tool_calls: list[dict[str, Any]] | None = None


DeltaHandler = Callable[[Delta], Any]
"""Called with each piece of a reply as it arrives (see `ModelClient.complete`); may be async."""


@dataclass
class CallStats:
    """Counts over a client's life. `made` = upstream calls answered; `failed` = upstream calls that failed after
    retries (not in `made`); `cached` = served from cache or a shared flight; `attempts` = requests sent."""

    made: int = 0
    cached: int = 0
    failed: int = 0
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    keys: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, Any]:
        return {
            "made": self.made,
            "unique": len(self.keys),
            "cached": self.cached,
            "failed": self.failed,
            "attempts": self.attempts,
        }


RETRYABLE = {"rate_limit", "server", "timeout", "connection", "malformed"}


def classify_error(exc: BaseException) -> str:
    """Map a LiteLLM / HTTP exception to a failure kind; kinds in RETRYABLE are retried."""
    if isinstance(exc, direct.HTTPStatusError):  # the direct lane's error status
        return direct.status_kind(exc.status_code, str(exc))
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    if _json_error_in_chain(exc):
        # LiteLLM wraps a 200 whose body is not JSON as an InternalServerError (status 500); the cause says so.
        return "malformed"
    if name in {"RateLimitError"} or status == 429:
        return "rate_limit"
    if name in {"Timeout", "TimeoutError", "APITimeoutError"} or isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionError):  # the direct lane's failed connection
        return "connection"
    if name in {"AuthenticationError", "PermissionDeniedError"} or status in (401, 403):
        return "auth"
    if name in {"NotFoundError"} or status == 404:
        return "not_found"
    if name in {"ContextWindowExceededError", "ContentPolicyViolationError"}:
        return "bad_request"
    if name in {"BadRequestError", "UnprocessableEntityError"} or status in (400, 422):
        # LiteLLM reports some unparseable upstream bodies as bad requests; the message tells them apart.
        text = str(exc).lower()
        if any(s in text for s in ("json", "decode", "malformed", "expecting value", "invalid response")):
            return "malformed"
        return "bad_request"
    if name in {"APIConnectionError", "ServiceUnavailableError", "InternalServerError", "BadGatewayError"}:
        text = str(exc).lower()
        if any(s in text for s in ("json", "decode", "expecting value")):
            return "malformed"
        return "connection" if name == "APIConnectionError" else "server"
    if isinstance(status, int) and status >= 500:
        return "server"
    if isinstance(exc, (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError, ValueError)):
        return "malformed"
    if name == "APIError":
        return "server"
    return "unknown"


def _json_error_in_chain(exc: BaseException) -> bool:
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, json.JSONDecodeError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


async def probe_endpoint(api_base: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing answers at `api_base`, or None: one `GET {api_base}/models` in which any HTTP response, an
    error status included (no /models route, no key sent), proves a server is there."""
    import httpx

    parts = urlsplit(api_base)
    url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/models", parts.query, ""))
    try:
        async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=False) as http:
            await http.get(url)
    except httpx.TimeoutException:
        return f"no answer to GET /models within {timeout_s:g} s"
    except httpx.HTTPError as exc:
        return f"GET /models: {type(exc).__name__}: {exc}"
    except ValueError as exc:  # not a URL httpx can reach
        return f"not a reachable URL: {exc}"
    return None


def _litellm():
    import litellm

    import colab_graphs._env  # noqa: F401  (offline settings before litellm loads)

    litellm.suppress_debug_info = True
    return litellm


def use_litellm_callbacks(names: Iterable[str]) -> None:
    """Register LiteLLM's callbacks by name (``otel``, ``langfuse_otel``, ...: what `litellm.callbacks` takes),
    once each. Calls then go through LiteLLM, never the direct lane, so that each callback sees every call.

    Raises:
        ValueError: a name LiteLLM does not know.
    """
    litellm = _litellm()
    known = set(getattr(litellm, "_known_custom_logger_compatible_callbacks", ()))
    for name in names:
        if known and name not in known:
            raise ValueError(f"LiteLLM has no callback named {name!r}; known: {', '.join(sorted(known))}")
        if name not in litellm.callbacks:
            litellm.callbacks.append(name)


async def _load_litellm() -> None:
    """Import LiteLLM in the running loop's executor (seconds of import that must not hold the loop)."""
    await asyncio.get_running_loop().run_in_executor(None, _litellm)


def _plain(value: Any) -> Any:
    """A LiteLLM/pydantic object as plain JSON data (what the cache and the trace store)."""
    dump = getattr(value, "model_dump", None)
    return dump(exclude_none=True) if dump is not None else value


def _tool_calls(message: Any) -> list[dict[str, Any]] | None:
    """The message's tool calls as OpenAI dicts (`id`, `type`, `function.name`, `function.arguments`)."""
    calls = getattr(message, "tool_calls", None) or (
        message.get("tool_calls") if isinstance(message, dict) else None
    )
    if not calls:
        return None
    out = []
    for call in calls:
        call = _plain(call)
        function = _plain(call.get("function") or {})
        out.append(
            {
                "id": call.get("id"),
                "type": call.get("type") or "function",
                "function": {"name": function.get("name"), "arguments": function.get("arguments") or ""},
            }
        )
    return out


def _response_message(response: Any) -> tuple[str, list[dict[str, Any]] | None, str | None]:
    """(text, tool calls, finish reason) of a completion. A reply with neither text nor a tool call is
    malformed (retried): an empty string is text, a missing content is not."""
    choices = getattr(response, "choices", None)
    if not choices:
        raise ValueError("response has no choices")
    message = choices[0].message
    content = getattr(message, "content", None)
    tool_calls = _tool_calls(message)
    if content is None and not tool_calls:
        raise ValueError("response message has no content")
    return content or "", tool_calls, getattr(choices[0], "finish_reason", None)


def _response_cost(litellm: Any, response: Any, models: list[str]) -> float | None:
    """The call's price in USD, None when LiteLLM has no price for the model.

    A Router files a price entry with every price unset under each deployment's model; LiteLLM then prices calls
    to that model, routed or not, at 0.0. A zero from such an entry is "unknown", not "free".
    """
    hidden = getattr(response, "_hidden_params", None) or {}
    if "response_cost" in hidden:
        # LiteLLM priced the response already (None: no price known); pricing it again costs ~0.4 ms a call.
        cost = hidden["response_cost"]
        cost = None if cost is None else float(cost)
    else:
        try:
            cost = float(litellm.completion_cost(completion_response=response))
        except Exception:  # noqa: BLE001 - LiteLLM raises for models it has no price for
            return None
    if cost == 0.0:
        entries = [litellm.model_cost.get(m) for m in models]
        if any(
            e is not None and e.get("input_cost_per_token") is None and e.get("output_cost_per_token") is None
            for e in entries
        ):
            return None
    return cost


@dataclass
class _Answer:
    """One attempt's reply as the call path reads it. `response` is LiteLLM's (what prices it, and a local
    model's token ids), None for a direct reply; `direct_usage` is a direct reply's usage (priced here)."""

    text: str
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str | None
    usage: Usage
    logprobs: list[float] | None
    response: Any = None
    direct_usage: Mapping[str, Any] | None = None
    local_details: Mapping[str, list[Any]] | None = None


def _litellm_answer(response: Any) -> _Answer:
    text, tool_calls, finish_reason = _response_message(response)
    usage = getattr(response, "usage", None)
    return _Answer(
        text,
        tool_calls,
        finish_reason,
        Usage(
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        ),
        _response_logprobs(response),
        response,
    )


async def _direct_answer(request: direct.DirectRequest) -> _Answer:
    """One direct attempt (on the call loop): posted, read, its usage kept for pricing."""
    data = await direct.post(request)
    reply = direct.read_reply(data)
    if reply is None:  # a shape only LiteLLM reads (it is imported for it, in the executor)
        response = await asyncio.get_running_loop().run_in_executor(None, direct.convert_reply, data)
        answer = _litellm_answer(response)
        answer.response, answer.direct_usage = None, data.get("usage") or {}
        return answer
    usage = Usage(prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens)
    return _Answer(
        reply.text, reply.tool_calls, reply.finish_reason, usage, reply.logprobs, direct_usage=reply.usage
    )


async def _local_answer(kwargs: Mapping[str, Any], params: dict[str, Any]) -> _Answer:
    """A plain call of an in-process `local/` model answered by its engine, not through LiteLLM: the reply
    LiteLLM would read from the provider's response (`tests/test_local_lane.py` compares the two)."""
    from colab_graphs.local.provider import answer_plain

    result, details = await answer_plain(kwargs["model"], kwargs["messages"], params)
    usage = Usage(prompt_tokens=len(result.prompt_ids), completion_tokens=len(result.completion_ids))
    return _Answer(result.text, None, result.finish_reason, usage, None, local_details=details)


def _local_params(member: Member, kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The in-process provider's parameters when the call is a plain one of a `local/` member, else None."""
    if member.deployments or not str(kwargs.get("model", "")).startswith("local/"):
        return None  # (decided before importing anything of local inference)
    from colab_graphs.local.provider import plain_call_params

    return plain_call_params(kwargs)


def _response_logprobs(response: Any) -> list[float] | None:
    try:
        content = response.choices[0].logprobs.content  # OpenAI format
    except AttributeError:
        try:
            content = response.choices[0].logprobs["content"]
        except (AttributeError, KeyError, TypeError):
            return None
    if not content:
        return None
    return [float(t["logprob"] if isinstance(t, dict) else t.logprob) for t in content]


class ModelClient:
    """The async call path shared by everything that calls a model.

    Args:
        cache: a `CallCache`, or None to disable caching (single-flight still applies).
        max_concurrency: in-flight calls allowed per endpoint (api_base, or provider for hosted APIs).
        retries: attempts after the first for retryable failures (429, 5xx, timeouts, malformed responses); a
            member's `num_retries` setting overrides it for that member's calls.
        backoff_s: first backoff; doubles each retry (with jitter), capped at `backoff_max_s`.
        timeout_s: per-attempt timeout passed to LiteLLM.
        preflight: before the first call that goes upstream to an HTTP endpoint, check once that something
            answers there (`GET {api_base}/models`, any HTTP status will do, `preflight_timeout_s`); when nothing
            does, every call to it fails at once with kind "unreachable", naming the member and its api_base,
            instead of after a minute of retries. A member over deployments fails only when none answers.
            Endpoints whose calls are all cached are never checked.
        direct: send plain chat calls to OpenAI-compatible servers without LiteLLM (`colab_graphs.models.direct`:
            the same requests and replies at a fraction of the CPU); None: on unless the environment sets
            ``COLAB_GRAPHS_DIRECT=0``. Calls it does not fit, and every call while a LiteLLM callback is set, go
            through LiteLLM either way.

    `cap` (a `SpendCap`, None by default) is asked before every upstream call; a call it refuses raises
    `CapReached` and is not sent (see `colab_graphs.models.spend`).
    """

    def __init__(
        self,
        cache: CallCache | None = None,
        *,
        max_concurrency: int = 16,
        retries: int = 6,
        backoff_s: float = 0.5,
        backoff_max_s: float = 30.0,
        timeout_s: float = 120.0,
        preflight: bool = False,
        preflight_timeout_s: float = 5.0,
        direct: bool | None = None,
    ):
        self.cache = cache
        # (`direct_enabled` imported by name: this argument hides the module here.)
        self.direct = direct_enabled() if direct is None else direct
        self.preflight = preflight
        self.preflight_timeout_s = preflight_timeout_s
        self.max_concurrency = max_concurrency
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.timeout_s = timeout_s
        self.stats = CallStats()
        self.cap: SpendCap | None = None
        self._pricing: list[asyncio.Future[Any]] = []
        self._flights: SingleFlight[str, Call] = SingleFlight()
        self._limits: dict[str, asyncio.Semaphore] = {}
        self._routers: dict[str, Any] = {}
        self._probes: dict[str, asyncio.Future[str | None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rng = random.Random(0)

    # --- public --------------------------------------------------------------------------------------------

    async def prepare(self, members: Iterable[Member]) -> None:
        """Do now what the first calls of `members` would otherwise wait for: load LiteLLM where a call of
        theirs goes through it (an audit and a run call this before their first play, so no play's deadline
        counts LiteLLM's seconds of import), and start looking up a direct member's price in LiteLLM's map.

        The price is awaited here only when a `--max-cost` cap needs it before the first call; otherwise the
        look-up runs beside the calls and a reply waits for it only when it comes first (its cost is then
        settled, before any report). A served model that LiteLLM's bundled map certainly does not price
        (`pricing.unmapped`) is settled at once without loading LiteLLM; members whose calls all go direct at
        a known price load nothing."""
        waits, through_litellm = [], False
        for member in members:
            settings = {**member.settings, "messages": []}
            if self._direct_now() and direct.direct_request(member, settings) is not None:
                if not direct.settled_price(member)[0]:
                    waits.append(on_call_loop(direct.price_of(member, self.cache)))
            elif not (self._direct_now() and _local_params(member, settings) is not None):
                through_litellm = True
        if through_litellm and "litellm" not in sys.modules:
            await on_call_loop(_load_litellm())
        if self.cap is not None and self.cap.max_cost_usd is not None:
            await asyncio.gather(*waits)
        else:
            self._pricing = [asyncio.ensure_future(wait) for wait in waits]  # (kept: a task is weakly held)

    def canonical_request(
        self, member: Member, messages: list[dict[str, Any]], sample: int = 0, overrides: dict | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(cache request, litellm kwargs) for one call.

        The cache request has no connection settings or secrets; its `identity` says which model answers (the
        endpoint, the member's deployments, its weights or its `cache_namespace`: `models/identity.py`), so a
        reply is never served for another model that goes by the same name.
        """
        messages = self._with_persona(member, messages)
        settings = {**member.settings, **(overrides or {})}
        if sample and settings.get("seed") is not None:
            # Repeated samples of a seeded member stay reproducible and distinct.
            settings["seed"] = int(settings["seed"]) + sample
        gen = {k: v for k, v in settings.items() if k not in CONNECTION_KEYS and k != "model"}
        request = {
            "model": settings["model"],
            "messages": messages,
            "settings": gen,
            "sample": sample,
            "identity": cache_identity(member, settings),
        }
        kwargs = {**settings, "messages": messages}
        return request, kwargs

    async def complete(
        self,
        member: Member,
        messages: list[dict[str, Any]],
        *,
        sample: int = 0,
        overrides: dict[str, Any] | None = None,
        node: str | None = None,
        seat: str | None = None,
        trace: Trace | None = None,
        on_delta: DeltaHandler | None = None,
    ) -> Call:
        """Call `member` on `messages`: the call's record (its reply, usage, cost, whether it was `cached`).

        The same record is appended to `trace` (when given) whether the call succeeded, was served from cache,
        or failed.
        With `on_delta`, a call that goes upstream streams (LiteLLM's `stream=True`) and `on_delta` gets each
        piece as it arrives; a reply served from the cache or from an identical call in flight comes as one
        piece (the cache keeps the reply, not how it was cut into tokens). Streaming is not part of the
        request: a streamed reply is cached for callers who do not stream, and the other way round. A stream
        is retried only before its first piece (pieces handed out cannot be taken back); local in-process
        members answer whole, as one piece. Raises `CallError` when the call fails after retries.
        """
        self._bind_loop()
        request, kwargs = self.canonical_request(member, messages, sample, overrides)
        key = request_key(request)
        self.stats.keys.add(key)
        asked = Call(
            node=node,
            seat=seat,
            member=member.name,
            model=request["model"],
            messages=request["messages"],
            settings=request["settings"],
            sample=sample,
            key=key,
        )
        with otel.call_span(asked, member.settings) as span:
            try:
                with pending_call(node or seat, member.name):
                    call = await self._served(asked, member, request, kwargs, on_delta, span)
            except CallError as err:
                if span is not None:
                    span.failed(err.kind, err.detail, err.attempts)
                if trace is not None:
                    failed = {"error": err.detail, "error_type": err.kind, "attempts": err.attempts}
                    trace.calls.append(asked.model_copy(update=failed))
                raise
            if span is not None:
                span.done(call)
        if on_delta is not None and call.cached:
            await deliver(on_delta, Delta(call.text, whole_calls(call.tool_calls)))
        if trace is not None:
            trace.calls.append(call)
        return call

    # --- internals -----------------------------------------------------------------------------------------

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Semaphores and futures belong to one loop; a new loop (a new asyncio.run) gets fresh ones.
            self._loop = loop
            self._flights = SingleFlight()
            self._limits = {}
            self._routers = {}
            self._probes = {}

    @staticmethod
    def _with_persona(member: Member, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not member.system_prompt:
            return list(messages)
        if messages and messages[0].get("role") == "system":
            merged = member.system_prompt + "\n\n" + str(messages[0].get("content", ""))
            return [{"role": "system", "content": merged}, *messages[1:]]
        return [{"role": "system", "content": member.system_prompt}, *messages]

    async def _served(
        self,
        asked: Call,
        member: Member,
        request: dict[str, Any],
        kwargs: dict[str, Any],
        on_delta: DeltaHandler | None,
        span: otel.CallSpan | None = None,
    ) -> Call:
        """The call `asked` answered: from the cache, from an identical call in flight, or upstream (`span`,
        its trace span when tracing, is told which)."""
        if self.cache is not None:
            reply = self.cache.reply(asked.key)
            if reply is not None:
                self.stats.cached += 1
                otel.served(span, "cache")
                return asked.answered(reply, cached=True)
        call, shared = await self._flights.run(
            asked.key, lambda: self._call_upstream(asked, member, request, kwargs, on_delta)
        )
        if shared:
            self.stats.cached += 1
            otel.served(span, "single_flight")
            return asked.answered(call, cached=True, attempts=call.attempts)
        return call

    def _router(self, member: Member) -> Any:
        """The member's `litellm.Router` over its deployments (one per member and event loop)."""
        router = self._routers.get(member.name)
        if router is None:
            litellm = _litellm()
            settings = {
                # Every deployment may be tried before the client's own retry loop (with backoff) takes over;
                # the first failure cools a deployment down, so a dead replica stops being picked at once.
                "num_retries": 2 * member.replicas,
                "allowed_fails": 0,
                "cooldown_time": 10.0,
                **member.router,
            }
            router = litellm.Router(model_list=member.router_model_list(), **settings)
            self._routers[member.name] = router
        return router

    async def _unreachable(self, member: Member) -> str | None:
        """Why nothing answers at the member's HTTP endpoint(s), or None when something does (or it has none).

        Each distinct api_base is probed once per client and event loop; concurrent calls share the probe.
        """
        bases = [
            str(base)
            for s in ([{**member.settings, **d} for d in member.deployments] or [member.settings])
            if (base := s.get("api_base") or s.get("base_url"))
        ]
        if not bases:
            return None
        reasons = []
        for base in dict.fromkeys(bases):
            probe = self._probes.get(base)
            if probe is None:
                probe = self._probes[base] = asyncio.ensure_future(
                    probe_endpoint(base, self.preflight_timeout_s)
                )
            reason = await asyncio.shield(probe)
            if reason is None:
                return None
            reasons.append(f"{public_url(base)} ({reason})")
        where = "any of its deployments" if len(reasons) > 1 else "its api_base"
        return (
            f"nothing answers at {where}: {'; '.join(reasons)}; is the server up and the address right? "
            "(--no-preflight skips this check)"
        )

    async def _send(self, member: Member, kwargs: dict) -> Any:
        """One attempt: straight to LiteLLM, or through the member's Router when it has deployments. Runs on
        the call loop (`colab_graphs.models.loops`): LiteLLM's own sync work never waits for a thread that a
        sync node holds."""
        litellm = _litellm()
        if any(m.startswith("local/") for m in _models(member, kwargs)):
            from colab_graphs.local.provider import register_local_provider

            register_local_provider()
        if not member.deployments:
            return await litellm.acompletion(**{**kwargs, "num_retries": 0, "max_retries": 0})
        call = {k: v for k, v in kwargs.items() if k not in CONNECTION_KEYS and k != "model"}
        return await self._router(member).acompletion(model=member.name, **call)

    async def _attempt(
        self, member: Member, kwargs: dict, on_delta: DeltaHandler | None, sent: list[bool]
    ) -> _Answer:
        """One attempt's reply: direct when the call goes direct, else through LiteLLM; streamed when `on_delta`
        is given (`sent` becomes [True] once a piece has been handed out)."""
        if on_delta is None and self._direct_now():
            request = direct.direct_request(member, kwargs)
            if request is not None:
                return await on_call_loop(_direct_answer(request))
            params = _local_params(member, kwargs)
            if params is not None:
                return await on_call_loop(_local_answer(kwargs, params))
        if on_delta is None:
            kwargs = otel.litellm_parented(kwargs)  # (LiteLLM's own spans nest under this call's)
            return _litellm_answer(await on_call_loop(self._send(member, kwargs)))
        kwargs = otel.litellm_parented(kwargs)
        # The stream is read on the call loop; its pieces come back here, in order, then None.
        here = asyncio.get_running_loop()
        pieces: asyncio.Queue[Delta | None] = asyncio.Queue()

        async def read() -> list[Any]:
            stream = await self._send(
                member, {**kwargs, "stream": True, "stream_options": {"include_usage": True}}
            )
            chunks = []
            async for chunk in stream:
                chunks.append(chunk)
                delta = getattr(chunk.choices[0], "delta", None) if chunk.choices else None
                if delta is None:
                    continue
                text, calls = getattr(delta, "content", None) or "", getattr(delta, "tool_calls", None)
                if text or calls:
                    piece = Delta(text, [_plain(c) for c in calls] if calls else None)
                    here.call_soon_threadsafe(pieces.put_nowait, piece)
            return chunks

        reading = asyncio.ensure_future(on_call_loop(read()))
        reading.add_done_callback(lambda _: pieces.put_nowait(None))
        try:
            while (piece := await pieces.get()) is not None:
                sent[0] = True
                await deliver(on_delta, piece)
            chunks = reading.result()
        finally:
            if not reading.done():
                reading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reading
        response = _litellm().stream_chunk_builder(chunks, messages=kwargs["messages"])
        if response is None:
            raise ValueError("the stream ended without a chunk")
        return _litellm_answer(response)

    def _concurrency(self, member: Member, local: bool) -> int:
        """Calls in flight at once to the member's endpoint. An in-process engine takes at least as many as it
        decodes in one batch: a lower limit would split what arrives together into batches that each pay the
        decoding steps of their longest reply (the default audit's 36 calls ran as 16, then 20, at the
        former limit of 16; BENCHMARKS.md)."""
        limit = self.max_concurrency * member.replicas
        if local:
            from colab_graphs.local.provider import MAX_BATCH

            limit = max(limit, MAX_BATCH)
        return limit

    def _direct_now(self) -> bool:
        """Whether calls may go direct now: the client allows it and no LiteLLM callback needs to see them
        (checked per call: a callback set mid-run sees every call from then on)."""
        return self.direct and not direct.litellm_in_use()

    async def _cost(self, member: Member, answer: _Answer, models: list[str]) -> float | None:
        """What the reply cost (None: unknown). A direct reply is priced from the member's price, looked up on
        the call loop the first time (`ModelClient.prepare` does it before an audit's plays); in-process
        `local/` models cost nothing to call (as `models.pricing` plans them); LiteLLM priced the rest."""
        if answer.direct_usage is not None:
            settled, price = direct.settled_price(member)
            if not settled:
                price = await on_call_loop(direct.price_of(member, self.cache))
            return direct.reply_cost(price, answer.direct_usage)
        if all(m.startswith("local/") for m in models):
            return 0.0
        return _response_cost(_litellm(), answer.response, models)

    async def _call_upstream(
        self,
        asked: Call,
        member: Member,
        request: dict[str, Any],
        kwargs: dict[str, Any],
        on_delta: DeltaHandler | None = None,
    ) -> Call:
        """The call `asked` made upstream (with retries), its reply stored in the cache. (LiteLLM is first
        imported on the call loop, by `_send`: its seconds of import do not hold this loop's timers.)"""
        models = _models(member, kwargs)
        local = any(m.startswith("local/") for m in models)
        limit = self._limits.get(member.endpoint)
        if limit is None:
            limit = self._limits[member.endpoint] = asyncio.Semaphore(self._concurrency(member, local))
        secrets = member.secrets()
        call_kwargs = {"timeout": self.timeout_s, **kwargs}
        # A member's (or a call's) `num_retries` is this path's retry count for it; LiteLLM itself never retries.
        retries = self.retries if kwargs.get("num_retries") is None else int(kwargs["num_retries"])
        # The in-process provider answers whole; its reply goes to `on_delta` as one piece below.
        streamed = on_delta if not local else None
        attempts = 0
        # Asked here, after the cache and the single flight: only a call that would really be sent counts.
        reserved = self.cap.reserve(member, kwargs["messages"], request["settings"]) if self.cap else 0.0
        if self.preflight:
            unreachable = await self._unreachable(member)
            if unreachable is not None:
                self.stats.failed += 1
                raise CallError("unreachable", redact(unreachable, secrets), member.name, 1)
        while True:
            attempts += 1
            self.stats.attempts += 1
            started = time.perf_counter()
            sent = [False]
            try:
                async with limit:
                    answer = await self._attempt(member, call_kwargs, streamed, sent)
                    latency = time.perf_counter() - started
                    # Priced before the slot goes to another call: from here to the cache write nothing waits,
                    # so a reply is stored before the next request to its endpoint is sent (a killed run
                    # repeats no call it was answered, one call at a time).
                    cost = await self._cost(member, answer, models)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every upstream failure is classified below
                kind = classify_error(exc)
                if kind in RETRYABLE and attempts <= retries and not sent[0]:
                    delay = min(self.backoff_max_s, self.backoff_s * 2 ** (attempts - 1))
                    await asyncio.sleep(delay * (0.5 + self._rng.random()))
                    continue
                self.stats.failed += 1
                if self.cap is not None:
                    self.cap.settle(reserved, 0.0)
                raise CallError(
                    kind, redact(f"{type(exc).__name__}: {exc}", secrets)[:2000], member.name, attempts
                ) from None
            break
        self.stats.made += 1  # (a call that failed is counted in `failed`, not here)
        if on_delta is not None and streamed is None:
            await deliver(on_delta, Delta(answer.text, whole_calls(answer.tool_calls)))
        if self.cap is not None:
            self.cap.settle(reserved, cost)
        details = answer.local_details
        if local and details is None:
            from colab_graphs.local.provider import local_call_details

            details = local_call_details(answer.response)
        reply = Reply(
            completion=answer.text,
            tool_calls=answer.tool_calls,
            finish_reason=answer.finish_reason,
            usage=answer.usage,
            cost_usd=cost,
            prompt_token_ids=(details or {}).get("prompt_token_ids"),
            completion_token_ids=(details or {}).get("completion_token_ids"),
            logprobs=(details or {}).get("logprobs") or answer.logprobs,
        )
        self.count(reply)
        if self.cache is not None:
            try:
                self.cache.put(asked.key, request["model"], request, reply.cache_entry(), member.name)
            except Exception as exc:  # noqa: BLE001 - a full disk must not lose the answer in hand
                logger.warning("call cache write failed (%s); continuing without caching this call", exc)
        return asked.answered(reply, latency_s=latency, attempts=attempts)

    def count(self, reply: Reply) -> None:
        """Add an upstream reply's tokens and price to `stats` (None: a price unknown)."""
        self.stats.prompt_tokens += reply.usage.prompt_tokens
        self.stats.completion_tokens += reply.usage.completion_tokens
        if reply.cost_usd is None:
            self.stats.cost_usd = None
        elif self.stats.cost_usd is not None:
            self.stats.cost_usd += reply.cost_usd


def _models(member: Member, kwargs: Mapping[str, Any]) -> list[str]:
    """The models a call of `member` may reach: its own and its deployments'."""
    return [str(kwargs["model"]), *(str(d.get("model", "")) for d in member.deployments)]


def whole_calls(tool_calls: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Finished tool calls as stream pieces: one piece per call, with its `index`."""
    return [{"index": i, **call} for i, call in enumerate(tool_calls)] if tool_calls else None


async def deliver(on_delta: DeltaHandler, delta: Delta) -> None:
    """Hand `delta` to a handler that may be sync or async."""
    if inspect.isawaitable(outcome := on_delta(delta)):
        await outcome


_default_client: ModelClient | None = None
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def default_client() -> ModelClient:
    """A process-wide client with the default on-disk cache, for graphs and chat models used outside our
    runner."""
    global _default_client
    if _default_client is None:
        from colab_graphs.models.cache import CallCache

        _default_client = ModelClient(CallCache())
    return _default_client


def background_loop() -> asyncio.AbstractEventLoop:
    """One event loop in a daemon thread, where work runs when it is waited for synchronously (a graph's or
    chat model's `invoke`, the API's sync forms); its default executor, where an app's sync nodes run, is a
    `DaemonThreads` (see `colab_graphs.models.loops`)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = new_loop_thread("colab-graphs-loop", DaemonThreads())
    return _loop
