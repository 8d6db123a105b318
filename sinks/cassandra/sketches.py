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
  so retention finds every partition of an expired slice without scanning the table. The bucket store shares this
  logic (``sinks.cassandra.slices.SlicedPartitions``).

``write_sketches`` says per row whether it applied: the stored boundaries are read first (without the blobs) and
rows whose stored boundary is not earlier are skipped, the rest written and their boundaries read back.

The store shares the bucket store's session (``beside``): one driver session per process serves every store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sinks.cassandra.buckets import CassandraBucketStore
from sinks.cassandra.cql import SketchCql
from sinks.cassandra.session import Executor
from sinks.cassandra.slices import Key, SlicedPartitions, now_us
from sinks.model import later_than_stored
from sinks.sketches import SketchRow, StoredSketch
from sinks.windows import BucketRange, Granularity

__all__ = ["CassandraSketchStore"]


class CassandraSketchStore:
    """The production sketch store. ``retention_for(namespace, granularity)`` gives the retention in seconds (None:
    forever, no TTL). Holds a reference to the executor: closing the store releases it."""

    def __init__(self, executor: Executor, *,
                 retention_for: Callable[[str, Granularity], float | None] | None = None,
                 ttl_grace_s: int = 86_400, clock_us: Callable[[], int] = now_us) -> None:
        self._x = executor
        self._cql = SketchCql(executor.keyspace)
        self.partitions = SlicedPartitions(executor, self._cql, what="sketch", retention_for=retention_for,
                                           ttl_grace_s=ttl_grace_s, clock_us=clock_us)

    @classmethod
    def beside(cls, buckets: CassandraBucketStore, *,
               retention_for: Callable[[str, Granularity], float | None] | None = None) -> CassandraSketchStore:
        """A sketch store on the bucket store's session (one more reference to it; closing releases it), with the
        bucket store's TTL grace."""
        executor = buckets.partitions.executor
        executor.acquire()
        return cls(executor, retention_for=retention_for, ttl_grace_s=buckets.partitions.ttl_grace_s)

    # -- SketchStore ----------------------------------------------------------------------------

    async def write_sketches(self, namespace: str, rows: Sequence[SketchRow]) -> list[bool]:
        if not rows:
            return []
        keyed = [(counter, Granularity(g), start, sketch, upto) for counter, g, start, sketch, upto in rows]
        chosen = later_than_stored([((c, g, start), upto) for c, g, start, _s, upto in keyed],
                                   await self._marks(namespace, keyed))
        if not chosen:
            return [False] * len(rows)
        fresh = [keyed[i] for i in chosen]
        await self.partitions.register(namespace, ((c, g, start) for c, g, start, _s, _u in fresh))
        await self._x.run_all([self._cql.write(namespace, c, g.value, start // g.slice_us, start, sketch, upto,
                                               self.partitions.ttl(namespace, g))
                               for c, g, start, sketch, upto in fresh])
        after = await self._marks(namespace, fresh)
        applied = [False] * len(rows)
        for i in chosen:
            counter, g, start, _sketch, upto = keyed[i]
            applied[i] = after.get((counter, g, start)) == upto
        return applied

    async def read_sketches_many(self, namespace: str, ranges: Sequence[BucketRange]) -> list[list[StoredSketch]]:
        found = await self.partitions.read_ranges(namespace, ranges, self._cql.range)
        return [[(int(s), bytes(b or b""), int(u or 0)) for s, b, u in rows] for rows in found]

    async def drop_expired(self, namespace: str, granularity: Granularity, before_us: int) -> int:
        return await self.partitions.drop_expired(namespace, granularity, before_us)

    async def close(self) -> None:
        await self._x.close()

    # -- internals ----------------------------------------------------------------------------

    async def _marks(self, namespace: str, rows: Sequence[tuple[str, Granularity, int, bytes, int]]) -> dict[Key, int]:
        """Stored ``computed_upto`` of the rows' sketches: one range read per partition, without the blobs."""
        found = await self.partitions.stored(namespace, ((c, g, start) for c, g, start, _s, _u in rows),
                                             self._cql.marks)
        return {key: int(upto or 0) for key, (upto,) in found.items()}
