"""Data in as pandas, Hugging Face `datasets` and inspect_ai users bring it, and out with input, gold and
prediction: real MoCo GSM8K records as a DataFrame, a Dataset, a DatasetDict, a CSV file and an `hf:PATH`
saved here, through `cg.run` / `cg.run_audit` and the CLI, against a scripted OpenAI-compatible server whose
members reply as models do (prose, then the number; one of them wrong on purpose)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli_in_process, write_pool_file

import colab_graphs as cg
from colab_graphs.models.client import ModelClient
from colab_graphs.tasks.example import DatasetError
from colab_graphs.testing import answer_key

datasets = pytest.importorskip("datasets")
pandas = pytest.importorskip("pandas")

MOCO = Path(__file__).parent / "fixtures" / "moco"
RECORDS = json.loads((MOCO / "gsm8k.json").read_text(encoding="utf-8"))["test"][:4]
GOLD = {str(r["id"]): str(r["output"]) for r in RECORDS}


def _replies(wrong: set[str]) -> dict[str, str]:
    """Question -> a reply as a model writes one: working, then the number (off by 1 for ids in `wrong`)."""
    out = {}
    for r in RECORDS:
        answer = int(GOLD[str(r["id"])]) + (1 if str(r["id"]) in wrong else 0)
        out[r["input"][:60]] = (
            f"Let me work through it step by step.\n\nSo the total is **{answer}**.\n\nThe answer is {answer}."
        )
    return out


FIRST, SECOND = str(RECORDS[0]["id"]), str(RECORDS[1]["id"])


@pytest.fixture
def server(scripted_server):
    return scripted_server(
        {"right": answer_key(_replies(set())), "half": answer_key(_replies({FIRST, SECOND}))}
    )


@pytest.fixture
def pool(server, pool_for):
    return pool_for(server, ["right", "half"])


def _frame() -> pandas.DataFrame:
    """The records as a user's DataFrame: their own column names, integer ids."""
    return pandas.DataFrame(
        {
            "uid": [r["id"] for r in RECORDS],
            "question": [r["input"] for r in RECORDS],
            "label": [int(r["output"]) for r in RECORDS],
        }
    )


FIELDS = {"id": "uid", "input": "question", "answer": "label"}


def test_a_dataframe_runs_with_field_mapping_and_results_carry_input_gold_and_prediction(pool, tmp_path):
    result = cg.run(
        "solo",
        pool,
        _frame(),
        params={"member": "half"},
        fields=FIELDS,
        out=tmp_path / "run",
        client=ModelClient(None),
        progress=False,
    )
    frame = result.to_pandas()
    assert list(frame.columns)[:4] == ["id", "input", "gold", "prediction"]
    assert list(frame["id"]) == list(GOLD) and list(frame["gold"]) == list(GOLD.values())
    assert list(frame["input"]) == [r["input"] for r in RECORDS]
    # The wrong member's first two predictions are the gold plus one, scored 0; the others match.
    assert list(frame["prediction"]) == [str(int(g) + (i < 2)) for i, g in enumerate(GOLD.values())]
    assert list(frame["score"]) == [0.0, 0.0, 1.0, 1.0] and result.score == 0.5
    lines = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert [(line["gold"], line["prediction"]) for line in lines] == list(
        zip(frame["gold"], frame["prediction"], strict=True)
    )
    assert all(
        line["answer"] == line["prediction"] for line in lines
    )  # the deprecated name, kept one release


def test_a_dataset_and_a_dataset_dict_split_run_through_the_api(pool):
    dataset = datasets.Dataset.from_pandas(_frame())
    by_dataset = cg.run(
        "solo",
        pool,
        dataset,
        params={"member": "right"},
        fields={"id": "uid", "input": "question", "answer": "label"},
        client=ModelClient(None),
        progress=False,
    )
    assert by_dataset.score == 1.0 and [r["id"] for r in by_dataset.rows()] == list(GOLD)
    splits = datasets.DatasetDict({"dev": dataset.select([0]), "test": dataset.select([1, 2, 3])})
    dev = cg.run(
        "solo",
        pool,
        splits,
        params={"member": "half"},
        fields=FIELDS,
        split="dev",
        client=ModelClient(None),
        progress=False,
    )
    assert [r["id"] for r in dev.rows()] == [FIRST] and dev.score == 0.0
    with pytest.raises(DatasetError, match=r"no split 'train'; choose one of \['dev', 'test'\]"):
        cg.run(
            "solo",
            pool,
            splits,
            params={"member": "half"},
            fields=FIELDS,
            split="train",
            client=ModelClient(None),
        )


