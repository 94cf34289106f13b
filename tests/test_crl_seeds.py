"""Reproducible C-RL: one seed, one run; seeded collaborator samples; a held-out split that was never trained on.

The system is the toy `relay` graph (colab_graphs/trainers/toy.py) with a scripted solver over real HTTP and
a *sampling* in-process collaborator (`helper`, tiny-random at temperature 1), then the tiny random policy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from colab_graphs.tasks.example import Example
from colab_graphs.testing.server import server_for_configs
from colab_graphs.trainers import system
from colab_graphs.trainers.config import ConfigError, config_from_dict
from colab_graphs.trainers.rollout import LoopThread, PolicyRouter, RolloutRunner

G = 4
TIMES = {"wall_s", "step_time", "generation_s", "credit_s", "training_s"}  # wall-clock, not the run's content


def _settings(out: Path, **overrides: object) -> dict:
    return {
        "graph": "colab_graphs.trainers.toy:relay",
        "scorer": "toy_marker",
        "pool": {
            "policy": {"max_tokens": 6},
            "helper": {"model": "local/tiny-random", "temperature": 1.0, "max_tokens": 5},
            "solver": {"temperature": 0.0},  # greedy: one answer per request, shared by every rollout
        },
        "scripted_members": {"solver": {"script": "arithmetic_solver", "args": {"accuracy": 0.5, "seed": 2}}},
        "limit": 16,
        "eval_size": 4,
        "num_generations": G,
        "per_device_train_batch_size": 2 * G,
        "max_steps": 2,
        "learning_rate": 2e-3,
        "max_completion_length": 6,
        "use_cpu": True,
        "output_dir": str(out),
        "cache_dir": str(out.parent / f"{out.name}-cache"),
        **overrides,
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Three 2-step trainings: two with seed 0, one with seed 1; and whether the policy ever generated in
    train mode."""
    from colab_graphs.local.local_engine import LocalEngine
    from colab_graphs.trainers.pipeline import train

    modes: list[bool] = []
    generate_batch = LocalEngine.generate_batch

    def spy(self, requests, *joining):  # noqa: ANN001, ANN002, ANN202 - the worker passes its admit/finished
        modes.append(bool(self.model.training))
        return generate_batch(self, requests, *joining)

    root = tmp_path_factory.mktemp("seeds")
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LocalEngine, "generate_batch", spy)
        for name, seed in (("a", 0), ("b", 0), ("c", 1)):
            out[name] = root / name
            train(config_from_dict(_settings(out[name], seed=seed)))
    return {**out, "modes": modes}


def _metrics(folder: Path) -> list[dict]:
    lines = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in TIMES} for line in lines]


@pytest.mark.slow
def test_two_runs_with_one_seed_log_identical_rollouts_and_metrics(runs) -> None:
    a, b = runs["a"], runs["b"]
    assert (a / "rollouts.jsonl").read_text() == (b / "rollouts.jsonl").read_text()
    assert _metrics(a) == _metrics(b)
    assert [x["step"] for x in _metrics(a)] == [1, 2]
    for name in ("eval_before.json", "eval_after.json"):
        assert json.loads((a / name).read_text()) == json.loads((b / name).read_text())


@pytest.mark.slow
def test_another_seed_draws_other_rollouts(runs) -> None:
    assert (runs["a"] / "rollouts.jsonl").read_text() != (runs["c"] / "rollouts.jsonl").read_text()


@pytest.mark.slow
def test_the_policy_never_generates_in_train_mode(runs) -> None:
    """Rollouts and both evaluations (the one after training too, when TRL has left the model in train
    mode) generate without dropout."""
    assert runs["modes"] and not any(runs["modes"])


@pytest.mark.slow
def test_eval_files_list_the_held_out_examples_and_say_their_size(runs) -> None:
    held = system.load_split(config_from_dict(_settings(runs["a"]))).eval
    for name in ("eval_before.json", "eval_after.json"):
        result = json.loads((runs["a"] / name).read_text())
        assert [(x["id"], x["input"]) for x in result["examples"]] == [(e.id, e.input) for e in held]
        assert result["n"] == result["split"]["held_out"] == len(held) == 4
        assert set(result["examples"][0]["replies"]) == {"answer_solver", "answer_helper", "add"}
        assert result["system"] == pytest.approx(sum(x["score"] for x in result["examples"]) / 4)


@pytest.mark.slow
def test_no_rollout_of_a_run_is_on_a_held_out_input(runs) -> None:
    held = {x["input"] for x in json.loads((runs["a"] / "eval_before.json").read_text())["examples"]}
    trained = {json.loads(x)["input"] for x in (runs["a"] / "rollouts.jsonl").read_text().splitlines()}
    assert trained and not trained & held


# --- the split -------------------------------------------------------------------------------------------


def test_no_held_out_input_is_a_training_input() -> None:
    """The built-in arithmetic repeats its single-digit sums: the last 60 distinct questions are held out,
    and every training example asking one of them is dropped."""
    split = system.load_split(config_from_dict({"data": "builtin:arithmetic", "limit": 400, "eval_size": 60}))
    held = [system.normalised_input(e) for e in split.eval]
    assert len(split.eval) == len(set(held)) == 60
    assert not set(held) & {system.normalised_input(e) for e in split.train}
    sizes = split.sizes()
    assert sizes["train_removed_as_held_out"] > 0 and sizes["held_out_duplicates_dropped"] > 0
    assert (
        sizes["train"]
        + sizes["held_out"]
        + sizes["held_out_duplicates_dropped"]
        + sizes["train_removed_as_held_out"]
        == 400
    )


