"""The code sandbox against the attacks generated code can make: each must fail and leave the host unharmed."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from colab_graphs.sandbox.runner import arun_code, run_code
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.loaders import DatasetError, load_examples
from colab_graphs.tasks.scoring import apply_scorer, get_scorer
from tests import plain_user

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


def _landlock_abi() -> int:
    """The kernel's Landlock ABI, asked of the kernel itself (never of the sandbox: see above)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return max(int(libc.syscall(444, None, 0, 1)), 0)


LANDLOCK_ABI = _landlock_abi()
# The landlock backend's minimum: ABI 3 as root, 6 for a non-root caller (see `runner._LANDLOCK_MIN_ABI`).
LANDLOCK_USABLE = (3 if os.geteuid() == 0 else 6) <= LANDLOCK_ABI
requires_landlock = pytest.mark.skipif(
    not LANDLOCK_USABLE, reason=f"this kernel's Landlock ABI is {LANDLOCK_ABI}"
)
# Each threat below is tried against each safe backend the machine has (the namespaces backend, and the
# landlock backend, which needs no namespaces).
SAFE_BACKENDS = [
    pytest.param("namespaces", marks=requires_namespaces),
    pytest.param("landlock", marks=requires_landlock),
]
CONTAINER = [sys.executable, "-m", "colab_graphs.testing.container"]
REPO = Path(__file__).resolve().parents[1]


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
    """The processes of the sandbox's run uids from `uid` up (its pool: 512 uids; not `nobody`, 65534, which
    may be the caller)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if uid <= entry.stat().st_uid < uid + 512:
                    pids.append(int(entry.name))
            except FileNotFoundError:
                continue
    return pids


@requires_namespaces
def test_every_namespace_the_machine_allows_is_applied():
    result = run_code("pass", backend="namespaces")
    assert set(result.isolation) >= FULL_ISOLATION
    assert result.backend == "namespaces"


@requires_landlock
def test_the_landlock_backend_applies_landlock_seccomp_and_the_sweep():
    result = run_code("pass", backend="landlock")
    expected = {"landlock_fs", f"landlock_abi_{LANDLOCK_ABI}", "seccomp", "sweep", "empty_env", "rlimits"}
    expected |= {"landlock_tcp"} if LANDLOCK_ABI >= 4 else set()
    expected |= {"landlock_scopes"} if LANDLOCK_ABI >= 6 else set()
    assert expected <= set(result.isolation)
    assert not {"netns", "private_root"} & set(result.isolation)
    assert result.backend == "landlock"


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
@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_fork_bomb_is_contained_and_the_host_can_still_spawn_processes(backend):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = run_code(bomb, timeout_s=2, max_procs=16, backend=backend)
    assert not result.passed and result.timed_out
    assert subprocess.run(["true"], check=False).returncode == 0
    deadline = time.monotonic() + 3
    while processes_of_uids_at_least(61000) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_of_uids_at_least(61000) == []


def processes_running(marker: str) -> list[int]:
    """The processes whose command line holds `marker` (one that a test's sandboxed code exec'd)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _daemon(marker: str) -> str:
    """Code that leaves a `setsid` daemon behind (a double fork: its parent exits, so it is nobody's child);
    where `setsid` is refused (landlock's seccomp) the daemon stays in the program's group, still orphaned."""
    return (
        "import os\nif os.fork() == 0:\n    try:\n        os.setsid()\n    except OSError:\n        pass\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', ['sleep', {marker!r}])\n    os._exit(0)\nos.wait()\n"
    )


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_a_setsid_daemon_dies_with_the_run(backend):
    marker = f"{3000 + int.from_bytes(os.urandom(2), 'big') % 1000}.{uuid.uuid4().int % 10**6}"
    result = run_code(_daemon(marker) + "import time\ntime.sleep(0.5)\n", timeout_s=5, backend=backend)
    assert result.passed, result.stderr
    assert processes_running(marker) == []


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_a_daemon_left_at_the_time_limit_dies_too(backend):
    marker = f"{3000 + int.from_bytes(os.urandom(2), 'big') % 1000}.{uuid.uuid4().int % 10**6}"
    result = run_code(_daemon(marker) + "while True:\n    pass\n", timeout_s=1.5, backend=backend)
    assert result.timed_out
    assert processes_running(marker) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="uids are handed out (and reused) only by a root scorer")
