"""Text-level protocols: members exchange text (answers, feedback, knowledge, posts) through the graph state.

Every protocol here is a `GraphSpec` builder registered with `@protocol(..., family="text")`. They share
these conventions, which are what make their coalition semantics mechanical:

- Each seat writes its own state key, named `protocol:stage:member` (e.g. `debate:r2:alice`). Member names
  cannot contain `:` (the pool allows letters, digits, `_`, `-`, `.`), so a pattern read such as
  `debate:r1:*` gathers exactly one stage, in pool order.
- A seat that needs its peers' texts reads them by pattern. When a member is absent its seats are dropped
  (`on_absent="drop"`) and its posts simply vanish from those reads; nothing else changes. A pattern read
  cannot leave out the reader, so where a member sees "all answers" its own is among them; its own previous
  text is then also given to it separately so it knows which one is its own.
- Stages are separated by joins: every seat of stage k waits for every present seat of stage k-1.
- A seat that belongs to the protocol rather than to a participant (aggregator, answerer, decider, ranker,
  fuser) is taken over by the first present member in pool order when its member is absent
  (`on_absent="substitute"`).
- The empty coalition has no graph (`restrict` returns None) and scores 0: no protocol here declares a
  member-free answer.

Debate, feedback, mixture-of-agents and knowledge card live in this module; topology, blackboard and
LLM-Blender (with the aggregators and router they register) in `colab_graphs.protocols.text_structured`; the
stage helpers both use in `colab_graphs.protocols.stages`. `majority_vote` is in `colab_graphs.protocols.basic`.
"""

from __future__ import annotations

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
from colab_graphs.registry import protocol
from colab_graphs.spec import GraphSpec

DEBATE_REVISE = (
    "{input}\n\n"
    "These are the answers of all agents in the previous round (yours is among them):\n\n{previous}\n\n"
    "Your previous answer was:\n{own}\n\n"
    "Use the other agents' reasoning as additional advice and give an updated answer. "
    "{answer_format}"
)
FEEDBACK_REVIEW = (
    "{input}\n\n"
    "Several agents answered this question:\n\n{answers}\n\n"
    "Give brief, specific feedback on each response, referring to it by its number: what is right, "
    "what is wrong, and how to fix it. Do not answer the question yourself."
)
FEEDBACK_REVISE = (
    "{input}\n\n"
    "Your answer was:\n{own}\n\n"
    "All answers, numbered as the reviewers saw them (yours is among them):\n\n{answers}\n\n"
    "Feedback from the reviewers on those answers:\n\n{reviews}\n\n"
    "Using the feedback on your answer, give a revised answer. {answer_format}"
)
MOA_SYNTHESIZE = (
    "{input}\n\n"
    "You have been given responses to this question from several models:\n\n{previous}\n\n"
    "Critically evaluate them (some may be wrong) and synthesize a single, accurate, well-reasoned "
    "answer; do not simply copy one of them. {answer_format}"
)
KNOWLEDGE_WRITE = (
    "{input}\n\n"
    "Do not answer the question. Write a short paragraph of background knowledge (facts, definitions, "
    "formulas) that would help someone answer it."
)
KNOWLEDGE_ANSWER = (
    "Knowledge from several sources (some of it may be irrelevant or wrong):\n\n{knowledge}\n\n"
    "Question: {input}\n\n"
    "Using the knowledge where it helps, answer the question. {answer_format}"
)


