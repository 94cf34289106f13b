"""The Python API in a notebook: typed sync forms, progress, a clean exit, and results as tables."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import colab_graphs as cg
from colab_graphs.models.client import ModelClient
from colab_graphs.testing import arithmetic_solver

pytestmark = pytest.mark.integration

DATA = [{"id": f"q{i}", "input": f"What is {i} + {i + 2}?", "answer": str(2 * i + 2)} for i in range(4)]


@pytest.fixture
def pool(scripted_server, pool_for) -> cg.Pool:
    server = scripted_server({"a": arithmetic_solver(1.0, 1), "b": arithmetic_solver(0.5, 2)})
    return pool_for(server, ["a", "b"])


@pytest.mark.parametrize(
    ("sync", "async_"), [("run", "arun"), ("run_audit", "arun_audit"), ("run_study", "arun_study")]
)
def test_each_sync_form_has_its_async_forms_signature(sync: str, async_: str) -> None:
    assert inspect.signature(getattr(cg, sync)) == inspect.signature(getattr(cg, async_))
    assert getattr(cg, sync).__name__ == sync


def test_on_progress_sees_every_play_of_an_audit_and_the_calls_so_far(pool) -> None:
    seen: list[cg.Progress] = []
    report = cg.run_audit(
        "majority_vote",
        pool,
        DATA,
        method="exact",
        client=ModelClient(None),
        on_progress=seen.append,
        progress=False,
        play_every_coalition=True,  # (else a vote's game is computed from the leave-one-out plays' answers)
    )
    plays = (len(report.coalitions) + len(report.players)) * len(
        DATA
    )  # coalitions and solo runs, per example
    assert [p.done for p in seen] == list(range(plays + 1))  # the plan (0 done), then one per play
    assert {p.total for p in seen} == {plays} and seen[-1].unit == "play"
    assert seen[-1].calls_made == report.calls.made and seen[-1].calls_cached == report.calls.cached


def test_on_progress_sees_every_example_of_a_run(pool) -> None:
    seen: list[cg.Progress] = []
    cg.run("solo", pool, DATA, params={"member": "a"}, client=ModelClient(None), on_progress=seen.append)
    assert [(p.done, p.total) for p in seen] == [(i, 4) for i in range(5)]


def test_a_progress_bar_is_drawn_when_asked(pool, capsys) -> None:
    cg.run_audit("majority_vote", pool, DATA, client=ModelClient(None), progress=True)
    drawn = capsys.readouterr().err
    assert (
        "audit majority_vote" in drawn and "20/20" in drawn
    )  # (3 LOO coalitions + 2 solo runs) x 4 examples


@pytest.mark.slow
def test_a_sync_call_leaves_no_pending_task_at_exit(tmp_path) -> None:
    """LiteLLM's logging worker, left pending on the background loop, was destroyed at exit with a warning
    (seen after a sync call followed by another loop's asyncio.run, as in a script that mixes both)."""
    script = textwrap.dedent(
        """
        import asyncio
        import colab_graphs as cg
        from colab_graphs.testing import ScriptedServer, arithmetic_solver

        data = [{"id": "q", "input": "What is 2 + 3?", "answer": "5"}]
        with ScriptedServer({"a": arithmetic_solver(1.0), "b": arithmetic_solver(1.0, 1)}) as server:
            pool = {m: {"model": f"openai/{m}", "api_base": server.base_url, "api_key": "k"} for m in "ab"}
            report = cg.run_audit("majority_vote", pool, data, cache_dir="CACHE", progress=False)
            asyncio.run(cg.arun("majority_vote", pool, data, cache_dir="CACHE"))
            print("loo", report.loo)
        """
    ).replace("CACHE", str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "loo {'a': " in done.stdout
    assert "Task was destroyed" not in done.stderr and "pending" not in done.stderr


def test_an_audit_report_is_a_table_a_dataset_and_html(pool) -> None:
    report = cg.run_audit(
        "majority_vote", pool, DATA, method="exact", client=ModelClient(None), progress=False
    )
    frame = report.to_pandas()
    assert list(frame["member"]) == ["a", "b"]
    assert frame.set_index("member")["shapley"].to_dict() == pytest.approx(report.shapley)
    assert frame.set_index("member")["loo_low"].to_dict() == {m: report.ci[m]["loo"][0] for m in "ab"}
    dataset = report.to_dataset()
    assert dataset.num_rows == 2 and dataset["individual"] == [report.individual["a"], report.individual["b"]]
    html = report._repr_html_()
    assert "<table>" in html and "majority_vote" in html and f"{report.shapley['a']:.3f}" in html


def test_a_run_is_a_table_a_dataset_and_html(pool) -> None:
    result = cg.run("solo", pool, DATA, params={"member": "a"}, client=ModelClient(None))
    frame = result.to_pandas()
    assert list(frame["id"]) == ["q0", "q1", "q2", "q3"] and list(frame["score"]) == [1.0] * 4
    assert result.to_dataset()["answer"] == ["2", "4", "6", "8"]
    assert "<table>" in result._repr_html_() and "q3" in result._repr_html_()


def test_a_study_is_a_table_a_dataset_and_html(pool, tmp_path) -> None:
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in DATA))
    (tmp_path / "pool.yaml").write_text(
        yaml.safe_dump({"models": cg.Pool.to_public_dict(pool) | _keys(pool)})
    )
    config = {
        "pools": {"P": "pool.yaml"},
        "protocols": ["majority_vote"],
        "datasets": ["d.jsonl"],
        "method": "exact",
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(config))
    study = cg.run_study(tmp_path / "study.yaml", tmp_path / "out", client=ModelClient(None), progress=False)
    frame = study.to_pandas()
    assert sorted(frame["member"]) == ["a", "b"] and set(frame["protocol"]) == {"majority_vote"}
    assert study.to_dataset().num_rows == 2
    assert "<table>" in study._repr_html_()


def _keys(pool: cg.Pool) -> dict:
    return {m.name: {**m.public_settings(), "api_key": "sk-test"} for m in pool}


def test_a_missing_pandas_is_named_with_the_extra_that_installs_it(pool, monkeypatch) -> None:
    result = cg.run("solo", pool, DATA[:1], params={"member": "a"}, client=ModelClient(None))
    monkeypatch.setitem(sys.modules, "pandas", None)  # what an environment without pandas gives
    with pytest.raises(
        ImportError, match=r"to_pandas\(\) needs the 'pandas' package: pip install 'colab-graphs\[notebook\]'"
    ):
        result.to_pandas()


def test_a_limit_of_zero_is_refused(pool) -> None:
    with pytest.raises(cg.DatasetError, match="limit must be an integer >= 1"):
        cg.run("solo", pool, DATA, params={"member": "a"}, limit=0)
    with pytest.raises(cg.DatasetError, match="limit must be an integer >= 1"):
        cg.run("solo", pool, "builtin:arithmetic", params={"member": "a"}, limit=0)


def test_the_docs_point_at_files_that_exist() -> None:
    root = Path(__file__).resolve().parents[1]
    docs = (root / "docs" / "apps.md").read_text() + (root / "docs" / "pools.md").read_text()
    for name in ("examples/agent_app.py", "examples/react_critic_app.py", "examples/pool.yaml"):
        assert f"](../{name})" in docs and (root / name).exists()