@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_a_daemon_of_one_run_cannot_touch_the_next_run_that_gets_its_uid(backend):
    from colab_graphs.sandbox.code_tests import run_tests

    # The daemon kills every process its uid may signal, for as long as it lives; the next run reuses the
    # uid (the pool hands out the lowest free one) and must still pass.
    marker = f"cg-killer-{uuid.uuid4().hex}"
    loop = "import os, signal, time\nwhile True:\n    try:\n        os.kill(-1, signal.SIGKILL)\n    except OSError:\n        pass\n    time.sleep(0.01)\n"
    killer = (
        "import os, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', {loop!r}, {marker!r}])\n    os._exit(0)\n"
        "def add(a, b):\n    return a + b\n"
    )
    run_tests(killer, ADD_TEST, sandbox=backend)  # its daemon kills it too: only what it leaves matters
    assert processes_running(marker) == []
    second = run_tests("def add(a, b):\n    return a + b\n", ADD_TEST, sandbox=backend)
    assert second.passed, second.reason


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_memory_bomb_fails_without_touching_host_memory(backend):
    # Run the sandbox from a fresh interpreter: RUSAGE_CHILDREN of this test process would also count every
    # earlier child of the suite (CLI subprocesses loading torch), not just the sandboxed code.
    probe = (
        "import json, resource\n"
        "from colab_graphs.sandbox.runner import run_code\n"
        "r = run_code(\"block = bytearray(6 * 1024**3)\\nprint('allocated')\", memory_mb=512,\n"
        f"             backend={backend!r})\n"
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


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
@pytest.mark.parametrize("target", ["/root", "/work", "/var/tmp", "/dev/shm"])
def test_writing_outside_the_work_directory_fails(target, backend):
    if not Path(target).is_dir():
        pytest.skip(f"{target} does not exist here")
    marker = Path(target) / f"cg_marker_{uuid.uuid4().hex}"
    result = run_code(f"open({str(marker)!r}, 'w').write('escaped')", backend=backend)
    assert not os.path.lexists(
        marker
    )  # (False too where the caller itself cannot look: /root as a plain user)
    if (backend, target) != ("namespaces", "/dev/shm"):  # there a /dev/shm of the run's own (16 MiB)
        assert not result.passed


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_host_files_the_data_file_and_the_test_file_are_unreadable(backend, tmp_path):
    from colab_graphs.sandbox.code_tests import run_tests

    # Files any user may read (mode 644, in directories open to all): the --data file, a test file beside
    # it, a file in /tmp, and the tests of this suite; the code reports what it could read.
    data, test_file, in_tmp = (
        tmp_path / "data.jsonl",
        tmp_path / "test_add.py",
        Path(f"/tmp/cg-{uuid.uuid4().hex}"),
    )
    for path in (data, test_file, in_tmp):
        path.write_text("SECRET-" + uuid.uuid4().hex)
        path.chmod(0o644)
    tmp_path.chmod(0o755)
    paths = [str(p) for p in (data, test_file, in_tmp, Path(__file__), Path("/etc/shadow"))]
    reader = (
        "import os\nSEEN = []\n"
        f"for path in {paths!r}:\n    try:\n        open(path, 'rb').read(1)\n        SEEN.append(path)\n"
        "    except OSError:\n        pass\n"
        "def add(a, b):\n    return a + b if not SEEN else (a, b, SEEN)\n"
    )
    try:
        result = run_code(reader + "print(SEEN)\n", backend=backend)
        verdict = run_tests(reader, ADD_TEST, sandbox=backend)
    finally:
        in_tmp.unlink()
    assert result.passed and result.stdout == "[]\n", result.stdout + result.stderr
    assert verdict.passed, verdict.reason


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


SNOOP = """\
import glob, os
print(dict(os.environ))
for path in glob.glob('/proc/*/environ') + ['/proc/%d/environ' % os.getppid(), '/proc/{pid}/environ']:
    try:
        print(path, open(path, 'rb').read())
    except OSError as exc:
        print(path, exc)
try:  # the scorer's memory: every readable mapping
    with open('/proc/{pid}/maps') as maps, open('/proc/{pid}/mem', 'rb') as mem:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split('-'))
            try:
                mem.seek(start)
                print(mem.read(min(end - start, 1 << 24)))
            except OSError:
                pass
except OSError as exc:
    print('mem', exc)
"""


@pytest.mark.parametrize("backend", ["auto", *SAFE_BACKENDS])
def test_parent_secrets_never_reach_the_code(monkeypatch, backend):
    secret = "sk-secret-" + uuid.uuid4().hex
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    result = run_code(SNOOP.format(pid=os.getpid()), backend=backend, timeout_s=30, max_output_bytes=1 << 26)
    assert secret not in result.stdout and secret not in result.stderr
    assert "OPENAI_API_KEY" not in result.stdout
    assert result.passed, result.stderr


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_ptrace_of_the_scorer_and_the_launcher_fails(backend):
    attach = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"for pid in {{os.getppid(), {os.getpid()}, 1}}:\n"
        "    assert libc.ptrace(16, pid, None, None) != 0, pid  # PTRACE_ATTACH\n"
        "    assert libc.ptrace(0x4206, pid, None, None) != 0, pid  # PTRACE_SEIZE\n"
        "buf = ctypes.create_string_buffer(8)\n"
        "iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)\n"
        f"assert libc.process_vm_readv({os.getpid()}, iov, 1, iov, 1, 0) < 0\n"
        "print('refused')\n"
    )
    result = run_code(attach, backend=backend)
    assert result.passed and result.stdout == "refused\n", result.stderr


