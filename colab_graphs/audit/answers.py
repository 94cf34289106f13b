"""The coalition game computed from the members' answers, for protocols whose replies do not depend on it.

A protocol declares it with `@protocol(..., independent_replies=True)` (majority_vote, slm_mux): every seat's
prompt depends on the example alone and no seat reads another's output. Then every coalition's seats make
requests the grand coalition makes too, so the grand coalition's replies hold every coalition's game: v(S) is
the protocol's aggregator applied to the replies of S's seats, in pure Python, with no graph run per
coalition. Exact Shapley then costs the calls of leave-one-out.

The declaration is checked against the spec (`answers_kind`): seats that read nothing and are dropped with
their member, pure-Python aggregates, no routes, no logit seats. A spec that does not pass is played
coalition by coalition as usual.

- `"vote"`: the built-in majority vote over every seat is vectorised. Per example, each seat's answer gets a
  class id (answers grouped by the task's `same`, as `TaskView.vote` groups them), and for every coalition
  bitmask at once the counts per class and the first seat (pool order) giving each class are built by
  dynamic programming over the members' bits; the winner is the largest class, ties to the class answered
  first, and v(S) the score of that class's first answer in S: what `TaskView.vote` returns and the run
  scores. An example whose answers the task's `same` does not partition (not an equivalence) is computed
  coalition by coalition instead.
- `"aggregate"`: any other aggregates (slm_mux): run per coalition and example on the present seats' replies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from colab_graphs.compile import resolve_reads, seat_messages, takes_task
from colab_graphs.models.cache import request_key
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.registry import registry_lookup
from colab_graphs.spec import Aggregate, GraphSpec, Seat, is_pattern
from colab_graphs.tasks.task_types import TaskView

# How much of the game from answers an audit computes before it plays coalitions instead: (2^n coalitions) x
# examples evaluations, a few seconds of CPU on the 2-core VM (BENCHMARKS.md): a vectorised vote does about
# 3.5 million a second (n = 16 over 100 examples: 1.9 s), slm_mux's Python aggregate about 7 thousand.
AFFORDABLE = {"vote": 2**16 * 200, "aggregate": 2**9 * 100}


def answers_kind(spec: GraphSpec) -> str | None:
    """ "vote", "aggregate", or None: how `spec`'s game can be computed from answers (module docstring)."""
    from colab_graphs.protocol_registry import get_protocol

    try:
        declared = get_protocol(spec.name).independent_replies
    except KeyError:
        return None
    seats = [n for n in spec.nodes if isinstance(n, Seat)]
    others = [n for n in spec.nodes if not isinstance(n, Seat)]
    if not declared or spec.routes or not seats or not others:
        return None
    if any(s.reads or s.on_absent != "drop" for s in seats) or not all(
        isinstance(n, Aggregate) for n in others
    ):
        return None
    if _is_builtin_vote(spec, seats, others):
        return "vote"
    return "aggregate"


def _is_builtin_vote(spec: GraphSpec, seats: list[Seat], aggregates: list) -> bool:
    from colab_graphs.aggregators import vote

    if len(aggregates) != 1:
        return False
    (node,) = aggregates
    if (
        node.fn != "vote"
        or node.writes != spec.output
        or registry_lookup("aggregator", "vote").obj is not vote
    ):
        return False
    refs = list(node.reads.values())
    if len(refs) != 1 or not is_pattern(refs[0]):
        return False
    prefix = refs[0][:-1]
    return all(s.writes.startswith(prefix) and "#" not in s.writes for s in seats)


def affordable(kind: str, n_players: int, n_examples: int) -> bool:
    """Whether computing all 2^n coalitions from answers stays within a few seconds of CPU."""
    return (2**n_players) * max(n_examples, 1) <= AFFORDABLE[kind]


def fixed_request(
    client: ModelClient, pool: Pool, seat: Seat, state: Mapping[str, Any]
) -> tuple[str, list, dict]:
    """(cache key, messages, settings) of a seat that reads nothing, on an example's input state.

    The key is the one the call path files the call under (`ModelClient.canonical_request`), so a call can be
    found in a play or in the cache, and counted, before or without making it.
    """
    messages = seat_messages(seat, state)  # type: ignore[arg-type]
    request, _ = client.canonical_request(pool[seat.member], messages, seat.sample, seat.settings or None)
    return request_key(request), request["messages"], request["settings"]


def seat_replies(
    spec: GraphSpec, pool: Pool, client: ModelClient, view: TaskView, calls: Sequence[Any]
) -> list[str]:
    """Each seat's reply on one example, in spec order, from the calls of a play that made them all.

    Raises:
        KeyError: a seat's request is not among `calls`.
    """
    by_key = {c.key: c.completion for c in calls if c.completion is not None}
    state = view.graph_input()
    replies = []
    for seat in (n for n in spec.nodes if isinstance(n, Seat)):
        key, _, _ = fixed_request(client, pool, seat, state)
        if key not in by_key:
            raise KeyError(f"seat {seat.name!r}: its request is not among the play's calls")
        replies.append(by_key[key])
    return replies


