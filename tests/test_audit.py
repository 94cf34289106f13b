"""Contribution audits end to end: real HTTP to a scripted server, values checked against hand computation.

The majority-vote game below is small enough to compute by hand. Three members answer five questions; the
vote takes the most frequent answer, a tie goes to the member first in pool order (a, then b, then c).

    question  gold   a   b   c  | a  b  c  ab ac bc abc   (1 = the coalition's vote is right)
    [q1]        1    1   1   2  | 1  1  0  1  1  1  1     ac: 1 vs 2, tie -> a; bc: tie -> b
    [q2]        2    9   2   2  | 0  1  1  0  0  1  1     ab, ac: ties -> a's 9
    [q3]        3    3   7   8  | 1  0  0  1  1  0  1     abc: three-way tie -> a
    [q4]        8    8   1   2  | 1  0  0  1  1  0  1
    [q5]        4    5   6   4  | 0  0  1  0  0  0  0     abc: three-way tie -> a's 5
    v(S) = mean                 | .6 .4 .4 .6 .6 .4 .8    v({}) = 0

LOO:     a = .8 - v(bc) = .4;  b = .8 - v(ac) = .2;  c = .8 - v(ab) = .2.
Shapley: a = 1/3 (.6 - 0) + 1/6 (v(ab) - v(b)) + 1/6 (v(ac) - v(c)) + 1/3 (.8 - v(bc))
           = .2 + .2/6 + .2/6 + .4/3 = .4
         b = 1/3 (.4) + 1/6 (v(ab) - v(a) = 0) + 1/6 (v(bc) - v(c) = 0) + 1/3 (.8 - .6) = .2
         c = 1/3 (.4) + 1/6 (0) + 1/6 (0) + 1/3 (.2) = .2          (sum .8 = v(abc): efficiency)
Individual (solo): a .6, b .4, c .4.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from colab_graphs.audit.run import play_audit
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.tasks.builtin import builtin_task
from colab_graphs.tasks.example import Example
from colab_graphs.testing import ScriptedServer, answer_key, arithmetic_solver

pytestmark = pytest.mark.integration

PLAYERS = ["a", "b", "c"]
GOLD = {"[q1]": "1", "[q2]": "2", "[q3]": "3", "[q4]": "8", "[q5]": "4"}
REPLIES = {
    "a": {"[q1]": "1", "[q2]": "9", "[q3]": "3", "[q4]": "8", "[q5]": "5"},
    "b": {"[q1]": "1", "[q2]": "2", "[q3]": "7", "[q4]": "1", "[q5]": "6"},
    "c": {"[q1]": "2", "[q2]": "2", "[q3]": "8", "[q4]": "2", "[q5]": "4"},
}
HAND_VALUES = {
    (): 0.0,
    ("a",): 0.6,
    ("b",): 0.4,
    ("c",): 0.4,
    ("a", "b"): 0.6,
    ("a", "c"): 0.6,
    ("b", "c"): 0.4,
    ("a", "b", "c"): 0.8,
}
HAND_LOO = {"a": 0.4, "b": 0.2, "c": 0.2}
HAND_SHAPLEY = {"a": 0.4, "b": 0.2, "c": 0.2}
HAND_INDIVIDUAL = {"a": 0.6, "b": 0.4, "c": 0.4}
# One request per member per question, shared by every coalition and by the member's solo run.
DISTINCT_REQUESTS = len(PLAYERS) * len(GOLD)


def vote_examples() -> list[Example]:
    return [Example(id=tag, input=f"{tag} Which number is it?", answer=gold) for tag, gold in GOLD.items()]


def vote_members() -> dict:
    return {
        m: answer_key({tag: f"The answer is {reply}." for tag, reply in replies.items()})
        for m, replies in REPLIES.items()
    }


def pool_of(server, names: list[str]) -> Pool:
    return Pool.from_dict({m: server.litellm_kwargs(m) for m in names})


def coalition_values(report) -> dict[tuple[str, ...], float]:
    return {tuple(c.members): c.value for c in report.coalitions}


@pytest.fixture
def vote_server(scripted_server):
    return scripted_server(vote_members())


def audit(arun, spec, pool, examples, cache_dir: Path, out: Path | None = None, **kwargs):
    client = ModelClient(CallCache(cache_dir), max_concurrency=8, backoff_s=0.01)
    return arun(play_audit(spec, pool, examples, client=client, out=out, **kwargs)), client


@pytest.fixture(scope="module")
def exact_vote_audit(arun, tmp_path_factory):
    """One exact audit of the hand-computed game: (report, server, output folder)."""
    with ScriptedServer(vote_members()) as server:
        base = tmp_path_factory.mktemp("exact-vote")
        spec = build_protocol("majority_vote", PLAYERS)
        report, _ = audit(arun, spec, pool_of(server, PLAYERS), vote_examples(), base / "c", base / "out",
                          method="exact")  # fmt: skip
        yield report, server, base / "out"


# Majority vote: exact values


def test_exact_audit_gives_the_hand_computed_coalition_values(exact_vote_audit):
    report, _, _ = exact_vote_audit
    assert report.method == "exact" and report.shapley_method == "exact"
    assert coalition_values(report) == pytest.approx(HAND_VALUES)


def test_exact_audit_gives_the_hand_computed_contributions(exact_vote_audit):
    report, _, _ = exact_vote_audit
    assert report.shapley == pytest.approx(HAND_SHAPLEY)
    assert report.loo == pytest.approx(HAND_LOO)
    assert report.individual == pytest.approx(HAND_INDIVIDUAL)
    assert list(report.shapley) == PLAYERS  # pool order


def test_loo_audit_of_a_vote_gives_the_hand_computed_values_and_exact_shapley_from_the_answers(
    arun, vote_server, pool_for, tmp_path
):
    spec = build_protocol("majority_vote", PLAYERS)
    report, _ = audit(
        arun, spec, pool_for(vote_server, PLAYERS), vote_examples(), tmp_path / "c", method="loo"
    )
    # A vote declares independent replies: every coalition's value follows from the leave-one-out calls.
    assert report.method == "loo" and report.shapley_estimator == "exact_from_answers"
    assert coalition_values(report) == pytest.approx(HAND_VALUES)
    assert report.loo == pytest.approx(HAND_LOO)
    assert report.shapley == pytest.approx(HAND_SHAPLEY)
    assert report.individual == pytest.approx(HAND_INDIVIDUAL)
    assert set(vote_server.request_counts().values()) == {1}


def test_an_audit_sends_each_distinct_request_exactly_once(exact_vote_audit):
    report, server, _ = exact_vote_audit
    counts = server.request_counts()
    assert len(counts) == DISTINCT_REQUESTS
    assert set(counts.values()) == {1}
    assert report.calls.made == report.calls.unique == DISTINCT_REQUESTS
    # Naive: 7 non-empty coalitions hold 12 member seats, plus 3 solo runs, on each of 5 questions.
    assert report.calls.naive == (12 + 3) * len(GOLD)


def test_a_repeated_audit_with_the_same_cache_sends_no_request(arun, vote_server, pool_for, tmp_path):
    spec = build_protocol("majority_vote", PLAYERS)
    pool, examples = pool_for(vote_server, PLAYERS), vote_examples()
    first, _ = audit(arun, spec, pool, examples, tmp_path / "c", tmp_path / "first", method="exact")
    before = vote_server.request_counts()
    again, client = audit(arun, spec, pool, examples, tmp_path / "c", tmp_path / "again", method="exact")
    assert vote_server.request_counts() == before
    assert client.stats.made == 0
    assert again.calls.made == 0 and again.calls.cached == first.calls.made + first.calls.cached
    assert coalition_values(again) == coalition_values(first)
    assert again.shapley == first.shapley and again.loo == first.loo


def test_report_files_follow_the_design_contract(exact_vote_audit):
    _, _, out = exact_vote_audit
    data = json.loads((out / "report.json").read_text())
    contract = {"players", "protocol", "n_examples", "coalitions", "individual", "loo", "shapley"}
    contract |= {"shapley_method", "calls", "cost_usd", "wall_s"}
    assert contract <= set(data)
    assert data["players"] == PLAYERS and data["protocol"] == "majority_vote" and data["n_examples"] == 5
    assert {"members": [], "value": 0.0} in data["coalitions"]
    assert {"made", "unique", "cached", "failed"} <= set(data["calls"])
    assert all(0.0 <= c["value"] <= 1.0 for c in data["coalitions"])
    markdown = (out / "report.md").read_text()
    assert "majority_vote" in markdown and "contributions.png" in markdown
    for png in ("contributions.png", "individual_vs_compositional.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# Debate over four members


DEBATERS = ["d1", "d2", "d3", "d4"]
DEBATE_EXAMPLES = builtin_task("arithmetic", 8, seed=3)


def debate_members() -> dict:
    accuracies = [0.9, 0.7, 0.5, 0.3]
    return {
        m: arithmetic_solver(accuracy=acc, seed=i)
        for i, (m, acc) in enumerate(zip(DEBATERS, accuracies, strict=True))
    }


@pytest.fixture(scope="module")
def debate_audit(arun, tmp_path_factory):
    """One LOO audit of a two-round debate over four members: (report, server)."""
    with ScriptedServer(debate_members()) as server:
        base = tmp_path_factory.mktemp("debate")
        spec = build_protocol("debate", DEBATERS, rounds=2)
        report, _ = audit(arun, spec, pool_of(server, DEBATERS), DEBATE_EXAMPLES, base / "c", method="loo")
        yield report, server


def test_debate_loo_values_follow_from_its_coalition_values(debate_audit):
    report, _ = debate_audit
    grand = report.value_of(DEBATERS)
    assert grand is not None
    for m in DEBATERS:
        without = report.value_of([x for x in DEBATERS if x != m])
        assert without is not None
        assert report.loo[m] == pytest.approx(grand - without)


def test_debate_audit_makes_fewer_calls_than_naive_and_none_twice(debate_audit):
    report, server = debate_audit
    n = len(DEBATE_EXAMPLES)
    # Per question, naive: the grand coalition 4 + 4 seats, four 3-member coalitions 3 + 3 each, four solos 1.
    assert report.calls.naive == (8 + 4 * 6 + 4) * n
    # Round-1 answers (and solos) are one request per member, shared; a round-2 request depends on the
    # round-1 answers it sees, so coalitions share it only when those answers read the same: at most
    # 4 (round 1) + 4 (grand coalition, round 2) + 4 x 3 (the others, round 2) distinct requests.
    assert report.calls.made == report.calls.unique <= (4 + 4 + 4 * 3) * n
    assert report.calls.made < report.calls.naive
    counts = server.request_counts()
    assert set(counts.values()) == {1} and len(counts) == report.calls.unique


# Sampled and exact Shapley: budgets and limits


def test_sampled_shapley_by_permutations_uses_its_budget_and_is_efficient(
    arun, scripted_server, pool_for, tmp_path
):
    spec = build_protocol("debate", DEBATERS)
    examples = builtin_task("arithmetic", 6, seed=5)
    report, _ = audit(
        arun,
        spec,
        pool_for(scripted_server(debate_members()), DEBATERS),
        examples,
        tmp_path / "c",
        method="sampled",
        budget=16,
        budget_unit="permutations",
        individual=False,
    )
    assert report.shapley_estimator == "permutation" and report.n_permutations == 16
    # Exact from the held values once the prefixes cover every coalition, sampled (with its error) before.
    covered = len(report.coalitions) == 2 ** len(DEBATERS)
    assert report.shapley_method == ("exact" if covered else "sampled")
    assert (report.sampling_error is None) == covered
    # Every permutation's marginal contributions add up to v(N) - v({}), so their average does too.
    assert sum(report.shapley.values()) == pytest.approx(report.value_of(DEBATERS) - report.value_of([]))


def test_exact_shapley_over_played_coalitions_refuses_thirteen_members_without_force(arun, tmp_path):
    members = [f"m{i}" for i in range(13)]
    spec = build_protocol("debate", members)  # its calls depend on the coalition: every coalition is played
    pool = Pool.from_dict({m: {"model": f"openai/{m}", "api_base": "http://127.0.0.1:9/v1"} for m in members})
    with pytest.raises(ValueError, match=r"exact Shapley over 13 players needs 2\^13 = 8192 coalitions"):
        audit(arun, spec, pool, vote_examples(), tmp_path / "c", method="exact")


# The CLI


def write_cli_inputs(server, tmp_path: Path) -> tuple[Path, Path]:
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "models:\n"
        + "".join(
            f"  {m}: {{model: openai/{m}, api_base: '{server.base_url}', api_key: sk-test}}\n"
            for m in PLAYERS
        )
    )
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(e.model_dump()) + "\n" for e in vote_examples()))
    return pool, data


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    command = [sys.executable, "-m", "colab_graphs.cli.app", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.slow
def test_cli_audit_writes_the_report_and_exits_zero(vote_server, tmp_path):
    pool, data = write_cli_inputs(vote_server, tmp_path)
    out = tmp_path / "audit"
    done = cli("audit", "--protocol", "majority_vote", "--pool", pool, "--data", data, "--method", "exact",
               "--cache-dir", tmp_path / "cache", "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["shapley"] == pytest.approx(HAND_SHAPLEY)
    assert {tuple(c["members"]): c["value"] for c in report["coalitions"]} == pytest.approx(HAND_VALUES)
    assert (out / "report.md").exists()
    assert (out / "contributions.png").exists() and (out / "individual_vs_compositional.png").exists()
    assert "Shapley (exact_from_answers)" in done.stdout


@pytest.mark.slow
def test_cli_exact_over_too_many_members_is_a_clear_error(tmp_path):
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "models:\n"
        + "".join(f"  m{i}: {{model: openai/m{i}, api_base: 'http://127.0.0.1:9/v1'}}\n" for i in range(13))
    )
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "x", "input": "What is 1 + 1?", "answer": "2"}) + "\n")
    done = cli("audit", "--protocol", "debate", "--pool", pool, "--data", data, "--method", "exact",
               "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")  # fmt: skip
    assert done.returncode == 2
    assert "exact Shapley over 13 players" in done.stderr and "--force" in done.stderr
    assert not (tmp_path / "out" / "report.json").exists()
