"""`TrainConfig`: what `colab-graphs train --config FILE.yaml` reads: C-RL's own fields and `trl.GRPOConfig`'s.

C-RL's fields (the system, the task, the objective, LoRA, running) are declared here, in `CRLFields`. The GRPO
fields are `trl.GRPOConfig`'s own dataclass fields, with TRL's types and help text; `GRPO_DEFAULTS` holds the
few defaults this project changes and `GRPO_NOTES` what a field means for C-RL. `output_dir` and
`resume_from_checkpoint` are C-RL's (the run folder, and `true` for its latest checkpoint); `MANAGED` lists the
GRPO fields the trainer sets itself. TRL is imported when `TrainConfig` is first used, not with this module.

The YAML file is a flat mapping of these fields (a `trl:` mapping of GRPO fields, as older configs have, is
read into the top level); an unknown key, or a value of the wrong type, is an error that names the file and
the field. `colab-graphs train --help-config` lists every field with its help.

Relative paths in the file (`pool`, `graph`, `data`, `eval_data`) are read relative to the file's folder.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

REWARDS = ("system", "solo", "own", "sft")
CREDITS = ("uniform", "replay")
LOSS_TYPES = ("dapo", "cispo")
"""TRL losses normalised by the global count of policy tokens: exact over any split of a batch into processes,
micro-batches and padding rows (the per-sequence or per-micro-batch means of grpo, bnpo, dr_grpo are not)."""
VLLM_REFUSAL = (
    "C-RL does not use TRL's vLLM generation: the policy's turns are calls inside the graph, and each turn's "
    "exact token ids are the training segment. To generate them with vLLM, set rollout: server and "
    "policy_url: http://HOST:PORT/v1 (vLLM's OpenAI server with --enable-lora; TRL's vllm_importance_sampling_* "
    "fields then correct the gap); serve the collaborators with vLLM as pool members (model: "
    "hosted_vllm/NAME, api_base: ...); and remove use_vllm from the config"
)
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""TRL's `vllm_importance_sampling_mode` values (rollout: server corrects the server's log-probs with them)."""
GENERATION_KWARGS = ("top_k", "top_p", "min_p", "repetition_penalty")
"""The `generation_kwargs` keys the in-process policy engine honours (they override the fields of the same
name); any other key is refused."""
GRPO_DEFAULTS: dict[str, Any] = {
    "num_generations": 4,
    "per_device_train_batch_size": 4,
    "max_steps": 10,
    "learning_rate": 1e-5,
    "max_completion_length": 64,
    "seed": 0,
    "logging_steps": 1,
    "save_steps": 0,
    "bf16": False,
    "gradient_checkpointing": False,
    "disable_tqdm": True,
    # TRL's own defaults today, pinned: C-RL's checks require them, whatever a later TRL defaults to.
    "loss_type": "dapo",
    "beta": 0.0,
    # rollout: server corrects each token's ratio to the server's logprob, truncated (TIS), as the issue asks
    "vllm_importance_sampling_mode": "token_truncate",
}
"""This project's defaults for GRPO fields, where they differ from TRL's."""
GRPO_NOTES = {
    "num_generations": "C-RL: rollouts of the whole system per prompt (the GRPO group size G).",
    "per_device_train_batch_size": (
        "C-RL: rollouts per device per micro-step (x gradient_accumulation_steps: a multiple of "
        "num_generations), and the most policy segments in one forward/backward pass (the rest of a "
        "generation batch is accumulated), which bounds the training memory."
    ),
    "max_completion_length": "C-RL: the most tokens per policy turn (caps the seat's max_tokens).",
    "temperature": "C-RL: the policy's sampling temperature in rollouts (reward=sft trains at 1.0).",
    "top_p": "C-RL: the policy's nucleus sampling mass in rollouts.",
    "top_k": "C-RL: the policy samples among its k most likely tokens in rollouts (0: all).",
    "min_p": "C-RL: the policy drops tokens below min_p x the top token's probability in rollouts.",
    "repetition_penalty": "C-RL: applied to the policy's logits in rollouts (the transformers rule).",
    "generation_kwargs": "C-RL: only top_k, top_p, min_p and repetition_penalty (the policy engine's).",
    "mask_truncated_completions": "C-RL: policy turns cut off at max_completion_length are left out of the loss.",
    "scale_rewards": "C-RL: batch takes the std over every process's rollouts (and replays), as TRL does.",
    "seed": (
        "C-RL: also seeds every rollout's sampling (policy and sampled collaborators), drawn from the step, "
        "the prompt, the generation and the call: one seed, one run; two arms with one seed share draws."
    ),
    "entropy_coef": (
        "C-RL: the bonus is the mean entropy over the policy tokens of each micro-batch, whatever the number of "
        "passes it is trained in; refused with reward=sft."
    ),
    "use_adaptive_entropy": (
        "C-RL: a micro-batch must fit one pass (per_device_train_batch_size >= its policy turns: TRL's "
        "controller steps once per pass); a batch that does not is refused when it is trained."
    ),
    "loss_type": "C-RL accepts dapo or cispo (both normalise by the policy tokens of the whole batch).",
    "save_steps": "C-RL: 0 (the default) writes no checkpoints, only the final policy.",
    "use_vllm": "Refused: set rollout: server and policy_url for vLLM-generated policy turns.",
    "vllm_importance_sampling_correction": "C-RL: applies with rollout: server (the server's logprobs vs the trainer's).",
    "vllm_importance_sampling_mode": "C-RL: with rollout: server; C-RL's default is token_truncate (TIS).",
    "vllm_importance_sampling_clip_max": "C-RL: with rollout: server.",
    "vllm_importance_sampling_clip_min": "C-RL: with rollout: server.",
}
"""What a GRPO field means in C-RL, appended to TRL's help."""
MANAGED = {
    "save_strategy": "steps when save_steps is set, else no checkpoints",
    "per_device_eval_batch_size": "TRL's evaluation loop is unused; the held-out evaluation is C-RL's own",
    "remove_unused_columns": "the trainer reads each prompt's example_id column",
}
"""GRPO fields the trainer sets itself (a config that sets one is refused, saying why)."""


