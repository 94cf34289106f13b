"""Run untrusted Python (code a model wrote) contained, and judge it from a process it cannot reach.

Two ways in:

- `run_code(code)`: one program in the sandbox; it passes when it exits 0 in time (its output comes back).
- `run_judged(code, harness, request)`: the judged run behind the code scorer (`colab_graphs.sandbox.harness`).
  The **candidate** process runs `code` and serves requests; a separate **judge** process holds the tests and
  the verdict, calls the candidate over a pipe with plain data, and alone writes the verdict (with a nonce the
  candidate never sees) on a pipe only it holds. The candidate's output never decides anything.

Which containment a run gets is its **backend** (`colab_graphs.sandbox.backends`; `resolve(setting)` picks it,
`availability()` says why each is or is not available here). ``isolation`` on each result names what was applied.

The **namespaces** backend (`unshare`; as root, or any user where user namespaces are allowed):

- ``netns``: a network namespace with only a loopback that is down: no TCP/UDP anywhere, and no abstract Unix
  sockets of the host (they belong to the host's network namespace).
- ``ipcns``: an IPC namespace: SysV shared memory, semaphores and message queues die with the run, and none
  of the host's (or an earlier run's) are visible.
- ``pidns``: a PID namespace: when the sandbox's first process ends, the kernel kills every process it started,
  even ones that called `setsid`; ``nested_pidns``: the candidate runs in a PID namespace of its own inside it,
  so it cannot signal, trace or even see the judge (or anything but its own processes) in its `/proc`.
- ``mountns`` + ``private_root`` + ``readonly_fs``: the sandbox's root is a fresh read-only tree holding only
  `/usr`, `/bin`, `/sbin`, `/lib*`, `/etc` (bound read-only, without the mounts below them) and the view of
  the interpreter (``package_allow_list``: `colab_graphs.sandbox.visible`), a minimal `/dev`, its own `/proc`. The host's `/tmp`,
  `/run`, `/var`, `/home`, `/root`, `/work`... are not in it, so no Unix socket there (a mode-666 one in /tmp,
  Docker's) can be reached, and no file there read.
- ``disk_cap``: the work directory is a tmpfs of `disk_mb` MiB (`/tmp` inside, also `HOME` and `TMPDIR`), the
  only writable place besides a 16 MiB `/dev/shm`; both vanish with the run. `RLIMIT_FSIZE` caps one file.

The **landlock** backend (no namespaces: where `unshare` is refused, as in a container under Docker's default
seccomp profile; `launcher` has the details):

- ``landlock_fs`` (``landlock_abi_N`` names the kernel's ABI): reading only the system directories, the files
  of `/etc` that the C library and Python read, and the view of the interpreter (``package_allow_list``);
  writing only the work directory (a fresh `cg_sandbox_*` directory of the run's uid, named by its scorer,
  which the next scorer removes if this one was killed; `multiprocessing`'s semaphores and shared memory
  live in a directory of it, `colab_graphs.sandbox.private_shm`, not the host's `/dev/shm`); no `/proc` at
  all. ``landlock_tcp`` (ABI 4): no TCP bind or connect. ``landlock_scopes`` (ABI 6): no signal to, and no abstract Unix socket of, any
  process outside the run's Landlock domain.
- ``seccomp``: no `socket()` (Landlock does not cover connecting to a Unix socket by path), only connected
  AF_UNIX `socketpair`s; no ptrace, `process_vm_*`, namespaces, mounts, BPF, keyrings, file handles, perf,
  userfaultfd, kexec, modules, io_uring, SysV IPC, POSIX message queues. Nothing outside the run, which
  Landlock does not cover and a non-root caller's uid would allow: no change of any file's mode, owner, times,
  extended attributes or `chattr` flags (refused outright: Landlock cannot limit them to the work directory);
  rlimits, scheduling, affinity, priority, I/O priority and memory placement only of the calling process;
  `kill` to a negative pid only for its own group (never -1); no `setsid`/`setpgid`.
- ``own_session`` + ``sweep``: the run has its own session and process group, killed as a whole (and the
  program's own group inside it, which seccomp keeps it in, is killed whole when it ends); its launcher
  is a child subreaper that kills every process left (a `setsid` daemon included) at the end, or when the
  host times the run out; as root also every process of the run's uids. The work directory is measured as
  the run goes (every 50 ms) and the run killed past `disk_mb` (``killed_reason == "disk_limit"``): a writer
  at full speed gets past the cap by what it writes before the host's next measure is scheduled (5-60 MiB on
  a quiet machine, 109 MiB measured with two busy workers on two cores).
- ``read_search_cap``: as root, when the interpreter sits behind a directory closed to others (a venv under
  /root), the run's uids keep CAP_DAC_READ_SEARCH alone, so that they can read it; Landlock limits what they
  read, and `open_by_handle_at` is refused.

Both safe backends, and ``unsafe-local`` (an explicit opt-in: rlimits, an empty environment and its own uid as
root, nothing else):

- Sessions: the judge and the program each lead a session and process group of their own, apart from the
  launcher's (the host's), so `kill(0, ...)` or `killpg(getpgrp(), ...)` in the code reaches only its own
  processes; both die with the launcher (`PR_SET_PDEATHSIG`), and the program's group is killed when it ends.
- ``uid_drop``: as root, the candidate and the judge each run as an unprivileged uid of their own (root ignores
  `RLIMIT_NPROC` and file permissions), locked machine-wide for the run (no other run, of this process or
  another, shares it); otherwise (root of a user namespace, a plain user) both drop every capability.
  Either way `no_new_privs`, and the judge and the launcher are non-dumpable: no process of their uid can read
  their memory or file descriptors through `/proc` or `ptrace`.
- ``rlimits``: address space, CPU seconds, processes, file size, open files, no core dumps; ``empty_env``: only
  `PATH`, `HOME`, `TMPDIR`, `LANG` (no API keys); stdin, stdout and stderr plus, for the candidate, its two
  request/reply pipes are its only file descriptors. Output beyond `max_output_bytes` is read and dropped:
  it never blocks the program, and in a judged run it cannot change the verdict.

Backend x threat (docs/sandbox.md has the full table):

| threat | namespaces | landlock | unsafe-local |
|---|---|---|---|
| host files, the data file | not in the root | Landlock: system + interpreter only | its uid's (every file, as root with a venv behind a closed directory) |
| TCP, host Unix sockets | netns, private root | no `socket()`; Landlock TCP | open |
| `setsid` daemons | PID namespace | subreaper sweep; uid sweep as root | survive |
| scorer's /proc mem, environ; ptrace | own /proc, other uid | no /proc; seccomp; Landlock | other uid as root |
| SysV IPC | IPC namespace | seccomp refuses | shared |
| disk | tmpfs cap | measured, killed | measured, killed |
| fork bomb, memory, CPU | rlimits | rlimits | rlimits (non-root: no NPROC) |

Not covered (the threat model's edges):

- Memory is limited per process (`RLIMIT_AS`), not per run (no cgroup): `max_procs` processes may each use
  `memory_mb`. CPU time competes with the host's (use `cpu_s` and bounded parallelism).
- The system directories are readable (installed packages, `/etc/passwd`); a Unix socket placed inside them
  would be reachable under the namespaces backend. Under landlock an unlinked file held open escapes the disk
  measure (bounded by `RLIMIT_FSIZE` x `RLIMIT_NOFILE`). Kernel exploits, timing side channels, and anything
  the tests themselves leak through the arguments they pass are out of scope.
- The judge runs the dataset's tests: trusted to be tests, yet contained like the candidate (its own uid or no
  capabilities, no writable directory at all).

The sandbox's inside is `colab_graphs.sandbox.launcher`, a standard-library script run (`-I -S`) by the
interpreter the code will run on (`sandbox_python()`: this environment's, so the code sees its packages).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import ctypes
import fcntl
import functools
import logging
import marshal
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from colab_graphs.sandbox import backends, visible

logger = logging.getLogger(__name__)

# Unprivileged uids handed to concurrent runs (one each for the candidate and the judge, so no two processes of
# different roles or runs can signal or read each other, and each has its own RLIMIT_NPROC budget). The range
# is far from system and login accounts; taken uids are skipped.
_UID_BASE = 61000
_UID_COUNT = 512
_FILE_SIZE_LIMIT = 64 * 1024**2
_OPEN_FILES_LIMIT = 256
_LAUNCHER_FAILED = 125
_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.py")
_JUDGE_GRACE_S = 2.0  # the judge times its own deadline; the host kills only a judge that overran it
T = TypeVar("T")


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
    backend: str = ""  # the backend that ran it (`colab_graphs.sandbox.backends`)


@dataclass(frozen=True)
class JudgedRun:
    """What happened to one judged run. `verdict` is the judge's (None: it gave none, e.g. killed at the time
    limit); `stdout` / `stderr` are the candidate's, `judge_output` the judge's, all capped."""

    verdict: dict[str, Any] | None
    timed_out: bool
    wall_s: float
    isolation: list[str]
    stdout: str
    stderr: str
    judge_output: str
    backend: str = ""  # the backend that ran it (`colab_graphs.sandbox.backends`)


def run_code(
    code: str,
    *,
    timeout_s: float = 10,
    memory_mb: int = 512,
    cpu_s: int | None = None,
    max_procs: int = 32,
    max_output_bytes: int = 64_000,
    disk_mb: int = 128,
    network: bool = False,
    stdin: str | None = None,
    backend: str | None = None,
    python: str | None = None,
    packages: Iterable[str] | None = None,
) -> SandboxResult:
    """Run Python source in the sandbox and wait for it (at most `timeout_s` of wall clock).

    Args:
        code: a complete Python program; it passes when it exits with status 0.
        timeout_s: wall-clock limit; on expiry every process of the run is killed.
        memory_mb: address-space limit per process (RLIMIT_AS), in MiB.
        cpu_s: CPU-seconds limit per process; defaults to the wall-clock limit plus one second.
        max_procs: process/thread limit for the run's uid (RLIMIT_NPROC): the dropped uid when the caller is
            root; a non-root caller gets it only inside a user namespace (otherwise it would count all of the
            caller's own processes).
        max_output_bytes: stdout and stderr are each kept up to this many bytes; the rest is read and dropped.
        disk_mb: size of the work directory (a tmpfs) where the machine allows a private root.
        network: allow network access (no network namespace).
        stdin: text fed to the program's standard input (empty when None).
        backend: the sandbox setting (`colab_graphs.sandbox.backends`; None: env, else ``auto``).
        python: the interpreter that runs the code (None: `sandbox_python()`, the caller's own environment).
        packages: the packages the code may import and read (`colab_graphs.sandbox.visible`; None: the default
            allow-list as env `COLAB_GRAPHS_SANDBOX_PACKAGES` changes it); nothing else of the environment is
            visible.

    Raises:
        SandboxUnavailable: no backend meets `backend` here, or the sandbox could not start the code (the
            interpreter cannot be run inside it, an allowed package is not installed): nothing was judged.

    Returns:
        A `SandboxResult`; the run never raises for anything the code does.

    Example:
        >>> run_code("print(1 + 1)").stdout
        '2\\n'
    """
    chosen = resolve(backend)
    files: dict[str, str | bytes] = {"main.py": code}
    run = _Run(
        _isolation_plan(network, chosen),
        timeout_s,
        memory_mb,
        cpu_s,
        max_procs,
        disk_mb,
        roles=("candidate",),
        python=python or sandbox_python(),
        packages=packages,
    )
    with run:
        out = run.start(
            files, ["{files}/main.py"], judge=None, stdin=stdin, max_output_bytes=max_output_bytes
        )
    _raise_if_not_started(out, chosen)
    returncode = out.returncode
    if out.status.get("signal"):
        returncode = -out.status["signal"]
    failure = _run_failure(out, run.plan)
    return SandboxResult(
        passed=returncode == 0 and not out.timed_out and not out.disk_full and failure is None,
        returncode=returncode,
        stdout=out.stdout.text(),
        stderr=out.stderr.text(),
        timed_out=out.timed_out,
        killed_reason="disk_limit"
        if out.disk_full
        else "unswept"
        if failure and not out.timed_out
        else _killed_reason(returncode, out.timed_out, out.stderr.text()),
        wall_s=out.wall_s,
        isolation=out.isolation,
        output_truncated=out.stdout.truncated or out.stderr.truncated,
        backend=chosen.name,
    )


def run_judged(
    code: str,
    harness: str,
    request: dict[str, Any],
    *,
    timeout_s: float = 10,
    memory_mb: int = 512,
    cpu_s: int | None = None,
    max_procs: int = 32,
    max_output_bytes: int = 64_000,
    disk_mb: int = 128,
    network: bool = False,
    backend: str | None = None,
    python: str | None = None,
    packages: Iterable[str] | None = None,
) -> JudgedRun:
    """Run `code` as the candidate and `harness`'s `judge(reply_fd, request_fd, request)` as its judge.

    `harness` is a module's source: run as `__main__` with the path of `code`'s file as its argument, it is the
    candidate's side; its `judge` function runs in the judge's process and returns the verdict (plain data).
    `request` (the tests) reaches only the judge. The judge times itself (`timeout_s`, which the request should
    carry); the host kills the run `_JUDGE_GRACE_S` later. Other arguments as `run_code`.
    """
    chosen = resolve(backend)
    python = python or sandbox_python()
    nonce = secrets.token_hex(16)
    judge: JudgeInput = {"input": request, "nonce": nonce}
    files: dict[str, str | bytes] = {"solution.py": code, "harness.code": _compiled(harness, python)}
    run = _Run(
        _isolation_plan(network, chosen), timeout_s + _JUDGE_GRACE_S, memory_mb, cpu_s or int(timeout_s) + 1,
        max_procs, disk_mb, roles=("candidate", "judge"), python=python, packages=packages,
    )  # fmt: skip
    with run:
        out = run.start(
            files, [*_HARNESS_ARGV, "{files}/solution.py"], judge=judge, max_output_bytes=max_output_bytes
        )
    _raise_if_not_started(out, chosen)
    verdict = None
    for message in _literals(out.verdict):
        if (
            isinstance(message, dict)
            and message.get("nonce") == nonce
            and isinstance(message.get("verdict"), dict)
        ):
            verdict = message["verdict"]
    failure = _run_failure(out, run.plan)
    if failure:  # whatever the judge said: the run left something running, or its launcher failed
        verdict = {"passed": False, "reason": failure, "calls": (verdict or {}).get("calls", 0)}
    return JudgedRun(
        verdict=verdict,
        timed_out=out.timed_out,
        wall_s=out.wall_s,
        isolation=out.isolation,
        stdout=out.stdout.text(),
        stderr=out.stderr.text(),
        judge_output=out.judge_log.text() if out.judge_log else "",
        backend=chosen.name,
    )


# The candidate runs the harness compiled once per host process by the sandbox's interpreter (compiling a
# few hundred lines in every run, twice, was a measurable part of each score).
_HARNESS_ARGV = ["-c", "import marshal\nexec(marshal.loads(open('{files}/harness.code', 'rb').read()))"]


def _raise_if_not_started(out: _Outcome, backend: backends.Backend) -> None:
    """A run the launcher could not set up judged nothing: refuse it (a 0 there would be the sandbox's fault).
    Only the launcher writes the status pipe (the code never holds it), so the code cannot fake this."""
    error = out.status.get("launcher_error")
    if error:
        raise backends.SandboxUnavailable(
            f"the {backend.name} sandbox could not start the code: {error}. If the interpreter cannot be run "
            f"there, set {PYTHON_ENV} to one that can (standard library and the packages the code needs)"
        )


def _run_failure(out: _Outcome, plan: _Plan) -> str | None:
    """Why a run that started failed as a run, whatever its code did (None: it did not): its launcher failed
    after the code started, or (landlock, no PID namespace to end it) the end-of-run sweep did not report that
    no process of the run was left. It fails this answer alone, with the cause; the launcher's group and the
    run's uids are killed regardless."""
    error = out.status.get("run_error")
    if error:
        return f"the sandbox's launcher failed during the run: {str(error)[:500]}"
    if plan.landlock and out.status.get("swept") is not True:
        why = out.status.get("sweep_error") or f"the launcher ended without sweeping (exit {out.returncode})"
        return f"the run could not be swept (processes it started may have been left): {str(why)[:500]}"
    return None


@functools.lru_cache(maxsize=8)
def _compiled(harness: str, python: str) -> bytes:
    """`harness` compiled by the sandbox's interpreter, as marshal bytes (the judge and the candidate exec it)."""
    compile_it = (
        "import marshal, sys\n"
        "if sys.version_info < (3, 10):\n    sys.exit(f'Python 3.10 or newer is needed, this is {sys.version}')\n"
        "sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.read(), 'harness.py', 'exec')))"
    )
    try:
        done = subprocess.run(
            [python, "-I", "-S", "-c", compile_it], input=harness.encode(), capture_output=True, timeout=60
        )
    except OSError as exc:
        raise backends.SandboxUnavailable(
            f"the sandbox's interpreter {python} cannot run: {exc} (set {PYTHON_ENV})"
        ) from exc
    if done.returncode != 0:
        raise backends.SandboxUnavailable(
            f"the sandbox's interpreter ({python}) cannot run the harness: {done.stderr.decode()[-500:]}"
            f" (set {PYTHON_ENV} to another)"
        )
    return done.stdout


async def arun_code(code: str, **options: Any) -> SandboxResult:
    """`run_code` for async callers; at most `max_parallel()` runs execute at once across the whole process."""
    return await in_sandbox_pool(run_code, code, **options)


async def in_sandbox_pool(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call `fn` (a blocking sandbox run) on the sandbox's thread pool, the process-wide bound on parallel runs."""
    call = functools.partial(fn, *args, **kwargs)
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


# --- which backend ----------------------------------------------------------------------------------------------


def resolve(setting: str | None = None) -> backends.Backend:
    """The backend for `setting` (None: env `COLAB_GRAPHS_SANDBOX`, else ``auto``), or `backends.SandboxUnavailable`."""
    setting = setting or backends.setting_from_env()
    if setting not in backends.SETTINGS:
        raise backends.SandboxUnavailable(
            f"sandbox {setting!r} is not a sandbox setting; use one of {', '.join(backends.SETTINGS)}"
        )
    if setting == "unsafe-local":
        return backends.Backend("unsafe-local", safe=False)
    why_not = availability()
    order = ["namespaces", "landlock"] if setting == "auto" else [setting]
    for name in order:
        if why_not[name] is None:
            return backends.Backend(name, safe=True)
    missing = "; ".join(f"{name}: {why_not[name]}" for name in order)
    raise backends.SandboxUnavailable(
        f"code cannot be scored safely here ({missing}). Ways out: run where user namespaces are allowed "
        "(as root, or a container started with --security-opt seccomp=unconfined / CAP_SYS_ADMIN), "
        "or on a kernel with Landlock (5.13+) for --sandbox landlock; or accept running model-written code "
        "unconfined with --sandbox unsafe-local (recorded in every result and report)"
    )


@functools.cache
def availability() -> dict[str, str | None]:
    """Each safe backend -> None when this machine gives it, else why not (probed once per process)."""
    return {"namespaces": _namespaces_missing(), "landlock": _landlock_missing()}


def _namespaces_missing() -> str | None:
    wanted = ("mountns", "pidns", "ipcns", "netns")
    prefix, names = _usable_namespaces(wanted)
    lacking = [n for n in wanted if n not in names]
    if lacking:
        return f"unshare cannot create {', '.join(lacking)}: {_why_no_unshare()}"
    problem = _probe_problem(_Plan(prefix, names, private_root=True))
    if problem:
        return f"the private root cannot be built: {problem}"
    return None


# The Landlock ABI the landlock backend needs: as root, 3 (the filesystem with truncation: below ABI 3 Landlock
# does not govern truncate(), so the code could empty a world-writable file anywhere; the dropped uid keeps
# the run from signalling others, and the seccomp filter refuses sockets); for a non-root caller, whose uid
# the code then shares, 6: also ABI 6's signal scoping (else it could kill the caller's processes, the
# scorer included).
_LANDLOCK_MIN_ABI = {True: 3, False: 6}
_LANDLOCK_KERNEL = {1: "5.13", 2: "5.19", 3: "6.2", 4: "6.7", 5: "6.10", 6: "6.12", 7: "6.15"}


def _landlock_missing() -> str | None:
    abi = _landlock_abi()
    needed = _LANDLOCK_MIN_ABI[os.geteuid() == 0]
    if abi < needed:
        found = f"ABI {abi}" if abi else "none (kernel older than 5.13, or the landlock system calls refused)"
        who = "root" if os.geteuid() == 0 else "a non-root caller"
        why = "truncation" if needed == 3 else "truncation and signal scoping"
        return (
            f"Landlock ABI {needed} (Linux {_LANDLOCK_KERNEL[needed]}) or newer is needed for {who} "
            f"({why}); this kernel offers {found}"
        )
    return _probe_problem(_Plan([], [], private_root=False, landlock=True))


def _landlock_abi() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return max(int(libc.syscall(444, None, 0, 1)), 0)  # landlock_create_ruleset(NULL, 0, VERSION)


# --- one run ----------------------------------------------------------------------------------------------------


class JudgeInput(TypedDict):
    """The judge's side of a judged run: what `judge(...)` gets, and the nonce its verdict must carry."""

    input: dict[str, Any]
    nonce: str


class JudgePlan(JudgeInput):
    limits: dict[str, int]  # the judge's rlimits, by `resource` name


class LaunchPlan(TypedDict):
    """What `sandbox_launcher` reads on its config pipe (marshal): the run it builds and starts."""

    python: str  # the interpreter the candidate execs (the launcher's own)
    private_root: bool  # build the private root (a mount namespace allows it), else run in `workdir`
    workdir: str | None  # the work directory without a private root
    disk_bytes: int  # the private root's work tmpfs
    uids: dict[str, int | None]  # "candidate", "judge": the uid each drops to (None: capabilities only)
    limits: dict[str, int]  # the candidate's rlimits, by `resource` name
    files: dict[str, str | bytes]  # the programs, by file name, read-only in the sandbox
    argv: list[str]  # after `python -I`; "{files}" stands for the programs' directory
    stdin: bool  # the candidate reads the launcher's stdin (else /dev/null)
    judge: JudgePlan | None
    fds: dict[str, int]  # "status", "verdict", "judge_log": the write ends of the pipes back to the host
    landlock: (
        bool  # confine both processes with Landlock and seccomp, and sweep the run's processes at the end
    )
    network: bool  # the run may use the network (no netns; under landlock: sockets and TCP allowed)
    host: int  # the scorer's PID: the landlock launcher ends (and sweeps) when it dies
    view: visible.View  # what the run sees of its interpreter (the private root binds it)
    landlock_rules: list[tuple[str, str]]  # the view and the system directories as Landlock rules


@dataclass(frozen=True)
class _Plan:
    prefix: list[str]  # the `unshare` command line, [] without namespaces
    namespaces: list[str]  # what the prefix creates
    private_root: bool
    landlock: bool = False  # Landlock + seccomp + the sweep (the landlock backend)
    network: bool = False


@dataclass
class _Outcome:
    returncode: int | None
    timed_out: bool
    wall_s: float
    status: dict[str, Any]
    isolation: list[str]
    stdout: _CappedReader
    stderr: _CappedReader
    judge_log: _CappedReader | None
    verdict: str
    disk_full: bool = (
        False  # killed for writing more than `disk_mb` in its work directory (no tmpfs to cap it)
    )


_NO_VIEW: visible.View = {"links": [], "files": [], "trees": [], "listed": [], "hidden": [], "packages": []}


class _Run:
    """One sandbox run's resources (uids, a fallback work directory) and the launcher that uses them."""

    def __init__(
        self,
        plan: _Plan,
        timeout_s: float,
        memory_mb: int,
        cpu_s: int | None,
        max_procs: int,
        disk_mb: int,
        roles: tuple[str, ...],
        python: str,
        packages: Iterable[str] | None = None,
    ) -> None:
        self.plan, self.timeout_s, self.roles, self.python = plan, timeout_s, roles, python
        # Resolved before anything is held: an allowed package that is not installed refuses the run.
        self.view = visible.view(python, packages) if plan.private_root or plan.landlock else None
        self.memory, self.cpu_s, self.max_procs, self.disk_mb = memory_mb * 1024**2, cpu_s, max_procs, disk_mb
        self.uids: dict[str, int | None] = dict.fromkeys(roles)
        self.workdir: str | None = None

    def __enter__(self) -> _Run:
        if os.geteuid() == 0:
            for role in self.roles:
                self.uids[role] = _UIDS.acquire()
        if not self.plan.private_root:
            parent = _workdir_parent() or tempfile.gettempdir()
            _sweep_workdirs(parent, os.getpid())
            self.workdir = tempfile.mkdtemp(prefix=f"cg_sandbox_{_owner_tag()}_", dir=parent)
            if self.uids["candidate"] is not None:
                os.chown(self.workdir, self.uids["candidate"], self.uids["candidate"])
            os.chmod(self.workdir, 0o700)
            if not self.plan.landlock:
                _warn_weak_isolation(self.plan)
        return self

    def __exit__(self, *_: object) -> None:
        if self.workdir:
            shutil.rmtree(self.workdir, onerror=_force_remove)
        for uid in self.uids.values():
            if uid is not None:
                _UIDS.release(uid)

    def _limits(self, role: str) -> dict[str, int]:
        cpu = self.cpu_s if self.cpu_s is not None else int(self.timeout_s) + 1
        limits = {"RLIMIT_AS": self.memory, "RLIMIT_CPU": cpu, "RLIMIT_CORE": 0}
        if role == "candidate":
            limits |= {"RLIMIT_NPROC": self.max_procs, "RLIMIT_FSIZE": _FILE_SIZE_LIMIT}
            limits["RLIMIT_NOFILE"] = _OPEN_FILES_LIMIT
        else:  # the judge forks nothing and writes no file
            limits |= {"RLIMIT_NPROC": 16, "RLIMIT_FSIZE": 1024**2, "RLIMIT_NOFILE": 64}
        if self.uids[role] is None and not self.plan.prefix:
            # A non-root caller outside a user namespace shares RLIMIT_NPROC with all its own processes: the
            # limit is what it runs now plus the run's own budget (unsafe-local: unbounded).
            if self.plan.landlock:
                limits["RLIMIT_NPROC"] += _tasks_of_uid(os.getuid())
            else:
                del limits["RLIMIT_NPROC"]
        return limits

    def start(
        self,
        files: dict[str, str | bytes],
        argv: list[str],
        *,
        judge: JudgeInput | None,
        max_output_bytes: int,
        stdin: str | None = None,
    ) -> _Outcome:
        pipes = {name: os.pipe() for name in ("config", "status", "verdict", "judge_log")}
        plan: LaunchPlan = {
            "python": self.python,
            "private_root": self.plan.private_root,
            "workdir": self.workdir,
            "disk_bytes": self.disk_mb * 1024**2,
            "uids": self.uids | {"judge": self.uids.get("judge")},
            "limits": self._limits("candidate"),
            "files": files,
            "argv": argv,
            "stdin": stdin is not None,
            "judge": {**judge, "limits": self._limits("judge")} if judge is not None else None,
            "fds": {name: pipes[name][1] for name in ("status", "verdict", "judge_log")},
            "landlock": self.plan.landlock,
            "network": self.plan.network,
            "host": os.getpid(),
            "view": self.view or _NO_VIEW,
            "landlock_rules": visible.landlock_rules(self.view, visible.SYSTEM)
            if self.view and self.plan.landlock
            else [],
        }
        child_fds = (pipes["config"][0], *plan["fds"].values())
        argv_ = [*self.plan.prefix, plan["python"], "-I", "-S", _LAUNCHER, str(pipes["config"][0])]
        start = time.monotonic()
        try:
            proc = _popen(
                argv_,
                plan["python"],
                stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_child_env("/"),
                cwd="/",
                pass_fds=child_fds,
                start_new_session=True,
            )
        finally:
            # Only the launcher may hold the write ends, so each read below ends when the sandbox does.
            for fd in child_fds:
                os.close(fd)
        config_w = pipes["config"][1]
        threading.Thread(target=_feed_fd, args=(config_w, marshal.dumps(dict(plan), 2)), daemon=True).start()
        if stdin is not None:
            threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True).start()
        out, err = _CappedReader(proc.stdout, max_output_bytes), _CappedReader(proc.stderr, max_output_bytes)
        judge_log = _CappedReader(os.fdopen(pipes["judge_log"][0], "rb"), max_output_bytes)
        verdict = _CappedReader(os.fdopen(pipes["verdict"][0], "rb"), 1024**2)
        timed_out, disk_full = self._wait(proc, start)
        if (timed_out or disk_full) and self.plan.landlock:
            # The launcher kills what left its group (a `setsid` daemon) before it exits.
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        # Kill the whole group even after a clean exit: background children must not outlive the run.
        _kill_group(proc.pid)
        proc.wait()
        wall = time.monotonic() - start
        for reader in (out, err, judge_log, verdict):
            reader.join()
        status = _read_status(pipes["status"][0])
        os.close(pipes["status"][0])
        if self.plan.landlock and status.get("swept") is not True:
            self._kill_uids()  # the launcher could not make sure: its uids are released only once empty
        return _Outcome(
            returncode=proc.returncode,
            timed_out=timed_out,
            wall_s=wall,
            status=status,
            isolation=self._isolation(status),
            stdout=out,
            stderr=err,
            judge_log=judge_log if judge else None,
            verdict=verdict.text(),
            disk_full=disk_full,
        )

    def _kill_uids(self) -> None:
        """Kill every process of the run's uids (as root: nothing else runs as them), from a process of each."""
        for uid in {u for u in self.uids.values() if u is not None}:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [self.python, "-I", "-S", "-c", "import os\nos.kill(-1, 9)"],
                    user=uid, group=uid, extra_groups=[], env=_child_env("/"), cwd="/", timeout=10,
                    capture_output=True,
                )  # fmt: skip

    def _wait(self, proc: subprocess.Popen[bytes], start: float) -> tuple[bool, bool]:
        """Wait for the launcher: (timed out, over the disk cap). Without a private root (whose work directory
        is a size-capped tmpfs) the work directory is measured as the run goes and the run killed beyond it."""
        if self.workdir is None:
            try:
                proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                return True, False
            return False, False
        cap = self.disk_mb * 1024**2
        while True:
            left = self.timeout_s - (time.monotonic() - start)
            if left <= 0:
                return True, False
            try:
                proc.wait(timeout=min(left, _DISK_POLL_S))
                return False, False
            except subprocess.TimeoutExpired:
                if _tree_usage(self.workdir) > cap:
                    return False, True

    def _isolation(self, status: dict[str, Any]) -> list[str]:
        """What the launcher applied, and which namespaces differ from the host's (asked of the kernel)."""
        applied = list(status.get("isolation", []))
        theirs = status.get("namespaces", {})
        for name, label in (("net", "netns"), ("ipc", "ipcns"), ("pid", "pidns"), ("mnt", "mountns")):
            with contextlib.suppress(OSError):
                if name in theirs and theirs[name] != os.readlink(f"/proc/self/ns/{name}"):
                    applied.append(label)
        return applied


def _isolation_plan(network: bool, backend: backends.Backend) -> _Plan:
    """What a run of `backend` applies; a safe backend that cannot apply all of it refuses (never runs weaker)."""
    if backend.name == "unsafe-local":
        return _Plan([], [], private_root=False, network=network)
    if backend.name == "landlock":
        return _Plan([], [], private_root=False, landlock=True, network=network)
    wanted = ("mountns", "pidns", "ipcns") + (() if network else ("netns",))
    prefix, names = _usable_namespaces(wanted)
    if set(names) != set(wanted) or availability()["namespaces"] is not None:
        raise backends.SandboxUnavailable(
            f"the namespaces backend cannot create {', '.join(sorted(set(wanted) - set(names))) or 'its private root'}"
            f" here: {availability()['namespaces'] or 'unshare failed'}"
        )
    return _Plan(prefix, names, private_root=True, network=network)


_NAMESPACES = {
    "netns": ["--net"],
    "ipcns": ["--ipc"],
    "pidns": ["--pid", "--fork", "--kill-child", "--mount-proc"],
    "mountns": ["--mount", "--propagation", "private"],
}


@functools.cache
def _usable_namespaces(wanted: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The `unshare` prefix creating all the wanted namespaces, and their names; ([], []) where it cannot
    (probed once)."""
    unshare = shutil.which("unshare") or ("/usr/bin/unshare" if os.path.exists("/usr/bin/unshare") else None)
    if unshare is None:
        return [], []
    # Non-root callers get the same namespaces inside a user namespace where they are root.
    base = [unshare] if os.geteuid() == 0 else [unshare, "--map-root-user"]
    prefix = base + [flag for n in wanted for flag in _NAMESPACES[n]] + ["--"]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, env=_child_env("/"))
    except (OSError, subprocess.TimeoutExpired):
        return [], []
    return (prefix, list(wanted)) if probe.returncode == 0 else ([], [])


def _why_no_unshare() -> str:
    """What refuses namespaces here, as far as the machine tells."""
    if not (shutil.which("unshare") or os.path.exists("/usr/bin/unshare")):
        return "no unshare program (util-linux)"
    for path, off in (
        ("/proc/sys/user/max_user_namespaces", "0"),
        ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"),
    ):
        with contextlib.suppress(OSError):
            if os.geteuid() != 0 and Path(path).read_text().strip() == off:
                return f"user namespaces refused ({path} is {off})"
    with contextlib.suppress(OSError):
        status = Path("/proc/self/status").read_text().splitlines()
        seccomp = [line for line in status if line.startswith("Seccomp:")]
        if seccomp and seccomp[0].split()[1] != "0":
            return (
                "unshare denied by this process's seccomp filter (a container under Docker's or Kubernetes' "
                "default profile, without CAP_SYS_ADMIN)"
            )
    return "user namespaces refused, or unshare denied (no CAP_SYS_ADMIN in a container)"


def _probe_problem(plan: _Plan) -> str | None:
    """Why `plan` cannot run a program here (None: it can): the launcher's own error (mounts refused inside a
    container, Landlock refused, the interpreter unreachable by the sandbox's uid), else the program's."""
    try:
        python = sandbox_python()
        with _Run(plan, 20, 256, None, 8, 1, roles=("candidate",), python=python) as run:
            out = run.start({"main.py": "pass"}, ["{files}/main.py"], judge=None, max_output_bytes=4000)
    except backends.SandboxUnavailable as exc:
        return str(exc)
    if out.returncode == 0 and not out.status.get("launcher_error"):
        return None
    why = (
        out.status.get("launcher_error")
        or out.stderr.text().strip()[-500:]
        or f"exit status {out.returncode}"
    )
    return f"{why} (interpreter {python}; {PYTHON_ENV} names another)"


_WEAK_WARNED: list[bool] = []


def _warn_weak_isolation(plan: _Plan) -> None:
    if not _WEAK_WARNED:
        _WEAK_WARNED.append(True)
        logger.warning(
            "sandboxed code runs without a private root here (namespaces: %s): it can reach host sockets and "
            "files its uid may read; score untrusted code as root or where user namespaces are allowed",
            ", ".join(plan.namespaces) or "none",
        )


class _CappedReader:
    """Drains a pipe on a thread, keeping the first `cap` bytes, so a flood never blocks the child or fills RAM."""

    def __init__(self, stream: Any, cap: int) -> None:
        self._stream = stream
        self._cap = cap
        self._chunks: list[bytes] = []
        self._kept = 0
        self.truncated = False
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        with self._stream:
            while chunk := self._stream.read1(65536):
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


# Math libraries start one thread each (a run's verdict never needs BLAS threads): OpenBLAS otherwise starts one
# per core at `import numpy` and, refused a thread, interrupts the import, so a correct numpy answer would score 0
# wherever the run's uid has few tasks left under RLIMIT_NPROC (a non-root caller shares it with all its own
# processes). The launcher passes them on to the candidate.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _child_env(home: str) -> dict[str, str]:
    """The whole environment of the launcher (and the judge it forks): nothing of the caller's."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        **ONE_THREAD,
    }


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _feed(pipe: Any, data: bytes) -> None:
    with contextlib.suppress(OSError):
        pipe.write(data)
        pipe.close()


def _feed_fd(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError), os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _read_status(fd: int) -> dict[str, Any]:
    """The launcher's report: one line with the isolation applied, one with how the code ended."""
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    status: dict[str, Any] = {}
    for message in _literals(data.decode("utf-8", errors="replace")):
        if isinstance(message, dict):
            status.update(message)
    return status


def _literals(text: str) -> list[Any]:
    """The Python literals of `text`, one per line (`ast.literal_eval`: no code runs); unreadable lines skipped."""
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            found.append(ast.literal_eval(line))
    return found


def _popen(argv: list[str], interpreter: str, **options: Any) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(argv, **options)
    except OSError as exc:
        raise backends.SandboxUnavailable(
            f"the sandbox cannot start its interpreter {interpreter}: {exc}; set {PYTHON_ENV} to one that runs"
        ) from exc


def _killed_reason(returncode: int | None, timed_out: bool, stderr: str) -> str | None:
    if timed_out:
        return "timeout"
    if returncode == _LAUNCHER_FAILED and "cg-sandbox launcher:" in stderr:
        return "launcher_failed"
    if returncode is not None and returncode < 0:
        names: dict[int, str] = {signal.SIGXCPU: "cpu_limit", signal.SIGXFSZ: "file_size_limit"}
        return names.get(-returncode, f"signal:{signal.Signals(-returncode).name}")
    if "MemoryError" in stderr[-2000:]:
        return "memory_limit"
    return None


PYTHON_ENV = "COLAB_GRAPHS_SANDBOX_PYTHON"


def sandbox_python() -> str:
    """The interpreter sandboxed code runs on: env `COLAB_GRAPHS_SANDBOX_PYTHON`, else this process's own
    (`sys.executable`, not resolved: a venv's `bin/python` is what makes its site-packages importable), so the
    code sees the allowed packages (`colab_graphs.sandbox.visible`: numpy, pandas, ...) of the environment
    colab-graphs runs in, read-only.

    Each backend makes it reachable by the sandbox's unprivileged uid even behind a closed directory (a venv
    under /root, mode 700): the namespaces backend binds its view into the private root, the landlock
    backend keeps CAP_DAC_READ_SEARCH there (see `launcher._drop_privileges`). Where it still cannot run, the
    run raises `SandboxUnavailable` naming this setting.
    """
    override = os.environ.get(PYTHON_ENV)
    if override:
        return override
    if not sys.executable:
        raise backends.SandboxUnavailable(f"this process does not know its interpreter; set {PYTHON_ENV}")
    return os.path.abspath(sys.executable)


def _workdir_parent() -> str | None:
    """Where work directories go: the usual temp dir, unless the dropped uid could not reach it (then /tmp)."""
    base = tempfile.gettempdir()
    if os.geteuid() != 0 or _world_executable(base):
        return None
    return "/tmp"


_DISK_POLL_S = 0.05
_MAX_ENTRIES = 20_000  # files and directories in a work directory: more counts as full (inodes, and the walk)


def _tree_usage(path: str) -> float:
    """Bytes allocated under `path` (a directory the host can read); a tree it cannot read, or one of more than
    `_MAX_ENTRIES` entries, counts as infinite (the run is then killed: fail closed)."""
    total, entries, stack = 0, 0, [path]
    try:
        while stack:
            with os.scandir(stack.pop()) as found:
                for entry in found:
                    entries += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:  # removed meanwhile
                        continue
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
    except OSError:
        return float("inf")
    return float("inf") if entries > _MAX_ENTRIES else total


def _tasks_of_uid(uid: int) -> int:
    """Threads that `uid` runs now (what RLIMIT_NPROC counts)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
    return count


def _world_executable(path: str) -> bool:
    parts = os.path.realpath(path).split(os.sep)
    dirs = [os.sep + os.path.join(*parts[1:i]) for i in range(2, len(parts))]
    ok_dirs = all(os.stat(d).st_mode & stat.S_IXOTH for d in dirs)
    return ok_dirs and bool(os.stat(path).st_mode & stat.S_IXOTH)


class _UidPool:
    """The run uids of this machine: each held by one run of one process at a time. Within a process a set;
    across processes (two scorers, two trainings on one machine) an exclusive `flock` on a file per uid in a
    root-only directory, which the kernel releases when its holder dies. So no two runs ever share a uid, and
    the landlock backend's end-of-run kill of a uid's every process touches only its own run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # uid -> the locked file's descriptor

    def acquire(self) -> int:
        with self._lock:
            for uid in range(_UID_BASE, _UID_BASE + _UID_COUNT):
                if uid in self._held or _uid_exists(uid):
                    continue
                fd = os.open(
                    os.path.join(_lock_dir(), str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
                )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._held[uid] = fd
                return uid
        raise RuntimeError(f"more than {_UID_COUNT} concurrent sandbox processes")

    def release(self, uid: int) -> None:
        with self._lock:
            fd = self._held.pop(uid, None)
            if fd is not None:
                os.close(fd)


@functools.cache
def _lock_dir() -> str:
    """A directory only root can write, for the uid locks (refused where another user owns it)."""
    path = os.path.join("/run" if os.access("/run", os.W_OK) else tempfile.gettempdir(), "colab-graphs-uids")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise backends.SandboxUnavailable(
            f"{path} is not a directory of root's alone: the sandbox's uid locks go there"
        )
    return path


@functools.cache
def _uid_exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


_UIDS = _UidPool()


# A work directory's name says which process made it (`_owner_tag`): a scorer killed mid-run (SIGKILL, the
# OOM killer) cannot remove its own, so the next one to start removes those whose maker is gone.
_WORKDIR_NAME = re.compile(r"cg_sandbox_(\d+)-(\d+)-(\d+)_")


def _owner_tag(pid: int | None = None) -> str:
    """``PIDNS-PID-START``: this process (or `pid`) as no other process, now or later, is: its PID namespace
    (a /tmp shared across containers holds other namespaces' PIDs), its PID and its start time (PIDs are
    reused). Empty when the process is gone."""
    where = f"/proc/{pid or 'self'}"
    try:
        namespace = os.stat(f"{where}/ns/pid").st_ino
        with open(f"{where}/stat") as fh:
            start = fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""
    return f"{namespace}-{pid or os.getpid()}-{start}"


@functools.cache
def _sweep_workdirs(parent: str, _pid: int) -> None:
    """Remove the work directories in `parent` whose maker is gone (once per process and directory; `_pid`
    makes a forked child sweep again). Only directories of this PID namespace, and of the uids a run of
    this caller gives them (the run uids as root, this uid otherwise), are considered."""
    ours = _owner_tag().split("-")[0]
    uids = (
        range(_UID_BASE, _UID_BASE + _UID_COUNT) if os.geteuid() == 0 else range(os.getuid(), os.getuid() + 1)
    )
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            found = _WORKDIR_NAME.match(entry.name)
            if found is None or found.group(1) != ours:
                continue
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode) or info.st_uid not in uids:
                    continue
                if _owner_tag(int(found.group(2))) != "-".join(found.groups()):
                    shutil.rmtree(entry.path, onerror=_force_remove)


def _force_remove(func: object, path: str, _exc: object) -> None:
    # Code running as the caller's own uid may leave read-only directories behind; make them removable.
    os.chmod(os.path.dirname(path), 0o700)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)
