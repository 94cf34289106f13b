"""`colab-graphs compare A B` and the viewer's compare page: two runs and two audits of MoCo's ARC-Challenge
records (multiple choice), written by the CLI against a scripted server whose members answer as models do
("The correct option is (C)."), one of them wrong on some questions; the page in a real Chromium when one is
installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli_in_process, write_pool_file

from colab_graphs.audit.compare import CompareError, compare_folders
from colab_graphs.testing import ScriptedServer, answer_key
from colab_graphs.viewer import ViewerServer
from tests.test_viewer import browser  # noqa: F401  (the viewer's Chromium, skipped with the reason where none)

MOCO = Path(__file__).parent / "fixtures" / "moco" / "arc_challenge.json"
N = 6
RECORDS = json.loads(MOCO.read_text(encoding="utf-8"))["test"][:N]
WRONG = {r["id"] for r in RECORDS[1:4]}  # the questions "flaky" gets wrong


def _member(wrong: set[str], lazy: bool = False) -> object:
    replies = {}
    for r in RECORDS:
        letters = list(r["choices"])
        gold = r["answer"]
        pick = letters[(letters.index(gold) + 1) % len(letters)] if r["id"] in wrong else gold
        text = r["choices"][pick]
        replies[r["question"][:60]] = (
            f"I'm not sure; maybe {text.lower()}"
            if lazy
            else f"Considering each option, {text.lower()}\n\nThe correct option is ({pick})."
        )
    return answer_key(replies)


def written(*args: object) -> None:
    done = cli_in_process(*args, "--no-preflight")
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("compare")
    work = tmp_path_factory.mktemp("work")
    members = {"right": _member(set()), "flaky": _member(WRONG), "lazy": _member(WRONG, lazy=True)}
    with ScriptedServer(members) as server:
        pool = write_pool_file(work / "pool.yaml", server, ["right", "flaky", "lazy"])
        pair = write_pool_file(work / "pair.yaml", server, ["right", "flaky"])
        data = ["--data", MOCO, "--limit", str(N), "--cache-dir", work / "cache"]
        written(
            "run",
            "--protocol",
            "solo",
            "-P",
            "member=right",
            "--pool",
            pool,
            *data,
            "--out",
            root / "run-right",
        )
        written(
            "run",
            "--protocol",
            "solo",
            "-P",
            "member=flaky",
            "--pool",
            pool,
            *data,
            "--out",
            root / "run-flaky",
        )
        written(
            "audit",
            "--protocol",
            "majority_vote",
            "--pool",
            pair,
            *data,
            "--out",
            root / "audit-pair",
            "--no-plots",
        )
        written(
            "audit",
            "--protocol",
            "majority_vote",
            "--pool",
            pool,
            *data,
            "--out",
            root / "audit-three",
            "--no-plots",
        )
    return root


def test_two_runs_side_by_side_with_the_examples_that_changed(outputs):
    done = cli_in_process("compare", outputs / "run-right", outputs / "run-flaky", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["kind"] == "run" and result["shared_examples"] == N
    assert (result["a"]["score"], result["b"]["score"]) == (1.0, 0.5) and result["score_delta"] == -0.5
    assert result["a"]["calls"] == {"made": N, "cached": 0, "failed": 0}
    assert {c["id"] for c in result["changed"]} == WRONG
    change = next(c for c in result["changed"] if c["id"] == RECORDS[1]["id"])
    gold = RECORDS[1]["answer"]
    assert change["gold"] == gold and change["a"] == {"score": 1.0, "prediction": gold, "failed": False}
    assert change["b"]["score"] == 0.0 and change["b"]["prediction"] not in (gold, None)
    assert "different protocols" not in " ".join(result["notes"])
    text = cli_in_process("compare", outputs / "run-right", outputs / "run-flaky")
    said = " ".join(text.stdout.split())
    assert "score │ 1.000 │ 0.500 │ -0.500" in said or "score 1.000 0.500 -0.500" in said.replace(
        "│", " "
    ).replace("  ", " ")
    assert f"3 of {N} shared example(s) changed score" in said


def test_two_audits_compare_members_values_calls_and_cost(outputs):
    result = compare_folders(outputs / "audit-pair", outputs / "audit-three")
    report_a = json.loads((outputs / "audit-pair" / "report.json").read_text())
    report_b = json.loads((outputs / "audit-three" / "report.json").read_text())
    rows = {r.member: r for r in result.members}
    assert list(rows) == ["right", "flaky", "lazy"]
    for measure in ("individual", "loo", "shapley"):
        for m in ("right", "flaky"):
            a, b = (report_a.get(measure) or {}).get(m), (report_b.get(measure) or {}).get(m)
            assert rows[m].a[measure] == a and rows[m].b[measure] == b
            assert rows[m].delta[measure] == (None if a is None or b is None else pytest.approx(b - a))
    assert (
        rows["lazy"].a["individual"] is None
        and rows["lazy"].b["individual"] == report_b["individual"]["lazy"]
    )
    # The runs made the solo calls first (one cache): a member with no call of its own made 0.
    assert rows["right"].a["calls"] == report_a["usage"].get("right", {}).get("calls", 0)
    assert rows["lazy"].b["calls"] == report_b["usage"]["lazy"]["calls"] > 0
    assert isinstance(rows["lazy"].b["calls"], int)  # a count stays a count (`--json` prints 3, not 3.0)
    assert result.a.calls["made"] == report_a["calls"]["made"] and result.b.cost_usd == report_b["cost_usd"]
    assert "different members: right, flaky vs right, flaky, lazy" in result.notes


def test_a_run_and_an_audit_are_not_comparable(outputs, tmp_path):
    done = cli_in_process("compare", outputs / "run-right", outputs / "audit-pair")
    assert done.returncode == 2
    said = " ".join(done.stderr.split())
    assert f"{outputs / 'run-right'} holds a run and {outputs / 'audit-pair'} a audit" in said or (
        "holds a run and" in said and "they measure different things" in said
    )
    with pytest.raises(CompareError, match="holds no run or audit"):
        compare_folders(outputs / "run-right", tmp_path)


def test_the_viewer_api_answers_a_comparison_and_refuses_mixed_kinds(outputs):
    import urllib.error
    import urllib.request

    server = ViewerServer(outputs).start()
    try:
        with urllib.request.urlopen(server.url + "api/compare?a=run-right&b=run-flaky") as response:
            data = json.loads(response.read())
        assert data["kind"] == "run" and {c["id"] for c in data["changed"]} == WRONG
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server.url + "api/compare?a=run-right&b=audit-pair")
        assert (
            refused.value.code == 422
            and "measure different things" in json.loads(refused.value.read())["error"]
        )
    finally:
        server.shutdown()
        server.server_close()


# --- in the browser --------------------------------------------------------------------------------------------


def test_the_compare_page_in_a_browser(outputs, browser):  # noqa: F811
    server = ViewerServer(outputs).start()
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(str(e)))
    try:
        # Reached from the index's form, as a user would: pick A and B, press Compare.
        tab.goto(server.url)
        tab.wait_for_selector("body[data-ready]")
        tab.select_option("#compare-a", "audit-pair")
        tab.select_option("#compare-b", "audit-three")
        tab.click("#compare button")
        tab.wait_for_selector("body[data-ready] #compare-members")
        assert tab.inner_text("h1").strip() == "Compare audits"
        report_b = json.loads((outputs / "audit-three" / "report.json").read_text())
        lazy = tab.inner_text('#compare-members tr[data-member="lazy"] td[data-measure="individual-b"]')
        assert lazy.strip() == f"{report_b['individual']['lazy']:.3f}"
        assert "different members" in tab.inner_text("#compare-notes")

        tab.goto(server.url + "?a=run-right&b=run-flaky")
        tab.wait_for_selector("body[data-ready]")
        cells = tab.inner_text("#compare-score").split()
        assert cells[-3:] == ["1.000", "0.500", "-0.500"]
        changed = tab.query_selector_all("#compare-changed tr[data-example]")
        assert {row.get_attribute("data-example") for row in changed} == WRONG

        # An audit's page names the scorer the records called for (report.json's scored_by), not "n/a".
        tab.goto(server.url + "?path=audit-pair")
        tab.wait_for_selector("body[data-ready]")
        assert tab.inner_text("#scorer").strip() == "multiple_choice (the records' default)"
        assert not tab.query_selector("#warnings")

        tab.goto(server.url + "?a=run-right&b=audit-pair")
        tab.wait_for_selector("body[data-ready]")
        assert "measure different things" in tab.inner_text("#error")
        assert errors == [] or all("422" in e for e in errors)  # the refused request, nothing else
    finally:
        tab.close()
        server.shutdown()
        server.server_close()
