"""Run untrusted Python (code a model wrote) in a contained child process.

What is contained, when the machine allows it (`SandboxResult.isolation` says what was applied):

- ``workdir``: a fresh temporary directory is the cwd, `HOME` and `TMPDIR`; it is deleted afterwards.
- ``empty_env``: the child's environment holds only `PATH`, `HOME`, `TMPDIR` and `LANG`: no API keys.
- ``rlimits``: address space (`RLIMIT_AS`), CPU seconds, process count, file size, no core dumps, open files.
- ``uid_drop``: when the parent runs as root, the code runs as an unprivileged uid of its own (root ignores
  `RLIMIT_NPROC` and file permissions, and could read `/proc/<parent>/environ`).
- ``netns``: a network namespace with only a loopback that is down (`unshare --net`): no connections at all.
- ``pidns``: a PID namespace; when the code's main process ends or is killed, the kernel kills every process it
  started, even ones that left the process group (`setsid`).
- ``mountns`` + ``readonly_fs``: a private mount namespace in which every mount is read-only except the work
  directory, so nothing outside it can be written even where plain permissions would allow it (`/tmp`).

Without `unshare` (or without the privilege to use it) the code still runs with rlimits, an empty environment,
its own process group (killed whole on timeout) and, as root, a dropped uid; but it can then reach the network,
write wherever its uid may (world-writable `/tmp`), and a process that calls `setsid` can outlive the timeout.

Not contained in any mode: reading files that are world-readable (the code can read the installed packages
and `/etc`), CPU contention with the host (use `cpu_s` and bounded parallelism), and kernel exploits.
This module imports only the standard library: it runs itself as the namespace-side launcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import json
import os
import pwd
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

# Unprivileged uids handed to concurrent runs (one each, so runs cannot signal or read each other and each has
# its own RLIMIT_NPROC budget). The range is far from system and login accounts; taken uids are skipped.
_UID_BASE = 61000
_UID_COUNT = 512
_FILE_SIZE_LIMIT = 64 * 1024**2
_OPEN_FILES_LIMIT = 256
_LAUNCHER_FAILED = 125


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one run. `passed` is true only for a clean exit with status 0 inside the time limit."""

    passed: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None
    wall_s: float
    isolation: list[str] = field(default_factory=list)
    output_truncated: bool = False


def run_code(
    code: str,
    *,
    timeout_s: float = 10,
    memory_mb: int = 512,
    cpu_s: int | None = None,
    max_procs: int = 32,
    max_output_bytes: int = 64_000,
    network: bool = False,
    stdin: str | None = None,
) -> SandboxResult:
    """Run Python source in a contained child process and wait for it (at most `timeout_s` of wall clock).

    Args:
        code: a complete Python program; it passes when it exits with status 0.
        timeout_s: wall-clock limit; on expiry the whole process tree is killed.
        memory_mb: address-space limit per process (RLIMIT_AS), in MiB.
        cpu_s: CPU-seconds limit per process; defaults to the wall-clock limit plus one second.
        max_procs: process/thread limit for the run's uid (RLIMIT_NPROC): the dropped uid when the caller is
            root; a non-root caller gets it only inside a user namespace (otherwise it would count all of the
            caller's own processes).
        max_output_bytes: stdout and stderr are each kept up to this many bytes; the rest is read and dropped.
        network: allow network access (no network namespace).
        stdin: text fed to the program's standard input (empty when None).

    Returns:
        A `SandboxResult`; the run never raises for anything the code does.

    Example:
        >>> run_code("print(1 + 1)").stdout
        '2\\n'
    """
    plan = _isolation_plan(network)
    workdir = tempfile.mkdtemp(prefix="cg_sandbox_", dir=_workdir_parent())
    uid = _UIDS.acquire() if os.geteuid() == 0 else None
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as fh:
            fh.write(code)
        if uid is not None:
            for path in (workdir, os.path.join(workdir, "main.py")):
                os.chown(path, uid, uid)
        os.chmod(workdir, 0o700)
        limits = {
            "RLIMIT_AS": memory_mb * 1024**2,
            "RLIMIT_CPU": cpu_s if cpu_s is not None else int(timeout_s) + 1,
            "RLIMIT_NPROC": max_procs,
            "RLIMIT_FSIZE": _FILE_SIZE_LIMIT,
            "RLIMIT_CORE": 0,
            "RLIMIT_NOFILE": _OPEN_FILES_LIMIT,
        }
        if uid is None and not plan.prefix:
            # A non-root caller outside a user namespace shares RLIMIT_NPROC with all its own processes: a low
            # limit would stop the sandbox from starting at all, so the process count goes unbounded there.
            del limits["RLIMIT_NPROC"]
        config = {
            "workdir": workdir,
            "python": _sandbox_python(),
            "uid": uid,
            "readonly_fs": "mountns" in plan.names,
            "limits": limits,
        }
        return _supervise(plan, config, timeout_s, max_output_bytes, stdin)
    finally:
        shutil.rmtree(workdir, onerror=_force_remove)
        if uid is not None:
            _UIDS.release(uid)


