"""Apps audited with their own state: input and answer mapped (keys, messages mode, langgraph.json), apps
compiled with a checkpointer, `interrupt()`, a broken contract failing loudly, and an app scored once.

The apps are tests/fixtures/apps (written as LangGraph's tutorials write them, no wrapper for the audit); the
members are scripted over real HTTP and reply as models do:

- "adder" solves sums and differences in prose ("... The answer is 7.") and guesses a product wrong ("I would
  guess 100"); it answers the first question in its context (it stands for a model thrown by a conversation
  that is not the user's: any history leaked from another play changes its answer);
- "multiplier" solves products with `\\boxed{}` and has nothing to say about anything else.

The data are the first four built-in arithmetic problems: 5 + 2, 7 + 3, 62 - 31, 11 * 10 (three for the adder,
one for the multiplier). Every expected value below is worked out by hand from that.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import write_pool_file
from typer.testing import CliRunner

import colab_graphs as cg
from colab_graphs.cli.app import _register_optional_commands
from colab_graphs.cli.app import app as cli
from colab_graphs.models.client import ModelClient
from colab_graphs.testing.scripts import Member, message_text

pytestmark = pytest.mark.integration

APPS = Path(__file__).resolve().parent / "fixtures" / "apps"
TUTORIAL = APPS / "tutorial_apps.py"
DEPLOYMENT = APPS / "deployment" / "langgraph.json"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DATA = ["--data", "builtin:arithmetic", "--limit", "4"]
EXPRESSION = re.compile(r"(\d+)\s*([+*-])\s*(\d+)")


def _user_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [message_text(m) for m in messages if m.get("role") == "user"]


def _solve(text: str) -> tuple[str, int] | None:
    match = EXPRESSION.search(text)
    if match is None:
        return None
    a, op, b = int(match[1]), match[2], int(match[3])
    return op, a + b if op == "+" else a - b if op == "-" else a * b


def adder(messages: list[dict[str, Any]], params: dict[str, Any]) -> str:
    solved = _solve(_user_texts(messages)[0])  # the first question in its context
    if solved is None or solved[0] == "*":
        return "Multiplication is not my strength, but I would guess 100."
    return f"Working it out step by step, I get {solved[1]}.\n\nThe answer is {solved[1]}."


def multiplier(messages: list[dict[str, Any]], params: dict[str, Any]) -> str:
    solved = _solve(_user_texts(messages)[-1])
    if solved is None or solved[0] != "*":
        return "I only check products, so I have nothing to add here."
    return f"Multiplying the two factors gives the product: \\boxed{{{solved[1]}}}."


@pytest.fixture
def team(scripted_server, tmp_path, monkeypatch):
    """(server, pool file) of the two scripted members, and a call cache of the test's own."""
    server = scripted_server({"adder": Member(adder), "multiplier": Member(multiplier)})
    pool = write_pool_file(tmp_path / "pool.yaml", server, ["adder", "multiplier"])
    monkeypatch.setenv("COLAB_GRAPHS_CACHE_DIR", str(tmp_path / "cache"))
    _register_optional_commands()
    return server, pool


def invoke(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def audit(pool: Path, out: Path, app: str, *options: str) -> Any:
    return invoke("audit", "--app", app, "--pool", pool, *DATA, "--method", "exact", "--no-plots", "--out", out,
                  *options)  # fmt: skip


def said(result: Any) -> str:
    return " ".join(result.output.split())


def report_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "report.json").read_text())


def values(report: dict[str, Any]) -> dict[tuple[str, ...], float]:
    return {tuple(c["members"]): c["value"] for c in report["coalitions"]}


def test_a_messages_state_app_with_no_wrapper_is_detected_and_audited_to_its_values(team, tmp_path):
    # The router sends 11 * 10 to the multiplier and the rest to the adder; an absent member's node is taken
    # by the other. Alone, the adder gets 3 of 4 (it guesses the product wrong), the multiplier 1 of 4 (it has
    # nothing to say about sums); together 4 of 4. Shapley adder (3/4 + 3/4) / 2 = 3/4, multiplier 1/4; LOO
    # the same (v(all) - v(other)). The answer is the last AI message's text.
    server, pool = team
    result = audit(pool, tmp_path / "out", f"{TUTORIAL}:router")
    assert result.exit_code == 0, result.output
    assert "its input schema has 'messages' and no 'input': auditing it as a MessagesState app" in said(
        result
    )
    report = report_of(tmp_path / "out")
    assert values(report) == pytest.approx(
        {(): 0.0, ("adder",): 0.75, ("multiplier",): 0.25, ("adder", "multiplier"): 1.0}
    )
    assert report["shapley"] == pytest.approx({"adder": 0.75, "multiplier": 0.25})
    assert report["loo"] == pytest.approx({"adder": 0.75, "multiplier": 0.25})
    assert report["individual"] == pytest.approx({"adder": 0.75, "multiplier": 0.25})
    assert report["protocol_params"] == {"mode": "messages", "detected": True}
    assert report["calls"]["made"] == report["calls"]["unique"] == len(server.request_counts())


