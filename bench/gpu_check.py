"""GPU check of the C-RL trainer's CUDA path, for an air-gapped machine with only PyTorch and transformers.

What it measures, per model shape (random weights built in process from a config, on the device: nothing to
download or carry; `tiny` is the zoo's tiny-random shape, `smollm2-135m`, `qwen2.5-0.5b`, `qwen2.5-1.5b` and
`qwen2.5-7b` are those models' shapes with their vocabularies), on `--device` (cuda by default):

1. rollout generation with the package's own engine (`colab_graphs.local.local_engine`, what serves the
   policy in training): `--rollouts` seeded requests of `--prompt-tokens` tokens, up to `--new-tokens` new
   tokens each, sampled at temperature 0.7, decoded as one batch; tokens/s and peak GPU memory; and whether
   the seeded rows repeat token for token when decoded again in batches of half the size (the seed contract
   on this device);
2. the policy update: the rollouts as the trainer's segment batch (`colab_graphs.trainers.segments`, the
   trainer's own code), trained in passes of `--pass-rows` rows with the trainer's loss (`dapo_loss`: TRL
   1.16's dapo loss; with beta 0 and one iteration tests/test_trainer.py checks it equals `CRLTrainer`'s loss
   and gradient), fp32 master weights with bf16 autocast (`bf16: true`) and AdamW, as the trainer runs on a
   GPU, a LoRA adapter of rank `--lora-r` on every linear layer (PEFT, as `lora: true`; `--lora-r 0` trains
   every weight); `--beta` > 0 adds the KL term to reference log-probs taken with the adapter disabled (the
   trainer's way; a frozen copy of the start when every weight trains) and `--iterations` 2 trains each
   generation batch twice (TRL's `num_iterations`: old log-probs taken once, the second pass clipped against
   them); tokens/s, seconds and peak memory per optimizer step, the KL and the clipped fraction, against
   `memory_estimate`'s formula (what bench/gpu_crl.py prints before a run);
3. how far the rollouts' logprobs (fp32, the engine's processed ones) are from the update's (bf16 autocast)
   on the same tokens: the importance-ratio error the GPU's precision adds;
4. the real trainer (`colab-graphs train` on examples/train_tiny.yaml, 2 steps, bf16 on the GPU) when TRL,
   LiteLLM and LangGraph are importable (bench/gpu_check.sh carries them as wheels); otherwise skipped,
   saying so.

What it does not cover of the real trainer without stage 4: TRL's `Trainer` loop (scheduler, gradient
clipping through accelerate, checkpoints), LoRA, LiteLLM and the graph around the policy, several processes.
The vLLM path (collaborators served by vLLM, bench/gpu_crl.py) needs vLLM, which such a machine lacks.

It imports colab_graphs' torch-only modules without the package's `__init__` (which needs LangGraph and
LiteLLM), so the repository's working tree is all it needs beside torch and transformers.

    python bench/gpu_check.py --out runs/gpu_check                     # on the GPU machine (a few minutes)
    python bench/gpu_check.py --dry-run --bare --out /tmp/gpu_check    # CPU, tiny shapes, seconds (the test)

`--dry-run` runs every shape shrunk to a few thousand weights (each keeps its architecture, tied or untied
embeddings), on CPU, fp32, a few tokens: the same code paths as the GPU run, in seconds.

`--bare` refuses imports of TRL, LiteLLM and LangGraph, as on that machine. Writes OUT/gpu_check.json.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import json
import platform
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GiB = 1024**3
ABSENT_THERE = ("trl", "litellm", "langgraph", "langchain_core")
"""Packages the air-gapped GPU image lacks (`--bare` refuses them)."""
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512},
    "smollm2-135m": {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
                     "vocab_size": 49152},
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
                     "vocab_size": 151936},
    "qwen2.5-1.5b": {"model_type": "qwen2", "hidden_size": 1536, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "intermediate_size": 8960,
                     "vocab_size": 151936},
    "qwen2.5-7b": {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
                   "vocab_size": 152064, "tie_word_embeddings": False},
}  # fmt: skip
DEFAULT_SHAPES = ["tiny", "smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"]


def shrunk(shape: str) -> dict[str, Any]:
    """`shape` at the dry run's size: the tiny shape's widths, the shape's own architecture and embeddings."""
    return {**SHAPES["tiny"], "model_type": SHAPES[shape]["model_type"],
            "tie_word_embeddings": SHAPES[shape].get("tie_word_embeddings", True)}  # fmt: skip


