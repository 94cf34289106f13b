"""Old import paths of moved modules (`colab_graphs._moved`): each gives the very module of its new path with a
`MovedModuleWarning` naming it, and nothing the repository tracks still says an old path."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from colab_graphs._moved import MOVED, MovedModuleWarning

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_gives_the_moved_module_with_a_warning(old):
    new = importlib.import_module(MOVED[old])
    for name in [m for m in sys.modules if m == old or m.startswith(old + ".")]:
        del sys.modules[name]
    with pytest.warns(MovedModuleWarning, match=re.escape(f"{old} moved to {MOVED[old]}")):
        module = importlib.import_module(old)
    assert module is new


def test_the_warning_is_a_deprecation_warning():
    assert issubclass(MovedModuleWarning, DeprecationWarning)


def test_an_old_path_warns_where_it_is_imported():
    old = "colab_graphs.data.answers"
    for name in [m for m in sys.modules if m.startswith("colab_graphs.data")]:
        del sys.modules[name]
    with pytest.warns(MovedModuleWarning) as caught:
        importlib.import_module(old)
    assert {Path(w.filename).name for w in caught} <= {Path(__file__).name, "__init__.py"}


def test_an_old_path_warns_in_a_script_run_with_python_c():
    code = "import colab_graphs.models.local as old, colab_graphs.local.provider as new; print(old is new)"
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert "MovedModuleWarning: colab_graphs.models.local moved to colab_graphs.local.provider" in done.stderr


def test_no_tracked_text_says_an_old_path():
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.toml"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    exempt = {"colab_graphs/_moved.py", "tests/test_moved.py"}
    old = re.compile("|".join(rf"{re.escape(m)}(?![\w])" for m in sorted(MOVED, key=len, reverse=True)))
    found = [
        f"{path}:{n}: {line.strip()}"
        for path in tracked
        if path not in exempt and not path.startswith("runs/") and (ROOT / path).is_file()
        for n, line in enumerate((ROOT / path).read_text(encoding="utf-8").splitlines(), 1)
        if old.search(line)
    ]
    assert found == []
