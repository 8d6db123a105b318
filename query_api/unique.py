"""The read side of unique counts (aggregation UNIQUE): estimates from the sketches that tile a range.

A UNIQUE namespace's counters count distinct items with HLL sketches per minute, hour and day (``sinks.sketches``,
kept by ``agents.sketches`` with the buckets, behind the same boundary). A read unions the sketches of the coarsest
buckets that tile its range (``sinks.windows.tile``, as a window's count does) and answers the estimate with its
bounds (2 standard deviations, about 95%):

* the total: the range since the counter's latest clear (or since the epoch) up to now; a bucket that ended at or
  before the clear is left out, and the bucket holding it was made of the items after it. A granularity past its
  retention is answered from the coarser ones (the presets keep days forever, so the total covers everything since
  the clear);
* a ``window``: its tiling, its edges aligned outwards (the answer says which range was counted);
* a ``dimensions`` filter: the combination counter's sketches (one counter, as for sums); ``group_by``: one estimate
  per registered value, and the filter's own estimate (groups may share items: they need not add up to it);
* ACCURATE (and AddAndGetCount's read-your-write): the items of the persisted events after the sketches' boundary
  are added to the union; a clear among them leaves only the items after it. A union is idempotent, so an item
  both in a sketch and in the live events counts once.

``as_of`` is the boundary the sketches are exact up to: the counter's rollup_ts (sketches are written before the
rollup that certifies them), or a later boundary a sketch read was computed at.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from control_plane import Namespace
from query_api.models import (
    UniqueCountResponse,
    UniqueDimensionCountResponse,
    UniqueDimensionWindowCountResponse,
    UniqueGroup,
    UniqueGroupedCountResponse,
    UniqueWindowCountResponse,
)
from query_api.responses import as_of_time, maybe_window, window_of
from query_api.service import GROUP_READS, CounterService, counted_or_retry
from query_api.windows import DEFAULT_MAX_BUCKETS, Series, granularity_of, parse_window
from schemas import Dimensions, MutationOp, ValidationError, combination, parse_generation_time
from sinks import BucketStore, EventStore, SketchStore
from sinks.sketches import Estimate, Union, estimate
from sinks.windows import Granularity, WindowError, is_masked, retained_from, series_range, tile

LIVE_SCAN_PAGE = 1000  # events per page of a live item scan

__all__ = ["UniqueCount", "UniqueGrouped", "UniqueResponse", "add_and_get_unique", "get_unique", "get_unique_groups",
           "live_items", "sketch_union", "unique_get_count", "unique_grouped_response", "unique_response",
           "unique_series"]


@dataclass(frozen=True, slots=True)
class UniqueCount:
    """A counter's distinct items: over the whole counter since its latest clear, or over the window
    ``[start_us, end_us)`` (aligned to its buckets) when one was asked for; exact up to ``as_of``."""

    ns: Namespace
    counter: str
    estimate: Estimate
    as_of: int | None
    start_us: int | None = None
    end_us: int | None = None


@dataclass(frozen=True, slots=True)
class UniqueGrouped:
    """GetCount with group_by in a UNIQUE namespace: the filter's estimate and one per value of ``group_by``."""

    ns: Namespace
    counter: str
    dimensions: Dimensions
    group_by: str
    groups: list[tuple[str, Estimate]]
    estimate: Estimate
    as_of: int | None
    start_us: int | None = None
    end_us: int | None = None


@dataclass(frozen=True, slots=True)
class SketchUnion:
    """The union of the sketches tiling ``[start_us, end_us)``, the latest boundary they were computed at, and the
    counter's latest clear."""

    union: Union
    start_us: int
    end_us: int
    upto_us: int
    clear_us: int | None


def _sketches(service: CounterService) -> SketchStore:
    if service.sketches is None:  # the app opens it whenever a namespace is UNIQUE
        raise RuntimeError("no sketch store: the service was built without one")
    return service.sketches


async def sketch_union(sketches: SketchStore, buckets: BucketStore, ns: Namespace, counter: str,
                       start_us: int | None, end_us: int, *, now_us: int) -> SketchUnion:
    """The union of ``counter``'s sketches tiling ``[start_us, end_us)`` (None: since its latest clear, or the
    epoch), masked by its latest clear. The clear is read *after* the sketches, as a window's count reads it after
    its buckets (``query_api.windows``): the worker bumps it before it writes the sketches computed with it, so no
    sketch read is masked by an older clear than it was made under. The total's range starts at the clear read
    before (one more call): a later clear only masks more of it."""
    assert ns.unique is not None
    lo = start_us
    if lo is None:
        lo = (await buckets.clears(ns.name, [counter])).get(counter, 0)
    chain = tuple(Granularity(g) for g in ns.windows.granularities)
    floors = {g: retained_from(g, now_us, ns.windows.retention_s(g)) for g in chain}
    try:
        tiling = tile(lo, end_us, chain, floors)
    except WindowError as exc:
        raise WindowError(exc.reason, field=exc.field or "window") from None
    found = await sketches.read_sketches_many(ns.name, [(counter, s.granularity, s.start_us, s.end_us)
                                                        for s in tiling.segments])
    clear_us = (await buckets.clears(ns.name, [counter])).get(counter)
    union = Union(ns.unique.lg_k)
    upto = 0
    for seg, rows in zip(tiling.segments, found, strict=True):
        for start, sketch, computed_upto in rows:
            upto = max(upto, computed_upto)
            if not is_masked(seg.granularity, start, clear_us, computed_upto):
                union.add_sketch(sketch)
    return SketchUnion(union, tiling.start_us, tiling.end_us, upto, clear_us)


