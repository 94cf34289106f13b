"""The inside of the sandbox: `python -I -S launcher.py FD` builds the sandbox and starts its processes.

`colab_graphs.sandbox.runner` starts this script (inside fresh namespaces for the namespaces backend, where it
is root; as a plain process for the landlock backend) with its plan on pipe `FD` (marshal: no import to pay);
what it reports back (the status and the verdict) are Python literals, one per line, which the host reads with
`ast.literal_eval`. It runs on the interpreter the code will run on (the plan's `python`). The script:

1. makes itself non-dumpable (its memory holds the tests: no process of its uid may read it through /proc);
2. namespaces: builds a **private root**: a read-only tmpfs holding only the system directories Python needs
   (`/usr`, `/bin`, `/lib*`, `/sbin`, `/etc`) and the view of the interpreter (`colab_graphs.sandbox.visible`:
   its standard library and allowed packages, every other package directory masked), bound read-only, a `/dev` of
   null/zero/full/random/urandom, a fresh `/proc`, a size-capped tmpfs `/tmp` (the work directory and the
   only writable place) and a size-capped `/dev/shm`; then `pivot_root`s into it and detaches the host's tree.
   landlock: writes the programs into the host's per-run work directory, with the links to the allowed packages
   and a private /dev/shm for `multiprocessing` (`_link_packages`), and becomes a child subreaper;
3. starts the **judge** (when the plan has one): a fork of this process, in a session of its own, that drops
   to its own uid (or all capabilities), turns non-dumpable, keeps only its pipes (landlock: confines itself,
   reading only and writing nothing), runs the harness program's `judge(...)` and writes the verdict, with
   the plan's nonce, on the verdict pipe;
4. starts the **candidate**: (namespaces) in a PID namespace of its own (so it can see, signal or trace no
   other process of the sandbox) with its own `/proc`; the program leads a session and process group of its
   own (its signals to "its group" reach only its processes), killed whole when it ends; as another uid (or
   without capabilities), under rlimits, with `no_new_privs`, (landlock) under Landlock and the seccomp filter, only stdin/stdout/stderr
   and (judged runs) its two request/reply pipes, exec'ing a fresh interpreter (so nothing of this
   process's memory, the tests included, survives into it);
5. waits: a judged run ends when the judge does, a plain run when the candidate does; namespaces: as PID 1 of
   the sandbox's PID namespace, its exit kills everything still running; landlock: it kills every process the
   run left (`_sweep`), also when the host sends SIGTERM at the time limit.

A failure to build any of it is reported on the status pipe (`launcher_error`, which the code never holds) and
the code does not run. Only the standard library, and nothing slow to import: this runs once per scored answer.
"""

from __future__ import annotations

import ctypes
import fcntl
import marshal
import os
import resource
import signal
import struct
import sys

TYPE_CHECKING = False  # `typing` is not imported at run time (nothing slow: this runs once per scored answer)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import NoReturn, TextIO

    from colab_graphs.sandbox.runner import JudgePlan, LaunchPlan
    from colab_graphs.sandbox.visible import View

_FAILED = 125
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_CLONE_NEWNS, _CLONE_NEWPID = 0x00020000, 0x20000000
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 4, 24, 38, 47
_PR_SET_KEEPCAPS, _PR_SET_SECCOMP, _PR_SET_CHILD_SUBREAPER, _PR_SET_PDEATHSIG = 8, 22, 36, 1
_CAP_DAC_READ_SEARCH = 2
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
    # Above the descriptors the processes are given (0-4), so no `dup2` of theirs replaces it.
    status = os.fdopen(fcntl.fcntl(plan["fds"]["status"], fcntl.F_DUPFD, 10), "w")
    os.close(plan["fds"]["status"])
    _STATUS.append(status)
    applied = ["empty_env", "workdir", "rlimits"]
    if plan["landlock"]:
        # Every process the run leaves behind (a `setsid` daemon included) becomes this process's child when its
        # parent ends, and is killed with the rest when the run ends or the host asks (SIGTERM).
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        _hold_children_file()

        def on_term(*_: object) -> None:
            _sweep(plan)
            os._exit(_FAILED)

        signal.signal(signal.SIGTERM, on_term)
        # A scorer killed mid-run (SIGKILL) cannot time the run out: its death ends the run the same way.
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != plan["host"]:
            on_term()
        applied += ["own_session", "sweep"]
    if plan["private_root"]:
        files_dir, workdir = _build_private_root(plan)
        applied += ["private_root", "readonly_fs", "disk_cap"]
    elif plan["workdir"] is not None:
        files_dir = workdir = plan["workdir"]
        for name, text in plan["files"].items():
            _write(os.path.join(files_dir, name), text, plan["uids"]["candidate"])
        if plan["landlock"]:
            _link_packages(plan["view"], workdir, plan["uids"]["candidate"])
    else:
        _die("the plan has neither a private root nor a work directory")
    if plan["uids"]["candidate"] is not None:
        applied.append("uid_drop")
    if plan["landlock"]:
        applied += ["seccomp", *_landlock_labels(plan["network"])]
    if _keeps_read_search(plan):
        applied.append("read_search_cap")
    if plan["private_root"] or plan["landlock"]:
        applied.append("package_allow_list")  # the interpreter's view: `colab_graphs.sandbox.visible`
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
    _CODE_STARTED.append(True)
    if rpc:
        os.close(rpc["request_r"])
        os.close(rpc["reply_w"])
    _wait(plan, judge_pid, candidate_pid, status)


