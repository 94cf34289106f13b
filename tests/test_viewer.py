"""`colab-graphs view` in a real headless browser: Chromium from the system's packages driven by Playwright.

Every kind of folder the CLI writes (an audit, a run, a study with its audit and solo folders, a training run)
is served by the viewer and opened in Chromium: each page renders without a console error, the numbers shown
are report.json's, and deep links (`?example=`, `?coalition=`, `?member=`) show the replies behind them. The
browser tests skip, saying why, only where Playwright or a Chromium binary is missing (`.ci/run` installs
Chromium with apt where it can); the server's own tests need no browser.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path

import pytest

from colab_graphs.log import LOG_FILE, RolloutRecord
from colab_graphs.testing import ScriptedServer
from colab_graphs.trace import Call, Trace
from colab_graphs.viewer import ViewerServer
from tests.conftest import cli_in_process, write_pool_file
from tests.test_audit import GOLD, PLAYERS, vote_examples, vote_members

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("COLAB_GRAPHS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
]  # root in a container: no sandbox


def cli(*args: str | Path, timeout: int = 300) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "colab_graphs.cli.app", *map(str, args)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "200"}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def written(*args: str | Path) -> None:
    """What `colab-graphs ARGS` writes, the command run in this process (the viewer reads only its files)."""
    done = cli_in_process(*args)
    assert done.returncode == 0, done.stdout + done.stderr


def shown(value: float | None, signed: bool = False) -> str:
    """A number as the page prints it (three decimals, a sign for contributions)."""
    if value is None:
        return "–"
    text = "0.000" if value == 0 else f"{value:.3f}"
    return "+" + text if signed and not text.startswith("-") else text


def training_folder(folder: Path) -> Path:
    """A training run's files as `colab-graphs train` writes them (two steps, evaluations, one rollout)."""
    folder.mkdir(parents=True)
    steps = [{"step": 1, "loss": 0.5, "system_reward": 0.25}, {"step": 2, "loss": 0.25, "system_reward": 0.5}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    evaluation = {"before": (0.5, 0.25), "after": (0.75, 0.25)}
    for name, (system, without) in evaluation.items():
        data = {
            "n": 8,
            "system": system,
            "without_policy": without,
            "loo": system - without,
            "policy_solo": 0.125,
        }
        (folder / f"eval_{name}.json").write_text(json.dumps(data))
    trace = Trace(example_id="[q1]", protocol="relay", calls=[
        Call(seat="helper", member="a", model="m", messages=[{"role": "user", "content": "[q1]?"}], key="k1",
             completion="The answer is 1.", cached=True),
        Call(seat="solver", member="policy", model="local/p", messages=[{"role": "user", "content": "[q1]? a: 1"}],
             key="k2", completion="The answer is 1 k."),
    ])  # fmt: skip
    rollout = RolloutRecord.from_trace(2, vote_examples()[0], trace, 1.0, {"policy"}, credit=[0.5])
    (folder / "rollouts.jsonl").write_text(rollout.model_dump_json() + "\n")
    (folder / "summary.json").write_text(
        json.dumps({"reward": "system", "credit": "uniform", "protocol": "relay"})
    )
    return folder


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    """One folder holding what the CLI writes: an audit, a run, a study, a training run; an audit caught while
    it is being played (its log cut after 20 plays, no report yet)."""
    from tests.test_study import member_scripts, write_study

    root = tmp_path_factory.mktemp("view")
    work = tmp_path_factory.mktemp("work")
    (work / "vote.jsonl").write_text(
        "".join(
            json.dumps({"id": e.id, "input": e.input, "answer": e.answer}) + "\n" for e in vote_examples()
        )
    )
    with ScriptedServer(vote_members()) as server:
        pool = write_pool_file(work / "pool.yaml", server, PLAYERS)
        shared = [
            "--pool",
            pool,
            "--data",
            work / "vote.jsonl",
            "--protocol",
            "majority_vote",
            "--cache-dir",
            work / "cache",
        ]
        written("audit", *shared, "--method", "exact", "--play-every-coalition", "--out", root / "audit")
        written("run", *shared, "--out", root / "run")
    with ScriptedServer(member_scripts()) as server:
        config = write_study(work / "study", server, datasets=("d1",))
        written(
            "study", "--config", config, "--out", root / "study", "--cache-dir", work / "cache", "--no-plots"
        )
    training_folder(root / "train")
    running = root / "running"
    running.mkdir()
    lines = (root / "audit" / LOG_FILE).read_text().splitlines(keepends=True)
    plays = [i for i, line in enumerate(lines) if line.startswith('{"type":"play"')]
    (running / LOG_FILE).write_text("".join(lines[: plays[19] + 1]))
    return root


@pytest.fixture(scope="module")
def viewer(outputs):
    server = ViewerServer(outputs).start()
    yield server
    server.shutdown()
    server.server_close()


def api(viewer: ViewerServer, route: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(viewer.url + route) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


# --- the server ------------------------------------------------------------------------------------------------


def test_the_api_passes_report_json_numbers_on_unchanged(viewer, outputs):
    status, data = api(viewer, "api/log?path=audit")
    report = json.loads((outputs / "audit" / "report.json").read_text())
    assert status == 200 and data["kind"] == "audit" and data["complete"]
    assert data["shapley"] == report["shapley"] and data["loo"] == report["loo"]
    assert data["coalitions"] == [
        {"members": c["members"], "value": c["value"]} for c in report["coalitions"]
    ]


def test_a_path_outside_the_viewed_folder_is_refused(viewer):
    status, data = api(viewer, "api/log?path=../..")
    assert status == 403 and "outside" in data["error"]


def test_an_unknown_example_is_not_found(viewer):
    status, data = api(viewer, "api/example?path=audit&id=nope")
    assert status == 404 and "nope" in data["error"]


def test_the_page_loads_nothing_from_the_network():
    static = resources.files("colab_graphs.viewer") / "static"
    for name in ("index.html", "app.js", "app.css", "favicon.svg"):
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s\"'`)]*", static.joinpath(name).read_text()))
        assert urls <= {"http://www.w3.org/2000/svg"}, (name, urls)


