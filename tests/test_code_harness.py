"""The judged code harness as the tests see it: values cross exactly, the solution stays out of the verdict.

Each test runs real code in the sandbox (`run_tests`: candidate and judge processes) with a test written the
way HumanEval, MBPP and MoCo write them.
"""

from __future__ import annotations

import json

import pytest

from colab_graphs.sandbox.code_tests import run_tests, unusable_test

ECHO = "def echo(value):\n    return value\n"


def test_plain_values_round_trip_exactly_with_their_types():
    test = """
import math
from fractions import Fraction
from decimal import Decimal
values = [None, True, 0, -7, 2**70, -(2**100), 0.1, -0.0, float('inf'), 'héllo\\n\\x00', b'\\x00\\xff',
          bytearray(b'ab'), (1, (2, [3])), [1, (2,)], {1, 2}, frozenset({'a'}), {(1, 2): [3], 'k': None},
          3 + 4j, Fraction(1, 3), Decimal('1.10'), range(1, 9, 2), (), [], {}]
for v in values:
    r = echo(v)
    assert type(r) is type(v), (v, r)
    assert r == v, (v, r)
assert math.copysign(1, echo(-0.0)) == -1
assert math.isnan(echo(float('nan')))
assert list(echo({'b': 1, 'a': 2}).keys()) == ['b', 'a']
"""
    verdict = run_tests(ECHO, test, entry_point="echo")
    assert verdict.passed, verdict.reason


def test_dict_views_and_generators_arrive_as_what_they_were():
    code = (
        "def views(d):\n    return d.keys(), d.values(), d.items()\n\ndef gen(n):\n    yield from range(n)\n"
    )
    test = """
k, v, i = views({'x': 1, 'y': 2})
assert list(k) == ['x', 'y'] and k == {'x', 'y'}
assert list(v) == [1, 2] and list(i) == [('x', 1), ('y', 2)]
g = gen(3)
assert next(g) == 0 and list(g) == [1, 2]
"""
    assert run_tests(code, test).passed


def test_subclasses_of_plain_types_cross_as_their_base():
    code = (
        "from collections import Counter, OrderedDict, namedtuple\nimport enum\n"
        "Point = namedtuple('Point', 'x y')\nclass Color(enum.IntEnum):\n    RED = 1\n"
        "def counts(s):\n    return Counter(s)\n\ndef point():\n    return Point(1, 2)\n\ndef red():\n    return Color.RED\n"
    )
    test = "assert counts('aab') == {'a': 2, 'b': 1}\nassert point() == (1, 2)\nassert red() == 1\n"
    assert run_tests(code, test).passed


def test_in_place_changes_to_arguments_reach_the_test():
    code = "def sort_in_place(xs):\n    xs.sort()\n\ndef fill(d):\n    d['k'] = 1\n"
    test = (
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]\nd = {}\nfill(d)\nassert d == {'k': 1}\n"
    )
    assert run_tests(code, test).passed


def test_a_builtin_exception_of_the_solution_is_raised_in_the_test_by_its_type():
    code = (
        "class Invalid(ValueError):\n    pass\n\nclass Odd(Exception):\n    pass\n\n"
        "def parse(s):\n    if s == 'odd':\n        raise Odd('odd')\n    raise Invalid(f'bad {s}')\n"
    )
    test = """
try:
    parse('x')
except ValueError as exc:
    assert str(exc) == 'bad x'
else:
    raise AssertionError('no ValueError')
try:
    parse('odd')
except ValueError:
    raise AssertionError('Odd is not a ValueError')
except Exception as exc:
    assert type(exc).__name__ == 'CandidateError'
"""
    verdict = run_tests(code, test)
    assert verdict.passed, verdict.reason


def test_a_solution_that_exits_fails_even_when_the_test_catches_everything():
    code = "def f():\n    raise SystemExit(0)\n"
    test = "try:\n    f()\nexcept BaseException:\n    pass\n"
    verdict = run_tests(code, test)
    assert not verdict.passed
    assert "SystemExit" in verdict.reason


def test_objects_of_the_solution_stay_behind_as_handles_the_test_can_use_but_not_compare():
    # MBPP 367's shape: the test builds the solution's Node objects and passes them back.
    code = (
        "class Node:\n    def __init__(self, data):\n        self.data = data\n        self.left = None\n\n"
        "def depth(node):\n    return 0 if node is None else 1 + depth(node.left)\n\n"
        "def make():\n    return Node(5)\n"
    )
    test = """
root = Node(1)
root.left = Node(2)
root.left.left = Node(3)
assert depth(root) == 3
assert root.left.data == 2
for compare in (lambda: make() == 5, lambda: bool(make()), lambda: hash(make()), lambda: list(make())):
    try:
        compare()
    except TypeError:
        pass
    else:
        raise AssertionError('a handle decided a comparison')
"""
    verdict = run_tests(code, test)
    assert verdict.passed, verdict.reason


