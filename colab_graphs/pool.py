"""The model pool: members by name, each with the LiteLLM settings that reach it.

Pool file (YAML)::

    models:
      alice: {model: openai/alice, api_base: http://127.0.0.1:8000/v1, api_key: ${OPENAI_API_KEY}}
      bob:   {model: local/smollm2-135m, temperature: 0.7, description: "a careful solver"}

Order of the mapping is pool order (it breaks vote ties and orders seats). Values `${ENV_VAR}` are read from the
environment. Besides `litellm.acompletion` keyword arguments a member may carry `description` (what a router
reads about it) and `system_prompt` (a persona prepended to every call it makes).

A member served by several deployments (vLLM replicas, API keys, regions) lists them; its calls then go through
LiteLLM's `Router` (load balancing, per-deployment rpm/tpm, cooldown and retry on another deployment)::

    models:
      qwen:
        model: hosted_vllm/Qwen2.5-7B-Instruct
        temperature: 0
        deployments:
          - {api_base: http://gpu-a:8000/v1}
          - {api_base: http://gpu-b:8000/v1, rpm: 600}
        router: {routing_strategy: least-busy, cooldown_time: 30}

A deployment overrides only where and how to connect (`api_base`, `api_key`, `model` as that deployment names
it, ...) and its routing limits (`rpm`, `tpm`, `weight`, `order`, `max_parallel_requests`); what shapes the
answer stays the member's, so the member's request (the cache key) is the same whichever deployment answers.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Keyword arguments `litellm.acompletion` accepts that make sense in a pool file. Hard-coded rather than read
# from litellm's signature because `import litellm` costs seconds and loading a pool must stay instant.
LITELLM_KWARGS = frozenset(
    {
        "model",
        "api_base",
        "base_url",
        "api_key",
        "api_version",
        "organization",
        "custom_llm_provider",
        "temperature",
        "top_p",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "response_format",
        "timeout",
        "extra_headers",
        "extra_body",
        "reasoning_effort",
        "top_k",
        "num_retries",
        "drop_params",
        "aws_region_name",
        "vertex_project",
        "vertex_location",
        "user",
        "metadata",
        "deployment_id",
    }
)
MEMBER_KEYS = frozenset({"description", "system_prompt", "deployments", "router"})
# Settings that say where and how to connect, not what to generate: never part of a cache key, never traced.
CONNECTION_KEYS = frozenset(
    {
        "api_base",
        "base_url",
        "api_key",
        "api_version",
        "organization",
        "timeout",
        "extra_headers",
        "num_retries",
        "aws_region_name",
        "vertex_project",
        "vertex_location",
        "deployment_id",
        "drop_params",
        "custom_llm_provider",
        "user",
    }
)
SECRET_KEYS = frozenset({"api_key", "extra_headers"})
# What a deployment may set besides connection settings: the Router's per-deployment limits and weights.
DEPLOYMENT_ROUTING_KEYS = frozenset({"rpm", "tpm", "weight", "order", "max_parallel_requests"})
DEPLOYMENT_KEYS = CONNECTION_KEYS | {"model"} | DEPLOYMENT_ROUTING_KEYS
# `litellm.Router(...)` settings a pool file may give (the Router's own `model_list` is built from `deployments`).
ROUTER_KEYS = frozenset(
    {
        "routing_strategy",
        "routing_strategy_args",
        "num_retries",
        "retry_after",
        "retry_policy",
        "allowed_fails",
        "allowed_fails_policy",
        "cooldown_time",
        "disable_cooldowns",
        "timeout",
        "default_max_parallel_requests",
        "enable_pre_call_checks",
        "enable_weighted_failover",
    }
)

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class PoolError(ValueError):
    """A pool file or pool definition is invalid; the message names the file and member."""


class Member(BaseModel):
    """One model in the pool: a name and the LiteLLM settings that call it."""

    model_config = ConfigDict(frozen=True)

    name: str
    settings: dict[str, Any] = Field(default_factory=dict)
    description: str | None = None
    system_prompt: str | None = None
    deployments: list[dict[str, Any]] = Field(default_factory=list)
    router: dict[str, Any] = Field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.settings["model"]

    @property
    def endpoint(self) -> str:
        """What concurrency limits are keyed on: the server a call goes to (api_base, else the provider).

        A member with deployments is keyed on all of them together (its Router spreads the calls).
        """
        if self.deployments:
            return " | ".join(_endpoint_of({**self.settings, **d}) for d in self.deployments)
        return _endpoint_of(self.settings)

    @property
    def replicas(self) -> int:
        """How many deployments serve the member (1 without `deployments`)."""
        return max(1, len(self.deployments))

    def generation_settings(self) -> dict[str, Any]:
        """Settings that shape the output (part of the cache key): everything but connection settings."""
        return {k: v for k, v in self.settings.items() if k not in CONNECTION_KEYS}

    def public_settings(self) -> dict[str, Any]:
        """Settings safe to write to traces and reports: secrets removed."""
        return {k: v for k, v in self.settings.items() if k not in SECRET_KEYS}

    def public_deployments(self) -> list[dict[str, Any]]:
        """The deployments as they may appear in reports: secrets removed."""
        return [{k: v for k, v in d.items() if k not in SECRET_KEYS} for d in self.deployments]

    def secrets(self) -> list[str]:
        """Every API key the member's calls may carry (its own and its deployments'), for redaction."""
        keys = [self.settings.get("api_key"), *(d.get("api_key") for d in self.deployments)]
        return [str(k) for k in keys if k]

    def router_model_list(self) -> list[dict[str, Any]]:
        """`litellm.Router(model_list=...)`: one entry per deployment under the member's name.

        Each deployment's `litellm_params` are the member's model and connection settings overridden by the
        deployment's; the generation settings are not there, they go with each call.
        """
        base = {k: v for k, v in self.settings.items() if k in CONNECTION_KEYS or k == "model"}
        return [{"model_name": self.name, "litellm_params": {**base, **d}} for d in self.deployments]


def _endpoint_of(settings: Mapping[str, Any]) -> str:
    base = settings.get("api_base") or settings.get("base_url")
    if base:
        return str(base)
    model = str(settings["model"])
    return model.split("/", 1)[0] if "/" in model else model


def _expand_env(value: Any, where: str) -> Any:
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            var = match.group(1)
            if var not in os.environ:
                raise PoolError(f"{where}: environment variable ${{{var}}} is not set")
            return os.environ[var]

        return _ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand_env(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, where) for v in value]
    return value


def make_member(name: str, settings: Mapping[str, Any], where: str = "pool") -> Member:
    """Validate one member's settings (clear errors naming `where` and the member) and build it."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise PoolError(f"{where}: member name {name!r} must be letters, digits, '_', '-' or '.'")
    if not isinstance(settings, Mapping):
        raise PoolError(
            f"{where}: member {name!r} must map to a mapping of LiteLLM settings, got {settings!r}"
        )
    unknown = sorted(set(settings) - LITELLM_KWARGS - MEMBER_KEYS)
    if unknown:
        hints = _with_hints(unknown, LITELLM_KWARGS | MEMBER_KEYS)
        raise PoolError(
            f"{where}: member {name!r} has unknown key(s) {', '.join(hints)}; allowed: LiteLLM completion "
            f"arguments (model, api_base, api_key, temperature, max_tokens, seed, ...) and "
            f"{', '.join(sorted(MEMBER_KEYS))}"
        )
    if not settings.get("model"):
        raise PoolError(f"{where}: member {name!r} has no 'model' (a LiteLLM model string is required)")
    settings = _expand_env(dict(settings), f"{where}: member {name!r}")
    extra = {k: settings.pop(k) for k in MEMBER_KEYS if k in settings}
    if "deployments" in extra:
        extra["deployments"] = _check_deployments(extra["deployments"], f"{where}: member {name!r}")
    if "router" in extra:
        extra["router"] = _check_router(
            extra["router"], bool(extra.get("deployments")), f"{where}: member {name!r}"
        )
    return Member(name=name, settings=settings, **extra)


