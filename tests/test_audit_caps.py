"""`--max-calls` and `--max-cost`: an audit stops before a cap, exits 4 with a partial report, and resumes.

Over real HTTP with a scripted server that counts requests: a capped audit sends no request past its cap,
writes `report.json` with `"partial": true` (values over the examples every coalition finished), and the same
command with a higher cap, or none, finishes it to the report an uncapped audit gives, without sending any
request twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from realistic_team import MEMBERS, PRICED, priced_team, records, team

from colab_graphs.audit.report import read_report
from colab_graphs.audit.run import play_audit
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.tasks.loaders import load_examples

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONTRIBUTIONS = ("coalitions", "individual", "loo", "shapley", "ci", "ranks", "n_examples", "sampling_error")


@pytest.fixture(scope="module")
def examples():
    return records(limit=3)


@pytest.fixture
def server(scripted_server, examples):
    return scripted_server(priced_team(examples))


def inputs(tmp_path: Path, server, examples, priced: bool = False) -> tuple[Path, Path]:
    model = PRICED if priced else {m: m for m in MEMBERS}
    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump({"models": {
        m: {"model": f"openai/{model[m]}", "api_base": server.base_url, "api_key": "sk-t", "max_tokens": 64}
        for m in MEMBERS
    }}))  # fmt: skip
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(e.model_dump()) + "\n" for e in examples))
    return pool, data


def audit_cli(
    pool: Path, data: Path, out: Path, cache: Path, *extra: str | Path
) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "colab_graphs.cli.app", "audit", "--protocol", "debate", "--pool", pool,
               "--data", data, "--method", "exact", "--no-plots", "--cache-dir", cache, "--out", out, *extra]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(list(map(str, command)), capture_output=True, text=True, timeout=180, env=env)


def contributions(report) -> dict:
    data = report.model_dump()
    return {k: data[k] for k in CONTRIBUTIONS}


def uncapped(arun, pool_file: Path, data: Path, tmp_path: Path):
    """The audit `audit_cli` runs, uncapped, in process (its own cache; the same files)."""
    client = ModelClient(CallCache(tmp_path / "cache-full"), max_concurrency=8, backoff_s=0.01)
    spec = build_protocol("debate", MEMBERS)
    examples = load_examples(str(data))
    return arun(play_audit(spec, Pool.from_yaml(pool_file), examples, client=client, method="exact"))


def test_a_capped_audit_stops_before_its_cap_and_resumes_to_the_uncapped_report(
    arun, server, examples, tmp_path
):
    pool, data = inputs(tmp_path, server, examples)
    full = uncapped(arun, pool, data, tmp_path)
    needed = full.calls.unique
    server.reset()

    cap = needed // 3
    done = audit_cli(pool, data, tmp_path / "capped", tmp_path / "cache", "--max-calls", cap)
    assert done.returncode == 4, done.stderr
    assert 0 < len(server.chat_requests) <= cap
    partial = read_report(tmp_path / "capped")
    assert partial.cap["calls"] == len(server.chat_requests)
    assert partial.partial and partial.cap["cap"] == "max_calls" and partial.examples_planned == len(examples)
    assert partial.n_examples < len(examples) and partial.calls.made <= cap
    assert "partial" in done.stdout and "partial" in (tmp_path / "capped" / "report.md").read_text().lower()

    # The same command without the cap finishes it: what was recorded or cached is not called again.
    done = audit_cli(pool, data, tmp_path / "capped", tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    resumed = read_report(tmp_path / "capped")
    assert not resumed.partial
    assert contributions(resumed) == contributions(full)
    assert resumed.calls.made == resumed.calls.unique == needed
    assert len(server.chat_requests) == needed and set(server.request_counts().values()) == {1}


def test_max_cost_stops_before_the_cost_would_pass_it(arun, server, examples, tmp_path):
    pool, data = inputs(tmp_path, server, examples, priced=True)
    total = uncapped(arun, pool, data, tmp_path).cost_usd
    assert total is not None and total > 0
    done = audit_cli(pool, data, tmp_path / "capped", tmp_path / "cache", "--max-cost", f"{total / 3:.8f}")
    assert done.returncode == 4, done.stderr
    partial = read_report(tmp_path / "capped")
    assert partial.partial and partial.cap["cap"] == "max_cost"
    assert partial.cap["calls"] > 0 and 0 < partial.cap["cost_usd"] <= total / 3


def test_max_cost_needs_a_price_for_every_member(server, examples, tmp_path):
    pool, data = inputs(tmp_path, server, examples)
    done = audit_cli(pool, data, tmp_path / "out", tmp_path / "cache", "--max-cost", "1")
    assert done.returncode == 2
    assert "--max-cost needs a price for every member" in done.stderr and "a, b, c" in done.stderr
    assert server.requests == []


def test_a_cap_of_zero_calls_sends_nothing_and_says_so(server, examples, tmp_path):
    pool, data = inputs(tmp_path, server, examples)
    done = audit_cli(pool, data, tmp_path / "out", tmp_path / "cache", "--max-calls", "0")
    assert done.returncode == 4, done.stderr
    assert server.requests == []
    report = read_report(tmp_path / "out")
    assert report.partial and report.n_examples == 0 and report.coalitions == []


def test_a_capped_sampled_audit_resumes_to_the_uncapped_estimate(
    arun, scripted_server, pool_for, examples, tmp_path
):
    names = [f"m{i}" for i in range(6)]
    server = scripted_server(team(examples, names))
    pool: Pool = pool_for(server, names)
    spec = build_protocol("debate", names, rounds=2)
    options = {"method": "sampled", "budget": 650, "seed": 4}

    def audit(out: str, cache: str, **caps):
        client = ModelClient(CallCache(tmp_path / cache), max_concurrency=8, backoff_s=0.01)
        return arun(play_audit(spec, pool, examples, client=client, out=tmp_path / out, **options, **caps))

    full = audit("full", "cache-full")
    assert full.shapley_estimator == "stratified" and full.stopped == "budget"
    server.reset()
    first = audit("capped", "cache", max_calls=full.calls.unique // 2)
    assert first.partial and len(server.chat_requests) <= full.calls.unique // 2
    resumed = audit("capped", "cache")
    assert not resumed.partial
    assert contributions(resumed) == contributions(full)
    assert set(server.request_counts().values()) == {1} and len(server.chat_requests) == full.calls.unique