def test_the_question_s_helpers_are_the_judge_s_not_the_solution_s():
    question = "def double(x):\n    return 2 * x\n\ndef halve(y):\n    ...\n"
    cheat = "def double(x):\n    return 0\n\ndef halve(y):\n    return 0\n"
    test = "def check(candidate):\n    assert double(candidate(8)) == 8\n"
    verdict = run_tests(cheat, test, entry_point="halve", prompt_code=question)
    assert not verdict.passed
    honest = "def halve(y):\n    return y / 2\n"
    assert run_tests(honest, test, entry_point="halve", prompt_code=question).passed


def test_check_is_called_with_the_entry_point_when_the_test_only_defines_it():
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    right = run_tests("def add(a, b):\n    return a + b\n", test, entry_point="add")
    wrong = run_tests("def add(a, b):\n    return a * b\n", test, entry_point="add")
    assert (right.passed, right.calls, wrong.passed) == (True, 1, False)


def test_a_call_past_its_own_limit_fails_the_run():
    code = "import time\ndef f(s):\n    time.sleep(s)\n    return s\n"
    verdict = run_tests(code, "assert f(0) == 0\nassert f(30) == 30\n", timeout_s=20, call_timeout_s=1)
    assert (verdict.passed, verdict.reason) == (False, "timeout")
    assert verdict.wall_s < 15


def test_the_solution_s_output_never_decides_and_is_capped():
    code = "import sys\nfor i in range(20000):\n    print(f'line {i}')\ndef f():\n    print('x' * 10**6)\n    return 1\n"
    verdict = run_tests(code, "assert f() == 1\n")
    assert verdict.passed
    assert len(verdict.stdout) <= 64_000


def test_a_test_that_passes_without_calling_the_solution_reports_no_calls():
    verdict = run_tests("def f():\n    return 1\n", "assert 1 == 1\n")
    assert (verdict.passed, verdict.calls) == (True, 0)


def test_a_unittest_style_test_that_exits_cleanly_passes():
    test = (
        "import unittest\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(1, 2), 3)\n"
        "unittest.main(argv=['t'])\n"
    )
    assert run_tests("def add(a, b):\n    return a + b\n", test).passed
    assert not run_tests("def add(a, b):\n    return 0\n", test).passed


@pytest.mark.parametrize(
    ("test", "problem"),
    [
        (None, "there is no test"),
        ("  \n", "the test is empty"),
        ("assert (", "the test is not Python"),
        ("# TODO", "nothing in the test can fail"),
        ("def check(candidate):\n    pass\n", "nothing in the test can fail"),
        ("METADATA = {}\n", "nothing in the test can fail"),
    ],
)
def test_a_test_that_cannot_fail_is_refused(test, problem):
    assert problem in (unusable_test(test) or "")
    if test is not None:
        with pytest.raises(ValueError, match=problem):
            run_tests("def f():\n    return 1\n", test)


FORGED_REPLIES = {
    "an array of objects (pointers)": {"value": {"ndarray": ["|O8", [1], "00" * 8]}},
    "an array of records": {"value": {"ndarray": ["|V8", [1], "00" * 8]}},
    "a dtype string that names no plain dtype": {"value": {"numpy": ["<i8]); import os #", [], "00" * 8]}},
    "bytes short of the shape": {"value": {"ndarray": ["<i8", [2], "05" + "00" * 7]}},
    "a reference to nothing read yet": {"value": {"same": 0}},
    "an argument the test never passed": {"value": {"arg": 7}},
    "a change that turns the test's list into a dict": {"value": 5, "changed": [[0, {"dict": []}]]},
}


@pytest.mark.parametrize("forged", list(FORGED_REPLIES))
def test_a_forged_reply_breaks_the_protocol_and_fails(forged):
    """Replies written by hand on the candidate's pipe, each of which would hand the judge something other than
    plain data of its own making (a numpy array of raw pointers, a dangling reference, a test object changed to
    another type): the judge refuses each (`the candidate broke the protocol`), so the verdict fails."""
    line = json.dumps(FORGED_REPLIES[forged]) + "\n"
    code = f"import os, time\ndef f(xs, y):\n    os.write(4, {line.encode()!r})\n    time.sleep(30)\n"
    verdict = run_tests(code, "assert f([1], 2) == 3\n", timeout_s=20)
    assert not verdict.passed
    assert "broke the protocol" in verdict.reason, verdict.reason
    assert verdict.wall_s < 15


def test_identity_changes_and_numpy_values_cross_as_in_one_process():
    numpy = pytest.importorskip("numpy")
    del numpy
    code = (
        "import numpy as np\nfrom collections import Counter\n"
        "def same(a, b):\n    return a is b\n\ndef link(xs):\n    xs.append(xs)\n    return xs\n\n"
        "def count(c):\n    c['a'] += 1\n    return c\n\ndef scale(a):\n    a *= 2\n    return a.sum()\n"
    )
    test = """
import numpy as np
from collections import Counter
x = [1]
assert same(x, x) and not same(x, [1]) and same([x, x][0], x)
xs = [0]
assert link(xs) is xs and xs[1] is xs
c = Counter('ab')
assert count(c) is c and type(c) is Counter and c['a'] == 2
a = np.array([1, 2])
total = scale(a)
assert total == 6 and type(total) is np.int64 and a.tolist() == [2, 4]
"""
    verdict = run_tests(code, test, timeout_s=20)
    assert verdict.passed, verdict.reason