def test_the_supervisor_tutorials_messages_graph_audits_as_its_wrapped_app_does(scripted_server, pool_for):
    # examples/agent_app.py's `team` is LangGraph's supervisor tutorial graph as written (MessagesState, no
    # wrapper); `app` wraps it to read `input` and write `answer`. Both are the same game: the hand-computed
    # Shapley values of tests/test_app_audit.py (supervisor 4/9, researcher 5/18, mathematician 5/18).
    from colab_graphs.testing.scripts import load_members

    members = load_members(f"{EXAMPLES}/agent_members.py:SUPERVISOR_TEAM")
    pool = pool_for(scripted_server(members), list(members))
    report = cg.run_audit(
        app=f"{EXAMPLES}/agent_app.py:team", pool=pool, data=str(EXAMPLES / "agent_questions.jsonl"),
        method="exact", individual=False, client=ModelClient(None), progress=False,
    )  # fmt: skip
    assert report.protocol_params == {"mode": "messages", "detected": True}
    assert report.shapley == pytest.approx(
        {"supervisor": 4 / 9, "researcher": 5 / 18, "mathematician": 5 / 18}
    )


def test_an_app_with_its_own_keys_is_audited_through_the_mapping(team, tmp_path):
    # `reviewed` reads `question` and writes `final_answer`: the adder drafts (no draft, no answer: it raises
    # MemberAbsent), the multiplier's boxed review replaces a draft, else the draft stands (an absent reviewer
    # answers empty). v(adder) = 3/4, v(multiplier) = 0, v(both) = 1: Shapley adder (3/4 + 1) / 2 = 7/8,
    # multiplier (0 + 1/4) / 2 = 1/8; LOO adder 1, multiplier 1/4.
    server, pool = team
    out = tmp_path / "out"
    result = audit(
        pool, out, f"{TUTORIAL}:reviewed", "--input-key", "question", "--answer-key", "final_answer"
    )
    assert result.exit_code == 0, result.output
    report = report_of(out)
    assert values(report) == pytest.approx(
        {(): 0.0, ("adder",): 0.75, ("multiplier",): 0.0, ("adder", "multiplier"): 1.0}
    )
    assert report["shapley"] == pytest.approx({"adder": 7 / 8, "multiplier": 1 / 8})
    assert report["loo"] == pytest.approx({"adder": 1.0, "multiplier": 0.25})
    assert report["protocol_params"] == {
        "mode": "keys",
        "input_key": "question",
        "answer_key": "final_answer",
    }
    # The same mapping through the API gives the same game.
    api = cg.run_audit(
        app=f"{TUTORIAL}:reviewed", pool=pool, data="builtin:arithmetic", limit=4, method="exact",
        input_key="question", answer_key="final_answer", individual=False, progress=False,
    )  # fmt: skip
    assert api.shapley == pytest.approx(report["shapley"]) and api.loo == pytest.approx(report["loo"])


def test_an_unmapped_app_fails_before_any_call_naming_its_keys(team, tmp_path):
    server, pool = team
    result = audit(pool, tmp_path / "out", f"{TUTORIAL}:reviewed")
    assert result.exit_code == 2, result.output
    text = said(result)
    assert "input schema has keys draft, final_answer, question, review and no 'input'" in text
    assert "the audit sends ({'input': question}); pass --input-key question" in text
    assert "no 'answer', where the audit reads the answer; pass --answer-key final_answer" in text
    assert server.chat_requests == [] and not (tmp_path / "out" / "report.json").exists()
    from colab_graphs.audit.app_contract import AppContractError

    with pytest.raises(AppContractError, match="pass --answer-key final_answer .answer_key='final_answer'"):
        cg.run_audit(
            app=f"{TUTORIAL}:reviewed", pool=pool, data="builtin:arithmetic", limit=4, progress=False
        )


