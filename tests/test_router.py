"""Members over several deployments: pool `deployments:` / `router:`, calls through LiteLLM's Router, real HTTP.

Two scripted servers serve the same members. An audit of a majority vote whose values are known by hand (the
game below) runs with every member spread over both servers; whichever server answers, and whether one of them
is down from the start or killed mid-audit, the values, the failures (none) and the calls made (= distinct
requests) are the same, because the cache key is the member's request, not the deployment.

    question  gold   a   b   c  | v(a) v(b) v(c) v(ab) v(ac) v(bc) v(abc)
    [q1]        1    1   1   2  |  1    1    0    1     1     1     1
    [q2]        2    9   2   2  |  0    1    1    0     0     1     1      (ties go to pool order: a, b, c)
    [q3]        3    3   7   8  |  1    0    0    1     1     0     1
    [q4]        8    8   1   2  |  1    0    0    1     1     0     1
    mean                        | .75  .5   .25  .75   .75   .5    1
LOO: a = 1 - .5 = .5; b = 1 - .75 = .25; c = 1 - .75 = .25.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from conftest import cli_in_process

from colab_graphs.audit.run import play_audit
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool, PoolError
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.tasks.example import Example
from colab_graphs.testing import ScriptedServer, answer_key

pytestmark = pytest.mark.integration

PLAYERS = ["a", "b", "c"]
GOLD = {"[q1]": "1", "[q2]": "2", "[q3]": "3", "[q4]": "8"}
REPLIES = {
    "a": {"[q1]": "1", "[q2]": "9", "[q3]": "3", "[q4]": "8"},
    "b": {"[q1]": "1", "[q2]": "2", "[q3]": "7", "[q4]": "1"},
    "c": {"[q1]": "2", "[q2]": "2", "[q3]": "8", "[q4]": "2"},
}
HAND_VALUES = {("a", "b", "c"): 1.0, ("b", "c"): 0.5, ("a", "c"): 0.75, ("a", "b"): 0.75}
HAND_LOO = {"a": 0.5, "b": 0.25, "c": 0.25}
HAND_INDIVIDUAL = {"a": 0.75, "b": 0.5, "c": 0.25}
DISTINCT_REQUESTS = len(PLAYERS) * len(GOLD)
SECRET = "sk-SECRET-replica-b-0123456789"


def members() -> dict:
    return {
        m: answer_key({tag: f"The answer is {reply}." for tag, reply in replies.items()})
        for m, replies in REPLIES.items()
    }


def examples() -> list[Example]:
    return [Example(id=tag, input=f"{tag} Which number is it?", answer=gold) for tag, gold in GOLD.items()]


def dead_base_url() -> str:
    """An api_base where nothing listens (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def replicated_pool(bases: list[str], weights: list[int] | None = None, **router) -> Pool:
    weights = weights or [1] * len(bases)
    return Pool.from_dict(
        {
            m: {
                "model": f"openai/{m}",
                "api_key": "sk-test",
                "temperature": 0,
                "deployments": [
                    {"api_base": base, **({"api_key": SECRET} if i == 1 else {})}
                    for i, base in enumerate(bases)
                ],
                **({"router": router} if router else {}),
            }
            for m in PLAYERS
        }
    )


def audit(arun, pool: Pool, cache_dir: Path, out: Path | None = None):
    client = ModelClient(CallCache(cache_dir), max_concurrency=4, backoff_s=0.01)
    spec = build_protocol("majority_vote", PLAYERS)
    # Every coalition played (not valued from the answers): the plays are what the replicas serve.
    return arun(
        play_audit(spec, pool, examples(), client=client, method="loo", out=out, play_every_coalition=True)
    )


def assert_hand_values(report) -> None:
    assert {tuple(c.members): c.value for c in report.coalitions} == pytest.approx(HAND_VALUES)
    assert report.loo == pytest.approx(HAND_LOO)
    assert report.individual == pytest.approx(HAND_INDIVIDUAL)
    assert report.failed_examples == []
    assert report.calls.made == report.calls.unique == DISTINCT_REQUESTS
    assert report.calls.failed == 0


def served(server: ScriptedServer) -> int:
    return sum(server.request_counts(successful_only=True).values())


# Pool file


def test_pool_file_reads_deployments_and_router_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("CG_REPLICA_KEY", SECRET)
    path = tmp_path / "pool.yaml"
    path.write_text(
        "models:\n"
        "  qwen:\n"
        "    model: hosted_vllm/qwen\n"
        "    temperature: 0\n"
        "    deployments:\n"
        "      - {api_base: 'http://10.0.0.1:8000/v1'}\n"
        "      - {api_base: 'http://10.0.0.2:8000/v1', api_key: '${CG_REPLICA_KEY}', rpm: 600}\n"
        "    router: {routing_strategy: least-busy, cooldown_time: 30}\n"
    )
    qwen = Pool.from_yaml(path)["qwen"]
    assert qwen.settings == {"model": "hosted_vllm/qwen", "temperature": 0}
    assert [d["api_base"] for d in qwen.deployments] == ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    assert qwen.deployments[1]["api_key"] == SECRET
    assert qwen.router == {"routing_strategy": "least-busy", "cooldown_time": 30}
    assert [d["litellm_params"]["api_base"] for d in qwen.router_model_list()] == [
        "http://10.0.0.1:8000/v1",
        "http://10.0.0.2:8000/v1",
    ]
    assert all("temperature" not in d["litellm_params"] for d in qwen.router_model_list())


def test_public_pool_keeps_deployments_without_their_keys(tmp_path):
    pool = replicated_pool(["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"])
    public = json.dumps(pool.to_public_dict())
    assert "10.0.0.2" in public and SECRET not in public


@pytest.mark.parametrize(
    ("member", "named"),
    [
        ("{model: openai/q, deployments: [{api_base: 'http://h/v1', temperature: 0.7}]}", "temperature"),
        ("{model: openai/q, deployments: [{api_base: 'http://h/v1'}, {api_bse: 'http://g/v1'}]}", "api_bse"),
        ("{model: openai/q, deployments: []}", "deployments"),
        ("{model: openai/q, router: {num_retries: 2}}", "router"),
        ("{model: openai/q, deployments: [{api_base: 'http://h/v1'}], router: {cooldown: 1}}", "cooldown"),
    ],
)
def test_a_bad_deployment_or_router_setting_names_the_file_the_member_and_the_key(tmp_path, member, named):
    path = tmp_path / "pool.yaml"
    path.write_text(f"models:\n  qwen: {member}\n")
    with pytest.raises(PoolError) as err:
        Pool.from_yaml(path)
    message = str(err.value)
    assert str(path) in message and "'qwen'" in message and named in message


def test_a_deployment_may_not_change_what_shapes_the_answer(tmp_path):
    with pytest.raises(PoolError, match=r"deployments\[2\] sets seed.*belong to the member"):
        Pool.from_dict({"q": {"model": "openai/q", "deployments": [{"api_base": "x"}, {"seed": 1}]}})


# Calls over real HTTP


def test_an_audit_over_two_replicas_spreads_the_load_and_keeps_the_hand_values(arun, tmp_path):
    with ScriptedServer(members()) as one, ScriptedServer(members()) as two:
        report = audit(arun, replicated_pool([one.base_url, two.base_url]), tmp_path / "cache")
        assert_hand_values(report)
        assert served(one) > 0 and served(two) > 0
        assert served(one) + served(two) == DISTINCT_REQUESTS


def test_a_replica_down_from_the_start_changes_no_value(arun, tmp_path):
    with ScriptedServer(members()) as live:
        report = audit(arun, replicated_pool([dead_base_url(), live.base_url]), tmp_path / "cache")
        assert_hand_values(report)
        assert served(live) == DISTINCT_REQUESTS


def test_a_replica_killed_mid_audit_changes_no_value(arun, tmp_path):
    # Each reply takes 50 ms, so the audit is still running when the second server stops after its 3rd reply;
    # it carries 9 in 10 of the load until then, so that it has 3 replies to give.
    with ScriptedServer(members(), latency_s=0.05) as one, ScriptedServer(members(), latency_s=0.05) as two:

        def kill_after_three() -> None:
            deadline = time.time() + 30
            while served(two) < 3 and time.time() < deadline:
                time.sleep(0.002)
            two.stop()

        killer = threading.Thread(target=kill_after_three, daemon=True)
        killer.start()
        report = audit(arun, replicated_pool([one.base_url, two.base_url], [1, 9]), tmp_path / "cache")
        killer.join()
        assert_hand_values(report)
        assert 3 <= served(two) < DISTINCT_REQUESTS
        assert served(one) + served(two) >= DISTINCT_REQUESTS


def test_the_cache_key_is_the_members_request_over_its_deployments_whichever_answers(arun, tmp_path):
    with ScriptedServer(members()) as one, ScriptedServer(members()) as two:
        audit(arun, replicated_pool([one.base_url, two.base_url]), tmp_path / "cache")
        one.reset()
        two.reset()
        # The same replicas listed the other way round, weighted otherwise: the entries are theirs.
        report = audit(arun, replicated_pool([two.base_url, one.base_url], [9, 1]), tmp_path / "cache")
        assert {tuple(c.members): c.value for c in report.coalitions} == pytest.approx(HAND_VALUES)
        assert served(one) == served(two) == 0


def test_a_member_over_other_deployments_does_not_reuse_a_plain_members_entries(arun, tmp_path):
    with ScriptedServer(members()) as one, ScriptedServer(members()) as two:
        plain = Pool.from_dict(
            {m: {"model": f"openai/{m}", "api_key": "sk-test", "temperature": 0, "api_base": one.base_url}
             for m in PLAYERS}
        )  # fmt: skip
        audit(arun, plain, tmp_path / "cache")
        one.reset()
        report = audit(arun, replicated_pool([two.base_url, one.base_url]), tmp_path / "cache")
        assert_hand_values(report)
        assert served(one) + served(two) == DISTINCT_REQUESTS


def test_a_deployments_key_reaches_no_cache_trace_or_report(arun, tmp_path):
    with ScriptedServer(members()) as one, ScriptedServer(members()) as two:
        audit(arun, replicated_pool([one.base_url, two.base_url]), tmp_path / "cache", tmp_path / "out")
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "report.json" for p in written)
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path


