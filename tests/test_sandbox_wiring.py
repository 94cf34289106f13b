"""The sandbox setting through the CLI: checked before the first call, opted out of only by name, and named in
every output of a code-scored run (results.jsonl rows, summary.json, report.json, study.json); `doctor`.

Real records (MoCo's HumanEval: `add`, `unique`, `incr_list`), a scripted coder that answers as models do
(prose around a fenced block): a correct `add`, a wrong `unique`, and no code at all for `incr_list`.
"A container" is `colab_graphs.testing.container --no-landlock`: a real seccomp filter refusing `unshare`,
`setns`, `mount` and Landlock, so no safe backend exists there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from colab_graphs.cli.app import _register_optional_commands, app
from colab_graphs.sandbox import SandboxUnavailable, scope
from colab_graphs.testing.scripts import last_user_text

MOCO = Path(__file__).resolve().parent / "fixtures" / "moco" / "humaneval.json"  # MoCo's file, unchanged
IDS = ("HumanEval/53", "HumanEval/34", "HumanEval/42")
EXPECTED = {"HumanEval/53": 1.0, "HumanEval/34": 0.0, "HumanEval/42": 0.0}

_register_optional_commands()  # audit, study, train, doctor: as the console entry point registers them


def coder(messages, params) -> str:
    """Answers like a model: prose, a fenced block, prose. `add` right, `unique` wrong, `incr_list` no code."""
    question = last_user_text(messages)
    if "def add(" in question:
        return "Sure! Here is the function:\n\n```python\ndef add(x: int, y: int):\n    return x + y\n```\n\nDone."
    if "def unique(" in question:
        return "This keeps the order:\n\n```python\ndef unique(l: list):\n    return list(l)\n```\n"
    return "I would increment every element of the list by one and return the new list."


@pytest.fixture(scope="module")
def code_data(tmp_path_factory) -> Path:
    """The three MoCo HumanEval records, as a MoCo file of their own."""
    moco = json.loads(MOCO.read_text())
    records = {r["id"]: r for r in moco["test"] + moco["dev"]}
    path = tmp_path_factory.mktemp("data") / "humaneval.json"
    path.write_text(
        json.dumps({"name": "humaneval", "task_type": "coding", "test": [records[i] for i in IDS]})
    )
    return path


@pytest.fixture
def coder_server(scripted_server):
    return scripted_server({"coder": coder, "other": coder})


def pool_file(tmp_path: Path, server, members=("coder",)) -> Path:
    path = tmp_path / "pool.yaml"
    path.write_text(
        "models:\n"
        + "".join(
            f"  {m}: {{model: openai/{m}, api_base: '{server.base_url}', api_key: sk-test}}\n"
            for m in members
        )
    )
    return path


def auto_record() -> dict:
    try:
        return scope.probe("auto")
    except SandboxUnavailable as err:
        pytest.skip(f"no safe sandbox backend on this machine: {err}")


def rows(out: Path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def in_container(*args: str | Path, landlock: bool = False) -> subprocess.CompletedProcess:
    """`colab-graphs ARGS` as in a container whose seccomp profile refuses namespaces (and Landlock)."""
    wrapper = [
        sys.executable,
        "-m",
        "colab_graphs.testing.container",
        *([] if landlock else ["--no-landlock"]),
    ]
    command = [*wrapper, "--", sys.executable, "-m", "colab_graphs.cli.app", *map(str, args)]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop(scope.backends.ENV, None)
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def test_a_code_run_names_its_sandbox_in_every_row_and_the_summary(coder_server, code_data, tmp_path):
    record = auto_record()
    out = tmp_path / "run"
    args = ["run", "--protocol", "solo", "--pool", pool_file(tmp_path, coder_server), "--data", code_data,
            "--out", out, "--no-cache"]  # fmt: skip
    result = CliRunner().invoke(app, list(map(str, args)))
    assert result.exit_code == 0, result.output
    lines = rows(out)
    assert {i: r["score"] for i, r in lines.items()} == EXPECTED, lines
    ran = {"backend": record["backend"], "isolation": record["isolation"]}
    assert lines["HumanEval/53"]["sandbox"] == ran  # passed: no reason
    failed = lines["HumanEval/34"]["sandbox"].pop("failed")  # the wrong `unique`: why it failed, in its row
    assert lines["HumanEval/34"]["sandbox"] == ran and failed.startswith("AssertionError"), failed
    assert lines["HumanEval/42"]["sandbox"] == {"backend": record["backend"], "isolation": []}  # no code ran
    assert record["backend"] != "unsafe-local" and record["safe"] and record["isolation"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sandbox"] == {**record, "setting": "auto"}
    traces = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    assert all(t["sandbox"]["backend"] == record["backend"] for t in traces)
    plays = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [p["sandbox"]["backend"] for p in plays if p.get("type") == "play"] == [record["backend"]] * 3
    assert f"code scored in the sandbox: {record['backend']}" in result.output

    # The viewer passes the record on (its API) and shows it on the run's page.
    from colab_graphs.viewer import ViewerServer

    viewer = ViewerServer(tmp_path).start()
    try:
        with urllib.request.urlopen(viewer.url + "api/log?path=run") as response:
            assert json.loads(response.read())["summary"]["sandbox"] == summary["sandbox"]
        if browser_available():
            from playwright.sync_api import sync_playwright

            from tests.test_viewer import CHROMIUM, CHROMIUM_ARGS

            with sync_playwright() as p:
                chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                tab = chromium.new_page()
                tab.goto(viewer.url + "?path=run")
                tab.wait_for_selector("body[data-ready]")
                assert tab.inner_text("#sandbox").strip().startswith(f"{record['backend']} (")
                chromium.close()
    finally:
        viewer.shutdown()
        viewer.server_close()


def browser_available() -> bool:
    from tests.test_viewer import CHROMIUM

    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return Path(CHROMIUM).exists()


def test_a_run_without_code_scores_writes_no_sandbox_key(scripted_server, tmp_path):
    server = scripted_server({"solver": lambda messages, params: "2 + 2 = 4. The answer is 4."})
    out = tmp_path / "run"
    args = ["run", "--protocol", "solo", "--pool", pool_file(tmp_path, server, ("solver",)), "--data",
            "builtin:arithmetic", "--limit", "2", "--out", out, "--no-cache", "--sandbox", "unsafe"]  # fmt: skip
    result = CliRunner().invoke(app, list(map(str, args)))
    assert result.exit_code == 0, result.output
    for name in ("results.jsonl", "summary.json", "traces.jsonl", "log.jsonl"):
        assert '"sandbox"' not in (out / name).read_text(), name


def test_an_audit_and_a_study_name_their_sandbox(coder_server, code_data, tmp_path):
    record = auto_record()
    pool = pool_file(tmp_path, coder_server, ("coder", "other"))
    out = tmp_path / "audit"
    args = ["audit", "--protocol", "majority_vote", "--pool", pool, "--data", code_data, "--out", out,
            "--no-cache", "--no-plots"]  # fmt: skip
    result = CliRunner().invoke(app, list(map(str, args)))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["sandbox"] == {**record, "setting": "auto"}
    assert report["individual"] == {"coder": pytest.approx(1 / 3), "other": pytest.approx(1 / 3)}
    assert f"| Sandbox | {record['backend']} (" in (out / "report.md").read_text()

    study = tmp_path / "study.yaml"
    study.write_text(
        f"pools: {{p: {pool}}}\nprotocols: [majority_vote]\n"
        f"datasets: [{{source: {code_data}, scorer: code, label: he}}]\nsandbox: auto\n"
    )
    result = CliRunner().invoke(
        app, ["study", "--config", str(study), "--out", str(tmp_path / "s"), "--no-cache", "--no-plots"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "s" / "study.json").read_text())["sandbox"] == {**record, "setting": "auto"}
    (audit,) = (tmp_path / "s" / "audits").glob("**/report.json")
    assert json.loads(audit.read_text())["sandbox"]["backend"] == record["backend"]


def _refusal_inputs(tmp_path: Path, server, code_data: Path) -> dict[str, list[str | Path]]:
    pool = pool_file(tmp_path, server, ("coder", "other"))
    app_file = tmp_path / "coder_app.py"
    app_file.write_text(
        "from langgraph.graph import END, START, MessagesState, StateGraph\n"
        "import colab_graphs as cg\n\n"
        "class State(MessagesState):\n    input: str\n    answer: str\n\n"
        "def answer(state):\n"
        "    reply = cg.member_chat_model('coder').invoke(state['input'])\n"
        "    return {'answer': reply.content}\n\n"
        "g = StateGraph(State)\ng.add_node('answer', answer)\ng.add_edge(START, 'answer')\n"
        "g.add_edge('answer', END)\napp = g.compile(name='coder_app')\n"
    )
    study = tmp_path / "study.yaml"
    study.write_text(
        f"pools: {{p: {pool}}}\nprotocols: [majority_vote]\ndatasets: [{{source: {code_data}, scorer: code}}]\n"
    )
    train = tmp_path / "train.yaml"
    train.write_text(
        f"protocol: majority_vote\npolicy_member: policy\npolicy_model: tiny-random\ndata: {code_data}\n"
        f"pool:\n  policy: {{max_tokens: 8}}\n"
        f"  coder: {{model: openai/coder, api_base: '{server.base_url}', api_key: sk-test}}\n"
        f"output_dir: {tmp_path / 'train'}\nuse_cpu: true\nbf16: false\n"
    )
    common = ["--no-cache"]
    return {
        "run": [
            "run",
            "--protocol",
            "solo",
            "--pool",
            pool,
            "--data",
            code_data,
            "--out",
            tmp_path / "r",
            *common,
        ],
        "audit --app": [
            "audit",
            "--app",
            f"{app_file}:app",
            "--pool",
            pool,
            "--data",
            code_data,
            "--out",
            tmp_path / "a",
            *common,
        ],  # fmt: skip
        "study": ["study", "--config", study, "--out", tmp_path / "s", *common],
        "train": ["train", "--config", train],
    }


@pytest.mark.parametrize("command", ["run", "audit --app", "study", "train"])
def test_where_no_safe_sandbox_exists_every_command_refuses_before_any_call(
    command, coder_server, code_data, tmp_path
):
    done = in_container(*_refusal_inputs(tmp_path, coder_server, code_data)[command])
    assert done.returncode == scope.EXIT_CODE, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert "unshare" in said and "--sandbox unsafe-local" in said and "Landlock" in said
    assert coder_server.requests == []  # not a call, not even the endpoint check
    assert (
        not (tmp_path / "r" / "results.jsonl").exists()
        and not (tmp_path / "train" / "metrics.jsonl").exists()
    )


def test_unsafe_local_runs_where_nothing_else_can_and_every_output_says_so(coder_server, code_data, tmp_path):
    pool = pool_file(tmp_path, coder_server, ("coder", "other"))
    out = tmp_path / "run"
    done = in_container("run", "--protocol", "solo", "-P", "member=coder", "--pool", pool, "--data", code_data,
                        "--out", out, "--no-cache", "--sandbox", "unsafe")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("runs unconfined") == 1  # the warning, once
    lines = rows(out)
    assert {i: r["score"] for i, r in lines.items()} == EXPECTED
    assert {r["sandbox"]["backend"] for r in lines.values()} == {"unsafe-local"}
    summary = json.loads((out / "summary.json").read_text())["sandbox"]
    assert summary["setting"] == summary["backend"] == "unsafe-local" and summary["safe"] is False
    assert "netns" not in summary["isolation"] and "mountns" not in summary["isolation"]

    audit = tmp_path / "audit"
    done = in_container("audit", "--protocol", "majority_vote", "--pool", pool, "--data", code_data,
                        "--out", audit, "--no-cache", "--no-plots", "--sandbox", "unsafe-local")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((audit / "report.json").read_text())
    assert report["sandbox"]["backend"] == "unsafe-local" and report["sandbox"]["safe"] is False
    assert "opted in: the code ran unconfined" in (audit / "report.md").read_text()


def test_doctor_says_what_this_machine_gives_and_what_a_container_does_not():
    here = CliRunner().invoke(app, ["doctor", "--json"])
    found = json.loads(here.output)
    assert here.exit_code == (0 if found["auto"] else scope.EXIT_CODE)
    assert set(found["backends"]) == {"namespaces", "landlock", "unsafe-local"}
    assert found["backends"]["unsafe-local"] == {"available": True, "safe": False, "why_not": None}
    assert found["interpreter"]["path"] and "reachable" in found["interpreter"]
    assert found["landlock_abi"]["abi"] is None or found["landlock_abi"]["abi"] >= 1

    done = in_container("doctor", "--json")
    assert done.returncode == scope.EXIT_CODE, done.stderr
    boxed = json.loads(done.stdout)
    assert boxed["auto"] is None and "unsafe-local" in boxed["auto_refusal"]
    assert "unshare" in boxed["backends"]["namespaces"]["why_not"]
    assert not boxed["backends"]["landlock"]["available"] and boxed["landlock_abi"]["abi"] is None
    assert boxed["user_namespaces"]["can_create"] is False
    text = in_container("doctor")
    assert text.returncode == scope.EXIT_CODE and "auto chooses: nothing" in text.stdout


def test_a_setting_that_is_not_one_is_refused_naming_the_settings(tmp_path):
    result = CliRunner().invoke(app, ["run", "--protocol", "solo", "--sandbox", "docker"])
    assert result.exit_code == 2 and "auto, namespaces, landlock, unsafe-local, unsafe" in result.output
    assert scope.normalize("unsafe") == "unsafe-local" and scope.normalize(" auto ") == "auto"
    from colab_graphs.study import StudyConfigError, load_study_config
    from colab_graphs.trainers.config import ConfigError, TrainConfig

    study = tmp_path / "study.yaml"
    study.write_text("pools: {p: {models: {a: {model: openai/a}}}}\nprotocols: [solo]\n"
                     "datasets: [builtin:arithmetic]\nsandbox: off\n")  # fmt: skip
    with pytest.raises(StudyConfigError, match=r"study.yaml: sandbox: expected a sandbox setting, got False"):
        load_study_config(study)
    with pytest.raises(ConfigError, match="config: sandbox: 'none' is not a sandbox setting"):
        TrainConfig(sandbox="none").validate()
    assert TrainConfig(sandbox="unsafe").validate().sandbox == "unsafe-local"


def test_the_python_api_takes_the_setting_and_refuses_before_any_call_too(coder_server, code_data, tmp_path):
    import colab_graphs as cg

    pool = {"coder": {"model": "openai/coder", "api_base": coder_server.base_url, "api_key": "sk-test"}}
    result = cg.run("solo", pool, str(code_data), out=tmp_path / "run", sandbox="unsafe", progress=False)
    assert (
        result.summary["sandbox"]["backend"] == "unsafe-local" and result.summary["sandbox"]["safe"] is False
    )
    assert [o.score for o in result.outcomes] == [EXPECTED[i] for i in IDS]
    coder_server.reset()

    script = (
        "import sys, colab_graphs as cg\n"
        "from colab_graphs.sandbox import SandboxUnavailable\n"
        f"pool = {pool!r}\n"
        "try:\n"
        f"    cg.run_audit('majority_vote', {{**pool, 'other': pool['coder']}}, {str(code_data)!r}, progress=False)\n"
        "except SandboxUnavailable as err:\n"
        "    sys.exit(f'refused: {err}')\n"
    )
    wrapper = [sys.executable, "-m", "colab_graphs.testing.container", "--no-landlock", "--"]
    done = subprocess.run(
        [*wrapper, sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1 and done.stderr.startswith("refused: code cannot be scored safely here")
    assert coder_server.requests == []


SANDBOXED_TEST = """
from colab_graphs.sandbox.runner import run_code


def test_runs_code():
    assert run_code("print(6 * 7)").stdout.strip() == "42"
"""


def test_a_test_file_outside_the_sandbox_group_that_runs_sandboxed_code_fails_naming_the_file(tmp_path):
    """The suite's own rule (tests/conftest.py): under `-n 2` the sandbox's files run one after another on one
    worker, because some of them check that no sandboxed process is left; a file outside the group that runs
    sandboxed code would break that check only now and then, so it is refused every time, by name."""
    conftest = Path(__file__).with_name("conftest.py")
    (tmp_path / "conftest.py").write_text(conftest.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "test_new_feature.py").write_text(SANDBOXED_TEST, encoding="utf-8")
    (tmp_path / "test_sandbox.py").write_text(SANDBOXED_TEST, encoding="utf-8")  # a file of the group
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert "1 failed, 1 passed" in out, out
    assert "FAILED test_new_feature.py::test_runs_code" in out
    assert (
        "test_new_feature.py runs sandboxed code: add it to XDIST_GROUPS['sandbox'] in tests/conftest.py"
        in out
    )
