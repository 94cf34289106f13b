"""The CLI's small promises: --version, --limit >= 1, "did you mean", a refused --out that says what differs,
one cost rule in every output, the Shapley interval in the terminal, and the example pool file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from colab_graphs import Pool, PoolError, __version__
from colab_graphs.cli.app import _register_optional_commands, app
from colab_graphs.testing import arithmetic_solver

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
_register_optional_commands()  # every command, as the console entry point registers them


def invoke(*args: Any) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False, env={"COLUMNS": "200"})


@pytest.fixture
def workspace(scripted_server, tmp_path: Path, monkeypatch) -> Path:
    # gpt-4o-mini: a name LiteLLM has a price for, so costs are known numbers.
    server = scripted_server({"gpt-4o-mini": arithmetic_solver(0.8, 1), "b": arithmetic_solver(0.6, 2)})
    (tmp_path / "pool.yaml").write_text(
        "models:\n"
        f"  a: {{model: openai/gpt-4o-mini, api_base: '{server.base_url}', api_key: sk-test, temperature: 0}}\n"
        f"  b: {{model: openai/b, api_base: '{server.base_url}', api_key: sk-test}}\n"
    )
    rows = [{"id": f"q{i}", "input": f"What is {i} + {i + 3}?", "answer": str(2 * i + 3)} for i in range(4)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("COLAB_GRAPHS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_version_prints_the_package_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip() == f"colab-graphs {__version__}"


def test_a_limit_of_zero_is_refused_before_anything_runs(workspace) -> None:
    result = invoke("run", "--pool", "pool.yaml", "--data", "d.jsonl", "--limit", "0")
    said = " ".join(result.output.split())
    assert (
        result.exit_code == 2
        and "Invalid value for '--limit'" in said
        and "greater than or equal to 1" in said
    )
    assert not (workspace / "runs").exists()


def test_an_unknown_protocol_gets_a_did_you_mean(workspace) -> None:
    result = invoke("run", "--protocol", "majority_vot", "--pool", "pool.yaml", "--data", "d.jsonl")
    assert result.exit_code == 2
    assert "unknown protocol 'majority_vot' (did you mean 'majority_vote'?)" in " ".join(
        result.output.split()
    )


def test_a_refused_run_folder_says_what_differs(workspace) -> None:
    assert (
        invoke("run", "--pool", "pool.yaml", "--data", "d.jsonl", "--limit", "2", "--out", "r").exit_code == 0
    )
    text = (workspace / "pool.yaml").read_text().replace("temperature: 0}", "temperature: 0.7}")
    (workspace / "pool.yaml").write_text(text)
    result = invoke("run", "--pool", "pool.yaml", "--data", "d.jsonl", "--limit", "3", "--out", "r")
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "r holds a different run" in said
    assert "pool member 'a' temperature: 0 -> 0.7" in said
    assert "data: 1 example(s) added (q2)" in said and "--overwrite" in said


def test_a_refused_audit_folder_says_what_differs(workspace) -> None:
    args = ["audit", "--pool", "pool.yaml", "--data", "d.jsonl", "--no-plots", "--out", "au"]
    assert invoke(*args, "--limit", "2").exit_code == 0
    result = invoke(*args, "--limit", "2", "--protocol", "solo", "-P", "member=b")
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "au holds a different audit" in said
    assert "protocol 'majority_vote' -> 'solo'" in said and "protocol parameter member added ('b')" in said


def test_an_error_names_a_path_longer_than_the_terminal_whole(workspace) -> None:
    folder = workspace / ("a-folder-with-a-long-name-" * 9)
    folder.mkdir()
    (folder / "pool.yaml").write_text("models:\n  a: {model: openai/a, temprature: 1}\n")
    result = invoke("run", "--pool", folder / "pool.yaml", "--data", "d.jsonl")
    assert result.exit_code == 2
    assert f"{folder / 'pool.yaml'}: member 'a' has unknown" in result.output


def test_the_terminal_table_shows_the_shapley_interval(workspace) -> None:
    result = invoke("audit", "--pool", "pool.yaml", "--data", "d.jsonl", "--method", "exact", "--no-plots")
    assert result.exit_code == 0, result.output
    # (the column names the estimator: a vote's exact game is computed from the members' answers)
    header = next(line for line in result.output.splitlines() if "Shapley (exact_from_answers)" in line)
    assert "Shapley 95% CI" in header and "LOO 95% CI" in header
    report = json.loads((workspace / "audits" / "majority_vote" / "report.json").read_text())
    low, high = report["ci"]["a"]["shapley"]
    assert f"[{low:+.3f}, {high:+.3f}]" in result.output


def test_every_output_tells_cost_by_one_rule(workspace) -> None:
    """Cost is what the calls made cost (0 when none was: a cache-served audit spent nothing), and what the
    calls served without a call of their own cost when made; unknown (null) where a price is."""
    args = ["audit", "--pool", "pool.yaml", "--data", "d.jsonl", "--method", "exact", "--no-plots"]
    first = invoke(*args, "--out", "one")
    again = invoke(*args, "--out", "two")
    one = json.loads((workspace / "one" / "report.json").read_text())
    two = json.loads((workspace / "two" / "report.json").read_text())
    # Member b has no price: the first audit's cost is unknown; the second made no call: it spent nothing.
    assert one["cost_usd"] is None and two["cost_usd"] == 0.0 and two["calls"]["made"] == 0
    assert two["cost_saved_usd"] is None  # b's cached calls have no price either
    for out, report in (("one", one), ("two", two)):
        spent = "unknown" if report["cost_usd"] is None else f"${report['cost_usd']:.4f}"
        assert (
            f"Cost: {spent} for {report['calls']['made']} call(s) made."
            in (workspace / out / "report.md").read_text()
        )
    assert "Cost: unknown for" in " ".join(first.output.split())
    assert "Cost: $0.0000 for 0 call(s) made. Served" in " ".join(again.output.split())
    run = invoke("run", "--pool", "pool.yaml", "--data", "d.jsonl", "--out", "r")
    summary = json.loads((workspace / "r" / "summary.json").read_text())
    assert (summary["cost_usd"], summary["cost_saved_usd"], summary["calls"]["made"]) == (0.0, None, 0)
    assert "Cost: $0.0000 for 0 call(s) made." in " ".join(run.output.split())


def test_known_prices_add_up_across_a_fresh_and_a_cache_served_audit(workspace) -> None:
    (workspace / "pool.yaml").write_text(
        "\n".join((workspace / "pool.yaml").read_text().splitlines()[:2]) + "\n"
    )
    args = [
        "audit",
        "--pool",
        "pool.yaml",
        "--data",
        "d.jsonl",
        "--no-plots",
        "--protocol",
        "solo",
        "-P",
        "member=a",
    ]
    assert invoke(*args, "--out", "one").exit_code == 0 and invoke(*args, "--out", "two").exit_code == 0
    one = json.loads((workspace / "one" / "report.json").read_text())
    two = json.loads((workspace / "two" / "report.json").read_text())
    assert one["cost_usd"] > 0 and two["cost_usd"] == 0.0
    # What the second audit was served cost, when made, what the first spent plus what it was served itself.
    assert two["cost_saved_usd"] == pytest.approx(one["cost_usd"] + one["cost_saved_usd"])


def test_the_example_pool_file_loads_with_its_key_set(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    pool = Pool.from_yaml(EXAMPLES / "pool.yaml")
    assert pool.names == ["gpt", "qwen", "llama", "smol", "policy"]
    assert pool["gpt"].settings["api_key"] == "sk-from-env" and "api_key" not in pool.to_public_dict()["gpt"]
    assert pool["qwen"].settings["api_base"] == "http://127.0.0.1:8000/v1"
    assert pool["llama"].replicas == 2 and pool["llama"].router["routing_strategy"] == "least-busy"
    assert pool["smol"].model == "local/smollm2-135m" and pool["smol"].system_prompt
    assert pool["policy"].model == "openai/policy"


def test_the_example_pool_file_names_the_key_it_lacks(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(
        PoolError, match=r"pool.yaml: member 'gpt': environment variable \$\{OPENAI_API_KEY\}"
    ):
        Pool.from_yaml(EXAMPLES / "pool.yaml")