def _check_deployments(deployments: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(deployments, list) or not deployments:
        raise PoolError(
            f"{where}: 'deployments' must be a non-empty list of mappings (e.g. one api_base each), "
            f"got {deployments!r}"
        )
    out = []
    for i, d in enumerate(deployments, 1):
        at = f"{where}: deployments[{i}]"
        if not isinstance(d, Mapping):
            raise PoolError(f"{at} must be a mapping of LiteLLM connection settings, got {d!r}")
        generation = sorted(set(d) & (LITELLM_KWARGS - DEPLOYMENT_KEYS))
        if generation:
            raise PoolError(
                f"{at} sets {', '.join(generation)}: a deployment says only where and how to connect; settings "
                "that shape the answer belong to the member, so that every deployment answers the same request"
            )
        unknown = sorted(set(d) - DEPLOYMENT_KEYS)
        if unknown:
            raise PoolError(
                f"{at} has unknown key(s) {', '.join(_with_hints(unknown, DEPLOYMENT_KEYS))}; allowed: "
                f"{', '.join(sorted(DEPLOYMENT_KEYS))}"
            )
        out.append(dict(d))
    return out


def _check_router(router: Any, has_deployments: bool, where: str) -> dict[str, Any]:
    if not has_deployments:
        raise PoolError(f"{where}: 'router' settings need 'deployments' (the Router spreads calls over them)")
    if not isinstance(router, Mapping):
        raise PoolError(f"{where}: 'router' must be a mapping of litellm.Router settings, got {router!r}")
    unknown = sorted(set(router) - ROUTER_KEYS)
    if unknown:
        raise PoolError(
            f"{where}: router has unknown key(s) {', '.join(_with_hints(unknown, ROUTER_KEYS))}; allowed: "
            f"{', '.join(sorted(ROUTER_KEYS))}"
        )
    return dict(router)


def _with_hints(unknown: list[str], known: frozenset[str]) -> list[str]:
    return [
        f"{k} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(k, known, 1)) else k
        for k in unknown
    ]


def unique_key_loader() -> type:
    """A safe YAML loader that rejects duplicate mapping keys (safe_load keeps the last one silently)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


class Pool:
    """An ordered set of members. Build it in Python or load it from YAML.

    Example:
        >>> pool = Pool.from_dict({"a": {"model": "openai/a"}, "b": {"model": "openai/b"}})
        >>> pool.names
        ['a', 'b']
    """

    def __init__(self, members: Iterable[Member], source: str | None = None):
        self.members: list[Member] = list(members)
        self.source = source
        names = [m.name for m in self.members]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise PoolError(f"{source or 'pool'}: duplicate member name(s) {', '.join(dupes)}")
        if not self.members:
            raise PoolError(f"{source or 'pool'}: a pool needs at least one member")
        self._by_name = {m.name: m for m in self.members}

    @classmethod
    def from_dict(cls, models: Mapping[str, Mapping[str, Any]], source: str = "pool") -> Pool:
        return cls((make_member(name, s, source) for name, s in models.items()), source=source)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> Pool:
        import yaml

        path = Path(path)
        try:
            data = yaml.load(path.read_text(), Loader=unique_key_loader())
        except FileNotFoundError:
            raise PoolError(f"pool file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise PoolError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
            raise PoolError(
                f"{path}: a pool file needs a top-level 'models:' mapping of member name -> settings"
            )
        unknown = sorted(set(data) - {"models"})
        if unknown:
            raise PoolError(f"{path}: unknown top-level key(s) {', '.join(unknown)}; expected only 'models'")
        return cls.from_dict(data["models"], source=str(path))

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def __getitem__(self, name: str) -> Member:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no member {name!r} in the pool; members: {', '.join(self.names)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Member]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def subset(self, names: Iterable[str]) -> Pool:
        """The members named, in pool order."""
        wanted = set(names)
        return Pool([m for m in self.members if m.name in wanted], source=self.source)

    def to_public_dict(self) -> dict[str, dict[str, Any]]:
        """The pool as it may appear in reports: secrets removed."""
        out = {}
        for m in self.members:
            entry = m.public_settings()
            if m.description:
                entry["description"] = m.description
            if m.system_prompt:
                entry["system_prompt"] = m.system_prompt
            if m.deployments:
                entry["deployments"] = m.public_deployments()
            if m.router:
                entry["router"] = dict(m.router)
            out[m.name] = entry
        return out