# --- the private root -----------------------------------------------------------------------------------------


def _build_private_root(plan: LaunchPlan) -> tuple[str, str]:
    """Mount the private root on /tmp (this namespace's copy of it), fill it, pivot into it. Returns the
    directory of the programs and the work directory, as seen from inside."""
    root = "/tmp"
    os.umask(0o022)
    # What the run sees of its interpreter is held open first: it may lie under /tmp (a clone's .venv), which
    # the private root is about to cover; it is bound last, over the work directory where it lies in it.
    view = plan["view"]
    sources = {}
    for path in (*view["trees"], *view["files"]):
        try:  # noqa: SIM105 - contextlib is one more import per scored answer
            sources[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:  # removed since the host looked (an upgrade): not shown
            pass
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
    _make_dev(f"{root}/dev")
    _mount("proc", f"{root}/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    uid = plan["uids"]["candidate"]
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    # Mode 711: the judge's uid may pass through to an interpreter prefix bound inside it, not list it.
    _mount(
        "cg-work",
        f"{root}/tmp",
        "tmpfs",
        _MS_NOSUID | _MS_NODEV,
        f"size={plan['disk_bytes']},mode=711{owner}",
    )
    _show_interpreter(root, view, sources)
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


def _show_interpreter(root: str, view: View, sources: dict[str, int]) -> None:
    """Put the view of the interpreter (`colab_graphs.sandbox.visible`) into the private root: each hidden
    directory that the system directories bring in is covered by an empty tmpfs, the package directories are
    made to hold only the allowed entries, each bound read-only, and the links to the interpreter are made.
    Parents come before what lies in them (by depth), a mask before what it re-exposes."""
    steps = [(p, 0) for p in view["hidden"]] + [(p, 1) for p in view["listed"]]
    steps += [(p, 2) for p in view["trees"]] + [(p, 3) for p in view["files"]]
    steps += [(p, 4) for p, _ in view["links"]]
    masks = []
    for path, kind in sorted(steps, key=lambda step: (step[0].count("/"), step[1], step[0])):
        target = f"{root}{path}"
        if kind == 0:
            if os.path.isdir(target) and not os.path.islink(target):
                _mount("cg-hidden", target, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=755")
                masks.append(target)
        elif kind == 1:
            os.makedirs(target, exist_ok=True)
        elif kind == 4:
            if not os.path.lexists(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(dict(view["links"])[path], target)
        elif path in sources:
            if not os.path.lexists(target):
                os.makedirs(target if kind == 2 else os.path.dirname(target), exist_ok=True)
                if kind == 3:
                    open(target, "w").close()
            _bind_readonly(f"/proc/self/fd/{sources[path]}", target)
    for fd in sources.values():
        os.close(fd)
    for target in masks:
        _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


_PACKAGES_DIR = ".packages"
_SHM_DIR = ".shm"  # the landlock backend's private /dev/shm (`colab_graphs.sandbox.private_shm`)
_SHM_MODULE = "_cg_private_shm"


def _link_packages(view: View, workdir: str, uid: int | None) -> None:
    """The landlock backend's package directory (it has no mounts to build one): a directory of links to the
    allowed packages' entries, on the candidate's path (`PYTHONPATH`), and a `sitecustomize` that takes the
    interpreter's own package directories off the path and puts this one after the standard library. Landlock lets the code read what the links lead
    to, and nothing else of those directories; listing them is not granted (Python would then find every
    installed package by name, and an optional import of one would fail with PermissionError, not ImportError).

    The same `sitecustomize` gives `multiprocessing` the run's private /dev/shm, a directory of the work
    directory (no mount can make one here, and the host's is not granted): `_PRIVATE_SHM` patches
    `_multiprocessing`, `_posixshmem` and `multiprocessing.heap` when they are imported, to
    `colab_graphs.sandbox.private_shm`, copied beside the links."""
    where = os.path.join(workdir, _PACKAGES_DIR)
    os.mkdir(where, 0o755)
    for entry in _allowed_entries(view):
        os.symlink(entry, os.path.join(where, os.path.basename(entry)))
    shm = os.path.join(workdir, _SHM_DIR)
    os.mkdir(shm, 0o700)
    if uid is not None:
        os.chown(shm, uid, uid)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "private_shm.py"), "rb") as fh:
        _write(os.path.join(where, _SHM_MODULE + ".py"), fh.read(), None)
    # After the standard library, where a package directory would be: no package shadows a standard module.
    hide = f"import sys\nsys.path[:] = [p for p in sys.path if p not in {[*view['listed'], where]!r}] + [{where!r}]\n"
    _write(
        os.path.join(where, "sitecustomize.py"), hide + _PRIVATE_SHM.format(shm=shm, module=_SHM_MODULE), None
    )


# The rest of the run's `sitecustomize` (`{shm}`: the private directory; `{module}`: the copy of
# `colab_graphs.sandbox.private_shm`): a finder that patches the modules
# behind `multiprocessing`'s shared state as they are imported, so that a run without them pays nothing.
_PRIVATE_SHM = """
class _PrivateShm:
    names = ("_multiprocessing", "_posixshmem", "multiprocessing.heap")

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        for finder in sys.meta_path:
            find = None if finder is self else getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Patched(spec.loader)
                return spec
        return None


class _Patched:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        import {module}
        {module}.install({shm!r}, module)


sys.meta_path.insert(0, _PrivateShm())
"""


def _allowed_entries(view: View) -> list[str]:
    """The allowed packages' top-level entries in the interpreter's package directories (`numpy/`,
    `numpy.libs/`, `six.py`, a dist-info): what a package directory of the view holds."""
    return [e for e in (*view["trees"], *view["files"]) if os.path.dirname(e) in view["listed"]]


def _judge_imports(plan: LaunchPlan) -> None:
    """Let the judge import what the candidate may import, and nothing else (one rule for both: the tests it
    runs are the benchmark's, but a package directory holds every benchmark's answer key). The launcher, and
    so the judge forked from it, runs without `site` (`-S`); the judge gets the allowed packages' top-level
    entries by name (`_AllowedPackages`), never a package directory on its path: under landlock it may not
    list them, and the candidate's links (in its work directory, which a candidate of the caller's uid can
    rewrite) are not for the judge to follow. Without a view (``unsafe-local``, no containment) it gets what
    the candidate's ``python -I`` gets: `site`'s doing, a venv's packages included."""
    if not (plan["private_root"] or plan["landlock"]):
        import site

        site.main()
        return
    import importlib.machinery

    suffixes = sorted(importlib.machinery.all_suffixes(), key=len, reverse=True)
    found = {}
    for entry in _allowed_entries(plan["view"]):
        base = os.path.basename(entry)
        if not os.path.isdir(entry):  # a module file: its name without the suffix (`six.py`, an extension)
            base = next((base[: -len(s)] for s in suffixes if base.endswith(s)), "")
        if base.isidentifier():  # not `numpy.libs` or a dist-info: nothing to import by that name
            found[base] = entry
    sys.meta_path.append(_AllowedPackages(found))  # after the standard library's finders, as on a path


class _AllowedPackages:
    """A finder of the allowed top-level packages and modules at their paths (their submodules are found
    below a package's own directory, as usual)."""

    def __init__(self, entries: dict[str, str]) -> None:
        self.entries = entries

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        import importlib.machinery
        import importlib.util

        at = self.entries.get(name)
        if path is not None or at is None:
            return None
        if not os.path.isdir(at):
            return importlib.util.spec_from_file_location(name, at)
        for suffix in importlib.machinery.all_suffixes():
            init = os.path.join(at, "__init__" + suffix)
            if os.path.isfile(init):
                return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[at])
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)  # a namespace package
        spec.submodule_search_locations = [at]
        return spec


