"""MoCo's trained text-level methods end to end: heterogeneous_swarms, multiagent_finetuning, sparta, agglm.

`heterogeneous_swarms` runs over real HTTP: scripted members whose answers depend on what they read (a solver, a
follower that adopts the first previous response, a member that is always wrong), so the searched DAG decides
the score. The trained methods fine-tune tiny local members (the zoo's `tiny-random`, seeded perturbations,
shared with the other tiny-model tests through `tiny_members` in conftest.py) beside scripted API members: a
few optimizer steps per fit. Each method is checked on the whole pool, each member removed and the empty
coalition (a coalition's fit never calls an absent member), and by an audit run twice: the second refits
nothing (`dev_fit.stats` counts fits). Fits go to a fresh `COLAB_GRAPHS_MERGE_DIR` per test (`fit_home`).
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
from colab_graphs.fitting import fit_coalition, fit_step_of
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol, list_protocols
from colab_graphs.protocols import dev_fit
from colab_graphs.protocols.text_swarms import decode
from colab_graphs.runner import run_dataset
from colab_graphs.tasks.loaders import load_examples
from colab_graphs.tasks.scoring import register_task
from colab_graphs.tasks.task_types import Score, TaskType
from colab_graphs.testing.scripts import last_user_text

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("fit_home")]

METHODS = ["heterogeneous_swarms", "multiagent_finetuning", "sparta", "agglm"]
NAMES = ["alpha", "beta", "gamma"]


def called(server) -> list[str]:
    return [r.model for r in server.requests if r.path.endswith("/chat/completions")]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sums(prefix: str, offset: int, n: int) -> list[dict]:
    return [
        {
            "id": f"{prefix}{i}",
            "input": f"What is {offset + i} + {2 * i + 1}?",
            "answer": str(offset + 3 * i + 1),
        }
        for i in range(n)
    ]


@pytest.fixture
def data(tmp_path) -> dict[str, Path]:
    return {
        "dev": write_jsonl(tmp_path / "dev.jsonl", sums("dev", 10, 3)),
        "test": write_jsonl(tmp_path / "test.jsonl", sums("test", 40, 2)),
    }


def fit(arun, spec, pool, scorer=None):
    return arun(fit_coalition(spec, pool, client=ModelClient(None), scorer=scorer))


def run(arun, spec, pool, path: Path, scorer=None):
    outcomes, _ = arun(run_dataset(spec, pool, load_examples(path), client=ModelClient(None), scorer=scorer))
    assert not any(o.failed for o in outcomes), [o.error for o in outcomes]
    return outcomes


def audit(spec, pool, examples, out: Path, scorer=None, method="exact"):
    from colab_graphs.audit.run import play_audit

    return asyncio.run(
        play_audit(spec, pool, examples, client=ModelClient(None), method=method, out=out, scorer=scorer)
    )


# --- every method --------------------------------------------------------------------------------------------------


def test_the_four_methods_are_registered_in_the_text_family_with_a_fit_step():
    infos = {p.name: p for p in list_protocols()}
    for name in METHODS:
        assert infos[name].family == "text"
        assert set(infos[name].param_docs) == set(infos[name].params), name
        assert fit_step_of(build_protocol(name, ["m1", "m2", "m3"])) is not None


def test_protocols_lists_them():
    result = CliRunner().invoke(app, ["protocols", "--json"])
    assert result.exit_code == 0, result.output
    assert {p["name"] for p in json.loads(result.output) if p["family"] == "text"} >= set(METHODS)


@pytest.mark.parametrize(
    ("name", "drawn"),
    [
        ("heterogeneous_swarms", "inbox_m3"),
        ("multiagent_finetuning", "r2_m3"),
        ("sparta", "best"),
        ("agglm", "aggregate"),
    ],
)
def test_show_draws_each(name, drawn):
    result = CliRunner().invoke(app, ["show", name, "--format", "mermaid"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("flowchart TD") and drawn in result.output


@pytest.mark.parametrize("name", METHODS)
def test_the_empty_coalition_has_no_graph(name):
    assert restrict(build_protocol(name, NAMES), []) is None


def test_the_protocol_table_lists_them():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "protocols.md").read_text()
    for name in METHODS:
        assert re.search(rf"^\| `{name}` \| text \|", readme, re.MULTILINE), name


# --- heterogeneous_swarms ------------------------------------------------------------------------------------------

QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


def sum_of(text: str) -> int:
    a, b = QUESTION.search(text).groups()
    return int(a) + int(b)


def solver(messages, params) -> str:
    return f"Adding gives {sum_of(last_user_text(messages))}.\n\nThe answer is {sum_of(last_user_text(messages))}."


def follower(messages, params) -> str:
    """Adopts the first previous response's answer; alone, it is off by one."""
    text = last_user_text(messages)
    previous = re.search(r"The answer is (\d+)", text)
    value = int(previous.group(1)) if previous else sum_of(text) + 1
    return f"I follow the others.\n\nThe answer is {value}."


