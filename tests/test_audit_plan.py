"""`--dry-run`: an audit's plan (calls, cached calls, tokens, cost) before any call, checked against the run.

Over real HTTP with a scripted server that counts requests: a dry run sends none, and the calls it plans are
the calls the audit then makes, exactly where the plan is fixed (every seat's prompt depends on the example
alone) and within the stated bound where later calls depend on earlier replies (a debate's second round).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import cli_in_process as cli
from realistic_team import MEMBERS, PRICED, priced_team, records, team

from colab_graphs.audit.plan import plan_audit
from colab_graphs.audit.run import play_audit
from colab_graphs.audit.strategy import choose_strategy
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def examples():
    return records(limit=4)


@pytest.fixture
def server(scripted_server, examples):
    return scripted_server(priced_team(examples))


def priced_pool(server, **settings) -> Pool:
    return Pool.from_dict(
        {
            m: {"model": f"openai/{PRICED[m]}", "api_base": server.base_url, "api_key": "sk-t", **settings}
            for m in MEMBERS
        }
    )


def write_inputs(tmp_path: Path, pool: Pool, examples) -> tuple[Path, Path]:
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(yaml.safe_dump({"models": {m.name: dict(m.settings) for m in pool}}))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(e.model_dump()) + "\n" for e in examples))
    return pool_file, data


def plan_of(spec, pool, examples, cache, **options):
    strategy = choose_strategy(spec, len(examples), options.pop("method", "loo"), **options)
    return plan_audit(spec, pool, examples, strategy, client=ModelClient(cache))


def run(arun, spec, pool, examples, cache, **options):
    client = ModelClient(cache, max_concurrency=8, backoff_s=0.01)
    return arun(play_audit(spec, pool, examples, client=client, **options))


def test_a_dry_run_writes_the_plan_and_sends_no_request(server, pool_for, examples, tmp_path):
    pool_file, data = write_inputs(tmp_path, pool_for(server, MEMBERS), examples)
    done = cli("audit", "--protocol", "debate", "--pool", pool_file, "--data", data, "--method", "exact",
               "--dry-run", "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert server.requests == []
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["calls"] is None and plan["calls_max"] > 0  # a debate's second round reads the first
    assert set(plan["per_member"]) == set(MEMBERS) and plan["cost_usd"] is None  # no price for "a"
    assert "No call was made" in done.stdout and "unknown" in done.stdout
    assert not (tmp_path / "out" / "report.json").exists()
    # The same command without --dry-run stays within the plan's bound.
    done = cli("audit", "--protocol", "debate", "--pool", pool_file, "--data", data, "--method", "exact",
               "--no-plots", "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["calls"]["made"] == len(server.chat_requests) <= plan["calls_max"]


def test_a_dry_run_table_of_a_vote_is_the_calls_the_run_then_makes(server, pool_for, examples, tmp_path):
    pool_file, data = write_inputs(tmp_path, pool_for(server, MEMBERS, seed=3, temperature=0.7), examples)
    args = ("audit", "--protocol", "majority_vote", "-P", "samples=2", "--pool", pool_file, "--data", data,
            "--method", "exact", "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")  # fmt: skip
    done = cli(*args, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert server.requests == []
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["calls_max"] is None and plan["calls"] == len(MEMBERS) * 2 * len(examples)
    total = next(line for line in done.stdout.splitlines() if "total" in line)
    assert [cell.strip() for cell in total.split("│")][2] == f"{plan['calls']:,}"
    assert "calls are exact" in done.stdout
    done = cli(*args, "--no-plots")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["calls"]["made"] == len(server.chat_requests) == plan["calls"]
    assert {m: p["calls"] for m, p in plan["per_member"].items()} == {
        m: u["calls"] for m, u in report["usage"].items()
    }


@pytest.mark.parametrize(("protocol", "params"), [("majority_vote", {"samples": 2}), ("slm_mux", {})])
def test_the_plan_of_a_fixed_protocol_is_exactly_the_calls_the_audit_makes(
    arun, server, pool_for, examples, tmp_path, protocol, params
):
    pool = pool_for(server, MEMBERS, seed=3, temperature=0.7)
    spec = build_protocol(protocol, MEMBERS, **params)
    plan = plan_of(spec, pool, examples, CallCache(tmp_path / "c"), method="exact")
    report = run(arun, spec, pool, examples, CallCache(tmp_path / "c"), method="exact")
    assert plan.calls == report.calls.unique == report.calls.made == len(server.chat_requests)
    assert plan.cached == 0 and plan.calls_max is None
    assert {m: p.calls for m, p in plan.per_member.items()} == {m: u.calls for m, u in report.usage.items()}


def test_the_plan_counts_the_calls_the_cache_holds_as_free(arun, server, pool_for, examples, tmp_path):
    pool = pool_for(server, MEMBERS)
    spec = build_protocol("majority_vote", MEMBERS)
    run(arun, spec, pool, examples[:2], CallCache(tmp_path / "c"))  # half the records' calls are cached
    plan = plan_of(spec, pool, examples, CallCache(tmp_path / "c"))
    assert plan.cached == len(MEMBERS) * 2 and plan.calls == len(MEMBERS) * len(examples)
    before = len(server.chat_requests)
    report = run(arun, spec, pool, examples, CallCache(tmp_path / "c"))
    assert report.calls.made == len(server.chat_requests) - before == plan.to_make


def test_the_plan_of_a_debate_bounds_the_calls_the_audit_makes(arun, server, pool_for, examples, tmp_path):
    pool = pool_for(server, MEMBERS)
    spec = build_protocol("debate", MEMBERS, rounds=2)
    plan = plan_of(spec, pool, examples, CallCache(tmp_path / "c"), method="exact")
    report = run(arun, spec, pool, examples, CallCache(tmp_path / "c"), method="exact")
    assert plan.calls is None
    # Round 1: one call per member and record, shared by every coalition; round 2: at most one per seat run.
    round_two_runs = sum(len(c.members) for c in report.coalitions) * len(examples)
    assert plan.calls_max == len(MEMBERS) * len(examples) + round_two_runs
    assert report.calls.unique == report.calls.made == len(server.chat_requests) <= plan.calls_max


def test_the_plan_prices_calls_from_litellm_s_price_map(server, examples, tmp_path):
    pool = priced_pool(server, max_tokens=64)
    plan = plan_of(build_protocol("majority_vote", MEMBERS), pool, examples, CallCache(tmp_path / "c"))
    import litellm

    for name, member in plan.per_member.items():
        price = litellm.model_cost[PRICED[name]]
        assert member.price == "litellm" and member.completion == "max_tokens"
        assert member.tokens.completion == 64 * member.calls
        expected = (
            member.tokens.prompt * price["input_cost_per_token"]
            + 64 * member.calls * price["output_cost_per_token"]
        )
        assert member.cost_usd == pytest.approx(expected)
    assert plan.cost_usd == pytest.approx(sum(m.cost_usd for m in plan.per_member.values()))


def test_a_sampled_plan_is_bounded_by_its_budget_in_calls_and_the_run_stays_within_it(
    arun, scripted_server, pool_for, examples, tmp_path
):
    names = [f"m{i}" for i in range(6)]
    server = scripted_server(team(examples, names))
    pool = pool_for(server, names)
    spec = build_protocol("debate", names, rounds=2)
    budget = 900
    plan = plan_of(spec, pool, examples, CallCache(tmp_path / "c"), method="sampled", budget=budget)
    assert plan.estimator == "stratified" and plan.calls_max == budget
    report = run(arun, spec, pool, examples, CallCache(tmp_path / "c"), method="sampled", budget=budget)
    assert report.shapley_estimator == "stratified" and report.stopped == "budget"
    assert report.calls.unique == len(server.chat_requests) <= budget
    assert report.sampling_error is not None and len(report.coalitions) > plan.coalitions


def test_a_budget_below_the_first_batch_is_a_clear_error(arun, scripted_server, pool_for, examples, tmp_path):
    names = [f"m{i}" for i in range(6)]
    server = scripted_server(team(examples, names))
    with pytest.raises(ValueError, match=r"a budget of 50 calls is below the \d+ distinct calls"):
        run(arun, build_protocol("debate", names), pool_for(server, names), examples, CallCache(tmp_path / "c"),
            method="sampled", budget=50)  # fmt: skip
    assert server.requests == []


def test_a_study_dry_run_writes_the_plan_and_sends_no_request(server, pool_for, examples, tmp_path):
    pool_file, data = write_inputs(tmp_path, pool_for(server, MEMBERS), examples)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "pools": {"p": str(pool_file)}, "protocols": ["majority_vote", "debate"], "datasets": [str(data)],
    }))  # fmt: skip
    done = cli(
        "study", "--config", study, "--dry-run", "--cache-dir", tmp_path / "cache", "--out", tmp_path / "s"
    )
    assert done.returncode == 0, done.stderr
    assert server.requests == []
    plan = json.loads((tmp_path / "s" / "plan.json").read_text())
    assert set(plan["settings"]) == {"p/majority_vote/data", "p/debate/data"}
    vote = plan["settings"]["p/majority_vote/data"]
    assert vote["estimator"] == "exact_from_answers" and vote["calls"] == len(MEMBERS) * len(examples)
    # The debate's first round asks what the vote asks: the study counts those requests once.
    debate = plan["settings"]["p/debate/data"]["calls_max"]
    assert plan["calls_max"] == debate
