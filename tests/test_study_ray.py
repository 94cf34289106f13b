"""Studies on a real local Ray cluster: the same study.json as in process, and a SIGKILLed worker costs at most
its shard's calls again.

The cluster is started once for this module with `ray start --head --block` on 127.0.0.1 with 2 CPUs, in a
session of its own, and stopped afterwards (`colab_graphs.study.distributed.local_cluster`: SIGTERM to that
command, which drains and stops what it started; anything left in its session is then killed by pid). The study
is the hand-computed one of tests/test_study.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import cli_in_process

from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.study import StudyError, load_study_config, play_study, read_study
from colab_graphs.study.distributed import local_cluster, session_processes
from colab_graphs.testing import ScriptedServer

pytest.importorskip("ray")

from test_study import DISTINCT_REQUESTS, REPLIES, cli, member_scripts, write_study  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CPUS = 2


def _study_workers(sid: int) -> list[int]:
    pids = []
    for pid in session_processes(sid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::StudyWorker"):
                pids.append(pid)
    return pids


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray head with 2 CPUs, stopped afterwards: yields (address, session id of its processes)."""
    with local_cluster(CPUS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The hand study run in process: its comparable study.json."""
    from test_study import HAND  # noqa: F401  (the values this baseline holds, checked in test_study.py)

    base = tmp_path_factory.mktemp("baseline")
    with ScriptedServer(member_scripts()) as server:
        config = write_study(base, server)
        done = cli_in_process(
            "study", "--config", config, "--out", base / "out", "--cache-dir", base / "cache", "--no-plots"
        )
    assert done.returncode == 0, done.stderr
    return read_study(base / "out").comparable()


def test_a_study_on_ray_writes_the_same_study_json_as_in_process(ray_cluster, baseline, tmp_path):
    address, _ = ray_cluster
    with ScriptedServer(member_scripts()) as server:
        config = write_study(tmp_path, server)
        done = cli("--config", config, "--out", tmp_path / "out", "--cache-dir", tmp_path / "cache",
                   "--ray", address, "--no-plots")  # fmt: skip
        counts = server.request_counts()
    assert done.returncode == 0, done.stderr
    report = read_study(tmp_path / "out")
    assert report.backend == f"ray ({address})" and report.workers == CPUS and report.shards > 1
    assert report.comparable() == baseline
    # Calls made = distinct requests across the cluster: each asked once, members shared by pools included.
    assert len(counts) == DISTINCT_REQUESTS and set(counts.values()) == {1}


def test_a_worker_killed_mid_study_costs_at_most_its_shards_calls(arun, ray_cluster, baseline, tmp_path):
    address, session = ray_cluster
    shard_size = 2  # examples per shard: a shard asks each of the 4 members each of its questions once
    killed: list[int] = []
    with ScriptedServer(member_scripts(), latency_s=0.05) as server:

        def kill_a_worker_after_eight_replies() -> None:
            deadline = time.time() + 120
            while sum(server.request_counts(successful_only=True).values()) < 8 and time.time() < deadline:
                time.sleep(0.005)
            workers = _study_workers(session)
            if workers:
                os.kill(workers[0], signal.SIGKILL)
                killed.append(workers[0])

        config = write_study(tmp_path, server, shard_size=shard_size)
        killer = threading.Thread(target=kill_a_worker_after_eight_replies, daemon=True)
        killer.start()
        # Workers keep caches of their own (as on other machines): the dead worker's calls are lost with it.
        client = ModelClient(CallCache(tmp_path / "cache"), max_concurrency=2)
        report = arun(
            play_study(load_study_config(config), tmp_path / "out", client=client, ray_address=address,
                      share_cache=False, plots=False)
        )  # fmt: skip
        killer.join()
        answered = server.request_counts(successful_only=True)
        server.reset()
        # The driver merged every worker's cache into the study's: in process, nothing is asked again.
        again = arun(play_study(load_study_config(config), tmp_path / "again", client=client, plots=False))
        assert server.request_counts() == {}
    assert killed, "no study worker was found to kill"
    assert len(answered) == DISTINCT_REQUESTS
    assert sum(answered.values()) - DISTINCT_REQUESTS <= shard_size * len(REPLIES)
    assert report.comparable() == baseline
    assert again.calls.made == 0 and again.comparable()["settings"] == baseline["settings"]


def test_ray_missing_is_a_clear_error(arun, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with ScriptedServer(member_scripts()) as server:
        config = write_study(tmp_path, server, pools={"P2": ["c", "d"]}, datasets=("d1",))
    client = ModelClient(CallCache(tmp_path / "cache"))
    with pytest.raises(StudyError, match=r"pip install 'colab-graphs\[ray\]'"):
        arun(play_study(load_study_config(config), tmp_path / "out", client=client, ray_address="auto"))
