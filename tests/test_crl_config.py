"""The training config's GRPO fields are `trl.GRPOConfig`'s own: its types, its help, this project's defaults."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from colab_graphs.trainers.config import (
    GRPO_DEFAULTS,
    ConfigError,
    config_fields,
    config_from_dict,
    load_config,
)
from colab_graphs.trainers.pipeline import grpo_args

ROOT = Path(__file__).resolve().parents[1]
# GRPOConfig fields nothing in this project names: the config must take them from TRL itself.
UNNAMED = ("adam_beta2", "epsilon_high")


def _trl_field(name: str) -> dataclasses.Field:
    from trl import GRPOConfig

    return next(f for f in dataclasses.fields(GRPOConfig) if f.name == name)


def test_the_project_never_declares_the_grpo_fields_it_takes() -> None:
    sources = [p.read_text(encoding="utf-8") for p in (ROOT / "colab_graphs").rglob("*.py")]
    assert not [name for name in UNNAMED if any(name in text for text in sources)]


def test_a_grpo_field_the_project_never_names_reaches_grpo_config(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("use_cpu: true\nadam_beta2: 0.95\nepsilon_high: 0.28\n")
    args = grpo_args(load_config(path), tmp_path)
    assert (args.adam_beta2, args.epsilon_high) == (0.95, 0.28)


def test_a_wrong_type_for_a_grpo_field_names_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("adam_beta2: high\n")
    with pytest.raises(ConfigError, match=r"train\.yaml: adam_beta2: expected float, got str 'high'"):
        load_config(path)


def test_a_misspelt_grpo_field_is_unknown_with_the_close_match() -> None:
    with pytest.raises(ConfigError, match=r"cfg: unknown field 'adam_beta' \(did you mean 'adam_beta"):
        config_from_dict({"adam_beta": 0.9}, where="cfg")


def test_grpo_defaults_are_trls_except_where_the_project_sets_its_own() -> None:
    fields = config_fields()
    assert fields["adam_beta2"].default == _trl_field("adam_beta2").default
    for name, default in GRPO_DEFAULTS.items():
        assert fields[name].default == default
    config = config_from_dict({})
    assert (config.learning_rate, config.max_steps, config.adam_beta2) == (1e-5, 10, 0.999)


def test_a_trl_mapping_is_read_into_the_top_level() -> None:
    config = config_from_dict({"use_cpu": True, "trl": {"adam_beta2": 0.9, "lr_scheduler_type": "cosine"}})
    assert (config.adam_beta2, config.lr_scheduler_type) == (0.9, "cosine")
    assert grpo_args(config, Path("unused")).lr_scheduler_type == "cosine"


def test_a_field_set_at_the_top_level_and_under_trl_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"cfg: trl\.adam_beta2: adam_beta2 is also set at the top level"):
        config_from_dict({"adam_beta2": 0.9, "trl": {"adam_beta2": 0.95}}, where="cfg")


def test_a_wrong_type_under_trl_names_it_as_written() -> None:
    with pytest.raises(ConfigError, match=r"cfg: trl\.adam_beta2: expected float, got str"):
        config_from_dict({"trl": {"adam_beta2": "high"}}, where="cfg")


def test_a_grpo_field_the_trainer_sets_is_refused_saying_why() -> None:
    with pytest.raises(ConfigError, match=r"cfg: remove_unused_columns: set by the trainer \(.*example_id"):
        config_from_dict({"remove_unused_columns": True}, where="cfg")


def test_a_config_built_in_python_takes_grpo_fields_as_keywords() -> None:
    from colab_graphs.trainers import TrainConfig

    config = TrainConfig(reward="sft", num_generations=2, per_device_train_batch_size=2, adam_beta2=0.9)
    assert config.validate("here") is config
    assert dataclasses.replace(config, max_steps=3).adam_beta2 == 0.9
    with pytest.raises(ConfigError, match=r"here: adam_beta2: expected float, got str"):
        TrainConfig(adam_beta2="high").validate("here")


def test_help_config_lists_every_field_with_trls_help_for_grpo_fields() -> None:
    from typer.testing import CliRunner

    from colab_graphs.cli.app import _register_optional_commands, app

    _register_optional_commands()  # every command, as the console entry point registers them
    result = CliRunner().invoke(app, ["train", "--help-config"])
    assert result.exit_code == 0, result.output
    listed = {line.split(" (default ")[0] for line in result.output.splitlines() if " (default " in line}
    assert listed == set(config_fields())
    help_text = " ".join(_trl_field("adam_beta2").metadata["help"].split())
    assert f"adam_beta2 (default 0.999): {help_text}" in result.output


def test_importing_the_trainers_package_does_not_import_trl() -> None:
    code = "import sys, colab_graphs.trainers; print('trl' in sys.modules, 'torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False False", proc.stderr
