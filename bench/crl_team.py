"""C-RL where the policy's credit is collaborative: a proposer whose answer a fixed vote combines with its
teammates', and a critic whose verdict gates a fixed answerer (`bench/crl_team_graphs.py` has the team).

Arms (one `CRLTrainer`, colab_graphs/trainers/baselines.py; the same prompts, draws, optimizer, schedule,
LoRA, seed and number of updates; they differ only in what is rolled out and what the loss is):

    before   the untrained policy
    solo     reward: solo            GRPO on the policy's own correctness, answering alone
    sft      reward: sft             cross-entropy on the policy turns of team rollouts that scored 1
    uniform  reward: system, credit: uniform   (C-RL)
    replay   reward: system, credit: replay    (C-RL, turn credit from K=2 re-runs)

Every trained policy (and `before`) is evaluated on the same held-out questions, greedily, with the teammates'
replies (hence the slot order) fixed per question and the same for every arm:

- `audit`: the product's own audit (`colab_graphs.audit.run.play_audit`, method exact: all 8 coalitions of
  policy + 2 teammates, and each member alone); every question's coalition scores are kept, so the policy
  seat's leave-one-out and Shapley values are recomputed per question from the rows (and checked against the
  audit report's means);
- `swap`: the whole team with the slot order reversed (position swap): a policy that follows the right
  teammate scores the same, one that copies a slot does not;
- `transfer` (with `--transfer`): the policy evaluated in the other seat (a protocol it was not trained in) and
  in its own seat on the transfer task (three-digit operands: a task it was not trained on;
  `crl_team_graphs.transfer_questions`), each as the team and the team without the policy (its LOO).

`--bf16` trains with bf16 autocast (fp32 master weights; TRL's `bf16`) and evaluates bf16 weights: 2-2.5x faster
on a CPU with AVX-512 BF16, at the price of greedy answers that may depend on what a request is batched with.

Constant policies a skeptic computes first (from the same rows, in `crl_team_report.py`): copy slot 1, copy the
best teammate (the one right most often on the training questions), an oracle selector, always reject.

Outputs under OUT (resumable: a rerun skips every training and evaluation already finished, and resumes a
training from its last checkpoint): `data/{train,eval}.jsonl`, `runs/SETTING-ARM-SEED/` (the trainer's
folders), `rows/SETTING-ARM-SEED-EVAL.jsonl` (one line per held-out question), `audits/*.json` (the audit
reports), `manifest.json` (the config, the seed list, the commit and the tree's state, the machine, times).
`python bench/crl_team_report.py OUT` then builds the summary, table and figure from the rows alone.

    # the full study, both seats, seed after seed (BENCHMARKS.md has its cost), 4 policies per process:
    until nice -n 19 python bench/crl_team.py --out runs/crl_team --settings vote gate --seeds 0 1 2 3 4 5 \
        --steps 24 --eval-size 300 --save-steps 4 --bf16 --transfer --stop-after 4; do [ $? = 3 ] || break; done
    # the small run docs/crl.md's table comes from (shipped in bench/results/crl_team/):
    nice -n 19 python bench/crl_team.py --out runs/crl_team_small --settings vote --seeds 0 1 2 --steps 6 \
        --eval-size 60 --save-steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import crl_team_graphs as team  # noqa: E402  (sets the process defaults first: colab_graphs._env)

ARMS = {
    "solo": {"reward": "solo"},
    "own": {"reward": "own"},
    "sft": {"reward": "sft"},
    "uniform": {"reward": "system", "credit": "uniform"},
    "replay": {"reward": "system", "credit": "replay"},
    # The positive control: the same LoRA, optimizer, schedule and number of updates (of as many sequences),
    # trained with supervision on the oracle's answer (`crl_team_control.py`); not a TrainConfig reward.
    "control": {"reward": "sft"},
    # The format warm start: the control's training with a teammate's name drawn at random as the target
    # (`crl_team_control.blind_reply`): the form of a pick, none of the skill; arms may start from its policy.
    "warm": {"reward": "sft"},
}
SETTINGS = team.GRAPHS
TRANSFER_SEATS = ("vote", "gate")
"""The seats `--transfer` evaluates a policy in besides its own (the pick seat has questions of its own)."""
TEMPERATURE = 0.7  # the teammates' sampling temperature (their phrasing), and the rollouts' by default
EVAL_SEED = 0  # the evaluation's draws (greedy policy; it fixes nothing else): the same for every arm
DEVICE = "cpu"
"""Where every policy trains and is evaluated (`--device`): the CPU, or one CUDA GPU (the teammates are scripted
on either)."""


def write_data(
    out: Path, n_train: int, n_eval: int, settings: list[str] | None = None, dev: int = 0
) -> tuple[Path, Path, Path]:
    """The training, held-out and transfer-task files (no question in two of them, operand order included).

    The `pick` setting has questions of its own (cued sums, `crl_team_graphs.pick_questions`) and no transfer
    task: a study of it is a study of it alone. `dev` > 0 (a sweep that chooses a setting): the last `dev`
    training questions become the evaluation file and are not trained on, and the held-out questions are not
    written at all, so nothing chosen on this folder has seen them."""
    picks = [s for s in settings or [] if s in team.PICK_SEATS]
    if picks and len(settings or []) > 1:
        raise SystemExit(
            f"--settings: {picks[0]} has questions of its own; run it in a study (--out) of its own"
        )
    if picks:
        train, held = team.pick_questions(n_train, n_eval)
        transfer: list[dict] = []
    else:
        train, held = team.questions(n_train, n_eval)
        transfer = team.transfer_questions(n_eval)
    if dev:
        if not 0 < dev < len(train):
            raise SystemExit(f"--dev-size: must be between 1 and --train-size - 1, got {dev}")
        train, held = train[:-dev], train[-dev:]
    folder = out / "data"
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.jsonl", folder / "eval.jsonl", folder / "transfer.jsonl"
    for path, records in zip(paths, (train, held, transfer), strict=True):
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return paths


def pool_settings(tokens: int, setting: str = "vote") -> dict[str, dict]:
    """The policy (its model set by the trainer; in `pick_brief` with a persona of its own) and the setting's
    teammates, which sample their phrasing."""
    persona = {"system_prompt": team.PICK_PERSONA} if setting == "pick_brief" else {}
    return {
        "policy": {"max_tokens": tokens, **persona},
        **{m: {"temperature": TEMPERATURE} for m in team.TEAMS[setting]},
    }


def settings(args: argparse.Namespace, setting: str, arm: str, seed: int, data: tuple[Path, ...]) -> dict:
    """One arm's training config: everything but `reward` / `credit` shared by all arms."""
    return {
        "graph": f"crl_team_graphs:{setting}",
        "pool": pool_settings(args.tokens, setting),
        "scripted_members": team.teammates_of(setting),
        "policy_model": args.policy,
        "data": str(data[0]),
        # The trainer's own held-out evaluation runs on one question only (it is not this study's: that is the
        # audit below, on every held-out question); the training file holds none of them anyway.
        "eval_data": str(data[1]),
        "eval_size": 1,
        "eval_before": False,
        "num_generations": 4,
        "per_device_train_batch_size": 4 * args.prompts,
        "max_steps": args.steps,
        "learning_rate": args.lr,
        "lr_scheduler_type": args.lr_schedule,
        "lora": True,
        "lora_r": 16,
        "lora_alpha": 32,
        "max_completion_length": args.tokens,
        "temperature": args.temperature,
        "replay_samples": 2,
        # The RL arms' advantage baseline (the same for all): the group's mean (GRPO), or the batch's mean
        # with the batch's std as scale (a group that scored alike still teaches).
        **({"advantage_baseline": "batch", "scale_rewards": "batch"} if args.baseline == "batch" else {}),
        # What keeps the RL arms exploring (the same for all; SFT and the control have losses of their own,
        # which the trainer refuses to combine with either): an entropy bonus, a KL to the initial policy.
        # With a target, the bonus applies only while the entropy is at or below it (TRL's adaptive control).
        **(
            {
                "entropy_coef": args.entropy_coef,
                "beta": args.beta,
                **(
                    {
                        "use_adaptive_entropy": True,
                        "entropy_target": args.entropy_target,
                        "entropy_coef_min": args.entropy_coef,
                    }
                    if args.entropy_target is not None
                    else {}
                ),
            }
            if ARMS[arm]["reward"] != "sft"
            else {}
        ),
        "seed": seed,
        "save_steps": args.save_steps,
        "use_cpu": DEVICE == "cpu",
        "bf16": args.bf16,
        "max_concurrency": 32,
        "output_dir": str(args.out / "runs" / f"{setting}-{arm}-{seed}"),
        "cache_dir": str(args.out / "cache"),
        **ARMS[arm],
    }


