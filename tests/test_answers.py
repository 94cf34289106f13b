"""Answer extraction per task type: commitments only, one commitment only, and idempotent (an extracted answer
extracts to itself).

A protocol's final node extracts the answer and the scorer reads that answer again, so extraction must give
back what it gave: `\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}` -> `\\frac{1}{2}` (not "2"), `3e-36` -> `3e-36`
(not "-36"). Replies written to fool an extractor (hedges, contradictions, look-alike characters, megabytes of
text) are specified here too: an RL policy searches for whatever the scorer accepts.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colab_graphs.tasks.answers import (
    LETTERS,
    extract_choice,
    extract_code,
    extract_math,
    extract_number,
    extract_text,
    function_named_by_record,
    main_function,
    math_equal,
    normalize_text,
    numbers_equal,
)
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import get_task
from colab_graphs.tasks.task_types import TaskView

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
        ("The answer is -0.5.", "-0.5"),
        ("Final Answer: -20", "-20"),
        ("Answer: - 20 apples", "20"),  # a dash and a space after the statement separate, they do not sign
        ("The answer is \u22120.5", "-0.5"),
        ("The answer is \uff14\uff12.", "42"),
        ("The answer is 3e-36.", "3e-36"),
        ("The answer is 3E+5 joules", "3E+5"),
        ("The answer is 3.0e-36 kg m/s", "3.0e-36"),
        ("So p = 3 \\times 10^{-36} kg m/s.", "3e-36"),
        ("The answer is $3\\cdot10^{-36}$.", "3e-36"),
        ("The answer is 3 \u00d7 10\u207b\u00b3\u2076.", "3e-36"),
        ("The answer is 3*10**-36", "3e-36"),
        ("The answer is -20. Check: 8 + 12 = 20.", "-20"),
        ("The answer is x = 5.", "5"),
        ("COVID-19 cases rose by 7 in total", "7"),
        # An answer statement that is an equation commits to its result, not to its first operand.
        ("The answer is 35 + 42 = 77", "77"),
        ("The answer is 35 - 42 = -7.", "-7"),
        ("\\boxed{3 \\cdot 4 = 12}", "12"),
        ("The answer is 5 - that is all.", "5"),  # a dash, not an operator: no number follows it
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


@pytest.mark.parametrize(
    ("test", "question_code", "question_text", "name"),
    [
        (
            "def check(candidate):\n    assert candidate(1)\n\ncheck(has_close_elements)\n",
            None,
            None,
            "has_close_elements",
        ),
        ('assert remove_Occ("hello", "l") == "heo"\n', None, None, "remove_Occ"),
        ("assert set(similar_elements((3, 4), (4,))) == set((4,))\n", None, None, "similar_elements"),
        ("assert math.isclose(area(2), 3.5)\nassert sum(1, 2) == 3\n", None, None, "area"),
        ("assert sum(10, 15) == 6\n", None, None, "sum"),  # MBPP 126 asks for a function named sum
        (
            "def check(candidate):\n    assert candidate([Pair(1, 2)], 1) == 1\n",
            None,
            "Your code should pass this test case: assert max_chain_length([Pair(5, 24)], 4) == 3",
            "max_chain_length",
        ),
        (
            "def check(candidate):\n    assert abs(candidate(3.5) - 0.5) < 1e-6\n",
            "def poly(x):\n    pass\n\ndef truncate_number(x):\n    pass\n",
            None,
            "truncate_number",
        ),
        ("def check(candidate):\n    assert candidate(2) == 4\n", None, "Square a number.", None),
    ],
)
def test_a_record_names_its_function_from_its_test_or_question(test, question_code, question_text, name):
    assert function_named_by_record(test, question_code, question_text) == name


def test_the_reply_s_main_function_is_never_a_name_it_must_not_replace():
    code = "def similar_elements(a, b):\n    return (0,)\n\ndef set(*args):\n    return 0\n"
    assert main_function(code) == "set"
    assert main_function(code, avoid={"set", "abs"}) == "similar_elements"


def test_main_function_is_not_the_helper_defined_before_it():
    code = "def is_prime(n):\n    return n > 1\n\ndef count(xs):\n    return sum(map(is_prime, xs))\n\nprint(count([2]))\n"
    assert main_function(code) == "count"
    assert main_function("def solve(x):\n    return x\n") == "solve"
    assert main_function("x = 1\n") is None


@pytest.mark.parametrize(
    "reply",
    [
        "The answer is 3 or 4 or 5.",
        "The answer is 3, 4, or 5.",
        "Final Answer: 3, 4, 5",
        "The answer is either 12 or 13 apples.",
        "The answer is 3\u20135.",
        "$\\boxed{3}\\boxed{4}$",
        "\\boxed{3} or \\boxed{4}",
        "\\boxed{3, 4}",
        "#### 3 or 4",
        "Counting again, it is 3 or 4.",
        # An unevaluated expression names no number: its first operand is not its value (a trained policy
        # echoed the question as "The answer is 35 - 42", which was read as 35).
        "The answer is 35 - 42",
        "The answer is 3 * 4.",
        "The answer is 6 minus 2",
        "\\boxed{3 \\times 4}",
    ],
)
def test_a_number_hedged_among_others_is_no_commitment(reply):
    assert extract_number(reply) is None


def test_a_box_contradicted_by_a_later_answer_statement_is_no_commitment():
    assert extract_number("So $\\boxed{5}$. The answer is 6.") is None
    assert extract_number("So $\\boxed{5}$. The answer is 5 apples.") == "5"
    assert extract_number("The answer is 6. Wait, recounting: $\\boxed{5}$.") == "5"  # a later box revises
    assert extract_number("Step one gives \\boxed{12}. Adding 3 we get \\boxed{15}.") == "15"


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("3e-36", "4e-36", False),
        ("0.000000708", "3.54e-07", False),
        ("3.54e-07", "3.54E-7", True),
        ("3e-36", "3 \\times 10^{-36}", True),
        ("2002.0781", "2002.0791", True),  # within 1e-6 of the larger magnitude
        ("2002.0781", "2002.1781", False),
        ("16777223", "16777216", False),  # integers compare exactly
        ("1234.00", "1234", True),
        ("-0.5", "0.5", False),
        ("0.0", "0", True),
        ("1e-17", "0.0", False),  # no absolute tolerance unless a task states one
    ],
)
def test_numbers_compare_relatively_and_integers_exactly(a, b, equal):
    assert numbers_equal(a, b) is equal


def test_an_absolute_tolerance_only_widens_closeness_near_zero():
    assert numbers_equal("1e-17", "0.0", abs_tol=1e-12)
    assert not numbers_equal("3e-36", "4e-36", abs_tol=0.0)
    example = Example(id="t", input="?", answer="0.0", abs_tol=1e-12)
    assert get_task("numeric").same("1e-17", "0.0", example)


def test_words_compare_as_text_in_order_and_never_through_math_verify():
    assert not math_equal("apple banana cherry", "banana apple cherry")  # math-verify multiplies the letters
    assert math_equal("apple banana cherry", "Apple, banana, cherry.")
    words = Example(
        id="w", input="Sort: cherry apple banana", answer="apple banana cherry", task_type="exact_match"
    )
    view = TaskView(get_task("exact"), words)
    assert (
        view.extract("Sorting alphabetically.\n\nThe answer is apple banana cherry.") == "apple banana cherry"
    )
    assert not view.same("banana apple cherry", "apple banana cherry")


def test_symbol_answers_keep_their_symbols():
    assert normalize_text(") ) }") == "))}" and normalize_text("> ) }") == ">)}"
    assert normalize_text(") ) }") != normalize_text("] ) }")
    assert normalize_text("\\} \\}") == normalize_text("} }")  # a box escapes its braces
    assert extract_text("Closing the open brackets in order.\n\nThe answer is ) ) }.") == ") ) }"
    assert extract_text("So the rest is $\\boxed{) ) \\}}$") == ") ) \\}"


def test_a_refusal_is_not_a_text_answer():
    assert extract_text("I'm sorry, but I cannot answer that question.") is None
    assert extract_text("The answer is: I don't know.") is None
    assert extract_text("The answer is no. It is not plausible.") == "no"
    assert extract_text("The answer is J. R. R. Tolkien.") == "J. R. R. Tolkien"


@pytest.mark.parametrize(
    "reply", ["\\boxed{3 \\vee 4}", "The answer is $x = 3$ or $x = 4$.", "\\boxed{3}\\boxed{4}"]
)
def test_math_alternatives_are_no_commitment(reply):
    assert extract_math(reply) is None


@pytest.mark.parametrize(
    ("reply", "letter"),
    [
        ("The answer is A, B, C or D", None),
        ("A, B, C or D", None),
        ("The answer is (A) or (B).", None),
        ("Answer: B/C", None),
        ("\\boxed{A}\\boxed{B}", None),
        ("$\\boxed{A}$, $\\boxed{B}$", None),
        ("\\boxed{C}. The answer is (B).", None),
        ("\\boxed{C}. The answer is (C).", "C"),
        ("The answer is C. Option A is wrong because density does not change.", "C"),
        ("The answer is C, not D.", "C"),
        ("The answer is C, a classic result.", "C"),
        ("The answer is (\uff23).", "C"),
        ("I cannot say whether planetary days will become shorter.", None),
    ],
)
def test_multiple_choice_takes_one_commitment_only(reply, letter):
    assert extract_choice(reply, CHOICES) == letter


def test_multiple_choice_reads_up_to_26_options():
    choices = [f"value {i} of the list" for i in range(26)]
    assert extract_choice("The answer is (K).", choices[:11]) == "K"
    assert extract_choice("**R) value 17 of the list**", choices[:18]) == "R"
    assert extract_choice("The answer is (Z).", choices) == "Z"
    assert extract_choice("The answer is (L).", choices[:11]) is None  # not an option of this question
    assert extract_choice("The answer is I think B", choices[:11]) is None  # "I think" is not option I


def test_a_letter_named_option_is_letter_of_its_position():
    task = get_task("multiple_choice")
    example = Example(id="m", input="?", answer="D", choices=["w", "x", "y", "z"])
    question = task.question(example)
    assert "\nD. z" in question and "Choose one option (A-D)" in task.instruction(example)


# --- long replies: one pass per rule -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "tail", "extract", "expected"),
    [
        ("answer:" + " " * 50, "\nThe answer is 7.", extract_number, "7"),
        ("\\boxed{" * 2, "\nThe answer is 7.", extract_number, "7"),
        ("1" * 50 + " ", "\nThe answer is 7.", extract_number, "7"),
        ("\\(", "\nThe answer is $x^2$.", extract_math, "x^2"),
        ("\n" * 20, "The answer is (C).", lambda r: extract_choice(r, CHOICES), "C"),
        ("The answer is (A). ", "Final answer: C", lambda r: extract_choice(r, CHOICES), "C"),
        (
            "whale ",
            "The answer is Blue whale.",
            lambda r: extract_choice(r, ["Mercury", "Blue whale", "whale"]),
            "B",
        ),
        ("abc. ", "The answer is no.", extract_text, "no"),
    ],
)
def test_a_megabyte_reply_is_read_in_linear_time(pattern, tail, extract, expected):
    """Padding built to make a backtracking pattern or a per-match rescan quadratic (minutes on a megabyte); the
    answer after it still counts. Each takes well under a second here (`bench/extraction.py` measures them)."""
    assert extract(pattern * (1_000_000 // len(pattern)) + tail) == expected


def test_boxes_nested_deeper_than_a_model_writes_are_no_answer_read_in_linear_time_and_memory():
    """Copying each level's content would take ~1.6 GB at 20,000 levels; three levels are opened, deeper is
    no answer."""
    assert extract_number("\\boxed{\\boxed{7}}") == "7"
    assert extract_number("\\boxed{" * 20_000 + "7" + "}" * 20_000) is None


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


_SUPERSCRIPT = str.maketrans(
    "0123456789-+", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b\u207a"
)


@st.composite
def written_numbers(draw) -> tuple[str, Decimal]:
    """A number as a reply writes it (signs incl. U+2212, exponents in six notations, full-width digits) and its
    value."""
    mantissa = f"{draw(st.integers(1, 999))}{draw(st.sampled_from(['', '.5', '.25', '.125']))}"
    negative = draw(st.booleans())
    sign = draw(st.sampled_from(["-", "\u2212"])) if negative else ""
    exponent = draw(st.integers(-40, 40))
    form = draw(
        st.sampled_from(["plain", "wide", "e", "E", "times", "cdot", "unicode", "python", "superscript"])
    )
    value = Decimal(f"{'-' if negative else ''}{mantissa}")
    if form in ("plain", "wide"):
        text = f"{sign}{mantissa}"
        return (
            text.translate(
                str.maketrans(
                    "0123456789.", "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19\uff0e"
                )
            )
            if form == "wide"
            else text
        ), value
    value *= Decimal(10) ** exponent
    text = {
        "e": f"{sign}{mantissa}e{exponent}",
        "E": f"{sign}{mantissa}E{exponent:+d}",
        "times": f"{sign}{mantissa} \\times 10^{{{exponent}}}",
        "cdot": f"{sign}{mantissa}\\cdot10^{{{exponent}}}",
        "unicode": f"{sign}{mantissa} \u00d7 10^{exponent}",
        "python": f"{sign}{mantissa}*10**{exponent}",
        "superscript": f"{sign}{mantissa} \u00d7 10{str(exponent).translate(_SUPERSCRIPT)}",
    }[form]
    return text, value


_NUMBER_FORMS = [
    "The answer is {}.",
    "Final Answer: {}",
    "$\\boxed{{{}}}$",
    "#### {}",
    "The answer is {}. Check: 2 + 2 = 4 and 10 - 3 = 7.",
    "Adding it all up, the total comes to {}",
]
_WORDS = ["apple", "banana", "cherry", "or", "valid", "invalid", "yes", "no", "Dennis", "O'Keefe", "maybe"]


@settings(max_examples=300, deadline=None)
@given(_prose, written_numbers(), st.sampled_from(_NUMBER_FORMS))
def test_every_number_shape_extracts_its_value_and_extracts_the_same_twice(prose, number, form):
    text, value = number
    once = extract_number(f"{prose}\n{form.format(text)}")
    assert once is not None and numbers_equal(once, str(value)), (text, once)
    assert extract_number(once) == once


@settings(max_examples=200, deadline=None)
@given(
    _prose,
    st.one_of(
        st.lists(st.sampled_from(_WORDS), min_size=1, max_size=8, unique=True).map(" ".join),
        st.lists(st.sampled_from([")", "]", "}", ">", "(", "[", "{", "<"]), min_size=1, max_size=8).map(
            " ".join
        ),
    ),
    st.sampled_from(["The answer is {}.", "Final Answer: {}", "$\\boxed{{{}}}$", "{}"]),
)
def test_every_text_shape_extracts_itself_and_extracts_the_same_twice(prose, answer, form):
    written = answer.replace("{", "\\{").replace("}", "\\}") if "boxed" in form else answer
    example = Example(id="t", input="?", answer=answer)
    task = get_task("exact")
    once = task.extract(f"{prose}\n{form.format(written)}", example)
    assert once is not None and task.same(once, answer, example), (answer, once)
    assert task.extract(once, example) == once


@settings(max_examples=200, deadline=None)
@given(
    _prose,
    st.integers(2, 26).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))),
    st.sampled_from(
        [
            "The answer is ({}).",
            "Answer: {}",
            "$\\boxed{{{}}}$",
            "**{}) {}**",
            "The correct option is {}.",
            "{}",
            "$\\boxed{{\\textbf{{({})}}}}$",
            "The answer is $\\text{{({})}}$.",
            "**Answer:** $\\mathrm{{{}}}$",
            "\\boxed{{\\text{{{}) {}}}}}",
        ]
    ),
)
def test_every_choice_shape_up_to_26_options_extracts_its_letter_and_the_same_twice(prose, options, form):
    n, i = options
    choices = [f"value {k} of the list" for k in range(n)]
    example = Example(id="m", input="?", answer=LETTERS[i], choices=choices)
    task = get_task("multiple_choice")
    once = task.extract(f"{prose}\n{form.format(LETTERS[i], choices[i])}", example)
    assert once == LETTERS[i]
    assert task.extract(once, example) == once


_LATEX_TEXT_FORMS = [
    "$\\boxed{{\\text{{{}}}}}$",
    "The answer is $\\text{{{}}}$.",
    "Final Answer: $\\textbf{{{}}}$",
    "\\boxed{{\\mathrm{{{}}}}}",
    "The final answer is \\textit{{{}}}",
    "The answer is \\mbox{{{}}}.",
    "$\\boxed{{\\text{{\\textbf{{{}}}}}}}$",
]


@settings(max_examples=150, deadline=None)
@given(
    _prose,
    st.lists(st.sampled_from([w for w in _WORDS if w != "or"]), min_size=1, max_size=4, unique=True).map(
        " ".join
    ),
    st.sampled_from(_LATEX_TEXT_FORMS),
    st.sampled_from(["exact", "f1"]),
)
def test_a_word_answer_in_latex_text_commands_reads_as_its_words_and_the_same_twice(
    prose, answer, form, task
):
    example = Example(id="t", input="?", answer=answer)
    view = get_task(task)
    once = view.extract(f"{prose}\n{form.format(answer)}", example)
    assert once == answer
    assert view.extract(once, example) == once


@pytest.mark.parametrize(
    ("reply", "text", "letter"),
    [
        # the case: a word answer a model wrapped in LaTeX
        ("So the statement is $\\boxed{\\text{False}}$.", "False", None),
        ("\\boxed{\\textbf{(C)}}", "(C)", "C"),
        ("The day shortens, so the correct option is $\\textbf{(C)}$.", "(C)", "C"),
        # hedges inside text commands commit to nothing
        ("$\\boxed{\\text{(A) or (C)}}$", "(A) or (C)", None),
        ("The answer is $\\text{A or C}$.", "A or C", None),
        ("\\boxed{\\textbf{(A)} \\text{ or } \\textbf{(C)}}", "(A) or (C)", None),
        ("Final Answer: $\\textbf{(C)}$, $\\textbf{(A)}$", "(C), (A)", None),
        ("$\\boxed{\\text{(A)}}\\boxed{\\text{(C)}}$", None, None),
        # a box contradicted by a later statement; a refusal in a box
        ("$\\boxed{\\text{(C)}}$. On reflection, the answer is (A).", "(C)", None),
        ("$\\boxed{\\text{I cannot answer this}}$", None, None),
        # a text command that is not all of the answer is left to the number reader
        ("The length is $\\boxed{5\\text{ cm}}$.", "5\\text{ cm}", None),
    ],
)
def test_latex_text_commands_are_read_as_their_words_and_hedges_in_them_commit_to_nothing(
    reply, text, letter
):
    assert extract_text(reply) == text
    assert extract_choice(reply, CHOICES) == letter


def test_a_hedge_or_a_number_in_latex_text_commands_reads_as_for_plain_text():
    assert extract_math("$\\boxed{\\text{True or False}}$") is None
    assert extract_math("\\boxed{\\text{False}}") == "False"
    assert extract_number("\\boxed{\\textbf{42}}") == "42"
    assert extract_number("The answer is $\\text{-20}$.") == "-20"
    assert extract_number("$\\boxed{\\text{3 or 4}}$") is None
    assert normalize_text(extract_text("The answer is $\\mathrm{Invalid}$.") or "") == "invalid"


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