def _interpreter_prefixes(python: str) -> list[str]:
    """The install prefixes of `python` (the interpreter this launcher runs on, by the path the code will run
    it as): a venv's (found as Python finds it, by the `pyvenv.cfg` beside the executable or one level up) and
    the base install's."""
    found = set()
    here = os.path.dirname(os.path.abspath(python))
    venv = [d for d in (here, os.path.dirname(here)) if os.path.isfile(os.path.join(d, "pyvenv.cfg"))]
    for prefix in (*venv[:1], sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix):
        prefix = os.path.realpath(prefix)
        if prefix != "/":
            found.add(prefix)
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


# --- Landlock and seccomp (the backend without namespaces) -----------------------------------------------------

# Landlock (Documentation/userspace-api/landlock.rst): the access rights each ABI adds, by bit.
_LL_CREATE_RULESET, _LL_ADD_RULE, _LL_RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_LL_VERSION, _LL_RULE_PATH_BENEATH, _LL_RULE_NET_PORT = 1, 1, 2
_LL_MIN_ABI = 3  # the runner's `_LANDLOCK_MIN_ABI` for root; checked here again, where the rules are made
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1, 2, 4, 8
_LL_REFER, _LL_TRUNCATE, _LL_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_LL_FILE_RIGHTS = _LL_EXECUTE | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV
_LL_READ = _LL_EXECUTE | _LL_READ_FILE | _LL_READ_DIR
# What a run may read besides the system's programs and libraries and the view of its interpreter (the host's
# `landlock_rules`): of /etc only what the C library and Python's standard library read (not /etc/shadow,
# which a kept CAP_DAC_READ_SEARCH would open).
_LL_ETC = (
    "ld.so.cache", "ld.so.preload", "localtime", "timezone", "passwd", "group", "nsswitch.conf", "hosts",
    "host.conf", "mime.types", "os-release", "ssl", "ca-certificates", "pki", "python3", "fonts", "alternatives",
)  # fmt: skip
_LL_DEVICES = {
    "null": True,
    "zero": True,
    "full": True,
    "random": False,
    "urandom": False,
}  # name -> writable


