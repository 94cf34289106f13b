"""Assembling the system a config describes: examples, pool (scripted test members included), policy, spec.

The policy member's calls are served in process by ``local/<POLICY_PREFIX><member>``, an engine registered
with `colab_graphs.local.provider.set_local_model` that holds the very model object the trainer updates, so
rollouts always generate with the current weights. Collaborators keep their own settings.

Pool order: the members of `pool` in their order, then `scripted_members` not already listed, then the
policy member if it is still missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from colab_graphs.pool import MEMBER_KEYS, Pool, make_member
from colab_graphs.spec import GraphSpec
from colab_graphs.tasks.example import Example
from colab_graphs.trainers.config import ConfigError

if TYPE_CHECKING:
    from colab_graphs.trainers.config import TrainConfig

POLICY_PREFIX = "crl-policy-"


@dataclass
class Split:
    """Training and held-out examples; no held-out input is a training input (`normalised_input`)."""

    train: list[Example]
    eval: list[Example]
    held_out_duplicates: int = 0
    """Held-out candidates dropped because an earlier held-out example has the same input."""
    train_removed: int = 0
    """Training examples dropped because a held-out example has the same input."""

    def sizes(self) -> dict[str, int]:
        """What `summary.json` and `eval_*.json` report of the split."""
        return {
            "train": len(self.train),
            "held_out": len(self.eval),
            "held_out_duplicates_dropped": self.held_out_duplicates,
            "train_removed_as_held_out": self.train_removed,
        }


def normalised_input(example: Example) -> str:
    """What makes two examples the same question: the input, case-folded, with whitespace collapsed."""
    return " ".join(str(example.input).casefold().split())


def held_out(candidates: list[Example], size: int | None) -> tuple[list[Example], int]:
    """The first `size` (None: all) candidates with distinct inputs, and how many duplicates were skipped."""
    seen: set[str] = set()
    kept, skipped = [], 0
    for example in candidates:
        if size is not None and len(kept) == size:
            break
        key = normalised_input(example)
        if key in seen:
            skipped += 1
            continue
        seen.add(key)
        kept.append(example)
    return kept, skipped


def load_split(config: TrainConfig) -> Split:
    """Training and held-out examples, with no input in both.

    Held out: `eval_data` (its first `eval_size` distinct inputs; 0: all), else the last `eval_size` distinct
    inputs of `data`. Training: the rest of `data`, without any example whose input is held out (generated
    tasks repeat questions: the built-in arithmetic has 81 single-digit sums). Inputs are compared after
    `normalised_input`.
    """
    from colab_graphs.tasks.loaders import load_examples

    try:
        examples = load_examples(config.data, limit=config.limit)
        if config.eval_data is not None:
            held, duplicates = held_out(load_examples(config.eval_data), config.eval_size or None)
        elif config.eval_size:
            held, duplicates = held_out(examples[::-1], config.eval_size)
            held.reverse()
            examples = examples[: len(examples) - len(held) - duplicates]
        else:
            held, duplicates = [], 0
    except (ValueError, FileNotFoundError, KeyError, ImportError) as err:
        raise ConfigError(f"data: {err}") from None
    inputs = {normalised_input(e) for e in held}
    train = [e for e in examples if normalised_input(e) not in inputs]
    if not train:
        raise ConfigError(
            f"data: no training examples left in {config.data!r} (eval_size={config.eval_size}; inputs "
            "that are held out are not trained on)"
        )
    return Split(train, held, duplicates, len(examples) - len(train))


def build_pool(config: TrainConfig, server: Any = None) -> Pool:
    """The pool with scripted members pointed at `server` and the policy member served in process."""
    if isinstance(config.pool, str):
        base = Pool.from_yaml(config.pool)
        models = {m.name: dict(m.settings) for m in base}
        # The policy member keeps its persona; its calls go to the in-process model, not to deployments.
        kept = {
            m.name: ("description", "system_prompt") if m.name == config.policy_member else MEMBER_KEYS
            for m in base
        }
        extras = {m.name: {k: getattr(m, k) for k in kept[m.name]} for m in base}
    else:
        models = {k: dict(v) for k, v in (config.pool or {}).items()}
        extras = {}
    for name in config.scripted_members or {}:
        models.setdefault(name, {}).update(server.litellm_kwargs(name))
    settings = models.setdefault(config.policy_member, {})
    if config.rollout == "server":
        # The name traces show; each call names the adapter loaded at the time (server_rollout.PolicyServer).
        settings.update(model=f"hosted_vllm/{policy_adapter(config)}", api_base=config.policy_url)
    else:
        settings["model"] = f"local/{POLICY_PREFIX}{config.policy_member}"
    members = []
    for name, s in models.items():
        for key, value in (extras.get(name) or {}).items():
            if value:
                s.setdefault(key, value)
        members.append(make_member(name, s, "pool"))
    return Pool(members, source="train config")


def build_spec(config: TrainConfig, pool: Pool) -> GraphSpec:
    """The system's protocol over the pool (resolved as the CLI resolves it: a router's `descriptions` come
    from the pool's members); the policy member must hold at least one seat."""
    from colab_graphs.resolve import ProtocolError, resolve_protocol
    from colab_graphs.spec import Seat, SpecError

    where = "graph" if config.graph else "protocol"
    try:
        spec = resolve_protocol(
            None if config.graph else config.protocol,
            pool.names,
            dict(config.protocol_params),
            graph=config.graph,
            pool=pool,
        )
        spec.validate_for(pool.names)
    except (ProtocolError, SpecError) as err:
        raise ConfigError(f"{where}: {err}") from None
    seats = [n for n in spec.nodes if isinstance(n, Seat) and n.member == config.policy_member]
    if not seats:
        raise ConfigError(
            f"policy_member: {config.policy_member!r} holds no seat in protocol {spec.name!r} "
            f"(members: {', '.join(spec.members)})"
        )
    return spec


