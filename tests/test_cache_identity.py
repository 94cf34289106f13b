"""A cached reply is served only for the model that would have answered, through the CLI on real ARC records.

Two scripted servers both serve a model named `ada`: one picks the gold option of each ARC question, the other a
wrong one. Before cache identity, a second pool pointing `openai/ada` at the wrong server reported score 1.000
with 0 calls made; now each endpoint, each set of deployments, each `cache_namespace` and each set of local
weights has entries of its own, and `colab-graphs cache list / drop` show and remove them per member.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from colab_graphs.cli.app import _register_optional_commands, app
from colab_graphs.models.cache import CallCache
from colab_graphs.pool import Pool
from colab_graphs.testing import Member, ScriptedServer, answer_key

pytestmark = pytest.mark.integration

ARC = Path(__file__).parent / "fixtures" / "moco" / "arc_challenge.json"
N = 4


def arc_records() -> list[dict[str, Any]]:
    return json.loads(ARC.read_text())["test"][:N]


def arc_member(right: bool) -> Member:
    """Replies as a chat model does, committing to the gold option (right) or the next one (wrong)."""
    replies = {}
    for record in arc_records():
        letters = list(record["choices"])
        gold = record["answer"]
        pick = gold if right else letters[(letters.index(gold) + 1) % len(letters)]
        replies[record["question"][:60]] = f"Let me weigh each option.\n\nThe correct option is ({pick})."
    return Member(answer_key(replies))


@pytest.fixture
def servers():
    with (
        ScriptedServer({"ada": arc_member(True)}) as right,
        ScriptedServer({"ada": arc_member(False)}) as wrong,
    ):
        yield right, wrong


def pool_file(path: Path, member: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"models": {"ada": {"model": "openai/ada", "api_key": "sk-test", **member}}}))
    return path


def run(pool: Path, cache: Path, out: Path) -> dict[str, Any]:
    args = ["run", "--protocol", "solo", "--pool", pool, "--data", ARC, "--limit", N, "--cache-dir", cache,
            "--out", out]  # fmt: skip
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text())


def invoke(*args: Any) -> Any:
    if not any(c.name == "audit" for c in app.registered_commands):
        _register_optional_commands()  # what `main()` does before parsing: audit, study, view
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_another_server_serving_the_same_model_name_is_called_not_served(servers, tmp_path) -> None:
    right, wrong = servers
    first = run(
        pool_file(tmp_path / "right.json", {"api_base": right.base_url}), tmp_path / "c", tmp_path / "1"
    )
    second = run(
        pool_file(tmp_path / "wrong.json", {"api_base": wrong.base_url}), tmp_path / "c", tmp_path / "2"
    )
    assert (first["score"], first["calls"]["made"]) == (1.0, N)
    assert (second["score"], second["calls"]) == (0.0, {"made": N, "cached": 0, "failed": 0})
    assert sum(wrong.request_counts(successful_only=True).values()) == N


def test_replicas_over_deployments_share_entries(servers, tmp_path) -> None:
    right, _ = servers
    with ScriptedServer({"ada": arc_member(True)}) as replica:
        bases = [right.base_url, replica.base_url]
        one = pool_file(tmp_path / "one.json", {"deployments": [{"api_base": b} for b in bases]})
        other = pool_file(
            tmp_path / "other.json",
            {"deployments": [{"api_base": replica.base_url, "weight": 3}, {"api_base": right.base_url}]},
        )
        assert run(one, tmp_path / "c", tmp_path / "1")["calls"]["made"] == N
        again = run(other, tmp_path / "c", tmp_path / "2")
    assert (again["score"], again["calls"]) == (1.0, {"made": 0, "cached": N, "failed": 0})


def test_bumping_cache_namespace_makes_the_calls_again(servers, tmp_path) -> None:
    """A policy retrained and served again under its name, at its address: the old replies stay the old
    model's until the pool says the model changed."""
    right, _ = servers
    v1 = pool_file(tmp_path / "v1.json", {"api_base": right.base_url, "cache_namespace": "ada-v1"})
    v2 = pool_file(tmp_path / "v2.json", {"api_base": right.base_url, "cache_namespace": "ada-v2"})
    assert run(v1, tmp_path / "c", tmp_path / "1")["score"] == 1.0
    right.members["ada"] = arc_member(False)  # retrained: same name, same server, other answers
    assert run(v1, tmp_path / "c", tmp_path / "2")["calls"]["cached"] == N  # as declared: the same model
    bumped = run(v2, tmp_path / "c", tmp_path / "3")
    assert (bumped["score"], bumped["calls"]["made"]) == (0.0, N)


def test_cache_list_shows_and_drop_removes_a_members_entries(servers, tmp_path) -> None:
    right, wrong = servers
    run(pool_file(tmp_path / "right.json", {"api_base": right.base_url}), tmp_path / "c", tmp_path / "1")
    run(pool_file(tmp_path / "wrong.json", {"api_base": wrong.base_url}), tmp_path / "c", tmp_path / "2")
    listed = invoke("cache", "list", "--cache-dir", tmp_path / "c", "--json")
    rows = json.loads(listed.output)
    assert {(r["member"], r["model"], r["entries"]) for r in rows} == {("ada", "openai/ada", N)}
    assert sorted(r["identity"] for r in rows) == sorted(f"endpoint:{s.base_url}" for s in (right, wrong))
    table = invoke("cache", "list", "--cache-dir", tmp_path / "c")
    assert table.exit_code == 0 and "ada" in table.output and "endpoint:" in table.output

    dropped = invoke("cache", "drop", "--member", "ada", "--identity", f"endpoint:{wrong.base_url}",
                     "--cache-dir", tmp_path / "c", "--yes")  # fmt: skip
    assert dropped.exit_code == 0 and f"deleted {N} entries" in dropped.output
    assert [r["identity"] for r in CallCache(tmp_path / "c").entries()] == [f"endpoint:{right.base_url}"]
    assert invoke("cache", "drop", "--member", "ada", "--cache-dir", tmp_path / "c", "-y").exit_code == 0
    again = run(
        pool_file(tmp_path / "right.json", {"api_base": right.base_url}), tmp_path / "c", tmp_path / "3"
    )
    assert again["calls"]["made"] == N