def wrong(messages, params) -> str:
    return f"Roughly.\n\nThe answer is {sum_of(last_user_text(messages)) + 2}."


@pytest.fixture
def swarm(scripted_server, pool_for):
    server = scripted_server({"alpha": solver, "beta": follower, "gamma": wrong})
    return server, pool_for(server, NAMES)


def test_decode_follows_moco_s_graph_decode_with_argmax():
    # end: least out-weight (node 1); then the node with most out-weight feeds the placed node it weighs most
    assert decode([[0, 0.9, 0.1], [0.2, 0, 0.1], [0.8, 0.7, 0]]) == {2: 1, 0: 1}
    assert decode([[5, 0.1], [0.3, 5]]) == {1: 0}  # the diagonal is ignored
    feeds = decode([[0, 0.4, 0.2, 0.9], [0.1, 0, 0.5, 0.3], [0.6, 0.2, 0, 0.1], [0.2, 0.2, 0.2, 0]])
    assert sorted(feeds) == [0, 1, 2] and 3 not in feeds  # one end node, every other node feeds one node


def test_a_fitted_swarm_answers_along_its_dag(arun, swarm, data):
    server, pool = swarm
    fitted = fit(arun, build_protocol("heterogeneous_swarms", NAMES, dev=str(data["dev"])), pool)
    result = fitted.record["result"]
    assert fitted.record["fitted"] is True and result["dev_score"] == 1.0
    # alpha is right; beta is right only when alpha's response comes first in what it reads
    assert result["end"] == "alpha" or (result["end"] == "beta" and result["feeds"].get("alpha") == "beta")
    server.reset()
    outcomes = run(arun, fitted.spec, pool, data["test"])
    assert [o.score for o in outcomes] == [1.0, 1.0]
    calls = outcomes[0].trace.calls
    assert sorted(c.member for c in calls) == NAMES  # every member answers once
    end = next(c for c in calls if c.member == result["end"])
    readers = [m for m, target in result["feeds"].items() if target == result["end"]]
    for m in readers:  # the end node reads its predecessors, labelled by pool position
        assert f"Node {NAMES.index(m) + 1}:" in last_user_text(end.messages)


@pytest.mark.parametrize("removed", NAMES)
def test_a_swarm_without_a_member_searches_without_it(arun, swarm, data, removed):
    server, pool = swarm
    present = [n for n in NAMES if n != removed]
    fitted = fit(
        arun, restrict(build_protocol("heterogeneous_swarms", NAMES, dev=str(data["dev"])), present), pool
    )
    assert removed not in called(server) and set(called(server)) == set(present)
    assert fitted.record["members"] == present and set(fitted.spec.members) == set(present)
    assert fitted.record["result"]["dev_score"] == (0.0 if removed == "alpha" else 1.0)
    server.reset()
    run(arun, fitted.spec, pool, data["test"])
    assert removed not in called(server)


