"""Guided JSON decoding: a reply that is one JSON value matching a JSON schema, whatever the model prefers.

At each step the engine asks a `JsonGuide` which tokens the row may take (`GenerationRequest.allowed_tokens`).
The guide keeps the text written so far and allows a token only when the text with it is still the beginning
of a value the schema accepts, and every such beginning can still be completed (a comma is not allowed when
no key is left to write, a string stops at ``maxLength``, a number stops where no digit keeps it in range).
It checks the model's most likely tokens first; when none of them fits it looks among the tokens that start
with a character the schema allows there. Once the value is complete only the end of turn is allowed, so the
reply is exactly the value. A reply cut by ``max_tokens`` ends early (``finish_reason: "length"``), as
OpenAI's does.

The schema subset (`schema_problems` names anything else, so a request is refused instead of half-honoured):
``type`` (one or a list), ``properties`` / ``required`` / ``additionalProperties`` (keys in any order; with
``properties`` and no ``additionalProperties``, only the listed keys are written), ``items`` / ``minItems`` /
``maxItems``, ``enum`` / ``const`` (written in canonical JSON), ``anyOf`` / ``oneOf`` (as any of), ``allOf``
of one schema, local ``$ref`` to ``$defs`` or ``definitions``, ``minLength`` / ``maxLength``, ``minimum`` /
``maximum`` / ``exclusiveMinimum`` / ``exclusiveMaximum``, and the annotations (``title``, ``description``,
``default``, ``format``...). The value is written as ``json.dumps`` writes it (``", "`` and ``": "`` between
items, no other whitespace; strings without raw control characters; numbers of at most `MAX_NUMBER`
characters, without an exponent when bounded), so a model cannot pad its reply forever. Sampling draws among
the allowed tokens of the model's `CANDIDATES` most likely (top-k style).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

PARTIAL = -1  # the text ended inside a value that can still be completed
MAX_NUMBER = 24
CANDIDATES = 32
MAX_ALTERNATIVES = 256  # schemas one position may stand for (anyOf / oneOf nested through references)
_SCAN_LIMIT = 4096  # tokens checked, in the model's order, when none of the likeliest fits
_FORCED_LIMIT = 256
_NON_ASCII = "\u00e9"  # stands for every character outside ASCII when probing what may come next
_PROBES = [chr(c) for c in range(32, 127)] + [_NON_ASCII]
_STRUCTURE = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
    "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum",
}  # fmt: skip
_ANNOTATIONS = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "format", "deprecated",
    "readOnly", "writeOnly", "strict",
}  # fmt: skip
_TYPES = {"string", "number", "integer", "boolean", "null", "object", "array"}
# The number grammar as a small automaton: state -> {character class -> next state}.
_NUMBER_STEPS = {
    "start": {"-": "minus", "0": "zero", "1": "int"},
    "minus": {"0": "zero", "1": "int"},
    "zero": {".": "dot", "e": "e"},
    "int": {"0": "int", "1": "int", ".": "dot", "e": "e"},
    "dot": {"0": "frac", "1": "frac"},
    "frac": {"0": "frac", "1": "frac", "e": "e"},
    "e": {"+": "sign", "-": "sign", "0": "exp", "1": "exp"},
    "sign": {"0": "exp", "1": "exp"},
    "exp": {"0": "exp", "1": "exp"},
}
_NUMBER_ENDS = {"zero", "int", "frac", "exp"}


def _number_class(c: str) -> str:
    if c == "0":
        return "0"
    if "1" <= c <= "9":
        return "1"
    return "e" if c in "eE" else c


def schema_problems(schema: Any, path: str = "schema") -> list[str]:
    """What in `schema` guided decoding cannot enforce: keywords outside the subset, references that name no
    definition, references that lead back to themselves before any character is written (the matcher would
    follow them forever), and ``anyOf`` / ``oneOf`` that multiply past `MAX_ALTERNATIVES` at one position."""
    problems = _keyword_problems(schema, path)
    if not problems and isinstance(schema, dict):
        problems = _reference_problems(schema, path)
    return problems


def _keyword_problems(schema: Any, path: str) -> list[str]:
    if isinstance(schema, bool):
        return []
    if not isinstance(schema, dict):
        return [f"{path} must be a JSON schema object"]
    problems = []
    for key, value in schema.items():
        if key not in _STRUCTURE | _ANNOTATIONS:
            problems.append(f"{path}: '{key}' cannot be enforced while decoding")
        elif key == "type":
            types = value if isinstance(value, list) else [value]
            problems += [f"{path}.type: unknown type {t!r}" for t in types if t not in _TYPES]
        elif key in ("properties", "$defs", "definitions") and not isinstance(value, dict):
            problems.append(f"{path}.{key} must be an object of schemas")
        elif key in ("anyOf", "oneOf", "allOf") and not isinstance(value, list):
            problems.append(f"{path}.{key} must be a list of schemas")
        elif key in ("properties", "$defs", "definitions"):
            problems += [
                p for name, sub in _items(value) for p in _keyword_problems(sub, f"{path}.{key}.{name}")
            ]
        elif key in ("items", "additionalProperties") and not isinstance(value, bool):
            problems += _keyword_problems(value, f"{path}.{key}")
        elif key in ("anyOf", "oneOf", "allOf"):
            subs = value if isinstance(value, list) else []
            if key == "allOf" and len(subs) != 1:
                problems.append(f"{path}.allOf: only an allOf of one schema can be enforced")
            problems += [
                p for i, sub in enumerate(subs) for p in _keyword_problems(sub, f"{path}.{key}[{i}]")
            ]
        elif key == "$ref" and not (
            isinstance(value, str) and value.startswith(("#/$defs/", "#/definitions/"))
        ):
            problems.append(f"{path}.$ref: only local references to #/$defs/ or #/definitions/ are followed")
    return problems


def _items(value: Any) -> list[tuple[str, Any]]:
    return list(value.items()) if isinstance(value, dict) else []


def _reference_problems(root: dict[str, Any], path: str) -> list[str]:
    definitions = {
        f"#/{kind}/{name}": sub for kind in ("$defs", "definitions") for name, sub in _items(root.get(kind))
    }
    nodes = list(_nodes(root, path))
    missing = [
        f"{where}.$ref: {node['$ref']!r} names no definition of this schema"
        for where, node in nodes
        if isinstance(node.get("$ref"), str) and node["$ref"] not in definitions
    ]
    if missing:
        return missing
    counted: dict[str, int] = {}

    def alternatives(schema: Any, trail: tuple[str, ...]) -> int:
        """Schemas `schema` stands for at one position, following references and unions (no input read)."""
        if not isinstance(schema, dict):
            return 1
        count = 1
        ref = schema.get("$ref")
        if isinstance(ref, str):
            if ref in trail:
                cycle = " -> ".join((*trail[trail.index(ref) :], ref))
                raise _CycleError(f"{path}: $ref cycle {cycle} writes nothing before it repeats")
            if ref not in counted:
                counted[ref] = alternatives(definitions[ref], (*trail, ref))
            count = counted[ref]
        for key in ("allOf", "anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list):
                count *= sum(alternatives(branch, trail) for branch in branches)
        return min(count, MAX_ALTERNATIVES + 1)

    try:
        for where, node in nodes:
            if alternatives(node, ()) > MAX_ALTERNATIVES:
                return [f"{where}: anyOf / oneOf branches multiply past {MAX_ALTERNATIVES} alternatives"]
    except _CycleError as exc:
        return [str(exc)]
    except RecursionError:
        return [f"{path}: references chain too deep to follow"]
    return []


class _CycleError(Exception):
    pass


def _nodes(root: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object inside `root` (itself included), with its path; iterative."""
    stack: list[tuple[str, Any]] = [(path, root)]
    while stack:
        where, node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield where, node
        for key in ("properties", "$defs", "definitions"):
            stack.extend((f"{where}.{key}.{name}", sub) for name, sub in _items(node.get(key)))
        for key in ("items", "additionalProperties"):
            stack.append((f"{where}.{key}", node.get(key)))
        for key in ("anyOf", "oneOf", "allOf"):
            branches = node.get(key)
            if isinstance(branches, list):
                stack.extend((f"{where}.{key}[{i}]", sub) for i, sub in enumerate(branches))


