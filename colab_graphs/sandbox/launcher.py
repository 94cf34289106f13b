"""The inside of the sandbox: `python -I -S sandbox_launcher.py FD` builds the sandbox and starts its processes.

`colab_graphs.sandbox.runner` starts this script (inside fresh namespaces when the machine allows them, where it is
root) with its plan on pipe `FD` (marshal: no import to pay); what it reports back (the status and the
verdict) are Python literals, one per line, which the host reads with `ast.literal_eval`. The script:

1. makes itself non-dumpable (its memory holds the tests: no process of its uid may read it through /proc);
2. with a mount namespace, builds a **private root**: a read-only tmpfs holding only the system directories
   Python needs (`/usr`, `/bin`, `/lib*`, `/sbin`, `/etc`, the interpreter's prefix), bound read-only, a `/dev`
   of null/zero/full/random/urandom, a fresh `/proc`, a size-capped tmpfs `/tmp` (the work directory and the
   only writable place) and a size-capped `/dev/shm`; then `pivot_root`s into it and detaches the host's tree;
3. starts the **judge** (when the plan has one): a fork of this process that drops to its own uid (or all
   capabilities), turns non-dumpable, keeps only its pipes, runs the harness program's `judge(...)` and writes
   the verdict, with the plan's nonce, on the verdict pipe;
4. starts the **candidate**: in a PID namespace of its own (so it can see, signal or trace no other process of
   the sandbox) with its own `/proc`, as another uid (or without capabilities), under rlimits, with
   `no_new_privs`, only stdin/stdout/stderr and (judged runs) its two request/reply pipes, exec'ing a fresh
   interpreter (so nothing of this process's memory, the tests included, survives into it);
5. waits: a judged run ends when the judge does, a plain run when the candidate does; as PID 1 of the sandbox's
   PID namespace, its exit kills everything still running.

Only the standard library, and nothing slow to import: this runs once per scored answer.
"""

from __future__ import annotations

import ctypes
import fcntl
import marshal
import os
import resource
import signal
import sys

TYPE_CHECKING = False  # `typing` is not imported at run time (nothing slow: this runs once per scored answer)
if TYPE_CHECKING:
    from typing import NoReturn, TextIO

    from colab_graphs.sandbox.runner import JudgePlan, LaunchPlan

_FAILED = 125
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_CLONE_NEWNS, _CLONE_NEWPID = 0x00020000, 0x20000000
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 4, 24, 38, 47
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
# statvfs flags of a bind's source that an unprivileged remount must keep (the kernel locks them).
_KEPT_FLAGS = {2: _MS_NOSUID, 4: _MS_NODEV, 8: _MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}
_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_SHM_BYTES = 16 * 1024**2
_FILES_DIR = "/sandbox"  # inside the private root: the programs to run, read-only
_WORKDIR = "/tmp"  # inside the private root: the size-capped tmpfs, the only writable place

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def main(config_fd: int) -> None:
    _prctl(_PR_SET_DUMPABLE, 0)
    with os.fdopen(config_fd, "rb") as fh:
        plan: LaunchPlan = marshal.loads(fh.read())
    status = os.fdopen(plan["fds"]["status"], "w")
    applied = ["empty_env", "workdir", "rlimits"]
    if plan["private_root"]:
        files_dir, workdir = _build_private_root(plan)
        applied += ["private_root", "readonly_fs", "disk_cap"]
    elif plan["workdir"] is not None:
        files_dir = workdir = plan["workdir"]
        for name, text in plan["files"].items():
            _write(os.path.join(files_dir, name), text, plan["uids"]["candidate"])
    else:
        _die("the plan has neither a private root nor a work directory")
    if plan["uids"]["candidate"] is not None:
        applied.append("uid_drop")
    judge_pid, rpc, judge = None, None, plan.get("judge")
    if judge:
        to_candidate, to_judge = os.pipe(), os.pipe()
        rpc = {"request_r": to_candidate[0], "request_w": to_candidate[1]}
        rpc.update(reply_r=to_judge[0], reply_w=to_judge[1])
        judge_pid = os.fork()
        if judge_pid == 0:
            _run_judge(plan, judge, rpc["reply_r"], rpc["request_w"], status)
        for fd in (plan["fds"]["verdict"], plan["fds"]["judge_log"], rpc["reply_r"], rpc["request_w"]):
            os.close(fd)
    else:
        os.close(plan["fds"]["verdict"])
        os.close(plan["fds"]["judge_log"])
    # Children forked from here on live in a PID namespace of their own: the candidate cannot name the judge.
    nested = plan["private_root"] and _libc.unshare(_CLONE_NEWPID) == 0
    if nested:
        applied.append("nested_pidns")
    status.write(repr({"isolation": applied, "namespaces": _namespace_ids()}) + "\n")
    status.flush()
    candidate_pid = os.fork()
    if candidate_pid == 0:
        _run_candidate(plan, files_dir, workdir, rpc, status, nested)
    if rpc:
        os.close(rpc["request_r"])
        os.close(rpc["reply_w"])
    _wait(judge_pid, candidate_pid, status)


