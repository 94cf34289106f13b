"""The code harness: the tests decide, in a judge process that the code under test cannot reach.

One scored answer runs as two processes (`colab_graphs.sandbox.code_tests.run_tests` asks
`colab_graphs.sandbox.runner.run_judged` to start and contain both):

- the **candidate**: a fresh interpreter runs the reply's code as module ``solution`` (so an
  ``if __name__ == "__main__":`` demo does not run), reports the callables it defined, then answers requests on
  a pipe: call this function or class, read or set this attribute. It never sees the tests, only the arguments
  the tests pass.
- the **judge**: holds the tests, the question's own definitions and the verdict. It runs the tests with each
  name they use from the solution bound to a proxy that forwards calls over the pipe, and decides pass or fail.
  Only the judge writes the verdict; the candidate's output is read for debugging and never looked at.

What crosses the pipe is plain data (`_Pipe` says how it is framed): None, bool, int, float (NaN and infinities
included), str, builtin types (`int` passed as an argument arrives as the other side's own `int`), and tagged
containers that the receiving side rebuilds from its own builtins: list, tuple, set, frozenset, dict (any plain
keys), bytes, bytearray, complex, Fraction, Decimal, range, dict views (keys, values, items, in order), iterators
(a returned generator is drained in the candidate and arrives as an iterator over its items), and numpy arrays
and scalars of plain dtypes (booleans, numbers, fixed-size text and bytes, datetimes), as their dtype's string,
shape and bytes. So no object with a custom ``__eq__`` ever reaches the judge: a candidate's value either
rebuilds as plain data or stays behind in the candidate as a **handle**, an opaque reference the tests may pass
back, call, and read or set attributes through (MBPP's tree tests build ``Node`` objects this way), but which
refuses to compare, hash, iterate or be true or false (a ``TypeError``: the test fails).

Nothing crossing runs code in the judge: JSON is parsed by `json`, every value is built by the judge's own
types (`Reader`), and a numpy value by the judge's numpy from bytes alone, after its dtype string is checked to
name a plain dtype (`_numpy_dtype`: never ``object``, never a structured record) and its bytes to be exactly
as many as its shape needs. Nothing is unpickled. (numpy is imported in the judge only when a numpy value
arrives, or the test imports it; the judge imports only the sandbox's allowed packages, as the candidate does:
`launcher._judge_imports`.)

Semantics the tests see (as in one process, where the tests call the solution directly):

- Identity: every container (list, tuple, set, frozenset, dict, bytearray) and numpy array is numbered once per
  message (`Writer`, `Reader`): one the message holds twice arrives as one object (aliasing and cycles survive),
  and one the test passed comes back as the test's own object: ``def clone(xs): return xs`` returns ``xs``
  itself (a test asserting ``result is not xs`` fails it, as it would in one process), a function that stores
  an argument in another (``a.append(b)``) stores the test's ``b``. The same object of the candidate's returned
  twice is one handle. Numbers, strings and bytes arrive equal, not identical (their identity is CPython's).
- Changes to arguments: after each call (also one that raised) the candidate sends back the new items of every
  mutable container and array the test passed that the call changed, nested ones included, and the judge puts
  them into its own objects, which keep their identity and type (a ``Counter`` stays one): an in-place sort, a
  row sorted inside a matrix (the test's reference to that row sees it), an array filled in place. Views of a
  numpy array are not tracked (a change through one arrives in the array itself only when it was passed).
  Both hold within one call: an argument the solution keeps for later (a registry, a cache) is its own copy,
  and what a later call does to it does not reach the test's object.
- The solution runs as a real module named ``solution``, importable from its directory: its functions and
  classes pickle by reference, so ``multiprocessing`` (fork or spawn) and ``concurrent.futures`` can send them
  to worker processes, as a module's can.
- numpy values compare as numpy's: an ``np.int64`` compared ``== 3`` is true, ``np.array_equal`` works, and
  ``array == [1, 2]`` in an ``assert`` raises numpy's ambiguity error, as it would in one process.
- A candidate's exception is raised in the judge as the first builtin exception class in its MRO, with its
  message (a test expecting ``ValueError`` sees one); a class whose only builtin base is ``Exception`` arrives
  as `CandidateError` (an ``Exception``). ``StopIteration`` (and ``StopAsyncIteration``) arrives as a
  ``RuntimeError``: raised from a call inside the test's ``all(map(lambda x: candidate(x) == ..., xs))`` it
  would silently end ``map`` and pass the test, so a call that raises it failed, as PEP 479 makes of one that
  escapes a generator. ``SystemExit``, ``KeyboardInterrupt`` and any other non-``Exception`` fail the run
  whatever the test catches, as do a crash, an exit, a protocol violation or a call past its deadline.
- Names: the tests run as the judge's ``__main__``, on its own builtins and modules. A name the tests use is
  the tests' own definition; else the record's entry point, always the solution's (a proxy), even where it
  has a builtin's name (MBPP 126 asks for ``sum``) or the question has a stub of it; else the question's
  code (HumanEval's ``poly``, ``encode_cyclic``: the question's version, never a redefinition in the reply);
  else the builtin; else the standard-library module of that name, imported by the judge (MBPP's tests use
  ``sys``, ``math``, ``re`` without importing them); only then a proxy for the solution's callable of that
  name (a class the task asks for: MoCo's ``Pair``). A reply adds names, never replaces one: its ``class
  sys`` or ``def set`` is not the test's. A test that only defines ``check(candidate)`` is called with the
  entry point.
- ``unittest``: ``sys.argv`` is ``["test.py"]`` (the judge's own arguments would name tests), and every
  failure or error of a unittest run in the judge fails the verdict, whatever the test does with its result:
  ``unittest.main()``, ``exit=False``, ``argv=...``, ``module=...`` and a runner whose result nobody reads
  all fail wrong code, as their traceback does in a script run on its own.
- A test that completes without a single request to the candidate reports ``calls == 0`` (the scorer refuses
  such a test: it checks nothing).

Not supported (the test fails): passing a function, a class of the test's own or another non-plain value
to the candidate, module attributes of the solution other than callables, more than 16 MiB in one reply, nesting deeper
than 200 levels, a generator longer than 100,000 items (an infinite one the test would only partly consume),
numpy arrays of objects or records, and other libraries' values (a pandas frame stays a handle).

This file runs in two places, compiled once per host process by the sandbox's interpreter: the judge executes
it and calls `judge`; the candidate's interpreter runs it as `__main__` with the solution's path (as
``python -I code_harness.py solution.py`` would). It uses only the standard library, imports nothing slow on
the candidate's side (it starts once per scored answer), and must stay runnable on the system interpreter
(Python 3.10 or newer).
"""