# The kernel's doors out of a sandbox, each tried by number (x86_64, aarch64): its return is -1 with an errno.
KERNEL_DOORS = """\
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
numbers = {
    "x86_64": {"unshare": 272, "mount": 165, "bpf": 321, "keyctl": 250, "io_uring_setup": 425,
               "userfaultfd": 323, "perf_event_open": 298, "open_by_handle_at": 304},
    "aarch64": {"unshare": 97, "mount": 40, "bpf": 280, "keyctl": 219, "io_uring_setup": 425,
                "userfaultfd": 282, "perf_event_open": 241, "open_by_handle_at": 265},
}[os.uname().machine]
params = ctypes.create_string_buffer(256)
args = {"unshare": (0x00020000,), "mount": (b"none", b"/tmp", b"tmpfs", 0, None), "bpf": (0, None, 0),
        "keyctl": (0, -3, 0), "io_uring_setup": (1, params), "userfaultfd": (0,),
        "perf_event_open": (None, 0, -1, -1, 0), "open_by_handle_at": (-100, None, 0)}
out = {}
for name, number in numbers.items():
    ctypes.set_errno(0)
    done = libc.syscall(number, *args[name])
    out[name] = ctypes.get_errno() if done < 0 else "opened"
print(json.dumps(out))
"""


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_mounts_namespaces_bpf_keyrings_io_uring_and_file_handles_are_refused(backend):
    """Under namespaces the code holds no capability, so no mount and no mount namespace (the rest is the
    kernel's to check against no capabilities, inside the run's own namespaces); under landlock the seccomp
    filter refuses each of them with EPERM, whatever the uid holds (as root, CAP_DAC_READ_SEARCH)."""
    result = run_code(KERNEL_DOORS, backend=backend)
    assert result.passed, result.stderr
    errors = json.loads(result.stdout)
    always = ("mount", "unshare")
    assert {name: errors[name] for name in always} == dict.fromkeys(always, errno.EPERM)
    if backend == "landlock":
        assert errors == dict.fromkeys(errors, errno.EPERM)


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_network_connection_to_a_local_listener_fails(backend):
    listener = Listener(socket.AF_INET, ("127.0.0.1", 0))
    port = listener.sock.getsockname()[1]
    try:
        result = run_code(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('connected')",
            backend=backend,
        )
    finally:
        listener.close()
    assert not result.passed
    assert "connected" not in result.stdout
    assert listener.accepted == 0


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


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
@pytest.mark.parametrize("kind", ["in /tmp, mode 666", "abstract"])
def test_a_unix_socket_of_the_host_is_unreachable(kind, backend):
    name = f"cg-host-{uuid.uuid4().hex[:12]}"
    address = f"/tmp/{name}.sock" if kind.startswith("in /tmp") else f"\0{name}"
    listener = Listener(socket.AF_UNIX, address)
    try:
        if kind.startswith("in /tmp"):
            os.chmod(address, 0o666)
        reach = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(2)\ns.connect({address!r})\n"
        result = run_code(reach + "print(s.recv(2))", backend=backend)
    finally:
        listener.close()
        if kind.startswith("in /tmp"):
            os.unlink(address)
    assert not result.passed
    assert listener.accepted == 0


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_sysv_shared_memory_dies_with_the_run_and_no_later_run_sees_it(backend):
    key = int.from_bytes(os.urandom(3), "big") + 0x100000
    shm = "import ctypes\nshmget = ctypes.CDLL(None).shmget\n"
    made = run_code(shm + f"print(shmget({key}, 1 << 20, 0o1666) >= 0)\n", backend=backend)
    # Its own IPC namespace (namespaces), or no SysV IPC at all (landlock's seccomp filter).
    assert made.stdout == ("True\n" if backend == "namespaces" else "False\n"), made.stderr
    assert host_segment(key) is None
    assert run_code(shm + f"assert shmget({key}, 0, 0) < 0\n", backend=backend).passed


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_the_work_directory_is_capped_in_total_not_only_per_file(backend):
    fill = (
        "import os, sys\nwritten = 0\ntry:\n    for i in range(40):\n        with open(f'chunk{i}', 'wb') as fh:\n"
        "            for _ in range(32):\n                fh.write(b'x' * (1024 * 1024))\n"
        "                fh.flush()\n                written += 1024 * 1024\n"
        "                print(written // 1024 // 1024, flush=True)\n"
        "except OSError as exc:\n    print(exc.strerror)\n"
    )
    result = run_code(fill, disk_mb=128, timeout_s=30, backend=backend)
    lines = result.stdout.splitlines()
    if backend == "namespaces":  # a tmpfs of 128 MiB: the write fails
        assert lines[-1] == "No space left on device"
        assert int(lines[-2]) <= 128
    else:  # measured as it grows (every 50 ms): killed after it passes 128 MiB, before it wrote all 1,280.
        # How far past the cap a full-speed writer gets depends on when the host's poll is scheduled: 5-60 MiB
        # on a quiet machine, 109 MiB once in CI with two test workers on two cores. Not asserted (a timing).
        assert result.killed_reason == "disk_limit" and not result.passed
        assert 64 <= int(lines[-1]) < 40 * 32 // 2, lines[-1]


