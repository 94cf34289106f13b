"""Files we own and files we are given, through the CLI on real ARC records: a corrupt call cache is set aside,
an output folder has one writer, bad input names its file and line, a dead endpoint is named at once."""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from colab_graphs.testing import ScriptedServer
from tests.test_cache_identity import ARC, N, arc_member, invoke, pool_file, run

pytestmark = pytest.mark.integration

LOCK_FILE = ".colab-graphs.lock"  # colab_graphs.files.LOCK_FILE, as a user finds it in --out


@pytest.fixture
def right():
    with ScriptedServer({"ada": arc_member(True)}) as server:
        yield server


def filled_cache(right: ScriptedServer, tmp_path: Path) -> tuple[Path, Path]:
    """(pool file, cache folder) after one run that cached the N calls."""
    pool = pool_file(tmp_path / "pool.json", {"api_base": right.base_url})
    assert run(pool, tmp_path / "cache", tmp_path / "first")["calls"]["made"] == N
    gc.collect()  # the run's cache connection closes, as at the end of a process
    with sqlite3.connect(tmp_path / "cache" / "calls.sqlite") as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every entry in the file itself, none in its WAL
    return pool, tmp_path / "cache"


def said(result) -> str:
    """What a command printed, its lines as the terminal wrapped them joined again."""
    return " ".join(result.output.split())