from __future__ import annotations

import builtins
import marshal
import os
import select
import sys
import time

try:
    from _json import encode_basestring_ascii as _quote
except ImportError:  # an interpreter without the C accelerator
    from json.encoder import py_encode_basestring_ascii as _quote

# `typing` is not imported at run time (the candidate's side starts once per scored answer). Values are
# dispatched on their exact type, taken once (`kind = type(value)`), which mypy does not narrow through: a
# function that dispatches so takes `Any`. What arrives from the pipe is `Any` too until `decode` checks it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn, TypeAlias

    # The plain data that crosses the pipe, as `encode` writes it.
    Wire: TypeAlias = "None | bool | int | float | str | list[Wire] | dict[str, Wire]"

_MAX_MESSAGE = 16 * 1024**2
_MAX_DEPTH = 200
_MAX_ITEMS = 100_000
_BIG_INT = 2**63
_OPAQUE = "a value the solution returned that is not plain data stays in the candidate: it cannot be compared"

# --- plain data on the wire ---------------------------------------------------------------------------------------


class WireError(Exception):
    """A message that is not plain data in the harness's format (or too big, too deep)."""


# Values with an identity a test can observe (`is`, in-place changes): each crosses once per message, numbered in
# the order it is written, and a second sight of it is a reference to that number.
_CONTAINERS = frozenset({list, tuple, set, frozenset, dict, bytearray})
_MUTABLE = frozenset({list, set, dict, bytearray})
# numpy dtypes that cross as their bytes (the dtype's own string, checked by `_numpy_dtype`): booleans, integers,
# floats, complex numbers, fixed-size bytes and text, datetimes; never objects or structured records.
_NUMPY_KINDS = "biufcSUmM"