def train_arm(args: argparse.Namespace, setting: str, arm: str, seed: int, data: tuple[Path, ...]) -> Path:
    """Train one arm (resuming from its last checkpoint); the exported policy folder."""
    from colab_graphs.trainers.config import config_from_dict
    from colab_graphs.trainers.pipeline import train

    values = settings(args, setting, arm, seed, data)
    folder = Path(values["output_dir"])
    if (folder / "summary.json").exists():
        return folder / "policy"
    if arm in ("control", "warm"):
        import crl_team_control

        return crl_team_control.train_control(values, args.bf16, "oracle" if arm == "control" else "blind")
    if any((folder / "checkpoints").glob("checkpoint-*")):
        values["resume_from_checkpoint"] = True
    started = time.perf_counter()
    train(
        config_from_dict(values), on_step=lambda line: print(setting, arm, seed, json.dumps(line), flush=True)
    )
    print(json.dumps({"trained": f"{setting}-{arm}-{seed}", "wall_s": round(time.perf_counter() - started)}))
    return folder / "policy"


# --- evaluation ----------------------------------------------------------------------------------------------


def _teammates_row(play: Any, question: str, answer: str, view: Any, swap: bool) -> dict[str, Any]:
    """Who sits in which slot, what each answered and whether it is right, and the policy's reply."""
    replies = {c.seat: c.completion or "" for c in play.calls if c.seat}
    by_reply = {replies.get(f"answer_{m}", ""): m for m in team.TEAMMATES}
    ordered = team.slot_order(question, [replies.get(f"answer_{m}", "") for m in team.TEAMMATES], swap)
    slots = [view.extract(r) or "" for r in ordered]
    policy_reply = replies.get("propose", replies.get("critic", ""))
    return {
        "slot_members": [by_reply[r] for r in ordered],
        "slots": slots,
        "slots_right": [bool(a) and view.same(a, answer) for a in slots],
        "policy_reply": policy_reply,
        "policy_answer": view.extract(policy_reply) or "",
        "verdict": team.verdict(policy_reply),
    }


