"""C-RL trainer: config, credit, rollouts with the policy seated in a live graph, the TRL hook, export, CLI.

The system under test is the toy `relay` graph (colab_graphs/trainers/toy.py): two scripted collaborators
answer over real HTTP, then the tiny random policy (an in-process `local/` model) adds its part.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest

from colab_graphs.builder import GraphBuilder
from colab_graphs.spec import END, START
from colab_graphs.testing.server import server_for_configs
from colab_graphs.trainers import system
from colab_graphs.trainers.config import ConfigError, TrainConfig, config_from_dict, load_config
from colab_graphs.trainers.credit import group_advantages, turn_advantages
from colab_graphs.trainers.rollout import LoopThread, PolicyRouter, RolloutRunner

ROOT = Path(__file__).resolve().parents[1]
G = 4


# --- config --------------------------------------------------------------------------------------------------


def test_config_unknown_field_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("protocol: majority_vote\nnum_generation: 4\n")
    with pytest.raises(
        ConfigError, match=r"bad\.yaml: unknown field 'num_generation' \(did you mean 'num_generations'"
    ):
        load_config(path)


def test_config_wrong_type_names_field_and_expected_type() -> None:
    with pytest.raises(ConfigError, match=r"cfg: learning_rate: expected float, got str"):
        config_from_dict({"learning_rate": "fast"}, where="cfg")


def test_config_batch_must_hold_whole_groups() -> None:
    with pytest.raises(ConfigError, match="multiple of num_generations"):
        config_from_dict({"num_generations": 4, "per_device_train_batch_size": 6})


def test_vllm_for_the_policy_is_refused_with_what_works_instead() -> None:
    with pytest.raises(ConfigError, match=r"cfg: trl\.use_vllm: .*hosted_vllm/NAME, api_base"):
        config_from_dict({"trl": {"use_vllm": True, "vllm_mode": "colocate"}}, where="cfg")


def test_a_loss_not_normalised_by_the_batchs_tokens_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"cfg: loss_type: must be one of dapo, cispo, got 'grpo'"):
        config_from_dict({"loss_type": "grpo"}, where="cfg")


def test_sft_with_a_kl_term_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"cfg: beta: reward=sft is plain fine-tuning"):
        config_from_dict({"reward": "sft", "beta": 0.1}, where="cfg")


def test_sft_with_an_entropy_term_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"cfg: entropy_coef: reward=sft is plain fine-tuning"):
        config_from_dict({"reward": "sft", "entropy_coef": 0.01}, where="cfg")


def test_example_configs_load() -> None:
    for name in ("train_tiny.yaml", "train_debate.yaml", "train_server.yaml"):
        assert isinstance(load_config(ROOT / "examples" / name), TrainConfig)


# --- credit --------------------------------------------------------------------------------------------------


def test_uniform_advantages_are_group_relative_rewards() -> None:
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    advantages = group_advantages(rewards, 4)
    std = 0.5  # sample std of [1, 0, 0, 0]
    assert advantages[:4] == pytest.approx([(1 - 0.25) / (std + 1e-4)] + [(0 - 0.25) / (std + 1e-4)] * 3)
    assert advantages[4:] == [0.0] * 4  # a group that all agree teaches nothing


def test_failed_rollouts_are_left_out_of_their_group() -> None:
    assert group_advantages([1.0, None, 0.0, None], 4, scale="none") == [0.5, 0.0, -0.5, 0.0]


def test_a_step_whose_rollouts_all_failed_is_an_error() -> None:
    from colab_graphs.tasks.example import Example
    from colab_graphs.trace import Trace
    from colab_graphs.trainers.rollout import Rollout, RolloutError, check_rollouts

    example = Example(id="1", input="What is 1 + 0?", answer="1")
    error = "solver: connection after 7 attempt(s)"
    failed = Rollout(example, Trace(example_id="1", protocol="relay", failed=True, error=error), None)
    scored = Rollout(example, Trace(example_id="1", protocol="relay"), 1.0)
    check_rollouts([failed, scored])  # some failures are tolerated (and counted in the metrics)
    with pytest.raises(
        RolloutError, match="all 2 rollouts of this step failed; first error: solver: connection"
    ):
        check_rollouts([failed, failed])


def test_failed_rollouts_and_truncated_turns_are_not_training_segments() -> None:
    """A failed rollout's tokens would dilute the loss's token normaliser; a cut-off turn is masked only when
    `mask_truncated_completions` asks (as TRL masks it)."""
    from colab_graphs.tasks.example import Example
    from colab_graphs.trace import Trace
    from colab_graphs.trainers.grpo import training_segments
    from colab_graphs.trainers.rollout import PolicyTurn, Rollout

    def turn(truncated: bool) -> PolicyTurn:
        return PolicyTurn(0, "s", 0, [1, 2], [3, 4], None, "x", truncated=truncated)

    example = Example(id="1", input="What is 1 + 0?", answer="1")
    ok, cut, failed = turn(False), turn(True), turn(False)
    rollouts = [
        Rollout(example, Trace(example_id="1", protocol="p"), 1.0, [ok, cut]),
        Rollout(example, Trace(example_id="1", protocol="p", failed=True), None, [failed]),
    ]
    credit = [[0.5, 0.5], [0.0]]
    assert training_segments(rollouts, credit) == [(ok, 0.5), (cut, 0.5)]
    assert training_segments(rollouts, credit, mask_truncated=True) == [(ok, 0.5)]
    assert training_segments(rollouts, None, 1.0, mask_truncated=True) == [(ok, 1.0)]  # sft keeps alike


# --- a live system with the tiny policy seated ---------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    """Scripted collaborators over HTTP, the tiny policy served in process, a runner for the relay graph."""
    from colab_graphs.models.cache import CallCache
    from colab_graphs.models.client import ModelClient
    from colab_graphs.tasks.builtin import builtin_task

    config = config_from_dict(
        {
            "graph": "colab_graphs.trainers.toy:relay",
            "scorer": "toy_marker",
            "pool": {"policy": {"max_tokens": 6, "seed": 7}},
            "scripted_members": {
                "solver_a": {"script": "arithmetic_solver", "args": {"accuracy": 1.0, "seed": 1}},
                "solver_b": {"script": "arithmetic_solver", "args": {"accuracy": 0.5, "seed": 2}},
            },
            "num_generations": G,
            "per_device_train_batch_size": 2 * G,
            "max_completion_length": 6,
            "learning_rate": 2e-3,
            "use_cpu": True,
            "output_dir": str(tmp_path_factory.mktemp("crl")),
        }
    )
    with server_for_configs(config.scripted_members, "scripted_members") as server:
        pool, spec, model, tokenizer = system.seated_system(config, server, "cpu")
        client = ModelClient(CallCache(tmp_path_factory.mktemp("cache")))
        router = PolicyRouter(client, ["policy"], system.policy_overrides(config))
        loop = LoopThread.shared()
        runner = RolloutRunner(spec, pool, router, "toy_marker")
        yield {
            "config": config,
            "pool": pool,
            "spec": spec,
            "model": model,
            "tokenizer": tokenizer,
            "router": router,
            "runner": runner,
            "loop": loop,
            "examples": builtin_task("arithmetic", n=8),
        }


@pytest.fixture(scope="module")
def trainer(live):
    from datasets import Dataset

    from colab_graphs.trainers.grpo import CRLTrainer
    from colab_graphs.trainers.pipeline import grpo_args

    config = live["config"]
    examples = live["examples"]
    crl = CRLTrainer(
        runner=live["runner"],
        examples={e.id: e for e in examples},
        loop=live["loop"],
        model=live["model"],
        args=grpo_args(config, Path(config.output_dir)),
        train_dataset=Dataset.from_list([{"prompt": e.input, "example_id": e.id} for e in examples]),
        processing_class=live["tokenizer"],
    )
    system.seat_policy(config, crl.policy_module(), live["tokenizer"])
    return crl


@pytest.mark.slow
def test_policy_calls_are_never_cached_or_shared(live) -> None:
    rollouts = live["loop"].run(live["runner"].arun([live["examples"][0]] * G))
    policy_calls = [c for r in rollouts for c in r.trace.calls if c.member == "policy"]
    assert len(policy_calls) == G
    assert (
        len({c.sample for c in policy_calls}) == G
    )  # G distinct requests: no cache, no single-flight sharing
    assert not any(c.cached for c in policy_calls)
    peer_calls = [c for r in rollouts for c in r.trace.calls if c.member != "policy"]
    assert all(c.completion_token_ids is None for c in peer_calls)


@pytest.mark.slow
def test_direct_policy_transport_matches_the_litellm_path(live) -> None:
    from colab_graphs.models.client import ModelClient
    from colab_graphs.trainers.rollout import InProcessPolicyClient

    member = live["pool"]["policy"]
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    greedy = {"temperature": 0, "max_tokens": 5}

    async def both():
        direct = await InProcessPolicyClient(None).complete(member, messages, overrides=greedy)
        via_litellm = await ModelClient(None).complete(member, messages, overrides=greedy)
        return direct, via_litellm

    direct, via_litellm = live["loop"].run(both())
    assert direct.text == via_litellm.text
    assert direct.prompt_token_ids == via_litellm.prompt_token_ids
    assert direct.completion_token_ids == via_litellm.completion_token_ids
    assert direct.logprobs == pytest.approx(via_litellm.logprobs, abs=1e-5)


@pytest.mark.slow
def test_generation_hook_trains_only_on_policy_tokens(trainer, live) -> None:
    inputs = [{"prompt": e.input, "example_id": e.id} for e in live["examples"][:2] for _ in range(G)]
    batch = trainer._generate_and_score_completions(inputs)
    calls = [c for r in trainer.last_rollouts for c in r.trace.calls if c.member == "policy"]
    mask = batch["completion_mask"].bool()
    trained = Counter(
        tuple(row[m].tolist()) for row, m in zip(batch["completion_ids"], mask, strict=True) if m.any()
    )
    assert trained == Counter(tuple(c.completion_token_ids) for c in calls)
    assert int(batch["num_items_in_batch"]) == sum(len(c.completion_token_ids) for c in calls)
    prompts = {
        tuple(row[m].tolist())
        for row, m in zip(batch["prompt_ids"], batch["prompt_mask"].bool(), strict=True)
    }
    assert prompts == {tuple(c.prompt_token_ids) for c in calls}


@pytest.mark.slow
def test_the_gpu_checks_update_is_the_trainers_loss_and_gradient(trainer, live) -> None:
    """bench/gpu_check.py trains without TRL with its own `dapo_loss`: the same loss and gradient as
    `CRLTrainer` on the same segment batch."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    inputs = [{"prompt": e.input, "example_id": e.id} for e in live["examples"][:2] for _ in range(G)]
    batch = trainer._generate_and_score_completions(inputs)
    model = trainer.model

    def loss_and_grad(compute) -> tuple[float, list]:  # noqa: ANN001
        model.zero_grad(set_to_none=True)
        loss = compute()
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
        return float(loss.detach()), grads

    trainer.pass_rows = batch["completion_ids"].size(0)  # one pass: the loss is the whole batch's
    trainer.current_gradient_accumulation_steps = 1  # as the training loop sets it
    theirs = loss_and_grad(lambda: trainer.compute_loss(model, batch))
    mine = loss_and_grad(lambda: gpu_check.dapo_loss(model, batch, trainer.args.temperature))
    assert mine[0] == pytest.approx(theirs[0], rel=1e-4, abs=1e-7)
    assert len(mine[1]) == len(theirs[1]) and any(g.abs().max() > 0 for g in theirs[1])
    for a, b in zip(mine[1], theirs[1], strict=True):
        assert float((a - b).abs().max()) <= 1e-4 * max(float(b.abs().max()), 1e-8)


