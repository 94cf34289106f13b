"""The audit report: one versioned, typed record (`report.json`) that every tool reads, and its markdown view.

`contribution_fields` turns evaluated coalition values into the report's contribution fields (coalition
values, individual strengths, leave-one-out and Shapley values, intervals, ranks and rank correlations); the
game adds calls, tokens, cost and timing and builds an `AuditReport`. `write_report` writes `report.json` and
`report.md` (and optionally the plots); `read_report` reads a report back and validates it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, model_validator

from colab_graphs.audit.estimators import (
    Coalition,
    CoalitionPlan,
    Estimates,
    bootstrap_mean_ci,
    estimate,
    rank_correlation,
    ranks,
)
from colab_graphs.files import atomic_write_text
from colab_graphs.log.records import package_version
from colab_graphs.redaction import hide_secrets
from colab_graphs.sandbox.scope import describe

SCHEMA_VERSION = 1
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
SHOWN_COALITIONS = 64  # rows of the markdown's coalition table (report.json lists every one)


class TokenCount(BaseModel):
    """Prompt and completion tokens."""

    prompt: int = 0
    completion: int = 0

    @computed_field
    @property
    def total(self) -> int:
        return self.prompt + self.completion


class MemberUsage(BaseModel):
    """What one member's calls cost: the calls made (cache hits excluded), their tokens and price."""

    calls: int = 0
    tokens: TokenCount = Field(default_factory=TokenCount)
    cost_usd: float | None = Field(None, description="None when a price is unknown")


class CoalitionValue(BaseModel):
    """v(S): the mean score over examples of the protocol run with only these members."""

    members: list[str]
    value: float


class CoalitionUsage(BaseModel):
    """What evaluating one coalition on its own would take: every call its runs needed, made or cached."""

    members: list[str]
    calls: int = 0
    tokens: TokenCount = Field(default_factory=TokenCount)
    cost_usd: float | None = None


class Calls(BaseModel):
    """Model calls of the whole audit.

    Attributes:
        made: Calls sent to a model (retries of one request count once).
        unique: Distinct requests, the least any evaluation can make.
        cached: Requests served from the cache.
        failed: Requests that failed after retries.
        naive: Calls a naive evaluation would make: every coalition run separately, with no cache.
    """

    made: int = 0
    unique: int = 0
    cached: int = 0
    failed: int = 0
    naive: int | None = None


class SamplingInterval(BaseModel):
    """What a sampled estimate's sampling intervals (`sampling_error`) hold.

    `kind` "member": each member's interval holds its exact value with probability `level`; "simultaneous":
    all members' intervals hold at once with probability at least `level` (Bonferroni: each member's at
    `member_level` = 1 - (1 - level) / n).
    """

    kind: Literal["member", "simultaneous"]
    level: float
    member_level: float


class Correlation(BaseModel):
    """Rank correlation between individual and compositional strength; None where undefined."""

    spearman: float | None = None
    kendall: float | None = None