def test_a_cache_written_before_identity_is_not_served(servers, tmp_path, caplog) -> None:
    """Its entries do not say which endpoint answered: they are dropped, with a warning that says why."""
    right, _ = servers
    (tmp_path / "c").mkdir()
    with sqlite3.connect(tmp_path / "c" / "calls.sqlite") as old:
        old.execute(
            "CREATE TABLE calls (key TEXT PRIMARY KEY, model TEXT, created REAL, request TEXT, response TEXT)"
        )
        old.executemany(
            "INSERT INTO calls VALUES (?, 'openai/ada', 0, '{}', ?)",
            [(f"k{i}", json.dumps({"text": "The correct option is (A)."})) for i in range(3)],
        )
    with caplog.at_level(logging.WARNING, logger="colab_graphs"):
        summary = run(
            pool_file(tmp_path / "p.json", {"api_base": right.base_url}), tmp_path / "c", tmp_path / "o"
        )
    assert "dropped 3 entries written by an older colab-graphs" in caplog.text
    assert summary["calls"]["made"] == N and summary["score"] == 1.0


def test_identity_holds_the_endpoint_without_its_secrets() -> None:
    from colab_graphs.models.identity import cache_identity
    from colab_graphs.pool import Member

    # (built directly: a pool file with credentials in a URL is refused at load, they cannot be sent)
    member = Member(
        name="a",
        settings={
            "model": "openai/a",
            "api_base": "HTTPS://user:pw-0123456789@Host.Example:443/v1/?key=k-0123456789",
        },
    )
    assert cache_identity(member) == "endpoint:https://host.example/v1"
    hosted = Pool.from_dict({"a": {"model": "anthropic/claude-x", "api_key": "k"}})["a"]
    assert cache_identity(hosted) == "provider:anthropic"


def test_a_zoo_model_is_known_by_its_pinned_source_without_materialising_it() -> None:
    from colab_graphs.local.weights import weights_identity

    ident = weights_identity("local/smollm2-135m")
    assert ident.startswith("zoo:smollm2-135m:") and ident.split(":")[2] != "built"


def shared_tiny_members(tiny_members) -> dict[str, Path]:
    """Two model folders of one architecture, other weights: the weight protocols' set (made once a session)."""
    return tiny_members(["m0", "m1", "m2"], 100)


def test_a_model_folder_saved_again_is_another_model(tiny_members, tmp_path) -> None:
    """A retrained policy saved to the same folder must not be served the old policy's replies; a copy of the
    same weights elsewhere is the same model."""
    from colab_graphs.local.weights import weights_identity

    source = shared_tiny_members(tiny_members)
    folder = tmp_path / "policy"
    shutil.copytree(source["m0"], folder)
    copy = tmp_path / "copy"
    shutil.copytree(source["m0"], copy)
    before = weights_identity(str(folder))
    assert weights_identity(str(copy)) == before
    for weights in source["m1"].glob("*.safetensors"):  # the retrained weights, saved over the old ones
        shutil.copy(weights, folder / weights.name)
    assert weights_identity(str(folder)) != before


def test_a_model_served_from_memory_changes_identity_when_its_weights_are_swapped() -> None:
    from colab_graphs.local import engines
    from colab_graphs.local.weights import weights_identity

    class _Stub:
        pass

    try:
        engines.set_local_model("policy-under-test", _Stub(), _Stub())
        first = weights_identity("local/policy-under-test")
        engines.set_local_model("policy-under-test", _Stub(), _Stub())
        assert (
            first.startswith("memory:policy-under-test:") and weights_identity("policy-under-test") != first
        )
    finally:
        engines.unload("policy-under-test")


def test_a_local_policy_saved_again_to_its_folder_is_called_again_not_served(tiny_members, tmp_path) -> None:
    """Through the public API: the same local folder and request hit the cache until the folder's weights change."""
    import colab_graphs
    from colab_graphs.local import engines

    source = shared_tiny_members(tiny_members)
    folder = tmp_path / "policy"
    shutil.copytree(source["m0"], folder)
    pool = {"policy": {"model": f"local/{folder}", "max_tokens": 3, "temperature": 0}}
    data = [{"id": "q1", "input": "What is 2 + 2?", "answer": "4"}]

    def calls() -> dict[str, int]:
        result = colab_graphs.run("solo", pool, data, cache_dir=tmp_path / "cache")
        engines.unload()  # as a new process would: the next run loads the folder as it is then
        return result.summary["calls"]

    assert calls()["made"] == 1
    assert calls() == {"made": 0, "cached": 1, "failed": 0}
    for weights in source["m1"].glob("*.safetensors"):  # retrained, saved over the old weights
        shutil.copy(weights, folder / weights.name)
    assert calls()["made"] == 1