def load(folder: str, label: str, bf16: bool) -> str:
    """Serve the policy in `folder` as the local model `crl-team-LABEL`; its name (one per policy, so no
    cache can mix two policies' calls)."""
    from colab_graphs.local.provider import set_local_model
    from colab_graphs.trainers import system

    model, tokenizer = system.load_policy(folder, DEVICE)
    if bf16:
        import torch

        model = model.to(torch.bfloat16)
    model.eval()
    name = f"crl-team-{label}"
    set_local_model(name, model, tokenizer)
    return name


def evaluate(
    name: str, setting: str, held: list[Any], label: str, out: Path, tokens: int, full: bool = True
) -> dict[str, list[dict]]:
    """The rows of the policy served as `name` in `setting` on `held`.

    `full`: the product's exact audit (all 8 coalitions, so LOO and Shapley of the policy seat) and the
    position swap; otherwise (the transfer evaluations) the team and the team without the policy (its LOO).
    """
    from colab_graphs.audit.game import CoalitionGame, coalition_id
    from colab_graphs.audit.run import play_audit
    from colab_graphs.models.client import ModelClient
    from colab_graphs.pool import Pool
    from colab_graphs.tasks.scoring import view_for
    from colab_graphs.testing.server import server_for_configs
    from colab_graphs.trainers.rollout import LoopThread

    loop = LoopThread.shared()
    players = ["policy", *team.TEAMMATES]
    result: dict[str, list[dict]] = {}
    with server_for_configs(team.teammate_configs(), "teammates") as server:
        members = pool_settings(tokens)
        members["policy"] = {"model": f"local/{name}", "temperature": 0.0, "max_tokens": tokens}
        for m in team.TEAMMATES:
            members[m].update(server.litellm_kwargs(m))
        pool = Pool.from_dict({m: members[m] for m in players})
        client = ModelClient(None, max_concurrency=32)  # no cache: every policy's calls are its own
        spec = team.GRAPHS[setting](pool.names)
        game = CoalitionGame(spec, pool, held, client=client)
        if full:
            report = loop.run(
                play_audit(
                    spec,
                    pool,
                    held,
                    client=client,
                    method="exact",
                    seed=EVAL_SEED,
                    game=game,
                    play_every_coalition=True,
                    individual=False,
                    plots=False,
                )
            )
            (out / "audits").mkdir(parents=True, exist_ok=True)
            (out / "audits" / f"{label}.json").write_text(report.model_dump_json(indent=1) + "\n")
            coalitions = [
                [m for m in players if m in s]
                for k in range(1, 8)
                for s in [{p for i, p in enumerate(players) if k >> i & 1}]
            ]
            result["audit_report"] = [
                {"shapley": report.shapley, "loo": report.loo, "individual": report.individual}
            ]
        else:
            coalitions = [players, list(team.TEAMMATES)]
            loop.run(game.evaluate([frozenset(c) for c in coalitions], []))
        rows = []
        for example in held:
            view = view_for(example)
            grand = game.plays[(coalition_id("coalition", players), example.id)]
            row = {
                "id": example.id,
                "kind": example.fields.get("kind"),
                "input": example.input,
                "answer": example.answer,
                "final": grand.answer,
                "score": grand.score or 0.0,
                "failed": any(p.failed for (c, e), p in game.plays.items() if e == example.id),
                "coalitions": {
                    ",".join(c): (p.score or 0.0)
                    if (p := game.plays.get((coalition_id("coalition", c), example.id)))
                    else 0.0
                    for c in coalitions
                },
                **_teammates_row(grand, example.input, example.answer, view, False),
            }
            rows.append(row)
        result["audit"] = rows
        if not full:
            return result
        swapped = team.GRAPHS[setting](pool.names, swap=True)
        swap_game = CoalitionGame(swapped, pool, held, client=client)
        loop.run(swap_game.evaluate([frozenset(players)], []))
        result["swap"] = []
        for example in held:
            view = view_for(example)
            play = swap_game.plays[(coalition_id("coalition", players), example.id)]
            result["swap"].append(
                {
                    "id": example.id,
                    "kind": example.fields.get("kind"),
                    "final": play.answer,
                    "score": play.score or 0.0,
                    "failed": play.failed,
                    **_teammates_row(play, example.input, example.answer, view, True),
                }
            )
    return result


