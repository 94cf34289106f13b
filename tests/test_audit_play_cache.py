"""The play cache (`colab_graphs.audit.play_cache`): a rerun from a full call cache replays its plays.

Every audit here is real: scripted OpenAI-compatible members over HTTP on MoCo's ARC-Challenge and GSM8K
records, replying as real models do (options in prose, "#### 112", "\\boxed{}", some abstaining, right and
wrong). That a play was replayed rather than played is seen in the log of the rerun: after the first run, each
stored play's line is given a mark (a field of its own, the entry sealed again as the cache seals it), which
only a replayed play carries into the new log; a play that ran again has none.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest
from conftest import cli_in_process
from realistic_team import MEMBERS, records, team

from colab_graphs.audit.play_cache import _sealed
from colab_graphs.audit.run import play_audit
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol

WHEN = {"created_at", "wall_s", "version"}
SPENT = {"calls", "tokens", "usage", "cost_usd", "cost_saved_usd", "per_coalition"}
SECRET = "sk-play-cache-secret-4242"
MARK = '"marked_by_test":1,'


@pytest.fixture
def moco(scripted_server):
    examples = records(limit=3)
    server = scripted_server(team(examples, MEMBERS, [0.8, 0.6, 0.45]))
    return server, examples


def values(report_or_path) -> dict:
    data = (
        json.loads(Path(report_or_path).read_text())
        if isinstance(report_or_path, Path)
        else report_or_path.model_dump(mode="json")
    )
    return {k: v for k, v in data.items() if k not in WHEN | SPENT}


def of(entry: str) -> str | None:
    """The example of a stored play (None: an entry of another kind)."""
    data = json.loads(entry[32:])
    return json.loads(data["line"] + "[]}")["example"] if isinstance(data, dict) else None


def mark_stored_plays(cache_dir: Path) -> int:
    """Give every stored play's line the mark; returns how many."""
    with sqlite3.connect(cache_dir / "calls.sqlite") as conn:
        rows = conn.execute("SELECT key, entry FROM plays").fetchall()
        marked = 0
        for key, entry in rows:
            data = json.loads(entry[32:])
            if not isinstance(data, dict):
                continue  # (an answers column, or bootstrap intervals)
            data["line"] = data["line"].replace('{"type":"play",', '{"type":"play",' + MARK, 1)
            sealed = _sealed(json.dumps(data, separators=(",", ":"), ensure_ascii=False))
            conn.execute("UPDATE plays SET entry = ? WHERE key = ?", (sealed, key))
            marked += 1
    return marked


def marked_plays(out: Path) -> tuple[int, int]:
    """(plays in the log that carry the mark, plays in the log)."""
    lines = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    plays = [line for line in lines if line.get("type") == "play"]
    return sum("marked_by_test" in p for p in plays), len(plays)


def test_a_cli_audit_run_twice_replays_its_plays_sends_no_request_and_reports_the_same_values(moco, tmp_path):
    server, examples = moco
    data = tmp_path / "data.jsonl"
    rows = [{"id": e.id, "input": e.input, "answer": e.answer, **e.fields} for e in examples]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "models:\n"
        + "".join(
            f"  {m}: {{model: openai/{m}, api_base: '{server.base_url}', api_key: {SECRET}}}\n"
            for m in MEMBERS
        )
    )
    cache = tmp_path / "cache"
    argv = ["audit", "--protocol", "majority_vote", "--method", "exact", "--pool", pool, "--data", data]
    argv += ["--cache-dir", cache, "--no-plots"]
    first = cli_in_process(*argv, "--out", tmp_path / "first")
    assert first.returncode == 0, first.stdout + first.stderr
    sent = sum(server.request_counts().values())
    report = json.loads((tmp_path / "first" / "report.json").read_text())
    assert sent == report["calls"]["made"] > 0
    plays = len(examples) * (2**0 + len(MEMBERS) + len(MEMBERS))  # grand, leave-one-out, each member alone
    assert mark_stored_plays(cache) == plays

    again = cli_in_process(*argv, "--out", tmp_path / "again")
    assert again.returncode == 0, again.stdout + again.stderr
    assert sum(server.request_counts().values()) == sent  # no request
    assert values(tmp_path / "again" / "report.json") == values(tmp_path / "first" / "report.json")
    rerun = json.loads((tmp_path / "again" / "report.json").read_text())
    assert rerun["calls"]["made"] == 0 and rerun["calls"]["cached"] == sum(
        report["calls"][k] for k in ("made", "cached")
    )
    assert marked_plays(tmp_path / "again") == (plays, plays)  # every play replayed
    # The secret of the pool reached neither the play cache nor the call cache (nor their journal).
    for path in cache.iterdir():
        assert SECRET.encode() not in path.read_bytes(), path


