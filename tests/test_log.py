"""The typed log: what runs, audits, studies and training runs write, read back as one `Log`.

Audits here are the hand-computed majority vote of tests/test_audit.py (three members, five questions) over real
HTTP to a scripted server; the contribution values themselves are tested there. Here: what the log holds, how
big it grows, how it reads while being written, and how old and new versions are told apart.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from colab_graphs.audit.run import play_audit
from colab_graphs.log import (
    LOG_FILE,
    LOG_VERSION,
    LogError,
    LogVersionError,
    RolloutRecord,
    find_kind,
    read_log,
    write_log,
)
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.runner import run_dataset
from colab_graphs.testing import ScriptedServer
from colab_graphs.trace import Call, Trace, Usage
from tests.conftest import cli_in_process
from tests.test_audit import DISTINCT_REQUESTS, PLAYERS, pool_of, vote_examples, vote_members

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server():
    with ScriptedServer(vote_members()) as s:
        yield s


def audit(
    server, out: Path, method: str = "exact", cache: Path | None = None, protocol: str = "majority_vote"
):
    client = ModelClient(CallCache(cache or out.parent / "cache"))
    spec = build_protocol(protocol, PLAYERS)
    examples = vote_examples()
    return play_audit(
        spec,
        pool_of(server, PLAYERS),
        examples,
        client=client,
        method=method,
        out=out,
        plots=False,
        dataset="vote",
        play_every_coalition=True,  # the log of every coalition's plays (not values from the answers)
    )


@pytest.fixture(scope="module")
def exact_audit(server, tmp_path_factory, arun):
    """The exact audit of the vote game, in its folder: (folder, report)."""
    out = tmp_path_factory.mktemp("log") / "exact"
    return out, arun(audit(server, out))


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / LOG_FILE).read_text().splitlines()]


def test_an_audit_log_records_each_distinct_call_once(exact_audit):
    out, report = exact_audit
    log = read_log(out)
    assert log.kind == "audit" and log.log_version == LOG_VERSION and log.complete
    assert len(log.calls) == report.calls.unique == DISTINCT_REQUESTS
    # 8 coalitions (the empty one included) and 3 solo runs, on 5 examples.
    assert len(log.plays) == (8 + 3) * 5
    assert log.summary["shapley"] == pytest.approx(report.shapley)


def test_the_log_grows_with_distinct_calls_not_with_coalitions(server, tmp_path, arun, exact_audit):
    exact, _ = exact_audit
    loo = tmp_path / "loo"
    arun(audit(server, loo, method="loo", cache=exact.parent / "cache"))
    calls = {
        name: [r for r in records(path) if r["type"] == "call"]
        for name, path in (("loo", loo), ("exact", exact))
    }
    assert len(calls["loo"]) == len(calls["exact"]) == DISTINCT_REQUESTS
    # a's reply to q2 is used by 5 plays of the exact audit (4 coalitions with a, a alone): written once.
    assert (exact / LOG_FILE).read_text().count("The answer is 9.") == 1
    plays = [r for r in records(exact) if r["type"] == "play"]
    assert max(len(json.dumps(p)) for p in plays) < 200  # a play refers to its calls; it holds no text


def test_a_play_reads_back_as_the_conversation_between_seats(exact_audit):
    log = read_log(exact_audit[0])
    play = log.play("[q2]", ["b", "c"], game="coalition")
    turns = log.turns(play)
    assert sorted((t.seat, t.member) for t in turns) == [("answer_b", "b"), ("answer_c", "c")]
    for t in turns:
        assert "[q2] Which number is it?" in t.messages[-1]["content"]
        assert t.completion == "The answer is 2."
        assert t.prompt_tokens > 0 and t.completion_tokens > 0
    assert play.answer == "2" and play.score == 1.0


def test_each_call_is_made_by_one_play_and_a_cache_hit_for_the_others(exact_audit):
    log = read_log(exact_audit[0])
    made = [t for p in log.plays for t in log.turns(p) if not t.cached]
    assert sorted(t.key for t in made) == sorted(c.key for c in log.calls.values())
    assert all(t.latency_s > 0 for t in made)
    assert all(t.latency_s == 0 for p in log.plays for t in log.turns(p) if t.cached)


def test_read_log_round_trips_through_write_log(exact_audit, tmp_path):
    log = read_log(exact_audit[0])
    write_log(log, tmp_path)
    shutil.copy(exact_audit[0] / "report.json", tmp_path / "report.json")
    again = read_log(tmp_path)
    assert again.header == log.header
    assert again.calls == log.calls and again.plays == log.plays and again.examples == log.examples
    assert again.summary == log.summary


def test_a_log_newer_than_this_version_is_refused_naming_both_versions(exact_audit, tmp_path):
    lines = (exact_audit[0] / LOG_FILE).read_text().splitlines()
    header = json.loads(lines[0]) | {"log_version": LOG_VERSION + 1}
    (tmp_path / LOG_FILE).write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(
        LogVersionError, match=rf"log version {LOG_VERSION + 1} .* versions 0 to {LOG_VERSION}"
    ):
        read_log(tmp_path)


def test_record_types_and_fields_added_later_are_skipped(exact_audit, tmp_path):
    text = (exact_audit[0] / LOG_FILE).read_text()
    extra = json.dumps({"type": "annotation", "note": "from a later version"})
    lines = text.splitlines()
    play = json.loads(next(line for line in lines if '"type":"play"' in line)) | {"judge": "later"}
    (tmp_path / LOG_FILE).write_text("\n".join([*lines, extra, json.dumps(play)]) + "\n")
    log = read_log(tmp_path)
    assert len(log.plays) == len(read_log(exact_audit[0]).plays)
    assert any(getattr(p, "judge", None) == "later" for p in log.plays)


def test_a_log_being_written_reads_up_to_its_last_whole_line(exact_audit, tmp_path):
    text = (exact_audit[0] / LOG_FILE).read_text()
    cut = text[: text.rindex('{"type":"play"') + 25]  # the last play half written
    (tmp_path / LOG_FILE).write_text(cut)
    log = read_log(tmp_path)
    assert log.torn and not log.complete
    assert len(log.plays) == len(read_log(exact_audit[0]).plays) - 1


def test_a_bad_line_inside_a_log_is_named_by_file_and_line(exact_audit, tmp_path):
    lines = (exact_audit[0] / LOG_FILE).read_text().splitlines()
    lines[3] = "{not json"
    (tmp_path / LOG_FILE).write_text("\n".join(lines) + "\n")
    with pytest.raises(LogError, match=rf"{LOG_FILE}:4: not a valid log record"):
        read_log(tmp_path)


def test_a_killed_audit_resumes_from_its_log_without_repeating_plays_or_calls(
    server, tmp_path, arun, exact_audit
):
    out = tmp_path / "audit"
    shutil.copytree(exact_audit[0], out)
    (out / "report.json").unlink()
    lines = (out / LOG_FILE).read_text().splitlines(keepends=True)
    (out / LOG_FILE).write_text("".join(lines[:-7]) + lines[-7][:30])  # killed mid-write, plays missing
    asked = len(server.requests)
    report = arun(audit(server, out, cache=exact_audit[0].parent / "cache"))
    log = read_log(out)
    assert len(server.requests) == asked and report.shapley == pytest.approx(exact_audit[1].shapley)
    assert len(log.plays) == (8 + 3) * 5 and not log.torn
    assert len(log.calls) == DISTINCT_REQUESTS


def test_plays_whose_call_line_was_lost_are_played_again_on_resume(server, tmp_path, arun, exact_audit):
    out = tmp_path / "audit"
    shutil.copytree(exact_audit[0], out)
    (out / "report.json").unlink()
    lines = (out / LOG_FILE).read_text().splitlines(keepends=True)
    del lines[next(i for i, line in enumerate(lines) if line.startswith('{"type":"call"'))]
    (out / LOG_FILE).write_text("".join(lines))
    arun(audit(server, out, cache=exact_audit[0].parent / "cache"))
    log = read_log(out)
    assert len(log.plays) == (8 + 3) * 5 and len(log.calls) == DISTINCT_REQUESTS


def test_a_run_logs_one_play_per_example_and_keeps_its_contract_files(server, tmp_path, arun):
    spec = build_protocol("majority_vote", PLAYERS)
    client = ModelClient(CallCache(tmp_path / "cache"))
    arun(run_dataset(spec, pool_of(server, PLAYERS), vote_examples(), client=client, out=tmp_path / "run"))
    log = read_log(tmp_path / "run")
    assert log.kind == "run" and log.complete and len(log.plays) == 5 and len(log.calls) == DISTINCT_REQUESTS
    play = log.play("[q1]", PLAYERS)
    assert play.output and play.answer == "1" and play.score == 1.0 and len(log.turns(play)) == 3
    results = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert all({"id", "answer", "score", "failed"} <= set(r) for r in results)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"protocol", "score", "n", "failed", "calls", "tokens", "cost_usd", "wall_s"} <= set(summary)
    assert (tmp_path / "run" / "traces.jsonl").exists()


def test_a_study_logs_its_settings_and_each_audit_its_plays(tmp_path):
    from tests.test_study import member_scripts, write_study

    with ScriptedServer(member_scripts()) as study_server:
        config = write_study(tmp_path, study_server, datasets=("d1",))
        out = ["--out", tmp_path / "out", "--cache-dir", tmp_path / "cache", "--no-plots"]
        done = cli_in_process("study", "--config", config, *out)
        assert done.returncode == 0, done.stderr
    log = read_log(tmp_path / "out")
    assert log.kind == "study" and log.complete
    folders = {s["folder"]: s["kind"] for s in log.header.settings}
    assert folders == {
        "audits/P1/majority_vote/d1": "audit",
        "audits/P2/majority_vote/d1": "audit",
        "solo/P1/d1": "solo",
        "solo/P2/d1": "solo",
    }
    for folder, kind in folders.items():
        child = read_log(tmp_path / "out" / folder)
        assert child.kind == "audit" and child.plays and child.calls
        assert child.complete == (kind == "audit")
        planned = (len(child.plan.coalitions) + len(child.plan.solo)) * child.plan.n_examples
        assert len(child.plays) == planned  # an audit's plan counts the solo plays its ledger is given


def test_a_study_plans_each_audit_with_the_solo_plays_it_is_given(tmp_path):
    """Before anything is played, a running study's audit logs say how many plays will come (for progress)."""
    from colab_graphs.study import load_study_config
    from colab_graphs.study.plan import build_plan
    from colab_graphs.study.run import _Ledgers
    from tests.test_study import member_scripts, write_study

    with ScriptedServer(member_scripts()) as study_server:
        plan = build_plan(load_study_config(write_study(tmp_path, study_server, datasets=("d1",))))
    _Ledgers(plan, tmp_path / "out", ModelClient(None))
    for setting in plan.settings:
        logged = read_log(tmp_path / "out" / setting.folder).plan
        assert logged.solo == plan.pools[setting.pool].names and logged.n_examples == 5
        assert len(logged.coalitions) == len(setting.coalitions)


