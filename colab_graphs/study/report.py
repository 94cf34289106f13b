"""`study.json` (the contract other tools read) and `study.md` (the paper-style table, heatmap and scatter grid).

One row per setting (pool, protocol, dataset) with the values of its audit, and one correlation row per (pool,
protocol family) plus one per pool over all families: the rank correlation, over (member, protocol, dataset)
pairs, between a member's individual strength on a dataset and its compositional strength in a protocol on that
dataset (Shapley when the study computes it, else leave-one-out).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from colab_graphs.audit.report import AuditReport, Calls, write_atomic
from colab_graphs.log.records import package_version
from colab_graphs.sandbox.scope import describe
from colab_graphs.study.stats import pair_correlation

SCHEMA_VERSION = 1
STUDY_JSON = "study.json"
STUDY_MD = "study.md"
ALPHA = 0.05
# Fields that describe a run (where, when, how long), not the study's results.
RUN_FIELDS = {
    "version",
    "created_at",
    "backend",
    "workers",
    "shards",
    "worker_cpu_s",
    "retried_shards",
    "wall_s",
}


# The columns of `StudyReport.rows()`, in order: one row per (setting, member).
STUDY_COLUMNS = ("pool", "protocol", "family", "dataset", "v_all", "member", "individual", "loo", "shapley")


class SettingResult(BaseModel):
    """One audit of the study. Values are mean scores in [0, 1]; contributions may be negative."""

    model_config = ConfigDict(extra="allow")

    pool: str
    protocol: str
    family: str
    dataset: str
    members: list[str]
    params: dict[str, Any] = Field(default_factory=dict)
    n_examples: int = 0
    failed_examples: int = 0
    v_all: float | None = None
    individual: dict[str, float] = Field(default_factory=dict)
    loo: dict[str, float] = Field(default_factory=dict)
    shapley: dict[str, float] | None = None
    error: str | None = Field(None, description="Why the setting has no values (every example failed)")
    audit: str = Field(description="The setting's audit folder, relative to the study folder")


class CorrelationRow(BaseModel):
    """Individual vs compositional strength over one pool's (member, protocol, dataset) pairs of one family."""

    pool: str
    family: str
    measure: Literal["shapley", "loo"]
    n_pairs: int
    spearman: float | None = None
    kendall: float | None = None
    p_value: float | None = Field(None, description="Spearman's two-sided p-value (t approximation)")
    significant: bool | None = None


class StudyReport(BaseModel):
    """The whole study: `settings`, `correlations`, `calls`, `wall_s` (see the module docstring)."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION
    version: str = Field(default_factory=package_version)
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    method: Literal["loo", "exact", "sampled"]
    measure: Literal["shapley", "loo"]
    alpha: float = ALPHA
    pools: dict[str, list[str]]
    protocols: list[dict[str, Any]]
    datasets: list[dict[str, Any]]
    settings: list[SettingResult]
    correlations: list[CorrelationRow]
    calls: Calls
    backend: str = "in-process"
    workers: int = 1
    shards: int = 1
    worker_cpu_s: float | None = Field(
        None, description="Ray workers' CPU seconds on the shards they returned"
    )
    retried_shards: int = Field(0, description="Shards played again because their worker died")
    wall_s: float = 0.0
    sandbox: dict[str, Any] | None = Field(
        None,
        description="code scores only: the sandbox the code ran under, {setting, backend, safe, isolation} "
        "(`colab_graphs.sandbox.scope`); absent from study.json otherwise",
    )

    def comparable(self) -> dict[str, Any]:
        """What two runs of the same study must agree on, whatever ran them and however long it took."""
        return self.model_dump(mode="json", exclude=RUN_FIELDS)

    def rows(self) -> list[dict[str, Any]]:
        """One row per (setting, member): where (pool, protocol, family, dataset), the setting's v(all), and
        the member's individual strength, LOO and Shapley (None where not computed)."""
        return [
            {
                "pool": st.pool,
                "protocol": st.protocol,
                "family": st.family,
                "dataset": st.dataset,
                "v_all": st.v_all,
                "member": m,
                "individual": st.individual.get(m),
                "loo": st.loo.get(m),
                "shapley": (st.shapley or {}).get(m),
            }
            for st in self.settings
            for m in st.members
        ]

    def to_pandas(self) -> Any:
        """`rows()` as a `pandas.DataFrame` (needs the `notebook` extra)."""
        from colab_graphs.tables import to_pandas

        return to_pandas(self.rows(), STUDY_COLUMNS)

    def to_dataset(self) -> Any:
        """`rows()` as a Hugging Face `datasets.Dataset` (needs the `notebook` extra)."""
        from colab_graphs.tables import to_dataset

        return to_dataset(self.rows(), STUDY_COLUMNS)

    def _repr_html_(self) -> str:
        from colab_graphs.tables import html_table

        notes = [
            f"{c.pool}, {c.family}: Spearman {'n/a' if c.spearman is None else f'{c.spearman:+.2f}'} over "
            f"{c.n_pairs} pair(s) ({c.measure})"
            for c in self.correlations
        ]
        return html_table(f"Study: {len(self.settings)} setting(s)", self.rows(), STUDY_COLUMNS, notes)