# --- a corrupt call cache ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: b"this is not a database " * 200, id="garbage"),
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: data[:4096] + b"\xde\xad\xbe\xef" * 1024 + data[8192:], id="damaged-page"),
    ],
)
def test_a_corrupt_cache_is_set_aside_named_and_replaced(right, tmp_path, caplog, damage) -> None:
    pool, cache = filled_cache(right, tmp_path)
    file = cache / "calls.sqlite"
    damaged = damage(file.read_bytes())
    file.write_bytes(damaged)
    with caplog.at_level(logging.WARNING, logger="colab_graphs"):
        summary = run(pool, cache, tmp_path / "second")
    assert f"call cache {file} is corrupt" in caplog.text and "set aside as" in caplog.text
    aside = [p for p in cache.glob("calls.sqlite.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and aside[0].read_bytes() == damaged
    assert (summary["score"], summary["calls"]["made"]) == (1.0, N)


@pytest.mark.slow
def test_a_corrupt_cache_is_reported_on_stderr_without_a_traceback(tmp_path, right) -> None:
    pool = pool_file(tmp_path / "pool.json", {"api_base": right.base_url})
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "calls.sqlite").write_bytes(b"\x00garbage" * 512)
    done = subprocess.run(
        [sys.executable, "-m", "colab_graphs.cli.app", "run", "--protocol", "solo", "--pool", str(pool),
         "--data", str(ARC), "--limit", "2", "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "is corrupt (file is not a database): set aside as" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_stored_reply_that_is_not_json_is_a_miss_named_by_file(right, tmp_path, caplog) -> None:
    pool, cache = filled_cache(right, tmp_path)
    with sqlite3.connect(cache / "calls.sqlite") as db:
        db.execute('UPDATE calls SET response = \'{"text": "The correct opt\' WHERE rowid = 1')
    with caplog.at_level(logging.WARNING, logger="colab_graphs"):
        summary = run(pool, cache, tmp_path / "second")
    assert f"call cache {cache / 'calls.sqlite'}: the entry" in caplog.text and "is not JSON" in caplog.text
    assert summary["score"] == 1.0 and summary["calls"] == {"made": 1, "cached": N - 1, "failed": 0}
    assert run(pool, cache, tmp_path / "third")["calls"]["cached"] == N  # the row was written again


@pytest.mark.parametrize(
    "entry", ['{"usage": {"prompt_tokens": 3}}', '{"text": 7, "usage": "none"}', "[1, 2]"]
)
def test_a_stored_entry_that_is_not_a_reply_is_a_miss_named_by_file(right, tmp_path, caplog, entry) -> None:
    pool, cache = filled_cache(right, tmp_path)
    with sqlite3.connect(cache / "calls.sqlite") as db:
        db.execute("UPDATE calls SET response = ? WHERE rowid = 1", (entry,))
    with caplog.at_level(logging.WARNING, logger="colab_graphs"):
        summary = run(pool, cache, tmp_path / "second")
    assert (
        f"call cache {cache / 'calls.sqlite'}: the entry" in caplog.text and "is not a reply" in caplog.text
    )
    assert summary["score"] == 1.0 and summary["calls"] == {"made": 1, "cached": N - 1, "failed": 0}


def test_a_cache_from_a_newer_version_is_refused_with_what_to_do(right, tmp_path) -> None:
    pool = pool_file(tmp_path / "pool.json", {"api_base": right.base_url})
    (tmp_path / "cache").mkdir()
    with sqlite3.connect(tmp_path / "cache" / "calls.sqlite") as db:
        db.execute("PRAGMA user_version = 99")
    result = invoke(
        "run", "--protocol", "solo", "--pool", pool, "--data", ARC, "--cache-dir", tmp_path / "cache"
    )
    assert result.exit_code == 2
    assert (
        "has schema 99, written by a newer colab-graphs" in result.output and "Traceback" not in result.output
    )


# --- one writer per output folder -------------------------------------------------------------------------


def audit_args(pool: Path, cache: Path, out: Path) -> list[str]:
    return ["audit", "--protocol", "majority_vote", "--pool", str(pool), "--data", str(ARC), "--limit", "2",
            "--cache-dir", str(cache), "--out", str(out), "--no-plots"]  # fmt: skip


@pytest.mark.slow
def test_a_second_audit_into_the_same_out_is_refused_naming_the_first(tmp_path) -> None:
    members = {name: arc_member(True) for name in ("ada", "bob", "cyd")}
    with ScriptedServer(members, latency_s=0.4) as slow:
        models = {
            m: {"model": f"openai/{m}", "api_base": slow.base_url, "api_key": "sk-test"} for m in members
        }
        pool = tmp_path / "pool.yaml"
        pool.write_text(yaml.safe_dump({"models": models}))
        out = tmp_path / "out"
        first = subprocess.Popen(
            [sys.executable, "-m", "colab_graphs.cli.app", *audit_args(pool, tmp_path / "c1", out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while f'"pid": {first.pid}' not in _read(out / LOCK_FILE) and time.monotonic() < deadline:
            assert first.poll() is None, first.communicate()
            time.sleep(0.1)
        second = invoke(*audit_args(pool, tmp_path / "c2", out))
        stdout, stderr = first.communicate(timeout=300)
    assert second.exit_code == 5, second.output
    assert f"is being written by pid {first.pid} on {socket.gethostname()} (colab-graphs audit" in said(
        second
    )
    assert first.returncode == 0, stderr
    plays = [line for line in (out / "log.jsonl").read_text().splitlines() if '"type":"play"' in line]
    assert len(plays) == 2 * (len(members) + 1 + len(members))  # examples x (LOO coalitions + solos), once


KILLED_WRITER = """
import os, signal, sys
from colab_graphs.files import atomic_file
with atomic_file(sys.argv[1]) as fh:
    fh.write('{"score": ')
    fh.flush()
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_file_written_atomically_keeps_its_old_text_when_the_writer_is_killed_midway(tmp_path) -> None:
    summary = tmp_path / "summary.json"
    summary.write_text('{"score": 1.0}\n')
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(summary)], capture_output=True, timeout=120
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert summary.read_text() == '{"score": 1.0}\n'


def test_a_file_written_atomically_is_untouched_and_leaves_no_temp_file_when_the_write_raises(
    tmp_path,
) -> None:
    from colab_graphs.files import atomic_file

    summary = tmp_path / "summary.json"
    summary.write_text('{"score": 1.0}\n')
    with pytest.raises(RuntimeError), atomic_file(summary) as fh:
        fh.write('{"score": ')
        raise RuntimeError("the run failed while its summary was written")
    assert summary.read_text() == '{"score": 1.0}\n' and os.listdir(tmp_path) == ["summary.json"]


def test_a_lock_left_by_a_dead_process_is_taken_over(right, tmp_path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_text(
        json.dumps({"pid": dead.pid, "host": socket.gethostname(), "command": "audit"})
    )
    pool = pool_file(tmp_path / "pool.json", {"api_base": right.base_url})
    assert run(pool, tmp_path / "cache", out)["score"] == 1.0
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


# --- files we are given -------------------------------------------------------------------------------------


def arc_jsonl(path: Path, prefix: bytes = b"", bad_line: int | None = None) -> Path:
    """The first N ARC records as a JSONL dataset; line `bad_line` gets a byte that is not UTF-8."""
    records = json.loads(ARC.read_text())["test"][:N]
    lines = []
    for i, r in enumerate(records, 1):
        row = {
            "id": r["id"],
            "input": r["question"],
            "choices": list(r["choices"].values()),
            "answer": r["answer"],
        }
        line = json.dumps(row, ensure_ascii=False).encode()
        lines.append(line.replace(b"?", b"\xff?", 1) if i == bad_line else line)
    path.write_bytes(prefix + b"\n".join(lines) + b"\n")
    return path


def test_a_line_that_is_not_utf8_is_named_by_file_and_line(right, tmp_path) -> None:
    data = arc_jsonl(tmp_path / "data.jsonl", bad_line=3)
    pool = pool_file(tmp_path / "pool.json", {"api_base": right.base_url})
    result = invoke(
        "run", "--protocol", "solo", "--pool", pool, "--data", data, "--cache-dir", tmp_path / "c"
    )
    assert result.exit_code == 2
    assert f"{data}:3: not UTF-8 text (byte 0xff at column" in said(result)


def test_a_byte_order_mark_is_accepted_in_datasets_and_pool_files(right, tmp_path) -> None:
    data = arc_jsonl(tmp_path / "data.jsonl", prefix=b"\xef\xbb\xbf")
    pool = tmp_path / "pool.yaml"
    pool.write_bytes(b"\xef\xbb\xbf" + f"models:\n  ada: {{model: openai/ada, api_base: '{right.base_url}', "
                     "api_key: sk-test}\n".encode())  # fmt: skip
    result = invoke("run", "--protocol", "solo", "--pool", pool, "--data", data, "--cache-dir", tmp_path / "c",
                    "--out", tmp_path / "o")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["score"] == 1.0


def test_a_folder_given_as_pool_is_a_clear_error(tmp_path) -> None:
    result = invoke("run", "--protocol", "solo", "--pool", tmp_path, "--data", ARC)
    assert result.exit_code == 2 and f"{tmp_path} is a folder; expected a pool file" in said(result)


def test_settings_of_the_wrong_type_fail_the_load_naming_file_member_and_every_field(tmp_path) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "models:\n  ada: {model: openai/ada, temperature: hot, max_tokens: lots, seed: x}\n"
        "  bob: {model: openai/bob, max_tokens: -5}\n"
    )
    result = invoke("run", "--protocol", "solo", "--pool", pool, "--data", ARC)
    message = said(result)
    assert result.exit_code == 2
    assert f"{pool}: member 'ada': temperature: 'hot'" in message
    assert "max_tokens: 'lots'" in message and "seed: 'x'" in message


def test_credentials_in_an_api_base_fail_the_load_without_printing_them(tmp_path) -> None:
    # LiteLLM's HTTP transport refuses them beside its own Authorization header: every call failed, 7 attempts.
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "models:\n  ada: {model: openai/ada, api_base: 'http://me:hunter2@127.0.0.1:9/v1', api_key: sk-x}\n"
    )
    result = invoke("run", "--protocol", "solo", "--pool", pool, "--data", ARC)
    message = said(result)
    assert result.exit_code == 2
    assert (
        f"{pool}: member 'ada': api_base: credentials in the URL" in message
        and "give the credential" in message
    )
    assert "hunter2" not in message
    pool.write_text("models:\n  bob: {model: ollama_chat/bob, api_base: 'http://me:hunter2@127.0.0.1:9'}\n")
    result = invoke("run", "--protocol", "solo", "--pool", pool, "--data", ARC)
    assert result.exit_code == 2 and "member 'bob': api_base: credentials in the URL" in said(result)


def test_a_query_string_in_an_openai_compatible_api_base_fails_the_load(tmp_path) -> None:
    # The client appended /chat/completions after it: every call was a 404 for POST /v1.
    pool = tmp_path / "pool.yaml"
    pool.write_text("models:\n  ada: {model: openai/ada, api_base: 'http://127.0.0.1:9/v1?key=k-12345678'}\n")
    result = invoke("run", "--protocol", "solo", "--pool", pool, "--data", ARC)
    message = said(result)
    assert result.exit_code == 2 and "member 'ada': api_base: a query string (?key=...)" in message
    assert "k-12345678" not in message


# --- a dead endpoint -----------------------------------------------------------------------------------------


def dead_base_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_a_dead_endpoint_fails_the_audit_at_once_naming_member_and_api_base(right, tmp_path) -> None:
    dead = dead_base_url()
    models = {
        "ada": {"model": "openai/ada", "api_base": right.base_url, "api_key": "sk-test"},
        "bob": {"model": "openai/bob", "api_base": dead, "api_key": "sk-test"},
    }
    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump({"models": models}))
    result = invoke(*audit_args(pool, tmp_path / "c", tmp_path / "out"))
    message = said(result)
    assert result.exit_code == 3
    assert f"bob: unreachable after 1 attempt(s): nothing answers at its api_base: {dead}" in message


def test_an_endpoint_whose_calls_are_all_cached_is_not_checked(tmp_path) -> None:
    with ScriptedServer({"ada": arc_member(True)}) as gone:
        pool, cache = filled_cache(gone, tmp_path)
    summary = run(pool, cache, tmp_path / "again")  # the server is down now
    assert (summary["score"], summary["calls"]["cached"]) == (1.0, N)
