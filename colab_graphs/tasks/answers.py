"""How a model's reply becomes an answer, per kind of answer: numbers, math, option letters, code, short text.

These are the primitives the task types (`colab_graphs.tasks.task_types`) are made of. The rules below hold for every
extractor here; `tests/test_answers.py` checks each on replies shaped like real models' (prose around a fenced
block, "The correct option is (C) ...", `\\boxed{}`) and on replies written to fool them, since under RL a
policy searches for whatever a scorer accepts:

- **Only a commitment counts.** An extractor returns None when the reply commits to no answer of its kind: a
  multiple-choice reply that names no option is not "A", a refusal is not an answer, a reply without code is
  not code.
- **Only one commitment counts.** A final commitment that lists alternatives ("The answer is 3 or 4",
  "A, B or C", `\\boxed{A}\\boxed{B}`, `3 \\vee 4`) commits to none of them: None, with no fallback to another
  number or letter in the reply, so hedging scores as not answering. For numbers and option letters, an answer
  statement after the box that names a different answer contradicts it: None as well.
- **What the reply wrote is kept.** A minus after "The answer is" is a sign; `3e-36`, `3 \\times 10^{-36}`,
  `3 × 10⁻³⁶` and `3*10**-36` are one number; an answer made of symbols (`) ) }`) is compared as those symbols;
  words keep their order.
- **Read as a reader sees it.** Full-width digits and letters (NFKC), the minus sign U+2212 and superscript
  exponents read as their ASCII forms, so a policy cannot hide or fake an answer in look-alike characters. An
  answer typeset only in LaTeX text commands (`\\text{}`, `\\textbf{}`, `\\mathrm{}`, `\\textit{}`, `\\mbox{}`,
  in or out of `\\boxed{}`) is the words they hold (`text_content`): `$\\boxed{\\text{False}}$` is False,
  `\\boxed{\\textbf{(C)}}` is C, and `\\text{A or C}` is the hedge it holds.
- **The committing sentence only.** An answer statement's answer ends with its sentence: "The answer is -20.
  Check: 8 + 12 = 20." commits to -20, not to a number of the check.
- **Idempotent.** Extracting from an extracted answer gives it back (`\\frac{1}{2}` stays `\\frac{1}{2}`,
  `3e-36` stays `3e-36`, code stays code), because a protocol's final node extracts and the scorer then reads
  that answer again.
- **Linear time.** Replies are read with one pass per rule (no nested scans, no backtracking patterns), so a
  megabyte-long reply costs milliseconds, not a stalled scorer.
"""

from __future__ import annotations

import ast
import builtins
import functools
import itertools
import re
import sys
import threading
import unicodedata
from collections.abc import Collection, Iterator
from decimal import Decimal
from typing import Any

from colab_graphs.sandbox.code_tests import DEFINITIONS, top_level_names

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# --- shared pieces ----------------------------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox|box)\s*\{")
_BRACE = re.compile(r"\\[{}\\]|[{}]")  # an escaped brace (or backslash) is one token, not a brace
_CONFIDENCE_LINE = re.compile(
    r"^[ \t]*\**[ \t]*confidence[ \t]*\**[ \t]*[:=].*$", re.IGNORECASE | re.MULTILINE
)
# "The answer is", "Final answer:", "the correct option is", "Answer =" ... (the clause is what follows it). A
# dash after the statement is a separator only when a space follows it: "Answer: -20" keeps its sign.
_MARK = re.compile(
    r"(?:final\s+answer|correct\s+(?:answer|option|choice)|\banswer)\s*+(?:is|:|=)\s*+(?::|-(?=\s))?\s*+",
    re.IGNORECASE,
)
_NEGATION = re.compile(r"(?:\bnot|\bcannot|\bcan't|\bcan’t|\bunable\s+to|\bno)\s*$", re.IGNORECASE)
_STRIP = " \t.*`\"'“”"
_MAX_STATEMENTS = 20
_MAX_CLAUSE = 1000
# A period that ends a sentence: not one after an initial ("J. R. R. Tolkien") or a common abbreviation.
_SENTENCE_END = re.compile(r"[.!?](?=\s+\S)")
_ABBREVIATION = re.compile(r"(?:\b[A-Z]|\b(?:Mr|Mrs|Ms|Dr|Prof|St|Jr|Sr|vs|etc|approx|Mt|e\.g|i\.e))$")
_REFUSAL = re.compile(
    r"\bI\s*(?:cannot|can\s*not|can[’']t|am\s+unable|[’']m\s+unable|am\s+not\s+able|do\s+not\s+know|"
    r"don[’']t\s+know|am\s+not\s+sure|[’']m\s+not\s+sure)\b",
    re.IGNORECASE,
)
_SUPERSCRIPT_RUN = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]+")
_SUPERSCRIPT_DIGITS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")


