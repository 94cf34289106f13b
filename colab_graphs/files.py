"""The files a user hands us (read with errors that name file and line) and the folders a command owns.

- `read_text` / `text_lines`: UTF-8, a byte-order mark accepted (editors on Windows write one), and a byte that
  is not UTF-8 named by file, line and column instead of Python's ``'utf-8' codec can't decode byte 0xff in
  position 1234``.
- `atomic_file` / `atomic_write_text`: a file another command may read (a report, a log, a model's marker) is
  replaced whole or not at all, so a killed writer never leaves half a file where finished work was.
- `OutLock`: an output folder is written by one command at a time. Two audits into one ``--out`` used to both
  exit 0 with their plays interleaved (1,600 play records for 800 plays, call numbers meaning two calls). The
  lock is an ``flock`` on ``OUT/.colab-graphs.lock``, which names its holder (pid, host, command); the kernel
  drops it when the holder dies, however it dies, so a crashed command never blocks the folder.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Any, TextIO

BOM = b"\xef\xbb\xbf"
LOCK_FILE = ".colab-graphs.lock"


def _undecodable(path: Path, data: bytes, exc: UnicodeDecodeError, line_offset: int = 0) -> str:
    line = data.count(b"\n", 0, exc.start) + 1 + line_offset
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    byte = data[exc.start : exc.start + 1].hex()
    return (
        f"{path}:{line}: not UTF-8 text (byte 0x{byte} at column {column}); save the file as UTF-8 "
        "(e.g. `iconv -f latin1 -t utf-8`)"
    )


def read_text(path: str | os.PathLike[str], error: type[Exception] = ValueError, what: str = "file") -> str:
    """The UTF-8 text of `path` (a leading byte-order mark dropped).

    Raises:
        error: `path` is missing, is a folder, or is not UTF-8 (naming the line and column).
    """
    path = Path(path)
    if path.is_dir():
        raise error(f"{path} is a folder; expected a {what}")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    data = data.removeprefix(BOM)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(_undecodable(path, data, exc)) from None


@contextlib.contextmanager
def text_lines(
    path: str | os.PathLike[str], error: type[Exception] = ValueError
) -> Iterator[Iterator[tuple[int, str]]]:
    """Open the UTF-8 file `path` for reading line by line: yields an iterator of (line number, line), a
    byte-order mark on line 1 dropped; the file is closed when the block ends, however it ends.

    Raises:
        error: `path` is a folder, or a line is not UTF-8 (naming the file, the line and the column).
    """
    path = Path(path)
    if path.is_dir():
        raise error(f"{path} is a folder; expected a file")

    def lines(fh: IO[bytes]) -> Iterator[tuple[int, str]]:
        for lineno, raw in enumerate(fh, start=1):
            if lineno == 1:
                raw = raw.removeprefix(BOM)
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise error(_undecodable(path, raw, exc, lineno - 1)) from None

    with path.open("rb") as fh:
        yield lines(fh)


class FolderBusy(RuntimeError):
    """Another live command is writing the folder; the message names it."""

    exit_code = 5


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[TextIO]:
    """A UTF-8 text file that replaces `path` when the block ends, and leaves `path` as it was if the block raises.

    Readers (the viewer, a resumed audit, a rerun command) see the old file or the new one, never part of one:
    the text goes to a hidden file beside `path` (the same filesystem, so the rename is atomic), is flushed to
    the disk, then renamed over `path`. The hidden name carries the process and thread, so concurrent writers of
    one path never write into each other's file (the last rename wins).

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "summary.json"
        >>> with atomic_file(path) as fh:
        ...     _ = fh.write("{}")
        >>> path.read_text()
        '{}'
    """
    path = Path(path)
    temp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with open(temp, "w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace `path` with `text` (UTF-8) whole or not at all (see `atomic_file`)."""
    with atomic_file(path) as fh:
        fh.write(text)


# Folders held by this flow of work (a command, and the library functions it calls: the CLI locks --out, then
# `play_audit` locks it again and holds it once). A context variable, not a process-wide table, so that two
# concurrent audits of one process into one folder still exclude each other.
_held: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "colab_graphs_out_locks", default=frozenset()
)


class OutLock:
    """Hold `folder` for writing while in the `with` block; a second writer gets `FolderBusy`.

    Example:
        >>> import tempfile
        >>> with OutLock(tempfile.mkdtemp(), "audit"):
        ...     pass
    """

    def __init__(self, folder: str | os.PathLike[str], command: str | None = None):
        self.folder = Path(folder)
        self.command = command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        self._file: IO[str] | None = None
        self._token: contextvars.Token[frozenset[str]] | None = None

    def __enter__(self) -> OutLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        key = str(self.folder.resolve())
        if key in _held.get():
            return self
        fh = open(self.folder / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 - open while the lock is held
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            held_by = fh.read()
            fh.close()
            raise FolderBusy(_busy_message(self.folder, held_by)) from None
        fh.seek(0)
        fh.truncate()
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": self.command,
            "since": time.time(),
        }
        fh.write(json.dumps(holder) + "\n")
        fh.flush()
        self._file = fh
        self._token = _held.set(_held.get() | {key})
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._file is None:
            return  # held by the caller
        if self._token is not None:
            _held.reset(self._token)
        self._file.close()  # releases the flock; the file stays (deleting it would race the next holder)
        self._file = None


def empty_folder(folder: str | os.PathLike[str]) -> None:
    """Discard what an earlier job wrote in `folder` (`--overwrite`), keeping the folder and its lock (held by
    the caller)."""
    import shutil

    folder = Path(folder)
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def holding(folder: str | os.PathLike[str] | None, command: str | None = None) -> AbstractContextManager[Any]:
    """`OutLock(folder)`, or nothing to hold when there is no folder (work kept in memory)."""
    return contextlib.nullcontext() if folder is None else OutLock(folder, command)


def _busy_message(folder: Path, holder: str) -> str:
    try:
        info = json.loads(holder)
        who = f"pid {info['pid']} on {info['host']} ({info['command']})"
    except (ValueError, KeyError, TypeError):
        who = "another process"
    return (
        f"{folder} is being written by {who}; wait for it to finish, or choose another --out "
        "(the lock goes away by itself when that process exits)"
    )