def test_the_page_ships_as_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "static/*" in data["colab_graphs.viewer"]


def test_cli_view_serves_the_folder_until_stopped(outputs):
    command = [sys.executable, "-m", "colab_graphs.cli.app", "view", str(outputs / "audit"), "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        with urllib.request.urlopen(url + "api/log") as response:
            assert json.loads(response.read())["kind"] == "audit"
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def small_viewer(tmp_path):
    """A viewer over a folder holding one plot and a link to a file outside it, named like a plot."""
    (tmp_path / "shapley.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "leak.png").symlink_to("/etc/passwd")
    server = ViewerServer(tmp_path).start()
    yield server
    server.shutdown()
    server.server_close()


def get(viewer: ViewerServer, route: str, host: str | None = None) -> tuple[int, bytes]:
    import http.client

    connection = http.client.HTTPConnection(*viewer.server_address[:2], timeout=10)
    headers = {"Host": host} if host is not None else {}
    connection.request("GET", "/" + route, headers=headers)  # a Host given replaces the default one
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, body


def test_a_request_naming_another_host_is_refused(small_viewer):
    """DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 sends Host: evil.example."""
    port = small_viewer.server_address[1]
    assert get(small_viewer, "api/log", "evil.example")[0] == 403
    assert get(small_viewer, "api/log", f"evil.example:{port}")[0] == 403
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
        assert get(small_viewer, "", host)[0] == 200, host


def test_allowed_hosts_extend_what_the_viewer_answers(tmp_path):
    server = ViewerServer(tmp_path, allow_hosts=["viewer.lab"]).start()
    try:
        port = server.server_address[1]
        assert get(server, "", f"viewer.lab:{port}")[0] == 200
        assert get(server, "", f"evil.example:{port}")[0] == 403
    finally:
        server.shutdown()
        server.server_close()


def test_a_link_that_leads_out_of_the_folder_is_not_served(small_viewer):
    status, body = get(small_viewer, "file?name=leak.png")
    assert status == 404 and b"root:" not in body
    assert get(small_viewer, "file?name=shapley.png")[0] == 200


def test_a_log_that_links_out_of_the_folder_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOG_FILE).symlink_to("/etc/passwd")
    server = ViewerServer(tmp_path).start()
    try:
        status, body = get(server, "api/log?path=run")
        assert status == 403 and b"root:" not in body
    finally:
        server.shutdown()
        server.server_close()


# --- in the browser --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install -e '.[dev]')")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium; or set COLAB_GRAPHS_CHROMIUM)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Page:
    """A browser tab on the viewer that records console errors and uncaught exceptions."""

    def __init__(self, browser, viewer: ViewerServer):
        self.tab = browser.new_page()
        self.viewer = viewer
        self.errors: list[str] = []
        self.tab.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.tab.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, query: str) -> Page:
        self.tab.goto(self.viewer.url + query)
        self.tab.wait_for_selector("body[data-ready]")
        return self

    def text(self, selector: str) -> str:
        return self.tab.inner_text(selector).strip()


