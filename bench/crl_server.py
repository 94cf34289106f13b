"""Per-update wall time and policy tokens/s: C-RL's in-process policy engine vs a policy server, same config.

Both arms train examples/train_tiny.yaml's system (two scripted collaborators over HTTP, then the policy) with
LoRA, 4 prompts x 4 rollouts per update and `--tokens` tokens per policy turn, in one process, by turns
(local, server, local, server, ...), so load on the shared machine falls on both. The server arm's policy is
`colab-graphs serve POLICY --enable-lora --logprobs-mode processed_logprobs`, started once through the CLI in a
subprocess: every update saves the adapter, loads it there (vLLM's /v1/load_lora_adapter), sends all of the
update's policy turns at once over HTTP, checks their token ids and computes the importance-sampling
correction. Per arm and run: the median over updates after the first of TRL's `step_time` (wall seconds per
update),
`generation_s`, the policy's tokens per second of generation, and CPU seconds per update of this process and
(server arm) of the server process, read from /proc; then the median over runs, the first round left out
(it pays the imports and first loads).

    python bench/crl_server.py [--rounds 4] [--steps 3] [--tokens 16] [--policy tiny-random] [--out FILE]

What it says about a GPU: nothing. On a CPU with a tiny model both arms decode with the same engine, so the
server arm measures what the HTTP boundary, the adapter sync and the checks cost; on a GPU the server would
be vLLM, whose decoding the in-process engine does not approach.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cpu_s(pid: int | None = None) -> float:
    """User + system CPU seconds of this process (threads included) or of process `pid`."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(policy: str) -> tuple[subprocess.Popen[bytes], str]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "colab_graphs.cli.app", "serve", policy, "--port", str(port)]
    command += ["--enable-lora", "--logprobs-mode", "processed_logprobs", "--no-access-log"]
    proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the policy server did not start")


def run_arm(args: argparse.Namespace, out: Path, server: tuple[Any, str] | None) -> dict[str, Any]:
    from colab_graphs.trainers.config import load_config
    from colab_graphs.trainers.pipeline import train

    overrides: dict[str, Any] = {
        "policy_model": args.policy,
        "lora": True,
        "max_steps": args.steps,
        "max_completion_length": args.tokens,
        "pool": {"policy": {"max_tokens": args.tokens}},
        "save_steps": 0,
        "eval_size": 0,
        "limit": 40,
        "output_dir": str(out),
        "cache_dir": str(out.parent / "cache"),
    }
    if server is not None:
        overrides.update(rollout="server", policy_url=server[1])
    config = load_config(ROOT / "examples" / "train_tiny.yaml", **overrides)
    own, served = _cpu_s(), _cpu_s(server[0].pid) if server else 0.0
    started = time.perf_counter()
    train(config)
    wall = time.perf_counter() - started
    own, served = _cpu_s() - own, (_cpu_s(server[0].pid) - served) if server else 0.0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    later = lines[1:] or lines
    rollouts = config.per_device_train_batch_size
    return {
        "update_s": statistics.median(x["step_time"] for x in later),
        "generation_s": statistics.median(x["generation_s"] for x in later),
        "policy_tokens_per_s": statistics.median(
            x["policy_tokens"] * rollouts / x["generation_s"] for x in later
        ),
        "trainer_cpu_s_per_update": own / len(lines),
        "server_cpu_s_per_update": served / len(lines),
        "run_wall_s": wall,
        "logp_gap_max": max(
            (x.get("sampling/sampling_logp_difference/max", 0.0) for x in lines), default=0.0
        ),
        "policy_sync_s": statistics.median(x.get("policy_sync_s", 0.0) for x in later),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--policy", default="tiny-random")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    server = start_server(args.policy)
    arms: dict[str, list[dict[str, Any]]] = {"local": [], "server": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for arm in arms:
                    result = run_arm(args, Path(tmp) / f"{arm}-{r}", server if arm == "server" else None)
                    arms[arm].append(result)
                    print(arm, r, json.dumps(result), flush=True)
    finally:
        server[0].terminate()
        server[0].wait(timeout=30)

    def med(arm: str, key: str) -> float:  # the first round warms up (imports, first loads): left out
        return statistics.median(x[key] for x in arms[arm][1:] or arms[arm])

    keys = (
        "update_s",
        "generation_s",
        "policy_tokens_per_s",
        "trainer_cpu_s_per_update",
        "server_cpu_s_per_update",
    )
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "date": time.strftime("%Y-%m-%d"),
        "settings": vars(args) | {"out": str(args.out)},
        "median": {arm: {k: round(med(arm, k), 4) for k in keys} for arm in arms},
        "server_over_local": {
            "update_s": round(med("server", "update_s") / med("local", "update_s"), 3),
            "policy_tokens_per_s": round(
                med("server", "policy_tokens_per_s") / med("local", "policy_tokens_per_s"), 3
            ),
            "cpu_s_per_update": round(
                (med("server", "trainer_cpu_s_per_update") + med("server", "server_cpu_s_per_update"))
                / med("local", "trainer_cpu_s_per_update"),
                3,
            ),
        },
        "runs": arms,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
