"""`train(config)`: the whole C-RL pipeline behind `colab-graphs train`.

1. load examples (train / held out), start scripted test members if the config has any, build the pool and
   the protocol, load the policy and serve it in process as the policy member;
2. evaluate the system on held-out examples as an audit plays them (system score, the policy seat's LOO, the
   policy's solo score; see `colab_graphs.trainers.evaluate`; skipped when `eval_before` is false);
3. train, always through `CRLTrainer` (see `colab_graphs.trainers.baselines` for what each objective is):
   `reward: system` (C-RL: GRPO on the system's score), `reward: solo` (GRPO on the policy's own score,
   answering alone), or `reward: sft` (cross-entropy on the policy's turns from successful rollouts);
4. evaluate again, export the policy folder, write `summary.json`.

Outputs under `output_dir`: `metrics.jsonl` (a line per step), `checkpoints/` (TRL's, when `save_steps`),
`eval_before.json`, `eval_after.json`, `policy/` (a Hugging Face folder), `summary.json`.

`metrics.jsonl` fields: `step`, `loss`, `system_reward` (mean reward of the step's rollouts: the system's
score; under `reward: solo` the rollouts are the policy alone, so it is the policy's own score),
`reward_std` (mean over prompts of the reward std within the prompt's group), `advantage_mean` and
`advantage_abs_max` (over the step's policy segments; GRPO runs), `policy_correct` (the scorer applied to
the policy's last turn), `policy_turns`, `policy_tokens` (per rollout), `system_tokens` (all members' tokens
per rollout, cached calls excluded), `segments` (policy turns trained on; for `sft` the kept turns), the time
split per optimizer step `generation_s` (rollouts and scoring), `credit_s` (credit assignment, replays
included) and `training_s` (forward and backward passes), `step_time`, `wall_s`, and TRL's own (grad_norm,
entropy, clip ratios, learning_rate). Rollout metrics cover every process; the time split is the main
process's.

Scaling out: `accelerate launch --num_processes P -m colab_graphs.cli.app train --config FILE` (add `--cpu`
for CPU processes). Each process runs the rollouts of its share of every step (whole groups per process)
and the evaluation of its share of the held-out examples; the gradient is the one a single process would
take over the whole step (see `colab_graphs.trainers.grpo`); only the main process writes files.
Collaborators served by vLLM are ordinary pool members (`hosted_vllm/...` with `api_base`). The policy generates
in process with its live weights (`rollout: local`) or on a policy server that holds its current LoRA adapter
(`rollout: server`, `policy_url`: vLLM or `colab-graphs serve`, see `colab_graphs.trainers.server_rollout`);
TRL's own `use_vllm: true` is refused when the config is read. With a policy server every metrics line also
has `sampling/sampling_logp_difference/mean|max` (|trainer - server| log-prob per policy token),
`sampling/importance_sampling_ratio/min|mean|max` (the correction) and `policy_sync_s` (saving and loading
the adapter).
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import colab_graphs._env  # noqa: F401  (offline settings before transformers / litellm load)
from colab_graphs.files import atomic_write_text, holding
from colab_graphs.redaction import hide_secrets
from colab_graphs.sandbox import scope
from colab_graphs.tasks.scoring import require_sandbox
from colab_graphs.trainers.config import ConfigError, grpo_values

if TYPE_CHECKING:
    from colab_graphs.trainers.config import TrainConfig


def grpo_args(config: TrainConfig, output_dir: Path) -> Any:
    """The `trl.GRPOConfig` for `config`: its GRPO fields, and the ones the trainer sets (`MANAGED`)."""
    from trl import GRPOConfig

    settings = grpo_values(config)
    if not config.save_steps:
        settings.pop("save_steps", None)
    settings.update(
        save_strategy="steps" if config.save_steps else "no",
        # Never used (no eval dataset); TRL checks it against num_generations all the same.
        per_device_eval_batch_size=config.num_generations,
        remove_unused_columns=False,
    )
    if config.reward == "sft":
        # reward=sft trains cross-entropy: TRL's fused head must give log-probabilities at temperature 1
        # (the rollouts still sample at `temperature`, see `system.policy_overrides`).
        settings["temperature"] = 1.0
    try:
        with warnings.catch_warnings():
            # transformers 5.2x renames gradient_checkpointing; TRL 1.16 still reads the old name.
            warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
            return GRPOConfig(output_dir=str(output_dir / "checkpoints"), **settings)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"GRPO settings: {err}") from None


def _peft_config(config: TrainConfig) -> Any:
    if not config.lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        target_modules=config.lora_target_modules,
        task_type="CAUSAL_LM",
    )


def _checkpoint(checkpoint: str | bool | None, checkpoints: Path) -> Path | None:
    """The checkpoint folder to resume from: the given one, the newest under `checkpoints` (True), or None."""
    if not checkpoint:
        return None
    if checkpoint is True:
        from transformers.trainer_utils import get_last_checkpoint

        found = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
        if found is None:
            raise ConfigError(f"resume_from_checkpoint: no checkpoint in {checkpoints}")
        return Path(found)
    if not Path(str(checkpoint)).is_dir():
        raise ConfigError(f"resume_from_checkpoint: {checkpoint} is not a folder")
    return Path(str(checkpoint))


def _trim_log(path: Path, folder: Path | None) -> None:
    """On resume (from `folder`), keep the lines of a per-step log up to its step (the steps after it run
    again); otherwise start the file afresh. Lines a kill left torn are dropped."""
    if folder is None:
        path.write_text("", encoding="utf-8")
        return
    step = int(folder.name.rsplit("-", 1)[-1])
    if path.exists():
        keep = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line)["step"] <= step:
                    keep.append(line)
            except (ValueError, KeyError, TypeError):
                continue
        path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")


def _processes(config: TrainConfig) -> Any:
    """accelerate's process state (one process unless started by `accelerate launch`), made before the
    trainer so that evaluation can share its examples among the processes."""
    from accelerate import PartialState

    return PartialState(cpu=config.use_cpu)


def train(config: TrainConfig, on_step: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the pipeline `config` describes; returns the summary (also written to `summary.json`).

    Args:
        config: the training config.
        on_step: called with each step's metrics line (as written to `metrics.jsonl`), on the main process.
    """
    config.validate()
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    resume = _checkpoint(config.resume_from_checkpoint, out / "checkpoints")  # a missing one fails first
    processes = _processes(config)
    # Two trainings into one folder would interleave their logs and checkpoints: the main process holds the
    # folder's lock (the other processes of an `accelerate launch` are its own).
    with (
        scope.using(config.sandbox),
        holding(out if processes.is_main_process else None, "colab_graphs.train"),
    ):
        return _train(config, out, resume, processes, on_step)