class Writer:
    """`encode` for one message: plain data as JSON-ready trees, the other side rebuilding every value from its
    own types.

    Every container (and numpy array) is numbered in the order it is written; written again, it becomes
    ``{"same": n}`` (aliasing and cycles survive). On the candidate's side `arguments` maps the id of each
    container the judge sent for this call to its number there, so a returned or stored argument crosses as
    ``{"arg": n}`` and the judge puts its own object there: the test's object itself, as in one process.
    `handle(value)` is asked for anything else (it returns a tag or raises). `kept` holds what was numbered
    (alive, so no id is reused while the message is written; the judge's originals for the reply's ``arg``)."""

    def __init__(
        self, handle: Callable[[Any, Writer], Wire], arguments: dict[int, int] | None = None
    ) -> None:
        self.handle, self.arguments = handle, arguments or {}
        self.numbers: dict[int, int] = {}
        self.kept: list[Any] = []

    def write(self, value: Any, depth: int = 0) -> Wire:
        if depth > _MAX_DEPTH:
            raise WireError(f"nested deeper than {_MAX_DEPTH} levels")
        if value is None or value is True or value is False:
            return value
        kind = type(value)
        if kind is str or kind is float:
            return value  # type: ignore[no-any-return]  # a str or a float, which mypy cannot tell from `kind`
        if kind is int:
            return value if -_BIG_INT < value < _BIG_INT else {"int": format(value, "x")}
        if kind in _CONTAINERS or _numbered_otherwise(value, kind):
            key = id(value)
            if key in self.arguments:
                return {"arg": self.arguments[key]}
            if key in self.numbers:
                return {"same": self.numbers[key]}
            self.numbers[key] = len(self.kept)
            self.kept.append(value)
        return self.body(value, depth)

    def body(self, value: Any, depth: int = 0) -> Wire:
        """`value` written out, without numbering it (the candidate's report of an argument it changed)."""
        kind, inner = type(value), depth + 1
        if kind is list or kind is tuple or kind is set or kind is frozenset:
            return {kind.__name__: [self.write(v, inner) for v in value]}
        if kind is dict:
            return {"dict": [[self.write(k, inner), self.write(v, inner)] for k, v in value.items()]}
        if kind is bytes or kind is bytearray:
            return {kind.__name__: value.hex()}
        if kind is complex:
            return {"complex": [value.real, value.imag]}
        if kind is range:
            return {"range": [value.start, value.stop, value.step]}
        if kind is type and getattr(builtins, getattr(value, "__name__", ""), None) is value:
            # A builtin type (MBPP's `remove_datatype(t, int)`): the other side's own.
            return {"type": getattr(value, "__name__", "")}
        name = f"{kind.__module__}.{kind.__qualname__}"
        if name in ("fractions.Fraction", "decimal.Decimal"):
            return {name.split(".")[1].lower(): str(value)}
        if kind.__module__ == "numpy" and _numpy_array_or_scalar(value):
            return {
                "ndarray" if kind.__name__ == "ndarray" else "numpy": [
                    value.dtype.str,
                    [int(n) for n in value.shape],
                    value.tobytes().hex(),
                ]
            }
        if kind.__module__ == "builtins" and kind.__name__ in ("dict_keys", "dict_values"):
            return {kind.__name__: [self.write(v, inner) for v in value]}
        if kind.__module__ == "builtins" and kind.__name__ == "dict_items":
            return {"dict_items": [[self.write(k, inner), self.write(v, inner)] for k, v in value]}
        base = _plain_base(value) if kind not in _PLAIN else None
        if base in _CONTAINERS:  # a namedtuple, a Counter: its base's value (numbered as itself, by `write`)
            return self.body(base(value), depth)
        if base is not None:  # an IntEnum, a str subclass: its base's value
            return self.write(base(value), depth)
        return self.handle(value, self)


def _numpy_array_or_scalar(value: Any) -> str | None:
    """ "ndarray" or "scalar" for a numpy array or scalar of a dtype that crosses as bytes; else None."""
    dtype = getattr(value, "dtype", None)
    if getattr(dtype, "kind", "") not in tuple(_NUMPY_KINDS) or getattr(dtype, "hasobject", True):
        return None
    if type(value).__name__ == "ndarray":
        return "ndarray"
    return "scalar" if getattr(value, "shape", None) == () and hasattr(value, "tobytes") else None


_PLAIN = frozenset({bool, int, float, complex, str, bytes, range, type})


def _numbered_otherwise(value: Any, kind: type) -> bool:
    """Whether a value not of a container type crosses as one (so `Reader` numbers it): a numpy array, or a
    container's subclass (a namedtuple, a Counter), which crosses as its base."""
    if kind in _PLAIN:
        return False
    if kind.__module__ == "numpy":
        return _numpy_array_or_scalar(value) == "ndarray"
    return _plain_base(value) in _CONTAINERS


def encode(value: Any, handle: Callable[[Any, Writer], Wire]) -> Wire:
    """`value` as JSON-ready plain data (one message's `Writer`)."""
    return Writer(handle).write(value)