@pytest.mark.slow
def test_generation_hook_gives_each_turn_its_rollouts_group_advantage(trainer, live) -> None:
    inputs = [{"prompt": e.input, "example_id": e.id} for e in live["examples"][2:4] for _ in range(G)]
    batch = trainer._generate_and_score_completions(inputs)
    rollouts = trainer.last_rollouts
    expected = group_advantages([r.reward for r in rollouts], G)
    by_tokens = {tuple(r.turns[0].completion_ids): a for r, a in zip(rollouts, expected, strict=True)}
    for row, m, adv in zip(
        batch["completion_ids"], batch["completion_mask"].bool(), batch["advantages"], strict=True
    ):
        assert float(adv) == pytest.approx(by_tokens[tuple(row[m].tolist())], abs=1e-5)


@pytest.mark.slow
def test_training_changes_the_seated_policy(trainer, live) -> None:
    import torch

    from colab_graphs.local.provider import get_engine

    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.args.max_steps = 2
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    assert changed, "no parameter moved"
    # The engine that serves the policy's calls generates with the trained object itself.
    assert get_engine(f"local/{system.POLICY_PREFIX}policy").model is trainer.policy_module()


@pytest.mark.slow
def test_exported_policy_folder_loads(live, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from colab_graphs.trainers.export import export_policy

    folder = export_policy(live["model"], live["tokenizer"], tmp_path / "policy", {"steps": 0})
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert AutoTokenizer.from_pretrained(folder).chat_template
    for (name, p), (_, q) in zip(live["model"].named_parameters(), loaded.named_parameters(), strict=True):
        assert torch.equal(p.detach().cpu(), q), name


@pytest.mark.slow
def test_solo_reward_runs_the_policy_alone(live) -> None:
    solo = system.solo_spec(live["config"], live["pool"])
    runner = RolloutRunner(solo, live["pool"], live["router"], "toy_marker")
    rollouts = live["loop"].run(runner.arun([live["examples"][0]] * 2))
    assert {c.member for r in rollouts for c in r.trace.calls} == {"policy"}
    assert all(r.reward == r.policy_score for r in rollouts)


@pytest.mark.slow
def test_replay_gives_the_turn_that_matters_the_larger_advantage(live) -> None:
    """The policy speaks twice; only its first turn reaches the final answer, so only it earns credit."""
    members = live["pool"].names
    b = GraphBuilder("draft_then_aside", members=members)
    peers = [m for m in members if m != "policy"]
    for m in peers:
        b.seat(f"answer_{m}", member=m, prompt="{input}", writes=f"answer:{m}")
    b.seat(
        "draft", member="policy", prompt="{input}\n{answers}\nAdd the unit.", reads={"answers": "answer:*"}
    )
    b.seat("aside", member="policy", prompt="{input}\nSay anything.", writes="aside")
    b.aggregate(
        "final", "concat", reads={"answers": "answer:*", "draft": "draft"}, writes="final", separator=" "
    )
    b.fan(START, [f"answer_{m}" for m in peers], join="draft").edge("draft", "aside").edge("aside", "final")
    spec = b.edge("final", END).output("final").build()
    runner = RolloutRunner(spec, live["pool"], live["router"], "toy_marker")
    examples = [e for e in live["examples"][:2] for _ in range(G)]
    rollouts = live["loop"].run(runner.arun(examples))
    credit = live["loop"].run(turn_advantages(runner, rollouts, G, "replay", samples=4))
    assert all([t.seat for t in r.turns] == ["draft", "aside"] for r in rollouts)
    draft = [abs(c[0]) for c in credit]
    aside = [abs(c[1]) for c in credit]
    assert aside == [0.0] * len(rollouts)  # resampling it never changes the outcome
    assert sum(draft) > 0


# --- the command ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_train_tiny_writes_metrics_and_a_loadable_policy(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from colab_graphs.cli.app import _register_optional_commands, app

    _register_optional_commands()  # every command, as the console entry point registers them
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--config",
            str(ROOT / "examples/train_tiny.yaml"),
            "--max-steps",
            "2",
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert all(0.0 <= x["system_reward"] <= 1.0 for x in lines)
    for x in lines:  # what each step reports beside TRL's own
        assert x["advantage_abs_max"] >= abs(x["advantage_mean"])
        assert x["reward_std"] >= 0.0 and (x["groups_varied"] > 0) == (x["reward_std"] > 0)
        assert x["generation_s"] > 0 and x["training_s"] > 0 and x["credit_s"] >= 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_after"]["loo"] == pytest.approx(
        summary["eval_after"]["system"] - summary["eval_after"]["without_policy"]
    )
    assert (out / "policy" / "config.json").is_file()


