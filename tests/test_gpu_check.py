"""bench/gpu_check.py, the GPU check for a machine with only PyTorch and transformers, runs through on CPU.

`--dry-run --bare`: CPU, every shape (135M, 0.5B, 1.5B, 7B) shrunk to the tiny widths with its own
architecture and embeddings, a few tokens, LoRA, beta > 0 and two passes per generation batch, with TRL,
LiteLLM and LangGraph refused at import as on that machine. tests/test_trainer.py checks that its update with
beta 0 and one pass is the trainer's loss and gradient. bench/gpu_crl.py's memory estimate runs there too.
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
    # a shared 2-core machine at load 25 gives this process a few percent of a core: minutes of wall time
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(report["shapes"]) == ["tiny", "smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"]
    for name, shape in report["shapes"].items():
        assert shape["generation"]["new_tokens"] > 0 and shape["generation"]["tokens_per_s"] > 0, name
        assert shape["generation"]["seeded_rows_repeat_in_half_batches"] == "8/8", name
        update = shape["update"]
        assert (update["trained"], update["beta"], update["iterations"]) == ("LoRA r=16", 0.04, 2), name
        steps = update["steps"]
        assert [s["tokens_per_s"] > 0 for s in steps] == [True, True], name
        # beta > 0: the reference (adapter disabled) is the start, so the KL grows as the adapter trains;
        # two passes: the second is taken against the old log-probs, and the policy moved off them
        assert 0 < steps[0]["kl"] < steps[1]["kl"], name
        assert all(s["ratio_max_abs_log"] > 0 for s in steps), name
        assert update["rollout_vs_update_logprob_gap"]["max"] < 1e-4, name  # fp32 both ways on CPU
    assert "not installed" in report["real_trainer"]["skipped"]


def test_the_gpu_memory_estimate_reads_no_hub_and_needs_only_torch() -> None:
    """`bench/gpu_crl.py --estimate-only` for the 7B shape with TRL, LiteLLM and LangGraph refused at import
    (as on the GPU machine) and the hub offline: the estimate comes from bench/gpu_check.py's shapes."""
    code = (
        "import sys, runpy; sys.path.insert(0, 'bench'); import gpu_check;"
        "sys.meta_path.insert(0, gpu_check._Refuse());"
        "sys.argv = ['gpu_crl.py', '--policy', 'qwen2.5-7b', '--collaborator', 'a=x@http://h:1/v1', '--estimate-only'];"
        "runpy.run_path('bench/gpu_crl.py', run_name='__main__')"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "memory estimate (GiB): weights 28.4" in proc.stdout  # 7.6 B fp32 weights, untied embeddings