class Reader:
    """`decode` for one message: plain data rebuilt with this process's own types. Containers are numbered in the
    order they are read, as `Writer` numbered them, so ``{"same": n}`` is the object read as number n;
    ``{"arg": n}`` is `arguments[n]` (the judge's own objects it sent for this call); ``{"ref": n}`` is
    `resolve(n)` (a handle). `made` lists what was numbered."""

    def __init__(self, resolve: Callable[[int], Any], arguments: list[Any] | None = None) -> None:
        self.resolve, self.arguments = resolve, arguments
        self.made: list[Any] = []

    def read(self, data: Any, depth: int = 0, number: bool = True) -> Any:
        if depth > _MAX_DEPTH:
            raise WireError(f"nested deeper than {_MAX_DEPTH} levels")
        if data is None or data is True or data is False:
            return data
        kind = type(data)
        if kind is str or kind is float or kind is int:
            return data
        if kind is not dict or len(data) != 1:
            raise WireError(f"not a value: {str(data)[:80]}")
        (tag, body), inner = next(iter(data.items())), depth + 1
        if tag in ("same", "arg", "ref"):
            return self._reference(tag, body)
        if tag in _NUMBERED and number:
            at = len(self.made)
            self.made.append(_BUILDING)
            value = self._container(tag, body, inner, at)
            self.made[at] = value
            return value
        if tag in _NUMBERED:
            return self._container(tag, body, inner, None)
        if tag in _SEQUENCES:
            return _SEQUENCES[tag]([self.read(v, inner) for v in _list(body)])
        if tag == "dict_items":
            return self._pairs(body, inner, {}).items()
        if tag in ("bytes",) and type(body) is str:
            return bytes.fromhex(body)
        if tag == "int" and type(body) is str:
            return int(body, 16)
        if tag == "complex" and len(_list(body)) == 2 and all(type(x) in (int, float) for x in body):
            return complex(*body)
        if tag == "range" and [type(x) for x in _list(body)] == [int, int, int]:
            return range(*body)
        if tag == "fraction" and type(body) is str:
            from fractions import Fraction

            return Fraction(body)
        if tag == "decimal" and type(body) is str:
            from decimal import Decimal

            return Decimal(body)
        if tag == "type" and type(body) is str and isinstance(getattr(builtins, body, None), type):
            return getattr(builtins, body)
        if tag == "numpy":
            return _numpy_value(body)[()]
        raise WireError(f"unknown value tag {str(tag)[:40]!r}")

    def _reference(self, tag: str, body: Any) -> Any:
        if type(body) is not int or body < 0:
            raise WireError(f"a {tag} reference is not a number")
        if tag == "ref":
            return self.resolve(body)
        table = self.made if tag == "same" else self.arguments
        if table is None or body >= len(table) or table[body] is _BUILDING:
            raise WireError(f"a {tag} reference to nothing (or to a tuple inside itself): {body}")
        return table[body]

    def _container(self, tag: str, body: Any, depth: int, at: int | None) -> Any:
        """A numbered value; a mutable one is made empty and numbered before its items (which may hold it)."""
        if tag == "list" or tag == "dict":
            value: Any = [] if tag == "list" else {}
            if at is not None:
                self.made[at] = value
            if tag == "list":
                value.extend(self.read(v, depth) for v in _list(body))
                return value
            return self._pairs(body, depth, value)
        if tag == "bytearray" and type(body) is str:
            return bytearray.fromhex(body)
        if tag == "ndarray":
            return _numpy_value(body)
        items = [self.read(v, depth) for v in _list(body)]
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)

    def _pairs(self, body: Any, depth: int, into: dict[Any, Any]) -> dict[Any, Any]:
        for pair in _list(body):
            if len(_list(pair)) != 2:
                raise WireError("a dict entry is not a pair")
            key = self.read(pair[0], depth)
            into[key] = self.read(pair[1], depth)
        return into


_BUILDING = object()  # a numbered value whose items are still being read
_NUMBERED = frozenset({"list", "tuple", "set", "frozenset", "dict", "bytearray", "ndarray"})


def decode(data: Any, resolve: Callable[[int], Any]) -> Any:
    """Plain data rebuilt from `encode`'s format with this process's own types; `resolve(n)` for a handle."""
    return Reader(resolve).read(data)


def _numpy_value(body: Any) -> Any:
    """A numpy array from ``[dtype, shape, hex bytes]``: only a dtype `_numpy_dtype` accepts, bytes of exactly
    the size it needs; built by numpy from the bytes alone (nothing of the sender's runs here)."""
    fields = _list(body)
    if len(fields) != 3 or type(fields[0]) is not str or type(fields[2]) is not str:
        raise WireError("a numpy value is not [dtype, shape, bytes]")
    shape = _list(fields[1])
    if len(shape) > 32 or any(type(n) is not int or n < 0 for n in shape):
        raise WireError("a numpy shape is not a list of sizes")
    import numpy

    dtype = numpy.dtype(_numpy_dtype(fields[0]))
    data = bytes.fromhex(fields[2])
    count = 1
    for n in shape:
        count *= n
    if len(data) != count * dtype.itemsize:
        raise WireError("a numpy value's bytes do not match its shape")
    return numpy.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _numpy_dtype(text: str) -> str:
    """`text` when it names a plain dtype (``<i8``, ``|b1``, ``<U5``, ``<M8[ns]``), else WireError."""
    size, _, unit = text[2:].partition("[")
    if (
        len(text) < 3
        or text[0] not in "<>|="
        or text[1] not in _NUMPY_KINDS
        or not size.isdigit()
        or (unit and (text[1] not in "mM" or not unit.endswith("]") or not unit[:-1].isalnum()))
    ):
        raise WireError(f"not a plain numpy dtype: {text[:40]!r}")
    return text


def _list(body: Any) -> list[Any]:
    if type(body) is not list:
        raise WireError("a container's items are not a list")
    return body


_SEQUENCES: dict[str, Callable[[list[Any]], Any]] = {
    "iterator": iter,
    "dict_keys": lambda items: dict.fromkeys(items).keys(),
    "dict_values": lambda items: dict(enumerate(items)).values(),
}


