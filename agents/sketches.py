"""Unique counts follow the rollup: recompute a batch of counters' minute, hour and day sketches (invariant 7).

In a UNIQUE namespace (``ns.unique``) every bucket also has an HLL sketch of the items counted in it
(``sinks.sketches``). When a counter's rollup moves from ``rollup_ts`` to a boundary ``B``, right after its buckets
(``agents.windows.maintain_buckets``, same steps, same guards) and before the rollup that certifies both:

1. minutes: every minute meeting ``(rollup_ts, B]`` is rebuilt whole from its events (from the minute's start to
   ``B``): a sketch of the items of the adds strictly after the latest clear inside the minute
   (``EventStore.bucket_items_many``, one call for the batch);
2. hours: every hour holding such a minute is the union of its minutes as read after the counter's latest clear
   (a minute that ended at or before it is left out; those before the recomputed range are read back from the
   sketch store); days likewise from hours;
3. every recomputed sketch still within its granularity's retention is written forward-only at ``B``.

A union is idempotent and a sketch is rebuilt from immutable events, so a re-run step, a replay or a recount
computes the same sketches again: nothing a retry or a duplicate does can move an estimate. Sources are guarded as
for buckets: in a recount, minutes only from events newer than ``delete_after``; parents only from children still
retained (or recomputed in this call), or in a worker's step the stored parent with the items of its events since
(``agents.windows.continued_parents``); the rest is left as stored. A worker's step (``worker_step``) starts from
rollup_ts however late it runs (``agents.windows.events_floor``).

Clears are the bucket store's (``maintain_buckets`` bumps them first): readers mask sketches with them as they
mask buckets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agents.windows import (
    BucketWork,
    continued_parents,
    events_floor,
    merge_steps,
    minutes_from,
    recompute_parents,
    retention_floor,
)
from control_plane import Namespace
from sinks import BucketStore, EventStore, SketchStore
from sinks.sketches import BucketItems, SketchRow, Union, sketch_of
from sinks.windows import CHAIN, BucketRange, Granularity, is_masked

__all__ = ["SketchMaintenance", "maintain_sketches"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SketchMaintenance:
    """What one call did: sketches recomputed and written (applied forward-only) per granularity, and touched
    hours/days left as stored because their sources may be gone."""

    computed: Mapping[Granularity, int] = field(default_factory=dict)
    written: Mapping[Granularity, int] = field(default_factory=dict)
    skipped: Mapping[Granularity, int] = field(default_factory=dict)


async def maintain_sketches(ns: Namespace, items: Iterable[BucketWork | tuple[str, int, int, int | None]], *,
                            events: EventStore, sketches: SketchStore, buckets: BucketStore,
                            now_us: int | None = None, worker_step: bool = False) -> SketchMaintenance:
    """Recompute the sketches of a batch of counters of a UNIQUE namespace for their rollup steps (module doc).

    A handful of store calls for the whole batch: the minutes' items, the stored clears, the stored children of
    the touched hours and days, and the writes. Nothing for a namespace that is not UNIQUE. ``worker_step``: the
    worker's rollups, as ``continue_minutes`` for buckets (no events floor); off, a recount's step.
    """
    if ns.unique is None:
        return SketchMaintenance()
    lg_k = ns.unique.lg_k
    chain = tuple(g for g in CHAIN if ns.windows.enabled(g))
    work = merge_steps(BucketWork(*item) for item in items)
    if not chain or not work:
        return SketchMaintenance()
    now = time.time_ns() // 1000 if now_us is None else now_us
    store_floor = {g: retention_floor(now, ns.windows.retention_s(g)) for g in chain}
    minute = Granularity.MINUTE

    # 1. minutes, from the items of every minute meeting (rollup_ts, B], each rebuilt whole
    known_from = minutes_from(work, events_floor(ns, now, worker_step=worker_step))
    todo = [w for w in work if known_from[w.counter] <= w.boundary]
    windows = [(w.counter, known_from[w.counter] - 1, w.boundary) for w in todo]
    found = await events.bucket_items_many(ns.name, windows, minute.width_us) if windows else []
    computed: dict[Granularity, dict[tuple[str, int], bytes]] = {g: {} for g in chain}
    new_clears: dict[str, int] = {w.counter: w.last_clear_us for w in work if w.last_clear_us is not None}
    for w, per_minute in zip(todo, found, strict=True):
        for start, minute_items, clear, _events in per_minute:
            computed[minute][(w.counter, start)] = sketch_of(minute_items, lg_k)
            if clear is not None and clear > new_clears.get(w.counter, clear - 1):
                new_clears[w.counter] = clear
    if not computed[minute] and not new_clears:
        return SketchMaintenance()
    stored_clears = await buckets.clears(ns.name, [w.counter for w in work]) if len(chain) > 1 else {}
    clear_of = {**stored_clears, **{c: max(t, stored_clears.get(c, t)) for c, t in new_clears.items()}}
    boundary = {w.counter: w.boundary for w in work}

    # 2. hours from minutes, days from hours: unions of the touched parents whose children are all at hand
    def union_of(counter: str, child: Granularity, children: Mapping[int, bytes]) -> bytes:
        union = Union(lg_k)
        for start, sketch in children.items():
            if not is_masked(child, start, clear_of.get(counter)):
                union.add_sketch(sketch)
        return union.sketch()

    async def read_children(ranges: list[BucketRange]) -> list[list[tuple[int, bytes, int]]]:
        return await sketches.read_sketches_many(ns.name, ranges)

    async def continue_sketches(keys: list[tuple[str, int]], parent: Granularity) -> dict[tuple[str, int], bytes]:
        stored = await sketches.read_sketches_many(ns.name, [(c, parent, p, p + 1) for c, p in keys])
        return await continued_parents(keys, parent, stored, steps, events.bucket_items_many, ns.name, add_items)

    def add_items(_counter: str, before: bytes | None, bucket: BucketItems | None) -> bytes:
        union = Union(lg_k)
        if before:
            union.add_sketch(before)
        if bucket is not None:
            union.add_items(bucket[1])
        return union.sketch()

    steps = {w.counter: w for w in work}
    skipped = await recompute_parents(chain, computed, known_from, store_floor, read_children, union_of,
                                      continue_sketches if worker_step else None)
    if skipped:
        log.warning("namespace %r: %s left as stored: their finer sketches or events are past retention",
                    ns.name, ", ".join(f"{n} {g} sketch(es)" for g, n in skipped.items()))

    # 3. every recomputed sketch still within its own retention, forward-only at the step's boundary
    rows: list[SketchRow] = [(c, g, start, sketch, boundary[c]) for g in chain
                             for (c, start), sketch in sorted(computed[g].items())
                             if start + g.width_us > store_floor[g]]
    applied = await sketches.write_sketches(ns.name, rows) if rows else []
    written: dict[Granularity, int] = {}
    for (_c, g, *_rest), ok in zip(rows, applied, strict=True):
        written[g] = written.get(g, 0) + ok
    return SketchMaintenance({g: len(computed[g]) for g in chain}, written, skipped)
