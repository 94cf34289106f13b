"""Apps as LangGraph's Functional API and deployment conventions write them, audited through the CLI and the
API (sync and async) over real HTTP: `@entrypoint`s taking the question itself and returning their answer,
graph factories that are async or context managers (an `AsyncSqliteSaver` among them), a sync saver refused
before any call, and absence reports naming the node a streamed call or a prebuilt agent's call came from.

The apps are tests/fixtures/apps (`functional_apps.py`, `agent_apps.py`, the deployment `factories/`); the
members are test_app_state's scripted "adder" (sums and differences in prose, a wrong guess at a product) and
"multiplier" (products, boxed; nothing to say about anything else), plus a supervisor "boss" scripted here.
The data are the first four built-in arithmetic problems: 5 + 2, 7 + 3, 62 - 31, 11 * 10. Products go to
the multiplier and the rest to the adder, a member absent being stood in for by the other, so the adder alone
gets 3 of 4 (it guesses the product wrong), the multiplier alone 1 of 4, both 4 of 4: Shapley and LOO adder
3/4, multiplier 1/4. Every other expected value below is worked out by hand the same way.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import write_pool_file
from test_app_state import APPS, DATA, adder, audit, invoke, multiplier, report_of, said, values

import colab_graphs as cg
from colab_graphs.audit.app_contract import AppContractError, AppError
from colab_graphs.cli.app import _register_optional_commands
from colab_graphs.models.client import ModelClient
from colab_graphs.tasks.loaders import load_examples
from colab_graphs.testing import Reply, ToolCall
from colab_graphs.testing.scripts import Member, message_text

pytestmark = pytest.mark.integration

FUNCTIONAL = APPS / "functional_apps.py"
AGENTS = APPS / "agent_apps.py"
FACTORIES = APPS / "factories" / "langgraph.json"
ROUTER_VALUES = {(): 0.0, ("adder",): 0.75, ("multiplier",): 0.25, ("adder", "multiplier"): 1.0}
SHAPLEY = {"adder": 0.75, "multiplier": 0.25}
QUESTIONS = [e.input for e in load_examples("builtin:arithmetic", limit=4)]


def boss(messages: list[dict[str, Any]], params: dict[str, Any]) -> str | Reply:
    """langgraph-supervisor's supervisor: hands the question to the solver, then answers with the number of
    the solver's report (an assistant message named "solver" that calls no tool). Offered `ask_helper` (the
    lead agent), it asks the helper, then repeats the helper's last line."""
    if messages[-1].get("role") == "tool" and messages[-1].get("name") == "ask_helper":
        return f"The helper says: {message_text(messages[-1]).splitlines()[-1]}"
    if "ask_helper" in {t["function"]["name"] for t in params.get("tools") or []}:
        return Reply("", (ToolCall("ask_helper", {"question": message_text(messages[-1])}),))
    reports = [
        message_text(m)
        for m in messages
        if m.get("role") == "assistant" and m.get("name") == "solver" and not m.get("tool_calls")
    ]
    if not reports:
        return Reply("", (ToolCall("transfer_to_solver", {}),))
    return f"The solver says: {reports[-1].splitlines()[-1]}"


@pytest.fixture
def team(scripted_server, tmp_path, monkeypatch):
    """(server, pool file) of the scripted members, a call cache of the test's own, and the factories' log and
    checkpoint database under the test's folder."""
    server = scripted_server({"adder": Member(adder), "multiplier": Member(multiplier), "boss": Member(boss)})
    pool = write_pool_file(tmp_path / "pool.yaml", server, ["adder", "multiplier"])
    monkeypatch.setenv("COLAB_GRAPHS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FACTORY_LOG", str(tmp_path / "factory.log"))
    monkeypatch.setenv("CHECKPOINTS_DB", str(tmp_path / "checkpoints.sqlite"))
    _register_optional_commands()
    return server, pool


def module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"test_fixture_{path.stem}", path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def user_texts(server) -> set[str]:
    return {message_text(m) for r in server.chat_requests for m in r.messages if m.get("role") == "user"}


def api_audit(protocol: Any, pool: Any, **options: Any) -> Any:
    """`cg.run_audit` (sync) of an app object (`protocol`) or reference (`app=`) over the four problems."""
    options = {
        "method": "exact",
        "individual": False,
        "progress": False,
        "client": ModelClient(None),
        **options,
    }
    return cg.run_audit(protocol, pool, "builtin:arithmetic", limit=4, **options)


