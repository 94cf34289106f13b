"""The richer scorers: math equivalence, multiple choice, code run in the sandbox, reasoning-gym's own checks.

Importing this module registers them (`colab_graphs.data.scoring` does so lazily). Each has the scorer
signature `(output, example) -> Score`; `code` is async.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading

from colab_graphs.data.example import Example
from colab_graphs.data.sandbox import arun_code
from colab_graphs.data.scoring import Score, extract_answer, last_boxed, normalize_answer, register_scorer

logger = logging.getLogger(__name__)

LETTERS = "ABCDEFGHIJ"


# --- math ------------------------------------------------------------------------------------------------------


@register_scorer("math")
def math_equivalence(output: str, example: Example) -> Score:
    """1 when the extracted answer is mathematically equal to the gold one (math-verify: 1/2 = 0.5 = \\frac12).

    Without math-verify installed it falls back to normalised exact match and logs a warning once.
    """
    if example.answer is None:
        raise ValueError(f"example {example.id!r} has no 'answer' field; the 'math' scorer needs one")
    extracted = extract_answer(output)
    if normalize_answer(extracted) == normalize_answer(example.answer):
        return Score(1.0, extracted)
    try:
        from math_verify import parse, verify
    except ImportError:
        _warn_once(
            "math-verify is not installed; the 'math' scorer falls back to exact match (pip install math-verify)"
        )
        return Score(0.0, extracted)
    # math-verify times out with SIGALRM, which only the main thread may use; elsewhere run without a timeout.
    in_main = threading.current_thread() is threading.main_thread()
    timeout = 5 if in_main else None
    gold = parse(f"${example.answer}$", parsing_timeout=timeout)
    predicted = parse(f"${extracted}$", parsing_timeout=timeout)
    if not gold or not predicted:
        return Score(0.0, extracted)
    return Score(float(verify(gold, predicted, timeout_seconds=timeout)), extracted)


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


# --- multiple choice ---------------------------------------------------------------------------------------------

_ANSWER_CLAUSE = re.compile(r"(?:answer|option|choice)\s*(?:is|:)?\s*[:\-]?\s*(.+)", re.IGNORECASE)
_PAREN_LETTER = re.compile(r"\(([A-J])\)")
_LEADING_LETTER = re.compile(r"^\(?([A-J])(?:[\).:]|\s*$)")


@register_scorer("multiple_choice")
def multiple_choice(output: str, example: Example) -> Score:
    """1 when the output picks the gold option, by letter ("B", "(B)", "Answer: B") or by the option's text.

    The example needs `choices` (option texts); its `answer` may be a letter, an index, or the option text.
    """
    choices = example.fields.get("choices")
    if not choices or example.answer is None:
        raise ValueError(
            f"example {example.id!r} needs 'choices' and 'answer' for the 'multiple_choice' scorer"
        )
    gold = _as_letter(example.answer, choices)
    if gold is None:
        raise ValueError(f"example {example.id!r}: answer {example.answer!r} is not one of its choices")
    picked = _picked_letter(output or "", choices)
    return Score(float(picked == gold), picked)


def _as_letter(text: str, choices: list[str]) -> str | None:
    """A letter for a reply fragment: itself a valid letter ("b", "(B)", "B."), an index, or an option's text."""
    cleaned = text.strip().strip("*`'\" ")
    valid = LETTERS[: len(choices)]
    bare = cleaned.strip("().:[] ").upper()
    if len(bare) == 1 and bare in valid:
        return bare
    if cleaned.isdigit() and int(cleaned) < len(choices):
        return LETTERS[int(cleaned)]
    texts = [normalize_answer(c) for c in choices]
    if normalize_answer(cleaned) in texts:
        return LETTERS[texts.index(normalize_answer(cleaned))]
    leading = _LEADING_LETTER.match(cleaned)
    if leading and leading.group(1) in valid:
        return leading.group(1)
    return None


