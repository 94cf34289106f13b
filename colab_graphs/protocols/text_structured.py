"""Text-level protocols with structure beyond all-see-all: topology, blackboard, LLM-Blender.

Part of the text family (conventions in `colab_graphs.protocols.text`). This
module also registers the pure-Python nodes they use: aggregators `inbox` (labelled messages from chosen
members), `count` (how many texts were read) and `pairwise_rank` (rank candidates from pairwise verdicts),
and the router `at_least` (a count against a threshold).
"""

from __future__ import annotations

import re
from typing import Any

from colab_graphs.builder import GraphBuilder
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.protocols.stages import (
    add_stage,
    check_count,
    check_members,
    finish_with_extract,
    finish_with_vote,
    pick_member,
)
from colab_graphs.registry import aggregator, protocol, router
from colab_graphs.spec import END, GraphSpec

TOPOLOGIES = ("chain", "ring", "star", "tree", "complete")

TOPOLOGY_REVISE = (
    "{input}\n\n"
    "Your previous answer was:\n{own}\n\n"
    "Previous answers of the agents connected to you:\n\n{neighbours}\n\n"
    "Consider their reasoning and give an updated answer. {answer_format}"
)
BOARD_POST = (
    "{input}\n\n"
    "You are one of several agents solving this together on a shared blackboard. "
    "The board so far, oldest post first:\n\n{board}\n\n"
    "Add one contribution to the board: a relevant fact, a solution step, a check or correction of an "
    "earlier post, or a candidate answer. Do not repeat what is already there. If you propose an answer, "
    "follow this format: {answer_format}"
)
BOARD_DECIDE = (
    "{input}\n\n"
    "Agents worked on this question on a shared blackboard:\n\n{board}\n\n"
    "Based on the board, give the final answer. {answer_format}"
)
BLENDER_RANK = (
    "{input}\n\n"
    "Candidate responses:\n\n{candidates}\n\n"
    "Compare the responses pairwise. For every pair i < j write one line, `i > j` if response i is better "
    "than response j, else `i < j` (for example `1 > 2`). Write only those lines."
)
BLENDER_FUSE = (
    "{input}\n\n"
    "The best candidate responses, best first:\n\n{candidates}\n\n"
    "Fuse them into one response that keeps their strengths and fixes their mistakes. "
    "{answer_format}"
)


@aggregator("inbox")
def inbox(inputs: dict[str, Any], empty: str = "(none)", **_: Any) -> str:
    """Each non-empty text read, under its read name as a label (`Agent 2:\\n...`); `empty` if none."""
    parts = [
        f"{label}:\n{text.strip()}"
        for label, text in inputs.items()
        if isinstance(text, str) and text.strip()
    ]
    return "\n\n".join(parts) or empty


@aggregator("count")
def count(inputs: dict[str, Any], **_: Any) -> str:
    """How many non-empty texts were read (pattern reads count each item), as a decimal string."""
    n = 0
    for value in inputs.values():
        items = value if isinstance(value, list) else [value]
        n += sum(1 for item in items if isinstance(item, str) and item.strip())
    return str(n)


_VERDICT = re.compile(r"(?:response\s*)?(\d+)\s*([<>])\s*(?:response\s*)?(\d+)", re.IGNORECASE)


def rank_from_verdicts(n: int, verdicts: str) -> list[int]:
    """Candidate indices (0-based) best first: most pairwise wins, ties in candidate order.

    A verdict is a line fragment `i > j` or `i < j` (1-based, optionally `Response i`); the first verdict on
    each pair counts, verdicts naming a candidate outside 1..n or a candidate against itself are ignored.
    """
    wins = [0] * n
    seen: set[frozenset[int]] = set()
    for m in _VERDICT.finditer(verdicts or ""):
        i, op, j = int(m[1]), m[2], int(m[3])
        pair = frozenset((i, j))
        if i == j or not (1 <= i <= n and 1 <= j <= n) or pair in seen:
            continue
        seen.add(pair)
        wins[(i if op == ">" else j) - 1] += 1
    return sorted(range(n), key=lambda k: (-wins[k], k))


