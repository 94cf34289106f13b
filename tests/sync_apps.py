"""LangGraph apps whose nodes are plain sync functions, written as LangGraph's tutorials write them, for the
audits of tests/test_app_sync.py (run through the CLI: ``colab-graphs audit --app tests/sync_apps.py:NAME``).

Their members are pool members "a", "b" and "c" (`colab_graphs.member_chat_model`), served by the scripted
server; each test says what each member answers and works the audit's values out by hand.

- `fan_out`: 16 sync workers at once via `Send` (more sync nodes in flight than any thread pool of asyncio's
  default size has threads), worker i asking member ("a", "b", "c")[i % 3]; the answer is the strict
  majority of the workers' answers.
- `vote`: three sync voter nodes in parallel, the third running a sub-graph of its own with `invoke`; the
  answer is the strict majority.
- `map_reduce`: the map-reduce tutorial's shape: split the question into its bracketed sub-problems, `Send`
  each to a sync solver (member "a", or "b" when "a" is absent: the app catches `MemberAbsent`), then member
  "c" combines their results.
- `call_styles`: one sync node asking "a" with `stream`, "b" with `batch` and "c" with `invoke` in a thread
  the node starts (with its context, as a thread must be started to carry the audit's coalition); the
  strict majority.
- `stalled`: a sync node that waits forever on an `Event` after a draft by member "a".
"""

from __future__ import annotations

import contextvars
import operator
import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

import colab_graphs as cg

MEMBERS = {name: cg.member_chat_model(name, on_absent="empty") for name in ("a", "b", "c")}


def stated_answer(text: str) -> str | None:
    """The number a reply commits to ("... the answer is 391."), None when it commits to none."""
    found = re.findall(r"answer is (-?\d+)", text)
    return found[-1] if found else None


def majority(replies: list[str]) -> str:
    """The answer more than half of the non-empty replies state, else no answer."""
    stated = [stated_answer(r) for r in replies if r]
    counts = Counter(a for a in stated if a is not None)
    if not counts:
        return "No member answered."
    best, votes = counts.most_common(1)[0]
    return f"The answer is {best}." if votes * 2 > len(stated) else "The members did not agree."


# --- fan_out ---------------------------------------------------------------------------------------------

WORKERS = 16


class FanState(TypedDict, total=False):
    input: str
    replies: Annotated[list[str], operator.add]
    answer: str


class WorkerJob(TypedDict):
    input: str
    worker: int


def assign_workers(state: FanState) -> list[Send]:
    return [Send("worker", {"input": state["input"], "worker": i}) for i in range(WORKERS)]


def worker(job: WorkerJob) -> FanState:
    llm = MEMBERS[("a", "b", "c")[job["worker"] % 3]]
    reply = llm.invoke(f"{job['input']}\n(You are worker {job['worker']} of {WORKERS}.)")
    return {"replies": [reply.text]}


def tally(state: FanState) -> FanState:
    return {"answer": majority(state["replies"])}


def map_then_reduce(name: str, state: type, route: Any, work: Any, reduce: Any) -> Any:
    """START -> `route` (a list of `Send`s to `work`) -> `work` x N -> `reduce` -> END."""
    mapped, reduced = work.__name__, reduce.__name__
    return (
        StateGraph(state)
        .add_node(mapped, work)
        .add_node(reduced, reduce)
        .add_conditional_edges(START, route, [mapped])
        .add_edge(mapped, reduced)
        .add_edge(reduced, END)
        .compile(name=name)
    )


fan_out = map_then_reduce("fan_out", FanState, assign_workers, worker, tally)

# --- vote ------------------------------------------------------------------------------------------------


class VoteState(TypedDict, total=False):
    input: str
    votes: Annotated[list[str], operator.add]
    answer: str


def voter_a(state: VoteState) -> VoteState:
    return {"votes": [MEMBERS["a"].invoke(state["input"]).text]}


def voter_b(state: VoteState) -> VoteState:
    return {"votes": [MEMBERS["b"].invoke(state["input"]).text]}


