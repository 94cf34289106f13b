"""What a C-RL team-study update's two passes cost on this CPU, by precision, prompt length and threads: the
training pass (forward and backward of 8 sequences through SmolLM2-135M with LoRA r 16 on all linear layers,
loss on the last 9 positions) and the rollouts' decoding (prefill of 8 prompts, then 8 decoding steps).

Run one process per thread layout being compared (two at once for "two processes, one thread each"):

    OMP_NUM_THREADS=2 python bench/crl_pass_cost.py --threads 2
    OMP_NUM_THREADS=1 python bench/crl_pass_cost.py --threads 1 & OMP_NUM_THREADS=1 python bench/crl_pass_cost.py --threads 1
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--lengths", type=int, nargs="+", default=[100, 50], help="prompt tokens")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats after one warm-up (best kept)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from peft import LoraConfig, get_peft_model

    from colab_graphs.trainers import system

    model, _ = system.load_policy("smollm2-135m", "cpu")
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    generator = torch.Generator().manual_seed(0)
    for training in (True, False):
        model.train(training)
        for length in args.lengths:
            ids = torch.randint(100, 10000, (8, length), generator=generator)
            for bf16 in (False, True):
                best = float("inf")
                for _ in range(args.repeats + 1):
                    started = time.perf_counter()
                    if training:
                        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                            logits = model(input_ids=ids, logits_to_keep=9).logits
                        logits.float().logsumexp(-1).mean().backward()
                        model.zero_grad()
                    else:
                        with (
                            torch.inference_mode(),
                            torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16),
                        ):
                            cache = model(input_ids=ids, use_cache=True).past_key_values
                            for _ in range(8):
                                cache = model(input_ids=ids[:, :1], past_key_values=cache).past_key_values
                    best = min(best, time.perf_counter() - started)
                pass_name = "train (forward + backward)" if training else "rollouts (prefill + 8 tokens)"
                line = {"threads": args.threads, "pass": pass_name, "prompt_tokens": length}
                print(json.dumps({**line, "bf16": bf16, "best_s": round(best, 3)}), flush=True)


if __name__ == "__main__":
    main()