def evaluate_pick(
    name: str, held: list[Any], tokens: int, swap: bool = True, setting: str = "pick"
) -> dict[str, list[dict]]:
    """The rows of the policy served as `name` in the `pick` seat on `held`: the team as trained on
    (`audit`), and with the teammates' display order reversed (`swap`: a policy that follows the cue and the
    names scores the same; one that copies a position does not). Without the policy the team's answer is the
    first shown teammate's: the policy's leave-one-out value is the team minus the `floor` constant."""
    from colab_graphs.audit.game import CoalitionGame, coalition_id
    from colab_graphs.models.client import ModelClient
    from colab_graphs.pool import Pool
    from colab_graphs.tasks.scoring import view_for
    from colab_graphs.testing.server import server_for_configs
    from colab_graphs.trainers.rollout import LoopThread

    mates = team.PICK_TEAMMATES
    players = frozenset(["policy", *mates])
    result: dict[str, list[dict]] = {}
    with server_for_configs(team.teammates_of(setting), "teammates") as server:
        members = pool_settings(tokens, setting)
        members["policy"].update(model=f"local/{name}", temperature=0.0)
        for m in mates:
            members[m].update(server.litellm_kwargs(m))
        pool = Pool.from_dict(members)
        client = ModelClient(None, max_concurrency=32)  # no cache: every policy's calls are its own
        for kind, reverse in [("audit", False), *([("swap", True)] if swap else [])]:
            game = CoalitionGame(team.GRAPHS[setting](pool.names, swap=reverse), pool, held, client=client)
            LoopThread.shared().run(game.evaluate([players], []))
            rows = []
            for example in held:
                view = view_for(example)
                play = game.plays[
                    (coalition_id("coalition", [n for n in pool.names if n in players]), example.id)
                ]
                replies = {c.seat: c.completion or "" for c in play.calls if c.seat}
                named = [
                    (m, view.extract(replies.get(f"answer_{m}", "")) or "")
                    for m in team.pick_named(example.input, mates, reverse)
                ]
                reply = replies.get("pick", "")
                first = "number" if setting == "pick_number" else "name"
                chosen, how = team.picked(reply, named, view, first)
                policy_answer = view.extract(reply) or ""
                rows.append(
                    {
                        "id": example.id,
                        "kind": example.fields.get("kind"),
                        "cue": example.fields.get("cue"),
                        "input": example.input,
                        "answer": example.answer,
                        "final": play.answer,
                        "score": play.score or 0.0,
                        "failed": play.failed,
                        "slot_members": [m for m, _ in named],
                        "slots": [a for _, a in named],
                        "slots_right": [bool(a) and view.same(a, example.answer) for _, a in named],
                        "policy_reply": reply,
                        "policy_answer": policy_answer,
                        "picked": chosen,
                        "picked_by": how,
                        "own": float(bool(policy_answer) and view.same(policy_answer, example.answer)),
                    }
                )
            result[kind] = rows
    return result


