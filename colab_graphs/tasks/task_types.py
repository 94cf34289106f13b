"""Task types: the task owns its answers.

A task type decides, for one kind of task, everything that depends on what an answer is:

- `question(example)`: the question as members see it (a multiple-choice question with its lettered options);
- `instruction(example)`: how to answer (`{answer_format}` in every protocol's prompts): "End with: The answer
  is <number>.", "Put the final answer in \\boxed{}.", "... in one ```python code block.";
- `extract(reply, example)`: the answer a reply commits to, or None when it commits to none;
- `same(a, b, example)`: whether two extracted answers are the same answer (votes, cascades);
- `score(output, example)`: the verdict on the system's final output.

Every protocol and aggregator asks the task (through `TaskView`, a task bound to one example), never a
generic extractor; so code stays code, a letter stays a letter, and `\\frac{1}{2}` is not read as "2".
A task type is registered under its scorer name (`--scorer`, an example's `scorer` field); a plain scorer
function registered with `register_scorer` becomes a task type with short-text extraction.

Numbers are equal by `colab_graphs.tasks.answers.numbers_equal`: an integer only to the same value, other numbers
within a relative tolerance (`NumericTask.rel_tol`, 1e-6) or an absolute one (`abs_tol`, 0: it only matters
near zero). A record may state its own in `rel_tol` / `abs_tol` fields (a MoCo file at its top level). Every
extractor defends against replies written to fool it (hedges, contradictions, look-alike characters): see
`colab_graphs.tasks.answers`.

| task type | extract | same answer |
|---|---|---|
| `exact` | `\\boxed{}`, "the answer is X" (its sentence), else the last line | normalised text, word order kept; numbers by value; symbols as symbols |
| `numeric` | `\\boxed{}`, `#### N`, "the answer is N", else the last number | integers exactly; else relative 1e-6 (`rel_tol`, `abs_tol`) |
| `math` | `\\boxed{}`, "the answer is X", a bare answer, `$...$`, the last number | numbers as `numeric`; words as text; else math-verify |
| `multiple_choice` | an explicit commitment to one letter (A-Z) or option's text | same letter |
| `code` | the fenced ```python block (the one defining the entry point) | same source after an AST round trip |
| `reasoning_gym` | `<answer>...</answer>`, else as `exact` | normalised text |
| `f1` | as `exact` | normalised text (scored by token F1) |
"""

from __future__ import annotations

import ast
import builtins
import inspect
import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from colab_graphs.sandbox.code_tests import top_level_names
from colab_graphs.tasks import answers
from colab_graphs.tasks.example import Example

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Score:
    """A scorer's verdict on one output: a value in [0, 1] and the answer it extracted (None: no answer)."""

    value: float
    extracted: str | None = None
    # Code scores only: the sandbox that ran the code, {"backend", "isolation"} (`colab_graphs.sandbox.scope`).
    sandbox: dict[str, Any] | None = None


ScorerFn = Callable[[str, Example], "Score | float | Awaitable[Score | float]"]

FAILED_CHARS = 300  # the most of a failed code run's reason a result row keeps

DEFAULT_INSTRUCTION = "Answer concisely. End with: The answer is <answer>."


def _needs_answer(example: Example, scorer: str) -> str:
    if example.answer is None:
        raise ValueError(f"example {example.id!r} has no 'answer' field; the {scorer!r} scorer needs one")
    return example.answer


class TaskType:
    """Short-text answers (the base every task type refines). See the module docstring."""

    name: ClassVar[str] = "exact"

    def question(self, example: Example) -> str:
        return example.input

    def instruction(self, example: Example) -> str:
        return DEFAULT_INSTRUCTION

    def extract(self, reply: str, example: Example) -> str | None:
        return answers.extract_text(reply)

    def canonical(self, answer: str, example: Example) -> str:
        """A key such that equal keys are the same answer (`same` may find more: math equivalence)."""
        return answers.normalize_text(answer)

    def same(self, a: str, b: str, example: Example) -> bool:
        return self.canonical(a, example) == self.canonical(b, example)

    def score(self, output: str, example: Example) -> Score | Awaitable[Score]:
        gold = _needs_answer(example, self.name)
        extracted = self.extract(output, example)
        if extracted is None:
            return Score(0.0, None)
        return Score(float(self.same(extracted, gold, example)), extracted)


def tolerances(example: Example, rel_tol: float, abs_tol: float) -> tuple[float, float]:
    """The example's own `rel_tol` / `abs_tol` fields where it states them, else the task's."""
    fields = example.fields
    return float(fields.get("rel_tol", rel_tol)), float(fields.get("abs_tol", abs_tol))