def landlock_abi() -> int:
    """The Landlock ABI this kernel offers (0: none, or the system call is refused)."""
    abi = _libc.syscall(_LL_CREATE_RULESET, None, 0, _LL_VERSION)
    return max(int(abi), 0)


def _landlock(granted: list[tuple[str, str]], writable: str | None, network: bool) -> None:
    """Restrict this process (and all it starts) to reading what `granted` names (the system and the view of
    the interpreter: `colab_graphs.sandbox.visible.landlock_rules`), writing only `writable`; with ABI 4 no TCP
    bind or connect (unless `network`), with ABI 6 no signal and no abstract Unix socket outside this domain
    (`_landlock_labels` names what applies). Dies where the kernel refuses, or offers less than ABI 3."""
    abi = landlock_abi()
    if abi < _LL_MIN_ABI:
        # Below ABI 3 truncate() is not governed: the code could empty any file it can open for writing.
        _die(
            f"Landlock ABI {_LL_MIN_ABI} (Linux 6.2) or newer is needed (truncation); this kernel offers {abi}"
        )
    handled = (1 << 13) - 1 | (_LL_REFER if abi >= 2 else 0) | (_LL_TRUNCATE if abi >= 3 else 0)
    handled |= _LL_IOCTL_DEV if abi >= 5 else 0
    net = 0 if network or abi < 4 else 3  # LANDLOCK_ACCESS_NET_BIND_TCP | CONNECT_TCP
    scoped = 3 if abi >= 6 else 0  # LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | SIGNAL
    attr = struct.pack("QQQ", handled, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _libc.syscall(_LL_CREATE_RULESET, attr, len(attr), 0)
    if ruleset < 0:
        _die(f"landlock_create_ruleset: errno {ctypes.get_errno()}")
    kinds = {"read": _LL_READ, "file": _LL_EXECUTE | _LL_READ_FILE, "list": _LL_READ_DIR}
    rules = [(path, kinds[kind]) for path, kind in granted]
    rules += [(f"/etc/{name}", _LL_READ) for name in _LL_ETC]
    rules += [(f"/dev/{name}", _LL_READ | (_LL_WRITE_FILE if w else 0)) for name, w in _LL_DEVICES.items()]
    if writable is not None:
        rules.append((writable, handled))
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # not on this machine
        if os.fstat(fd).st_mode & 0o170000 != 0o040000:  # not a directory
            access &= _LL_FILE_RIGHTS
        beneath = struct.pack("=Qi", access & handled, fd)  # struct landlock_path_beneath_attr (packed)
        failed = _libc.syscall(_LL_ADD_RULE, ruleset, _LL_RULE_PATH_BENEATH, beneath, 0) != 0
        os.close(fd)
        if failed:
            _die(f"landlock_add_rule({path}): errno {ctypes.get_errno()}")
    if _libc.syscall(_LL_RESTRICT_SELF, ruleset, 0) != 0:
        _die(f"landlock_restrict_self: errno {ctypes.get_errno()}")
    os.close(ruleset)


# seccomp: the system calls `seccomp_program` refuses or checks, and their numbers per architecture (with its
# audit arch), in the same order.
_SYSCALL_NAMES = (
    "socket", "socketpair", "clone", "clone3", "ptrace", "process_vm_readv", "process_vm_writev", "unshare",
    "setns", "mount", "umount2", "pivot_root", "chroot", "bpf", "keyctl", "add_key", "request_key",
    "open_by_handle_at", "name_to_handle_at", "perf_event_open", "userfaultfd", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "kcmp", "shmget", "shmat", "shmctl",
    "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open",
    "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
)  # fmt: skip
_SYSCALLS = {
    "x86_64": (0xC000003E, (
        41, 53, 56, 435, 101, 310, 311, 272, 308, 165, 166, 155, 161, 321, 250, 248, 249, 304, 303, 298, 323,
        246, 320, 175, 313, 176, 312, 29, 30, 31, 67, 64, 65, 66, 220, 68, 69, 70, 71, 240, 241, 242, 243,
        244, 245,
    )),
    "aarch64": (0xC00000B7, (
        198, 199, 220, 435, 117, 270, 271, 97, 268, 40, 39, 41, 51, 280, 219, 217, 218, 265, 264, 241, 282,
        104, 294, 105, 273, 106, 272, 194, 196, 195, 197, 190, 193, 191, 192, 186, 189, 188, 187, 180, 181,
        182, 183, 184, 185,
    )),
}  # fmt: skip
# The same number on both: io_uring, the new mount API, pidfd_getfd (another process's file descriptors),
# process_madvise, process_mrelease.
_GENERIC = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
            "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
            "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442,
            "process_mrelease": 448}  # fmt: skip
