"""The team of `bench/crl_team.py`: questions by type, two scripted specialists, and the policy's two seats.

**Questions** (`questions`): four types, generated from a seed, answers exact integers.

| type | example | `adder` | `multiplier` |
|---|---|---|---|
| `add` (two-digit sum) | What is 47 + 38? | right | wrong: forgets a carry (+10) |
| `mul` (small x two-digit product) | What is 7 * 23? | wrong: one group too many (+ a) | right |
| `easy` (single-digit sum) | What is 4 + 5? | right | right |
| `sub` (a - b with a < b) | What is 23 - 61? | wrong: drops the sign (b - a) | wrong: the same b - a |

So exactly one teammate is right on `add` and `mul` (the policy's choice decides the team), both are right on
`easy` (the team is right whatever the policy does) and both are wrong *with the same answer* on `sub` (the team
is wrong whatever the policy does, right answer or not). No operand pair appears twice, in either order
(`question_key`): the held-out questions are never trained on, operand order included.

**Teammates** (`teammate`, registered as the scripted member script `crl_team_specialist`): they answer the way
models do, in one of several phrasings ("I get 85.", "Answer: **85**", "\\boxed{85}", ...) drawn from the
request's seed, so a rollout's replies (and hence the order they are shown in) vary with the rollout while
each one's answer is fixed by the question. Their names never reach the policy.

**Order** (`slot_order`): the teammates' replies are put in slots 1 and 2 by a hash of the question and each
reply's text: shuffled per question and, since the phrasing is drawn per rollout, per rollout; `swap=True`
reverses it (the position-swap evaluation). Which specialist sits in slot 1 is a coin flip per question.

**Seats** (the policy member holds one):

- `vote(members, policy="policy")` (proposer): the policy reads the question and the two teammates' answers in
  slot order and writes its own answer; the team's answer is the plurality of (slot 1, slot 2, the policy's
  answer), a three-way tie going to slot 1 (the order `team_vote` breaks ties in). The team is right when the
  policy sides with the right teammate, and also when it is wrong on its own but slot 1 is right; it is wrong
  on `sub` even when the policy is right. Without the policy, the teammates tie and slot 1 stands: the
  policy's leave-one-out value is the team minus "copy slot 1".
- `gate(members, policy="policy")` (critic): the teammate in slot 1 answers, the policy reads the question and
  that answer and says whether it is correct; accepted, it stands; rejected, slot 2's answer is the team's
  (`team_gate`). The team is right when the critic wrongly rejects a right answer on `easy` (slot 2 is right
  too), and wrong when it rightly rejects on `sub` (slot 2 is as wrong). Without the critic (or without a slot
  2), slot 1's answer stands: the critic's leave-one-out value is the team minus "always accept".

Coalitions (as the audit plays them): an absent teammate's seat is dropped and the slots hold the present ones;
no teammate at all leaves the team without an answer ("", scored 0) in the gate, and the policy's answer alone
in the vote.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections.abc import Sequence
from typing import Any

# Passive OpenMP waits before torch loads (the engine sets it too, but the trainer may load torch first): on
# this shared 2-core machine one LoRA forward and backward of 8 x 100 tokens took 100 s with spinning waits and
# 36 s without (load average 11-16).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import colab_graphs._env  # noqa: E402, F401  (process defaults before transformers / litellm load)
from colab_graphs.builder import GraphBuilder
from colab_graphs.protocols.prompts import ANSWER
from colab_graphs.registry import aggregator
from colab_graphs.spec import END, START, GraphSpec
from colab_graphs.tasks.task_types import TaskView
from colab_graphs.testing.scripts import SCRIPTS, Messages, last_user_text, unit_draw

TEAMMATES = ("adder", "multiplier")
KINDS = ("add", "mul", "easy", "sub")
MIX = {"add": 0.35, "mul": 0.30, "easy": 0.15, "sub": 0.20}
"""How often each question type is drawn (train and held out alike)."""

PHRASINGS = (
    "The answer is {a}.",
    "I get {a}.",
    "{a}",
    "Answer: **{a}**",
    "Let me work it out carefully. So the result is \\boxed{{{a}}}.",
    "Working it out step by step, the answer is {a}.",
)
"""How a teammate may word its reply (one per request, drawn from the request's seed)."""

VOTE = "{input}\n\nYour teammates answered:\n{slots}\n\nWhat is the correct answer? {answer_format}"
GATE = (
    "{input}\n\nA teammate answered: {slots}\n\nIs the teammate's answer correct? Reply with one word: "
    "correct or incorrect."
)

_QUESTION = re.compile(r"What is (-?\d+) ([+*-]) (-?\d+)\?")
_CUED = re.compile(r"(?:(\w+) question: )?(What is -?\d+ [+*-] -?\d+\?)")
"""A question, with the cue word of the `pick` setting before it or none."""


# --- questions -----------------------------------------------------------------------------------------------


def make_question(kind: str, rng: random.Random, big: bool = False) -> tuple[str, int, tuple]:
    """(question, answer, key) of one question of type `kind`; `key` is `question_key`'s.

    `big`: the transfer task's operands, three digits where the training questions have two (`easy` has no
    big form: its single-digit sums are what makes it easy)."""
    if kind == "easy" and big:
        raise ValueError("the transfer task has no easy questions")
    if kind == "add":
        a, b = (
            (rng.randint(100, 999), rng.randint(100, 999))
            if big
            else (rng.randint(10, 99), rng.randint(10, 99))
        )
        text, answer = f"What is {a} + {b}?", a + b
    elif kind == "mul":
        a, b = rng.randint(3, 12), rng.randint(101, 299) if big else rng.randint(11, 29)
        text, answer = f"What is {a} * {b}?", a * b
    elif kind == "easy":
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        text, answer = f"What is {a} + {b}?", a + b
    elif kind == "sub":
        a = rng.randint(100, 800) if big else rng.randint(10, 80)
        b = rng.randint(a + 5, 999) if big else rng.randint(a + 5, 99)
        text, answer = f"What is {a} - {b}?", a - b
    else:
        raise ValueError(f"unknown question type {kind!r}; types: {', '.join(KINDS)}")
    return text, answer, question_key(text)


def question_key(text: str) -> tuple:
    """What makes two questions the same: the operation and its operands, unordered for + and * (a `pick`
    question's cue word aside: no operand pair is asked twice under two cues).

    Raises:
        ValueError: `text` is not one of this module's questions.
    """
    cued = _CUED.fullmatch(" ".join(text.split()))
    match = _QUESTION.fullmatch(cued[2]) if cued else None
    if match is None:
        raise ValueError(f"not a team question: {text!r}")
    a, op, b = int(match[1]), match[2], int(match[3])
    return (op, *sorted((a, b))) if op in "+*" else (op, a, b)


def questions(n_train: int, n_eval: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """`n_train` training and `n_eval` held-out records (`id`, `input`, `answer`, `kind`), no question twice
    across both (`question_key`: operand order included). Held-out questions are drawn first, so a longer
    training list keeps the same held-out set."""
    rng = random.Random(f"crl-team:{seed}")
    seen: set[tuple] = set()
    out: dict[str, list[dict]] = {"eval": [], "train": []}
    kinds, weights = list(MIX), list(MIX.values())
    for split, n in (("eval", n_eval), ("train", n_train)):
        tries = 0
        while len(out[split]) < n:
            tries += 1
            if tries > 100 * (n + 10):
                raise ValueError(f"cannot draw {n} distinct {split} questions (the types are too small)")
            kind = rng.choices(kinds, weights)[0]
            text, answer, key = make_question(kind, rng)
            if key in seen:
                continue
            seen.add(key)
            out[split].append(
                {"id": f"{split}-{len(out[split])}", "input": text, "answer": str(answer), "kind": kind}
            )
    return out["train"], out["eval"]


TRANSFER_MIX = {"add": 0.40, "mul": 0.35, "sub": 0.25}
"""The transfer task's types (three-digit operands; no single-digit sums)."""


def transfer_questions(n: int, seed: int = 0) -> list[dict]:
    """`n` distinct questions of the transfer task (`kind` prefixed `big-`): the same skills, operands of three
    digits, so none is a training or held-out question. Exactly one teammate is right on `big-add` and
    `big-mul`, both are wrong alike on `big-sub`."""
    rng = random.Random(f"crl-team-transfer:{seed}")
    seen: set[tuple] = set()
    out: list[dict] = []
    kinds, weights = list(TRANSFER_MIX), list(TRANSFER_MIX.values())
    while len(out) < n:
        kind = rng.choices(kinds, weights)[0]
        text, answer, key = make_question(kind, rng, big=True)
        if key in seen:
            continue
        seen.add(key)
        out.append(
            {"id": f"transfer-{len(out)}", "input": text, "answer": str(answer), "kind": f"big-{kind}"}
        )
    return out


# --- teammates -----------------------------------------------------------------------------------------------


def specialist_answer(skill: str, text: str) -> int | None:
    """What the specialist `skill` ("add" or "mul") answers to question `text` (None: no question in it)."""
    match = _QUESTION.search(text)
    if match is None:
        return None
    a, op, b = int(match[1]), match[2], int(match[3])
    if op == "-":
        return abs(a - b)  # both specialists drop the sign
    if op == "+":
        single = a < 10 and b < 10
        return a + b if skill == "add" or single else a + b + 10
    return a * b if skill == "mul" else a * b + min(a, b)


def teammate(skill: str) -> Any:
    """A scripted member: the specialist `skill`'s answer, in a phrasing drawn from the request's seed."""
    if skill not in ("add", "mul"):
        raise ValueError(f"skill must be 'add' or 'mul', got {skill!r}")

    def script(messages: Messages, params: dict[str, Any]) -> str:
        text = last_user_text(messages)
        answer = specialist_answer(skill, text)
        if answer is None:
            return "I see no arithmetic question."
        pick = int(unit_draw("crl-team", skill, params.get("seed"), text) * len(PHRASINGS))
        return PHRASINGS[pick].format(a=answer)

    return script


SCRIPTS.setdefault("crl_team_specialist", teammate)


def teammate_configs() -> dict[str, dict]:
    """The training config's `scripted_members`."""
    return {
        "adder": {"script": "crl_team_specialist", "args": {"skill": "add"}},
        "multiplier": {"script": "crl_team_specialist", "args": {"skill": "mul"}},
    }


# --- slots and the fixed aggregators ------------------------------------------------------------------------


def _replies(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value] if value else []
    return [str(v) for v in items if v is not None and str(v).strip()]


def slot_order(question: str, replies: Sequence[str], swap: bool = False) -> list[str]:
    """The replies in slot order: sorted by sha256 of (question, reply), reversed when `swap`."""

    def rank(reply: str) -> bytes:
        return hashlib.sha256(f"{question}\x1f{reply}".encode()).digest()

    ordered = sorted(replies, key=rank)
    return ordered[::-1] if swap else ordered


def _answers(inputs: dict[str, Any], task: TaskView, swap: bool) -> list[str]:
    """The teammates' extracted answers in slot order ("" for a reply that commits to none)."""
    ordered = slot_order(str(inputs.get("question") or ""), _replies(inputs.get("replies")), swap)
    return [task.extract(r) or "" for r in ordered]


@aggregator("crl_team_slots")
def team_slots(
    inputs: dict[str, Any], *, task: TaskView, swap: bool = False, first_only: bool = False, **_: Any
) -> str:
    """What the policy is shown: "Teammate 1: 85\\nTeammate 2: 95" (vote), or slot 1's answer (gate)."""
    answers = _answers(inputs, task, swap)
    if first_only:
        return answers[0] if answers and answers[0] else "(none)"
    lines = [f"Teammate {i}: {a or '(no answer)'}" for i, a in enumerate(answers, 1)]
    return "\n".join(lines) or "(none)"


@aggregator("crl_team_vote")
def team_vote(inputs: dict[str, Any], *, task: TaskView, swap: bool = False, **_: Any) -> str:
    """Plurality of (slot 1, slot 2, the policy's answer); ties go to the earliest in that order.

    `TaskView.vote`: each reply's answer is what it commits to (the task's own extraction; a reply that commits
    to none casts no vote), answers are grouped by `task.same` (numbers compared as numbers)."""
    ordered = slot_order(str(inputs.get("question") or ""), _replies(inputs.get("replies")), swap)
    return task.vote([*ordered, str(inputs.get("proposal") or "")])


_NEGATIVE = re.compile(
    r"\b(incorrect|wrong|(?:not|isn'?t|is\s+not)\s+(?:correct|right)|false|no)\b", re.IGNORECASE
)
_POSITIVE = re.compile(r"\b(correct|right|true|yes)\b", re.IGNORECASE)


def verdict(reply: str) -> bool | None:
    """A critic's verdict: True (accept), False (reject), None (commits to neither).

    Defends against: a negated positive ("not correct", "isn't right" reject), a positive word inside a
    negative one ("incorrect" rejects), case and markup ("**Incorrect**"), and replies that say both or neither
    (the first verdict decides: "Not correct. The correct answer is 95." rejects; no verdict word is no verdict,
    and the answer stands: a critic that cannot decide does not overrule). It does not read reasoning: "It is
    correct that this is wrong" accepts.
    """
    text = reply or ""
    neg, pos = _NEGATIVE.search(text), _POSITIVE.search(text)
    if neg is None and pos is None:
        return None
    if neg is None:
        return True
    if pos is None:
        return False
    return pos.start() < neg.start()


@aggregator("crl_team_gate")
def team_gate(inputs: dict[str, Any], *, task: TaskView, swap: bool = False, **_: Any) -> str:
    """Slot 1's answer unless the critic rejects it and there is a slot 2, whose answer then stands."""
    answers = _answers(inputs, task, swap)
    if not answers:
        return ""
    rejected = verdict(str(inputs.get("verdict") or "")) is False
    return answers[1] if rejected and len(answers) > 1 else answers[0]


# --- the two graphs ------------------------------------------------------------------------------------------


def _team(name: str, members: list[str], policy: str, description: str) -> tuple[GraphBuilder, list[str]]:
    if policy not in members:
        raise ValueError(f"{name}: {policy!r} is not in the pool ({', '.join(members)})")
    mates = [m for m in members if m != policy]
    b = GraphBuilder(name, members=members, description=description)
    for m in mates:
        b.seat(f"answer_{m}", member=m, prompt=ANSWER, writes=f"answer:{m}")
        b.edge(START, f"answer_{m}")
    return b, mates


def vote(members: list[str], policy: str = "policy", swap: bool = False) -> GraphSpec:
    """The policy proposes an answer after reading its teammates'; a fixed plurality vote decides."""
    b, mates = _team("crl_team_vote", members, policy, "teammates answer; the policy proposes; plurality")
    reads = {"question": "input", "replies": "answer:*"}
    b.aggregate("slots", "crl_team_slots", reads=reads, writes="slots", swap=swap)
    b.edge([f"answer_{m}" for m in mates] or [START], "slots")
    b.seat("propose", member=policy, prompt=VOTE, reads={"slots": "slots"}, writes="proposal")
    b.aggregate("final", "crl_team_vote", reads={**reads, "proposal": "proposal?"}, writes="final", swap=swap)
    b.edge("slots", "propose").edge("propose", "final").edge("final", END)
    return b.output("final").build()


def gate(members: list[str], policy: str = "policy", swap: bool = False) -> GraphSpec:
    """Slot 1 answers; the policy, as critic, accepts or rejects; a rejection hands the answer to slot 2."""
    b, mates = _team("crl_team_gate", members, policy, "slot 1 answers; the policy critic gates it")
    reads = {"question": "input", "replies": "answer:*"}
    b.aggregate("slots", "crl_team_slots", reads=reads, writes="slots", swap=swap, first_only=True)
    b.edge([f"answer_{m}" for m in mates] or [START], "slots")
    b.seat("critic", member=policy, prompt=GATE, reads={"slots": "slots"}, writes="verdict")
    b.aggregate("final", "crl_team_gate", reads={**reads, "verdict": "verdict?"}, writes="final", swap=swap)
    b.edge("slots", "critic").edge("critic", "final").edge("final", END)
    return b.output("final").build()


# --- the pick seat: teammates under stable names, each reliable on the questions one cue word marks ---------

PICK_TEAMMATES = ("ana", "ben", "cal")
CUES = {"ana": ("farm", "garden"), "ben": ("ship", "harbor"), "cal": ("bank", "market")}
"""Each teammate is right on the questions of its two cue words and wrong (each in its own way) on the rest."""
OWNER = {cue: name for name, cues in CUES.items() for cue in cues}
OFFSETS = (-20, -11, -10, -9, -2, -1, 1, 2, 9, 10, 11, 20)
"""How far a wrong teammate's sum is off (two distinct ones per question, drawn from the question): the right
answer is no fixed rank among the three (not the middle, not the smallest), so no number comparison finds it."""
PICK = (
    "{input}\n\nYour teammates answered:\n{slots}\n\nOnly one of them is right. Which teammate is right? "
    "Reply with the teammate's name."
)
"""The `pick` seat's question: the right teammate's name (a cue word -> name mapping)."""
PICK_NUMBER = (
    "{input}\n\nYour teammates answered:\n{slots}\n\nOnly one of them is right. Which answer is right? "
    "Reply with that number."
)
"""The `pick_number` seat's question (the first version of the seat): the right teammate's number, i.e. the
mapping and copying that teammate's number from its line. Its positive control failed (docs/crl-study.md)."""
PICK_BRIEF = "{input}\n{slots}\nWho is right? Reply with a name."
"""The `pick_brief` seat's question: the `pick` seat's, worded in half the tokens (an update's cost grows with
the prompt: the rollouts' prefill and the training pass both run over it)."""
PICK_PERSONA = "Reply with one name."
"""The `pick_brief` policy's system prompt: without one, SmolLM2's chat template puts its own default persona
(15 tokens) before every prompt."""
PICK_SEATS = ("pick", "pick_number", "pick_brief")


def pick_question(cue: str, rng: random.Random) -> tuple[str, int, tuple]:
    """(question, answer, key) of one `pick` question: a two-digit sum marked by a cue word."""
    if cue not in OWNER:
        raise ValueError(f"unknown cue {cue!r}; cues: {', '.join(OWNER)}")
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    text = f"{cue.capitalize()} question: What is {a} + {b}?"
    return text, a + b, question_key(text)


def pick_questions(n_train: int, n_eval: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """`n_train` training and `n_eval` held-out `pick` records (`id`, `input`, `answer`, `kind`: the teammate
    who is right, `cue`), the cue words in turn (so every teammate owns a third of each split), no operand
    pair twice across both (held out drawn first)."""
    rng = random.Random(f"crl-team-pick:{seed}")
    cues = list(OWNER)
    seen: set[tuple] = set()
    out: dict[str, list[dict]] = {"eval": [], "train": []}
    for split, n in (("eval", n_eval), ("train", n_train)):
        while len(out[split]) < n:
            cue = cues[len(out[split]) % len(cues)]
            text, answer, key = pick_question(cue, rng)
            if key in seen:
                continue
            seen.add(key)
            out[split].append(
                {
                    "id": f"{split}-{len(out[split])}",
                    "input": text,
                    "answer": str(answer),
                    "kind": OWNER[cue],
                    "cue": cue,
                }
            )
    return out["train"], out["eval"]


def pick_answers(text: str) -> dict[str, int] | None:
    """What each `pick` teammate answers to `text` (None: not a cued sum): the cue's owner the sum, the
    other two the sum off by two distinct offsets drawn from the question."""
    cued = _CUED.search(text)
    match = _QUESTION.fullmatch(cued[2]) if cued and cued[1] else None
    if cued is None or match is None or match[2] != "+" or cued[1].lower() not in OWNER:
        return None
    total = int(match[1]) + int(match[3])
    owner = OWNER[cued[1].lower()]
    offsets = random.Random(hashlib.sha256(cued[0].encode()).digest()).sample(OFFSETS, 2)
    wrong = iter(offsets)
    return {name: total if name == owner else total + next(wrong) for name in PICK_TEAMMATES}


def pick_teammate(name: str) -> Any:
    """A scripted `pick` teammate: its answer, in a phrasing drawn from the request's seed."""
    if name not in PICK_TEAMMATES:
        raise ValueError(f"name must be one of {', '.join(PICK_TEAMMATES)}, got {name!r}")

    def script(messages: Messages, params: dict[str, Any]) -> str:
        text = last_user_text(messages)
        answers = pick_answers(text)
        if answers is None:
            return "I see no question I can answer."
        pick = int(unit_draw("crl-team-pick", name, params.get("seed"), text) * len(PHRASINGS))
        return PHRASINGS[pick].format(a=answers[name])

    return script


SCRIPTS.setdefault("crl_team_pick_specialist", pick_teammate)


def pick_named(question: str, names: Sequence[str], swap: bool = False) -> list[str]:
    """The present teammates in display order: by sha256 of (question, name), reversed when `swap`
    (shuffled per question, the same in every rollout of it)."""
    ordered = sorted(names, key=lambda n: hashlib.sha256(f"{question}\x1f{n}".encode()).digest())
    return ordered[::-1] if swap else ordered


def _named_answers(inputs: dict[str, Any], task: TaskView, swap: bool) -> list[tuple[str, str]]:
    """(name, extracted answer) of each present teammate in display order."""
    present = [n for n in PICK_TEAMMATES if str(inputs.get(n) or "").strip()]
    order = pick_named(str(inputs.get("question") or ""), present, swap)
    return [(n, task.extract(str(inputs[n])) or "") for n in order]


@aggregator("crl_team_named")
def team_named(inputs: dict[str, Any], *, task: TaskView, swap: bool = False, **_: Any) -> str:
    """What the policy is shown: "Ana: 85\nCal: 95\nBen: 75" (present teammates, display order)."""
    lines = [f"{n.capitalize()}: {a or '(no answer)'}" for n, a in _named_answers(inputs, task, swap)]
    return "\n".join(lines) or "(none)"


_NAME = re.compile(r"\b(" + "|".join(PICK_TEAMMATES) + r")\b", re.IGNORECASE)


def picked(
    reply: str, named: Sequence[tuple[str, str]], task: TaskView, first: str = "name"
) -> tuple[str, str]:
    """(teammate, how) a reply picks among `named` (display order): the one teammate it names ("name"), or the
    teammate whose answer it commits to ("number"), in the order `first` says (what the seat asks for comes
    first: a name in `pick`, "Ben: 129" picking Ben; a number in `pick_number`, picking 129's teammate), else
    the first shown ("none").

    Defends against: a number no teammate gave (no pick: the first shown stands), a reply naming two or
    more teammates ("Ana or Ben"), a name inside another word ("Banana" names nobody), and a number that two
    teammates share (the first shown of them)."""
    if not named:
        return "", "none"

    def by_number() -> str | None:
        answer = task.extract(reply or "")
        for name, given in named:
            if answer and given and task.same(given, answer):
                return name
        return None

    def by_name() -> str | None:
        names = {m.lower() for m in _NAME.findall(reply or "")} & {n for n, _ in named}
        return names.pop() if len(names) == 1 else None

    readers = {"name": by_name, "number": by_number}
    for how in (first, *(k for k in readers if k != first)):
        chosen = readers[how]()
        if chosen is not None:
            return chosen, how
    return named[0][0], "none"


@aggregator("crl_team_pick")
def team_pick(
    inputs: dict[str, Any],
    *,
    task: TaskView,
    swap: bool = False,
    first: str = "name",
    unpicked: str = "first",
    **_: Any,
) -> str:
    """The answer of the teammate the policy picks (`picked`); no pick, the first shown teammate's
    (`unpicked="first"`) or no answer at all (`unpicked="none"`: the team is wrong)."""
    named = _named_answers(inputs, task, swap)
    name, how = picked(str(inputs.get("choice") or ""), named, task, first)
    if how == "none" and unpicked == "none":
        return ""
    return dict(named).get(name, "")


def pick(
    members: list[str],
    policy: str = "policy",
    swap: bool = False,
    ask: str = PICK,
    first: str = "name",
    unpicked: str = "first",
) -> GraphSpec:
    """Three named teammates answer; the policy, shown their answers by name, picks one; that one stands."""
    b, mates = _team("crl_team_pick", members, policy, "named teammates answer; the policy picks one")
    reads = {"question": "input", **{m: f"answer:{m}?" for m in PICK_TEAMMATES}}
    b.aggregate("slots", "crl_team_named", reads=reads, writes="slots", swap=swap)
    b.edge([f"answer_{m}" for m in mates] or [START], "slots")
    b.seat("pick", member=policy, prompt=ask, reads={"slots": "slots"}, writes="choice")
    final = {**reads, "choice": "choice?"}
    b.aggregate(
        "final", "crl_team_pick", reads=final, writes="final", swap=swap, first=first, unpicked=unpicked
    )
    b.edge("slots", "pick").edge("pick", "final").edge("final", END)
    return b.output("final").build()


def pick_number(members: list[str], policy: str = "policy", swap: bool = False) -> GraphSpec:
    """The `pick` team, the policy asked for the right teammate's number instead of its name."""
    return pick(members, policy, swap, ask=PICK_NUMBER, first="number")


def pick_brief(members: list[str], policy: str = "policy", swap: bool = False) -> GraphSpec:
    """The `pick` team with the seat's question worded briefly (`PICK_BRIEF`; the policy's persona is
    `PICK_PERSONA`, set in its pool entry by the study), and a reply that picks nobody leaving the team without
    an answer: in `pick` it handed the first shown teammate the question, which the team reward paid a third of
    the time, more than naming Ben always (docs/crl-study.md: C-RL learnt to name nobody, and then every group
    scored alike)."""
    return pick(members, policy, swap, ask=PICK_BRIEF, unpicked="none")


GRAPHS = {"vote": vote, "gate": gate, "pick": pick, "pick_number": pick_number, "pick_brief": pick_brief}
TEAMS = {
    "vote": TEAMMATES,
    "gate": TEAMMATES,
    **{s: PICK_TEAMMATES for s in ("pick", "pick_number", "pick_brief")},
}
"""The teammates of each setting's team."""


def teammates_of(setting: str) -> dict[str, dict]:
    """The training config's `scripted_members` for `setting`."""
    if setting in PICK_SEATS:
        return {n: {"script": "crl_team_pick_specialist", "args": {"name": n}} for n in PICK_TEAMMATES}
    return teammate_configs()
