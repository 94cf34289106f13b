"""The figures README and docs/ print, written from files the repository ships, never typed by hand.

    python bench/doc_figures.py            # rewrite every generated block from the shipped files
    python bench/doc_figures.py --check    # exit 1 naming each block that differs (tests/test_docs.py runs it)

A generated block is the text between `<!-- figures:NAME -->` and `<!-- /figures:NAME -->` in its page. Each
NAME is written by one function below from its source files:

| block | page | from |
|---|---|---|
| `default-audit-timing` | README.md | `bench/results/default_audit/timing.json`, `report.json` (`bench/first_audit.py`) |
| `default-audit-table` | README.md | `bench/results/default_audit/report.json` |
| `study-mini` | docs/studies.md | `bench/results/study_mini/study.json` (the study's own, shipped with its `study.md`) |

The C-RL team table has its own script (`bench/crl_team_report.py`, from `bench/results/crl_team/`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _read(path: Path) -> dict:
    if not path.exists():
        raise SystemExit(f"{path.relative_to(ROOT)}: missing (see bench/doc_figures.py for what writes it)")
    return json.loads(path.read_text())


def _signed(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:+.{digits}f}"


def _p(value: float | None) -> str:
    """A p-value to two significant digits, written out (0.00004, not 4e-05)."""
    if value is None:
        return "n/a"
    if value <= 0:
        return "0"
    return f"{value:.{max(0, 1 - math.floor(math.log10(value)))}f}"


def default_audit_timing(root: Path) -> str:
    folder = root / "bench" / "results" / "default_audit"
    timing, report = _read(folder / "timing.json"), _read(folder / "report.json")
    first, exact = timing["first_audit"], timing["exact_audit"]
    installed = timing.get(
        "installed_audit"
    )  # (measured since bench/first_audit.py ran it; older files lack it)
    first_cpu = f" ({first['cpu_s']:.0f} s of CPU)" if "cpu_s" in first else ""
    once = (
        f"; once the model is converted, an audit that generates every answer takes {installed['wall_s']:.0f} s "
        f"({installed['cpu_s']:.0f} s of CPU, a load average of {installed['load_average_at_start']:.1f} when it "
        "started)"
        if installed
        else ""
    )
    return (
        f"From a fresh clone, after the install, the first audit converts the model once from its PyPI wheel and "
        f"generates the {report['calls']['unique']} distinct answers: {first['wall_s']:.0f} s on "
        f"{timing['machine']['cpus']} CPU cores{first_cpu}{once}, the exact audit below after it "
        f"{exact['wall_s']:.0f} s, its answers served from the call cache (`bench/first_audit.py`, "
        f"{timing['date']}: empty model and call caches, a load average of {first['load_average_at_start']:.1f} "
        f"when the first started, the model's wheel {timing['model_wheel'].split(':')[0]})."
    )


def default_audit_table(root: Path) -> str:
    report = _read(root / "bench" / "results" / "default_audit" / "report.json")
    lines = [
        "| member | individual | LOO | Shapley (exact) | Shapley 95% CI |",
        "|---|---|---|---|---|",
    ]
    for m in report["players"]:
        low, high = report["ci"][m]["shapley"]
        lines.append(
            f"| {m} | {report['individual'][m]:.3f} | {_signed(report['loo'][m])} | "
            f"{_signed(report['shapley'][m])} | [{low:+.3f}, {high:+.3f}] |"
        )
    grand = next(c["value"] for c in report["coalitions"] if len(c["members"]) == len(report["players"]))
    calls = report["calls"]
    lines += [
        "",
        f"v(all) = {grand:.3f} over {report['n_examples']} examples; calls: {calls['unique']} distinct requests "
        f"(a naive evaluation: {calls['naive']}).",
    ]
    below = [m for m in report["players"] if report["loo"][m] < 0]
    if below:
        shapley_signs = "are not" if all(report["shapley"][m] >= 0 for m in below) else "are negative too"
        lines += [
            "",
            f"The leave-one-out of {' and '.join(below)} is negative (the vote is better without "
            f"{'them' if len(below) > 1 else 'it'}) while {'their' if len(below) > 1 else 'its'} Shapley "
            f"value{'s' if len(below) > 1 else ''} {shapley_signs}"
            + (": exactly the gap between a cheap proxy and the full game that the audit exists to show."
               if shapley_signs == "are not" else "."),
        ]  # fmt: skip
    return "\n".join(lines)


def study_mini(root: Path) -> str:
    from colab_graphs.study.report import StudyReport, correlation_rows

    folder = root / "bench" / "results" / "study_mini"
    study = StudyReport.model_validate(_read(folder / "study.json"))
    lines = [
        f"It made {study.calls.made:,} calls (the distinct requests; a naive evaluation of the same "
        f"{len(study.settings)} audits makes {study.calls.naive:,}) in {study.wall_s / 60:.0f} minutes, from an "
        f"empty call cache, on 2 CPU cores shared with other work (study.json, {study.created_at:%Y-%m-%d}). "
        f"Spearman's rho between a member's individual strength and its Shapley value, over (member, protocol, "
        f"dataset) pairs:",
        "",
        "| pool | family | pairs | Spearman rho | Kendall tau-b | p-value |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {c.pool} | {c.family} | {c.n_pairs} | {_signed(c.spearman, 2)} | {_signed(c.kendall, 2)} | "
        f"{_p(c.p_value)} |"
        for c in study.correlations
    ]
    tested = [c for c in study.correlations if c.family != "all" and c.p_value is not None]
    lines += ["", f'"{sum(not c.significant for c in tested)} of {len(tested)} settings show no significant '
              f'correlation" (alpha {study.alpha}). Each member alone, and the correlations with one dataset left '
              f"out (from the same settings):", ""]  # fmt: skip
    datasets = [d["label"] for d in study.datasets]
    for dataset in datasets:
        rights = {
            m: f"{round(s.individual[m] * s.n_examples)} of {s.n_examples}"
            for s in study.settings
            if s.dataset == dataset and s.protocol == study.settings[0].protocol
            for m in s.members
        }
        lines.append(f"- alone on {dataset}: " + ", ".join(f"{m} {r}" for m, r in rights.items()))
    for left_out in datasets:
        rows = correlation_rows(
            [s for s in study.settings if s.dataset != left_out], study.measure, study.alpha
        )
        by_family = [c for c in rows if c.family != "all"]
        read = ", ".join(
            f"{c.pool}/{c.family} {_signed(c.spearman, 2)} (p {_p(c.p_value)})" for c in by_family
        )
        insignificant = sum(c.significant is not True for c in by_family)
        lines.append(f"- without {left_out}: {read}; {insignificant} of {len(by_family)} not significant")
    return "\n".join(lines)


BLOCKS: dict[str, tuple[str, Callable[[Path], str]]] = {
    "default-audit-timing": ("README.md", default_audit_timing),
    "default-audit-table": ("README.md", default_audit_table),
    "study-mini": ("docs/studies.md", study_mini),
}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(
        f"(<!-- figures:{re.escape(name)} -->\n).*?(<!-- /figures:{re.escape(name)} -->)", re.DOTALL
    )


def block_in(text: str, name: str, where: str) -> str:
    """The text of block `name` in `text` (without its markers)."""
    found = _pattern(name).search(text)
    if found is None:
        raise SystemExit(f"{where}: no <!-- figures:{name} --> ... <!-- /figures:{name} --> block")
    return text[found.end(1) : found.start(2)]


def written(root: Path) -> dict[str, tuple[Path, str]]:
    """name -> (page, the block's text as the shipped files give it)."""
    return {name: (root / page, make(root) + "\n") for name, (page, make) in BLOCKS.items()}


def stale(root: Path) -> list[str]:
    """The blocks whose page text differs from what the shipped files give."""
    return [
        f"{page.relative_to(root)}: {name}"
        for name, (page, text) in written(root).items()
        if block_in(page.read_text(), name, str(page)) != text
    ]


def write(root: Path) -> None:
    for name, (page, text) in written(root).items():
        current = page.read_text()
        block_in(current, name, str(page))  # (names the page when the block is missing)
        page.write_text(_pattern(name).sub(lambda m, t=text: m.group(1) + t + m.group(2), current, count=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 naming each block that differs")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    if args.check:
        differ = stale(args.root)
        for line in differ:
            print(f"stale: {line} (run python bench/doc_figures.py)", file=sys.stderr)
        return 1 if differ else 0
    write(args.root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