class _Pipe:
    """The two sides over a pair of file descriptors, every wait bounded by a deadline.

    The judge sends marshal frames (a length line, then the bytes: nothing to import, and trusted in that
    direction); the candidate answers in JSON lines, which the judge parses with `json`, safe on any input
    (marshal is not). The candidate writes its JSON without importing `json` (whose `re` import would cost
    every scored answer a few milliseconds)."""

    def __init__(self, read_fd: int, write_fd: int, *, judge: bool) -> None:
        self._read_fd, self._write_fd, self._judge, self._buffer = read_fd, write_fd, judge, b""

    def send(self, message: dict[str, Any], deadline: float = float("inf")) -> None:
        if self._judge:
            payload = marshal.dumps(message, 2)
            data = b"%d\n" % len(payload) + payload
        else:
            data = (_json_text(message) + "\n").encode()
        while data:
            if not select.select([], [self._write_fd], [], _remaining(deadline))[1]:
                raise TimeoutError("the other side stopped reading")
            data = data[os.write(self._write_fd, data[:65536]) :]

    def receive(self, deadline: float = float("inf")) -> dict[str, Any]:
        line = self._line(deadline)
        if self._judge:
            import json

            message = json.loads(line)
        else:
            message = marshal.loads(self._exactly(int(line), deadline))
        if type(message) is not dict:
            raise WireError("a message is not an object")
        return message

    def _line(self, deadline: float) -> bytes:
        while b"\n" not in self._buffer:
            self._fill(deadline)
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _exactly(self, size: int, deadline: float) -> bytes:
        while len(self._buffer) < size:
            self._fill(deadline)
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def _fill(self, deadline: float) -> None:
        if self._judge and len(self._buffer) > _MAX_MESSAGE:
            raise WireError(f"a message over {_MAX_MESSAGE} bytes")
        if not select.select([self._read_fd], [], [], _remaining(deadline))[0]:
            raise TimeoutError("no reply before the deadline")
        chunk = os.read(self._read_fd, 1 << 20)
        if not chunk:
            raise EOFError("the other side closed the pipe")
        self._buffer += chunk


def _json_text(tree: Any) -> str:
    """JSON for the wire's trees (None, bool, int, float, str, lists, dicts with str keys); floats that are not
    finite as Python's `json` writes them (NaN, Infinity), which it reads back."""
    if tree is None:
        return "null"
    if tree is True or tree is False:
        return "true" if tree else "false"
    kind = type(tree)
    if kind is str:
        return _quote(tree)
    if kind is int:
        return int.__repr__(tree)
    if kind is float:
        if tree != tree:
            return "NaN"
        if tree in (float("inf"), float("-inf")):
            return "Infinity" if tree > 0 else "-Infinity"
        return float.__repr__(tree)
    if kind is list:
        return "[" + ",".join(_json_text(v) for v in tree) + "]"
    if kind is dict:
        return "{" + ",".join(_quote(str(k)) + ":" + _json_text(v) for k, v in tree.items()) + "}"
    raise WireError(f"not wire data: {kind.__name__}")


def _remaining(deadline: float) -> float | None:
    if deadline == float("inf"):
        return None
    return max(0.0, deadline - time.monotonic())


# --- the judge's side -----------------------------------------------------------------------------------------------


class CandidateError(Exception):
    """An exception the solution raised whose classes are none of Python's builtin exceptions."""


class CandidateAbort(BaseException):
    """The candidate's process ended, exited, broke the protocol or ran out of time: the run fails.

    A BaseException, so that a test's `except Exception` cannot swallow it (the verdict checks it anyway)."""


class _Candidate:
    """The judge's connection to the candidate process: every request and its plain-data reply."""

    def __init__(self, pipe: _Pipe, deadline: float, call_timeout_s: float | None) -> None:
        self.pipe, self.total_deadline, self.call_timeout_s, self.calls = pipe, deadline, call_timeout_s, 0
        self.aborted: str | None = None
        self.deadline = deadline
        self.handles: dict[int, Handle] = {}

    def _start_call(self) -> None:
        per_call = time.monotonic() + self.call_timeout_s if self.call_timeout_s else float("inf")
        self.deadline = min(self.total_deadline, per_call)

    def hello(self) -> dict[str, Any]:
        return self._receive()

    def request(self, op: str, target: str | int, *, args: tuple[object, ...] = (), **fields: object) -> Any:
        if self.aborted:
            raise CandidateAbort(self.aborted)
        self.calls += 1
        self._start_call()
        # One writer for the request, the arguments first: its numbering is the candidate's, so the reply's
        # ``arg`` references and changes name the test's own objects (`writer.kept`).
        writer = Writer(_handle_of)
        message: dict[str, Any] = {"op": op, "target": target}
        if op == "call":
            message["args"] = [writer.write(a) for a in args]
        message |= {k: writer.write(v) for k, v in fields.items()}
        try:
            self.pipe.send(message, self.deadline)
        except (OSError, TimeoutError) as exc:
            self._abort(f"the candidate stopped reading: {exc}")
        reply = self._receive()
        try:
            reader = Reader(self._handle, writer.kept)
            value = None if "error" in reply else reader.read(reply.get("value"))
            for entry in _list(reply.get("changed") or []):
                number, data = _list(entry)
                _write_into(writer.kept[number], reader.read(data, number=False))
        except (WireError, TypeError, ValueError, KeyError, IndexError, RecursionError, OverflowError) as exc:
            self._abort(f"the candidate broke the protocol: {type(exc).__name__}: {str(exc)[:200]}")
        if "error" in reply:
            raise self._exception(reply["error"])
        return value

    def _exception(self, error: Any) -> BaseException:
        try:
            return _rebuilt_exception(error)
        except WireError as exc:
            self._abort(f"the candidate broke the protocol: {exc}")

    def _receive(self) -> dict[str, Any]:
        try:
            reply = self.pipe.receive(self.deadline)
        except TimeoutError:
            self._abort("timeout")
        except (EOFError, OSError):
            self._abort("the candidate's process ended")
        except (WireError, ValueError, RecursionError) as exc:
            self._abort(f"the candidate broke the protocol: {type(exc).__name__}: {str(exc)[:200]}")
        if "abort" in reply:
            self._abort(f"the candidate raised {str(reply['abort'])[:100]}")
        return reply

    def _abort(self, reason: str) -> NoReturn:
        self.aborted = self.aborted or reason
        raise CandidateAbort(reason)

    def _handle(self, number: int) -> Handle:
        """The one handle of the candidate's object `number` (the candidate numbers each object once, so the
        same object returned twice is the same handle here)."""
        if number not in self.handles:
            self.handles[number] = Handle(self, number)
        return self.handles[number]