@requires_landlock
def test_a_work_directory_past_the_cap_is_killed_without_a_further_write():
    """Under landlock the cap is a measure, not a tmpfs: a run that passes it and then waits is killed while
    it waits (the measure does not depend on the run writing on)."""
    over = (
        "import time\nfor i in range(13):\n    with open(f'part{i}', 'wb') as fh:\n"
        "        fh.write(b'x' * (10 * 1024 * 1024))\n"
        "print('written', flush=True)\ntime.sleep(60)\nprint('survived')\n"
    )
    result = run_code(over, disk_mb=128, timeout_s=90, backend="landlock")
    assert result.killed_reason == "disk_limit" and not result.passed
    # 130 MiB written: killed as the last file passes the cap or while it sleeps, never after its sleep.
    assert result.stdout in ("", "written\n"), result.stderr
    assert not result.timed_out and result.wall_s < 60


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


@pytest.mark.parametrize("backend", [*SAFE_BACKENDS, "unsafe-local"])
def test_the_judge_decides_under_every_backend(monkeypatch, backend):
    from colab_graphs.sandbox.code_tests import run_tests

    if backend == "unsafe-local" and os.geteuid() == 0 and not _open_to_others(sys.executable):
        # Unconfined, the dropped uid cannot reach this interpreter; the system's runs the stdlib-only cases.
        monkeypatch.setenv("COLAB_GRAPHS_SANDBOX_PYTHON", "/usr/bin/python3")
    verdicts = {name: run_tests(code, ADD_TEST, sandbox=backend) for name, (code, _) in VERDICT_CASES.items()}
    assert {name: v.passed for name, v in verdicts.items()} == {
        n: want for n, (_, want) in VERDICT_CASES.items()
    }
    assert {v.backend for v in verdicts.values()} == {backend}
    if backend != "namespaces":
        assert not {"netns", "private_root"} & set(verdicts["right"].isolation)


def _open_to_others(path: str) -> bool:
    """Whether a uid other than the file's owner could reach `path`, asked of that uid: tried as `nobody`."""
    if os.geteuid() != 0:
        return True
    probe = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/bin/test", "-r", path]
    return subprocess.run(probe, capture_output=True).returncode == 0


