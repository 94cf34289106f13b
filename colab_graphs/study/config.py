"""The study file (YAML): pools x protocols x datasets, read and checked with errors that name the file and key.

    pools:                                  # name -> pool file (relative to this file) or inline models
      small: pools/small.yaml
      mixed: {models: {a: {model: openai/a, api_base: "http://127.0.0.1:8000/v1"}}}
    protocols:                              # names, or {name, params, label}
      - majority_vote
      - {name: debate, params: {rounds: 2}}
    datasets:                               # sources, or {source, limit, split, scorer, label, fields}
      - builtin:arithmetic
      - {source: arc_challenge, limit: 20, scorer: multiple_choice}
    method: loo                             # loo | exact | sampled (sampled needs budget or target_error)
    budget: 2000                            # for sampled: distinct calls (see budget_unit)
    budget_unit: calls                      # calls | coalitions | permutations
    target_error: 0.01                      # for sampled: stop at this 95% sampling half-width
    limit: 20                               # default limit of every dataset
    seed: 0                                 # shuffles the data before limit; seeds the estimators
    max_concurrency: 16                     # in-flight calls per endpoint
    force: false                            # allow exact Shapley over more than 12 members
    shard_size: 16                          # on Ray: examples per shard (default: 4 shards per worker)
    sandbox: auto                           # code scores: auto | namespaces | landlock | unsafe-local (unsafe)

Every key is checked before anything runs; a relative path is read relative to the study file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colab_graphs.pool import Pool, PoolError

STUDY_KEYS = (
    "pools",
    "protocols",
    "datasets",
    "method",
    "budget",
    "budget_unit",
    "target_error",
    "limit",
    "seed",
    "max_concurrency",
    "force",
    "shard_size",
    "sandbox",
)
PROTOCOL_KEYS = ("name", "params", "label")
DATASET_KEYS = ("source", "limit", "split", "scorer", "label", "fields")
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class StudyConfigError(ValueError):
    """The study file is invalid; the message names the file and the key at fault."""


@dataclass(frozen=True)
class ProtocolEntry:
    """One protocol of the study: a registered protocol name, its parameters, and the label its folder takes."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    label: str = ""


@dataclass(frozen=True)
class DatasetEntry:
    """One dataset of the study: a source `load_examples` understands, and how to cut and score it.

    `source` is as the study file gives it; `location` is what is loaded (a file path made absolute).
    """

    source: str
    label: str
    limit: int | None = None
    split: str | None = None
    scorer: str | None = None
    location: str = ""
    # Example field -> the records' field (`load_examples`'s `field_map`: {input: question, answer: label}).
    fields: dict[str, str] | None = None


@dataclass
class StudyConfig:
    """A checked study file: pools in file order, protocol and dataset entries, and the audit settings."""

    path: Path
    pools: dict[str, Pool]
    protocols: list[ProtocolEntry]
    datasets: list[DatasetEntry]
    method: str = "loo"
    budget: int | None = None
    seed: int | None = None
    max_concurrency: int = 16
    force: bool = False
    shard_size: int | None = None
    budget_unit: str = "calls"
    target_error: float | None = None
    # Code scores' sandbox setting (`colab_graphs.sandbox.scope`); None: env, else auto.
    sandbox: str | None = None
    # The stall watchdog's time in seconds (`--stall-after`; None: `colab_graphs.watch.STALL_S`; 0: none).
    stall_after: float | None = None


def load_study_config(path: str | Path) -> StudyConfig:
    """Read and check a study file.

    Raises:
        StudyConfigError: a missing file, bad YAML, an unknown or ill-typed key, a pool, protocol or dataset
            that cannot be used; the message names the file and the key (e.g. ``protocols[2].params``).
    """
    import yaml

    from colab_graphs.files import read_text
    from colab_graphs.pool import unique_key_loader

    path = Path(path)
    text = read_text(path, StudyConfigError, "study file")
    try:
        data = yaml.load(text, Loader=unique_key_loader())
    except yaml.YAMLError as exc:
        raise StudyConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_study_config(data, path)