TEMPERATURE = 0.7


class _Refuse(importlib.abc.MetaPathFinder):
    """Refuses the packages the GPU image lacks, so a CPU run shows the script does without them."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] in ABSENT_THERE:
            raise ImportError(f"{name} is not installed on the GPU image (--bare)")


def bare_package() -> None:
    """Make `colab_graphs.local.local_engine` and `colab_graphs.trainers.segments` importable without the
    package's `__init__` (which imports LangGraph and LiteLLM): bare package modules over their folders."""
    for name in ("colab_graphs", "colab_graphs.models", "colab_graphs.trainers"):
        module = types.ModuleType(name)
        module.__path__ = [str(ROOT / name.replace(".", "/"))]
        sys.modules[name] = module


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def memory_estimate(
    config: dict,
    pass_rows: int,
    row_tokens: int,
    rollouts: int,
    lora_r: int | None = None,
    checkpointing: bool = False,
) -> dict[str, float]:
    """GiB the trainer needs on the policy's device, from the policy's `config.json` (a Llama/Qwen-style
    decoder).

    Args:
        config: the model's config.json as a dict.
        pass_rows: segments per forward/backward pass (`per_device_train_batch_size`).
        row_tokens: tokens of the longest segment (prompt + completion).
        rollouts: rollouts generated at once (the engine's KV cache while the policy writes its turns).
        lora_r: LoRA rank on every linear layer (None: all weights train).
        checkpointing: gradient checkpointing (only each layer's input is kept, one layer recomputed).

    The policy is held in fp32 (the trainer's master weights; bf16 is autocast): 4 bytes a weight, 4 a
    gradient, 8 of AdamW state. Activations kept for the backward pass, per token and layer, in bf16: the
    layer input and both norms' outputs, q/k/v and the attention output, and the MLP's four intermediate
    tensors, i.e. 2 x (6 h + 2 kv + 4 I) bytes (attention by SDPA keeps no seq x seq matrix). TRL's fused
    LM head never materialises the logits. The engine's KV cache is fp32: 2 x layers x kv x 4 bytes a token.

    Example:
        >>> qwen = {"hidden_size": 896, "num_hidden_layers": 24, "intermediate_size": 4864,
        ...         "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936}
        >>> round(memory_estimate(qwen, 8, 1250, 64)["activations"], 1)
        11.2
        >>> round(memory_estimate(qwen, 128, 1250, 64)["activations"])  # one pass over all segments
        179
    """
    h, layers, inner = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]
    head_dim = config.get("head_dim") or h // config["num_attention_heads"]
    kv = config.get("num_key_value_heads", config["num_attention_heads"]) * head_dim
    linears = [(h, h), (h, kv), (h, kv), (h, h), (h, inner), (h, inner), (inner, h)]
    per_layer = sum(a * b for a, b in linears) + 2 * h
    embeddings = config["vocab_size"] * h * (1 if config.get("tie_word_embeddings", True) else 2)
    weights = embeddings + layers * per_layer + h
    trainable = weights if lora_r is None else layers * lora_r * sum(a + b for a, b in linears)
    tokens = pass_rows * row_tokens
    layer_activations = 2 * (6 * h + 2 * kv + 4 * inner)
    kept = (
        tokens * (layers * 2 * h + layer_activations)
        if checkpointing
        else tokens * layers * layer_activations
    )
    return {
        "weights": 4 * weights / GiB,
        "gradients": 4 * trainable / GiB,
        "optimizer": 8 * trainable / GiB,
        "activations": kept / GiB,
        "kv_cache": rollouts * row_tokens * 2 * layers * kv * 4 / GiB,
    }