@dataclass(frozen=True)
class Progress:
    """Where a text stands against a schema."""

    valid: bool  # the text begins a value the schema accepts (or is one)
    complete: bool  # the text is a whole value the schema accepts
    open: bool  # the text can still grow into an accepted value


class JsonMatcher:
    """Checks texts against a JSON schema (the subset in the module docstring), from the start each time."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.root = schema

    def progress(self, text: str) -> Progress:
        ends = set(self._value(self.root, text, 0)) if text else {PARTIAL}
        complete = len(text) in ends
        return Progress(valid=complete or PARTIAL in ends, complete=complete, open=PARTIAL in ends)

    def _resolve(self, schema: Any) -> dict[str, Any]:
        if schema is True or schema is None:
            return {}
        if schema is False:
            return {"enum": []}
        while "$ref" in schema:
            kind, _, name = schema["$ref"].removeprefix("#/").partition("/")
            schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **self.root[kind][name]}
        if "allOf" in schema:
            (only,) = schema["allOf"]
            schema = {**{k: v for k, v in schema.items() if k != "allOf"}, **self._resolve(only)}
        resolved: dict[str, Any] = schema
        return resolved

    def _value(self, schema: Any, s: str, i: int) -> Iterator[int]:
        """End positions of the values `schema` accepts that start at `s[i]` (PARTIAL: `s` ends inside one)."""
        schema = self._resolve(schema)
        if i == len(s):
            yield PARTIAL
            return
        if "const" in schema or "enum" in schema:
            yield from _literals([schema["const"]] if "const" in schema else schema["enum"], s, i)
            return
        for union in ("anyOf", "oneOf"):
            if union in schema:
                rest = {k: v for k, v in schema.items() if k != union}
                for branch in schema[union]:
                    yield from self._value({**rest, **self._resolve(branch)}, s, i)
                return
        declared = schema.get("type")
        types = set(declared) if isinstance(declared, list) else {declared} if declared else _TYPES
        c = s[i]
        if c == '"' and "string" in types:
            yield from _string(s, i, schema.get("minLength", 0), schema.get("maxLength"))
        elif c == "{" and "object" in types:
            yield from self._object(schema, s, i)
        elif c == "[" and "array" in types:
            yield from self._array(schema, s, i)
        elif (c == "-" or c.isdigit()) and types & {"number", "integer"}:
            yield from _number(schema, s, i, integer="number" not in types)
        elif c in "tf" and "boolean" in types:
            yield from _literals([True, False], s, i)
        elif c == "n" and "null" in types:
            yield from _literals([None], s, i)

    def _object(self, schema: dict[str, Any], s: str, i: int) -> Iterator[int]:
        j = i + 1
        if j == len(s):
            yield PARTIAL
        elif s[j] == "}":
            if not schema.get("required"):
                yield j + 1
        else:
            yield from self._member(schema, s, j, frozenset())

    def _member(self, schema: dict[str, Any], s: str, j: int, used: frozenset[str]) -> Iterator[int]:
        """A key and its value at `s[j]`, then what may follow them."""
        if s[j] != '"':
            return
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties", not properties)
        left = [key for key in properties if key not in used]
        keys = _literals(left, s, j) if extra is False else _string(s, j, 0, None)
        for key_end in keys:
            if key_end == PARTIAL:
                yield PARTIAL
                continue
            key = json.loads(s[j:key_end])
            if key in used or (key not in properties and extra is False):
                continue
            start = _separator(s, key_end, ":")
            if start == PARTIAL:
                yield PARTIAL
            elif start is not None:
                for end in self._value(properties.get(key, extra), s, start):
                    yield from self._after_member(schema, s, end, used | {key})

    def _after_member(self, schema: dict[str, Any], s: str, end: int, used: frozenset[str]) -> Iterator[int]:
        properties = schema.get("properties") or {}
        more = schema.get("additionalProperties", not properties) is not False or any(
            key not in used for key in properties
        )
        if end == PARTIAL or end == len(s):
            yield PARTIAL
        elif s[end] == "}" and set(schema.get("required") or ()) <= used:
            yield end + 1
        elif more:
            key = _separator(s, end, ",")
            if key == PARTIAL:
                yield PARTIAL
            elif key is not None:
                yield from self._member(schema, s, key, used)

    def _array(self, schema: dict[str, Any], s: str, i: int) -> Iterator[int]:
        j = i + 1
        if j == len(s):
            yield PARTIAL
        elif s[j] == "]":
            if schema.get("minItems", 0) == 0:
                yield j + 1
        elif schema.get("maxItems") != 0:
            yield from self._elements(schema, s, j, 0)

    def _elements(self, schema: dict[str, Any], s: str, j: int, count: int) -> Iterator[int]:
        most = schema.get("maxItems")
        for end in self._value(schema.get("items", True), s, j):
            if end == PARTIAL or end == len(s):
                yield PARTIAL
            elif s[end] == "]" and count + 1 >= schema.get("minItems", 0):
                yield end + 1
            elif most is None or count + 1 < most:
                nxt = _separator(s, end, ",")
                if nxt == PARTIAL:
                    yield PARTIAL
                elif nxt is not None:
                    yield from self._elements(schema, s, nxt, count + 1)


def _separator(s: str, j: int, mark: str) -> int | None:
    """Where the value after `mark` and its one space (``": "``, ``", "``) starts at `s[j]`; PARTIAL when `s`
    ends inside them, None when something else is there."""
    if j >= len(s):
        return PARTIAL
    written = s[j : j + 2]
    if written == f"{mark} ":
        return j + 2 if j + 2 < len(s) else PARTIAL
    return PARTIAL if written == mark else None


def _literals(values: Sequence[Any], s: str, i: int) -> Iterator[int]:
    rest = s[i:]
    for value in values:
        text = json.dumps(value, ensure_ascii=False)
        if rest.startswith(text):
            yield i + len(text)
        elif text.startswith(rest):
            yield PARTIAL


def _string(s: str, i: int, least: int, most: int | None) -> Iterator[int]:
    j, count = i + 1, 0
    while j < len(s):
        c = s[j]
        if c == '"':
            if count >= least:
                yield j + 1
            return
        if most is not None and count >= most:
            return  # only the closing quote may follow
        if c == "\\":
            escape = s[j + 1 : j + 2]
            if escape and escape in '"\\/bfnrt':
                j += 2
            elif escape == "u":
                digits = s[j + 2 : j + 6]
                if not all(d in "0123456789abcdefABCDEF" for d in digits):
                    return
                if len(digits) < 4:
                    yield PARTIAL
                    return
                j += 6
            elif not escape:
                yield PARTIAL
                return
            else:
                return
        elif c < " ":
            return
        else:
            j += 1
        count += 1
    yield PARTIAL


def _number(schema: dict[str, Any], s: str, i: int, integer: bool) -> Iterator[int]:
    bounds = _bounds(schema, integer)
    state, j = "start", i
    while j < len(s):
        step = _NUMBER_STEPS[state].get(_number_class(s[j]))
        # integers have no fraction or exponent; bounded numbers are written without an exponent
        if (
            step is None
            or (integer and step == "dot")
            or ((integer or bounds != (None, None)) and step == "e")
        ):
            break
        state, j = step, j + 1
        if j - i > MAX_NUMBER:
            return
    if state in _NUMBER_ENDS and _in_bounds(schema, float(s[i:j])):
        yield j
    can_grow = state not in _NUMBER_ENDS or not (integer and state == "zero")
    if j == len(s) and can_grow and _can_reach(s[i:j], bounds, integer):
        yield PARTIAL


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[float | None, float | None]:
    """The closed range a number must fall in (exclusive bounds of integers made closed)."""
    step = 1 if integer else 0
    lows = [
        schema.get("minimum"),
        None if "exclusiveMinimum" not in schema else schema["exclusiveMinimum"] + step,
    ]
    highs = [
        schema.get("maximum"),
        None if "exclusiveMaximum" not in schema else schema["exclusiveMaximum"] - step,
    ]
    low = max((x for x in lows if x is not None), default=None)
    high = min((x for x in highs if x is not None), default=None)
    return low, high


def _can_reach(prefix: str, bounds: tuple[float | None, float | None], integer: bool) -> bool:
    """Whether some number written with `prefix` at its start lies within `bounds` (no exponents here)."""
    low, high = bounds
    if low is None and high is None:
        return True
    negative = prefix.startswith("-")
    if negative:
        low, high = (None if high is None else -high), (None if low is None else -low)
    body = prefix[1:] if negative else prefix
    if not body:
        return high is None or high >= (1 if integer else 0) or (not negative and low is None)
    whole, dot, fraction = body.partition(".")
    if dot:  # the integer part is written: the value lies within one unit of the last written digit
        start = float(f"{whole}.{fraction or 0}")
        return _overlaps(start, start + 10.0 ** -len(fraction), low, high, open_end=True)
    if whole == "0":
        return _overlaps(0, 0 if integer else 1, low, high, open_end=not integer)
    digits = int(whole)
    for more in range(MAX_NUMBER - len(body) + 1):
        start, end = digits * 10**more, (digits + 1) * 10**more - (1 if integer else 0)
        if high is not None and start > high:
            return False
        if _overlaps(start, end, low, high, open_end=not integer):
            return True
    return False


def _in_bounds(schema: dict[str, Any], value: float) -> bool:
    return not (
        ("minimum" in schema and value < schema["minimum"])
        or ("maximum" in schema and value > schema["maximum"])
        or ("exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"])
        or ("exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"])
    )


def _overlaps(
    start: float, end: float, low: float | None, high: float | None, open_end: bool = False
) -> bool:
    """Whether [start, end] (or [start, end) with `open_end`) meets [low, high]."""
    return (high is None or start <= high) and (low is None or end > low or (end == low and not open_end))


class Vocabulary:
    """Each token's text as it reads after other text, and the tokens grouped by their first character.

    Texts are decoded after a fixed anchor token, so tokenizers that drop a word's leading space at the start
    of a text (SentencePiece) still show it. Special tokens and tokens that are part of a character are left
    out (their text is empty here): guided replies are written in whole characters.
    """

    def __init__(self, tokenizer: Any) -> None:
        size = len(tokenizer)
        specials = set(getattr(tokenizer, "all_special_ids", ()) or ())
        anchor = tokenizer.encode("a", add_special_tokens=False)[:1]
        head = tokenizer.decode(anchor)
        pairs = tokenizer.batch_decode([[*anchor, i] for i in range(size)])
        self.texts = [
            text[len(head) :] if i not in specials and text.startswith(head) and "\ufffd" not in text else ""
            for i, text in enumerate(pairs)
        ]
        self.by_first: dict[str, list[int]] = {}
        for token, text in enumerate(self.texts):
            if text:
                self.by_first.setdefault(text[0], []).append(token)


_vocabularies: weakref.WeakKeyDictionary[Any, Vocabulary] = weakref.WeakKeyDictionary()
_vocabulary_lock = threading.Lock()


def vocabulary(tokenizer: Any) -> Vocabulary:
    """The `Vocabulary` of `tokenizer`, built once per tokenizer object (about a second for 50k tokens)."""
    with _vocabulary_lock:
        found = _vocabularies.get(tokenizer)
        if found is None:
            found = _vocabularies[tokenizer] = Vocabulary(tokenizer)
        return found


class JsonGuide:
    """``allowed_tokens`` for one request: the tokens that keep its reply a JSON value `schema` accepts.

    Where the schema leaves one way to go (punctuation, a key that must come, a ``const``), the text it forces
    is written with the tokens that cover it whole, the way the tokenizer itself would split it (``": "`` as
    one token, not a space the model then reads as the start of a number); the model picks among those.
    Elsewhere it is the model's likeliest tokens that fit, or the tokens starting with a character that fits.

    Args:
        schema: The JSON schema (check it with `schema_problems` first).
        vocab: The model's `Vocabulary`.
        end_ids: The model's end-of-turn tokens.
        greedy: The request decodes greedily: only the likeliest allowed token is needed.
    """

    def __init__(
        self, schema: dict[str, Any], vocab: Vocabulary, end_ids: Iterable[int], greedy: bool
    ) -> None:
        self.matcher = JsonMatcher(schema)
        self.vocab, self.end_ids, self.greedy = vocab, sorted(end_ids), greedy
        self.text, self.read = "", 0
        self._forced_from = ("", "")

    def __call__(self, ids: list[int], logits: Any) -> list[int]:
        logits = logits.cpu()  # token lists index it here: one copy a step, whatever device decodes
        for token in ids[self.read :]:
            self.text += self.vocab.texts[token]
        self.read = len(ids)
        now = self.matcher.progress(self.text)
        if now.complete and not now.open:
            return self.end_ids
        wanted = 1 if self.greedy else CANDIDATES
        forced = self._forced()
        if forced:
            allowed = self._covering(forced, logits, wanted)
        else:
            allowed = self._fitting(_top(logits, CANDIDATES), wanted)
            if not allowed:
                allowed = self._fitting(self._by_allowed_start(logits), wanted)
        if now.complete or not allowed:
            allowed += self.end_ids  # not allowed: a dead end the schema's subset could not foresee
        return allowed

    def _next_characters(self, text: str) -> list[str]:
        return [c for c in _PROBES if self.matcher.progress(text + c).valid]

    def _forced(self) -> str:
        """The text every accepted continuation starts with (as far as `_PROBES` can tell: all of ASCII).

        Remembered: while the text written stays inside the forced text found before, the rest of it is still
        forced, with no probing.
        """
        base, known = self._forced_from
        written = self.text[len(base) :]
        if self.text.startswith(base) and known.startswith(written) and len(written) < len(known):
            return known[len(written) :]
        forced = ""
        while len(forced) < _FORCED_LIMIT:
            options = self._next_characters(self.text + forced)
            if len(options) != 1 or options[0] == _NON_ASCII:
                break
            forced += options[0]
        self._forced_from = (self.text, forced)
        return forced

    def _covering(self, forced: str, logits: Any, wanted: int) -> list[int]:
        """Tokens that write all of `forced` (and may go on, if that fits), likeliest first; else the longest
        token that writes a beginning of it."""
        texts = self.vocab.texts
        bucket = self.vocab.by_first.get(forced[0], [])
        covering = [t for t in bucket if texts[t].startswith(forced)]
        allowed = self._fitting(_likeliest(logits, covering, _SCAN_LIMIT), wanted)
        if allowed:
            return allowed
        prefixes = [t for t in bucket if forced.startswith(texts[t])]
        return [max(prefixes, key=lambda t: len(texts[t]))] if prefixes else []

    def _fitting(self, tokens: Sequence[int], wanted: int) -> list[int]:
        fitting = []
        for token in tokens:
            text = self.vocab.texts[token] if token < len(self.vocab.texts) else ""
            if text and self.matcher.progress(self.text + text).valid:
                fitting.append(token)
                if len(fitting) >= wanted:
                    break
        return fitting

    def _by_allowed_start(self, logits: Any) -> list[int]:
        """Tokens whose first character the schema allows next, likeliest first (at most `_SCAN_LIMIT`)."""
        starts = set(self._next_characters(self.text))
        if _NON_ASCII in starts:  # inside a string: any character a string may hold
            starts |= {c for c in self.vocab.by_first if not c.isascii()}
        tokens = [token for c in starts for token in self.vocab.by_first.get(c, ())]
        return _likeliest(logits, tokens, _SCAN_LIMIT)


def _top(logits: Any, k: int) -> list[int]:
    import torch

    top: list[int] = torch.topk(logits, min(k, logits.shape[-1])).indices.tolist()
    return top


def _likeliest(logits: Any, tokens: Sequence[int], limit: int) -> list[int]:
    import torch

    if not len(tokens):
        return []
    index = torch.as_tensor(tokens, dtype=torch.long)
    index = index[index < logits.shape[-1]]
    order = torch.argsort(logits[index], descending=True)[:limit]
    likeliest: list[int] = index[order].tolist()
    return likeliest