CODE_GRAPH = """
from colab_graphs.builder import GraphBuilder
from colab_graphs.spec import END, START

b = GraphBuilder("plan_then_code", members=["policy", "coder"])
b.seat("plan", member="policy", prompt="{input}", writes="plan")
b.seat("code", member="coder", prompt="{input}\\nPlan: {plan}", reads={"plan": "plan"}, writes="answer")
plan_then_code = b.edge(START, "plan").edge("plan", "code").edge("code", END).output("answer").build()
"""


@pytest.mark.slow
def test_cli_train_on_code_rewards_names_the_sandbox_in_every_metrics_line_and_the_summary(
    scripted_server, tmp_path: Path
) -> None:
    """C-RL on MoCo HumanEval records, a scripted coder seated after the policy: the opt-in to unconfined code
    (`--sandbox unsafe`) is written into each metrics line and the summary, and the reward is the tests'."""
    from typer.testing import CliRunner

    from colab_graphs.cli.app import _register_optional_commands, app
    from tests.test_sandbox_wiring import IDS, MOCO, coder

    if not MOCO.exists():
        pytest.skip("the MoCo data files are not here")
    _register_optional_commands()
    moco = json.loads(MOCO.read_text())
    records = {r["id"]: r for r in moco["test"] + moco["dev"]}
    data = tmp_path / "humaneval.json"
    data.write_text(json.dumps({"task_type": "coding", "test": [records[i] for i in IDS[:2]]}))
    server = scripted_server({"coder": coder})
    (tmp_path / "code_graph.py").write_text(CODE_GRAPH)
    config = tmp_path / "train.yaml"
    config.write_text(
        f"graph: {tmp_path / 'code_graph.py'}:plan_then_code\nscorer: code\npolicy_member: policy\n"
        f"policy_model: tiny-random\ndata: {data}\n"
        f"pool:\n  policy: {{max_tokens: 4}}\n"
        f"  coder: {{model: openai/coder, api_base: '{server.base_url}', api_key: sk-test}}\n"
        "num_generations: 2\nper_device_train_batch_size: 2\nmax_steps: 2\nmax_completion_length: 4\n"
        "logging_steps: 1\neval_size: 0\nuse_cpu: true\nbf16: false\ngradient_checkpointing: false\n"
    )
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--config", str(config), "--out", str(out), "--no-cache",
                                      "--sandbox", "unsafe"])  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    recorded = json.loads((out / "summary.json").read_text())["sandbox"]
    assert recorded["setting"] == recorded["backend"] == "unsafe-local" and recorded["safe"] is False
    assert all(x["sandbox"] == recorded for x in lines)
    assert {x["system_reward"] for x in lines} <= {
        0.0,
        1.0,
    }  # all of a group's rollouts: right add, wrong unique


