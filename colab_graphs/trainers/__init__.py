"""Compositional RL: train a policy seated in a live collaboration graph on the system's outcome.

Entry points: `train(config)` (the whole pipeline, as `colab-graphs train --config FILE` runs it),
`TrainConfig` / `load_config`, and the pieces for custom loops: `RolloutRunner`, `PolicyRouter`,
`group_advantages` / `turn_advantages`, `CRLTrainer` (in `colab_graphs.trainers.grpo`, which imports TRL),
`export_policy`. Torch, transformers and TRL load only when a function needs them; `TrainConfig`, whose GRPO
fields are `trl.GRPOConfig`'s, imports TRL the first time it is used.
"""

from typing import TYPE_CHECKING, Any

from colab_graphs.trainers.config import ConfigError, config_from_dict, load_config
from colab_graphs.trainers.credit import group_advantages, replay_advantage, turn_advantages
from colab_graphs.trainers.export import export_policy
from colab_graphs.trainers.rollout import PolicyRouter, PolicyTurn, Rollout, RolloutRunner

if TYPE_CHECKING:
    from colab_graphs.trainers.config import TrainConfig
else:

    def __getattr__(name: str) -> Any:
        if name == "TrainConfig":  # built from trl.GRPOConfig's fields on first use
            from colab_graphs.trainers.config import train_config_class

            return train_config_class()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def train(config: "TrainConfig") -> dict:
    """Run the training pipeline `config` describes (see `colab_graphs.trainers.pipeline.train`)."""
    from colab_graphs.trainers.pipeline import train as run

    return run(config)


__all__ = [
    "ConfigError",
    "PolicyRouter",
    "PolicyTurn",
    "Rollout",
    "RolloutRunner",
    "TrainConfig",
    "config_from_dict",
    "export_policy",
    "group_advantages",
    "load_config",
    "replay_advantage",
    "train",
    "turn_advantages",
]
