"""Batching generation engine for in-process transformers models.

One :class:`LocalEngine` per loaded model. Requests are queued from any thread or event loop; a worker thread
collects the requests that arrive within ``batch_wait_ms`` of the first one, left-pads them and decodes them
together with a KV cache. Each row keeps its own sampling settings and its own random stream (a
``random.Random`` seeded by the request's ``seed``, else from ``os.urandom``), and every step draws all rows'
tokens at once from one uniform number per row (`draw_tokens`), so a request's tokens do not depend on what it
was batched with: greedy rows (temperature 0) match batch-1 generation in fp32, and seeded rows repeat
exactly, on any device (the stream is Python's, not a device generator's). A guided row
(``allowed_tokens``) draws only among the tokens its guide allows.

Logprobs are those of the model's own distribution (``log_softmax`` of the raw logits, before repetition
penalty, temperature and truncation), the OpenAI convention, unless the request asks for
``logprobs_mode="processed"``: then each token's logprob in the distribution it was actually drawn from (after
repetition penalty, temperature, top-k, min-p and top-p, renormalised), what a policy-gradient trainer's
importance ratio compares against. A greedy row has no sampling distribution: it reports raw logprobs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from colab_graphs.local.prefix import SharedPrefixes, plan_shared_prefixes

# torch's OpenMP threads otherwise spin at every barrier; on a machine whose cores other processes also use
# (a laptop, a shared CI runner), a spinning thread burns the time slice its partner needs. Measured on 2 cores
# (BENCHMARKS.md, batch 8): passive waits decode 2.1x faster with 2 other busy processes (56 vs 27 tok/s) and
# 8x faster with 6 (14.5 vs 1.8); they cost 0-35% on an idle machine (batch 1: 16 vs 24 tok/s). It must be in
# the environment before torch loads (the CLI and the provider import this module first); a user's value
# wins (OMP_WAIT_POLICY=ACTIVE for a machine of one's own).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
THREADS_ENV = "COLAB_GRAPHS_LOCAL_THREADS"

# A plain prompt format for models without a chat template (base models such as Gemma-3-270m).
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}"
    "{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n' }}"
    "{% else %}{{ 'Assistant: ' + message['content'] + '\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


_STOP: Any = object()
_RENDER_CACHE_SIZE = 256  # prompts remembered per engine (a few steps of GRPO groups)
_SCAN = 64  # waiting requests a running batch looks at per step for ones that can join
# Requests decoded together at most, by default. A batch cut short leaves the rest to a later batch that pays
# its own tail of decoding steps (up to its longest reply); 64 takes the default audit's 36 calls at once. Its
# KV cache holds rows x (longest prompt + largest max_tokens) positions: for SmolLM2-135M 45 KB a position (fp32),
# 64 rows of 100 positions about 290 MB.
MAX_BATCH = 64


@dataclass
class GenerationRequest:
    """One completion to generate.

    Attributes:
        prompt_ids: Token ids of the rendered prompt.
        max_tokens: Most new tokens to generate.
        temperature: 0 means greedy decoding.
        top_p: Nucleus sampling mass.
        top_k: Sample among the k most likely tokens only (0: all).
        min_p: Drop tokens less likely than ``min_p`` times the most likely one (0: none).
        repetition_penalty: Divide the positive logits (multiply the negative ones) of every token already in
            the prompt or the completion by this (1: none; the transformers/CTRL rule).
        seed: Seed of this request's own random stream; None draws a fresh one.
        stop: Strings that end generation; the text is cut before the first one.
        top_logprobs: Number of alternatives to report per position (0 for none; always raw logprobs).
        logprobs_mode: "raw" (the model's distribution) or "processed" (the distribution the token was drawn
            from; see the module docstring).
        on_text: Called from the worker thread with each new piece of text (streaming).
        allowed_tokens: Guided decoding: called with the ids generated so far and the next-token logits,
            returns the ids this row may take next (the logprobs recorded stay the model's own).
        cancelled: Set by `LocalEngine.cancel`: the request is dropped at the engine's next step.
        cancel_step: The engine's step count when it was cancelled.
    """

    prompt_ids: list[int]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = ()
    top_logprobs: int = 0
    logprobs_mode: str = "raw"
    on_text: Callable[[str], None] | None = None
    allowed_tokens: Callable[[list[int], Any], Sequence[int]] | None = None
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    cancel_step: int | None = field(default=None, repr=False, compare=False)


class GenerationCancelled(Exception):
    """The request was cancelled (its client left) and dropped from its batch."""


@dataclass(frozen=True)
class Cancellation:
    """What the engine did with a cancelled request: the step counts when it was cancelled and when it was
    dropped (at most one step apart when the engine checks every step), and the tokens it had made."""

    cancel_step: int
    dropped_step: int
    tokens: int


@dataclass
class GenerationResult:
    """What a request produced: exact token ids and the logprob of each generated token."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


class _Row:
    """Decoding state of one request inside a batch."""

    def __init__(
        self, req: GenerationRequest, engine: LocalEngine, eos_ids: frozenset[int] | None = None
    ) -> None:
        self.req = req
        self.eos_ids = frozenset(engine.eos_ids) if eos_ids is None else eos_ids
        # Text is needed per token only to find stop strings or to stream; otherwise decode once at the end.
        self.live_text = bool(req.stop) or req.on_text is not None
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.top: list[list[tuple[int, float]]] = []
        self.text = ""
        self.emitted = 0
        # Incremental decoding: only the ids from `_prefix` on are decoded again each step; the text of
        # ids[_prefix:_read] is known, what follows it is new (a window: a token's text can depend on the one
        # before it, as SentencePiece's leading space does).
        self._prefix = 0
        self._read = 0
        self.finish: str | None = None
        self.engine = engine
        seed = req.seed if req.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        # random.Random seeds from |seed|: -5 and 5 would draw alike. Seeds are 64-bit (OpenAI's signed range,
        # vLLM's unsigned one): taken modulo 2**64 every distinct seed in either range draws its own stream.
        self.rng = random.Random(seed % 2**64)

    def choose(self, logits: Any) -> int:
        """Pick the next token from this row's fp32 logits (one row, as `draw_tokens` picks for a batch) and
        record it."""
        tokens, picked, logp = draw_tokens([self], logits.unsqueeze(0))
        self.record(tokens[0], picked[0], logp[0])
        return tokens[0]

    def record(self, token: int, logprob: float, logp: Any) -> None:
        """Append the chosen token, its logprob and (when asked) the top alternatives from ``logp``."""
        import torch

        self.ids.append(token)
        self.logprobs.append(logprob)
        if self.req.top_logprobs:
            values, indices = torch.topk(logp, self.req.top_logprobs)
            self.top.append([(int(i), float(v)) for i, v in zip(indices, values, strict=True)])

    def update(self, token: int) -> None:
        """Decode, check end conditions, and stream the text that can no longer change."""
        if token in self.eos_ids:
            self.finish = "stop"
        if not self.live_text:
            if self.finish is None and len(self.ids) >= self.req.max_tokens:
                self.finish = "length"
            if self.finish is not None:
                self.text = self.engine.tokenizer.decode(self.ids, skip_special_tokens=True)
            return
        before = len(self.text)
        self._decode_new()
        # A stop string can only end in the new text: search from where one could start.
        start = max(0, before - max((len(s) for s in self.req.stop), default=0) + 1)
        for s in self.req.stop:
            cut = self.text.find(s, start)
            if s and cut >= 0:
                self.text, self.finish = self.text[:cut], "stop"
        if self.finish is None and len(self.ids) >= self.req.max_tokens:
            self.finish = "length"
        if self.req.on_text is not None:
            # Hold back what a stop string or an unfinished UTF-8 sequence may still change.
            hold = 0 if self.finish else max((len(s) - 1 for s in self.req.stop), default=0)
            safe = len(self.text) - hold
            while not self.finish and safe > self.emitted and self.text[safe - 1] == "\ufffd":
                safe -= 1
            if safe > self.emitted:
                self.req.on_text(self.text[self.emitted : safe])
                self.emitted = safe

    def _decode_new(self) -> None:
        """Append the text of the ids decoded since the last call (held back while it ends inside a
        character: the next token completes it)."""
        decode = self.engine.tokenizer.decode
        known = decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        window = decode(self.ids[self._prefix :], skip_special_tokens=True)
        if len(window) > len(known) and not window.endswith("\ufffd"):
            self.text += window[len(known) :]
            self._prefix, self._read = self._read, len(self.ids)
        elif self.finish is not None or len(self.ids) >= self.req.max_tokens:
            self.text += window[len(known) :]  # the last token: what is left goes out as it is

    def result(self) -> GenerationResult:
        return GenerationResult(
            prompt_ids=list(self.req.prompt_ids),
            completion_ids=self.ids,
            logprobs=self.logprobs,
            text=self.text,
            finish_reason=self.finish or "length",
            top_logprobs=self.top,
        )


def check_request(req: GenerationRequest) -> None:
    """Raise ValueError naming every sampling setting of `req` that is out of range."""
    problems = []
    if not req.prompt_ids:
        problems.append("a generation request needs at least one prompt token")
    if not 0 < req.top_p <= 1:
        problems.append(f"top_p must be in (0, 1], got {req.top_p}")
    if req.top_k < 0:
        problems.append(f"top_k must be >= 0 (0: no top-k), got {req.top_k}")
    if not 0 <= req.min_p <= 1:
        problems.append(f"min_p must be in [0, 1], got {req.min_p}")
    if req.repetition_penalty <= 0:
        problems.append(f"repetition_penalty must be > 0 (1: none), got {req.repetition_penalty}")
    if req.logprobs_mode not in ("raw", "processed"):
        problems.append(f"logprobs_mode must be 'raw' or 'processed', got {req.logprobs_mode!r}")
    if problems:
        raise ValueError("; ".join(problems))


def draw_tokens(rows: Sequence[_Row], logits: Any) -> tuple[list[int], list[float], Any]:
    """Every row's next token from the batch's fp32 logits: (tokens, each token's logprob, raw logprobs).

    A greedy row (temperature <= 0) takes the argmax of its (repetition-penalised) logits. A sampled row's
    distribution is softmax(logits / temperature) cut by top-k, min-p and top-p, renormalised, and its token
    is the inverse CDF of that distribution (in vocabulary order) at one uniform number drawn from the row's
    own stream. Every operation is row-wise, so a row's token is a function of its own logits and its own
    stream only: the same seed gives the same tokens whatever the row is batched with, and the draw is one
    pass over the batch (per-row tensor calls cost more than a small model's forward pass). Reported logprobs
    are the raw ones unless the row asked for ``logprobs_mode="processed"``.
    """
    import torch

    reqs = [r.req for r in rows]
    logp = torch.log_softmax(logits, dim=-1)  # row-wise: each row's values equal its batch-1 values
    scores = logits
    if any(q.repetition_penalty != 1.0 for q in reqs):
        scores = logits.clone()
        for i, row in enumerate(rows):
            penalty = row.req.repetition_penalty
            if penalty != 1.0:
                seen = torch.tensor(sorted({*row.req.prompt_ids, *row.ids}), device=logits.device)
                values = scores[i, seen]
                scores[i, seen] = torch.where(values < 0, values * penalty, values / penalty)
    for i, row in enumerate(rows):  # guided decoding: only the tokens the row's guide allows
        if row.req.allowed_tokens is not None:
            allowed = torch.tensor(
                list(row.req.allowed_tokens(row.ids, logits[i])), dtype=torch.long, device=logits.device
            )
            if scores is logits:
                scores = logits.clone()
            scores[i] = torch.full_like(scores[i], float("-inf")).index_copy_(-1, allowed, scores[i][allowed])
    tokens = torch.argmax(scores, dim=-1)
    picked = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    sampled = [i for i, q in enumerate(reqs) if q.temperature > 0]
    if sampled:
        index = torch.tensor(sampled, device=logits.device)
        temperature = torch.tensor([reqs[i].temperature for i in sampled], device=logits.device)
        z = scores[index] / temperature.unsqueeze(-1)
        for slot, i in enumerate(sampled):
            k = reqs[i].top_k
            if 0 < k < z.size(-1):
                z[slot] = z[slot].masked_fill(z[slot] < torch.topk(z[slot], k).values[-1], float("-inf"))
        probs = torch.softmax(z, dim=-1)
        min_p = torch.tensor([reqs[i].min_p for i in sampled], device=logits.device)
        if bool((min_p > 0).any()):
            floor = min_p.unsqueeze(-1) * probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < floor, 0.0)
        nucleus = [slot for slot, i in enumerate(sampled) if reqs[i].top_p < 1.0]
        if nucleus:
            cut = torch.tensor(nucleus, device=logits.device)
            top_p = torch.tensor([reqs[sampled[s]].top_p for s in nucleus], device=logits.device)
            sorted_p, order = torch.sort(probs[cut], descending=True, dim=-1)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            sorted_p[torch.cumsum(sorted_p, dim=-1) - sorted_p >= top_p.unsqueeze(-1)] = 0.0
            probs[cut] = torch.zeros_like(sorted_p).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
        cdf = torch.cumsum(probs, dim=-1)
        total = cdf[:, -1:].contiguous()
        u = torch.tensor([[rows[i].rng.random()] for i in sampled], dtype=cdf.dtype, device=logits.device)
        drawn = torch.searchsorted(cdf, u * total, right=True)
        # u * total may round up to the total itself: that draw belongs to the last token with mass.
        drawn = torch.where(drawn >= cdf.size(-1), torch.searchsorted(cdf, total), drawn).squeeze(-1)
        tokens[index] = drawn
        processed = torch.log(probs.gather(-1, drawn.unsqueeze(-1)).squeeze(-1))
        raw = logp[index].gather(-1, drawn.unsqueeze(-1)).squeeze(-1)
        modes = torch.tensor([reqs[i].logprobs_mode == "processed" for i in sampled], device=logits.device)
        picked[index] = torch.where(modes, processed, raw)
    return tokens.tolist(), picked.tolist(), logp


