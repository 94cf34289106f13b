"""`bench/crl_team_parallel.py`: a study's trainings as one process per (arm, seed), merged into one study
folder that the pick report reads and packs like any other (the GPU study, bench/results/crl_brief_gpu, was
made this way)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import crl_team_parallel as parallel  # noqa: E402

TINY = [
    "--settings", "pick_brief", "--steps", "1", "--prompts", "1", "--eval-size", "3", "--train-size", "6",
    "--tokens", "4", "--lr", "1e-3", "--lr-schedule", "constant", "--temperature", "1.0", "--save-steps", "1",
]  # fmt: skip


def test_jobs_name_an_arm_and_its_seeds() -> None:
    assert parallel.parse_job("uniform:0-2") == [("uniform", 0), ("uniform", 1), ("uniform", 2)]
    assert parallel.parse_job("sft:0,3") == [("sft", 0), ("sft", 3)]
    for bad in ("uniform", "uniform:", ":0", "uniform:a-b"):
        with pytest.raises(argparse.ArgumentTypeError):
            parallel.parse_job(bad)
    with pytest.raises(SystemExit, match="--seeds: set by crl_team_parallel.py"):
        parallel.main(["--out", "x", "--jobs", "own:0", "--", "--seeds", "1"])


def test_two_parts_run_at_once_and_merge_into_a_study_the_report_packs(tmp_path: Path) -> None:
    import crl_team_pick_report as pick_report
    import crl_team_report as report

    out = tmp_path / "par"
    parallel.main(["--out", str(out), "--jobs", "control:0", "own:0", "--", *TINY])
    study = out / "study"
    merged = json.loads((study / "merge.json").read_text())
    assert [(p["part"], p["rc"], p["stopped_at_deadline"]) for p in merged["parts"]] == [
        ("control-0", 0, False),
        ("own-0", 0, False),
    ]
    assert sorted(merged["trainings_finished"]) == ["pick_brief-control-0", "pick_brief-own-0"]
    manifest = json.loads((study / "manifest.json").read_text())
    assert manifest["arms"] == ["before", "control", "own"] and manifest["seeds"] == [0]
    assert manifest["device"] == "cpu" and len(manifest["part_commands"]) == 2
    assert len(manifest["processes"]) == 2  # each part's own process, with its commit and tree state
    # Every part drew the same questions; the merged study holds them once.
    for part in ("control-0", "own-0"):
        assert (out / "parts" / part / "data" / "eval.jsonl").read_bytes() == (
            study / "data" / "eval.jsonl"
        ).read_bytes()
    pack = tmp_path / "pack"
    pick_report.main([str(study), "--pack", str(pack)])
    summary, text = pick_report.build(pack)
    assert set(summary["arms"]) == {"before", "control", "own"}
    rows = report.read_rows(pack)
    assert {(r["arm"], r["eval"]) for r in rows} >= {
        ("control", "audit"),
        ("own", "audit"),
        ("before", "audit"),
    }
    assert "(all 2 trainings at once, 1 CPU thread each; x86_64" in text  # the cost line says how it ran

    # A part that drew other questions is refused, not merged.
    eval_file = out / "parts" / "own-0" / "data" / "eval.jsonl"
    eval_file.write_text(eval_file.read_text().splitlines(keepends=True)[0] * 2)
    shutil.rmtree(study)
    with pytest.raises(SystemExit, match="data/eval.jsonl: the parts drew different questions"):
        parallel.merge(out, merged["parts"])


def test_parts_stopped_at_the_deadline_are_not_merged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "late"
    # A deadline already passed: the part is stopped as soon as it has started, before it writes anything.
    with pytest.raises(SystemExit, match="no part wrote a manifest"):
        parallel.main(["--out", str(out), "--jobs", "own:0", "--deadline-s", "0", "--", *TINY])
    outcome = json.loads(next(x for x in capsys.readouterr().out.splitlines() if '"part"' in x))
    assert outcome["part"] == "own-0" and outcome["stopped_at_deadline"] and outcome["rc"] != 0
    assert (out / "logs" / "own-0.log").exists() and not (out / "study" / "merge.json").exists()


def test_a_cuda_study_is_refused_where_torch_sees_no_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import crl_team
    import torch

    assert crl_team.DEVICE == "cpu"
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setattr(sys, "argv", ["crl_team.py", "--out", str(tmp_path), *TINY, "--device", "cuda"])
    with pytest.raises(SystemExit, match="--device cuda: torch sees no CUDA device"):
        crl_team.main()
    assert crl_team.DEVICE == "cpu"  # a refused study leaves the process's device as it was
