"""The Python API as users meet it: docs/python-api.md's snippets run as written, making the calls their graph
says, and the sync forms work inside a running event loop (a notebook)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from conftest import write_pool_file

import colab_graphs as cg
from colab_graphs.testing import arithmetic_solver

PAGE = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"


def page_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)


@pytest.fixture
def solvers(scripted_server, tmp_path, monkeypatch):
    server = scripted_server(
        {
            m: arithmetic_solver(accuracy=acc, seed=i)
            for i, (m, acc) in enumerate([("a", 0.9), ("b", 0.6), ("c", 1.0)])
        }
    )
    write_pool_file(tmp_path / "pool.yaml", server, ["a", "b", "c"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLAB_GRAPHS_CACHE_DIR", str(tmp_path / "cache"))
    return server


@pytest.mark.slow
def test_the_python_api_snippets_run_as_written_making_the_calls_their_graph_says(solvers, capsys):
    snippets = page_snippets()
    assert len(snippets) == 2
    namespace: dict = {}
    exec(compile(snippets[0], "docs/python-api.md", "exec"), namespace)  # noqa: S102
    audit_calls = len(solvers.chat_requests)
    exec(compile(snippets[1], "docs/python-api.md", "exec"), namespace)  # noqa: S102
    report = namespace["report"]
    assert report.players == ["a", "b", "c"] and report.shapley_method == "exact"
    assert len(report.coalitions) == 8
    grand = next(c.value for c in report.coalitions if len(c.members) == 3)
    assert sum(report.shapley.values()) == pytest.approx(grand)  # efficiency: v(N) - v(empty), v(empty) = 0
    assert report.individual["c"] > report.individual["b"]  # the better solver alone
    assert "51" in capsys.readouterr().out  # 17 * 3, through the compiled LangGraph graph
    assert namespace["without_a"].members == ["b", "c"]
    # The calls the graph says, per example: each solver once, then the judge once, after both (an absent
    # judge's seat passes to the first present member; an absent solver's seat is dropped). A START -> judge
    # edge would add a judge call on no solutions to every coalition that has a judge.
    per_example = {"abc": 3, "ab": 3, "ac": 2, "bc": 2, "a": 2, "b": 2, "c": 1, "": 0}
    assert {"".join(c.members): c.calls for c in report.per_coalition} == {
        k: 10 * n for k, n in per_example.items()
    }
    # A naive evaluation plays each coalition, and each member's solo run (its individual strength) apart.
    assert report.calls.naive == 10 * (sum(per_example.values()) + 3)
    # Each distinct request was sent once, and nothing else: the audit's, then the compiled graph's three.
    assert report.calls.made == report.calls.unique == audit_calls
    assert sorted(solvers.request_counts().values()) == [1] * len(solvers.chat_requests)
    assert sorted(r.model for r in solvers.chat_requests[audit_calls:]) == ["a", "b", "c"]


def test_sync_forms_work_inside_a_running_event_loop(solvers):
    async def notebook_cell():
        # A notebook cell runs inside the kernel's loop: asyncio.run() would fail here, the sync form must not.
        result = cg.run("majority_vote", "pool.yaml", "builtin:arithmetic", limit=4)
        report = cg.run_audit("majority_vote", "pool.yaml", "builtin:arithmetic", limit=4)
        return result, report

    result, report = asyncio.run(notebook_cell())
    assert result.summary["n"] == 4 and 0.0 <= result.score <= 1.0
    assert set(report.loo) == {"a", "b", "c"}


def test_async_forms_and_inputs_given_as_python_objects(solvers, arun):
    pool = {"a": {"model": "openai/a", "api_base": solvers.base_url, "api_key": "sk-test"}}
    data = [{"id": "q1", "input": "What is 6 * 7?", "answer": "42"}]
    result = arun(cg.arun("solo", pool, data))
    assert result.score == 1.0 and result.outcomes[0].answer == "42"


def test_the_public_api_is_imported_statically():
    source = (Path(cg.__file__)).read_text()
    assert "__getattr__" not in source
    assert {"run", "run_audit", "run_study", "train", "arun_audit", "load_examples", "GraphBuilder"} <= set(
        cg.__all__
    )
