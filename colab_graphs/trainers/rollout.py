"""Rollouts: run the live graph with the policy seated, and collect the policy's turns from the traces.

The policy is an in-process model served as ``local/<name>`` by :mod:`colab_graphs.local.provider` (the engine
holds the trainer's own model object, so every rollout generates with the current weights). Its calls go
through a `PolicyRouter`:

- policy calls use a client **without cache**, each with its own seeded `sample` index, so no call is ever
  served from a cache or shared with a concurrent identical request (single-flight): the G rollouts of a
  prompt are G independent samples, and no step sees an older policy's answer. That client
  (`InProcessPolicyClient`) hands `local/` requests straight to the provider's batching engine instead of
  through LiteLLM's dispatch: same request building, same tokens, less overhead per turn;
- every other member's call goes through the normal call path (cache -> single-flight -> limits -> LiteLLM).

**Seeds.** Every sampled call of a rollout gets a sample index, and a seed, drawn from the config's `seed`
and where the call stands (`call_seed`): the rollout's key (in training: the step, the prompt's position in
the step and the rollout's index in its group; a replay adds the forked turn and the re-run), the member,
the seat, how many calls that seat made before in the rollout, and the protocol's own sample index. So the
same config repeats its run, and two runs with one seed (two arms of a comparison) draw the same random
numbers wherever they make the same call: the same tokens where their inputs are the same. A collaborator
that samples (temperature above 0, or unset: its provider's default) gets a distinct seeded sample per
rollout, cached under that index (a rerun of the config is served from the cache); a greedy collaborator
keeps sample 0, one answer per request, shared across rollouts. The seed reaches the provider where it takes
one (`local/` models, OpenAI-compatible servers such as vLLM); a member with its own `seed` gets its seed
plus the sample index (the call path's rule). Outside a rollout (the before/after evaluation) a call's seed is
drawn from its request instead, and collaborators keep their sample index (0: one answer per request, shared
by the coalitions an evaluation plays, as an audit shares it, and by the evaluations before and after).

Each policy call recorded in a trace carries the exact ``prompt_token_ids`` / ``completion_token_ids`` /
``logprobs`` the engine produced: one `PolicyTurn`, i.e. one training segment (prompt, completion). The
logprobs are those of the distribution each token was drawn from (temperature, top-k, min-p, top-p and
repetition penalty applied: the engine's ``logprobs_mode="processed"``), not the model's untempered one.

`ReplayClient` re-runs a recorded rollout from one policy turn: calls whose request is unchanged are served
from the recorded trace, the forked turn is resampled, and everything downstream of it runs live.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import itertools
import json
import threading
import time
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from colab_graphs.models.client import CallError, DeltaHandler, ModelClient
from colab_graphs.pool import Member, Pool
from colab_graphs.spec import GraphSpec
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import apply_scorer
from colab_graphs.trace import Call, Reply, Trace, Usage

T = TypeVar("T")

ROLLOUT_KEY: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("crl_rollout_key", default=None)
"""The key of the rollout whose graph run is making the current call (None outside a rollout)."""
_CALL_ORDER: contextvars.ContextVar[tuple[Iterator[int], dict[int, int]] | None] = contextvars.ContextVar(
    "crl_call_order", default=None
)
"""The current rollout's calls in the order they started: a trace lists calls as they finish, and parallel
calls finish in whatever order the machine's timing gives; the order they start in is the graph's."""


def _started() -> int | None:
    order = _CALL_ORDER.get()
    return next(order[0]) if order is not None else None


def _note(record: Call, started: int | None) -> None:
    order = _CALL_ORDER.get()
    if order is not None and started is not None:
        order[1][id(record)] = started


def call_seed(seed: int, *parts: Any) -> int:
    """A 48-bit number drawn from `seed` and `parts` (SHA-256 of their JSON): a call's sample index and seed.

    48 bits stay exact in JSON readers that hold numbers as doubles and leave room for a member's own seed
    to be added (the call path gives a seeded member seed + sample).

    Example:
        >>> call_seed(0, "step", 1) == call_seed(0, "step", 1) != call_seed(1, "step", 1)
        True
    """
    text = json.dumps([seed, *parts], default=str, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:6], "big")


@functools.cache
def accepts_seed(model: str) -> bool:
    """Whether a call to `model` may carry a `seed` (local models and providers LiteLLM sends it to)."""
    if model.startswith(("local/", "hosted_vllm/")):  # vLLM's server takes a seed
        return True
    try:
        import litellm

        return "seed" in (litellm.get_supported_openai_params(model=model) or [])
    except Exception:  # noqa: BLE001 - a model LiteLLM cannot place gets no seed, only its sample index
        return False


async def _in_context(coro: Coroutine[Any, Any, T], context: contextvars.Context) -> T:
    return await asyncio.get_running_loop().create_task(coro, context=context)


class LoopThread:
    """One event loop in a daemon thread, reused for every rollout batch.

    LiteLLM's logging worker complains when `asyncio.run` creates a new loop per call, and a trainer may run
    inside a notebook whose loop is already running; a private long-lived loop avoids both.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="colab-graphs-rollouts", daemon=True
        )
        self._thread.start()

    _shared: LoopThread | None = None
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls) -> LoopThread:
        """The process-wide loop thread (never closed: LiteLLM's logging worker stays bound to one loop)."""
        with cls._shared_lock:
            if cls._shared is None or cls._shared.loop.is_closed():
                cls._shared = cls()
            return cls._shared

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and wait for its result (exceptions propagate).

        It runs in a copy of the caller's context, as `asyncio.run` would: context variables the caller set
        (the sandbox setting of code scores, `colab_graphs.sandbox.scope.using`) hold inside.
        """
        return asyncio.run_coroutine_threadsafe(
            _in_context(coro, contextvars.copy_context()), self.loop
        ).result()

    def close(self) -> None:
        """Stop the loop and join its thread."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        self.loop.close()


