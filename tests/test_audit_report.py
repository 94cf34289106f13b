"""The audit report: fields computed from a hand-checked game, JSON round trip, markdown, plots."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from colab_graphs.audit.estimators import plan_coalitions
from colab_graphs.audit.plots import write_plots
from colab_graphs.audit.report import (
    SCHEMA_VERSION,
    AuditReport,
    Calls,
    CoalitionUsage,
    MemberUsage,
    TokenCount,
    contribution_fields,
    read_report,
    write_report,
)

PLAYERS = ["alpha", "beta"]
A, B, AB = frozenset({"alpha"}), frozenset({"beta"}), frozenset({"alpha", "beta"})
# Four examples. Means: v(alpha) = 0.75, v(beta) = 0.25, v(alpha, beta) = 0.75, v({}) = 0.
VALUES = {
    A: np.array([1.0, 1.0, 1.0, 0.0]),
    B: np.array([0.0, 1.0, 0.0, 0.0]),
    AB: np.array([1.0, 1.0, 1.0, 0.0]),
}
# Alone (the solo protocol): alpha 0.5, beta 0.75.
INDIVIDUAL = {"alpha": np.array([1.0, 1.0, 0.0, 0.0]), "beta": np.array([0.0, 1.0, 1.0, 1.0])}


def make_report(method: str = "exact", **overrides) -> AuditReport:
    fields = contribution_fields(plan_coalitions(PLAYERS, method), VALUES, INDIVIDUAL, n_boot=200)
    extra = {
        "protocol": "majority_vote",
        "protocol_params": {"rounds": 2},
        "players": PLAYERS,
        "scorer": "numeric",
        "calls": Calls(made=12, unique=12, cached=4, failed=0, naive=24),
        "tokens": TokenCount(prompt=1000, completion=200),
        "cost_usd": 0.0125,
        "usage": {p: MemberUsage(calls=6, tokens=TokenCount(prompt=500, completion=100)) for p in PLAYERS},
        "per_coalition": [CoalitionUsage(members=["alpha", "beta"], calls=8, tokens=TokenCount(prompt=640))],
        "wall_s": 3.5,
    }
    return AuditReport(**{**fields, **extra, **overrides})


# Fields from the game


def test_contribution_fields_match_hand_computed_values():
    report = make_report()
    # LOO: alpha 0.75 - 0.25 = 0.5, beta 0.75 - 0.75 = 0.
    assert report.loo == pytest.approx({"alpha": 0.5, "beta": 0.0})
    # Shapley: alpha (0.75 + 0.5) / 2 = 0.625, beta (0.25 + 0) / 2 = 0.125.
    assert report.shapley == pytest.approx({"alpha": 0.625, "beta": 0.125})
    assert report.shapley_method == "exact"
    assert report.individual == pytest.approx({"alpha": 0.5, "beta": 0.75})
    assert [(c.members, c.value) for c in report.coalitions] == [
        ([], 0.0),
        (["alpha"], 0.75),
        (["beta"], 0.25),
        (["alpha", "beta"], 0.75),
    ]


def test_contribution_fields_rank_members_and_correlate_individual_with_compositional():
    report = make_report()
    assert report.ranks == {
        "individual": {"alpha": 2, "beta": 1},
        "loo": {"alpha": 1, "beta": 2},
        "shapley": {"alpha": 1, "beta": 2},
    }
    assert report.rank_correlation["shapley"].spearman == pytest.approx(-1.0)
    assert report.rank_correlation["loo"].kendall == pytest.approx(-1.0)


def test_contribution_fields_give_every_measure_an_interval_around_its_value():
    report = make_report()
    for member in PLAYERS:
        for measure, scores in (
            ("individual", report.individual),
            ("loo", report.loo),
            ("shapley", report.shapley),
        ):
            low, high = report.ci[member][measure]
            assert low <= scores[member] <= high


def test_a_loo_audit_has_no_shapley_values():
    report = make_report("loo")
    assert report.shapley is None and report.shapley_method is None
    assert [c.members for c in report.coalitions] == [["alpha"], ["beta"], ["alpha", "beta"]]
    assert set(report.rank_correlation) == {"loo"}


def test_without_individual_strengths_there_is_no_rank_correlation():
    fields = contribution_fields(plan_coalitions(PLAYERS, "exact"), VALUES, n_boot=50)
    assert fields["individual"] == {} and fields["rank_correlation"] == {}
    assert "individual" not in fields["ranks"]


# Validation


def test_report_rejects_members_that_are_not_players():
    with pytest.raises(ValueError, match="field 'loo' names members \\['gamma'\\]"):
        make_report(loo={"alpha": 0.5, "gamma": 0.1})


def test_report_requires_shapley_values_and_method_together():
    with pytest.raises(ValueError, match="shapley and shapley_method"):
        make_report(shapley_method=None)


def test_value_of_finds_an_evaluated_coalition_whatever_the_member_order():
    report = make_report()
    assert report.value_of(["beta", "alpha"]) == pytest.approx(0.75)
    assert make_report("loo").value_of([]) is None


# JSON


def test_report_round_trips_through_json(tmp_path):
    report = make_report()
    write_report(report, tmp_path)
    assert read_report(tmp_path / "report.json") == report
    assert read_report(tmp_path) == report


def test_report_json_holds_the_contract_fields(tmp_path):
    write_report(make_report(), tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    for field in ("players", "protocol", "n_examples", "coalitions", "individual", "loo", "shapley"):
        assert field in data
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["calls"] == {"made": 12, "unique": 12, "cached": 4, "failed": 0, "naive": 24}
    assert data["tokens"] == {"prompt": 1000, "completion": 200, "total": 1200}
    assert data["ci"]["alpha"]["loo"] == list(make_report().ci["alpha"]["loo"])


def test_reading_keeps_fields_added_by_later_versions(tmp_path):
    write_report(make_report(), tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    data["per_example"] = {"alpha": [1, 0]}
    (tmp_path / "report.json").write_text(json.dumps(data))
    assert read_report(tmp_path).model_extra == {"per_example": {"alpha": [1, 0]}}


def test_reading_a_newer_schema_asks_for_an_upgrade(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(ValueError, match="upgrade colab-graphs"):
        read_report(path)


def test_reading_an_invalid_report_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "report.json"
    data = make_report().model_dump(mode="json")
    del data["loo"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"(?s)report\.json: invalid audit report.*loo\s+Field required"):
        read_report(path)


def test_reading_a_missing_report_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_report(tmp_path)


def test_writing_leaves_no_temporary_files(tmp_path):
    write_report(make_report(), tmp_path)
    write_report(make_report(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]


# Markdown


def test_markdown_has_a_member_table_with_values_intervals_and_ranks(tmp_path):
    report = make_report()
    text = write_report(report, tmp_path)["md"].read_text()
    assert "| Member | Individual | LOO | Shapley | Rank Individual | Rank LOO | Rank Shapley |" in text
    lo, hi = report.ci["alpha"]["shapley"]
    assert f"| +0.625 [{lo:.3f}, {hi:.3f}] |" in text
    assert "| alpha | 0.500 [" in text
    assert text.count("| alpha |") == 2  # member table and usage table


def test_markdown_reports_correlations_calls_and_coalitions(tmp_path):
    text = write_report(make_report(), tmp_path)["md"].read_text()
    assert "| Shapley | -1.00 | -1.00 |" in text
    assert "| 12 | 12 | 4 | 0 | 24 (2.0x the calls made) |" in text
    assert "Cost: $0.0125" in text
    assert "| {alpha, beta} | 2 | 0.750 | 640 |" in text
    assert "| {} (no members) | 0 | 0.000 | n/a |" in text


def test_markdown_of_a_loo_audit_has_no_shapley_column(tmp_path):
    text = write_report(make_report("loo"), tmp_path)["md"].read_text()
    assert "| Member | Individual | LOO | Rank Individual | Rank LOO |" in text
    assert "Shapley |" not in text


def test_markdown_escapes_pipes_in_member_names(tmp_path):
    report = AuditReport(
        protocol="vote",
        players=["a|b", "beta"],
        n_examples=1,
        method="loo",
        coalitions=[],
        loo={"a|b": 0.5, "beta": 0.0},
    )
    assert "| a\\|b |" in write_report(report, tmp_path)["md"].read_text()


# Plots


def is_png(path) -> bool:
    return path.stat().st_size > 10_000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_are_written_and_shown_in_the_markdown(tmp_path):
    pytest.importorskip("matplotlib")
    report = make_report()
    written = write_report(report, tmp_path, images=write_plots(report, tmp_path))
    assert is_png(written["contributions"]) and is_png(written["individual_vs_compositional"])
    text = written["md"].read_text()
    assert "![contributions](contributions.png)" in text
    assert "![individual_vs_compositional](individual_vs_compositional.png)" in text


def test_contribution_plot_works_without_shapley_or_individual_strengths(tmp_path):
    pytest.importorskip("matplotlib")
    from colab_graphs.audit.plots import plot_contributions

    report = make_report("loo").model_copy(update={"individual": {}})
    assert is_png(plot_contributions(report, tmp_path / "bars.png"))
    assert set(write_plots(report, tmp_path / "plots")) == {"contributions"}


def test_scatter_needs_individual_strengths(tmp_path):
    pytest.importorskip("matplotlib")
    from colab_graphs.audit.plots import plot_individual_vs_compositional

    with pytest.raises(ValueError, match="no individual strengths"):
        plot_individual_vs_compositional(
            make_report().model_copy(update={"individual": {}}), tmp_path / "x.png"
        )


def test_plotting_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    from colab_graphs.audit.plots import plot_contributions

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'colab-graphs\[plots\]'"):
        plot_contributions(make_report(), tmp_path / "bars.png")
