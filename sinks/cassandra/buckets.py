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
  The sketch store shares this logic (``sinks.cassandra.slices.SlicedPartitions``).
* ``window_clears`` ((namespace, counter_name)) clear_us, written ``USING TIMESTAMP`` = the clear's time: the
  cell keeps the latest clear. Never expires: old buckets rely on it to stay masked.
* ``window_ranks`` ((namespace, signature, granularity, start_us), bucket_count DESC, counter_name): the rank
  lists of Top-K, an entry (value, base name) per bucket (``schemas.dimensions.split_signature`` of its counter). A
  bucket's value change inserts the new entry *before* the bucket is written and deletes the entry of the value it
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

from collections.abc import Callable, Sequence

from schemas.dimensions import split_signature
from sinks.cassandra.cql import Stmt, WindowCql
from sinks.cassandra.session import Executor
from sinks.cassandra.slices import Key, SlicedPartitions, now_us
from sinks.model import later_than_stored
from sinks.windows import BucketRange, BucketRow, Granularity, RankEntry, RankPage, StoredBucket

__all__ = ["CassandraBucketStore"]


_RANK_LISTS_MAX = 200_000  # rank lists remembered as listed per process (then forgotten at once)


class CassandraBucketStore:
    """The production bucket store (shares its executor with the event and rollup stores).

    ``retention_for(namespace, granularity)`` gives the retention in seconds (None: forever, no TTL).
    """

    def __init__(self, executor: Executor, *,
                 retention_for: Callable[[str, Granularity], float | None] | None = None,
                 ttl_grace_s: int = 86_400, clock_us: Callable[[], int] = now_us) -> None:
        self._x = executor
        self._cql = WindowCql(executor.keyspace)
        self.partitions = SlicedPartitions(executor, self._cql, what="bucket", retention_for=retention_for,
                                           ttl_grace_s=ttl_grace_s, clock_us=clock_us)
        self._rank_lists: set[tuple[str, Granularity, int, str]] = set()  # (namespace, g, start, signature) listed

    # -- BucketStore ----------------------------------------------------------------------------

    async def write_buckets(self, namespace: str, rows: Sequence[BucketRow]) -> list[bool]:
        if not rows:
            return []
        keyed = [(counter, Granularity(g), start, value, upto) for counter, g, start, value, upto in rows]
        stored = await self._read_keys(namespace, keyed)
        # 1. refuse rows whose stored (or earlier-in-this-call) boundary is not earlier
        chosen = later_than_stored([((c, g, start), upto) for c, g, start, _v, upto in keyed],
                                   {k: u for k, (_v, u) in stored.items()})
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
        found = await self.partitions.read_ranges(namespace, ranges, self._cql.range)
        return [[(int(s), int(v or 0), int(u or 0)) for s, v, u in rows] for rows in found]

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

        async def drop_ranks(slice_no: int, whole: bool, last_start: int, stamp: int) -> None:
            """The slice's rank lists go with its buckets: all of them with a whole slice, else the expired ones."""
            lists = sorted((str(sig), int(start)) for sig, start in await self._x.run(
                self._cql.rank_lists(namespace, g.value, slice_no)))
            expired = lists if whole else [(sig, start) for sig, start in lists if start <= last_start]
            await self._x.run_all([self._cql.rank_drop(namespace, sig, g.value, start, stamp)
                                   for sig, start in expired])
            if whole:
                await self._x.run(self._cql.rank_lists_forget(namespace, g.value, slice_no))
            else:
                await self._x.run_all([self._cql.rank_list_remove(namespace, g.value, slice_no, sig, start)
                                       for sig, start in expired])
            if whole:
                self._rank_lists = {k for k in self._rank_lists
                                    if k[:2] != (namespace, g) or k[2] // g.slice_us != slice_no}
            else:
                self._rank_lists -= {(namespace, g, start, sig) for sig, start in expired}
        return await self.partitions.drop_expired(namespace, g, before_us, hook=drop_ranks)

    async def close(self) -> None:
        await self._x.close()

    # -- internals ----------------------------------------------------------------------------

    def _write_stmt(self, namespace: str, counter: str, g: Granularity, start: int, value: int, upto: int) -> Stmt:
        return self._cql.write(namespace, counter, g.value, start // g.slice_us, start, value, upto,
                               self.partitions.ttl(namespace, g))

    def _rank_stmt(self, namespace: str, counter: str, g: Granularity, start: int, value: int, upto: int) -> Stmt:
        base, signature = split_signature(counter)
        return self._cql.rank_add(namespace, signature, g.value, start, value, base, upto,
                                  self.partitions.ttl(namespace, g))

    async def _read_keys(self, namespace: str,
                         rows: Sequence[tuple[str, Granularity, int, int, int]]) -> dict[Key, tuple[int, int]]:
        """Stored ``(value, computed_upto)`` of the rows' buckets: one range read per partition."""
        found = await self.partitions.stored(namespace, ((c, g, start) for c, g, start, _v, _u in rows),
                                             self._cql.range)
        return {key: (int(value or 0), int(upto or 0)) for key, (value, upto) in found.items()}

    async def _register(self, namespace: str, rows: Sequence[tuple[str, Granularity, int, int, int]]) -> None:
        """The partitions' catalog rows and the rank lists' (``window_rank_lists``), before the buckets."""
        ttl = self.partitions.ttl
        lists = {(namespace, g, start, split_signature(counter)[1])
                 for counter, g, start, _v, _u in rows} - self._rank_lists
        await self.partitions.register(namespace, ((c, g, start) for c, g, start, _v, _u in rows), [
            self._cql.rank_list_add(ns, g.value, start // g.slice_us, sig, start, ttl(ns, g))
            for ns, g, start, sig in sorted(lists)])
        if len(self._rank_lists) + len(lists) > _RANK_LISTS_MAX:
            self._rank_lists.clear()
        self._rank_lists |= lists