class NumericTask(TaskType):
    """Numbers: integers compare exactly, others within `rel_tol` of the larger magnitude (or `abs_tol`)."""

    name = "numeric"
    rel_tol: ClassVar[float] = 1e-6
    abs_tol: ClassVar[float] = 0.0

    def instruction(self, example: Example) -> str:
        return "Answer concisely. End with: The answer is <number>."

    def extract(self, reply: str, example: Example) -> str | None:
        return answers.extract_number(reply)

    def same(self, a: str, b: str, example: Example) -> bool:
        equal = answers.numbers_equal(a, b, *tolerances(example, self.rel_tol, self.abs_tol))
        return equal if equal is not None else super().same(a, b, example)


class MathTask(TaskType):
    name = "math"
    _warned = False

    def instruction(self, example: Example) -> str:
        return "Answer concisely. End with: The answer is \\boxed{<answer>}."

    def extract(self, reply: str, example: Example) -> str | None:
        return answers.extract_math(reply)

    def same(self, a: str, b: str, example: Example) -> bool:
        try:
            return answers.math_equal(a, b, *tolerances(example, NumericTask.rel_tol, NumericTask.abs_tol))
        except answers.MathVerifyMissing:
            if not MathTask._warned:
                MathTask._warned = True
                logger.warning(
                    "math-verify is not installed; math answers compare as normalised text (pip install math-verify)"
                )
            return False


class MultipleChoiceTask(TaskType):
    """Options come from the example's `choices` (a list, or MoCo's {"A": ...} dict made a list by the loader)."""

    name = "multiple_choice"

    @staticmethod
    def choices(example: Example) -> list[str]:
        choices = example.fields.get("choices")
        if not choices:
            raise ValueError(f"example {example.id!r} needs 'choices' for the 'multiple_choice' scorer")
        if len(choices) > len(answers.LETTERS):
            raise ValueError(
                f"example {example.id!r} has {len(choices)} choices; at most {len(answers.LETTERS)} (A-Z)"
            )
        return [str(c) for c in choices]

    def question(self, example: Example) -> str:
        choices = self.choices(example)
        if shows_options(example.input, choices):
            return example.input
        options = "\n".join(f"{answers.LETTERS[i]}. {text}" for i, text in enumerate(choices))
        return f"{example.input.rstrip()}\n\n{options}"

    def instruction(self, example: Example) -> str:
        last = answers.LETTERS[len(self.choices(example)) - 1]
        return f"Choose one option (A-{last}). End with: The answer is (<letter>)."

    def extract(self, reply: str, example: Example) -> str | None:
        return answers.extract_choice(reply, self.choices(example))

    def canonical(self, answer: str, example: Example) -> str:
        return answers.choice_letter(answer, self.choices(example)) or answers.normalize_text(answer)

    def score(self, output: str, example: Example) -> Score:
        choices = self.choices(example)
        if example.answer is None:
            raise ValueError(f"example {example.id!r} needs an 'answer' for the 'multiple_choice' scorer")
        gold = answers.choice_letter(example.answer, choices)
        if gold is None:
            raise ValueError(f"example {example.id!r}: answer {example.answer!r} is not one of its choices")
        picked = self.extract(output, example)
        return Score(float(picked == gold), picked)


def shows_options(text: str, choices: Sequence[str]) -> bool:
    """Whether `text` already lists every option under its letter ("A. ...", "(B) ...", "C) ...")."""
    for i, option in enumerate(choices):
        head = re.escape(" ".join(str(option).split())[:30])
        if not re.search(rf"^\s*\(?{answers.LETTERS[i]}[\).:]?\s+{head}", text, re.MULTILINE):
            return False
    return True