def _write_into(original: Any, new: Any) -> None:
    """The candidate's change to an argument, made to the test's own object (which keeps its identity and type,
    a Counter's included): its items replaced by the new ones (which may be the test's other objects)."""
    if isinstance(original, list) and type(new) is list:
        list.__setitem__(original, slice(None), new)
    elif isinstance(original, dict) and type(new) is dict:
        dict.clear(original)
        dict.update(original, new)
    elif isinstance(original, set) and type(new) is set:
        set.clear(original)
        set.update(original, new)
    elif isinstance(original, bytearray) and type(new) is bytearray:
        bytearray.__setitem__(original, slice(None), new)
    elif (
        _is_ndarray(original)
        and _is_ndarray(new)
        and (original.shape, original.dtype) == (new.shape, new.dtype)
    ):
        original[...] = new
    else:  # another type, or an argument the candidate could not have changed (a tuple, a str)
        raise WireError("a changed argument came back as another type")


def _is_ndarray(value: object) -> bool:
    kind = type(value)
    return kind.__name__ == "ndarray" and kind.__module__ == "numpy"


def _handle_of(value: object, _writer: Writer) -> Wire:
    if isinstance(value, Handle):
        return {"ref": object.__getattribute__(value, "_cg_target")}
    raise TypeError(f"cannot pass a {type(value).__name__} to the code under test: only plain data crosses")


def _plain_base(value: object) -> type | None:
    """The builtin type a subclass instance (a namedtuple, a Counter, an IntEnum) crosses as, if any."""
    return next((base for base in _BASES if isinstance(value, base)), None)


_BASES = (bool, int, float, complex, str, bytes, bytearray, tuple, list, dict, set, frozenset)