def _train(
    config: TrainConfig,
    out: Path,
    resume: Path | None,
    processes: Any,
    on_step: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any]:
    """`train`'s work, with the output folder held."""
    from colab_graphs.models.cache import CallCache
    from colab_graphs.models.client import ModelClient
    from colab_graphs.testing.server import server_for_configs
    from colab_graphs.trainers import system
    from colab_graphs.trainers.evaluate import evaluate
    from colab_graphs.trainers.export import export_policy
    from colab_graphs.trainers.rollout import LoopThread, PolicyRouter, RolloutRunner

    started = time.perf_counter()
    main = processes.is_main_process
    split = system.load_split(config)
    loop = LoopThread.shared()
    try:
        scripted = server_for_configs(config.scripted_members, "scripted_members")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    with scripted as server:
        pool, spec, model, tokenizer = system.seated_system(config, server, str(processes.device))
        # Code-scored rewards: the sandbox is checked before the first call, and named in every metrics line and
        # in summary.json (the LoopThread carries the setting to the rollouts). After the system is seated: a
        # scorer the graph's module registers (`scorer: toy_marker`) is known from then on.
        sandbox = require_sandbox([*split.train, *split.eval], config.scorer)
        cache = None if config.no_cache else CallCache(config.cache_dir)
        client = ModelClient(cache, max_concurrency=config.max_concurrency)
        policy = [config.policy_member]
        policy_server, policy_client = _policy_server(config)
        router = PolicyRouter(
            client, policy, system.policy_overrides(config), config.seed, "train", policy_client
        )
        eval_router = PolicyRouter(
            client,
            policy,
            system.policy_overrides(config, config.eval_temperature),
            config.seed,
            "eval",
            policy_client,
        )

        def run_eval(name: str) -> dict[str, Any] | None:
            if not split.eval:
                return None
            result = evaluate(
                spec,
                pool,
                split.eval,
                eval_router,
                config.policy_member,
                loop,
                config.scorer,
                processes,
            )
            result["split"] = split.sizes()
            if main:
                _write_json(out / f"eval_{name}.json", result)
            return result

        before = run_eval("before") if config.eval_before else None
        rollout_spec = system.solo_spec(config, pool) if config.reward == "solo" else spec
        runner = RolloutRunner(rollout_spec, pool, router, config.scorer, own_reward=config.reward == "own")
        metrics_path = out / "metrics.jsonl"
        if main:
            for log in (metrics_path, out / "rollouts.jsonl"):
                _trim_log(log, resume)
        try:
            policy, steps = _train_policy(
                config,
                model,
                tokenizer,
                runner,
                split.train,
                loop,
                metrics_path,
                out,
                on_step,
                resume,
                sandbox,
                policy_server,
            )
            after = run_eval("after")
        finally:
            if policy_server is not None:
                loop.run(policy_server.aclose())
        folder = out / "policy"
        if main:
            info = {
                "config": dataclasses.asdict(config),
                "steps": steps,
                "eval_before": _brief(before),
                "eval_after": _brief(after),
            }
            export_policy(policy, tokenizer, folder, info)
        processes.wait_for_everyone()
    summary = {
        "reward": config.reward,
        "credit": config.credit,
        "protocol": spec.name,
        "policy_member": config.policy_member,
        "steps": steps,
        "processes": processes.num_processes,
        "split": split.sizes(),
        "eval_before": _brief(before),
        "eval_after": _brief(after),
        "policy": str(folder),
        "calls": client.stats.as_dict(),
        "wall_s": round(time.perf_counter() - started, 3),
        **({"sandbox": sandbox} if sandbox is not None else {}),
    }
    if main:
        _write_json(out / "summary.json", summary)
    return summary