def factory_log(tmp_path: Path) -> list[str]:
    log = tmp_path / "factory.log"
    return log.read_text().splitlines() if log.exists() else []


# --- the Functional API -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entrypoint", "params"),
    [
        ("solve", {"mode": "value", "detected": True}),  # sync, a str returned
        ("solve_async", {"mode": "value", "detected": True}),  # async, the call in an async @task
        ("solution", {"mode": "value", "detected": True}),  # a pydantic model returned: its `answer`
        ("drafted", {"mode": "value", "detected": True}),  # async, a dict returned: its "answer"
        (
            "chat",
            {"mode": "value", "input": "messages", "detected": True},
        ),  # the quickstart's list of messages
    ],
)
def test_an_entrypoint_is_sent_the_question_itself_and_its_return_value_is_the_answer(
    team, tmp_path, entrypoint, params
):
    # Before: "the app's final state has keys none ... pass --answer-key", and `question: str` was sent
    # {'input': question}, whose text reached the models' prompts.
    server, pool = team
    result = audit(pool, tmp_path / "out", f"{FUNCTIONAL}:{entrypoint}", "--no-individual")
    assert result.exit_code == 0, result.output
    assert "(a Functional API entrypoint): sending it" in said(result)
    report = report_of(tmp_path / "out")
    assert report["protocol"] == entrypoint
    assert values(report) == pytest.approx(ROUTER_VALUES)
    assert report["shapley"] == pytest.approx(SHAPLEY) and report["loo"] == pytest.approx(SHAPLEY)
    assert report["protocol_params"] == params
    # What the models were asked is the question and nothing else (no "{'input': ...}" in any prompt).
    assert user_texts(server) == set(QUESTIONS)


def test_entrypoints_through_the_api_sync_and_async_and_scored_once(team, tmp_path, arun):
    server, pool = team
    functional = module(FUNCTIONAL)
    report = api_audit(functional.solve, pool)  # an object, from sync code
    assert report.shapley == pytest.approx(SHAPLEY) and report.protocol == "solve"
    assert report.protocol_params == {"mode": "value", "detected": True}
    report = arun(
        cg.arun_audit(
            app=f"{FUNCTIONAL}:solve_async", pool=pool, data="builtin:arithmetic", limit=4, method="exact",
            individual=False, progress=False, client=ModelClient(None),
        )
    )  # fmt: skip
    assert report.shapley == pytest.approx(SHAPLEY) and report.loo == pytest.approx(SHAPLEY)
    # Scored once with the whole pool (`run --app` and cg.run): every answer right.
    out = tmp_path / "run"
    result = invoke("run", "--app", f"{FUNCTIONAL}:solution", "--pool", pool, *DATA, "--out", out)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["answer"] for r in rows] == ["7", "10", "31", "110"]
    ran = cg.run(functional.chat, pool, "builtin:arithmetic", limit=4, out=tmp_path / "api", progress=False)
    assert ran.score == 1.0 and [r["answer"] for r in ran.rows()] == ["7", "10", "31", "110"]
    assert user_texts(server) == set(QUESTIONS)


def test_an_entrypoint_whose_input_has_no_type_is_refused_before_any_call_and_mapped_on_request(
    team, tmp_path
):
    server, pool = team
    refused = audit(pool, tmp_path / "a", f"{FUNCTIONAL}:untyped")
    assert refused.exit_code == 2, refused.output
    text = said(refused)
    assert "its entrypoint untyped(question) does not say what it takes (its parameter has no type)" in text
    assert "pass --mode value (mode='value' in Python) to send the question itself" in text
    assert server.requests == [] and not (tmp_path / "a" / "report.json").exists()
    told = audit(pool, tmp_path / "b", f"{FUNCTIONAL}:untyped", "--mode", "value", "--no-individual")
    assert told.exit_code == 0, told.output
    assert values(report_of(tmp_path / "b")) == pytest.approx(ROUTER_VALUES)
    assert report_of(tmp_path / "b")["protocol_params"] == {"mode": "value"}
    assert user_texts(server) == set(QUESTIONS)