NUMPY_TASK = (
    "import numpy as np\n\ndef moving_average(xs, k):\n"
    "    return [float(v) for v in np.convolve(np.asarray(xs, dtype=float), np.ones(k) / k, mode='valid')]\n"
)
NUMPY_TEST = (
    "assert moving_average([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]\nassert moving_average([5], 1) == [5.0]\n"
)


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_correct_numpy_code_scores_one_on_the_users_interpreter(backend):
    """The candidate runs this environment's interpreter and site-packages (here a venv whose base
    interpreter may sit under /root, mode 700): numpy imports, the correct answer passes, a wrong one fails."""
    from colab_graphs.sandbox.code_tests import run_tests

    numpy = pytest.importorskip("numpy")
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    if not any(os.path.realpath(numpy.__file__).startswith(p + os.sep) for p in prefixes):
        pytest.skip(f"numpy ({numpy.__file__}) lies outside this environment's prefixes (reached by a .pth)")
    right = run_tests(NUMPY_TASK, NUMPY_TEST, sandbox=backend)
    wrong = run_tests(NUMPY_TASK.replace("mode='valid'", "mode='same'"), NUMPY_TEST, sandbox=backend)
    assert right.passed, right.reason
    assert not wrong.passed and "AssertionError" in wrong.reason


@pytest.mark.parametrize("backend", SAFE_BACKENDS)
def test_numpy_imports_where_the_runs_uid_has_no_thread_to_spare(backend):
    """A run whose uid may start no other task (RLIMIT_NPROC 1: a non-root caller's own processes can use up
    its budget) still imports numpy: OpenBLAS starts no thread in the sandbox, where refused one it interrupts
    the import (a correct numpy answer scored 0 that way under a whole suite as a plain user)."""
    from colab_graphs.sandbox.runner import run_code

    pytest.importorskip("numpy")
    code = "import numpy as np\nprint(int(np.sum(np.asarray([1, -2, 3, 0]) > 0)))\n"
    ran = run_code(code, max_procs=1, backend=backend)
    assert (ran.returncode, ran.stdout.strip()) == (0, "2"), ran.stderr[-1000:]


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="no system interpreter to name")
def test_a_run_may_name_its_interpreter():
    from colab_graphs.sandbox.code_tests import run_tests

    code = "import sys\ndef where():\n    return sys.executable\n"
    verdict = run_tests(code, "assert where() == '/usr/bin/python3'\n", python="/usr/bin/python3")
    assert verdict.passed, verdict.reason


def test_an_interpreter_the_sandbox_cannot_run_is_refused_not_scored_zero(monkeypatch, tmp_path):
    from colab_graphs.sandbox.backends import SandboxUnavailable
    from colab_graphs.sandbox.code_tests import run_tests

    missing = tmp_path / "no-such-python"
    monkeypatch.setenv("COLAB_GRAPHS_SANDBOX_PYTHON", str(missing))
    with pytest.raises(SandboxUnavailable, match="COLAB_GRAPHS_SANDBOX_PYTHON"):
        run_tests("def add(a, b):\n    return a + b\n", ADD_TEST)


NOBODY = 65534
UNPRIVILEGED_SCRIPT = """\
import json, os, socket, sys, types
# The package's other modules need the venv (which `nobody` may not reach): `colab_graphs` is made a bare
# namespace here, so that only colab_graphs.sandbox (standard library only) loads, from this checkout.
package = types.ModuleType("colab_graphs")
package.__path__ = [{package!r}]
sys.modules["colab_graphs"] = package
from colab_graphs.sandbox import runner
secret = "sk-secret-unprivileged"
os.environ["OPENAI_API_KEY"] = secret
harness = open({harness!r}).read()
cases = {cases}
request = {request!r}
runs = {{n: runner.run_judged(c, harness, request) for n, c in cases.items()}}
server = socket.create_server(("127.0.0.1", 0))
server.setblocking(False)
probes = {{
    "snoop": {snoop!r}.replace("{{pid}}", str(os.getpid())),
    "tcp": "import socket\\nsocket.create_connection(('127.0.0.1', %d), timeout=2)" % server.getsockname()[1],
    "kill_the_caller": "import os, signal\\ntry:\\n    os.kill(%d, signal.SIGKILL)\\nexcept OSError:\\n    pass"
    % os.getpid(),
    "daemon": {daemon!r},
}}
results = {{n: runner.run_code(c, timeout_s=20, max_output_bytes=1 << 26) for n, c in probes.items()}}
try:
    server.accept()
    connected = True
except BlockingIOError:
    connected = False
print(json.dumps({{
    "verdicts": {{n: [(r.verdict or {{}}).get("passed"), r.isolation, r.backend] for n, r in runs.items()}},
    "secret_seen": any(secret in r.stdout + r.stderr for r in results.values()),
    "snoop_passed": results["snoop"].passed,
    "connected": connected,
    "killed_caller_passed": results["kill_the_caller"].passed,
    "backends": sorted({{r.backend for r in results.values()}}),
}}))
"""


