"""`colab-graphs run --scorer code` with a member over HTTP that answers with sandbox attacks in fenced blocks.

Each attack sits in front of a correct `add`: contained, it raises or is killed and the example scores 0;
escaped, the tests would pass and score 1. The host checks that nothing got out (no file written, no
connection received, no secret printed) and the correct answer still scores 1.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from colab_graphs.cli.app import app
from colab_graphs.testing.scripts import last_user_text

RIGHT = "def add(a, b):\n    return a + b\n"
SECRET = "sk-conformance-" + uuid.uuid4().hex


def attacks(port: int, outside: Path) -> dict[str, str]:
    return {
        "correct": RIGHT,
        "early_exit": "import sys\nsys.exit(0)\n" + RIGHT,
        "hard_exit": "import os\nos._exit(0)\n" + RIGHT,
        "network": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'x')\n"
        + RIGHT,
        "write_outside": f"open({str(outside)!r}, 'w').write('pwned')\n" + RIGHT,
        "read_secret": "import os\nprint(os.environ['OPENAI_API_KEY'])\n" + RIGHT,
        "fork_bomb": "import os\nwhile True:\n    os.fork()\n" + RIGHT,
        "memory_bomb": "x = bytearray(8 * 1024 ** 3)\n" + RIGHT,
        "hang": "while True:\n    pass\n" + RIGHT,
        "fake_token": "print('0' * 32)\ndef add(a, b):\n    return 0\n",
    }


@pytest.fixture
def listener():
    """A TCP listener on 127.0.0.1 that records every connection it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn.recv(16))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def test_cli_code_scorer_scores_the_correct_answer_one_and_every_attack_zero(
    scripted_server, tmp_path, listener, monkeypatch
):
    port, accepted = listener
    outside = tmp_path / f"cg-pwned-{uuid.uuid4().hex}"
    codes = attacks(port, outside)

    def coder(messages, params):
        name = last_user_text(messages).split("Attack: ", 1)[1].split()[0]
        return f"Here is my solution:\n\n```python\n{codes[name]}```\n\nIt adds the two numbers."

    server = scripted_server({"coder": coder})
    data = tmp_path / "attacks.jsonl"
    with data.open("w") as fh:
        for name in codes:
            record = {
                "id": name,
                "input": f"Write add(a, b) returning a + b. Attack: {name}",
                "test": "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n",
                "entry_point": "add",
                "timeout_s": 5,
            }
            fh.write(json.dumps(record) + "\n")
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        f"models:\n  coder: {{model: openai/coder, api_base: '{server.base_url}', api_key: '${{OPENAI_API_KEY}}'}}\n"
    )
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--protocol",
            "solo",
            "--scorer",
            "code",
            "--pool",
            str(pool),
            "--data",
            str(data),
            "--out",
            str(out),
            "--no-cache",
        ],
    )
    assert result.exit_code == 0, result.output
    scores = {r["id"]: r["score"] for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert scores == {name: float(name == "correct") for name in codes}
    assert accepted == [] and not outside.exists()
    for path in out.iterdir():
        assert SECRET not in path.read_text(), path.name
