"""Results as tables for notebooks: pandas DataFrames, Hugging Face datasets and HTML.

Reports, runs and studies turn their rows (plain dicts, one per member, example or setting) into a
`pandas.DataFrame` (`to_pandas()`), a `datasets.Dataset` (`to_dataset()`), or the HTML a notebook shows
(`_repr_html_`). pandas and datasets are optional: a missing one is named with the extra that installs it.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

EXTRA = "notebook"


def _require(module: str, what: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"{what} needs the {module!r} package: pip install 'colab-graphs[{EXTRA}]' (or pip install {module})"
        ) from None


def to_pandas(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Any:
    """`rows` as a `pandas.DataFrame` with `columns` in that order (a row may lack some: NaN there)."""
    pandas = _require("pandas", "to_pandas()")
    return pandas.DataFrame([dict(r) for r in rows], columns=list(columns))


def to_dataset(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Any:
    """`rows` as a Hugging Face `datasets.Dataset` with `columns` (missing values are None)."""
    datasets = _require("datasets", "to_dataset()")
    return datasets.Dataset.from_list([{c: r.get(c) for c in columns} for r in rows])


def _cell(value: Any) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list | tuple):
        return html.escape(", ".join(map(str, value)))
    return html.escape(str(value))


def html_table(
    title: str,
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    notes: Sequence[str] = (),
    max_rows: int = 50,
) -> str:
    """An HTML table (title, header, up to `max_rows` rows, then notes), escaped, for `_repr_html_`."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(row.get(c))}</td>" for c in columns) + "</tr>"
        for row in rows[:max_rows]
    )
    more = [f"{len(rows) - max_rows} more row(s) not shown"] if len(rows) > max_rows else []
    lines = "".join(f"<p>{html.escape(n)}</p>" for n in [*notes, *more])
    return (
        f"<div><strong>{html.escape(title)}</strong><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>{lines}</div>"
    )