def _write_json(path: Path, value: Any) -> None:
    """Write a result file whole or not at all, without the registered secrets (a collaborator that echoes
    its key into a reply would otherwise put it in eval_*.json)."""
    atomic_write_text(path, hide_secrets(json.dumps(value, indent=2) + "\n"))


def _brief(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """An evaluation without its per-example lines (those are in `eval_*.json`)."""
    return None if result is None else {k: v for k, v in result.items() if k != "examples"}


def _policy_server(config: TrainConfig) -> tuple[Any, Any]:
    """(PolicyServer, its ServerPolicyClient) for `rollout: server`, else (None, None): the in-process engine.

    The client lets all of a generation batch's policy turns (and replay credit's re-runs) be in flight at
    once: the server batches them, as the in-process engine batches a step's turns."""
    if config.rollout != "server":
        return None, None
    from colab_graphs.trainers.server_rollout import PolicyServer, ServerPolicyClient
    from colab_graphs.trainers.system import policy_adapter

    assert config.policy_url is not None  # validated
    try:
        server = PolicyServer(config.policy_url, policy_adapter(config))
    except ConnectionError as err:
        raise ConfigError(str(err)) from None
    rollouts = config.per_device_train_batch_size * (
        config.steps_per_generation or config.gradient_accumulation_steps
    )
    replays = config.replay_samples if config.credit == "replay" else 0
    in_flight = max(config.max_concurrency, rollouts * (1 + replays))
    return server, ServerPolicyClient(server, max_concurrency=in_flight)


def _train_policy(
    config,
    model,
    tokenizer,
    runner,
    examples,
    loop,
    metrics_path: Path,
    out: Path,
    on_step,
    resume,
    sandbox,
    policy_server=None,
):  # noqa: ANN001, ANN202
    """GRPO (`reward: system | solo`) or SFT (`reward: sft`) through `CRLTrainer`; (policy, steps)."""
    from datasets import Dataset
    from transformers import set_seed

    from colab_graphs.trainers import system
    from colab_graphs.trainers.grpo import CRLTrainer

    set_seed(config.seed)  # LoRA's initial weights are drawn before TRL's Trainer seeds itself
    trainer = CRLTrainer(
        runner=runner,
        examples={e.id: e for e in examples},
        objective="sft" if config.reward == "sft" else "grpo",
        credit=config.credit,
        replay_samples=config.replay_samples,
        advantage_baseline=config.advantage_baseline,
        sft_min_reward=config.sft_min_reward,
        metrics_path=metrics_path,
        loop=loop,
        on_log=on_step,
        step_fields={"sandbox": sandbox} if sandbox is not None else None,
        model=model,
        args=grpo_args(config, out),
        train_dataset=Dataset.from_list([{"prompt": e.input, "example_id": e.id} for e in examples]),
        processing_class=tokenizer,
        peft_config=_peft_config(config),
        policy_server=policy_server,
    )
    # TRL may wrap the model (LoRA): the rollouts must generate with exactly what is trained.
    system.seat_policy(config, trainer.policy_module(), tokenizer)
    trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    trainer.sync_server_policy()  # the evaluation after training asks the server for the trained policy
    return trainer.accelerator.unwrap_model(trainer.model), trainer.state.global_step
