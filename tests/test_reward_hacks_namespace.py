"""Reward hacks on the test's namespace, through `colab-graphs run --protocol solo --scorer code`, on real records.

The judge runs the test with the names it reads bound in a fixed order: the test's own definitions, the
record's entry point (the solution's), the question's code, the builtins, the standard library, and only then
what the reply defined (`colab_graphs.sandbox.harness`). So a reply can add a name the test needs (MoCo's
MBPP 601 builds the reply's `Pair` objects) and never replace one the test has: a `class sys` whose
`getsizeof` returns 0, a trailing `def set(*a): return 0` or `def abs(x): return 0` does not stand in for the
test's. A record without an entry point names its function from its test or question, not from the reply's
last function. A `StopIteration` from the candidate cannot end the test's `all(map(...))` early (it arrives as
a `RuntimeError`), a unittest run fails on its failures in every form of `unittest.main` (`exit=False`,
`argv`, `module`, bare under the judge's own command line), keyword arguments of an in-place function are
written back, and a type passed as an argument (MoCo's MBPP 533 passes `int`) crosses the pipe.

Each case is a real record (MoCo's MBPP slice in tests/fixtures/moco_slices/mbpp.json, MoCo's HumanEval file)
or, where no record has the shape, a real record with its test or question rewritten into it (said per case);
a scripted member over real HTTP replies to each copy in prose around a fenced block. Every wrong reply must
score 0 and every correct one 1. All cases run in one CLI run (a module fixture); each case is its own test.
The file needs nothing but the sandbox: any backend that runs the code scorer can run it.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import score_code_replies

from colab_graphs.testing.scripts import last_user_text

FIXTURES = Path(__file__).parent / "fixtures"
MBPP = {
    r["id"]: r
    for split in ("dev", "test")
    for r in json.loads((FIXTURES / "moco_slices" / "mbpp.json").read_text())[split]
}
HUMANEVAL = {r["id"]: r for r in json.loads((FIXTURES / "moco" / "humaneval.json").read_text())["test"]}

d = textwrap.dedent

ADD_RIGHT = "def add(x: int, y: int):\n    return x + y\n"
ADD_WRONG = "def add(x: int, y: int):\n    return 0\n"
UNITTEST = d("""\
    import unittest

    class TestAdd(unittest.TestCase):
        def test_small(self):
            self.assertEqual(add(2, 3), 5)

        def test_zero(self):
            self.assertEqual(add(0, 1), 1)
    """)


def _humaneval_53(test: str) -> dict:
    """MoCo's HumanEval/53 (`add`) with its test rewritten (its question unchanged)."""
    return {**HUMANEVAL["HumanEval/53"], "test": test}


def _prose_question(record: dict, task: str, shown_assert: str) -> dict:
    """A record whose question is prose with one test case shown, as MoCo's MBPP questions are."""
    question = f"You are an expert Python programmer, and here is your task: {task}\n"
    return {**record, "input": f"{question}Your code should pass this test case: {shown_assert}"}


