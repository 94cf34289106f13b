"""Where blocking work runs, so that a model call never waits for a thread that a waiting sync node holds.

A LangGraph app's sync nodes and sync tools run in their event loop's default executor (LangGraph's
`run_in_executor(None, ...)`); a sync node that calls a model (`llm.invoke`, `llm.stream`, `llm.batch`)
blocks its thread until the call is done. `litellm.acompletion` itself needs a thread of the running loop's
default executor for every call (it runs its sync `completion()` there). Were both the same pool (asyncio's
default has min(32, cpu + 4) threads: 6 on two cores), enough sync nodes waiting at once would hold every
thread their own calls need: a deadlock.

So the two never share a pool:

- `call_loop()`: one event loop in a daemon thread of its own, with its own executor, where every model call
  runs, through LiteLLM or the direct lane (`on_call_loop`, used by `ModelClient`). Nothing else runs there:
  its threads are busy only with LiteLLM's own short sync work (and the direct lane's DNS look-ups and one
  price look-up per model), never with a node waiting for a reply. One loop for every call also keeps
  per-loop state (LiteLLM's logging worker and HTTP clients, the direct lane's session) on one loop, whatever
  loops callers use.
- `DaemonThreads`: the executor that loops this package runs (`run_loop`, the CLI's; the background loop of
  the sync API) hand sync nodes to. It grows as work arrives (up to `max_workers`, more work waits), and its
  daemon threads never hold the process at exit: a node stalled past its deadline (see `colab_graphs.watch`)
  is abandoned, not waited for.

The call loop's logging worker (LiteLLM's) is stopped, its HTTP clients and sessions closed and the loop
closed at exit (`_close_call_loop`), so nothing is left pending ("Task was destroyed but it is pending!",
"Unclosed client session").
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import inspect
import queue
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from colab_graphs import otel

T = TypeVar("T")

SYNC_THREADS = 256
"""Threads a loop run by this package gives sync nodes and tools at most (`DaemonThreads`); more wait."""


class DaemonThreads(concurrent.futures.ThreadPoolExecutor):
    """A thread pool of daemon threads, started as work arrives up to `max_workers` at once (more work waits
    its turn), each ending after `idle_s` without work.

    Unlike `ThreadPoolExecutor`'s, its threads never hold the process at exit, and `shutdown` never waits for a
    job still running: a job that never returns (a sync node waiting forever, abandoned at its deadline) is
    left to its thread. (A `ThreadPoolExecutor` by type only, as `loop.set_default_executor` requires: none of
    its machinery is used.)
    """

    def __init__(  # (ThreadPoolExecutor's __init__ is deliberately not called)
        self, max_workers: int = SYNC_THREADS, name: str = "colab-graphs-sync", idle_s: float = 30.0
    ):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self.name = name
        self.idle_s = idle_s
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._alive = 0  # started and not ended
        self._idle = 0  # of those, the ones not running a job
        self._queued = 0  # jobs not taken yet
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future: _Job[T] = _Job()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queued += 1
            self._jobs.put((future, fn, args, kwargs))
            if self._queued > self._idle and self._alive < self.max_workers:
                self._alive += 1
                self._idle += 1
                threading.Thread(target=self._work, name=f"{self.name}-{self._alive}", daemon=True).start()
        return future

    @property
    def threads(self) -> int:
        """Threads alive now."""
        return self._alive

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._queued <= self._idle - 1:  # the other idle threads take what is queued
                        self._idle -= 1
                        self._alive -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            if job is None:  # shutdown
                with self._lock:
                    self._alive -= 1
                return
            future, fn, args, kwargs = job
            del job
            result: Any = None
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                    future.set_exception(exc)
                else:
                    if future.abandoned and inspect.iscoroutine(result):
                        # Nobody will await it (LiteLLM's sync half returns the call's coroutine; its caller
                        # was cancelled meanwhile): closed, not left to warn "never awaited".
                        result.close()
                    future.set_result(result)
            # An idle thread holds nothing of its last job: one that ends (idle, or at exit) while holding a
            # result with tensors frees them as the interpreter finalizes, and torch's deallocator, retaking the
            # GIL from a daemon thread then, aborts the process ("terminate called without an active exception").
            del future, fn, args, kwargs, result
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; idle threads end. Never waits for a running job (see the class docstring)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in range(self._alive):
                self._queued += 1
                self._jobs.put(None)


class _Job(concurrent.futures.Future[T]):
    """A job's future that remembers a cancellation asked for while it ran (its waiter gave up on it)."""

    abandoned = False

    def cancel(self) -> bool:
        self.abandoned = True
        return super().cancel()


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` on a loop whose default executor is a `DaemonThreads` (the CLI's commands)."""
    with CommandLoop() as loop:
        return loop.run(coro)


async def _daemon_threads() -> None:
    asyncio.get_running_loop().set_default_executor(DaemonThreads())


class CommandLoop:
    """One event loop for a command's several steps, in this thread (`asyncio.Runner`: Ctrl-C cancels the step
    running): what `enter` opens on it (an app's async factory, whose resources are bound to the loop they were
    made on) stays open for the steps that `run` then plays, and is closed on it when the command ends, before
    the loop is. Its default executor is a `DaemonThreads`, as `run_loop`'s."""

    def __init__(self) -> None:
        self._runner = asyncio.Runner()
        self._opened = contextlib.AsyncExitStack()
        self._runner.run(_daemon_threads())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop until it is done."""
        return self._runner.run(coro)

    def enter(self, context: contextlib.AbstractAsyncContextManager[T]) -> T:
        """Enter an async context manager on the loop; it is exited by `close`."""
        return self._runner.run(self._opened.enter_async_context(context))

    def close(self) -> None:
        """Exit what was entered (last first), then close the loop."""
        try:
            self._runner.run(self._opened.aclose())
        finally:
            self._runner.close()

    def __enter__(self) -> CommandLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def new_loop_thread(name: str, executor: concurrent.futures.Executor) -> asyncio.AbstractEventLoop:
    """A new event loop running forever in a daemon thread `name`, `executor` its default executor."""
    loop = asyncio.new_event_loop()
    loop.set_default_executor(executor)
    threading.Thread(target=loop.run_forever, name=name, daemon=True).start()
    return loop


_call_loop: asyncio.AbstractEventLoop | None = None
_call_loop_lock = threading.Lock()


def call_loop() -> asyncio.AbstractEventLoop:
    """The loop every LiteLLM call runs on (see the module docstring), started on first use."""
    global _call_loop
    with _call_loop_lock:
        if _call_loop is None or _call_loop.is_closed():
            _call_loop = new_loop_thread("colab-graphs-calls", DaemonThreads(name="colab-graphs-litellm"))
    return _call_loop


_closing: set[asyncio.AbstractEventLoop] = set()
_closing_after_litellm: set[asyncio.AbstractEventLoop] = set()


async def on_call_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await `coro` run on the call loop (cancelling the wait cancels it there)."""
    loop = call_loop()
    try:
        if asyncio.get_running_loop() is loop:
            return await coro
        # (The call loop's tasks do not copy this context: a trace's current span is carried over.)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(otel.carried(coro), loop))
    finally:
        if loop not in _closing:
            _closing.add(loop)
            atexit.register(_close_call_loop, loop)
        if loop not in _closing_after_litellm and "litellm" in sys.modules:
            # Registered again once LiteLLM is imported, so that it runs before LiteLLM's own exit handlers
            # (last registered, first run), which would otherwise close this loop's clients from a loop of
            # their own. (Run twice, the second finds the loop closed.)
            _closing_after_litellm.add(loop)
            atexit.register(_close_call_loop, loop)


async def _close_http_clients() -> None:
    """Close the direct lane's session and LiteLLM's cached async HTTP clients on the loop they belong to, and
    drop them while the interpreter is whole: left to the garbage collector at finalization, a client's
    `__del__` imports a module and may wait forever on an import lock a frozen daemon thread holds (the process
    then hangs), and an unclosed aiohttp session complains on stderr."""
    from colab_graphs.models.direct import close_session

    with contextlib.suppress(Exception):
        await close_session()
    if "litellm" not in sys.modules:
        return
    from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients

    with contextlib.suppress(Exception):
        await close_litellm_async_clients()
    cache = getattr(sys.modules["litellm"], "in_memory_llm_clients_cache", None)
    with contextlib.suppress(Exception):
        cache.flush_cache()  # type: ignore[union-attr]


def _close_call_loop(loop: asyncio.AbstractEventLoop, timeout_s: float = 5.0) -> None:
    """At exit: stop LiteLLM's logging worker on the call loop, cancel what is left there, close the loop."""
    if loop.is_closed() or not loop.is_running():
        return

    async def wind_down() -> None:
        worker_module = sys.modules.get("litellm.litellm_core_utils.logging_worker")
        worker = getattr(worker_module, "GLOBAL_LOGGING_WORKER", None)
        task = getattr(worker, "_worker_task", None)
        if worker is not None and task is not None and not task.done() and task.get_loop() is loop:
            with contextlib.suppress(Exception):  # a flush that fails at exit must not break the exit
                await worker.stop(timeout=timeout_s)
        await _close_http_clients()
        for _ in range(3):  # (a task cancelled here may start another: a failure being logged)
            rest = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
            if not rest:
                break
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
        await loop.shutdown_asyncgens()

    with contextlib.suppress(Exception):  # (a timeout) the loop is stopped anyway
        asyncio.run_coroutine_threadsafe(wind_down(), loop).result(timeout_s + 1.0)
    loop.call_soon_threadsafe(loop.stop)
    stopped = time.monotonic() + 1.0
    while loop.is_running() and time.monotonic() < stopped:
        time.sleep(0.01)
    if not loop.is_running():
        loop.close()
