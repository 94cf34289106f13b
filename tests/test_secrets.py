"""Secrets reach no output file, no cache and no terminal, even when a provider echoes them back.

One member sits behind a provider that answers every request with a 400 quoting the request line (query string
included) and every header it was sent; its pool entry carries a secret in each place a pool can hold one: an
`api_key` read from `${ENV}`, `extra_headers` and `headers` values, another member's `api_base` whose `?key=` is
read from the environment (a password as URL userinfo cannot be sent at all: the pool refuses it at load, without
printing it, tests/test_owned_files.py). A run, an audit and a study over real ARC records write everything they write; every
file under their folders and the call cache, what the CLI printed, and what the viewer serves are searched for
every secret value.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from colab_graphs.cli.app import _register_optional_commands, app
from colab_graphs.testing import ScriptedServer, answer_key
from colab_graphs.viewer import ViewerServer

pytestmark = pytest.mark.integration

ARC = Path(__file__).parent / "fixtures" / "moco" / "arc_challenge.json"
ENV = {
    "CG_SECRET_API_KEY": "sk-ENV-api-key-0123456789abcdef",
    "CG_SECRET_QUERY_KEY": "qk-SECRET-query-5e6f7a8b9c",
    "CG_SECRET_HEADER": "hk-SECRET-header-1a2b3c4d",
}
EXTRA_HEADER = "hdr-SECRET-extra-7f3a9c2e"
SECRETS = [*ENV.values(), EXTRA_HEADER]


def steady_replies() -> dict[str, str]:
    records = json.loads(ARC.read_text())["test"][:2]
    return {r["question"][:60]: f"The correct option is ({r['answer']})." for r in records}


@pytest.fixture
def leaky_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    with (
        ScriptedServer(echo_errors=True) as leaky,
        ScriptedServer({"steady": answer_key(steady_replies())}) as ok,
    ):
        host = leaky.base_url.removeprefix("http://")
        pool = {
            "models": {
                "leaky": {
                    "model": "openai/leaky",
                    "api_base": f"http://{host}",
                    "api_key": "${CG_SECRET_API_KEY}",
                    "extra_headers": {"X-Team-Token": EXTRA_HEADER},
                    "headers": {"X-Org-Token": "${CG_SECRET_HEADER}"},
                },
                "queried": {  # (an OpenAI-compatible member cannot take a query string: refused at load)
                    "model": "ollama_chat/queried",
                    "api_base": f"http://{host}?key=${{CG_SECRET_QUERY_KEY}}",
                },
                "steady": {
                    "model": "openai/steady",
                    "api_base": ok.base_url,
                    "api_key": "${CG_SECRET_API_KEY}",
                    "extra_headers": {"X-Team-Token": EXTRA_HEADER},
                },
            }
        }
        (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
        study = {
            "pools": {"p": "pool.yaml"},
            "protocols": ["majority_vote"],
            "datasets": [str(ARC)],
            "limit": 2,
        }
        (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
        yield tmp_path


def invoke(*args: Any) -> Any:
    if not any(c.name == "audit" for c in app.registered_commands):
        _register_optional_commands()  # what `main()` does before parsing
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def assert_no_secret(text: str | bytes, where: str) -> None:
    data = text.encode() if isinstance(text, str) else text
    for secret in SECRETS:
        assert secret.encode() not in data, f"{secret} in {where}"


def test_an_echoing_provider_leaks_no_secret_into_any_output(leaky_workspace) -> None:
    ws = leaky_workspace
    shared = [
        "--pool",
        ws / "pool.yaml",
        "--data",
        ARC,
        "--limit",
        2,
        "--cache-dir",
        ws / "cache",
        "--retries",
        0,
    ]
    run = invoke("run", "--protocol", "majority_vote", *shared, "--out", ws / "run")
    audit = invoke("audit", "--protocol", "majority_vote", *shared, "--out", ws / "audit", "--no-plots")
    study = invoke("study", "--config", ws / "study.yaml", "--out", ws / "study", "--cache-dir", ws / "cache",
                   "--no-plots", "--retries", 0)  # fmt: skip
    assert (run.exit_code, audit.exit_code, study.exit_code) == (3, 3, 3), (
        run.output + audit.output + study.output
    )
    for result in (run, audit, study):
        assert_no_secret(result.output, "the terminal")
    # Not vacuous: the provider did echo what it was sent, and the echo is in the outputs, redacted.
    log = [json.loads(line) for line in (ws / "audit" / "log.jsonl").read_text().splitlines()]
    echoed = [r["error"] for r in log if r["type"] == "call" and r["member"] == "leaky" and r.get("error")]
    assert echoed and all("rejected POST" in e and "x-team-token: [redacted]" in e.lower() for e in echoed), (
        echoed
    )
    queried = [r["error"] for r in log if r["type"] == "call" and r["member"] == "queried" and r.get("error")]
    assert queried and all(re.search(r"rejected POST /v1\?(key=)?\[?REDACTED", e) for e in queried), queried

    written = [p for p in ws.rglob("*") if p.is_file() and p.suffix not in (".yaml",)]
    names = {p.name for p in written}
    assert {
        "results.jsonl",
        "traces.jsonl",
        "summary.json",
        "log.jsonl",
        "calls.sqlite",
        "study.json",
    } <= names
    for path in written:
        assert_no_secret(path.read_bytes(), str(path))

    header = json.loads((ws / "run" / "log.jsonl").read_text().splitlines()[0])
    assert header["pool"]["queried"]["api_base"].endswith("?key=[REDACTED]")

    viewer = ViewerServer(ws).start()
    try:
        for folder in ("run", "audit", "study"):
            with urllib.request.urlopen(f"{viewer.url}api/log?path={folder}") as response:
                assert_no_secret(response.read(), f"the viewer's payload of {folder}")
    finally:
        viewer.shutdown()
        viewer.server_close()


def test_a_pool_written_to_a_report_names_environment_values_by_their_variable(tmp_path, monkeypatch) -> None:
    from colab_graphs.pool import Pool

    monkeypatch.setenv("CG_VLLM_URL", "http://gpu-a.internal:8000/v1")
    pool = Pool.from_dict({"q": {"model": "hosted_vllm/q", "api_base": "${CG_VLLM_URL}", "api_key": "k"}})
    assert pool.to_public_dict() == {"q": {"model": "hosted_vllm/q", "api_base": "${CG_VLLM_URL}"}}