# What reaches other processes or metadata outside the work directory, which Landlock does not cover (a non-root
# caller's code runs as the caller's uid): per architecture, the system calls refused outright (changing any
# file's mode, owner, times or extended attributes: Landlock cannot limit them to the work directory, and a
# read-only descriptor of one of the caller's files would do), those whose first argument must be 0 (this
# process: another's rlimits, scheduling, affinity, memory placement), and `setsid`/`setpgid` (the program stays
# in the process group the launcher kills whole). x86_64 has the old path forms too; aarch64 only the `*at`.
_OUTSIDE: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, int, int, int]]] = {
    # (refused, self only, (setpriority, ioprio_set, kill, ioctl))
    "x86_64": (
        (90, 91, 92, 93, 94, 260, 268, 132, 235, 261, 280, 188, 189, 190, 197, 198, 199, 112, 109),
        (302, 203, 144, 142, 314, 256, 279),
        (141, 251, 62, 16),
    ),
    "aarch64": (
        (52, 53, 55, 54, 88, 5, 6, 7, 14, 15, 16, 157, 154),
        (261, 122, 119, 118, 274, 238, 239),
        (140, 30, 129, 29),
    ),
}  # fmt: skip
# The same number on both: fchmodat2, setxattrat, removexattrat.
_OUTSIDE_GENERIC = (452, 463, 466)
# ioctl requests that change a file's attributes (chattr, project ids), allowed on a read-only descriptor.
_SET_FILE_FLAGS = (
    0x40086602,
    0x40046602,
    0x401C5820,
)  # FS_IOC_SETFLAGS, FS_IOC32_SETFLAGS, FS_IOC_FSSETXATTR
_CLONE_NEW_ANY = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_AF_UNIX, _SOCK_STREAM, _SOCK_SEQPACKET = 1, 1, 5
_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_EPERM, _ENOSYS = 1, 38
# classic BPF opcodes: BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_JMP|JSET|K, BPF_ALU|AND|K, BPF_RET|K
LD, JEQ, JGE, JSET, AND, RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
# seccomp_data offsets: nr, arch, the low 32 bits of args[0] and args[1] (pid_t, int and ioctl's request are 32
# bits: the kernel ignores the high ones)
NR, ARCH, ARG0, ARG1 = 0, 4, 16, 24
_PRIO_PROCESS, _IOPRIO_WHO_PROCESS = 0, 1


def bpf(program: list[tuple[int, int, str | None, str | None] | str]) -> bytes:
    """Assemble classic BPF: each entry is (code, k, jump-if-true label, jump-if-false label) or a label (a str,
    naming the instruction after it); a None label falls through."""
    at: dict[str, int] = {}
    count = 0
    for entry in program:
        if isinstance(entry, str):
            at[entry] = count
        else:
            count += 1
    out, i = [], 0
    for entry in program:
        if isinstance(entry, str):
            continue
        code, k, yes, no = entry
        jt, jf = (at[label] - i - 1 if label else 0 for label in (yes, no))
        out.append(struct.pack("HBBI", code, jt, jf, k))
        i += 1
    return b"".join(out)