def test_training_files_read_as_a_log(tmp_path):
    steps = [{"step": s, "loss": 0.1 * s, "system_reward": 0.5} for s in (1, 2, 3)]
    restarted = [{"step": s, "loss": 1.0, "system_reward": 0.25} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps + restarted))
    (tmp_path / "eval_before.json").write_text(
        json.dumps({"n": 4, "system": 0.5, "without_policy": 0.25, "loo": 0.25, "policy_solo": 0.0})
    )
    (tmp_path / "eval_after.json").write_text(
        json.dumps({"n": 4, "system": 0.75, "without_policy": 0.25, "loo": 0.5, "policy_solo": 0.25})
    )
    trace = Trace(example_id="e1", protocol="relay", calls=[
        Call(seat="helper", member="zoo", model="m", messages=[{"role": "user", "content": "2+2?"}], key="k1",
             completion="Think of 4.", usage=Usage(prompt_tokens=3, completion_tokens=3), cached=True),
        Call(seat="solver", member="policy", model="local/p", messages=[{"role": "user", "content": "2+2? Hint: 4"}],
             key="k2", completion="The answer is 4."),
    ])  # fmt: skip
    example = vote_examples()[0]
    rollout = RolloutRecord.from_trace(2, example, trace, 1.0, {"policy"}, credit=[0.5], policy_score=1.0)
    (tmp_path / "rollouts.jsonl").write_text(rollout.model_dump_json() + "\n")
    assert find_kind(tmp_path) == "train"
    log = read_log(tmp_path)
    assert [s.step for s in log.steps] == [1, 2] and log.steps[0].loss == 1.0  # the restarted run replaces
    assert log.evaluations["after"].system == 0.75 and log.evaluations["before"].loo == 0.25
    [turn_helper, turn_policy] = log.rollouts[0].turns
    assert not turn_helper.policy and turn_helper.credit is None and turn_helper.cached
    assert turn_policy.policy and turn_policy.credit == 0.5 and turn_policy.completion == "The answer is 4."


def test_a_folder_with_no_output_is_not_a_log(tmp_path):
    with pytest.raises(FileNotFoundError, match="no colab-graphs output"):
        read_log(tmp_path)
