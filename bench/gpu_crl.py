"""C-RL in the real setting, for a GPU machine: a SmolLM2/Qwen-0.5B-class policy debating vLLM collaborators.

Not run in CI or on CPU. What it does:

1. prints the training memory it will need (`memory_estimate`: weights, gradients, optimizer, the
   activations of one forward/backward pass of `--pass-rows` segments, the policy engine's KV cache during
   rollouts) against the GPU memory left beside the vLLM servers, and stops before any work when it does
   not fit (`--force` goes on anyway);
2. optionally starts one `vllm serve` per collaborator (`--vllm-python` names the Python of a separate
   environment that has vLLM; vLLM cannot share the trainer's environment, see docs/platform.md), else expects
   OpenAI-compatible servers at the `--collaborator` URLs;
3. for each `--reward` (default: system, then solo), trains the policy seated in `--protocol` (default a
   2-round debate) on `--data` with GRPO (bf16, the policy generating in process with its live weights),
   evaluating the system before and after on held-out examples;
4. prints and writes `OUT/gpu_crl.json`: the memory estimate, eval before/after (system score, the policy
   seat's LOO, the policy's solo score), the median step time and its split per reward.

Sized for one H200 (139 GiB usable): 64 rollouts per step (8 prompts x 8) of a 2-round debate, i.e. 128
policy segments of up to ~1,250 tokens, trained in passes of 8 segments (8 micro-steps of 16 segments, two
passes each); two collaborators at 0.2 of the GPU each. A 0.5B policy (Qwen2.5-0.5B's shape) then needs
~19 GiB, 11 of them one pass's activations (`--gradient-checkpointing`: under 1), where one pass over all 128
segments, as before passes were bounded, would have needed ~180 GiB of activations; SmolLM2-135M ~8 GiB.

Example (policy from the zoo or any HF folder, collaborators served by vLLM on the same GPU):

    python bench/gpu_crl.py --policy smollm2-135m --data gsm8k --steps 100 \
        --collaborator qwen=Qwen/Qwen2.5-0.5B-Instruct@http://127.0.0.1:8001/v1 \
        --collaborator smol=HuggingFaceTB/SmolLM2-360M-Instruct@http://127.0.0.1:8002/v1 \
        --vllm-python /opt/vllm/bin/python --out runs/gpu_crl

    python bench/gpu_crl.py --policy smollm2-135m --collaborator a=x@http://h:1/v1 --estimate-only
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

from gpu_check import SHAPES, GiB, memory_estimate  # bench/gpu_check.py: the formula and the real shapes

# colab_graphs is imported only past --estimate-only: the estimate runs where only torch is installed.


def parse_collaborator(text: str) -> tuple[str, str, str]:
    """`name=model@url` -> (name, model, url)."""
    name, _, rest = text.partition("=")
    model, _, url = rest.partition("@")
    if not (name and model and url):
        raise argparse.ArgumentTypeError(f"expected name=model@http://host:port/v1, got {text!r}")
    return name, model, url


def start_vllm(python: str, model: str, url: str, memory: float) -> subprocess.Popen:
    """Start `vllm serve` for `model` on the port of `url` and wait until it answers /models."""
    port = url.rstrip("/").rsplit(":", 1)[-1].split("/")[0]
    proc = subprocess.Popen(
        [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--port",
            port,
            "--gpu-memory-utilization",
            str(memory),
            "--max-model-len",
            "4096",
        ],
    )
    deadline = time.time() + 900
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url.rstrip("/") + "/models", timeout=2)
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve {model} exited with {proc.returncode}") from None
            time.sleep(5)
    proc.terminate()
    raise TimeoutError(f"vllm serve {model} did not come up on {url}")


def print_estimate(estimate: dict[str, float], budget: float) -> float:
    """Print the estimate; returns the peak (rollouts and training do not overlap in time)."""
    static = estimate["weights"] + estimate["gradients"] + estimate["optimizer"]
    peak = static + max(estimate["activations"], estimate["kv_cache"])
    print("memory estimate (GiB): " + "  ".join(f"{k} {v:.1f}" for k, v in estimate.items()))
    print(f"peak ~{peak:.1f} GiB of {budget:.1f} GiB left beside the vLLM servers", flush=True)
    return peak


def gpu_gib() -> float:
    """This machine's GPU memory in GiB (139, one H200, when there is no GPU to ask)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / GiB
    return 139.0