def test_an_eval_file_input_is_removed_from_training_whatever_its_case_and_spacing(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    held = tmp_path / "held.jsonl"
    rows = [{"id": f"t{i}", "input": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(5)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held.write_text(json.dumps({"id": "h0", "input": "  what IS 3 +  1? ", "answer": "4"}) + "\n")
    split = system.load_split(config_from_dict({"data": str(data), "eval_data": str(held)}))
    assert [e.id for e in split.train] == ["t0", "t1", "t2", "t4"]
    assert split.sizes()["train_removed_as_held_out"] == 1


# --- seeded rollouts --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    """The relay with the sampling helper, a runner factory over one call cache."""
    from colab_graphs.models.cache import CallCache
    from colab_graphs.models.client import ModelClient

    config = config_from_dict(_settings(tmp_path_factory.mktemp("live") / "run"))
    with server_for_configs(config.scripted_members, "scripted_members") as server:
        pool, spec, model, _ = system.seated_system(config, server, "cpu")
        client = ModelClient(CallCache(tmp_path_factory.mktemp("cache")))

        def runner(**overrides: object) -> RolloutRunner:
            policy = {**system.policy_overrides(config), **overrides}
            return RolloutRunner(spec, pool, PolicyRouter(client, ["policy"], policy, seed=3), "toy_marker")

        yield {"runner": runner, "model": model, "loop": LoopThread.shared()}


EXAMPLE = Example(id="q", input="What is 5 + 2?", answer="7")
KEYS = [("step", 0, "prompt", 0, "generation", g) for g in range(G)]


def _calls(rollouts, member: str) -> list:
    return [c for r in rollouts for c in r.trace.calls if c.member == member]


@pytest.mark.slow
def test_a_sampling_collaborator_gets_a_seeded_sample_per_rollout_cached_by_its_index(live) -> None:
    runner = live["runner"]()
    first = live["loop"].run(runner.arun([EXAMPLE] * G, KEYS))
    helper = _calls(first, "helper")
    assert len({c.sample for c in helper}) == G  # one sample per rollout, not one per prompt
    assert all(c.settings["seed"] == c.sample for c in helper)  # seeded by its index
    assert len({c.completion for c in helper}) > 1
    again = live["loop"].run(live["runner"]().arun([EXAMPLE] * G, KEYS))
    assert [c.completion for c in _calls(again, "helper")] == [c.completion for c in helper]
    assert all(c.cached for c in _calls(again, "helper"))  # served from the cache under that index
    assert [c.completion for c in _calls(again, "policy")] == [c.completion for c in _calls(first, "policy")]
    assert {c.sample for c in _calls(first, "solver")} == {0}  # a greedy collaborator: one shared answer


@pytest.mark.slow
def test_policy_turn_logprobs_are_those_of_the_tempered_distribution(live) -> None:
    import torch

    rollout = live["loop"].run(live["runner"](temperature=0.5).arun([EXAMPLE], KEYS[:1]))[0]
    turn = rollout.turns[0]
    ids = torch.tensor([turn.prompt_ids + turn.completion_ids])
    with torch.no_grad():
        logits = live["model"](input_ids=ids).logits[0, len(turn.prompt_ids) - 1 : -1].float()
    tempered = torch.log_softmax(logits / 0.5, dim=-1)
    expected = tempered[torch.arange(len(turn.completion_ids)), torch.tensor(turn.completion_ids)]
    assert turn.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


@pytest.mark.slow
def test_top_k_of_one_makes_every_rollout_write_the_greedy_turn(live) -> None:
    from colab_graphs.local.local_engine import GenerationRequest
    from colab_graphs.local.provider import get_engine

    sampled = live["loop"].run(live["runner"](temperature=1.0, top_k=1).arun([EXAMPLE] * G, KEYS))
    engine = get_engine(f"local/{system.POLICY_PREFIX}policy")
    for turn in (r.turns[0] for r in sampled):
        greedy = engine.generate(GenerationRequest(turn.prompt_ids, max_tokens=6, temperature=0))
        assert turn.completion_ids == greedy.completion_ids


# --- settings the engine cannot honour ---------------------------------------------------------------------


def test_generation_kwargs_the_policy_engine_cannot_honour_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"cfg: generation_kwargs: .*'num_beams' cannot be honoured"):
        config_from_dict({"generation_kwargs": {"top_k": 5, "num_beams": 4}}, where="cfg")


def test_sampling_generation_kwargs_reach_the_policy() -> None:
    config = config_from_dict({"top_k": 3, "min_p": 0.05, "generation_kwargs": {"repetition_penalty": 1.2}})
    overrides = system.policy_overrides(config)
    assert (overrides["top_k"], overrides["min_p"], overrides["repetition_penalty"]) == (3, 0.05, 1.2)


def test_chat_template_kwargs_are_refused() -> None:
    with pytest.raises(ConfigError, match="cfg: chat_template_kwargs: "):
        config_from_dict({"chat_template_kwargs": {"enable_thinking": False}}, where="cfg")


def test_out_of_range_sampling_fields_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"cfg: min_p: must be in \[0, 1\]"):
        config_from_dict({"min_p": 1.5}, where="cfg")


@pytest.mark.slow
def test_a_turn_cut_at_the_token_limit_is_marked_truncated(live) -> None:
    from colab_graphs.local.provider import get_engine

    rollouts = live["loop"].run(live["runner"](max_tokens=1).arun([EXAMPLE] * G, KEYS))
    eos = get_engine(f"local/{system.POLICY_PREFIX}policy").eos_ids
    for turn in (r.turns[0] for r in rollouts):
        assert turn.truncated is (turn.completion_ids[-1] not in eos)
    assert any(r.turns[0].truncated for r in rollouts)
