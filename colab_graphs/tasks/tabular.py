"""Records from tables: CSV files and pandas DataFrames, each record with where it came from.

A CSV file's first line is its header (the field names); each following row is one record, located as
``FILE:LINE`` (the line the row starts on, so a quoted cell holding newlines still names its row). An empty
cell is a missing value, as in a DataFrame read from the file (`pandas.read_csv` gives NaN there). A
DataFrame's rows are located by their index label (``DataFrame row 3``); NaN and None cells are missing
values. pandas is not imported: a DataFrame is taken as it comes (anything with `columns` and
`to_dict(orient="records")`).
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from colab_graphs.files import read_text
from colab_graphs.tasks.example import DatasetError

Located = list[tuple[dict[str, Any], str]]


def is_frame(obj: Any) -> bool:
    """Whether `obj` is a pandas DataFrame (or looks like one: columns, an index and records)."""
    return hasattr(obj, "columns") and hasattr(obj, "index") and callable(getattr(obj, "to_dict", None))


def csv_records(path: str | os.PathLike[str]) -> tuple[Located, list[str]]:
    """The records of a CSV file with their places (``FILE:LINE``), and the problems of rows that are not
    records (more cells than the header names). Raises `DatasetError` for a file with no header or a header
    that repeats a name."""
    path = Path(path)
    text = read_text(path, DatasetError, "dataset file")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise DatasetError(f"{path}: empty file; expected a header line naming the fields") from None
    except csv.Error as exc:
        raise DatasetError(f"{path}:1: unreadable CSV ({exc})") from None
    names = [name.strip() for name in header]
    repeated = sorted({n for n in names if n and names.count(n) > 1})  # (empty names: cells dropped)
    if repeated or not any(names):
        what = f"repeats {', '.join(map(repr, repeated))}" if repeated else "names no field"
        raise DatasetError(f"{path}:1: the header {what}")
    located: Located = []
    problems: list[str] = []
    start = reader.line_num + 1
    try:
        for row in reader:
            where = f"{path}:{start}"
            start = reader.line_num + 1
            if not any(cell.strip() for cell in row):
                continue  # a blank line
            if len(row) > len(names):
                problems.append(
                    f"{where}: {len(row)} cells, but the header (line 1) names {len(names)} fields"
                )
                continue
            record = {n: (cell if cell.strip() else None) for n, cell in zip(names, row, strict=False)}
            located.append(({n: record.get(n) for n in names if n}, where))
    except csv.Error as exc:
        problems.append(f"{path}:{reader.line_num}: unreadable CSV ({exc})")
    return located, problems


def frame_records(frame: Any) -> Located:
    """The rows of a DataFrame as records with their places (``DataFrame row LABEL``); NaN cells are None."""
    rows = frame.to_dict(orient="records")
    return [
        ({str(k): _value(v) for k, v in row.items()}, f"DataFrame row {label!r}")
        for label, row in zip(frame.index, rows, strict=True)
    ]


def _value(value: Any) -> Any:
    # numpy values (a DataFrame's int64 cells, an array of choices) as Python's, which JSON logs can hold.
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if type(value).__name__ in ("NAType", "NaTType"):  # pandas' missing values (pd.NA, pd.NaT)
        return None
    return value
