"""The Python API as users meet it: README's snippets run as written, and the sync forms work inside a
running event loop (a notebook)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from conftest import write_pool_file

import colab_graphs as cg
from colab_graphs.testing import arithmetic_solver

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_snippets(section: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, re.DOTALL)


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
def test_the_readme_python_api_snippets_run_as_written(solvers, capsys):
    snippets = readme_snippets("Python API")
    assert len(snippets) == 2
    namespace: dict = {}
    for snippet in snippets:
        exec(compile(snippet, "README.md", "exec"), namespace)  # noqa: S102
    report = namespace["report"]
    assert report.players == ["a", "b", "c"] and report.shapley_method == "exact"
    assert len(report.coalitions) == 8
    grand = next(c.value for c in report.coalitions if len(c.members) == 3)
    assert sum(report.shapley.values()) == pytest.approx(grand)  # efficiency: v(N) - v(empty), v(empty) = 0
    assert report.individual["c"] > report.individual["b"]  # the better solver alone
    assert "51" in capsys.readouterr().out  # 17 * 3, through the compiled LangGraph graph
    assert namespace["without_a"].members == ["b", "c"]


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