def solo_spec(config: TrainConfig, pool: Pool) -> GraphSpec:
    """The policy answering alone (the `reward: solo` baseline and its individual strength)."""
    from colab_graphs.protocol_registry import build_protocol

    return build_protocol("solo", pool.names, member=config.policy_member)


def load_policy(ref: str, device: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of the initial policy, fp32, on `device` (default: cuda if present, else cpu)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from colab_graphs.local.zoo import resolve

    hf_logging.disable_progress_bar()

    try:
        folder = resolve(ref)
    except FileNotFoundError as err:
        raise ConfigError(f"policy_model: {err}") from None
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device), tokenizer


def policy_adapter(config: TrainConfig) -> str:
    """The name the policy's LoRA adapter is loaded under on a policy server (`rollout: server`)."""
    return f"{POLICY_PREFIX}{config.policy_member}"


def seat_policy(config: TrainConfig, model: Any, tokenizer: Any) -> None:
    """Serve `model` as the policy member's `local/` model (swapping weights if already served); with
    `rollout: server` the policy server holds the policy instead, and nothing is served here."""
    from colab_graphs.local.provider import set_local_model

    if config.rollout == "server":
        return
    set_local_model(f"{POLICY_PREFIX}{config.policy_member}", model, tokenizer)


def seated_system(config: TrainConfig, server: Any = None, device: str | None = None) -> tuple[Any, ...]:
    """(pool, spec, model, tokenizer): the system `config` describes, with its initial policy loaded on
    `device` and served as the policy member."""
    pool = build_pool(config, server)
    spec = build_spec(config, pool)
    model, tokenizer = load_policy(config.policy_model, device)
    seat_policy(config, model, tokenizer)
    return pool, spec, model, tokenizer


def policy_overrides(config: TrainConfig, temperature: float | None = None) -> dict[str, Any]:
    """Generation settings forced on policy calls (TRL's logprobs assume the same temperature): the config's
    sampling fields, and the sampling keys of `generation_kwargs` (`config.GENERATION_KWARGS`)."""
    settings = {
        "temperature": config.temperature if temperature is None else temperature,
        "top_p": config.top_p,
        "top_k": config.top_k or 0,
        "min_p": config.min_p or 0.0,
        "repetition_penalty": config.repetition_penalty,
        **(config.generation_kwargs or {}),
        "max_tokens": config.max_completion_length,
    }
    if temperature is not None:
        settings["temperature"] = temperature
    return settings