def test_an_audit_takes_a_dataframe_and_overwrite_discards_the_earlier_one(pool, tmp_path):
    out = tmp_path / "audit"
    first = cg.run_audit(
        "majority_vote",
        pool,
        _frame(),
        fields=FIELDS,
        out=out,
        client=ModelClient(None),
        progress=False,
        plots=False,
    )
    assert first.individual == {"right": 1.0, "half": 0.5} and first.dataset == "pandas.DataFrame"
    assert (
        first.scored_by == ["numeric"]
        and "Scorer | numeric (the records' default" in (out / "report.md").read_text()
    )
    # Other data in the same folder is refused, unless the earlier audit is discarded.
    other = _frame().iloc[:2]
    with pytest.raises(ValueError, match="holds a different audit .*pass --overwrite"):
        cg.run_audit(
            "majority_vote",
            pool,
            other,
            fields=FIELDS,
            out=out,
            client=ModelClient(None),
            progress=False,
            plots=False,
        )
    again = cg.run_audit(
        "majority_vote",
        pool,
        other,
        fields=FIELDS,
        out=out,
        overwrite=True,
        client=ModelClient(None),
        progress=False,
        plots=False,
    )
    assert again.n_examples == 2 and again.individual == {"right": 1.0, "half": 0.0}
    # A folder of other things (a user's own files beside, or `out="."`) is never wiped by overwrite.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    with pytest.raises(ValueError, match="no colab-graphs job wrote: not overwritten"):
        cg.run_audit("majority_vote", pool, other, fields=FIELDS, out=mine, overwrite=True,
                     client=ModelClient(None), progress=False, plots=False)  # fmt: skip
    assert (mine / "notes.txt").read_text() == "mine\n"


def test_run_overwrite_is_a_keyword_of_cg_run(pool, tmp_path):
    out = tmp_path / "run"
    cg.run(
        "solo",
        pool,
        _frame(),
        params={"member": "half"},
        fields=FIELDS,
        out=out,
        client=ModelClient(None),
        progress=False,
    )
    again = cg.run(
        "solo",
        pool,
        _frame().iloc[2:],
        params={"member": "half"},
        fields=FIELDS,
        out=out,
        overwrite=True,
        client=ModelClient(None),
        progress=False,
    )
    assert again.score == 1.0
    assert [json.loads(line)["id"] for line in (out / "results.jsonl").read_text().splitlines()] == list(
        GOLD
    )[2:]


def test_the_cli_reads_a_csv_and_an_hf_path_with_field_options(server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from the hub: the paths are read here
    server_pool = write_pool_file(tmp_path / "pool.yaml", server, ["right", "half"])
    csv = tmp_path / "gsm8k.csv"
    _frame().to_csv(csv, index=False)
    options = ["--input-field", "question", "--answer-field", "label", "--id-field", "uid"]
    ran = cli_in_process(
        "run",
        "--protocol",
        "solo",
        "-P",
        "member=half",
        "--pool",
        server_pool,
        "--data",
        csv,
        *options,
        "--out",
        tmp_path / "csv",
        "--no-preflight",
    )
    assert ran.returncode == 0, ran.stderr
    assert "score 0.500 over 4 example(s)" in ran.stdout
    lines = [json.loads(line) for line in (tmp_path / "csv" / "results.jsonl").read_text().splitlines()]
    assert [(line["id"], line["gold"]) for line in lines] == list(GOLD.items())

    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {
            "dev": datasets.Dataset.from_pandas(_frame().iloc[:1]),
            "test": datasets.Dataset.from_pandas(_frame()),
        }
    ).save_to_disk(str(saved))
    audited = cli_in_process(
        "audit",
        "--protocol",
        "majority_vote",
        "--pool",
        server_pool,
        "--data",
        f"hf:{saved}",
        "--split",
        "dev",
        *options,
        "--out",
        tmp_path / "hf",
        "--no-plots",
        "--no-preflight",
    )
    assert audited.returncode == 0, audited.stderr
    report = json.loads((tmp_path / "hf" / "report.json").read_text())
    assert report["n_examples"] == 1 and report["individual"] == {"right": 1.0, "half": 0.0}
    assert report["dataset"] == f"hf:{saved}"


