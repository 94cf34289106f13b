"""MoCo's remaining API-level methods and SLM-MUX end to end over real HTTP: trained_router, graph_routing,
mentor_collab, slm_mux; and nudging / co_llm refusing API members (their token-level runs on tiny local models
are in tests/test_protocols_api_decoding.py).

Scripted members reply as real models do (a sentence of working, then "The answer is N."). For the routers each
member is an expert on one kind of question (sums, spiders' legs, days in weeks) and off by one on the others, so
a router that learned from the dev split sends each test question to its expert. Fits go to a fresh
`COLAB_GRAPHS_MERGE_DIR` per test; `dev_fit.stats` counts the fits computed.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from colab_graphs.cli.app import app
from colab_graphs.coalition import restrict
from colab_graphs.compile import compile_graph
from colab_graphs.fitting import fit_coalition
from colab_graphs.logit_pool import LogitPoolError
from colab_graphs.models.client import ModelClient
from colab_graphs.protocol_registry import build_protocol, list_protocols
from colab_graphs.protocols import dev_fit
from colab_graphs.protocols.api_mentor import chosen_option
from colab_graphs.runner import run_dataset
from colab_graphs.tasks.loaders import load_examples
from colab_graphs.testing.scripts import last_user_text

pytestmark = pytest.mark.integration

NAMES = ["alpha", "beta", "gamma"]
ROUTERS = ["trained_router", "graph_routing"]
NEW = ["trained_router", "graph_routing", "nudging", "co_llm", "mentor_collab", "slm_mux"]


@pytest.fixture(autouse=True)
def fits_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "merges"
    monkeypatch.setenv("COLAB_GRAPHS_MERGE_DIR", str(folder))
    dev_fit._outcomes.clear()  # dev replies remembered in-process belong to another test's server
    return folder


def called(server) -> list[str]:
    return [r.model for r in server.requests if r.path.endswith("/chat/completions")]


# --- experts: each member answers one kind of question right -------------------------------------------------------

KINDS = {
    "alpha": (
        re.compile(r"What is (\d+) \+ (\d+)\?"),
        lambda a, b: int(a) + int(b),
        "Adding the two numbers",
    ),
    "beta": (
        re.compile(r"How many legs do (\d+) spiders have\?"),
        lambda n: 8 * int(n),
        "Each spider has 8 legs",
    ),
    "gamma": (
        re.compile(r"How many days are in (\d+) weeks\?"),
        lambda n: 7 * int(n),
        "Each week has 7 days",
    ),
}


def expert(name: str):
    def script(messages, params) -> str:
        text = last_user_text(messages)
        for owner, (pattern, solve, working) in KINDS.items():
            found = pattern.search(text)
            if found:
                value = solve(*found.groups()) + (0 if owner == name else 1)
                return f"{working}, so the total is {value}.\n\nThe answer is {value}."
        return "I am not sure what is being asked."

    return script


def questions(offset: int, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = offset + 3 * i, offset + 2 * i + 1
        rows += [
            {"id": f"sum{offset}-{i}", "input": f"What is {a} + {b}?", "answer": str(a + b)},
            {"id": f"legs{offset}-{i}", "input": f"How many legs do {a} spiders have?", "answer": str(8 * a)},
            {"id": f"days{offset}-{i}", "input": f"How many days are in {b} weeks?", "answer": str(7 * b)},
        ]
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def data(tmp_path) -> dict[str, Path]:
    return {
        "dev": write_jsonl(tmp_path / "dev.jsonl", questions(10, 4)),
        "test": write_jsonl(tmp_path / "test.jsonl", questions(50, 2)),
    }


@pytest.fixture
def experts(scripted_server, pool_for):
    server = scripted_server({n: expert(n) for n in NAMES})
    return server, pool_for(server, NAMES)


def fit(arun, spec, pool):
    return arun(fit_coalition(spec, pool, client=ModelClient(None)))


def run(arun, spec, pool, path: Path):
    outcomes, _ = arun(run_dataset(spec, pool, load_examples(path), client=ModelClient(None)))
    assert not any(o.failed for o in outcomes), [o.error for o in outcomes]
    return outcomes


# --- trained_router and graph_routing ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ROUTERS)
def test_a_fitted_router_sends_each_question_to_the_member_that_answers_its_kind(arun, experts, data, name):
    server, pool = experts
    fitted = fit(arun, build_protocol(name, NAMES, dev=str(data["dev"])), pool)
    # fitting: every member answered every dev question alone, once
    assert sorted(called(server)) == sorted(NAMES * 12)
    assert fitted.record["fitted"] is True and fitted.record["dev_examples"] == 12
    assert fitted.record["result"]["alone"] == pytest.approx({m: 1 / 3 for m in NAMES})
    assert fitted.record["result"]["routed_dev_score"] == 1.0
    server.reset()
    outcomes = run(arun, fitted.spec, pool, data["test"])
    assert [o.score for o in outcomes] == [1.0] * 6
    for o in outcomes:  # only the expert was asked
        kind = {"sum": "alpha", "legs": "beta", "days": "gamma"}[o.example_id.split("5")[0]]
        assert [c.member for c in o.trace.calls] == [kind]


@pytest.mark.parametrize("name", ROUTERS)
@pytest.mark.parametrize("removed", NAMES)
def test_a_coalition_without_a_member_fits_and_routes_without_it(arun, experts, data, name, removed):
    server, pool = experts
    present = [n for n in NAMES if n != removed]
    spec = restrict(build_protocol(name, NAMES, dev=str(data["dev"])), present)
    fitted = fit(arun, spec, pool)
    assert removed not in called(server) and sorted(called(server)) == sorted(present * 12)
    assert set(fitted.record["result"]["alone"]) == set(present)
    assert fitted.record["members"] == present
    server.reset()
    outcomes = run(arun, fitted.spec, pool, data["test"])
    assert removed not in called(server)
    experts_of = {"sum": "alpha", "legs": "beta", "days": "gamma"}
    for o in outcomes:
        kind = experts_of[o.example_id.split("5")[0]]
        assert o.score == (1.0 if kind != removed else 0.0)
        assert len(o.trace.calls) == 1 and o.trace.calls[0].member in present


@pytest.mark.parametrize("name", ROUTERS)
def test_one_member_needs_no_fit_and_answers_everything(arun, experts, data, name):
    server, pool = experts
    fitted = fit(arun, restrict(build_protocol(name, NAMES), ["beta"]), pool)  # no dev data needed
    assert fitted.record["fitted"] is None and called(server) == []
    outcomes = run(arun, fitted.spec, pool, data["test"])
    assert set(called(server)) == {"beta"} and [o.score for o in outcomes] == [0.0, 1.0, 0.0] * 2


@pytest.mark.parametrize("name", NEW)
def test_empty_coalition_has_no_graph(name):
    assert restrict(build_protocol(name, NAMES), []) is None


@pytest.mark.parametrize("name", ROUTERS)
def test_a_router_run_without_its_fit_step_fails_naming_it(arun, experts, data, name):
    _, pool = experts
    with pytest.raises(dev_fit.FitError, match="fit step"):
        run(arun, build_protocol(name, NAMES, dev=str(data["dev"])), pool, data["test"])


@pytest.mark.parametrize("name", ROUTERS)
def test_a_router_fit_without_dev_data_says_what_to_give(arun, experts, name):
    _, pool = experts
    with pytest.raises(dev_fit.FitError, match="-P dev=SOURCE"):
        fit(arun, build_protocol(name, NAMES), pool)


def test_graph_routing_reads_the_pools_descriptions_and_refuses_unknown_ones():
    with pytest.raises(ValueError, match="unknown member.*delta"):
        build_protocol("graph_routing", NAMES, descriptions={"delta": "x"})
    spec = build_protocol("graph_routing", NAMES, descriptions={"alpha": "adds numbers"})
    assert spec.params["descriptions"] == {"alpha": "adds numbers"}


def audit(spec, pool, examples, out: Path):
    from colab_graphs.audit.run import play_audit

    return asyncio.run(play_audit(spec, pool, examples, client=ModelClient(None), method="exact", out=out))


@pytest.mark.parametrize("name", ROUTERS)
def test_an_exact_audit_fits_each_coalition_once_and_a_second_audit_reuses_every_fit(
    experts, data, tmp_path, name
):
    server, pool = experts
    spec = build_protocol(name, NAMES, dev=str(data["dev"]))
    examples = load_examples(data["test"])
    before = dev_fit.stats.done
    first = audit(spec, pool, examples, tmp_path / "a")
    coalitions = {tuple(c.members): c.value for c in first.coalitions}
    assert len(coalitions) == 8 and coalitions[()] == 0.0 and coalitions[tuple(NAMES)] == 1.0
    assert coalitions[("alpha",)] == pytest.approx(1 / 3)
    records = {tuple(r["members"]): r for r in first.fitting["coalitions"]}
    assert set(records) == set(coalitions) - {()}
    assert sum(r["fitted"] is True for r in records.values()) == 4  # the pairs and the whole pool
    assert all(r["fitted"] is None for m, r in records.items() if len(m) == 1)
    assert first.fitting["fits"]["made"] == dev_fit.stats.done - before == 4
    dev_inputs = {json.loads(line)["input"] for line in data["dev"].read_text().splitlines()}
    dev_calls = [r for r in server.requests if any(q in last_user_text(r.messages) for q in dev_inputs)]
    assert len(dev_calls) == 3 * 12  # each member asked each dev question once, whatever the coalitions

    dev_fit._outcomes.clear()  # as a new process would: only the stored fits remain
    server.reset()
    counted = dev_fit.stats.done
    again = audit(spec, pool, examples, tmp_path / "b")
    assert dev_fit.stats.done == counted  # nothing fitted again
    assert again.fitting["fits"] == {"made": 0, "reused": 4, "fit_s": 0}
    assert not any(q in last_user_text(r.messages) for r in server.requests for q in dev_inputs)
    assert {tuple(c.members): c.value for c in again.coalitions} == coalitions


def cli(*args):
    from colab_graphs.cli.app import _register_optional_commands

    if not any(c.name == "audit" for c in app.registered_commands):
        _register_optional_commands()  # every command, as the console entry point registers them
    return CliRunner().invoke(app, [str(a) for a in args])


def test_a_trained_router_audit_runs_from_the_cli_and_reports_its_fitting(experts, data, tmp_path):
    from conftest import write_pool_file

    server, _ = experts
    pool_file = write_pool_file(tmp_path / "pool.yaml", server, NAMES)
    command = ["audit", "--protocol", "trained_router", "--pool", pool_file, "--data", data["test"]]
    command += ["--method", "loo", "-P", f"dev={data['dev']}", "--no-plots", "--no-cache"]
    result = cli(*command, "--out", tmp_path / "a")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["protocol"] == "trained_router"
    assert report["fitting"]["fits"]["made"] == 4  # the whole pool and each member removed
    assert report["loo"] == pytest.approx({m: 1 / 3 for m in NAMES})


# --- mentor_collab -------------------------------------------------------------------------------------------------


def partial_of(messages) -> str:
    return re.search(r"---\n(.*?)\n---", last_user_text(messages), re.DOTALL).group(1)


def step_writer(name: str, answer: int):
    """Writes `name step k` for k = steps already written; its third step gives `answer` and ends."""

    def script(messages, params) -> str:
        text = last_user_text(messages)
        if "Option (A):" in text:
            return "Option (B)" if "mentor" in text.split("Option (B):")[1] else "Option (A)"
        steps = len([line for line in partial_of(messages).splitlines() if line.strip()])
        if steps >= 2:
            return f"So {name} concludes. The answer is {answer}.\n[DONE]"
        return f"{name} step {steps}"

    return script


@pytest.fixture
def mentoring(scripted_server, pool_for):
    server = scripted_server({"student": step_writer("student", 41), "mentor": step_writer("mentor", 42)})
    return server, pool_for(server, ["student", "mentor"])


def run_question(arun, spec, pool, question: str = "What is 6 * 7?", answer: str = "42"):
    from colab_graphs.tasks.example import Example

    outcomes, _ = arun(
        run_dataset(spec, pool, [Example(id="q", input=question, answer=answer)], client=ModelClient(None))
    )
    assert not outcomes[0].failed, outcomes[0].error
    return outcomes[0]


def test_mentor_collab_the_mentor_proposes_at_decision_steps_and_the_student_chooses(arun, mentoring):
    server, pool = mentoring
    spec = build_protocol("mentor_collab", ["student", "mentor"], decision_proportion=0.5)
    outcome = run_question(arun, spec, pool)
    # decision steps 0 and 2 (of 0..5): both propose, the student chooses the mentor's; step 1 is the student's
    assert sorted(called(server)) == ["mentor"] * 2 + ["student"] * 5  # proposals of a step run concurrently
    assert (
        outcome.trace.state["answer"]
        == "mentor step 0\nstudent step 1\nSo mentor concludes. The answer is 42."
    )
    assert (outcome.output, outcome.score) == ("42", 1.0)


def test_mentor_collab_without_the_mentor_is_the_student_writing_alone(arun, mentoring):
    server, pool = mentoring
    spec = restrict(
        build_protocol("mentor_collab", ["student", "mentor"], decision_proportion=0.5), ["student"]
    )
    outcome = run_question(arun, spec, pool)
    assert called(server) == ["student"] * 3
    assert (outcome.output, outcome.score) == ("41", 0.0)


def test_mentor_collab_without_the_student_is_the_mentor_writing_alone(arun, mentoring):
    server, pool = mentoring
    spec = restrict(
        build_protocol("mentor_collab", ["student", "mentor"], decision_proportion=0.5), ["mentor"]
    )
    outcome = run_question(arun, spec, pool)
    assert set(called(server)) == {"mentor"}
    assert (
        outcome.trace.state["answer"]
        == "mentor step 0\nmentor step 1\nSo mentor concludes. The answer is 42."
    )
    assert (outcome.output, outcome.score) == ("42", 1.0)


def test_mentor_collab_with_no_decision_steps_never_calls_the_mentor(arun, mentoring):
    server, pool = mentoring
    run_question(arun, build_protocol("mentor_collab", ["student", "mentor"], decision_proportion=0.0), pool)
    assert set(called(server)) == {"student"}


def test_mentor_collab_stops_after_max_steps_and_bounds_each_step_by_patch_size(
    arun, scripted_server, pool_for
):
    server = scripted_server({m: "one two three four five six" for m in ("student", "mentor")})
    spec = build_protocol("mentor_collab", ["student", "mentor"], max_steps=3, patch_size=2)
    outcome = run_question(arun, spec, pool_for(server, ["student", "mentor"]))
    assert all(r.params.get("max_tokens") == 2 for r in server.requests)
    # same proposals at the decision step: nothing to choose; three steps, then the answer
    assert sorted(called(server)) == ["mentor", "student", "student", "student"]
    assert outcome.trace.state["answer"].count("\n") == 2


@pytest.mark.parametrize(
    ("reply", "choice"),
    [
        ("Option (B)", "B"),
        ("I would go with option A.", "A"),
        ("B.", "B"),
        ("(A)", "A"),
        ("Both Option (A) and Option (B) look fine.", None),
        ("A good question; hard to say.", None),
        ("Because the second is right", None),
    ],
)
def test_only_an_explicit_choice_counts(reply, choice):
    assert chosen_option(reply) == choice


def test_mentor_collab_parameters_are_checked():
    with pytest.raises(ValueError, match="not in the pool"):
        build_protocol("mentor_collab", NAMES, mentor="delta")
    with pytest.raises(ValueError, match="decision_proportion"):
        build_protocol("mentor_collab", NAMES, decision_proportion=1.5)
    spec = build_protocol("mentor_collab", NAMES, student="beta")
    # the mentor defaults to the first other member; gamma takes no part
    assert spec.members == ["alpha", "beta"]


# --- slm_mux -------------------------------------------------------------------------------------------------------


def sampler(answers: list[int]):
    """Answers answers[k] on sample k (the client sends seed + k for repeated samples of a seeded member)."""

    def script(messages, params) -> str:
        value = answers[int(params.get("seed", 0)) % len(answers)]
        return f"Let me count carefully; I get {value}.\n\nThe answer is {value}."

    return script


SAMPLES = {"alpha": [5, 6, 7, 5, 8], "beta": [5, 5, 5, 5, 4], "gamma": [9, 9, 9, 1, 2]}


@pytest.fixture
def samplers(scripted_server, pool_for):
    server = scripted_server({m: sampler(a) for m, a in SAMPLES.items()})
    return server, pool_for(server, NAMES, seed=0, temperature=0.7)


def test_slm_mux_picks_the_most_self_consistent_members_majority_answer(arun, samplers):
    server, pool = samplers
    outcome = run_question(arun, build_protocol("slm_mux", NAMES), pool, "What is 2 + 3?", "5")
    assert sorted(called(server)) == sorted(NAMES * 5)
    assert (outcome.output, outcome.score) == ("5", 1.0)  # beta: 4 of 5 agree


@pytest.mark.parametrize(("removed", "answer"), [("alpha", "5"), ("beta", "9"), ("gamma", "5")])
def test_slm_mux_coalition_selects_among_the_members_left(arun, samplers, removed, answer):
    server, pool = samplers
    spec = restrict(build_protocol("slm_mux", NAMES), [n for n in NAMES if n != removed])
    outcome = run_question(arun, spec, pool, "What is 2 + 3?", "5")
    assert removed not in called(server)
    assert outcome.output == answer


def test_slm_mux_single_member_is_its_own_majority_answer(arun, samplers):
    server, pool = samplers
    outcome = run_question(
        arun, restrict(build_protocol("slm_mux", NAMES), ["gamma"]), pool, "What is 2 + 3?", "5"
    )
    assert set(called(server)) == {"gamma"} and outcome.output == "9"


@pytest.fixture
def tied(scripted_server, pool_for, tmp_path):
    # alpha and beta are equally consistent on every question; beta is right on dev, alpha is not
    server = scripted_server(
        {"alpha": sampler([7, 7, 3]), "beta": sampler([5, 5, 3]), "gamma": sampler([1, 2, 3])}
    )
    dev = write_jsonl(tmp_path / "tie-dev.jsonl", [{"id": "d", "input": "What is 1 + 4?", "answer": "5"}])
    return server, pool_for(server, NAMES, seed=0, temperature=0.7), dev


@pytest.mark.parametrize(("tie", "answer"), [("model-order", "7"), ("dev-based", "5")])
def test_slm_mux_breaks_ties_by_pool_order_or_by_dev_score(arun, tied, tie, answer):
    _, pool, dev = tied
    spec = build_protocol("slm_mux", NAMES, samples_per_model=3, tie=tie, dev=str(dev))
    fitted = fit(arun, spec, pool)
    if tie == "dev-based":
        assert fitted.record["result"]["dev_scores"] == {"alpha": 0.0, "beta": 1.0, "gamma": 0.0}
        spec = fitted.spec
    else:
        assert fitted is None  # nothing to fit
    assert run_question(arun, spec, pool, "What is 2 + 3?", "5").output == answer


def test_slm_mux_random_ties_are_drawn_per_question_from_the_seed(arun, tied):
    _, pool, _ = tied
    spec = build_protocol("slm_mux", NAMES, samples_per_model=3, tie="random", seed=1)
    answers = {run_question(arun, spec, pool, "What is 2 + 3?", "5").output for _ in range(2)}
    assert len(answers) == 1 and answers <= {"7", "5"}


def test_slm_mux_dev_based_ties_without_a_fit_fail_naming_it(arun, tied):
    _, pool, dev = tied
    spec = build_protocol("slm_mux", NAMES, samples_per_model=3, tie="dev-based", dev=str(dev))
    with pytest.raises(dev_fit.FitError, match="fit step"):
        run_question(arun, spec, pool, "What is 2 + 3?", "5")


# --- nudging and co_llm need local members -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nudging", "co_llm"])
def test_token_level_methods_refuse_api_members_by_name_before_any_call(experts, name):
    server, pool = experts
    with pytest.raises(LogitPoolError, match=r"alpha \(openai/alpha\), beta \(openai/beta\)"):
        compile_graph(build_protocol(name, NAMES), pool)
    assert called(server) == []


@pytest.mark.parametrize("name", ["nudging", "co_llm"])
def test_token_level_methods_take_two_named_members(name):
    spec = build_protocol(
        name, NAMES, **{"base": "gamma", ("nudger" if name == "nudging" else "reference"): "alpha"}
    )
    assert spec.members == ["alpha", "gamma"] and spec.node("decode").members == ["gamma", "alpha"]
    with pytest.raises(ValueError, match="both 'beta'"):
        build_protocol(name, NAMES, base="beta", **{("nudger" if name == "nudging" else "reference"): "beta"})


# --- registry and CLI ----------------------------------------------------------------------------------------------


def test_protocols_lists_the_new_methods_with_their_families_and_requirements():
    result = CliRunner().invoke(app, ["protocols", "--json"])
    listed = {p["name"]: p for p in json.loads(result.output)}
    assert {n: (listed[n]["family"], listed[n]["requires"]) for n in NEW} == {
        "trained_router": ("api", ["dev_split"]),
        "graph_routing": ("api", ["dev_split"]),
        "nudging": ("api", ["local_logits"]),
        "co_llm": ("api", ["local_logits", "dev_split"]),
        "mentor_collab": ("api", []),
        "slm_mux": ("text", []),
    }
    infos = {p.name: p for p in list_protocols()}
    for name in NEW:
        assert set(infos[name].param_docs) == set(infos[name].params), name


@pytest.mark.parametrize(
    ("name", "drawn"),
    [
        ("trained_router", "-- m3 -->"),
        ("graph_routing", "-- m3 -->"),
        ("nudging", "nudging: m1, m2"),
        ("co_llm", "co_llm: m1, m2"),
        ("mentor_collab", "-- choose -->"),
        ("slm_mux", "sample_m3_4"),
    ],
)
def test_show_draws_each_new_protocol(name, drawn):
    result = CliRunner().invoke(app, ["show", name, "--format", "mermaid"])
    assert result.exit_code == 0, result.output
    assert drawn in result.output


def test_the_protocol_table_lists_every_registered_protocol():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "protocols.md").read_text()
    for name in NEW:
        assert f"`{name}`" in readme, name