@pytest.mark.parametrize(
    ("app", "message", "mapping"),
    [
        # `unwritten` declares `answer` but writes `final_answer`: only a run shows it. Never an all-zero report.
        (
            "unwritten",
            "the app's final state has keys final_answer, input and no 'answer', where the audit reads the "
            "answer; pass --answer-key final_answer",
            ["--answer-key", "final_answer"],
        ),
        # A StateGraph(dict) has no schema to check: the KeyError its node raises says what the audit sends.
        (
            "dict_state",
            "the app raised KeyError: 'question': the audit sends the question as {'input': question} and "
            "nothing else; if the app reads its question from 'question', pass --input-key question",
            ["--input-key", "question"],
        ),
    ],
)
def test_a_contract_only_a_run_shows_fails_on_the_first_example_and_the_mapping_fixes_it(
    team, tmp_path, app, message, mapping
):
    server, pool = team
    result = audit(pool, tmp_path / "out", f"{TUTORIAL}:{app}")
    assert result.exit_code == 2, result.output
    assert message in said(result)
    assert not (tmp_path / "out" / "report.json").exists()
    # Mapped, the same app is audited: the adder alone drafts 3 of 4; without it there is no answer.
    again = audit(pool, tmp_path / "out", f"{TUTORIAL}:{app}", *mapping)
    assert again.exit_code == 0, again.output
    assert report_of(tmp_path / "out")["loo"] == pytest.approx({"adder": 0.75, "multiplier": 0.0})


def test_an_app_with_a_checkpointer_gets_a_fresh_thread_per_play_and_nothing_leaks(team, tmp_path, arun):
    # The memory chatbot (MemorySaver): the adder answers, the multiplier stands in without it. v(adder) = 3/4,
    # v(multiplier) = 1/4, v(both) = 3/4 (the adder answers): Shapley adder (3/4 + 1/2) / 2 = 5/8, multiplier
    # 1/8; LOO adder 1/2, multiplier 0.
    server, pool = team
    from colab_graphs.audit.app_load import load_app

    chatbot, _ = load_app(f"{TUTORIAL}:chatbot")
    saver = chatbot.checkpointer
    threads: list[str] = []
    put = saver.aput

    async def recording_put(config, *args, **kwargs):
        threads.append(config["configurable"]["thread_id"])
        return await put(config, *args, **kwargs)

    saver.aput = recording_put
    report = cg.run_audit(chatbot, pool, "builtin:arithmetic", limit=4, method="exact", progress=False,
                          client=ModelClient(None))  # fmt: skip
    assert {tuple(c.members): c.value for c in report.coalitions} == pytest.approx(
        {(): 0.0, ("adder",): 0.75, ("multiplier",): 0.25, ("adder", "multiplier"): 0.75}
    )
    assert report.shapley == pytest.approx({"adder": 5 / 8, "multiplier": 1 / 8})
    assert report.loo == pytest.approx({"adder": 0.5, "multiplier": 0.0})
    assert len(set(threads)) == 3 * 4  # one thread per coalition and example (the empty one never plays)
    assert dict(saver.storage) == {}  # every play's thread was deleted when it ended
    # The same app file through the CLI (before: "Checkpointer requires ... thread_id", exit 3).
    result = audit(pool, tmp_path / "cli", f"{TUTORIAL}:chatbot", "--no-individual")
    assert result.exit_code == 0, result.output
    assert report_of(tmp_path / "cli")["shapley"] == pytest.approx(report.shapley)
    # Leakage would change the values: two questions on one thread, and the second gets the first's answer.
    config = {"configurable": {"thread_id": "shared"}}
    with cg.use_pool(pool, ModelClient(None)):
        first = arun(chatbot.ainvoke({"messages": [("user", "What is 5 + 2?")]}, config))
        second = arun(chatbot.ainvoke({"messages": [("user", "What is 7 + 3?")]}, config))
    assert first["messages"][-1].text.endswith("The answer is 7.")
    assert second["messages"][-1].text.endswith("The answer is 7.")  # not 10: the thread's history leaked


def test_an_interrupt_is_an_error_naming_the_node(team, tmp_path):
    from langgraph.types import interrupt

    server, pool = team
    args = ["--input-key", "question", "--answer-key", "final_answer"]
    result = audit(pool, tmp_path / "out", f"{TUTORIAL}:reviewed_by_a_human", *args)
    assert result.exit_code == 2, result.output
    text = said(result)
    assert "the app called interrupt() in node 'human_review' asking {'question': 'What is" in text
    assert "an audit plays the app unattended" in text
    assert not (tmp_path / "out" / "report.json").exists()
    # In a subgraph, the node that called it is named with the node it ran inside.
    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    from colab_graphs.audit.app_contract import AppContractError

    class State(TypedDict, total=False):
        input: str
        answer: str

    def ask_human(state: State) -> State:
        return {"answer": interrupt(f"Answer {state['input']} for me?")}

    approval = StateGraph(State).add_node(ask_human).add_edge(START, "ask_human").compile()
    app = StateGraph(State).add_node("approval", approval).add_edge(START, "approval").compile()
    with pytest.raises(
        AppContractError, match=r"interrupt\(\) in node 'ask_human' \(inside 'approval'\) asking"
    ):
        cg.run_audit(app, pool, "builtin:arithmetic", limit=1, individual=False, progress=False)