async def arun_code(
    code: str,
    *,
    timeout_s: float = 10,
    memory_mb: int = 512,
    cpu_s: int | None = None,
    max_procs: int = 32,
    max_output_bytes: int = 64_000,
    network: bool = False,
    stdin: str | None = None,
) -> SandboxResult:
    """`run_code` for async callers; at most `max_parallel()` runs execute at once across the whole process."""
    call = functools.partial(
        run_code,
        code,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        cpu_s=cpu_s,
        max_procs=max_procs,
        max_output_bytes=max_output_bytes,
        network=network,
        stdin=stdin,
    )
    return await asyncio.get_running_loop().run_in_executor(_executor(), call)


def max_parallel() -> int:
    """How many sandboxed runs may execute at once (env `COLAB_GRAPHS_SANDBOX_PARALLEL`, default: CPU count)."""
    configured = os.environ.get("COLAB_GRAPHS_SANDBOX_PARALLEL")
    return max(1, int(configured)) if configured else max(2, os.cpu_count() or 2)


@functools.cache
def _executor() -> ThreadPoolExecutor:
    # A dedicated pool is the process-wide bound: it serves every event loop and never starves the default
    # executor that other `to_thread` users share.
    return ThreadPoolExecutor(max_workers=max_parallel(), thread_name_prefix="cg-sandbox")


# --- parent side ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    prefix: list[str]
    names: list[str]


_NAMESPACES = {
    "netns": ["--net"],
    "pidns": ["--pid", "--fork", "--kill-child", "--mount-proc"],
    "mountns": ["--mount", "--propagation", "private"],
}


def _isolation_plan(network: bool) -> _Plan:
    wanted = ["mountns", "pidns"] + ([] if network else ["netns"])
    prefix, names = _usable_namespaces(tuple(wanted))
    always = ["workdir", "empty_env", "rlimits"] + (["uid_drop"] if os.geteuid() == 0 else [])
    return _Plan(prefix, always + names + (["readonly_fs"] if "mountns" in names else []))


