"""Run a command as a plain user on this environment's interpreter, changing nothing on the host.

A venv whose interpreter lies behind a directory closed to others (here /work/venv links to
/root/.pyenv/..., and /root is mode 700) cannot be run by `nobody`. As root, `python -I plain_user.py
PREFIX... -- COMMAND...` enters a mount namespace of its own (private propagation: nothing it mounts reaches
the host), covers each closed directory on the way to a prefix with a mode-755 tmpfs, binds the prefix back
into it read-only, and execs COMMAND (which drops to the plain uid itself: `setpriv`, or
`colab_graphs.testing.container --user`). The host's mounts and files are untouched; the namespace ends with
the command. Without CAP_SYS_ADMIN (a non-root caller, a container) it exits `CANNOT` with the reason, which
the tests turn into a skip.
"""

from __future__ import annotations

import ctypes
import os
import sys

CANNOT = 77
_CLONE_NEWNS, _MS_RDONLY, _MS_NOSUID, _MS_NODEV = 0x00020000, 1, 2, 4
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18


def closed_directory(path: str) -> str | None:
    """The outermost directory on the way to `path` that others may not enter, or None."""
    parts = os.path.realpath(path).split(os.sep)[1:]
    for i in range(1, len(parts) + 1):
        at = os.sep + os.path.join(*parts[:i])
        if os.stat(at).st_mode & 0o005 != 0o005:
            return at
    return None


def interpreter_prefixes() -> list[str]:
    """The real prefixes of this interpreter (a venv's and its base install's) and its executable's directory."""
    found = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    found.add(os.path.dirname(os.path.realpath(sys.executable)))
    return sorted({os.path.realpath(p) for p in found})


def command(argv: list[str]) -> list[str]:
    """`argv` run through this module (as root) where a prefix of this interpreter is closed to others."""
    closed = [p for p in interpreter_prefixes() if closed_directory(p)]
    closed = [p for p in closed if not any(p.startswith(q + os.sep) for q in closed)]  # one bind holds both
    if not closed:
        return argv
    return [sys.executable, "-I", os.path.abspath(__file__), *closed, "--", *argv]


def _fail(message: str) -> None:
    print(f"plain_user: {message}", file=sys.stderr, flush=True)
    os._exit(CANNOT)


def _mount(
    libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int, data: str
) -> None:
    args = [s.encode() if s is not None else None for s in (source, target, fstype, data)]
    if libc.mount(args[0], args[1], args[2], flags, args[3]) != 0:
        errno = ctypes.get_errno()
        _fail(
            f"mount {source or ''} on {target}: {os.strerror(errno)} (a mount namespace needs CAP_SYS_ADMIN)"
        )


def main(prefixes: list[str], argv: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    if libc.unshare(_CLONE_NEWNS) != 0:
        _fail(f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())} (needs CAP_SYS_ADMIN)")
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, "")
    # Held in this namespace (a bind's source must be in it) before a tmpfs covers them.
    held = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in prefixes}
    covered: set[str] = set()
    for prefix in prefixes:
        closed = closed_directory(prefix)
        if closed is None:
            continue
        if closed not in covered:
            _mount(libc, "cg-plain-user", closed, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=755")
            covered.add(closed)
        os.makedirs(prefix, mode=0o755, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{held[prefix]}", prefix, None, _MS_BIND | _MS_REC, "")
        _mount(libc, None, prefix, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, "")
    for fd in held.values():
        os.close(fd)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    split = sys.argv.index("--")
    main(sys.argv[1:split], sys.argv[split + 1 :])