def seccomp_program(network: bool, group: int) -> bytes:
    """The run's seccomp filter: refuses (EPERM) tracing, other processes' memory, namespaces, mounts, BPF,
    keyrings, file handles, perf, userfaultfd, kexec, modules, io_uring, SysV IPC and POSIX message queues
    (without an IPC namespace they are the host's, and outlive the run), and clone with CLONE_NEW*; `clone3`
    gets ENOSYS (its flags are out of the filter's reach: libc falls back to `clone`). Without `network`, no
    `socket()` at all (Landlock does not cover connecting to a Unix socket by path: a mode-666 one in /tmp would
    be reachable) and `socketpair()` only for connected AF_UNIX stream/seqpacket pairs (what asyncio and
    multiprocessing use). Another architecture's system calls (x32, i386) kill the process.

    Nothing outside the run (`_OUTSIDE`): no change of any file's mode, owner, times or extended attributes
    (nor `chattr` flags), no `setsid`/`setpgid`; `prlimit64`, the scheduler's setters, `migrate_pages` and
    `move_pages` only on the calling process (pid 0), `setpriority` and `ioprio_set` only on the calling process
    (who 0), and `kill` with a negative pid only for the caller's own process `group` (never -1: every process
    the uid may signal). A signal to one pid outside the run is Landlock's (ABI 6 scope) or the uid's to refuse."""
    machine = os.uname().machine
    arch, by_arch = _SYSCALLS[machine]
    numbers = dict(zip(_SYSCALL_NAMES, by_arch, strict=True)) | _GENERIC
    refused = [n for name, n in numbers.items() if name not in ("socket", "socketpair", "clone", "clone3")]
    outside, self_only, (setpriority, ioprio_set, kill, ioctl) = _OUTSIDE[machine]
    refused += [*outside, *_OUTSIDE_GENERIC]
    program: list[tuple[int, int, str | None, str | None] | str] = [
        (LD, ARCH, None, None),
        (JEQ, arch, None, "kill"),
        (LD, NR, None, None),
        (JGE, 0x40000000, "kill", None),  # the x32 ABI's numbers
        *[(JEQ, n, "eperm", None) for n in refused],
        *[(JEQ, n, "self", None) for n in self_only],
        (JEQ, setpriority, "priority", None),
        (JEQ, ioprio_set, "ioprio", None),
        (JEQ, kill, "signal", None),
        (JEQ, ioctl, "ioctl", None),
        (JEQ, numbers["clone3"], "enosys", None),
        (JEQ, numbers["clone"], "clone", None),
    ]
    if not network:
        program += [(JEQ, numbers["socket"], "eperm", None), (JEQ, numbers["socketpair"], "pair", None)]
    program += [
        (RET, _RET_ALLOW, None, None),
        "clone",
        (LD, ARG0, None, None),
        (JSET, _CLONE_NEW_ANY, "eperm", "allow"),
        "pair",
        (LD, ARG0, None, None),
        (JEQ, _AF_UNIX, None, "eperm"),
        (LD, ARG1, None, None),
        (AND, 0xF, None, None),  # the socket type without SOCK_NONBLOCK / SOCK_CLOEXEC
        (JEQ, _SOCK_STREAM, "allow", None),
        (JEQ, _SOCK_SEQPACKET, "allow", "eperm"),
        "self",
        (LD, ARG0, None, None),
        (JEQ, 0, "allow", "eperm"),
        "priority",
        (LD, ARG0, None, None),
        (JEQ, _PRIO_PROCESS, "self_second", "eperm"),
        "ioprio",
        (LD, ARG0, None, None),
        (JEQ, _IOPRIO_WHO_PROCESS, "self_second", "eperm"),
        "self_second",
        (LD, ARG1, None, None),
        (JEQ, 0, "allow", "eperm"),
        "signal",
        (LD, ARG0, None, None),
        (JGE, 0x80000000, None, "allow"),  # a pid >= 0: one process, or the caller's own group (0)
        (JEQ, -group & 0xFFFFFFFF, "allow", "eperm"),
        "ioctl",
        (LD, ARG1, None, None),
        *[(JEQ, request, "eperm", None) for request in _SET_FILE_FLAGS],
        "allow",
        (RET, _RET_ALLOW, None, None),
        "eperm",
        (RET, _RET_ERRNO | _EPERM, None, None),
        "enosys",
        (RET, _RET_ERRNO | _ENOSYS, None, None),
        "kill",
        (RET, _RET_KILL_PROCESS, None, None),
    ]
    return bpf(program)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program: bytes) -> None:
    """Install a seccomp filter on this process (and all it starts); `no_new_privs` must be set (or root)."""
    buffer = ctypes.create_string_buffer(program)
    prog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if _libc.prctl(_PR_SET_SECCOMP, 2, ctypes.addressof(prog), 0, 0) != 0:  # SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def _confine(plan: LaunchPlan, writable: str | None) -> None:
    """The landlock backend's confinement of one process, after its privileges are dropped."""
    _landlock(plan["landlock_rules"], writable, plan["network"])
    install_seccomp(seccomp_program(plan["network"], os.getpgrp()))


def _landlock_labels(network: bool) -> list[str]:
    """What `_landlock` applies on this kernel (the isolation the run reports)."""
    abi = landlock_abi()
    labels = [f"landlock_abi_{abi}", "landlock_fs"]
    return (
        labels
        + (["landlock_tcp"] if abi >= 4 and not network else [])
        + (["landlock_scopes"] if abi >= 6 else [])
    )


def _keeps_read_search(plan: LaunchPlan) -> bool:
    """Whether the run's uids keep CAP_DAC_READ_SEARCH: never under the namespaces backend (its private root
    binds the interpreter where they can reach it); under landlock (Landlock is the read policy) and under
    the unsafe-local opt-in (whose code may read the caller's files anyway) when `_read_search_needed`."""
    return not plan["private_root"] and _read_search_needed(plan)


def _read_search_needed(plan: LaunchPlan) -> bool:
    """Whether the dropped uids need CAP_DAC_READ_SEARCH to reach the interpreter: as root, when a directory on
    the way to one of its prefixes is closed to others (a venv under /root, mode 700). Landlock, not file
    permissions, is then what limits reading to the system and the interpreter."""
    if plan["uids"]["candidate"] is None:
        return False
    return not all(_open_to_others(p) for p in _interpreter_prefixes(plan["python"]))


def _open_to_others(path: str) -> bool:
    parts = os.path.realpath(path).split(os.sep)
    dirs = ["/"] + [os.sep + os.path.join(*parts[1:i]) for i in range(2, len(parts) + 1)]
    try:
        return all(os.stat(d).st_mode & 0o005 == 0o005 for d in dirs)
    except OSError:
        return False


