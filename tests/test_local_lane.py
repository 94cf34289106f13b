"""A plain call of an in-process `local/` member is answered by its engine without LiteLLM (the local lane):
the same reply, token for token, as through LiteLLM's custom provider; LiteLLM never loaded by an audit of
local members; a setting out of range refused at once, named."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from colab_graphs.models.client import CallError, ModelClient
from colab_graphs.pool import Pool
from colab_graphs.trace import Reply

TINY = "local/tiny-random"
QUESTIONS = ["What is 2+2?", "Name a colour.", "What is 17 * 3? Think step by step."]
SETTINGS = {
    "greedy": {"temperature": 0.0, "max_tokens": 12},
    "seeded": {"temperature": 0.9, "seed": 11, "max_tokens": 16, "top_p": 0.9, "top_k": 40},
    # (min_p and repetition_penalty are the engine's, not pool settings: a trainer's calls pass them per call)
    "penalised": {
        "temperature": 0.7,
        "seed": 3,
        "max_tokens": 10,
        "overrides": {"min_p": 0.05, "repetition_penalty": 1.3},
    },
    "stopped": {"temperature": 0.0, "max_tokens": 16, "stop": ["e"], "logprobs": True, "top_logprobs": 2},
    "connection settings too": {"temperature": 0.0, "max_tokens": 6, "timeout": 30, "num_retries": 1},
}


def replies(arun, direct: bool, settings: dict) -> list[dict]:
    """Each question's reply as the call record keeps it, with the lane on (`direct`) or off (LiteLLM)."""
    settings = dict(settings)
    overrides = settings.pop("overrides", None)
    pool = Pool.from_dict({"m": {"model": TINY, **settings}})
    client = ModelClient(None, direct=direct)

    async def ask() -> list[dict]:
        out = []
        for question in QUESTIONS:
            call = await client.complete(
                pool["m"], [{"role": "user", "content": question}], overrides=overrides
            )
            out.append(call.model_dump(include=set(Reply.model_fields)))
        return out

    return arun(ask())


@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_lane_answers_what_litellm_answers(arun, name) -> None:
    """Text, finish reason, usage, cost, exact token ids and logprobs: equal with and without LiteLLM (so a
    cache filled by either serves the other, and an audit's values do not depend on the lane)."""
    settings = SETTINGS[name]
    lane, through_litellm = replies(arun, True, settings), replies(arun, False, settings)
    assert lane == through_litellm
    assert all(r["completion_token_ids"] and r["cost_usd"] == 0.0 for r in lane)
    if "stop" in settings:
        assert all("e" not in r["completion"] for r in lane)


def test_a_setting_litellm_would_change_goes_through_litellm(arun) -> None:
    """`max_completion_tokens` (LiteLLM renames it) and `n` are not the lane's: LiteLLM takes the call, and
    the reply is still the provider's (its token ids present)."""
    from colab_graphs.local.provider import plain_call_params

    assert plain_call_params({"model": TINY, "messages": [], "max_completion_tokens": 5}) is None
    assert plain_call_params({"model": TINY, "messages": [], "n": 1, "temperature": 0}) is None
    assert plain_call_params({"model": "openai/x", "messages": [], "temperature": 0}) is None
    reply = replies(arun, True, {"temperature": 0.0, "max_completion_tokens": 5})[0]
    assert len(reply["completion_token_ids"]) <= 5


def test_a_setting_out_of_range_fails_at_once_naming_it(arun) -> None:
    """Through LiteLLM such a call was retried as a "connection" failure; the lane refuses it as a bad request
    after one attempt, with the field and the bound."""
    pool = Pool.from_dict({"m": {"model": TINY, "top_k": -1, "max_tokens": 4}})
    client = ModelClient(None, retries=3, backoff_s=0.01)
    with pytest.raises(CallError) as caught:
        arun(client.complete(pool["m"], [{"role": "user", "content": "hi"}]))
    assert caught.value.kind == "bad_request" and caught.value.attempts == 1
    assert "top_k" in str(caught.value) and "greater than or equal to 0" in str(caught.value)


LOADED_AT_EXIT = textwrap.dedent(
    """
    import atexit, json, runpy, sys

    record = sys.argv[1]
    atexit.register(lambda: json.dump(sorted(sys.modules), open(record, "w")))
    sys.argv = ["colab-graphs", *sys.argv[2:]]
    runpy.run_module("colab_graphs.cli.app", run_name="__main__")
    """
)


@pytest.mark.slow
def test_an_audit_of_local_members_never_loads_litellm(tmp_path) -> None:
    """`colab-graphs audit` of local members (as the embedded default's) answers every call in process:
    LiteLLM (seconds of import) is not loaded at all, and the report counts every call made."""
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "models:\n"
        "  a: {model: local/tiny-random, temperature: 0.0, max_tokens: 8}\n"
        "  b: {model: local/tiny-random, temperature: 0.8, seed: 7, max_tokens: 8}\n"
    )
    record = tmp_path / "modules.json"
    command = [sys.executable, "-c", LOADED_AT_EXIT, str(record), "audit", "--protocol", "majority_vote",
               "--pool", str(pool), "--data", "builtin:arithmetic", "--limit", "3", "--out",
               str(tmp_path / "audit"), "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = set(json.loads(record.read_text()))
    assert "torch" in loaded  # (the members were really decoded in process)
    assert [m for m in loaded if m == "litellm" or m.startswith("litellm.")] == []
    report = json.loads((tmp_path / "audit" / "report.json").read_text())
    assert report["calls"]["made"] == 6 and report["calls"]["failed"] == 0


def test_requests_that_join_a_running_batch_together_decode_as_they_would_alone() -> None:
    """The engine's running batch takes what arrives while it decodes: several requests at one step share one
    prompt pass, and one whose `max_tokens` outruns the batch's room grows its cache instead of waiting for a
    batch of its own (the default audit's calls arrive over the first steps). Greedy and seeded rows give the
    tokens they give alone."""
    from colab_graphs.local.local_engine import GenerationRequest
    from colab_graphs.local.provider import get_engine

    engine = get_engine("tiny-random")

    def request(question: str, **settings) -> GenerationRequest:
        return GenerationRequest(engine.render([{"role": "user", "content": question}]), **settings)

    running = request("hello hello hello hello hello What is 2+2?", max_tokens=6, temperature=0.0)
    joining = [
        request("What is 3+4?", max_tokens=20, temperature=0.0),
        request("Name a colour.", max_tokens=12, temperature=0.9, seed=5),
        request("hi", max_tokens=3, temperature=0.0),
    ]
    alone = [engine.generate_batch([r])[0].completion_ids for r in (running, *joining)]
    steps = []

    def admit(fits, room: int) -> list[GenerationRequest]:
        steps.append(engine.steps)
        if len(steps) == 3:  # two decoding steps in
            assert all(fits(r) for r in joining) and room >= len(joining)
            return joining
        return []

    together = engine.generate_batch([running], admit)
    assert [r.completion_ids for r in together] == alone
    assert len(together[1].completion_ids) == 20  # (its reply outran the room the batch started with)
