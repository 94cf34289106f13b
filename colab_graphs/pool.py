"""The model pool: members by name, each with the LiteLLM settings that reach it.

Pool file (YAML)::

    models:
      alice: {model: openai/alice, api_base: http://127.0.0.1:8000/v1, api_key: ${OPENAI_API_KEY}}
      bob:   {model: local/smollm2-135m, temperature: 0.7, description: "a careful solver"}

Order of the mapping is pool order (it breaks vote ties and orders seats). Values `${ENV_VAR}` are read from the
environment. Besides `litellm.acompletion` keyword arguments a member may carry `description` (what a router
reads about it) and `system_prompt` (a persona prepended to every call it makes).
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
MEMBER_KEYS = frozenset({"description", "system_prompt"})
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

    @property
    def model(self) -> str:
        return self.settings["model"]

    @property
    def endpoint(self) -> str:
        """What concurrency limits are keyed on: the server a call goes to (api_base, else the provider)."""
        base = self.settings.get("api_base") or self.settings.get("base_url")
        if base:
            return str(base)
        return self.model.split("/", 1)[0] if "/" in self.model else self.model

    def generation_settings(self) -> dict[str, Any]:
        """Settings that shape the output (part of the cache key): everything but connection settings."""
        return {k: v for k, v in self.settings.items() if k not in CONNECTION_KEYS}

    def public_settings(self) -> dict[str, Any]:
        """Settings safe to write to traces and reports: secrets removed."""
        return {k: v for k, v in self.settings.items() if k not in SECRET_KEYS}


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
        hints = [
            f"{k} (did you mean {close[0]}?)"
            if (close := difflib.get_close_matches(k, LITELLM_KWARGS | MEMBER_KEYS, 1))
            else k
            for k in unknown
        ]
        raise PoolError(
            f"{where}: member {name!r} has unknown key(s) {', '.join(hints)}; allowed: LiteLLM completion "
            f"arguments (model, api_base, api_key, temperature, max_tokens, seed, ...) and "
            f"{', '.join(sorted(MEMBER_KEYS))}"
        )
    if not settings.get("model"):
        raise PoolError(f"{where}: member {name!r} has no 'model' (a LiteLLM model string is required)")
    settings = _expand_env(dict(settings), f"{where}: member {name!r}")
    extra = {k: settings.pop(k) for k in MEMBER_KEYS if k in settings}
    return Member(name=name, settings=settings, **extra)


def _unique_key_loader() -> type:
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
            data = yaml.load(path.read_text(), Loader=_unique_key_loader())
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
            out[m.name] = entry
        return out
