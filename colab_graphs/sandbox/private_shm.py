"""A private `/dev/shm` for `multiprocessing` under the landlock backend, at the level of Python.

The landlock backend has no mount namespace, so no `/dev/shm` of the run's own can be mounted, and granting the
host's would expose every segment in it (the host's, other runs'). The C library hard-codes where named
semaphores (`/dev/shm/sem.NAME`) and shared memory (`/dev/shm/NAME`) live, so `multiprocessing`'s locks,
queues, pools, `Value`/`Array` and `shared_memory` fail there with EACCES. This module gives them a directory
of the run's own instead: the launcher copies it into the run's `.packages` as `_cg_private_shm`, and the
run's `sitecustomize` patches, when (and only when) the code imports them,

- `_multiprocessing.SemLock` / `sem_unlink`: a counting or recursive semaphore kept in a file of the private
  directory (its value as 8 bytes, changed under a POSIX record lock, which belongs to the process, so a forked
  child is another owner; a thread lock orders the process's own threads), blocking by polling with backoff
  and honouring timeouts, with `_rebuild` (spawn: reopened by name), `_after_fork`, `_is_mine`, `_count`,
  `_get_value` and `_is_zero` as the C type has them;
- `_posixshmem.shm_open` / `shm_unlink`: files of the private directory;
- `multiprocessing.heap.Arena`'s directory (what `Value` and `Array` allocate from).

The private directory lies in the run's work directory (`.shm`), the only place Landlock lets the run write,
and goes with it; another run's is in another work directory, which this run's Landlock rules do not name.
A C extension that calls `sem_open` or `shm_open` itself still meets EACCES (fail closed): see docs/sandbox.md.

Only the standard library, imported only when the code uses `multiprocessing`'s shared state.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
import time

SEM_VALUE_MAX = 2147483647
_RECURSIVE_MUTEX, _SEMAPHORE = 0, 1
_VALUE = struct.Struct("q")
_FIRST_WAIT_S, _LONGEST_WAIT_S = 0.0001, 0.005  # the poll's backoff while a semaphore is at zero
_DIR: list[str] = []  # the private directory, once `install` has named it


class _ProcessLock:
    """Orders this process's threads around the record lock (POSIX record locks belong to the process: two of
    its threads would both hold one). A forked child starts with a fresh one: the thread that held the parent's
    does not exist there."""

    lock = threading.Lock()

    @classmethod
    def renew(cls) -> None:
        cls.lock = threading.Lock()


os.register_at_fork(after_in_child=_ProcessLock.renew)


def _path(name: str, prefix: str = "") -> str:
    """The file of a semaphore or segment named as the C library takes it: leading slashes dropped, no other."""
    bare = name.lstrip("/")
    if not _DIR:
        raise OSError(errno.ENOSYS, "the run's private /dev/shm is not set up")
    if not bare or "/" in bare or bare in (".", ".."):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), name)
    return os.path.join(_DIR[0], prefix + bare)


def _reraise(exc: OSError, name: str) -> OSError:
    """The error as the C functions give it: by errno, naming what the code asked for (not the file)."""
    return OSError(exc.errno, os.strerror(exc.errno or 0), name)


class SemLock:
    """`_multiprocessing.SemLock` over a file of the private directory."""

    SEM_VALUE_MAX = SEM_VALUE_MAX

    def __init__(self, kind: int, value: int, maxvalue: int, name: str, unlink: bool) -> None:
        if kind not in (_RECURSIVE_MUTEX, _SEMAPHORE):
            raise ValueError("unrecognized kind")
        if not 0 <= value <= SEM_VALUE_MAX:
            raise ValueError("invalid value")
        path = _path(name, "sem.")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise _reraise(exc, name) from None
        os.pwrite(fd, _VALUE.pack(value), 0)
        if unlink:  # the fork context: children inherit the open file, nobody reopens it by name
            os.unlink(path)
        self._setup(fd, kind, maxvalue, None if unlink else name)

    def _setup(self, fd: int, kind: int, maxvalue: int, name: str | None) -> None:
        self.handle, self.kind, self.maxvalue, self.name = fd, kind, maxvalue, name
        self.count, self.last_tid = 0, 0  # this process's acquisitions, and the thread of the last one

    @classmethod
    def _rebuild(cls, handle: int, kind: int, maxvalue: int, name: str | None) -> SemLock:
        """In a spawned child: reopen by name (a forked child, `name` None, holds the same descriptor)."""
        self = cls.__new__(cls)
        if name is not None:
            try:
                handle = os.open(_path(name, "sem."), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError as exc:
                raise _reraise(exc, name) from None
        self._setup(handle, kind, maxvalue, name)
        return self

    def _change(self, step: int, limit: int | None = None) -> int | None:
        """Add `step` to the value unless that would take it below 0 (or `limit` would be passed); the value
        before, or None when it was left as it was."""
        with _ProcessLock.lock:
            fcntl.lockf(self.handle, fcntl.LOCK_EX, _VALUE.size, 0)
            try:
                (value,) = _VALUE.unpack(os.pread(self.handle, _VALUE.size, 0))
                if value + step < 0 or (limit is not None and value >= limit):
                    return None
                os.pwrite(self.handle, _VALUE.pack(value + step), 0)
                return int(value)
            finally:
                fcntl.lockf(self.handle, fcntl.LOCK_UN, _VALUE.size, 0)

    def _is_mine(self) -> bool:
        return self.count > 0 and self.last_tid == threading.get_ident()

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        if self.kind == _RECURSIVE_MUTEX and self._is_mine():
            self.count += 1
            return True
        deadline = None if not block or timeout is None else time.monotonic() + max(timeout, 0.0)
        wait = _FIRST_WAIT_S
        while self._change(-1) is None:
            if not block or (deadline is not None and time.monotonic() >= deadline):
                return False
            pause = wait if deadline is None else min(wait, max(deadline - time.monotonic(), 0.0))
            time.sleep(pause)
            wait = min(wait * 2, _LONGEST_WAIT_S)
        self.count += 1
        self.last_tid = threading.get_ident()
        return True

    def release(self) -> None:
        if self.kind == _RECURSIVE_MUTEX:
            if not self._is_mine():
                raise AssertionError("attempt to release recursive lock not owned by thread")
            if self.count > 1:
                self.count -= 1
                return
        if self._change(1, limit=self.maxvalue) is None:
            raise ValueError("semaphore or lock released too many times")
        self.count -= 1

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_: object) -> None:
        self.release()

    def _count(self) -> int:
        return self.count

    def _get_value(self) -> int:
        with _ProcessLock.lock:
            return int(_VALUE.unpack(os.pread(self.handle, _VALUE.size, 0))[0])

    def _is_zero(self) -> bool:
        return self._get_value() == 0

    def _after_fork(self) -> None:
        self.count = 0

    def __del__(self) -> None:
        try:  # noqa: SIM105 - kept to the standard library's cheapest form
            os.close(self.handle)
        except (OSError, AttributeError):  # half-built, or closed already
            pass


def sem_unlink(name: str) -> None:
    try:
        os.unlink(_path(name, "sem."))
    except OSError as exc:
        raise _reraise(exc, name) from None


def shm_open(path: str, flags: int, mode: int = 0o777) -> int:
    try:
        return os.open(_path(path), flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise _reraise(exc, path) from None


def shm_unlink(path: str) -> None:
    try:
        os.unlink(_path(path))
    except OSError as exc:
        raise _reraise(exc, path) from None


def install(directory: str, module: object) -> None:
    """Point the module just imported (`_multiprocessing`, `_posixshmem` or `multiprocessing.heap`) at the
    private directory `directory`."""
    _DIR[:] = [directory]
    name = getattr(module, "__name__", "")
    if name == "_multiprocessing":
        module.SemLock, module.sem_unlink = SemLock, sem_unlink  # type: ignore[attr-defined]
    elif name == "_posixshmem":
        module.shm_open, module.shm_unlink = shm_open, shm_unlink  # type: ignore[attr-defined]
    elif name == "multiprocessing.heap" and hasattr(module, "Arena"):
        module.Arena._dir_candidates = [directory]