def _sweep(plan: LaunchPlan) -> None:
    """Kill every process the run left (the landlock backend has no PID namespace to do it): every process of
    the run's uids (as root), and every descendant, which this subreaper inherits as their parents end.
    Reports on the status pipe whether it ended with no process left (``swept``) or why not (``sweep_error``):
    the host fails the answer of a run that could not be swept, and only that answer."""
    try:
        for uid in {u for u in plan["uids"].values() if u is not None}:
            pid = os.fork()
            if pid == 0:
                try:
                    os.setgroups([])
                    os.setresgid(uid, uid, uid)
                    os.setresuid(uid, uid, uid)
                    os.kill(-1, signal.SIGKILL)  # every process this uid may signal; atomic against fork
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
        for _ in range(10_000):
            children = _children()
            if not children:
                break
            for child in children:
                _kill(child)
            for child in children:
                try:  # noqa: SIM105 - contextlib is one more import per scored answer
                    os.waitpid(child, 0)
                except ChildProcessError:
                    pass
        else:
            raise RuntimeError("processes were still being started after 10,000 rounds of killing")
        report: dict[str, object] = {"swept": True}
    except Exception as exc:  # noqa: BLE001 - any failure is this run's, reported with its cause
        report = {"sweep_error": f"{type(exc).__name__}: {exc}"[:500]}
    for status in _STATUS:
        try:  # noqa: SIM105 - contextlib is one more import per scored answer
            status.write(repr(report) + "\n")
            status.flush()
        except (OSError, ValueError):
            pass


_CHILDREN_FD: list[int] = []  # /proc/<self>/task/<self>/children, opened before the code runs


def _hold_children_file() -> None:
    """Open the file that lists this process's children now, while its descriptors and limits are its own:
    the sweep then reads it again (`pread`) without opening anything."""
    me = os.getpid()
    try:  # noqa: SIM105 - contextlib is one more import per scored answer
        _CHILDREN_FD.append(os.open(f"/proc/{me}/task/{me}/children", os.O_RDONLY | os.O_CLOEXEC))
    except OSError:  # a kernel without it: `_children` walks /proc
        pass


def _children() -> list[int]:
    """This process's children (they are reaped here, so none is a zombie of another's)."""
    if _CHILDREN_FD:
        data, chunk = b"", b"."
        while chunk:
            chunk = os.pread(_CHILDREN_FD[0], 65536, len(data))
            data += chunk
        return [int(pid) for pid in data.split()]
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                if entry.isdigit() and int(fh.read().rsplit(")", 1)[1].split()[1]) == me:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


# --- the processes --------------------------------------------------------------------------------------------


def _run_judge(plan: LaunchPlan, judge: JudgePlan, reply_r: int, request_w: int, status: TextIO) -> NoReturn:
    """The judge's process (never returns): the harness's `judge` with the tests, behind its own uid."""
    fds = plan["fds"]
    try:
        # A session and process group of its own: no signal to the candidate's group, or to the launcher's
        # (the host's), reaches it.
        os.setsid()
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds["judge_log"], 1)
        os.dup2(fds["judge_log"], 2)
        keep = {0, 1, 2, reply_r, request_w, fds["verdict"], status.fileno()}
        _close_all_but(keep)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _limit(judge["limits"])
        _drop_privileges(plan["uids"]["judge"], _keeps_read_search(plan))
        _prctl(_PR_SET_DUMPABLE, 0)  # after the uid change, which resets it
        _die_with_launcher(signal.SIGKILL)  # outside the launcher's group, so the host's kill misses it
        if plan["landlock"]:
            _confine(plan, writable=None)  # the judge writes nothing
        status.close()  # open until here, so that a failure to contain the judge is reported (`_die`)
        _judge_imports(plan)
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
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # A signal cannot be re-raised on a PID 1, so how the program ended goes through the status pipe. SIGUSR1
    # (from the launcher once the judge is done, or on the launcher's death) ends the program here, so that its
    # reaping counts its CPU time.
    child = 0

    def end_program(*_: object) -> None:
        if child:
            _kill(child)

    signal.signal(signal.SIGUSR1, end_program)
    _die_with_launcher(signal.SIGUSR1)
    child = os.fork()
    if child == 0:
        _exec_candidate(plan, files_dir, workdir, rpc)
    _close_all_but({1, 2, status.fileno()})
    while True:  # reap what ends (as PID 1 of its namespace, the program's orphans too), leaving the program
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        pid = info.si_pid if info is not None else 0  # None only with WNOHANG
        if pid == child:
            break
        os.waitpid(pid, 0)
    # The program leads a process group that its processes cannot leave (landlock: seccomp refuses `setsid` and
    # `setpgid`); unreaped, it holds the group's id, so this kills exactly what it left running.
    _kill_group(child)
    _, wait_status = os.waitpid(child, 0)
    signum = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
    code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else 128 + (signum or 0)
    status.write(repr({"signal": signum, "exit_code": code}) + "\n")
    status.close()
    os._exit(code)


