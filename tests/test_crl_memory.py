"""Bounded training memory: at most `per_device_train_batch_size` segments per forward/backward pass, the
rest of a generation batch accumulated; gradient checkpointing that works with the policy engine.

Memory itself is measured in bench/ (bench/gpu_crl.py prints its estimate); these tests check the
mechanism: how a batch is cut, that cutting it changes no gradient, and that checkpointing changes none.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from colab_graphs.trainers.segments import batch_layout
from tests.test_crl_multiprocess import train_one_step

ROOT = Path(__file__).resolve().parents[1]


def test_batch_layout_bounds_every_pass_and_splits_evenly() -> None:
    for segments, steps, bound in itertools.product(range(0, 40), (1, 2, 3), (1, 2, 4, 8)):
        layout = batch_layout(segments, steps, bound)
        assert layout.pass_rows <= bound
        assert layout.rows >= max(segments, 1)
        assert layout.rows % (steps * layout.pass_rows) == 0  # equal micro-batches of equal passes
        # no whole pass of padding in any micro-batch
        assert layout.rows - segments < steps * layout.pass_rows + steps


def _max_relative_difference(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max() / b[n].abs().max().clamp(min=1e-12)) for n in b)


@pytest.mark.slow
def test_passes_of_at_most_the_batch_size_give_the_gradient_of_one_pass() -> None:
    bounded = train_one_step(4)  # 4 prompts x 2 rollouts, 12 policy segments, 2 micro-batches
    whole = train_one_step(4, one_pass=True)
    assert max(bounded["passes"][0]) <= 4 < max(whole["passes"][0])
    assert len(bounded["passes"][0]) > len(whole["passes"][0])
    assert bounded["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert _max_relative_difference(bounded["grad"], whole["grad"]) < 1e-4


@pytest.mark.slow
def test_gradient_checkpointing_changes_no_gradient() -> None:
    plain = train_one_step(4)
    checkpointed = train_one_step(4, gradient_checkpointing=True)
    assert checkpointed["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert _max_relative_difference(checkpointed["grad"], plain["grad"]) < 1e-4


@pytest.mark.slow
def test_training_with_gradient_checkpointing_keeps_the_policy_engine_generating(tmp_path: Path) -> None:
    """Rollouts between checkpointed training steps: the seated policy still writes every turn."""
    from colab_graphs.trainers.config import load_config
    from colab_graphs.trainers.pipeline import train

    config = load_config(
        ROOT / "examples" / "train_tiny.yaml",
        gradient_checkpointing=True,
        lora=True,
        max_steps=3,
        save_steps=0,
        eval_size=0,
        output_dir=str(tmp_path / "run"),
        cache_dir=str(tmp_path / "cache"),
    )
    assert train(config)["steps"] == 3
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    assert all(x["policy_turns"] == 1 and x["policy_tokens"] > 0 for x in lines)
    assert any(x["grad_norm"] > 0 for x in lines)  # (a step whose groups all agree has no gradient)
