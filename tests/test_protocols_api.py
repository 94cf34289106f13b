"""API-level protocols end to end over real HTTP: prompt routing, cascade, switch generation.

Scripted members reply as a function of the prompt they get, so each test can say exactly who should be
called, with what, and what the protocol should answer. Coalition tests remove each member in turn and check
in the server's request log that the removed member is never called.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from colab_graphs.aggregators import get_router
from colab_graphs.cli.app import app
from colab_graphs.coalition import restrict
from colab_graphs.models.client import ModelClient
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.runner import run_dataset
from colab_graphs.tasks.example import Example
from colab_graphs.testing import Member
from colab_graphs.testing.scripts import last_user_text

pytestmark = pytest.mark.integration

NAMES = ["alpha", "beta", "gamma"]


def run_one(arun, spec, pool, question: str):
    """Run `spec` on one question with a fresh, cache-less client; returns the example's outcome."""
    outcomes, _ = arun(
        run_dataset(spec, pool, [Example(id="q", input=question, answer="?")], client=ModelClient(None))
    )
    assert not outcomes[0].failed, outcomes[0].error
    return outcomes[0]


def called(server) -> list[str]:
    """Members in the order the server answered them."""
    return [r.model for r in server.requests if r.path.endswith("/chat/completions")]


# --- prompt routing -------------------------------------------------------------------------------------------


def routing_script(name: str):
    """As router: rank by the question's topic. As candidate: sign the answer with the member's name."""

    def script(messages, params) -> str:
        text = last_user_text(messages)
        if "Rank all of them" in text:
            return "gamma, beta, alpha" if "poem" in text else "no idea"
        return f"The answer is {name}."

    return script


@pytest.fixture
def routing(scripted_server, pool_for):
    server = scripted_server({n: routing_script(n) for n in NAMES})
    return server, pool_for(server, NAMES)


def test_routing_the_named_member_answers_and_no_other_candidate_is_called(arun, routing):
    server, pool = routing
    outcome = run_one(arun, build_protocol("prompt_routing", NAMES), pool, "Write a poem about 2 + 2.")
    assert outcome.output == "gamma"
    # alpha sits in the router seat; gamma is the only candidate that answers.
    assert called(server) == ["alpha", "gamma"]


def test_router_reads_every_candidates_description(arun, routing):
    server, pool = routing
    spec = build_protocol("prompt_routing", NAMES, descriptions={"gamma": "writes {poems}"})
    run_one(arun, spec, pool, "Write a poem.")
    router_prompt = server.requests[0].messages[-1]["content"]
    assert "- alpha: (no description)" in router_prompt
    assert "- gamma: writes {poems}" in router_prompt  # braces in a description are text, not a template
    assert "Question:\nWrite a poem." in router_prompt


def test_router_reply_naming_no_candidate_goes_to_the_first(arun, routing):
    server, pool = routing
    outcome = run_one(arun, build_protocol("prompt_routing", NAMES), pool, "What is 2 + 2?")
    assert outcome.output == "alpha"
    assert called(server) == ["alpha", "alpha"]


def test_router_seat_can_be_given_to_any_member(arun, routing):
    server, pool = routing
    run_one(arun, build_protocol("prompt_routing", NAMES, router="beta"), pool, "A poem, please.")
    assert called(server) == ["beta", "gamma"]


def test_routing_to_an_unknown_router_is_a_clear_error():
    with pytest.raises(ValueError, match="router names member.*'delta' not in the pool"):
        build_protocol("prompt_routing", NAMES, router="delta")


@pytest.mark.parametrize(
    ("removed", "answerer", "router"),
    [("alpha", "gamma", "beta"), ("beta", "gamma", "alpha"), ("gamma", "beta", "alpha")],
)
def test_routing_coalition_follows_the_routers_next_choice(arun, routing, removed, answerer, router):
    server, pool = routing
    spec = restrict(build_protocol("prompt_routing", NAMES), [n for n in NAMES if n != removed])
    outcome = run_one(arun, spec, pool, "Write a poem about 2 + 2.")
    assert outcome.output == answerer
    assert called(server) == [router, answerer]
    assert removed not in called(server)


