"""docs/data-io.md as a user runs it: every Python block and every command, in order, in one folder holding the
`pool.yaml` and `questions.csv` the page refers to, against a scripted server whose members answer as models
do; each step's calls are counted at the server."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import cli_in_process, write_pool_file

from colab_graphs.testing import arithmetic_solver

DOC = Path(__file__).resolve().parents[1] / "docs" / "data-io.md"
STYLE = "Working it out: {answer}.\n\nThe answer is {answer}."


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def commands() -> list[list[str]]:
    lines = "\n".join(blocks("bash")).replace("\\\n", " ").splitlines()
    return [shlex.split(line.split("  #")[0]) for line in lines if line.startswith("colab-graphs ")]


@pytest.fixture
def folder(scripted_server, tmp_path, monkeypatch):
    server = scripted_server(
        {
            "a": arithmetic_solver(accuracy=1.0, seed=1, style=STYLE),
            "b": arithmetic_solver(accuracy=0.5, seed=2, style=STYLE),
        }
    )
    write_pool_file(tmp_path / "pool.yaml", server, ["a", "b"])
    (tmp_path / "questions.csv").write_text(
        "uid,question,label\nq1,What is 17 + 25?,42\nq2,What is 9 * 8?,72\nq3,What is 40 - 13?,27\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLAB_GRAPHS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # hf:PATH is read here; nothing comes from the hub
    return server


def test_every_python_block_and_command_of_docs_data_runs(folder, capsys):
    frame_block, dict_block, compare_block = blocks("python")
    namespace: dict = {}
    exec(compile(frame_block, "docs/data-io.md", "exec"), namespace)
    assert len(folder.chat_requests) == 2  # member a, once per row
    assert list(namespace["result"].to_pandas()["gold"]) == ["42", "72"] and namespace["result"].score == 1.0
    assert "prediction" in capsys.readouterr().out

    before = len(folder.chat_requests)
    exec(compile(dict_block, "docs/data-io.md", "exec"), namespace)
    report = namespace["report"]
    assert report.n_examples == 2 and report.calls.made == len(folder.chat_requests) - before
    assert Path("gsm-local", "dataset_dict.json").is_file()

    run_csv, audit_hf, compare_text, compare_json = commands()
    for argv in (run_csv, audit_hf):
        before = len(folder.chat_requests)
        done = cli_in_process(*argv[1:], "--no-preflight")
        assert done.returncode == 0, done.stderr
        assert "calls made" in done.stdout
    assert Path("runs/csv/results.jsonl").read_text().count('"gold"') == 3

    # The compare block's folders: the CSV run before and after member b joins the vote.
    for out, pool in (("runs/before", ["a"]), ("runs/after", ["a", "b"])):
        write_pool_file(Path(f"{out}.yaml"), folder, pool)
        done = cli_in_process(
            "run", "--protocol", "majority_vote", "--pool", f"{out}.yaml", "--data", "questions.csv",
            "--id-field", "uid", "--out", out, "--no-preflight",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    compared = cli_in_process(*compare_text[1:])
    assert compared.returncode == 0 and "shared example(s) changed score" in compared.stdout
    exec(compile(compare_block, "docs/data-io.md", "exec"), namespace)
    assert namespace["comparison"].kind == "run" and namespace["comparison"].shared_examples == 3
    # The audit folders of the second command: the same vote over 3 and over 4 questions.
    for out, limit in (("audits/vote-3", "3"), ("audits/vote-4", "4")):
        done = cli_in_process(
            "audit", "--protocol", "majority_vote", "--pool", "pool.yaml", "--data", "builtin:arithmetic",
            "--limit", limit, "--out", out, "--no-plots", "--no-preflight",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    as_json = cli_in_process(*compare_json[1:])
    assert as_json.returncode == 0 and '"kind": "audit"' in as_json.stdout