class InProcessPolicyClient(ModelClient):
    """The call path for the policy: `ModelClient` (single-flight, limits, trace record) whose upstream for a
    `local/` model is the in-process engine itself.

    The policy is this process's own model, so LiteLLM's dispatch adds nothing but per-call overhead (about
    as much CPU as decoding a short turn of a tiny model); the request is built and decoded by the same
    provider functions `local/` uses under LiteLLM (`build_request`, the batching engine), so text, token ids
    and logprobs are the same. Logit-level requests and non-local models go through LiteLLM as usual.
    """

    async def _call_upstream(
        self,
        asked: Call,
        member: Member,
        request: dict[str, Any],
        kwargs: dict[str, Any],
        on_delta: DeltaHandler | None = None,
    ) -> Call:
        from colab_graphs.local.provider import DETAILS_KEY, build_request, get_engine

        model = str(kwargs["model"])
        if not model.startswith("local/") or DETAILS_KEY in kwargs or kwargs.get("metadata") or on_delta:
            return await super()._call_upstream(asked, member, request, kwargs, on_delta)
        self.stats.made += 1
        self.stats.attempts += 1
        started = time.perf_counter()
        try:
            engine = get_engine(model)
            params = {k: v for k, v in kwargs.items() if k not in ("model", "messages")}
            request = build_request(engine, kwargs["messages"], params)
            request.logprobs_mode = "processed"  # what the tokens were drawn from (see the module docstring)
            with engine.expecting(-1):  # this rollout waits on the engine now: the batch need not wait for it
                result = await engine.agenerate(request)
        except Exception as exc:  # noqa: BLE001 - reported as a failed call, like any upstream failure
            self.stats.failed += 1
            raise CallError("local", f"{type(exc).__name__}: {exc}", member.name, 1) from None
        reply = Reply(
            completion=result.text,
            usage=Usage(prompt_tokens=len(result.prompt_ids), completion_tokens=len(result.completion_ids)),
            cost_usd=None,  # as through LiteLLM: a local model has no price
            prompt_token_ids=list(result.prompt_ids),
            completion_token_ids=list(result.completion_ids),
            logprobs=list(result.logprobs),
            finish_reason=result.finish_reason,
        )
        self.count(reply)
        return asked.answered(reply, latency_s=time.perf_counter() - started, attempts=1)