def parse_study_config(data: Any, path: Path) -> StudyConfig:
    """Check an already parsed study mapping; `path` names it in errors and anchors relative paths."""

    def fail(key: str, message: str) -> StudyConfigError:
        return StudyConfigError(f"{path}: {key}: {message}")

    if not isinstance(data, Mapping):
        raise StudyConfigError(f"{path}: a study file is a mapping with pools, protocols and datasets")
    unknown = sorted(set(data) - set(STUDY_KEYS))
    if unknown:
        raise fail(unknown[0], f"unknown key; known keys: {', '.join(STUDY_KEYS)}")
    for key in ("pools", "protocols", "datasets"):
        if not data.get(key):
            raise fail(key, "missing or empty; a study needs at least one pool, protocol and dataset")

    method = data.get("method", "loo")
    if method not in ("loo", "exact", "sampled"):
        raise fail("method", f"must be loo, exact or sampled, got {method!r}")
    budget = _optional_int(data, "budget", fail, minimum=1)
    budget_unit = data.get("budget_unit", "calls")
    if budget_unit not in ("calls", "coalitions", "permutations"):
        raise fail("budget_unit", f"must be calls, coalitions or permutations, got {budget_unit!r}")
    target_error = data.get("target_error")
    if target_error is not None and (
        isinstance(target_error, bool) or not isinstance(target_error, (int, float)) or target_error <= 0
    ):
        raise fail("target_error", f"must be a positive number, got {target_error!r}")
    if method == "sampled" and budget is None and target_error is None:
        raise fail(
            "budget", "method sampled needs a budget (distinct calls, see budget_unit) or a target_error"
        )
    limit = _optional_int(data, "limit", fail, minimum=1)
    seed = _optional_int(data, "seed", fail, minimum=0)
    max_concurrency = _optional_int(data, "max_concurrency", fail, minimum=1) or 16
    shard_size = _optional_int(data, "shard_size", fail, minimum=1)
    force = data.get("force", False)
    if not isinstance(force, bool):
        raise fail("force", f"must be true or false, got {force!r}")

    sandbox = data.get("sandbox")
    if sandbox is not None:
        from colab_graphs.sandbox.scope import normalize

        try:
            if not isinstance(sandbox, str):
                raise ValueError(f"expected a sandbox setting, got {sandbox!r}")
            sandbox = normalize(sandbox)
        except ValueError as err:
            raise fail("sandbox", str(err)) from None

    pools = _pools(data["pools"], path, fail)
    protocols = _protocols(data["protocols"], fail)
    datasets = _datasets(data["datasets"], path, limit, fail)
    config = StudyConfig(
        path, pools, protocols, datasets, method, budget, seed, max_concurrency, force, shard_size, budget_unit,
        None if target_error is None else float(target_error), sandbox,
    )  # fmt: skip
    _check_protocols_fit_pools(config, fail)
    return config


