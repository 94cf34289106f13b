"""Shared fixtures: offline settings, one event loop, a scripted OpenAI-compatible server, a throwaway cache;
the CLI in process; how tests share pytest-xdist's workers.

Keep this file small: fixtures that only one test module needs belong in that module.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

import colab_graphs._env  # noqa: F401  (offline settings before anything imports litellm)
from colab_graphs.models.cache import CallCache
from colab_graphs.pool import Pool
from colab_graphs.testing import ScriptedServer

T = TypeVar("T")

# Under pytest-xdist (`-n 2`, README's test command) a test file is one unit of work, so that its module
# fixtures are made once; the files of a group below are one unit together, run one after another on one
# worker. "sandbox": the files whose tests run sandboxed code. test_sandbox.py and test_reward_hacks.py assert
# that no process of the sandbox's run uids is left, which a sandboxed run on the other worker would break.
# A new test file that runs sandboxed code (the code scorer, run_code, the harness) joins it: a test of a file
# outside the group that starts a sandboxed process fails, naming the file (`_sandbox_runs_in_its_group`).
XDIST_GROUPS = {
    "sandbox": {
        "test_code_harness.py",
        "test_code_parity.py",
        "test_conformance.py",
        "test_reward_hacks.py",
        "test_reward_hacks_answer_key.py",
        "test_reward_hacks_namespace.py",
        "test_reward_hacks_reach.py",
        "test_sandbox.py",
        "test_sandbox_cli.py",
        "test_sandbox_reach.py",
        "test_sandbox_visible.py",
        "test_sandbox_wiring.py",
        "test_scorers.py",
        "test_trainer.py",
    }
}
_GROUP_OF = {name: group for group, names in XDIST_GROUPS.items() for name in names}


def _unit(nodeid: str) -> str:
    """The unit of work of a test under xdist: its file's group, or its file."""
    path = nodeid.split("::", 1)[0]
    return _GROUP_OF.get(Path(path).name, path)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: a plain run without xdist installed has no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """For `-n N` without another `--dist`: xdist's scope scheduling over `_unit`, handing the units out in
    collection order (see below)."""
    if config.getvalue("dist") != "load":  # a --dist the caller chose is xdist's to make
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False  # xdist would put the units with the most tests first
    return ByUnit(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, the groups first, then the files holding a slow test, then the rest (each file's
    tests in their order): the long units start early and short ones fill the end, so both workers finish
    together. A plain run keeps pytest's order."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.path.name not in _GROUP_OF, item.path not in slow_files))


@pytest.fixture(scope="session", autouse=True)
def _sandbox_runs_in_its_group() -> Iterator[None]:
    """Every sandboxed process starts through `runner._popen`: one started while a test outside the "sandbox"
    group runs (`PYTEST_CURRENT_TEST` names it) is refused with the file to add, so the group never misses a file
    (a miss would only show as a rare flake of the leftover-process checks on the other worker)."""
    from colab_graphs.sandbox import runner

    popen = runner._popen

    def guarded(*args: Any, **kwargs: Any) -> Any:
        current = os.environ.get("PYTEST_CURRENT_TEST", "").split("::", 1)[0]
        name = Path(current).name
        if name and _GROUP_OF.get(name) != "sandbox":
            raise AssertionError(
                f"{name} runs sandboxed code: add it to XDIST_GROUPS['sandbox'] in tests/conftest.py, so it never "
                "runs beside the files that check the sandbox leaves no process behind"
            )
        return popen(*args, **kwargs)

    runner._popen = guarded
    yield
    runner._popen = popen


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Point the default call cache at a session directory: tests must never read or fill the user's cache."""
    old = os.environ.get("COLAB_GRAPHS_CACHE_DIR")
    os.environ["COLAB_GRAPHS_CACHE_DIR"] = str(tmp_path_factory.mktemp("default-cache"))
    yield
    if old is None:
        os.environ.pop("COLAB_GRAPHS_CACHE_DIR", None)
    else:
        os.environ["COLAB_GRAPHS_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def arun() -> Iterator[Callable[[Awaitable[T]], T]]:
    """Run a coroutine to completion on one loop shared by the whole session.

    One loop, because LiteLLM's logging worker warns when `asyncio.run()` hands it a new loop each time.
    """
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete
    # As asyncio.run does: cancel what is left (LiteLLM's logging worker) before closing the loop.
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


@pytest.fixture
def scripted_server() -> Iterator[Callable[..., ScriptedServer]]:
    """A factory: `scripted_server(members, **ScriptedServer kwargs)` starts a server on 127.0.0.1.

    Every server started is stopped when the test ends.
    """
    started: list[ScriptedServer] = []

    def start(members: Mapping[str, Any], **kwargs: Any) -> ScriptedServer:
        server = ScriptedServer(members, **kwargs).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def server_pool(server: ScriptedServer, names: list[str], api_key: str = "sk-test", **settings: Any) -> Pool:
    """A pool whose members are the server's scripted models of those names, in that order."""
    return Pool.from_dict(
        {
            name: {"model": f"openai/{name}", "api_base": server.base_url, "api_key": api_key, **settings}
            for name in names
        }
    )


def write_pool_file(path: Path, server: ScriptedServer, names: list[str]) -> Path:
    """`server_pool` as a pool file for the CLI; returns `path`."""
    path.write_text(
        "models:\n"
        + "".join(
            f"  {m}: {{model: openai/{m}, api_base: '{server.base_url}', api_key: sk-test}}\n" for m in names
        )
    )
    return path


def score_code_replies(tmp: Path, records: list[dict[str, Any]], coder: Callable[..., str]) -> CodeScores:
    """`colab-graphs run --protocol solo --scorer code` (in process) on `records`, a coding data file written
    under `tmp`, its one member `coder` a scripted model over real HTTP; each record's score, by id."""
    import json

    from typer.testing import CliRunner

    from colab_graphs.cli.app import app

    data = tmp / "records.json"
    data.write_text(json.dumps({"name": tmp.name, "task_type": "coding", "test": records}))
    server = ScriptedServer({"coder": coder}).start()
    try:
        pool = write_pool_file(tmp / "pool.yaml", server, ["coder"])
        argv = ["run", "--protocol", "solo", "--scorer", "code", "--pool", str(pool), "--data", str(data)]
        result = CliRunner().invoke(app, [*argv, "--out", str(tmp / "run"), "--no-cache"])
    finally:
        server.stop()
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp / "run" / "results.jsonl").read_text().splitlines()]
    scores = CodeScores({row["id"]: row["score"] for row in rows})
    scores.why = {row["id"]: row["sandbox"]["failed"] for row in rows if "failed" in row.get("sandbox", {})}
    return scores