def _picked_letter(output: str, choices: list[str]) -> str | None:
    boxed = last_boxed(output)
    candidates = [boxed] if boxed is not None else []
    candidates += [m.group(1) for m in reversed(list(_ANSWER_CLAUSE.finditer(output)))]
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    candidates += [output, lines[0] if lines else "", lines[-1] if lines else ""]
    for candidate in candidates:
        letter = _as_letter(candidate.splitlines()[0] if candidate.strip() else candidate, choices)
        if letter is not None:
            return letter
    valid = LETTERS[: len(choices)]
    in_parens = [m.group(1) for m in _PAREN_LETTER.finditer(output) if m.group(1) in valid]
    if in_parens:
        return in_parens[-1]
    # Last resort: the option whose text the output mentions last, ignoring a mention that lies inside another
    # option's mention (so "the blue whale" picks "Blue whale", not "whale").
    lowered = output.lower()
    spans = {
        i: (start, start + len(c))
        for i, c in enumerate(choices)
        if c and (start := lowered.rfind(c.lower())) >= 0
    }
    outer = [
        i
        for i, (a, b) in spans.items()
        if not any(j != i and x <= a and b <= y and (y - x) > (b - a) for j, (x, y) in spans.items())
    ]
    return LETTERS[max(outer, key=lambda i: spans[i][0])] if outer else None


# --- code --------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)

# The candidate runs first, in its own namespace, then the tests; a secret token printed only after the tests
# finish tells a pass from an early `sys.exit(0)` / `os._exit(0)`. The token comes through stdin, which the
# harness consumes before the candidate runs, so it is not in the source the candidate can read. (Code that
# deliberately inspects the harness's frames could still find it: this stops accidents and cheap exits.)
_HARNESS = """\
import os as _cg_os, sys as _cg_sys
_cg_token = _cg_sys.stdin.readline().strip()
_cg_sys.stdin = open(_cg_os.devnull)
_cg_ns = {{"__name__": "solution"}}
exec(compile({candidate!r}, "solution.py", "exec"), _cg_ns)
exec(compile({test!r}, "test.py", "exec"), _cg_ns)
print(_cg_token)
"""


def extract_code(output: str) -> str:
    """The code in a model's reply: the last ```python block, else the last fenced block, else the whole reply.

    A block left open at the end of the reply (a cut-off generation) counts.
    """
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(output or "")]
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    if python:
        return python[-1]
    untagged = [body for lang, body in blocks if not lang]
    if untagged:
        return untagged[-1]
    return output or ""


def assemble_candidate(code: str, example: Example) -> str:
    """The candidate program: HumanEval-style completions (a body without its `def`) get the prompt prepended."""
    prompt = example.fields.get("prompt")
    entry = example.entry_point
    if prompt and entry and not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        return f"{prompt}{code}"
    return code


@register_scorer("code")
async def code_tests(output: str, example: Example) -> Score:
    """1 when the example's `test` runs without error against the code extracted from the output.

    The program runs in the sandbox (`colab_graphs.data.sandbox`): separate process, time/memory/process
    limits, no network, no environment. `example.timeout_s` overrides the 10 s default.
    """
    if example.test is None:
        raise ValueError(f"example {example.id!r} has no 'test' field; the 'code' scorer needs one")
    code = extract_code(output)
    token = secrets.token_hex(16)
    program = _HARNESS.format(candidate=assemble_candidate(code, example), test=example.test)
    result = await arun_code(
        program, timeout_s=float(example.fields.get("timeout_s") or 10), stdin=token + "\n"
    )
    passed = result.passed and result.stdout.rstrip().endswith(token)
    return Score(float(passed), code)


# --- reasoning-gym ---------------------------------------------------------------------------------------------

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


@register_scorer("reasoning_gym")
def reasoning_gym_check(output: str, example: Example) -> Score:
    """reasoning-gym's own answer check for examples loaded from `reasoning_gym:TASK` (partial credit possible).

    The answer is the last `<answer>...</answer>` if present, else the usual extraction.
    """
    entry, task = example.fields.get("rg_entry"), example.fields.get("rg_task")
    if entry is None or task is None:
        raise ValueError(f"example {example.id!r} was not generated by reasoning-gym (no rg_entry / rg_task)")
    import reasoning_gym

    tagged = _ANSWER_TAG.findall(output or "")
    extracted = tagged[-1].strip() if tagged else extract_answer(output or "")
    value = reasoning_gym.get_score_answer_fn(task)(answer=extracted, entry=entry)
    return Score(min(1.0, max(0.0, float(value))), extracted)
