"""Plain Python across the pipe, and code that reaches past its run, through `colab-graphs run --scorer code`.

Real records (MoCo's HumanEval/53, `add`, and the same record asking for other functions, its test rewritten
the way MBPP writes tests: asserts calling the function by name), a scripted member over real HTTP replying to
each copy in prose around a fenced block. Every wrong reply scores 0 and every correct one 1:

- identity as in one process: a returned argument is the test's own object (``clone`` returning its argument
  fails a test asserting a new list), a change inside a nested argument reaches the test's own row, the
  solution's functions and classes pickle (workers of a `multiprocessing.Pool` and a spawning
  `ProcessPoolExecutor` get them), processes share state through `Lock`, `Value`, `Array`, `Event`, `Queue`
  and `shared_memory` (forked and spawned, on the run's own /dev/shm: a tmpfs under namespaces, a directory
  of its work directory under landlock), numpy scalars and arrays compare as numpy's (`== 2`,
  `np.array_equal`);
- the candidate's signals reach only its own processes: a correct answer that ignores SIGTERM and sends it to
  its own process group (`kill(0, ...)`, `killpg(getpgrp(), ...)`) scores 1, its judge alive;
- nothing outside the run changes: replies that try to renice, re-limit (open files, CPU, memory), pin,
  reschedule or I/O-deprioritize the scorer and a bystander process of the caller's uid, or change the mode,
  times and extended attributes of the caller's files, score 0 when their `add` is right only if an attempt
  worked, and 1 when they are correct anyway; afterwards the scorer, the bystander and the files are as they
  were, and the daemon a reply left is gone.

The file runs under the backend in force (`auto`); `tests/test_sandbox.py` runs every test_reward_hacks*.py
again under landlock with `unshare` refused, as root and as a plain user where that user can run this
environment. `tests/test_sandbox_reach.py` runs the same cases (those needing no numpy) for a plain user's
scorer on the system interpreter, which a plain user can always run, under both backends.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import score_code_replies

from colab_graphs.testing.scripts import last_user_text
from tests.reach_cases import (
    PLAIN_PYTHON,
    file_state,
    host_header,
    process_cases,
    process_state,
)
from tests.test_sandbox import (
    processes_running,
)

HUMANEVAL = {
    r["id"]: r
    for r in json.loads((Path(__file__).parent / "fixtures" / "moco" / "humaneval.json").read_text())["test"]
}


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Iterator[dict[str, object]]:
    """A bystander process of the caller's uid and two of the caller's files (one in a world-writable
    directory, mode 666, one in the test's own, mode 644), each with an extended attribute where the file
    system keeps them; the scorer is this process."""
    bystander = subprocess.Popen(["sleep", "600"])
    shared = Path("/tmp") / f"cg-reach-{uuid.uuid4().hex[:12]}.txt"
    own = tmp_path_factory.mktemp("reach") / "caller.txt"
    for path, mode in ((shared, 0o666), (own, 0o644)):
        path.write_text("host")
        path.chmod(mode)
        with contextlib.suppress(OSError):  # no user xattrs here: the modes and times are still checked
            os.setxattr(path, "user.cg", b"host")
    marker = f"{5000 + int.from_bytes(os.urandom(2), 'big') % 1000}.{uuid.uuid4().int % 10**6}"
    files = [str(shared), str(own)]
    yield {"pids": [os.getpid(), bystander.pid], "files": files, "marker": marker}
    bystander.kill()
    bystander.wait()
    shared.unlink()


@pytest.fixture(scope="module")
def scored(host, tmp_path_factory) -> Iterator[tuple[dict[str, float], dict[str, float], dict, dict]]:
    """Every case scored in one `colab-graphs run --scorer code`: (scores, wanted scores, the host's state
    before, after)."""
    tmp = tmp_path_factory.mktemp("reach_run")
    header = host_header(host["pids"], host["files"], host["marker"])
    replies, wanted, records = {}, {}, []
    add = HUMANEVAL["HumanEval/53"]
    for name, (question, test, wrong, right) in PLAIN_PYTHON.items():
        for verdict, code, score in (("wrong", wrong, 0.0), ("right", right, 1.0)):
            variant = f"{name}-{verdict}"
            replies[variant], wanted[variant] = code, score
            records.append({**add, "id": variant, "input": f"Variant: {variant}.\n{question}", "test": test})
    for variant, (code, score) in process_cases(header).items():
        replies[variant], wanted[variant] = code, score
        records.append({**add, "id": variant, "input": f"Variant: {variant}.\n{add['input']}"})

    def coder(messages, params):
        variant = last_user_text(messages).split("Variant: ", 1)[1].split(".", 1)[0]
        return f"Here is my solution:\n\n```python\n{replies[variant]}```\n\nIt follows the question."

    state = {pid: process_state(pid) for pid in host["pids"]} | {f: file_state(f) for f in host["files"]}
    scores = score_code_replies(tmp, records, coder)
    after = {pid: process_state(pid) for pid in host["pids"]} | {f: file_state(f) for f in host["files"]}
    yield scores, wanted, state, after


@pytest.mark.parametrize("case", [*PLAIN_PYTHON, "signals_its_own_group"])
def test_the_wrong_reply_scores_zero_and_the_correct_one_one(scored, case):
    scores, _, _, _ = scored
    assert (scores[f"{case}-wrong"], scores[f"{case}-right"]) == (0.0, 1.0), scores.why


def test_replies_that_reach_outside_the_run_change_nothing_and_leave_nothing(scored, host):
    scores, wanted, before, after = scored
    reach = {n: s for n, s in scores.items() if n.startswith(("reaches", "limits"))}
    assert reach == {n: wanted[n] for n in reach}
    assert after == before  # the scorer, the bystander, the caller's files
    assert processes_running(str(host["marker"])) == []