def test_an_entrypoint_taking_a_mapping_is_sent_one_and_its_key_mapped(team, tmp_path):
    # `keyed(inputs: dict)` reads inputs["question"]: sent {'input': question}, its KeyError says what to pass.
    server, pool = team
    stopped = audit(pool, tmp_path / "a", f"{FUNCTIONAL}:keyed")
    assert stopped.exit_code == 2, stopped.output
    assert "the app raised KeyError: 'question': the audit sends the question as {'input': question}" in said(
        stopped
    )
    assert "pass --input-key question" in said(stopped)
    mapped = audit(pool, tmp_path / "b", f"{FUNCTIONAL}:keyed", "--input-key", "question", "--no-individual")
    assert mapped.exit_code == 0, mapped.output
    report = report_of(tmp_path / "b")
    assert values(report) == pytest.approx(ROUTER_VALUES)
    assert report["protocol_params"] == {"mode": "keys", "input_key": "question", "answer_key": "answer"}


def test_a_mapping_an_entrypoint_cannot_meet_is_refused(team, tmp_path):
    server, pool = team
    keys = audit(pool, tmp_path / "a", f"{FUNCTIONAL}:solve", "--mode", "keys")
    assert keys.exit_code == 2
    assert (
        "the app's input is a str, not a mapping, and the audit would send {'input': question}; pass --mode "
        "value" in said(keys)
    )
    # And the other way round: the question itself to an app that takes a mapping.
    value = audit(pool, tmp_path / "c", f"{APPS / 'tutorial_apps.py'}:reviewed", "--mode", "value")
    assert value.exit_code == 2
    assert (
        "mode 'value' sends the question itself (a str), and the app's input schema has keys draft, "
        "final_answer, question, review (it takes a mapping); pass --input-key question" in said(value)
    )
    assert server.requests == []
    # A str returned is the answer: a key to read it from is a contract the whole pool's play breaks.
    answer_key = audit(pool, tmp_path / "b", f"{FUNCTIONAL}:solve", "--answer-key", "final_answer")
    assert answer_key.exit_code == 2
    assert (
        "the app returned a str, not a state holding 'final_answer': what it returns is the answer; drop "
        in (said(answer_key))
    )
    assert not (tmp_path / "b" / "report.json").exists()


# --- graph factories --------------------------------------------------------------------------------------


@pytest.mark.parametrize("graph", ["coroutine", "sqlite", "memory"])
def test_an_async_or_context_manager_factory_is_awaited_or_entered_and_left_when_the_audit_ends(
    team, tmp_path, graph
):
    # Before: "a coroutine, expected a compiled graph". The router's values, its checkpointer made by the
    # factory on the audit's loop (an AsyncSqliteSaver is bound to it), each play on a thread of its own.
    server, pool = team
    result = audit(pool, tmp_path / "out", f"{FACTORIES}:{graph}", "--no-individual")
    assert result.exit_code == 0, result.output
    report = report_of(tmp_path / "out")
    assert report["protocol"] == "router"
    assert values(report) == pytest.approx(ROUTER_VALUES)
    assert report["shapley"] == pytest.approx(SHAPLEY)
    name = {"coroutine": "make_graph", "sqlite": "sqlite_graph", "memory": "memory_graph"}[graph]
    assert factory_log(tmp_path) == [f"enter {name}"] + ([f"exit {name}"] if graph != "coroutine" else [])
    if graph == "sqlite":
        # The saver was used (its tables are made on first use) and every play's thread deleted after it.
        with sqlite3.connect(tmp_path / "checkpoints.sqlite") as db:
            tables = {row[0] for row in db.execute("select name from sqlite_master where type='table'")}
            assert {"checkpoints", "writes"} <= tables
            assert db.execute("select count(*) from checkpoints").fetchone() == (0,)