async def live_items(events: EventStore, ns: Namespace, counter: str, after_us: int, upto_us: int,
                     items_upto_us: int | None = None) -> tuple[set[str], int | None]:
    """The items of the persisted events in ``(after_us, upto_us]`` after the latest clear among them (and no later
    than ``items_upto_us``: a window's end, when the scan goes on to find a clear after it), and that clear (None
    without one), read in bounded pages."""
    items: set[str] = set()
    clear: int | None = None
    if upto_us <= after_us:
        return items, clear
    last_item = upto_us if items_upto_us is None else items_upto_us
    cursor = None
    while True:
        page = await events.scan(ns.name, counter, after_us, upto_us, after=cursor, limit=LIVE_SCAN_PAGE)
        for _ns, _c, event_time, _id, item, _d, is_clear in page:
            if is_clear:
                items, clear = set(), event_time  # pages ascend by time: everything before it is erased
            elif item and (clear is None or event_time > clear) and event_time <= last_item:
                items.add(item)
        if len(page) < LIVE_SCAN_PAGE:
            return items, clear
        last = page[-1]
        cursor = (last[2], last[3], last[4])


async def get_unique(service: CounterService, ns: Namespace, counter: str,
                     window: Mapping[str, object] | None = None, *, now_us: int | None = None,
                     live: bool | None = None) -> UniqueCount:
    """A counter's distinct items (GetCount in a UNIQUE namespace): the total, or a window's; ``live`` (default:
    ACCURATE) adds the persisted events' items after the sketches' boundary."""
    now = time.time_ns() // 1000 if now_us is None else now_us
    buckets = service.buckets
    if buckets is None:
        raise RuntimeError("no bucket store: the service was built without one")
    start, end = parse_window(window, now) if window is not None else (None, now + 1)
    # The rollup before the sketches (as CounterService.get_window reads it before the buckets): a rollup writes its
    # sketches before its rollup_ts, so sketches read after are at least as fresh. Read the other way round, a
    # rollup landing in between moved as_of past items the sketches read did not hold, and the live items started
    # after them.
    _, rollup_ts = await service.rollup_of(ns, counter)
    got = await sketch_union(_sketches(service), buckets, ns, counter, start, end, now_us=now)
    service.signal_if_stale(ns, counter, rollup_ts)
    as_of = max(rollup_ts, got.upto_us)
    union = got.union
    if live is None:
        live = ns.counter_type.value == "ACCURATE"
    if live:
        horizon = service._live_horizon(ns)
        after = max(as_of, got.start_us - 1) if window is not None else as_of
        upto = min(got.end_us - 1, horizon) if window is not None else horizon
        # Scanned to the horizon: a clear after a window, not applied to its sketches yet, erases all of the window.
        items, clear = await live_items(service.events, ns, counter, after, horizon, items_upto_us=upto)
        if clear is not None:  # a live clear erases every item before it, the sketches' included
            union = Union(ns.unique.lg_k)  # type: ignore[union-attr]  # a UNIQUE namespace has its config
        union.add_items(items)
    span = (got.start_us, got.end_us) if window is not None else (None, None)
    return UniqueCount(ns, counter, union.estimate(), as_of or None, *span)


async def get_unique_groups(service: CounterService, ns: Namespace, counter: str, dimensions: Dimensions,
                            group_by: str, window: Mapping[str, object] | None = None) -> UniqueGrouped:
    """GetCount with group_by in a UNIQUE namespace: the filter's estimate and each registered value's."""
    names = await service.group_names(ns, counter, dimensions, group_by)
    todo = [combination(counter, dimensions), *(name for _, name in names)]
    now = time.time_ns() // 1000
    counted: list[UniqueCount] = []
    for i in range(0, len(todo), GROUP_READS):
        counted.extend(await asyncio.gather(*(get_unique(service, ns, name, window, now_us=now)
                                              for name in todo[i:i + GROUP_READS])))
    marks = [c.as_of for c in counted]
    as_of = None if any(not m for m in marks) else min(m for m in marks if m)
    total = counted[0]
    groups = [(value, c.estimate) for (value, _), c in zip(names, counted[1:], strict=True)]
    return UniqueGrouped(ns, counter, dimensions, group_by, groups, total.estimate, as_of, total.start_us,
                         total.end_us)


