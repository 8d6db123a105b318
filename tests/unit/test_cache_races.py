"""Reads racing rollups: a cached count never goes back to an older rollup, a windowed ACCURATE read never misses
the events a rollup certified while it read, and the API's own in-process cache keeps a value at most 1 s.

Real SQLite stores and the real rollup; the rollup is run at the point where another process's could land
(right after a store read returns). The memcached cache's compare-and-set is in tests/integration/test_cache.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from agents.rollup import rollup_counter
from control_plane import Namespace, parse_namespaces
from query_api.service import CounterService
from schemas import MICROS
from sinks import InProcessRollupCache, Partitioning, SqliteBucketStore, SqliteEventStore, SqliteRollupStore, open_cache
from sinks.model import RollupState

REGISTRY = parse_namespaces({"namespaces": {
    "ev": {"counter_type": "EVENTUAL", "accept_limit": "2s", "max_clock_skew": "500ms"},
    "acc": {"counter_type": "ACCURATE", "accept_limit": "2s", "max_clock_skew": "500ms"},
    "ev_ttl": {"counter_type": "EVENTUAL", "accept_limit": "2s", "max_clock_skew": "500ms", "ttl": "1h"}}})


class Signals:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def emit(self, namespace: str, counter: str) -> None:
        self.sent.append((namespace, counter))


class RacingRollups(SqliteRollupStore):
    """The real store; `meanwhile` runs once, right after a `get` returns (a worker's rollup landing then)."""

    meanwhile: Any = None

    async def get(self, namespace: str, counter: str) -> RollupState | None:
        state = await super().get(namespace, counter)
        if self.meanwhile is not None:
            hook, self.meanwhile = self.meanwhile, None
            await hook()
        return state


class RacingBuckets(SqliteBucketStore):
    meanwhile: Any = None

    async def read_buckets_many(self, *args: Any, **kwargs: Any) -> Any:
        rows = await super().read_buckets_many(*args, **kwargs)
        if self.meanwhile is not None:
            hook, self.meanwhile = self.meanwhile, None
            await hook()
        return rows


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.events = SqliteEventStore(tmp_path / "e.db", lambda ns: Partitioning.of(REGISTRY[ns].time_partition))
        self.rollups = RacingRollups(tmp_path / "r.db")
        self.buckets = RacingBuckets(tmp_path / "b.db")
        self.now = time.time_ns() // 1000
        self.t1, self.t2 = self.now - 20 * MICROS, self.now - 15 * MICROS

    async def write(self, ns: str, at: int, token: str) -> None:
        await self.events.write_events([(ns, "c", at, token, "", 1, False)])
        await self.rollups.bump_last_write([(ns, "c", at)])

    async def rollup(self, ns: Namespace, cache: Any, upto: int) -> int:
        result = await rollup_counter(ns, "c", events=self.events, rollups=self.rollups, cache=cache,
                                      buckets=self.buckets, watermark_us=upto + 3 * MICROS, now_us=self.now)
        return result.count

    def service(self, cache: Any, signals: Signals | None = None) -> CounterService:
        return CounterService(REGISTRY, producer=None, signals=signals or Signals(), events=self.events,
                              rollups=self.rollups, cache=cache, counters=None, buckets=self.buckets)

    async def close(self) -> None:
        await self.events.close()
        await self.rollups.close()
        await self.buckets.close()


def run(tmp_path: Path, scenario: Any) -> Any:
    async def main() -> Any:
        world = World(tmp_path)
        try:
            return await scenario(world)
        finally:
            await world.close()
    return asyncio.run(main())


def test_a_read_filling_the_cache_after_a_miss_never_replaces_a_rollup_cached_meanwhile(tmp_path: Path) -> None:
    """The API reads the store on a miss (count 1), the worker rolls up to 2 and caches it, the API's fill lands
    last: before, it cached 1 for good (no TTL, and a standing watermark sends no read signal)."""
    async def scenario(w: World) -> tuple[int, list[int], tuple[int, int] | None]:
        ev, cache = REGISTRY["ev"], InProcessRollupCache()
        await w.write("ev", w.t1, "tok1")
        await w.rollup(ev, cache, w.t1)
        await cache.delete("ev", "c")  # evicted, or memcached restarted: the next read misses
        await w.write("ev", w.t2, "tok2")
        w.rollups.meanwhile = lambda: w.rollup(ev, cache, w.t2)
        svc = w.service(cache)
        first = (await svc.get(ev, "c")).count
        return first, [(await svc.get(ev, "c")).count for _ in range(3)], await cache.get("ev", "c")

    first, later, cached = run(tmp_path, scenario)
    assert first == 1  # what the store held when read
    assert later == [2, 2, 2] and cached is not None and cached[0] == 2


def test_an_accurate_window_read_racing_a_rollup_still_counts_every_event(tmp_path: Path) -> None:
    async def scenario(w: World) -> list[int]:
        acc, cache = REGISTRY["acc"], InProcessRollupCache()
        await w.write("acc", w.t1, "tok1")
        await w.rollup(acc, cache, w.t1)
        await w.write("acc", w.t2, "tok2")
        svc = w.service(cache)
        before = (await svc.get_window(acc, "c", {"last": "1h"})).count
        w.buckets.meanwhile = lambda: w.rollup(acc, cache, w.t2)
        raced = (await svc.get_window(acc, "c", {"last": "1h"})).count
        return [before, raced, (await svc.get_window(acc, "c", {"last": "1h"})).count]

    assert run(tmp_path, scenario) == [2, 2, 2]


def test_the_apis_in_process_cache_keeps_a_value_at_most_a_second_whatever_the_namespace_ttl(
        tmp_path: Path) -> None:
    """`query_api.app` opens its cache so; the worker's rollups never reach an in-process cache of the API."""
    async def scenario(w: World) -> tuple[int, int]:
        ns = REGISTRY["ev_ttl"]
        api_cache = open_cache(None, local_max_ttl_s=1.0)
        worker_cache = InProcessRollupCache()
        await w.write("ev_ttl", w.t1, "tok1")
        await w.rollup(ns, worker_cache, w.t1)
        svc = w.service(api_cache)
        first = (await svc.get(ns, "c")).count
        await w.write("ev_ttl", w.t2, "tok2")
        await w.rollup(ns, worker_cache, w.t2)
        assert isinstance(api_cache, InProcessRollupCache)
        api_cache._clock = lambda: time.monotonic() + 1.5  # 1.5 s on
        return first, (await svc.get(ns, "c")).count

    assert run(tmp_path, scenario) == (1, 2)


def test_in_process_advance_keeps_the_later_rollup_and_max_ttl_caps_every_entry() -> None:
    async def scenario() -> list[Any]:
        now = [100.0]
        cache = InProcessRollupCache(max_ttl_s=1.0, clock=lambda: now[0])
        await cache.advance("n", "c", 5, 200)
        await cache.advance("n", "c", 3, 100)  # older: kept out
        seen = [await cache.get("n", "c")]
        await cache.advance("n", "c", 7, 200)  # the same rollup (a recount's repair): taken
        seen.append(await cache.get("n", "c"))
        await cache.set("n", "c", 1, 50)  # set is unconditional
        seen.append(await cache.get("n", "c"))
        await cache.set("n", "forever", 1, 1, ttl_s=0)
        await cache.set("n", "hour", 1, 1, ttl_s=3600)
        now[0] += 1.5
        seen.append((await cache.get("n", "forever"), await cache.get("n", "hour")))
        await cache.advance("n", "c", 2, 10)  # the later one expired: an older one may fill
        seen.append(await cache.get("n", "c"))
        return seen

    assert asyncio.run(scenario()) == [(5, 200), (7, 200), (1, 50), (None, None), (2, 10)]
