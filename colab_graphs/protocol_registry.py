"""Protocols by name: look up, list, and build them from the one registry (`colab_graphs.registry`).

A protocol is a builder `(members: list[str], **params) -> GraphSpec` registered with `@protocol(...)`. The
registry records each parameter's default (from the signature) and its doc (from the `Args:` section of the
docstring), so `colab-graphs protocols` can list them and `-P key=value` can be parsed to the right type.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from colab_graphs.registry import FAMILIES, RegistryInfo, registry_find, registry_lookup
from colab_graphs.spec import GraphSpec

Builder = Callable[..., GraphSpec]

__all__ = [
    "ProtocolInfo",
    "build_protocol",
    "coerce_param",
    "get_protocol",
    "list_protocols",
]


@dataclass
class ProtocolInfo:
    """A registered protocol: its builder and what its `@protocol` decorator recorded."""

    name: str
    family: str
    description: str
    builder: Builder
    min_members: int = 1
    max_members: int | None = None
    requires: list[str] = field(default_factory=list)
    independent_replies: bool = False
    fit: Callable[..., Awaitable[Any]] | None = None  # the fit step (`colab_graphs.fitting.FitStep`)
    params: dict[str, Any] = field(default_factory=dict)
    param_docs: dict[str, str] = field(default_factory=dict)
    source: str = ""  # where the builder is defined (`colab_graphs.registry.source_of`)

    @classmethod
    def of(cls, info: RegistryInfo) -> ProtocolInfo:
        return cls(name=info.name, builder=info.obj, **info.metadata)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "description": self.description,
            "min_members": self.min_members,
            "max_members": self.max_members,
            "requires": self.requires,
            "independent_replies": self.independent_replies,
            "params": {k: _jsonable(v) for k, v in self.params.items()},
            "param_docs": self.param_docs,
        }


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def list_protocols() -> list[ProtocolInfo]:
    """Every registered protocol, by family (api, text, logit, weight, basic) then name."""
    order = {f: i for i, f in enumerate(FAMILIES)}
    return sorted(map(ProtocolInfo.of, registry_find("protocol")), key=lambda p: (order[p.family], p.name))


def get_protocol(name: str) -> ProtocolInfo:
    return ProtocolInfo.of(registry_lookup("protocol", name))


def coerce_param(info: ProtocolInfo, key: str, raw: Any) -> Any:
    """Turn a CLI string into the type of the parameter's default (JSON for lists / dicts)."""
    if key not in info.params:
        raise KeyError(
            f"protocol {info.name!r} has no parameter {key!r}; parameters: {', '.join(info.params) or '(none)'}"
        )
    if not isinstance(raw, str):
        return raw
    default = info.params[key]
    try:
        if isinstance(default, bool):
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, (list, dict)) or (default is None and raw[:1] in "[{"):
            return json.loads(raw)
    except (ValueError, json.JSONDecodeError):
        raise ValueError(
            f"protocol {info.name!r}: parameter {key}={raw!r} is not a valid {type(default).__name__}"
        ) from None
    return raw


def build_protocol(name: str, members: Sequence[str], **params: Any) -> GraphSpec:
    """Build protocol `name` over `members` (pool order); string params are coerced to their types."""
    info = get_protocol(name)
    if len(members) < info.min_members:
        raise ValueError(f"protocol {name!r} needs at least {info.min_members} member(s), got {len(members)}")
    coerced = {k: coerce_param(info, k, v) for k, v in params.items()}
    spec = info.builder(list(members), **coerced)
    full = {**info.params, **coerced}
    return spec.model_copy(update={"params": {k: _jsonable(v) for k, v in full.items()}})
