"""Studies end to end: `colab-graphs study` over real HTTP to scripted members, values checked by hand.

Four members answer two datasets; each reply is "The answer is X." with X fixed per question. Two pools vote
(majority_vote: the most frequent answer; a tie goes to the member first in pool order), audited by
leave-one-out, each member alone for its individual strength.

    d1   gold  a b c d      d2   gold  a b c d
    [q1]  1    1 1 2 1      [r1]  5    5 5 5 0
    [q2]  2    9 2 2 5      [r2]  6    1 6 6 0
    [q3]  3    3 7 8 3      [r3]  7    7 2 3 7
    [q4]  8    8 1 2 8      [r4]  9    4 4 9 0
    [q5]  4    5 6 4 4
    alone:     .6 .4 .4 .8        alone:    .5 .5 .75 .25

P1 = (a, b, c). d1 (tests/test_audit.py works it out): v(abc) .8, v(bc) .4, v(ac) .6, v(ab) .6, so LOO a .4,
b .2, c .2. d2: v(abc) = .75 (r1 all 5; r2 6 by two; r3 three-way tie -> a's 7; r4 4 by two, wrong);
v(bc) = .5 (r3 tie -> b's 2, r4 tie -> b's 4); v(ac) = .5 (r2 tie -> a's 1, r4 -> a's 4); v(ab) = .5 (r2 -> a's
1, r4 both 4): LOO a = b = c = .25.
P2 = (c, d): two members, so every tie goes to c and v(cd) = v(c); v(c), v(d) are the solo values. d1: v(cd) .4,
LOO c = .4 - .8 = -.4, LOO d = .4 - .4 = 0. d2: v(cd) .75, LOO c = .75 - .25 = .5, LOO d = 0.

Correlation per pool over its (member, dataset) pairs (one protocol, so family "text" = "all"):
P1 pairs (individual, LOO): (.6,.4) (.4,.2) (.4,.2) (.5,.25) (.5,.25) (.75,.25).
    Average ranks x: 5 1.5 1.5 3.5 3.5 6; y: 6 1.5 1.5 4 4 4; centred dx: 1.5 -2 -2 0 0 2.5, dy: 2.5 -2 -2 .5 .5 .5.
    Spearman = 13 / sqrt(16.5 * 15). Kendall tau-b: 10 concordant, 1 discordant (a/d1 vs c/d2), 2 pairs tied
    in x, 4 tied in y: (10 - 1) / sqrt((15 - 2) (15 - 4)) = 9 / sqrt(143).
P2 pairs: (.4,-.4) (.8,0) (.75,.5) (.25,0). Ranks x: 2 4 3 1; y: 1 2.5 4 2.5; Spearman = 1.5 / sqrt(5 * 4.5)
    = 1/sqrt(10). Kendall: 3 concordant, 2 discordant, 1 pair tied in y: 1 / sqrt(6 * 5).
p-value (Spearman, t approximation with n - 2 df) = I_{1-rho^2}((n-2)/2, 1/2): for n = 4 it is 1 - |rho|, for
n = 6 it is 1 - 3/2 |rho| + 1/2 |rho|^3. So P1 is significant at .05 (p = .043) and P2 is not (p = .68):
"1 of 2 settings show no significant correlation".

Calls: each member is asked each question once in the whole study (c's requests are the same in both pools):
4 x 9 = 36 distinct requests. A naive evaluation asks 162: P1 has 4 coalitions holding 9 seats plus 3 solo runs
(12 per example), P2 3 coalitions holding 4 seats plus 2 solo runs (6 per example), over 9 examples.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from conftest import cli_in_process

from colab_graphs.audit.report import read_report
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.study import StudyConfigError, StudyError, load_study_config, play_study, read_study
from colab_graphs.study.plan import make_shards
from colab_graphs.study.report import SettingResult, correlation_rows
from colab_graphs.study.stats import regularized_incomplete_beta, spearman_p_value
from colab_graphs.tasks.example import Example
from colab_graphs.testing import ScriptedServer, answer_key

pytestmark = pytest.mark.integration

GOLD = {
    "d1": {"[q1]": "1", "[q2]": "2", "[q3]": "3", "[q4]": "8", "[q5]": "4"},
    "d2": {"[r1]": "5", "[r2]": "6", "[r3]": "7", "[r4]": "9"},
}
REPLIES = {
    "a": "1 9 3 8 5 5 1 7 4",
    "b": "1 2 7 1 6 5 6 2 4",
    "c": "2 2 8 2 4 5 6 3 9",
    "d": "1 5 3 8 4 0 0 7 0",
}
POOLS = {"P1": ["a", "b", "c"], "P2": ["c", "d"]}
HAND = {  # (pool, dataset): (v_all, individual, loo)
    ("P1", "d1"): (0.8, {"a": 0.6, "b": 0.4, "c": 0.4}, {"a": 0.4, "b": 0.2, "c": 0.2}),
    ("P1", "d2"): (0.75, {"a": 0.5, "b": 0.5, "c": 0.75}, {"a": 0.25, "b": 0.25, "c": 0.25}),
    ("P2", "d1"): (0.4, {"c": 0.4, "d": 0.8}, {"c": -0.4, "d": 0.0}),
    ("P2", "d2"): (0.75, {"c": 0.75, "d": 0.25}, {"c": 0.5, "d": 0.0}),
}
RHO_P1, TAU_P1 = 13 / math.sqrt(16.5 * 15), 9 / math.sqrt(143)
RHO_P2, TAU_P2 = 1 / math.sqrt(10), 1 / math.sqrt(30)
P_P1 = 1 - 1.5 * RHO_P1 + 0.5 * RHO_P1**3
P_P2 = 1 - RHO_P2
DISTINCT_REQUESTS, NAIVE = 36, 162


def member_scripts() -> dict:
    tags = [t for gold in GOLD.values() for t in gold]
    return {
        m: answer_key({t: f"The answer is {x}." for t, x in zip(tags, replies.split(), strict=True)})
        for m, replies in REPLIES.items()
    }


def write_study(folder: Path, server: ScriptedServer, pools=POOLS, datasets=("d1", "d2"), **extra) -> Path:
    """Data files, one pool file (P1) and one inline pool (P2), and the study file; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, gold in GOLD.items():
        rows = [{"id": t, "input": f"{t} Which number is it?", "answer": g} for t, g in gold.items()]
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def models(names: list[str]) -> dict:
        return {m: {"model": f"openai/{m}", "api_base": server.base_url, "api_key": "sk-test"} for m in names}

    pool_entries: dict = {}
    for name, names in pools.items():
        if name == "P1":
            (folder / "p1.yaml").write_text(yaml.safe_dump({"models": models(names)}, sort_keys=False))
            pool_entries[name] = "p1.yaml"
        else:
            pool_entries[name] = {"models": models(names)}
    study = {
        "pools": pool_entries,
        "protocols": ["majority_vote"],
        "datasets": [f"{d}.jsonl" for d in datasets],
        "method": "loo",
        **extra,
    }
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "colab_graphs.cli.app", "study", *map(str, args)]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=180, env={**os.environ, "COLUMNS": "200"}
    )