class AuditReport(BaseModel):
    """A contribution audit: each member's individual and compositional strength, with uncertainty and cost.

    Values are mean scores in [0, 1] (contributions may be negative). Member-keyed mappings follow pool order.
    `ci` maps member -> measure ("individual", "loo", "shapley") -> [low, high]; `ranks` maps measure ->
    member -> rank (1 = best); `rank_correlation` maps "loo"/"shapley" -> its correlation with individual
    strength. Fields added by later versions are kept when an older reader loads a newer file.
    """

    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION
    version: str = Field(default_factory=package_version)
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    protocol: str
    protocol_params: dict[str, Any] = Field(default_factory=dict)
    players: list[str]
    scorer: str | None = Field(None, description="the scorer named (--scorer); None: each record's default")
    scored_by: list[str] = Field(
        default_factory=list,
        description="the scorers the examples were scored by (the named one, or defaults)",
    )
    dataset: str | None = None
    n_examples: int
    failed_examples: list[str] = Field(default_factory=list)
    errors: dict[str, str] = Field(
        default_factory=dict, description="failed example -> the error of its first failed play"
    )
    notes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="a routing node that fell back for want of what it decides from (a cascade's stated "
        "confidence): {node, note, decisions, of} over the coalitions' plays (`colab_graphs.mechanism`)",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="the notes that fired on every decision, in words: values to distrust",
    )
    ended_by_absent: list[dict[str, Any]] = Field(
        default_factory=list,
        description="an app's plays ended by an uncaught MemberAbsent: {member, node, plays, coalitions} "
        "(scored as empty answers)",
    )
    method: Literal["loo", "exact", "sampled"]
    shapley_method: Literal["exact", "sampled"] | None = None
    shapley_estimator: str | None = Field(
        None,
        description="exact | exact_from_answers (computed from the members' answers) | stratified | permutation",
    )
    shapley_adjustment: str | None = Field(
        None,
        description="stratified, not exact: what was subtracted before sampling, chosen from the played "
        "coalitions: plain | control variate | surrogate | control variate + surrogate | monotone completion",
    )
    sampling_error: dict[str, float] | None = Field(
        None,
        description="member -> half-width of the sampling interval `sampling_interval` describes (None when "
        "exact); `ci[m]['shapley']` is the example-noise interval, apart",
    )
    sampling_interval: SamplingInterval | None = Field(
        None, description="with `sampling_error`: per member or all members at once, and its level"
    )
    n_permutations: int | None = None
    budget: int | None = None
    budget_unit: str | None = None
    target_error: float | None = None
    stopped: str | None = Field(
        None, description="why sampling stopped: target_error | budget | complete | coalitions"
    )
    coalitions_valued: int | None = Field(
        None, description="coalitions with a value (all 2^n from answers), when more than `coalitions` lists"
    )
    partial: bool = Field(False, description="a cap stopped the audit: values over the examples finished")
    cap: dict[str, Any] | None = Field(
        None, description="the cap reached: {cap, limit, calls, cost_usd} (calls and cost: what the run sent)"
    )
    examples_planned: int | None = None
    coalitions: list[CoalitionValue]
    individual: dict[str, float] = Field(default_factory=dict)
    loo: dict[str, float]
    shapley: dict[str, float] | None = None
    confidence: float = 0.95
    n_boot: int = 1000
    ci: dict[str, dict[str, tuple[float, float]]] = Field(default_factory=dict)
    ranks: dict[str, dict[str, int]] = Field(default_factory=dict)
    rank_correlation: dict[str, Correlation] = Field(default_factory=dict)
    calls: Calls = Field(default_factory=Calls)
    tokens: TokenCount = Field(default_factory=TokenCount)
    cost_usd: float | None = Field(
        None, description="What the calls made cost (0.0 when none was made); None when a price is unknown"
    )
    cost_saved_usd: float | None = Field(
        0.0, description="What the calls served without a call of their own cost when made; None when unknown"
    )
    usage: dict[str, MemberUsage] = Field(default_factory=dict)
    per_coalition: list[CoalitionUsage] = Field(default_factory=list)
    wall_s: float = 0.0
    sandbox: dict[str, Any] | None = Field(
        None,
        description="code scores only: the sandbox the code ran under, {setting, backend, safe, isolation} "
        "(`colab_graphs.sandbox.scope`); absent from report.json otherwise",
    )

    @model_validator(mode="after")
    def _members_are_players(self) -> AuditReport:
        if not self.players or len(set(self.players)) != len(self.players):
            raise ValueError(f"players must be distinct and non-empty, got {self.players}")
        if (self.shapley is None) != (self.shapley_method is None):
            raise ValueError("shapley and shapley_method must be given together")
        known = set(self.players)
        named: dict[str, set[str]] = {
            "individual": set(self.individual),
            "loo": set(self.loo),
            "shapley": set(self.shapley or {}),
            "ci": set(self.ci),
            "usage": set(self.usage),
            "coalitions": {m for c in self.coalitions for m in c.members},
            "per_coalition": {m for c in self.per_coalition for m in c.members},
            **{f"ranks.{measure}": set(by_member) for measure, by_member in self.ranks.items()},
        }
        for field, members in named.items():
            unknown = sorted(members - known)
            if unknown:
                raise ValueError(
                    f"field {field!r} names members {unknown} that are not players {self.players}"
                )
        return self

    def value_of(self, members: list[str] | set[str] | frozenset[str]) -> float | None:
        """v(S) for a coalition, if it was evaluated."""
        wanted = set(members)
        return next((c.value for c in self.coalitions if set(c.members) == wanted), None)

    def rows(self) -> list[dict[str, Any]]:
        """One row per member (pool order): individual, LOO and Shapley values with their interval bounds,
        ranks, and the calls, tokens and cost of the member's calls made."""
        rows = []
        for m in self.players:
            row: dict[str, Any] = {"member": m}
            for measure, values in (
                ("individual", self.individual),
                ("loo", self.loo),
                ("shapley", self.shapley),
            ):
                low, high = self.ci.get(m, {}).get(measure, (None, None))
                row |= {measure: (values or {}).get(m), f"{measure}_low": low, f"{measure}_high": high}
                row[f"rank_{measure}"] = self.ranks.get(measure, {}).get(m)
            usage = self.usage.get(m, MemberUsage())
            row |= {"calls": usage.calls, "tokens": usage.tokens.total, "cost_usd": usage.cost_usd}
            rows.append(row)
        return rows

    def to_pandas(self) -> Any:
        """The members as a `pandas.DataFrame` (`rows()`; needs the `notebook` extra)."""
        from colab_graphs.tables import to_pandas

        return to_pandas(self.rows(), MEMBER_COLUMNS)

    def to_dataset(self) -> Any:
        """The members as a Hugging Face `datasets.Dataset` (`rows()`; needs the `notebook` extra)."""
        from colab_graphs.tables import to_dataset

        return to_dataset(self.rows(), MEMBER_COLUMNS)

    def _repr_html_(self) -> str:
        from colab_graphs.tables import html_table

        columns = ["member", "individual", "loo", "loo_low", "loo_high"]
        if self.shapley is not None:
            columns += ["shapley", "shapley_low", "shapley_high"]
        grand = self.value_of(self.players)
        c = self.calls
        notes = [
            f"v(all) = {'n/a' if grand is None else f'{grand:.3f}'} over {self.n_examples} example(s); "
            f"method {self.method}; calls made {c.made} (distinct {c.unique}, cached {c.cached}, failed {c.failed})"
        ]
        return html_table(f"Contribution audit: {self.protocol}", self.rows(), columns, notes)


