"""What a user's app calls its members through during an app audit: the binding, and `MemberAbsent`.

`colab_graphs.member_chat_model(NAME)` is a LangChain chat model that is a pool member, for auditing a user's
own LangGraph app.

A user's app calls its models wherever its nodes do (a supervisor, tool-using workers, a critic); written
with `member_chat_model("coder")` instead of a provider's chat model, each of those calls goes through the
call path as pool member "coder" (cached, shared in flight, traced, counted), and an audit can play the app
once per coalition: `colab_graphs.run_audit(app, pool, data)` binds the pool, the client and the coalition
around each run (`bind_members`), and a member outside the coalition follows its declared rule.

Why a context variable and not LangGraph's run context (`context=`): LangGraph hands its context only to the
nodes that ask for it (a `runtime` parameter), while a chat model is usually made once, at import time, and
called from deep inside a node, a tool or a prebuilt agent that never sees the runtime. A `ContextVar` set
around the app's `ainvoke` reaches every call the run makes: asyncio copies it into each task, and LangGraph
copies it into the threads that run sync nodes (`run_in_executor` with `copy_context`); concurrent runs of
different coalitions each see their own. It also leaves the app's own `context_schema` to the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from colab_graphs.models.client import ModelClient
from colab_graphs.models.flight import Memo
from colab_graphs.pool import Pool
from colab_graphs.trace import Trace

AbsentRule = Literal["raise", "empty", "substitute"]


class MemberAbsent(RuntimeError):
    """A call to a pool member that is not in the coalition being played (rule "raise", the default).

    An app may catch it to route around the member (a supervisor skipping that worker); an app that does not
    catch it gives no answer for that coalition, which then scores as an empty answer (and its play records
    the member and the node: `ended_by_absent`). `node` is the LangGraph node that made the call, where known.
    """

    def __init__(self, member: str, coalition: frozenset[str], node: str | None = None):
        present = ", ".join(sorted(coalition)) or "nobody"
        where = f" (called at node {node!r})" if node else ""
        super().__init__(f"member {member!r} is absent from this coalition{where} (present: {present})")
        self.member = member
        self.coalition = coalition
        self.node = node


@dataclass(frozen=True)
class MemberBinding:
    """What a run's member chat models call through: the pool, the client, the coalition (None: the whole
    pool), the trace to record calls in, a memo shared by the runs of one example, the loop that runs the
    calls (where sync `invoke`s from sync nodes are sent), and `graph_of`: the name of the graph whose node a
    run (a call's parent) is in, where the play knows it (how a prebuilt agent's call is named after the agent)."""

    pool: Pool
    client: ModelClient
    coalition: frozenset[str] | None = None
    trace: Trace | None = None
    memo: Memo | None = None
    loop: asyncio.AbstractEventLoop | None = None
    graph_of: Callable[[UUID | None], str | None] | None = None


_binding: ContextVar[MemberBinding | None] = ContextVar("colab_graphs_member_binding", default=None)
_plays = [0]  # coalition plays running now, in this process
_plays_lock = threading.Lock()


@contextlib.contextmanager
def bind_members(binding: MemberBinding) -> Iterator[MemberBinding]:
    """Make `binding` what member chat models call through, in this context and the tasks it starts (and the
    threads started with this context: LangGraph's and LangChain's copy it; a thread of your own needs
    `contextvars.copy_context().run`)."""
    token = _binding.set(binding)
    playing = binding.coalition is not None
    if playing:
        with _plays_lock:
            _plays[0] += 1
    try:
        yield binding
    finally:
        _binding.reset(token)
        if playing:
            with _plays_lock:
                _plays[0] -= 1


def plays_running() -> bool:
    """Whether a coalition play (an app audit's) is running in this process now."""
    return _plays[0] > 0


def current_binding() -> MemberBinding | None:
    return _binding.get()