def setting_result(
    setting: Any, report: AuditReport | None, n_examples: int, error: str | None
) -> SettingResult:
    """A study row from a setting (`colab_graphs.study.plan.Setting`) and its audit report (None if failed)."""
    row = SettingResult(
        pool=setting.pool,
        protocol=setting.protocol,
        family=setting.family,
        dataset=setting.dataset,
        members=list(setting.spec.members),
        params=setting.params,
        n_examples=n_examples,
        error=error,
        audit=setting.folder,
    )
    if report is None:
        row.failed_examples = n_examples
        return row
    row.failed_examples = len(report.failed_examples)
    row.v_all = report.value_of(report.players)
    row.individual, row.loo, row.shapley = report.individual, report.loo, report.shapley
    return row


def correlation_rows(
    settings: Sequence[SettingResult], measure: Literal["shapley", "loo"], alpha: float = ALPHA
) -> list[CorrelationRow]:
    """One row per (pool, family) in order of first appearance, then one per pool over every family ("all")."""
    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in settings:
        if s.error is not None:
            continue
        compositional = s.shapley if measure == "shapley" else s.loo
        pairs = [
            (s.individual[m], compositional[m]) for m in s.members if m in s.individual and compositional
        ]
        groups.setdefault((s.pool, s.family), []).extend(pairs)
        groups.setdefault((s.pool, "all"), []).extend(pairs)
    ordered = [k for k in groups if k[1] != "all"] + [k for k in groups if k[1] == "all"]
    rows = []
    for pool, family in ordered:
        pairs = groups[(pool, family)]
        corr = pair_correlation([p[0] for p in pairs], [p[1] for p in pairs])
        p = corr["p_value"]
        rows.append(
            CorrelationRow(
                pool=pool,
                family=family,
                measure=measure,
                n_pairs=len(pairs),
                **corr,
                significant=None if p is None else p < alpha,
            )
        )
    return rows


def _num(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def render_markdown(report: StudyReport, images: Mapping[str, str] | None = None) -> str:
    """The study as a page: the finding, the correlation table, the settings, calls, and the figures."""
    r = report
    measure = {"shapley": "Shapley value", "loo": "leave-one-out"}[r.measure]
    by_family = [c for c in r.correlations if c.family != "all"]
    tested = [c for c in by_family if c.p_value is not None]
    not_significant = [c for c in tested if not c.significant]
    lines = ["# Study: individual vs compositional strength", ""]
    lines.append(
        f"**{len(not_significant)} of {len(tested)} settings (pool x protocol family) show no significant "
        f"correlation** (Spearman, two-sided, alpha = {r.alpha}) between a member's individual strength and "
        f"its compositional strength ({measure}), over (member, protocol, dataset) pairs."
    )
    undefined = len(by_family) - len(tested)
    if undefined:
        lines.append(
            f"{undefined} more have too few pairs or a constant side, where the correlation is undefined."
        )
    lines += ["", f"{len(r.pools)} pool(s), {len(r.protocols)} protocol(s), {len(r.datasets)} dataset(s), "
              f"method `{r.method}`; {len(r.settings)} audits.", ""]  # fmt: skip
    lines += ["## Correlations", ""]
    lines += _table(
        ["Pool", "Family", "Pairs", "Spearman rho", "Kendall tau-b", "p-value", "Significant"],
        [
            [c.pool, c.family, str(c.n_pairs), _num(c.spearman, True), _num(c.kendall, True),
             "n/a" if c.p_value is None else f"{c.p_value:.3g}",
             "n/a" if c.significant is None else ("yes" if c.significant else "no")]
            for c in r.correlations
        ],
    )  # fmt: skip
    lines += ["", "## Settings", ""]
    rows = []
    for s in r.settings:
        comp = s.shapley if r.measure == "shapley" else s.loo
        members = ", ".join(
            f"{m} {_num(s.individual.get(m))}/{_num((comp or {}).get(m), True)}" for m in s.members
        )
        rows.append([s.pool, s.protocol, s.family, s.dataset, _num(s.v_all), s.error or members, s.audit])
    lines += _table(
        ["Pool", "Protocol", "Family", "Dataset", "v(all)", f"member individual/{r.measure}", "Audit"], rows
    )
    c = r.calls
    lines += [
        "",
        "## Calls",
        "",
        f"Calls made {c.made} (distinct requests {c.unique}), served from cache {c.cached}, failed {c.failed}; "
        f"{r.backend}, {r.workers} worker(s), {r.shards} shard(s); {r.wall_s:.1f} s.",
    ]
    if r.sandbox:
        lines += ["", f"Code was scored in the sandbox: {describe(r.sandbox)}."]
    for name, file in (images or {}).items():
        lines += ["", f"![{name}]({file})"]
    return "\n".join(lines) + "\n"


def write_study(
    report: StudyReport, out: str | Path, *, images: dict[str, Path] | None = None
) -> dict[str, Path]:
    """Write `study.json` and `study.md` (showing `images`, the plots `study.plots.write_plots` drew) under
    `out`; returns name -> path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    images = dict(images or {})
    exclude = {"sandbox"} if report.sandbox is None else None  # (a study without code scores is as it was)
    write_atomic(out / STUDY_JSON, report.model_dump_json(indent=2, exclude=exclude) + "\n")
    write_atomic(out / STUDY_MD, render_markdown(report, {name: p.name for name, p in images.items()}))
    return {**images, "json": out / STUDY_JSON, "md": out / STUDY_MD}


def read_study(path: str | Path) -> StudyReport:
    """Read `study.json` (or the folder holding it) and validate it."""
    path = Path(path)
    if path.is_dir():
        path = path / STUDY_JSON
    return StudyReport.model_validate(json.loads(path.read_text(encoding="utf-8")))