async def add_and_get_unique(service: CounterService, ns: Namespace, counter: str, token: str | None,
                             generation_time: str | int | float | None, dimensions: Mapping[str, Any] | None,
                             item: str | None, delta: int | None, item_key: str = "") -> UniqueCount:
    """AddAndGetCount in a UNIQUE namespace: the write, then the counter's estimate including its item (the
    sketches plus the live items after them), or NotCountedYet after a bounded wait."""
    delta = service.delta_of(ns, delta)
    _dims, valid_item = service.extras(ns, dimensions, item, delta=delta, item_key=item_key)
    written, acknowledged = await service.write_bounded(ns, counter, delta, MutationOp.ADD, token, generation_time,
                                                        item_key, dimensions, item, then_count=True)
    await service.acknowledged(acknowledged, written)
    with counted_or_retry(written):
        await service.wait_counted(written, valid_item)  # in a UNIQUE namespace the event's item key is its item
        return await get_unique(service, ns, counter, live=True)


async def unique_series(service: CounterService, ns: Namespace, counter: str, granularity: str,
                        start: str | int | float, end: str | int | float | None, *,
                        max_buckets: int = DEFAULT_MAX_BUCKETS) -> tuple[Series, int | None]:
    """GetCountSeries in a UNIQUE namespace: each bucket's distinct items (its sketch's estimate, rounded; 0 where
    nothing is stored or a clear erased it), zero-filled, and their as_of."""
    g = granularity_of(ns, granularity)
    now = time.time_ns() // 1000
    start_us, end_us = _series_time(start, "start"), now if end is None else _series_time(end, "end")
    lo, hi = series_range(g, start_us, end_us, now_us=now, retention_s=ns.windows.retention_s(g),
                          max_buckets=max_buckets)
    buckets = service.buckets
    if buckets is None:
        raise RuntimeError("no bucket store: the service was built without one")
    _, rollup_ts = await service.rollup_of(ns, counter)  # before the sketches, as get_unique reads it
    [rows] = await _sketches(service).read_sketches_many(ns.name, [(counter, g, lo, hi)])
    clear = (await buckets.clears(ns.name, [counter])).get(counter)  # after the sketches: see sketch_union
    stored = {start: (0 if is_masked(g, start, clear, u) else estimate(sketch).rounded) for start, sketch, u in rows}
    filled = tuple((start, stored.get(start, 0)) for start in range(lo, hi, g.width_us))
    upto = max((row[2] for row in rows), default=0)
    return Series(g, lo, hi, filled, upto), max(rollup_ts, upto) or None


def _series_time(value: str | int | float, field: str) -> int:
    try:
        return parse_generation_time(value, field=field)
    except ValidationError as exc:
        raise WindowError(exc.reason, field=field) from None


# -- responses -----------------------------------------------------------------------------------------------


def _bounds(e: Estimate) -> dict[str, Any]:
    return {"count": e.rounded, "estimate": e.estimate, "lower_bound": e.lower_bound, "upper_bound": e.upper_bound}


def unique_response(u: UniqueCount, counter: str | None = None, dimensions: Dimensions = ()) -> UniqueResponse:
    """The response of a UNIQUE GetCount (or AddAndGetCount): with its window and dimensions filter, if any.
    ``counter``: the base counter a combination counter's estimate is answered under."""
    fields: dict[str, Any] = {"namespace": u.ns.name, "counter_name": counter or u.counter,
                              "counter_type": u.ns.counter_type.value, "as_of": as_of_time(u.as_of),
                              **_bounds(u.estimate)}
    if u.start_us is not None and u.end_us is not None:
        window = window_of(u.start_us, u.end_us)
        if dimensions:
            return UniqueDimensionWindowCountResponse(**fields, window=window, dimensions=dict(dimensions))
        return UniqueWindowCountResponse(**fields, window=window)
    if dimensions:
        return UniqueDimensionCountResponse(**fields, dimensions=dict(dimensions))
    return UniqueCountResponse(**fields)


def unique_grouped_response(g: UniqueGrouped) -> UniqueGroupedCountResponse:
    window = maybe_window(g.start_us, g.end_us)
    return UniqueGroupedCountResponse(
        namespace=g.ns.name, counter_name=g.counter, counter_type=g.ns.counter_type.value,
        dimensions=dict(g.dimensions), group_by=g.group_by,
        groups=[UniqueGroup(value=v, **_bounds(e)) for v, e in g.groups], as_of=as_of_time(g.as_of), window=window,
        **_bounds(g.estimate))


async def unique_get_count(service: CounterService, ns: Namespace, counter: str, dimensions: Dimensions,
                           group_by: str | None, window: Mapping[str, object] | None
                           ) -> UniqueResponse | UniqueGroupedCountResponse:
    """GetCount in a UNIQUE namespace, as the route answers it."""
    if group_by is not None:
        return unique_grouped_response(await get_unique_groups(service, ns, counter, dimensions, group_by, window))
    return unique_response(await get_unique(service, ns, combination(counter, dimensions), window), counter,
                           dimensions)


UniqueResponse = (UniqueCountResponse | UniqueWindowCountResponse | UniqueDimensionCountResponse
                  | UniqueDimensionWindowCountResponse)