class PolicyRouter:
    """The call path of a rollout: policy calls uncached, every sampled call seeded (see the module docstring).

    Duck-types `ModelClient.complete`, so a compiled graph's runtime can use it.

    Args:
        client: the normal call path for the collaborators (usually with a `CallCache`).
        policy_members: names of the members the policy plays.
        policy_overrides: generation settings forced on policy calls (temperature, top_p, max_tokens cap).
        seed: the run's seed (the training config's `seed`).
        stream: a name that separates this router's draws from another's with the same seed (training and
            evaluation).
        policy_client: the policy's call path (default: the in-process engine's `InProcessPolicyClient`;
            `rollout: server` gives `server_rollout.ServerPolicyClient`).
    """

    def __init__(
        self,
        client: ModelClient,
        policy_members: Sequence[str],
        policy_overrides: dict[str, Any],
        seed: int = 0,
        stream: str = "train",
        policy_client: ModelClient | None = None,
    ):
        self.client = client
        self.policy_client = policy_client or InProcessPolicyClient(
            None, max_concurrency=client.max_concurrency, retries=client.retries
        )
        self.policy_members = frozenset(policy_members)
        self.policy_overrides = dict(policy_overrides)
        self.seed = seed
        self.stream = stream

    cache: None = None
    """No play cache behind a router: the policy's replies change with every update, so a game played through
    it must play every coalition (`Game.play_cache` reads this; the collaborators' calls stay cached in
    `client`)."""

    @property
    def max_concurrency(self) -> int:
        return self.client.max_concurrency

    @property
    def stats(self):  # noqa: ANN201 - the collaborators' CallStats
        return self.client.stats

    def canonical_messages(self, member: Member, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages as a trace records them (the member's persona included)."""
        return self.client.canonical_request(member, messages)[0]["messages"]

    async def complete(self, member: Member, messages: list[dict[str, Any]], **call: Any) -> Call:
        """Call `member` (keywords as `ModelClient.complete`); policy calls get the policy overrides, and
        every sampled call its seeded sample index."""
        started = _started()
        client, call = self._route(member, messages, call)
        record = await client.complete(member, messages, **call)
        _note(record, started)
        return record

    def _route(
        self, member: Member, messages: list[dict[str, Any]], call: dict[str, Any]
    ) -> tuple[ModelClient, dict[str, Any]]:
        overrides = call.get("overrides") or {}
        policy = member.name in self.policy_members
        if policy:
            merged = {**overrides, **self.policy_overrides}
            cap = self.policy_overrides.get("max_tokens")
            asked = overrides.get("max_tokens") or member.settings.get("max_tokens")
            if cap is not None and asked is not None:
                merged["max_tokens"] = min(int(cap), int(asked))
            overrides = merged
        else:
            temperature = {**member.settings, **overrides}.get("temperature")
            if temperature is not None and float(temperature) <= 0:
                return self.client, call  # greedy: one answer per request, shared by every rollout
        key = ROLLOUT_KEY.get()
        if key is None:  # outside a rollout: the request itself says which draw this is
            position: tuple = ("request", member.name, call.get("seat"), call.get("sample", 0), messages)
        else:
            position = self._position(key, member, call)
        drawn = call_seed(self.seed, self.stream, *position)
        # The call path gives a seeded member seed + sample. A drawn sample index with seed 0 makes the seed
        # the index; a collaborator outside a rollout keeps its sample index (one answer per request, shared
        # as an audit shares it) and gets the drawn number as its seed.
        sample, seed = (drawn, 0) if policy or key is not None else (call.get("sample", 0), drawn)
        if {**member.settings, **overrides}.get("seed") is None and accepts_seed(
            str(member.settings.get("model", ""))
        ):
            overrides = {**overrides, "seed": seed}
        routed = {**call, "sample": sample, "overrides": overrides}
        return (self.policy_client if policy else self.client), routed

    @staticmethod
    def _position(key: tuple, member: Member, call: dict[str, Any]) -> tuple:
        """Where a rollout's call stands: the rollout, the member, the seat and its earlier calls, the
        protocol's sample index."""
        seat, trace = call.get("seat"), call.get("trace")
        occurrence = sum(1 for c in trace.calls if c.seat == seat) if trace is not None else 0
        return (*key, member.name, seat, occurrence, call.get("sample", 0))


@dataclass
class PolicyTurn:
    """One policy call of a rollout: a training segment.

    Attributes:
        index: position among the rollout's policy calls (0 = first).
        seat: the seat (node) that made the call.
        occurrence: how many earlier calls that seat made in the rollout (loops visit a seat again).
        prompt_ids: exact prompt tokens the policy saw (its chat template applied).
        completion_ids: exact tokens it generated (the only tokens that carry loss).
        logprobs: logprobs of `completion_ids` in the distribution each was drawn from (see the module
            docstring).
        text: the completion text.
        truncated: generation stopped at the token limit (`mask_truncated_completions` leaves such turns
            out of the loss).
    """

    index: int
    seat: str
    occurrence: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None
    text: str
    truncated: bool = False


@dataclass
class Rollout:
    """One run of the system on one example with the policy seated; `key` seeds its calls (see the module
    docstring)."""

    example: Example
    trace: Trace
    reward: float | None
    turns: list[PolicyTurn] = field(default_factory=list)
    policy_score: float | None = None
    key: tuple = ()

    @property
    def failed(self) -> bool:
        return self.reward is None


class RolloutError(RuntimeError):
    """Every rollout of a step failed: the system cannot be run as configured (an unreachable member, ...)."""


def check_rollouts(rollouts: Sequence[Rollout]) -> None:
    """Raise `RolloutError` when every rollout failed (some failures are tolerated and counted in metrics).

    Failed calls are not answers: training on a step where the system never ran would only hide the fault.
    """
    if rollouts and all(r.failed for r in rollouts):
        raise RolloutError(
            f"all {len(rollouts)} rollouts of this step failed; first error: {rollouts[0].trace.error}"
        )


def seat_positions(trace: Trace) -> list[tuple[str | None, int]]:
    """(seat, occurrence) of every call in `trace`: a call's identity that survives concurrent scheduling."""
    seen: dict[str | None, int] = {}
    out = []
    for call in trace.calls:
        out.append((call.seat, seen.get(call.seat, 0)))
        seen[call.seat] = seen.get(call.seat, 0) + 1
    return out


def policy_turns(trace: Trace, policy_members: Sequence[str]) -> list[PolicyTurn]:
    """The policy's successful calls in `trace`, in call order, as training segments.

    Raises:
        ValueError: a policy call lacks token ids (the policy member is not an in-process `local/` model).
    """
    turns = []
    for call, (seat, occurrence) in zip(trace.calls, seat_positions(trace), strict=True):
        if call.member not in policy_members or call.error is not None:
            continue
        if call.prompt_token_ids is None or call.completion_token_ids is None:
            raise ValueError(
                f"policy call of seat {call.seat!r} has no token ids: the policy member must be an in-process "
                f"'local/' model or a policy server (rollout: server) (got model {call.model!r})"
            )
        turns.append(
            PolicyTurn(
                index=len(turns),
                seat=str(seat),
                occurrence=occurrence,
                prompt_ids=list(call.prompt_token_ids),
                completion_ids=list(call.completion_token_ids),
                logprobs=list(call.logprobs) if call.logprobs is not None else None,
                text=call.completion or "",
                truncated=call.finish_reason == "length",
            )
        )
    return turns


class ReplayClient:
    """Re-run a recorded rollout from one policy turn (the fork), holding everything else fixed.

    A call whose (seat, occurrence) and request messages match the recorded trace is served from the record
    (its inputs did not change, so the recorded output is a valid sample of it); the fork call is resampled
    live by the policy; calls whose inputs changed run live through `router`.
    """

    def __init__(self, router: PolicyRouter, recorded: Trace, fork: tuple[str, int]):
        self.router = router
        self.fork = fork
        self.max_concurrency = router.max_concurrency
        self._recorded: dict[tuple[str | None, int], Call] = {
            pos: call
            for call, pos in zip(recorded.calls, seat_positions(recorded), strict=True)
            if call.error is None
        }

    async def complete(self, member: Member, messages: list[dict[str, Any]], **call: Any) -> Call:
        recorded = self._served(member, messages, call.get("seat"), call.get("trace"))
        if recorded is None:
            return await self.router.complete(member, messages, **call)
        return self._serve(recorded, call.get("trace"))

    def _served(
        self, member: Member, messages: list[dict[str, Any]], seat: str | None, trace: Trace | None
    ) -> Call | None:
        """The recorded call that answers this request unchanged, or None (the fork, or changed inputs)."""
        occurrence = sum(1 for c in trace.calls if c.seat == seat) if trace is not None else 0
        position = (seat, occurrence)
        recorded = self._recorded.get(position)
        if (
            position != self.fork
            and recorded is not None
            and recorded.member == member.name
            and recorded.messages == self.router.canonical_messages(member, messages)
        ):
            return recorded
        return None

    @staticmethod
    def _serve(recorded: Call, trace: Trace | None) -> Call:
        # The recorded call's latency and attempts stay on the replay: the trace keeps what the turn took.
        record = recorded.model_copy(update={"cached": True})
        _note(record, _started())
        if trace is not None:
            trace.calls.append(record)
        return record


class RolloutRunner:
    """Runs `spec` on examples with the policy seated and returns `Rollout`s.

    Args:
        spec: the protocol (already restricted/validated for `pool`).
        pool: the pool, with the policy member pointing at the in-process policy (`local/<name>`).
        router: the call path (see `PolicyRouter`).
        scorer: scorer name or callable (None: chosen from each example's fields).
        own_reward: a rollout's reward is the policy's own score (`Rollout.policy_score`: its last turn
            scored against the answer; 0 when it made no turn) instead of the system's (`reward: own`).
    """

    def __init__(
        self,
        spec: GraphSpec,
        pool: Pool,
        router: PolicyRouter,
        scorer: Any = None,
        own_reward: bool = False,
    ):
        from colab_graphs.compile import compile_graph

        self.spec = spec
        self.pool = pool
        self.router = router
        self.scorer = scorer
        self.own_reward = own_reward
        self.graph = compile_graph(spec, pool, router.client, fuse=True)
        self._batches = itertools.count()

    def _scorer_for(self, example: Example):  # noqa: ANN202
        from colab_graphs.runner import resolve_scorer

        return self.scorer if callable(self.scorer) else resolve_scorer(self.scorer, example)

    def _policy_engines(self) -> list[Any]:
        """The in-process engines serving the policy members (the batching hint goes to them)."""
        from colab_graphs.local.provider import get_engine

        models = {str(self.pool[m].settings.get("model", "")) for m in self.router.policy_members}
        return [get_engine(m) for m in sorted(models) if m.startswith("local/")]

    async def _run(self, example: Example, client: Any, key: tuple) -> Rollout:
        from colab_graphs.runner import run_example

        ROLLOUT_KEY.set(key)  # this task's own context: the calls of this rollout, and only they, see it
        order: dict[int, int] = {}
        _CALL_ORDER.set((itertools.count(), order))
        # While this rollout runs, the policy engine may expect a request from it: the G x B rollouts of a
        # step reach their policy turns at slightly different times (their collaborators answer one by one),
        # and one batch of all their turns costs one pass per decoding step instead of one per batch.
        with contextlib.ExitStack() as hints:
            for engine in self._policy_engines():
                hints.enter_context(engine.expecting(1))
            outcome = await run_example(self.graph, self.spec, self.pool, client, example, self.scorer)
        outcome.trace.calls.sort(key=lambda c: order.get(id(c), len(order)))  # stable: failed calls last
        turns = policy_turns(outcome.trace, sorted(self.router.policy_members))
        policy_score = None
        if turns and not outcome.failed:
            verdict = await apply_scorer(self._scorer_for(example), turns[-1].text, example)
            policy_score = verdict.value
        reward = None if outcome.failed else float(outcome.score or 0.0)
        if self.own_reward and reward is not None:
            reward = float(policy_score or 0.0)
        return Rollout(example, outcome.trace, reward, turns, policy_score, key)

    async def arun(self, examples: Sequence[Example], keys: Sequence[tuple] | None = None) -> list[Rollout]:
        """One rollout per entry of `examples` (repeat an example G times for a GRPO group), concurrently.

        `keys` name each rollout for its seeds (the trainer passes (step, prompt, generation) positions);
        by default the n-th batch this runner runs keys its rollouts ("batch", n, i).
        """
        if keys is None:
            batch = next(self._batches)
            keys = [("batch", batch, i) for i in range(len(examples))]
        if len(keys) != len(examples):
            raise ValueError(f"{len(keys)} rollout keys for {len(examples)} examples")
        runs = (self._task(e, self.router, tuple(k)) for e, k in zip(examples, keys, strict=True))
        return list(await asyncio.gather(*runs))

    async def areplay(self, rollout: Rollout, turn: PolicyTurn, samples: int) -> list[Rollout]:
        """`samples` re-runs of `rollout` with `turn` resampled and the rest of the system re-run after it
        (re-run k keyed as the rollout, the turn and k)."""
        client = ReplayClient(self.router, rollout.trace, (turn.seat, turn.occurrence))
        return list(
            await asyncio.gather(
                *(
                    self._task(rollout.example, client, (*rollout.key, "replay", turn.index, k))
                    for k in range(samples)
                )
            )
        )

    def _task(self, example: Example, client: Any, key: tuple) -> asyncio.Task[Rollout]:
        # A task per rollout runs in a copy of the current context, so its key stays its own.
        return asyncio.ensure_future(self._run(example, client, key))