def test_a_swarm_of_one_needs_no_fit(arun, swarm, data):
    server, pool = swarm
    fitted = fit(arun, restrict(build_protocol("heterogeneous_swarms", NAMES), ["gamma"]), pool)
    assert fitted.record["fitted"] is None and called(server) == []
    assert [o.score for o in run(arun, fitted.spec, pool, data["test"])] == [0.0, 0.0]


def test_a_swarm_run_without_its_fit_step_fails_naming_it(arun, swarm, data):
    _, pool = swarm
    spec = build_protocol("heterogeneous_swarms", NAMES, dev=str(data["dev"]))
    outcomes, _ = arun(
        run_dataset(spec, pool, load_examples(data["test"]), client=ModelClient(None, retries=0))
    )
    assert all(o.failed and "fit-step" in o.error for o in outcomes)


def test_a_swarm_audit_fits_each_coalition_once_and_a_second_audit_refits_nothing(swarm, data, tmp_path):
    server, pool = swarm
    spec = build_protocol("heterogeneous_swarms", NAMES, dev=str(data["dev"]))
    examples = load_examples(data["test"])
    before = dev_fit.stats.done
    first = audit(spec, pool, examples, tmp_path / "a")
    values = {tuple(c.members): c.value for c in first.coalitions}
    assert values[tuple(NAMES)] == 1.0 and values[()] == 0.0 and values[("beta", "gamma")] == 0.0
    assert first.loo == pytest.approx({"alpha": 1.0, "beta": 0.0, "gamma": 0.0})
    assert (
        first.fitting["fits"]["made"] == dev_fit.stats.done - before == 4
    )  # the pool and each member removed
    assert first.fitting["fits"]["fit_s"] > 0
    server.reset()
    again = audit(spec, pool, examples, tmp_path / "b")
    assert dev_fit.stats.done - before == 4
    assert again.fitting["fits"] == {"made": 0, "reused": 4, "fit_s": 0}
    dev_inputs = {json.loads(line)["input"] for line in data["dev"].read_text().splitlines()}
    assert not any(q in last_user_text(r.messages) for r in server.requests for q in dev_inputs)
    assert {tuple(c.members): c.value for c in again.coalitions} == values