def answer_classes(replies: Sequence[str], view: TaskView) -> tuple[np.ndarray, list[str | None], bool]:
    """(class id per reply, -1 for one committing to no answer; the answers; whether `same` partitions them).

    Classes are formed as `TaskView.vote` forms groups (an answer joins the first group whose first answer is
    the same); they are what every coalition's vote groups only when `same` is an equivalence on these
    answers, which the third value says (checked on every pair of distinct answers, both ways).
    """
    answers: list[str | None] = []
    classes = np.full(len(replies), -1, dtype=np.int64)
    firsts: list[str] = []
    for j, reply in enumerate(replies):
        answer = view.extract(reply)
        if answer is None or not answer.strip():
            answers.append(None)
            continue
        answers.append(answer)
        for k, first in enumerate(firsts):
            if view.same(first, answer):
                classes[j] = k
                break
        else:
            firsts.append(answer)
            classes[j] = len(firsts) - 1
    distinct = {a: int(classes[j]) for j, a in enumerate(answers) if a is not None}
    texts = list(distinct)
    consistent = all(
        view.same(a, b) == (distinct[a] == distinct[b]) and view.same(b, a) == (distinct[a] == distinct[b])
        for i, a in enumerate(texts)
        for b in texts[i + 1 :]
    )
    return classes, answers, consistent


def vote_values(
    classes: np.ndarray,
    seat_member: np.ndarray,
    n_players: int,
    seat_scores: np.ndarray,
    no_answer: float,
    empty: float,
) -> np.ndarray:
    """The value of every coalition's majority vote on one example, shape (2^n,), indexed by bitmask.

    Args:
        classes: (seats,) class id of each seat's answer, -1 where it commits to none; seats in the vote's
            read order.
        seat_member: (seats,) the member index (pool order) of each seat.
        n_players: members.
        seat_scores: (seats,) the score of each seat's answer as the final answer.
        no_answer: the score of "" (a coalition whose seats all abstain).
        empty: the empty coalition's value.
    """
    n_seats = len(classes)
    n_classes = int(classes.max()) + 1 if n_seats else 0
    out = np.full(1 << n_players, no_answer, dtype=float)
    if n_classes == 0:
        out[0] = empty
        return out
    none = n_seats  # "no seat": sorts after every seat
    per_member = np.zeros((n_players, n_classes), dtype=np.int32)
    first_seat = np.full((n_players, n_classes), none, dtype=np.int32)
    for j, (c, m) in enumerate(zip(classes, seat_member, strict=True)):
        if c >= 0:
            per_member[m, c] += 1
            first_seat[m, c] = min(first_seat[m, c], j)
    counts = np.zeros((1 << n_players, n_classes), dtype=np.int32)
    first = np.full((1 << n_players, n_classes), none, dtype=np.int32)
    for b in range(n_players):  # masks with highest bit b extend the masks below 2^b by member b
        low, high = 1 << b, 2 << b
        counts[low:high] = counts[:low] + per_member[b]
        first[low:high] = np.minimum(first[:low], first_seat[b])
    # Most votes first; among equals, the class whose first answer came first.
    winner = (counts * (n_seats + 1) + (none - first)).argmax(axis=1)
    rows = np.arange(1 << n_players)
    answered = counts[rows, winner] > 0
    scores = np.append(np.asarray(seat_scores, dtype=float), no_answer)
    out = np.where(answered, scores[first[rows, winner]], no_answer)
    out[0] = empty
    return out


async def _score(view: TaskView, output: str, memo: dict[str, float]) -> float:
    if output not in memo:
        memo[output] = (await view.score(output)).value
    return memo[output]


async def aggregate_values(
    spec: GraphSpec, replies: Sequence[str], view: TaskView, empty: float
) -> np.ndarray:
    """Every coalition's value on one example, shape (2^n,), by running `spec`'s aggregates on the replies of
    the coalition's seats (spec order), as the graph would after its seats."""
    players = list(spec.members)
    index = {p: i for i, p in enumerate(players)}
    seats = [n for n in spec.nodes if isinstance(n, Seat)]
    aggregates = [n for n in spec.nodes if isinstance(n, Aggregate)]
    order = {n.writes: i for i, n in enumerate(spec.nodes)}
    fns = [(node, registry_lookup("aggregator", node.fn).obj) for node in aggregates]
    base = view.graph_input()
    memo: dict[str, float] = {}
    out = np.empty(1 << len(players))
    out[0] = empty
    for mask in range(1, 1 << len(players)):
        values = {s.writes: r for s, r in zip(seats, replies, strict=True) if mask >> index[s.member] & 1}
        state = {**base, "values": values}
        for node, fn in fns:
            params = {**node.params, "task": view} if takes_task(fn) else node.params
            values[node.writes] = fn(resolve_reads(node.reads, state, order), **params)  # type: ignore[arg-type]
        out[mask] = await _score(view, str(values.get(spec.output, "")), memo)
    return out


async def game_from_answers(
    spec: GraphSpec, kind: str, replies: Sequence[str], view: TaskView, empty: float
) -> np.ndarray:
    """Every coalition's value (2^n,) on one example from the seats' replies (spec order)."""
    if kind == "vote":
        classes, answers, consistent = answer_classes(replies, view)
        if consistent:
            players = list(spec.members)
            seat_member = np.array([players.index(n.member) for n in spec.nodes if isinstance(n, Seat)])
            memo: dict[str, float] = {}
            scores = np.array([await _score(view, a, memo) if a is not None else 0.0 for a in answers])
            no_answer = await _score(view, "", memo)
            return vote_values(classes, seat_member, len(players), scores, no_answer, empty)
    return await aggregate_values(spec, replies, view, empty)