# --- cascade --------------------------------------------------------------------------------------------------

# Confidence of each member per question: "easy" is easy for all, "medium" only for beta and gamma.
CONFIDENCE = {
    "easy": {"alpha": 0.9, "beta": 0.9, "gamma": 0.9},
    "medium": {"alpha": 0.2, "beta": 0.8, "gamma": 0.9},
    "hard": {"alpha": 0.1, "beta": 0.3, "gamma": 0.4},
}


def confidence_of(name: str, messages) -> float:
    word = re.search(r"easy|medium|hard", last_user_text(messages))
    return CONFIDENCE[word.group(0) if word else "hard"][name]


def self_reporting(name: str):
    def script(messages, params) -> str:
        return f"The answer is {name}.\nConfidence: {confidence_of(name, messages)}"

    return script


@pytest.fixture
def reporters(scripted_server, pool_for):
    server = scripted_server({n: self_reporting(n) for n in NAMES})
    return server, pool_for(server, NAMES)


@pytest.fixture
def logprob_members(scripted_server, pool_for):
    # The text says nothing about confidence; only the tokens' logprobs do.
    members = {
        n: Member(f"The answer is {n}.", confidence=lambda msgs, params, n=n: confidence_of(n, msgs))
        for n in NAMES
    }
    server = scripted_server(members)
    return server, pool_for(server, NAMES)


@pytest.mark.parametrize(
    ("question", "answer", "calls"),
    [
        ("An easy one: 1 + 1?", "alpha", ["alpha"]),
        ("A medium one: 12 * 12?", "beta", ["alpha", "beta"]),
        ("A hard one: 123 * 456?", "gamma", ["alpha", "beta", "gamma"]),
    ],
)
def test_cascade_self_reported_defers_until_a_stage_is_confident(arun, reporters, question, answer, calls):
    server, pool = reporters
    outcome = run_one(arun, build_protocol("cascade", NAMES), pool, question)
    assert outcome.output == answer  # on "hard" the last stage answers whatever its confidence
    assert called(server) == calls
    assert "Confidence: <number>" in server.requests[0].messages[-1]["content"]


@pytest.mark.parametrize(
    ("question", "answer", "calls"),
    [
        ("An easy one: 1 + 1?", "alpha", ["alpha"]),
        ("A medium one: 12 * 12?", "beta", ["alpha", "beta"]),
    ],
)
def test_cascade_logprob_mode_uses_token_probabilities(arun, logprob_members, question, answer, calls):
    server, pool = logprob_members
    outcome = run_one(arun, build_protocol("cascade", NAMES, mode="logprob"), pool, question)
    assert outcome.output == answer
    assert called(server) == calls
    assert all(r.params.get("logprobs") is True for r in server.requests)


def test_cascade_logprob_mode_defers_when_the_endpoint_returns_no_logprobs(arun, reporters):
    server, pool = reporters
    # The self-reporting members say 0.9 in text, but logprob mode reads only token probabilities; the
    # stage settings ask for logprobs, so strip them to simulate an endpoint that ignores the request.
    spec = build_protocol("cascade", NAMES, mode="logprob")
    spec = spec.model_copy(
        update={
            "nodes": [n.model_copy(update={"settings": {}}) if n.kind == "seat" else n for n in spec.nodes]
        }
    )
    outcome = run_one(arun, spec, pool, "An easy one: 1 + 1?")
    assert outcome.output == "gamma"
    assert called(server) == NAMES


def test_cascade_self_reported_ignores_recorded_logprobs(arun, scripted_server, pool_for):
    # Tokens say 0.99, the text says 0.2: a self-reporting cascade must believe the text.
    members = {n: Member(f"The answer is {n}.\nConfidence: 0.2", confidence=0.99) for n in NAMES}
    server = scripted_server(members)
    pool = pool_for(server, NAMES, logprobs=True)
    outcome = run_one(arun, build_protocol("cascade", NAMES), pool, "Anything?")
    assert outcome.output == "gamma"
    assert called(server) == NAMES