class CodeScores(dict[str, float]):
    """Each record's score, by id; `why`: the reason each failed run's row gives (a timeout, an assertion)."""

    why: dict[str, str]


def cli_in_process(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`colab-graphs ARGS` run in this process, its exit status and output as a subprocess's would be.

    No interpreter start and no LiteLLM import: ~4 s of CPU less than a subprocess. For tests of what a
    command writes; a test of how the process exits, of signals, or of what reaches its streams runs a
    subprocess.
    """
    from typer.testing import CliRunner

    from colab_graphs.cli.app import _register_optional_commands, app

    _register_optional_commands()  # every command, as the console entry point registers them
    argv = [str(a) for a in args]
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200"}, catch_exceptions=False)
    return subprocess.CompletedProcess(
        ["colab-graphs", *argv], result.exit_code, result.stdout, result.stderr
    )


@pytest.fixture
def pool_for() -> Callable[..., Pool]:
    """`pool_for(server, ["a", "b"], api_key=..., **settings)`: see `server_pool`."""
    return server_pool


@pytest.fixture
def fit_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh `COLAB_GRAPHS_MERGE_DIR` (merged models and fits) for one test, with no dev replies remembered
    in process from another test's members."""
    from colab_graphs.protocols import dev_fit

    folder = tmp_path / "merges"
    monkeypatch.setenv("COLAB_GRAPHS_MERGE_DIR", str(folder))
    dev_fit._outcomes.clear()
    return folder


@pytest.fixture(scope="session")
def tiny_members(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Sequence[str], int], dict[str, Path]]:
    """`tiny_members(names, seed)`: a model folder per name, the zoo's `tiny-random` with its weights perturbed
    (Gaussian noise of std 0.1, drawn with seed `seed + i` for the i-th name): one architecture and vocabulary,
    other weights. Made once per session for each (names, seed)."""
    made: dict[tuple[tuple[str, ...], int], dict[str, Path]] = {}

    def make(names: Sequence[str], seed: int) -> dict[str, Path]:
        key = (tuple(names), seed)
        if key not in made:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from colab_graphs.local.zoo import resolve

            base = resolve("tiny-random")
            root = tmp_path_factory.mktemp(f"tiny-{seed}")
            made[key] = {}
            for i, name in enumerate(names):
                model = AutoModelForCausalLM.from_pretrained(base)
                g = torch.Generator().manual_seed(seed + i)
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn(p.shape, generator=g) * 0.1)
                model.save_pretrained(root / name)
                AutoTokenizer.from_pretrained(base).save_pretrained(root / name)
                made[key][name] = root / name
        return made[key]

    return make


@pytest.fixture
def tmp_cache(tmp_path: Path) -> Iterator[CallCache]:
    """A call cache in a fresh directory of its own."""
    cache = CallCache(tmp_path / "cache")
    yield cache
    cache.close()