# --- the private root -----------------------------------------------------------------------------------------


def _build_private_root(plan: LaunchPlan) -> tuple[str, str]:
    """Mount the private root on /tmp (this namespace's copy of it), fill it, pivot into it. Returns the
    directory of the programs and the work directory, as seen from inside."""
    root = "/tmp"
    _mount("cg-root", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=8m,mode=755")
    for name in ("proc", "dev", "tmp", "sandbox", ".old"):
        os.mkdir(f"{root}/{name}")
    for name in _SYSTEM_DIRS:
        host = f"/{name}"
        if os.path.islink(host):
            os.symlink(os.readlink(host), f"{root}{host}")
        elif os.path.isdir(host):
            os.mkdir(f"{root}{host}")
            _bind_readonly(host, f"{root}{host}")
    for prefix in _interpreter_prefixes():
        os.makedirs(f"{root}{prefix}", exist_ok=True)
        _bind_readonly(prefix, f"{root}{prefix}")
    _make_dev(f"{root}/dev")
    _mount("proc", f"{root}/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    uid = plan["uids"]["candidate"]
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    _mount(
        "cg-work",
        f"{root}/tmp",
        "tmpfs",
        _MS_NOSUID | _MS_NODEV,
        f"size={plan['disk_bytes']},mode=700{owner}",
    )
    for name, text in plan["files"].items():
        _write(f"{root}/sandbox/{name}", text, None)
    os.chdir(root)
    number = _PIVOT_ROOT.get(os.uname().machine)
    if number is not None and _libc.syscall(number, b".", b".old") == 0:
        os.chroot(".")
        if _libc.umount2(b"/.old", _MNT_DETACH) != 0:
            _die(f"could not detach the host's root: errno {ctypes.get_errno()}")
        os.rmdir("/.old")
    else:  # an architecture without a known pivot_root number: chroot, which the dropped privileges can't undo
        os.chroot(".")
    os.chdir("/")
    _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    return _FILES_DIR, _WORKDIR


def _interpreter_prefixes() -> list[str]:
    """The interpreter's install prefixes that the system directories do not already hold (a pyenv, a conda)."""
    found = []
    for prefix in {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}:
        top = prefix.strip("/").split("/")[0]
        if top not in _SYSTEM_DIRS and prefix != "/":
            found.append(prefix)
    return sorted(found)


def _make_dev(dev: str) -> None:
    _mount("cg-dev", dev, "tmpfs", _MS_NOSUID | _MS_NOEXEC, "size=64k,mode=755")
    for name in _DEVICES:
        open(f"{dev}/{name}", "w").close()
        _mount(f"/dev/{name}", f"{dev}/{name}", None, _MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
    ):
        os.symlink(target, f"{dev}/{name}")
    os.symlink("/proc/self/fd/2", f"{dev}/stderr")
    os.mkdir(f"{dev}/shm")
    _mount(
        "cg-shm", f"{dev}/shm", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, f"size={_SHM_BYTES},mode=1777"
    )
    _mount(None, dev, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC)


def _bind_readonly(source: str, target: str) -> None:
    # Not recursive: mounts below a system directory stay out of the sandbox.
    _mount(source, target, None, _MS_BIND)
    kept = sum(ms for st, ms in _KEPT_FLAGS.items() if os.statvfs(source).f_flag & st)
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | kept)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encoded = [s.encode() if s is not None else None for s in (source, target, fstype, data)]
    if _libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]) != 0:
        _die(f"mount {source} on {target}: errno {ctypes.get_errno()}")


def _write(path: str, content: str | bytes, uid: int | None) -> None:
    with open(path, "wb") as fh:
        fh.write(content.encode() if isinstance(content, str) else content)
    if uid is not None:
        os.chown(path, uid, uid)


def _namespace_ids() -> dict[str, str]:
    ids = {}
    for name in ("net", "ipc", "pid", "mnt"):
        try:
            ids[name] = os.readlink(f"/proc/self/ns/{name}")
        except OSError:
            continue
    return ids


# --- the processes --------------------------------------------------------------------------------------------


def _run_judge(plan: LaunchPlan, judge: JudgePlan, reply_r: int, request_w: int, status: TextIO) -> NoReturn:
    """The judge's process (never returns): the harness's `judge` with the tests, behind its own uid."""
    fds = plan["fds"]
    try:
        status.close()
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds["judge_log"], 1)
        os.dup2(fds["judge_log"], 2)
        keep = {0, 1, 2, reply_r, request_w, fds["verdict"]}
        _close_all_but(keep)
        _limit(judge["limits"])
        _drop_privileges(plan["uids"]["judge"])
        _prctl(_PR_SET_DUMPABLE, 0)  # after the uid change, which resets it
        harness = type(sys)("cg_harness")  # a real module: dataclasses look their module up in sys.modules
        sys.modules[harness.__name__] = harness
        code = plan["files"]["harness.code"]
        if not isinstance(code, bytes):
            raise TypeError("the harness is not compiled code")
        exec(marshal.loads(code), harness.__dict__)
        verdict = harness.judge(reply_r, request_w, judge["input"])
    except BaseException as exc:  # noqa: BLE001 - any failure of the judge is a failed verdict
        verdict = {"passed": False, "reason": f"judge error: {type(exc).__name__}: {exc}"[:2000]}
    try:
        os.write(fds["verdict"], (repr({"nonce": judge["nonce"], "verdict": verdict}) + "\n").encode())
    finally:
        os._exit(0)


