"""Never a silent hang: what a play is waiting for, its deadline, and a watchdog over a whole audit.

- `PlayWatch`: one play (one coalition on one example): the graph nodes running in it (an app's, seen through
  LangGraph's callbacks: `node_tracker`) and the model calls it waits for (`pending_call`, entered by the
  call path and the chat models, whichever run waits, the owner of a call or a run waiting for another's).
  `waiting_for()` says it in words: "node 'work' (3 running, for 5.0 s); calls pending: member 'a' at node
  'work' (for 4.9 s)".
- The deadline (`colab_graphs.runner.run_example(..., timeout_s=)`): a play not finished within it is
  cancelled and fails (a `CallError` of kind "deadline") with a message that names what it was waiting for; the example is then reported
  as failed, not scored. A sync node that never returns cannot be stopped (Python cannot stop a thread): it
  is abandoned to its thread (see `colab_graphs.models.loops.DaemonThreads`), the audit goes on.
- `Watchdog`: a thread that watches every play of an audit in flight; when no call and no node has finished
  for `stall_s` seconds it logs (logger "colab_graphs", so stderr by default) what each play waits for, and
  again while the stall lasts at doubling intervals (`stall_s`, 2x, 4x, ... capped at 16x): a long stall is
  a few reports, not a flood. Progress is the process's: a call or node that finishes in any play (another
  audit's, in a study that plays its settings side by side on one endpoint) is progress for every watchdog,
  so plays queued behind others' calls are not reported as stalled while calls go on. Being a thread it
  reports even when the event loop itself is blocked (an async node doing blocking work), and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

logger = logging.getLogger("colab_graphs")

APP_EXAMPLE_TIMEOUT_S = 600.0
"""An app's plays' deadline unless told otherwise (`--example-timeout`); protocol plays have none by default."""
STALL_S = 60.0
"""The watchdog's default: report when no call and no node has finished for this long."""


_progress_at = [time.monotonic()]
"""When a call or a node last finished in any watched play of this process (see `Watchdog`)."""


def _progressed() -> None:
    _progress_at[0] = time.monotonic()


class PlayWatch:
    """What one play is doing: its running nodes and pending calls (thread-safe: sync nodes report too)."""

    def __init__(self, label: str, watchdog: Watchdog | None = None):
        self.label = label
        self.watchdog = watchdog
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._nodes: dict[Any, tuple[str, float]] = {}
        self._calls: dict[int, tuple[str | None, str, float]] = {}

    def node_started(self, key: Any, name: str) -> None:
        with self._lock:
            self._nodes[key] = (name, time.monotonic())

    def node_finished(self, key: Any) -> None:
        with self._lock:
            found = self._nodes.pop(key, None)
        if found is not None:
            _progressed()
            if self.watchdog is not None:
                self.watchdog.progress()

    def call_started(self, node: str | None, member: str) -> int:
        key = next(self._ids)
        with self._lock:
            self._calls[key] = (node, member, time.monotonic())
        return key

    def call_finished(self, key: int) -> None:
        with self._lock:
            self._calls.pop(key, None)
        _progressed()
        if self.watchdog is not None:
            self.watchdog.progress()

    def waiting_for(self) -> str:
        """The running nodes and the pending calls, in words (longest waiting first)."""
        now = time.monotonic()
        with self._lock:
            nodes, calls = list(self._nodes.values()), list(self._calls.values())
        by_node: dict[str, list[float]] = {}
        for name, since in nodes:
            by_node.setdefault(name, []).append(since)
        running = []
        for name, times in sorted(by_node.items(), key=lambda item: min(item[1])):
            count = f"{len(times)} running, " if len(times) > 1 else ""
            running.append(f"node {name!r} ({count}for {now - min(times):.1f} s)")
        pending = [
            f"member {member!r}" + (f" at node {node!r}" if node else "") + f" (for {now - since:.1f} s)"
            for node, member, since in sorted(calls, key=lambda call: call[2])
        ]
        nodes_text = "running " + ", ".join(running) if running else "no node running"
        calls_text = "calls pending: " + ("; ".join(pending) if pending else "none")
        return f"{nodes_text}; {calls_text}"


class DeadlinePassed(Exception):
    """A play's deadline passed; `waiting` is what it was waiting for then (`PlayWatch.waiting_for`)."""

    def __init__(self, timeout_s: float, waiting: str):
        super().__init__(f"did not finish within {timeout_s:g} s (the example timeout): {waiting}")
        self.timeout_s = timeout_s
        self.waiting = waiting