@pytest.fixture
def page(browser, viewer):
    tab = Page(browser, viewer)
    yield tab
    tab.tab.close()


PAGES = [
    "?path=audit",
    "?path=audit&example=[q2]&coalition=b,c",
    "?path=audit&member=a",
    "?path=audit&coalition=a,b",
    "?path=audit&example=[q3]&member=a",
    "?path=run",
    "?path=run&example=[q1]",
    "?path=study",
    "?path=study/audits/P1/majority_vote/d1",
    "?path=study/solo/P1/d1",
    "?path=train",
    "?path=running",
    "?path=",
]


@pytest.mark.parametrize("query", PAGES)
def test_each_page_renders_without_console_errors(page, query):
    page.open(query)
    assert not page.tab.query_selector("#error"), page.text("#error")
    assert page.tab.query_selector("main h1")
    assert page.errors == []


def test_members_table_shows_report_json_values(page, outputs):
    report = json.loads((outputs / "audit" / "report.json").read_text())
    page.open("?path=audit")
    for m in PLAYERS:
        row = f"#members tr[data-member='{m}']"
        assert page.text(f"{row} td[data-measure=individual] .v") == shown(report["individual"][m])
        assert page.text(f"{row} td[data-measure=loo] .v") == shown(report["loo"][m], signed=True)
        assert page.text(f"{row} td[data-measure=shapley] .v") == shown(report["shapley"][m], signed=True)
        low, high = report["ci"][m]["shapley"]
        assert page.text(f"{row} td[data-measure=shapley] .ci") == f"[{shown(low)}, {shown(high)}]"
        assert page.text(f"{row} td[data-measure=calls]") == str(report["usage"][m]["calls"])
    assert page.errors == []


def test_lattice_shows_each_coalition_value(page, outputs):
    report = json.loads((outputs / "audit" / "report.json").read_text())
    page.open("?path=audit")
    for c in report["coalitions"]:
        node = f"#lattice a.node[data-coalition='{','.join(c['members'])}'] text.value"
        assert page.tab.text_content(node) == shown(c["value"])
    assert page.text("#v-all") == shown(
        next(c["value"] for c in report["coalitions"] if len(c["members"]) == 3)
    )


def test_a_deep_link_to_an_example_and_coalition_shows_its_replies(page):
    page.open("?path=audit&example=[q2]&coalition=b,c")
    play = "#example .conversation[data-coalition='b,c']"
    assert [page.text(f"{play} .turn[data-seat={seat}] .reply") for seat in ("answer_b", "answer_c")] == [
        "The answer is 2.",
        "The answer is 2.",
    ]
    assert not page.tab.query_selector(f"{play} .turn[data-seat=answer_a]")
    assert "[q2] Which number is it?" in page.text(f"{play} .turn[data-seat=answer_b] .saw")
    assert page.text(f"{play} .outcome .score") == "1.000"


