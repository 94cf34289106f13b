"""Scoring code by its tests: a judged run in the sandbox, and the refusal of a test that tests nothing.

`run_tests(code, test)` runs the code in the sandbox's candidate process and the test in its judge process
(`colab_graphs.sandbox.harness` says what crosses between them and what the test sees); the verdict is the
judge's alone. The question's code and the test are read here, on the host (they are the dataset's, not the
candidate's), so the judge gets them ready to run: which names the test reads without defining them (the judge
resolves each: the entry point, the builtins, the standard library, then the solution), whether it only defines
`check(candidate)` and whether it runs unittest, the question's definitions one statement at a time.

A test that cannot fail passes everything: `unusable_test` names why a test is unusable (missing, blank, not
Python, or nothing in it can fail: no `assert`, no `raise`, no call), and `run_tests` refuses it with that
reason; a test that passes without a single call to the code under test comes back with `calls == 0`.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True)
class CodeVerdict:
    """How the tests judged one piece of code. `passed` is the judge's verdict and nothing else."""

    passed: bool
    reason: (
        str  # "" when passed; else why not: the failing assertion, "timeout", "the code did not load: ..."
    )
    calls: int  # requests the test made to the code under test (0: it never used it)
    wall_s: float
    isolation: list[str] = field(default_factory=list)
    stdout: str = ""  # the candidate's, capped: for reading, never for judging
    stderr: str = ""
    backend: str = ""  # the sandbox backend that ran it (`colab_graphs.sandbox.backends`)


def unusable_test(test: str | None) -> str | None:
    """Why `test` cannot judge code (None when it can): missing, blank, not Python, or nothing in it can fail.

    Example:
        >>> unusable_test("assert add(2, 3) == 5") is None
        True
        >>> unusable_test("def check(candidate):\\n    pass\\n")
        'nothing in the test can fail (no assert, raise or call)'
    """
    if test is None:
        return "there is no test"
    if not test.strip():
        return "the test is empty"
    try:
        tree = ast.parse(test)
    except SyntaxError as exc:
        return f"the test is not Python: {exc.msg} (line {exc.lineno})"
    if not any(isinstance(n, ast.Assert | ast.Raise | ast.Call) for n in ast.walk(tree)):
        return "nothing in the test can fail (no assert, raise or call)"
    return None


def run_tests(
    code: str,
    test: str,
    *,
    entry_point: str | None = None,
    prompt_code: str | None = None,
    timeout_s: float = 10,
    call_timeout_s: float | None = None,
    memory_mb: int = 512,
    sandbox: str | None = None,
    python: str | None = None,
) -> CodeVerdict:
    """Run `test` against `code` in the sandbox, candidate and judge apart, and return the judge's verdict.

    Args:
        code: the solution's source (its module-level code runs in the candidate process).
        test: Python that raises on failure (asserts, or a `check(candidate)` it never calls itself).
        entry_point: the function under test: `check`'s argument, and always taken from the solution.
        prompt_code: the question's code; its imports, functions, classes and constants are the judge's own.
        timeout_s: wall clock for the whole run (loading the code and every call).
        call_timeout_s: wall clock for one call of the solution (default: only the total limit).
        memory_mb: address-space limit per process.
        sandbox: the sandbox setting (`colab_graphs.sandbox.backends`; None: env, else ``auto``).
        python: the interpreter the code and the test run on (a record's or pool's; None:
            `runner.sandbox_python()`, this environment's, or env ``COLAB_GRAPHS_SANDBOX_PYTHON``).

    Raises:
        ValueError: the test cannot fail (`unusable_test`).
        SandboxUnavailable: no sandbox backend meets `sandbox` here (nothing ran).

    Example:
        >>> run_tests("def add(a, b):\\n    return a + b\\n", "assert add(2, 3) == 5").passed
        True
    """
    from colab_graphs.sandbox import runner

    problem = unusable_test(test)
    if problem:
        raise ValueError(problem)
    request = _judge_request(test, entry_point, prompt_code or "")
    request |= {"timeout_s": timeout_s, "call_timeout_s": call_timeout_s}
    run = runner.run_judged(
        code,
        _harness_source(),
        request,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        backend=sandbox,
        python=python,
    )
    verdict = run.verdict or {}
    passed = verdict.get("passed") is True
    reason = verdict.get("reason") or ("timeout" if run.timed_out else "the judge gave no verdict")
    return CodeVerdict(
        passed=passed,
        reason="" if passed else str(reason),
        calls=int(verdict.get("calls") or 0),
        wall_s=run.wall_s,
        isolation=run.isolation,
        stdout=run.stdout,
        stderr=run.stderr,
        backend=run.backend,
    )


async def arun_tests(code: str, test: str, **options: object) -> CodeVerdict:
    """`run_tests` for async callers, bounded by the sandbox's process-wide parallelism."""
    from colab_graphs.sandbox import runner as sandbox

    return await sandbox.in_sandbox_pool(run_tests, code, test, **options)


@functools.cache
def _harness_source() -> str:
    from colab_graphs.sandbox import harness as code_harness

    with open(code_harness.__file__, encoding="utf-8") as fh:
        return fh.read()


def _judge_request(test: str, entry_point: str | None, prompt: str) -> dict[str, Any]:
    """What the judge needs, read from the dataset's test and question (see `harness.judge`)."""
    tree = ast.parse(test)
    question = _question_statements(prompt)
    question_names = set().union(*(top_level_names(ast.parse(s)) for s in question)) if question else set()
    own = top_level_names(tree)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return {
        "test": test,
        "question": question,
        "entry_point": entry_point,
        "unbound": sorted(used - own - question_names),
        "call_check": _defines_check_without_calling(tree),
        "bind_candidate": "candidate" in used and "candidate" not in own,
        "unittest": "unittest" in _imported_modules(tree),
    }


def _imported_modules(tree: ast.Module) -> set[str]:
    """The top-level packages the code imports anywhere (`import unittest.mock`, `from unittest import main`)."""
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module.split(".")[0])
    return modules


def _question_statements(prompt: str) -> list[str]:
    """The question's definitions (imports, functions, classes, constants), one source snippet each."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return []
    return [ast.unparse(n) for n in tree.body if isinstance(n, DEFINITIONS)]


def _defines_check_without_calling(tree: ast.Module) -> bool:
    defines = any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body)
    calls = any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "check"
        for n in ast.walk(tree)
        if not (isinstance(n, ast.FunctionDef) and n.name == "check")
    )
    return defines and not calls