def test_a_swarm_audit_runs_from_the_cli_and_reports_its_fitting(swarm, data, tmp_path):
    from conftest import write_pool_file

    from colab_graphs.cli.app import _register_optional_commands

    server, _ = swarm
    if not any(c.name == "audit" for c in app.registered_commands):
        _register_optional_commands()  # every command, as the console entry point registers them
    command = [
        "audit",
        "--protocol",
        "heterogeneous_swarms",
        "--pool",
        write_pool_file(tmp_path / "p.yaml", server, NAMES),
    ]
    command += [
        "--data",
        data["test"],
        "-P",
        f"dev={data['dev']}",
        "-P",
        "max_iterations=2",
        "--method",
        "loo",
    ]
    result = CliRunner().invoke(
        app, [str(a) for a in [*command, "--no-plots", "--no-cache", "--out", tmp_path / "a"]]
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["protocol"] == "heterogeneous_swarms" and report["fitting"]["fits"]["made"] == 4
    assert report["loo"] == pytest.approx({"alpha": 1.0, "beta": 0.0, "gamma": 0.0})


# --- tiny local members beside scripted API members ----------------------------------------------------------------

LOCAL = ["l1", "l2"]
AGREE = "moco_text_agree"
GREEDY = {"temperature": 0, "max_tokens": 6}


class Agreeing(TaskType):
    """Every reply that says anything commits to the one answer "agreed", and "agreed" is right: tiny random
    models then reach a consensus, and every turn agrees with it."""

    name = AGREE

    def instruction(self, example) -> str:
        return "Answer."

    def extract(self, reply: str, example) -> str | None:
        return "agreed" if reply.strip() else None

    def score(self, output: str, example) -> Score:
        return Score(1.0 if output.strip() else 0.0, output or None)


register_task(Agreeing())


@pytest.fixture(scope="module")
def tiny(tiny_members) -> dict[str, Path]:
    return tiny_members(LOCAL, 500)


def mixed_pool(tiny, server, names=(*LOCAL, "api")) -> Pool:
    models = {m: {"model": f"local/{tiny[m]}", **GREEDY} for m in LOCAL}
    models["api"] = {"model": "openai/api", "api_base": server.base_url, "api_key": "sk-test", **GREEDY}
    return Pool.from_dict({m: models[m] for m in names})


@pytest.fixture
def api(scripted_server):
    return scripted_server({"api": "I agree with that.\n\nThe answer is 7."})


def weights_of(folder) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


def changed(a, b) -> bool:
    return any(not (weights_of(a)[k] == weights_of(b)[k]).all() for k in weights_of(a))


# --- multiagent_finetuning -----------------------------------------------------------------------------------------


def scripted_debater(first: int, last: int):
    """Answers `first` alone and `last` once it has read the others."""

    def script(messages, params) -> str:
        value = last if "previous round" in last_user_text(messages) else first
        return f"Let me see.\n\nThe answer is {value}."

    return script


def test_select_turns_keeps_what_agrees_with_the_consensus_as_the_paper_defines(
    arun, scripted_server, pool_for, tmp_path
):
    from colab_graphs.protocols.text_finetune import select_turns
    from colab_graphs.protocols.text_fit import run_on_dev

    server = scripted_server(
        {"alpha": scripted_debater(5, 5), "beta": scripted_debater(6, 5), "gamma": scripted_debater(5, 6)}
    )
    pool = pool_for(server, NAMES)
    examples = load_examples(
        write_jsonl(tmp_path / "d.jsonl", [{"id": "q", "input": "What is 2 + 3?", "answer": "5"}])
    )
    spec = build_protocol("debate", NAMES)
    outcomes = arun(run_on_dev(spec, pool, examples, client=ModelClient(None), scorer=None))
    assert outcomes[0].output == "5"  # the consensus: the last round's vote
    kept = select_turns(outcomes, examples, NAMES, 2)
    texts = {
        m: ([s.completion for g in k.generation for s in g], [s.completion for g in k.critic for s in g])
        for m, k in kept.items()
    }
    # generation data: round-1 answers agreeing with the consensus; critic data: last-round answers agreeing
    # with it, whether the member agreed all along (alpha: DC+) or was persuaded (beta: DC-)
    assert [bool(g) for g, _ in texts.values()] == [True, False, True]
    assert [bool(c) for _, c in texts.values()] == [True, True, False]
    assert all(c[0].endswith("The answer is 5.") for _, c in texts.values() if c)
    assert kept["alpha"].generation[0][0].messages[-1]["content"].startswith("What is 2 + 3?")
    # keep="correct": a debate whose answer is wrong teaches nothing
    wrong_gold = load_examples(
        write_jsonl(tmp_path / "w.jsonl", [{"id": "q", "input": "What is 2 + 3?", "answer": "6"}])
    )
    outcomes = arun(run_on_dev(spec, pool, wrong_gold, client=ModelClient(None), scorer=None))
    kept = select_turns(outcomes, wrong_gold, NAMES, 2, keep="correct")
    assert not any(k.generation or k.critic for k in kept.values())


def test_multiagent_finetuning_refuses_api_members_by_name_before_any_call(arun, tiny, api, data):
    from colab_graphs.protocols.text_fit import LocalMembersError

    pool = mixed_pool(tiny, api)
    with pytest.raises(LocalMembersError, match=r"api \(openai/api\).*frozen_api_members=true"):
        fit(arun, build_protocol("multiagent_finetuning", pool.names, dev=str(data["dev"])), pool, AGREE)
    assert called(api) == []


def test_multiagent_finetuning_fine_tunes_each_local_member_and_an_audit_reuses_every_fit(
    arun, tiny, api, data, tmp_path
):
    pool = mixed_pool(tiny, api)
    spec = build_protocol(
        "multiagent_finetuning",
        pool.names,
        dev=str(data["dev"]),
        dev_limit=2,
        frozen_api_members=True,
        sft_learning_rate=0.01,
    )
    before = dev_fit.stats.done
    fitted = fit(arun, spec, pool, AGREE)
    result = fitted.record["result"]
    assert fitted.record["fitted"] is True and result["frozen"] == ["api"]
    assert set(result["models"]) == {f"{m}-{role}" for m in LOCAL for role in ("generation", "critic")}
    # every turn agreed, on 2 questions; the critic data are drawn: a 1 - w share of the DC+ turns
    assert result["segments"] == {"l1-generation": 2, "l1-critic": 1, "l2-generation": 2, "l2-critic": 1}
    for label, folder in result[
        "models"
    ].items():  # all weights trained: each model moved away from its member
        assert changed(folder, tiny[label.split("-")[0]])
    models = {n.name: n.settings.get("model") for n in fitted.spec.nodes if hasattr(n, "settings")}
    assert models["r1_l1"] == f"local/{result['models']['l1-generation']}"
    assert models["r2_l2"] == f"local/{result['models']['l2-critic']}"
    assert models["r1_api"] is None and models["r2_api"] is None  # the API member debates as it is
    outcomes = run(arun, fitted.spec, pool, data["test"], AGREE)
    assert {c.model for c in outcomes[0].trace.calls if c.member == "l1"} == {
        models["r1_l1"],
        models["r2_l1"],
    }

    examples = load_examples(data["test"])[:1]
    first = audit(spec, pool, examples, tmp_path / "a", AGREE, method="loo")
    records = {tuple(r["members"]): r for r in first.fitting["coalitions"]}
    assert set(records) == {(*LOCAL, "api"), ("l2", "api"), ("l1", "api"), tuple(LOCAL)}
    assert first.fitting["fits"]["made"] == 3 and first.fitting["fits"]["reused"] == 1  # the pool's fit above
    assert dev_fit.stats.done - before == 4
    for members, record in records.items():  # a coalition fine-tunes its own members only
        assert {label.split("-")[0] for label in record["result"]["models"]} == set(members) - {"api"}
    again = audit(spec, pool, examples, tmp_path / "b", AGREE, method="loo")
    assert again.fitting["fits"] == {"made": 0, "reused": 4, "fit_s": 0}
    assert dev_fit.stats.done - before == 4


# --- sparta --------------------------------------------------------------------------------------------------------


def test_sparta_deals_each_member_one_question_per_loop_against_another_member():
    import random

    from colab_graphs.protocols.text_sparta import matches

    dealt = matches(7, NAMES, dict.fromkeys(NAMES, 100.0), random.Random(0))
    assert [q for q, _, _ in dealt] == list(range(7))
    assert all(sorted(first for _, first, _ in dealt[k : k + 3]) == NAMES for k in (0, 3))
    assert all(first != opponent and opponent in NAMES for _, first, opponent in dealt)


def test_sparta_reads_a_judge_s_score_as_moco_does():
    from colab_graphs.protocols.text_sparta import judge_score

    assert judge_score('{"score": 7}') == 7
    assert judge_score('Sure: {"score": 3} is fair') == 3
    assert judge_score("I give it 8/10.") == 8
    assert judge_score('{"score": 11}') is None and judge_score("no idea") is None


def test_sparta_reputations_move_by_the_reputation_weighted_verdict():
    import math

    from colab_graphs.protocols.text_sparta import Ratings

    ratings = Ratings(["a", "b", "j1", "j2"], score={"j1": 300.0})
    assert ratings.weighted("a", "b", {"j1": (8, 2), "j2": (2, 8)}) == pytest.approx((6.5, 3.5))
    ratings.update("a", "b", {"j1": (8, 2), "j2": (2, 8)})
    k = max(5.0, 10.0 * 0.9 ** (1 / 10))
    # equal reputations: the win probabilities tie, so the gap is epsilon
    assert ratings.score["a"] == pytest.approx(100.0 + k * 3.0 * math.tanh(0.5) * 0.01 / 20.0)
    assert ratings.score["b"] < 100.0 and ratings.score["j1"] == 300.0  # judges do not move
    ratings.update("a", "b", {})  # no judge: nothing moves
    assert ratings.updates == 2 and ratings.deviation["a"] == 0.5


def combatant(messages, params) -> str:
    """Competes with a fixed answer; judges by the length of the response."""
    found = re.search(r"Response to be evaluated: (.*)\n\nOperation", last_user_text(messages), re.S)
    if found:
        return json.dumps({"score": 1 + len(found.group(1)) % 10})
    return "I agree with that.\n\nThe answer is 7."


def test_sparta_trains_local_members_on_winners_answers_and_the_best_answers_alone(
    arun, tiny, scripted_server, tmp_path
):
    server = scripted_server({"api": combatant})
    pool = mixed_pool(tiny, server)
    dev = write_jsonl(tmp_path / "dev6.jsonl", sums("dev", 10, 6))
    spec = build_protocol("sparta", pool.names, dev=str(dev), frozen_api_members=True, sft_learning_rate=0.01)
    before = dev_fit.stats.done
    fitted = fit(arun, spec, pool, AGREE)
    result = fitted.record["result"]
    assert fitted.record["fitted"] is True and result["frozen"] == ["api"]
    # the API member judges the local members' pairs; a tiny member's garbage verdict is a tie (5 and 5)
    assert any("Response to be evaluated" in last_user_text(r.messages) for r in server.requests)
    won = [p for p in result["pairs"] if p["winner"] is not None]
    assert won and all(sorted(p["pair"]) == LOCAL for p in won) and result["preferences"] == len(won)
    assert set(result["models"]) == set(LOCAL)
    assert all(changed(result["models"][m], tiny[m]) for m in LOCAL)
    # every reply scores 1 under this task: the first member in pool order is the best, as fine-tuned
    assert result["best"] == "l1"
    seat = fitted.spec.node("best")
    assert seat.member == "l1" and seat.settings["model"] == f"local/{result['models']['l1']}"
    outcomes = run(arun, fitted.spec, pool, dev, AGREE)
    assert {c.model for o in outcomes for c in o.trace.calls} == {seat.settings["model"]}

    first = audit(spec, pool, load_examples(dev)[:1], tmp_path / "a", AGREE, method="loo")
    records = {tuple(r["members"]): r for r in first.fitting["coalitions"]}
    assert first.fitting["fits"]["made"] == 3 and first.fitting["fits"]["reused"] == 1
    for members in (("l2", "api"), ("l1", "api"), tuple(LOCAL)):  # two members: no judge, nothing learnt
        assert records[members]["result"]["preferences"] == 0 and records[members]["result"]["models"] == {}
        assert set(records[members]["result"]["dev_scores"]) == set(members)
    again = audit(spec, pool, load_examples(dev)[:1], tmp_path / "b", AGREE, method="loo")
    assert again.fitting["fits"] == {"made": 0, "reused": 4, "fit_s": 0}
    assert dev_fit.stats.done - before == 4


# --- agglm ---------------------------------------------------------------------------------------------------------


def even_solver(messages, params) -> str:
    """Right when the first number is even, off by one otherwise."""
    text = last_user_text(messages)
    a = int(QUESTION.search(text).group(1))
    value = sum_of(text) + (0 if a % 2 == 0 else 1)
    return f"Adding.\n\nThe answer is {value}."


@pytest.fixture
def proposers(scripted_server):
    return scripted_server({"p1": even_solver, "p2": wrong})


def agglm_pool(tiny, server, names=("l1", "p1", "p2")) -> Pool:
    models = {"l1": {"model": f"local/{tiny['l1']}", **GREEDY}}
    for p in ("p1", "p2"):
        models[p] = {"model": f"openai/{p}", "api_base": server.base_url, "api_key": "sk-test", **GREEDY}
    return Pool.from_dict({m: models[m] for m in names})


AGGLM_PARAMS = {"num_generations": 2, "max_completion_length": 8, "dev_limit": 3}


def test_agglm_refuses_an_api_aggregator_by_name(arun, tiny, proposers, data):
    from colab_graphs.protocols.text_fit import LocalMembersError

    pool = agglm_pool(tiny, proposers, ("p1", "l1"))
    with pytest.raises(LocalMembersError, match=r"p1 \(openai/p1\).*-P aggregator=NAME"):
        fit(arun, build_protocol("agglm", pool.names, dev=str(data["dev"])), pool)
    assert called(proposers) == []


def test_agglm_without_its_aggregator_is_the_proposers_vote_and_alone_it_answers_untrained(
    arun, tiny, proposers, data
):
    pool = agglm_pool(tiny, proposers)
    spec = build_protocol("agglm", pool.names, dev=str(data["dev"]))
    voted = fit(arun, restrict(spec, ["p1", "p2"]), pool)
    assert voted.record["fitted"] is None and called(proposers) == []
    outcomes = run(arun, voted.spec, pool, data["test"])
    assert [o.score for o in outcomes] == [1.0, 0.0]  # p1's answer wins the tie; right on even first numbers
    alone = fit(arun, restrict(spec, ["l1"]), pool)
    assert alone.record["fitted"] is None
    assert alone.spec.node("aggregate").settings["model"] == f"local/{tiny['l1']}"


def test_agglm_trains_the_aggregator_seat_with_the_c_rl_trainer_and_an_audit_reuses_every_fit(
    arun, tiny, proposers, data, tmp_path
):
    pool = agglm_pool(tiny, proposers)
    spec = build_protocol("agglm", pool.names, dev=str(data["dev"]), **AGGLM_PARAMS)
    before = dev_fit.stats.done
    # without p1, p2 alone proposes: wrong everywhere, so every dev question is hard; p1 is never asked
    without_p1 = fit(arun, restrict(spec, ["l1", "p2"]), pool)
    assert set(called(proposers)) == {"p2"}
    result = without_p1.record["result"]
    assert (result["hard"], result["easy"], result["trained_on"], result["steps"]) == (3, 0, 3, 3)
    metrics = (Path(result["model"]).parent / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 3 and "system_reward" in json.loads(metrics[0])  # GRPO on the system's outcome

    examples = load_examples(data["test"])[:1]
    first = audit(spec, pool, examples, tmp_path / "a", method="loo")
    records = {tuple(r["members"]): r for r in first.fitting["coalitions"]}
    assert records[("p1", "p2")]["fitted"] is None  # no aggregator: the proposers vote
    whole = records[("l1", "p1", "p2")]["result"]
    # p1 (first in the vote's tie) is wrong on an odd first number: one hard question, and one easy one drawn
    assert (whole["hard"], whole["easy"], whole["trained_on"]) == (1, 2, 2)
    assert first.fitting["fits"]["made"] == 2 and first.fitting["fits"]["reused"] == 1
    fitted = fit(arun, spec, pool)
    assert fitted.record["fitted"] is False
    assert fitted.spec.node("aggregate").settings["model"] == f"local/{whole['model']}"
    outcomes = run(arun, fitted.spec, pool, data["test"])
    assert {c.model for c in outcomes[0].trace.calls if c.member == "l1"} == {f"local/{whole['model']}"}
    again = audit(spec, pool, examples, tmp_path / "b", method="loo")
    assert again.fitting["fits"] == {"made": 0, "reused": 3, "fit_s": 0}
    assert dev_fit.stats.done - before == 3