def _exec_candidate(plan: LaunchPlan, files_dir: str, workdir: str, rpc: dict[str, int] | None) -> NoReturn:
    try:
        # Its own session and process group, apart from the judge's and the launcher's: `kill(0, ...)` and
        # `killpg(getpgrp(), ...)` reach only the program's own processes.
        os.setsid()
        if not plan["stdin"]:
            os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
        keep = {0, 1, 2, _STATUS[0].fileno()}  # the status pipe closes on exec: `_die` reports until then
        os.set_inheritable(_STATUS[0].fileno(), False)
        if rpc:
            # The harness's candidate side reads requests on fd 3 and writes replies on fd 4 (moved up first:
            # either pipe may already sit on 3 or 4).
            request_r, reply_w = (fcntl.fcntl(rpc[k], fcntl.F_DUPFD, 10) for k in ("request_r", "reply_w"))
            os.dup2(request_r, 3)
            os.dup2(reply_w, 4)
            keep |= {3, 4}
        _close_all_but(keep)
        _limit(plan["limits"])
        _drop_privileges(plan["uids"]["candidate"], _keeps_read_search(plan))
        os.chdir(workdir)
        if plan["landlock"]:
            _confine(plan, writable=workdir)
        python = plan["python"]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
        # The math libraries' thread counts the host set for this process (`runner.ONE_THREAD`, why).
        env |= {k: v for k, v in os.environ.items() if k.endswith("_NUM_THREADS")}
        flags = ["-I"]
        if plan["landlock"]:  # the allowed packages come from the work directory's links (`_link_packages`)
            flags = ["-s", "-P"] if sys.version_info >= (3, 11) else ["-s"]
            env["PYTHONPATH"] = os.path.join(workdir, _PACKAGES_DIR)
        argv = [python, *flags, *[a.replace("{files}", files_dir) for a in plan["argv"]]]
        os.execve(python, argv, env)
    except BaseException as exc:  # noqa: BLE001 - never run the code half-contained
        _die(f"{type(exc).__name__}: {exc}")


def _kill(pid: int) -> None:
    try:  # noqa: SIM105 - contextlib is one more import per scored answer
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended (and was reaped) meanwhile
        pass


def _kill_group(pgid: int) -> None:
    try:  # noqa: SIM105 - contextlib is one more import per scored answer
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # nothing left in it (or only what the uid may not signal)
        pass


def _die_with_launcher(signum: int) -> None:
    """`signum` to this process when the launcher dies (a process in a session of its own is out of reach of
    the host's kill of the launcher's group). Set after any uid change, which clears it."""
    launcher = os.getppid()
    _prctl(_PR_SET_PDEATHSIG, signum)
    if os.getppid() != launcher:  # it died before the request took effect
        os.kill(os.getpid(), signum)


def _wait(plan: LaunchPlan, judge_pid: int | None, candidate_pid: int, status: TextIO) -> NoReturn:
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
    if plan["landlock"]:
        _sweep(plan)
    status.close()
    os._exit(code)


def _limit(limits: dict[str, int]) -> None:
    for name, value in limits.items():
        # A CPU hard limit above the soft one lets SIGXCPU (reported as cpu_limit) arrive before SIGKILL.
        hard = value + 1 if name == "RLIMIT_CPU" else value
        resource.setrlimit(getattr(resource, name), (value, hard))


def _drop_privileges(uid: int | None, read_search: bool = False) -> None:
    """To `uid` when the launcher is root; otherwise (root of a user namespace, or a plain user) no capabilities
    in any set, and none regained by exec. Both ways with `no_new_privs`: no setuid binary helps.

    `read_search` (the landlock backend as root, interpreter behind a closed directory): `uid` keeps
    CAP_DAC_READ_SEARCH alone, in every set including the ambient one (so it survives exec); it reads past file
    permissions, and Landlock confines it to the system and the interpreter; `open_by_handle_at`, the one call
    that capability opens beyond paths, is refused by the seccomp filter."""
    for cap in range(64):
        if cap == _CAP_DAC_READ_SEARCH and read_search:
            continue
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    _libc.prctl(_PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    if uid is not None:
        if read_search:
            _prctl(_PR_SET_KEEPCAPS, 1)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            _die("privilege drop did not take effect")
        _set_capabilities(1 << _CAP_DAC_READ_SEARCH if read_search else 0)
        if read_search and _libc.prctl(_PR_CAP_AMBIENT, 2, _CAP_DAC_READ_SEARCH, 0, 0) != 0:  # RAISE
            _die(f"PR_CAP_AMBIENT_RAISE: errno {ctypes.get_errno()}")
    else:
        _set_capabilities(0)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _set_capabilities(mask: int) -> None:
    """This process's effective, permitted and inheritable capabilities: exactly `mask` (capabilities < 32)."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = data[0].inheritable = mask
    if _libc.capset(ctypes.byref(header), data) != 0:
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


_STATUS: list[
    TextIO
] = []  # the status pipe, once open: a failure is reported there too (the code cannot write it)


_CODE_STARTED: list[
    bool
] = []  # set in the launcher once the code runs: a failure is then the run's, not setup's


def _die(message: str) -> NoReturn:
    print(f"cg-sandbox launcher: {message}", file=sys.stderr, flush=True)
    # Before the code started, the sandbox could not be set up (`launcher_error`: the host refuses the backend);
    # after, this run failed (`run_error`: the host fails this answer alone, with the cause).
    key = "run_error" if _CODE_STARTED else "launcher_error"
    for status in _STATUS:
        try:
            status.write(repr({key: message[:2000]}) + "\n")
            status.flush()
        except (OSError, ValueError):
            pass
    os._exit(_FAILED)


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]))
    except Exception as exc:  # noqa: BLE001 - any launcher failure must stop the run, never run the code
        _die(f"{type(exc).__name__}: {exc}")
