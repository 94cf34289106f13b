"""Assembling the system a config describes: examples, pool (scripted test members included), policy, spec.

The policy member's calls are served in process by ``local/<POLICY_PREFIX><member>``, an engine registered
with `colab_graphs.models.local.set_local_model` that holds the very model object the trainer updates, so
rollouts always generate with the current weights. Collaborators keep their own settings.

Pool order: the members of `pool` in their order, then `scripted_members` not already listed, then the
policy member if it is still missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from colab_graphs.data.example import Example
from colab_graphs.pool import MEMBER_KEYS, Pool, make_member
from colab_graphs.spec import GraphSpec
from colab_graphs.trainers.config import ConfigError

if TYPE_CHECKING:
    from colab_graphs.trainers.config import TrainConfig

POLICY_PREFIX = "crl-policy-"


@dataclass
class Split:
    train: list[Example]
    eval: list[Example]


def load_split(config: TrainConfig) -> Split:
    """Training and held-out examples (held out: `eval_data`, else the last `eval_size` of `data`)."""
    from colab_graphs.data.loaders import load_examples

    try:
        examples = load_examples(config.data, limit=config.limit)
        if config.eval_data is not None:
            held = load_examples(config.eval_data, limit=config.eval_size or None)
        else:
            cut = len(examples) - config.eval_size
            examples, held = examples[:cut], examples[cut:]
    except (ValueError, FileNotFoundError, KeyError, ImportError) as err:
        raise ConfigError(f"data: {err}") from None
    if not examples:
        raise ConfigError(
            f"data: no training examples left in {config.data!r} (eval_size={config.eval_size})"
        )
    return Split(examples, held)


@contextlib.contextmanager
def scripted_server(config: TrainConfig) -> Iterator[Any]:
    """A ScriptedServer for `scripted_members` (testing feature), or None; stopped on exit."""
    if not config.scripted_members:
        yield None
        return
    from colab_graphs.testing.scripts import member_from_config
    from colab_graphs.testing.server import ScriptedServer

    try:
        members = {
            name: member_from_config(spec, f"scripted_members.{name}")
            for name, spec in config.scripted_members.items()
        }
    except ValueError as err:
        raise ConfigError(str(err)) from None
    with ScriptedServer(members) as server:
        yield server


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
    from colab_graphs.protocols.resolve import ProtocolError, resolve_protocol
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
    from colab_graphs.protocols.registry import build_protocol

    return build_protocol("solo", pool.names, member=config.policy_member)


def load_policy(ref: str, device: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of the initial policy, fp32, on `device` (default: cuda if present, else cpu)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from colab_graphs.models.zoo import resolve

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


def seat_policy(config: TrainConfig, model: Any, tokenizer: Any) -> None:
    """Serve `model` as the policy member's `local/` model (swapping weights if already served)."""
    from colab_graphs.models.local import set_local_model

    set_local_model(f"{POLICY_PREFIX}{config.policy_member}", model, tokenizer)


def policy_overrides(config: TrainConfig, temperature: float | None = None) -> dict[str, Any]:
    """Generation settings forced on policy calls (TRL's logprobs assume the same temperature)."""
    return {
        "temperature": config.temperature if temperature is None else temperature,
        "top_p": config.top_p,
        "max_tokens": config.max_completion_length,
    }