# The columns of `AuditReport.rows()`, in order: one row per member.
MEMBER_COLUMNS = (
    "member",
    "individual",
    "individual_low",
    "individual_high",
    "rank_individual",
    "loo",
    "loo_low",
    "loo_high",
    "rank_loo",
    "shapley",
    "shapley_low",
    "shapley_high",
    "rank_shapley",
    "calls",
    "tokens",
    "cost_usd",
)


def contribution_fields(
    plan: CoalitionPlan,
    values: Mapping[Coalition, np.ndarray],
    individual: Mapping[str, np.ndarray] | None = None,
    *,
    shapley: Estimates | None = None,
    listed: Sequence[Coalition] | None = None,
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """The report fields that follow from the game's values, ready for `AuditReport(**fields, ...)`.

    Args:
        plan: The plan the values were evaluated for.
        values: Coalition -> per-example scores (the empty coalition scores zero unless given).
        individual: Member -> per-example scores of the member alone (the `solo` protocol).
        shapley: Shapley estimates computed elsewhere (stratified sampling, the game from answers); default:
            `estimate(plan, values)` unless the plan is leave-one-out.
        listed: The coalitions the report lists (default: the plan's).
        n_boot: Bootstrap replicates for the intervals.
        confidence: Interval level.
        seed: Bootstrap seed; every measure resamples with it.

    Returns:
        method, shapley_method, shapley_estimator, shapley_adjustment, sampling_error, sampling_interval, n_permutations,
        n_examples, coalitions,
        individual, loo, shapley, confidence, n_boot, ci, ranks and rank_correlation.
    """
    boot = {"n_boot": n_boot, "confidence": confidence, "seed": seed}
    loo = estimate(plan, values, method="loo", **boot)
    if shapley is None and plan.method != "loo":
        shapley = estimate(plan, values, **boot)
    n_examples = len(next(iter(loo.per_player.values())).per_example)

    ci: dict[str, dict[str, tuple[float, float]]] = {p: {"loo": loo.intervals()[p]} for p in plan.players}
    strengths: dict[str, float] = {}
    for member, scores in (individual or {}).items():
        scores = np.asarray(scores, dtype=float)
        strengths[member] = float(scores.mean())
        ci[member]["individual"] = bootstrap_mean_ci(scores, **boot)
    if shapley is not None:
        for p, interval in shapley.intervals().items():
            ci[p]["shapley"] = interval
            if shapley.sampling_error is not None:
                value, half = shapley[p].value, shapley.sampling_error[p]
                ci[p]["shapley_sampling"] = (value - half, value + half)

    measures = {"loo": loo.values(), **({"shapley": shapley.values()} if shapley else {})}
    correlations = (
        {name: Correlation(**rank_correlation(strengths, scores)) for name, scores in measures.items()}
        if set(strengths) == set(plan.players)
        else {}
    )
    zeros = np.zeros(n_examples)
    return {
        "method": plan.method,
        "shapley_method": None if shapley is None else "exact" if shapley.exact else "sampled",
        "shapley_estimator": None if shapley is None else shapley.estimator,
        "shapley_adjustment": None if shapley is None else shapley.adjustment,
        "sampling_error": None if shapley is None else shapley.sampling_error,
        "sampling_interval": None if shapley is None else sampling_interval(shapley),
        "n_permutations": len(plan.permutations) or None,
        "n_examples": n_examples,
        "coalitions": [
            CoalitionValue(
                members=[p for p in plan.players if p in c],
                value=float(np.mean(values.get(c, zeros))),
            )
            for c in (plan.coalitions if listed is None else listed)
        ],
        "individual": strengths,
        "loo": measures["loo"],
        "shapley": measures.get("shapley"),
        "confidence": confidence,
        "n_boot": n_boot,
        "ci": ci,
        "ranks": {
            name: ranks(scores) for name, scores in {"individual": strengths, **measures}.items() if scores
        },
        "rank_correlation": correlations,
    }


def sampling_interval(shapley: Estimates) -> SamplingInterval | None:
    """What the estimates' sampling intervals hold (None when they have none: exact values)."""
    if shapley.sampling_error is None:
        return None
    kind: Literal["member", "simultaneous"] = "simultaneous" if shapley.simultaneous else "member"
    return SamplingInterval(kind=kind, level=shapley.confidence, member_level=shapley.member_level)


def describe_sampling(interval: SamplingInterval | None) -> str:
    """The sampling interval in words, for report.md and the terminal."""
    if interval is None or interval.kind == "member":
        level = 0.95 if interval is None else interval.level
        return f"the {level:.0%} sampling interval of each member"
    return (
        f"the {interval.level:.0%} simultaneous sampling interval (all members at once; Bonferroni, each "
        f"member's at {interval.member_level:.2%})"
    )


def usd(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.4f}"


def cost_sentence(spent: float | None, made: int, saved: float | None, cached: int) -> str:
    """The one way cost is told (report.md, the terminal): what the calls made cost, then what the calls
    served from the cache (or shared) would have cost. "unknown" where a price is unknown."""
    text = f"Cost: {usd(spent)} for {made} call(s) made."
    if cached:
        text += f" Served {cached} call(s) without a model call, which cost {usd(saved)} when made."
    return text


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _rank(by_member: dict[str, int], member: str) -> str:
    """A member's rank, "2=" where another member shares it (a tie, within `estimators.TIE_TOL`)."""
    rank = by_member.get(member)
    if rank is None:
        return "n/a"
    return f"{rank}=" if list(by_member.values()).count(rank) > 1 else str(rank)


def _scorer(r: AuditReport) -> str:
    """The scorer named, else the records' defaults (a report from before `scored_by` says n/a)."""
    if r.scorer:
        return r.scorer
    if r.scored_by:
        return f"{', '.join(r.scored_by)} (the records' default, from their fields)"
    return "n/a"


def _score(value: float | None, interval: tuple[float, float] | None = None, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    text = f"{value:+.3f}" if signed else f"{value:.3f}"
    return f"{text} [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else text


def _correlation(value: float | None) -> str:
    return "undefined" if value is None else f"{value:+.2f}"


def _coalition_name(members: list[str]) -> str:
    return "{" + ", ".join(members) + "}" if members else "{} (no members)"


def _table(header: list[str], align: str, rows: list[list[str]]) -> list[str]:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join({"l": ":---", "r": "---:", "c": ":---:"}[a] for a in align) + "|",
    ]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]