def _run_candidate(
    plan: LaunchPlan, files_dir: str, workdir: str, rpc: dict[str, int] | None, status: TextIO, nested: bool
) -> NoReturn:
    """The candidate's side (never returns): a reaper as PID 1 of its own PID namespace, the program below it."""
    if nested:
        # PID 1 of the new namespace: a /proc that shows only this namespace's processes needs a mount of its own.
        if _libc.unshare(_CLONE_NEWNS) != 0:
            _die(f"unshare(CLONE_NEWNS): errno {ctypes.get_errno()}")
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        # Over the outer /proc, not after unmounting it: in a user namespace the kernel allows a new proc mount
        # only while one is already visible (and the candidate, without privileges, cannot unmount this one).
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    child = os.fork()
    if child == 0:
        _exec_candidate(plan, files_dir, workdir, rpc)
    # A signal cannot be re-raised on a PID 1, so how the program ended goes through the status pipe. SIGUSR1
    # (from the launcher, once the judge is done) ends the program here, so that its reaping counts its CPU time.
    signal.signal(signal.SIGUSR1, lambda *_: os.kill(child, signal.SIGKILL))
    _close_all_but({1, 2, status.fileno()})
    while True:
        pid, wait_status = os.waitpid(-1, 0)
        if pid == child:
            break
    signum = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
    code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else 128 + (signum or 0)
    status.write(repr({"signal": signum, "exit_code": code}) + "\n")
    status.close()
    os._exit(code)


def _exec_candidate(plan: LaunchPlan, files_dir: str, workdir: str, rpc: dict[str, int] | None) -> NoReturn:
    try:
        if not plan["stdin"]:
            os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
        keep = {0, 1, 2}
        if rpc:
            # The harness's candidate side reads requests on fd 3 and writes replies on fd 4 (moved up first:
            # either pipe may already sit on 3 or 4).
            request_r, reply_w = (fcntl.fcntl(rpc[k], fcntl.F_DUPFD, 10) for k in ("request_r", "reply_w"))
            os.dup2(request_r, 3)
            os.dup2(reply_w, 4)
            keep |= {3, 4}
        _close_all_but(keep)
        _limit(plan["limits"])
        _drop_privileges(plan["uids"]["candidate"])
        os.chdir(workdir)
        python = plan["python"]
        argv = [python, "-I", *[a.replace("{files}", files_dir) for a in plan["argv"]]]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
        os.execve(python, argv, env)
    except BaseException as exc:  # noqa: BLE001 - never run the code half-contained
        _die(f"{type(exc).__name__}: {exc}")


def _wait(judge_pid: int | None, candidate_pid: int, status: TextIO) -> NoReturn:
    """Reap every process; end when the judge (judged runs) or the candidate (plain runs) has ended."""
    waited = judge_pid if judge_pid is not None else candidate_pid
    code = 0
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == waited:
            code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else 128
            break
    if judge_pid is not None:
        try:
            os.kill(candidate_pid, signal.SIGUSR1)
            os.waitpid(candidate_pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    status.close()
    os._exit(code)


def _limit(limits: dict[str, int]) -> None:
    for name, value in limits.items():
        # A CPU hard limit above the soft one lets SIGXCPU (reported as cpu_limit) arrive before SIGKILL.
        hard = value + 1 if name == "RLIMIT_CPU" else value
        resource.setrlimit(getattr(resource, name), (value, hard))


def _drop_privileges(uid: int | None) -> None:
    """To `uid` when the launcher is root; otherwise (root of a user namespace, or a plain user) no capabilities
    in any set, and none regained by exec. Both ways with `no_new_privs`: no setuid binary helps."""
    for cap in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    _libc.prctl(_PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            _die("privilege drop did not take effect")
    else:
        _clear_capabilities()
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _clear_capabilities() -> None:
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    if _libc.capset(ctypes.byref(header), (_CapData * 2)()) != 0:
        _die(f"capset: errno {ctypes.get_errno()}")


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        _die(f"prctl({option}): errno {ctypes.get_errno()}")


def _close_all_but(keep: set[int]) -> None:
    low = 0
    for fd in sorted(keep) + [65536]:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1


def _die(message: str) -> NoReturn:
    print(f"cg-sandbox launcher: {message}", file=sys.stderr, flush=True)
    os._exit(_FAILED)


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]))
    except Exception as exc:  # noqa: BLE001 - any launcher failure must stop the run, never run the code
        _die(f"{type(exc).__name__}: {exc}")
