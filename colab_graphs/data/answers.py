"""How a model's reply becomes an answer, per kind of answer: numbers, math, option letters, code, short text.

These are the primitives the task types (`colab_graphs.data.tasks`) are made of. Two rules hold for every
extractor here, and the tests check both on replies shaped like real models' (prose around a fenced block,
"The correct option is (C) ...", `\\boxed{}`):

- **Only a commitment counts.** An extractor returns None when the reply commits to no answer of its kind: a
  multiple-choice reply that names no option is not "A", a reply without code is not code.
- **Idempotent.** Extracting from an extracted answer gives it back (`\\frac{1}{2}` stays `\\frac{1}{2}`, code
  stays code), because a protocol's final node extracts and the scorer then reads that answer again.
"""

from __future__ import annotations

import ast
import builtins
import functools
import re
import threading
from decimal import Decimal, InvalidOperation

LETTERS = "ABCDEFGHIJ"

# --- shared pieces ----------------------------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox|box)\s*\{")
_CONFIDENCE_LINE = re.compile(r"^\s*\**\s*confidence\s*\**\s*[:=].*$", re.IGNORECASE | re.MULTILINE)
# "The answer is", "Final answer:", "the correct option is", "Answer =" ... (the clause is what follows it).
_MARK = re.compile(
    r"(?:final\s+answer|correct\s+(?:answer|option|choice)|\banswer)\s*(?:is|:|=)\s*[:\-]?\s*",
    re.IGNORECASE,
)
_NEGATION = re.compile(r"(?:\bnot|\bcannot|\bcan't|\bcan’t|\bunable\s+to|\bno)\s*$", re.IGNORECASE)
_STRIP = " \t.*`\"'“”"


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (also `\\box{}` as MoCo's prompts ask, and `\\fbox{}`), braces balanced.

    Example:
        >>> last_boxed("so $\\\\boxed{\\\\frac{1}{2}}$.")
        '\\\\frac{1}{2}'
    """
    found = None
    for m in _BOXED.finditer(text or ""):
        depth = 0
        for j in range(m.end() - 1, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    found = text[m.end() : j].strip()
                    break
    return found


def without_confidence(text: str) -> str:
    """The reply without "Confidence: 0.8" lines (a cascade asks for them; they are never the answer)."""
    return _CONFIDENCE_LINE.sub("", text or "")


def answer_clauses(text: str) -> list[str]:
    """What follows each "the answer is" / "answer:" statement, to the end of its line; the last one first.

    A statement after a negation ("I cannot answer: ...") commits to nothing and is skipped.
    """
    out = []
    for m in reversed(list(_MARK.finditer(text or ""))):
        if _NEGATION.search(text[max(0, m.start() - 16) : m.start()]):
            continue
        rest = text[m.end() :].split("\n", 1)[0].strip(_STRIP)
        if rest:
            out.append(rest)
    return out


def _last_line(text: str) -> str | None:
    lines = [line.strip(_STRIP) for line in (text or "").strip().splitlines()]
    lines = [line for line in lines if line]
    return lines[-1] if lines else None


# --- short text ---------------------------------------------------------------------------------------------------

_PUNCTUATION = re.compile(r"[!\"#$&'(),.:;?@\[\\\]_`{|}~]")  # math operators + - * / ^ = < > % stay


def extract_text(reply: str) -> str | None:
    """A short answer: `\\boxed{}`, else the last "the answer is X", else the last non-empty line."""
    reply = without_confidence(reply)
    boxed = last_boxed(reply)
    if boxed:
        return boxed
    clauses = answer_clauses(reply)
    return clauses[0] if clauses else _last_line(reply)


def normalize_text(answer: str) -> str:
    """Canonical short text: numbers by value; else lower case, no punctuation or articles, one space.

    Math operators are kept so "x+1" and "x-1" stay different (as MoCo's evaluator normalises).
    """
    number = parse_number(answer)
    if number is not None:
        return format_number(number)
    t = _PUNCTUATION.sub(" ", (answer or "").lower())
    t = re.sub(r"\b(?:a|an|the)\b", " ", t)
    t = re.sub(r"\s*([+\-*/^=<>%])\s*", r"\1", t)
    return " ".join(t.split())


# --- numbers --------------------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
_LATEX_NOISE = re.compile(
    r"\\text\s*\{[^{}]*\}|\\mathrm\s*\{[^{}]*\}|\^\s*\{?\\circ\}?|\\[!,;: ]|\\(?:left|right)|\\\$|\\%|[${}]"
)


def _delatex(text: str) -> str:
    text = _FRAC.sub(r"\1/\2", text or "")
    return _LATEX_NOISE.sub("", text.replace("{,}", ",")).strip()


@functools.lru_cache(maxsize=65536)
def parse_number(text: str) -> Decimal | None:
    """A number written as `1,234`, `$12`, `-3/4`, `50%`, `0.5.` or LaTeX `\\frac{1}{2}`; None if it is not one."""
    t = _delatex(text).strip("$ ").replace(",", "")
    t = t.rstrip(".").removesuffix("%").strip()
    if "/" in t:
        num, _, den = t.partition("/")
        try:
            d = Decimal(den)
            return Decimal(num) / d if d != 0 else None
        except InvalidOperation:
            return None
    try:
        value = Decimal(t)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def format_number(value: Decimal) -> str:
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _number_in(text: str) -> str | None:
    """The text itself when it is a number, else the first number written in it."""
    if parse_number(text) is not None:
        return _delatex(text).strip(" .")
    numbers = _NUMBER.findall(_delatex(text))
    return numbers[0] if numbers else None


def extract_number(reply: str) -> str | None:
    """The number a reply commits to: `\\boxed{}`, then GSM8K's `#### N`, then the last "the answer is N" (its
    first number), then the last number written. None when there is no number."""
    reply = without_confidence(reply)
    boxed = last_boxed(reply)
    if boxed is not None and (n := _number_in(boxed)) is not None:
        return n
    hashes = reply.rfind("####")
    if hashes >= 0 and (n := _number_in(reply[hashes + 4 :].split("\n", 1)[0])) is not None:
        return n
    for clause in answer_clauses(reply):
        if (n := _number_in(clause)) is not None:
            return n
    numbers = _NUMBER.findall(_delatex(reply))
    return numbers[-1] if numbers else None


def numbers_equal(a: str, b: str, rel_tol: float = 1e-6) -> bool | None:
    """Whether two numbers are equal within `rel_tol` (relative, at least absolute for |b| < 1); None if either
    is not a number."""
    x, y = parse_number(a), parse_number(b)
    if x is None or y is None:
        return None
    return abs(x - y) <= Decimal(str(rel_tol)) * max(Decimal(1), abs(y))


# --- math ---------------------------------------------------------------------------------------------------------

_INLINE_MATH = re.compile(r"\$\$(.+?)\$\$|\$([^$\n]+)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")


def _strip_math(text: str) -> str:
    t = text.strip().strip("$").strip()
    t = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", t).strip()
    return t.rstrip(".").strip()


def extract_math(reply: str) -> str | None:
    """A math answer: `\\boxed{}`, else the last "the answer is X", else the whole reply when it is one short line
    of math rather than prose (an answer already extracted), else the last `$...$`, else the last number."""
    reply = without_confidence(reply)
    boxed = last_boxed(reply)
    if boxed:
        return boxed
    for clause in answer_clauses(reply):
        if (inner := last_boxed(clause)) or (inner := _strip_math(clause)):
            return inner
    stripped = reply.strip()
    if stripped and "\n" not in stripped and len(stripped) <= 120 and len(_WORD.findall(stripped)) <= 2:
        return _strip_math(stripped) or None
    inline = [next(g for g in m.groups() if g is not None) for m in _INLINE_MATH.finditer(reply)]
    if inline:
        return inline[-1].strip()
    numbers = _NUMBER.findall(reply)
    return numbers[-1] if numbers else None


_math_lock = threading.Lock()


@functools.lru_cache(maxsize=4096)
def _math_parse(text: str, in_main: bool):
    from math_verify import parse

    return parse(f"${text}$", parsing_timeout=5 if in_main else None)


def math_equal(a: str, b: str) -> bool:
    """Whether `a` and `b` are the same mathematical answer (math-verify: 1/2 = 0.5 = \\frac12, 6-5i = 6 - 5i).

    Equal normalised text (or equal numbers) is enough; otherwise math-verify decides. Without math-verify
    installed only that first check applies (`MathVerifyMissing` is raised for the caller to report once).
    """
    if normalize_text(a) == normalize_text(b) or numbers_equal(a, b):
        return True
    try:
        from math_verify import verify
    except ImportError:
        raise MathVerifyMissing() from None
    # math-verify times out with SIGALRM, which only the main thread may use; elsewhere it runs without one.
    in_main = threading.current_thread() is threading.main_thread()
    with _math_lock:  # its sympy parsing is not thread-safe
        x, y = _math_parse(a, in_main), _math_parse(b, in_main)
        if not x or not y:
            return False
        return bool(verify(x, y, timeout_seconds=5 if in_main else None))


class MathVerifyMissing(RuntimeError):
    """math-verify is not installed: math answers compare by normalised text only."""


# --- multiple choice ----------------------------------------------------------------------------------------------

# The statement is matched in any case, the letter only in capitals ("the answer is a prime" names no option),
# except in brackets: "(c)".
_CHOICE_MARK = re.compile(
    r"(?i:final\s+answer|correct\s+(?:answer|option|choice)|\banswer|\boption|\bchoice)"
    r"\s*(?i:is|:|=|-)?\s*[:\-]?\s*(?:\*\*)?\s*(?:\(([A-Ja-j])\)|\[([A-J])\]|([A-J]))(?![A-Za-z0-9])"
)
_LEADING_CHOICE = re.compile(r"^\s*(?:\*\*)?\s*(?:\(([A-J])\)|([A-J])[\).:])\s*(?:\*\*)?\s*(.*)$")


def _clean(text: str) -> str:
    return re.sub(r"[\s.,;:!?*`\"']+$", "", " ".join((text or "").lower().split())).strip(" *`\"'")


def _option_text_letter(text: str, choices: list[str]) -> str | None:
    """The letter whose option text `text` is (normalised), or None."""
    cleaned = _clean(text)
    for i, option in enumerate(choices):
        if cleaned and cleaned == _clean(option):
            return LETTERS[i]
    return None


def _bare_choice(text: str, choices: list[str]) -> str | None:
    """A reply (or part) that is only a choice: "C", "(c)", "C.", "**C**", "C) text-of-C", or an option's text."""
    valid = LETTERS[: len(choices)]
    t = text.strip().strip("*` ")
    bare = t.strip("()[].: ").upper()
    if len(bare) == 1 and bare in valid and len(t) <= 4:
        return bare
    leading = _LEADING_CHOICE.match(t)
    if leading:
        letter = leading.group(1) or leading.group(2)
        rest = leading.group(3)
        if letter in valid and (not rest.strip() or _option_text_letter(rest, choices) == letter):
            return letter
    return _option_text_letter(t, choices)


def _mentioned_option(text: str, choices: list[str]) -> str | None:
    """The one option whose text the reply mentions (a mention inside another option's mention does not count:
    "the blue whale" names "Blue whale", not "whale"); None when none or several are mentioned."""
    lowered = " ".join(text.lower().split())
    spans: dict[int, list[tuple[int, int]]] = {}
    for i, option in enumerate(choices):
        o = " ".join(option.lower().split())
        if len(o) < 2:
            continue
        spans[i] = [
            (m.start(), m.end()) for m in re.finditer(rf"(?<![a-z0-9]){re.escape(o)}(?![a-z0-9])", lowered)
        ]
    mentioned = set()
    for i, own in spans.items():
        for a, b in own:
            inside = any(
                j != i and x <= a and b <= y and (y - x) > (b - a)
                for j, other in spans.items()
                for x, y in other
            )
            if not inside:
                mentioned.add(i)
    return LETTERS[mentioned.pop()] if len(mentioned) == 1 else None


def extract_choice(reply: str, choices: list[str]) -> str | None:
    """The option letter a reply commits to; None when it commits to none.

    In order: a `\\boxed{}` letter or option; the whole reply being a choice ("C", "(C)", "C. text", the option's
    text); the last explicit statement ("The answer is (C)", "The correct option is C ...", "Option C: ...",
    "Answer: C", or such a statement followed by an option's text); the last line that starts with a letter and
    that option's text; the only option whose text the reply mentions. A letter elsewhere in prose ("I cannot
    answer: A..." or "A lot depends") is not a commitment.
    """
    if not choices:
        return None
    valid = LETTERS[: len(choices)]
    reply = without_confidence(reply)
    boxed = last_boxed(reply)
    if boxed is not None and (letter := _bare_choice(boxed, choices)):
        return letter
    if letter := _bare_choice(reply, choices):
        return letter
    for m in reversed(list(_CHOICE_MARK.finditer(reply))):
        if _NEGATION.search(reply[max(0, m.start() - 16) : m.start()]):
            continue
        letter = (m.group(1) or m.group(2) or m.group(3)).upper()
        if letter in valid:
            return letter
    for clause in answer_clauses(reply):
        if letter := (_bare_choice(clause, choices) or _mentioned_option(clause, choices)):
            return letter
    for line in reversed(reply.splitlines()):
        leading = _LEADING_CHOICE.match(line)
        if leading and leading.group(3).strip():
            letter = leading.group(1) or leading.group(2)
            if letter in valid and _option_text_letter(leading.group(3), choices) == letter:
                return letter
    return _mentioned_option(reply, choices)


def choice_letter(gold: str, choices: list[str]) -> str | None:
    """A gold answer as a letter: a letter ("c", "(C)"), a 0-based index, or an option's text."""
    g = (gold or "").strip()
    if g.isdigit() and int(g) < len(choices):
        return LETTERS[int(g)]
    return _bare_choice(g, choices)


# --- code -----------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = ("python", "py", "python3")


def defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def _parses_with_function(code: str) -> bool:
    tree = _parse(code)
    return tree is not None and any(
        isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(tree)
    )


def extract_code(reply: str, entry_point: str | None = None, prompt_code: str | None = None) -> str | None:
    """The code in a reply; None when it holds none.

    Fenced blocks first: ```python blocks (else untagged ones; blocks tagged with another language are not
    Python); a block left open at the end of a cut-off reply counts. The solution is the last block that defines
    `entry_point` when given, else the last that defines a function, else the last block: an "Example usage"
    block after the solution is not the answer. Blocks the solution needs are joined to it, in reply order: a
    block that only defines (imports, functions, classes, constants; no call at its top level) and defines a
    name the solution uses without defining it (imports in a block of their own, a helper in the block before);
    never another block defining `entry_point` (an earlier draft). Without fences, the reply itself when it
    parses as Python defining a function, or when it completes `prompt_code` (a HumanEval-style body). Prose is
    not code. Idempotent: a joined solution parses as one program, so extracting from it gives it back.
    """
    reply = reply or ""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(reply)]
    candidates = [body for lang, body in blocks if lang in _PYTHON_TAGS] or [
        b for lang, b in blocks if not lang
    ]
    candidates = [c for c in candidates if c.strip()]
    if candidates:
        defining = [c for c in candidates if entry_point and defines(c, entry_point)]
        defining = defining or [c for c in candidates if _parses_with_function(c)] or candidates
        return _with_needed_blocks(defining[-1], candidates, entry_point)
    if _parses_with_function(reply):
        return reply
    if prompt_code and reply.strip() and _parses_with_function(prompt_code + reply):
        return reply
    return None


