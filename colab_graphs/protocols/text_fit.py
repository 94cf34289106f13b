"""What the trained text-level methods share: an unfitted placeholder, dev runs, and fine-tuning members.

`heterogeneous_swarms` (`colab_graphs.protocols.text_swarms`), `multiagent_finetuning`
(`colab_graphs.protocols.text_finetune`), `sparta` (`colab_graphs.protocols.text_sparta`) and `agglm`
(`colab_graphs.protocols.text_agglm`) fit each coalition on a dev split before it runs (the fit steps of
`colab_graphs.fitting`, cached through `colab_graphs.protocols.dev_fit`). Until its fit step has run, a
spec's seats call `UNFITTED_MODEL`, so a run without it fails at its first call, naming the step.

Members are fine-tuned with `finetune`: supervised fine-tuning through the C-RL trainer's SFT objective
(`colab_graphs.trainers.grpo.CRLTrainer` with `objective="sft"`, the `reward: sft` baseline's TRL machinery:
optimizer, schedule, clipping, precision), on fixed (prompt, completion) segments instead of fresh rollouts. Only
in-process `local/` members have weights to train; `trainable_members` refuses API members by name, or keeps
them unchanged when the protocol is told to (`frozen_api_members`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocols.dev_fit import LOCAL_PREFIX, FitError
from colab_graphs.runner import ExampleOutcome
from colab_graphs.spec import GraphSpec, Seat, SpecError
from colab_graphs.tasks.example import Example

LOCAL_TRAINING = "local_weights"  # what `colab-graphs protocols` says a protocol that trains members requires
# A seat's model until the fit step routes it: a call fails, and the failure names what is missing.
UNFITTED_MODEL = "local/unfitted-protocol(run-the-protocol's-fit-step:colab_graphs.fitting)"

__all__ = [
    "LOCAL_TRAINING",
    "UNFITTED_MODEL",
    "FitError",
    "LocalMembersError",
    "Segment",
    "check_models",
    "finetune",
    "finetune_members",
    "run_on_dev",
    "trainable_members",
    "unfitted",
    "with_seat_models",
]


class LocalMembersError(SpecError):
    """A protocol that trains its members' weights was given API members (each named, with what to do)."""


def unfitted(spec: GraphSpec) -> GraphSpec:
    """`spec` with every seat calling `UNFITTED_MODEL` (the placeholder a registered builder returns)."""
    return with_seat_models(spec, {n.name: UNFITTED_MODEL for n in spec.nodes if isinstance(n, Seat)})


def with_seat_models(spec: GraphSpec, models: dict[str, str]) -> GraphSpec:
    """`spec` whose seats named in `models` call that model (their other settings kept)."""
    nodes = [
        n.model_copy(update={"settings": {**n.settings, "model": models[n.name]}})
        if isinstance(n, Seat) and n.name in models
        else n
        for n in spec.nodes
    ]
    return spec.model_copy(update={"nodes": nodes})


def is_local(pool: Pool, member: str) -> bool:
    return pool[member].model.startswith(LOCAL_PREFIX)


FROZEN_HINT = "give -P frozen_api_members=true to let them take part unchanged"


def trainable_members(
    name: str, pool: Pool, members: Sequence[str], frozen_api_members: bool, remedy: str = FROZEN_HINT
) -> list[str]:
    """The members whose weights `name` trains (the in-process `local/` ones), in pool order.

    Raises:
        LocalMembersError: API members are present and `frozen_api_members` is false (they are named, and
            the message ends with `remedy`).
    """
    remote = [m for m in members if not is_local(pool, m)]
    if remote and not frozen_api_members:
        listed = ", ".join(f"{m} ({pool[m].model})" for m in remote)
        raise LocalMembersError(
            name,
            [
                f"{name} fine-tunes its members' weights, which only in-process models have: member(s) {listed} "
                f"are not '{LOCAL_PREFIX}...' models (a zoo name or a model folder); {remedy}"
            ],
        )
    return [m for m in members if m not in remote]