def test_factories_through_the_api_sync_and_async(team, tmp_path, arun):
    server, pool = team
    report = api_audit(None, pool, app=f"{FACTORIES}:sqlite")
    assert report.shapley == pytest.approx(SHAPLEY)
    assert factory_log(tmp_path) == ["enter sqlite_graph", "exit sqlite_graph"]
    report = arun(
        cg.arun_audit(
            app=f"{FACTORIES}:memory", pool=pool, data="builtin:arithmetic", limit=4, method="exact",
            individual=False, progress=False, client=ModelClient(None),
        )
    )  # fmt: skip
    assert report.loo == pytest.approx(SHAPLEY)
    assert factory_log(tmp_path)[2:] == ["enter memory_graph", "exit memory_graph"]
    # A factory object (an async function) given in Python; and cg.run scores it once.
    sys.path.insert(0, str(FACTORIES.parent))
    try:
        factories = module(FACTORIES.parent / "graphs.py")
    finally:
        sys.path.remove(str(FACTORIES.parent))
    assert api_audit(factories.make_graph, pool).shapley == pytest.approx(SHAPLEY)
    ran = cg.run(
        factories.memory_graph, pool, "builtin:arithmetic", limit=4, out=tmp_path / "run", progress=False
    )
    assert ran.score == 1.0
    assert factory_log(tmp_path)[4:] == ["enter make_graph", "enter memory_graph", "exit memory_graph"]


def test_a_sync_saver_is_refused_before_any_call_naming_the_async_saver(team, tmp_path):
    # Before: the solo calls were made, then LangGraph's ainvoke raised NotImplementedError.
    server, pool = team
    result = audit(pool, tmp_path / "out", f"{FACTORIES}:sync_sqlite")
    assert result.exit_code == 2, result.output
    text = said(result)
    assert (
        "app 'router': its checkpointer is a SqliteSaver (langgraph.checkpoint.sqlite), which has no async "
        in (text)
    )
    assert (
        "Use AsyncSqliteSaver (from langgraph.checkpoint.sqlite.aio), made on the running event loop" in text
    )
    assert "async with AsyncSqliteSaver.from_conn_string('checkpoints.sqlite') as saver" in text
    assert server.requests == [] and not (tmp_path / "out" / "report.json").exists()
    assert factory_log(tmp_path) == ["enter sync_sqlite_graph", "exit sync_sqlite_graph"]  # left on refusal
    # The same through the API, and for an app compiled with one (no factory).
    from langgraph.checkpoint.sqlite import SqliteSaver

    with pytest.raises(AppError, match="its checkpointer is a SqliteSaver .* Use AsyncSqliteSaver"):
        api_audit(None, pool, app=f"{FACTORIES}:sync_sqlite")
    router = module(APPS / "tutorial_apps.py").router_builder
    saver = SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))
    with pytest.raises(AppError, match="its checkpointer is a SqliteSaver"):
        api_audit(router.compile(checkpointer=saver), pool)
    assert server.requests == []


def test_a_factory_that_fails_is_an_error_naming_the_app_and_what_it_raised(team, tmp_path):
    server, pool = team
    result = audit(pool, tmp_path / "out", f"{FACTORIES}:broken")
    assert result.exit_code == 2, result.output
    text = said(result)
    assert (
        f"app {FACTORIES}:broken (" in text and "graphs.py:broken_graph): its graph factory raised " in text
    )
    assert "OperationalError: unable to open database file" in text
    assert server.requests == []
    with pytest.raises(AppError, match="its graph factory raised OperationalError"):
        api_audit(None, pool, app=f"{FACTORIES}:broken")


def test_the_docs_examples_run_and_audit_to_their_values(team, tmp_path, monkeypatch):
    # docs/apps.md's section on entrypoints: its Python blocks are one graph.py and its JSON block the langgraph.json beside it. `solve` and
    # `make_graph` call only the adder (absent: MemberAbsent, no answer): v(adder) = v(both) = 3/4 (the
    # product guessed wrong), v(multiplier) = 0; Shapley and LOO adder 3/4, multiplier 0. Each makes one call per
    # question (the coalitions with the adder share it): 4 requests each, the same 4 (the cache is off in the
    # API, and the CLI's is the test's own, empty).
    server, pool = team
    page = (Path(__file__).resolve().parents[1] / "docs" / "apps.md").read_text()
    page = page[page.index("## Functional API entrypoints, graph factories") :]  # (the section's own example)
    blocks = re.findall(r"```(python|json)\n(.*?)```", page, flags=re.S)
    (tmp_path / "graph.py").write_text("\n".join(code for kind, code in blocks if kind == "python"))
    (tmp_path / "langgraph.json").write_text(next(code for kind, code in blocks if kind == "json"))
    monkeypatch.chdir(tmp_path)  # (checkpoints.sqlite, as the page writes it, in the working folder)
    expected = {"adder": 0.75, "multiplier": 0.0}
    result = audit(pool, tmp_path / "out", f"{tmp_path}/langgraph.json:agent", "--no-individual")
    assert result.exit_code == 0, result.output
    assert report_of(tmp_path / "out")["shapley"] == pytest.approx(expected)
    assert (tmp_path / "checkpoints.sqlite").exists()
    assert len(server.chat_requests) == 4
    report = api_audit(None, pool, app=f"{tmp_path}/graph.py:solve")
    assert report.shapley == pytest.approx(expected) and report.loo == pytest.approx(expected)
    assert len(server.chat_requests) == 8 and set(server.request_counts().values()) == {2}
    assert user_texts(server) == set(QUESTIONS)


