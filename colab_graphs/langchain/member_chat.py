"""`MemberChatModel`: a pool member as a LangChain chat model (made by `colab_graphs.member_chat_model`).

Where its calls go is decided at call time: the binding of the run (`colab_graphs.langchain.binding`, set by an
app audit) gives the pool, client, coalition, trace and memo; without one, the pool and client it was made
with.
"""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

from pydantic import Field

from colab_graphs.langchain.binding import (
    AbsentRule,
    MemberAbsent,
    MemberBinding,
    current_binding,
    plays_running,
)
from colab_graphs.langchain.chat_model import CallPathChatModel, Target
from colab_graphs.models.client import ModelClient, default_client
from colab_graphs.pool import Pool
from colab_graphs.trace import Trace


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

    def _target(self, metadata: dict[str, Any] | None, parent: UUID | None = None) -> Target:
        binding = current_binding()
        if binding is None and plays_running():
            # Fail closed: called outside every play's context while an audit plays (a thread started without
            # the caller's context), the call cannot know its coalition; answering as the whole pool would
            # give a wrong value silently.
            raise RuntimeError(
                f"member_chat_model({self.member_name!r}) was called where no audit play reaches, while an "
                "app audit is running: from a thread your code started? Start it with the caller's context "
                "(contextvars.copy_context().run, or LangChain's ContextThreadPoolExecutor) so the call knows "
                "its coalition"
            )
        pool = binding.pool if binding is not None else self.pool
        if pool is None:
            raise RuntimeError(
                f"member_chat_model({self.member_name!r}) has no pool: run the app through "
                "colab_graphs.run_audit(app, pool, data), or give one: member_chat_model(NAME, pool=...)"
            )
        node = call_node(metadata, parent, binding)
        coalition = binding.coalition if binding is not None else None
        try:
            name = self._answering(pool, coalition, node)
        except MemberAbsent:
            if binding is not None:
                note_absence(binding.trace, self.member_name, node, self.on_absent, None)
            raise
        if binding is None:
            return Target(self.client or default_client(), pool[name] if name else None, node=node)
        if name != self.member_name:
            note_absence(binding.trace, self.member_name, node, self.on_absent, name)
        member = pool[name] if name else None
        return Target(binding.client, member, binding.trace, binding.memo, binding.loop, node)

    def _answering(self, pool: Pool, coalition: frozenset[str] | None, node: str | None) -> str | None:
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
        raise MemberAbsent(self.member_name, coalition, node)


AGENT_NODES = frozenset({"agent", "model"})
"""The node a prebuilt agent calls its model in: `create_react_agent`'s "agent", LangChain's `create_agent`'s
"model" (also inside langgraph-supervisor's and langgraph-swarm's agents)."""


def call_node(
    metadata: dict[str, Any] | None, parent: UUID | None, binding: MemberBinding | None
) -> str | None:
    """The node a call is reported under: LangGraph's node that made it, except in a prebuilt agent (its
    "agent" / "model" node, the same in every agent), where it is the agent's name: the name of the graph that
    node ran in (`create_react_agent(name=...)`, an agent of a supervisor or swarm), read from the play's runs
    (`MemberBinding.graph_of`), else the ``lc_agent_name`` LangChain's `create_agent` sets."""
    node = (metadata or {}).get("langgraph_node")
    if node not in AGENT_NODES:
        return node
    graph = binding.graph_of(parent) if binding is not None and binding.graph_of is not None else None
    agent = graph or (metadata or {}).get("lc_agent_name")
    return str(agent) if agent else node


def note_absence(
    trace: Trace | None, member: str, node: str | None, rule: str, answered_by: str | None
) -> None:
    """Record in the play (`trace.absent`, a list kept in the log with the play) that a call asked for an
    absent `member` at `node`, and what its rule did: "raise" (`MemberAbsent`), "empty" (answered empty) or
    "substitute" (`answered_by` answered); repeated calls count in `calls`."""
    extra = trace.__pydantic_extra__ if trace is not None else None
    if extra is None:
        return
    entry = {"member": member, "node": node, "rule": rule, "answered_by": answered_by}
    with _absence_lock:  # (sync nodes of one play record from several threads)
        absent: list[dict[str, Any]] = extra.setdefault("absent", [])
        for seen in absent:
            if all(seen.get(k) == v for k, v in entry.items()):
                seen["calls"] = seen.get("calls", 1) + 1
                return
        absent.append({**entry, "calls": 1})


_absence_lock = threading.Lock()
