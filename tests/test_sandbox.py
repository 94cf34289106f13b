"""The code sandbox against the attacks generated code can make: each must fail and leave the host unharmed."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from colab_graphs.data.example import Example
from colab_graphs.data.loaders import DatasetError, load_examples
from colab_graphs.data.scoring import apply_scorer, get_scorer
from colab_graphs.sandbox.runner import arun_code, run_code

FULL_ISOLATION = {
    "netns",
    "ipcns",
    "pidns",
    "nested_pidns",
    "mountns",
    "private_root",
    "readonly_fs",
    "disk_cap",
}


def _machine_allows_namespaces() -> bool:
    """Whether this machine lets us create net, pid and mount namespaces, asked of `unshare` itself.

    Never asked of the sandbox: a sandbox that stopped requesting a namespace would then turn the isolation
    tests into skips. Probed here, a machine that allows namespaces runs them, and a sandbox that fails to
    use them fails them.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    as_root = [] if os.geteuid() == 0 else ["--map-root-user"]
    probe = [unshare, *as_root, "--net", "--ipc", "--mount", "--pid", "--fork", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


NAMESPACES_ALLOWED = _machine_allows_namespaces()
requires_namespaces = pytest.mark.skipif(
    not NAMESPACES_ALLOWED, reason="`unshare --net --ipc --mount --pid` fails on this machine"
)


def host_segment(key: int) -> int | None:
    """The id of the host's SysV shared-memory segment with this key (None: there is none)."""
    for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[0]) == key:
            return int(fields[1])
    return None