@pytest.fixture(scope="module")
def hand_study(tmp_path_factory):
    """The study of the module docstring, run once through the CLI: (study.json, server, folder)."""
    with ScriptedServer(member_scripts()) as server:
        base = tmp_path_factory.mktemp("study")
        config = write_study(base, server)
        done = cli_in_process(
            "study", "--config", config, "--out", base / "out", "--cache-dir", base / "cache"
        )
        assert done.returncode == 0, done.stderr
        yield read_study(base / "out"), server, base, done.stdout


def by_setting(report) -> dict:
    return {(s.pool, s.dataset): s for s in report.settings}


# The hand-computed study


def test_study_gives_the_hand_computed_values(hand_study):
    report, _, _, _ = hand_study
    rows = by_setting(report)
    assert set(rows) == set(HAND)
    for key, (v_all, individual, loo) in HAND.items():
        row = rows[key]
        assert (row.protocol, row.family, row.members) == ("majority_vote", "text", POOLS[key[0]])
        assert row.v_all == pytest.approx(v_all)
        assert row.individual == pytest.approx(individual)
        assert row.loo == pytest.approx(loo)
        assert row.failed_examples == 0
        # A vote's game is computed from the members' answers: exact Shapley comes with leave-one-out.
        assert sum(row.shapley.values()) == pytest.approx(v_all)