def _optional_int(data: Mapping, key: str, fail, minimum: int) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise fail(key, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _label(value: Any, key: str, fail) -> str:
    if not isinstance(value, str) or not _LABEL.match(value):
        raise fail(key, f"{value!r} is not a usable name (letters, digits, '_', '-', '.'; it names a folder)")
    return value


def _pools(raw: Any, path: Path, fail) -> dict[str, Pool]:
    if not isinstance(raw, Mapping):
        raise fail("pools", "must map a pool name to a pool file or to inline models")
    pools: dict[str, Pool] = {}
    for name, spec in raw.items():
        key = f"pools.{name}"
        _label(name, key, fail)
        try:
            if isinstance(spec, str):
                file = Path(spec) if Path(spec).is_absolute() else path.parent / spec
                pools[name] = Pool.from_yaml(file)
            elif isinstance(spec, Mapping):
                # `{models: {...}}` as in a pool file, or the members directly.
                if "models" in spec and set(spec) != {"models"}:
                    raise fail(key, f"inline pool has unknown key(s) {sorted(set(spec) - {'models'})}")
                models = spec.get("models", spec)
                if not isinstance(models, Mapping) or not models:
                    raise fail(key, "inline models must map member names to LiteLLM settings")
                pools[name] = Pool.from_dict(models, source=f"{path}: {key}")
            else:
                raise fail(key, f"must be a pool file path or inline models, got {spec!r}")
        except PoolError as err:
            raise StudyConfigError(f"{path}: {key}: {err}") from None
    return pools


def _protocols(raw: Any, fail) -> list[ProtocolEntry]:
    from colab_graphs.protocol_registry import coerce_param, get_protocol

    entries: list[ProtocolEntry] = []
    for key, item in _entries(raw, "protocols", PROTOCOL_KEYS, fail):
        try:
            info = get_protocol(str(item["name"]))
        except KeyError as err:
            raise fail(f"{key}.name", str(err.args[0])) from None
        params = item.get("params") or {}
        if not isinstance(params, Mapping):
            raise fail(f"{key}.params", f"must be a mapping of parameter -> value, got {params!r}")
        for p, value in params.items():
            try:
                coerce_param(info, p, value)
            except (KeyError, ValueError) as err:
                raise fail(f"{key}.params.{p}", str(err.args[0])) from None
        label = _label(item.get("label", info.name), f"{key}.label", fail)
        entries.append(ProtocolEntry(info.name, dict(params), label))
    _unique([e.label for e in entries], "protocols", "label", fail)
    return entries


def _entries(raw: Any, name: str, known: tuple[str, ...], fail) -> Iterator[tuple[str, Mapping]]:
    """(key, entry) for each entry of a list; a bare string is the entry's first key (a name, a source)."""
    main = known[0]
    if not isinstance(raw, list):
        raise fail(name, f"must be a list, each a {main} or a mapping of {', '.join(known)}")
    for i, item in enumerate(raw, 1):
        key = f"{name}[{i}]"
        if isinstance(item, str):
            item = {main: item}
        if not isinstance(item, Mapping) or not isinstance(item.get(main), str):
            raise fail(key, f"must be a {main} or a mapping with a string '{main}', got {item!r}")
        unknown = sorted(set(item) - set(known))
        if unknown:
            raise fail(f"{key}.{unknown[0]}", f"unknown key; known: {', '.join(known)}")
        yield key, item


def _source_label(source: str) -> str:
    if source.endswith((".jsonl", ".json", ".csv")):
        source = Path(source).stem
    return re.sub(r"[^A-Za-z0-9_.\-]+", "-", source).strip("-") or "data"


def _datasets(raw: Any, path: Path, default_limit: int | None, fail) -> list[DatasetEntry]:
    entries: list[DatasetEntry] = []
    for key, item in _entries(raw, "datasets", DATASET_KEYS, fail):
        source = location = item["source"]
        if source.endswith((".jsonl", ".json", ".csv")) and not Path(source).is_absolute():
            location = str(path.parent / source)
        limit = _optional_int(item, "limit", lambda k, m, at=key: fail(f"{at}.{k}", m), minimum=1)
        for text_key in ("split", "scorer"):
            if item.get(text_key) is not None and not isinstance(item[text_key], str):
                raise fail(f"{key}.{text_key}", f"must be a string, got {item[text_key]!r}")
        if item.get("scorer"):
            from colab_graphs.tasks.scoring import get_scorer

            try:
                get_scorer(item["scorer"])
            except (KeyError, ValueError) as err:
                raise fail(f"{key}.scorer", str(err.args[0])) from None
        fields = item.get("fields")
        if fields is not None and not (
            isinstance(fields, Mapping) and all(isinstance(v, str) for v in [*fields, *fields.values()])
        ):
            raise fail(f"{key}.fields", f"must map Example fields to the records' fields, got {fields!r}")
        label = _label(item.get("label", _source_label(source)), f"{key}.label", fail)
        entries.append(
            DatasetEntry(
                source,
                label,
                limit or default_limit,
                item.get("split"),
                item.get("scorer"),
                location,
                dict(fields) if fields else None,
            )  # fmt: skip
        )
    _unique([e.label for e in entries], "datasets", "label", fail)
    return entries


def _unique(labels: list[str], key: str, what: str, fail) -> None:
    seen: set[str] = set()
    for i, label in enumerate(labels, 1):
        if label in seen:
            raise fail(
                f"{key}[{i}]",
                f"{what} {label!r} is used twice; give one of them its own 'label' (a folder name)",
            )
        seen.add(label)


def _check_protocols_fit_pools(config: StudyConfig, fail) -> None:
    from colab_graphs.protocol_registry import get_protocol

    for i, entry in enumerate(config.protocols, 1):
        info = get_protocol(entry.name)
        for name, pool in config.pools.items():
            if len(pool) < info.min_members:
                raise fail(
                    f"protocols[{i}]",
                    f"protocol {entry.name!r} needs at least {info.min_members} members; pool {name!r} has "
                    f"{len(pool)}",
                )