def test_cascade_threshold_decides_what_is_confident_enough(arun, reporters):
    server, pool = reporters
    outcome = run_one(arun, build_protocol("cascade", NAMES, threshold=0.1), pool, "A hard one?")
    assert outcome.output == "alpha"
    assert called(server) == ["alpha"]


def test_cascade_order_parameter_sets_the_stages(arun, reporters):
    server, pool = reporters
    spec = build_protocol("cascade", NAMES, order="gamma,alpha")  # as -P order=gamma,alpha gives it
    assert spec.members == ["alpha", "gamma"]  # pool order
    outcome = run_one(arun, spec, pool, "A hard one?")
    assert outcome.output == "alpha"
    assert called(server) == ["gamma", "alpha"]


@pytest.mark.parametrize(
    ("removed", "answer", "calls"),
    [
        ("alpha", "beta", ["beta"]),
        ("beta", "gamma", ["alpha", "gamma"]),
        ("gamma", "beta", ["alpha", "beta"]),
    ],
)
def test_cascade_coalition_skips_the_absent_stage(arun, reporters, removed, answer, calls):
    server, pool = reporters
    spec = restrict(build_protocol("cascade", NAMES), [n for n in NAMES if n != removed])
    outcome = run_one(arun, spec, pool, "A medium one: 12 * 12?")
    assert outcome.output == answer
    assert called(server) == calls


def test_cascade_without_its_last_stage_ends_at_the_new_last_stage(arun, reporters):
    server, pool = reporters
    spec = restrict(build_protocol("cascade", NAMES), ["alpha", "beta"])
    outcome = run_one(arun, spec, pool, "A hard one?")
    assert outcome.output == "beta"  # beta is unconfident, but nobody is left to defer to
    assert called(server) == ["alpha", "beta"]


def test_confidence_router_rejects_an_unknown_signal():
    with pytest.raises(ValueError, match="signal must be"):
        get_router("confidence")({"text": "Confidence: 1"}, {}, signal="vibes")


# --- switch generation ----------------------------------------------------------------------------------------


def partial_of(messages) -> str:
    return re.search(r"---\n(.*?)\n---", last_user_text(messages), re.DOTALL).group(1)


def turn_taker(name: str):
    """Writes `name:<number of parts it was shown>`, so each part records what its writer saw."""

    def script(messages, params) -> str:
        partial = partial_of(messages)
        return f"{name}:{len(partial.splitlines()) if partial else 0}"

    return script


@pytest.fixture
def writers(scripted_server, pool_for):
    server = scripted_server({n: turn_taker(n) for n in NAMES})
    return server, pool_for(server, NAMES)


def test_switch_generation_members_take_turns_continuing_the_partial_answer(arun, writers):
    server, pool = writers
    outcome = run_one(arun, build_protocol("switch_generation", NAMES), pool, "Explain 2 + 2.")
    parts = ["alpha:0", "beta:1", "gamma:2", "alpha:3", "beta:4", "gamma:5"]
    assert called(server) == [p.split(":")[0] for p in parts]
    # Turn k was shown exactly the k parts written before it, in order.
    shown = [partial_of(r.messages) for r in server.requests]
    assert shown == ["\n".join(parts[:k]) for k in range(len(parts))]
    assert outcome.trace.state["answer"] == "\n".join(parts)
    assert outcome.output == "gamma:5"  # a short-text task's answer: the last line of the finished text


def test_switch_generation_turns_per_member_sets_the_number_of_turns(arun, writers):
    server, pool = writers
    run_one(arun, build_protocol("switch_generation", NAMES, turns_per_member=1), pool, "Explain.")
    assert called(server) == NAMES