@protocol(
    "debate",
    family="text",
    description="Multi-agent debate: members answer, then revise over rounds seeing every answer of the "
    "previous round; majority vote over the last round.",
    min_members=2,
)
def debate(
    members: list[str], rounds: int = 2, prompt: str = ANSWER, revise_prompt: str = DEBATE_REVISE
) -> GraphSpec:
    """Multi-agent debate (Du et al., 2023), also called multi-agent refinement.

    Round 1: every member answers alone. Rounds 2..R: every member sees all answers of the previous round
    (a pattern read, so its own is among them, in pool order) and its own previous answer, and revises.
    The final answer is the majority vote over the last round (ties: pool order). For a variant in which a
    member sees only the others, or only some of them, use `topology`.

    Coalitions: an absent member's seats are dropped in every round, so its answers vanish from everyone's
    view and from the vote. A single member refines its own answer for R rounds. Empty coalition: 0.

    Args:
        rounds: number of rounds, including the first independent one (1 = majority vote).
        prompt: round-1 template (`{input}` and any example field).
        revise_prompt: template of rounds 2..R; reads `{previous}` (all answers of the previous round,
            numbered) and `{own}` (the member's previous answer).
    """
    members = check_members(members, "debate")
    check_count(rounds, "debate", "rounds")
    b = GraphBuilder("debate", members, description="multi-agent debate; vote over the last round")
    seats = add_stage(b, members, "r1", prompt, "debate:r1", None)
    for r in range(2, rounds + 1):
        reads = {"previous": f"debate:r{r - 1}:*"}
        seats = add_stage(
            b, members, f"r{r}", revise_prompt, f"debate:r{r}", seats, reads, f"debate:r{r - 1}"
        )
    return finish_with_vote(b, seats, f"debate:r{rounds}:*")


@protocol(
    "feedback",
    family="text",
    description="Multi-agent feedback: members answer, review all answers, then revise using the reviews; "
    "majority vote over the revisions.",
    min_members=2,
)
def feedback(
    members: list[str],
    rounds: int = 1,
    prompt: str = ANSWER,
    review_prompt: str = FEEDBACK_REVIEW,
    revise_prompt: str = FEEDBACK_REVISE,
) -> GraphSpec:
    """Multi-agent feedback: answer, give feedback to peers, revise.

    Every member answers; then every member reviews all answers (one call per reviewer covering every
    response, numbered in pool order); then every member revises its own answer given its answer, all the
    answers as numbered for the reviewers, and all reviews. One review seat per reviewer rather than one per
    (reviewer, target) pair keeps the calls at 3n per round and keeps coalitions exact: a per-pair seat
    would belong to the reviewer yet depend on the target. With `rounds` > 1, review and revision repeat on
    the latest answers. The final answer is the majority vote over the last revisions.

    Coalitions: an absent member's answer, review and revision seats are dropped; the others review and
    revise over the answers that remain. A single member reviews its own answer and revises it
    (self-refine). Empty coalition: 0.

    Args:
        rounds: review-and-revise rounds after the first answers.
        prompt: template of the first answers.
        review_prompt: reviewer template; reads `{answers}` (all current answers, numbered).
        revise_prompt: revision template; reads `{own}` (the member's current answer), `{answers}` and
            `{reviews}` (all reviews, numbered).
    """
    members = check_members(members, "feedback")
    check_count(rounds, "feedback", "rounds")
    b = GraphBuilder("feedback", members, description="answer, review all answers, revise; vote")
    seats = add_stage(b, members, "answer", prompt, "feedback:answer:0", None)
    for k in range(1, rounds + 1):
        answers = f"feedback:answer:{k - 1}"
        reviews = add_stage(
            b,
            members,
            f"review{k}",
            review_prompt,
            f"feedback:review:{k}",
            seats,
            {"answers": f"{answers}:*"},
        )
        reads = {"answers": f"{answers}:*", "reviews": f"feedback:review:{k}:*"}
        seats = add_stage(
            b, members, f"revise{k}", revise_prompt, f"feedback:answer:{k}", reviews, reads, answers
        )
    return finish_with_vote(b, seats, f"feedback:answer:{rounds}:*")


