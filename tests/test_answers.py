"""Answer extraction per task type: commitments only, and idempotent (an extracted answer extracts to itself).

A protocol's final node extracts the answer and the scorer reads that answer again, so extraction must give
back what it gave: `\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}` -> `\\frac{1}{2}` (not "2").
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colab_graphs.data.answers import (
    extract_choice,
    extract_code,
    extract_math,
    extract_number,
    main_function,
)
from colab_graphs.data.example import Example
from colab_graphs.data.scoring import get_task
from colab_graphs.data.tasks import TaskView

CHOICES = [
    "Planetary density will decrease.",
    "Planetary years will become longer.",
    "Planetary days will become shorter.",
    "Planetary gravity will become stronger.",
]
MC = Example(id="mc", input="What happens?", answer="C", choices=CHOICES)
CODE = Example(id="c", input="def add(a, b):\n    '''Add.'''\n", test="assert add(1, 2) == 3")


@pytest.mark.parametrize(
    ("reply", "letter"),
    [
        ("The answer is (C) Planetary days will become shorter.", "C"),
        ("Let's consider each option. Option A is tempting.\n\nThe correct option is C.", "C"),
        ("**C) Planetary days will become shorter.**", "C"),
        ("Option C: days get shorter ... 24 h becomes 20 h.", "C"),
        ("\\boxed{C}", "C"),
        ("(c)", "C"),
        ("The answer is Planetary days will become shorter.", "C"),
        ("It spins faster, so planetary days will become shorter.", "C"),
        ("I cannot answer: the options are not shown to me.", None),
        ("I cannot answer: A lot depends on the planet.", None),
        ("The answer is a prime number.", None),
        ("I am not sure.", None),
        ("Planetary days or planetary years will become longer?", None),
    ],
)
def test_multiple_choice_counts_only_explicit_commitments(reply, letter):
    assert extract_choice(reply, CHOICES) == letter


@pytest.mark.parametrize(
    ("reply", "number"),
    [
        ("16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18", "18"),
        ("The answer is 18 apples.", "18"),
        ("The answer is 5.\nConfidence: 0.9", "5"),
        ("So $\\boxed{\\frac{1}{2}}$.", "1/2"),
        ("Total: \\boxed{1,234}", "1,234"),
        ("No numbers here.", None),
    ],
)
def test_numeric_extraction(reply, number):
    assert extract_number(reply) == number


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("Expanding gives $$\\boxed{18x^3+8x^2}$$", "18x^3+8x^2"),
        ("The answer is $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        ("So we find that $x = 5$ after simplifying both sides of the equation.", "x = 5"),
        ("MoCo asks for \\box{7} sometimes", "7"),
    ],
)
def test_math_extraction(reply, answer):
    assert extract_math(reply) == answer


def test_code_extraction_prefers_the_block_defining_the_entry_point_and_refuses_prose():
    reply = "Import first:\n```python\nimport math\n```\nThen:\n```python\ndef add(a, b):\n    return a + b\n```\nok"
    assert extract_code(reply, "add") == "def add(a, b):\n    return a + b\n"
    assert extract_code("I would loop over the list and sum it.", "add") is None
    assert extract_code("```text\nnot python\n```", "add") is None
    assert extract_code("    return a + b\n", "add", "def add(a, b):\n") == "    return a + b\n"


SOLUTION = "def add(a, b):\n    return a + b\n"


def test_code_extraction_without_an_entry_point_skips_an_example_usage_block():
    reply = f"Here you go:\n```python\n{SOLUTION}```\nExample usage:\n```python\nprint(add(2, 3))\n```\n"
    assert extract_code(reply) == SOLUTION


def test_code_extraction_joins_the_imports_block_the_solution_needs():
    reply = (
        "First the import:\n```python\nimport math\n```\nThen the function:\n"
        "```python\ndef hyp(a, b):\n    return math.sqrt(a * a + b * b)\n```\n"
        "Example usage:\n```python\nprint(hyp(3, 4))\n```"
    )
    once = extract_code(reply, "hyp")
    assert once == "import math\n\ndef hyp(a, b):\n    return math.sqrt(a * a + b * b)\n"
    assert extract_code(once, "hyp") == once


def test_code_extraction_joins_a_helper_block_but_never_an_earlier_draft():
    reply = (
        "A first try:\n```python\ndef count_primes(xs):\n    return 0\n```\nA helper:\n"
        "```python\ndef is_prime(n):\n    return n > 1 and all(n % d for d in range(2, n))\n```\nThe fix:\n"
        "```python\ndef count_primes(xs):\n    return sum(map(is_prime, xs))\n```"
    )
    once = extract_code(reply, "count_primes")
    assert once.startswith("def is_prime(n):") and once.endswith("return sum(map(is_prime, xs))\n")
    assert "return 0" not in once
    assert extract_code(once, "count_primes") == once


def test_main_function_is_not_the_helper_defined_before_it():
    code = "def is_prime(n):\n    return n > 1\n\ndef count(xs):\n    return sum(map(is_prime, xs))\n\nprint(count([2]))\n"
    assert main_function(code) == "count"
    assert main_function("def solve(x):\n    return x\n") == "solve"
    assert main_function("x = 1\n") is None


# --- idempotence, on replies shaped like real models' ----------------------------------------------------------------

_prose = st.text(alphabet=st.characters(whitelist_categories=("Ll", "Lu", "Zs")), max_size=40)
_numbers = st.integers(-(10**6), 10**6).map(str) | st.fractions(max_denominator=50).map(str)
_math = st.sampled_from(
    ["\\frac{1}{2}", "18x^3+8x^2", "\\sqrt{2}", "(3, \\frac{\\pi}{2})", "6-5i", "x^2", "12"]
)


@settings(max_examples=200, deadline=None)
@given(_prose, _numbers, st.sampled_from(["The answer is {}.", "#### {}", "\\boxed{{{}}}", "so {} in total"]))
def test_numeric_extraction_is_idempotent(prose, number, form):
    once = get_task("numeric").extract(f"{prose}\n{form.format(number)}", MC)
    assert once is not None
    assert get_task("numeric").extract(once, MC) == once


@settings(max_examples=200, deadline=None)
@given(_prose, _math, st.sampled_from(["$\\boxed{{{}}}$", "The answer is ${}$.", "Final answer: {}"]))
def test_math_extraction_is_idempotent(prose, answer, form):
    once = get_task("math").extract(f"{prose}\n{form.format(answer)}", MC)
    assert once == answer
    assert get_task("math").extract(once, MC) == once


@settings(max_examples=200, deadline=None)
@given(
    _prose, st.sampled_from("ABCD"), st.sampled_from(["The answer is ({}).", "Answer: {}", "\\boxed{{{}}}"])
)
def test_choice_extraction_is_idempotent(prose, letter, form):
    once = get_task("multiple_choice").extract(f"{prose}\n{form.format(letter)}", MC)
    assert once == letter
    assert get_task("multiple_choice").extract(once, MC) == once


@settings(max_examples=100, deadline=None)
@given(_prose, st.sampled_from(["return a + b", "return sum([a, b])", "x = a\n    return x + b"]))
def test_code_extraction_is_idempotent(prose, body):
    code = f"def add(a, b):\n    {body}\n"
    once = get_task("code").extract(f"{prose}\n```python\n{code}```\n{prose}", CODE)
    assert once == code
    assert get_task("code").extract(once, CODE) == once


# --- "same answer": what votes compare ----------------------------------------------------------------------------


def test_votes_group_answers_the_task_calls_the_same():
    math = TaskView(get_task("math"), Example(id="m", input="?", answer="1/2"))
    assert math.vote(["\\boxed{0.5}", "The answer is $\\frac{1}{3}$.", "So $\\boxed{\\frac{1}{2}}$"]) == "0.5"
    choice = TaskView(get_task("multiple_choice"), MC)
    assert choice.vote(["The answer is (B).", "The correct option is C.", "C", "I cannot answer."]) == "C"
    code = TaskView(get_task("code"), CODE)
    formatted = "```python\ndef add(a, b):\n    '''Sum.'''\n    return a + b  # done\n```"
    compact = "```python\ndef add(a,b): return a+b\n```"
    assert (
        code.vote(["```python\ndef add(a, b):\n    return a - b\n```", formatted, compact])
        == formatted[10:-3]
    )


def test_a_vote_where_nobody_commits_is_empty_and_ties_go_to_pool_order():
    numeric = TaskView(get_task("numeric"), Example(id="n", input="?", answer="3"))
    assert numeric.vote(["I am not sure.", "No idea."]) == ""
    assert numeric.vote(["The answer is 4.", "The answer is 3."]) == "4"