async def within(timeout_s: float | None, watch: PlayWatch, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`, cancelled after `timeout_s` (None: no deadline) with `DeadlinePassed`, which says what
    `watch` was waiting for the moment the deadline passed (before the cancellation unwinds it)."""
    if timeout_s is None:
        return await awaitable
    task = asyncio.current_task()
    assert task is not None
    waiting: list[str] = []

    def expire() -> None:
        waiting.append(watch.waiting_for())
        task.cancel()

    handle = asyncio.get_running_loop().call_later(timeout_s, expire)
    try:
        result = await awaitable
    except asyncio.CancelledError:
        if waiting and task.uncancel() == 0:
            raise DeadlinePassed(timeout_s, waiting[0]) from None
        raise
    finally:
        handle.cancel()
    if waiting:  # the cancellation was swallowed on the way: it is ours, taken back
        task.uncancel()
    return result


_watch: ContextVar[PlayWatch | None] = ContextVar("colab_graphs_play_watch", default=None)
_in_call: ContextVar[bool] = ContextVar("colab_graphs_in_watched_call", default=False)


@contextlib.contextmanager
def watching(watch: PlayWatch) -> Iterator[PlayWatch]:
    """Make `watch` the play that calls made here (and in the tasks and threads started here) belong to."""
    token = _watch.set(watch)
    if watch.watchdog is not None:
        watch.watchdog.add(watch)
    try:
        yield watch
    finally:
        _watch.reset(token)
        if watch.watchdog is not None:
            watch.watchdog.remove(watch)


def current_watch() -> PlayWatch | None:
    return _watch.get()


@contextlib.contextmanager
def pending_call(node: str | None, member: str) -> Iterator[None]:
    """Count a call as pending in the current play while this block runs (once: a call path entered from
    within another's block, as a chat model's call reaching the client, is the same call)."""
    watch = _watch.get()
    if watch is None or _in_call.get():
        yield
        return
    token = _in_call.set(True)
    key = watch.call_started(node, member)
    try:
        yield
    finally:
        watch.call_finished(key)
        _in_call.reset(token)


def node_path(name: str, metadata: dict[str, Any]) -> str:
    """A node's name with the (sub)graph nodes it runs in: "research_agent > tools"."""
    namespace = str(metadata.get("checkpoint_ns") or "")
    outer = [part.split(":")[0] for part in namespace.split("|") if part] if namespace else []
    if outer and outer[-1] == name:
        outer = outer[:-1]
    return " > ".join([*outer, name])


_tracker_class: type | None = None


def node_tracker(watch: PlayWatch) -> Any:
    """A LangChain callback handler that tells `watch` which LangGraph nodes start and finish (run inline, on
    the thread that runs the node: no executor thread is needed to report)."""
    global _tracker_class
    if _tracker_class is None:
        from langchain_core.callbacks import BaseCallbackHandler

        class NodeTracker(BaseCallbackHandler):
            run_inline = True

            def __init__(self, watch: PlayWatch):
                self.watch = watch

            def on_chain_start(
                self, serialized: Any, inputs: Any, *, run_id: Any, metadata: Any = None, **kwargs: Any
            ) -> None:
                name = kwargs.get("name")
                node = (metadata or {}).get("langgraph_node")
                if name and name == node and name != "__start__":
                    self.watch.node_started(run_id, node_path(name, metadata))

            def on_chain_end(self, outputs: Any, *, run_id: Any, **kwargs: Any) -> None:
                self.watch.node_finished(run_id)

            def on_chain_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
                self.watch.node_finished(run_id)

        _tracker_class = NodeTracker
    return _tracker_class(watch)


class Watchdog:
    """Reports a stalled audit (module docstring): `report` gets the text (default: a warning on the
    "colab_graphs" logger). Use as a context manager around the audit's plays."""

    def __init__(
        self,
        stall_s: float = STALL_S,
        report: Callable[[str], None] | None = None,
        loop: Any = None,
    ):
        if stall_s <= 0:
            raise ValueError(f"the watchdog's stall time must be > 0 seconds, got {stall_s}")
        self.stall_s = stall_s
        self.report = report or (lambda text: logger.warning("%s", text))
        self.loop = loop
        self.reports = 0
        self._plays: set[PlayWatch] = set()
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def progress(self) -> None:
        self._last = time.monotonic()

    def add(self, watch: PlayWatch) -> None:
        with self._lock:
            self._plays.add(watch)

    def remove(self, watch: PlayWatch) -> None:
        with self._lock:
            self._plays.discard(watch)
        self.progress()

    def __enter__(self) -> Watchdog:
        self._last = self._beat = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="colab-graphs-watchdog", daemon=True)
        self._thread.start()
        if self.loop is not None:
            self.loop.call_soon(self._heartbeat)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _heartbeat(self) -> None:
        """On the audit's loop: says the loop runs (a blocked loop stops beating)."""
        self._beat = time.monotonic()
        if not self._stop.is_set() and self.loop is not None:
            self.loop.call_later(min(1.0, self.stall_s / 4), self._heartbeat)

    MAX_BACKOFF = 16
    """Repeated reports of one stall wait `stall_s` times 1, 2, 4, ... up to this factor."""

    def _watch(self) -> None:
        reported = 0.0
        wait = self.stall_s  # until the next report of this stall
        while not self._stop.wait(min(1.0, self.stall_s / 4)):
            now = time.monotonic()
            idle = now - max(self._last, _progress_at[0])
            if idle < self.stall_s:
                wait = self.stall_s  # progress: a new stall is reported after stall_s again
                continue
            if now - reported < wait:
                continue
            with self._lock:
                plays = sorted(self._plays, key=lambda w: w.started)
            if not plays:
                continue
            if reported and now - reported < 2 * wait:  # the same stall, reported before: back off
                wait = min(wait * 2, self.stall_s * self.MAX_BACKOFF)
            reported = now
            self.reports += 1
            self.report(self.describe(plays, idle, now))

    def describe(self, plays: list[PlayWatch], idle: float, now: float) -> str:
        lines = [f"stalled: no call and no node has finished for {idle:.1f} s; {len(plays)} play(s) waiting:"]
        if self.loop is not None and now - self._beat > self.stall_s / 2:
            lines.append(
                f"  the event loop itself has not run for {now - self._beat:.1f} s: an async node or tool "
                "doing blocking work (time.sleep, a sync client, waiting on a lock) holds it"
            )
        shown = plays[:10]
        lines += [f"  {w.label}: {w.waiting_for()}" for w in shown]
        if len(plays) > len(shown):
            lines.append(f"  ... and {len(plays) - len(shown)} more")
        return "\n".join(lines)