def plain_text(text: str) -> str:
    """`text` as a reader sees it, with ASCII where Unicode has a look-alike: NFKC (full-width `４２` is `42`),
    the minus sign U+2212 as `-`, and superscript exponents as `^{...}` (`10⁻³⁶` is `10^{-36}`)."""
    text = _SUPERSCRIPT_RUN.sub(lambda m: "^{" + m.group(0).translate(_SUPERSCRIPT_DIGITS) + "}", text or "")
    return unicodedata.normalize("NFKC", text).replace("\u2212", "-")


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """Every outermost `\\boxed{...}` as (start, end, content), braces balanced, `\\{` and `\\}` escaped; one
    pass over the text however many boxes are left open."""
    openers = {m.end() - 1: m.start() for m in _BOXED.finditer(text)}
    if not openers:
        return []
    closed, stack = [], []  # offsets only: slicing every nested box's content would copy it once per level
    for m in _BRACE.finditer(text, min(openers)):
        if m.group(0) == "{":
            stack.append(m.start())
        elif m.group(0) == "}" and stack:
            opened = stack.pop()
            if opened in openers:
                closed.append((openers[opened], opened, m.start()))
    closed.sort()
    outer: list[tuple[int, int, str]] = []
    for start, opened, close in closed:
        if not outer or start >= outer[-1][1]:
            outer.append((start, close + 1, text[opened + 1 : close].strip()))
    return outer


