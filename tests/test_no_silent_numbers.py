"""No silent wrong numbers: a cascade whose members never state a confidence is reported, not measured in
silence; failed calls are counted apart from calls made and a failed run's score is none; equal values rank
as ties; the stall watchdog is quiet while calls progress elsewhere and does not flood a long stall; report.md
names the scorer. Through the CLI and `cg.run` / `cg.run_audit`, against the scripted OpenAI-compatible
server on the built-in arithmetic task."""

from __future__ import annotations

import json
import logging
import time

import pytest
from conftest import cli_in_process, write_pool_file

import colab_graphs as cg
from colab_graphs.audit.estimators import rank_correlation, ranks
from colab_graphs.models.client import ModelClient
from colab_graphs.testing import arithmetic_solver
from colab_graphs.viewer import ViewerServer
from colab_graphs.watch import PlayWatch, Watchdog
from tests.test_viewer import browser  # noqa: F401  (the viewer's Chromium, skipped with the reason where none)

DATA = "builtin:arithmetic"
# Replies as models write them: working, then the answer; the confident ones state a confidence after it.
PLAIN = "Adding them up step by step, the result is {answer}.\n\nThe answer is {answer}."
CONFIDENT = PLAIN + "\nConfidence: 0.9"


def _members(style: str) -> dict:
    return {
        "small": arithmetic_solver(accuracy=0.5, seed=1, style=style),
        "large": arithmetic_solver(accuracy=1.0, seed=2, style=style),
    }


@pytest.mark.parametrize("style", [PLAIN, CONFIDENT], ids=["no-confidence", "confidence"])
def test_a_cascade_that_never_finds_a_confidence_is_warned_and_recorded(scripted_server, tmp_path, style):
    server = scripted_server(_members(style))
    pool = write_pool_file(tmp_path / "pool.yaml", server, ["small", "large"])
    out = tmp_path / "audit"
    done = cli_in_process(
        "audit", "--protocol", "cascade", "--pool", pool, "--data", DATA, "--limit", "8", "--out", out,
        "--no-plots", "--no-preflight", "--cache-dir", tmp_path / "cache",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    said = " ".join(done.stdout.split())
    if style == PLAIN:
        # Stage 0 deferred on all 8 examples, in both coalitions that hold it ({small, large}, and {small},
        # where it defers to the final answer): v(all) is the large member's score, which the warning says.
        assert report["notes"] == [
            {
                "node": "stage0_small",
                "note": "found no confidence statement ('Confidence: 0.8') in the reply, so it deferred",
                "decisions": 16,
                "of": 16,
            }
        ]
        v_all = next(c["value"] for c in report["coalitions"] if sorted(c["members"]) == ["large", "small"])
        assert v_all == report["individual"]["large"]  # the last stage alone
        assert "warning: cascade: node 'stage0_small' found no confidence statement" in said
        assert "in every one of its 16 decision(s)" in said
        assert "## Warnings" in (out / "report.md").read_text()
    else:
        assert report["notes"] == [] and report["warnings"] == []
        assert "warning:" not in said and "## Warnings" not in (out / "report.md").read_text()


def test_the_api_warns_on_the_logger_and_the_summary_holds_it(scripted_server, pool_for, caplog):
    pool = pool_for(scripted_server(_members(PLAIN)), ["small", "large"])
    with caplog.at_level(logging.WARNING, logger="colab_graphs"):
        result = cg.run("cascade", pool, DATA, limit=4, client=ModelClient(None), progress=False)
    assert result.summary["notes"][0]["decisions"] == result.summary["notes"][0]["of"] == 4
    assert result.summary["warnings"] and result.summary["warnings"][0] in caplog.text


def test_failed_calls_are_not_calls_made_and_a_failed_run_scores_none(scripted_server, tmp_path):
    server = scripted_server(_members(PLAIN), down_models=["small"])
    pool = write_pool_file(tmp_path / "pool.yaml", server, ["small", "large"])
    out = tmp_path / "run"
    done = cli_in_process(
        "run", "--protocol", "solo", "-P", "member=small", "--pool", pool, "--data", DATA, "--limit", "3",
        "--out", out, "--retries", "0", "--no-preflight", "--no-cache",
    )  # fmt: skip
    assert done.returncode == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["calls"] == {"made": 0, "cached": 0, "failed": 3} and summary["score"] is None
    assert "score none over 0 example(s)" in " ".join(done.stdout.split())
    assert "score 0.000" not in done.stdout  # (the progress bar too: "score none  failed 3")
    assert "score none  failed 3" in done.stdout
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(line["score"], line["prediction"], line["failed"]) for line in lines] == [(None, None, True)] * 3


