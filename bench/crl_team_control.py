"""The positive control of `bench/crl_team.py` (arm `control`): the policy trained with supervision on the
oracle's answer in its seat, with everything else a trained arm has.

Same starting policy, LoRA (rank, alpha, target modules, initial draw: `set_seed(seed)` before the adapter is
made, as the trainer does), optimizer (AdamW, weight decay 0, as TRL's default), learning rate and schedule
(`lr_scheduler_type`), gradient clipping (`max_grad_norm`), precision (bf16 autocast with `--bf16`) and number of
updates, each of as many sequences as an RL update has rollouts (`per_device_train_batch_size`). What differs
is the loss: token cross-entropy of the oracle's reply (`oracle_reply`: in the `pick` seat the right teammate's
name, "Ana."; in `pick_number` "The answer is N.", N the right teammate's answer) after the policy's own prompt in the seat: the exact messages its
seat sends, taken from a run of the team with the untrained policy, rendered by the engine that serves it.
It asks one thing: can this policy, with this adapter and budget, learn the seat's skill at all? If it
cannot, a trained arm's failure says nothing about C-RL.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import crl_team_graphs as team


def policy_prompts(
    values: dict[str, Any], model: Any, tokenizer: Any, examples: list[Any]
) -> list[list[int]]:
    """Each example's prompt token ids as the policy's seat renders it (one run of the team, the policy
    making a one-token turn, its seat's messages read from the trace)."""
    from colab_graphs.audit.game import CoalitionGame, coalition_id
    from colab_graphs.local.provider import get_engine, set_local_model, unload
    from colab_graphs.models.client import ModelClient
    from colab_graphs.pool import Pool
    from colab_graphs.testing.server import server_for_configs
    from colab_graphs.trainers.rollout import LoopThread

    setting = values["graph"].split(":")[1]
    mates = list(team.TEAMS[setting])
    name = f"crl-team-control-prompts-{time.monotonic_ns()}"
    set_local_model(name, model, tokenizer)
    try:
        with server_for_configs(values["scripted_members"], "teammates") as server:
            members = {m: dict(values["pool"][m]) for m in mates}
            for m in mates:
                members[m].update(server.litellm_kwargs(m))
            members["policy"] = {
                **values["pool"]["policy"],
                "model": f"local/{name}",
                "temperature": 0.0,
                "max_tokens": 1,
            }
            pool = Pool.from_dict(members)
            game = CoalitionGame(
                team.GRAPHS[setting](pool.names), pool, examples, client=ModelClient(None, max_concurrency=32)
            )
            players = frozenset(["policy", *mates])
            LoopThread.shared().run(game.evaluate([players], []))
            engine = get_engine(name)
            prompts = []
            for example in examples:
                play = game.plays[
                    (coalition_id("coalition", [n for n in pool.names if n in players]), example.id)
                ]
                calls = [c for c in play.calls if c.member == "policy"]
                if len(calls) != 1 or play.failed:
                    raise RuntimeError(f"{example.id}: the team's run gave {len(calls)} policy turns")
                prompts.append(list(engine.render(calls[0].messages)))
            return prompts
    finally:
        unload(name)


def oracle_reply(values: dict[str, Any], example: Any) -> str:
    """What the oracle replies in the seat: the right teammate's name where the seat asks for a name (`pick`),
    else its answer (which, where a teammate is right, is the question's)."""
    if values["graph"].endswith((":pick", ":pick_brief")):
        return f"{str(example.fields['kind']).capitalize()}."
    return f"The answer is {example.answer}."


def blind_reply(values: dict[str, Any], example: Any) -> str:
    """The format warm start's reply: one of the seat's teammates by name, drawn uniformly per question from
    the seed and the question's id alone (independent of its cue and of who is right): the form of a pick,
    none of the skill."""
    setting = values["graph"].split(":")[1]
    rng = random.Random(f"crl-team-warm:{values['seed']}:{example.id}")
    return f"{rng.choice(sorted(team.TEAMS[setting])).capitalize()}."


def train_control(values: dict[str, Any], bf16: bool, target: str = "oracle") -> Path:
    """Train the control arm of the config `values` (`crl_team.settings`); the exported policy folder.

    `target` "blind": the format warm start instead (`blind_reply`: a teammate's name at random)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import set_seed

    from colab_graphs.tasks.loaders import load_examples
    from colab_graphs.trainers import system
    from colab_graphs.trainers.export import export_policy

    started = time.perf_counter()
    out = Path(values["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    examples = load_examples(values["data"])
    steps, batch = values["max_steps"], values["per_device_train_batch_size"]
    # The examples of each update, drawn in turn from reshuffled passes over the training questions.
    rng = random.Random(f"crl-team-control:{values['seed']}")
    schedule: list[list[int]] = []
    order: list[int] = []
    for _ in range(steps):
        picked = []
        for _ in range(batch):
            if not order:
                order = list(range(len(examples)))
                rng.shuffle(order)
            picked.append(order.pop())
        schedule.append(picked)
    used = sorted({i for picked in schedule for i in picked})
    device = "cpu" if values.get("use_cpu", True) else "cuda"
    model, tokenizer = system.load_policy(values["policy_model"], device)
    rendered = policy_prompts(values, model, tokenizer, [examples[i] for i in used])
    prompts = dict(zip(used, rendered, strict=True))
    eos = tokenizer.eos_token_id
    reply = blind_reply if target == "blind" else oracle_reply
    targets = {
        i: tokenizer.encode(reply(values, examples[i]), add_special_tokens=False) + [eos] for i in used
    }
    set_seed(values["seed"])
    model = get_peft_model(
        model,
        LoraConfig(
            r=values["lora_r"],
            lora_alpha=values["lora_alpha"],
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        ),
    )
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=values["learning_rate"], weight_decay=0.0)
    linear = values.get("lr_scheduler_type", "linear") == "linear"
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, (lambda k: 1.0 - k / steps) if linear else (lambda k: 1.0)
    )
    metrics = out / "metrics.jsonl"
    metrics.write_text("")
    for step, picked in enumerate(schedule, 1):
        tick = time.perf_counter()
        seqs = [prompts[i] + targets[i] for i in picked]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        labels = torch.full((len(seqs), width), -100, dtype=torch.long)
        for row, (i, seq) in enumerate(zip(picked, seqs, strict=True)):
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
            labels[row, len(prompts[i]) : len(seq)] = torch.tensor(targets[i])
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(trainable, values.get("max_grad_norm", 1.0))
        optimizer.step()
        lr = scheduler.get_last_lr()[0]
        scheduler.step()
        optimizer.zero_grad()
        line = {
            "step": step,
            "loss": round(loss.item(), 5),
            "grad_norm": round(float(norm), 5),
            "learning_rate": lr,
            "step_time": round(time.perf_counter() - tick, 3),
        }
        with open(metrics, "a") as fh:
            fh.write(json.dumps(line) + "\n")
        if values.get("save_steps") and step % values["save_steps"] == 0 and step < steps:
            # The adapter at this update, as the trainer's checkpoints hold it (the held-out curve's input).
            model.save_pretrained(str(out / "checkpoints" / f"checkpoint-{step}"))
        print("control", values["seed"], json.dumps(line), flush=True)
    model.eval()
    folder = export_policy(model, tokenizer, out / "policy", {"control": target, "steps": steps})
    summary = {
        "reward": "control" if target == "oracle" else "warm",
        "steps": steps,
        "wall_s": round(time.perf_counter() - started, 3),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return folder