def _rebuilt_exception(error: Any) -> BaseException:
    if type(error) is not dict:
        raise WireError("an error is not an object")
    message = str(error.get("message", ""))[:10_000]
    for name in error.get("types") or []:
        if name in ("Exception", "BaseException"):
            break  # the solution's own exception class: CandidateError says so
        if name in ("StopIteration", "StopAsyncIteration"):
            # Raised in the test it would end the iteration it was called from (`all(map(...))` then passes):
            # a call that raises it failed, as a generator that lets one escape does (PEP 479).
            return RuntimeError(f"the code under test raised {name}" + (f": {message}" if message else ""))
        cls = getattr(builtins, str(name), None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                return cls(message)
            except TypeError:  # e.g. UnicodeDecodeError needs five arguments: try its base
                continue
    return CandidateError(message)


class Handle:
    """A value that lives in the candidate's process: a function or class of the solution, or an object it
    returned. Calls, attribute reads and writes are forwarded (the results come back as plain data or handles);
    comparing, hashing, iterating or testing truth raises, since no candidate code may decide them."""

    __slots__ = ("_cg_candidate", "_cg_target")
    # The slots' types, for mypy only: a class annotation would add `__annotations__`, one more attribute.
    if TYPE_CHECKING:
        _cg_candidate: _Candidate
        _cg_target: str | int

    def __init__(self, candidate: _Candidate, target: str | int) -> None:
        object.__setattr__(self, "_cg_candidate", candidate)
        object.__setattr__(self, "_cg_target", target)

    def __call__(self, *args: object, **kwargs: object) -> Any:
        return self._cg_candidate.request("call", self._cg_target, args=args, kwargs=kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._cg_candidate.request("getattr", self._cg_target, name=name)

    def __setattr__(self, name: str, value: object) -> None:
        self._cg_candidate.request("setattr", self._cg_target, name=name, value=value)

    def _refuse(self, *_: object) -> NoReturn:
        raise TypeError(_OPAQUE)

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __len__ = __iter__ = __contains__ = (
        _refuse
    )
    __index__ = __int__ = __float__ = __complex__ = _refuse
    # Unhashable, the documented way; typeshed types `object.__hash__` as a method, which None does not match.
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<the solution's {self._cg_target!r}>"


def judge(reply_fd: int, request_fd: int, request: dict[str, Any]) -> dict[str, Any]:
    """Run the tests against the candidate on the other end of the pipes; return the verdict (plain data).

    `request` (made by `colab_graphs.sandbox.code_tests` from the dataset's test and question): ``test`` (source),
    ``question`` (the question's definitions, one snippet each), ``entry_point``, ``unbound`` (the names the
    test reads that neither it nor the question defines: `_resolve` binds each), ``call_check`` (the test only
    defines `check`), ``bind_candidate`` (the test uses `candidate` at module level), ``unittest`` (the test
    imports it), ``timeout_s``, ``call_timeout_s``.
    """
    deadline = time.monotonic() + float(request["timeout_s"])
    per_call = request.get("call_timeout_s")
    candidate = _Candidate(
        _Pipe(reply_fd, request_fd, judge=True), deadline, float(per_call) if per_call else None
    )
    try:
        hello = candidate.hello()
    except CandidateAbort as exc:
        return {"passed": False, "reason": f"the code did not load: {exc}", "calls": 0}
    if not hello.get("ready"):
        return {
            "passed": False,
            "reason": f"the code did not load: {str(hello.get('error'))[:2000]}",
            "calls": 0,
        }
    # The test runs as this process's __main__, so `unittest.main()` finds the test cases it defines, with the
    # command line of a script run on its own (the judge's own arguments would name tests).
    main = type(sys)("__main__")
    sys.modules["__main__"] = main
    sys.argv = ["test.py"]
    namespace = main.__dict__
    namespace["__builtins__"] = builtins
    failures = _watch_unittest() if request.get("unittest") else []
    for snippet in request["question"]:
        try:
            exec(compile(snippet, "question.py", "exec"), namespace)
        except Exception:  # noqa: BLE001, S112 - a helper that cannot be defined is not one the test needs
            continue
    names = hello.get("names")
    offered = {str(n) for n in names} if isinstance(names, list) else set()
    entry = request.get("entry_point")
    tested = Handle(candidate, str(entry)) if entry else None
    for name in request.get("unbound") or ():
        value = _resolve(str(name), offered, candidate)
        if value is not _UNRESOLVED:
            namespace[str(name)] = value
    if tested is not None:  # the record's function under test, over the question's stub of it (HumanEval's)
        namespace[str(entry)] = tested
    if request.get("bind_candidate") and tested is not None:
        namespace["candidate"] = tested
    outcome = _run_test(request, namespace, tested)
    reason = failures[0] if failures else outcome  # a unittest failure says more than the exit it caused
    return {
        "passed": reason == "" and not candidate.aborted,
        "reason": candidate.aborted or reason,
        "calls": candidate.calls,
    }


_UNRESOLVED = object()
# Standard-library modules that act when imported (print, open a browser, start a GUI): never a test's name.
_NOT_RESOLVED = frozenset(
    {"antigravity", "this", "__hello__", "__phello__", "idlelib", "turtledemo", "turtle"}
)


def _resolve(name: str, offered: set[str], candidate: _Candidate) -> Any:
    """What a name the test reads and neither it, the question nor the record's entry point defines is: the
    builtin, which is in scope already; else the standard-library module of that name, imported here (MBPP's
    tests use `sys`, `math`, `re` unimported); else the solution's callable of that name (a class the task
    asks for, MoCo's `Pair`); else unbound (a NameError in the test). So a reply adds names and never replaces
    one: its `class sys` or `def set` is not the test's."""
    if hasattr(builtins, name):
        return _UNRESOLVED
    if name in getattr(sys, "stdlib_module_names", ()) and name not in _NOT_RESOLVED:
        try:
            return __import__(name)
        except Exception:  # noqa: BLE001 - a module this interpreter lacks is a NameError in the test
            return _UNRESOLVED
    return Handle(candidate, name) if name in offered else _UNRESOLVED


def _watch_unittest() -> list[str]:
    """Every failure of a unittest run in this process, as it happens, whatever the test does with the result:
    `unittest.main(exit=False)` and a runner's result that nobody reads fail the verdict, as failures do in a
    script run on its own (its traceback is on stderr, which MoCo's evaluator reads)."""
    import unittest

    failed: list[str] = []

    def watched(method: str) -> None:
        original = getattr(unittest.TestResult, method)

        def record(self: Any, test: Any, *rest: Any) -> Any:
            err = rest[-1] if rest else None
            if method != "addSubTest" or err is not None:
                why = f": {err[0].__name__}: {str(err[1])[:300]}" if isinstance(err, tuple) else ""
                failed.append(f"unittest {method[3:].lower()} in {test}{why}")
            return original(self, test, *rest)

        setattr(unittest.TestResult, method, record)

    for method in ("addError", "addFailure", "addUnexpectedSuccess", "addSubTest"):
        watched(method)
    return failed


def _run_test(request: dict[str, Any], namespace: dict[str, Any], tested: Handle | None) -> str:
    """Execute the test; "" when it completed, else why it failed."""
    try:
        exec(compile(request["test"], "test.py", "exec"), namespace)
        if request.get("call_check"):
            if tested is None:
                return "the test defines check(candidate) and no function under test is known"
            namespace["check"](tested)
    except SystemExit as exc:  # the test's own exit (unittest.main): a clean one is a completed test
        return "" if exc.code in (None, 0) else f"the test exited with {exc.code!r}"
    except CandidateAbort as exc:
        return str(exc)
    except BaseException as exc:  # noqa: BLE001 - every way a test fails is a failed verdict
        return _describe_failure(exc)
    return ""


def _describe_failure(exc: BaseException) -> str:
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "test.py":
            line = tb.tb_lineno
        tb = tb.tb_next
    where = f" (test.py line {line})" if line else ""
    return f"{type(exc).__name__}: {str(exc)[:500]}{where}"


# --- the candidate's side -------------------------------------------------------------------------------------------


def serve(solution_path: str, request_fd: int = 3, reply_fd: int = 4) -> None:
    """Load the solution, say which callables it defines, then answer the judge's requests until it hangs up."""
    pipe = _Pipe(request_fd, reply_fd, judge=False)
    # A real module named `solution`, importable from its directory: what the reply defines pickles by reference
    # (multiprocessing, concurrent.futures), in this process, its forks, and a process `spawn` starts.
    module = type(sys)("solution")
    module.__file__ = solution_path
    sys.modules["solution"] = module
    sys.path.append(os.path.dirname(os.path.abspath(solution_path)))
    namespace: dict[str, Any] = module.__dict__
    namespace["__builtins__"] = builtins
    try:
        with open(solution_path, encoding="utf-8") as fh:
            source = fh.read()
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001 - any failure to load is reported, not raised
        pipe.send({"ready": False, "error": _describe(exc)})
        return
    names = [n for n, v in list(namespace.items()) if callable(v) and not n.startswith("__")]
    pipe.send({"ready": True, "names": names})
    objects: list[object] = []
    numbers: dict[int, int] = {}  # id -> handle number: an object returned twice is one handle in the judge

    def handle(value: Any, writer: Writer) -> Wire:
        if hasattr(type(value), "__next__") and hasattr(type(value), "__iter__"):
            items = []
            for item in value:
                items.append(writer.write(item))
                if len(items) > _MAX_ITEMS:
                    raise WireError(f"an iterator longer than {_MAX_ITEMS} items")
            return {"iterator": items}
        if id(value) not in numbers:
            numbers[id(value)] = len(objects)
            objects.append(value)
        return {"ref": numbers[id(value)]}

    def resolve(number: int) -> Any:
        return objects[number]

    while True:
        try:
            message = pipe.receive()
        except (EOFError, OSError):
            return
        pipe.send(_answer(message, namespace, handle, resolve))


def _answer(
    message: dict[str, Any],
    namespace: dict[str, Any],
    handle: Callable[[Any, Writer], Wire],
    resolve: Callable[[int], Any],
) -> dict[str, Any]:
    try:
        target = message["target"]
        if isinstance(target, str) and target not in namespace:
            raise NameError(f"name {target!r} is not defined")
        obj = namespace[target] if isinstance(target, str) else resolve(target)
        op = message["op"]
        if op == "getattr":
            return {"value": Writer(handle).write(getattr(obj, message["name"]))}
        reader = Reader(resolve)
        if op == "setattr":
            setattr(obj, message["name"], reader.read(message["value"]))
            return {"value": None}
        args = [reader.read(a) for a in message["args"]]
        kwargs = reader.read(message["kwargs"])
        return _call(obj, args, kwargs, reader.made, handle)
    except Exception as exc:  # noqa: BLE001 - the solution's exceptions go to the judge
        return {"error": _error(exc)}
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt...: the run fails
        return {"abort": type(exc).__name__}


def _call(
    obj: Any, args: list[Any], kwargs: Any, sent: list[Any], handle: Callable[[Any, Writer], Wire]
) -> dict[str, Any]:
    """Call `obj` on the arguments; the reply is its value (or exception) and the arguments it changed.

    `sent` lists the containers the judge sent, by number: the value and the changes name each as ``{"arg": n}``
    (the judge puts its own object there). A mutable one whose items differ after the call (compared written out,
    each of the others as a reference, unknown objects by id: nothing is drained twice) is reported with its new
    items, written by the reply's writer after the value, so what they share stays shared."""
    arguments = {id(v): n for n, v in enumerate(sent)}
    mutable = [n for n, v in enumerate(sent) if type(v) in _MUTABLE or _is_ndarray(v)]

    def items(n: int) -> Wire:
        return Writer(lambda value, _: {"id": id(value)}, arguments).body(sent[n])

    before = {n: items(n) for n in mutable}
    writer = Writer(handle, arguments)
    try:
        reply: dict[str, Any] = {"value": writer.write(obj(*args, **kwargs))}
    except Exception as exc:  # noqa: BLE001 - the solution's exceptions go to the judge, with its changes
        reply = {"error": _error(exc)}
    changed = [[n, writer.body(sent[n])] for n in mutable if items(n) != before[n]]
    if changed:
        reply["changed"] = changed
    return reply


def _error(exc: BaseException) -> dict[str, Any]:
    types = [c.__name__ for c in type(exc).__mro__ if getattr(builtins, c.__name__, None) is c]
    return {"types": types, "message": _message(exc)}


def _message(exc: BaseException) -> str:
    try:
        return str(exc)[:10_000]
    except Exception:  # noqa: BLE001 - a message that cannot be printed is no message
        return ""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_message(exc)[:2000]}"


if __name__ == "__main__":
    serve(sys.argv[1])
