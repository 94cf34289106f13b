"""Which pool members can sit in a logit seat: only in-process `local/` models give next-token distributions.

`compile_graph` checks a pool before any call (and again at run time for a pool given only then), so a logit
protocol over API members fails at once, naming each member and its model.
"""

from __future__ import annotations

from colab_graphs.pool import Pool
from colab_graphs.spec import GraphSpec, LogitSeat, SpecError

LOCAL_PREFIX = "local/"


class LogitPoolError(SpecError):
    """A logit-level protocol was given members that are not in-process `local/` models."""


def unsupported_members(node: LogitSeat, pool: Pool) -> list[str]:
    """The members of `node` whose model is not a `local/` model ([] when it runs as plain generation)."""
    if len(node.members) < 2:
        return []  # one member decodes alone: any endpoint can do that
    return [m for m in node.members if not pool[m].model.startswith(LOCAL_PREFIX)]


def _problem(node: LogitSeat, pool: Pool) -> str | None:
    bad = unsupported_members(node, pool)
    if not bad:
        return None
    listed = ", ".join(f"{m} ({pool[m].model})" for m in bad)
    return (
        f"logit seat {node.name!r} ({node.mode}) decodes from every member's next-token distribution, "
        f"which only in-process models give: member(s) {listed} are not '{LOCAL_PREFIX}...' models. Use "
        f"local models that share a vocabulary (e.g. model: local/smollm2-135m), or a text-level protocol."
    )


def check_pool_supports(spec: GraphSpec, pool: Pool) -> None:
    """Raise `LogitPoolError` naming every member of a logit seat that is not a `local/` model.

    `compile_graph` calls this when it is given a pool, so a run fails before its first call.

    Args:
        spec: any graph; only its `LogitSeat`s are checked.
        pool: the pool the graph will run on.

    Raises:
        LogitPoolError: some logit seat has members whose model is an API endpoint (each named with its
            model), which cannot return next-token distributions.
    """
    problems = [p for n in spec.nodes if isinstance(n, LogitSeat) and (p := _problem(n, pool))]
    if problems:
        raise LogitPoolError(spec.name, problems)


def check_seat_supports(node: LogitSeat, pool: Pool, graph: str = "graph") -> None:
    """`check_pool_supports` for one seat (for graphs that receive their pool only at run time)."""
    problem = _problem(node, pool)
    if problem:
        raise LogitPoolError(graph, [problem])