# --- absence reports name the node ------------------------------------------------------------------------


def plays_of(out: Path) -> dict[tuple[str, ...], dict[str, Any]]:
    from colab_graphs.audit.game import read_plays

    return {tuple(p.coalition): p.model_extra for p in read_plays(out) if p.game == "coalition"}


def test_a_streamed_calls_absence_names_its_node(team, tmp_path, arun):
    # `draft` streams the adder (sync), `check` the multiplier (async); both raise when absent. Both present:
    # sums keep the draft (the multiplier has nothing to add), the product is the multiplier's boxed 110: 4/4.
    # Alone, each ends its plays at the other's node: 0. Shapley 1/2 each, LOO 1 each.
    # Before: node null (langchain-core streams without a run manager).
    server, pool = team
    result = audit(pool, tmp_path / "cli", f"{AGENTS}:streamed", "--no-individual")
    assert result.exit_code == 0, result.output
    report = report_of(tmp_path / "cli")
    assert values(report) == pytest.approx(
        {(): 0.0, ("adder",): 0.0, ("multiplier",): 0.0, ("adder", "multiplier"): 1.0}
    )
    assert report["shapley"] == pytest.approx({"adder": 0.5, "multiplier": 0.5})
    ended = [
        {"member": "multiplier", "node": "check", "plays": 4, "coalitions": [["adder"]]},
        {"member": "adder", "node": "draft", "plays": 4, "coalitions": [["multiplier"]]},
    ]
    assert sorted(report["ended_by_absent"], key=str) == sorted(ended, key=str)
    plays = plays_of(tmp_path / "cli")
    assert plays[("adder",)]["absent"] == [
        {"member": "multiplier", "node": "check", "rule": "raise", "answered_by": None, "calls": 1}
    ]
    assert plays[("multiplier",)]["ended_by_absent"] == {"member": "adder", "node": "draft"}
    # The same from async user code.
    agents = module(AGENTS)
    api = arun(
        cg.arun_audit(
            agents.streamed, pool, "builtin:arithmetic", limit=4, method="exact", individual=False,
            progress=False, client=ModelClient(None), out=tmp_path / "api", plots=False,
        )
    )  # fmt: skip
    assert sorted(api.ended_by_absent, key=str) == sorted(ended, key=str)