HOLDER = """
import sys, time
from colab_graphs.files import OutLock
with OutLock(sys.argv[1], "colab-graphs train (the first)"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_training_into_a_folder_another_process_writes_is_refused_before_any_work(tmp_path: Path) -> None:
    import subprocess
    import sys

    from typer.testing import CliRunner

    from colab_graphs.cli.app import _register_optional_commands, app

    _register_optional_commands()
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdout.readline() == "held\n"
        result = CliRunner().invoke(
            app,
            [
                "train",
                "--config",
                str(ROOT / "examples/train_tiny.yaml"),
                "--max-steps",
                "1",
                "--out",
                str(out),
            ],
        )
    finally:
        first.kill()
        first.wait()
    said = " ".join(result.output.split())  # (the terminal wraps lines)
    assert result.exit_code == 5, result.output
    assert f"is being written by pid {first.pid}" in said and "(colab-graphs train (the first))" in said
    assert sorted(p.name for p in out.iterdir()) == [".colab-graphs.lock"]  # nothing of the second run


@pytest.mark.slow
def test_sft_objective_is_the_kept_completions_token_cross_entropy(live) -> None:
    import torch
    from datasets import Dataset

    from colab_graphs.trainers.grpo import CRLTrainer
    from colab_graphs.trainers.pipeline import grpo_args

    config, examples = live["config"], live["examples"]
    sft = CRLTrainer(
        runner=live["runner"],
        examples={e.id: e for e in examples},
        objective="sft",
        sft_min_reward=0.0,  # keep every turn
        loop=live["loop"],
        model=live["model"],
        args=grpo_args(dataclasses.replace(config, reward="sft"), Path(config.output_dir)),
        train_dataset=Dataset.from_list([{"prompt": e.input, "example_id": e.id} for e in examples]),
        processing_class=live["tokenizer"],
    )
    system.seat_policy(config, sft.policy_module(), live["tokenizer"])
    inputs = [{"prompt": e.input, "example_id": e.id} for e in examples[:2] for _ in range(G)]
    batch = sft._generate_and_score_completions(inputs)
    turns = [t for r in sft.last_rollouts for t in r.turns]
    model = live["model"]
    nll = []
    with torch.no_grad():
        for t in turns:
            ids = torch.tensor([t.prompt_ids + t.completion_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
            targets = ids[0, 1:]
            picked = logp[torch.arange(len(targets)), targets][len(t.prompt_ids) - 1 :]
            nll.extend((-picked).tolist())
    sft.pass_rows = 3  # the loss of a batch trained in several passes is the whole batch's
    sft.current_gradient_accumulation_steps = 1  # as the training loop sets it
    loss = sft.compute_loss(sft.model, batch)  # (backpropagates every pass but the last)
    model.zero_grad(set_to_none=True)
    assert int(batch["num_items_in_batch"]) == len(nll)
    assert float(loss.detach()) == pytest.approx(sum(nll) / len(nll), rel=1e-4)


@pytest.mark.slow
def test_entropy_bonus_is_the_batchs_mean_token_entropy_in_any_number_of_passes(live) -> None:
    """`entropy_coef` (TRL's bonus, run through C-RL's passes): the loss falls by coef x the mean entropy of
    the policy's next-token distributions over every policy token of the batch, computed here from the
    model's logits, and a batch trained in three passes gets the gradient of one pass."""
    import torch
    from datasets import Dataset

    from colab_graphs.trainers.grpo import CRLTrainer
    from colab_graphs.trainers.pipeline import grpo_args

    config, examples, model = live["config"], live["examples"], live["model"]
    coef = 0.5
    crl = CRLTrainer(
        runner=live["runner"],
        examples={e.id: e for e in examples},
        loop=live["loop"],
        model=model,
        args=grpo_args(dataclasses.replace(config, entropy_coef=coef), Path(config.output_dir)),
        train_dataset=Dataset.from_list([{"prompt": e.input, "example_id": e.id} for e in examples]),
        processing_class=live["tokenizer"],
    )
    system.seat_policy(config, crl.policy_module(), live["tokenizer"])
    inputs = [{"prompt": e.input, "example_id": e.id} for e in examples[4:6] for _ in range(G)]
    batch = crl._generate_and_score_completions(inputs)
    turns = [t for r in crl.last_rollouts for t in r.turns]
    entropies = []
    with torch.no_grad():
        for t in turns:
            ids = torch.tensor([t.prompt_ids + t.completion_ids])
            logits = model(input_ids=ids).logits[0, len(t.prompt_ids) - 1 : -1] / crl.args.temperature
            logp = torch.log_softmax(logits.float(), dim=-1)
            entropies.extend((-(logp.exp() * logp).sum(-1)).tolist())
    crl.current_gradient_accumulation_steps = 1  # as the training loop sets it

    def loss_and_grad(rows: int, bonus: float) -> tuple[float, list]:
        crl.pass_rows, crl.entropy_coef = rows, bonus
        model.zero_grad(set_to_none=True)
        loss = crl.compute_loss(model, batch)  # (backpropagates every pass but the last)
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
        return float(loss.detach()), grads

    rows = batch["completion_ids"].size(0)
    plain = loss_and_grad(rows, 0.0)
    one = loss_and_grad(rows, coef)
    three = loss_and_grad(3, coef)
    assert len(entropies) == int(batch["num_items_in_batch"]) and min(entropies) > 0
    assert one[0] - plain[0] == pytest.approx(-coef * sum(entropies) / len(entropies), rel=1e-3)

    def gap(x: list, y: list) -> float:  # the largest relative difference of two gradients, per tensor
        return max(
            float((a - b).abs().max()) / max(float(b.abs().max()), 1e-8) for a, b in zip(x, y, strict=True)
        )

    # Passes differ only by float rounding (their padding columns are cut), far less than the bonus moves the
    # gradient; summing each pass's own mean instead of one token mean would move it by as much again.
    assert gap(three[1], one[1]) <= 1e-3 < 0.05 <= gap(one[1], plain[1])
    assert crl.entropy_coef == coef  # the per-pass shares do not outlive the call
    crl.use_adaptive_entropy = True  # TRL's controller steps once per call: several passes are refused
    with pytest.raises(RuntimeError, match="use_adaptive_entropy: this micro-batch needs 3 passes"):
        loss_and_grad(3, coef)