class LocalEngine:
    """A loaded model plus its batching worker.

    ``model`` and ``tokenizer`` are plain attributes: a trainer may update the weights in place (or assign
    a new model) between steps; each batch reads them when it starts.

    Args:
        model: A transformers causal LM.
        tokenizer: Its tokenizer.
        name: Display name (the model reference).
        batch_wait_ms: How long the worker waits for more requests after the first one of a batch.
        max_batch_size: Most requests decoded together.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        name: str = "local",
        batch_wait_ms: float | None = None,
        max_batch_size: int = MAX_BATCH,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        if batch_wait_ms is None:
            batch_wait_ms = float(os.environ.get("COLAB_GRAPHS_BATCH_WAIT_MS", "5"))
        self.batch_wait_ms = batch_wait_ms
        self.max_batch_size = max_batch_size
        # Callers that announced they may still send a request (a trainer's rollouts that are running but not
        # inside a policy call; see `expecting`): while there are any, the worker keeps collecting for up to
        # `expect_wait_ms`, so a step's turns decode as one batch rather than as several that each pay every
        # decoding step. The wait ends as soon as every announced caller has sent its request (or finished):
        # it is bounded by the slowest rollout's way to its policy turn, which on a loaded machine (a rollout
        # waits on its collaborators' HTTP calls) exceeded the former 100 ms and split one update in four into two
        # batches (load average 16.6, BENCHMARKS.md).
        self.expected = 0
        self.expect_wait_ms = float(os.environ.get("COLAB_GRAPHS_EXPECT_WAIT_MS", "2000"))
        self._expect_lock = threading.Lock()
        self.batches_run = 0
        self.steps = 0  # forward passes of the batch loop (a prompt pass and each decoding step)
        self.cancellations: collections.deque[Cancellation] = collections.deque(maxlen=1024)
        self._queue: queue.Queue[Any] = queue.Queue()
        self._held: collections.deque[Any] = collections.deque()  # taken from the queue, not yet decoded
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()
        # Serialises forward passes of this model (the batch worker and logit-level decoding).
        self.lock = threading.Lock()
        self._rendered: dict[tuple, tuple[Any, tuple[int, ...]]] = {}
        self._render_lock = threading.Lock()

    @property
    def device(self) -> Any:
        return self.model.device

    @property
    def eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(int(v) for v in value)
        return ids

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else min(self.eos_ids, default=0)

    def render(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of ``messages`` rendered with the model's chat template (or the plain fallback).

        Recent renderings are remembered: the rollouts of one GRPO group often send the policy the very same
        messages, and templating plus tokenising costs about as much as decoding a short turn of a tiny model.
        """
        tokenizer = self.tokenizer
        plain = [(m["role"], _content_text(m.get("content"))) for m in messages]
        key = (id(tokenizer), getattr(tokenizer, "chat_template", None), tuple(plain))
        hit = self._rendered.get(key)
        if hit is not None and hit[0] is tokenizer:  # the same tokenizer object, not a reused id
            return list(hit[1])
        ids = self._render(tokenizer, plain)
        with self._render_lock:  # rendering runs on event loops and worker threads alike
            if len(self._rendered) >= _RENDER_CACHE_SIZE:
                self._rendered.pop(next(iter(self._rendered)))  # oldest first (dicts keep insertion order)
            self._rendered[key] = (tokenizer, tuple(ids))
        return ids

    @staticmethod
    def _render(tokenizer: Any, plain: list[tuple[str, str]]) -> list[int]:
        template = None if getattr(tokenizer, "chat_template", None) else FALLBACK_CHAT_TEMPLATE
        text = tokenizer.apply_chat_template(
            [{"role": role, "content": content} for role, content in plain],
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
        )
        # The template already holds any BOS it wants; adding special tokens again would double it.
        return list(tokenizer(text, add_special_tokens=template is not None)["input_ids"])

    @contextlib.contextmanager
    def expecting(self, n: int) -> Iterator[None]:
        """Tell the worker that ``n`` more callers may send requests while the block runs (counts add up;
        a caller about to wait for its own request enters ``expecting(-1)`` so it is not waited for).

        A hint only: it changes how requests are grouped into batches, never what any request generates.
        """
        with self._expect_lock:
            self.expected += n
        try:
            yield
        finally:
            with self._expect_lock:
                self.expected -= n

    def cancel(self, request: GenerationRequest) -> None:
        """Drop `request` at the next step (any thread): its future raises `GenerationCancelled`."""
        if not request.cancelled.is_set():
            request.cancel_step = self.steps
            request.cancelled.set()

    def _dropped(self, request: GenerationRequest, tokens: int) -> None:
        step = request.cancel_step if request.cancel_step is not None else self.steps
        self.cancellations.append(Cancellation(step, self.steps, tokens))

    def submit(self, request: GenerationRequest) -> Future[GenerationResult]:
        """Queue a request from any thread; the future resolves when its batch finishes."""
        self._ensure_worker()
        future: Future[GenerationResult] = Future()
        self._queue.put((request, future))
        return future

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        """Queue a request and await it without blocking the event loop."""
        return await asyncio.wrap_future(self.submit(request))

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Queue a request and wait for it (batched with whatever else is queued)."""
        return self.submit(request).result()

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(
                    target=self._serve, name=f"local-engine:{self.name}", daemon=True
                )
                self._worker.start()

    def close(self, wait_s: float = 60.0) -> None:
        """Stop the worker thread after the queued requests, so the model can be freed; wait up to `wait_s` for
        it to end.

        Waiting matters at exit: a worker still ending when the interpreter finalizes frees its tensors
        there, and torch's deallocator, retaking the GIL from a daemon thread at that moment, aborts the whole
        process ("terminate called without an active exception") after everything else succeeded.
        """
        with self._start_lock:
            worker, self._worker = self._worker, None
            if worker is not None and worker.is_alive():
                self._queue.put(_STOP)
        if worker is not None and worker is not threading.current_thread():
            worker.join(wait_s)

    def _next(self, timeout: float | None = None) -> Any:
        """The oldest waiting item (one a running batch could not take comes first); `queue.Empty` when none
        comes within `timeout` (0: do not wait)."""
        if self._held:
            return self._held.popleft()
        if timeout is not None and timeout <= 0:
            return self._queue.get_nowait()
        return self._queue.get(timeout=timeout)

    def _serve(self) -> None:
        while True:
            first = self._next()
            if first is _STOP:
                return
            batch = [first]
            started = time.monotonic()
            while len(batch) < self.max_batch_size:
                wait_ms = self.batch_wait_ms
                hinted = self.expected > 0
                if hinted:
                    wait_ms = max(wait_ms, self.expect_wait_ms)
                left = started + wait_ms / 1000 - time.monotonic()
                # While hinted, look at the hint again every 2 ms: the callers it counts may finish instead.
                timeout = min(left, 0.002) if hinted else left
                try:
                    item = self._next(timeout)
                except queue.Empty:
                    if hinted and left > 0.002:
                        continue
                    break
                if item is _STOP:
                    self._queue.put(_STOP)  # finish this batch first, then stop
                    break
                batch.append(item)
            live = [(req, fut) for req, fut in batch if self._starts(req, fut)]
            if not live:
                continue
            streams = _Streams([req for req, _ in live])

            def admit(
                fits: Callable[[GenerationRequest], bool],
                room: int,
                live: list[tuple[GenerationRequest, Future[GenerationResult]]] = live,
                streams: _Streams = streams,
            ) -> list[GenerationRequest]:
                joined = self._admit(fits, room)
                for req, _ in joined:
                    streams.add(req)
                live.extend(joined)
                return [req for req, _ in joined]

            def finished(index: int, result: GenerationResult, live: list[Any] = live) -> None:
                fut = live[index][1]
                if result.finish_reason == "cancelled":
                    fut.set_exception(GenerationCancelled("the request was cancelled while it decoded"))
                else:
                    fut.set_result(result)

            try:
                self.generate_batch([req for req, _ in live], admit, finished)
            except BaseException as exc:
                left = [(req, fut) for req, fut in live if not fut.done()]  # the ones that had not finished
                if len(left) == 1:
                    left[0][1].set_exception(exc)
                elif left:
                    self._decode_alone(left, streams)
                continue
            finally:
                streams.restore()

    def _starts(self, req: GenerationRequest, fut: Future[GenerationResult]) -> bool:
        """Whether a queued request is to be decoded (else its future is settled here)."""
        if not fut.set_running_or_notify_cancel():
            return False
        if req.cancelled.is_set():  # cancelled while it waited: never decoded
            self._dropped(req, 0)
            fut.set_exception(GenerationCancelled("the request was cancelled before it was decoded"))
            return False
        return True

    def _admit(
        self, fits: Callable[[GenerationRequest], bool], room: int
    ) -> list[tuple[GenerationRequest, Future[GenerationResult]]]:
        """Waiting requests a running batch takes now, oldest first, up to `room`. One that does not `fit`
        waits at the head of the line for the next batch, and the ones behind it that fit still join: a
        request too long for this batch does not hold back the short ones (the first `_SCAN` are looked at)."""
        joined: list[tuple[GenerationRequest, Future[GenerationResult]]] = []
        skipped: list[Any] = []
        while len(joined) < room and len(skipped) < _SCAN:
            try:
                item = self._next(0)
            except queue.Empty:
                break
            if item is _STOP:
                skipped.append(item)
                break
            if not fits(item[0]):
                skipped.append(item)
                continue
            req, fut = item
            try:
                check_request(req)
            except ValueError as exc:
                if fut.set_running_or_notify_cancel():
                    fut.set_exception(exc)
                continue
            if self._starts(req, fut):
                joined.append((req, fut))
        self._held.extendleft(reversed(skipped))
        return joined

    def _decode_alone(self, live: list[tuple[GenerationRequest, Future]], streams: _Streams) -> None:
        """After a batch failed, decode each of its requests by itself: the one that fails fails alone.

        A streaming request's client already has the text streamed before the failure; its retry sends only
        what follows, and fails if it does not repeat that text (greedy and seeded requests repeat it).
        """
        for req, fut in live:
            with streams.replaying(req):
                try:
                    fut.set_result(self.generate_batch([req])[0])
                except BaseException as exc:  # this request's own failure
                    fut.set_exception(exc)

    def generate_batch(
        self,
        requests: Sequence[GenerationRequest],
        admit: Callable[[Callable[[GenerationRequest], bool], int], list[GenerationRequest]] | None = None,
        finished: Callable[[int, GenerationResult], None] | None = None,
    ) -> list[GenerationResult]:
        """Decode ``requests`` together right now, in the calling thread.

        `admit` (the worker's) is asked before every step for requests that join the running batch, as
        vLLM's scheduler lets them: each is given a prompt pass of its own, and its keys and values are
        written into the batch's cache so that its prompt ends where the batch's columns end (left padding,
        as the batch's own rows have). Results come back for `requests` and then the joined ones, in the
        order they joined; `finished` is called with each row's index and result as the row ends (a short
        reply does not wait for the longest of its batch). A request joins when its prompt is no longer than the
        batch's columns (the requests that join at one step share one prompt pass, and the cache grows when their
        ``max_tokens`` need more room); a model whose cache is not the preallocated one takes none.
        """
        import torch

        for req in requests:
            check_request(req)
        with self.lock, torch.inference_mode(), decoding_threads():
            self.batches_run += 1
            eos_ids = frozenset(self.eos_ids)
            rows = [_Row(req, self, eos_ids) for req in requests]
            model, device = self.model, self.device
            cache_name = cache_kwarg(model)
            most = max(r.max_tokens for r in requests)
            plan = plan_shared_prefixes([r.prompt_ids for r in requests])
            shared = preallocated_cache(model, plan.width + most) if plan is not None else None
            if plan is not None and shared is not None:
                width = plan.width
                capacity = width + most
                logits, mask, next_pos = self._shared_pass(model, cache_name, shared, plan)
                full_mask = torch.ones((len(rows), capacity), dtype=torch.long, device=device)
                full_mask[:, :width] = mask
                cache = shared
            else:
                width = max(len(r.prompt_ids) for r in requests)
                # The mask for every position the batch can reach, filled once: a step passes a prefix (a view).
                capacity = width + most
                input_ids, mask = _left_padded([r.prompt_ids for r in requests], width, self.pad_id)
                full_mask = torch.ones((len(rows), capacity), dtype=torch.long)
                full_mask[:, :width] = mask
                input_ids, full_mask = input_ids.to(device), full_mask.to(device)
                # Left padding: positions must count real tokens only, or padded rows see shifted positions.
                positions = (full_mask[:, :width].cumsum(-1) - 1).clamp(min=0)
                kwargs = prefill_kwargs(model, cache_name, capacity)
                out = model(
                    input_ids=input_ids,
                    attention_mask=full_mask[:, :width],
                    position_ids=positions,
                    use_cache=True,
                    **kwargs,
                )
                cache, logits = output_cache(out), out.logits[:, -1, :].float()
                next_pos = positions[:, -1:] + 1
            self.steps += 1
            active = list(range(len(rows)))
            length = width
            layer_class = _preallocated_layer_class()
            joinable = admit is not None and all(
                type(x) is layer_class for x in getattr(cache, "layers", [0])
            )
            while True:
                if joinable and admit is not None and len(active) < self.max_batch_size:

                    def fits(req: GenerationRequest, length: int = length) -> bool:
                        return len(req.prompt_ids) <= length

                    joined = admit(fits, self.max_batch_size - len(active))
                    if joined:
                        # Room for the longest joiner's reply: the buffers grow (the filled columns copied once)
                        # rather than leaving it to a later batch with a tail of its own.
                        room = length + max(req.max_tokens for req in joined)
                        if room > capacity:
                            for layer in cache.layers:
                                layer.grow(room)
                            grown = torch.ones(
                                (len(active), room - capacity), dtype=torch.long, device=device
                            )
                            full_mask, capacity = torch.cat([full_mask, grown], dim=1), room
                        own_logits, own_mask = self._join(model, cache, joined, length)
                        logits = torch.cat([logits, own_logits])
                        mask = torch.ones((len(joined), capacity), dtype=torch.long, device=device)
                        mask[:, : length - own_mask.shape[1]] = 0
                        mask[:, length - own_mask.shape[1] : length] = own_mask
                        for req in joined:
                            rows.append(_Row(req, self, eos_ids))
                            active.append(len(rows) - 1)
                        full_mask = torch.cat([full_mask, mask])
                        pos = torch.tensor(
                            [[len(r.prompt_ids)] for r in joined], dtype=next_pos.dtype, device=device
                        )
                        next_pos = torch.cat([next_pos, pos])
                tokens, picked, logps = draw_tokens([rows[i] for i in active], logits)
                for slot, idx in enumerate(active):
                    rows[idx].record(tokens[slot], picked[slot], logps[slot])
                    rows[idx].update(tokens[slot])
                    if rows[idx].finish is None and rows[idx].req.cancelled.is_set():
                        rows[idx].finish = "cancelled"  # its client left: dropped below, like a finished row
                        self._dropped(rows[idx].req, len(rows[idx].ids))
                keep = [slot for slot, idx in enumerate(active) if rows[idx].finish is None]
                if finished is not None:
                    for idx in active:
                        if rows[idx].finish is not None:
                            finished(idx, rows[idx].result())
                if not keep:
                    break
                if len(keep) < len(active):
                    # Drop finished rows from the batch so they cost nothing in later steps.
                    index = torch.tensor(keep, device=device)
                    cache.batch_select_indices(index)
                    full_mask, next_pos = full_mask[index], next_pos[index]
                    active = [active[s] for s in keep]
                    tokens = [tokens[s] for s in keep]
                length += 1
                out = model(
                    input_ids=torch.tensor(tokens, device=device).unsqueeze(-1),
                    attention_mask=full_mask[:, :length],
                    position_ids=next_pos,
                    use_cache=True,
                    **{cache_name: cache},
                )
                cache, logits = output_cache(out), out.logits[:, -1, :].float()
                self.steps += 1
                next_pos = next_pos + 1
        return [row.result() for row in rows]

    def _join(
        self, model: Any, cache: Any, joined: Sequence[GenerationRequest], length: int
    ) -> tuple[Any, Any]:
        """One prompt pass of the `joined` requests together (left-padded among themselves, as a batch's own
        prompts are, or sharing their prefixes: `colab_graphs.local.prefix`), their keys and values written
        into the batch's `cache` (every layer a preallocated one) as new rows whose prompts end at column
        `length`; returns their next-token logits and their mask over the columns they filled."""
        prompts = [req.prompt_ids for req in joined]
        plan = plan_shared_prefixes(prompts)
        own = preallocated_cache(model, plan.width) if plan is not None and plan.width <= length else None
        if plan is not None and own is not None:
            logits, mask, _ = self._shared_pass(model, cache_kwarg(model), own, plan)
            layers = own.layers
        else:
            out, mask = self._padded_pass(model, prompts)
            logits, layers = out.logits[:, -1, :].float(), output_cache(out).layers
        self.steps += 1
        # (A padded column's keys and values are copied too; the row's mask hides them, as it hides the zeros.)
        for layer, mine in zip(cache.layers, layers, strict=True):
            layer.add_rows(mine.keys, mine.values, length - mask.shape[1])
        return logits, mask

    def _shared_pass(
        self, model: Any, cache_name: str, cache: Any, plan: SharedPrefixes
    ) -> tuple[Any, Any, Any]:
        """The prompt pass `plan` lays out (`colab_graphs.local.prefix`) into `cache`, an empty preallocated
        one: the distinct prefixes in one pass, their keys and values copied to the rows that share them, then
        every row's suffix in a second pass against them. Returns the next-token logits, the rows' mask over
        the ``plan.width`` columns and each row's next position (its prompt's length)."""
        import torch

        device = self.device
        prefix_width, suffix_width = plan.prefix_width, plan.suffix_width
        out, _ = self._padded_pass(model, plan.prefixes)
        # Row i takes its prefix's keys and values; a row that shares none takes zeros (its mask hides them).
        pick = torch.tensor([g if g >= 0 else len(plan.prefixes) for g in plan.group], device=device)
        for layer, own in zip(cache.layers, output_cache(out).layers, strict=True):
            keys = torch.cat([own.keys, own.keys.new_zeros((1, *own.keys.shape[1:]))])
            values = torch.cat([own.values, own.values.new_zeros((1, *own.values.shape[1:]))])
            layer.update(keys.index_select(0, pick), values.index_select(0, pick))
        rows = len(plan.suffixes)
        ids = torch.full((rows, suffix_width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((rows, prefix_width + suffix_width), dtype=torch.long)
        positions = torch.zeros((rows, suffix_width), dtype=torch.long)
        for i, suffix in enumerate(plan.suffixes):
            before, n = plan.prefix_length(i), len(suffix)
            mask[i, prefix_width - before : prefix_width] = 1
            mask[i, prefix_width + suffix_width - n :] = 1
            ids[i, suffix_width - n :] = torch.tensor(suffix)
            positions[i, suffix_width - n :] = torch.arange(before, before + n)
        ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{cache_name: cache},
            **_last_logits(model),
        )
        return out.logits[:, -1, :].float(), mask, positions[:, -1:] + 1

    def _padded_pass(self, model: Any, prompts: Sequence[Sequence[int]]) -> tuple[Any, Any]:
        """One forward pass of `prompts` left-padded to the longest (the model's own cache, the last logits):
        its output and the prompts' mask."""
        ids, mask = _left_padded(prompts, max(len(p) for p in prompts), self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            **_last_logits(model),
        )
        return out, mask


def _left_padded(prompts: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[Any, Any]:
    """`prompts` as one (rows, width) tensor padded on the left with `pad_id`, and its mask."""
    import torch

    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        if prompt:
            ids[i, width - len(prompt) :] = torch.tensor(list(prompt))
            mask[i, width - len(prompt) :] = 1
    return ids, mask


def _last_logits(model: Any) -> dict[str, Any]:
    """Ask a prompt pass for the last position's logits only, where the model's forward can be asked."""
    return {"logits_to_keep": 1} if "logits_to_keep" in _forward_params(_unbound(model.forward)) else {}


class _Streams:
    """The text each streaming request of a batch has emitted (see `LocalEngine._decode_alone`)."""

    def __init__(self, requests: Sequence[GenerationRequest]) -> None:
        self.sinks: dict[int, tuple[GenerationRequest, Callable[[str], None]]] = {}
        self.sent: dict[int, list[str]] = {}
        for req in requests:
            self.add(req)

    @staticmethod
    def _recorder(sent: list[str], sink: Callable[[str], None]) -> Callable[[str], None]:
        def record(piece: str) -> None:
            sent.append(piece)
            sink(piece)

        return record

    def add(self, req: GenerationRequest) -> None:
        """Record the text of a request that joined the batch while it ran."""
        if req.on_text is not None:
            self.sinks[id(req)] = (req, req.on_text)
            self.sent[id(req)] = []
            req.on_text = self._recorder(self.sent[id(req)], req.on_text)

    def restore(self) -> None:
        for req, sink in self.sinks.values():
            req.on_text = sink

    @contextlib.contextmanager
    def replaying(self, req: GenerationRequest) -> Iterator[None]:
        if id(req) not in self.sinks or not self.sent[id(req)]:
            yield
            return
        sink, before = self.sinks[id(req)][1], "".join(self.sent[id(req)])
        seen = [""]

        def replay(piece: str) -> None:
            done = seen[0]
            seen[0] = now = done + piece
            common = min(len(now), len(before))
            if now[:common] != before[:common]:
                raise RuntimeError("a streamed request failed with its batch and its retry wrote other text")
            if len(now) > len(before):
                sink(now[max(len(before), len(done)) :])

        req.on_text = replay
        try:
            yield
        finally:
            req.on_text = sink


@contextlib.contextmanager
def decoding_threads() -> Iterator[int]:
    """Run a batch with ``COLAB_GRAPHS_LOCAL_THREADS=N`` intra-op threads when that is set, then restore.

    Unset, a batch uses torch's own count (one per core). Some matmuls round differently with another thread
    count, so only a fixed count makes logprobs repeat to the last bit from run to run (greedy tokens matched
    either way in every test). Measured on 2 cores with passive waits (`bench/wait_policy.py`), fewer threads
    never paid: 2 threads beat 1 by 1.25-1.35x at a load average of 3 and tied at 7, so the count does not
    follow the load average (an earlier version did; the average lags a minute, so a quiet machine just after
    a finished job decoded on one thread, 0.72x at batch 8).
    """
    import torch

    ceiling = torch.get_num_threads()
    fixed = os.environ.get(THREADS_ENV)
    threads = max(1, int(fixed)) if fixed else ceiling
    if threads != ceiling:
        torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        if threads != ceiling:
            torch.set_num_threads(ceiling)


def cache_kwarg(model: Any) -> str:
    """Name of the KV-cache argument of ``model.forward`` (``cache`` from transformers 5.2x on)."""
    return "cache" if "cache" in _forward_params(_unbound(model.forward)) else "past_key_values"


def _unbound(forward: Callable[..., Any]) -> Callable[..., Any]:
    return getattr(forward, "__func__", forward)


def prefill_kwargs(model: Any, cache_name: str, capacity: int) -> dict[str, Any]:
    """Extra arguments of a batch's prompt pass: only the last position's logits, and a KV cache that holds
    ``capacity`` positions without growing.

    Both change no number a request gets: the logits of the other prompt positions are never read (computing
    them costs a vocabulary-sized matmul per prompt token), and the cache stores the same keys and values that
    concatenation would, in place.
    """
    kwargs = _last_logits(model)
    cache = preallocated_cache(model, capacity)
    if cache is not None:
        kwargs[cache_name] = cache
    return kwargs


@functools.lru_cache(maxsize=64)
def _forward_params(forward: Callable[..., Any]) -> frozenset[str]:
    """The parameter names of a model's forward; keyed on the function itself (a trainer may wrap an instance's
    forward), so each is inspected once, not per batch."""
    import inspect

    return frozenset(inspect.signature(forward).parameters)


def preallocated_cache(model: Any, capacity: int) -> Any | None:
    """A transformers ``DynamicCache`` whose full-attention layers write into buffers of ``capacity``
    positions, or None where the model brings its own kind of cache.

    ``DynamicCache`` concatenates each step's keys and values onto the whole cache: a copy of the batch's
    cache per layer per token, growing with the context. These layers hand attention a view of the filled
    prefix of a buffer instead: the same values, the same shape. Sliding-window layers keep theirs.
    """
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    config = getattr(model, "config", None)
    if config is None or (supports is not None and not supports()):
        return None
    from transformers.cache_utils import DynamicCache, DynamicLayer

    text_config = config.get_text_config(decoder=True)
    cache = DynamicCache(config=text_config)
    if not cache.layers:  # no layer structure in the config: let the model build its cache
        return None
    layer_class = _preallocated_layer_class()
    cache.layers = [layer_class(capacity) if type(x) is DynamicLayer else x for x in cache.layers]
    return cache


@functools.cache
def _preallocated_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A ``DynamicLayer`` backed by buffers of a fixed number of positions (see `preallocated_cache`).

        It serves the engine's decode loop: appending, dropping finished rows, resetting.
        """

        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity = capacity
            self.length = 0

        def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
            import torch

            batch, heads, _, _ = key_states.shape
            shape = (batch, heads, self.capacity)
            self.key_buffer = torch.empty(
                (*shape, key_states.shape[-1]), dtype=key_states.dtype, device=key_states.device
            )
            self.value_buffer = torch.empty(
                (*shape, value_states.shape[-1]), dtype=value_states.dtype, device=value_states.device
            )
            self.device = key_states.device
            self.is_initialized = True

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start, added = self.length, key_states.shape[-2]
            if start + added > self.capacity:
                raise RuntimeError(f"KV cache of {self.capacity} positions asked to hold {start + added}")
            # narrow + copy_: the fewest tensor calls per layer per token (this runs 2 x layers times a step)
            self.key_buffer.narrow(2, start, added).copy_(key_states)
            self.value_buffer.narrow(2, start, added).copy_(value_states)
            self.length = start + added
            self.keys = self.key_buffer.narrow(2, 0, self.length)
            self.values = self.value_buffer.narrow(2, 0, self.length)
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def reset(self) -> None:
            self.length = 0
            super().reset()

        def grow(self, capacity: int) -> None:
            """Hold ``capacity`` positions (more than now): new buffers, the filled columns copied."""
            if self.is_initialized:
                for name in ("key_buffer", "value_buffer"):
                    old = getattr(self, name)
                    new = old.new_empty((*old.shape[:2], capacity, old.shape[-1]))
                    new.narrow(2, 0, self.length).copy_(old.narrow(2, 0, self.length))
                    setattr(self, name, new)
                self.keys = self.key_buffer.narrow(2, 0, self.length)
                self.values = self.value_buffer.narrow(2, 0, self.length)
            self.capacity = capacity

        def add_rows(self, keys: Any, values: Any, start: int) -> None:
            """New batch rows whose keys and values fill columns ``start`` to ``start + len`` (zeros before:
            the row's mask hides them, as it hides a padded row's)."""
            import torch

            added = keys.shape[-2]
            key_row = self.key_buffer.new_zeros((keys.shape[0], *self.key_buffer.shape[1:]))
            value_row = self.value_buffer.new_zeros((values.shape[0], *self.value_buffer.shape[1:]))
            key_row.narrow(2, start, added).copy_(keys)
            value_row.narrow(2, start, added).copy_(values)
            self.key_buffer = torch.cat([self.key_buffer, key_row])
            self.value_buffer = torch.cat([self.value_buffer, value_row])
            self.keys = self.key_buffer.narrow(2, 0, self.length)
            self.values = self.value_buffer.narrow(2, 0, self.length)

        def batch_select_indices(self, indices: Any) -> None:
            if self.is_initialized:
                self.key_buffer = self.key_buffer[indices]
                self.value_buffer = self.value_buffer[indices]
                self.keys = self.key_buffer.narrow(2, 0, self.length)
                self.values = self.value_buffer.narrow(2, 0, self.length)

    return PreallocatedLayer


def output_cache(out: Any) -> Any:
    """The KV cache of a forward output, under either of its transformers names."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _content_text(content: Any) -> str:
    """Message content as text: strings pass, OpenAI content parts are joined, None is empty."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)