def test_a_langgraph_deployment_file_names_the_app(team, tmp_path):
    # langgraph.json's "agent" is ./src/agent/graph.py:graph (a MessagesState agent importing its prompts
    # through the deployment's "dependencies"); its values are the chatbot's: Shapley 5/8, 1/8; LOO 1/2, 0.
    server, pool = team
    result = audit(pool, tmp_path / "out", f"{DEPLOYMENT}:agent")
    assert result.exit_code == 0, result.output
    report = report_of(tmp_path / "out")
    assert report["protocol"] == "agent"
    assert report["shapley"] == pytest.approx({"adder": 5 / 8, "multiplier": 1 / 8})
    assert report["loo"] == pytest.approx({"adder": 0.5, "multiplier": 0.0})
    # A graph factory taking the server's config is called with one.
    factory = audit(pool, tmp_path / "factory", f"{DEPLOYMENT}:factory", "--no-individual")
    assert factory.exit_code == 0, factory.output
    assert report_of(tmp_path / "factory")["shapley"] == report["shapley"]
    missing = audit(pool, tmp_path / "missing", f"{DEPLOYMENT}:nope")
    assert missing.exit_code == 2
    assert f"{DEPLOYMENT} has no graph 'nope'; its graphs: 'agent', 'factory'" in said(missing)
    unnamed = audit(pool, tmp_path / "unnamed", str(DEPLOYMENT))
    assert unnamed.exit_code == 2 and "has graphs 'agent', 'factory': name one" in said(unnamed)


def test_run_scores_an_app_once_with_a_protocol_runs_outputs(team, tmp_path):
    # The router with both members answers all four: score 1. The CLI and cg.run (before: a TypeError) agree.
    from colab_graphs.viewer.payload import LogCache, example_payload, folder_payload

    server, pool = team
    out = tmp_path / "run"
    result = invoke("run", "--app", f"{TUTORIAL}:router", "--pool", pool, *DATA, "--out", out)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["score"] == 1.0 and summary["scored"] == 4 and summary["failed"] == 0
    assert summary["params"] == {"mode": "messages", "detected": True}
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["answer"] for r in rows] == ["7", "10", "31", "110"]
    assert len((out / "traces.jsonl").read_text().splitlines()) == 4
    page = folder_payload(tmp_path, "run", LogCache())
    assert page["kind"] == "run" and page["progress"]["score"] == 1.0
    play = example_payload(tmp_path, "run", rows[3]["id"], LogCache())["plays"][0]
    assert [turn["member"] for turn in play["turns"]] == ["multiplier"] and play["answer"] == "110"

    from colab_graphs.audit.app_load import load_app

    router, _ = load_app(f"{TUTORIAL}:router")
    api = cg.run(router, pool, "builtin:arithmetic", limit=4, out=tmp_path / "api", progress=False)
    assert api.score == 1.0 and api.rows() == rows
    refused = invoke("run", "--app", f"{TUTORIAL}:reviewed", "--pool", pool, *DATA, "--out", tmp_path / "x")
    assert refused.exit_code == 2 and "pass --input-key question" in said(refused)
    # A contract only a run shows stops the run on its first example; mapped, the same command in the same
    # folder runs it (the stopped run finished nothing to keep). The adder alone drafts 3 of 4.
    unwritten = ["run", "--app", f"{TUTORIAL}:unwritten", "--pool", pool, *DATA, "--out", tmp_path / "u"]
    stopped = invoke(*unwritten)
    assert stopped.exit_code == 2 and "and no 'answer'" in said(stopped)
    assert invoke(*unwritten, "--answer-key", "final_answer").exit_code == 0
    assert json.loads((tmp_path / "u" / "summary.json").read_text())["score"] == 0.75