def _tiny_lora(tmp_path: Path, name: str, **overrides: object) -> TrainConfig:
    """examples/train_tiny.yaml with a LoRA adapter (r 4) into tmp_path/name; the starting policy is not
    evaluated (runs that share one evaluate it once)."""
    return load_config(
        ROOT / "examples" / "train_tiny.yaml",
        lora=True,
        lora_r=4,
        lora_alpha=8,
        save_steps=0,
        eval_before=False,
        output_dir=str(tmp_path / name),
        cache_dir=str(tmp_path / "cache"),
        **overrides,
    )


@pytest.mark.slow
def test_kl_term_with_lora_is_to_the_policy_before_training(tmp_path: Path) -> None:
    """beta > 0 with LoRA: the reference is the policy with its adapter disabled. The adapter starts as a
    no-op, so the KL is 0 until an update moves it; after that the KL to the starting policy is not 0 (a
    reference that followed the policy would keep it at 0)."""
    from colab_graphs.trainers.pipeline import train

    config = _tiny_lora(tmp_path, "kl", beta=0.1, max_steps=4, eval_size=0)
    train(config)
    lines = [json.loads(line) for line in (tmp_path / "kl" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all("kl" in line for line in lines)
    # The first update with a gradient moves the adapter; the KL is 0 up to it and positive after it.
    moved = next(i for i, line in enumerate(lines) if line["grad_norm"] > 0)
    assert moved < 3
    assert all(line["kl"] == pytest.approx(0.0, abs=1e-7) for line in lines[: moved + 1])
    assert lines[moved + 1]["kl"] > 1e-6


def _checkpointed_run(tmp_path: Path, **overrides: object) -> dict:
    """A tiny relay training run that checkpoints every step, under tmp_path/run."""
    return {
        "graph": "colab_graphs.trainers.toy:relay",
        "scorer": "toy_marker",
        "pool": {"policy": {"max_tokens": 4}},
        "scripted_members": {"solver": {"script": "arithmetic_solver"}},
        "limit": 8,
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_completion_length": 4,
        "save_steps": 1,
        "use_cpu": True,
        "output_dir": str(tmp_path / "run"),
        "cache_dir": str(tmp_path / "cache"),
        **overrides,
    }


@pytest.mark.slow
def test_training_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    from colab_graphs.trainers.pipeline import train

    settings = _checkpointed_run(tmp_path)
    assert train(config_from_dict({**settings, "max_steps": 1}))["steps"] == 1
    resumed = train(config_from_dict({**settings, "max_steps": 2, "resume_from_checkpoint": True}))
    assert resumed["steps"] == 2
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert (tmp_path / "run" / "checkpoints" / "checkpoint-2").is_dir()


@pytest.mark.slow
def test_a_resumed_run_logs_each_step_once(tmp_path: Path) -> None:
    """Resuming from an earlier checkpoint trains its later steps again: their old lines go, in both logs."""
    from colab_graphs.trainers.pipeline import train

    settings = _checkpointed_run(tmp_path, max_steps=2)
    train(config_from_dict(settings))
    first = tmp_path / "run" / "checkpoints" / "checkpoint-1"
    train(config_from_dict({**settings, "resume_from_checkpoint": str(first)}))
    run = tmp_path / "run"
    metrics = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    rollouts = Counter(json.loads(x)["step"] for x in (run / "rollouts.jsonl").read_text().splitlines())
    assert metrics == [1, 2]
    assert rollouts == {1: 2, 2: 2}  # one group of num_generations rollouts logged per step


@pytest.mark.slow
def test_sft_baseline_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    from colab_graphs.trainers.pipeline import train

    # sft_min_reward 0 keeps every turn, so each step updates the weights.
    settings = _checkpointed_run(tmp_path, reward="sft", sft_min_reward=0.0, learning_rate=1e-2)
    assert train(config_from_dict({**settings, "max_steps": 1}))["steps"] == 1
    one = tmp_path / "run" / "checkpoints" / "checkpoint-1"
    assert (one / "trainer_state.json").is_file() and (one / "optimizer.pt").is_file()  # TRL's checkpoint
    resumed = train(config_from_dict({**settings, "max_steps": 2, "resume_from_checkpoint": True}))
    assert resumed["steps"] == 2
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]  # step 1 was not trained again
    assert (tmp_path / "run" / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()
    with pytest.raises(ConfigError, match="no checkpoint"):
        train(
            config_from_dict(
                {**settings, "output_dir": str(tmp_path / "other"), "resume_from_checkpoint": True}
            )
        )


@pytest.mark.slow
def test_crl_teaches_cooperation_that_solo_rl_cannot(tmp_path: Path) -> None:
    """The toy relay: the system needs the policy's marker; alone the policy never scores, so solo RL is flat."""
    from colab_graphs.trainers.pipeline import train

    def run(reward: str, seed: int) -> dict:
        config = load_config(
            ROOT / "examples" / "train_tiny.yaml",
            reward=reward,
            max_steps=12,
            save_steps=0,
            pool={"policy": {"max_tokens": 6, "seed": seed}},
            output_dir=str(tmp_path / f"{reward}-{seed}"),
            cache_dir=str(tmp_path / "cache"),
        )
        return train(config)

    # Sampling is seeded per request, but dynamic batching groups requests by timing and batched float
    # arithmetic differs in the last bits, so a run is not bit-reproducible under load. One bad trajectory in
    # 12 steps happens (seen once in the full suite); a second seed makes the test about learning, not luck.
    for seed in (3, 4):
        crl = run("system", seed)
        if crl["eval_after"]["system"] >= 0.25:
            break
    solo = run("solo", 3)
    assert crl["eval_before"]["system"] == solo["eval_before"]["system"] == 0.0
    assert crl["eval_after"]["system"] >= 0.25
    assert crl["eval_after"]["loo"] >= 0.25  # the gain is the policy seat's contribution
    assert solo["eval_after"]["system"] < crl["eval_after"]["system"]


@pytest.mark.slow
def test_lora_training_exports_a_merged_policy_that_differs_from_the_start(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from colab_graphs.trainers.pipeline import train

    config = _tiny_lora(tmp_path, "lora", max_steps=2, eval_size=2)
    summary = train(config)
    assert summary["eval_before"] is None and summary["eval_after"]["n"] == 2
    assert not (tmp_path / "lora" / "eval_before.json").exists()
    folder = tmp_path / "lora" / "policy"
    trained = AutoModelForCausalLM.from_pretrained(folder)
    assert not any("lora" in name for name in trained.state_dict())  # merged: a plain model folder
    start_model, _ = system.load_policy(config.policy_model, "cpu")
    start = start_model.state_dict()
    changed = [n for n, p in trained.state_dict().items() if n in start and not torch.equal(p, start[n])]
    assert changed, "LoRA training left every weight of the exported policy unchanged"


# --- rewards -------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_rollout_whose_answer_hacks_the_code_scorer_is_rewarded_zero(
    live, scripted_server, tmp_path
) -> None:
    """A rollout's reward is the task's score of the system's final answer: for code, the judge's verdict. The
    tiny in-process policy drafts a plan, a scripted coder answers with the code (a tiny random policy cannot
    write a hack itself); the hacks that fooled the old same-process harness earn 0, the correct answer 1."""
    import json

    from colab_graphs.pool import Pool
    from colab_graphs.tasks.loaders import load_examples
    from tests.test_reward_hacks import MOCO, RIGHT, VERDICT_HACKS, variant

    if not MOCO.exists():
        pytest.skip("the MoCo data files are not here")
    chosen = ("exec_patched", "always_equal", "gc_strings_then_exit")
    codes = {name: VERDICT_HACKS[name][0] for name in chosen} | {"correct": RIGHT}
    record = next(r for r in json.loads(MOCO.read_text())["test"] if r["id"] == "HumanEval/53")
    data = tmp_path / "humaneval.json"
    data.write_text(json.dumps({"task_type": "coding", "test": [variant(record, name) for name in codes]}))

    def coder(messages, params):
        name = messages[-1]["content"].split("Variant: ", 1)[1].split(".", 1)[0]
        return f"Following the plan:\n```python\n{codes[name]}```\nIt passes the examples."

    server = scripted_server({"coder": coder})
    pool = Pool.from_dict(
        {
            "policy": dict(live["pool"]["policy"].settings),
            "coder": {"model": "openai/coder", "api_base": server.base_url, "api_key": "sk-x"},
        }
    )
    b = GraphBuilder("plan_then_code", members=["policy", "coder"])
    b.seat("plan", member="policy", prompt="{input}", writes="plan")
    b.seat("code", member="coder", prompt="{input}\nPlan: {plan}", reads={"plan": "plan"}, writes="answer")
    spec = b.edge(START, "plan").edge("plan", "code").edge("code", END).output("answer").build()
    runner = RolloutRunner(spec, pool, live["router"], "code")
    rollouts = live["loop"].run(runner.arun(load_examples(data)))
    assert {r.example.id: r.reward for r in rollouts} == {name: float(name == "correct") for name in codes}
    assert all(len(r.turns) == 1 for r in rollouts)  # each rollout holds the policy's turn it would train
    # Each reward names the sandbox that ran its code; the setting a trainer is given (`using`, as
    # `colab_graphs.trainers.pipeline.train` sets its config's `sandbox`) reaches the rollouts on the loop thread.
    from colab_graphs.sandbox import SandboxUnavailable, scope

    try:
        expected = scope.probe("auto")["backend"]
    except SandboxUnavailable:
        expected = None
    if expected is not None:
        assert {r.trace.sandbox["backend"] for r in rollouts} == {expected}
    with scope.using("unsafe"):
        (again,) = live["loop"].run(runner.arun([e for e in load_examples(data) if e.id == "correct"]))
    assert again.reward == 1.0 and again.trace.sandbox["backend"] == "unsafe-local"
