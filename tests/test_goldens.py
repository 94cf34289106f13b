"""No behaviour changes: real CLI jobs give the report.json, summary.json and study.json stored in
`tests/goldens/`, byte for byte once what legitimately varies is normalised (times, temporary paths, the
scripted server's port, versions).

The jobs run in process (`cli_in_process`) against a scripted server whose members solve the built-in
arithmetic task with fixed accuracies: an exact audit, a sampled audit, a study (two pools, two datasets) and a
run on the embedded data. Regenerate the goldens (only for an intended change of an output, said in the
commit) with `COLAB_GRAPHS_REGEN_GOLDENS=1 pytest tests/test_goldens.py`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import cli_in_process

from colab_graphs.testing import ScriptedServer
from colab_graphs.testing.scripts import arithmetic_solver

pytestmark = pytest.mark.integration

GOLDENS = Path(__file__).parent / "goldens"
REGEN = os.environ.get("COLAB_GRAPHS_REGEN_GOLDENS") == "1"
MEMBERS = {"a": 0.9, "b": 0.6, "c": 0.4, "d": 0.7}
# Keys whose values are clocks, durations or versions: the only fields allowed to differ between two runs.
VARYING = re.compile(
    r"(^|_)(s|ms|seconds|secs|latency|wall|elapsed|time|timestamp|started|finished|created|updated|at|"
    r"date|when|version|versions|python|platform|host|pid)$"
)


def normalise(value: Any, swaps: dict[str, str], key: str = "") -> Any:
    if key and VARYING.search(key) and key != "schema_version":
        return "<varies>"
    if isinstance(value, dict):
        return {k: normalise(v, swaps, k) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, swaps) for v in value]
    if isinstance(value, str):
        for old, new in swaps.items():
            value = value.replace(old, new)
    return value


def check(name: str, path: Path, swaps: dict[str, str]) -> None:
    text = json.dumps(normalise(json.loads(path.read_text()), swaps), indent=1, sort_keys=True) + "\n"
    golden = GOLDENS / name
    if REGEN:
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: run with COLAB_GRAPHS_REGEN_GOLDENS=1"
    assert text == golden.read_text(), f"{name} differs from its golden"


@pytest.fixture(scope="module")
def server():
    scripts = {m: arithmetic_solver(accuracy=p, seed=i) for i, (m, p) in enumerate(MEMBERS.items())}
    with ScriptedServer(scripts) as live:
        yield live


def pool_file(folder: Path, server: ScriptedServer, names=tuple(MEMBERS)) -> Path:
    path = folder / "pool.yaml"
    models = {m: {"model": f"openai/{m}", "api_base": server.base_url, "api_key": "sk-test"} for m in names}
    path.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    return path


def swaps_for(tmp_path: Path, server: ScriptedServer) -> dict[str, str]:
    return {server.base_url: "<server>", str(tmp_path): "<tmp>"}


def audit(tmp_path: Path, server: ScriptedServer, *extra: str) -> Path:
    pool = pool_file(tmp_path, server)
    out = tmp_path / "out"
    done = cli_in_process(
        "audit", "--protocol", "majority_vote", "--pool", pool, "--data", "builtin:arithmetic",
        "--limit", "6", "--cache-dir", tmp_path / "cache", "--out", out, "--no-plots", *extra,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out / "report.json"


def test_an_exact_audit_gives_the_golden_report(tmp_path, server):
    report = audit(tmp_path, server, "--method", "exact")
    check("audit_exact.report.json", report, swaps_for(tmp_path, server))


def test_a_sampled_audit_gives_the_golden_report(tmp_path, server):
    sampled = ("--method", "sampled", "--budget", "16", "--budget-unit", "permutations", "--seed", "3")
    report = audit(tmp_path, server, *sampled, "--play-every-coalition")
    check("audit_sampled.report.json", report, swaps_for(tmp_path, server))


def test_a_run_on_the_embedded_data_gives_the_golden_summary(tmp_path, server):
    pool = pool_file(tmp_path, server)
    out = tmp_path / "out"
    done = cli_in_process(
        "run", "--protocol", "majority_vote", "--pool", pool, "--data", "builtin:arithmetic",
        "--limit", "5", "--cache-dir", tmp_path / "cache", "--out", out,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    check("run.summary.json", out / "summary.json", swaps_for(tmp_path, server))


def test_a_study_gives_the_golden_study(tmp_path, server):
    pool_file(tmp_path, server)
    two = {m: {"model": f"openai/{m}", "api_base": server.base_url, "api_key": "sk-test"} for m in ("b", "c")}
    study = {
        "pools": {"P1": "pool.yaml", "P2": {"models": two}},
        "protocols": ["majority_vote"],
        "datasets": ["builtin:arithmetic", "builtin:word_problems"],
        "limit": 4,
        "method": "loo",
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    out = tmp_path / "out"
    done = cli_in_process(
        "study", "--config", tmp_path / "study.yaml", "--out", out, "--cache-dir", tmp_path / "cache"
    )
    assert done.returncode == 0, done.stderr
    check("study.study.json", out / "study.json", swaps_for(tmp_path, server))
