"""Weight-level protocols: merges checked against their definitions, searches on scripted scores, and audits
over three tiny local members (and three LoRA adapters of one base) from Python and from the CLI.

The merge tests work on small tensors; the model tests (marked slow) build three members from the zoo's
`tiny-random` with seeded perturbations (one architecture, other weights), so every merge is a new model.
Dev scores come from a test scorer that rewards letters a-m in the answer, so the searches see scores that
differ between models. Merged folders go to a fresh `COLAB_GRAPHS_MERGE_DIR` per test.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from colab_graphs.cli.app import app
from colab_graphs.coalition import restrict
from colab_graphs.fitting import fit_coalition, fit_step_of
from colab_graphs.local import merge
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol, get_protocol
from colab_graphs.protocols import weight
from colab_graphs.protocols.weight_search import es_search, greedy_soup_search, swarm_search
from colab_graphs.registry import FAMILIES
from colab_graphs.tasks.loaders import load_examples
from colab_graphs.tasks.scoring import register_scorer

torch = pytest.importorskip("torch")

METHODS = ["greedy_soup", "dare_ties", "model_swarms", "lorahub", "expo"]
MEMBERS = ["m0", "m1", "m2"]
SCORER = "weight_test_letters"
GREEDY = {"temperature": 0, "max_tokens": 6}


@register_scorer(SCORER)
def _letters(output: str, example) -> float:
    text = (output or "").lower()
    return sum(c in "abcdefghijklm" for c in text) / max(len(text), 1)


@pytest.fixture(autouse=True)
def merge_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "merges"
    monkeypatch.setenv("COLAB_GRAPHS_MERGE_DIR", str(folder))
    return folder


def state(seed: int, shapes=((3, 4), (5,))) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(shape, generator=g) for i, shape in enumerate(shapes)}


def same(a: dict, b: dict, tol: float = 1e-6) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=tol) for k in a)


# --- merges against their definitions ----------------------------------------------------------------------------


def test_a_soup_of_a_model_with_itself_is_that_model():
    m = state(1)
    assert same(merge.soup([m, m]), m)
    assert same(merge.soup([m, m, m]), m)


def test_ties_of_a_model_with_itself_is_that_model():
    base, m = state(0), state(1)
    assert same(merge.ties(base, [m, m]), m)
    assert same(merge.dare_ties(base, [m, m], drop_rate=0.0), m)


@pytest.mark.parametrize("density", [1.0, 0.5, 0.2])
def test_dare_ties_with_drop_rate_zero_equals_ties(density):
    base, models = state(0), [state(1), state(2), state(3)]
    weights = [1.0, 0.5, 2.0]
    expected = merge.ties(base, models, weights, density)
    assert same(merge.dare_ties(base, models, weights, drop_rate=0.0, density=density, seed=7), expected, 0)


def test_ties_elects_the_weighted_sign_and_averages_the_entries_that_agree():
    base = {"w": torch.zeros(4)}
    a = {"w": torch.tensor([1.0, -2.0, 3.0, 0.0])}
    b = {"w": torch.tensor([3.0, 1.0, -1.0, 0.0])}
    merged = merge.ties(base, [a, b], weights=[1.0, 1.0])
    # entry 0: both +, mean 2; entry 1: sum -1 elects -, only a agrees: -2; entry 2: sum 2 elects +, only a: 3
    assert torch.equal(merged["w"], torch.tensor([2.0, -2.0, 3.0, 0.0]))
    # weights move the election and the mean: b counts 3x (entry 2: 3 - 3 = 0, which elects +)
    merged = merge.ties(base, [a, b], weights=[1.0, 3.0])
    assert torch.equal(merged["w"], torch.tensor([2.5, 1.0, 3.0, 0.0]))


def test_ties_trims_each_task_vector_to_its_largest_entries():
    base = {"w": torch.zeros(4)}
    a = {"w": torch.tensor([0.1, -4.0, 3.0, 0.2])}
    assert torch.equal(merge.ties(base, [a], density=0.5)["w"], torch.tensor([0.0, -4.0, 3.0, 0.0]))


def test_dare_drops_about_its_rate_and_rescales_what_it_keeps():
    delta = torch.ones(20_000)
    out = merge.dare(delta, 0.75, torch.Generator().manual_seed(0))
    kept = out[out != 0]
    assert abs(len(kept) / len(delta) - 0.25) < 0.02
    assert torch.allclose(kept, torch.full_like(kept, 4.0))
    assert abs(out.mean().item() - 1.0) < 0.05  # unbiased


def test_dare_ties_is_reproducible_by_seed():
    base, models = state(0), [state(1), state(2)]
    first = merge.dare_ties(base, models, drop_rate=0.5, seed=3)
    assert same(first, merge.dare_ties(base, models, drop_rate=0.5, seed=3), 0)
    assert not same(first, merge.dare_ties(base, models, drop_rate=0.5, seed=4))


def test_expo_with_alpha_zero_returns_the_aligned_model_and_alpha_one_doubles_its_step():
    aligned, reference = state(1), state(2)
    assert same(merge.extrapolate(aligned, reference, 0.0), aligned, 0)
    doubled = {k: 2 * aligned[k] - reference[k] for k in aligned}
    assert same(merge.extrapolate(aligned, reference, 1.0), doubled)


def test_lora_composition_of_an_adapter_with_itself_is_that_adapter():
    adapter = {"x.lora_A.weight": torch.randn(2, 4), "x.lora_B.weight": torch.randn(4, 2)}
    assert same(merge.compose_adapters([adapter, adapter], [0.5, 0.5]), adapter)


def test_applying_an_adapter_adds_its_scaled_low_rank_product():
    base = {"model.q.weight": torch.randn(4, 4), "model.k.weight": torch.randn(4, 4)}
    a, b = torch.randn(2, 4), torch.randn(4, 2)
    adapter = {"base_model.model.model.q.lora_A.weight": a, "base_model.model.model.q.lora_B.weight": b}
    merged = merge.apply_adapter(base, adapter, {"r": 2, "lora_alpha": 8})
    assert torch.allclose(merged["model.q.weight"], base["model.q.weight"] + 4.0 * b @ a)
    assert torch.equal(merged["model.k.weight"], base["model.k.weight"])


def test_merging_states_of_other_shapes_names_the_parameter():
    with pytest.raises(merge.MergeError, match="w0"):
        merge.soup([state(1), state(2, shapes=((4, 4), (5,)))])


# --- searches, on scripted dev scores ----------------------------------------------------------------------------


def run(coro):
    return asyncio.run(coro)


def soup_scores(table: dict[tuple[str, ...], float]):
    seen = []

    async def score(members):
        seen.append(tuple(members))
        return table[tuple(members)]

    return score, seen


def test_greedy_soup_adds_a_member_only_when_the_dev_score_improves():
    table = {("a",): 0.5, ("b",): 0.7, ("c",): 0.6, ("a", "b"): 0.7, ("b", "c"): 0.8, ("a", "b", "c"): 0.9}
    score, seen = soup_scores(table)
    found = run(greedy_soup_search(["a", "b", "c"], score))
    # ranked b (0.7), c (0.6), a (0.5): b+c improves to 0.8 and is kept; a+b+c improves to 0.9
    assert found.soup == ["a", "b", "c"] and found.score == 0.9
    assert seen == [("a",), ("b",), ("c",), ("b", "c"), ("a", "b", "c")]
    table[("a", "b", "c")] = 0.8  # a tie: not an improvement
    found = run(greedy_soup_search(["a", "b", "c"], soup_scores(table)[0]))
    assert found.soup == ["b", "c"] and [t["added"] for t in found.tried] == [True, False]


def test_greedy_soup_keeps_ties_when_asked_as_moco_does():
    table = {("a",): 0.5, ("b",): 0.5, ("a", "b"): 0.5}
    assert run(greedy_soup_search(["a", "b"], soup_scores(table)[0])).soup == ["a"]
    assert run(greedy_soup_search(["a", "b"], soup_scores(table)[0], keep_ties=True)).soup == ["a", "b"]


def test_swarm_particles_stay_affine_combinations_and_the_best_seen_is_returned():
    seen = []

    async def score(c):  # peaks at an even mix of experts 0 and 1
        seen.append(c)
        return -((c[0] - 0.5) ** 2) - (c[1] - 0.5) ** 2 - c[2] ** 2

    found = run(swarm_search(3, score, population=6, max_iterations=8, seed=1))
    assert all(abs(sum(c) - 1.0) < 1e-9 for c in seen)
    assert seen[:3] == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]  # the experts themselves first
    best_seen = max(seen, key=lambda c: -((c[0] - 0.5) ** 2) - (c[1] - 0.5) ** 2 - c[2] ** 2)
    assert found.best == best_seen and found.score > -0.5  # better than any expert (-0.5)
    assert found.evaluations == len(seen)


def test_swarm_stops_when_the_global_best_stalls():
    async def flat(c):
        return 0.0

    found = run(swarm_search(2, flat, population=2, max_iterations=50, patience=3))
    assert found.iterations == 4


def test_es_search_starts_from_zero_stays_in_the_box_and_never_gets_worse():
    seen = []

    async def objective(w):
        seen.append(w)
        return (w[0] - 1.0) ** 2 + (w[1] + 2.0) ** 2

    found = run(es_search(2, objective, budget=30, bound=1.5, seed=0))
    assert seen[0] == [0.0, 0.0] and found.evaluations == len(seen) == 30
    assert all(-1.5 <= x <= 1.5 for w in seen for x in w)
    assert found.objective == min((w[0] - 1.0) ** 2 + (w[1] + 2.0) ** 2 for w in seen) < 5.0


# --- registry, CLI listing, pool checks -----------------------------------------------------------------------


def test_the_five_methods_are_registered_in_the_weight_family_with_a_fit_step():
    assert FAMILIES == ("api", "text", "logit", "weight", "basic")
    for name in METHODS:
        info = get_protocol(name)
        assert (info.family, info.requires) == ("weight", ["local_weights"])
        assert set(info.param_docs) == set(info.params), name
        assert fit_step_of(build_protocol(name, MEMBERS)) is weight.fit_weight_coalition
    assert fit_step_of(build_protocol("majority_vote", MEMBERS)) is None


def test_protocols_lists_the_four_families():
    result = CliRunner().invoke(app, ["protocols", "--json"])
    assert result.exit_code == 0, result.output
    families = {p["family"] for p in json.loads(result.output)}
    assert families == {"api", "text", "logit", "weight", "basic"}
    assert {p["name"] for p in json.loads(result.output) if p["family"] == "weight"} == set(METHODS)


@pytest.mark.parametrize("name", METHODS)
def test_show_draws_each_weight_protocol(name):
    result = CliRunner().invoke(app, ["show", name, "--format", "mermaid"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("flowchart TD") and "merged" in result.output


@pytest.mark.parametrize("name", METHODS)
def test_a_coalition_keeps_one_seat_held_by_its_first_member(name):
    spec = build_protocol(name, MEMBERS)
    assert restrict(spec, []) is None
    for kept in (["m1", "m2"], ["m2"]):
        seat = restrict(spec, kept).node(weight.SEAT)
        assert seat.member == kept[0] and seat.settings["model"] == weight.UNFITTED_MODEL


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("dare_ties", {"drop_rate": 1.0}, "drop_rate"),
        ("dare_ties", {"weights": {"zed": 1.0}}, "zed"),
        ("lorahub", {"budget": 0}, "budget"),
        ("model_swarms", {"population": 0}, "population"),
    ],
)
def test_bad_parameters_are_refused(name, params, message):
    with pytest.raises(ValueError, match=message):
        build_protocol(name, MEMBERS, **params)


def fit(spec, pool, scorer: str | None = SCORER):
    return asyncio.run(fit_coalition(spec, pool, client=ModelClient(None), scorer=scorer))


def test_api_members_are_refused_by_name_before_any_call():
    pool = Pool.from_dict({"m0": {"model": "local/tiny-random"}, "m1": {"model": "openai/gpt-x"}})
    with pytest.raises(weight.WeightPoolError, match=r"m1 \(openai/gpt-x\)"):
        fit(build_protocol("dare_ties", ["m0", "m1"]), pool)


# --- tiny local members ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_members) -> dict[str, Path]:
    """Three members of one architecture: `tiny-random` with seeded perturbations; and `base`, the original."""
    from colab_graphs.local.zoo import resolve

    return {"base": resolve("tiny-random"), **tiny_members(MEMBERS, 100)}


@pytest.fixture(scope="module")
def adapters(tiny, tmp_path_factory) -> dict[str, Path]:
    """Three LoRA adapters of `tiny-random` (random A and B, so each changes the model)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("tiny-adapters")
    out = {}
    for i, name in enumerate(MEMBERS):
        torch.manual_seed(200 + i)
        model = AutoModelForCausalLM.from_pretrained(tiny["base"])
        config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        get_peft_model(model, config).save_pretrained(root / name)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weight-data")
    for split, offset in (("dev", 10), ("test", 20)):
        with open(root / f"{split}.jsonl", "w") as fh:
            for i in range(2):
                record = {
                    "id": f"{split}{i}",
                    "input": f"What is {i + offset} + {i}?",
                    "answer": str(2 * i + offset),
                }
                fh.write(json.dumps(record) + "\n")
    return {"dev": root / "dev.jsonl", "test": root / "test.jsonl"}


