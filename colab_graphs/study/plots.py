"""Pictures of a study: a heatmap of correlations (pool x family) and a scatter grid of the pairs behind them.

Drawn on matplotlib's Agg canvas without pyplot (as the audit plots), so plotting changes no global state.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from colab_graphs.audit.plots import _new_figure

if TYPE_CHECKING:
    from colab_graphs.study.report import StudyReport

HEATMAP_PNG = "study-heatmap.png"
SCATTER_PNG = "study-scatter.png"
_DPI = 150
# Okabe-Ito colours, one per protocol (cycled), distinguishable with the common forms of colour blindness.
_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]  # one per dataset (cycled)


def _families(report: StudyReport) -> list[str]:
    return list(dict.fromkeys(c.family for c in report.correlations if c.family != "all")) + ["all"]


def plot_heatmap(report: StudyReport, path: str | Path) -> Path:
    """Spearman's rho per (pool, family), annotated with rho, p and the number of pairs; blank = undefined."""
    import numpy as np

    pools, families = list(report.pools), _families(report)
    cells = {(c.pool, c.family): c for c in report.correlations}
    grid = np.full((len(pools), len(families)), np.nan)
    fig = _new_figure(max(4.5, 1.6 * len(families) + 2.0), max(2.5, 0.8 * len(pools) + 1.5))
    ax = fig.add_subplot()
    for i, pool in enumerate(pools):
        for j, family in enumerate(families):
            c = cells.get((pool, family))
            if c is None:
                continue
            if c.spearman is not None:
                grid[i, j] = c.spearman
            p = "p n/a" if c.p_value is None else f"p={c.p_value:.2g}"
            rho = "n/a" if c.spearman is None else f"{c.spearman:+.2f}"
            ax.text(j, i, f"{rho}\n{p}\nn={c.n_pairs}", ha="center", va="center", fontsize=8)
    image = ax.imshow(grid, cmap="RdBu_r", vmin=-1.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(families)), families)
    ax.set_yticks(range(len(pools)), pools)
    ax.set_xlabel("protocol family")
    ax.set_ylabel("pool")
    measure = "Shapley" if report.measure == "shapley" else "leave-one-out"
    ax.set_title(f"Spearman rho: individual vs {measure}", fontsize=10)
    fig.colorbar(image, ax=ax, shrink=0.8)
    path = Path(path)
    fig.savefig(path, dpi=_DPI)
    return path


def plot_scatter_grid(report: StudyReport, path: str | Path) -> Path:
    """One panel per (pool, family): each (member, protocol, dataset) as a point, coloured by protocol and
    shaped by dataset."""
    pools, families = list(report.pools), _families(report)[:-1]
    protocols = list(dict.fromkeys(s.protocol for s in report.settings))
    colour = {p: _COLOURS[i % len(_COLOURS)] for i, p in enumerate(protocols)}
    datasets = list(dict.fromkeys(s.dataset for s in report.settings))
    marker = {d: _MARKERS[i % len(_MARKERS)] for i, d in enumerate(datasets)}
    fig = _new_figure(3.0 * len(families) + 1.5, 2.8 * len(pools) + 0.6)
    axes: dict[tuple[int, int], Any] = {}
    for i, pool in enumerate(pools):
        for j, family in enumerate(families):
            ax = axes[(i, j)] = fig.add_subplot(len(pools), len(families), i * len(families) + j + 1)
            ax.axhline(0.0, color="#cccccc", linewidth=0.8)
            ax.set_title(f"{pool} / {family}", fontsize=9)
            ax.tick_params(labelsize=7)
            if i == len(pools) - 1:
                ax.set_xlabel("individual", fontsize=8)
            if j == 0:
                ax.set_ylabel(report.measure, fontsize=8)
    for s in report.settings:
        if s.error is not None or (s.pool, s.family) not in {(p, f) for p in pools for f in families}:
            continue
        comp = (s.shapley if report.measure == "shapley" else s.loo) or {}
        ax = axes[(pools.index(s.pool), families.index(s.family))]
        xs = [s.individual[m] for m in s.members if m in s.individual and m in comp]
        ys = [comp[m] for m in s.members if m in s.individual and m in comp]
        label = f"{s.protocol} / {s.dataset}"
        ax.scatter(xs, ys, s=22, color=colour[s.protocol], marker=marker[s.dataset], label=label, alpha=0.8)
    handles = {}
    for ax in axes.values():
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(3, len(handles)),
                   fontsize=8)  # fmt: skip
    path = Path(path)
    fig.savefig(path, dpi=_DPI)
    return path


def write_plots(report: StudyReport, out: str | Path) -> dict[str, Path]:
    """Draw both figures into `out`; returns name -> path."""
    out = Path(out)
    return {
        "heatmap": plot_heatmap(report, out / HEATMAP_PNG),
        "scatter": plot_scatter_grid(report, out / SCATTER_PNG),
    }