def test_study_gives_the_hand_computed_correlations(hand_study):
    report, _, base, stdout = hand_study
    rows = {(c.pool, c.family): c for c in report.correlations}
    assert list(rows) == [("P1", "text"), ("P2", "text"), ("P1", "all"), ("P2", "all")]
    for family in ("text", "all"):
        p1, p2 = rows[("P1", family)], rows[("P2", family)]
        assert (p1.measure, p1.n_pairs, p2.n_pairs) == ("loo", 6, 4)
        assert (p1.spearman, p1.kendall, p1.p_value) == pytest.approx((RHO_P1, TAU_P1, P_P1))
        assert (p2.spearman, p2.kendall, p2.p_value) == pytest.approx((RHO_P2, TAU_P2, P_P2))
        assert p1.significant is True and p2.significant is False
    page = (base / "out" / "study.md").read_text()
    assert "1 of 2 settings (pool x protocol family) show no significant correlation" in page
    assert "1 of 2 settings" in stdout


def test_each_distinct_request_is_made_once_in_the_whole_study(hand_study):
    report, server, _, _ = hand_study
    counts = server.request_counts()
    assert len(counts) == DISTINCT_REQUESTS and set(counts.values()) == {1}
    calls = report.calls
    assert (calls.made, calls.unique, calls.failed) == (DISTINCT_REQUESTS, DISTINCT_REQUESTS, 0)
    assert calls.naive == NAIVE and calls.cached == NAIVE - DISTINCT_REQUESTS


def test_each_setting_has_a_standard_audit_folder(hand_study):
    report, _, base, _ = hand_study
    for row in report.settings:
        assert row.audit == f"audits/{row.pool}/majority_vote/{row.dataset}"
        audit = read_report(base / "out" / row.audit)
        assert audit.protocol == "majority_vote" and audit.players == row.members
        assert audit.loo == pytest.approx(row.loo) and audit.individual == pytest.approx(row.individual)
        assert audit.value_of(row.members) == pytest.approx(row.v_all)
        assert (base / "out" / row.audit / "report.md").exists()
    for png in ("study-heatmap.png", "study-scatter.png"):
        assert (base / "out" / png).stat().st_size > 1000
    assert "![heatmap](study-heatmap.png)" in (base / "out" / "study.md").read_text()