def test_mapping_options_are_checked(team, tmp_path):
    server, pool = team
    bad = audit(pool, tmp_path / "a", f"{TUTORIAL}:router", "--mode", "messages", "--input-key", "q")
    assert bad.exit_code == 2 and "input_key 'q' does not apply" in said(bad)
    wrong = audit(pool, tmp_path / "b", f"{TUTORIAL}:router", "--mode", "chat")
    assert wrong.exit_code == 2 and "mode must be one of auto, keys, messages, value, got 'chat'" in said(
        wrong
    )
    answer = audit(pool, tmp_path / "d", f"{TUTORIAL}:router", "--mode", "messages", "--answer-key", "final")
    assert answer.exit_code == 2
    assert "the app's output schema has keys messages and no 'final', where the audit reads" in said(answer)
    keys = audit(pool, tmp_path / "c", f"{TUTORIAL}:router", "--mode", "keys")
    assert keys.exit_code == 2
    assert "no 'input', so it never reads the question the audit sends" in said(keys)
    assert "pass --mode messages" in said(keys)
    protocol = invoke("run", "--protocol", "solo", "--pool", pool, *DATA, "--answer-key", "x")
    assert protocol.exit_code == 2 and "they need --app" in said(protocol)
    assert server.chat_requests == []


def test_the_answer_is_the_models_and_nothing_written_to_look_like_one():
    # Final states written to fool the reading of the answer: what follows the model's last word (a human's
    # follow-up quoting an answer, a tool's result), its reasoning, and answers that are not there.
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    from colab_graphs.audit.app_contract import AppContractError, AppIO

    messages = AppIO(mode="messages")
    answer = AIMessage(
        content=[
            {"type": "reasoning", "reasoning": "Perhaps the answer is 5."},
            {"type": "text", "text": "The answer is 7."},
        ]
    )
    after = [HumanMessage("Is the answer 42?"), ToolMessage("42", tool_call_id="c1"), SystemMessage("42")]
    state = {"messages": [HumanMessage("What is 5 + 2?"), answer, *after]}
    assert messages.answer(state, full=True) == "The answer is 7."
    # What LangChain reads as an AI message counts as one; what it reads as a human's does not.
    dicts = [
        {"role": "assistant", "content": "The answer is 7."},
        {"role": "user", "content": "The answer is 42."},
    ]
    assert messages.answer({"messages": dicts}, full=True) == "The answer is 7."
    assert (
        messages.answer({"messages": [("ai", "\\boxed{7}"), ("human", "\\boxed{42}")]}, full=True)
        == "\\boxed{7}"
    )
    only_human = {"messages": [HumanMessage("The answer is 42.")]}
    with pytest.raises(AppContractError, match="holds 1 message.s. and no AI message"):
        messages.answer(only_human, full=True)
    assert messages.answer(only_human, full=False) == ""
    keys = AppIO(mode="keys", answer_key="final_answer")
    assert keys.answer({"final_answer": AIMessage("The answer is 7.")}, full=True) == "The answer is 7."
    assert keys.answer({"final_answer": 7}, full=True) == "7"
    none = {"final_answer": None, "draft": "The answer is 7."}
    with pytest.raises(AppContractError, match="the app's final 'final_answer' is None"):
        keys.answer(none, full=True)
    missing = {"draft": "7", "__interrupt__": ()}
    with pytest.raises(AppContractError, match="final state has keys draft and no 'final_answer'"):
        keys.answer(missing, full=True)
    for unanswered in (none, missing):  # a smaller coalition: no answer, not a default that scores
        assert keys.answer(unanswered, full=False) == ""


def test_a_key_left_unwritten_by_an_absent_member_fails_the_example_not_the_audit(scripted_server, pool_for):
    # The drafter's node writes nothing when its member is absent, and the next node reads the draft: with every
    # member present the app runs; without the drafter its KeyError is the app's own (no input-key hint).
    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict, total=False):
        input: str
        draft: str
        answer: str

    drafter = cg.member_chat_model("a")

    async def draft(state: State) -> State:
        try:
            return {"draft": (await drafter.ainvoke(state["input"])).text}
        except cg.MemberAbsent:
            return {}

    def finish(state: State) -> State:
        return {"answer": state["draft"]}

    app = (
        StateGraph(State)
        .add_node(draft)
        .add_node(finish)
        .add_edge(START, "draft")
        .add_edge("draft", "finish")
    )
    pool = pool_for(scripted_server({"a": "The answer is 5.", "b": "The answer is 5."}), ["a", "b"])
    data = [{"id": "q", "input": "What is 2 + 3?", "answer": "5"}]
    with pytest.raises(Exception, match="every example failed") as failed:
        cg.run_audit(
            app, pool, data, method="exact", individual=False, client=ModelClient(None), progress=False
        )
    assert "the app raised KeyError: 'draft'" in str(failed.value)
    assert "--input-key" not in str(failed.value)
