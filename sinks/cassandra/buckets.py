"""Cassandra bucket store: the minute/hour/day buckets of windowed counts and each counter's latest clear.

Layout (statements in ``sinks.cassandra.cql.WindowCql``):
* ``window_buckets``: partition ``(namespace, counter_name, granularity, slice)``, clustering ``start_us``; a
  slice is a day of minutes, 32 days of hours or a year of days (``Granularity.slice_us``), so a partition
  holds at most 1440 rows however long a counter lives, and a series or a window's segment reads one or two
  partitions with one range each.
* Forward-only without reads or locks: ``(bucket_count, computed_upto)`` are written ``USING TIMESTAMP`` = the
  boundary the bucket was computed at, so the bucket recomputed at the latest boundary wins on every replica,
  in any order (DESIGN invariant 7; both cells carry the same timestamp, so they never mix). ``USING TTL`` is
  the retention backstop (``bucket_ttl_seconds``); retention proper is ``drop_expired``.
* ``window_slices`` ((namespace, granularity), slice) and ``window_counters`` ((namespace, granularity, slice,
  shard), counter_name) say which partitions exist, written *before* the buckets they point at (as the event
  store writes its index before its events), with the same TTL. A process registers each (counter, slice) once.
  So retention finds every partition of an expired slice without scanning the table: a partition delete per
  counter, then the catalog rows; a cutoff inside a slice range-deletes that slice's expired rows per counter.
* ``window_clears`` ((namespace, counter_name)) clear_us, written ``USING TIMESTAMP`` = the clear's time: the
  cell keeps the latest clear. Never expires: old buckets rely on it to stay masked.
* ``window_ranks`` ((namespace, signature, granularity, start_us), bucket_count DESC, counter_name): the rank
  lists of Top-K, an entry (value, base name) per bucket (``schemas.split_signature`` of its counter). A bucket's
  value change inserts the new entry *before* the bucket is written and deletes the entry of the value it
  replaced (known from the read that decides the write) *after*, each stamped with the new boundary, with the
  bucket's TTL: at every moment a stored bucket has its entry, whatever crashes in between. Racing writers can
  leave stale entries (a value since replaced); readers verify every candidate against the buckets, so a stale
  entry costs a read, never a wrong answer. ``window_rank_lists`` ((namespace, granularity, slice), signature,
  start_us) lists the rank partitions of a bucket slice, written before their first entry, so retention drops
  them with the slice's buckets.

``write_buckets`` says per row whether it applied, as the rollup store does: read the partitions' rows first
and skip rows whose stored boundary is not earlier (an equal boundary would tie on timestamps), write the
rest, read back: applied iff the stored bucket is ours. ``False`` can also mean "applied, then overtaken" by
a later boundary (racing workers, or the same bucket twice in one call).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from schemas.dimensions import split_signature
from sinks.cassandra.config import bucket_ttl_seconds
from sinks.cassandra.cql import COUNTER_SHARDS, Stmt, WindowCql
from sinks.cassandra.session import Executor
from sinks.windows import BucketRange, BucketRow, Granularity, RankEntry, RankPage, StoredBucket, slice_bounds

__all__ = ["CassandraBucketStore"]

log = logging.getLogger(__name__)

_NARROW_SLICES = 4  # a range over more slices than this reads the slice catalog instead of every slice
_REGISTERED_MAX = 200_000  # (counter, slice) registrations remembered per process (then forgotten at once)

Partition = tuple[str, Granularity, int]  # (counter, granularity, slice)


def _now_us() -> int:
    return time.time_ns() // 1000


class CassandraBucketStore:
    """The production bucket store (shares its executor with the event and rollup stores).

    ``retention_for(namespace, granularity)`` gives the retention in seconds (None: forever, no TTL).
    """

    def __init__(self, executor: Executor, *,
                 retention_for: Callable[[str, Granularity], float | None] | None = None,
                 ttl_grace_s: int = 86_400, clock_us: Callable[[], int] = _now_us) -> None:
        self._x = executor
        self._cql = WindowCql(executor.keyspace)
        self._retention_for = retention_for
        self._ttl_grace_s = ttl_grace_s
        self._clock_us = clock_us
        self._registered: set[tuple[str, Granularity, int, str]] = set()  # (namespace, g, slice, counter)
        self._slices: set[tuple[str, Granularity, int]] = set()  # (namespace, g, slice) in window_slices
        self._rank_lists: set[tuple[str, Granularity, int, str]] = set()  # (namespace, g, start, signature) listed

    # -- BucketStore ----------------------------------------------------------------------------

    async def write_buckets(self, namespace: str, rows: Sequence[BucketRow]) -> list[bool]:
        if not rows:
            return []
        keyed = [(counter, Granularity(g), start, value, upto) for counter, g, start, value, upto in rows]
        stored = await self._read_keys(namespace, keyed)
        # 1. refuse rows whose stored (or earlier-in-this-call) boundary is not earlier
        latest = {k: u for k, (_v, u) in stored.items()}
        chosen: list[int] = []
        for i, (counter, g, start, _value, upto) in enumerate(keyed):
            key = (counter, g, start)
            if upto > latest.get(key, upto - 1):
                latest[key] = upto
                chosen.append(i)
        if not chosen:
            return [False] * len(rows)
        # 2. catalog rows for partitions this process has not registered, before the buckets they point at
        await self._register(namespace, [keyed[i] for i in chosen])
        # 3. rank entries of the new values, the buckets, a read-back (applied iff the stored bucket is the one we
        #    wrote), then the deletion of the entries of the values replaced (see the module doc)
        await self._x.run_all([self._rank_stmt(namespace, *keyed[i]) for i in chosen])
        await self._x.run_all([self._write_stmt(namespace, *keyed[i]) for i in chosen])
        after = await self._read_keys(namespace, [keyed[i] for i in chosen])
        applied = [False] * len(rows)
        previous = {k: v for k, (v, _u) in stored.items()}
        replaced: list[Stmt] = []
        for i in chosen:
            counter, g, start, value, upto = keyed[i]
            applied[i] = after.get((counter, g, start)) == (value, upto)
            old = previous.get((counter, g, start))
            if old is not None and old != value:
                base, signature = split_signature(counter)
                replaced.append(self._cql.rank_remove(namespace, signature, g.value, start, old, base, upto))
            previous[(counter, g, start)] = value
        await self._x.run_all(replaced)
        return applied

    async def read_buckets_many(self, namespace: str, ranges: Sequence[BucketRange]) -> list[list[StoredBucket]]:
        """One range read per partition a range meets; a range over more than a few slices reads only the
        slices the catalog lists (a series or a window's segment meets one or two)."""
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
        out: list[list[StoredBucket]] = [[] for _ in ranges]
        for i, found in zip(owners, await self._x.run_all(stmts), strict=True):  # slices ascend per range
            out[i].extend((int(s), int(v or 0), int(u or 0)) for s, v, u in (found or ()))
        return out

    async def read_ranks_many(self, namespace: str, pages: Sequence[RankPage]) -> list[list[RankEntry]]:
        """One statement per first page; a later page reads the rest of its tie and the values below it at once
        (two statements, the second's rows used only as far as the first leaves room)."""
        stmts: list[Stmt] = []
        owners: list[int] = []
        normal = [RankPage(*p) for p in pages]
        for i, p in enumerate(normal):
            if p.limit <= 0:
                continue
            key = (namespace, p.signature, Granularity(p.granularity).value, p.start_us)
            if p.after is None:
                stmts.append(self._cql.rank_first(*key, p.limit, ascending=p.ascending))
                owners.append(i)
            else:
                stmts += [self._cql.rank_tie(*key, p.after[0], p.after[1], p.limit, ascending=p.ascending),
                          self._cql.rank_beyond(*key, p.after[0], p.limit, ascending=p.ascending)]
                owners += [i, i]
        out: list[list[RankEntry]] = [[] for _ in pages]
        for i, found in zip(owners, await self._x.run_all(stmts) if stmts else [], strict=True):
            room = normal[i].limit - len(out[i])
            out[i].extend((str(base), int(value or 0)) for base, value in list(found or ())[:room])
        return out

    async def bump_clears(self, namespace: str, items: Sequence[tuple[str, int]]) -> None:
        latest: dict[str, int] = {}
        for counter, clear_us in items:  # one write per counter per call
            if clear_us > latest.get(counter, clear_us - 1):
                latest[counter] = clear_us
        await self._x.run_all([self._cql.bump_clear(namespace, c, t) for c, t in latest.items()])

    async def clears(self, namespace: str, counters: Sequence[str]) -> dict[str, int]:
        names = list(dict.fromkeys(counters))
        results = await self._x.run_all([self._cql.get_clear(namespace, c) for c in names])
        return {c: int(rows[0][0]) for c, rows in zip(names, results, strict=True) if rows and rows[0][0] is not None}

    async def drop_expired(self, namespace: str, granularity: Granularity, before_us: int) -> int:
        g = Granularity(granularity)
        last_start = before_us - g.width_us  # buckets starting at or before it ended at or before before_us
        # Tombstones stamped now shadow every write of these buckets, even a recount's at a boundary after
        # before_us: boundaries trail the clock by at least accept_limit.
        stamp = self._clock_us()
        listed = await self._x.run(self._cql.list_slices(namespace, g.value))
        expiring = sorted(s for s in {int(r[0]) for r in listed} if s <= last_start // g.slice_us)
        emptied = 0
        for slice_no in expiring:
            pages = await self._x.run_all([self._cql.registered(namespace, g.value, slice_no, shard)
                                           for shard in range(COUNTER_SHARDS)])
            counters = sorted({str(row[0]) for page in pages for row in (page or ())})
            lists = sorted((str(sig), int(start)) for sig, start in await self._x.run(
                self._cql.rank_lists(namespace, g.value, slice_no)))
            if slice_bounds(g, slice_no)[1] > before_us:  # the slice holding the cutoff: its expired rows only
                await self._x.run_all([self._cql.drop_through(namespace, c, g.value, slice_no, last_start, stamp)
                                       for c in counters])
                expired = [(sig, start) for sig, start in lists if start <= last_start]
                await self._x.run_all([self._cql.rank_drop(namespace, sig, g.value, start, stamp)
                                       for sig, start in expired])
                await self._x.run_all([self._cql.rank_list_remove(namespace, g.value, slice_no, sig, start)
                                       for sig, start in expired])
                self._rank_lists -= {(namespace, g, start, sig) for sig, start in expired}
                continue
            await self._x.run_all([self._cql.drop_partition(namespace, c, g.value, slice_no, stamp) for c in counters])
            await self._x.run_all([self._cql.rank_drop(namespace, sig, g.value, start, stamp) for sig, start in lists])
            await self._x.run_all([self._cql.forget(namespace, g.value, slice_no, shard)
                                   for shard in range(COUNTER_SHARDS)])
            await self._x.run(self._cql.rank_lists_forget(namespace, g.value, slice_no))
            await self._x.run(self._cql.remove_slice(namespace, g.value, slice_no))
            self._slices.discard((namespace, g, slice_no))
            self._registered = {k for k in self._registered if k[:3] != (namespace, g, slice_no)}
            self._rank_lists = {k for k in self._rank_lists
                                if k[:2] != (namespace, g) or k[2] // g.slice_us != slice_no}
            emptied += 1
        if emptied:
            log.info("namespace %r: dropped %d expired %s slice(s) before %d", namespace, emptied, g, before_us)
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

    def _write_stmt(self, namespace: str, counter: str, g: Granularity, start: int, value: int, upto: int) -> Stmt:
        return self._cql.write(namespace, counter, g.value, start // g.slice_us, start, value, upto,
                               self._ttl(namespace, g))

    def _rank_stmt(self, namespace: str, counter: str, g: Granularity, start: int, value: int, upto: int) -> Stmt:
        base, signature = split_signature(counter)
        return self._cql.rank_add(namespace, signature, g.value, start, value, base, upto, self._ttl(namespace, g))

    async def _read_keys(self, namespace: str,
                         rows: Sequence[tuple[str, Granularity, int, int, int]]) -> dict[tuple[str, Granularity, int],
                                                                                         tuple[int, int]]:
        """Stored ``(value, computed_upto)`` of the rows' buckets: one range read per partition."""
        spans: dict[Partition, tuple[int, int]] = {}
        for counter, g, start, _value, _upto in rows:
            key = (counter, g, start // g.slice_us)
            lo, hi = spans.get(key, (start, start))
            spans[key] = (min(lo, start), max(hi, start))
        parts = list(spans)
        results = await self._x.run_all([self._cql.range(namespace, c, g.value, s, spans[(c, g, s)][0],
                                                         spans[(c, g, s)][1] + 1) for c, g, s in parts])
        out: dict[tuple[str, Granularity, int], tuple[int, int]] = {}
        for (counter, g, _slice), found in zip(parts, results, strict=True):
            for start, value, upto in found or ():
                out[(counter, g, int(start))] = (int(value or 0), int(upto or 0))
        return out

    async def _register(self, namespace: str, rows: Sequence[tuple[str, Granularity, int, int, int]]) -> None:
        new = {(namespace, g, start // g.slice_us, counter) for counter, g, start, _v, _u in rows} - self._registered
        lists = {(namespace, g, start, split_signature(counter)[1])
                 for counter, g, start, _v, _u in rows} - self._rank_lists
        if not new and not lists:
            return
        slices = {k[:3] for k in new} - self._slices
        await self._x.run_all([
            *(self._cql.add_slice(ns, g.value, s, self._ttl(ns, g)) for ns, g, s in sorted(slices)),
            *(self._cql.register(ns, g.value, s, c, self._ttl(ns, g)) for ns, g, s, c in sorted(new)),
            *(self._cql.rank_list_add(ns, g.value, start // g.slice_us, sig, start, self._ttl(ns, g))
              for ns, g, start, sig in sorted(lists))])
        if len(self._registered) + len(new) > _REGISTERED_MAX or len(self._rank_lists) + len(lists) > _REGISTERED_MAX:
            self._registered.clear()
            self._slices.clear()
            self._rank_lists.clear()
        self._registered |= new
        self._slices |= slices
        self._rank_lists |= lists
