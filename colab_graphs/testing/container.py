"""Run a command as it would run in a container under Docker's default seccomp profile: no new namespaces.

    python -m colab_graphs.testing.container [--no-landlock] [--user UID] -- COMMAND [ARG ...]

installs a seccomp filter on this process (inherited by everything it starts, for good) and then execs
COMMAND. The filter answers ``EPERM`` to `unshare`, `setns` and `mount`, and to `clone` with any
``CLONE_NEW*`` flag; `clone3` gets ``ENOSYS`` (as Docker's profile does, so libc falls back to `clone`).
``--no-landlock`` also answers ``ENOSYS`` to the Landlock system calls (a kernel older than 5.13, or a
profile without them), which leaves no safe sandbox backend at all. ``--user UID`` drops to that uid (and
its gid) first, so the command runs as an unprivileged user (needs root).

Nothing else is touched: no root is needed (``PR_SET_NO_NEW_PRIVS`` comes first), the host is unchanged, and
the filter ends with the command. This is how the suite reproduces "unshare is refused" on a machine where
it is allowed. Linux on x86_64 and aarch64 only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_CLONE_NEW = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
# (audit arch, unshare, setns, mount, clone, clone3, landlock create_ruleset / add_rule / restrict_self)
_ARCH = {
    "x86_64": (0xC000003E, 272, 308, 165, 56, 435, (444, 445, 446)),
    "aarch64": (0xC00000B7, 97, 268, 40, 220, 435, (444, 445, 446)),
}


def filter_program(no_landlock: bool = False) -> bytes:
    """The classic BPF program (bytes of `struct sock_filter`) that the filter runs on every system call."""
    arch, unshare, setns, mount, clone, clone3, landlock = _ARCH[platform.machine()]
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
    # (code, k, jump-if-true label, jump-if-false label); labels resolve to the three returns at the end.
    program: list[tuple[int, int, str | None, str | None]] = [
        (ld, 4, None, None),  # seccomp_data.arch
        (jeq, arch, None, "allow"),
        (ld, 0, None, None),  # seccomp_data.nr
        *[(jeq, nr, "eperm", None) for nr in (unshare, setns, mount)],
        *[(jeq, nr, "enosys", None) for nr in (clone3, *(landlock if no_landlock else ()))],
        (jeq, clone, None, "allow"),
        (ld, 16, None, None),  # the low 32 bits of args[0]: clone's flags
        (jset, _CLONE_NEW, "eperm", "allow"),
    ]
    returns = {"allow": _RET_ALLOW, "eperm": _RET_ERRNO | errno.EPERM, "enosys": _RET_ERRNO | errno.ENOSYS}
    at = {name: len(program) + i for i, name in enumerate(returns)}
    out = []
    for i, (code, k, yes, no) in enumerate(program):
        jt = at[yes] - i - 1 if yes else 0
        jf = at[no] - i - 1 if no else 0
        out.append(struct.pack("HBBI", code, jt, jf, k))
    out += [struct.pack("HBBI", ret, 0, 0, value) for value in returns.values()]
    return b"".join(out)


def install(no_landlock: bool = False) -> None:
    """Install the filter on the calling process (and so on all it starts from now on)."""
    libc = ctypes.CDLL(None, use_errno=True)
    program = filter_program(no_landlock)
    buffer = ctypes.create_string_buffer(program)

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Prog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def main(argv: list[str]) -> None:
    no_landlock, user = False, None
    while argv and argv[0] != "--":
        flag = argv.pop(0)
        if flag == "--no-landlock":
            no_landlock = True
        elif flag == "--user" and argv:
            user = int(argv.pop(0))
        else:
            sys.exit(__doc__)
    if not argv[1:]:
        sys.exit(__doc__)
    if user is not None:
        os.setgroups([])
        os.setgid(user)
        os.setuid(user)
    install(no_landlock)
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