async def run_on_dev(
    spec: GraphSpec, pool: Pool, examples: Sequence[Example], *, client: ModelClient, scorer: str | None
) -> list[ExampleOutcome]:
    """`spec` run over the dev examples through the run's client (and its call cache), in dataset order.

    Raises:
        FitError: a dev example failed (the message names the protocol, the example and the error).
    """
    from colab_graphs.compile import compile_graph
    from colab_graphs.runner import run_example

    graph = compile_graph(spec, pool, client, fuse=True)
    outcomes = await asyncio.gather(*(run_example(graph, spec, pool, client, e, scorer) for e in examples))
    failed = [o for o in outcomes if o.failed]
    if failed:
        raise FitError(f"{spec.name}: a dev run failed on {failed[0].example_id}: {failed[0].error}")
    return list(outcomes)


def mean_score(outcomes: Sequence[ExampleOutcome]) -> float:
    return sum(o.score or 0.0 for o in outcomes) / len(outcomes) if outcomes else 0.0


# --- fine-tuning a member ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """One thing a member learns to write: the messages it is prompted with and the completion.

    `prompt_ids` / `completion_ids` are the exact tokens when the member itself wrote the completion in process
    (a trace of a `local/` call records them); otherwise the messages are rendered with the member's chat
    template and the completion tokenised, ending with its end-of-turn token.
    """

    messages: tuple[dict[str, Any], ...]
    completion: str
    prompt_ids: tuple[int, ...] | None = None
    completion_ids: tuple[int, ...] | None = None

    @classmethod
    def of_call(cls, call: Any, completion: str | None = None) -> Segment:
        """A trace call as a segment (its own completion, exact tokens when recorded; or `completion` instead)."""
        own = completion is None
        return cls(
            tuple(call.messages),
            (call.completion or "") if own else completion,
            tuple(call.prompt_token_ids) if own and call.prompt_token_ids else None,
            tuple(call.completion_token_ids) if own and call.completion_token_ids else None,
        )


class _FixedSegments:
    """Stands in for a `RolloutRunner`: each example's rollout carries that example's segments as policy turns.

    TRL repeats each prompt `num_generations` times in a batch; only the first copy carries the segments, so
    each segment is trained on once per epoch.
    """

    def __init__(self, turns: dict[str, list[Any]]):
        self.turns = turns

    async def arun(self, examples: Sequence[Example], keys: Sequence[tuple] | None = None) -> list[Any]:
        # `keys` seed a RolloutRunner's sampling; fixed segments sample nothing, so they are not used.
        from colab_graphs.trace import Trace
        from colab_graphs.trainers.rollout import Rollout

        seen: set[str] = set()
        out = []
        for e in examples:
            turns = self.turns[e.id] if e.id not in seen else []
            seen.add(e.id)
            out.append(Rollout(e, Trace(example_id=e.id, protocol="sft"), 1.0, list(turns)))
        return out


def _turns(segments: Sequence[Segment], engine: Any) -> list[Any]:
    from colab_graphs.trainers.rollout import PolicyTurn

    tokenizer = engine.tokenizer
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else min(engine.eos_ids, default=0)
    turns = []
    for i, s in enumerate(segments):
        prompt = list(s.prompt_ids) if s.prompt_ids else engine.render(list(s.messages))
        if s.completion_ids:
            completion = list(s.completion_ids)
        else:
            completion = tokenizer(s.completion, add_special_tokens=False)["input_ids"] + [eos]
        turns.append(PolicyTurn(i, "sft", i, prompt, completion, None, s.completion))
    return turns


def finetune(
    pool: Pool,
    member: str,
    groups: Sequence[Sequence[Segment]],
    out: Path,
    *,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
) -> dict[str, Any]:
    """Fine-tune `member`'s weights on `groups` of segments and save the model to `out` (blocking; run it in a
    thread from async code).

    Each group (the segments of one dev question) is one row of TRL's dataset; a step trains on `batch_size`
    groups (all of them when there are fewer), for `epochs` passes in a shuffled order (TRL's sampler leaves
    the groups that do not fill a last batch for another pass). The loss is the mean token cross-entropy of the
    completions (`CRLTrainer`'s SFT objective). Returns the folder, the segments and steps, and the seconds.
    """
    import torch
    from datasets import Dataset

    from colab_graphs.local import merge
    from colab_graphs.local.provider import get_engine
    from colab_graphs.trainers.config import TrainConfig
    from colab_graphs.trainers.export import export_policy
    from colab_graphs.trainers.grpo import CRLTrainer
    from colab_graphs.trainers.pipeline import grpo_args
    from colab_graphs.trainers.rollout import LoopThread
    from colab_graphs.trainers.system import load_policy

    started = time.perf_counter()
    groups = [list(g) for g in groups if g]
    folder = merge.served_folder(pool[member].model.removeprefix(LOCAL_PREFIX))
    engine = get_engine(pool[member].model)
    turns = {f"g{i}": _turns(g, engine) for i, g in enumerate(groups)}
    per_step = max(1, min(batch_size, len(groups)))
    steps = steps_for(len(groups), batch_size, epochs)
    config = TrainConfig(
        reward="sft",
        num_generations=2,  # TRL's smallest group; the copies carry no segments (see _FixedSegments)
        per_device_train_batch_size=2 * per_step,
        max_steps=steps,
        learning_rate=learning_rate,
        seed=seed,
        use_cpu=not torch.cuda.is_available(),
    ).validate(f"{member}'s fine-tuning")
    model, tokenizer = load_policy(str(folder))
    examples = {i: Example(id=i, input=i) for i in turns}
    trainer = CRLTrainer(
        runner=_FixedSegments(turns),
        examples=examples,
        objective="sft",
        loop=LoopThread.shared(),
        model=model,
        args=grpo_args(config, out),
        train_dataset=Dataset.from_list([{"prompt": i, "example_id": i} for i in turns]),
        processing_class=tokenizer,
    )
    trainer.train()
    info = {"member": member, "from": str(folder), "segments": sum(map(len, groups)), "steps": steps}
    export_policy(trainer.accelerator.unwrap_model(trainer.model), tokenizer, out, info)
    return {**info, "folder": str(out), "train_s": round(time.perf_counter() - started, 3)}


async def finetune_members(
    pool: Pool, jobs: dict[str, tuple[str, Sequence[Sequence[Segment]]]], home: Path, params: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Run `finetune` for each job `label -> (member, groups)` that has segments, one after another in a worker
    thread, into `home/<label>`; jobs without segments are left out of the result (the member keeps its weights).

    `params` gives `sft_epochs`, `sft_batch_size`, `sft_learning_rate` and `seed` (the protocol's parameters).
    """
    trained = {}
    for label, (member, groups) in jobs.items():
        if not any(groups):
            continue
        trained[label] = await asyncio.to_thread(
            finetune,
            pool,
            member,
            groups,
            home / label,
            epochs=int(params["sft_epochs"]),
            batch_size=int(params["sft_batch_size"]),
            learning_rate=float(params["sft_learning_rate"]),
            seed=int(params["seed"]),
        )
    return trained


def check_models(name: str, models: dict[str, str]) -> None:
    """Raise `FitError` when a cached fit names a trained model folder that is gone (say what to delete)."""
    from colab_graphs.local.merge import merges_home

    missing = [folder for folder in models.values() if not (Path(folder) / "config.json").is_file()]
    if missing:
        raise FitError(
            f"{name}: a cached fit names trained model(s) that are gone ({', '.join(missing)}); delete its "
            f"{name}-*.json under {merges_home() / 'fits'} (or the whole folder) to fit again"
        )


def steps_for(n_groups: int, batch_size: int, epochs: int) -> int:
    """The optimizer steps `finetune` takes: `epochs` passes over `n_groups` groups, `batch_size` per step."""
    per_step = max(1, min(batch_size, n_groups))
    return max(1, (n_groups // per_step) * epochs)