def _with_needed_blocks(solution: str, blocks: list[str], entry_point: str | None) -> str:
    tree = _parse(solution)
    if tree is None:
        return solution
    missing = _free_names(tree)
    chosen = {blocks.index(solution)}
    progress = True
    while missing and progress:
        progress = False
        for i, block in enumerate(blocks):
            helper = _parse(block) if i not in chosen else None
            if helper is None or not _only_defines(helper) or (entry_point and defines(block, entry_point)):
                continue
            provided = top_level_names(helper)
            if provided & missing:
                chosen.add(i)
                missing = (missing - provided) | _free_names(helper)
                progress = True
    if len(chosen) == 1:
        return solution
    return "\n".join(blocks[i] if blocks[i].endswith("\n") else blocks[i] + "\n" for i in sorted(chosen))


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


# Statements that only define things (what a helper block, or a question's code, is made of).
DEFINITIONS = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
)


def _only_defines(tree: ast.Module) -> bool:
    return all(
        isinstance(n, DEFINITIONS) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
        for n in tree.body
    )


def top_level_names(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level: functions, classes, imports, and whatever else it assigns."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            names.update(
                t.id for t in ast.walk(node) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)
            )
    return names


def _free_names(tree: ast.Module) -> set[str]:
    """Names the code reads that it binds nowhere (approximately: any binding anywhere counts) and that are not
    builtins: what another block would have to define."""
    bound = top_level_names(tree) | set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - bound


def main_function(code: str) -> str | None:
    """The function a solution offers when no entry point is known: the last top-level function that no other
    top-level function calls (a helper defined before it is not it). None when the code defines none.

    Example:
        >>> main_function("def is_prime(n):\n    return n > 1\n\ndef count(xs):\n    return sum(map(is_prime, xs))\n")
        'count'
    """
    tree = _parse(code)
    if tree is None:
        defined = defined_functions(code)
        return defined[-1] if defined else None
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    called = {
        inner.id
        for f in functions
        for inner in ast.walk(f)
        if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Load) and inner.id != f.name
    }
    roots = [f.name for f in functions if f.name not in called]
    return (roots or [f.name for f in functions] or [None])[-1]


def canonical_code(code: str) -> str:
    """Source with formatting, comments and docstrings normalised away (ast round trip), for "same answer"."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return " ".join((code or "").split())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def defined_functions(code: str) -> list[str]:
    """Names of the top-level functions `code` defines, in order ([] when it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return re.findall(r"^def\s+([A-Za-z_]\w*)\s*\(", code or "", re.MULTILINE)
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