@functools.cache
def _usable_namespaces(wanted: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The largest subset of the wanted namespaces that `unshare` can create here (probed once)."""
    unshare = shutil.which("unshare") or ("/usr/bin/unshare" if os.path.exists("/usr/bin/unshare") else None)
    if unshare is None:
        return [], []
    # Non-root callers get the same namespaces inside a user namespace where they are root.
    base = [unshare] if os.geteuid() == 0 else [unshare, "--map-root-user"]
    candidates = [list(wanted)] + [[n for n in wanted if n != drop] for drop in wanted] + [["netns"]]
    for names in candidates:
        names = [n for n in names if n in wanted]
        if not names:
            continue
        prefix = base + [flag for n in names for flag in _NAMESPACES[n]] + ["--"]
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, env=_child_env("/"))
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix, names
    return [], []


def _supervise(
    plan: _Plan, config: dict, timeout_s: float, max_output_bytes: int, stdin: str | None
) -> SandboxResult:
    status_r, status_w = os.pipe()
    try:
        return _run_launcher(plan, config, status_r, status_w, timeout_s, max_output_bytes, stdin)
    finally:
        os.close(status_r)


def _run_launcher(
    plan: _Plan,
    config: dict,
    status_r: int,
    status_w: int,
    timeout_s: float,
    max_output_bytes: int,
    stdin: str | None,
) -> SandboxResult:
    config = {**config, "status_fd": status_w}
    argv = [*plan.prefix, sys.executable, "-I", "-S", os.path.abspath(__file__), json.dumps(config)]
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_child_env(config["workdir"]),
            cwd=config["workdir"],
            pass_fds=(status_w,),
            start_new_session=True,
        )
    finally:
        # Only the launcher may hold the write end, so the status read below ends when the launcher does.
        os.close(status_w)
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True).start()
    out, err = _CappedReader(proc.stdout, max_output_bytes), _CappedReader(proc.stderr, max_output_bytes)
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    # Kill the whole group even after a clean exit: background children must not outlive the run.
    _kill_group(proc.pid)
    proc.wait()
    wall = time.monotonic() - start
    out.join()
    err.join()
    status = _read_status(status_r)
    stderr = err.text()
    isolation = [name for name in plan.names if name in status.get("isolation", [])]
    returncode = proc.returncode
    if status.get("signal"):
        returncode = -status["signal"]
    return SandboxResult(
        passed=returncode == 0 and not timed_out,
        returncode=returncode,
        stdout=out.text(),
        stderr=stderr,
        timed_out=timed_out,
        killed_reason=_killed_reason(returncode, timed_out, stderr),
        wall_s=wall,
        isolation=isolation,
        output_truncated=out.truncated or err.truncated,
    )


class _CappedReader:
    """Drains a pipe on a thread, keeping the first `cap` bytes, so a flood never blocks the child or fills RAM."""

    def __init__(self, stream: object, cap: int) -> None:
        self._stream = stream
        self._cap = cap
        self._chunks: list[bytes] = []
        self._kept = 0
        self.truncated = False
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while chunk := self._stream.read1(65536):  # type: ignore[attr-defined]
            room = self._cap - self._kept
            if len(chunk) > room:
                self.truncated = True
                chunk = chunk[: max(room, 0)]
            if chunk:
                self._chunks.append(chunk)
                self._kept += len(chunk)

    def join(self) -> None:
        # Without a PID namespace an escaped grandchild may hold the pipe open; don't wait for it forever.
        self._thread.join(timeout=2)

    def text(self) -> str:
        return b"".join(self._chunks).decode("utf-8", errors="replace")


def _child_env(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _feed(pipe: object, data: bytes) -> None:
    with contextlib.suppress(OSError):
        pipe.write(data)  # type: ignore[attr-defined]
        pipe.close()  # type: ignore[attr-defined]


def _read_status(fd: int) -> dict:
    """The launcher's report: one JSON line with the isolation applied, one with how the code ended."""
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    status: dict = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            status.update(json.loads(line))
        except ValueError:
            break
    return status


def _killed_reason(returncode: int | None, timed_out: bool, stderr: str) -> str | None:
    if timed_out:
        return "timeout"
    if returncode == _LAUNCHER_FAILED and "cg-sandbox launcher:" in stderr:
        return "launcher_failed"
    if returncode is not None and returncode < 0:
        names = {signal.SIGXCPU: "cpu_limit", signal.SIGXFSZ: "file_size_limit"}
        return names.get(-returncode, f"signal:{signal.Signals(-returncode).name}")
    if "MemoryError" in stderr[-2000:]:
        return "memory_limit"
    return None


@functools.cache
def _sandbox_python() -> str:
    """An interpreter the unprivileged uid can execute: ours if every directory up to it is world-searchable.

    A venv under /root (mode 700) is not; the system interpreter then runs the code (it needs only the stdlib).
    `COLAB_GRAPHS_SANDBOX_PYTHON` overrides.
    """
    override = os.environ.get("COLAB_GRAPHS_SANDBOX_PYTHON")
    if override:
        return override
    candidates = [os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"]
    if os.geteuid() != 0:
        return candidates[0]
    for candidate in candidates:
        if os.path.exists(candidate) and _world_executable(candidate):
            return candidate
    raise RuntimeError(
        "no Python interpreter is executable by an unprivileged user; set COLAB_GRAPHS_SANDBOX_PYTHON"
    )


def _workdir_parent() -> str | None:
    """Where work directories go: the usual temp dir, unless the dropped uid could not reach it (then /tmp)."""
    base = tempfile.gettempdir()
    if os.geteuid() != 0 or _world_executable(base):
        return None
    return "/tmp"


def _world_executable(path: str) -> bool:
    parts = os.path.realpath(path).split(os.sep)
    dirs = [os.sep + os.path.join(*parts[1:i]) for i in range(2, len(parts))]
    ok_dirs = all(os.stat(d).st_mode & stat.S_IXOTH for d in dirs)
    return ok_dirs and bool(os.stat(path).st_mode & stat.S_IXOTH)


class _UidPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: set[int] = set()

    def acquire(self) -> int:
        with self._lock:
            for uid in range(_UID_BASE, _UID_BASE + _UID_COUNT):
                if uid not in self._taken and not _uid_exists(uid):
                    self._taken.add(uid)
                    return uid
        raise RuntimeError(f"more than {_UID_COUNT} concurrent sandbox runs")

    def release(self, uid: int) -> None:
        with self._lock:
            self._taken.discard(uid)


@functools.cache
def _uid_exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


_UIDS = _UidPool()


def _force_remove(func: object, path: str, _exc: object) -> None:
    # Code running as the caller's own uid may leave read-only directories behind; make them removable.
    os.chmod(os.path.dirname(path), 0o700)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)


# --- namespace side: `python -I -S sandbox.py CONFIG` runs as root inside the new namespaces ------------------

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC = 32, 4096, 16384
_MOUNT_FLAGS = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC}


