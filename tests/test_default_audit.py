"""README's main job, `colab-graphs audit` of the embedded default (three SmolLM2-135M members on 12 arithmetic
questions), from an empty call cache: the numbers README shows, unchanged by anything that makes it faster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "bench" / "results" / "default_audit" / "report.json"
# What the audit found (not when, how fast, or which calls a cache served): every coalition's value, each
# member's individual / leave-one-out / Shapley value with its interval and rank, and each coalition's calls and
# tokens (530 completion tokens in all: the 36 replies, token for token).
VALUES = ["coalitions", "individual", "loo", "shapley", "ci", "ranks", "rank_correlation", "per_coalition"]


@pytest.mark.slow
def test_the_default_audit_gives_the_values_readme_shows(tmp_path) -> None:
    """The shipped report (`bench/first_audit.py`) was made through LiteLLM's provider, in two batches; this run
    answers in process without LiteLLM, in one batch that grows as calls arrive, and must find the same."""
    command = [sys.executable, "-m", "colab_graphs.cli.app", "audit", "--method", "exact", "--no-plots",
               "--out", str(tmp_path / "audit"), "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "audit" / "report.json").read_text())
    shipped = json.loads(SHIPPED.read_text())
    assert report["calls"]["unique"] == 36 and report["calls"]["failed"] == 0
    assert {key: report[key] for key in VALUES} == {key: shipped[key] for key in VALUES}