def cli(*args: str | Path):
    from colab_graphs.cli.app import _register_optional_commands

    if not any(c.name == "audit" for c in app.registered_commands):
        _register_optional_commands()  # every command, as the console entry point registers them
    return CliRunner().invoke(app, [str(a) for a in args])


def write_pool(path: Path, folders: dict[str, Path]) -> Path:
    path.write_text(
        "models:\n"
        + "".join(f"  {m}: {{model: local/{folders[m]}, temperature: 0, max_tokens: 6}}\n" for m in MEMBERS)
    )
    return path


def local_pool(folders: dict[str, Path]) -> Pool:
    return Pool.from_dict({m: {"model": f"local/{folders[m]}", **GREEDY} for m in MEMBERS})


def params_for(name: str, tiny, data) -> dict:
    dev = {"dev": str(data["dev"])}
    return {
        "greedy_soup": dev,
        "dare_ties": {"drop_rate": 0.3},
        "model_swarms": {**dev, "population": 3, "max_iterations": 2},
        "lorahub": {**dev, "budget": 3},
        "expo": {**dev, "reference": str(tiny["base"]), "alpha": 0.5},
    }[name]


def audit(name, tiny, adapters, data, out: Path, **params):
    from colab_graphs.audit.run import play_audit

    pool = local_pool(adapters if name == "lorahub" else tiny)
    spec = build_protocol(name, MEMBERS, **{**params_for(name, tiny, data), **params})
    examples = load_examples(data["test"])
    client = ModelClient(None)
    return asyncio.run(
        play_audit(spec, pool, examples, client=client, method="exact", scorer=SCORER, out=out)
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_an_exact_audit_fits_and_merges_every_coalition_once(name, tiny, adapters, data, tmp_path):
    merges, fits = merge.stats.done, weight.stats.done
    report = audit(name, tiny, adapters, data, tmp_path / "first")
    coalitions = {tuple(c.members): c.value for c in report.coalitions}
    # every coalition: the whole pool, each member removed, each alone, the empty one (0)
    assert len(coalitions) == 8 and coalitions[()] == 0.0
    assert all(0.0 <= v <= 1.0 for v in coalitions.values()) and not report.failed_examples
    records = {tuple(r["members"]): r for r in report.fitting["coalitions"]}
    assert set(records) == set(coalitions) - {()}
    for members, record in records.items():  # a coalition fits without its absent members
        absent = set(MEMBERS) - set(members)
        assert not any(f'"{m}"' in json.dumps(record["result"]) for m in absent), record
    assert weight.stats.done - fits == report.fitting["fits"]["made"]
    assert merge.stats.done - merges >= report.fitting["merges"]["made"]
    assert report.fitting["merges"]["made"] + report.fitting["fits"]["made"] > 0
    counted = (merge.stats.done, weight.stats.done)

    again = audit(name, tiny, adapters, data, tmp_path / "second")
    assert (merge.stats.done, weight.stats.done) == counted  # nothing merged or fitted twice
    assert again.fitting["merges"]["made"] == again.fitting["fits"]["made"] == 0
    assert again.fitting["fits"]["reused"] == report.fitting["fits"]["made"]
    assert {tuple(c.members): c.value for c in again.coalitions} == coalitions


@pytest.mark.slow
def test_a_coalition_s_calls_go_to_the_merge_of_its_members(tiny, data):
    pool = local_pool(tiny)
    spec = build_protocol("dare_ties", MEMBERS, drop_rate=0.3, seed=5)
    fitted = fit(restrict(spec, ["m0", "m2"]), pool)
    folder = Path(fitted.spec.node(weight.SEAT).settings["model"].removeprefix("local/"))
    expected = merge.dare_ties(
        merge.load_state(tiny["m0"]), [merge.load_state(tiny["m2"])], [1.0], drop_rate=0.3, seed=5
    )
    assert same(merge.load_state(folder), expected, 0)
    from colab_graphs.runner import run_dataset

    outcomes, _ = asyncio.run(
        run_dataset(fitted.spec, pool, load_examples(data["test"])[:1], client=ModelClient(None))
    )
    assert [c.model for c in outcomes[0].trace.calls] == [f"local/{folder}"]
    assert [c.member for c in outcomes[0].trace.calls] == ["m0"]
    # without m0 the first member left is the base, and one member alone is that member
    assert fit(restrict(spec, ["m2"]), pool).spec.node(weight.SEAT).settings["model"] == f"local/{tiny['m2']}"


@pytest.mark.slow
def test_greedy_soup_keeps_only_members_that_improve_the_dev_score(tiny, data):
    pool = local_pool(tiny)
    fitted = fit(build_protocol("greedy_soup", MEMBERS, dev=str(data["dev"])), pool)
    result = fitted.record["result"]
    best = max(result["alone"].values())
    for tried in result["tried"]:
        assert tried["added"] == (tried["score"] > best)
        best = max(best, tried["score"]) if tried["added"] else best
    assert result["dev_score"] == best
    model = fitted.spec.node(weight.SEAT).settings["model"]
    if len(result["soup"]) > 1:
        expected = merge.soup([merge.load_state(tiny[m]) for m in result["soup"]])
        assert same(merge.load_state(Path(model.removeprefix("local/"))), expected)


@pytest.mark.slow
def test_expo_without_a_reference_or_a_search_without_dev_data_says_what_to_give(tiny):
    pool = local_pool(tiny)
    with pytest.raises(weight.FitError, match="reference=MODEL"):
        fit(build_protocol("expo", MEMBERS), pool)
    with pytest.raises(weight.FitError, match="-P dev=SOURCE"):
        fit(build_protocol("greedy_soup", MEMBERS), pool)


@pytest.mark.slow
def test_a_pool_mixing_architectures_is_refused_naming_the_members(tiny, tmp_path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny["m0"])
    config.hidden_size, config.intermediate_size = 32, 64
    other = tmp_path / "narrow"
    other.mkdir()
    config.save_pretrained(other)
    pool = Pool.from_dict(
        {**{m: {"model": f"local/{tiny[m]}"} for m in ("m0", "m1")}, "m2": {"model": f"local/{other}"}}
    )
    with pytest.raises(weight.WeightPoolError, match=r"m0, m1: qwen2, hidden 64.*m2: qwen2, hidden 32"):
        fit(build_protocol("dare_ties", MEMBERS), pool)


@pytest.mark.slow
def test_lorahub_refuses_members_that_are_not_adapters(tiny):
    with pytest.raises(weight.WeightPoolError, match="m0 .* is not a LoRA adapter"):
        fit(build_protocol("lorahub", MEMBERS, dev="x.jsonl"), local_pool(tiny))


@pytest.mark.slow
def test_an_adapter_alone_runs_as_its_base_with_the_adapter_merged(adapters):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from colab_graphs.local.provider import get_engine

    adapter = adapters["m1"]
    base = AutoModelForCausalLM.from_pretrained(merge.adapter_base(adapter))
    expected = PeftModel.from_pretrained(base, adapter).merge_and_unload().state_dict()
    served = get_engine(f"local/{adapter}").model.state_dict()
    assert all(torch.allclose(served[k], expected[k], atol=1e-5) for k in expected)


@pytest.mark.slow
def test_a_weight_audit_runs_from_the_cli_and_a_second_run_reuses_every_fit(tiny, data, tmp_path):
    pool_file = write_pool(tmp_path / "pool.yaml", tiny)
    command = ["audit", "--protocol", "greedy_soup", "--pool", str(pool_file), "--data", str(data["test"])]
    command += ["--scorer", SCORER, "--method", "exact", "-P", f"dev={data['dev']}", "--no-plots"]
    first = cli(*command, "--out", tmp_path / "a")
    assert first.exit_code == 0, first.output
    assert "fitting: 7 coalition(s); fits made 4" in first.output
    second = cli(*command, "--out", tmp_path / "b")
    assert second.exit_code == 0, second.output
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["fitting"]["fits"] == {"made": 0, "reused": 4, "fit_s": 0}
    assert report["fitting"]["merges"]["made"] == 0
    assert report["coalitions"] == json.loads((tmp_path / "a" / "report.json").read_text())["coalitions"]


@pytest.mark.slow
def test_run_fits_the_whole_pool_first(tiny, data, tmp_path):
    pool_file = write_pool(tmp_path / "pool.yaml", tiny)
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--protocol",
            "dare_ties",
            "--pool",
            str(pool_file),
            "--data",
            str(data["test"]),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    traces = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    assert {c["model"].split("/")[-1].split("-")[0] for t in traces for c in t["calls"]} == {"dare_ties"}


@pytest.mark.slow
def test_a_spec_run_without_its_fit_step_fails_naming_the_step(tiny, data):
    from colab_graphs.runner import run_dataset

    spec = build_protocol("dare_ties", MEMBERS)
    examples = load_examples(data["test"])[:1]
    outcomes, _ = asyncio.run(
        run_dataset(spec, local_pool(tiny), examples, client=ModelClient(None, retries=0))
    )
    assert outcomes[0].failed and "fit-step" in outcomes[0].error
