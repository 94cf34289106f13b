"""`colab-graphs train --config FILE.yaml`: compositional RL (and its baselines) from a config file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from colab_graphs.cli.options import SandboxOpt


def _config_help() -> str:
    import dataclasses

    from colab_graphs.trainers.config import config_fields, grpo_fields

    grpo = grpo_fields()
    lines = ["C-RL fields:"]
    for name, f in config_fields().items():
        if name == next(iter(grpo)):
            lines += ["", "GRPO fields (trl.GRPOConfig's, with TRL's help; defaults are this project's):"]
        missing = f.default_factory is dataclasses.MISSING
        default = f.default if missing else f.default_factory()  # type: ignore[misc]
        lines.append(f"{name} (default {default!r}): {f.metadata['help']}")
    return "\n".join(lines)


def _print_step(line: dict) -> None:
    def fmt(key: str) -> str:
        value = line.get(key)
        return "-" if value is None else f"{value:.3g}"

    typer.echo(
        f"step {line['step']:>4}  system reward {fmt('system_reward')}  policy correct {fmt('policy_correct')}  "
        f"loss {fmt('loss')}  turns {fmt('policy_turns')}  tokens {fmt('policy_tokens')}  {fmt('wall_s')} s "
        f"(rollouts {fmt('generation_s')}, credit {fmt('credit_s')}, training {fmt('training_s')})"
    )


def train(
    config: Annotated[
        Path | None, typer.Option("--config", help="Training config YAML (see examples/train_tiny.yaml).")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Output folder (overrides output_dir).")] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--cache-dir", envvar="COLAB_GRAPHS_CACHE_DIR", help="Call cache for the collaborators."
        ),
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not cache collaborator calls.")] = False,
    max_steps: Annotated[int | None, typer.Option("--max-steps", help="Override max_steps.")] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Resume from the latest checkpoint in the output folder.")
    ] = False,
    help_config: Annotated[
        bool,
        typer.Option(
            "--help-config",
            help="List every config field (C-RL's and trl.GRPOConfig's) with its help and exit.",
        ),
    ] = False,
    sandbox: SandboxOpt = None,
) -> None:
    """Train a policy seated in a collaboration graph on the system's outcome (C-RL), or a baseline.

    Writes metrics.jsonl (a line per step), eval_before/after.json, checkpoints/, policy/ (a Hugging Face
    folder) and summary.json under the output folder.
    """
    from colab_graphs.cli.common import fail

    if help_config:
        typer.echo(_config_help())
        raise typer.Exit(0)
    if config is None:
        fail("--config is required (see examples/train_tiny.yaml)")
    from colab_graphs.files import FolderBusy
    from colab_graphs.sandbox import SandboxUnavailable, scope
    from colab_graphs.trainers.config import ConfigError, load_config
    from colab_graphs.trainers.rollout import RolloutError

    try:
        cfg = load_config(
            config,
            output_dir=str(out) if out else None,
            cache_dir=str(cache_dir) if cache_dir else None,
            no_cache=True if no_cache else None,
            max_steps=max_steps,
            resume_from_checkpoint=True if resume else None,
            sandbox=sandbox,
        )
        from colab_graphs.trainers.pipeline import train as run_training

        summary = run_training(cfg, on_step=_print_step)
    except ConfigError as err:
        fail(str(err))
    except SandboxUnavailable as err:  # code-scored rewards where the setting cannot be met (no call made)
        fail(str(err), code=scope.EXIT_CODE)
    except FolderBusy as err:  # another training writes that folder
        fail(str(err), code=FolderBusy.exit_code)
    except RolloutError as err:
        fail(f"{err} (check the pool: are the collaborators' servers up?)", code=1)
    from accelerate import PartialState
    from rich.console import Console

    if not PartialState().is_main_process:  # under `accelerate launch`, one report, from the main process
        return
    console = Console()
    for name in ("eval_before", "eval_after"):
        ev = summary.get(name)
        if ev:
            console.print(
                f"{name}: system {ev['system']:.3f}  loo(policy) {ev['loo']:+.3f}  policy solo {ev['policy_solo']:.3f}"
            )
    console.print(
        f"policy saved to {summary['policy']}  ({summary['steps']} steps, {summary['wall_s']:.1f} s)"
    )


def register(app: typer.Typer) -> None:
    """Add the `train` command to the CLI."""
    app.command("train")(train)