def audit(arun, spec, pool, examples, cache_dir: Path, out: Path, **options):
    client = ModelClient(CallCache(cache_dir), max_concurrency=4, backoff_s=0.01)
    return arun(
        play_audit(spec, pool, examples, client=client, method="exact", out=out, plots=False, **options)
    )


def pool_of(server, **settings) -> Pool:
    return Pool.from_dict(
        {
            m: {"model": f"openai/{m}", "api_base": server.base_url, "api_key": "sk-t", **settings}
            for m in MEMBERS
        }
    )


@pytest.mark.parametrize(
    "change",
    ["temperature", "prompt template", "scorer", "protocol params", "calls dropped from the call cache"],
)
def test_whatever_could_change_a_play_plays_it_again(arun, moco, tmp_path, change):
    server, examples = moco
    spec, pool = build_protocol("majority_vote", MEMBERS), pool_of(server)
    first = audit(arun, spec, pool, examples, tmp_path / "cache", tmp_path / "first")
    assert mark_stored_plays(tmp_path / "cache") > 0
    sent = sum(server.request_counts().values())
    options = {}
    if change == "temperature":
        pool = pool_of(server, temperature=0.7)
    elif change == "prompt template":
        spec = build_protocol("majority_vote", MEMBERS, prompt="Answer the question below.\n\n{input}")
    elif change == "scorer":
        options["scorer"] = "exact"
    elif change == "protocol params":
        spec = build_protocol("majority_vote", MEMBERS, samples=2)
    else:
        CallCache(tmp_path / "cache").drop(member="b")
    rerun = audit(arun, spec, pool, examples, tmp_path / "cache", tmp_path / "rerun", **options)
    marked, plays = marked_plays(tmp_path / "rerun")
    assert plays > 0 and marked == 0
    made = sum(server.request_counts().values()) - sent
    assert made == rerun.calls.made
    assert made > 0  # (the scorer's task also words the prompt: its calls are new too)
    if change == "calls dropped from the call cache":
        assert values(rerun) == values(first)  # the same replies made again: the same audit
    # The plays that ran are stored anew: a third run replays them all.
    third = audit(arun, spec, pool, examples, tmp_path / "cache", tmp_path / "third", **options)
    assert mark_stored_plays(tmp_path / "cache") > 0
    fourth = audit(arun, spec, pool, examples, tmp_path / "cache", tmp_path / "fourth", **options)
    assert marked_plays(tmp_path / "fourth")[0] == marked_plays(tmp_path / "fourth")[1] > 0
    assert values(fourth) == values(third) == values(rerun)