def test_a_member_deep_link_on_an_example_shows_the_play_with_and_without_it(page):
    # q3: a, b, c answer 3, 7, 8; all three tie and a's 3 (first in pool order) wins; b and c tie on b's 7.
    page.open("?path=audit&example=[q3]&member=a")
    assert page.text("#diff p b") == "+1.000"
    assert page.text("#diff .turn[data-side=with][data-seat=answer_a] .reply") == "The answer is 3."
    assert page.text("#diff .turn[data-side=without][data-seat=answer_b] .reply") == "The answer is 7."
    assert "does not play without a" in page.text("#diff .diff")


def test_a_member_page_lists_the_examples_where_it_changes_the_team_score(page):
    page.open("?path=audit&member=a")  # with a the team gets q3 and q4 right, without a neither
    flips = [chip.inner_text() for chip in page.tab.query_selector_all("#member .chips a")]
    assert flips == ["[q3]: 0.000 → 1.000", "[q4]: 0.000 → 1.000"]


def test_a_run_page_shows_summary_json_score_and_each_answer(page, outputs):
    summary = json.loads((outputs / "run" / "summary.json").read_text())
    page.open("?path=run")
    assert page.text("#run-score") == shown(summary["score"])
    assert [page.text(f"tr[data-example='{i}'] td:nth-child(4)") for i in GOLD] == ["1", "2", "3", "8", "5"]


def test_the_study_page_shows_study_json_correlations_and_links_each_audit(page, outputs):
    study = json.loads((outputs / "study" / "study.json").read_text())
    page.open("?path=study")
    for c in study["correlations"]:
        cell = f"#correlations tr[data-pool='{c['pool']}'][data-family='{c['family']}'] td[data-measure=spearman]"
        assert page.text(cell) == shown(c["spearman"], signed=True)
        assert page.tab.query_selector(
            f"#heatmap g.cell[data-pool='{c['pool']}'][data-family='{c['family']}']"
        )
    page.tab.click("tr[data-setting='P1/majority_vote/d1'] a")
    page.tab.wait_for_selector("body[data-ready] #members")
    audit = json.loads((outputs / "study/audits/P1/majority_vote/d1/report.json").read_text())
    assert page.text("#members tr[data-member='a'] td[data-measure=loo] .v") == shown(
        audit["loo"]["a"], signed=True
    )
    assert page.errors == []


def test_a_training_page_shows_evaluations_curves_and_each_policy_turns_credit(page):
    page.open("?path=train")
    assert page.text("#evaluation tr[data-measure=system] .before") == "0.500"
    assert page.text("#evaluation tr[data-measure=system] .after") == "0.750"
    assert page.tab.query_selector("#curves .chart[data-metric=system_reward] polyline")
    turn = "#rollouts .turn[data-seat=solver]"
    assert (
        "credit +0.500" in page.text(f"{turn} header") and page.text(f"{turn} .reply") == "The answer is 1 k."
    )
    assert "credit" not in page.text("#rollouts .turn[data-seat=helper] header")


def test_a_running_audit_shows_progress_and_more_on_reload(page, outputs, tmp_path):
    running = outputs / "running"
    page.open("?path=running")
    assert page.text("#status") == "running: 20 of 55 plays logged (reload to update)"
    shutil.copy(outputs / "audit" / LOG_FILE, running / LOG_FILE)
    page.open("?path=running")
    assert page.text("#status") == "all plays logged"
    shutil.copy(outputs / "audit" / "report.json", running / "report.json")
    page.open("?path=running")
    assert page.text("#status") == "finished"
    assert page.errors == []


@pytest.mark.slow
def test_a_real_training_run_opens_in_view(browser, tmp_path):
    out = tmp_path / "train"
    cli("train", "--config", ROOT / "examples/train_tiny.yaml", "--max-steps", "2", "--out", out,
        "--cache-dir", tmp_path / "cache", timeout=900)  # fmt: skip
    after = json.loads((out / "eval_after.json").read_text())
    server = ViewerServer(tmp_path).start()
    try:
        tab = Page(browser, server).open("?path=train")
        assert tab.text("#evaluation tr[data-measure=system] .after") == shown(after["system"])
        assert tab.tab.query_selector_all("#curves .chart")
        assert tab.tab.query_selector("#rollouts .turn.policy")
        assert tab.errors == []
    finally:
        server.shutdown()
        server.server_close()
