"""The Ray backend: shards played by a pool of `StudyWorker` actors, results recorded on the driver.

The driver puts the plan in Ray's object store once, starts one actor per CPU of the cluster (or `workers`),
and hands each idle actor the next shard with the plays already recorded for its examples. A finished shard
comes back as its new plays (and, from a worker that keeps a cache of its own, the cache entries it wrote),
which the driver merges into the study's cache first and records second, so a driver killed in between
replays nothing from upstream. A worker killed mid-shard (SIGKILL, a lost node) is restarted by Ray and its
shard is handed out again: the study costs at most that shard's calls again and ends with the same values.

Ray is an optional extra (`pip install 'colab-graphs[ray]'`); it is imported only here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colab_graphs.audit.game import Play
from colab_graphs.study.plan import Shard, StudyPlan
from colab_graphs.study.worker import ShardResult, StudyWorker

MAX_SHARD_ATTEMPTS = 3
_POLL_S = 0.5
_RESTART_WAIT_S = 1.0  # before a shard goes back to an actor that Ray is restarting


class DistributedError(RuntimeError):
    """Ray is missing, the cluster cannot be reached, or a shard failed for good."""


@dataclass
class RayRun:
    workers: int
    shards: int
    retried_shards: int
    worker_cpu_s: float  # CPU the workers spent on the shards that came back


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise DistributedError(
            "--ray needs Ray, an optional extra: pip install 'colab-graphs[ray]'"
        ) from None
    return ray


def connect(address: str) -> tuple[Any, bool]:
    """Connect to the cluster at `address` ("auto" finds a running one); returns (ray, whether we connected)."""
    ray = _import_ray()
    if ray.is_initialized():
        return ray, False
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise DistributedError(f"cannot reach a Ray cluster at {address!r}: {err}") from None
    return ray, True


def cluster_cpus(ray: Any) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def play_on_ray(
    ray: Any,
    plan: StudyPlan,
    shards: list[Shard],
    done_for: Callable[[Shard], dict[str, list[Play]]],
    *,
    workers: int,
    client_options: dict[str, Any],
    cache_dir: str | None,
    share_cache: bool,
    on_result: Callable[[ShardResult], None],
    on_progress: Callable[[int], None] | None = None,
) -> RayRun:
    """Play every shard on the cluster; `on_result` gets each finished shard (on the calling thread).

    Raises:
        DistributedError: a shard raised an error, or its worker died `MAX_SHARD_ATTEMPTS` times.
    """
    actor_class = ray.remote(num_cpus=1, max_restarts=-1)(StudyWorker)
    plan_ref = ray.put(plan)
    driver_node = ray.get_runtime_context().get_node_id()
    actors = [
        actor_class.remote(client_options, cache_dir, driver_node, share_cache)
        for _ in range(min(workers, len(shards)))
    ]
    queue = deque(shards)
    attempts = {s.index: 0 for s in shards}
    running: dict[Any, tuple[Any, Shard]] = {}
    shown: dict[Any, int] = {}  # plays of each running shard already passed to on_progress
    idle = [(0.0, actor) for actor in actors]  # (usable from, actor): a restarting actor waits a moment
    retried = 0
    cpu_s = 0.0

    def advance(ref: Any, count: int) -> None:
        if on_progress is not None and count > shown.get(ref, 0):
            on_progress(count - shown.get(ref, 0))
            shown[ref] = count

    try:
        while queue or running:
            now = time.monotonic()
            for ready_at, actor in [a for a in idle if a[0] <= now]:
                if not queue:
                    break
                idle.remove((ready_at, actor))
                shard = queue.popleft()
                attempts[shard.index] += 1
                running[actor.run_shard.remote([plan_ref], shard, done_for(shard))] = (actor, shard)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=_POLL_S) if running else ([], [])
            if not running:
                time.sleep(_POLL_S)  # every actor is restarting
            for ref in ready:
                actor, shard = running.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayActorError as err:
                    shown.pop(ref, None)
                    idle.append((time.monotonic() + _RESTART_WAIT_S, actor))
                    if isinstance(err, ray.exceptions.ActorUnavailableError):
                        attempts[shard.index] -= 1  # still restarting from an earlier death: nothing ran
                    elif attempts[shard.index] >= MAX_SHARD_ATTEMPTS:
                        raise DistributedError(
                            f"shard {shard.index}: its worker died {MAX_SHARD_ATTEMPTS} times ({err})"
                        ) from None
                    else:
                        retried += 1
                    queue.appendleft(shard)  # the restarted actor (or another) plays it again
                    continue
                except ray.exceptions.RayTaskError as err:
                    raise DistributedError(f"shard {shard.index} failed: {err.cause!r}") from None
                idle.append((0.0, actor))
                on_result(result)
                cpu_s += result.cpu_s
                advance(ref, len(result.plays))
                shown.pop(ref, None)
            if on_progress is not None and running:
                _poll_progress(ray, running, advance)
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
    return RayRun(len(actors), len(shards), retried, round(cpu_s, 2))


def _poll_progress(ray: Any, running: dict, advance: Callable[[Any, int], None]) -> None:
    refs = list(running)
    try:
        counts = ray.get([running[ref][0].progress.remote() for ref in refs], timeout=_POLL_S)
    except (ray.exceptions.RayError, TimeoutError):
        return  # a worker restarting: its count shows on a later poll
    for ref, count in zip(refs, counts, strict=True):
        advance(ref, count)


def wait_for_workers(ray: Any, seconds: float = 60.0) -> None:
    """Wait until the cluster reports at least one CPU (a freshly started head may take a moment)."""
    deadline = time.time() + seconds
    while ray.cluster_resources().get("CPU", 0) < 1:
        if time.time() > deadline:
            raise DistributedError("the Ray cluster has no CPU to run workers on")
        time.sleep(0.2)


@contextlib.contextmanager
def local_cluster(cpus: int) -> Iterator[tuple[str, int]]:
    """A Ray head on this machine for tests and benchmarks: yields (address, session id of its processes).

    `ray start --head --block` on 127.0.0.1 with `cpus` CPUs, in a session of its own; on exit it gets SIGTERM
    (it drains and stops what it started) and anything left in its session is killed by pid. Unlike `ray stop`
    it ends only this cluster.
    """
    temp = tempfile.mkdtemp(prefix="cg-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
               "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", "--include-dashboard=false",
               "--disable-usage-stats", f"--temp-dir={temp}", "--block"]  # fmt: skip
    log_path = Path(temp) / "ray-start.log"
    with open(log_path, "w") as log:
        head = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 90
        while True:
            with socket.socket() as s, contextlib.suppress(OSError):
                s.connect(("127.0.0.1", port))
                break
            if head.poll() is not None or time.time() > deadline:
                raise DistributedError(f"the Ray head did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}", head.pid
    finally:
        head.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=40)
        for pid in session_processes(head.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if head.poll() is None:
            head.wait(timeout=10)
        shutil.rmtree(temp, ignore_errors=True)


def session_processes(sid: int) -> list[int]:
    """Pids of the processes in session `sid` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry)) == sid:
                    found.append(int(entry))
    return found
