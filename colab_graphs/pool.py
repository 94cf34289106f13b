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

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from colab_graphs.redaction import SECRET_FIELDS, SECRETS, public_settings, public_value, settings_secrets

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
        "headers",
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
        "input_cost_per_token",
        "output_cost_per_token",
    }
)
MEMBER_KEYS = frozenset({"description", "system_prompt", "deployments", "router", "cache_namespace"})
# A member's own price per token (`colab_graphs.models.pricing`): what its calls cost, not what they answer.
PRICE_KEYS = frozenset({"input_cost_per_token", "output_cost_per_token"})
# Settings that say where and how to connect, or what a call costs, not what to generate: never part of a cache
# key, never traced.
CONNECTION_KEYS = PRICE_KEYS | frozenset(
    {
        "api_base",
        "base_url",
        "api_key",
        "api_version",
        "organization",
        "timeout",
        "extra_headers",
        "headers",
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
SECRET_KEYS = SECRET_FIELDS
# What a deployment may set besides connection settings: the Router's per-deployment limits and weights.
DEPLOYMENT_ROUTING_KEYS = frozenset({"rpm", "tpm", "weight", "order", "max_parallel_requests"})
# (A member's price is its own: a deployment does not set one.)
DEPLOYMENT_KEYS = (CONNECTION_KEYS - PRICE_KEYS) | {"model"} | DEPLOYMENT_ROUTING_KEYS
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
    cache_namespace: str | None = None
    # Values read from the environment -> their reference ("${VAR}"): what reports write instead. Private, so
    # that no dump of the member carries them.
    _env_refs: dict[str, str] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any) -> None:
        self._register_secrets()

    def _register_secrets(self) -> None:
        """Tell this process's redactor every secret the member holds (see `colab_graphs.redaction`)."""
        for value in self.secrets():
            SECRETS.add(value)
        for value, ref in self._env_refs.items():
            SECRETS.add(value, ref)

    def with_env_refs(self, env_refs: Mapping[str, str]) -> Member:
        """The member, remembering which of its values came from the environment (value -> ``${VAR}``)."""
        self._env_refs = dict(env_refs)
        self._register_secrets()
        return self

    @property
    def model(self) -> str:
        return str(self.settings["model"])

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
        """Settings safe to write to traces and reports: keys and headers removed, URL userinfo and query
        values redacted, values read from the environment written as their ``${VAR}``."""
        return public_settings(self.settings, self._env_refs)

    def public_deployments(self) -> list[dict[str, Any]]:
        """The deployments as they may appear in reports (secrets removed, as `public_settings`)."""
        return [public_settings(d, self._env_refs) for d in self.deployments]

    def public_text(self, value: Any) -> Any:
        """A value of the member's (a description, a persona) with environment values written as references."""
        return public_value(value, self._env_refs)

    def secrets(self) -> list[str]:
        """Every secret the member's calls may carry (keys, header values, URL userinfo and query values of its
        own settings and its deployments', values read from the environment), for redaction."""
        found = settings_secrets(self.settings)
        for deployment in self.deployments:
            found += settings_secrets(deployment)
        found += list(self._env_refs)
        return list(dict.fromkeys(found))

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


def _expand_env(value: Any, where: str, refs: dict[str, str]) -> Any:
    """`value` with each ``${VAR}`` read from the environment; `refs` collects value -> reference (a secret)."""
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            var = match.group(1)
            if var not in os.environ:
                raise PoolError(f"{where}: environment variable ${{{var}}} is not set")
            if os.environ[var]:
                refs[os.environ[var]] = match.group(0)
            return os.environ[var]

        expanded = _ENV_REF.sub(sub, value)
        if expanded != value and _ENV_REF.fullmatch(value) is None:
            refs[expanded] = value  # "http://h/v1?key=${KEY}" is written as that template
        return expanded
    if isinstance(value, dict):
        return {k: _expand_env(v, where, refs) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, where, refs) for v in value]
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
    refs: dict[str, str] = {}
    expanded: dict[str, Any] = _expand_env(dict(settings), f"{where}: member {name!r}", refs)
    extra = {k: expanded.pop(k) for k in MEMBER_KEYS if k in expanded}
    if "deployments" in extra:
        extra["deployments"] = _check_deployments(extra["deployments"], f"{where}: member {name!r}")
    if "router" in extra:
        extra["router"] = _check_router(
            extra["router"], bool(extra.get("deployments")), f"{where}: member {name!r}"
        )
    checked = checked_settings(expanded, extra, f"{where}: member {name!r}")
    return Member(name=name, settings=checked, **extra).with_env_refs(refs)


def checked_settings(settings: dict[str, Any], extra: dict[str, Any], where: str) -> dict[str, Any]:
    """The member's settings, type-checked with its deployments, router and own keys (see `pool_settings`).

    Strings that spell a number or a flag are converted in place (`extra` too); every field of a wrong type is
    listed in one error.
    """
    from colab_graphs.pool_settings import setting_problems

    settings, problems = setting_problems(settings)
    own: dict[str, Any] = {
        k: extra[k] for k in ("description", "system_prompt", "cache_namespace") if k in extra
    }
    checked_own, more = setting_problems(own)
    extra.update(checked_own)
    problems += more
    for i, deployment in enumerate(extra.get("deployments") or [], 1):
        extra["deployments"][i - 1], more = setting_problems(deployment)
        problems += [f"deployments[{i}].{p}" for p in more]
    if extra.get("router"):
        extra["router"], more = setting_problems(extra["router"], "router")
        problems += [f"router.{p}" for p in more]
    if problems:
        raise PoolError(f"{where}: " + "; ".join(problems))
    return settings


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

        from colab_graphs.files import read_text

        path = Path(path)
        text = read_text(path, PoolError, "pool file")
        try:
            data = yaml.load(text, Loader=unique_key_loader())
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
                entry["description"] = m.public_text(m.description)
            if m.system_prompt:
                entry["system_prompt"] = m.public_text(m.system_prompt)
            if m.deployments:
                entry["deployments"] = m.public_deployments()
            if m.router:
                entry["router"] = m.public_text(dict(m.router))
            if m.cache_namespace:
                entry["cache_namespace"] = m.public_text(m.cache_namespace)
            out[m.name] = entry
        return out