class Listener:
    """A host server on one address that answers b'ok' to every connection and counts them."""

    def __init__(self, family: int, address: object) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)  # type: ignore[arg-type]
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            with conn:
                conn.sendall(b"ok")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def processes_of_uids_at_least(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid >= uid:
                    pids.append(int(entry.name))
            except FileNotFoundError:
                continue
    return pids


@requires_namespaces
def test_every_namespace_the_machine_allows_is_applied():
    assert set(run_code("pass").isolation) >= FULL_ISOLATION


def test_clean_program_passes_and_its_output_comes_back():
    result = run_code("print(6 * 7)")
    assert result.passed and result.returncode == 0
    assert result.stdout == "42\n"
    assert {"workdir", "empty_env", "rlimits"} <= set(result.isolation)


def test_raising_program_fails_with_the_traceback_in_stderr():
    result = run_code("assert 1 == 2, 'wrong answer'")
    assert not result.passed
    assert "AssertionError: wrong answer" in result.stderr


def test_infinite_loop_is_killed_at_the_wall_clock_limit():
    start = time.monotonic()
    result = run_code("while True:\n    pass", timeout_s=1.5)
    elapsed = time.monotonic() - start
    assert not result.passed and result.timed_out
    assert result.killed_reason == "timeout"
    assert elapsed < 1.5 + 2.0


def test_sleeping_program_is_bounded_by_wall_clock_not_cpu_time():
    result = run_code("import time\ntime.sleep(60)", timeout_s=1)
    assert result.timed_out and result.wall_s < 3


def test_cpu_limit_stops_a_busy_loop_before_the_wall_clock_does():
    result = run_code("while True:\n    pass", timeout_s=20, cpu_s=1)
    assert not result.passed and not result.timed_out
    assert result.killed_reason == "cpu_limit"


@pytest.mark.skipif(os.geteuid() != 0, reason="checks the per-run uid, which only a root parent assigns")
def test_fork_bomb_is_contained_and_the_host_can_still_spawn_processes():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = run_code(bomb, timeout_s=2, max_procs=16)
    assert not result.passed and result.timed_out
    assert subprocess.run(["true"], check=False).returncode == 0
    deadline = time.monotonic() + 3
    while processes_of_uids_at_least(61000) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_of_uids_at_least(61000) == []


@requires_namespaces
def test_process_that_leaves_the_group_dies_with_the_run():
    escape = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
    result = run_code(escape, timeout_s=5)
    assert result.passed
    time.sleep(1)
    assert processes_of_uids_at_least(61000) == []


def test_memory_bomb_fails_without_touching_host_memory():
    # Run the sandbox from a fresh interpreter: RUSAGE_CHILDREN of this test process would also count every
    # earlier child of the suite (CLI subprocesses loading torch), not just the sandboxed code.
    probe = (
        "import json, resource\n"
        "from colab_graphs.sandbox.runner import run_code\n"
        "r = run_code(\"block = bytearray(6 * 1024**3)\\nprint('allocated')\", memory_mb=512)\n"
        "print(json.dumps({'passed': r.passed, 'stdout': r.stdout, 'reason': r.killed_reason,\n"
        "                  'peak_mib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not result["passed"]
    assert "allocated" not in result["stdout"]
    assert result["reason"] == "memory_limit"
    assert result["peak_mib"] < 1024


@pytest.mark.parametrize("target", ["/root", "/work", "/var/tmp"])
def test_writing_outside_the_work_directory_fails(target):
    if not Path(target).is_dir():
        pytest.skip(f"{target} does not exist here")
    marker = Path(target) / f"cg_marker_{uuid.uuid4().hex}"
    result = run_code(f"open({str(marker)!r}, 'w').write('escaped')")
    assert not result.passed
    assert not marker.exists()


@requires_namespaces
def test_the_sandbox_tmp_is_its_own_and_nothing_written_there_reaches_the_host():
    marker = Path("/tmp") / f"cg_marker_{uuid.uuid4().hex}"
    result = run_code(f"open({str(marker)!r}, 'w').write('contained')\nprint(open({str(marker)!r}).read())")
    assert result.stdout == "contained\n"
    assert not marker.exists()


def test_work_directory_is_writable_and_leaves_nothing_behind():
    name = f"notes-{uuid.uuid4().hex}.txt"
    result = run_code(f"import os\nopen({name!r}, 'w').write('x')\nprint(os.getcwd())")
    assert result.passed
    workdir = Path(result.stdout.strip())
    assert not (workdir / name).exists()


def test_parent_secrets_never_reach_the_code(monkeypatch):
    secret = "sk-secret-" + uuid.uuid4().hex
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    snoop = (
        "import glob, os\n"
        "print(dict(os.environ))\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        print(path, open(path, 'rb').read())\n"
        "    except OSError as exc:\n"
        "        print(path, exc)\n"
        f"print(open('/proc/{os.getpid()}/environ', 'rb').read())\n"
    )
    result = run_code(snoop)
    assert secret not in result.stdout and secret not in result.stderr
    assert "OPENAI_API_KEY" not in result.stdout


@requires_namespaces
def test_network_connection_to_a_local_listener_fails():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        result = run_code(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('connected')"
        )
    assert not result.passed
    assert "connected" not in result.stdout


@requires_namespaces
def test_code_scorer_candidate_cannot_reach_a_listening_local_server():
    leak = "def leak():\n    import socket\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        task = Example(id="net", input="Write leak().", test="leak()", entry_point="leak")
        reply = f"Here it is:\n```python\n{leak.format(port=port)}```"
        assert _score_all([reply], [task]) == [0.0]
        with pytest.raises(BlockingIOError):  # nothing connected, not even briefly: the backlog is empty
            server.accept()
        # The same code with the network allowed does connect: the scorer's 0 is the sandbox's doing.
        assert run_code(leak.format(port=port) + "leak()\n", network=True).passed
        server.accept()[0].close()


@requires_namespaces
@pytest.mark.parametrize("kind", ["in /tmp, mode 666", "abstract"])
def test_a_unix_socket_of_the_host_is_unreachable(kind):
    name = f"cg-host-{uuid.uuid4().hex[:12]}"
    address = f"/tmp/{name}.sock" if kind.startswith("in /tmp") else f"\0{name}"
    listener = Listener(socket.AF_UNIX, address)
    try:
        if kind.startswith("in /tmp"):
            os.chmod(address, 0o666)
        reach = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(2)\ns.connect({address!r})\n"
        result = run_code(reach + "print(s.recv(2))")
    finally:
        listener.close()
        if kind.startswith("in /tmp"):
            os.unlink(address)
    assert not result.passed
    assert listener.accepted == 0


@requires_namespaces
def test_sysv_shared_memory_dies_with_the_run_and_no_later_run_sees_it():
    key = int.from_bytes(os.urandom(3), "big") + 0x100000
    shm = "import ctypes\nshmget = ctypes.CDLL(None).shmget\n"
    made = run_code(shm + f"assert shmget({key}, 1 << 20, 0o1666) >= 0\nassert shmget({key}, 0, 0) >= 0\n")
    assert made.passed, made.stderr
    assert host_segment(key) is None
    assert run_code(shm + f"assert shmget({key}, 0, 0) < 0\n").passed


@requires_namespaces
def test_the_work_directory_is_capped_in_total_not_only_per_file():
    fill = (
        "written = 0\ntry:\n    for i in range(40):\n        with open(f'chunk{i}', 'wb') as fh:\n"
        "            fh.write(b'x' * (32 * 1024 * 1024))\n        written += 32 * 1024 * 1024\n"
        "except OSError as exc:\n    print(exc.strerror)\nprint(written // 1024 // 1024)\n"
    )
    result = run_code(fill, disk_mb=128, timeout_s=30)
    error, written_mib = result.stdout.splitlines()
    assert error == "No space left on device"
    assert int(written_mib) <= 128


def test_network_can_be_allowed_explicitly():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        result = run_code(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)", network=True
        )
    assert result.passed


def test_output_flood_is_capped_and_the_host_keeps_reading():
    flood = "import sys\nfor _ in range(2000):\n    sys.stdout.write('x' * 10000)\n"
    result = run_code(flood, max_output_bytes=5000, timeout_s=10)
    assert len(result.stdout) == 5000
    assert result.output_truncated
    assert result.passed


def test_large_file_in_the_work_directory_hits_the_file_size_limit():
    result = run_code("open('big', 'wb').write(b'x' * (200 * 1024**2))")
    assert not result.passed
    assert "File too large" in result.stderr or result.killed_reason == "file_size_limit"


def test_stdin_reaches_the_program():
    assert run_code("print(input()[::-1])", stdin="abc\n").stdout == "cba\n"


def test_parallel_runs_all_complete_and_overlap():
    async def many() -> list:
        return await asyncio.gather(
            *[arun_code("import time\ntime.sleep(0.5)\nprint('ok')") for _ in range(4)]
        )

    start = time.monotonic()
    results = asyncio.run(many())
    elapsed = time.monotonic() - start
    assert all(r.passed and r.stdout == "ok\n" for r in results)
    assert elapsed < 4 * (0.5 + 0.4)


def _humaneval(n: int) -> list:
    try:
        return load_examples("humaneval", limit=n)
    except DatasetError as exc:
        pytest.skip(str(exc))


def _score_all(outputs: list[str], examples: list) -> list[float]:
    code = get_scorer("code")

    async def score() -> list:
        return await asyncio.gather(
            *[apply_scorer(code, o, e) for o, e in zip(outputs, examples, strict=True)]
        )

    return [s.value for s in asyncio.run(score())]


def test_canonical_humaneval_solutions_pass():
    problems = _humaneval(6)
    outputs = [f"```python\n{p.fields['prompt']}{p.fields['canonical_solution']}```" for p in problems]
    assert _score_all(outputs, problems) == [1.0] * len(problems)


def test_wrong_humaneval_solutions_fail():
    problems = _humaneval(6)
    outputs = [f"```python\n{p.fields['prompt']}    return None\n```" for p in problems]
    assert _score_all(outputs, problems) == [0.0] * len(problems)


# --- the judge decides in every mode -------------------------------------------------------------------------

VERDICT_CASES = {
    "right": ("def add(a, b):\n    return a + b\n", True),
    "wrong": ("def add(a, b):\n    return 0\n", False),
    "always_equal": ("class Y:\n    __eq__ = lambda s, o: True\ndef add(a, b):\n    return Y()\n", False),
    "exec_patched": (
        "import builtins\nbuiltins.exec = lambda *a: None\ndef add(a, b):\n    return 0\n",
        False,
    ),
}
ADD_TEST = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"


def test_without_namespaces_the_judge_still_decides(monkeypatch):
    from colab_graphs.sandbox import runner as sandbox
    from colab_graphs.sandbox.code_tests import run_tests

    monkeypatch.setattr(sandbox, "_usable_namespaces", lambda wanted: ([], []))
    verdicts = {name: run_tests(code, ADD_TEST) for name, (code, _) in VERDICT_CASES.items()}
    assert {name: v.passed for name, v in verdicts.items()} == {
        n: want for n, (_, want) in VERDICT_CASES.items()
    }
    assert not {"netns", "private_root"} & set(verdicts["right"].isolation)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists(),
    reason="runs the sandbox as an unprivileged user, which needs root to switch to",
)
def test_an_unprivileged_caller_gets_the_private_root_and_the_judge_in_a_user_namespace():
    # The caller is `nobody` with the system interpreter: the package's other modules need the venv, so the
    # sandbox module is loaded by path (it needs only the standard library).
    data = Path(__file__).resolve().parents[1] / "colab_graphs" / "data"
    if not all(os.access(p, os.R_OK) for p in (data / "sandbox.py", data / "code_harness.py")) or not (
        Path(data).stat().st_mode & 0o005
    ):
        pytest.skip("the package is not readable by an unprivileged user here")
    request = {"test": ADD_TEST, "question": [], "entry_point": "add", "from_solution": ["add"]}
    request |= {"call_check": False, "bind_candidate": False, "timeout_s": 10, "call_timeout_s": None}
    script = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('sandbox', {str(data / 'sandbox.py')!r})\n"
        "sandbox = importlib.util.module_from_spec(spec)\nsys.modules['sandbox'] = sandbox\n"
        "spec.loader.exec_module(sandbox)\n"
        f"harness = open({str(data / 'code_harness.py')!r}).read()\n"
        f"cases = {json.dumps({n: c for n, (c, _) in VERDICT_CASES.items()})}\n"
        f"request = {request!r}\n"
        "runs = {n: sandbox.run_judged(c, harness, request) for n, c in cases.items()}\n"
        "print(json.dumps({n: [(r.verdict or {}).get('passed'), r.isolation] for n, r in runs.items()}))\n"
    )
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script]
    done = subprocess.run(
        nobody, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"}, cwd="/"
    )
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    assert {n: passed for n, (passed, _) in runs.items()} == {
        n: want for n, (_, want) in VERDICT_CASES.items()
    }
    if NAMESPACES_ALLOWED:
        assert {"private_root", "nested_pidns", "netns", "ipcns"} <= set(runs["right"][1])
        assert (
            "uid_drop" not in runs["right"][1]
        )  # one uid in the user namespace: capabilities dropped instead
