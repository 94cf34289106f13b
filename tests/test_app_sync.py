"""Sync LangGraph apps audited through the CLI on one and two cores: no deadlock, the exact hand-computed
values, and a stalled app named within its deadline.

The apps are in tests/sync_apps.py (plain `def` nodes calling `llm.invoke` / `stream` / `batch`, sub-graphs
invoked from a node, threads a node starts). Each audit runs as a user runs it, `colab-graphs audit --app`, in
a subprocess pinned to the cores (`taskset`), bounded by the subprocess timeout written in each test: a
deadlock fails the test at that bound instead of hanging the suite. Members reply as models do (prose around
"The answer is N."); "a" and "b" solve the arithmetic, "c" gets it wrong, unless a test says otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import write_pool_file

from colab_graphs.testing import arithmetic_solver

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TESTS = Path(__file__).resolve().parent
TASKSET = shutil.which("taskset")
CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
PROSE = (
    "Let me work this out carefully.\n\nFirst I read the problem, then I compute.\n\nThe answer is {answer}."
)
SOLVERS = {
    "a": arithmetic_solver(1.0, seed=1, style=PROSE),
    "b": arithmetic_solver(1.0, seed=2, style="Sure! Computing it step by step, the answer is {answer}."),
    "c": arithmetic_solver(0.0, seed=3, style="Quick estimate: the answer is {answer}."),
}
PROBLEMS = [(17, "*", 23), (120, "-", 45), (38, "+", 54), (12, "*", 12), (99, "-", 17), (7, "*", 8)]


def on_cores(n: int) -> str:
    if TASKSET is None:
        pytest.skip("taskset (util-linux) is not installed")
    if len(CORES) < n:
        pytest.skip(f"needs {n} cores, this process may use {len(CORES)}")
    return ",".join(map(str, CORES[:n]))


def arithmetic(n: int) -> list[dict[str, str]]:
    rows = []
    for i in range(n):
        x, op, y = PROBLEMS[i % len(PROBLEMS)]
        x += i // len(PROBLEMS)
        answer = x * y if op == "*" else x - y if op == "-" else x + y
        rows.append({"id": f"q{i}", "input": f"What is {x} {op} {y}?", "answer": str(answer)})
    return rows


def audit_app(
    app: str,
    server: Any,
    tmp_path: Path,
    cores: int,
    data: list[dict[str, str]],
    *options: str,
    timeout: int,
    method: str = "exact",
) -> tuple[subprocess.CompletedProcess, dict[str, Any] | None]:
    """`colab-graphs audit --app tests/sync_apps.py:APP` (no cache, no solo runs) pinned to `cores` cores,
    killed at `timeout` seconds; the process and its report."""
    pinned = on_cores(cores)
    pool = write_pool_file(tmp_path / "pool.yaml", server, ["a", "b", "c"])
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(row) + "\n" for row in data))
    out = tmp_path / "audit"
    command = [TASKSET, "-c", pinned, sys.executable, "-m", "colab_graphs.cli.app", "audit", "--app",
               f"{TESTS}/sync_apps.py:{app}", "--pool", str(pool), "--data", str(questions), "--method",
               method, "--no-cache", "--no-individual", "--no-plots", "--out", str(out), *options]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)  # type: ignore[arg-type]
    report = out / "report.json"
    return done, json.loads(report.read_text()) if report.exists() else None


def values(report: dict[str, Any]) -> dict[tuple[str, ...], float]:
    return {tuple(c["members"]): c["value"] for c in report["coalitions"]}


def assert_clean(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Task was destroyed" not in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("cores", [1, 2])
def test_sixteen_sync_workers_via_send_on_twelve_examples(scripted_server, tmp_path, cores):
    # Worker i asks ("a", "b", "c")[i % 3]: a answers 6 workers, b 5, c 5; the strict majority of the answers
    # given wins. all: 11 of 16 right; {a, b}: 11 of 11; {a, c}: 6 of 11; {b, c}: 5 of 10, no majority;
    # {a}, {b}: all right; {c}: wrong. So v(S) = 1 for S holding a, for {b}; 0 for {b, c}, {c}, {}.
    # Shapley (weights 1/3, 1/6, 1/6, 1/3 over |S| = 0, 1, 1, 2):
    #   a: 1/3 * 1 + 1/6 * 0 + 1/6 * 1 + 1/3 * 1 = 5/6;  b: 1/3 * 1 = 1/3;  c: 1/6 * (0 - 1) = -1/6.
    # LOO: a 1 - v(b, c) = 1; b 1 - v(a, c) = 0; c 1 - v(a, b) = 0.
    # 12 examples x 7 coalitions x 16 sync workers: far more sync nodes at once than asyncio's default
    # executor has threads (min(32, cpu + 4)).
    server = scripted_server(SOLVERS)
    done, report = audit_app("fan_out", server, tmp_path, cores, arithmetic(12), timeout=180)
    assert_clean(done)
    assert report["shapley"] == pytest.approx({"a": 5 / 6, "b": 1 / 3, "c": -1 / 6})
    assert report["loo"] == pytest.approx({"a": 1.0, "b": 0.0, "c": 0.0})
    assert values(report)[("b", "c")] == 0.0 and values(report)[("a", "c")] == 1.0
    # 16 distinct worker prompts per example, each made once whatever the coalitions that share it.
    made = sum(server.request_counts().values())  # chat requests (the pre-flight's GET /models is none)
    assert report["calls"]["made"] == report["calls"]["unique"] == 12 * 16 == made


@pytest.mark.parametrize(("app", "cores", "n"), [("vote", 1, 2), ("vote", 2, 2), ("call_styles", 1, 3)])
def test_sync_vote_apps_calling_by_invoke_sub_graph_stream_batch_and_thread(
    scripted_server, tmp_path, app, cores, n
):
    # vote: three voter nodes (c's through a sub-graph it invokes); call_styles: one node asking a by
    # `stream`, b by `batch` (its second reply) and c by `invoke` in a thread the node starts. Both take the
    # strict majority. all: 2 of 3 right; {a, b}: 2 of 2; {a, c}, {b, c}: 1 of 2, no majority; {a}, {b}:
    # right; {c}: wrong. Shapley a: 1/3 * 1 + 1/6 * 0 + 1/6 * 0 + 1/3 * (1 - 0) = 2/3 = b;
    # c: 1/6 * (0 - 1) * 2 = -1/3. LOO a: 1 - v(b, c) = 1 = b; c: 1 - v(a, b) = 0.
    # (The vote over two examples is the audit that hung.)
    server = scripted_server(SOLVERS)
    done, report = audit_app(app, server, tmp_path, cores, arithmetic(n), timeout=120)
    assert_clean(done)
    assert report["shapley"] == pytest.approx({"a": 2 / 3, "b": 2 / 3, "c": -1 / 3})
    assert report["loo"] == pytest.approx({"a": 1.0, "b": 1.0, "c": 0.0})


def test_a_sync_map_reduce_at_max_concurrency_one(scripted_server, tmp_path):
    # The sub-problems go to a (to b when a is absent: the app catches MemberAbsent), then c adds the results
    # up. Here b gets arithmetic wrong and a and c do not: right only when a solves and c combines, so
    # v(S) = 1[a, c in S], a unanimity game: Shapley a = c = 1/2, b = 0; LOO a = c = 1, b = 0.
    server = scripted_server({**SOLVERS, "b": SOLVERS["c"], "c": SOLVERS["a"]})
    rows = [
        {"id": "m0", "input": "What is (17 * 23) + (40 - 5)?", "answer": "426"},
        {"id": "m1", "input": "What is (12 * 12) + (99 - 17)?", "answer": "226"},
        {"id": "m2", "input": "What is (38 + 54) + (7 * 8)?", "answer": "148"},
    ]
    done, report = audit_app("map_reduce", server, tmp_path, 1, rows, "--max-concurrency", "1", timeout=120)
    assert_clean(done)
    assert report["shapley"] == pytest.approx({"a": 0.5, "b": 0.0, "c": 0.5})
    assert report["loo"] == pytest.approx({"a": 1.0, "b": 0.0, "c": 1.0})
    assert values(report)[("b", "c")] == 0.0 and values(report)[("a", "b")] == 0.0


def test_the_sync_react_agent_with_a_critic_on_one_core(scripted_server, tmp_path):
    # examples/react_critic_app.py: a LangChain agent (`create_agent`) invoked from a sync node, its calculator a sync
    # tool, and a sync critic; values worked out in tests/test_app_audit.py (Shapley solver 3/4, critic 1/4;
    # LOO solver 1, critic 1/2).
    from colab_graphs.testing.scripts import load_members

    examples = TESTS.parent / "examples"
    server = scripted_server(load_members(f"{examples}/agent_members.py:CRITIC_TEAM"))
    pool = write_pool_file(tmp_path / "pool.yaml", server, ["solver", "critic"])
    command = [TASKSET or "taskset", "-c", on_cores(1), sys.executable, "-m", "colab_graphs.cli.app", "audit",
               "--app", f"{examples}/react_critic_app.py:app", "--pool", str(pool), "--data",
               str(examples / "calculator_questions.jsonl"), "--method", "exact", "--no-cache", "--no-plots",
               "--out", str(tmp_path / "audit")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert_clean(done)
    report = json.loads((tmp_path / "audit" / "report.json").read_text())
    assert report["shapley"] == pytest.approx({"solver": 0.75, "critic": 0.25})
    assert report["loo"] == pytest.approx({"solver": 1.0, "critic": 0.5})


def test_a_stalled_app_fails_within_its_deadline_naming_the_node(scripted_server, tmp_path):
    # The app drafts with a, then its sync node waits forever. Each play is given 6 s: every example fails,
    # its error naming the node it waited in; the watchdog (1 s) prints the same on stderr; the process exits
    # (the stalled threads do not hold it). Bound: 2 rounds of plays per example (the whole pool first, then
    # the rest together), each 6 s, plus the start; the subprocess timeout is far above, far below forever.
    # 6 s, not 2: at a load of ~6 on two cores (two test workers and more), the first round's plays (and a
    # run's) timed out before the watchdog had seen a second without progress and named them.
    server = scripted_server(SOLVERS)
    done, report = audit_app(
        "stalled", server, tmp_path, 2, arithmetic(2), "--example-timeout", "6", "--stall-after", "1",
        timeout=90, method="loo",
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert "did not finish within 6 s (the example timeout): running node 'wait_for_review'" in said
    assert "calls pending: none" in said
    assert "stalled: no call and no node has finished for" in done.stderr
    assert "example 'q0' with a, b, c: running node 'wait_for_review'" in done.stderr
    assert report is None  # every example failed: no contribution to report
    assert "Task was destroyed" not in done.stderr


def test_run_of_a_stalled_app_fails_each_example_at_its_deadline_naming_the_node(scripted_server, tmp_path):
    # `colab-graphs run --app` scores the app once, the whole pool playing: each example has the same deadline
    # as an audit's play. Bound: 2 examples in flight together, 6 s each (see above), plus the start.
    server = scripted_server(SOLVERS)
    pool = write_pool_file(tmp_path / "pool.yaml", server, ["a", "b", "c"])
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(row) + "\n" for row in arithmetic(2)))
    out = tmp_path / "run"
    command = [TASKSET, "-c", on_cores(2), sys.executable, "-m", "colab_graphs.cli.app", "run", "--app",
               f"{TESTS}/sync_apps.py:stalled", "--pool", str(pool), "--data", str(questions), "--no-cache",
               "--out", str(out), "--example-timeout", "6", "--stall-after", "1"]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=90, env={**os.environ, "COLUMNS": "200"}
    )
    assert done.returncode == 3, done.stdout + done.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["failed"] for r in rows)
    assert all(
        "did not finish within 6 s (the example timeout): running node 'wait_for_review'" in r["error"]
        for r in rows
    )
    assert "stalled: no call and no node has finished for" in done.stderr
    assert json.loads((out / "summary.json").read_text())["failed"] == 2


def test_a_call_from_a_thread_without_the_plays_context_fails_closed(scripted_server, pool_for):
    # A node that starts a bare thread (no copy of its context) calls a member: the call cannot know its
    # coalition, so it fails the example with what to do, rather than answering as the whole pool.
    from concurrent.futures import ThreadPoolExecutor

    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    import colab_graphs as cg
    from colab_graphs.audit.run import AuditError
    from colab_graphs.models.client import ModelClient

    class State(TypedDict, total=False):
        input: str
        answer: str

    a = cg.member_chat_model("a", pool=pool_for(scripted_server(SOLVERS), ["a"]))

    def ask(state: State) -> State:
        with ThreadPoolExecutor(1) as bare:
            return {"answer": bare.submit(a.invoke, state["input"]).result().text}

    app = StateGraph(State).add_node(ask).add_edge(START, "ask").compile(name="bare_thread")
    with pytest.raises(AuditError, match=r"no audit play reaches.*contextvars\.copy_context\(\)\.run"):
        cg.run_audit(app, a.pool, arithmetic(1), client=ModelClient(None), individual=False, progress=False)


def test_a_protocol_play_past_its_deadline_fails_naming_the_pending_calls(scripted_server, pool_for):
    import colab_graphs as cg
    from colab_graphs.audit.run import AuditError
    from colab_graphs.models.client import ModelClient
    from colab_graphs.testing.scripts import Member

    server = scripted_server({"a": SOLVERS["a"], "b": Member(SOLVERS["b"], latency_s=3.0)})
    pool = pool_for(server, ["a", "b"])
    with pytest.raises(
        AuditError, match=r"did not finish within 0\.5 s .*calls pending: .*member 'b' at node 'answer_b'"
    ):
        cg.run_audit(
            "majority_vote",
            pool,
            arithmetic(1),
            example_timeout=0.5,
            client=ModelClient(None),
            progress=False,
        )


def test_the_watchdog_says_when_an_async_node_blocks_the_event_loop(scripted_server, pool_for, caplog):
    # An async node that does blocking work holds the loop itself: no timer of the loop can fire, but the
    # watchdog is a thread, and says what blocks.
    import time

    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    import colab_graphs as cg
    from colab_graphs.models.client import ModelClient

    class State(TypedDict, total=False):
        input: str
        answer: str

    async def blocking(state: State) -> State:
        time.sleep(2.5)  # a sync client, in an async node
        return {"answer": "The answer is 391."}

    app = StateGraph(State).add_node(blocking).add_edge(START, "blocking").compile(name="blocking")
    pool = pool_for(scripted_server(SOLVERS), ["a"])
    with caplog.at_level("WARNING", logger="colab_graphs"):
        report = cg.run_audit(
            app,
            pool,
            arithmetic(1),
            stall_after=0.5,
            client=ModelClient(None),
            individual=False,
            progress=False,
        )
    assert report.loo == {"a": 1.0}  # (the empty coalition is not played: it scores 0)
    said = caplog.text
    assert (
        "the event loop itself has not run for" in said
        and "an async node or tool doing blocking work" in said
    )
    assert "example 'q0' with a: running node 'blocking'" in said