def test_a_prebuilt_agents_absence_names_the_agent(team, tmp_path):
    # langgraph-supervisor: "boss" hands each question to the solver (create_react_agent(name="solver"), the
    # adder), then answers with its report. Data: 5 + 2 and 7 + 3. Both present: 2/2. Without the adder the
    # solver's call raises inside its node "agent", without the boss the supervisor's does: 0 each, and each
    # play is reported under the agent's name (before: "agent" for both).
    server, _ = team
    pool = write_pool_file(tmp_path / "team.yaml", server, ["boss", "adder"])
    out = tmp_path / "team"
    result = invoke("audit", "--app", f"{AGENTS}:team", "--pool", pool, "--data", "builtin:arithmetic",
                    "--limit", "2", "--method", "exact", "--no-plots", "--no-individual", "--out", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    report = report_of(out)
    assert values(report) == pytest.approx({(): 0.0, ("boss",): 0.0, ("adder",): 0.0, ("boss", "adder"): 1.0})
    assert sorted(report["ended_by_absent"], key=str) == sorted(
        [
            {"member": "adder", "node": "solver", "plays": 2, "coalitions": [["boss"]]},
            {"member": "boss", "node": "supervisor", "plays": 2, "coalitions": [["adder"]]},
        ],
        key=str,
    )
    # The whole team's calls are traced under the agents' names too.
    plays = plays_of(out)
    assert "absent" not in plays[("boss", "adder")]
    # LangChain's create_agent(name="solver_agent"), the app itself: its node is "model". From sync code.
    agents = module(AGENTS)
    alone = cg.run_audit(
        agents.solver_agent, write_pool_file(tmp_path / "p.yaml", server, ["adder", "multiplier"]),
        "builtin:arithmetic", limit=4, method="loo", individual=False, progress=False, client=ModelClient(None),
    )  # fmt: skip
    assert {tuple(c.members): c.value for c in alone.coalitions} == pytest.approx(
        {("adder", "multiplier"): 0.75, ("multiplier",): 0.0, ("adder",): 0.75}
    )
    assert alone.ended_by_absent == [
        {"member": "adder", "node": "solver_agent", "plays": 4, "coalitions": [["multiplier"]]}
    ]
    # An agent asked inside another agent's tool: the helper's call is named after the helper (the lead's
    # name is what LangChain's metadata would say). 5 + 2 and 7 + 3: both present 2/2, else 0.
    lead = cg.run_audit(
        agents.lead_agent, pool, "builtin:arithmetic", limit=2, method="exact", individual=False,
        progress=False, client=ModelClient(None),
    )  # fmt: skip
    assert {tuple(c.members): c.value for c in lead.coalitions} == pytest.approx(
        {(): 0.0, ("boss",): 0.0, ("adder",): 0.0, ("boss", "adder"): 1.0}
    )
    assert sorted(lead.ended_by_absent, key=str) == sorted(
        [
            {"member": "adder", "node": "helper", "plays": 2, "coalitions": [["boss"]]},
            {"member": "boss", "node": "lead_agent", "plays": 2, "coalitions": [["adder"]]},
        ],
        key=str,
    )


def test_an_interrupt_reached_only_without_a_member_names_its_node_and_coalition(team, tmp_path, arun):
    server, pool = team
    result = audit(pool, tmp_path / "out", f"{AGENTS}:escalating", "--method", "loo", "--no-individual")
    assert result.exit_code == 2, result.output
    assert (
        "the app called interrupt() in node 'ask_or_escalate' asking 'No adder in the team: what is What is "
        in said(result)
    )
    assert "in the play of coalition [multiplier] (absent: adder): an audit plays the app unattended" in said(
        result
    )
    with pytest.raises(AppContractError, match=r"in the play of coalition \[multiplier\] \(absent: adder\)"):
        arun(cg.arun_audit(module(AGENTS).escalating, pool, "builtin:arithmetic", limit=1, progress=False,
                           individual=False, client=ModelClient(None)))  # fmt: skip


def test_a_returned_value_is_read_as_the_models_answer_and_nothing_written_to_look_like_one():
    # What an entrypoint returns, written to fool the reading: a conversation ending with a human's follow-up
    # quoting an answer, a conversation with no AI message, None, a str where a key was asked for.
    from langchain_core.messages import AIMessage, HumanMessage

    from colab_graphs.audit.app_contract import AppIO

    value = AppIO(mode="value")
    conversation = [HumanMessage("What is 5 + 2?"), AIMessage("The answer is 7."), HumanMessage("Is it 42?")]
    assert value.answer(conversation, full=True) == "The answer is 7."
    assert value.answer(AIMessage("\\boxed{7}"), full=True) == "\\boxed{7}"
    assert value.answer(7, full=True) == "7"
    with pytest.raises(AppContractError, match="the app's returned 1 message.s. and no AI message"):
        value.answer([HumanMessage("The answer is 42.")], full=True)
    with pytest.raises(AppContractError, match="the app returned None .with every member present."):
        value.answer(None, full=True)
    keyed = AppIO(mode="value", answer_key="final_answer")
    with pytest.raises(AppContractError, match="the app returned a str, not a state holding 'final_answer'"):
        keyed.answer("The answer is 7.", full=True)
    # A smaller coalition: no answer, never a default that scores.
    for unanswered in ([HumanMessage("The answer is 42.")], None):
        assert value.answer(unanswered, full=False) == ""
    assert keyed.answer("The answer is 7.", full=False) == ""