class ConfigError(ValueError):
    """A training config is invalid; the message names the file and the field."""


def _f(default: Any, help: str) -> Any:
    if isinstance(default, dict | list):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(kw_only=True)
class CRLFields:
    """C-RL's own fields of `TrainConfig` (the rest are `trl.GRPOConfig`'s)."""

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
        "Training starts a local ScriptedServer (colab_graphs.testing.server.server_for_configs) and points these "
        "members at it, so a config runs offline.",
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
    sandbox: str | None = _f(
        None,
        "Where code-scored rewards run: auto | namespaces | landlock | unsafe-local (alias unsafe; an explicit "
        "opt-in to unconfined code, recorded in metrics.jsonl and summary.json). Default: env "
        "COLAB_GRAPHS_SANDBOX, else auto. Checked before the first call.",
    )
    # --- the objective -----------------------------------------------------------------------------------
    reward: Literal["system", "solo", "own", "sft"] = _f(
        "system",
        "system: GRPO on the system's score (C-RL); solo: GRPO on the policy's own score answering alone; "
        "own: GRPO on the policy's own score in the system (its last turn scored against the answer, the "
        "teammates shown as in C-RL: the baseline that asks whether the team's reward adds anything); "
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
    advantage_baseline: Literal["group", "batch"] = _f(
        "group",
        "credit=uniform: the reward each rollout's is measured against; group: its prompt's group mean (GRPO); "
        "batch: the mean over the whole batch, so a group whose rollouts all scored alike still teaches "
        "(needs scale_rewards batch or none).",
    )
    sft_min_reward: float = _f(1.0, "reward=sft: keep the policy turns of rollouts scoring at least this.")
    # --- LoRA --------------------------------------------------------------------------------------------
    lora: bool = _f(False, "Train a LoRA adapter instead of all weights (merged into the exported folder).")
    lora_r: int = _f(16, "LoRA rank.")
    lora_alpha: int = _f(32, "LoRA alpha.")
    lora_target_modules: list | str = _f("all-linear", "LoRA target modules.")
    # --- running and output (output_dir and resume_from_checkpoint replace GRPOConfig's) ------------------
    output_dir: str = _f(
        "runs/train",
        "Where metrics.jsonl, eval_*.json, policy/ and checkpoints/ (TRL's output_dir) go.",
    )
    resume_from_checkpoint: str | bool | None = _f(
        None, "Resume: a checkpoint folder, or true for the latest checkpoint in the output folder."
    )
    rollout: Literal["local", "server"] = _f(
        "local",
        "Where the policy's turns are generated: local (the package's engine, in this process, with the live "
        "weights) or server (an OpenAI server at policy_url that holds the current policy: vLLM with "
        "--enable-lora, or colab-graphs serve --enable-lora; the trainer loads its LoRA adapter there after "
        "each update, checks every turn's token ids and corrects the log-prob gap; needs lora: true).",
    )
    policy_url: str | None = _f(
        None, "rollout: server: the policy server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1."
    )
    cache_dir: str | None = _f(None, "Call cache for the collaborators (policy calls are never cached).")
    no_cache: bool = _f(False, "Do not cache collaborator calls.")
    max_concurrency: int = _f(16, "In-flight model calls per endpoint.")
    eval_temperature: float = _f(0.0, "Policy temperature in the before/after evaluation (0: greedy).")
    trl: InitVar[dict | None] = _f(
        None,
        "GRPO fields as a mapping, as older configs set them (e.g. {max_grad_norm: 0.5}): read into the top "
        "level; a field set both ways is an error.",
    )

    def __post_init__(self, trl: dict | None) -> None:
        settings = grpo_fields()
        for key, value in (trl or {}).items():
            if key not in settings:
                raise ConfigError(f"config: trl.{key}: {_not_grpo(key)}")
            setattr(self, key, value)

    def validate(self, where: str = "config") -> typing.Self:
        """Check types and the values that types alone do not catch; returns self."""
        return self._validate(where, {})

    def _validate(self, where: str, names: dict[str, str]) -> typing.Self:
        """`validate`, naming each field as the config spelled it (`names`: field -> e.g. `trl.use_vllm`)."""

        def bad(name: str, message: str) -> typing.NoReturn:
            raise ConfigError(f"{where}: {names.get(name, name)}: {message}")

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            hint = _hint(f.name)
            if not _is_default(value, f) and not _type_ok(value, hint):
                message = f"expected {_type_name(hint)}, got {type(value).__name__} {value!r}"
                if isinstance(value, str) and _number(value) is not None and _type_ok(_number(value), hint):
                    message += " (YAML reads a number like 1e-5 as text: write 1.0e-5)"
                bad(f.name, message)
        if self.sandbox is not None:
            from colab_graphs.sandbox.scope import normalize

            try:
                self.sandbox = normalize(self.sandbox)
            except ValueError as err:
                bad("sandbox", str(err))
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
            value = getattr(self, name)
            if value is None or value < 1:
                bad(name, f"must be at least 1, got {value}")
        if self.advantage_baseline == "batch" and (self.credit != "uniform" or self.scale_rewards == "group"):
            bad(
                "advantage_baseline",
                "batch needs credit uniform and scale_rewards batch or none (a group that scored alike has "
                "std 0)",
            )
        if self.num_generations < 2:
            bad("num_generations", "at least 2 rollouts per prompt (GRPO groups; SFT keeps the good ones)")
        steps_per_generation = self.steps_per_generation or self.gradient_accumulation_steps
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
        if self.use_vllm:
            bad("use_vllm", VLLM_REFUSAL)
        self._validate_rollout(bad)
        if self.reward == "sft" and self.beta != 0:
            bad("beta", "reward=sft is plain fine-tuning on kept turns: it has no KL term, set beta to 0")
        if self.reward == "sft" and (self.entropy_coef != 0 or self.use_adaptive_entropy):
            name = "entropy_coef" if self.entropy_coef != 0 else "use_adaptive_entropy"
            bad(name, "reward=sft is plain fine-tuning on kept turns: it has no entropy term, leave it unset")
        if self.eval_size < 0 or self.save_steps < 0:
            bad("eval_size" if self.eval_size < 0 else "save_steps", "must be >= 0")
        if not 0 < self.top_p <= 1:
            bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            bad("top_k", f"must be >= 0 (0: no top-k filtering), got {self.top_k}")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            bad("min_p", f"must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            bad("repetition_penalty", f"must be > 0 (1: none), got {self.repetition_penalty}")
        unsupported = sorted(set(self.generation_kwargs or {}) - set(GENERATION_KWARGS))
        if unsupported:
            bad(
                "generation_kwargs",
                f"the policy generates with the package's own engine, not transformers' generate: it takes "
                f"{', '.join(GENERATION_KWARGS)} here; {', '.join(map(repr, unsupported))} cannot be honoured "
                "(set temperature and max_completion_length as fields of their own)",
            )
        if self.chat_template_kwargs:
            bad(
                "chat_template_kwargs",
                "the graph's prompts are rendered with the policy's chat template as the seat sends them; "
                "extra template arguments are not supported",
            )
        if self.temperature <= 0 and self.reward != "sft":
            bad("temperature", "GRPO needs sampled rollouts: temperature must be > 0")
        if self.scripted_members and self.policy_member in self.scripted_members:
            bad("scripted_members", f"the policy member {self.policy_member!r} cannot be scripted")
        return self

    def _validate_rollout(self, bad: typing.Callable[[str, str], typing.NoReturn]) -> None:
        if self.rollout == "local":
            if self.policy_url is not None:
                bad("policy_url", "only with rollout: server (rollout: local generates in this process)")
            return
        if not self.policy_url or not self.policy_url.startswith(("http://", "https://")):
            bad(
                "policy_url",
                f"rollout: server needs the policy server's http(s) URL, got {self.policy_url!r}",
            )
        if not self.lora:
            bad(
                "lora",
                "rollout: server needs lora: true: the server holds the base weights and the trainer loads its "
                "adapter there after each update (vLLM's /v1/load_lora_adapter); full weights are not sent",
            )
        if self.vllm_importance_sampling_mode not in IS_MODES:
            bad("vllm_importance_sampling_mode", f"must be one of {', '.join(IS_MODES)}")


if TYPE_CHECKING:
    from trl import GRPOConfig

    # The static view of the class `train_config_class` builds: C-RL's fields and GRPOConfig's (it is not a
    # GRPOConfig at run time; `pipeline.grpo_args` makes one from it).
    @dataclass(kw_only=True)
    class TrainConfig(CRLFields, GRPOConfig):  # type: ignore[misc]
        """Compositional RL (and its baselines) for one policy seated in a collaboration graph."""

else:

    def __getattr__(name: str) -> Any:
        if name == "TrainConfig":
            return train_config_class()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def grpo_fields() -> dict[str, dataclasses.Field]:
    """GRPO field name -> `TrainConfig` field made from `trl.GRPOConfig`'s (this project's default where
    `GRPO_DEFAULTS` has one, TRL's help plus `GRPO_NOTES`), in TRL's order."""
    from trl import GRPOConfig

    own = {f.name for f in dataclasses.fields(CRLFields)}
    out = {}
    for f in dataclasses.fields(GRPOConfig):
        if not f.init or f.name in own or f.name in MANAGED:
            continue
        help = " ".join(str(f.metadata.get("help") or "").replace("%%", "%").split())  # argparse escapes %
        if f.name in GRPO_NOTES:
            help = f"{help} {GRPO_NOTES[f.name]}".strip()
        metadata = {**f.metadata, "help": help}
        if f.name in GRPO_DEFAULTS:
            out[f.name] = field(default=GRPO_DEFAULTS[f.name], metadata=metadata)
        elif f.default is not dataclasses.MISSING:
            out[f.name] = field(default=f.default, metadata=metadata)
        else:
            out[f.name] = field(default_factory=f.default_factory, metadata=metadata)
    return out


@functools.cache
def _grpo_hints() -> dict[str, Any]:
    from trl import GRPOConfig

    return typing.get_type_hints(GRPOConfig)


@functools.cache
def train_config_class() -> type[TrainConfig]:
    """The `TrainConfig` dataclass: `CRLFields` and the GRPO fields of `grpo_fields` (imports TRL once)."""
    hints = _grpo_hints()
    cls = dataclasses.make_dataclass(
        "TrainConfig",
        [(name, hints[name], f) for name, f in grpo_fields().items()],
        bases=(CRLFields,),
        kw_only=True,
        namespace={
            "__doc__": "Compositional RL (and its baselines) for one policy seated in a collaboration graph."
        },
    )
    cls.__module__ = __name__  # pickles and prints as colab_graphs.trainers.config.TrainConfig
    return cls


def config_fields() -> dict[str, dataclasses.Field]:
    """Field name -> dataclass field of `TrainConfig`, C-RL's then GRPO's (help text in `.metadata['help']`);
    `trl` (an init-only mapping) included."""
    return dict(train_config_class().__dataclass_fields__)


@functools.cache
def _hint(name: str) -> Any:
    if name in grpo_fields():
        return _grpo_hints()[name]
    return typing.get_type_hints(CRLFields)[name]


def _is_default(value: Any, f: dataclasses.Field) -> bool:
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return type(value) is type(default) and value == default


@functools.cache
def _adapter(annotation: Any) -> Any:
    from pydantic import ConfigDict, TypeAdapter

    try:
        return TypeAdapter(annotation, config=ConfigDict(strict=True, arbitrary_types_allowed=True))
    except Exception:  # noqa: BLE001 - a type pydantic cannot check is left to GRPOConfig's own checks
        return None


def _type_ok(value: Any, annotation: Any) -> bool:
    from pydantic import ValidationError

    adapter = _adapter(annotation)
    if adapter is None:
        return True
    try:
        adapter.validate_python(value)
    except ValidationError:
        return False
    return True


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _suggest(key: str, names: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(str(key), list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _not_grpo(key: str) -> str:
    if key in MANAGED:
        return f"set by the trainer ({MANAGED[key]})"
    if key in config_fields():
        return f"not a GRPO field: {key} is C-RL's own, set it at the top level"
    return f"not a trl.GRPOConfig field{_suggest(key, grpo_fields())}"


def config_from_dict(
    data: dict[str, Any], where: str = "config", base_dir: Path | None = None
) -> TrainConfig:
    """Build and validate a `TrainConfig` from a flat mapping; errors name `where` and the field.

    Args:
        data: field -> value (GRPO fields too; a `trl:` mapping of GRPO fields is read into the top level).
        where: what the mapping came from (a file name), for messages.
        base_dir: folder that relative paths in `pool`, `graph`, `data`, `eval_data` are relative to.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of config fields, got {type(data).__name__}")
    known = config_fields()
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for key, value in data.items():
        if key in MANAGED:
            raise ConfigError(f"{where}: {key}: set by the trainer ({MANAGED[key]})")
        if key not in known:
            raise ConfigError(
                f"{where}: unknown field {key!r}{_suggest(key, known)}; see `colab-graphs train --help-config`"
            )
        if key != "trl":
            values[key] = value
    trl = data.get("trl") or {}
    if not isinstance(trl, dict):
        raise ConfigError(f"{where}: trl: expected a mapping of GRPO fields, got {type(trl).__name__}")
    for key, value in trl.items():
        if key not in grpo_fields():
            raise ConfigError(f"{where}: trl.{key}: {_not_grpo(key)}")
        if key in data:
            raise ConfigError(f"{where}: trl.{key}: {key} is also set at the top level; set it once")
        values[key], names[key] = value, f"trl.{key}"
    if base_dir is not None:
        for key in ("pool", "graph", "data", "eval_data"):
            value = values.get(key)
            if isinstance(value, str):
                values[key] = _relative(value, base_dir, graph=key == "graph")
    return train_config_class()(**values)._validate(where, names)


def grpo_values(config: TrainConfig) -> dict[str, Any]:
    """The GRPO fields of `config` whose value is not `trl.GRPOConfig`'s own default."""
    from trl import GRPOConfig

    trl_fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    values = {name: getattr(config, name) for name in grpo_fields()}
    return {name: v for name, v in values.items() if not _is_default(v, trl_fields[name])}


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