@pytest.mark.parametrize("damage", ["cut short", "a score altered", "not JSON"])
def test_a_damaged_play_cache_entry_is_played_again_never_replayed(arun, moco, tmp_path, caplog, damage):
    server, examples = moco
    spec, pool = build_protocol("majority_vote", MEMBERS), pool_of(server)
    first = audit(arun, spec, pool, examples, tmp_path / "cache", tmp_path / "first")
    victim = examples[-1].id  # a GSM8K record
    assert mark_stored_plays(tmp_path / "cache") > 0
    with sqlite3.connect(tmp_path / "cache" / "calls.sqlite") as conn:
        key, entry = next((k, e) for k, e in conn.execute("SELECT key, entry FROM plays") if of(e) == victim)
        if damage == "cut short":
            entry = entry[: len(entry) // 2]
        elif damage == "a score altered":  # the text changed, its digest not: as a bad disk or a hand would
            entry = entry.replace('"score":1.0', '"score":0.0').replace('"score":0.0', '"score":1.0', 1)
        else:
            entry = entry[:32] + "\x00" + entry[33:]
        conn.execute("UPDATE plays SET entry = ? WHERE key = ?", (entry, key))
    sent = sum(server.request_counts().values())
    with caplog.at_level(logging.WARNING, logger="colab_graphs"):
        rerun = audit(arun, spec, pool, examples, tmp_path / "cache", tmp_path / "rerun")
    assert any("play cache" in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records)
    assert sum(server.request_counts().values()) == sent  # its calls are still in the call cache
    assert values(rerun) == values(first)  # never a wrong score
    lines = [json.loads(x) for x in (tmp_path / "rerun" / "log.jsonl").read_text().splitlines()]
    plays = [p for p in lines if p.get("type") == "play"]
    # The damaged entry's example was played again (all its plays: an example is replayed whole or not at all),
    # every other example replayed.
    assert {p["example"] for p in plays if "marked_by_test" not in p} == {victim}
    assert all("marked_by_test" in p for p in plays if p["example"] != victim)


def test_no_call_cache_no_play_cache(arun, moco, tmp_path):
    server, examples = moco
    spec, pool = build_protocol("majority_vote", MEMBERS), pool_of(server)
    audit(arun, spec, pool, examples, tmp_path / "cache", tmp_path / "first")
    assert mark_stored_plays(tmp_path / "cache") > 0
    sent = sum(server.request_counts().values())
    client = ModelClient(None, max_concurrency=4, backoff_s=0.01)  # what --no-cache gives
    rerun = arun(
        play_audit(spec, pool, examples, client=client, method="exact", out=tmp_path / "rerun", plots=False)
    )
    assert sum(server.request_counts().values()) - sent == rerun.calls.made > 0
    assert marked_plays(tmp_path / "rerun")[0] == 0


def test_cache_clear_empties_the_play_cache_too(arun, moco, tmp_path):
    server, examples = moco
    spec, pool = build_protocol("majority_vote", MEMBERS), pool_of(server)
    audit(arun, spec, pool, examples, tmp_path / "cache", tmp_path / "first")
    assert mark_stored_plays(tmp_path / "cache") > 0
    cleared = cli_in_process("cache", "clear", "--yes", "--cache-dir", tmp_path / "cache")
    assert cleared.returncode == 0, cleared.stdout
    with sqlite3.connect(tmp_path / "cache" / "calls.sqlite") as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not tables & {"plays", "play_calls"}
    sent = sum(server.request_counts().values())
    rerun = audit(arun, spec, pool, examples, tmp_path / "cache", tmp_path / "rerun")
    assert sum(server.request_counts().values()) - sent == rerun.calls.made > 0
    assert marked_plays(tmp_path / "rerun")[0] == 0


def test_a_call_cache_past_its_in_memory_copy_still_replays_and_a_dropped_call_plays_its_example(
    arun, moco, tmp_path
):
    """A big audit's call cache holds more calls than it keeps in memory (`CallCache.memory_entries`): the
    rerun still replays every play from the play cache (0 requests, the same values), and a call dropped with
    `cache drop` still plays its examples again (issue 43, item 3: the regime of a 300,000-call audit)."""
    server, examples = moco
    spec, pool = build_protocol("majority_vote", MEMBERS), pool_of(server)
    cache = tmp_path / "cache"

    def run(out: str):
        client = ModelClient(CallCache(cache, memory_entries=2), max_concurrency=4, backoff_s=0.01)
        return arun(
            play_audit(spec, pool, examples, client=client, method="exact", out=tmp_path / out, plots=False)
        )

    first = run("first")
    assert first.calls.made > CallCache(cache, memory_entries=2).memory_entries  # past the copy in memory
    plays = mark_stored_plays(cache)
    assert plays > 0
    sent = sum(server.request_counts().values())
    rerun = run("rerun")
    assert sum(server.request_counts().values()) == sent and rerun.calls.made == 0
    assert values(rerun) == values(first)
    assert marked_plays(tmp_path / "rerun") == (plays, plays)  # every play replayed

    assert CallCache(cache).drop(member="b") > 0
    dropped = run("dropped")
    made = sum(server.request_counts().values()) - sent
    assert made == dropped.calls.made > 0  # b's calls made again
    assert values(dropped) == values(first)
    # Every example has a play with one of b's calls (the grand coalition's): each was played, none replayed.
    assert marked_plays(tmp_path / "dropped")[0] == 0
    assert mark_stored_plays(cache) > 0  # stored anew: a fourth run replays them all
    fourth = run("fourth")
    assert sum(server.request_counts().values()) - sent == made
    assert marked_plays(tmp_path / "fourth")[0] == marked_plays(tmp_path / "fourth")[1] > 0
    assert values(fourth) == values(first)


def test_a_rerun_that_replays_no_play_although_every_call_is_cached_says_why_once(
    arun, moco, tmp_path, caplog, monkeypatch
):
    """The package's code changed between a first run and its rerun (an upgrade, an edit, a merge): every call
    is still in the call cache, every play misses (their keys hold the code's digest). The rerun says so, once;
    a first run and a rerun that replays its plays say nothing."""
    from colab_graphs.audit import play_cache

    server, examples = moco
    spec, pool = build_protocol("majority_vote", MEMBERS), pool_of(server)

    def notes(out: str):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="colab_graphs"):
            report = audit(arun, spec, pool, examples, tmp_path / "cache", tmp_path / out)
        said = [r.getMessage() for r in caplog.records if "none of its" in r.getMessage()]
        return report, said

    first, said = notes("first")
    assert first.calls.made > 0 and said == []
    replayed, said = notes("replayed")
    assert replayed.calls.made == 0 and said == []
    monkeypatch.setattr(play_cache, "code_digest", lambda: "the digest of another version of the package")
    sent = sum(server.request_counts().values())
    missed, said = notes("missed")
    assert sum(server.request_counts().values()) == sent and missed.calls.made == 0
    assert values(missed) == values(first)
    plays = len(examples) * (1 + len(MEMBERS) + len(MEMBERS))
    assert len(said) == 1, said
    assert f"none of its {plays} plays" in said[0] and "colab_graphs' files" in said[0], said[0]
    assert "endpoint" in said[0] and str(tmp_path / "cache") in said[0]
    again, said = notes("again")  # stored anew under the new digest: replayed, nothing to say
    assert again.calls.made == 0 and said == []


