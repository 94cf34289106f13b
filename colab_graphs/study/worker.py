"""Playing shards: the same code in process and in a Ray worker.

`ShardRunner` plays every setting of a study on a shard's examples through one `ModelClient`, on one event
loop, so a request that several settings make identically is made once (single-flight while in flight, the
cache after). It keeps one `CoalitionGame` per setting for its whole life (compiled graphs are reused across
shards) and plays only what the driver has not recorded yet.

`StudyWorker` is the Ray actor around a runner: its own client, and a cache that is the study's cache when
the worker runs on the driver's machine (SQLite in WAL mode takes writers from several processes), else a
cache of its own whose new entries go back to the driver with the shard's plays.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colab_graphs import otel
from colab_graphs.audit.game import CoalitionGame, Play, coalition_id
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.sandbox import scope
from colab_graphs.study.plan import Setting, Shard, StudyPlan

PlayKey = tuple[str, str]  # (coalition id, example id), as `CoalitionGame.plays` keys them


def play_key(play: Play) -> PlayKey:
    return coalition_id(play.game, play.coalition), play.example_id


@dataclass
class ShardResult:
    """What a shard gave: new plays by setting key, and the cache entries its worker wrote that the driver
    does not share (each `(key, model, request, response, member)`)."""

    shard: int
    plays: list[tuple[str, Play]] = field(default_factory=list)
    entries: list[tuple[str, str, dict, dict, str | None]] = field(default_factory=list)
    cpu_s: float = 0.0  # the worker process's CPU time while it played the shard


class RecordingCache(CallCache):
    """A worker's own call cache that also keeps what it stores, for the driver to merge into the study's."""

    def __init__(self, directory: str | os.PathLike[str]):
        super().__init__(directory)
        self.new_entries: list[tuple[str, str, dict, dict, str | None]] = []

    def put(
        self,
        key: str,
        model: str,
        request: dict[str, Any],
        response: dict[str, Any],
        member: str | None = None,
    ) -> None:
        super().put(key, model, request, response, member)
        self.new_entries.append((key, model, request, response, member))

    def take_entries(self) -> list[tuple[str, str, dict, dict, str | None]]:
        entries, self.new_entries = self.new_entries, []
        return entries


class ShardRunner:
    """Plays the settings of a study on shards of examples.

    Args:
        plan: The study's settings and pools.
        client: The call path every play goes through.
    """

    def __init__(self, plan: StudyPlan, client: ModelClient):
        self.plan = plan
        self.client = client
        self.plays_done = 0
        self._games: dict[str, CoalitionGame] = {}

    def _game(self, setting: Setting) -> CoalitionGame:
        game = self._games.get(setting.key)
        if game is None:
            pool = self.plan.pools[setting.pool]
            game = CoalitionGame(setting.spec, pool, [], client=self.client, scorer=setting.scorer)
            game.watch_plays(None, self.plan.stall_after)
            self._games[setting.key] = game
        return game

    async def run(
        self,
        shard: Shard,
        done: Mapping[str, Sequence[Play]],
        on_plays: Callable[[list[tuple[str, Play]]], None] | None = None,
    ) -> list[tuple[str, Play]]:
        """Play every setting on the shard's examples, skipping the plays in `done` (setting key -> plays).

        Returns the new plays, each with its setting key; `on_plays` gets a setting's new plays of one example
        as soon as they are all finished. `plays_done` counts this shard's new plays while it runs.
        """
        with scope.using(self.plan.sandbox):  # (on a Ray worker, the study's setting arrives with the plan)
            return await self._run(shard, done, on_plays)

    async def _run(
        self,
        shard: Shard,
        done: Mapping[str, Sequence[Play]],
        on_plays: Callable[[list[tuple[str, Play]]], None] | None,
    ) -> list[tuple[str, Play]]:
        self.plays_done = 0
        fresh: list[tuple[str, Play]] = []
        evaluations = []
        for setting in self.plan.settings:
            examples = shard.examples.get(setting.dataset)
            if not examples:
                continue
            game = self._game(setting)
            prior = {play_key(p): p for p in done.get(setting.key, ())}
            game.examples, game.plays = list(examples), dict(prior)

            def record(plays: list[Play], key: str = setting.key) -> None:
                keyed = [(key, play) for play in plays]
                self.plays_done += len(keyed)
                fresh.extend(keyed)
                if on_plays is not None:
                    on_plays(keyed)

            evaluations.append(self._played(setting, game, record))
        await asyncio.gather(*evaluations)
        return fresh

    @staticmethod
    async def _played(setting: Setting, game: CoalitionGame, record: Callable[[list[Play]], None]) -> None:
        """One setting's plays on the shard, under a trace span of their own (`colab_graphs.otel`)."""
        members = list(setting.spec.members)
        with otel.root_span("setting", setting.spec.name, members, len(game.examples), setting.key):
            await game.evaluate(setting.coalitions, setting.solo_members, on_plays=record)


class StudyWorker:
    """A Ray actor that plays shards (see the module docstring for its cache).

    The plan comes with each shard as a one-item list holding its object reference (fetched once per worker
    life), not as a constructor argument: a restarted worker needs nothing that may have left the object store.

    Args:
        client_options: `ModelClient` keyword arguments (max_concurrency, retries, ...).
        cache_dir: The study's cache folder, or None when the study runs without a cache.
        driver_node: The Ray node id of the driver; a worker on it shares the study's cache file.
        share_cache: False makes every worker keep a cache of its own, as on another machine.
    """

    def __init__(
        self,
        client_options: dict[str, Any],
        cache_dir: str | None,
        driver_node: str,
        share_cache: bool = True,
    ):
        import ray

        import colab_graphs._env  # noqa: F401  (offline settings before litellm loads)

        cache: CallCache | None = None
        self._recording: RecordingCache | None = None
        if cache_dir is not None:
            same_node = ray.get_runtime_context().get_node_id() == driver_node
            if share_cache and same_node and Path(cache_dir).is_dir():
                cache = CallCache(cache_dir)
            else:
                cache = self._recording = RecordingCache(tempfile.mkdtemp(prefix="colab-graphs-worker-"))
        self.client = ModelClient(cache, **client_options)
        self.runner: ShardRunner | None = None
        self._plan_id: str | None = None

    async def run_shard(self, plan: list[Any], shard: Shard, done: dict[str, list[Play]]) -> ShardResult:
        started = time.process_time()
        ref = plan[0]
        if self.runner is None or self._plan_id != ref.hex():
            self.runner, self._plan_id = ShardRunner(await ref, self.client), ref.hex()
        plays = await self.runner.run(shard, done)
        entries = self._recording.take_entries() if self._recording is not None else []
        return ShardResult(shard.index, plays, entries, time.process_time() - started)

    async def progress(self) -> int:
        """New plays finished in the shard this worker is playing."""
        return self.runner.plays_done if self.runner is not None else 0

    async def pid(self) -> int:
        return os.getpid()
