"""The baselines are like for like: SFT trains through the same TRL machinery as the GRPO runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from colab_graphs.trainers.config import config_from_dict
from colab_graphs.trainers.pipeline import grpo_args

SETTINGS = {
    "num_generations": 2,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "max_steps": 10,
    "learning_rate": 3e-4,
    "temperature": 0.7,
    "lora": True,
    "lora_r": 4,
    "use_cpu": True,
    "trl": {"warmup_steps": 2, "max_grad_norm": 0.5},
}


def test_sft_and_grpo_differ_in_no_training_setting_but_the_loss_temperature(tmp_path: Path) -> None:
    """Optimizer, schedule, clipping, precision, accumulation: one GRPOConfig. The fused head scores SFT's
    cross-entropy at temperature 1; the rollouts of both still sample at `temperature`."""
    args = {
        reward: grpo_args(config_from_dict({**SETTINGS, "reward": reward}), tmp_path).to_dict()
        for reward in ("system", "sft")
    }
    differing = {k for k in args["system"] if args["system"][k] != args["sft"][k]}
    assert differing == {"temperature"}
    assert (args["system"]["temperature"], args["sft"]["temperature"]) == (0.7, 1.0)
    assert args["sft"]["max_grad_norm"] == 0.5 and args["sft"]["weight_decay"] == 0.0


@pytest.mark.slow
def test_sft_and_grpo_trainers_build_the_same_optimizer_over_the_same_lora_weights(tmp_path: Path) -> None:
    from datasets import Dataset

    from colab_graphs.tasks.example import Example
    from colab_graphs.trainers import system
    from colab_graphs.trainers.grpo import CRLTrainer
    from colab_graphs.trainers.pipeline import _peft_config
    from tests.test_crl_multiprocess import ScriptedRunner

    built = {}
    for objective, reward in (("grpo", "system"), ("sft", "sft")):
        config = config_from_dict({**SETTINGS, "reward": reward})
        model, tokenizer = system.load_policy("tiny-random", "cpu")
        examples = [Example(id=f"e{k}", input=f"q{k}", answer="0") for k in range(4)]
        trainer = CRLTrainer(
            runner=ScriptedRunner(),
            examples={e.id: e for e in examples},
            objective=objective,
            model=model,
            args=grpo_args(config, tmp_path / objective),
            train_dataset=Dataset.from_list([{"prompt": e.input, "example_id": e.id} for e in examples]),
            processing_class=tokenizer,
            peft_config=_peft_config(config),
        )
        trainer.create_optimizer_and_scheduler(num_training_steps=config.max_steps)
        lrs = []
        for _ in range(config.max_steps):
            lrs.append(trainer.lr_scheduler.get_last_lr()[0])
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
        groups = [{k: v for k, v in g.items() if k != "params"} for g in trainer.optimizer.param_groups]
        trainable = sorted(n for n, p in trainer.model.named_parameters() if p.requires_grad)
        built[objective] = (type(trainer.optimizer), groups, lrs, trainable)
    assert built["grpo"] == built["sft"]
    assert built["sft"][3] and all("lora_" in n for n in built["sft"][3])  # LoRA weights only
    assert built["sft"][2][0] < built["sft"][2][1]  # warmup, then decay
