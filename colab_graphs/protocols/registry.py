"""The protocol registry: built-in and user protocols by name, with family, parameters and defaults.

A protocol is a builder `(members: list[str], **params) -> GraphSpec` registered with `@protocol(...)`. The
registry records each parameter's default (from the signature) and its doc (from the `Args:` section of the
docstring), so `colab-graphs protocols` can list them and `-P key=value` can be parsed to the right type.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from colab_graphs.spec import GraphSpec

Builder = Callable[..., GraphSpec]

FAMILIES = ("api", "text", "logit", "weight", "basic")
_BUILTIN_MODULES = (
    "colab_graphs.protocols.basic",
    "colab_graphs.protocols.api",
    "colab_graphs.protocols.text",
    "colab_graphs.protocols.logit",
    "colab_graphs.protocols.weight",
)


@dataclass
class ProtocolInfo:
    name: str
    family: str
    description: str
    builder: Builder
    min_members: int = 1
    max_members: int | None = None
    requires: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    param_docs: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "description": self.description,
            "min_members": self.min_members,
            "max_members": self.max_members,
            "requires": self.requires,
            "params": {k: _jsonable(v) for k, v in self.params.items()},
            "param_docs": self.param_docs,
        }


_REGISTRY: dict[str, ProtocolInfo] = {}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def _param_docs(fn: Callable[..., Any]) -> dict[str, str]:
    doc = inspect.getdoc(fn) or ""
    m = re.search(r"^Args:\n((?:[ \t]+.*\n?)+)", doc, re.MULTILINE)
    if not m:
        return {}
    out: dict[str, str] = {}
    current = None
    for line in m.group(1).splitlines():
        pm = re.match(r"^\s{2,4}(\w+)(?: \([^)]*\))?:\s*(.*)$", line)
        if pm:
            current = pm.group(1)
            out[current] = pm.group(2).strip()
        elif current and line.strip():
            out[current] += " " + line.strip()
    return out


def protocol(
    name: str,
    *,
    family: str,
    description: str,
    min_members: int = 1,
    max_members: int | None = None,
    requires: Sequence[str] = (),
) -> Callable[[Builder], Builder]:
    """Register a protocol builder under `name`."""
    if family not in FAMILIES:
        raise ValueError(f"protocol {name!r}: family must be one of {FAMILIES}")

    def decorate(fn: Builder) -> Builder:
        sig = inspect.signature(fn)
        params = {
            p.name: p.default
            for p in list(sig.parameters.values())[1:]
            if p.default is not inspect.Parameter.empty and p.kind is not inspect.Parameter.VAR_KEYWORD
        }
        _REGISTRY[name] = ProtocolInfo(
            name=name,
            family=family,
            description=description,
            builder=fn,
            min_members=min_members,
            max_members=max_members,
            requires=list(requires),
            params=params,
            param_docs=_param_docs(fn),
        )
        return fn

    return decorate


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def list_protocols() -> list[ProtocolInfo]:
    _load_builtins()
    order = {f: i for i, f in enumerate(FAMILIES)}
    return sorted(_REGISTRY.values(), key=lambda p: (order[p.family], p.name))


def get_protocol(name: str) -> ProtocolInfo:
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown protocol {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


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
