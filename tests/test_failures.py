"""Failures: injected faults, SIGKILL and resume, and a member that is down, against a real HTTP server.

Kill tests start the real CLI entry point (`colab_graphs.cli.app.main`, what the `colab-graphs` script runs)
in a child process against a scripted server with latency, SIGKILL it after a seeded random number of
answered requests, run the same command again, and compare with an uninterrupted run. Children fork from a
multiprocessing fork server that has imported the CLI, LiteLLM and LangGraph once: a fresh interpreter pays
about 7 s of CPU for those imports, which would dominate these tests on a 2-core machine.

What a resume can promise about repeated requests:

- every call whose answer reached the call cache before the kill is never sent again;
- a request the server answered but the killed client never stored (in flight at the kill) is sent again by
  the rerun, at most once more; there are at most `--max-concurrency` of those (one endpoint here).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import multiprocessing
import os
import random
import signal
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import write_pool_file

from colab_graphs.audit.report import read_report
from colab_graphs.audit.run import AuditError, play_audit
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.runner import run_dataset
from colab_graphs.tasks.builtin import builtin_task
from colab_graphs.testing import ScriptedServer, arithmetic_solver

pytestmark = pytest.mark.integration

MEMBERS = ["m1", "m2", "m3"]
EXAMPLES = builtin_task("arithmetic", 6, seed=11)
CONCURRENCY = 4
LATENCY_S = 0.03
KILL_SEEDS = [1, 2, 3]


def members() -> dict:
    accuracies = [0.8, 0.6, 0.4]
    return {
        m: arithmetic_solver(accuracy=a, seed=i)
        for i, (m, a) in enumerate(zip(MEMBERS, accuracies, strict=True))
    }


def pool_of(server: ScriptedServer, names: list[str] = MEMBERS) -> Pool:
    return Pool.from_dict({m: server.litellm_kwargs(m) for m in names})


def debate():
    return build_protocol("debate", MEMBERS, rounds=2)


def report_values(report) -> dict:
    """What must not depend on faults or kills: the values, the intervals and the distinct requests."""
    return {
        "coalitions": [(c.members, c.value) for c in report.coalitions],
        "loo": report.loo,
        "individual": report.individual,
        "ci": report.ci,
        "failed_examples": report.failed_examples,
        "unique": report.calls.unique,
        "naive": report.calls.naive,
    }


def audit(arun, server: ScriptedServer, cache_dir: Path):
    """A LOO audit of the debate in-process, with a fresh client whose retries wait 10 ms first."""
    client = ModelClient(CallCache(cache_dir), max_concurrency=CONCURRENCY, backoff_s=0.01)
    return arun(play_audit(debate(), pool_of(server), EXAMPLES, client=client, method="loo"))


@pytest.fixture(scope="module")
def reference(arun, tmp_path_factory):
    """The uninterrupted, fault-free audit and run of the debate, each with a fresh cache."""
    base = tmp_path_factory.mktemp("reference")
    with ScriptedServer(members()) as server:
        report = audit(arun, server, base / "audit-cache")
        client = ModelClient(CallCache(base / "run-cache"), max_concurrency=CONCURRENCY)
        outcomes, summary = arun(run_dataset(debate(), pool_of(server), EXAMPLES, client=client))
    results = [o.result_line() for o in outcomes]
    return {
        "audit": report_values(report),
        "results": results,
        "score": summary["score"],
        "run_distinct": summary["calls"]["made"],  # a fresh cache: every distinct request made once
    }


# Injected faults


def test_twenty_percent_faults_give_the_fault_free_report(arun, reference, scripted_server, tmp_path):
    server = scripted_server(members(), fault_rate=0.2, faults=("429", "500", "malformed"), fault_seed=7)
    report = audit(arun, server, tmp_path / "cache")
    assert report_values(report) == reference["audit"]
    assert report.calls.failed == 0 and report.calls.made == report.calls.unique
    injected = collections.Counter(r.fault for r in server.requests if r.fault)
    assert set(injected) == {"429", "500", "malformed"}
    assert sum(injected.values()) >= 0.1 * len(server.requests)
    # Retries repeat only failed attempts: each distinct request is answered exactly once.
    answered = server.request_counts(successful_only=True)
    assert len(answered) == report.calls.unique and set(answered.values()) == {1}


# SIGKILL and resume


_FORKSERVER = multiprocessing.get_context("forkserver")
_FORKSERVER.set_forkserver_preload(
    [
        "colab_graphs.cli.app",
        "colab_graphs.cli.audit_cmd",
        "colab_graphs.audit.run",
        "colab_graphs.runner",
        "litellm",
    ]
)


def _cli_main(argv: list[str], stdout: str, stderr: str, backoff_s: float | None) -> None:
    """A child's body: the `colab-graphs` entry point with `argv`, its output in two files.

    `backoff_s` replaces the client's first retry backoff: the CLI has no option for it, and the default 0.5 s
    doubling over six retries makes each request to a down member wait about 30 s.
    """
    out, err = open(stdout, "w", buffering=1), open(stderr, "w", buffering=1)  # noqa: SIM115
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdout, sys.stderr = out, err
    if backoff_s is not None:
        ModelClient.__init__.__kwdefaults__["backoff_s"] = backoff_s
    os.environ["COLUMNS"] = "200"
    sys.argv = ["colab-graphs", *argv]
    from colab_graphs.cli.app import main

    main()


@dataclass
class Cli:
    """One `colab-graphs` child process and its output files."""

    process: multiprocessing.process.BaseProcess
    stdout_path: Path
    stderr_path: Path

    @classmethod
    def start(cls, argv: list[str], logs: Path, backoff_s: float | None = None) -> Cli:
        logs.mkdir(parents=True, exist_ok=True)
        n = len(list(logs.glob("*.out")))
        stdout, stderr = logs / f"{n}.out", logs / f"{n}.err"
        process = _FORKSERVER.Process(target=_cli_main, args=(argv, str(stdout), str(stderr), backoff_s))
        process.start()
        return cls(process, stdout, stderr)

    def wait(self, timeout: float = 180) -> Cli:
        self.process.join(timeout)
        assert self.process.exitcode is not None, (
            f"colab-graphs still running after {timeout}s: {self.stderr}"
        )
        return self

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()


def cli_args(command: str, server: ScriptedServer, tmp_path: Path) -> list[str]:
    pool = write_pool_file(tmp_path / "pool.yaml", server, MEMBERS)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(e.model_dump()) + "\n" for e in EXAMPLES))
    args = [
        command,
        "--protocol",
        "debate",
        "--pool",
        pool,
        "--data",
        data,
        "--cache-dir",
        tmp_path / "cache",
    ]
    args += ["--out", tmp_path / "out", "--max-concurrency", str(CONCURRENCY)]
    if command == "audit":
        args += ["--method", "loo", "--no-plots"]
    return [str(a) for a in args]


def run_killed_then_resumed(args: list[str], server: ScriptedServer, seed: int, tmp_path: Path):
    """SIGKILL `colab-graphs args` after a seeded random number of answered requests; rerun it to the end.

    Returns (answered-before-kill counts, requests in the cache at the kill, the finished rerun).
    """
    rng = random.Random(seed)
    threshold = rng.randint(1, 30)  # a debate audit here answers ~70 distinct requests, a run 36
    # Replies past the threshold wait (in the server) until the kill, so the command cannot finish first however
    # long this process waits for the CPU: on a loaded machine (2 cores, a test on the other worker) it did.
    released, answering = threading.Event(), itertools.count()
    originals = dict(server.members)
    for name, member in originals.items():

        def held(messages, params, _reply_to=member.reply_to):
            if next(answering) >= threshold:
                released.wait(60)
            reply, _ = _reply_to(messages, params)
            return reply

        server.members[name] = dataclasses.replace(member, reply=held)
    child = Cli.start(args, tmp_path / "logs")
    try:
        deadline = time.monotonic() + 120
        while len(server.request_counts(successful_only=True)) < threshold:
            assert child.process.is_alive(), f"the command ended before the kill: {child.stderr}"
            assert time.monotonic() < deadline, "no progress before the kill"
            time.sleep(0.002)
        time.sleep(rng.random() * LATENCY_S * 2)  # land anywhere in a call, not only right after an answer
        os.kill(child.process.pid, signal.SIGKILL)
        assert child.wait().returncode == -signal.SIGKILL
    finally:
        released.set()
        server.members.update(originals)
    before = settled_counts(server)
    stored = cached_requests(tmp_path / "cache")
    return before, stored, Cli.start(args, tmp_path / "logs").wait()


def settled_counts(server: ScriptedServer) -> collections.Counter:
    """Answered-request counts once the server has finished what the killed client left in flight.

    The server logs a request when it answers, after its latency: a request still waiting at the kill is
    answered (to a closed socket) a little later, and counts as answered before the rerun.
    """
    counts = server.request_counts(successful_only=True)
    while True:
        time.sleep(LATENCY_S * 5)
        now = server.request_counts(successful_only=True)
        if now == counts:
            return now
        counts = now


def cached_requests(cache_dir: Path) -> set[tuple[str, str, str]]:
    """Requests whose answers are in the call cache, as the server names them (model, messages, params)."""
    with sqlite3.connect(cache_dir / "calls.sqlite") as db:
        rows = [json.loads(r) for (r,) in db.execute("SELECT request FROM calls")]

    def canonical(value) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)

    return {(r["model"].split("/", 1)[1], canonical(r["messages"]), canonical(r["settings"])) for r in rows}


def assert_no_request_repeated_beyond_the_kill(server: ScriptedServer, before, stored, distinct: int) -> None:
    after = server.request_counts(successful_only=True)
    # Killed and resumed, it asked for exactly the requests an uninterrupted run asks for.
    assert len(after) == distinct
    stored_keys = [k for k in after if tuple(k) in stored]
    in_flight = [k for k in before if tuple(k) not in stored]
    # Answers stored before the kill are never asked for again.
    assert all(after[k] == 1 for k in stored_keys)
    # Only requests the killed client had in flight (answered, never stored) are asked again, once at most.
    assert len(in_flight) <= CONCURRENCY
    assert {k for k, n in after.items() if n > 1} <= set(in_flight)
    assert max(after.values()) <= 2


@pytest.mark.slow
@pytest.mark.parametrize("seed", KILL_SEEDS)
def test_a_killed_audit_resumes_to_the_uninterrupted_report(reference, scripted_server, tmp_path, seed):
    server = scripted_server(members(), latency_s=LATENCY_S)
    args = cli_args("audit", server, tmp_path)
    before, stored, rerun = run_killed_then_resumed(args, server, seed, tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    report = read_report(tmp_path / "out")
    assert report_values(report) == reference["audit"]
    # Calls the killed run made count as made, though the rerun found them in the cache.
    assert report.calls.made == report.calls.unique
    assert_no_request_repeated_beyond_the_kill(server, before, stored, reference["audit"]["unique"])


@pytest.mark.slow
@pytest.mark.parametrize("seed", KILL_SEEDS[:2])
def test_a_killed_run_resumes_to_the_uninterrupted_results(reference, scripted_server, tmp_path, seed):
    server = scripted_server(members(), latency_s=LATENCY_S)
    args = cli_args("run", server, tmp_path)
    before, stored, rerun = run_killed_then_resumed(args, server, seed, tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    results = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert results == reference["results"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["score"] == reference["score"] and summary["failed"] == 0
    assert_no_request_repeated_beyond_the_kill(server, before, stored, reference["run_distinct"])


# A member that is down


def test_a_run_with_a_member_down_reports_every_example_failed_and_exits_3(scripted_server, tmp_path):
    server = scripted_server(members(), down_models=["m3"])
    done = Cli.start(cli_args("run", server, tmp_path), tmp_path / "logs", backoff_s=0.01).wait()
    assert done.returncode == 3, done.stderr
    results = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in results] == [e.id for e in EXAMPLES]
    assert all(r["failed"] and r["score"] is None and "m3" in r["error"] for r in results)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["failed"] == len(EXAMPLES) and summary["score"] is None
    assert f"{len(EXAMPLES)} example(s) failed" in done.stdout


def test_an_audit_with_a_member_down_fails_with_the_members_error(arun, scripted_server, tmp_path):
    server = scripted_server(members(), down_models=["m3"])
    with pytest.raises(AuditError, match=r"every example failed .*m3: server after 7 attempt\(s\)"):
        audit(arun, server, tmp_path / "cache")


def test_the_audit_cli_with_a_member_down_exits_nonzero_naming_it(scripted_server, tmp_path):
    server = scripted_server(members(), down_models=["m3"])
    done = Cli.start(cli_args("audit", server, tmp_path), tmp_path / "logs", backoff_s=0.01).wait()
    assert done.returncode == 3  # a failed audit, not a usage error (2)
    assert "every example failed" in done.stderr and "m3" in done.stderr
    assert not (tmp_path / "out" / "report.json").exists()


def test_an_audit_leaves_out_the_examples_a_member_fails_on_and_exits_3(scripted_server, tmp_path):
    failing = [e.id for e in EXAMPLES[:2]]
    questions = [e.input for e in EXAMPLES[:2]]
    solve = arithmetic_solver(accuracy=0.4, seed=3)

    def flaky(messages, params):
        if any(q in str(m.get("content")) for m in messages for q in questions):
            raise RuntimeError("scripted outage on this question")
        return solve(messages, params)

    server = scripted_server({**members(), "m3": flaky})
    done = Cli.start(cli_args("audit", server, tmp_path), tmp_path / "logs", backoff_s=0.01).wait()
    assert done.returncode == 3, done.stderr
    report = read_report(tmp_path / "out")
    assert report.failed_examples == failing
    assert report.n_examples == len(EXAMPLES) - len(failing)
    assert "2 example(s) failed and were left out" in done.stdout