def test_bad_csv_rows_are_named_by_file_line_and_field(tmp_path):
    csv = tmp_path / "bad.csv"
    # Line 3's answer is empty; the quoted question of line 4 spans two lines, so line 6 is the next row,
    # which has a cell too many.
    csv.write_text(
        "uid,question,label\n"
        "1,What is 6 + 1?,7\n"
        "2,What is 2 + 2?,\n"
        '3,"A question\non two lines",4\n'
        "4,What is 3 + 3?,6,extra\n",
        encoding="utf-8",
    )
    refused = cli_in_process(
        "run",
        "--protocol",
        "solo",
        "--data",
        csv,
        "--input-field",
        "question",
        "--answer-field",
        "label",
        "--id-field",
        "uid",
    )
    assert refused.returncode == 2
    said = " ".join(refused.stderr.split())
    assert f"{csv}:3 (id '2'): field 'answer': missing" in said
    assert f"{csv}:6: 4 cells, but the header (line 1) names 3 fields" in said
    assert f"{csv}:4" not in said  # the two-line question is a good row
    wrong_name = cli_in_process("run", "--protocol", "solo", "--data", csv, "--answer-field", "gold")
    assert wrong_name.returncode == 2
    assert (
        f"{csv}: no such field: 'answer' is mapped to 'gold'; its fields: uid, question, label"
        in " ".join(wrong_name.stderr.split())
    )


def test_a_dataframe_with_a_missing_gold_names_its_row():
    frame = _frame().astype({"label": "object"})
    frame.loc[2, "label"] = None
    with pytest.raises(DatasetError, match=r"DataFrame row 2 \(id '\d+'\): field 'answer': missing"):
        cg.run("solo", {"a": {"model": "openai/a", "api_base": "http://127.0.0.1:9"}}, frame, fields=FIELDS)


def test_an_object_that_is_no_dataset_is_refused_with_what_is_accepted():
    with pytest.raises(DatasetError, match="cannot load examples from a set: pass a datasets.Dataset"):
        cg.run("solo", {"a": {"model": "openai/a", "api_base": "http://127.0.0.1:9"}}, {"What is 2 + 2?"})


def test_a_study_reads_a_csv_beside_its_file_with_fields(server, tmp_path):
    _frame().to_csv(tmp_path / "gsm8k.csv", index=False)
    models = {
        m: {"model": f"openai/{m}", "api_base": server.base_url, "api_key": "sk-test"}
        for m in ("right", "half")
    }
    (tmp_path / "study.yaml").write_text(
        json.dumps(
            {
                "pools": {"P": {"models": models}},
                "protocols": ["majority_vote"],
                "datasets": [{"source": "gsm8k.csv", "fields": FIELDS}],
            }
        )
    )
    done = cli_in_process(
        "study",
        "--config",
        tmp_path / "study.yaml",
        "--out",
        tmp_path / "out",
        "--no-plots",
        "--no-preflight",
    )
    assert done.returncode == 0, done.stderr
    study = json.loads((tmp_path / "out" / "study.json").read_text())
    assert study["datasets"][0]["n_examples"] == 4 and study["settings"][0]["individual"] == {
        "right": 1.0,
        "half": 0.5,
    }
    bad = tmp_path / "bad.yaml"
    bad.write_text((tmp_path / "study.yaml").read_text().replace('"uid"', '"nope"'))
    refused = cli_in_process("study", "--config", bad, "--out", tmp_path / "bad", "--no-preflight")
    assert refused.returncode == 2 and "no such field: 'id' is mapped to 'nope'" in " ".join(
        refused.stderr.split()
    )


def test_fields_take_an_inspect_ai_style_field_spec(pool):
    # inspect_ai's FieldSpec as inspect_ai defines it (not installed here: a dataclass of its shape and
    # defaults): id, choices and target default to their own names and are optional there, so a frame with
    # no "id" or "choices" column is taken, its ids made from the row numbers.
    from dataclasses import dataclass

    @dataclass
    class FieldSpec:
        input: str = "input"
        target: str = "target"
        choices: str = "choices"
        id: str = "id"
        metadata: list[str] | None = None

    def run(spec, frame):
        return cg.run(
            "solo",
            pool,
            frame,
            params={"member": "right"},
            fields=spec,
            client=ModelClient(None),
            progress=False,
        )

    result = run(FieldSpec(input="question", target="label", id="uid"), _frame())
    assert [(r["id"], r["gold"]) for r in result.rows()] == list(GOLD.items()) and result.score == 1.0
    no_ids = run(FieldSpec(input="question", target="label"), _frame().drop(columns=["uid"]))
    assert [r["gold"] for r in no_ids.rows()] == list(GOLD.values()) and no_ids.score == 1.0


def test_a_csv_header_with_empty_trailing_columns_is_read(pool, tmp_path):
    """Spreadsheet exports end their header in empty names ("question,answer,,"): their cells are dropped."""
    import csv

    path = tmp_path / "export.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["uid", "question", "label", "", ""])
        writer.writerows([i, q, a, "", ""] for i, q, a in _frame().itertuples(index=False))
    result = cg.run("solo", pool, path, params={"member": "right"}, fields=FIELDS, client=ModelClient(None),
                    progress=False)  # fmt: skip
    assert result.score == 1.0 and len(result.rows()) == len(_frame())