def skip_unless_a_plain_user_can_score(where: str) -> None:
    """Skip unless `nobody` can read this checkout and the machine gives it the backend `where` names
    ("namespaces allowed", "unshare refused (container)")."""
    # Whether `nobody` can read this checkout is asked of `nobody` (root's os.access says yes to everything):
    # a clone under a mode-700 parent (root's home) cannot be, and the test then has nothing to run.
    runner = REPO / "colab_graphs" / "sandbox" / "runner.py"
    readable = _as_nobody(["/usr/bin/python3", "-I", "-c", f"open({str(runner)!r}).read()"])
    if readable.returncode != 0:
        pytest.skip(f"uid {NOBODY} cannot read this checkout ({REPO}): {readable.stderr.strip()[-200:]}")
    if where.startswith("namespaces") and not NAMESPACES_ALLOWED:
        pytest.skip("user namespaces are refused on this machine")
    if where.startswith("unshare refused") and LANDLOCK_ABI < 6:
        pytest.skip(
            f"the landlock backend needs Landlock ABI 6 for a non-root caller; this kernel has {LANDLOCK_ABI}"
        )


def _as_nobody(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return subprocess.run([*nobody, *argv], capture_output=True, text=True, timeout=300, cwd="/", **kwargs)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists(),
    reason="runs the sandbox as an unprivileged user, which needs root to switch to",
)
@pytest.mark.parametrize("where", ["namespaces allowed", "unshare refused (container)"])
def test_an_unprivileged_caller_is_contained_and_judged(where):
    """The scorer as `nobody` (the system interpreter: the caller's own), where user namespaces are allowed
    (the namespaces backend, in a user namespace) and in a container that refuses them (the landlock
    backend, picked by `auto`): the verdicts hold, and the code reads neither the caller's environment nor
    its memory, reaches no listener, kills nothing of the caller's, and leaves no daemon."""
    sandbox = REPO / "colab_graphs" / "sandbox"
    skip_unless_a_plain_user_can_score(where)
    marker = f"{4000 + int.from_bytes(os.urandom(2), 'big') % 1000}.{uuid.uuid4().int % 10**6}"
    request = {"test": ADD_TEST, "question": [], "entry_point": "add", "from_solution": ["add"]}
    request |= {"call_check": False, "bind_candidate": False, "timeout_s": 10, "call_timeout_s": None}
    script = UNPRIVILEGED_SCRIPT.format(
        package=str(REPO / "colab_graphs"),
        harness=str(sandbox / "harness.py"),
        cases=json.dumps({n: c for n, (c, _) in VERDICT_CASES.items()}),
        request=request,
        snoop=SNOOP,
        daemon=_daemon(marker),
    )
    python = ["/usr/bin/python3", "-I", "-c", script]
    if where.startswith("namespaces"):
        done = _as_nobody(python, env={"PATH": "/usr/bin:/bin"})
    else:  # the container wrapper drops to nobody itself, after which its filter refuses unshare
        done = subprocess.run(
            [*CONTAINER, "--user", str(NOBODY), "--", *python],
            capture_output=True, text=True, timeout=300, cwd=REPO, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    verdicts = report["verdicts"]
    assert {n: passed for n, (passed, _, _) in verdicts.items()} == {
        n: want for n, (_, want) in VERDICT_CASES.items()
    }
    expected_backend = "namespaces" if where.startswith("namespaces") else "landlock"
    assert report["backends"] == [expected_backend] and verdicts["right"][2] == expected_backend
    assert not report["secret_seen"] and report["snoop_passed"]
    assert not report["connected"]
    assert report["killed_caller_passed"]  # it ran, and the caller lived to report it
    assert processes_running(marker) == []
    if expected_backend == "namespaces":
        assert {"private_root", "nested_pidns", "netns", "ipcns"} <= set(verdicts["right"][1])
        assert "uid_drop" not in verdicts["right"][1]  # one uid in the user namespace: capabilities dropped
    else:
        assert {"landlock_fs", "landlock_scopes", "seccomp", "sweep"} <= set(verdicts["right"][1])


def test_where_unshare_is_refused_auto_picks_landlock_and_without_landlock_refuses_naming_both():
    probe = (
        "from colab_graphs.sandbox import SandboxUnavailable, availability, resolve\n"
        "print(repr(availability()))\n"
        "try:\n    print('chosen', resolve('auto').name)\nexcept SandboxUnavailable as exc:\n"
        "    print('refused', exc)\n"
    )
    env = {**os.environ, "COLAB_GRAPHS_SANDBOX": "auto"}
    runs = {
        flags: subprocess.run(
            [*CONTAINER, *flags, "--", sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=REPO,
        )  # fmt: skip
        for flags in ((), ("--no-landlock",))
    }
    with_landlock, without = (runs[f].stdout for f in ((), ("--no-landlock",)))
    assert "unshare denied by this process's seccomp filter" in with_landlock, runs[()].stderr
    if LANDLOCK_USABLE:
        assert "chosen landlock" in with_landlock
    refusal = without.splitlines()[-1]
    assert refusal.startswith("refused code cannot be scored safely here"), (
        without + runs[("--no-landlock",)].stderr
    )
    assert "unshare denied" in refusal and "Landlock ABI" in refusal and "unsafe-local" in refusal


@requires_landlock
@pytest.mark.parametrize("user", ["root", "unprivileged"])
def test_every_reward_hack_suite_holds_under_landlock_with_unshare_refused(user):
    """Every tests/test_reward_hacks*.py, run in a container that refuses namespaces (Docker's default seccomp
    profile, reproduced by `colab_graphs.testing.container`) with the landlock backend: each wrong answer 0,
    each correct one 1, nothing reaches the host (the suites assert all of that themselves). As the caller,
    and as an unprivileged uid (`tests/plain_user.py` shows it this environment's interpreter where a closed
    directory hides it, in a mount namespace of the test's own)."""
    as_user = ["--user", str(NOBODY)] if user == "unprivileged" else []
    _run_reward_hack_suites(user, "landlock", lambda argv: [*CONTAINER, *as_user, "--", *argv])


@requires_namespaces
def test_every_reward_hack_suite_holds_for_a_plain_user_under_namespaces():
    """The same suites as a plain user (`nobody`) with the namespaces backend, in a user namespace of its own."""
    setpriv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    _run_reward_hack_suites("unprivileged", "namespaces", lambda argv: [*setpriv, *argv])


def _run_reward_hack_suites(user: str, backend: str, wrap: Callable[[list[str]], list[str]]) -> None:
    """Run every tests/test_reward_hacks*.py with `backend`, through `wrap` (which drops to the user); as a plain
    user, in a mount namespace of its own where this interpreter is reachable (skipped, with the reason, where
    that cannot be made)."""
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_reward_hacks*.py"))
    env = {**os.environ, "COLAB_GRAPHS_SANDBOX": backend, "PYTHONPATH": str(REPO)}
    reach: Callable[[list[str]], list[str]] = list
    with tempfile.TemporaryDirectory(prefix="cg-plain-user-") as home:
        if user == "unprivileged":
            if os.geteuid() != 0:
                pytest.skip("the caller is unprivileged already: the root case is this one")
            if not shutil.which("setpriv"):
                pytest.skip("setpriv (util-linux) is needed to switch to an unprivileged uid")
            reach = plain_user.command
            Path(home).chmod(
                0o777
            )  # the plain user's HOME and TMPDIR (pytest's tmp_path is root's, mode 700)
            env |= {"HOME": home, "TMPDIR": home}
            # Tried as that uid, the way the suite would run: this interpreter with its pytest, on this checkout.
            probe = f"import os, pytest; os.listdir({str(REPO / 'tests')!r})"
            tried = subprocess.run(
                reach(wrap([sys.executable, "-c", probe])),
                capture_output=True, text=True, timeout=120, cwd=REPO, env=env,
            )  # fmt: skip
            if tried.returncode == plain_user.CANNOT:
                pytest.skip(
                    f"this interpreter cannot be shown to uid {NOBODY}: {tried.stderr.strip()[-300:]}"
                )
            assert tried.returncode == 0, tried.stderr[-2000:]
        pytest_argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *files]
        done = subprocess.run(
            reach(wrap(pytest_argv)), capture_output=True, text=True, timeout=900, env=env, cwd=REPO
        )
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in summary and "skipped" not in summary, done.stdout[-3000:]