def build_model(shape: str, device: str, dry_run: bool = False) -> tuple[Any, Any]:
    """A random-init causal LM of `shape` (fp32, made on `device`: a 7B model is not drawn on the CPU first)
    and a word-level tokenizer of its vocabulary size (token i is "t{i}"; 0 is the end of a turn), built
    offline in process."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    settings = shrunk(shape) if dry_run else {"tie_word_embeddings": True, **SHAPES[shape]}
    vocab = {f"t{i}": i for i in range(settings["vocab_size"])}
    vocab["<eos>"], vocab["<pad>"] = 0, 1
    vocab.pop("t0"), vocab.pop("t1")
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    config = AutoConfig.for_model(settings.pop("model_type"), **settings, eos_token_id=0, pad_token_id=1)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model, tokenizer


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_gib(device: str) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / GiB, 3) if device.startswith("cuda") else None


def _reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def generate(engine: Any, args: argparse.Namespace, device: str) -> tuple[list[Any], dict[str, Any]]:
    """The rollouts (one batch), their tokens/s and memory, and whether seeded rows repeat in half batches."""
    import random

    from colab_graphs.local.local_engine import GenerationRequest

    rng = random.Random(0)
    vocab = engine.model.config.vocab_size
    prompts = [[rng.randrange(2, vocab) for _ in range(args.prompt_tokens)] for _ in range(args.rollouts)]

    def requests(rows: range) -> list[Any]:
        return [
            GenerationRequest(prompts[i], max_tokens=args.new_tokens, temperature=TEMPERATURE, seed=1000 + i,
                              logprobs_mode="processed")
            for i in rows
        ]  # fmt: skip

    engine.generate_batch(requests(range(min(2, args.rollouts))))  # warm-up: kernels, allocator
    _reset_peak(device)
    _sync(device)
    started = time.perf_counter()
    results = engine.generate_batch(requests(range(args.rollouts)))
    _sync(device)
    seconds = time.perf_counter() - started
    tokens = sum(len(r.completion_ids) for r in results)
    half = max(1, args.rollouts // 2)
    again = [
        *engine.generate_batch(requests(range(half))),
        *engine.generate_batch(requests(range(half, args.rollouts))),
    ]
    same = sum(a.completion_ids == b.completion_ids for a, b in zip(results, again, strict=True))
    return results, {
        "rollouts": args.rollouts,
        "new_tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
        "peak_gib": _peak_gib(device),
        "seeded_rows_repeat_in_half_batches": f"{same}/{args.rollouts}",
    }


def token_logps(model: Any, batch: dict[str, Any], temperature: float) -> Any:
    """Log-probabilities of the completion tokens at `temperature`, as TRL's loss computes them."""
    import torch

    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    keep = batch["completion_ids"].size(1)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -keep - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


def dapo_loss(
    model: Any, batch: dict[str, Any], temperature: float, epsilon: float = 0.2, beta: float = 0.0
) -> Any:
    """TRL 1.16's dapo loss (`GRPOTrainer._compute_loss`): the clipped ratio against the batch's old
    log-probs (`old_per_token_logps`; absent, with one iteration per generation, its own detached ones), plus
    beta x the k3 KL estimate to `ref_per_token_logps` when beta > 0, summed over policy tokens and divided
    by the policy tokens of the whole batch (`num_items_in_batch`), one process."""
    import torch

    logps = token_logps(model, batch, temperature)
    old = batch.get("old_per_token_logps")
    ratio = torch.exp(logps - (logps.detach() if old is None else old))
    advantages = batch["advantages"].unsqueeze(1)
    per_token = -torch.min(ratio * advantages, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantages)
    if beta:
        gap = batch["ref_per_token_logps"] - logps
        per_token = per_token + beta * (torch.exp(gap) - gap - 1)
    return (per_token * batch["completion_mask"]).sum() / batch["num_items_in_batch"].clamp(min=1.0)


