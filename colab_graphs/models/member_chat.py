"""`member_chat_model(NAME)`: a LangChain chat model that is a pool member, for auditing a user's own LangGraph app.

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
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from colab_graphs.models.chat_model import CallPathChatModel, Target
from colab_graphs.models.client import ModelClient, default_client
from colab_graphs.pool import Pool
from colab_graphs.trace import Trace

AbsentRule = Literal["raise", "empty", "substitute"]


class MemberAbsent(RuntimeError):
    """A call to a pool member that is not in the coalition being played (rule "raise", the default).

    An app may catch it to route around the member (a supervisor skipping that worker); an app that does not
    catch it gives no answer for that coalition, which then scores as an empty answer.
    """

    def __init__(self, member: str, coalition: frozenset[str]):
        present = ", ".join(sorted(coalition)) or "nobody"
        super().__init__(f"member {member!r} is absent from this coalition (present: {present})")
        self.member = member
        self.coalition = coalition


@dataclass(frozen=True)
class MemberBinding:
    """What a run's member chat models call through: the pool, the client, the coalition (None: the whole
    pool), the trace to record calls in, a memo shared by the runs of one example, and the loop that runs
    the calls (where sync `invoke`s from sync nodes are sent)."""

    pool: Pool
    client: ModelClient
    coalition: frozenset[str] | None = None
    trace: Trace | None = None
    memo: dict[str, Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None


_binding: ContextVar[MemberBinding | None] = ContextVar("colab_graphs_member_binding", default=None)


@contextlib.contextmanager
def bind_members(binding: MemberBinding) -> Iterator[MemberBinding]:
    """Make `binding` what member chat models call through, in this context and the tasks it starts."""
    token = _binding.set(binding)
    try:
        yield binding
    finally:
        _binding.reset(token)


def current_binding() -> MemberBinding | None:
    return _binding.get()


class MemberChatModel(CallPathChatModel):
    """A pool member as a LangChain chat model; the pool and client come from the run (`bind_members`, set
    by an app audit), else from the ones given here.

    Attributes:
        member_name: The pool member.
        on_absent: What a call does when the member is not in the coalition being played: "raise"
            `MemberAbsent` (the default), answer "empty" (an empty reply, no call), or "substitute" another
            member (`substitute`, else the first present member in pool order; `MemberAbsent` if none is).
        substitute: The member that answers instead, for on_absent="substitute".
        pool, client: Used when no audit has bound any (running the app yourself).
    """

    member_name: str
    on_absent: AbsentRule = "raise"
    substitute: str | None = None
    pool: Pool | None = Field(default=None, exclude=True, repr=False)
    client: ModelClient | None = Field(default=None, exclude=True, repr=False)

    @property
    def _llm_type(self) -> str:
        return "colab-graphs-member"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"member": self.member_name, "on_absent": self.on_absent}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_model_name"] = kwargs.get("model") or self.member_name
        params["ls_provider"] = "colab_graphs"
        return params

    def _target(self, metadata: dict[str, Any] | None) -> Target:
        binding = current_binding()
        pool = binding.pool if binding is not None else self.pool
        if pool is None:
            raise RuntimeError(
                f"member_chat_model({self.member_name!r}) has no pool: run the app through "
                "colab_graphs.run_audit(app, pool, data), or give one: member_chat_model(NAME, pool=...)"
            )
        name = self._answering(pool, binding.coalition if binding is not None else None)
        node = (metadata or {}).get("langgraph_node")
        if binding is None:
            return Target(self.client or default_client(), pool[name] if name else None, node=node)
        member = pool[name] if name else None
        return Target(binding.client, member, binding.trace, binding.memo, binding.loop, node)

    def _answering(self, pool: Pool, coalition: frozenset[str] | None) -> str | None:
        """The member that answers this call (None: nobody, an empty answer)."""
        unknown = [m for m in (self.member_name, self.substitute) if m is not None and m not in pool]
        if unknown:
            raise ValueError(
                f"member_chat_model: no member {', '.join(map(repr, unknown))} in the pool; members: "
                f"{', '.join(pool.names)}"
            )
        if coalition is None or self.member_name in coalition:
            return self.member_name
        if self.on_absent == "empty":
            return None
        if self.on_absent == "substitute":
            if self.substitute is not None:
                if self.substitute in coalition:
                    return self.substitute
            else:
                present = [m for m in pool.names if m in coalition]
                if present:
                    return present[0]
        raise MemberAbsent(self.member_name, coalition)


def member_chat_model(
    name: str,
    *,
    on_absent: AbsentRule = "raise",
    substitute: str | None = None,
    pool: Pool | None = None,
    client: ModelClient | None = None,
    **options: Any,
) -> MemberChatModel:
    """Pool member `name` as a LangChain chat model, to use anywhere in a LangGraph app.

    Its calls go through the call path as that member's (cached, single-flight, traced, counted). Under an
    app audit (`colab_graphs.run_audit(app, pool, data)`, `colab-graphs audit --app FILE.py:NAME`) the
    audit's pool, client and coalition apply; a member outside the coalition follows `on_absent` ("raise"
    `MemberAbsent`, answer "empty", or "substitute" another member). Outside an audit, `pool` (and `client`,
    default the process-wide one) say where calls go.

    Example:
        >>> import colab_graphs as cg
        >>> coder = cg.member_chat_model("coder")                  # doctest: +SKIP
        >>> coder.bind_tools([run_python]).invoke("Print 2 + 2")   # doctest: +SKIP
    """
    return MemberChatModel(
        member_name=name, on_absent=on_absent, substitute=substitute, pool=pool, client=client, **options
    )
