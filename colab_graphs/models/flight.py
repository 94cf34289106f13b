"""Single flight: identical requests made at once share one call, and the runs of one example share their calls.

`SingleFlight` is the one implementation behind the client's single flight (identical calls in flight at once
make one upstream call) and the memo an example's runs share (`Memo`: an audit's coalitions of one example,
where a request another coalition made is answered at once, as the cache would, without its lookup).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from colab_graphs.trace import Call

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def being_cancelled() -> bool:
    """Whether the current task has been asked to stop (as opposed to an awaited future being cancelled)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def fail_flight(flight: asyncio.Future[Any], exc: BaseException) -> None:
    """End a shared flight with its owner's failure: a cancelled owner cancels it (a waiter that was not
    cancelled itself then takes the call over); any other failure goes to every waiter."""
    if isinstance(exc, asyncio.CancelledError):
        flight.cancel()
    else:
        flight.set_exception(exc)
        flight.exception()  # retrieved: waiters re-raise it themselves


class SingleFlight(Generic[K, V]):
    """One flight per key: the first caller of `run` makes the value; callers of the same key meanwhile wait
    for it, and get its failure too. A waiter whose owner was cancelled (a sibling branch failed, say) while it
    was not takes the flight over rather than fail with a cancellation nobody asked for.

    With `keep`, a value stays once made and answers later callers at once (`landed`); without, the flight
    ends with its owner (the client's: the call cache answers after it). A failure is never kept: the next
    caller tries again. Futures belong to the event loop that made them: one `SingleFlight` serves one loop.
    """

    def __init__(self, *, keep: bool = False) -> None:
        self.keep = keep
        self._flights: dict[K, asyncio.Future[V]] = {}
        self._landed: dict[K, V] = {}

    def landed(self, key: K) -> V | None:
        """The value made for `key`, if one was (and kept)."""
        return self._landed.get(key)

    async def run(self, key: K, make: Callable[[], Awaitable[V]]) -> tuple[V, bool]:
        """(the value for `key`, whether it was shared): made by `make` unless a flight of `key` is under way
        or landed, whose value is then returned with `True`."""
        while True:
            if key in self._landed:
                return self._landed[key], True
            flight = self._flights.get(key)
            if flight is None:
                break
            try:
                return await asyncio.shield(flight), True
            except asyncio.CancelledError:
                if flight.cancelled() and not being_cancelled():
                    continue
                raise
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._flights[key] = future
        try:
            value = await make()
        except BaseException as exc:
            fail_flight(future, exc)
            raise
        else:
            if self.keep:
                self._landed[key] = value
            future.set_result(value)
            return value, False
        finally:
            if self._flights.get(key) is future:
                del self._flights[key]


@dataclass
class Memo:
    """What the runs of one example share (an audit's coalitions, an evaluation's): their calls by request, the
    prompts of seats that read no state, and each seat's record of a reused call.

    A seat (or a member chat model) whose request another run made takes that call and records it as served
    again (cached, as the cache would serve it); one whose request is in flight waits for it. Requests are keyed
    by what makes them (a seat's member, sample, settings and messages; a chat model's cache key).
    """

    calls: SingleFlight[Hashable, Call] = field(default_factory=lambda: SingleFlight(keep=True))
    prompts: dict[Hashable, tuple[str | None, str]] = field(default_factory=dict)
    # (request, seat) -> the record of a reused call at that seat, one object shared by every play that reuses it.
    replays: dict[tuple[Hashable, str], Call] = field(default_factory=dict)