@pytest.mark.slow
def test_no_api_key_reaches_the_study_folder(tmp_path, monkeypatch):
    secret = "sk-SECRET-study-0123456789"
    monkeypatch.setenv("CG_STUDY_KEY", secret)
    with ScriptedServer(member_scripts()) as server:
        config = write_study(tmp_path, server, pools={"P2": ["c", "d"]}, datasets=("d1",))
        text = config.read_text().replace("sk-test", "${CG_STUDY_KEY}")
        config.write_text(text)
        done = cli("--config", config, "--out", tmp_path / "out", "--cache-dir", tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    for path in [*(tmp_path / "out").rglob("*"), *(tmp_path / "cache").rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in done.stdout + done.stderr


# Resume


@pytest.mark.slow
def test_a_study_killed_mid_way_finishes_with_no_request_repeated(hand_study, tmp_path):
    expected, _, _, _ = hand_study
    victim: dict = {"pid": None, "at": 15, "seen": 0}
    lock = threading.Lock()
    scripts = member_scripts()

    def kill_at_request(script):
        def reply(messages, params):
            with lock:
                victim["seen"] += 1
                if victim["pid"] is not None and victim["seen"] == victim["at"]:
                    os.kill(victim["pid"], signal.SIGKILL)
                    raise RuntimeError("the study was killed while this request was in flight")
            return script(messages, params)

        return reply

    with ScriptedServer({m: kill_at_request(s) for m, s in scripts.items()}) as server:
        config = write_study(tmp_path, server)
        # One call in flight at a time, so every reply before the kill is in the cache when the kill comes.
        args = ["--config", config, "--out", tmp_path / "out", "--cache-dir", tmp_path / "cache", "--max-concurrency", "1"]  # fmt: skip
        command = [sys.executable, "-m", "colab_graphs.cli.app", "study", *map(str, args)]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        victim["pid"] = process.pid
        assert process.wait(timeout=180) == -signal.SIGKILL
        assert not (tmp_path / "out" / "study.json").exists()
        victim["pid"] = None
        done = cli_in_process("study", *args)
        assert done.returncode == 0, done.stderr
        answered = server.request_counts(successful_only=True)
    assert len(answered) == DISTINCT_REQUESTS and set(answered.values()) == {1}
    assert read_study(tmp_path / "out").comparable() == expected.comparable()


def test_adding_a_pool_and_a_dataset_plays_only_what_is_new(arun, hand_study, tmp_path):
    expected, _, _, _ = hand_study
    with ScriptedServer(member_scripts()) as server:
        client = ModelClient(CallCache(tmp_path / "cache"), max_concurrency=4)
        small = write_study(tmp_path, server, pools={"P1": POOLS["P1"]}, datasets=("d1",))
        arun(play_study(load_study_config(small), tmp_path / "out", client=client, plots=False))
        assert len(server.request_counts()) == 3 * 5
        full = write_study(tmp_path, server)
        report = arun(play_study(load_study_config(full), tmp_path / "out", client=client, plots=False))
        counts = server.request_counts()
    assert len(counts) == DISTINCT_REQUESTS and set(counts.values()) == {1}
    assert report.comparable() == expected.comparable()


def test_a_changed_setting_is_an_error_that_names_it(arun, tmp_path):
    with ScriptedServer(member_scripts()) as server:
        client = ModelClient(CallCache(tmp_path / "cache"), max_concurrency=4)
        config = write_study(tmp_path, server, pools={"P2": ["c", "d"]}, datasets=("d1",))
        arun(play_study(load_study_config(config), tmp_path / "out", client=client, plots=False))
        changed = write_study(tmp_path, server, pools={"P2": ["c", "d"]}, datasets=("d1",), limit=2)
        with pytest.raises(StudyError, match=r"study.yaml: setting P2/.*/d1 was played .* --overwrite"):
            arun(play_study(load_study_config(changed), tmp_path / "out", client=client, plots=False))
        report = arun(play_study(load_study_config(changed), tmp_path / "out", client=client, overwrite=True))
    assert report.settings[0].n_examples == 2


# Bad study files


@pytest.mark.parametrize(
    ("edit", "key", "says"),
    [
        ({"protocol": ["majority_vote"]}, "protocol", "unknown key"),
        ({"protocols": [{"name": "majority_vote", "params": {"rounds": 2}}]}, "protocols[1].params.rounds", "no parameter"),
        ({"protocols": ["majority_voting"]}, "protocols[1].name", "unknown protocol"),
        ({"datasets": ["d1.jsonl", {"source": "d2.jsonl", "limit": 0}]}, "datasets[2].limit", "integer >= 1"),
        ({"datasets": ["d1.jsonl", "d1.jsonl"]}, "datasets[2]", "used twice"),
        ({"datasets": ["missing.jsonl"]}, "datasets[1]", "no such file"),
        ({"method": "sampled"}, "budget", "needs a budget"),
        ({"pools": {"P1": "nowhere.yaml"}}, "pools.P1", "does not exist"),
        ({"pools": {"P1": {"models": {"a": {"model": "openai/a", "temprature": 0}}}}}, "pools.P1", "temprature"),
    ],
)  # fmt: skip
def test_a_bad_study_file_names_the_file_and_the_key(tmp_path, edit, key, says):
    with ScriptedServer(member_scripts()) as server:
        path = write_study(tmp_path, server)
    data = {**yaml.safe_load(path.read_text()), **edit}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(StudyConfigError) as err:
        from colab_graphs.study.plan import build_plan

        build_plan(load_study_config(path))
    message = str(err.value)
    assert message.startswith(f"{path}: {key}") and says in message, message


def test_cli_reports_a_bad_study_file_with_exit_code_2(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(
        "pools: {P: {a: {model: openai/a}}}\nprotocols: [majority_vote]\ndatasets: [builtin:arithmetic]\nmethod: shapley\n"
    )
    done = cli("--config", path, "--out", tmp_path / "out")
    assert done.returncode == 2
    assert f"{path}: method: must be loo, exact or sampled" in " ".join(done.stderr.split())


# Pieces


def test_correlations_are_per_pool_and_family_with_one_row_over_all_families():
    def row(pool, family, protocol, ind, loo):
        members = list(ind)
        return SettingResult(pool=pool, protocol=protocol, family=family, dataset="d", members=members,
                             individual=ind, loo=loo, audit="x")  # fmt: skip

    settings = [
        row("P", "text", "vote", {"a": 0.1, "b": 0.2, "c": 0.3}, {"a": 0.0, "b": 0.1, "c": 0.2}),
        row("P", "api", "cascade", {"a": 0.1, "b": 0.2, "c": 0.3}, {"a": 0.2, "b": 0.1, "c": 0.0}),
    ]
    rows = {(c.family): c for c in correlation_rows(settings, "loo")}
    assert list(rows) == ["text", "api", "all"]
    assert rows["text"].spearman == pytest.approx(1.0) and rows["text"].p_value == 0.0
    assert rows["api"].spearman == pytest.approx(-1.0)
    # All six pairs: x ranks 1.5 3.5 5.5 1.5 3.5 5.5, y ranks 1.5 3.5 5.5 5.5 3.5 1.5: rho 0.
    assert rows["all"].n_pairs == 6 and rows["all"].spearman == pytest.approx(0.0)
    assert rows["all"].p_value == pytest.approx(1.0)


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.9])
def test_spearman_p_value_matches_the_closed_forms(rho):
    assert spearman_p_value(rho, 3) == pytest.approx(
        1 - 2 / math.pi * math.atan(rho * math.sqrt(1 / (1 - rho**2)))
    )
    assert spearman_p_value(rho, 4) == pytest.approx(1 - rho)
    assert spearman_p_value(-rho, 6) == pytest.approx(1 - 1.5 * rho + 0.5 * rho**3)
    assert regularized_incomplete_beta(2.0, 3.0, 0.4) == pytest.approx(0.5248)  # sum of binomial terms


def test_examples_with_the_same_input_share_a_shard_across_datasets():
    def ex(i: int, text: str) -> Example:
        return Example(id=str(i), input=text, answer="1")

    shards = make_shards({"x": [ex(0, "A"), ex(1, "B"), ex(2, "C")], "y": [ex(0, "C"), ex(1, "A")]}, 2)
    where = {(label, e.id): s.index for s in shards for label, items in s.examples.items() for e in items}
    assert where[("x", "0")] == where[("y", "1")]  # "A"
    assert where[("x", "2")] == where[("y", "0")]  # "C"
    assert len(shards) == 2 and sum(s.size() for s in shards) == 5