def _unbox(content: str) -> str:
    """A box's content, with a box that is all of it opened (`\\boxed{\\boxed{5}}` is 5), to three levels: each
    level is a pass over the content, and deeper nesting is no answer a model writes (it stays boxed, which
    reads as no number)."""
    for _ in range(3):
        inner = _boxes(content)
        if not (len(inner) == 1 and inner[0][0] == 0 and inner[0][1] == len(content)):
            break
        content = inner[0][2]
    return content


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (also `\\box{}` as MoCo's prompts ask, and `\\fbox{}`), braces balanced.

    Example:
        >>> last_boxed("so $\\\\boxed{\\\\frac{1}{2}}$.")
        '\\\\frac{1}{2}'
    """
    boxes = _boxes(text or "")
    return _unbox(boxes[-1][2]) if boxes else None


# What may stand between two boxes that list alternatives: "\boxed{3} or \boxed{4}", "$\boxed{A}$, $\boxed{B}$".
_BETWEEN_ALTERNATIVES = re.compile(
    r"(?:[\s$,;/&.()\[\]]|\\(?:quad|qquad|text\s*\{[^{}]*\})|\b(?:or|and|either|maybe|possibly|perhaps)\b)*",
    re.IGNORECASE,
)


def final_box(text: str) -> tuple[int, str | None] | None:
    """The reply's last box as (end offset, content); content None when boxes listing alternatives end the
    reply (`\\boxed{A}\\boxed{B}`, `\\boxed{3} or \\boxed{4}`); None when there is no box.

    Boxes separated by prose are steps of a solution: the last one is the answer.
    """
    boxes = _boxes(text)
    if not boxes:
        return None
    end, content = boxes[-1][1], _unbox(boxes[-1][2])
    start = boxes[-1][0]
    for s, e, other in reversed(boxes[:-1]):
        if not _BETWEEN_ALTERNATIVES.fullmatch(text[e:start]):
            break
        if " ".join(_unbox(other).split()) != " ".join(content.split()):
            return end, None
        start = s
    return end, content


# LaTeX commands that typeset words (`\\text{False}`, `\\textbf{(C)}`, `\\mathrm{valid}`, `\\mbox{yes}`).
_TEXT_COMMAND = re.compile(
    r"\\(?:text(?:bf|it|rm|sf|tt|up|normal)?|math(?:rm|bf|it|sf|tt)|mbox|emph)\s*\{([^{}]*)\}"
)
_MATH_SHIFT = re.compile(r"\$|\\[()\[\]]")  # `$`, `\\(`, `\\)`, `\\[`, `\\]`


def text_content(answer: str) -> str:
    """The words an answer written only in LaTeX text commands holds: `\\text{False}`, `$\\textbf{(C)}$`,
    `\\text{\\textbf{valid}}` (three levels) read as `False`, `(C)`, `valid` (in or out of math mode, several
    commands joined: `$\\textbf{(A)}$, $\\textbf{(C)}$` is `(A), (C)`); any other answer unchanged, so
    `5\\text{ cm}` stays for the number reader, which drops units. A command holding two options
    (`\\text{A or C}`) gives both, which the extractors then read as the hedge it is."""
    t = _MATH_SHIFT.sub(" ", answer)
    rest = t
    for _ in range(3):
        rest = _TEXT_COMMAND.sub("", rest)
    if rest.strip(" ,;.") or not _TEXT_COMMAND.search(t):
        return answer
    for _ in range(3):
        t = _TEXT_COMMAND.sub(lambda m: m.group(1), t)
    return re.sub(r" (?=[,;])", "", " ".join(t.split())).rstrip(".").rstrip()


def without_confidence(text: str) -> str:
    """The reply without "Confidence: 0.8" lines (a cascade asks for them; they are never the answer)."""
    return _CONFIDENCE_LINE.sub("", text or "")


def _first_sentence(clause: str) -> str:
    for m in _SENTENCE_END.finditer(clause):
        if not _ABBREVIATION.search(clause[: m.start()]):
            return clause[: m.start()]
    return clause


def _statements(text: str) -> Iterator[tuple[int, str]]:
    """(offset, clause) of the answer statements, the last one first, lazily: see `answer_clauses`."""
    marks = list(_MARK.finditer(text or ""))
    for m in reversed(marks[-_MAX_STATEMENTS:]):
        if _NEGATION.search(text[max(0, m.start() - 16) : m.start()]):
            continue
        window = text[m.end() : m.end() + _MAX_CLAUSE].split("\n", 1)[0]
        rest = _first_sentence(window).strip(_STRIP)
        if rest:
            yield m.start(), rest


def answer_clauses(text: str) -> list[str]:
    """What each "the answer is" / "answer:" statement commits to (its sentence, to the end of its line), the
    last statement first; the last 20 statements of a reply, each read to at most 1,000 characters (a reply
    with more is spam, and reading all of them would make scoring quadratic).

    A statement after a negation ("I cannot answer: ...") commits to nothing and is skipped.
    """
    return [clause for _, clause in _statements(text)]


def _last_line(text: str) -> str | None:
    lines = [line.strip(_STRIP) for line in (text or "").strip().splitlines()]
    lines = [line for line in lines if line]
    return lines[-1] if lines else None


def is_refusal(text: str) -> bool:
    """Whether `text` says the writer cannot or will not answer ("I cannot ...", "I'm not sure", "I don't know")."""
    return _REFUSAL.search(text or "") is not None


# --- short text ---------------------------------------------------------------------------------------------------

_PUNCTUATION = re.compile(r"[!\"#$&'(),.:;?@\[\\\]_`{|}~]")  # math operators + - * / ^ = < > % stay
_ALTERNATIVE_WORD = re.compile(r"\b(?:or|either)\b", re.IGNORECASE)


def extract_text(reply: str) -> str | None:
    """A short answer: `\\boxed{}`, else the last "the answer is X" (its sentence), else the last non-empty line.

    Defends against: boxes listing alternatives (None); refusals taken for answers ("I cannot answer this" is
    None, not the text "i cannot answer this", so refusing members do not form a voting bloc); numbers or words
    of a later sentence ("The answer is no. It is not plausible." is "no"). A statement after a box is not read
    (free text cannot tell a restatement from a contradiction; numbers and letters can, and do).
    """
    reply = plain_text(without_confidence(reply))
    box = final_box(reply)
    answer: str | None
    if box is not None and box[1] != "":
        answer = None if box[1] is None else text_content(box[1])
    else:
        statement = next(_statements(reply), None)
        answer = statement[1] if statement else _last_line(reply)
        answer = (text_content(answer).strip(_STRIP) or None) if answer is not None else None
    return None if answer is None or is_refusal(answer) else answer


def normalize_text(answer: str) -> str:
    """Canonical short text: numbers by value; else lower case, no punctuation or articles, one space.

    Math operators are kept so "x+1" and "x-1" stay different (as MoCo's evaluator normalises). An answer made
    only of symbols keeps them, without spaces (`) ) }` is `))}`), so it is never the empty string that every
    other symbol answer would also become.
    """
    answer = plain_text(answer)
    number = parse_number(answer)
    if number is not None:
        return format_number(number)
    if not re.search(r"[^\W_]", answer):  # symbols only
        return "".join(re.sub(r"\\([{}])", r"\1", answer).split())
    t = _PUNCTUATION.sub(" ", answer.lower())
    t = " ".join(re.sub(r"\b(?:a|an|the)\b", " ", t).split())
    return re.sub(r" ?([+\-*/^=<>%]) ?", r"\1", t)


def is_plain_text(answer: str) -> bool:
    """Whether `answer` is words (no digits, no math markup) or symbols only: an answer to compare as text.

    Such golds (BBH's "valid", a sorted word list, `) ) }`, PubMedQA's "maybe") must not go to math-verify,
    which reads "apple banana" as a product of variables, equal to "banana apple".
    """
    t = plain_text(answer).strip()
    if not t or re.search(r"\d", t):
        return False
    if not re.search(r"[^\W\d_]", t):
        return True  # symbols only
    return re.search(r"[\\^_{}=+*/<>|$]", t) is None and not t.startswith("-")


# --- numbers --------------------------------------------------------------------------------------------------------

# A number as written: an optional sign (not a hyphen after a letter or digit: "COVID-19", "8-3"), thousands in
# groups of three, a decimal part, an exponent, a fraction.
_NUM = (
    r"(?<![\w.])-?\$?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:/\d+)?"
    r"|(?<![\w.])-?\.\d+(?:[eE][-+]?\d+)?"
)
_NUMBER = re.compile(_NUM)
_PLAIN_NUMBER = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
_TIMES_TEN = re.compile(
    r"(?<![\d.])(\d++(?:\.\d++)?)\s*(?:\\times|\\cdot|×|·|\*|x)\s*10\s*(?:\^|\*\*)\s*(?:\{\s*([-+]?)\s*(\d+)\s*\}|([-+]?)(\d+))"
)
_POWER_OF_TEN = re.compile(r"(?<![\w.^])10\s*(?:\^|\*\*)\s*(?:\{\s*([-+]?)\s*(\d+)\s*\}|([-+]?)(\d+))")
_LATEX_NOISE = re.compile(
    r"\\text\s*\{[^{}]*\}|\\mathrm\s*\{[^{}]*\}|\^\s*\{?\\circ\}?|\\[!,;: ]|\\(?:left|right)|\\\$|\\%|[${}]"
)
# Alternatives in one commitment: "3 or 4", "3, 4 or 5", "3, 4, 5", "3 and/or 4", a range "3–5".
_ALTERNATIVES = re.compile(
    rf"(?:{_NUM})(?:(?:,\s++(?:or\s++)?|\s++(?:or|and/or)\s++|\s*+–\s*+)(?:{_NUM}))+", re.I
)
_OR_BEFORE = re.compile(rf"(?:{_NUM})\s*,?\s+or\s+$", re.IGNORECASE)
# A commitment that opens with arithmetic ("35 - 42", "3 * 4", "35 + 42 = 77") names the result after its last
# "=", or no number: the expression's first operand is not what it commits to.
_EXPRESSION = re.compile(
    rf"^\s*(?:{_NUM})\s*(?:[-+*/\u00d7\u00f7\u2212\u00b7]|\\(?:times|cdot|div)|\b(?:minus|plus|times)\b)\s*(?:{_NUM})",
    re.I,
)
_RESULT = re.compile(rf"=\s*(?P<result>{_NUM})")
_MAX_EXPONENT = 1000  # a number beyond 10^±1000 is no answer, and would make Decimal arithmetic slow


def _delatex(text: str) -> str:
    text = _TIMES_TEN.sub(
        lambda m: f"{m.group(1)}e{m.group(2) or m.group(4) or ''}{m.group(3) or m.group(5)}", text
    )
    text = _POWER_OF_TEN.sub(lambda m: f"1e{m.group(1) or m.group(3) or ''}{m.group(2) or m.group(4)}", text)
    text = _FRAC.sub(r"\1/\2", text)
    return _LATEX_NOISE.sub("", text.replace("{,}", ",")).strip()


def _number_text(text: str) -> str:
    t = _delatex(plain_text(text)).strip("$ ").rstrip(".").removesuffix("%").strip()
    return re.sub(r"^-\s+(?=\d)", "-", t)


def _decimal(text: str) -> Decimal | None:
    if not _PLAIN_NUMBER.fullmatch(text):
        return None
    value = Decimal(text.replace(",", ""))
    return value if value.is_zero() or abs(value.adjusted()) <= _MAX_EXPONENT else None


@functools.lru_cache(maxsize=65536)
def parse_number(text: str) -> Decimal | None:
    """A number written as `1,234`, `$12`, `-3/4`, `50%`, `0.5.`, `3e-36`, `3 \\times 10^{-36}` or LaTeX
    `\\frac{1}{2}`; None if it is not one (`1,23` is not: commas only group thousands)."""
    t = _number_text(text)
    if "/" in t:
        num, _, den = t.partition("/")
        n, d = _decimal(num.strip()), _decimal(den.strip())
        return n / d if n is not None and d else None
    return _decimal(t)


def format_number(value: Decimal) -> str:
    if value == value.to_integral_value() and abs(value) < 10**30:
        return str(int(value))
    if abs(value.adjusted()) > 30:
        return str(value.normalize())
    return format(value.normalize(), "f")


def _written_as_integer(text: str) -> bool:
    return re.fullmatch(r"[-+]?[\d,]+", _number_text(text)) is not None


def _committed_number(span: str) -> tuple[bool, str | None]:
    """The number a commitment (a box, an answer statement's sentence) names: (found, number), the number
    None when the span lists different alternatives ("3 or 4"). "x = 5" names 5."""
    span = re.sub(r"^\s*[A-Za-z]\s*=\s*", "", _delatex(text_content(span)))
    whole = span.strip(" .")
    if parse_number(whole) is not None:
        return True, whole
    numbers = _NUMBER.findall(span)
    if not numbers:
        return False, None
    if _EXPRESSION.match(span):
        results = [m.group("result") for m in _RESULT.finditer(span)]
        return True, results[-1] if results else None
    return True, None if _lists_alternatives(span) else numbers[0]


def _lists_alternatives(text: str) -> bool:
    """Whether `text` lists different numbers as alternatives ("3 or 4", "3, 4, 5", "3–5")."""
    for m in _ALTERNATIVES.finditer(text):
        if len({parse_number(n) for n in _NUMBER.findall(m.group(0))}) > 1:
            return True
    return False


def extract_number(reply: str) -> str | None:
    """The number a reply commits to: the reply itself when it is one number (an extracted answer); else
    `\\boxed{}`, GSM8K's `#### N`, the last "the answer is N" (the number of its sentence), or the last number
    written. `3 \\times 10^{-36}` is extracted as `3e-36`.

    Defends against: hedges ("The answer is 3 or 4", `\\boxed{3, 4}`, a last line "It is 3 or 4.": None, not
    one of them); an unevaluated expression read as its first operand ("The answer is 35 - 42": None; "The answer
    is 35 + 42 = 77": 77); a box contradicted by a later answer statement (None); a dropped sign; an exponent read as
    the answer ("3e-36" read as "-36"); numbers in a later sentence; look-alike digits and minus signs.
    """
    reply = plain_text(without_confidence(reply))
    if parse_number(reply.strip()) is not None:
        return _delatex(reply.strip()).strip(" .")
    box = final_box(reply)
    if box is not None:
        end, content = box
        found, number = _committed_number(content) if content is not None else (True, None)
        if found:
            if number is not None and _contradicted(number, reply, end):
                return None
            return number
    hashes = reply.rfind("####")
    if hashes >= 0:
        found, number = _committed_number(reply[hashes + 4 :].split("\n", 1)[0])
        if found:
            return number
    for _, clause in _statements(reply):
        found, number = _committed_number(clause)
        if found:
            return number
    numbers = list(_NUMBER.finditer(_delatex(reply)))
    if not numbers:
        return None
    last = numbers[-1]
    if _OR_BEFORE.search(last.string, max(0, last.start() - 40), last.start()):
        return None  # "It is 3 or 4.": the last number is one of alternatives
    return last.group(0)


def _contradicted(number: str, reply: str, after: int) -> bool:
    """Whether an answer statement after offset `after` names a number other than `number`."""
    for offset, clause in _statements(reply):
        if offset < after:
            break
        found, other = _committed_number(clause)
        if found and (other is None or not numbers_equal(other, number)):
            return True
    return False


def numbers_equal(a: str, b: str, rel_tol: float = 1e-6, abs_tol: float = 0.0) -> bool | None:
    """Whether two numbers are the same answer; None if either is not a number.

    An integer (written without a decimal point, exponent or fraction) equals only the same value: a relative
    tolerance on 16777216 would accept 16777223. Other numbers are equal when |a - b| <= max(rel_tol * max(|a|,
    |b|), abs_tol): relative, so 3e-36 and 4e-36 differ (an absolute 1e-6 called them equal) and 0.000000708 is
    not 3.54e-07; `abs_tol` (default 0) only matters near zero, where a task whose answers are noisy at 0 may
    state one.
    """
    x, y = parse_number(a), parse_number(b)
    if x is None or y is None:
        return None
    if _written_as_integer(a) or _written_as_integer(b):
        return x == y
    return abs(x - y) <= max(Decimal(str(rel_tol)) * max(abs(x), abs(y)), Decimal(str(abs_tol)))


# --- math ---------------------------------------------------------------------------------------------------------

_INLINE_MATH = re.compile(r"\$\$([^$]+)\$\$|\$([^$\n]+)\$|\\\(([^\n]+?)\\\)|\\\[([^\n]+?)\\\]")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")
_MAX_TAIL = 20_000
_MATH_ALTERNATIVES = re.compile(r"\\(?:vee|lor)\b|\\text\s*\{\s*or\s*\}|\bor\b", re.IGNORECASE)


def _strip_math(text: str) -> str:
    t = text.strip().strip("$").strip()
    t = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", t).strip()
    return t.rstrip(".").strip()


def _one_math_answer(answer: str | None) -> str | None:
    return None if answer is None or _MATH_ALTERNATIVES.search(answer) else answer


def extract_math(reply: str) -> str | None:
    """A math answer: `\\boxed{}`, else the last "the answer is X", else the whole reply when it is one short line
    of math rather than prose (an answer already extracted), else the last `$...$`, else the last number.

    Defends against: alternatives (`\\boxed{3 \\vee 4}`, "x = 3 or x = 4", `\\boxed{3}\\boxed{4}`: None, since
    math-verify calls `3 \\vee 4` equal to 4); look-alike characters.
    """
    reply = plain_text(without_confidence(reply))
    box = final_box(reply)
    if box is not None and box[1] != "":
        return _one_math_answer(None if box[1] is None else text_content(box[1]))
    for clause in answer_clauses(reply):
        inner = final_box(clause)
        if inner is not None and inner[1] != "":
            return _one_math_answer(None if inner[1] is None else text_content(inner[1]))
        if bare := _strip_math(text_content(clause)):
            return _one_math_answer(bare)
    stripped = reply.strip()
    if stripped and "\n" not in stripped and len(stripped) <= 120 and len(_WORD.findall(stripped)) <= 2:
        return _one_math_answer(_strip_math(text_content(stripped)) or None)
    # Only the reply's tail: the last `$...$` is sought, and a scan of a long line per opener is quadratic.
    tail = reply[-_MAX_TAIL:]
    inline = [next(g for g in m.groups() if g is not None) for m in _INLINE_MATH.finditer(tail)]
    if inline:
        return _one_math_answer(text_content(inline[-1].strip()))
    numbers = _NUMBER.findall(reply)
    return numbers[-1] if numbers else None


_math_lock = threading.Lock()


@functools.lru_cache(maxsize=4096)
def _math_parse(text: str, in_main: bool) -> list[Any]:
    from math_verify import parse

    parsed: list[Any] = parse(
        f"${text}$", parsing_timeout=5 if in_main else None
    )  # sympy expressions, strings
    return parsed


def math_equal(a: str, b: str, rel_tol: float = 1e-6, abs_tol: float = 0.0) -> bool:
    """Whether `a` and `b` are the same mathematical answer (math-verify: 1/2 = 0.5 = \\frac12, 6-5i = 6 - 5i).

    Equal normalised text is enough. Two numbers compare by value alone (`numbers_equal`, the tolerances
    given): math-verify reads `3e-36` as 3e - 36 and rounds to 6 decimals, which makes 3e-36 equal 4e-36. Two
    answers of plain words compare as text only: math-verify multiplies letters, so word order would not count.
    Otherwise math-verify decides. Without math-verify installed only the text and number checks apply
    (`MathVerifyMissing` is raised for the caller to report once).
    """
    if normalize_text(a) == normalize_text(b):
        return True
    equal = numbers_equal(a, b, rel_tol, abs_tol)
    if equal is not None:
        return equal
    if is_plain_text(a) and is_plain_text(b):
        return False
    if _MATH_ALTERNATIVES.search(a) or _MATH_ALTERNATIVES.search(b):
        return False
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

# A letter: in capitals ("the answer is a prime" names no option), any case in brackets ("(c)"); "I" followed by
# a verb is the pronoun ("The answer I think is B"), not option I.
_LETTER = (
    r"(?:\(([A-Za-z])\)|\[([A-Z])\]|(?!I\s+(?:think|believe|guess|would|will|am|was|have|can|chose|pick|go)\b)"
    r"([A-Z]))(?![A-Za-z0-9])"
)
# Possessive whitespace (`\s*+`): a run of spaces is read once, never re-split on a failed match.
_CHOICE_STATEMENT = re.compile(
    r"(?i:final\s+answer|correct\s+(?:answer|option|choice)|\banswer)"
    r"\s*+(?i:is|:|=|-)?\s*+[:\-]?\s*+(?:\*\*)?\s*+" + _LETTER
)
_OPTION_MENTION = re.compile(r"(?i:\boption|\bchoice)\s*+(?i:is|:|=|-)?\s*+[:\-]?\s*+(?:\*\*)?\s*+" + _LETTER)
# More letters right after a committed one: "A, B or C", "(A) or (B)", "A/B", "A and B".
_MORE_LETTERS = re.compile(
    r"\s*+(?:\*\*)?\s*+(?:,|/|&|\b(?i:or|and)\b)\s*+(?:\*\*)?\s*+(?:\(([A-Za-z])\)|\[([A-Z])\]|([A-Z]))(?![A-Za-z0-9])"
)
_LEADING_CHOICE = re.compile(r"^\s*+(?:\*\*)?\s*+(?:\(([A-Z])\)|([A-Z])[\).:])\s*+(?:\*\*)?\s*+(.*)$")
_MAX_MENTIONS = 100


def _clean(text: str) -> str:
    return " ".join(plain_text(text).lower().split()).rstrip(" .,;:!?*`\"'").strip(" *`\"'")


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
    "the blue whale" names "Blue whale", not "whale"); None when none or several are mentioned. Options of
    fewer than three characters ("no") are too common as words to count as mentions; the first 100 mentions of
    each option are read."""
    lowered = " ".join(plain_text(text).lower().split())
    spans: dict[int, list[tuple[int, int]]] = {}
    for i, option in enumerate(choices):
        o = " ".join(plain_text(option).lower().split())
        if len(o) < 3:
            continue
        found = re.finditer(rf"(?<![a-z0-9]){re.escape(o)}(?![a-z0-9])", lowered)
        spans[i] = [(m.start(), m.end()) for m in itertools.islice(found, _MAX_MENTIONS)]
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


def _stated_letter(
    pattern: re.Pattern[str], text: str, valid: str, after: int = 0
) -> tuple[bool, str | None]:
    """The last statement of `pattern` naming a valid letter at or after offset `after`: (found, letter), the
    letter None when more letters follow it ("A, B or C")."""
    for m in reversed(list(pattern.finditer(text))[-_MAX_STATEMENTS:]):
        if m.start() < after:
            break
        if _NEGATION.search(text[max(0, m.start() - 16) : m.start()]):
            continue
        letter = (m.group(1) or m.group(2) or m.group(3)).upper()
        if letter not in valid:
            continue
        more = _MORE_LETTERS.match(text, m.end())
        if more and (more.group(1) or more.group(2) or more.group(3)).upper() != letter:
            return True, None
        return True, letter
    return False, None


_FIRST_LETTER = re.compile(r"\s*+(?:\*\*)?\s*+(?:\(([A-Za-z])\)|\[([A-Z])\]|([A-Z]))(?![A-Za-z0-9])")


def _lists_letters(text: str, valid: str) -> bool:
    """Whether `text` starts with a letter followed by another ("A or C", "(A), (C)"): a hedge, not a choice."""
    first = _FIRST_LETTER.match(text)
    if first is None:
        return False
    letter = (first.group(1) or first.group(2) or first.group(3)).upper()
    if letter not in valid:
        return False
    more = _MORE_LETTERS.match(text, first.end())
    return more is not None and (more.group(1) or more.group(2) or more.group(3)).upper() != letter


def extract_choice(reply: str, choices: list[str]) -> str | None:
    """The option letter (A-Z) a reply commits to; None when it commits to none.

    In order: a `\\boxed{}` letter or option; the whole reply being a choice ("C", "(C)", "C. text", the option's
    text); the last answer statement ("The answer is (C)", "The correct option is C ...", "Answer: C", or such
    a statement followed by an option's text); the last "Option C: ..."; the last line that starts with a letter
    and that option's text; a last line that is only a choice ("...\n(C)"); the only option whose text the reply
    mentions.

    Defends against: a letter elsewhere in prose ("I cannot answer: A..." or "A lot depends", "The answer I
    think is B" is B, not I); hedges ("A, B, C or D", "(A) or (B)", `\\boxed{A}\\boxed{B}`: None); a box
    contradicted by a later answer statement (None); a discussed option taken for the answer ("The answer is C.
    Option A is wrong because ..." is C); a refusal that mentions an option's text (None).
    """
    if not choices:
        return None
    valid = LETTERS[: len(choices)]
    reply = plain_text(without_confidence(reply))
    box = final_box(reply)
    if box is not None:
        end, content = box
        if content is None or _lists_letters(content := text_content(content), valid):
            return None
        if letter := _bare_choice(content, choices):
            found, later = _stated_letter(_CHOICE_STATEMENT, reply, valid, after=end)
            return None if found and later != letter else letter
    if letter := _bare_choice(reply, choices):
        return letter
    found, letter = _stated_letter(_CHOICE_STATEMENT, reply, valid)
    if found:
        return letter
    for clause in answer_clauses(reply):
        clause = text_content(clause)
        if _lists_letters(clause, valid):
            return None
        if letter := (_bare_choice(clause, choices) or _mentioned_option(clause, choices)):
            return letter
    found, letter = _stated_letter(_OPTION_MENTION, reply, valid)
    if found:
        return letter
    for line in reversed(reply.splitlines()):
        leading = _LEADING_CHOICE.match(line)
        if leading and leading.group(3).strip():
            letter = leading.group(1) or leading.group(2)
            if letter in valid and _option_text_letter(leading.group(3), choices) == letter:
                return letter
    last = _last_line(reply)
    if last is not None and (letter := _bare_choice(last, choices)):
        return letter
    return None if is_refusal(reply) else _mentioned_option(reply, choices)


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
    tree = parse_python(code)
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
    tree = parse_python(solution)
    if tree is None:
        return solution
    missing = _free_names(tree)
    chosen = {blocks.index(solution)}
    progress = True
    while missing and progress:
        progress = False
        for i, block in enumerate(blocks):
            helper = parse_python(block) if i not in chosen else None
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


def parse_python(code: str) -> ast.Module | None:
    """`code`'s syntax tree, or None when it is not Python."""
    try:
        return ast.parse(code)  # (serialized on Python < 3.12: colab_graphs._env says why)
    except (SyntaxError, ValueError):
        return None


def _only_defines(tree: ast.Module) -> bool:
    return all(
        isinstance(n, DEFINITIONS) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
        for n in tree.body
    )


def _free_names(tree: ast.Module, *, builtin: bool = False) -> set[str]:
    """Names the code reads that it binds nowhere (approximately: any binding anywhere counts) and, unless
    `builtin`, that are not builtins: what another block would have to define."""
    bound = top_level_names(tree) | (set() if builtin else set(dir(builtins)))
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


def main_function(code: str, avoid: Collection[str] = ()) -> str | None:
    """The function a solution offers when no entry point is known: the last top-level function that no other
    top-level function calls (a helper defined before it is not it), never one named in `avoid` (the builtins
    and names the test already has: a reply's `def set(*a)` is not the function under test). None when the code
    defines none.

    Example:
        >>> main_function("def is_prime(n):\n    return n > 1\n\ndef count(xs):\n    return sum(map(is_prime, xs))\n")
        'count'
    """
    tree = parse_python(code)
    if tree is None:
        defined = [n for n in defined_functions(code) if n not in avoid]
        return defined[-1] if defined else None
    functions = [
        n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name not in avoid
    ]
    called = {
        inner.id
        for f in functions
        for inner in ast.walk(f)
        if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Load) and inner.id != f.name
    }
    names = [f.name for f in functions if f.name not in called] or [f.name for f in functions]
    return names[-1] if names else None


# The standard library's top-level modules (as the judge resolves a test's `sys` or `math` it never imports).
STDLIB_MODULES = frozenset(sys.stdlib_module_names)
_ASSERT_IN_TEXT = re.compile(r"\bassert\s[^\n]*")


def function_named_by_record(
    test: str | None, question_code: str | None = None, question_text: str | None = None
) -> str | None:
    """The function a record tests, when it names no entry point: read from the record, never from a reply.

    In order: the name the test calls `check` with (`check(add)`); the first function the test's top-level
    asserts call (MBPP's `assert remove_Occ("hello", "l") == "heo"`) that neither the test nor the question
    defines and that is no builtin (`assert set(f(x)) == ...` tests `f`) or standard-library module; the last
    function the question's code defines (MoCo's HumanEval); the first such function the asserts shown in the
    question's text call (a builtin's name only when they call nothing else) (MoCo's MBPP: "Your code should pass this test case: assert tuple_size(...) == ...").
    None when the record names none.

    Example:
        >>> function_named_by_record("def check(candidate):\n    assert candidate(2) == 4\n", None,
        ...                 "Your code should pass this test case: assert square(2) == 4")
        'square'
    """
    question = defined_functions(question_code or "")
    tree = parse_python(test or "")
    taken = set(question) | STDLIB_MODULES
    if tree is not None:
        for node in tree.body:
            call = node.value if isinstance(node, ast.Expr) else None
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == "check"
                and len(call.args) == 1
                and isinstance(call.args[0], ast.Name)
            ):
                return call.args[0].id
        if found := _asserted_function(tree, taken):
            return found
    if question:
        return question[-1]
    for m in _ASSERT_IN_TEXT.finditer(question_text or ""):
        shown = parse_python(m.group(0))
        if shown is not None and (found := _asserted_function(shown, taken)):
            return found
    return None


def _asserted_function(tree: ast.Module, taken: set[str]) -> str | None:
    """The first function (in reading order) that a top-level assert calls and that the code leaves undefined,
    a builtin's name only when the asserts call nothing else (MBPP 126 asks for a function named `sum`)."""
    free = _free_names(tree, builtin=True) - taken
    called = [
        node.func.id
        for statement in _outside_definitions(tree.body)
        if isinstance(statement, ast.Assert)
        for node in _preorder(statement.test)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in free
    ]
    return next((name for name in called if not hasattr(builtins, name)), called[0] if called else None)


def _outside_definitions(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of `body` and of the blocks in it (if, for, with, try), not of functions or classes."""
    for statement in body:
        yield statement
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _outside_definitions(getattr(statement, field, None) or [])
        for handler in getattr(statement, "handlers", None) or []:
            yield from _outside_definitions(handler.body)


def _preorder(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _preorder(child)


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
            body[:] = body[1:] or [ast.Pass()]  # the node's own list: `node` is any AST with a body
    return ast.unparse(tree)


def defined_functions(code: str) -> list[str]:
    """Names of the top-level functions `code` defines, in order ([] when it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return re.findall(r"^def\s+([A-Za-z_]\w*)\s*\(", code or "", re.MULTILINE)
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