class CodeTask(TaskType):
    """Coding tasks: `test` is Python that raises on failure; the sandbox's judge runs it against the reply's code.

    The function under test is `entry_point`, else the one the record names (`answers.function_named_by_record`:
    the name the test calls `check` with, the function its asserts call, the last function the question's code
    defines as in MoCo's HumanEval, or the function the asserts shown in the question call as in MoCo's MBPP),
    else the reply's main function (the last top-level function no other one calls, never a builtin or a name
    the test has). A `test` that defines `check(candidate)` and never calls it (HumanEval's and MoCo's form) is
    called with that function, as MoCo's evaluator does.

    The verdict is the tests' (`colab_graphs.sandbox.code_tests`): the reply's code runs in a process of its own
    and answers the judge's calls with plain data, so it cannot read the tests, patch what they run on, exit
    early, print a token, or hand back a value that equals anything. A test that cannot fail (missing, blank,
    nothing to assert) is refused, as is one that passes without calling the code: either would pass anything.
    """

    name = "code"

    def entry_point(self, example: Example) -> str | None:
        """The function the record tests: its `entry_point`, else named by its test or question
        (`answers.function_named_by_record`); never chosen by a reply."""
        if example.entry_point:
            return example.entry_point
        return answers.function_named_by_record(example.test, self.prompt_code(example), example.input)

    def function_under_test(self, code: str, example: Example) -> str | None:
        """The entry point, else the reply's main function, which is never a builtin, a standard-library module
        or a name the test or question defines (so it cannot stand in for one)."""
        entry = self.entry_point(example)
        if entry:
            return entry
        taken = set(dir(builtins)) | answers.STDLIB_MODULES
        for source in (example.test, self.prompt_code(example)):
            tree = answers.parse_python(source or "")
            taken |= top_level_names(tree) if tree is not None else set()
        return answers.main_function(code, avoid=taken)

    @staticmethod
    def prompt_code(example: Example) -> str | None:
        """The code part of the question (HumanEval's `prompt`, or the input from its first line of code)."""
        prompt = example.fields.get("prompt")
        if isinstance(prompt, str) and prompt.strip():
            return prompt
        m = re.search(r"^(?:from |import |def |class |@)", example.input, re.MULTILINE)
        return example.input[m.start() :] if m else None

    def instruction(self, example: Example) -> str:
        entry = self.entry_point(example)
        what = f"the complete Python function `{entry}`" if entry else "a complete Python solution"
        return f"Write {what}, with the imports it needs, in one ```python code block."

    def extract(self, reply: str, example: Example) -> str | None:
        return answers.extract_code(reply, self.entry_point(example), self.prompt_code(example))

    def canonical(self, answer: str, example: Example) -> str:
        return answers.canonical_code(answer)

    def candidate(self, code: str, example: Example) -> str:
        """The program under test: a HumanEval-style body without its `def` gets the question's code before it."""
        entry, prompt = self.entry_point(example), self.prompt_code(example)
        if prompt and entry and not answers.defines(code, entry):
            return f"{prompt}{code}"
        return code

    async def score(self, output: str, example: Example) -> Score:
        """The tests' verdict under the sandbox setting in force (`colab_graphs.sandbox.scope.current`).

        The score names the backend and isolation that ran the code (`Score.sandbox`; a reply without code
        names the backend with no isolation: nothing ran). Raises `SandboxUnavailable` where the setting
        cannot be met: a code score is never given outside the isolation the user accepted.
        """
        from colab_graphs.sandbox import resolve, scope
        from colab_graphs.sandbox.code_tests import arun_tests, unusable_test

        problem = unusable_test(example.test)
        if problem or example.test is None:  # (unusable_test names a missing test)
            raise ValueError(
                f"example {example.id!r}: {problem}; the 'code' scorer needs a test that can fail"
            )
        setting = scope.current()
        code = self.extract(output, example)
        if code is None:
            return Score(0.0, None, scope.row_record(resolve(setting).name, []))
        program = self.candidate(code, example)
        verdict = await arun_tests(
            program,
            example.test,
            entry_point=self.function_under_test(program, example),
            prompt_code=self.prompt_code(example),
            timeout_s=float(example.fields.get("timeout_s") or 10),
            sandbox=setting,
        )
        if verdict.passed and verdict.calls == 0:
            raise ValueError(
                f"example {example.id!r}: its test passed without calling the code under test, so it would pass "
                "any code; the 'code' scorer needs a test that calls the solution"
            )
        record = scope.row_record(verdict.backend, verdict.isolation)
        if not verdict.passed:  # why not, for the user reading the row: the failing assertion, "timeout", ...
            record["failed"] = verdict.reason[:FAILED_CHARS]
        return Score(float(verdict.passed), code, record)


class ReasoningGymTask(TaskType):
    """Examples generated by reasoning-gym (`reasoning_gym:TASK`): the generator's own check, partial credit."""

    name = "reasoning_gym"
    _TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)

    def instruction(self, example: Example) -> str:
        return "Answer concisely. End with your final answer inside <answer></answer> tags."

    def extract(self, reply: str, example: Example) -> str | None:
        tagged = self._TAG.findall(reply or "")
        return tagged[-1].strip() if tagged else answers.extract_text(reply)

    def score(self, output: str, example: Example) -> Score:
        entry, task = example.fields.get("rg_entry"), example.fields.get("rg_task")
        if entry is None or task is None:
            raise ValueError(
                f"example {example.id!r} was not generated by reasoning-gym (no rg_entry / rg_task)"
            )
        import reasoning_gym

        extracted = self.extract(output, example)
        if extracted is None:
            return Score(0.0, None)
        value = reasoning_gym.get_score_answer_fn(task)(answer=extracted, entry=entry)
        return Score(min(1.0, max(0.0, float(value))), extracted)


