"""Audits of users' own LangGraph apps, written as LangGraph's tutorials write them, over real HTTP.

The apps are the examples (`examples/agent_app.py`: a supervisor with a research and a math agent, each a
LangChain agent (`create_agent`) with tools; `examples/react_critic_app.py`: a ReAct agent with a calculator and a
critic, in sync nodes); their members are the scripted models of `examples/agent_members.py`, which call the
tools in OpenAI's format. The expected values below are worked out by hand from what those scripts do.
"""

from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import colab_graphs as cg
from colab_graphs.cli.app import _register_optional_commands
from colab_graphs.cli.app import app as cli
from colab_graphs.models.client import ModelClient
from colab_graphs.testing.scripts import load_members

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def team_pool(scripted_server, pool_for, team: str) -> tuple[Any, cg.Pool]:
    members = load_members(f"{EXAMPLES}/agent_members.py:{team}")
    server = scripted_server(members)
    return server, pool_for(server, list(members))


def distinct_requests(server) -> int:
    return len(server.request_counts())


def supervisor_audit(scripted_server, pool_for) -> tuple[Any, Any]:
    """The supervisor app audited with exact Shapley, without a call cache (only the example's memo and
    single flight share calls between coalitions); the server and the report."""
    server, pool = team_pool(scripted_server, pool_for, "SUPERVISOR_TEAM")
    report = cg.run_audit(
        example("agent_app").app,
        pool,
        str(EXAMPLES / "agent_questions.jsonl"),
        method="exact",
        client=ModelClient(None),
        progress=False,
    )
    return server, report


def test_exact_shapley_of_the_supervisor_app_is_the_hand_computed_one(scripted_server, pool_for):
    # Per question, the team answers right only with these members present (the scripts' behaviour):
    #   arithmetic ("12 times 7", "15 plus 27"): supervisor and mathematician (the research agent is skipped);
    #   a fact and arithmetic ("7 spiders", "3 days"): all three;
    #   a fact ("a spider", "a hexagon"): supervisor and researcher.
    # Two questions of each kind, so v(S) = (1[s,m in S] + 1[S = all] + 1[s,r in S]) / 3, a sum of three
    # unanimity games: Shapley = supervisor (1/2 + 1/3 + 1/2) / 3 = 4/9, researcher (1/3 + 1/2) / 3 = 5/18,
    # mathematician 5/18. LOO: v(all) = 1, v without the supervisor 0, without either worker 1/3.
    # Alone (solo), the researcher answers the two fact questions from memory and the mathematician the two
    # arithmetic ones: individual 1/3 each, the supervisor 0.
    server, report = supervisor_audit(scripted_server, pool_for)
    assert report.players == ["supervisor", "researcher", "mathematician"]
    assert report.shapley == pytest.approx(
        {"supervisor": 4 / 9, "researcher": 5 / 18, "mathematician": 5 / 18}
    )
    assert report.loo == pytest.approx({"supervisor": 1.0, "researcher": 2 / 3, "mathematician": 2 / 3})
    assert report.individual == pytest.approx(
        {"supervisor": 0.0, "researcher": 1 / 3, "mathematician": 1 / 3}
    )
    values = {tuple(c.members): c.value for c in report.coalitions}
    assert (
        values[("supervisor", "researcher")]
        == values[("supervisor", "mathematician")]
        == pytest.approx(1 / 3)
    )
    assert values[("researcher", "mathematician")] == 0.0
    assert report.failed_examples == []
    # Each distinct request was made once: the calls made are the server's distinct requests, all it got.
    assert report.calls.made == report.calls.unique == distinct_requests(server) == len(server.requests)
    assert report.calls.cached > 0 and report.calls.naive > report.calls.made
    # docs/apps.md prints this audit's output: its calls are these.
    printed = re.search(
        r"calls made (\d+) \(distinct requests (\d+), cached (\d+), failed (\d+); naive evaluation: (\d+)\)",
        (EXAMPLES.parent / "docs" / "apps.md").read_text(),
    )
    calls = report.calls
    assert tuple(map(int, printed.groups())) == (
        calls.made,
        calls.unique,
        calls.cached,
        calls.failed,
        calls.naive,
    )