def policy_shape(policy: str, fetch: bool) -> dict:
    """The policy's config.json: from its folder, a zoo model already on disk, or (not `fetch`, as with
    --estimate-only) bench/gpu_check.py's shape of that name; nothing is downloaded unless `fetch`."""
    folder = Path(policy).expanduser()
    if (folder / "config.json").is_file():
        return json.loads((folder / "config.json").read_text())
    try:
        from colab_graphs.local import zoo

        entry = zoo.get_entry(policy)
    except (
        ImportError,
        KeyError,
    ):  # the package's dependencies are absent (a bare GPU image), or no zoo name
        entry = None
    if entry is not None and (fetch or entry.is_cached()):
        return json.loads((zoo.resolve(policy) / "config.json").read_text())
    if not fetch and policy in SHAPES:
        return {"tie_word_embeddings": True, **SHAPES[policy]}
    if not fetch:
        raise SystemExit(
            f"--estimate-only reads the policy's config.json from a folder, a zoo model already on disk or "
            f"bench/gpu_check.py's shapes ({', '.join(SHAPES)}); {policy!r} is none of these and nothing is "
            "downloaded for an estimate"
        )
    from colab_graphs.local import zoo  # training needs the whole package: its ImportError says what lacks

    return json.loads((zoo.resolve(policy) / "config.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="smollm2-135m", help="zoo name, HF folder or hub id")
    parser.add_argument("--collaborator", type=parse_collaborator, action="append", required=True)
    parser.add_argument("--protocol", default="debate")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data", default="gsm8k")
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument("--eval-size", type=int, default=200)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="rollouts per step")
    parser.add_argument("--pass-rows", type=int, default=8, help="segments per forward/backward pass")
    parser.add_argument(
        "--row-tokens", type=int, default=1250, help="longest policy segment, for the estimate"
    )
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--credit", default="uniform", choices=["uniform", "replay"])
    parser.add_argument("--reward", action="append", choices=["system", "solo", "sft"])
    parser.add_argument("--vllm-python", help="Python of an environment with vLLM: start the collaborators")
    parser.add_argument("--vllm-memory", type=float, default=0.2, help="GPU memory share per vLLM server")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_crl"))
    parser.add_argument("--force", action="store_true", help="train even when the estimate does not fit")
    parser.add_argument("--estimate-only", action="store_true", help="print the memory estimate and stop")
    args = parser.parse_args()
    if args.batch % args.pass_rows or args.batch % args.generations:
        parser.error("--batch must be a multiple of --pass-rows and of --generations")

    policy_config = policy_shape(args.policy, fetch=not args.estimate_only)
    estimate = memory_estimate(
        policy_config, args.pass_rows, args.row_tokens, args.batch, None, args.gradient_checkpointing
    )
    budget = gpu_gib() * (1 - args.vllm_memory * len(args.collaborator)) - 4  # CUDA context, fragmentation
    peak = print_estimate(estimate, budget)
    if args.estimate_only:
        return
    if peak > budget and not args.force:
        raise SystemExit(
            f"the estimate ({peak:.1f} GiB) exceeds the {budget:.1f} GiB left: lower --pass-rows, add "
            "--gradient-checkpointing or give vLLM less (--vllm-memory); --force to try anyway"
        )

    import colab_graphs._env  # noqa: F401  (process defaults before transformers / litellm load)
    from colab_graphs.trainers.config import config_from_dict
    from colab_graphs.trainers.pipeline import train

    servers = []
    if args.vllm_python:
        servers = [start_vllm(args.vllm_python, m, u, args.vllm_memory) for _, m, u in args.collaborator]
    pool = {"policy": {"max_tokens": args.max_tokens}}
    for name, model, url in args.collaborator:
        pool[name] = {
            "model": f"hosted_vllm/{model}",
            "api_base": url,
            "api_key": "none",
            "temperature": 0.7,
            "max_tokens": args.max_tokens,
        }
    report: dict = {"policy": args.policy, "protocol": args.protocol, "memory_gib": estimate, "runs": {}}
    try:
        for reward in args.reward or ["system", "solo"]:
            out = args.out / reward
            config = config_from_dict(
                {
                    "protocol": args.protocol,
                    "protocol_params": {"rounds": args.rounds} if args.protocol == "debate" else {},
                    "pool": pool,
                    "policy_model": args.policy,
                    "data": args.data,
                    "limit": args.limit,
                    "eval_size": args.eval_size,
                    "reward": reward,
                    "credit": args.credit,
                    "num_generations": args.generations,
                    # passes of --pass-rows segments; the step's --batch rollouts over batch / pass_rows
                    # micro-steps (TRL generates all of them at once: steps_per_generation = that count)
                    "per_device_train_batch_size": args.pass_rows,
                    "gradient_accumulation_steps": args.batch // args.pass_rows,
                    "gradient_checkpointing": args.gradient_checkpointing,
                    "max_steps": args.steps,
                    "learning_rate": args.lr,
                    "max_completion_length": args.max_tokens,
                    "bf16": True,
                    "save_steps": max(1, args.steps // 4),
                    "output_dir": str(out),
                    "cache_dir": str(args.out / "cache"),
                    "max_concurrency": 64,
                }
            )
            summary = train(config, on_step=lambda line: print(json.dumps(line), flush=True))
            lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]

            def median(key: str, lines: list = lines) -> float | None:
                values = [x[key] for x in lines[1:] or lines if x.get(key) is not None]
                return statistics.median(values) if values else None

            report["runs"][reward] = {
                "eval_before": summary["eval_before"],
                "eval_after": summary["eval_after"],
                "median_step_s": median("step_time"),
                "median_split_s": {k: median(k) for k in ("generation_s", "credit_s", "training_s")},
                "wall_s": summary["wall_s"],
            }
    finally:
        for proc in servers:
            proc.terminate()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_crl.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
