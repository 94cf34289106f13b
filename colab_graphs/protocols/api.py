"""API-level protocols: who answers. Prompt routing, cascade, switch generation.

These protocols decide which member writes the answer (or which part of it), not how members' texts are
combined. Each is a graph over ordinary seats, so it runs on any pool, and each states what a coalition
(a subset of the members) makes of it.
"""

from __future__ import annotations

from colab_graphs.builder import GraphBuilder
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.registry import protocol
from colab_graphs.spec import END, START, GraphSpec

ROUTER_PROMPT = (
    "A question must be answered by one of these models:\n{candidates}\n\n"
    "Question:\n{input}\n\n"
    "Which model is most likely to answer it correctly? Rank all of them, best first. Reply with the names "
    "only, comma-separated, and nothing else."
)

CASCADE_SELF_REPORTED = (
    "{input}\n\n{answer_format}\n"
    "Then, on a last line of its own, say how sure you are that the answer is right, as a number "
    "between 0 and 1: Confidence: <number>"
)

SWITCH_PROMPT = (
    "{input}\n\n"
    "You are writing one answer to this together with other models, taking turns. The answer so far:\n"
    "---\n{partial}\n---\n"
    "Write only the next part of it (a sentence or one step); do not repeat what is written. If the answer "
    "is complete with your part, finish it as asked: {answer_format}"
)


def _escape(text: str) -> str:
    """Literal text inside a str.format template (a description may contain braces)."""
    return text.replace("{", "{{").replace("}", "}}")


def _check_members(protocol_name: str, names: list[str], members: list[str], what: str) -> None:
    unknown = [n for n in names if n not in members]
    if unknown:
        raise ValueError(
            f"{protocol_name}: {what} names member(s) {', '.join(map(repr, unknown))} not in the pool "
            f"({', '.join(members)})"
        )


@protocol(
    "prompt_routing",
    family="api",
    description="A router member reads the candidates' descriptions and names who answers; only they answer.",
    min_members=1,
)
def prompt_routing(
    members: list[str],
    router: str | None = None,
    descriptions: dict | None = None,
    prompt: str = ANSWER,
    router_prompt: str = ROUTER_PROMPT,
) -> GraphSpec:
    """The router ranks the candidates; the highest-ranked candidate answers alone.

    The router sees each candidate's name and description and replies with the names ranked best first; the
    earliest-named candidate that is in the graph answers (a reply naming none goes to the first candidate).
    Coalitions: an absent candidate loses its path, so the router's next choice answers (the router's request
    is the same in every coalition, so audits share its cached call); an absent router member is replaced by
    the first present member; one member left answers alone after routing to itself.

    Args:
        router: the member in the router seat (default: the first in pool order).
        descriptions: member name -> what it is good at, shown to the router (default: names only). From
            Python, the pool's own: `{m.name: m.description for m in pool if m.description}`; from the CLI
            as JSON: -P 'descriptions={"coder": "writes Python"}'.
        prompt: the question template the chosen candidate answers.
        router_prompt: the router's template; `{candidates}` is the list of names and descriptions.
    """
    who = router or members[0]
    _check_members("prompt_routing", [who], members, "router")
    descriptions = dict(descriptions or {})
    _check_members("prompt_routing", list(descriptions), members, "descriptions")
    candidates = "\n".join(f"- {m}: {descriptions.get(m) or '(no description)'}" for m in members)
    b = GraphBuilder("prompt_routing", members=members, description="a router picks who answers")
    b.seat(
        "router",
        member=who,
        prompt=router_prompt.replace("{candidates}", _escape(candidates)),
        writes="route",
        on_absent="substitute",
        role="router",
    )
    answer_seats = {m: f"answer_{m}" for m in members}
    for m, seat in answer_seats.items():
        b.seat(seat, member=m, prompt=prompt, writes=f"answer:{m}", role="answer")
        b.edge(seat, "final")
    b.aggregate("final", "first", reads={"answer": "answer:*"}, writes="final", extract=True)
    b.edge(START, "router").edge("final", END)
    b.route("router", "match_name", answer_seats, key="route", on_target_absent="remove")
    return b.output("final").build()


