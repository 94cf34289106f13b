"""Layers and cycles, read from the source: every import of every module, function-local imports included.

The core (spec, builder, coalition, fitting, compile, pool, trace, runner, the registry with protocol_registry
and resolve, models/, local/, serve/, langchain/, tasks/, log/, testing/, ...) stands on its own: it imports
nothing from the upper layers. Above it, each layer may import only the layers below it (`LAYERS`, lowest
first):

- base: the plain modules the model packages stand on (`BASE`: pool, trace, redaction, watch, files, _env, and
  the OpenTelemetry spans every layer opens: otel, otel_common, otel_export).
- local: in-process inference (`local/`): the LiteLLM provider, the engine, the zoo, merges, logit decoding.
- models: the call path (`models/`); it knows local inference only as a LiteLLM provider: its one door into
  `local/` is `colab_graphs.local.provider` (`test_the_call_path_knows_local_inference_only_as_a_provider`).
- serve, langchain: the OpenAI-compatible server (`serve/`, over local inference) and the LangChain adapters
  (`langchain/`, over the call path); neither imports the other.
- core: what every layer above runs on; the protocol machinery (registry, resolution, the fit stage) is here,
  so no layer needs the protocol library to look up, build or fit a protocol.
- audit: the coalition game and its estimators, over any spec the core builds.
- study, trainers: each runs audits (a study audits many systems; the trainer's held-out evaluation is the
  policy seat's leave-one-out, a coalition game); neither imports the other.
- protocols: the built-in protocol library, a leaf; its trained methods use the trainers (SFT and GRPO).
- surfaces: the CLI, the viewer, the public API (`colab_graphs`, `colab_graphs.api`) and `colab_graphs.builtins`
  (the package's own plugin, loaded through the registry's entry point: the one module that imports the
  protocol library).

No arrow runs back up, no package imports (at any depth) a package that imports it back, and no module imports
a module that imports it back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "colab_graphs"
UPPER = ("protocols", "audit", "study", "trainers", "cli", "viewer")
MEETING_POINTS = {"colab_graphs", "colab_graphs.builtins", "colab_graphs.api"}
# The core's own packages below the rest of it, and the plain modules they stand on.
MODEL_PACKAGES = ("local", "models", "serve", "langchain")
BASE = frozenset(
    f"colab_graphs.{m}"
    for m in (
        "_env",
        "files",
        "otel",
        "otel_common",
        "otel_export",
        "pool",
        "pool_settings",
        "redaction",
        "trace",
        "watch",
    )
)
# The package layers, lowest first (the module docstring says why): a package imports its own layer or below.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"base"}),
    frozenset({"local"}),
    frozenset({"models"}),
    frozenset({"serve", "langchain"}),
    frozenset({"core"}),
    frozenset({"audit"}),
    frozenset({"study", "trainers"}),
    frozenset({"protocols"}),
    frozenset({"cli", "viewer", "api", "builtins", "colab_graphs"}),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports anywhere in its body (`from pkg import mod` counts as `pkg.mod`;
    `pkg` itself only when some name imported from it is not a module)."""
    found: set[str] = set()
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            submodules = {f"{base}.{a.name}" for a in node.names} & modules
            found.update(submodules)
            if len(submodules) < len(node.names):  # some name is an object defined in `base` itself
                found.add(base)
    return {m for m in found if m in modules and m != me}


def import_graph() -> nx.DiGraph:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = nx.DiGraph()
    for path in paths:
        graph.add_node(module_name(path))
        for target in imports_of(path, modules):
            graph.add_edge(module_name(path), target)
    return graph


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in UPPER else "core"


def package(module: str) -> str:
    """The package a module belongs to, as `LAYERS` names it: the rest of the core is one package."""
    parts = module.split(".")
    if len(parts) == 1:
        return "colab_graphs"
    if parts[1] in UPPER or parts[1] in ("api", "builtins") or parts[1] in MODEL_PACKAGES:
        return parts[1]
    return "base" if module in BASE else "core"


def rank(name: str) -> int:
    return next(i for i, members in enumerate(LAYERS) if name in members)


def package_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for src, dst in import_graph().edges:
        graph.add_node(package(src))
        if package(src) != package(dst):
            graph.add_edge(package(src), package(dst), via=f"{src} -> {dst}")
    return graph


def test_every_package_has_a_layer():
    assert [p for p in package_graph() if not any(p in layer for layer in LAYERS)] == []


def test_no_import_runs_back_up_a_layer():
    graph = import_graph()
    bad = sorted(f"{src} -> {dst}" for src, dst in graph.edges if rank(package(src)) < rank(package(dst)))
    assert bad == []


def test_no_package_imports_a_package_that_imports_it_back():
    graph = package_graph()
    cycles = [
        [graph.edges[a, b]["via"] for a, b in zip(c, [*c[1:], c[0]], strict=True)]
        for c in nx.simple_cycles(graph)
    ]
    assert cycles == []


def test_no_folder_imports_a_folder_that_imports_it_back():
    """Within a layer too: the core's own folders (tasks/, sandbox/, log/, testing/) are packages of their own
    here, so two of them importing each other is a loop even though both are "core"."""
    folders = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    graph = nx.DiGraph()
    for src, dst in import_graph().edges:
        a, b = (
            m.split(".")[1] if m.count(".") >= 1 and m.split(".")[1] in folders else None for m in (src, dst)
        )
        if a and b and a != b:
            graph.add_edge(a, b, via=f"{src} -> {dst}")
    cycles = [
        [graph.edges[a, b]["via"] for a, b in zip(c, [*c[1:], c[0]], strict=True)]
        for c in nx.simple_cycles(graph)
    ]
    assert cycles == []


def test_only_the_builtins_plugin_imports_the_protocol_library():
    importers = {
        src
        for src, dst in import_graph().edges
        if package(dst) == "protocols" and package(src) != "protocols"
    }
    assert importers == {"colab_graphs.builtins"}


def test_the_core_imports_nothing_from_the_upper_layers():
    graph = import_graph()
    bad = sorted(
        f"{src} -> {dst}"
        for src, dst in graph.edges
        if src not in MEETING_POINTS and layer(src) == "core" and layer(dst) != "core"
    )
    assert bad == []


def test_no_module_imports_a_module_that_imports_it_back():
    graph = import_graph()
    graph.remove_nodes_from([m for m in MEETING_POINTS if m != "colab_graphs"])
    # The package itself re-exports the public API; its submodules never import it.
    cycles = [c for c in nx.simple_cycles(graph) if "colab_graphs" not in c]
    assert cycles == []


def test_the_walker_sees_function_local_imports():
    graph = import_graph()
    assert graph.has_edge("colab_graphs.models.client", "colab_graphs.local.provider")  # in a function


def test_the_call_path_knows_local_inference_only_as_a_provider():
    doors = {dst for src, dst in import_graph().edges if package(src) == "models" and package(dst) == "local"}
    assert doors == {"colab_graphs.local.provider"}


def test_serving_and_the_adapters_stand_apart():
    edges = import_graph().edges
    assert not [(a, b) for a, b in edges if {package(a), package(b)} == {"serve", "langchain"}]
    assert not [(a, b) for a, b in edges if package(a) == "serve" and package(b) == "models"]
    assert not [(a, b) for a, b in edges if package(a) == "langchain" and package(b) in ("local", "serve")]
