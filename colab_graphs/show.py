"""Drawing a GraphSpec: mermaid (for docs) and a terminal tree (rich)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from colab_graphs.spec import END, START, Aggregate, GraphSpec, LogitSeat, Seat

if TYPE_CHECKING:
    from rich.tree import Tree


def _label(node: Seat | LogitSeat | Aggregate) -> str:
    if isinstance(node, Seat):
        return f"{node.name}\\n[{node.member}]"
    if isinstance(node, LogitSeat):
        return f"{node.name}\\n[{node.mode}: {', '.join(node.members)}]"
    return f"{node.name}\\n({node.fn})"


def render_mermaid(spec: GraphSpec) -> str:
    """A mermaid flowchart: seats as rounded boxes, aggregators as hexagons, joins and routes labelled."""
    ids = {START: "start", END: "stop"}
    lines = ["flowchart TD", "  start([START])", "  stop([END])"]
    for i, node in enumerate(spec.nodes):
        ids[node.name] = f"n{i}"
        text = _label(node).replace('"', "'")
        shape = ('{{"', '"}}') if isinstance(node, Aggregate) else ('("', '")')
        lines.append(f"  n{i}{shape[0]}{text}{shape[1]}")
    for e in spec.edges:
        style = " -. join .-> " if len(e.sources) > 1 else " --> "
        for s in e.sources:
            lines.append(f"  {ids[s]}{style}{ids[e.target]}")
    for r in spec.routes:
        for key, target in r.path_map.items():
            lines.append(f"  {ids[r.source]} -- {key} --> {ids[target]}")
        if r.max_visits and r.exit:
            lines.append(f"  {ids[r.source]} -- after {r.max_visits} --> {ids[r.exit]}")
    return "\n".join(lines)


def render_tree(spec: GraphSpec) -> Tree:
    """A rich Tree: each node with its member, reads and writes, then successors."""
    from rich.markup import escape
    from rich.tree import Tree

    root = Tree(f"[bold]{spec.name}[/] members: {', '.join(spec.members)}  output: {spec.output}")
    succ: dict[str, list[str]] = {}
    for e in spec.edges:
        for s in e.sources:
            succ.setdefault(s, []).append(e.target + (" (join)" if len(e.sources) > 1 else ""))
    for r in spec.routes:
        for key, target in r.path_map.items():
            succ.setdefault(r.source, []).append(f"{target} if {r.fn}={key}")
    root.add(f"START -> {', '.join(succ.get(START, []))}")
    for node in spec.nodes:
        if isinstance(node, Seat):
            head = f"[cyan]{node.name}[/] seat " + escape(f"[{node.member}]") + f" on_absent={node.on_absent}"
        elif isinstance(node, LogitSeat):
            head = f"[magenta]{node.name}[/] logit {node.mode} " + escape(f"[{', '.join(node.members)}]")
        else:
            head = f"[green]{node.name}[/] aggregate {node.fn}"
        branch = root.add(head)
        if node.reads:
            branch.add(escape("reads " + ", ".join(f"{k}<-{v}" for k, v in node.reads.items())))
        branch.add(f"writes {node.writes}")
        branch.add("-> " + ", ".join(succ.get(node.name, ["(none)"])))
    return root
