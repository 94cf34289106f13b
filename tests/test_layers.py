"""Layers and cycles, read from the source: every import of every module, function-local imports included.

The core (spec, builder, coalition, compile, pool, trace, runner, registry, models/, data/, ...) stands on its
own: it imports nothing from the upper layers (protocols/, audit/, study/, trainers/, cli/, viewer/). The upper
layers use the core. `colab_graphs.builtins` (the package's own plugin, loaded through the registry's entry
point) and the public API module are where the layers meet. No module imports, at any depth, a module that
imports it back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "colab_graphs"
UPPER = ("protocols", "audit", "study", "trainers", "cli", "viewer")
MEETING_POINTS = {"colab_graphs", "colab_graphs.builtins", "colab_graphs.api"}


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
    assert graph.has_edge("colab_graphs.models.client", "colab_graphs.models.local")  # imported in a function
