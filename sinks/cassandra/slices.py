"""`SlicedPartitions`: what the Cassandra bucket and sketch stores share about their partitions and catalog.

Both tables are laid out alike (``sinks.cassandra.cql.SlicedCql``): partition ``(namespace, counter_name,
granularity, slice)``, clustering ``start_us``, a slice being a day of minutes, 32 days of hours or a year of days,
so a series or a window's segment reads one or two partitions with one range each. Both list their partitions in a
slices table and a sharded counters table, written *before* the rows they point at and with the same TTL, so
retention finds every partition of an expired slice without scanning the table. One class keeps that logic, so
the two stores cannot drift apart on how they register, read or expire a partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from sinks.cassandra.config import ExpiryCap, bucket_ttl_seconds
from sinks.cassandra.cql import COUNTER_SHARDS, SlicedCql, Stmt
from sinks.cassandra.session import Executor
from sinks.windows import BucketRange, Granularity, slice_bounds

__all__ = ["Key", "SliceHook", "SlicedPartitions", "now_us"]

log = logging.getLogger(__name__)

NARROW_SLICES = 4  # a range over more slices than this reads the slice catalog instead of every slice
REGISTERED_MAX = 200_000  # (counter, slice) registrations remembered per process (then forgotten at once)

Key = tuple[str, Granularity, int]  # (counter, granularity, start_us): one row
# hook(slice_no, whole, last_start_us, stamp_us): run by `drop_expired` after a slice's rows are dropped (whole: the
# slice's partitions; else its rows starting at or before last_start_us) and before its catalog rows are.
SliceHook = Callable[[int, bool, int, int], Awaitable[None]]


def now_us() -> int:
    return time.time_ns() // 1000


class SlicedPartitions:
    """The partitions of one sliced table, on a shared executor: TTLs, catalog registration, range reads and
    retention. ``retention_for(namespace, granularity)`` gives the retention in seconds (None: forever, no TTL).
    ``what`` names the rows in logs ("bucket", "sketch")."""

    def __init__(self, executor: Executor, cql: SlicedCql, *, what: str,
                 retention_for: Callable[[str, Granularity], float | None] | None = None,
                 ttl_grace_s: int = 86_400, clock_us: Callable[[], int] = now_us) -> None:
        self.executor = executor
        self._cap = ExpiryCap(lambda: clock_us() / 1e6)
        self.ttl_grace_s = ttl_grace_s
        self._cql = cql
        self._what = what
        self._retention_for = retention_for
        self._clock_us = clock_us
        self._registered: set[tuple[str, Granularity, int, str]] = set()  # (namespace, g, slice, counter)
        self._slices: set[tuple[str, Granularity, int]] = set()  # (namespace, g, slice) in the slices table

    def ttl(self, namespace: str, g: Granularity) -> int:
        """The TTL of a row of granularity ``g`` (and of the catalog rows naming its slice): 0 for none; capped
        as of now so it expires before Cassandra's 2038 limit (every statement binds it when it is sent)."""
        retention = None
        if self._retention_for is not None:
            try:
                retention = self._retention_for(namespace, g)
            except KeyError:
                retention = None
        ttl = bucket_ttl_seconds(retention, g.width_us // 1_000_000, g.slice_us // 1_000_000, self.ttl_grace_s)
        return self._cap(ttl, f"namespace {namespace!r} {g.value} {self._what}s")

    async def register(self, namespace: str, keys: Iterable[Key], also: Sequence[Stmt] = ()) -> None:
        """Write the catalog rows of the partitions holding ``keys`` that this process has not registered yet, with
        the statements ``also``, before the caller writes the rows they point at."""
        new = {(namespace, g, start // g.slice_us, counter) for counter, g, start in keys} - self._registered
        if not new and not also:
            return
        slices = {k[:3] for k in new} - self._slices
        await self.executor.run_all([
            *(self._cql.add_slice(ns, g.value, s, self.ttl(ns, g)) for ns, g, s in sorted(slices)),
            *(self._cql.register(ns, g.value, s, c, self.ttl(ns, g)) for ns, g, s, c in sorted(new)),
            *also])
        if len(self._registered) + len(new) > REGISTERED_MAX:
            self._registered.clear()
            self._slices.clear()
        self._registered |= new
        self._slices |= slices

    async def read_ranges(self, namespace: str, ranges: Sequence[BucketRange],
                          stmt: Callable[[str, str, str, int, int, int], Stmt]) -> list[list[tuple]]:
        """The rows of each range, ascending, read by ``stmt(namespace, counter, granularity, slice, lo, hi)``: one
        range read per partition a range meets; a range over more than a few slices reads only the slices the
        catalog lists (a series or a window's segment meets one or two; a total since the epoch meets the listed
        ones)."""
        wide = {Granularity(g) for _c, g, lo, hi in ranges
                if hi > lo and (hi - 1) // Granularity(g).slice_us - lo // Granularity(g).slice_us >= NARROW_SLICES}
        listed: dict[Granularity, list[int]] = {}
        for g, rows in zip(wide, await self.executor.run_all([self._cql.list_slices(namespace, g.value)
                                                              for g in wide]), strict=True):
            listed[g] = sorted(int(r[0]) for r in rows or ())
        stmts: list[Stmt] = []
        owners: list[int] = []
        for i, (counter, g, lo, hi) in enumerate(ranges):
            g = Granularity(g)
            if hi <= lo:
                continue
            first, last = lo // g.slice_us, (hi - 1) // g.slice_us
            slices = ([s for s in listed[g] if first <= s <= last] if last - first >= NARROW_SLICES
                      else range(first, last + 1))
            for slice_no in slices:
                stmts.append(stmt(namespace, counter, g.value, slice_no, lo, hi))
                owners.append(i)
        out: list[list[tuple]] = [[] for _ in ranges]
        for i, found in zip(owners, await self.executor.run_all(stmts), strict=True):  # slices ascend per range
            out[i].extend(found or ())
        return out

    async def stored(self, namespace: str, keys: Iterable[Key],
                     stmt: Callable[[str, str, str, int, int, int], Stmt]) -> dict[Key, tuple]:
        """The stored rows of ``keys``, without their ``start_us``: one range read per partition (from its first key
        to its last), by ``stmt`` as in ``read_ranges``. What a forward-only write reads before and after."""
        spans: dict[tuple[str, Granularity, int], tuple[int, int]] = {}  # (counter, g, slice) -> first, last start
        for counter, g, start in keys:
            part = (counter, g, start // g.slice_us)
            lo, hi = spans.get(part, (start, start))
            spans[part] = (min(lo, start), max(hi, start))
        parts = list(spans)
        results = await self.executor.run_all([stmt(namespace, c, g.value, s, spans[(c, g, s)][0],
                                                    spans[(c, g, s)][1] + 1) for c, g, s in parts])
        out: dict[Key, tuple] = {}
        for (counter, g, _slice), found in zip(parts, results, strict=True):
            for row in found or ():
                out[(counter, g, int(row[0]))] = tuple(row[1:])
        return out

    async def drop_expired(self, namespace: str, granularity: Granularity, before_us: int, *,
                           hook: SliceHook | None = None) -> int:
        """Drop the rows that ended at or before ``before_us``: whole slices by partition deletes, then their catalog
        rows (the slice's own last, so a retention cut short finds it again); in the slice holding the cutoff, only
        the expired rows. ``hook`` drops what the caller keeps beside each slice. Returns the slices emptied."""
        g = Granularity(granularity)
        last_start = before_us - g.width_us  # rows starting at or before it ended at or before before_us
        # Tombstones stamped now shadow every write of these rows, even a recount's at a boundary after before_us:
        # boundaries trail the clock by at least accept_limit.
        stamp = self._clock_us()
        run_all = self.executor.run_all
        listed = await self.executor.run(self._cql.list_slices(namespace, g.value))
        expiring = sorted(s for s in {int(r[0]) for r in listed} if s <= last_start // g.slice_us)
        emptied = 0
        for slice_no in expiring:
            pages = await run_all([self._cql.registered(namespace, g.value, slice_no, shard)
                                   for shard in range(COUNTER_SHARDS)])
            counters = sorted({str(row[0]) for page in pages for row in (page or ())})
            whole = slice_bounds(g, slice_no)[1] <= before_us
            if whole:
                await run_all([self._cql.drop_partition(namespace, c, g.value, slice_no, stamp) for c in counters])
            else:  # the slice holding the cutoff: its expired rows only
                await run_all([self._cql.drop_through(namespace, c, g.value, slice_no, last_start, stamp)
                               for c in counters])
            if hook is not None:
                await hook(slice_no, whole, last_start, stamp)
            if not whole:
                continue
            await run_all([self._cql.forget(namespace, g.value, slice_no, shard) for shard in range(COUNTER_SHARDS)])
            await self.executor.run(self._cql.remove_slice(namespace, g.value, slice_no))
            self._slices.discard((namespace, g, slice_no))
            self._registered = {k for k in self._registered if k[:3] != (namespace, g, slice_no)}
            emptied += 1
        if emptied:
            log.info("namespace %r: dropped %d expired %s %s slice(s) before %d", namespace, emptied, g, self._what,
                     before_us)
        return emptied