@pytest.mark.parametrize("removed", NAMES)
def test_switch_generation_coalition_drops_the_absent_members_turns(arun, writers, removed):
    server, pool = writers
    present = [n for n in NAMES if n != removed]
    spec = restrict(build_protocol("switch_generation", NAMES, turns_per_member=2), present)
    outcome = run_one(arun, spec, pool, "Explain.")
    order = [n for n in NAMES * 2 if n != removed]
    assert called(server) == order
    assert outcome.trace.state["answer"] == "\n".join(f"{n}:{k}" for k, n in enumerate(order))


# --- coalition edge cases shared by the three -----------------------------------------------------------------


SCRIPTS = {"prompt_routing": routing_script, "cascade": self_reporting, "switch_generation": turn_taker}
ALONE = {
    "prompt_routing": "beta",
    "cascade": "beta",
    "switch_generation": "beta:1",
}  # switch: "beta:0\nbeta:1"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_single_member_coalition_is_that_member_alone(arun, scripted_server, pool_for, name):
    server = scripted_server({n: SCRIPTS[name](n) for n in NAMES})
    spec = restrict(build_protocol(name, NAMES), ["beta"])
    outcome = run_one(arun, spec, pool_for(server, NAMES), "A poem, a hard one.")
    assert set(called(server)) == {"beta"}
    assert outcome.output == ALONE[name]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_empty_coalition_has_no_graph(name):
    assert restrict(build_protocol(name, NAMES), []) is None


# --- the CLI --------------------------------------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "my_protocol.py"


@pytest.mark.parametrize(
    ("name", "drawn"),
    [
        ("prompt_routing", "-- m3 -->"),  # the router's path to the third candidate
        ("cascade", "-- defer -->"),
        ("switch_generation", "turn5_m3"),
    ],
)
def test_show_draws_each_api_protocol(name, drawn):
    result = CliRunner().invoke(app, ["show", name, "--format", "mermaid"])
    assert result.exit_code == 0, result.output
    assert drawn in result.output


def test_protocols_json_lists_the_api_family():
    result = CliRunner().invoke(app, ["protocols", "--json"])
    listed = {p["name"]: p for p in json.loads(result.output)}
    for name in ("prompt_routing", "cascade", "switch_generation"):
        assert (listed[name]["family"], listed[name]["requires"]) == ("api", [])
    assert listed["cascade"]["params"]["threshold"] == 0.7
    assert "-P order=small,medium,large" in listed["cascade"]["param_docs"]["order"]


def writer_script(messages, params) -> str:
    """Drafts 5; revises to 4 once the critique (or its own corrected draft) says 4."""
    return "The answer is 4." if "is 4" in last_user_text(messages) else "The answer is 5."


def critic_script(messages, params) -> str:
    return "Wrong: 2 + 2 is 4." if "The answer is 5." in last_user_text(messages) else "Looks right."


def test_user_protocol_file_runs_from_the_cli(scripted_server, tmp_path):
    server = scripted_server({"writer": writer_script, "critic": critic_script})
    pool = {"models": {name: server.litellm_kwargs(name) for name in ("writer", "critic")}}
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool, sort_keys=False))
    rows = [
        {"id": "1", "input": "What is 2 + 2?", "answer": "4"},
        {"id": "2", "input": "2 + 2 = ?", "answer": "4"},
    ]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["run", "--graph", f"{EXAMPLE}:draft_critique_revise", "--pool", str(tmp_path / "pool.yaml")]
    args += ["--data", str(tmp_path / "data.jsonl"), "--out", str(tmp_path / "out"), "--no-cache"]
    result = CliRunner().invoke(app, [*args, "-P", "rounds=2"])
    assert result.exit_code == 0, result.output
    results = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [(r["id"], r["answer"], r["score"]) for r in results] == [("1", "4", 1.0), ("2", "4", 1.0)]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["protocol"], summary["params"], summary["calls"]["made"]) == (
        "draft_critique_revise",
        {"critic": None, "rounds": 2},
        10,  # per example: draft, then critique + revise twice
    )
    for row in rows:  # the two examples ran concurrently: follow each one's calls
        calls = [r.model for r in server.requests if row["input"] in last_user_text(r.messages)]
        assert calls == ["writer", "critic", "writer", "critic", "writer"]