@protocol(
    "cascade",
    family="api",
    description="Members answer from weak to strong; an unconfident answer defers to the next member.",
    min_members=1,
)
def cascade(
    members: list[str],
    order: list | None = None,
    threshold: float = 0.7,
    mode: str = "self_reported",
    prompt: str | None = None,
) -> GraphSpec:
    """Weak-to-strong cascade: each stage answers; a confident answer is final, otherwise the next stage tries.

    Confidence is self-reported ("Confidence: 0.8" at the end of the answer) or, in mode "logprob", the mean
    token probability of the answer (the seat asks the endpoint for logprobs; an endpoint that returns none
    defers). The last stage's answer is final whatever its confidence. Coalitions: an absent stage is skipped
    (its predecessor defers to the next present stage); one member left answers alone.

    Args:
        order: member names from weakest to strongest (default: pool order); members left out take no part.
            From the CLI: -P order=small,medium,large.
        threshold: confidence in [0, 1] at or above which a stage's answer is accepted.
        mode: "self_reported" (the prompt asks for a confidence) or "logprob" (mean token probability).
        prompt: the stage template (default: the answer prompt, plus the confidence request when
            self-reported).
    """
    if mode not in ("self_reported", "logprob"):
        raise ValueError(f"cascade: mode must be 'self_reported' or 'logprob', got {mode!r}")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"cascade: threshold must be in [0, 1], got {threshold!r}")
    if isinstance(order, str):  # -P order=a,b,c
        order = [name.strip() for name in order.split(",") if name.strip()]
    stages = list(order) if order else list(members)
    _check_members("cascade", stages, members, "order")
    if len(set(stages)) != len(stages):
        raise ValueError(f"cascade: order lists a member twice: {stages}")
    template = prompt or (CASCADE_SELF_REPORTED if mode == "self_reported" else ANSWER)
    settings = {"logprobs": True} if mode == "logprob" else {}
    # Pool order, whatever the stage order: coalitions and vote ties read members in pool order.
    b = GraphBuilder("cascade", members=[m for m in members if m in stages], description="weak to strong")
    names = [f"stage{i}_{m}" for i, m in enumerate(stages)]
    for i, (m, name) in enumerate(zip(stages, names, strict=True)):
        # Stage keys sort in stage order (writer order), so `last` over them is the last stage that ran.
        b.seat(name, member=m, prompt=template, writes=f"stage:{i}:{m}", settings=settings, role="stage")
    b.aggregate("final", "last", reads={"answers": "stage:*"}, writes="final", extract=True)
    b.edge(START, names[0]).edge(names[-1], "final").edge("final", END)
    signal = "self_reported" if mode == "self_reported" else "logprob"
    for i, name in enumerate(names[:-1]):
        b.route(
            name,
            "confidence",
            {"accept": "final", "defer": names[i + 1]},
            default=names[i + 1],
            key=f"stage:{i}:{stages[i]}",
            threshold=threshold,
            signal=signal,
            on_target_absent="skip",
            on_source_absent="defer",
        )
    return b.output("final").build()


@protocol(
    "switch_generation",
    family="api",
    description="Members take turns writing parts of one answer, each continuing the answer so far.",
    min_members=1,
)
def switch_generation(
    members: list[str],
    turns_per_member: int = 2,
    separator: str = "\n",
    prompt: str = SWITCH_PROMPT,
) -> GraphSpec:
    """Round-robin co-writing: turn k goes to member k mod n and continues the partial answer.

    Before each turn the parts written so far are joined into the draft the next member continues; the
    answer is extracted from the finished draft. Coalitions: an absent member's turns are dropped and the
    others keep their turns in the same order; one member left writes its own turns alone.

    Args:
        turns_per_member: how many turns each member takes.
        separator: what joins consecutive parts into the draft.
        prompt: the turn template; `{partial}` is the draft so far (empty on the first turn).
    """
    if turns_per_member < 1:
        raise ValueError(f"switch_generation: turns_per_member must be >= 1, got {turns_per_member}")
    b = GraphBuilder("switch_generation", members=members, description="members take turns writing")
    path: list[str] = []
    for k in range(turns_per_member * len(members)):
        m = members[k % len(members)]
        b.aggregate(
            f"draft_{k}", "concat", reads={"parts": "part:*"}, writes=f"draft:{k}", separator=separator
        )
        # Zero-padded turn numbers keep the parts in turn order wherever keys are compared as text.
        b.seat(
            f"turn{k}_{m}",
            member=m,
            prompt=prompt,
            reads={"partial": f"draft:{k}"},
            writes=f"part:{k:03d}:{m}",
            role="turn",
        )
        path += [f"draft_{k}", f"turn{k}_{m}"]
    b.aggregate("answer", "concat", reads={"parts": "part:*"}, writes="answer", separator=separator)
    b.aggregate("final", "extract", reads={"answer": "answer"}, writes="final")
    return b.chain(*path, "answer", "final").output("final").build()