def pick_constants(rows: list[dict]) -> dict[str, list[dict]]:
    """The constant policies of the `pick` seat as per-question rows, from any evaluation's rows (the
    teammates' answers and display order are fixed per question): `floor` (no pick: the first shown
    teammate's answer, what a policy blind to the question gets), `copy-NAME` (always pick NAME: needs the
    names, not the question), `oracle` (right whenever a teammate is: the right one is picked)."""
    keep = ("id", "kind", "cue", "input", "answer", "slot_members", "slots", "slots_right")
    out: dict[str, list[dict]] = {}
    for arm in ("floor", *(f"copy-{m}" for m in team.PICK_TEAMMATES), "oracle"):
        out[arm] = []
        for row in rows:
            right = dict(zip(row["slot_members"], row["slots_right"], strict=True))
            if arm == "floor":
                score = row["slots_right"][0]
            elif arm == "oracle":
                score = any(row["slots_right"])
            else:
                score = right[arm.removeprefix("copy-")]
            out[arm].append({**{k: row[k] for k in keep}, "score": float(score)})
    return out


def write_rows(path: Path, rows: list[dict], meta: dict) -> None:
    """One JSON line per held-out question, each carrying `meta` (setting, arm, seed, evaluation)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({**meta, **r}) + "\n" for r in rows))
    tmp.replace(path)


def run_evaluations(
    args: argparse.Namespace,
    folder: str,
    setting: str,
    arm: str,
    seed: int | None,
    held: list[Any],
    transfer: list[Any],
) -> None:
    """Evaluate one policy in its setting on the held-out questions (the full audit and the swap) and, with
    --transfer, in the other setting (a protocol it was not trained in) and on the transfer task (a task it
    was not trained on); skip what is done."""
    rows_dir = args.out / "rows"
    rows_dir.mkdir(parents=True, exist_ok=True)
    base = f"{setting}-{arm}-{seed if seed is not None else 'all'}"
    if setting in team.PICK_SEATS:
        if (rows_dir / f"{base}-audit.jsonl").exists():
            return
        name = load(folder, base, args.bf16)
        try:
            started = time.perf_counter()
            result = evaluate_pick(name, held, args.tokens, setting=setting)
        finally:
            from colab_graphs.local.provider import unload

            unload(f"crl-team-{base}")
        meta = {"setting": setting, "evaluated_in": setting, "arm": arm, "seed": seed}
        write_rows(rows_dir / f"{base}-swap.jsonl", result["swap"], {**meta, "eval": "swap"})
        if arm == "before":
            for constant, rows in pick_constants(result["audit"]).items():
                meta_c = {**meta, "arm": constant, "eval": "audit"}
                write_rows(rows_dir / f"{setting}-{constant}-all-audit.jsonl", rows, meta_c)
        write_rows(rows_dir / f"{base}-audit.jsonl", result["audit"], {**meta, "eval": "audit"})
        print(json.dumps({"evaluated": base, "wall_s": round(time.perf_counter() - started)}), flush=True)
        return
    targets = [(setting, setting, held, base, True)]
    if args.transfer:
        targets += [(s, s, held, f"{base}-in-{s}", False) for s in TRANSFER_SEATS if s != setting]
        targets += [(setting, f"{setting}/big", transfer, f"{base}-on-big", False)]
    todo = [t for t in targets if not (rows_dir / f"{t[3]}-audit.jsonl").exists()]
    if not todo:
        return
    name = load(folder, base, args.bf16)
    try:
        for graph, where, questions, label, full in todo:
            started = time.perf_counter()
            result = evaluate(name, graph, questions, label, args.out, args.tokens, full)
            meta = {"setting": setting, "evaluated_in": where, "arm": arm, "seed": seed}
            if full:
                write_rows(rows_dir / f"{label}-swap.jsonl", result["swap"], {**meta, "eval": "swap"})
                write_rows(
                    rows_dir / f"{label}-audit-report.jsonl",
                    result["audit_report"],
                    {**meta, "eval": "report"},
                )
            write_rows(rows_dir / f"{label}-audit.jsonl", result["audit"], {**meta, "eval": "audit"})
            print(
                json.dumps({"evaluated": label, "wall_s": round(time.perf_counter() - started)}), flush=True
            )
    finally:
        from colab_graphs.local.provider import unload

        unload(f"crl-team-{base}")


ROW_FILES = {"audit": "audit", "swap": "swap", "report": "audit-report", "curve": "audit"}


def row_file(row: dict) -> str:
    """The rows/ file a shipped row came from (the names `run_evaluations` and crl_team_curve.py write)."""
    setting, where = row["setting"], row["evaluated_in"]
    label = f"{setting}-{row['arm']}-{'all' if row['seed'] is None else row['seed']}"
    if row["eval"] == "curve":
        label += f"-at-{row['step']}"
    elif where == f"{setting}/big":
        label += "-on-big"
    elif where != setting:
        label += f"-in-{where}"
    return f"{label}-{ROW_FILES[row['eval']]}.jsonl"


def resume_from(pack: Path, out: Path, transfer: bool) -> dict[str, int]:
    """Go on with a study shipped elsewhere: copy `pack`'s (a `crl_team_report.py --pack` folder) rows, and the
    trainings whose every evaluation it holds, into `out` where `out` lacks them, so a rerun of the study's
    command skips them (a training whose evaluations are incomplete is trained again: its weights are not
    shipped, and a seed's training repeats on the same machine). Refuses a pack of other questions."""
    import crl_team_report as report

    for name in ("train.jsonl", "eval.jsonl", "transfer.jsonl"):
        shipped, here = pack / "data" / name, out / "data" / name
        if shipped.exists() and here.exists() and shipped.read_bytes() != here.read_bytes():
            raise SystemExit(f"{here}: differs from {shipped} (the pack is of another study's questions)")
    if not (out / "manifest.json").exists() and (pack / "manifest.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        (out / "manifest.json").write_bytes((pack / "manifest.json").read_bytes())
    files: dict[str, list[dict]] = {}
    for row in report.read_rows(pack):
        files.setdefault(row_file(row), []).append(row)
    rows_dir = out / "rows"
    rows_dir.mkdir(parents=True, exist_ok=True)
    restored = {"row_files": 0, "trainings": 0}
    for name, rows in files.items():
        if not (rows_dir / name).exists():
            (rows_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
            restored["row_files"] += 1
    curves: dict[str, list[dict]] = {}
    rollouts: dict[str, list[dict]] = {}
    for lines, read in ((curves, report.read_curves), (rollouts, report.read_rollouts)):
        for line in read(pack):
            run = f"{line['setting']}-{line['arm']}-{line['seed']}"
            lines.setdefault(run, []).append(
                {k: v for k, v in line.items() if k not in ("setting", "arm", "seed")}
            )
    for training in report.read_trainings(pack):
        run = f"{training['setting']}-{training['arm']}-{training['seed']}"
        base = {"setting": training["setting"], "arm": training["arm"], "seed": training["seed"]}
        evals = (
            ("audit", "swap")
            if training["setting"] in team.PICK_SEATS
            else [e for e in ROW_FILES if e != "curve"]
        )
        needed = {row_file({**base, "evaluated_in": training["setting"], "eval": e}) for e in evals}
        if transfer:
            needed |= {
                row_file({**base, "evaluated_in": w, "eval": "audit"})
                for w in [
                    *[s for s in TRANSFER_SEATS if s != training["setting"]],
                    f"{training['setting']}/big",
                ]
            }
        folder = out / "runs" / run
        if (folder / "summary.json").exists() or not all((rows_dir / n).exists() for n in needed):
            continue
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in curves.get(run, [])))
        if run in rollouts:  # a pack made before rollouts were shipped has none
            (folder / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rollouts[run]))
        (folder / "summary.json").write_text(json.dumps(training["summary"], indent=2) + "\n")
        restored["trainings"] += 1
    return restored