def test_cli_audit_with_a_replica_down_gives_the_hand_values(tmp_path):
    with ScriptedServer(members()) as live:
        pool = tmp_path / "pool.yaml"
        pool.write_text(
            "models:\n"
            + "".join(
                f"  {m}:\n    model: openai/{m}\n    api_key: sk-test\n    temperature: 0\n"
                f"    deployments:\n      - {{api_base: '{dead_base_url()}'}}\n      - {{api_base: '{live.base_url}'}}\n"
                "    router: {num_retries: 4, cooldown_time: 30}\n"
                for m in PLAYERS
            )
        )
        data = tmp_path / "data.jsonl"
        data.write_text("".join(json.dumps(e.model_dump()) + "\n" for e in examples()))
        out = ["--cache-dir", tmp_path / "cache", "--out", tmp_path / "out", "--no-plots"]
        done = cli_in_process("audit", "--protocol", "majority_vote", "--pool", pool, "--data", data, *out)
        assert done.returncode == 0, done.stderr
        report = json.loads((tmp_path / "out" / "report.json").read_text())
        assert report["loo"] == pytest.approx(HAND_LOO)
        assert report["calls"]["made"] == report["calls"]["unique"] == DISTINCT_REQUESTS
        assert served(live) == DISTINCT_REQUESTS