def test_the_replay_spares_the_collector_and_gives_the_process_its_collector_back_even_on_an_error():
    """`collector_spared` (around a replay): no full collection meanwhile; afterwards the collector's
    thresholds are the caller's again, also when the replay raises; a caller's own change made meanwhile is
    kept; a collector turned off is left as it is. (It never calls `gc.freeze` or `gc.unfreeze`; the permanent
    generation's count is not compared: frozen objects that die leave it meanwhile.)"""
    import gc

    from colab_graphs.audit.play_cache import collector_spared

    before = gc.get_threshold()
    with collector_spared():
        assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 10**6
    assert gc.get_threshold() == before and gc.isenabled()
    with pytest.raises(KeyError), collector_spared():
        raise KeyError("a replay that fails")
    assert gc.get_threshold() == before and gc.isenabled()
    try:
        with collector_spared():
            gc.set_threshold(500, 5, 5)  # the caller's own, meanwhile
        assert gc.get_threshold() == (500, 5, 5)
    finally:
        gc.set_threshold(*before)
    gc.disable()
    try:
        with collector_spared():
            assert gc.get_threshold() == before and not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_rerun_gives_the_process_its_collector_back(arun, moco, tmp_path):
    import gc

    server, examples = moco
    spec, pool = build_protocol("majority_vote", MEMBERS), pool_of(server)
    before = gc.get_threshold()
    audit(arun, spec, pool, examples, tmp_path / "cache", tmp_path / "first")
    assert mark_stored_plays(tmp_path / "cache") > 0
    rerun = audit(arun, spec, pool, examples, tmp_path / "cache", tmp_path / "rerun")
    assert marked_plays(tmp_path / "rerun")[0] > 0 and rerun.calls.made == 0  # replayed
    assert gc.get_threshold() == before and gc.isenabled()