@protocol(
    "mixture_of_agents",
    family="text",
    description="Mixture-of-agents: layers of proposers, each seeing the previous layer's answers, then an "
    "aggregator member synthesises the final answer.",
    min_members=2,
)
def mixture_of_agents(
    members: list[str],
    layers: int = 2,
    aggregator: str | None = None,
    prompt: str = ANSWER,
    synthesize_prompt: str = MOA_SYNTHESIZE,
) -> GraphSpec:
    """Mixture-of-agents (Wang et al., 2024).

    Layer 1: every member proposes an answer. Layers 2..L: every member sees all proposals of the previous
    layer (numbered, pool order) and writes a synthesis. Then the aggregator seat synthesises the last layer
    into the final answer (the answer extracted from its text).

    Coalitions: an absent member's proposer seats are dropped in every layer. When the aggregator member is
    absent, the first present member in pool order takes the aggregator seat. A single member proposes,
    refines its own proposal through the layers, and aggregates it. Empty coalition: 0.

    Args:
        layers: proposer layers before the aggregator (1 = propose, then aggregate).
        aggregator: member in the aggregator seat (default: the first in pool order).
        prompt: layer-1 template.
        synthesize_prompt: template of layers 2..L and of the aggregator; reads `{previous}` (the previous
            layer's answers, numbered).
    """
    members = check_members(members, "mixture_of_agents")
    check_count(layers, "mixture_of_agents", "layers")
    agg = pick_member(members, aggregator, "mixture_of_agents", "aggregator")
    b = GraphBuilder("mixture_of_agents", members, description="proposer layers, then an aggregator")
    seats = add_stage(b, members, "l1", prompt, "moa:l1", None)
    for k in range(2, layers + 1):
        seats = add_stage(
            b, members, f"l{k}", synthesize_prompt, f"moa:l{k}", seats, {"previous": f"moa:l{k - 1}:*"}
        )
    b.seat(
        "aggregate",
        member=agg,
        prompt=synthesize_prompt,
        reads={"previous": f"moa:l{layers}:*"},
        writes="moa:aggregate",
        on_absent="substitute",
        role="aggregator",
    )
    b.edge(seats, "aggregate")
    return finish_with_extract(b, "aggregate", "moa:aggregate")


@protocol(
    "knowledge_card",
    family="text",
    description="Knowledge card: every member writes background knowledge; an answerer member answers "
    "using all of it.",
    min_members=1,
)
def knowledge_card(
    members: list[str],
    answerer: str | None = None,
    knowledge_prompt: str = KNOWLEDGE_WRITE,
    answer_prompt: str = KNOWLEDGE_ANSWER,
) -> GraphSpec:
    """Knowledge card (Feng et al., 2024): members act as knowledge sources for one answering member.

    Every member (the answerer included) writes a paragraph of knowledge relevant to the question without
    answering it; then the answerer answers, reading all knowledge (numbered, pool order). The answer
    extracted from its text is the final answer. The answerer defaults to the first member: put the member
    you trust to answer first in the pool, or name it.

    Coalitions: an absent member's knowledge seat is dropped. When the answerer is absent, the first present
    member in pool order answers. A single member writes knowledge for itself and then answers with it
    (generated-knowledge prompting). Empty coalition: 0.

    Args:
        answerer: member in the answering seat (default: the first in pool order).
        knowledge_prompt: template of the knowledge seats.
        answer_prompt: answerer template; reads `{knowledge}` (all knowledge paragraphs, numbered).
    """
    members = check_members(members, "knowledge_card")
    who = pick_member(members, answerer, "knowledge_card", "answerer")
    b = GraphBuilder("knowledge_card", members, description="members write knowledge; one answers with it")
    seats = add_stage(b, members, "knowledge", knowledge_prompt, "kc:knowledge", None)
    b.seat(
        "answer",
        member=who,
        prompt=answer_prompt,
        reads={"knowledge": "kc:knowledge:*"},
        writes="kc:answer",
        on_absent="substitute",
        role="answerer",
    )
    b.edge(seats, "answer")
    return finish_with_extract(b, "answer", "kc:answer")
