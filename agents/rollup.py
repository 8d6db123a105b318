"""Rollup: aggregate each signalled counter's immutable window (rollup_ts, B] and move its rollup forward.

Counters whose last write is still ahead of their new rollup are returned for re-signalling, so every
touched counter keeps circulating until it has converged (DESIGN invariant 6). The rollup agent's coalesced sets
of counters go through `agents.rollup_batches`, which rolls them up in batches and through store outages.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agents.sketches import maintain_sketches
from agents.windows import BucketWork, maintain_buckets
from control_plane import Namespace
from control_plane.admission import rollup_boundary
from sinks import BucketStore, EventStore, RollupCache, RollupStore, SketchStore, apply_aggregate

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
                         cache: RollupCache, watermark_us: int, now_us: int | None = None,
                         buckets: BucketStore | None = None, sketches: SketchStore | None = None) -> RollupResult:
    """Roll one counter up to the latest immutable boundary and refresh its cache value."""
    [result] = await rollup_counters(ns, [counter], events=events, rollups=rollups, cache=cache,
                                     watermark_us=watermark_us, now_us=now_us, buckets=buckets, sketches=sketches)
    return result


async def rollup_counters(ns: Namespace, counters: Sequence[str], *, events: EventStore, rollups: RollupStore,
                          cache: RollupCache, watermark_us: int, now_us: int | None = None,
                          buckets: BucketStore | None = None, sketches: SketchStore | None = None
                          ) -> list[RollupResult]:
    """Roll counters of one namespace up to the latest immutable boundary and refresh their cache values.

    Three store calls for the whole batch (states, aggregates, forward-only writes) rather than three per
    counter: on SQLite each call is a hand-off to the store's thread, which cost more than the query. With a
    bucket store and a namespace that keeps windows, the batch's minute/hour/day buckets are recomputed up to
    the same boundary first (agents.windows), so a rollup_ts always certifies its buckets; with a sketch store and
    a UNIQUE namespace, their sketches next (agents.sketches), so it certifies the sketches too.
    Returns one result per distinct counter, in order.
    """
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    boundary = rollup_boundary(now_us, watermark_us, ns)
    names = list(dict.fromkeys(counters))
    states = await rollups.get_many([(ns.name, c) for c in names])
    results: dict[str, RollupResult] = {}
    to_cache: list[tuple[str, int, int]] = []
    todo: list[tuple[str, int, int, int]] = []  # counter, count, rollup_ts, last_write_ts
    for c in names:
        st = states.get((ns.name, c))
        count, rollup_ts, last_write = (st.count, st.rollup_ts, st.last_write_ts) if st else (0, 0, 0)
        if boundary <= rollup_ts:
            to_cache.append((c, count, rollup_ts))
            results[c] = RollupResult((ns.name, c), count, rollup_ts, False, last_write > rollup_ts)
        else:
            todo.append((c, count, rollup_ts, last_write))
    if todo:
        aggs = await events.aggregate_many(ns.name, [(c, rollup_ts, boundary) for c, _, rollup_ts, _ in todo])
        if buckets is not None and ns.windows:
            work = [BucketWork(c, rollup_ts, boundary, agg.last_clear_us)
                    for (c, _, rollup_ts, _), agg in zip(todo, aggs, strict=True)]
            await maintain_buckets(ns, work, events=events, buckets=buckets, now_us=now_us, continue_minutes=True)
            if sketches is not None and ns.counts_unique:
                await maintain_sketches(ns, work, events=events, sketches=sketches, buckets=buckets, now_us=now_us,
                                        worker_step=True)
        new_counts = [apply_aggregate(count, agg, (ns.name, c))  # saturated at the int64 bounds
                      for (c, count, _, _), agg in zip(todo, aggs, strict=True)]
        applied = await rollups.write_rollups(ns.name, [(c, n, boundary) for (c, *_), n in
                                                        zip(todo, new_counts, strict=True)])
        raced: list[tuple[str, int]] = []
        for (c, _, _, last_write), n, ok in zip(todo, new_counts, applied, strict=True):
            if ok:
                to_cache.append((c, n, boundary))
                results[c] = RollupResult((ns.name, c), n, boundary, True, last_write > boundary)
            else:
                raced.append((c, n))
        if raced:  # another worker moved them further meanwhile: its values are at least as fresh
            fresh = await rollups.get_many([(ns.name, c) for c, _ in raced])
            for c, n in raced:
                f = fresh.get((ns.name, c))
                if f is None:
                    results[c] = RollupResult((ns.name, c), n, boundary, False, True)
                    continue
                to_cache.append((c, f.count, f.rollup_ts))
                results[c] = RollupResult((ns.name, c), f.count, f.rollup_ts, False, f.last_write_ts > f.rollup_ts)
    await cache.advance_many((ns.name, c, n, ts, ns.ttl_s) for c, n, ts in to_cache)
    return [results[c] for c in names]


class BackPressure:
    """Adaptive pause between rollup batches: a fraction of how long the previous batch took, capped."""

    def __init__(self, ratio: float = 0.25, max_pause_s: float = 0.5) -> None:
        self.ratio = ratio
        self.max_pause_s = max_pause_s
        self.last_batch_s = 0.0

    @property
    def pause_s(self) -> float:
        return min(self.max_pause_s, self.last_batch_s * self.ratio)
