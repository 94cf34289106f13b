"""C-RL in the real setting, for a GPU machine: a SmolLM2/Qwen-0.5B-class policy debating vLLM collaborators.

Not run in CI or on CPU. What it does:

1. optionally starts one `vllm serve` per collaborator (`--vllm-python` names the Python of a separate
   environment that has vLLM; vLLM cannot share the trainer's environment, see FIELD_NOTES), else expects
   OpenAI-compatible servers at the `--collaborator` URLs;
2. for each `--reward` (default: system, then solo), trains the policy seated in `--protocol` (default a
   2-round debate) on `--data` with GRPO (bf16, the policy generating in process with its live weights),
   evaluating the system before and after on held-out examples;
3. prints and writes `OUT/gpu_crl.json`: eval before/after (system score, the policy seat's LOO, the
   policy's solo score) and the median step time per reward.

Example (policy from the zoo or any HF folder, collaborators served by vLLM on the same GPU):

    python bench/gpu_crl.py --policy smollm2-135m --data gsm8k --steps 100 \
        --collaborator qwen=Qwen/Qwen2.5-0.5B-Instruct@http://127.0.0.1:8001/v1 \
        --collaborator smol=HuggingFaceTB/SmolLM2-360M-Instruct@http://127.0.0.1:8002/v1 \
        --vllm-python /opt/vllm/bin/python --out runs/gpu_crl
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

import colab_graphs._env  # noqa: F401  (offline settings first)
from colab_graphs.trainers.config import config_from_dict
from colab_graphs.trainers.pipeline import train


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
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--credit", default="uniform", choices=["uniform", "replay"])
    parser.add_argument("--reward", action="append", choices=["system", "solo", "sft"])
    parser.add_argument("--vllm-python", help="Python of an environment with vLLM: start the collaborators")
    parser.add_argument("--vllm-memory", type=float, default=0.2, help="GPU memory share per vLLM server")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_crl"))
    args = parser.parse_args()

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
    report: dict = {"policy": args.policy, "protocol": args.protocol, "runs": {}}
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
                    "per_device_train_batch_size": args.batch,
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
            times = [x["step_time"] for x in lines if x.get("step_time") is not None]
            report["runs"][reward] = {
                "eval_before": summary["eval_before"],
                "eval_after": summary["eval_after"],
                "median_step_s": statistics.median(times[1:] or times) if times else None,
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
