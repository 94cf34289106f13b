"""bench/gpu_check.py, the GPU check for a machine with only PyTorch and transformers, runs through on CPU.

`--dry-run --bare`: CPU, the tiny shape, a few tokens, with TRL, LiteLLM and LangGraph refused at import as
on that machine. tests/test_trainer.py checks that its update is the trainer's loss and gradient.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_runs_through_on_cpu_without_trl_litellm_or_langgraph(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "gpu_check.py"),
        "--dry-run",
        "--bare",
        "--out",
        str(tmp_path),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    tiny = report["shapes"]["tiny"]
    assert tiny["generation"]["new_tokens"] > 0 and tiny["generation"]["tokens_per_s"] > 0
    assert tiny["generation"]["seeded_rows_repeat_in_half_batches"] == "8/8"
    assert [s["tokens_per_s"] > 0 for s in tiny["update"]["steps"]] == [True, True]
    assert tiny["update"]["rollout_vs_update_logprob_gap"]["max"] < 1e-4  # fp32 both ways on CPU
    assert "not installed" in report["real_trainer"]["skipped"]