def update(
    model: Any, results: list[Any], pad_id: int, args: argparse.Namespace, device: str, reference: Any = None
) -> dict[str, Any]:
    """`--steps` generation batches, each trained `--iterations` times, as the trainer takes them (`model` a
    PEFT model when `--lora-r`; `reference` the frozen start when every weight trains and beta > 0)."""
    import random

    import torch

    from colab_graphs.trainers.segments import batch_layout, row_passes, segment_batch

    rng = random.Random(0)
    advantages = [rng.gauss(0, 1) for _ in results]
    layout = batch_layout(len(results), 1, args.pass_rows)
    batch = segment_batch(list(zip(results, advantages, strict=True)), pad_id, layout.rows, device)
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=args.bf16)
    with torch.no_grad(), autocast:
        trained = token_logps(model, batch, TEMPERATURE)
    sampled = torch.zeros_like(trained)
    for i, r in enumerate(results):
        sampled[i, : len(r.logprobs)] = torch.tensor(r.logprobs, device=device)
    gap = ((trained - sampled).abs() * batch["completion_mask"]).sum() / batch["completion_mask"].sum()
    worst = ((trained - sampled).abs() * batch["completion_mask"]).max()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.0)
    tokens = int(batch["prompt_mask"].sum() + batch["completion_mask"].sum())
    steps = []
    for _ in range(args.steps):
        _reset_peak(device)
        _sync(device)
        started = time.perf_counter()
        with torch.no_grad(), autocast:  # what the trainer adds to a batch before its first pass
            if args.iterations > 1:
                batch["old_per_token_logps"] = token_logps(model, batch, TEMPERATURE)
            if args.beta:
                if reference is not None:
                    batch["ref_per_token_logps"] = token_logps(reference, batch, TEMPERATURE)
                else:
                    with model.disable_adapter():
                        batch["ref_per_token_logps"] = token_logps(model, batch, TEMPERATURE)
        model.train()
        for _ in range(args.iterations):
            for piece in row_passes(batch, layout.pass_rows):
                with autocast:
                    loss = dapo_loss(model, piece, TEMPERATURE, beta=args.beta)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        model.eval()
        _sync(device)
        seconds = time.perf_counter() - started
        steps.append(
            {
                "seconds": round(seconds, 3),
                "tokens_per_s": round(tokens * args.iterations / seconds, 1),
                "peak_gib": _peak_gib(device),
                **_drift(model, batch, autocast),
            }
        )
    row_tokens = batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)
    lora = args.lora_r or None
    estimate = memory_estimate(model.config.to_dict(), layout.pass_rows, row_tokens, len(results), lora)
    return {
        "segments": len(results),
        "passes_per_step": layout.rows // layout.pass_rows,
        "pass_rows": layout.pass_rows,
        "tokens_per_step": tokens,
        "trained": f"LoRA r={args.lora_r}" if args.lora_r else "all weights",
        "beta": args.beta,
        "iterations": args.iterations,
        "steps": steps,
        "estimate_gib": {k: round(v, 3) for k, v in estimate.items()},
        "estimate_training_peak_gib": round(sum(v for k, v in estimate.items() if k != "kv_cache"), 3),
        "rollout_vs_update_logprob_gap": {"mean": round(float(gap), 5), "max": round(float(worst), 5)},
    }


def _drift(model: Any, batch: dict[str, Any], autocast: Any) -> dict[str, float]:
    """After a step: the mean KL estimate to the reference and the fraction of policy tokens whose ratio to
    the old log-probs left [0.8, 1.2] (TRL's clip region), as the trainer logs `kl` and `clip_ratio`."""
    import torch

    mask = batch["completion_mask"].bool()
    out = {}
    with torch.no_grad(), autocast:
        logps = token_logps(model, batch, TEMPERATURE)
    if "ref_per_token_logps" in batch:
        gap = batch["ref_per_token_logps"] - logps
        out["kl"] = round(float((torch.exp(gap) - gap - 1)[mask].mean()), 6)
    if "old_per_token_logps" in batch:
        ratio = torch.exp(logps - batch["old_per_token_logps"])[mask]
        out["clipped_fraction"] = round(float(((ratio < 0.8) | (ratio > 1.2)).float().mean()), 4)
        out["ratio_max_abs_log"] = round(float(torch.log(ratio).abs().max()), 5)
    return out


