"""The one registry: protocols, aggregators, routers and task types (what `--scorer` names) by kind and name.

Each is registered by a decorator that records its arguments (a protocol's family, description, member bounds,
and the defaults and docs of its parameters), as inspect_ai's registry does, so a report can name what ran and
the CLI can list and rebuild it:

    @protocol("draft_critique", family="text", description="...")      # a GraphSpec builder
    @aggregator("vote")                                                 # (inputs, *, task, **params) -> str
    @router("confidence")                                               # (view, path_map, **params) -> key
    register_task(NumericTask())                                        # kind "task": a TaskType (tasks/task_types.py)

Plugins: every entry point of the group ``colab_graphs.plugins`` is loaded (imported; a callable entry point
is also called) the first time a name is looked up. The package's own built-ins are such a plugin
(``builtins = "colab_graphs.builtins"`` in pyproject.toml), so the core never imports the protocol library; a
user package adds a protocol or a scorer the same way:

    [project.entry-points."colab_graphs.plugins"]
    my_protocols = "my_package.protocols"
"""

from __future__ import annotations

import difflib
import inspect
import re
import threading
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Literal, TypeVar

Kind = Literal["protocol", "aggregator", "router", "task"]
KINDS: tuple[Kind, ...] = ("protocol", "aggregator", "router", "task")
# What a user calls an entry of a kind in messages: a task type is named by `--scorer` and an example's
# `scorer` field, so an unknown one is an "unknown scorer".
NOUNS: dict[str, str] = {"task": "scorer"}
# Kind names of the previous release, accepted with a DeprecationWarning for one release: "scorer" (the kind
# always stored TaskType objects).
OLD_KINDS: dict[str, Kind] = {"scorer": "task"}
AnyKind = Kind | Literal["scorer"]
FAMILIES = ("api", "text", "logit", "weight", "basic")
PLUGIN_GROUP = "colab_graphs.plugins"

F = TypeVar("F", bound=Callable[..., Any])  # a decorated function keeps its own type


@dataclass(frozen=True)
class RegistryInfo:
    """One registered object: its kind, name, the object itself, and what its decorator recorded."""

    kind: Kind
    name: str
    obj: Any
    metadata: dict[str, Any] = field(default_factory=dict)


class PluginError(RuntimeError):
    """A plugin entry point could not be loaded; the message names it."""


class NameClash(ValueError):
    """Two sources register one (kind, name); the message names both."""


_entries: dict[tuple[str, str], RegistryInfo] = {}
_plugins_loaded = False
_plugins_lock = threading.RLock()


def _kind(kind: AnyKind) -> Kind:
    """`kind`, an old kind name replaced by its new one (with a DeprecationWarning at the caller's caller)."""
    new = OLD_KINDS.get(kind)
    if new is None:
        return kind  # type: ignore[return-value]  # (not an old name: a Kind, or refused by registry_add)
    warnings.warn(
        f"registry kind {kind!r} is now {new!r} (it stores TaskType objects); {kind!r} goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return new


def registry_add(
    kind: AnyKind, name: str, obj: Any, *, source: str | None = None, **metadata: Any
) -> RegistryInfo:
    """Register `obj` under (`kind`, `name`).

    Names are global across plugins, so a plugin cannot silently replace a built-in or another plugin's entry:
    a name already registered from another source is a `NameClash` naming both. The same source registering
    again (a module imported twice, a user graph file loaded again) replaces its own entry. `source` is where
    `obj` is defined (default: its module and qualified name; an instance's class).
    """
    kind = _kind(kind)
    if kind not in KINDS:
        raise ValueError(f"unknown registry kind {kind!r}; kinds: {', '.join(KINDS)}")
    source = source or source_of(obj)
    earlier = _entries.get((kind, name))
    if earlier is not None and earlier.metadata["source"] != source:
        raise NameClash(
            f"{NOUNS.get(kind, kind)} {name!r} is registered twice: by {earlier.metadata['source']} and by {source}; "
            "rename one (names are shared by every plugin)"
        )
    info = RegistryInfo(kind, name, obj, {**metadata, "source": source})
    _entries[(kind, name)] = info
    return info


def source_of(obj: Any) -> str:
    """Where `obj` is defined: `module.qualname` of a function or class, of an instance's class otherwise."""
    defined = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{defined.__module__}.{defined.__qualname__}"


def load_plugins() -> None:
    """Load every ``colab_graphs.plugins`` entry point once (the package's built-ins are one)."""
    global _plugins_loaded
    with _plugins_lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True
        for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: (e.name != "builtins", e.name)):
            try:
                loaded = ep.load()
            except Exception as exc:  # a broken third-party plugin must say which one it is
                raise PluginError(f"plugin {ep.name!r} ({ep.value}) failed to load: {exc}") from exc
            if callable(loaded):
                loaded()