def _launch(config: dict) -> None:
    applied: list[str] = ["workdir", "empty_env"]
    workdir = config["workdir"]
    if config["readonly_fs"]:
        failed = _make_readonly_except(workdir)
        applied += ["mountns"] + (["readonly_fs"] if not failed else [])
        if failed:
            print(f"cg-sandbox launcher: could not make read-only: {failed}", file=sys.stderr)
    applied += _namespaces_of_self()
    for name, value in config["limits"].items():
        # A CPU hard limit above the soft one lets SIGXCPU (reported as cpu_limit) arrive before SIGKILL.
        hard = value + 1 if name == "RLIMIT_CPU" else value
        resource.setrlimit(getattr(resource, name), (value, hard))
    applied.append("rlimits")
    if config["uid"] is not None:
        uid = config["uid"]
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            _die("privilege drop did not take effect")
        applied.append("uid_drop")
    os.chdir(workdir)
    status = os.fdopen(config["status_fd"], "w")
    status.write(json.dumps({"isolation": applied}) + "\n")
    status.flush()
    python = config["python"]
    child = os.fork()
    if child == 0:
        status.close()
        os.execve(python, [python, "-I", "main.py"], _child_env(workdir))
    # As PID 1 of the namespace this process reaps every orphan, and its exit kills whatever is left; a signal
    # cannot be re-raised on PID 1, so the child's fate is reported through the status pipe instead.
    while True:
        pid, wait_status = os.waitpid(-1, 0)
        if pid == child:
            break
    signum = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
    code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else 128 + (signum or 0)
    status.write(json.dumps({"signal": signum, "exit_code": code}) + "\n")
    status.close()
    os._exit(code)


def _make_readonly_except(workdir: str) -> list[str]:
    """Remount every mount read-only, then bind the work directory over itself writable. Returns failures."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]

    def mount(src: str | None, target: str, flags: int) -> bool:
        encoded = src.encode() if src else None
        return libc.mount(encoded, target.encode(), None, flags, None) == 0

    failed = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        mounts = [(line.split()[4], line.split()[5]) for line in fh]
    for target, options in mounts:
        kept = sum(flag for opt, flag in _MOUNT_FLAGS.items() if opt in options.split(","))
        target = target.encode().decode("unicode_escape")
        if not mount(None, target, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | kept) and os.path.exists(target):
            failed.append(target)
    if not (mount(workdir, workdir, _MS_BIND) and mount(None, workdir, _MS_REMOUNT | _MS_BIND | _MS_NOSUID)):
        _die(f"could not bind the work directory writable: errno {ctypes.get_errno()}")
    return failed


def _namespaces_of_self() -> list[str]:
    # Compare with PID 1's view of the host is impossible from inside; unshare already succeeded, so report
    # what this process sees: its own PID 1 (pidns) and a network with only a loopback device (netns).
    names = []
    if os.getpid() == 1:
        names.append("pidns")
    try:
        with open("/proc/net/dev", encoding="utf-8") as fh:
            devices = [line.split(":")[0].strip() for line in fh.readlines()[2:]]
        if devices == ["lo"]:
            names.append("netns")
    except OSError:
        pass
    return names


def _die(message: str) -> None:
    print(f"cg-sandbox launcher: {message}", file=sys.stderr)
    os._exit(_LAUNCHER_FAILED)


if __name__ == "__main__":
    try:
        _launch(json.loads(sys.argv[1]))
    except Exception as exc:  # noqa: BLE001 - any launcher failure must stop the run, never run the code
        _die(f"{type(exc).__name__}: {exc}")