def _troubles(r: AuditReport) -> list[str]:
    """The report's lines on failed examples (their errors) and plays an absent member ended."""
    lines: list[str] = []
    if r.errors:
        lines += ["", "## Failed examples", "", "Left out of every value (not scored):", ""]
        lines += [f"- `{example}`: {error}" for example, error in r.errors.items()]
    if r.ended_by_absent:
        lines += ["", "## Plays ended by an absent member", ""]
        lines.append(
            "An uncaught `MemberAbsent` ended these plays; each scored as an empty answer (the app's contract)."
        )
        lines.append("")
        for entry in r.ended_by_absent:
            where = f" at node `{entry['node']}`" if entry.get("node") else ""
            coalitions = "; ".join(", ".join(c) or "nobody" for c in entry.get("coalitions", []))
            lines.append(f"- `{entry['member']}`{where}: {entry['plays']} play(s), coalitions: {coalitions}")
    return lines


def render_markdown(report: AuditReport, images: Mapping[str, str] | None = None) -> str:
    """The report as a readable markdown page.

    Args:
        report: The audit report.
        images: Plot name -> file name relative to the page, shown at the end.
    """
    r = report
    method = {"loo": "leave-one-out", "exact": "exact Shapley", "sampled": "sampled Shapley"}[r.method]
    estimator = {
        "exact_from_answers": "exact Shapley computed from the members' answers",
        "stratified": "stratified sampling with a control variate",
        "permutation": f"{r.n_permutations} permutations",
        "exact": "exact Shapley",
    }.get(r.shapley_estimator or "", "")
    if estimator:
        method += f" ({estimator}" + (f", stopped: {r.stopped}" if r.stopped else "") + ")"
    grand = r.value_of(r.players)
    params = ", ".join(f"`{k}={v!r}`" for k, v in r.protocol_params.items()) or "defaults"
    failed = f" ({len(r.failed_examples)} failed and excluded)" if r.failed_examples else ""
    lines = [f"# Contribution audit: `{r.protocol}`", ""]
    if r.partial:
        cap = r.cap or {}
        lines += [
            f"**Partial**: {cap.get('cap')} {cap.get('limit')} was reached. Values are over the {r.n_examples} of "
            f"{r.examples_planned} examples every coalition finished; run the same command with a higher cap "
            "(or none) to finish the audit.",
            "",
        ]
    lines += _table(
        ["", ""],
        "ll",
        [
            ["Members", ", ".join(r.players)],
            ["Protocol parameters", params],
            ["Examples", f"{r.n_examples}{failed}"],
            ["Dataset", r.dataset or "n/a"],
            ["Scorer", _scorer(r)],
            *([["Sandbox", describe(r.sandbox)]] if r.sandbox else []),
            ["Method", f"{method}, {len(r.coalitions)} coalitions evaluated"],
            ["System score v(all members)", _score(grand)],
            ["Created", f"{r.created_at:%Y-%m-%d %H:%M:%S %Z} by colab-graphs {r.version}"],
        ],
    )

    if r.warnings:
        lines += ["", "## Warnings", ""]
        lines += [f"- **{w}**" for w in r.warnings]
    lines += ["", "## Members", ""]
    lines.append(
        f"Intervals are {r.confidence:.0%} percentile bootstrap intervals over examples ({r.n_boot} resamples). "
        "LOO is v(all) - v(all without the member); Shapley averages the member's marginal contribution over "
        'all orders of joining. Ranks: 1 = best; "2=" marks a tie (values equal within 1e-9).'
    )
    lines.append("")
    # (key, column title, signed): contributions can be negative, strengths cannot.
    if r.sampling_error is not None:
        lines += [
            f"The Shapley interval is the example noise; `Sampling +-` is the half-width of "
            f"{describe_sampling(r.sampling_interval)}: how far the estimate may be from the exact value on these "
            "examples.",
            "",
        ]
    measures = [("individual", "Individual", False), ("loo", "LOO", True)]
    measures += [("shapley", "Shapley", True)] if r.shapley is not None else []
    scores = {"individual": r.individual, "loo": r.loo, "shapley": r.shapley or {}}
    header = ["Member", *(title for _, title, _ in measures), *(f"Rank {title}" for _, title, _ in measures)]
    if r.sampling_error is not None:
        header.append("Sampling +-")
    rows = [
        [
            m,
            *(_score(scores[key].get(m), r.ci.get(m, {}).get(key), signed) for key, _, signed in measures),
            *(_rank(r.ranks.get(key, {}), m) for key, _, _ in measures),
            *([f"{r.sampling_error[m]:.3f}"] if r.sampling_error is not None else []),
        ]
        for m in r.players
    ]
    lines += _table(header, "l" + "r" * (len(header) - 1), rows)

    lines += _troubles(r)

    if r.rank_correlation:
        lines += ["", "## Individual vs compositional strength", ""]
        lines.append("Rank correlation across members between strength alone and contribution to the team.")
        lines.append("")
        names = {"loo": "LOO", "shapley": "Shapley"}
        lines += _table(
            ["Compositional measure", "Spearman rho", "Kendall tau-b"],
            "lrr",
            [
                [names.get(k, k), _correlation(c.spearman), _correlation(c.kendall)]
                for k, c in r.rank_correlation.items()
            ],
        )

    lines += ["", "## Calls and cost", ""]
    naive = "n/a"
    if r.calls.naive is not None:
        naive = str(r.calls.naive)
        if r.calls.made:
            naive += f" ({r.calls.naive / r.calls.made:.1f}x the calls made)"
    lines += _table(
        ["Calls made", "Distinct requests", "Served from cache", "Failed", "Naive evaluation"],
        "rrrrr",
        [[str(r.calls.made), str(r.calls.unique), str(r.calls.cached), str(r.calls.failed), naive]],
    )
    lines += [
        "",
        f"Tokens: {r.tokens.total:,} ({r.tokens.prompt:,} prompt, {r.tokens.completion:,} completion). ",
    ]
    lines[-1] += f"{cost_sentence(r.cost_usd, r.calls.made, r.cost_saved_usd, r.calls.cached)} "
    lines[-1] += f"Wall time: {r.wall_s:.1f} s."
    if r.usage:
        lines.append("")
        lines += _table(
            ["Member", "Calls", "Prompt tokens", "Completion tokens", "Cost (USD)"],
            "lrrrr",
            [
                [
                    m,
                    str(u.calls),
                    f"{u.tokens.prompt:,}",
                    f"{u.tokens.completion:,}",
                    "unknown" if u.cost_usd is None else f"{u.cost_usd:.4f}",
                ]
                for m, u in r.usage.items()
            ],
        )

    lines += ["", "## Coalitions", ""]
    usage = {tuple(c.members): c for c in r.per_coalition}
    rows = []
    for c in r.coalitions[:SHOWN_COALITIONS]:
        u = usage.get(tuple(c.members))
        rows.append(
            [
                _coalition_name(c.members),
                str(len(c.members)),
                f"{c.value:.3f}",
                f"{u.tokens.total:,}" if u else "n/a",
            ]
        )
    lines += _table(["Coalition", "Size", "Value", "Tokens"], "lrrr", rows)
    hidden = (r.coalitions_valued or len(r.coalitions)) - len(rows)
    if hidden > 0:
        lines += ["", f"... and {hidden:,} more coalitions ({len(r.coalitions):,} listed in report.json)."]

    for name, file in (images or {}).items():
        lines += ["", f"![{name}]({file})"]
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """A report file, the old one or the new one, never half written (even if the audit is killed), without
    the registered secrets."""
    atomic_write_text(path, hide_secrets(text))


