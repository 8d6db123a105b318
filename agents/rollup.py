"""Rollup: aggregate each signalled counter's immutable window (rollup_ts, B] and move its rollup forward.

Counters whose last write is still ahead of their new rollup are returned for re-signalling, so every
touched counter keeps circulating until it has converged (DESIGN invariant 6).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from control_plane import Namespace, NamespaceRegistry
from control_plane.admission import rollup_boundary
from sinks import EventStore, RollupCache, RollupStore, apply_aggregate

log = logging.getLogger(__name__)

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class RollupResult:
    key: Key
    count: int
    rollup_ts: int
    applied: bool
    pending: bool  # last write still ahead of the rollup: signal again


def global_watermark(marks: Mapping[int, int], partitions: int) -> int:
    """The minimum over every mutations partition; 0 (hold everything) until each has reported."""
    if partitions <= 0 or any(p not in marks for p in range(partitions)):
        return 0
    return min(marks[p] for p in range(partitions))


async def rollup_counter(ns: Namespace, counter: str, *, events: EventStore, rollups: RollupStore,
                         cache: RollupCache, watermark_us: int, now_us: int | None = None) -> RollupResult:
    """Roll one counter up to the latest immutable boundary and refresh its cache value."""
    key = (ns.name, counter)
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    boundary = rollup_boundary(now_us, watermark_us, ns)
    state = await rollups.get(ns.name, counter)
    count, rollup_ts, last_write = (state.count, state.rollup_ts, state.last_write_ts) if state else (0, 0, 0)
    if boundary <= rollup_ts:
        await cache.set(ns.name, counter, count, rollup_ts, ns.ttl_s)
        return RollupResult(key, count, rollup_ts, False, last_write > rollup_ts)
    agg = await events.aggregate(ns.name, counter, rollup_ts, boundary)
    new_count = apply_aggregate(count, agg)
    applied = await rollups.write_rollup(ns.name, counter, new_count, boundary)
    if applied:
        await cache.set(ns.name, counter, new_count, boundary, ns.ttl_s)
        return RollupResult(key, new_count, boundary, True, last_write > boundary)
    # Another worker moved it further meanwhile: its value is at least as fresh; keep circulating if needed.
    fresh = await rollups.get(ns.name, counter)
    if fresh is None:
        return RollupResult(key, new_count, boundary, False, True)
    await cache.set(ns.name, counter, fresh.count, fresh.rollup_ts, ns.ttl_s)
    return RollupResult(key, fresh.count, fresh.rollup_ts, False, fresh.last_write_ts > fresh.rollup_ts)


class BackPressure:
    """Adaptive pause between rollup batches: a fraction of how long the previous batch took, capped."""

    def __init__(self, ratio: float = 0.25, max_pause_s: float = 0.5) -> None:
        self.ratio = ratio
        self.max_pause_s = max_pause_s
        self.last_batch_s = 0.0

    @property
    def pause_s(self) -> float:
        return min(self.max_pause_s, self.last_batch_s * self.ratio)


async def rollup_many(keys: Iterable[Key], registry: NamespaceRegistry, *, events: EventStore,
                      rollups: RollupStore, cache: RollupCache, watermark: Callable[[], Awaitable[int]],
                      pressure: BackPressure) -> list[RollupResult]:
    """Roll up a coalesced set of counters, `rollup_batch_count` at a time per namespace."""
    by_ns: dict[str, list[str]] = defaultdict(list)
    for ns_name, counter in keys:
        by_ns[ns_name].append(counter)
    results: list[RollupResult] = []
    first = True
    for ns_name, counters in by_ns.items():
        ns = registry.get(ns_name)
        if ns is None:
            log.warning("rollup signal for unknown namespace %r ignored", ns_name)
            continue
        step = max(1, ns.rollup_batch_count)
        for i in range(0, len(counters), step):
            if not first and pressure.pause_s:
                await asyncio.sleep(pressure.pause_s)
            first = False
            mark = await watermark()
            started = time.monotonic()
            results.extend(await asyncio.gather(*(
                rollup_counter(ns, c, events=events, rollups=rollups, cache=cache, watermark_us=mark)
                for c in counters[i:i + step])))
            pressure.last_batch_s = time.monotonic() - started
    return results