@aggregator("pairwise_rank")
def pairwise_rank(inputs: dict[str, Any], top_k: int = 1, **_: Any) -> str:
    """The `top_k` best of `inputs["candidates"]` by the pairwise verdicts in `inputs["verdicts"]`.

    One selected candidate is returned verbatim; several are numbered (`Candidate 1:` ...), best first.
    Without usable verdicts the ranking is candidate (pool) order.
    """
    candidates = [str(c) for c in inputs.get("candidates") or []]
    order = rank_from_verdicts(len(candidates), str(inputs.get("verdicts") or ""))
    top = [candidates[k].strip() for k in order[: max(1, int(top_k))]]
    if len(top) <= 1 or int(top_k) == 1:
        return top[0] if top else ""
    return "\n\n".join(f"Candidate {i}:\n{text}" for i, text in enumerate(top, 1))


@router("at_least")
def at_least(view: dict[str, Any], path_map: dict[str, str], n: int = 2, **_: Any) -> str:
    """'yes' when the routed text is a number >= `n`, else 'no' (a non-number counts as 0)."""
    try:
        value = float(str(view.get("text") or "").strip())
    except ValueError:
        value = 0.0
    return "yes" if value >= n else "no"


def topology_edges(topology: str, n: int, adjacency: list[list[Any]] | None = None) -> list[tuple[int, int]]:
    """Directed edges (i, j), 0-based pool positions: member j hears member i. Self-edges are left out.

    chain: i -> i+1. ring: chain plus last -> first. star: first <-> every other. tree: binary tree in pool
    order, parent (i-1)//2 <-> child i. complete: every ordered pair. `adjacency` (n x n, truthy
    `adjacency[i][j]` = i -> j) replaces the named topology; its diagonal is ignored.
    """
    if adjacency is not None:
        if not isinstance(adjacency, list) or len(adjacency) != n:
            got = len(adjacency) if isinstance(adjacency, list) else type(adjacency).__name__
            raise ValueError(f"topology: adjacency must have {n} rows (one per member), got {got}")
        edges = []
        for i, row in enumerate(adjacency):
            if not isinstance(row, list) or len(row) != n:
                raise ValueError(f"topology: adjacency row {i} must be a list of {n} entries, got {row!r}")
            for j, cell in enumerate(row):
                if cell not in (0, 1, True, False):
                    raise ValueError(f"topology: adjacency[{i}][{j}] must be 0 or 1, got {cell!r}")
                if cell and i != j:
                    edges.append((i, j))
        return edges
    if topology == "chain":
        pairs = [(i, i + 1) for i in range(n - 1)]
    elif topology == "ring":
        pairs = [(i, (i + 1) % n) for i in range(n)]
    elif topology == "star":
        pairs = [p for j in range(1, n) for p in ((0, j), (j, 0))]
    elif topology == "tree":
        pairs = [p for j in range(1, n) for p in (((j - 1) // 2, j), (j, (j - 1) // 2))]
    elif topology == "complete":
        pairs = [(i, j) for i in range(n) for j in range(n)]
    else:
        raise ValueError(f"topology: unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
    return sorted({(i, j) for i, j in pairs if i != j})


@protocol(
    "topology",
    family="text",
    description="Structured interaction: members on a graph (chain, ring, star, tree, complete or an "
    "adjacency matrix) revise over rounds seeing their in-neighbours' answers; majority vote.",
    min_members=2,
)
def topology(
    members: list[str],
    topology: str = "complete",
    adjacency: list[list[int]] | None = None,
    rounds: int = 2,
    prompt: str = ANSWER,
    revise_prompt: str = TOPOLOGY_REVISE,
) -> GraphSpec:
    """Structured interaction over a communication graph (in the spirit of MacNet, Qian et al., 2024).

    Round 1: every member answers alone. Rounds 2..R: every member sees its own previous answer and the
    previous answers of its in-neighbours only, then revises; final answer = majority vote over the last
    round. Each member's view is assembled by a pure-Python `inbox` node (`inbox_r{r}_{member}`) that reads
    its in-neighbours' keys and labels them `Agent k` (k = pool position, stable under coalitions), so the
    drawing shows who hears whom. chain and ring are directed in pool order; star (centre: the first member),
    tree (binary, in pool order) and complete are undirected. Unlike `debate`, a member's own answer is not
    in its list of peers.

    Coalitions: an absent member's seats are dropped; the others keep the graph induced on the present
    members (no rewiring through the absent one: in a chain a -> b -> c without b, c hears nobody). An
    absent member's inbox nodes stay (pure Python, no calls) and feed only the final join. A single member
    revises its own answer. Empty coalition: 0.

    Args:
        topology: chain | ring | star | tree | complete.
        adjacency: n x n 0/1 matrix (JSON with -P) in pool order; `adjacency[i][j] = 1` means member j hears
            member i. Replaces `topology` when given.
        rounds: number of rounds, including the first independent one.
        prompt: round-1 template.
        revise_prompt: template of rounds 2..R; reads `{own}` (the member's previous answer) and
            `{neighbours}` (its in-neighbours' previous answers, labelled `Agent k`, or `(none)`).
    """
    members = check_members(members, "topology")
    check_count(rounds, "topology", "rounds")
    heard_by: dict[int, list[int]] = {j: [] for j in range(len(members))}
    for i, j in topology_edges(topology, len(members), adjacency):
        heard_by[j].append(i)
    shape = "adjacency matrix" if adjacency is not None else topology
    b = GraphBuilder("topology", members, description=f"rounds over a {shape} graph; vote")
    seats = add_stage(b, members, "r1", prompt, "topology:r1", None)
    inboxes: list[str] = []
    for r in range(2, rounds + 1):
        new_seats = []
        for j, m in enumerate(members):
            box = f"inbox_r{r}_{m}"
            reads = {f"Agent {i + 1}": f"topology:r{r - 1}:{members[i]}?" for i in heard_by[j]}
            b.aggregate(box, "inbox", reads=reads, writes=f"topology:inbox:r{r}:{m}")
            b.edge([seats[i] for i in sorted({*heard_by[j], j})], box)
            reads = {"own": f"topology:r{r - 1}:{m}", "neighbours": f"topology:inbox:r{r}:{m}"}
            b.seat(f"r{r}_{m}", member=m, prompt=revise_prompt, reads=reads, writes=f"topology:r{r}:{m}")
            b.edge(box, f"r{r}_{m}")
            new_seats.append(f"r{r}_{m}")
            inboxes.append(box)
        seats = new_seats
    # The inboxes join the vote too, so an absent member's inbox (which feeds no seat) still reaches END.
    return finish_with_vote(b, seats + inboxes, f"topology:r{rounds}:*")


@protocol(
    "blackboard",
    family="text",
    description="Blackboard: over rounds every member reads the whole shared board and posts to it; a "
    "decider member (or a vote) gives the final answer.",
    min_members=2,
)
def blackboard(
    members: list[str],
    rounds: int = 2,
    final: str = "decider",
    decider: str | None = None,
    post_prompt: str = BOARD_POST,
    decide_prompt: str = BOARD_DECIDE,
) -> GraphSpec:
    """A shared blackboard that members read and write over rounds.

    In each round every member reads the whole board (every post of earlier rounds, oldest first, pool order
    within a round) and adds one post; posts of one round are written in parallel, so they see each other in
    the next round. Then either a decider member reads the board and gives the final answer (`final=
    "decider"`: board posts are contributions, not necessarily answers) or the last round's posts are voted
    on (`final="vote"`).

    Coalitions: an absent member's posts are dropped, so the board simply has fewer posts. When the decider
    is absent, the first present member in pool order decides. A single member works the board alone.
    Empty coalition: 0.

    Args:
        rounds: rounds of posting.
        final: decider | vote.
        decider: member in the deciding seat (default: the first in pool order); used when final=decider.
        post_prompt: template of the posts; reads `{board}` (all earlier posts, numbered, or `(none)`).
        decide_prompt: decider template; reads `{board}`.
    """
    members = check_members(members, "blackboard")
    check_count(rounds, "blackboard", "rounds")
    if final not in ("decider", "vote"):
        raise ValueError(f"blackboard: final must be 'decider' or 'vote', got {final!r}")
    who = pick_member(members, decider, "blackboard", "decider")
    b = GraphBuilder("blackboard", members, description=f"shared board over rounds; final by {final}")
    seats: list[str] | None = None
    for r in range(1, rounds + 1):
        key = f"board:r{r}"
        seats = add_stage(b, members, f"post_r{r}", post_prompt, key, seats, {"board": "board:*"})
    assert seats is not None
    if final == "vote":
        return finish_with_vote(b, seats, f"board:r{rounds}:*")
    b.seat(
        "decide",
        member=who,
        prompt=decide_prompt,
        reads={"board": "board:*"},
        writes="blackboard:decision",
        on_absent="substitute",
        role="decider",
    )
    b.edge(seats, "decide")
    return finish_with_extract(b, "decide", "blackboard:decision")


@protocol(
    "llm_blender",
    family="text",
    description="LLM-Blender: every member answers, a ranker member compares the candidates pairwise, "
    "the top-k are fused by a fuser member.",
    min_members=2,
)
def llm_blender(
    members: list[str],
    ranker: str | None = None,
    fuser: str | None = None,
    top_k: int = 2,
    prompt: str = ANSWER,
    rank_prompt: str = BLENDER_RANK,
    fuse_prompt: str = BLENDER_FUSE,
) -> GraphSpec:
    """Rank and fuse (LLM-Blender, Jiang et al., 2023), with members as PairRanker and GenFuser.

    Every member answers (a candidate). If two or more candidates exist, the ranker member compares them
    pairwise in one call that lists every pair as `i > j` lines (n(n-1)/2 separate calls would be costlier,
    and a per-pair seat would depend on two members, which coalitions cannot express); the pure-Python
    `pairwise_rank` node ranks the candidates by wins (ties: pool order) and keeps the top_k, which the
    fuser member fuses into the final answer. With top_k = 1 there is no fuser: the best candidate is the
    answer. With one candidate (a route after the candidates counts them) ranking and fusion are skipped
    and that candidate is the answer.

    Coalitions: an absent member's candidate is dropped. The ranker and fuser seats are taken by the first
    present member in pool order when their member is absent. A single member's own answer is the answer
    (one call). Empty coalition: 0.

    Args:
        ranker: member in the ranker seat (default: the first in pool order).
        fuser: member in the fuser seat (default: the first in pool order).
        top_k: candidates passed to the fuser (1 = no fusion: the best candidate is the answer).
        prompt: candidate template.
        rank_prompt: ranker template; reads `{candidates}` (numbered); must ask for `i > j` lines.
        fuse_prompt: fuser template; reads `{candidates}` (the top_k, numbered best first).
    """
    members = check_members(members, "llm_blender")
    check_count(top_k, "llm_blender", "top_k")
    rank_by = pick_member(members, ranker, "llm_blender", "ranker")
    fuse_by = pick_member(members, fuser, "llm_blender", "fuser")
    b = GraphBuilder("llm_blender", members, description=f"candidates, pairwise ranking, fuse top-{top_k}")
    candidates = "blender:cand:*"
    seats = add_stage(b, members, "candidate", prompt, "blender:cand", None)
    b.aggregate("count", "count", reads={"candidates": candidates}, writes="blender:n")
    b.edge(seats, "count")
    b.route("count", "at_least", {"yes": "rank", "no": "final"}, default="final", key="blender:n", n=2)
    b.seat(
        "rank",
        member=rank_by,
        prompt=rank_prompt,
        reads={"candidates": candidates},
        writes="blender:verdicts",
        on_absent="substitute",
        role="ranker",
    )
    reads = {"candidates": candidates, "verdicts": "blender:verdicts"}
    b.aggregate("select", "pairwise_rank", reads=reads, writes="blender:top", top_k=top_k)
    b.edge("rank", "select")
    chosen = "blender:top"
    if top_k > 1:
        b.seat(
            "fuse",
            member=fuse_by,
            prompt=fuse_prompt,
            reads={"candidates": "blender:top"},
            writes="blender:fused",
            on_absent="substitute",
            role="fuser",
        )
        b.edge("select", "fuse")
        chosen = "blender:fused"
    # The fused (or selected) text when ranking ran, else the only candidate.
    reads = {"chosen": f"{chosen}?", "candidates": candidates}
    b.aggregate("final", "first", reads=reads, writes="final", extract=True)
    b.edge("fuse" if top_k > 1 else "select", "final").edge("final", END)
    return b.output("final").build()


__all__ = ["TOPOLOGIES", "rank_from_verdicts", "topology_edges"]