# --- provenance ----------------------------------------------------------------------------------------------


def _git(*argv: str, strip: bool = True) -> str:
    try:
        out = subprocess.run(["git", *argv], cwd=BENCH, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""
    return out.strip() if strip else out


def tree_state() -> dict[str, Any]:
    """Whether the whole work tree differed from its commit (any tracked change or untracked file, not only
    under bench/), and which paths did."""
    # Unstripped: a porcelain line's status column may start with a space (" M path").
    status = _git("status", "--porcelain", "--", ":/", strip=False)
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return {"tree_dirty": bool(changed), "dirty_paths": changed[:50]}


def manifest(args: argparse.Namespace, data: tuple[Path, ...], started: float) -> dict[str, Any]:
    """The config, the seed list, the commit (and whether the tree differed from it), the machine."""
    import torch
    import transformers
    import trl

    path = args.out / "manifest.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    config = {
        s: {
            a: {k: v for k, v in settings(args, s, a, 0, data).items() if k not in ("seed", "output_dir")}
            for a in ARMS
        }
        for s in args.settings
    }
    # A study may be run a setting at a time (all seeds of one, then the next): the manifest keeps them all.
    config = {**earlier.get("config", {}), **config}
    return {
        "study": "bench/crl_team.py",
        "command": " ".join(sys.argv),
        "settings": [*[s for s in earlier.get("settings", []) if s not in args.settings], *args.settings],
        "arms": ["before", *[a for a in ARMS if a in set(earlier.get("arms", [])) | set(args.arms)]],
        "seeds": sorted(set(earlier.get("seeds", [])) | set(args.seeds)),
        "steps": args.steps,
        "prompts_per_step": args.prompts,
        "rollouts_per_prompt": 4,
        "eval_size": args.eval_size,
        "train_size": args.train_size,
        "policy": args.policy,
        "tokens": args.tokens,
        "learning_rate": args.lr,
        "lr_schedule": args.lr_schedule,
        "temperature": args.temperature,
        "baseline": args.baseline,
        "entropy_coef": args.entropy_coef,
        "entropy_target": args.entropy_target,
        "beta": args.beta,
        "dev_size": args.dev_size,
        "transfer": args.transfer,
        "transfer_task": "three-digit operands (add, mul, sub; bench/crl_team_graphs.transfer_questions)",
        "bf16": args.bf16,
        "device": DEVICE,
        **({"gpu": torch.cuda.get_device_name(0)} if DEVICE == "cuda" else {}),
        "eval_seed": EVAL_SEED,
        "curve_steps": args.curve_steps,
        "config": config,
        "commit": _git("rev-parse", "HEAD"),
        **tree_state(),
        # Every process that worked on the study (a long one is many, `--stop-after`), with the commit it
        # started on: the code each seed ran is known even when the tree moved on between processes.
        "processes": [
            *[p for p in earlier.get("processes", []) if p.get("pid") != PROCESS["pid"]],
            PROCESS,
        ],
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}",
        "started": earlier.get("started", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))),
        "wall_s": round(earlier.get("wall_s", 0) + time.time() - started),
    }


