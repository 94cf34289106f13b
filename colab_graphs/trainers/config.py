"""`TrainConfig`: what `colab-graphs train --config FILE.yaml` reads, as a dataclass in TRL's style.

Every field has a default and help text (`dataclasses.fields(TrainConfig)[i].metadata["help"]`). The YAML
file is a flat mapping of these fields; an unknown key, or a value of the wrong type, is an error that names
the file and the field. GRPO settings not surfaced here go under `trl:` and reach `trl.GRPOConfig` as they are.

Relative paths in the file (`pool`, `graph`, `data`, `eval_data`) are read relative to the file's folder.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

REWARDS = ("system", "solo", "sft")
CREDITS = ("uniform", "replay")
LOSS_TYPES = ("dapo", "cispo")
"""TRL losses normalised by the global count of policy tokens: exact over any split of a batch into processes,
micro-batches and padding rows (the per-sequence or per-micro-batch means of grpo, bnpo, dr_grpo are not)."""
VLLM_REFUSAL = (
    "C-RL does not generate the policy with vLLM: the policy's turns run in process with its live weights, "
    "inside the graph, and each turn's exact token ids are the training segment, so there is no generation "
    "step for TRL's vLLM (or its importance-sampling ratio) to replace. Serve the collaborators with vLLM "
    "instead, as pool members (model: hosted_vllm/NAME, api_base: http://HOST:PORT/v1), and remove "
    "use_vllm from trl:"
)


class ConfigError(ValueError):
    """A training config is invalid; the message names the file and the field."""


def _f(default: Any, help: str) -> Any:
    if isinstance(default, dict | list):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    """Compositional RL (and its baselines) for one policy seated in a collaboration graph."""

    # --- the system --------------------------------------------------------------------------------------
    protocol: str = _f(
        "majority_vote", "Registered protocol the policy plays in (see `colab-graphs protocols`)."
    )
    protocol_params: dict = _f({}, "Keyword parameters of the protocol builder.")
    graph: str | None = _f(
        None, "A user graph instead of `protocol`: `path/to/file.py:NAME` (GraphSpec or builder)."
    )
    pool: str | dict | None = _f(
        None,
        "Pool file path, or an inline mapping member -> LiteLLM settings (the `models:` of a pool file).",
    )
    scripted_members: dict | None = _f(
        None,
        "TESTING FEATURE: member -> scripted reply config (see colab_graphs.testing.scripts.member_from_config). "
        "The CLI starts a local ScriptedServer and points these members at it, so a config runs offline.",
    )
    policy_member: str = _f("policy", "The pool member whose seats the trained policy fills.")
    policy_model: str = _f(
        "tiny-random", "Initial policy weights: a zoo name, a local HF folder, or a hub id."
    )
    # --- the task ----------------------------------------------------------------------------------------
    data: str = _f("builtin:arithmetic", "Training examples: a JSONL path or a loader source name.")
    limit: int | None = _f(None, "Use at most this many training examples.")
    eval_data: str | None = _f(None, "Held-out examples (default: the last `eval_size` examples of `data`).")
    eval_size: int = _f(0, "Held-out examples for the before/after evaluation (0 skips the evaluation).")
    eval_before: bool = _f(
        True,
        "Evaluate before training too (false: only after, e.g. for runs that share one starting policy).",
    )
    scorer: str | None = _f(None, "Scorer name (default: chosen from the examples' fields).")
    # --- the objective -----------------------------------------------------------------------------------
    reward: Literal["system", "solo", "sft"] = _f(
        "system",
        "system: GRPO on the system's score (C-RL); solo: GRPO on the policy's own score answering alone; "
        "sft: cross-entropy on the policy's turns from system rollouts scoring at least sft_min_reward, "
        "through the same TRL trainer (optimizer, schedule, clipping, precision, LoRA) as the GRPO runs.",
    )
    credit: Literal["uniform", "replay"] = _f(
        "uniform",
        "uniform: every policy turn gets its rollout's group-relative advantage; replay: each turn's advantage "
        "is the rollout's reward minus the mean reward of `replay_samples` re-runs resampled from that turn.",
    )
    replay_samples: int = _f(
        2, "K for credit=replay: re-runs per policy turn (cost: K x turns extra system runs)."
    )
    sft_min_reward: float = _f(1.0, "reward=sft: keep the policy turns of rollouts scoring at least this.")
    # --- GRPO (names and meanings as in trl.GRPOConfig) --------------------------------------------------
    num_generations: int = _f(4, "Rollouts per prompt (the GRPO group size G).")
    per_device_train_batch_size: int = _f(
        4,
        "Rollouts per device per micro-step (x gradient_accumulation_steps: a multiple of num_generations), "
        "and the most policy segments in one forward/backward pass (the rest of a generation batch is "
        "accumulated), which bounds the training memory.",
    )
    gradient_accumulation_steps: int = _f(1, "Steps accumulated per optimizer update.")
    max_steps: int = _f(10, "Optimizer steps.")
    learning_rate: float = _f(1e-5, "Peak learning rate.")
    max_completion_length: int = _f(64, "Most tokens per policy turn (caps the seat's max_tokens).")
    temperature: float = _f(1.0, "Policy sampling temperature in rollouts (and in TRL's logprobs).")
    top_p: float = _f(1.0, "Policy nucleus sampling mass in rollouts.")
    beta: float = _f(0.0, "KL coefficient against the initial policy (0: no reference model).")
    loss_type: str = _f(
        "dapo", "TRL loss type: dapo or cispo (both normalise by the policy tokens of the whole batch)."
    )
    scale_rewards: str = _f("group", "Advantage scaling: group, batch or none.")
    seed: int = _f(0, "Random seed.")
    logging_steps: int = _f(1, "Write a metrics line every this many steps.")
    save_steps: int = _f(0, "Checkpoint every this many steps (0: no checkpoints, only the final policy).")
    resume_from_checkpoint: str | bool | None = _f(
        None, "Resume: a checkpoint folder, or true for the latest checkpoint in the output folder."
    )
    use_cpu: bool = _f(False, "Train on CPU even when a GPU is present.")
    bf16: bool = _f(False, "bfloat16 mixed precision.")
    gradient_checkpointing: bool = _f(False, "Trade compute for memory (slow for tiny models).")
    trl: dict = _f(
        {},
        "Further trl.GRPOConfig keyword arguments (e.g. max_grad_norm, lr_scheduler_type, warmup_steps, "
        "num_iterations, epsilon). use_vllm is refused: the policy generates in process.",
    )
    # --- LoRA --------------------------------------------------------------------------------------------
    lora: bool = _f(False, "Train a LoRA adapter instead of all weights (merged into the exported folder).")
    lora_r: int = _f(16, "LoRA rank.")
    lora_alpha: int = _f(32, "LoRA alpha.")
    lora_target_modules: list | str = _f("all-linear", "LoRA target modules.")
    # --- running and output ------------------------------------------------------------------------------
    output_dir: str = _f("runs/train", "Where metrics.jsonl, checkpoints, eval_*.json and policy/ go.")
    cache_dir: str | None = _f(None, "Call cache for the collaborators (policy calls are never cached).")
    no_cache: bool = _f(False, "Do not cache collaborator calls.")
    max_concurrency: int = _f(16, "In-flight model calls per endpoint.")
    eval_temperature: float = _f(0.0, "Policy temperature in the before/after evaluation (0: greedy).")

    def validate(self, where: str = "config") -> TrainConfig:
        """Check values that types alone do not catch; returns self."""

        def bad(name: str, message: str) -> None:
            raise ConfigError(f"{where}: {name}: {message}")

        if self.reward not in REWARDS:
            bad("reward", f"must be one of {', '.join(REWARDS)}, got {self.reward!r}")
        if self.credit not in CREDITS:
            bad("credit", f"must be one of {', '.join(CREDITS)}, got {self.credit!r}")
        if self.graph is not None and ":" not in self.graph:
            bad("graph", f"expected path/to/file.py:NAME, got {self.graph!r}")
        for name in (
            "num_generations",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "max_steps",
            "max_completion_length",
            "replay_samples",
            "logging_steps",
            "max_concurrency",
        ):
            if getattr(self, name) < 1:
                bad(name, f"must be at least 1, got {getattr(self, name)}")
        if self.num_generations < 2:
            bad("num_generations", "at least 2 rollouts per prompt (GRPO groups; SFT keeps the good ones)")
        steps_per_generation = self.trl.get("steps_per_generation") or self.gradient_accumulation_steps
        batch = self.per_device_train_batch_size * steps_per_generation
        if batch % self.num_generations:
            bad(
                "per_device_train_batch_size",
                f"per_device_train_batch_size x steps_per_generation ({batch}; steps_per_generation defaults "
                f"to gradient_accumulation_steps) must be a multiple of num_generations "
                f"({self.num_generations}): each process scores whole groups",
            )
        if self.loss_type not in LOSS_TYPES:
            bad(
                "loss_type",
                f"must be one of {', '.join(LOSS_TYPES)}, got {self.loss_type!r}: a C-RL batch holds a variable "
                "number of policy segments per process, padded with empty rows, and only a loss normalised "
                "by the global count of policy tokens stays exact across processes and micro-batches",
            )
        if self.trl.get("use_vllm"):
            bad("trl.use_vllm", VLLM_REFUSAL)
        if self.reward == "sft" and self.beta != 0:
            bad("beta", "reward=sft is plain fine-tuning on kept turns: it has no KL term, set beta to 0")
        if self.eval_size < 0 or self.save_steps < 0:
            bad("eval_size" if self.eval_size < 0 else "save_steps", "must be >= 0")
        if not 0 < self.top_p <= 1:
            bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.temperature <= 0 and self.reward != "sft":
            bad("temperature", "GRPO needs sampled rollouts: temperature must be > 0")
        if self.scripted_members and self.policy_member in self.scripted_members:
            bad("scripted_members", f"the policy member {self.policy_member!r} cannot be scripted")
        return self


def config_fields() -> dict[str, dataclasses.Field]:
    """Field name -> dataclass field of `TrainConfig` (help text in `.metadata['help']`)."""
    return {f.name: f for f in dataclasses.fields(TrainConfig)}


def _type_ok(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(annotation))
    if origin is Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation in (dict, list, str, bool):
        return isinstance(value, annotation)
    return True


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def config_from_dict(
    data: dict[str, Any], where: str = "config", base_dir: Path | None = None
) -> TrainConfig:
    """Build and validate a `TrainConfig` from a mapping; errors name `where` and the field.

    Args:
        data: field -> value.
        where: what the mapping came from (a file name), for messages.
        base_dir: folder that relative paths in `pool`, `graph`, `data`, `eval_data` are relative to.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of config fields, got {type(data).__name__}")
    hints = typing.get_type_hints(TrainConfig)
    known = config_fields()
    for key, value in data.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown field {key!r}{hint}; see `colab-graphs train --help-config`")
        if not _type_ok(value, hints[key]):
            raise ConfigError(
                f"{where}: {key}: expected {_type_name(hints[key])}, got {type(value).__name__} {value!r}"
            )
    values = dict(data)
    if base_dir is not None:
        for key in ("pool", "graph", "data", "eval_data"):
            value = values.get(key)
            if isinstance(value, str):
                values[key] = _relative(value, base_dir, graph=key == "graph")
    return TrainConfig(**values).validate(where)


def _relative(value: str, base_dir: Path, graph: bool) -> str:
    path_s, sep, name = value.rpartition(":") if graph else (value, "", "")
    candidate = base_dir / path_s
    if not Path(path_s).is_absolute() and candidate.exists():
        return f"{candidate}{sep}{name}"
    return value


def load_config(path: str | Path, **overrides: Any) -> TrainConfig:
    """Read a YAML training config; `overrides` (non-None values) replace fields after reading.

    Raises:
        ConfigError: the file is missing, not YAML, or a field is unknown or of the wrong type.
    """
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config fields, got {type(data).__name__}")
    data.update({k: v for k, v in overrides.items() if v is not None})
    return config_from_dict(data, where=str(path), base_dir=path.parent)
