"""Time buckets follow the rollup: recompute a batch of counters' minute, hour and day buckets (invariant 7).

When a counter's rollup moves from ``rollup_ts`` to a boundary ``B`` (behind the persist watermark and the
accept limit), every bucket that can have changed is **recomputed**, never incremented, and written
forward-only with ``computed_upto = B``:

1. minutes: every minute meeting ``(rollup_ts, B]`` is summed from its events, whole (from the minute's start
   to ``B``): the adds strictly after the latest clear inside the minute (``EventStore.bucket_sums_many``). In
   the worker's rollups the minute holding ``rollup_ts`` is the one exception: when its stored sum was computed
   up to exactly ``rollup_ts``, the sum continues from it with the minute's events of ``(rollup_ts, B]``
   (restarting after a clear among them). It is the same value, since the events up to ``rollup_ts`` are
   immutable, read at the cost of the new events instead of every event of the minute (a recount, which checks
   the stored buckets against the events, always sums whole);
2. hours: every hour holding such a minute is the masked sum of its minutes (those before the recomputed
   range read back from the store); days likewise from hours. Only the namespace's granularities are kept.
   Every bucket is saturated at the int64 bounds, as a counter's count is (``sinks.model.saturate``).
3. the counter's latest clear is bumped before the buckets are written, so masking at read time (a bucket that
   ended at or before the clear reads 0) never shows the rewritten bucket under an older clear.

Re-running a step, a replay or a recount recomputes the same values from the same immutable events: the writes
are refused (same boundary) or rewrite equal values (later boundary), so nothing is counted twice. Call it
*before* writing the rollup that moves ``rollup_ts`` to ``B``: a crash in between leaves the rollup behind and
the next rollup recomputes the same buckets, and a rollup_ts then always certifies its buckets.

A bucket is recomputed only while its sources are complete: hours from minutes still within their retention or
recomputed in this call, days likewise from hours (in a worker's step, an hour whose earlier minutes are past
their retention continues from its stored sum with its events since: `continued_parents`); and, in a recount
(which recomputes from before the counter's rollup_ts), minutes from events newer than the namespace's
``delete_after`` only (older rolled-up ones may be deleted). A recount from zero thus rebuilds what the events
still support and leaves older buckets as they were, instead of overwriting them with partial sums. A worker's
step (``continue_minutes``) starts from the counter's rollup_ts however late it runs: no store deletes an event a
rollup has not passed (SQLite deletes rolled-up events only; Cassandra's TTL backstop, when a rollup stalls past
it, takes the events from the rollup's total as well), so its minutes hold exactly what its rollup adds and the
buckets since the last clear keep summing to the total.
Buckets already past their own retention are used for their parents but not written back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple, TypeVar

from control_plane import Namespace
from sinks import BucketStore, EventStore
from sinks.model import saturate
from sinks.windows import CHAIN, BucketRange, BucketRow, BucketSum, Granularity, align_down, align_up, masked

__all__ = ["BucketWork", "Maintenance", "continued_parents", "events_floor", "maintain_buckets", "merge_steps",
           "minutes_from", "recompute_parents", "retention_floor"]

log = logging.getLogger(__name__)

_US = 1_000_000
_NEVER = -(2**63)  # a floor that excludes nothing


class BucketWork(NamedTuple):
    """One counter's rollup step: from ``rollup_ts`` (0: never rolled up) to ``boundary``, with the latest clear
    at or before the boundary if the caller knows one (the rollup's aggregate); clears found in the recomputed
    minutes count too."""

    counter: str
    rollup_ts: int
    boundary: int
    last_clear_us: int | None = None


@dataclass(frozen=True, slots=True)
class Maintenance:
    """What one call did: buckets recomputed and written (applied forward-only) per granularity, and touched
    hours/days left as stored because their sources may be gone (see the module doc)."""

    computed: Mapping[Granularity, int] = field(default_factory=dict)
    written: Mapping[Granularity, int] = field(default_factory=dict)
    skipped: Mapping[Granularity, int] = field(default_factory=dict)
    clears: int = 0


async def maintain_buckets(ns: Namespace, items: Iterable[BucketWork | tuple[str, int, int, int | None]], *,
                           events: EventStore, buckets: BucketStore, now_us: int | None = None,
                           continue_minutes: bool = False) -> Maintenance:
    """Recompute the buckets of a batch of counters of ``ns`` for their rollup steps (see the module doc).

    ``continue_minutes``: the worker's rollups. The minute holding a step's rollup_ts may continue from its stored
    sum, and the step starts from rollup_ts however old (see the module doc). Off (a recount), every minute is
    summed whole from its events, which must be newer than ``delete_after``: a recount compares the stored buckets
    with what the events say, so it must not start from a stored one, nor from events that may be gone.

    A handful of store calls for the whole batch, never one per counter or bucket: the minutes' sums, the
    stored clears, the stored children of the touched hours and days, the clears' bump and the writes.
    """
    chain = tuple(g for g in CHAIN if ns.windows.enabled(g))
    work = merge_steps(BucketWork(*item) for item in items)
    if not chain or not work:
        return Maintenance()
    now = time.time_ns() // 1000 if now_us is None else now_us
    store_floor = {g: retention_floor(now, ns.windows.retention_s(g)) for g in chain}  # buckets ending after it kept
    minute = Granularity.MINUTE

    # 1. minutes, from the events of every minute meeting (rollup_ts, B], each summed whole; the minute holding
    #    rollup_ts continues from its stored sum when that sum was computed up to exactly rollup_ts
    known_from = minutes_from(work, events_floor(ns, now, worker_step=continue_minutes))
    todo = [w for w in work if known_from[w.counter] <= w.boundary]
    partial = await _stored_partial_minutes(ns.name, todo, known_from, buckets) if continue_minutes else {}
    windows = [(w.counter, w.rollup_ts if w.counter in partial else known_from[w.counter] - 1, w.boundary)
               for w in todo]
    sums = await events.bucket_sums_many(ns.name, windows, minute.width_us) if windows else []
    computed: dict[Granularity, dict[tuple[str, int], int]] = {g: {} for g in chain}
    new_clears: dict[str, int] = {w.counter: w.last_clear_us for w in work if w.last_clear_us is not None}
    for w, per_minute in zip(todo, sums, strict=True):
        before = partial.get(w.counter)
        if before is not None:  # the minute's sum up to rollup_ts, whatever (rollup_ts, B] adds to it below
            computed[minute][(w.counter, known_from[w.counter])] = before
        for start, value, clear, _events in per_minute:
            if before is not None and start == known_from[w.counter] and clear is None:
                value += before  # no clear after rollup_ts in the minute: its earlier adds still count
            computed[minute][(w.counter, start)] = saturate(value, (ns.name, w.counter))  # a bucket is an int64
            if clear is not None and clear > new_clears.get(w.counter, clear - 1):
                new_clears[w.counter] = clear
    if not computed[minute] and not new_clears:
        return Maintenance()
    # parents are summed as read after the latest clear, stored or new (minutes alone need no masking)
    stored_clears = await buckets.clears(ns.name, [w.counter for w in work]) if len(chain) > 1 else {}
    clear_of = {**stored_clears, **{c: max(t, stored_clears.get(c, t)) for c, t in new_clears.items()}}
    boundary = {w.counter: w.boundary for w in work}

    # 2. hours from minutes, days from hours: the touched parents whose children are all at hand
    def add_up(counter: str, child: Granularity, children: Mapping[int, int]) -> int:
        return saturate(sum(masked(child, start, value, clear_of.get(counter)) for start, value in children.items()),
                        (ns.name, counter))

    async def read_children(ranges: list[BucketRange]) -> list[list[tuple[int, int, int]]]:
        return await buckets.read_buckets_many(ns.name, ranges)

    async def continue_sums(keys: list[tuple[str, int]], parent: Granularity) -> dict[tuple[str, int], int]:
        stored = await buckets.read_buckets_many(ns.name, [(c, parent, p, p + 1) for c, p in keys])
        return await continued_parents(keys, parent, stored, steps, events.bucket_sums_many, ns.name, add_sum)

    def add_sum(counter: str, before: int | None, bucket: BucketSum | None) -> int:
        return saturate((before or 0) + (bucket[1] if bucket is not None else 0), (ns.name, counter))

    steps = {w.counter: w for w in work}
    skipped = await recompute_parents(chain, computed, known_from, store_floor, read_children, add_up,
                                      continue_sums if continue_minutes else None)
    if skipped:
        log.warning("namespace %r: %s left as stored: their finer buckets or events are past retention",
                    ns.name, ", ".join(f"{n} {g}(s)" for g, n in skipped.items()))

    # 3. the clears first, then every recomputed bucket still within its own retention
    if new_clears:
        await buckets.bump_clears(ns.name, sorted(new_clears.items()))
    rows: list[BucketRow] = [(c, g, start, value, boundary[c]) for g in chain
                             for (c, start), value in sorted(computed[g].items())
                             if start + g.width_us > store_floor[g]]
    applied = await buckets.write_buckets(ns.name, rows) if rows else []
    written: dict[Granularity, int] = {}
    for (_c, g, *_rest), ok in zip(rows, applied, strict=True):
        written[g] = written.get(g, 0) + ok
    return Maintenance({g: len(computed[g]) for g in chain}, written, skipped, len(new_clears))


async def _stored_partial_minutes(namespace: str, work: list[BucketWork], known_from: Mapping[str, int],
                                  buckets: BucketStore) -> dict[str, int]:
    """Per counter whose rollup_ts lies inside its first minute to recompute: that minute's stored sum, if it
    was computed up to exactly rollup_ts (as the previous step wrote it). The events up to rollup_ts are
    immutable, so that sum plus the minute's events of (rollup_ts, B] is the whole-minute sum, read without
    reading the minute's earlier events again: a busy counter's rollup then costs its new events, not every
    event of the current minute (measured: the rollups after a burst took 1.7 s longer with minute buckets).
    Counters without such a row (a first rollup, a minute past retention, a replay's step) are summed whole."""
    minute = Granularity.MINUTE
    inside = [w for w in work if known_from[w.counter] <= w.rollup_ts]
    if not inside:
        return {}
    ranges: list[BucketRange] = [(w.counter, minute, known_from[w.counter], known_from[w.counter] + 1)
                                 for w in inside]
    stored = await buckets.read_buckets_many(namespace, ranges)
    return {w.counter: rows[0][1] for w, rows in zip(inside, stored, strict=True)
            if rows and rows[0][0] == known_from[w.counter] and rows[0][2] == w.rollup_ts}


V = TypeVar("V")


Continue = Callable[[list[tuple[str, int]], Granularity], Awaitable[dict[tuple[str, int], V]]]
"""Parents (counter, start) of a granularity whose stored children may be gone, computed otherwise: a worker's step
continues each from its stored value (`continued_parents`)."""


async def recompute_parents(chain: tuple[Granularity, ...], computed: dict[Granularity, dict[tuple[str, int], V]],
                            known_from: Mapping[str, int], store_floor: Mapping[Granularity, int],
                            read: Callable[[list[BucketRange]], Awaitable[list[list[tuple[int, V, int]]]]],
                            combine: Callable[[str, Granularity, dict[int, V]], V],
                            continued: Continue[V] | None = None) -> dict[Granularity, int]:
    """Step 2 of the maintenance, for bucket sums and unique sketches alike: every parent (hour, day) of a
    recomputed child is recomputed from all its children (the recomputed ones, the others read back from the
    store with `read`), combined by `combine(counter, child granularity, {child start: value})`. A parent whose
    stored children may be gone (before `known_from`, past the child's retention) is computed by `continued`
    when given (a worker's step) and still within its own retention, else left as stored; returns how many were
    left, per granularity. `computed` gains the parents."""
    skipped: dict[Granularity, int] = {}
    for child, parent in pairwise(chain):
        children: dict[tuple[str, int], dict[int, V]] = {}  # (counter, parent start) -> recomputed children
        for (c, start), value in computed[child].items():
            children.setdefault((c, align_down(start, parent)), {})[start] = value
        # children before known_from come from the store: they must still be there
        ready = sorted(k for k in children if k[1] >= min(known_from[k[0]], store_floor[child]))
        late = [k for k in sorted(children) if k[1] < min(known_from[k[0]], store_floor[child])
                and k[1] + parent.width_us > store_floor[parent]] if continued is not None else []
        if late and continued is not None:
            computed[parent].update(await continued(late, parent))
        if len(ready) + len(late) < len(children):
            skipped[parent] = len(children) - len(ready) - len(late)
        ranges: list[BucketRange] = [(c, child, p, min(p + parent.width_us, known_from[c])) for c, p in ready]
        stored = await read(ranges) if ranges else []
        for (c, p), parent_rows in zip(ready, stored, strict=True):
            values = {start: value for start, value, _upto in parent_rows}
            values.update(children[(c, p)])
            computed[parent][(c, p)] = combine(c, child, values)
        known_from = {c: align_up(k, parent) for c, k in known_from.items()}
    return skipped


B = TypeVar("B", bound=tuple)  # a bucket of new events: (start, sum or items, the clear inside it or None, events)


async def continued_parents(keys: list[tuple[str, int]], parent: Granularity, stored: list[list[tuple[int, V, int]]],
                            steps: Mapping[str, BucketWork],
                            found: Callable[[str, Sequence[tuple[str, int, int]], int], Awaitable[list[list[B]]]],
                            namespace: str, merge: Callable[[str, V | None, B | None], V]) -> dict[tuple[str, int], V]:
    """`recompute_parents`' `continued` in a worker's step. A parent whose earlier children are past their retention
    (the step's rollup_ts lies in an hour older than the minutes kept: a long accept_limit, or a rollup days late)
    is its stored value (`stored`: a row or none per key) merged by `merge(counter, stored value, bucket)` with the
    bucket its events after that value's computed_upto, up to the step's boundary, make at the parent's width
    (`found`: the event store's bucket sums or items); a clear among them restarts it (no stored value). The stored
    value is whole as of its computed_upto: no event at or before a rollup_ts arrives later, and every step with
    events in the parent rewrote it. Without this the parent was left as stored, short of every later write in it
    (a review: an hour and its day read 0 where the total was 11)."""
    rows = [found_rows[0] if found_rows and found_rows[0][0] == p else None for (_c, p), found_rows in
            zip(keys, stored, strict=True)]
    windows = [(c, steps[c].rollup_ts if row is None else row[2], min(steps[c].boundary, p + parent.width_us - 1))
               for (c, p), row in zip(keys, rows, strict=True)]
    out: dict[tuple[str, int], V] = {}
    for (c, p), row, buckets in zip(keys, rows, await found(namespace, windows, parent.width_us), strict=True):
        bucket = next((b for b in buckets if b[0] == p), None)
        before = None if row is None or (bucket is not None and bucket[2] is not None) else row[1]
        out[(c, p)] = merge(c, before, bucket)
    return out


def events_floor(ns: Namespace, now_us: int, *, worker_step: bool) -> int:
    """The oldest event time a step may recompute minutes from: ``delete_after`` ago for a recount (older rolled-up
    events may be deleted), none for a worker's step (every event after rollup_ts is still stored: module doc)."""
    return _NEVER if worker_step else now_us - int(ns.retention.delete_after_s * _US)


def minutes_from(work: Iterable[BucketWork], floor_us: int) -> dict[str, int]:
    """Per counter, the start of the first minute a step recomputes: the one holding its first time after
    rollup_ts, or the first whole minute at or after ``floor_us`` (see :func:`events_floor`)."""
    minute = Granularity.MINUTE
    return {w.counter: align_up(max(align_down(w.rollup_ts + 1, minute), floor_us), minute) for w in work}


def merge_steps(work: Iterable[BucketWork]) -> list[BucketWork]:
    """One step per counter: the same counter twice covers the union of its steps (buckets and sketches)."""
    merged: dict[str, BucketWork] = {}
    for w in work:
        if w.boundary <= w.rollup_ts:
            continue
        seen = merged.get(w.counter)
        if seen is not None:
            clears = [c for c in (seen.last_clear_us, w.last_clear_us) if c is not None]
            w = BucketWork(w.counter, min(seen.rollup_ts, w.rollup_ts), max(seen.boundary, w.boundary),
                           max(clears) if clears else None)
        merged[w.counter] = w
    return list(merged.values())


def retention_floor(now_us: int, retention_s: float | None) -> int:
    """Buckets (and sketches) ending after this time are within a retention of `retention_s` (None: forever)."""
    return _NEVER if retention_s is None else now_us - int(retention_s * _US)
