"""`colab-graphs run | cache` end to end: a pool file and JSONL data written here, a scripted server over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from colab_graphs.cli.app import app
from colab_graphs.testing import ScriptedServer, arithmetic_solver

pytestmark = pytest.mark.integration

HEAVY = ("litellm", "torch", "transformers", "trl", "langgraph")


def write_pool(path: Path, server: ScriptedServer, names: list[str]) -> Path:
    lines = ["models:"]
    for name in names:
        lines.append(f"  {name}:")
        lines.append(f"    model: openai/{name}")
        lines.append(f"    api_base: {server.base_url}")
        lines.append("    api_key: ${CG_CLI_TEST_KEY}")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_data(path: Path, n: int) -> Path:
    rows = [{"id": f"q{i}", "input": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scripted_server) -> dict[str, Any]:
    monkeypatch.setenv("CG_CLI_TEST_KEY", "sk-SECRET-cli-0123456789")
    server = scripted_server(
        {
            "a": arithmetic_solver(accuracy=1.0),
            "b": arithmetic_solver(accuracy=0.0, seed=1),
            "c": arithmetic_solver(accuracy=1.0, seed=2),
        },
    )
    return {
        "server": server,
        "pool": write_pool(tmp_path / "pool.yaml", server, ["a", "b", "c"]),
        "data": write_data(tmp_path / "data.jsonl", 4),
        "cache": tmp_path / "cache",
        "tmp": tmp_path,
    }


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def run_args(ws: dict[str, Any], protocol: str, out: str, *extra: str | Path) -> list[str | Path]:
    return [
        "run",
        "--protocol",
        protocol,
        "--pool",
        ws["pool"],
        "--data",
        ws["data"],
        "--out",
        ws["tmp"] / out,
        "--cache-dir",
        ws["cache"],
        *extra,
    ]


def read_outputs(out: Path) -> tuple[list[dict], list[dict], dict]:
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    traces = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    return results, traces, json.loads((out / "summary.json").read_text())


def test_help_does_not_import_heavy_modules() -> None:
    code = (
        "import sys\n"
        "sys.argv = ['colab-graphs', '--help']\n"
        "from colab_graphs.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr
    assert "run" in proc.stdout and "cache" in proc.stdout
    assert "HEAVY []" in proc.stdout
    assert elapsed < 10  # generous on a loaded 2-core machine; heavy imports would cost 5-20 s


def test_importing_the_cli_does_not_import_litellm() -> None:
    code = "import colab_graphs.cli.app, sys; print('litellm' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


def test_run_solo_writes_the_documented_outputs(workspace) -> None:
    result = invoke(*run_args(workspace, "solo", "solo", "-P", "member=c"))
    assert result.exit_code == 0, result.output
    results, traces, summary = read_outputs(workspace["tmp"] / "solo")
    assert [r["id"] for r in results] == ["q0", "q1", "q2", "q3"]
    assert all({"id", "answer", "score", "failed"} <= set(r) for r in results)
    assert [r["answer"] for r in results] == ["1", "3", "5", "7"]
    assert {"protocol", "score", "n", "failed", "calls", "tokens", "cost_usd", "wall_s"} <= set(summary)
    assert (summary["protocol"], summary["score"], summary["n"], summary["failed"]) == ("solo", 1.0, 4, 0)
    assert summary["calls"] == {"made": 4, "cached": 0, "failed": 0}
    assert {t["calls"][0]["member"] for t in traces} == {"c"}
    assert "score 1.000" in result.output


def test_run_majority_vote_with_samples_and_limit(workspace) -> None:
    result = invoke(*run_args(workspace, "majority_vote", "mv", "-P", "samples=2", "--limit", "3"))
    assert result.exit_code == 0, result.output
    results, traces, summary = read_outputs(workspace["tmp"] / "mv")
    assert summary["n"] == 3 and summary["score"] == 1.0  # a and c outvote b
    assert summary["calls"]["made"] == 18 and sum(workspace["server"].request_counts().values()) == 18
    assert {c["sample"] for t in traces for c in t["calls"]} == {0, 1}


def test_second_run_is_all_cache_hits(workspace) -> None:
    assert invoke(*run_args(workspace, "majority_vote", "one")).exit_code == 0
    workspace["server"].reset()
    result = invoke(*run_args(workspace, "majority_vote", "two"))
    assert result.exit_code == 0, result.output
    assert workspace["server"].requests == []
    assert read_outputs(workspace["tmp"] / "two")[2]["calls"] == {"made": 0, "cached": 12, "failed": 0}


def test_failed_examples_make_a_nonzero_exit(workspace) -> None:
    # A model the server does not serve: a 404 is permanent, so the call fails at once (no retry backoff).
    write_pool(workspace["pool"], workspace["server"], ["a", "missing"])
    result = invoke(*run_args(workspace, "majority_vote", "failing", "--limit", "2"))
    assert result.exit_code == 3
    assert "2 example(s) failed" in result.output
    results, _, summary = read_outputs(workspace["tmp"] / "failing")
    assert all(r["failed"] is True and r["score"] is None for r in results)
    assert summary["failed"] == 2 and summary["score"] is None


def test_bad_pool_file_is_a_usage_error_naming_file_and_member(workspace) -> None:
    workspace["pool"].write_text("models:\n  a: {model: openai/a, temprature: 1}\n")
    result = invoke(*run_args(workspace, "solo", "bad"))
    assert result.exit_code == 2
    assert (
        str(workspace["pool"]) in result.output and "'a'" in result.output and "temprature" in result.output
    )


def test_no_cache_writes_no_cache_file(workspace) -> None:
    result = invoke(*run_args(workspace, "solo", "nocache", "--no-cache"))
    assert result.exit_code == 0, result.output
    assert not (workspace["cache"] / "calls.sqlite").exists()


def test_cache_stats_and_clear(workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    assert invoke(*run_args(workspace, "majority_vote", "fill", "--limit", "2")).exit_code == 0
    monkeypatch.setenv("COLAB_GRAPHS_CACHE_DIR", str(workspace["cache"]))  # the env var names the cache too
    stats = json.loads(invoke("cache", "stats").output)
    assert stats["entries"] == 6
    assert stats["by_model"] == {"openai/a": 2, "openai/b": 2, "openai/c": 2}
    assert stats["path"] == str(workspace["cache"] / "calls.sqlite") and stats["bytes"] > 0
    assert "deleted 2 entries" in invoke("cache", "clear", "--model", "openai/b", "--yes").output
    assert json.loads(invoke("cache", "stats").output)["entries"] == 4
    assert invoke("cache", "clear", "--cache-dir", workspace["cache"], "-y").output.startswith(
        "deleted 4 entries"
    )
    assert json.loads(invoke("cache", "stats").output)["entries"] == 0


def test_cache_clear_asks_first(workspace) -> None:
    result = CliRunner().invoke(app, ["cache", "clear", "--cache-dir", str(workspace["cache"])], input="n\n")
    assert result.exit_code == 1 and "delete all entries" in result.output


def test_run_a_user_graph_from_a_python_file(workspace) -> None:
    graph_file = workspace["tmp"] / "my_graph.py"
    graph_file.write_text(
        "from colab_graphs import GraphBuilder\n\n\n"
        "def two_step(members, hint='Think.'):\n"
        "    b = GraphBuilder('two_step', members=members[:2])\n"
        "    b.seat('draft', member=members[0], prompt=hint + ' {input}', writes='draft')\n"
        "    b.seat('check', member=members[1], prompt='{input} Draft: {d}', reads={'d': 'draft'}, writes='out')\n"
        "    return b.chain('draft', 'check').output('out').build()\n"
    )
    args = run_args(workspace, "", "user", "--limit", "2", "-P", "hint=Careful.")
    args[1:3] = ["--graph", f"{graph_file}:two_step"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    _, traces, summary = read_outputs(workspace["tmp"] / "user")
    assert summary["protocol"] == "two_step" and summary["n"] == 2
    assert traces[0]["calls"][0]["messages"][0]["content"].startswith("Careful. What is 0 + 1?")
    assert [c["member"] for c in traces[0]["calls"]] == ["a", "b"]


def test_show_prints_mermaid(workspace) -> None:
    result = invoke("show", "majority_vote", "--pool", workspace["pool"], "--format", "mermaid")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("flowchart TD") and '"answer_c\\n[c]"' in result.output


def test_retries_option_bounds_attempts_on_a_failing_server(workspace, scripted_server) -> None:
    server = scripted_server({"a": arithmetic_solver(accuracy=1.0)}, fail_first=5, fail_first_kind="500")
    write_pool(workspace["pool"], server, ["a"])
    result = invoke(*run_args(workspace, "solo", "retries", "--limit", "1", "--retries", "1"))
    assert result.exit_code == 3
    # The first attempt and one retry, then the example is failed (the pre-flight GET /models is no attempt).
    assert sum(server.request_counts().values()) == 2
