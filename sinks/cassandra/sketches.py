"""Cassandra sketch store: the HLL sketches of a UNIQUE namespace's buckets (``sinks.sketches``).

Layout (statements in ``sinks.cassandra.cql.SketchCql``), as the bucket store's (``sinks.cassandra.buckets``):
* ``window_sketches``: partition ``(namespace, counter_name, granularity, slice)``, clustering ``start_us``, a
  ``sketch`` blob and its ``computed_upto``: a partition holds at most 1440 sketches of one counter (a day of
  minutes, 32 days of hours, a year of days), a window's segment reads one or two partitions with one range each.
* Forward-only without locks: ``(sketch, computed_upto)`` are written ``USING TIMESTAMP`` = the boundary the sketch
  was computed at, so the one recomputed at the latest boundary wins on every replica, in any order. Two workers
  computing a sketch at the same boundary computed it from the same immutable events: the same sketch.
  ``USING TTL`` is the retention backstop (the granularity's retention, as buckets); retention is ``drop_expired``.
* ``sketch_slices`` ((namespace, granularity), slice) and ``sketch_counters`` ((namespace, granularity, slice,
  shard), counter_name) say which partitions exist, written before the sketches they point at, with the same TTL,
  so retention finds every partition of an expired slice without scanning the table.

``write_sketches`` says per row whether it applied: the stored boundaries are read first (without the blobs) and
rows whose stored boundary is not earlier are skipped, the rest written and their boundaries read back.

The store shares the bucket store's session (``beside``): one driver session per process serves every store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from sinks.cassandra.buckets import CassandraBucketStore
from sinks.cassandra.config import bucket_ttl_seconds
from sinks.cassandra.cql import COUNTER_SHARDS, SketchCql, Stmt
from sinks.cassandra.session import Executor
from sinks.sketches import SketchRow, StoredSketch
from sinks.windows import BucketRange, Granularity, slice_bounds

__all__ = ["CassandraSketchStore"]

log = logging.getLogger(__name__)

_NARROW_SLICES = 4  # a range over more slices than this reads the slice catalog instead of every slice
_REGISTERED_MAX = 200_000  # (counter, slice) registrations remembered per process (then forgotten at once)

Partition = tuple[str, Granularity, int]  # (counter, granularity, slice)


def _now_us() -> int:
    return time.time_ns() // 1000


class CassandraSketchStore:
    """The production sketch store. ``retention_for(namespace, granularity)`` gives the retention in seconds (None:
    forever, no TTL). Holds a reference to the executor: closing the store releases it."""

    def __init__(self, executor: Executor, *,
                 retention_for: Callable[[str, Granularity], float | None] | None = None,
                 ttl_grace_s: int = 86_400, clock_us: Callable[[], int] = _now_us) -> None:
        self._x = executor
        self._cql = SketchCql(executor.keyspace)
        self._retention_for = retention_for
        self._ttl_grace_s = ttl_grace_s
        self._clock_us = clock_us
        self._registered: set[tuple[str, Granularity, int, str]] = set()  # (namespace, g, slice, counter)
        self._slices: set[tuple[str, Granularity, int]] = set()  # (namespace, g, slice) in sketch_slices

    @classmethod
    def beside(cls, buckets: CassandraBucketStore, *,
               retention_for: Callable[[str, Granularity], float | None] | None = None) -> CassandraSketchStore:
        """A sketch store on the bucket store's session (one more reference to it; closing releases it), with the
        bucket store's TTL grace."""
        executor = buckets._x
        executor.acquire()
        return cls(executor, retention_for=retention_for, ttl_grace_s=buckets._ttl_grace_s)

    # -- SketchStore ----------------------------------------------------------------------------

    async def write_sketches(self, namespace: str, rows: Sequence[SketchRow]) -> list[bool]:
        if not rows:
            return []
        keyed = [(counter, Granularity(g), start, sketch, upto) for counter, g, start, sketch, upto in rows]
        stored = await self._marks(namespace, keyed)
        latest = dict(stored)
        chosen: list[int] = []
        for i, (counter, g, start, _sketch, upto) in enumerate(keyed):
            key = (counter, g, start)
            if upto > latest.get(key, upto - 1):
                latest[key] = upto
                chosen.append(i)
        if not chosen:
            return [False] * len(rows)
        await self._register(namespace, [keyed[i] for i in chosen])
        await self._x.run_all([self._cql.write(namespace, c, g.value, start // g.slice_us, start, sketch, upto,
                                               self._ttl(namespace, g))
                               for c, g, start, sketch, upto in (keyed[i] for i in chosen)])
        after = await self._marks(namespace, [keyed[i] for i in chosen])
        applied = [False] * len(rows)
        for i in chosen:
            counter, g, start, _sketch, upto = keyed[i]
            applied[i] = after.get((counter, g, start)) == upto
        return applied

    async def read_sketches_many(self, namespace: str, ranges: Sequence[BucketRange]) -> list[list[StoredSketch]]:
        """One range read per partition a range meets; a range over more than a few slices reads only the slices
        the catalog lists (a window's segment meets one or two; a total since the epoch meets the listed ones)."""
        wide = {Granularity(g) for _c, g, lo, hi in ranges
                if hi > lo and (hi - 1) // Granularity(g).slice_us - lo // Granularity(g).slice_us >= _NARROW_SLICES}
        listed: dict[Granularity, list[int]] = {}
        for g, rows in zip(wide, await self._x.run_all([self._cql.list_slices(namespace, g.value) for g in wide]),
                           strict=True):
            listed[g] = sorted(int(r[0]) for r in rows or ())
        stmts: list[Stmt] = []
        owners: list[int] = []
        for i, (counter, g, lo, hi) in enumerate(ranges):
            g = Granularity(g)
            if hi <= lo:
                continue
            first, last = lo // g.slice_us, (hi - 1) // g.slice_us
            slices = ([s for s in listed[g] if first <= s <= last] if last - first >= _NARROW_SLICES
                      else range(first, last + 1))
            for slice_no in slices:
                stmts.append(self._cql.range(namespace, counter, g.value, slice_no, lo, hi))
                owners.append(i)
        out: list[list[StoredSketch]] = [[] for _ in ranges]
        for i, found in zip(owners, await self._x.run_all(stmts), strict=True):  # slices ascend per range
            out[i].extend((int(s), bytes(b or b""), int(u or 0)) for s, b, u in (found or ()))
        return out

    async def drop_expired(self, namespace: str, granularity: Granularity, before_us: int) -> int:
        g = Granularity(granularity)
        last_start = before_us - g.width_us  # sketches starting at or before it ended at or before before_us
        stamp = self._clock_us()  # shadows every write of these sketches: boundaries trail the clock
        listed = await self._x.run(self._cql.list_slices(namespace, g.value))
        expiring = sorted(s for s in {int(r[0]) for r in listed} if s <= last_start // g.slice_us)
        emptied = 0
        for slice_no in expiring:
            pages = await self._x.run_all([self._cql.registered(namespace, g.value, slice_no, shard)
                                           for shard in range(COUNTER_SHARDS)])
            counters = sorted({str(row[0]) for page in pages for row in (page or ())})
            if slice_bounds(g, slice_no)[1] > before_us:  # the slice holding the cutoff: its expired rows only
                await self._x.run_all([self._cql.drop_through(namespace, c, g.value, slice_no, last_start, stamp)
                                       for c in counters])
                continue
            await self._x.run_all([self._cql.drop_partition(namespace, c, g.value, slice_no, stamp) for c in counters])
            await self._x.run_all([self._cql.forget(namespace, g.value, slice_no, shard)
                                   for shard in range(COUNTER_SHARDS)])
            await self._x.run(self._cql.remove_slice(namespace, g.value, slice_no))
            self._slices.discard((namespace, g, slice_no))
            self._registered = {k for k in self._registered if k[:3] != (namespace, g, slice_no)}
            emptied += 1
        if emptied:
            log.info("namespace %r: dropped %d expired %s sketch slice(s) before %d", namespace, emptied, g,
                     before_us)
        return emptied

    async def close(self) -> None:
        await self._x.close()

    # -- internals ----------------------------------------------------------------------------

    def _ttl(self, namespace: str, g: Granularity) -> int:
        retention = None
        if self._retention_for is not None:
            try:
                retention = self._retention_for(namespace, g)
            except KeyError:
                retention = None
        return bucket_ttl_seconds(retention, g.width_us // 1_000_000, g.slice_us // 1_000_000, self._ttl_grace_s)

    async def _marks(self, namespace: str, rows: Sequence[tuple[str, Granularity, int, bytes, int]]
                     ) -> dict[tuple[str, Granularity, int], int]:
        """Stored ``computed_upto`` of the rows' sketches: one range read per partition, without the blobs."""
        spans: dict[Partition, tuple[int, int]] = {}
        for counter, g, start, _sketch, _upto in rows:
            key = (counter, g, start // g.slice_us)
            lo, hi = spans.get(key, (start, start))
            spans[key] = (min(lo, start), max(hi, start))
        parts = list(spans)
        results = await self._x.run_all([self._cql.marks(namespace, c, g.value, s, spans[(c, g, s)][0],
                                                         spans[(c, g, s)][1] + 1) for c, g, s in parts])
        out: dict[tuple[str, Granularity, int], int] = {}
        for (counter, g, _slice), found in zip(parts, results, strict=True):
            for start, upto in found or ():
                out[(counter, g, int(start))] = int(upto or 0)
        return out

    async def _register(self, namespace: str, rows: Sequence[tuple[str, Granularity, int, bytes, int]]) -> None:
        new = {(namespace, g, start // g.slice_us, counter) for counter, g, start, _s, _u in rows} - self._registered
        if not new:
            return
        slices = {k[:3] for k in new} - self._slices
        await self._x.run_all([
            *(self._cql.add_slice(ns, g.value, s, self._ttl(ns, g)) for ns, g, s in sorted(slices)),
            *(self._cql.register(ns, g.value, s, c, self._ttl(ns, g)) for ns, g, s, c in sorted(new))])
        if len(self._registered) + len(new) > _REGISTERED_MAX:
            self._registered.clear()
            self._slices.clear()
        self._registered |= new
        self._slices |= slices