class SecondOpinion(TypedDict, total=False):
    question: str
    opinion: str


def ask_c(state: SecondOpinion) -> SecondOpinion:
    return {"opinion": MEMBERS["c"].invoke(state["question"]).text}


second_opinion = StateGraph(SecondOpinion).add_node("ask_c", ask_c).add_edge(START, "ask_c").compile()


def voter_c(state: VoteState) -> VoteState:
    return {"votes": [second_opinion.invoke({"question": state["input"]})["opinion"]]}


def count_votes(state: VoteState) -> VoteState:
    return {"answer": majority(state["votes"])}


vote = (
    StateGraph(VoteState)
    .add_node("voter_a", voter_a)
    .add_node("voter_b", voter_b)
    .add_node("voter_c", voter_c)
    .add_node("count_votes", count_votes)
    .add_edge(START, "voter_a")
    .add_edge(START, "voter_b")
    .add_edge(START, "voter_c")
    .add_edge(["voter_a", "voter_b", "voter_c"], "count_votes")
    .add_edge("count_votes", END)
    .compile(name="vote")
)

# --- map_reduce ------------------------------------------------------------------------------------------

solver = cg.member_chat_model("a")  # raises MemberAbsent when "a" is absent: the app asks "b" instead
backup = cg.member_chat_model("b")
combiner = MEMBERS["c"]


class MapState(TypedDict, total=False):
    input: str
    results: Annotated[list[tuple[int, str]], operator.add]
    answer: str


class SubProblem(TypedDict):
    index: int
    problem: str


def split(state: MapState) -> list[Send]:
    problems = re.findall(r"\(([^()]+)\)", state["input"])
    return [Send("solve", {"index": i, "problem": p}) for i, p in enumerate(problems)]


def solve(job: SubProblem) -> MapState:
    question = f"What is {job['problem']}?"
    try:
        reply = solver.invoke(question).text
    except cg.MemberAbsent:
        try:
            reply = backup.invoke(question).text
        except cg.MemberAbsent:
            return {"results": []}
    return {"results": [(job["index"], stated_answer(reply) or "")]}


def combine(state: MapState) -> MapState:
    results = [r for _, r in sorted(state.get("results") or [])]
    if len(results) != 2 or not all(results):
        return {"answer": "I could not solve every part."}
    return {"answer": combiner.invoke(f"What is {results[0]} + {results[1]}?").text}


map_reduce = map_then_reduce("map_reduce", MapState, split, solve, combine)

# --- call_styles -----------------------------------------------------------------------------------------


class PollState(TypedDict, total=False):
    input: str
    answer: str


def poll(state: PollState) -> PollState:
    question = state["input"]
    streamed = "".join(chunk.text for chunk in MEMBERS["a"].stream(question))
    batched = MEMBERS["b"].batch([question, f"{question} Please check your work."])
    with ThreadPoolExecutor(max_workers=1) as pool:  # a thread of the node's own, started with its context
        threaded = pool.submit(contextvars.copy_context().run, MEMBERS["c"].invoke, question).result()
    return {"answer": majority([streamed, batched[1].text, threaded.text])}


call_styles = StateGraph(PollState).add_node(poll).add_edge(START, "poll").compile(name="call_styles")

# --- stalled ---------------------------------------------------------------------------------------------

never = threading.Event()


class DraftState(TypedDict, total=False):
    input: str
    draft: str
    answer: str


def draft(state: DraftState) -> DraftState:
    return {"draft": MEMBERS["a"].invoke(state["input"]).text}


def wait_for_review(state: DraftState) -> DraftState:
    never.wait()  # nobody ever sets it: the play stalls here
    return {"answer": state["draft"]}


stalled = (
    StateGraph(DraftState)
    .add_node("draft", draft)
    .add_node("wait_for_review", wait_for_review)
    .add_edge(START, "draft")
    .add_edge("draft", "wait_for_review")
    .compile(name="stalled")
)