def test_the_cli_audits_an_app_file_and_a_rerun_makes_no_call(
    scripted_server, pool_for, tmp_path, monkeypatch
):
    # The critic app, nodes written as sync functions. Alone the solver gets the two two-number problems right
    # and drops the last operation of the two three-number ones; the critic sends those back once and the
    # solver, told, gets them right. v(solver) = 1/2, v(critic) = 0 (no solver, no answer), v(both) = 1:
    # Shapley solver (1/2 + 1) / 2 = 3/4, critic (0 + 1/2) / 2 = 1/4; LOO solver 1, critic 1/2.
    server, pool = team_pool(scripted_server, pool_for, "CRITIC_TEAM")
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(
        "models:\n"
        + "".join(
            f"  {m}: {{model: openai/{m}, api_base: '{server.base_url}', api_key: sk-test}}\n"
            for m in pool.names
        )
    )
    monkeypatch.setenv("COLAB_GRAPHS_CACHE_DIR", str(tmp_path / "cache"))
    args = [
        "audit",
        "--app",
        f"{EXAMPLES}/react_critic_app.py:app",
        "--pool",
        str(pool_file),
        "--data",
        str(EXAMPLES / "calculator_questions.jsonl"),
        "--method",
        "exact",
        "--no-plots",
    ]
    _register_optional_commands()  # every command, as the console entry point registers them
    first = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "one")], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    report = json.loads((tmp_path / "one" / "report.json").read_text())
    assert report["protocol"] == "react_with_critic" and report["players"] == ["solver", "critic"]
    assert report["shapley"] == pytest.approx({"solver": 0.75, "critic": 0.25})
    assert report["loo"] == pytest.approx({"solver": 1.0, "critic": 0.5})
    made = sum(server.request_counts().values())  # chat requests (the pre-flight's GET /models is none)
    assert report["calls"]["made"] == made == distinct_requests(server)
    again = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "two")], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert sum(server.request_counts().values()) == made  # every call served from the cache
    rerun = json.loads((tmp_path / "two" / "report.json").read_text())
    assert rerun["shapley"] == report["shapley"] and rerun["calls"]["made"] == 0


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (
            ["--method", "exact", "--dry-run"],
            "--dry-run plans a protocol's calls; an app's graph is its own code",
        ),
        (["--method", "sampled", "--budget", "500"], "an app's calls cannot be counted before it runs"),
    ],
)
def test_an_app_audit_refuses_a_plan_of_its_calls_before_any_call(tmp_path, options, said):
    pool_file = tmp_path / "pool.yaml"  # (a dead endpoint: nothing may be called)
    pool_file.write_text(
        "".join(
            ["models:\n"]
            + [
                f"  {m}: {{model: openai/{m}, api_base: 'http://127.0.0.1:9/v1', api_key: sk-test}}\n"
                for m in ("solver", "critic")
            ]
        )
    )
    _register_optional_commands()
    args = ["audit", "--app", f"{EXAMPLES}/react_critic_app.py:app", "--pool", str(pool_file), "--data"]
    args += [str(EXAMPLES / "calculator_questions.jsonl"), "--out", str(tmp_path / "out"), "--no-preflight"]
    result = CliRunner().invoke(cli, [*args, *options])
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split())
    assert not (tmp_path / "out" / "report.json").exists()


def tiny_app(*models: Any):
    """An app with one node that asks each model in turn and answers with the last reply that says something."""
    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict, total=False):
        input: str
        answer: str

    async def ask(state: State) -> State:
        replies = [(await m.ainvoke(state["input"])).text for m in models]
        return {"answer": next((r for r in reversed(replies) if r), "")}

    return StateGraph(State).add_node(ask).add_edge(START, "ask").compile(name="tiny")


def play(app: Any, pool: cg.Pool, answer: str = "5") -> cg.Progress:
    data = [{"id": "q", "input": "What is 2 + 3?", "answer": answer}]
    return cg.run_audit(
        app, pool, data, method="exact", client=ModelClient(None), individual=False, progress=False
    )


def test_an_absent_member_raises_by_default_and_an_uncaught_absence_scores_empty(scripted_server, pool_for):
    server = scripted_server({"a": "The answer is 5.", "b": "The answer is 5."})
    pool = pool_for(server, ["a", "b"])
    report = play(tiny_app(cg.member_chat_model("a"), cg.member_chat_model("b")), pool)
    values = {tuple(c.members): c.value for c in report.coalitions}
    assert values == {(): 0.0, ("a",): 0.0, ("b",): 0.0, ("a", "b"): 1.0}


def test_a_play_ended_by_an_uncaught_absence_records_the_member_and_the_node(
    scripted_server, pool_for, tmp_path
):
    from colab_graphs.audit.game import read_plays

    server = scripted_server({"a": "The answer is 5.", "b": "The answer is 5."})
    pool = pool_for(server, ["a", "b"])
    substitute = cg.member_chat_model("b", on_absent="substitute", substitute="a")
    data = [{"id": "q", "input": "What is 2 + 3?", "answer": "5"}]
    report = cg.run_audit(
        tiny_app(cg.member_chat_model("a"), substitute), pool, data, method="exact", client=ModelClient(None),
        individual=False, progress=False, out=tmp_path / "audit", plots=False,
    )  # fmt: skip
    # Without a, its MemberAbsent ends the play at node "ask" (scored as an empty answer, as the contract
    # says); without b, a answers in its place.
    assert {tuple(c.members): c.value for c in report.coalitions} == {
        (): 0.0,
        ("a",): 1.0,
        ("b",): 0.0,
        ("a", "b"): 1.0,
    }
    assert report.ended_by_absent == [{"member": "a", "node": "ask", "plays": 1, "coalitions": [["b"]]}]
    plays = {
        tuple(p.coalition): p.model_extra for p in read_plays(tmp_path / "audit") if p.game == "coalition"
    }
    assert plays[("b",)]["ended_by_absent"] == {"member": "a", "node": "ask"}
    assert plays[("b",)]["absent"] == [
        {"member": "a", "node": "ask", "rule": "raise", "answered_by": None, "calls": 1}
    ]
    assert plays[("a",)]["absent"] == [
        {"member": "b", "node": "ask", "rule": "substitute", "answered_by": "a", "calls": 1}
    ]
    assert "ended_by_absent" not in plays[("a", "b")] and "absent" not in plays[("a", "b")]
    page = (tmp_path / "audit" / "report.md").read_text()
    assert (
        "## Plays ended by an absent member" in page
        and "- `a` at node `ask`: 1 play(s), coalitions: b" in page
    )


