"""`--simultaneous`: a sampled audit's sampling intervals hold all members at once, through the CLI.

Real audits of a six-member debate (its coalitions' replies differ, so Shapley is sampled, not computed from
answers) over real HTTP to the scripted server. The exact values come from an exact audit of the same
examples; the sampled audits then reuse its cache (no call is made twice).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_in_process, write_pool_file
from realistic_team import records, team

from colab_graphs.audit.stratified import critical_value

pytestmark = pytest.mark.integration

NAMES = [f"m{i}" for i in range(6)]
SEEDS = range(10)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """(pool file, data file, cache folder, exact Shapley values) of a debate the scripted server plays."""
    from colab_graphs.testing import ScriptedServer

    examples = records(limit=3)
    folder = tmp_path_factory.mktemp("simultaneous")
    server = ScriptedServer(team(examples, NAMES)).start()
    pool = write_pool_file(folder / "pool.yaml", server, NAMES)
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(e.model_dump()) + "\n" for e in examples))
    exact = audit(pool, data, folder / "cache", folder / "exact", "--method", "exact")
    yield pool, data, folder / "cache", exact["shapley"]
    server.stop()


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "colab_graphs.cli.app", *map(str, args)]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"}
    )


def audit(pool: Path, data: Path, cache: Path, out: Path, *options: str) -> dict:
    done = cli_in_process("audit", "--protocol", "debate", "--pool", pool, "--data", data, "--cache-dir",
                          cache, "--out", out, "--no-plots", "--no-individual", *options)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads((out / "report.json").read_text())


def sampled(inputs, out: Path, seed: int, *options: str, budget: str = "30") -> dict:
    """A sampled audit of `budget` coalitions (none: "")."""
    pool, data, cache, _ = inputs
    limit = ["--budget-unit", "coalitions", "--budget", budget] if budget else []
    return audit(pool, data, cache, out, "--method", "sampled", *limit, "--seed", str(seed), *options)


def test_a_simultaneous_audit_records_its_interval_in_the_report(inputs, tmp_path):
    report = sampled(inputs, tmp_path / "out", 0, "--simultaneous")
    assert report["shapley_estimator"] == "stratified"
    # The adjustment the estimator chose from the played coalitions is recorded (the debate's singletons
    # agree with its coalitions, so the per-example control variate is in it).
    assert report["shapley_adjustment"] in ("control variate", "control variate + surrogate")
    assert report["sampling_interval"] == {
        "kind": "simultaneous", "level": 0.95, "member_level": pytest.approx(1 - 0.05 / len(NAMES)),
    }  # fmt: skip
    page = (tmp_path / "out" / "report.md").read_text()
    assert "95% simultaneous sampling interval (all members at once; Bonferroni" in page


def test_a_default_audit_records_per_member_intervals(inputs, tmp_path):
    report = sampled(inputs, tmp_path / "out", 0)
    assert report["sampling_interval"] == {"kind": "member", "level": 0.95, "member_level": 0.95}


def test_simultaneous_intervals_widen_the_per_member_ones_by_bonferroni_s_quantile(inputs, tmp_path):
    member = sampled(inputs, tmp_path / "member", 3)
    together = sampled(inputs, tmp_path / "together", 3, "--simultaneous")
    assert together["shapley"] == member["shapley"]  # the same coalitions: a budget, not a target error
    ratio = critical_value(len(NAMES), True) / critical_value(len(NAMES), False)
    for name in NAMES:
        assert together["sampling_error"][name] == pytest.approx(ratio * member["sampling_error"][name])


def test_a_simultaneous_target_error_holds_for_all_members_at_once(inputs, tmp_path):
    report = sampled(inputs, tmp_path / "out", 1, "--simultaneous", "--target-error", "0.05", budget="")
    assert report["stopped"] in ("target_error", "complete")
    assert max(report["sampling_error"].values()) <= 0.05


def test_simultaneous_intervals_hold_every_member_at_once_in_at_least_90_percent_of_audits(inputs, tmp_path):
    exact = inputs[3]
    held = []
    for seed in SEEDS:
        report = sampled(inputs, tmp_path / f"s{seed}", seed, "--simultaneous")
        held.append(all(abs(report["shapley"][m] - exact[m]) <= report["sampling_error"][m] for m in NAMES))
    assert np.mean(held) >= 0.9


@pytest.mark.slow
def test_the_permutation_sampler_refuses_simultaneous_intervals(inputs, tmp_path):
    done = cli("audit", "--protocol", "debate", "--pool", inputs[0], "--data", inputs[1], "--method", "sampled",
               "--budget-unit", "permutations", "--budget", "16", "--simultaneous", "--out", tmp_path / "out")  # fmt: skip
    assert done.returncode == 2
    assert "simultaneous intervals are the stratified estimator's" in done.stderr


def test_simultaneous_applies_to_sampled_audits_only(inputs, tmp_path):
    pool, data, cache, _ = inputs
    done = cli("audit", "--protocol", "debate", "--pool", pool, "--data", data, "--method", "loo",
               "--simultaneous", "--out", tmp_path / "out")  # fmt: skip
    assert done.returncode == 2
    assert "--simultaneous apply to --method sampled" in done.stderr


def test_sampled_audits_approach_the_exact_audit_as_the_budget_grows_and_their_intervals_hold(
    inputs, tmp_path
):
    """The estimator chosen from the played coalitions (control variate, surrogate, both or neither), through
    the CLI: at 30 coalitions of 64 and at 50 the audits' simultaneous intervals hold every member's exact
    value in at least 90% of audits, and the mean largest error falls as the budget grows."""
    exact = inputs[3]
    largest, held = {}, []
    for budget in ("30", "50"):
        errors = []
        for seed in range(5):
            report = sampled(inputs, tmp_path / f"b{budget}s{seed}", seed, "--simultaneous", budget=budget)
            gaps = {m: abs(report["shapley"][m] - exact[m]) for m in NAMES}
            held.append(all(gaps[m] <= report["sampling_error"][m] + 1e-9 for m in NAMES))
            errors.append(max(gaps.values()))
        largest[budget] = float(np.mean(errors))
    assert np.mean(held) >= 0.9
    assert largest["50"] < largest["30"]