def registry_lookup(kind: AnyKind, name: str) -> RegistryInfo:
    """The entry (`kind`, `name`); plugins load on the first lookup. KeyError lists the known names."""
    kind = _kind(kind)
    if (kind, name) not in _entries:
        load_plugins()
    try:
        return _entries[(kind, name)]
    except KeyError:
        names = registry_names(kind)
        known = ", ".join(names) or "(none: is colab-graphs installed? pip install -e .)"
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise KeyError(f"unknown {NOUNS.get(kind, kind)} {name!r}{hint}; known: {known}") from None


def registry_find(kind: AnyKind) -> list[RegistryInfo]:
    """Every entry of `kind`, in name order (plugins loaded)."""
    kind = _kind(kind)
    load_plugins()
    return sorted((i for (k, _), i in _entries.items() if k == kind), key=lambda i: i.name)


def registry_names(kind: AnyKind) -> list[str]:
    return [info.name for info in registry_find(_kind(kind))]


# --- decorators ------------------------------------------------------------------------------------------------


def aggregator(name: str) -> Callable[[F], F]:
    """Register a pure-Python aggregator `(inputs, *, task, **params) -> str` under `name`."""

    def decorate(fn: F) -> F:
        registry_add("aggregator", name, fn)
        return fn

    return decorate


def router(name: str) -> Callable[[F], F]:
    """Register a router `(view, path_map, **params) -> path key` under `name`."""

    def decorate(fn: F) -> F:
        registry_add("router", name, fn)
        return fn

    return decorate


def protocol(
    name: str,
    *,
    family: str,
    description: str,
    min_members: int = 1,
    max_members: int | None = None,
    requires: Sequence[str] = (),
    independent_replies: bool = False,
    fit: Callable[..., Awaitable[Any]] | None = None,
) -> Callable[[F], F]:
    """Register a protocol builder `(members, **params) -> GraphSpec` under `name`.

    Records the decorator's arguments and, from the builder, each parameter's default (its signature) and doc
    (the `Args:` section of its docstring), so `colab-graphs protocols` can list them and `-P key=value` is
    parsed to the parameter's type. `independent_replies` declares that no member's reply depends on the
    coalition (every seat's prompt depends on the example alone, no seat reads another's output), so an audit
    may compute every coalition's value from the members' answers (`colab_graphs.audit.answers`). `fit` is
    the protocol's fit step, run on each coalition's spec before it compiles (`colab_graphs.fitting`: an
    `async step(spec, pool, *, client, scorer) -> Fitted`); None when the protocol runs as built.
    """
    if family not in FAMILIES:
        raise ValueError(f"protocol {name!r}: family must be one of {FAMILIES}")

    def decorate(fn: F) -> F:
        params = {
            p.name: p.default
            for p in list(inspect.signature(fn).parameters.values())[1:]
            if p.default is not inspect.Parameter.empty and p.kind is not inspect.Parameter.VAR_KEYWORD
        }
        registry_add(
            "protocol",
            name,
            fn,
            family=family,
            description=description,
            min_members=min_members,
            max_members=max_members,
            requires=list(requires),
            independent_replies=independent_replies,
            fit=fit,
            params=params,
            param_docs=param_docs(fn),
        )
        return fn

    return decorate


def param_docs(fn: Callable[..., Any]) -> dict[str, str]:
    """Parameter name -> its doc, from the `Args:` section of `fn`'s Google-style docstring."""
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
