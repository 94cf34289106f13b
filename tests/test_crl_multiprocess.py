"""Multi-process C-RL (accelerate, gloo on CPU): the same step as one process, bounded passes, a real run.

`python tests/test_crl_multiprocess.py worker OUT ROWS` trains one optimizer step of the tiny policy on
scripted rollouts (fixed token ids and rewards, a different number of policy turns per rollout) and writes
the loss, the gradient and each process's forward/backward passes to OUT. The tests run it as one process
over the whole global batch and as two processes (`accelerate launch --multi_gpu --num_processes 2`, CPU) over its two
halves, and compare.

The two processes are launched once for the module (each launch costs both processes' imports, ~15 s of CPU):
`python tests/test_crl_multiprocess.py train-then-step OUT ROWS TRAIN_ARGS...` first runs the README's
`colab-graphs train` as `-m colab_graphs.cli.app` runs it, in the processes as the launch started them, then
the worker's step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
G = 2  # rollouts per prompt
PROMPTS = 8


def _launch(processes: int, *args: str) -> list[str]:
    """`accelerate launch` of `processes` processes. On CPU this needs `--multi_gpu` (accelerate's name for
    its torchrun launcher; the config's `use_cpu` makes them CPU processes with gloo): `--cpu` alone starts
    ONE process, whatever `--num_processes` says."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(_free_port()),  # not the default 29500, which an earlier launch may still hold
        *args,
    ]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(cmd: list[str], timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:  # the whole of both streams' ends: a rank's traceback is what says why
        pytest.fail(
            f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-8000:]}"
        )
    return proc


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The same optimizer step as 1 process x 4 rows per pass and as 2 processes x 2 rows per pass, the two
    processes after the README's `accelerate launch --multi_gpu --num_processes 2 -m colab_graphs.cli.app
    train --config examples/train_tiny.yaml ...`: (one's step, two's step, the training's output folder)."""
    one, two, work = (tmp_path_factory.mktemp(name) for name in ("one", "two", "train"))
    worker = str(Path(__file__).resolve())
    _run([sys.executable, worker, "worker", str(one), "4"], timeout=300)
    train = ["train", "--config", "examples/train_tiny.yaml", "--out", str(work / "run"),
             "--cache-dir", str(work / "cache")]  # fmt: skip
    _run(_launch(2, worker, "train-then-step", str(two), "2", *train), timeout=600)
    return one, two, work / "run"


@pytest.mark.slow
def test_two_processes_take_the_same_step_as_one_over_the_same_global_batch(launched) -> None:
    import torch

    one, two, _ = launched
    a, b = json.loads((one / "result.json").read_text()), json.loads((two / "result.json").read_text())
    assert a["example_ids"] == b["example_ids"]  # the same global batch
    assert len(set(b["segments"])) > 1  # the processes held different numbers of policy segments
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    grad_one, grad_two = torch.load(one / "grad.pt"), torch.load(two / "grad.pt")
    assert grad_one.keys() == grad_two.keys()
    assert any(g.abs().max() > 0 for g in grad_one.values())
    for name, g in grad_one.items():
        # fp32 sums in a different order: equal to ~1e-5 of each tensor's scale (a wrong normaliser is 50% off)
        assert float((grad_two[name] - g).abs().max()) <= 1e-4 * float(g.abs().max()), name


@pytest.mark.slow
def test_every_process_runs_the_same_passes_of_at_most_the_batch_size(launched) -> None:
    _, two, _ = launched
    result = json.loads((two / "result.json").read_text())
    passes = result["pass_rows"]  # per process, the rows of each forward/backward pass
    assert len(passes) == 2 and passes[0] == passes[1]
    assert len(passes[0]) > 2  # more passes than micro-batches: the bound split them
    assert max(passes[0]) <= 2
    assert sum(passes[0]) >= max(result["segments"])


@pytest.mark.slow
def test_accelerate_launch_of_train_tiny_exports_a_policy_that_learned(launched) -> None:
    """The README's command: `accelerate launch --multi_gpu --num_processes 2 -m colab_graphs.cli.app train ...`."""
    _, _, out = launched
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processes"] == 2
    assert summary["eval_after"]["system"] > summary["eval_before"]["system"]
    assert (out / "policy" / "config.json").is_file()
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, summary["steps"] + 1))  # one line per step: only the main process writes


# --- the worker -------------------------------------------------------------------------------------------


def scripted_rollouts(examples: list) -> list:
    """Rollouts with fixed policy turns: example k, copy j has (2k + j) % 4 turns of varied lengths."""
    from colab_graphs.trace import Trace
    from colab_graphs.trainers.rollout import PolicyTurn, Rollout

    out, copies = [], {}
    for example in examples:
        k, j = int(example.id[1:]), copies.get(example.id, 0)
        copies[example.id] = j + 1
        turns = [
            PolicyTurn(
                index=t,
                seat="s",
                occurrence=t,
                prompt_ids=[10 + (k * 31 + j * 17 + i * 7 + t) % 300 for i in range(5 + (k * 3 + j + t) % 7)],
                completion_ids=[
                    10 + (k * 13 + j * 5 + i * 11 + t) % 300 for i in range(2 + (k + 2 * j + t) % 5)
                ],
                logprobs=None,
                text="",
            )
            for t in range((2 * k + j) % 4)
        ]
        trace = Trace(example_id=example.id, protocol="scripted")
        # Rewards 0-3 that differ between prompts: each process's half of the batch has its own std.
        out.append(Rollout(example, trace, float((k + j) % 2 * (1 + k % 3)), turns, None))
    return out


class ScriptedRunner:
    """A runner whose rollouts are `scripted_rollouts` (no model runs; the token ids are fixed)."""

    async def arun(self, examples: list, keys: list | None = None) -> list:
        return scripted_rollouts(examples)


def train_one_step(rows: int, one_pass: bool = False, **settings: object) -> dict:
    """One optimizer step of the tiny policy on scripted rollouts (G = 2, 8 prompts, 2 micro-steps), rewards
    scaled by the batch's std.

    `one_pass` trains each micro-batch in one forward/backward pass, whatever its size (the unbounded way).

    Returns the logged loss, the gradient before the optimizer step (unclipped), and, over all processes,
    the rows of each forward/backward pass, the policy segments and the example ids of the step.
    """
    from accelerate import PartialState
    from accelerate.utils import gather_object
    from datasets import Dataset
    from transformers import TrainerCallback

    from colab_graphs.tasks.example import Example
    from colab_graphs.trainers import system
    from colab_graphs.trainers.config import config_from_dict
    from colab_graphs.trainers.grpo import CRLTrainer
    from colab_graphs.trainers.pipeline import grpo_args

    PartialState(cpu=True)
    config = config_from_dict(
        {
            "num_generations": G,
            "per_device_train_batch_size": rows,
            "gradient_accumulation_steps": 2,
            "max_steps": 1,
            "learning_rate": 1e-3,
            "use_cpu": True,
            "trl": {"max_grad_norm": 0.0},  # the raw gradient, not a clipped one
            # TRL's batch std is the global batch's: the processes must pool their rewards to take one step.
            "scale_rewards": "batch",
            **settings,
        }
    )
    model, tokenizer = system.load_policy("tiny-random", "cpu")
    examples = [Example(id=f"e{k}", input=f"question {k}", answer="0") for k in range(PROMPTS)]
    captured: dict = {}

    class Capture(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):  # noqa: ANN001, ANN003
            captured["grad"] = {
                n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None
            }

    class Recording(CRLTrainer):
        def _pass_loss(self, model, inputs):  # noqa: ANN001, ANN202
            captured.setdefault("passes", []).append(int(inputs["completion_ids"].size(0)))
            return super()._pass_loss(model, inputs)

        def _generate_and_score_completions(self, inputs):  # noqa: ANN001, ANN202
            captured.setdefault("ids", []).extend(row["example_id"] for row in inputs)
            batch = super()._generate_and_score_completions(inputs)
            if one_pass:
                self.pass_rows = batch["completion_ids"].size(0)
            captured["segments"] = captured.get("segments", 0) + int(batch["completion_mask"].any(1).sum())
            return batch

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Recording(
            runner=ScriptedRunner(),
            examples={e.id: e for e in examples},
            on_log=lambda line: captured.setdefault("loss", line["loss"]),
            model=model,
            args=grpo_args(config, Path(tmp)),
            train_dataset=Dataset.from_list([{"prompt": e.input, "example_id": e.id} for e in examples]),
            processing_class=tokenizer,
            callbacks=[Capture()],
        )
        trainer.train()
    return {
        "loss": captured.get("loss"),
        "grad": captured["grad"],
        "passes": gather_object([captured["passes"]]),
        "segments": gather_object([captured["segments"]]),
        "ids": sorted(gather_object(captured["ids"])),
    }


def worker(out: Path, rows: int) -> None:
    import torch
    from accelerate import PartialState

    result = train_one_step(rows)
    if PartialState().is_main_process:
        torch.save(result.pop("grad"), out / "grad.pt")
        renamed = {"loss": result["loss"], "pass_rows": result["passes"], "segments": result["segments"]}
        (out / "result.json").write_text(json.dumps({**renamed, "example_ids": result["ids"]}))


def train_then_step(out: Path, rows: int, train_args: list[str]) -> None:
    """`colab-graphs train` run as `python -m colab_graphs.cli.app` runs it (runpy, as `__main__`), then
    `worker` in the same processes; a failed training exits with its status."""
    import runpy

    sys.argv = ["colab_graphs.cli.app", *train_args]  # argv[0] becomes the module's path, as under -m
    try:
        runpy.run_module("colab_graphs.cli.app", run_name="__main__", alter_sys=True)
    except SystemExit as done:  # the CLI's own exit, 0 when it trained
        if done.code not in (0, None):
            raise
    worker(out, rows)


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    worker(Path(sys.argv[2]), int(sys.argv[3]))
if __name__ == "__main__" and sys.argv[1:2] == ["train-then-step"]:
    train_then_step(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