def check_shape(shape: str, args: argparse.Namespace, device: str) -> dict[str, Any]:
    import copy

    from colab_graphs.local.local_engine import LocalEngine

    started = time.perf_counter()
    model, tokenizer = build_model(shape, device, args.dry_run)
    model.eval()
    out: dict[str, Any] = {
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "build_s": round(time.perf_counter() - started, 2),
    }
    reference = None
    if args.lora_r:  # as `lora: true`: the engine generates with the adapter's layers in place
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules="all-linear")
        trained = get_peft_model(model, config)
        policy = trained.get_base_model()
    else:
        trained = policy = model
        reference = copy.deepcopy(model).requires_grad_(False) if args.beta else None
    engine = LocalEngine(policy, tokenizer, name=shape, max_batch_size=args.rollouts)
    results, out["generation"] = generate(engine, args, device)
    out["update"] = update(trained, results, engine.pad_id, args, device, reference)
    return out


def real_trainer(args: argparse.Namespace, device: str, out: Path) -> dict[str, Any]:
    """`train()` on examples/train_tiny.yaml, 2 steps, bf16 on the GPU (fp32 on CPU)."""

    from colab_graphs.trainers.config import load_config
    from colab_graphs.trainers.pipeline import train

    cuda = device.startswith("cuda")
    config = load_config(
        ROOT / "examples" / "train_tiny.yaml",
        max_steps=2, save_steps=0, eval_size=4, limit=16, use_cpu=not cuda, bf16=cuda,
        output_dir=str(out / "train_tiny"), no_cache=True,
    )  # fmt: skip
    _reset_peak(device)
    summary = train(config)
    lines = [json.loads(x) for x in (out / "train_tiny" / "metrics.jsonl").read_text().splitlines()]
    return {
        "steps": summary["steps"],
        "step_time_s": [x.get("step_time") for x in lines],
        "split_s": [{k: x.get(k) for k in ("generation_s", "credit_s", "training_s")} for x in lines],
        "peak_gib": _peak_gib(device),
        "eval_after": summary["eval_after"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, choices=list(SHAPES))
    parser.add_argument("--rollouts", type=int, default=64, help="rollouts per step (one generation batch)")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--pass-rows", type=int, default=8, help="segments per forward/backward pass")
    parser.add_argument("--steps", type=int, default=3, help="generation batches trained per shape")
    parser.add_argument(
        "--iterations", type=int, default=2, help="passes per generation batch (num_iterations)"
    )
    parser.add_argument("--beta", type=float, default=0.04, help="KL coefficient (0: no reference pass)")
    parser.add_argument(
        "--lora-r", type=int, default=16, help="LoRA rank on every linear layer (0: all weights)"
    )
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument(
        "--no-bf16", dest="bf16", action="store_false", help="fp32 updates (bf16 autocast by default)"
    )
    parser.add_argument(
        "--bare", action="store_true", help="refuse TRL, LiteLLM, LangGraph, as on the GPU image"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU, fp32, the tiny shape, a few tokens: seconds"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_check"))
    args = parser.parse_args()
    if args.dry_run:  # every shape shrunk (`shrunk`), CPU, fp32, a large enough step to move the policy
        args.device, args.bf16, args.lr = "cpu", False, 1e-2
        args.rollouts, args.prompt_tokens, args.new_tokens, args.pass_rows, args.steps = 8, 16, 8, 4, 2
    if args.bare:
        sys.meta_path.insert(0, _Refuse())
    full = all(_importable(name) for name in ABSENT_THERE)
    try:
        import colab_graphs  # noqa: F401
    except ImportError:
        bare_package()
    import torch
    import transformers

    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
        "bf16": args.bf16,
        "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"out": str(args.out)},
        "shapes": {},
    }
    failed = False
    for shape in args.shapes:
        try:
            report["shapes"][shape] = check_shape(shape, args, args.device)
        except Exception as exc:  # noqa: BLE001 - one shape's failure is reported; the others still run
            failed = True
            report["shapes"][shape] = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        print(json.dumps({shape: report["shapes"][shape]}, indent=1), flush=True)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if full:
        try:
            report["real_trainer"] = real_trainer(args, args.device, args.out)
        except Exception as exc:  # noqa: BLE001
            failed = True
            report["real_trainer"] = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
    else:
        report["real_trainer"] = {
            "skipped": "TRL, LiteLLM or LangGraph is not installed (bench/gpu_check.sh carries them)"
        }
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"real_trainer": report["real_trainer"]}, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