def write_report(
    report: AuditReport, out_dir: str | Path, *, images: dict[str, Path] | None = None
) -> dict[str, Path]:
    """Write `report.json` and `report.md` (which shows `images`, the plots `audit.plots.write_plots` drew).

    Args:
        report: The audit report.
        out_dir: Folder to write into; created if missing.
        images: Plot name -> PNG path, already written in `out_dir`.

    Returns:
        Name ("json", "md", and the plot names) -> path.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = dict(images or {})
    exclude = {"sandbox"} if report.sandbox is None else None  # (a report without code scores is as it was)
    write_atomic(out / REPORT_JSON, report.model_dump_json(indent=2, exclude=exclude) + "\n")
    written["json"] = out / REPORT_JSON
    images = {name: path.name for name, path in written.items() if path.suffix == ".png"}
    write_atomic(out / REPORT_MD, render_markdown(report, images))
    written["md"] = out / REPORT_MD
    return written


def read_report(path: str | Path) -> AuditReport:
    """Read and validate an audit report.

    Args:
        path: `report.json` or the folder that holds it.

    Raises:
        FileNotFoundError: When there is no report there.
        ValueError: When the file is not a valid report, naming the file and the fields at fault.
    """
    path = Path(path)
    if path.is_dir():
        path = path / REPORT_JSON
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: an audit report is a JSON object, got {type(data).__name__}")
    found = data.get("schema_version")
    if isinstance(found, int) and found > SCHEMA_VERSION:
        raise ValueError(
            f"{path}: schema_version {found} was written by a newer colab-graphs (this one reads up to "
            f"{SCHEMA_VERSION}); upgrade colab-graphs"
        )
    try:
        return AuditReport.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{path}: invalid audit report: {exc}") from None
