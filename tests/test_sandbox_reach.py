"""A plain user's scorer reaches nothing outside its runs, under namespaces and under landlock with `unshare`
refused: the cases of `tests/test_reward_hacks_reach.py` (`tests/reach_cases.py`) scored by `run_tests` (the
code scorer's judged run) in a scorer running as `nobody` on the system interpreter (this environment's may
sit where a plain user cannot reach it, as under /root): each wrong reply 0, each correct one 1, the scorer
itself, a bystander process of its uid and its files (one in a world-writable directory) unchanged, and no
daemon left. Under landlock the code runs as the scorer's own uid, so only the sandbox's own rules (Landlock's
scopes, the seccomp filter) stand between it and the scorer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.test_sandbox import (
    CONTAINER,
    NOBODY,
    REPO,
    _as_nobody,
    processes_running,
    skip_unless_a_plain_user_can_score,
)

PLAIN_USER_SCRIPT = """\
import json, os, shutil, subprocess, sys, tempfile, types, uuid
package = types.ModuleType("colab_graphs")
package.__path__ = [{package!r}]
sys.modules["colab_graphs"] = package
sys.path.insert(0, {tests!r})
from colab_graphs.sandbox.code_tests import run_tests
import reach_cases as reach
bystander = subprocess.Popen(["sleep", "600"])
own = tempfile.mkdtemp()
shared = "/tmp/cg-reach-%s.txt" % uuid.uuid4().hex[:12]
files = [shared, os.path.join(own, "caller.txt")]
for path, mode in zip(files, (0o666, 0o644)):
    with open(path, "w") as fh:
        fh.write("host")
    os.chmod(path, mode)
    try:
        os.setxattr(path, "user.cg", b"host")
    except OSError:
        pass
pids = [os.getpid(), bystander.pid]
add_test = "assert add(2, 3) == 5\\nassert add(-1, 1) == 0\\n"
cases = {{n: (code, want, add_test) for n, (code, want) in reach.process_cases(reach.host_header(pids, files, {marker!r})).items()}}
for name, (question, test, wrong, right) in reach.PLAIN_PYTHON.items():
    if "numpy" not in wrong + right:
        cases[name + "-wrong"], cases[name + "-right"] = (wrong, 0.0, test), (right, 1.0, test)
before = {{str(p): reach.process_state(p) for p in pids}} | {{f: reach.file_state(f) for f in files}}
verdicts = {{}}
for name, (code, want, test) in cases.items():
    verdict = run_tests(code, test, timeout_s=20)
    verdicts[name] = [verdict.passed, want, verdict.reason[:300], verdict.backend]
after = {{str(p): reach.process_state(p) for p in pids}} | {{f: reach.file_state(f) for f in files}}
bystander.kill()
os.unlink(shared)
shutil.rmtree(own)
print(json.dumps({{"verdicts": verdicts, "before": before, "after": after}}, default=repr))
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists(),
    reason="runs the scorer as a plain user, which needs root to switch to",
)
@pytest.mark.parametrize("where", ["namespaces allowed", "unshare refused (container)"])
def test_a_plain_user_s_scorer_reaches_nothing_outside_the_run(where):
    """The scorer as `nobody` (its code then runs as `nobody` too: a user namespace, or Landlock alone), with
    the system interpreter (this environment's may be out of a plain user's reach): every case above that needs
    no numpy, judged right; the scorer itself, a bystander of its uid and its files unchanged; no daemon left."""
    skip_unless_a_plain_user_can_score(where)
    marker = f"{6000 + int.from_bytes(os.urandom(2), 'big') % 1000}.{uuid.uuid4().int % 10**6}"
    backend = "namespaces" if where.startswith("namespaces") else "landlock"
    script = PLAIN_USER_SCRIPT.format(
        package=str(REPO / "colab_graphs"), tests=str(REPO / "tests"), marker=marker, backend=backend
    )
    python = ["/usr/bin/python3", "-I", "-c", script]
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp"}
    if where.startswith("namespaces"):
        done = _as_nobody(python, env=env)
    else:
        done = subprocess.run(
            [*CONTAINER, "--user", str(NOBODY), "--", *python],
            capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    wrong = {n: v for n, v in report["verdicts"].items() if float(v[0]) != v[1]}
    assert wrong == {}
    assert {v[3] for v in report["verdicts"].values()} == {backend}
    assert report["after"] == report["before"]
    assert processes_running(marker) == []
