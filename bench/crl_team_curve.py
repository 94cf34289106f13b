"""Held-out learning curves of the C-RL team study: each training's checkpoints evaluated on the held-out
questions (`bench/crl_team.py`; its trainings keep a checkpoint every `--save-steps` updates).

A checkpoint is the LoRA adapter at that update, merged into the base policy and evaluated as the final
policies are, greedily, but on two coalitions only: the team and the team without the policy (its LOO), i.e.
one policy generation per question. Rows go to `rows/SETTING-ARM-SEED-at-STEP-audit.jsonl` with `eval:
"curve"` and `step`, beside the study's own rows; `crl_team_report.py` puts the curve (step 0 is the untrained
policy's evaluation, the last step the final policy's) into the summary, the table and the figure.

    # the curves of C-RL and SFT in the vote seat, every seed of a study
    nice -n 19 python bench/crl_team_curve.py runs/crl_team --settings vote --arms uniform sft --steps 8 16 --bf16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import crl_team  # noqa: E402  (sets the process defaults first: colab_graphs._env)


def load_checkpoint(base: str, checkpoint: Path, label: str, bf16: bool) -> str:
    """Serve `base` with the LoRA adapter in `checkpoint` merged as the local model `crl-team-LABEL`."""
    from peft import PeftModel

    from colab_graphs.local.provider import set_local_model
    from colab_graphs.trainers import system

    model, tokenizer = system.load_policy(base, crl_team.DEVICE)
    model = PeftModel.from_pretrained(model, str(checkpoint)).merge_and_unload()
    if bf16:
        import torch

        model = model.to(torch.bfloat16)
    model.eval()
    name = f"crl-team-{label}"
    set_local_model(name, model, tokenizer)
    return name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="a crl_team.py output folder")
    parser.add_argument("--settings", nargs="+", default=["vote"])
    parser.add_argument("--arms", nargs="+", default=["uniform", "sft"])
    parser.add_argument("--seeds", type=int, nargs="*", help="default: every seed the manifest lists")
    parser.add_argument(
        "--steps", type=int, nargs="+", required=True, help="checkpoints (updates) to evaluate"
    )
    parser.add_argument("--bf16", action="store_true", help="evaluate bf16 weights (as the study's --bf16)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="as the study's --device")
    parser.add_argument(
        "--running", action="store_true", help="also evaluate the checkpoints of trainings not finished yet"
    )
    args = parser.parse_args(argv)
    crl_team.DEVICE = args.device
    manifest = json.loads((args.study / "manifest.json").read_text())
    from colab_graphs.local.provider import unload
    from colab_graphs.tasks.loaders import load_examples

    held = load_examples(str(args.study / "data" / "eval.jsonl"))
    rows_dir = args.study / "rows"
    for seed in args.seeds if args.seeds is not None else manifest["seeds"]:
        for setting in args.settings:
            for arm in args.arms:
                run = args.study / "runs" / f"{setting}-{arm}-{seed}"
                if not (run / "summary.json").exists() and not args.running:
                    print(json.dumps({"skipped": run.name, "why": "not trained yet"}), flush=True)
                    continue
                for step in args.steps:
                    label = f"{setting}-{arm}-{seed}-at-{step}"
                    done = rows_dir / f"{label}-audit.jsonl"
                    checkpoint = run / "checkpoints" / f"checkpoint-{step}"
                    if done.exists():
                        continue
                    if not checkpoint.is_dir():
                        raise SystemExit(
                            f"{checkpoint}: no such checkpoint (the study saves every --save-steps)"
                        )
                    started = time.perf_counter()
                    name = load_checkpoint(manifest["policy"], checkpoint, label, args.bf16)
                    try:
                        result: dict[str, Any] = (
                            crl_team.evaluate_pick(name, held, manifest["tokens"], False, setting)
                            if setting in crl_team.team.PICK_SEATS
                            else crl_team.evaluate(
                                name, setting, held, label, args.study, manifest["tokens"], full=False
                            )
                        )
                    finally:
                        unload(name)
                    meta = {
                        "setting": setting,
                        "evaluated_in": setting,
                        "arm": arm,
                        "seed": seed,
                        "step": step,
                        "eval": "curve",
                    }
                    crl_team.write_rows(done, result["audit"], meta)
                    print(
                        json.dumps({"evaluated": label, "wall_s": round(time.perf_counter() - started)}),
                        flush=True,
                    )


if __name__ == "__main__":
    main()