def test_equal_values_rank_as_ties_whatever_the_float_noise(scripted_server, tmp_path):
    assert ranks({"a": 0.1 + 0.2, "b": 0.3, "c": 0.1}) == {"a": 1, "b": 1, "c": 3}  # 0.30000000000000004
    assert rank_correlation({"a": 0.1 + 0.2, "b": 0.3, "c": 0.1}, {"a": 1.0, "b": 1.0, "c": 0.0}) == {
        "spearman": pytest.approx(1.0),
        "kendall": pytest.approx(1.0),
    }
    # Two members that answer alike (the same solver) in a vote of three: equal contributions, one rank.
    twin = arithmetic_solver(accuracy=0.6, seed=4, style=PLAIN)
    server = scripted_server(
        {"a": twin, "b": twin, "c": arithmetic_solver(accuracy=0.9, seed=5, style=PLAIN)}
    )
    pool = write_pool_file(tmp_path / "pool.yaml", server, ["a", "b", "c"])
    out = tmp_path / "audit"
    done = cli_in_process(
        "audit", "--protocol", "majority_vote", "--method", "exact", "--pool", pool, "--data", DATA, "--limit",
        "10", "--out", out, "--no-plots", "--no-preflight", "--cache-dir", tmp_path / "cache",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["shapley"]["a"] == pytest.approx(report["shapley"]["b"], abs=1e-12)
    assert report["ranks"]["shapley"]["a"] == report["ranks"]["shapley"]["b"]
    rank = report["ranks"]["shapley"]["a"]
    md = (out / "report.md").read_text()
    assert "| a " in md and f"{rank}=" in md
    assert "Scorer | numeric (the records' default, from their fields)" in " ".join(md.split()) or (
        "numeric (the records' default, from their fields)" in md
    )


def test_the_watchdog_is_quiet_while_calls_finish_in_other_plays_and_backs_off_a_long_stall():
    # Two audits side by side (a study's settings on one endpoint): the first one's play waits in the queue
    # while the second's calls finish. Before, its watchdog saw no progress of its own and reported.
    reports: list[str] = []
    with Watchdog(0.2, report=reports.append) as queued, Watchdog(0.2, report=reports.append) as busy:
        waiting = PlayWatch("example 'q0' with a", queued)
        working = PlayWatch("example 'q1' with b", busy)
        queued.add(waiting)
        busy.add(working)
        waiting.call_started("stage0_a", "a")  # queued behind the other audit's calls
        for _ in range(20):  # 1 s of calls finishing, one every 50 ms
            working.call_finished(working.call_started("stage0_b", "b"))
            time.sleep(0.05)
        assert reports == []
        # Now nothing finishes anywhere for 2.5 s: a stall, reported at 0.2, 0.4, 0.8, 1.6 s (not every 0.2 s).
        time.sleep(2.5)
        queued.remove(waiting)
        busy.remove(working)
    stalled = [r for r in reports if r.startswith("stalled:")]
    assert 2 <= len(stalled) <= 10, stalled  # two watchdogs, each at most 5 (12 each without the back-off)
    assert all("stalled: no call and no node has finished for" in r for r in stalled)


def test_a_study_on_one_busy_endpoint_reports_no_stall_while_calls_finish(scripted_server, tmp_path, caplog):
    # Every setting's plays queue for one endpoint (one call in flight, 0.1 s each): a setting waits seconds
    # for its turn while the others' calls finish. With --stall-after 0.5 nothing is stalled, and nothing is said.
    server = scripted_server(_members(CONFIDENT), latency_s=0.1)
    models = {
        m: {"model": f"openai/{m}", "api_base": server.base_url, "api_key": "sk-test"}
        for m in ("small", "large")
    }
    config = tmp_path / "study.yaml"
    config.write_text(
        json.dumps(
            {
                "pools": {"P": {"models": models}},
                "protocols": ["majority_vote", "cascade"],
                "datasets": [{"source": DATA, "limit": 4}],
                "method": "loo",
            }
        )
    )
    with caplog.at_level(logging.WARNING, logger="colab_graphs"):  # (where the watchdog reports)
        done = cli_in_process(
            "study", "--config", config, "--out", tmp_path / "study", "--max-concurrency", "1", "--stall-after",
            "0.5", "--no-plots", "--no-preflight", "--no-cache",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = json.loads((tmp_path / "study" / "study.json").read_text())
    assert study["calls"]["made"] >= 16 and study["wall_s"] > 1.6  # seconds of queued calls
    assert "stalled" not in caplog.text + done.stderr + done.stdout


# --- in the browser (last: once Playwright's loop runs in this thread, the CLI's asyncio.run cannot) ---------


@pytest.fixture(scope="module")
def cascade_run(tmp_path_factory):
    """A cascade run whose members state no confidence (module scope: made before the browser starts, whose
    event loop would refuse the CLI's)."""
    from colab_graphs.testing import ScriptedServer

    root = tmp_path_factory.mktemp("cascade")
    with ScriptedServer(_members(PLAIN)) as server:
        pool = write_pool_file(root / "pool.yaml", server, ["small", "large"])
        done = cli_in_process(
            "run", "--protocol", "cascade", "--pool", pool, "--data", DATA, "--limit", "2", "--out",
            root / "run", "--no-preflight", "--no-cache",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return root


def test_the_viewer_shows_a_runs_warning(cascade_run, browser):  # noqa: F811
    viewer = ViewerServer(cascade_run).start()
    tab = browser.new_page()
    try:
        tab.goto(viewer.url + "?path=run")
        tab.wait_for_selector("body[data-ready]")
        shown = tab.inner_text("#warnings")
        assert "cascade: node 'stage0_small' found no confidence statement" in shown
        assert "in every one of its 2 decision(s)" in shown
    finally:
        tab.close()
        viewer.shutdown()
        viewer.server_close()