PROCESS: dict[str, Any] = {}
"""This process: its pid, start, the commit it started on and whether the tree differed from it."""


def main() -> None:
    PROCESS.update(
        pid=os.getpid(),
        started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        commit=_git("rev-parse", "HEAD"),
        **tree_state(),
    )
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/crl_team"))
    parser.add_argument("--settings", nargs="+", default=["vote"], choices=list(team.GRAPHS))
    parser.add_argument(
        "--arms",
        nargs="+",
        default=["solo", "sft", "uniform", "replay"],
        choices=list(ARMS),
        help="own: RL on the policy's own correctness in the seat; control: the positive control",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=8, help="policy updates per arm")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per update (x 4 rollouts)")
    parser.add_argument("--eval-size", type=int, default=300)
    parser.add_argument("--train-size", type=int, default=600)
    parser.add_argument("--policy", default="smollm2-135m", help="zoo name or HF folder")
    parser.add_argument("--tokens", type=int, default=10, help="most tokens per policy turn")
    parser.add_argument(
        "--temperature",
        type=float,
        default=TEMPERATURE,
        help="the policy's sampling temperature in rollouts (the vote and gate studies: 0.7; at 1.0 "
        "SmolLM2-135M mostly writes off-topic text there)",
    )
    parser.add_argument(
        "--baseline",
        default="group",
        choices=["group", "batch"],
        help="the RL arms' advantage baseline: each prompt's group mean (GRPO), or the batch mean",
    )
    parser.add_argument(
        "--entropy-coef",
        type=float,
        default=0.0,
        help="the RL arms' entropy bonus (TRL's entropy_coef: the loss minus coef x the mean token entropy)",
    )
    parser.add_argument(
        "--entropy-target",
        type=float,
        help="the RL arms' entropy floor: the bonus applies only while the mean token entropy is at or below "
        "it, at least --entropy-coef, raised by TRL's entropy_coef_delta each update it stays below",
    )
    parser.add_argument(
        "--beta", type=float, default=0.0, help="the RL arms' KL to the initial policy (the adapter disabled)"
    )
    parser.add_argument(
        "--dev-size",
        type=int,
        default=0,
        help="choose a setting: evaluate on the last N training questions (not trained on), never the held-out",
    )
    parser.add_argument("--lr", type=float, default=3e-4, help="LoRA (r 16) learning rate")
    parser.add_argument(
        "--lr-schedule",
        default="linear",
        choices=["linear", "constant"],
        help="linear decay to 0 over --steps (the first study's), or constant (a plateau cannot be the schedule)",
    )
    parser.add_argument("--save-steps", type=int, default=4, help="checkpoint every N updates (resume)")
    parser.add_argument(
        "--curve-steps",
        type=int,
        nargs="*",
        default=[],
        help="after each training, evaluate its checkpoints at these updates on the held-out questions "
        "(crl_team_curve.py; each a multiple of --save-steps)",
    )
    parser.add_argument(
        "--transfer", action="store_true", help="also evaluate each policy in the other setting"
    )
    parser.add_argument(
        "--bf16", action="store_true", help="bf16 autocast in training, bf16 weights in evaluation"
    )
    parser.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="train and evaluate every policy on the CPU or on one CUDA GPU",
    )
    parser.add_argument(
        "--stop-after",
        type=int,
        default=0,
        help="exit (status 3) once N policies were trained by this process (a loop of fresh processes keeps "
        "a long study's memory bounded; each resumes where the last stopped)",
    )
    parser.add_argument(
        "--resume-from",
        type=Path,
        help="a shipped study (bench/results/crl_team): its finished policies are not redone here",
    )
    args = parser.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device here")
    global DEVICE
    DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    if args.resume_from:
        print(
            json.dumps(
                {
                    "resumed_from": str(args.resume_from),
                    **resume_from(args.resume_from, args.out, args.transfer),
                }
            )
        )
    started = time.time()
    if set(args.settings) & set(team.PICK_SEATS) and args.transfer:
        raise SystemExit("--transfer: the pick settings have no transfer task")
    data = write_data(args.out, args.train_size, args.eval_size, args.settings, args.dev_size)
    from colab_graphs.tasks.loaders import load_examples

    held = load_examples(str(data[1]))
    transfer = load_examples(str(data[2])) if data[2].read_text().strip() else []
    train_keys = {team.question_key(e.input) for e in load_examples(str(data[0]))}
    overlap = [e.id for e in [*held, *transfer] if team.question_key(e.input) in train_keys]
    overlap += [
        e.id for e in transfer if team.question_key(e.input) in {team.question_key(h.input) for h in held}
    ]
    if overlap:
        raise SystemExit(f"held-out or transfer questions also in training or held out: {overlap[:5]}")
    (args.out / "manifest.json").write_text(json.dumps(manifest(args, data, started), indent=1) + "\n")
    for setting in args.settings:
        run_evaluations(args, args.policy, setting, "before", None, held, transfer)
    fresh = 0
    for seed in args.seeds:
        for setting in args.settings:
            for arm in args.arms:
                trained = (args.out / "runs" / f"{setting}-{arm}-{seed}" / "summary.json").exists()
                if args.stop_after and fresh >= args.stop_after and not trained:
                    print(json.dumps({"stopped_after": fresh}), flush=True)
                    raise SystemExit(3)
                fresh += not trained
                folder = train_arm(args, setting, arm, seed, data)
                run_evaluations(args, str(folder), setting, arm, seed, held, transfer)
                if args.curve_steps:
                    import crl_team_curve

                    curve = ["--settings", setting, "--arms", arm, "--seeds", str(seed), "--steps"]
                    bf16 = ["--bf16"] if args.bf16 else []
                    device = ["--device", DEVICE]
                    crl_team_curve.main([str(args.out), *curve, *map(str, args.curve_steps), *bf16, *device])
                (args.out / "manifest.json").write_text(
                    json.dumps(manifest(args, data, started), indent=1) + "\n"
                )
                started = time.time()


if __name__ == "__main__":
    main()