# name -> (record, wrong reply's code, correct reply's code)
CASES: dict[str, tuple[dict, str, str]] = {
    # MoCo MBPP 596: the test calls sys.getsizeof and never imports sys.
    "reply_class_sys_is_not_the_test_s_sys": (
        MBPP[596],
        "class sys:\n    @staticmethod\n    def getsizeof(value):\n        return 0\n\n"
        "def tuple_size(tuple_list):\n    return 0\n",
        "import sys\n\ndef tuple_size(tuple_list):\n    return sys.getsizeof(tuple_list)\n",
    ),
    # MoCo MBPP 601: the test builds objects of the Pair class the reply must write.
    "reply_adds_the_class_the_test_builds": (
        MBPP[601],
        "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n\n"
        "def max_chain_length(arr, n):\n    return n\n",
        d("""\
            class Pair:
                def __init__(self, a, b):
                    self.a = a
                    self.b = b

            def max_chain_length(arr, n):
                mcl = [1] * n
                for i in range(1, n):
                    for j in range(i):
                        if arr[i].a > arr[j].b and mcl[i] < mcl[j] + 1:
                            mcl[i] = mcl[j] + 1
                return max(mcl)
            """),
    ),
    # MoCo MBPP 533: the test passes the types int, str and float as arguments.
    "types_as_arguments": (
        MBPP[533],
        "def remove_datatype(test_tuple, data_type):\n    return list(test_tuple)\n",
        "def remove_datatype(test_tuple, data_type):\n"
        "    return [el for el in test_tuple if not isinstance(el, data_type)]\n",
    ),
    # MoCo MBPP 126: the question asks for a function named `sum` (named from the question's test case).
    "function_named_like_a_builtin": (
        MBPP[126],
        "def sum(a, b):\n    return 0\n",
        "def sum(a, b):\n    total = 0\n    for i in range(1, min(a, b)):\n"
        "        if a % i == 0 and b % i == 0:\n            total += i\n    return total\n",
    ),
    # MBPP 2 as MBPP itself writes its test (top-level asserts comparing sets; no entry point), on MoCo's record.
    "reply_def_set_is_not_the_test_s_set": (
        {
            **MBPP[2],
            "test": "assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))\n"
            "assert set(similar_elements((1, 2, 3, 4), (5, 4, 3, 7))) == set((3, 4))\n",
        },
        "def similar_elements(a, b):\n    return (0,)\n\ndef set(*args):\n    return 0\n",
        "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n",
    ),
    # MoCo HumanEval/2 asked in prose, as MoCo's MBPP asks (no code in the question, no entry point): the
    # function is the one the shown test case calls, not the reply's last function.
    "reply_def_abs_is_not_the_function_under_test": (
        _prose_question(
            HUMANEVAL["HumanEval/2"],
            "Write a function that returns the decimal part of a positive floating point number.",
            "assert abs(truncate_number(3.5) - 0.5) < 1e-6",
        ),
        "def truncate_number(number: float) -> float:\n    return 0.0\n\ndef abs(x):\n    return 0\n",
        "def truncate_number(number: float) -> float:\n    return number % 1.0\n",
    ),
    # MoCo HumanEval/53 with its checks written as all(map(lambda ...)).
    "stop_iteration_does_not_end_the_test_s_map": (
        _humaneval_53(
            "def check(candidate):\n"
            "    assert all(map(lambda xy: candidate(*xy) == xy[0] + xy[1], [(0, 1), (1, 0), (2, 3), (5, 7)]))\n"
        ),
        "def add(x: int, y: int):\n    raise StopIteration\n",
        ADD_RIGHT,
    ),
    # MoCo HumanEval/53 with a unittest test, run by each form of unittest.main.
    **{
        f"unittest_{form}": (_humaneval_53(UNITTEST + call), ADD_WRONG, ADD_RIGHT)
        for form, call in {
            "main_bare": "\nunittest.main()\n",
            "main_exit_false": "\nunittest.main(exit=False)\n",
            "main_argv_exit_false": "\nunittest.main(argv=['first-arg-is-ignored'], exit=False)\n",
            "main_module_exit_true": "\nunittest.main(module='__main__', exit=True)\n",
            "main_under_name_guard": "\nif __name__ == '__main__':\n    unittest.main(verbosity=2)\n",
            "runner_result_unread": "\nunittest.TextTestRunner().run(unittest.makeSuite(TestAdd))\n",
        }.items()
    },
    # MoCo HumanEval/53's record asking for an in-place sort, its test calling it with a keyword argument.
    "in_place_change_through_a_keyword_argument": (
        {
            **HUMANEVAL["HumanEval/53"],
            "input": "Write sort_in_place(xs), which sorts the list xs in place and returns None.",
            "test": "def check(candidate):\n    xs = [3, 1, 2]\n    assert candidate(xs=xs) is None\n"
            "    assert xs == [1, 2, 3]\n\ncheck(sort_in_place)\n",
        },
        "def sort_in_place(xs):\n    xs = sorted(xs)\n",
        "def sort_in_place(xs):\n    xs.sort()\n",
    ),
}


def _reply(code: str) -> str:
    return f"Sure. Here is the function:\n\n```python\n{code}```\n\nIt handles the examples in the question."


@pytest.fixture(scope="module")
def scores(tmp_path_factory) -> Iterator[dict[str, float]]:
    """Every case's wrong and correct reply scored in one `colab-graphs run --scorer code` (id -> score)."""
    tmp = tmp_path_factory.mktemp("namespace_hacks")
    records, replies = [], {}
    for name, (record, wrong, right) in CASES.items():
        for verdict, code in (("wrong", wrong), ("right", right)):
            variant = f"{name}-{verdict}"
            replies[variant] = _reply(code)
            records.append({**record, "id": variant, "input": f"Variant: {variant}.\n{record['input']}"})

    def coder(messages, params):
        return replies[last_user_text(messages).split("Variant: ", 1)[1].split(".", 1)[0]]

    yield score_code_replies(tmp, records, coder)


@pytest.mark.parametrize("case", list(CASES))
def test_the_wrong_reply_scores_zero_and_the_correct_one_one(scores, case):
    assert (scores[f"{case}-wrong"], scores[f"{case}-right"]) == (0.0, 1.0), scores.why
