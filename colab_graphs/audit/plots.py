"""Pictures of an audit: contribution bars with intervals, and individual vs compositional strength.

matplotlib is an optional extra (`pip install colab-graphs[plots]`), imported only when a plot is drawn.
Figures are drawn on matplotlib's Agg canvas directly, without pyplot, so plotting never changes the backend
or global state of a user's session and is safe from worker threads.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from colab_graphs.audit.report import AuditReport

CONTRIBUTIONS_PNG = "contributions.png"
SCATTER_PNG = "individual_vs_compositional.png"

# Okabe-Ito colours: distinguishable with the common forms of colour blindness.
_COLOURS = {"individual": "#999999", "loo": "#0072B2", "shapley": "#D55E00"}
_LABELS = {"individual": "Individual (alone)", "loo": "Leave-one-out", "shapley": "Shapley"}
_DPI = 150


def plots_available() -> bool:
    """Whether matplotlib is installed."""
    from importlib.util import find_spec

    return find_spec("matplotlib") is not None


def preload_plots() -> None:
    """Import matplotlib in a daemon thread (drawing later then finds it loaded); nothing when it is missing."""

    def load() -> None:
        with contextlib.suppress(ImportError):
            import matplotlib.figure  # noqa: F401

    threading.Thread(target=load, name="colab-graphs-plots", daemon=True).start()


def _new_figure(width: float, height: float) -> Any:
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "audit plots need matplotlib: pip install 'colab-graphs[plots]'", name=exc.name
        ) from exc
    return Figure(figsize=(width, height), layout="constrained")


def _subtitle(report: AuditReport) -> str:
    method = {"loo": "leave-one-out", "exact": "exact Shapley", "sampled": "sampled Shapley"}[report.method]
    return f"{report.n_examples} examples, {method}, {report.confidence:.0%} bootstrap intervals"


def _error_bars(report: AuditReport, measure: str, values: list[float]) -> list[list[float]]:
    # Asymmetric error bars from intervals; a missing interval draws no bar.
    low, high = [], []
    for member, value in zip(report.players, values, strict=True):
        interval = report.ci.get(member, {}).get(measure)
        low.append(value - interval[0] if interval else 0.0)
        high.append(interval[1] - value if interval else 0.0)
    return [low, high]


def _measures(report: AuditReport) -> dict[str, dict[str, float]]:
    found = {"individual": report.individual, "loo": report.loo, "shapley": report.shapley or {}}
    return {k: v for k, v in found.items() if set(v) == set(report.players)}


def plot_contributions(report: AuditReport, path: str | Path) -> Path:
    """Bars of each member's individual strength, leave-one-out and Shapley values, with interval whiskers.

    Args:
        report: The audit report.
        path: PNG file to write.

    Returns:
        The path written.
    """
    measures = _measures(report)
    players = report.players
    fig = _new_figure(max(6.0, 1.3 * len(players) + 2.5), 4.5)
    ax = fig.add_subplot()
    width = 0.8 / len(measures)
    for k, (measure, scores) in enumerate(measures.items()):
        values = [scores[p] for p in players]
        positions = [i + (k - (len(measures) - 1) / 2) * width for i in range(len(players))]
        ax.bar(
            positions,
            values,
            width * 0.95,
            yerr=_error_bars(report, measure, values),
            capsize=3,
            color=_COLOURS[measure],
            label=_LABELS[measure],
            error_kw={"elinewidth": 1, "ecolor": "#333333"},
        )
    ax.axhline(0.0, color="black", linewidth=0.8)
    grand = report.value_of(players)
    if grand is not None:
        ax.axhline(
            grand, color="#009E73", linestyle="--", linewidth=1, label=f"Team score v(all) = {grand:.3f}"
        )
    ax.set_xticks(range(len(players)), players, rotation=20 if len(players) > 5 else 0)
    ax.set_xlabel("Member")
    ax.set_ylabel("Score (mean over examples)")
    ax.set_title(f"Member contributions: {report.protocol}\n{_subtitle(report)}", fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, loc="best", frameon=False)
    path = Path(path)
    fig.savefig(path, dpi=_DPI)
    return path


def _label_points(ax: Any, names: list[str], x: list[float], y: list[float]) -> None:
    """Name each point, stacking labels of points that sit close together so they stay readable."""
    ax.autoscale_view()
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    placed: list[tuple[float, float]] = []
    for name, xi, yi in sorted(zip(names, x, y, strict=True), key=lambda t: (-t[2], t[1])):
        u, v = (xi - x0) / ((x1 - x0) or 1.0), (yi - y0) / ((y1 - y0) or 1.0)
        stacked = sum(1 for pu, pv in placed if abs(pu - u) < 0.15 and abs(pv - v) < 0.05)
        placed.append((u, v))
        ax.annotate(name, (xi, yi), xytext=(6, 4 - 11 * stacked), textcoords="offset points", fontsize=8)


def plot_individual_vs_compositional(report: AuditReport, path: str | Path) -> Path:
    """Scatter of each member's strength alone (x) against its contribution to the team (y).

    Shapley values are plotted when the report has them, leave-one-out values always; the dashed line y = x
    marks contribution equal to strength alone. The rank correlations are printed in the corner.

    Args:
        report: The audit report; it must hold individual strengths.
        path: PNG file to write.

    Returns:
        The path written.

    Raises:
        ValueError: When the report has no individual strength for some member.
    """
    measures = _measures(report)
    if "individual" not in measures:
        raise ValueError(
            "the report has no individual strengths for every member; nothing to compare against"
        )
    players = report.players
    x = [report.individual[p] for p in players]
    fig = _new_figure(6.0, 5.2)
    ax = fig.add_subplot()
    shown = [m for m in ("loo", "shapley") if m in measures]
    if len(shown) == 2:
        # One faint segment per member ties its two compositional measures together.
        for p, xi in zip(players, x, strict=True):
            ax.plot(
                [xi, xi], [measures["loo"][p], measures["shapley"][p]], color="#bbbbbb", linewidth=1, zorder=1
            )
    for measure in shown:
        y = [measures[measure][p] for p in players]
        ax.errorbar(
            x,
            y,
            xerr=_error_bars(report, "individual", x),
            yerr=_error_bars(report, measure, y),
            fmt={"loo": "s", "shapley": "o"}[measure],
            markersize=7,
            color=_COLOURS[measure],
            elinewidth=0.8,
            alpha=0.85,
            capsize=2,
            label=_LABELS[measure],
            zorder=2,
        )
    labelled = measures[shown[-1]]
    _label_points(ax, players, x, [labelled[p] for p in players])
    # axline spans the axes without widening them: individual strengths never go below zero.
    ax.axline((0.0, 0.0), slope=1.0, linestyle="--", color="#666666", linewidth=1, label="y = x")
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xlabel("Individual strength (score alone)")
    ax.set_ylabel("Compositional strength (contribution to the team)")
    ax.set_title(f"Individual vs compositional strength: {report.protocol}\n{_subtitle(report)}", fontsize=11)
    lines = []
    for measure, correlation in report.rank_correlation.items():
        rho = "undefined" if correlation.spearman is None else f"{correlation.spearman:+.2f}"
        tau = "undefined" if correlation.kendall is None else f"{correlation.kendall:+.2f}"
        lines.append(f"{_LABELS.get(measure, measure)}: Spearman {rho}, Kendall {tau}")
    if lines:
        ax.text(
            0.02,
            0.98,
            "\n".join(lines),
            transform=ax.transAxes,
            va="top",
            fontsize=8,
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8, "edgecolor": "#cccccc"},
        )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", frameon=False)
    path = Path(path)
    fig.savefig(path, dpi=_DPI)
    return path


def write_plots(report: AuditReport, out_dir: str | Path) -> dict[str, Path]:
    """Draw every plot the report supports into `out_dir`.

    Returns:
        Plot name -> path: "contributions" always, "individual_vs_compositional" when the report has
        individual strengths.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {"contributions": plot_contributions(report, out / CONTRIBUTIONS_PNG)}
    if "individual" in _measures(report):
        written["individual_vs_compositional"] = plot_individual_vs_compositional(report, out / SCATTER_PNG)
    return written