def test_an_absent_member_may_answer_empty(scripted_server, pool_for):
    server = scripted_server({"a": "The answer is 5.", "b": "The answer is 7."})
    pool = pool_for(server, ["a", "b"])
    report = play(tiny_app(cg.member_chat_model("a"), cg.member_chat_model("b", on_absent="empty")), pool)
    values = {tuple(c.members): c.value for c in report.coalitions}
    # Without b, b's empty reply leaves a's answer (right); with b, b's answer is taken (wrong).
    assert values == {(): 0.0, ("a",): 1.0, ("b",): 0.0, ("a", "b"): 0.0}


def test_an_absent_member_may_be_substituted(scripted_server, pool_for):
    server = scripted_server({"a": "The answer is 4.", "b": "The answer is 5."})
    pool = pool_for(server, ["a", "b"])
    report = play(tiny_app(cg.member_chat_model("a", on_absent="substitute", substitute="b")), pool)
    values = {tuple(c.members): c.value for c in report.coalitions}
    assert values == {(): 0.0, ("a",): 0.0, ("b",): 1.0, ("a", "b"): 0.0}  # b answers in a's place


def test_an_app_catches_member_absent_to_route_around_a_member(scripted_server, pool_for, arun):
    from colab_graphs.langchain.binding import MemberBinding, bind_members

    server = scripted_server({"a": "The answer is 5."})
    pool = pool_for(server, ["a", "b"])
    b = cg.member_chat_model("b")

    async def without_b() -> str:
        with bind_members(MemberBinding(pool, ModelClient(None), coalition=frozenset({"a"}))):
            try:
                await b.ainvoke("hi")
            except cg.MemberAbsent as absent:
                return f"{absent.member} skipped"
        return "not raised"

    assert arun(without_b()) == "b skipped"
    assert server.requests == []


def test_an_app_that_raises_fails_its_examples_with_the_error(scripted_server, pool_for):
    server = scripted_server({"a": "The answer is 5."})
    pool = pool_for(server, ["a"])
    with pytest.raises(Exception, match="every example failed.*member_chat_model: no member 'nobody'"):
        play(tiny_app(cg.member_chat_model("nobody")), pool)


def test_a_bad_app_reference_is_an_error_naming_it(scripted_server, pool_for, tmp_path):
    from colab_graphs.audit.app_contract import AppError

    server = scripted_server({"a": "x"})
    pool = pool_for(server, ["a"])
    with pytest.raises(AppError, match="defines no 'nope'"):
        cg.run_audit(
            app=f"{EXAMPLES}/agent_app.py:nope", pool=pool, data=[{"id": "q", "input": "x", "answer": "1"}]
        )
    (tmp_path / "notapp.py").write_text("app = 42\n")
    with pytest.raises(AppError, match="a int, expected a compiled LangGraph graph"):
        cg.run_audit(
            app=f"{tmp_path}/notapp.py:app", pool=pool, data=[{"id": "q", "input": "x", "answer": "1"}]
        )


def test_an_app_given_as_module_and_factory_of_a_state_graph_is_audited(
    scripted_server, pool_for, tmp_path, monkeypatch
):
    (tmp_path / "team_app.py").write_text(
        textwrap.dedent(
            """
            from langgraph.graph import START, StateGraph
            from typing_extensions import TypedDict

            import colab_graphs as cg

            class State(TypedDict, total=False):
                input: str
                answer: str

            def build():  # a factory of an uncompiled StateGraph: the audit calls and compiles it
                model = cg.member_chat_model("a")

                def ask(state: State) -> State:
                    return {"answer": model.invoke(state["input"]).text}

                return StateGraph(State).add_node(ask).add_edge(START, "ask")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    server = scripted_server({"a": "The answer is 5."})
    data = [{"id": "q", "input": "What is 2 + 3?", "answer": "5"}]
    report = cg.run_audit(
        app="team_app:build", pool=pool_for(server, ["a"]), data=data, client=ModelClient(None)
    )
    assert report.protocol == "build" and report.loo == {"a": 1.0}


def test_a_member_chat_model_outside_an_audit_calls_the_pool_in_use(scripted_server, pool_for, arun):
    server = scripted_server({"a": "The answer is 5."})
    pool = pool_for(server, ["a"])
    with cg.use_pool(pool, ModelClient(None)):
        state = arun(tiny_app(cg.member_chat_model("a")).ainvoke({"input": "What is 2 + 3?"}))
    assert state["answer"] == "The answer is 5."
    with pytest.raises(RuntimeError, match="has no pool"):
        cg.member_chat_model("a").invoke("hi")