class F1Task(TaskType):
    """MoCo's `f1_match`: token F1 between the extracted answer and the gold (the best over a list of golds)."""

    name = "f1"

    def score(self, output: str, example: Example) -> Score:
        gold = _needs_answer(example, self.name)
        extracted = self.extract(output, example)
        if extracted is None:
            return Score(0.0, None)
        golds = [gold]
        if gold.strip().startswith("["):
            try:
                parsed = ast.literal_eval(gold.strip())
                golds = [str(g) for g in parsed] if isinstance(parsed, list | tuple) and parsed else golds
            except (ValueError, SyntaxError):
                pass
        return Score(max(token_f1(extracted, g) for g in golds), extracted)


def token_f1(prediction: str, gold: str) -> float:
    p, g = answers.normalize_text(prediction).split(), answers.normalize_text(gold).split()
    if not p or not g:
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


class ScorerTask(TaskType):
    """A plain scorer function registered by name: short-text extraction, the function decides the score."""

    def __init__(self, name: str, fn: ScorerFn):
        self._name, self.fn = name, fn

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._name

    def score(self, output: str, example: Example) -> Any:
        return self.fn(output, example)


BUILTIN_TASKS: tuple[TaskType, ...] = (
    TaskType(),
    NumericTask(),
    MathTask(),
    MultipleChoiceTask(),
    CodeTask(),
    ReasoningGymTask(),
    F1Task(),
)


@dataclass(frozen=True)
class TaskView:
    """A task bound to one example: what protocols, aggregators and routers ask.

    Example:
        >>> view = TaskView(NumericTask(), Example(id="1", input="6 * 7?", answer="42"))
        >>> view.extract("6 * 7 = 42, so the answer is 42.")
        '42'
        >>> view.vote(["The answer is 42.", "It is 41.", "#### 42.0"])
        '42'
    """

    task: TaskType
    example: Example
    # Extractions and verdicts already made for this example: an audit asks again for every coalition.
    _extracted: dict[str, str | None] = field(default_factory=dict, compare=False, repr=False)
    _verdicts: dict[str, Score] = field(default_factory=dict, compare=False, repr=False)
    _input: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    _same: dict[tuple[str, str], bool] = field(default_factory=dict, compare=False, repr=False)

    def graph_input(self) -> dict[str, Any]:
        """A graph's input state for this example: the question as the task shows it (options included) and
        the example's fields, with `answer_format` (the task's answer instruction) for prompt templates."""
        if not self._input:
            example = self.example
            self._input["input"] = self.task.question(example)
            self._input["example"] = {**example.fields, "answer_format": self.task.instruction(example)}
        return dict(self._input)

    def extract(self, reply: str) -> str | None:
        reply = reply or ""
        if reply not in self._extracted:
            self._extracted[reply] = self.task.extract(reply, self.example)
        return self._extracted[reply]

    async def score(self, output: str) -> Score:
        """The task's verdict on a final output (the same output is scored once per view)."""
        if output not in self._verdicts:
            result: Any = self.task.score(output, self.example)
            if inspect.isawaitable(result):
                result = await result
            self._verdicts[output] = result if isinstance(result, Score) else Score(float(result))
        return self._verdicts[output]

    def same(self, a: str, b: str) -> bool:
        if (a, b) not in self._same:
            self._same[(a, b)] = self.task.same(a, b, self.example)
        return self._same[(a, b)]

    def vote(self, replies: Sequence[str]) -> str:
        """Deterministic majority vote over the answers the replies commit to (replies committing to none abstain).

        Answers are grouped by `same`; the largest group wins, a tie goes to the group whose first answer came
        first (pool order). Returns that group's first answer as extracted; "" when no reply commits to one.
        """
        groups: list[list[str]] = []
        for reply in replies:
            answer = self.extract(reply)
            if answer is None or not answer.strip():
                continue
            for group in groups:
                if self.same(group[0], answer):
                    group.append(answer)
                    break
            else:
                groups.append([answer])
        if not groups:
            return ""
        best = max(len(g) for g in groups)
        return next(g[0] for g in groups if len(g) == best)
