"""Cassandra TimeSeries event store: one table per (namespace, time slice), idempotent events.

Layout (statements in ``sinks.cassandra.cql``):
* Slice table ``ev_<ns>_<hash>_<slice>``: partition ``(namespace, counter_name, time_bucket,
  event_bucket)``, clustering ``(event_time DESC, event_id, event_item_key)``, so a hot counter is
  spread over ``buckets_per_id`` partitions per ``seconds_per_bucket`` and no partition grows wide.
  ``default_time_to_live`` comes from the namespace's ``delete_after`` (a backstop: retention drops
  whole slices with DROP TABLE once they are old *and* rolled up, see ``event_ttl_seconds``).
  Tables are created on demand (``CREATE TABLE IF NOT EXISTS`` with a deterministic table id, so
  workers racing to create one slice issue identical DDL), listed in ``event_slices`` before any
  event lands in them; a process re-reads that catalog only when the bucket index points at a table
  it does not know yet, and reads a table dropped meanwhile as empty.
* ``event_namespaces`` pins each namespace's partitioning on its first write (a lightweight
  transaction, once per namespace): time_bucket and event_bucket are part of an event's primary key,
  so a later configuration change must not re-key (and so double) events.
* ``event_buckets`` indexes which ``(time_bucket, event_bucket)`` partitions of a counter hold
  events, and whether a partition holds a clear. A range reads the index (one partition) and then
  only the event partitions that exist, concurrently: a never-rolled-up counter (rollup_ts 0) or one
  idle for weeks costs what its events cost, never one query per bucket since 1970. Written
  *before* the events, so a visible event always has its index row (and its clear flag).
* ``event_counters`` registers each counter name (once per process) for ``counters()``, which pages
  a namespace's counters in name order without scanning the cluster.

Writes are idempotent by primary key without lightweight transactions: rows already stored are
looked up first (one range read per partition of the batch) and only new identities are inserted,
``USING TIMESTAMP`` = event time and ``USING TTL`` = the namespace's backstop (capped below the 2038
expiry limit at write time). An identity is stored once whatever happens (it is the primary key), re-sends
cost a read, and ``write_events`` can return how many rows were new: a re-sent event that
``delete_rolled_up`` deleted reads as absent and is inserted again, but the range tombstone (stamped
later than any event time) shadows it, so inserts older than a possible cutoff (``_floor``) are read
back and counted only if visible.

Which *content* an identity keeps is first-write-wins only when the later write reads the earlier one.
Two writes of one identity carry the same write timestamp (its event time), and Cassandra (4.0+,
CASSANDRA-14592) resolves equal timestamps per cell: a tombstone wins, then the cell expiring later, then
the greater value (bytes compared unsigned: a negative delta beats any positive one, ``true`` beats
``false``). Writes that carry a TTL expire ``now + ttl`` on their coordinator's clock, so among them the
one applied in a later second wins; without a TTL the greater value does, cell by cell, so ``delta`` and
``is_clear`` may come from different writes. That happens only when two writes of one identity with
different content both miss each other: (a) writers racing on one identity (a partition moving between
workers mid-batch, both persisting the same batch: same content, so nothing changes), (b) a client re-using
an idempotency token with another delta while the first write's read-before-write misses it: a timed-out
write that landed on fewer replicas than a quorum read meets, or racing writers. Then the identity
counts once, with one of the deltas (not necessarily the first), replicas converge on the same one, and a
rollup computed before they converged may hold the other: counts stay off by the difference until a
recount. Making it first-write-wins would take a lightweight transaction per event (Paxos: four round
trips), which the design rejects for the hot path; with identical re-sends, the normal case, none of this
matters.

Aggregation over ``(after, upto]``: the latest clear is found in the partitions flagged
``has_clear`` (their rows are read); every other partition is summed by Cassandra
(``sum(cast(delta AS varint)), count(*)``: a bigint sum would wrap once the total leaves int64, a varint sum is
exact), restricted to after the latest clear when there is one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from sinks.base import ScanCursor
from sinks.cassandra.config import ExpiryCap, event_ttl_seconds, index_ttl_seconds
from sinks.cassandra.cql import (
    COUNTER_SHARDS,
    MIN_BIGINT,
    EventCql,
    Part,
    Stmt,
    bucket_slices,
    index_bounds,
    parts_for,
    slice_table_name,
)
from sinks.cassandra.session import Executor, MissingTable, SliceTableUnknown, run_bounded
from sinks.keys import retention_cutoff
from sinks.model import EMPTY_AGGREGATE, Aggregate, EventRow, Partitioning
from sinks.sketches import BucketItems, bucket_items_of
from sinks.windows import BucketSum, bucket_sums_of

__all__ = ["CassandraEventStore"]

log = logging.getLogger(__name__)

_SCAN_BUCKETS_PER_ROUND = 8  # time buckets fetched concurrently by one scan round
_REGISTERED_MAX = 200_000  # counters remembered as registered in event_counters (then forgotten at once)


class CassandraEventStore:
    """The production event store. ``partitioning_for(namespace)`` gives the configured partitioning
    (pinned on a namespace's first write); ``delete_after_for(namespace)`` its retention in seconds
    (None: slice tables get no TTL and only ``drop_expired_slices`` removes events)."""

    def __init__(self, executor: Executor, partitioning_for: Callable[[str], Partitioning], *,
                 delete_after_for: Callable[[str], float | None] | None = None, ttl_grace_s: int = 86_400,
                 table_ids: bool = True, expiry_cap: ExpiryCap | None = None,
                 clock_us: Callable[[], int] = lambda: time.time_ns() // 1000) -> None:
        self._x = executor
        self._cap = expiry_cap or ExpiryCap()
        self._clock_us = clock_us
        self._cutoffs: dict[tuple[str, str], int] = {}  # (namespace, counter) -> delete_rolled_up's latest cutoff
        self._cql = EventCql(executor.keyspace)
        self._partitioning_for = partitioning_for
        self._delete_after_for = delete_after_for
        self._ttl_grace_s = ttl_grace_s
        self._table_ids = table_ids
        self._pinned: dict[str, Partitioning] = {}
        # Slice tables of each namespace known to exist: read from the catalog, or created here.
        # Only ever trusted positively; an unknown table triggers a fresh catalog read.
        self._known: dict[str, set[str]] = {}
        self._registered: set[tuple[str, str]] = set()  # (namespace, counter) already in event_counters

    # -- EventStore ---------------------------------------------------------------------------

    async def write_events(self, rows: Sequence[EventRow]) -> int:
        if not rows:
            return 0
        unique: dict[tuple, EventRow] = {}
        for row in rows:  # the first of duplicates inside one batch wins
            unique.setdefault(row[:5], row)
        try:
            return await self._write(list(unique.values()), recreate=set())
        except MissingTable as exc:  # a slice table this process believed existed was dropped
            log.warning("event table %s vanished during a write; re-creating it and retrying", exc.table)
            for tables in self._known.values():
                tables.discard(exc.table or "")
            return await self._write(list(unique.values()), recreate={exc.table or ""})

    async def aggregate(self, namespace: str, counter: str, after_us: int, upto_us: int) -> Aggregate:
        if upto_us <= after_us:
            return EMPTY_AGGREGATE
        part = await self._pin(namespace, create=False)
        if part is None:
            return EMPTY_AGGREGATE
        parts = await self._parts(namespace, counter, after_us, upto_us, part)
        return await self._aggregate_parts(namespace, counter, after_us, upto_us, part, parts)

    async def aggregate_many(self, namespace: str, windows: Sequence[tuple[str, int, int]]) -> list[Aggregate]:
        """The windows' bucket-index rows in one fan-out and one catalog refresh (as ``_window_rows``), then the
        windows' partition reads, windows concurrently up to the session's concurrency (``run_bounded``): a batch
        of small windows does not wait on one round trip after another."""
        found = await self._window_parts(namespace, windows)
        out = [EMPTY_AGGREGATE] * len(windows)
        if found is None:
            return out
        part, live, parts = found

        async def one(k: int) -> Aggregate:
            _i, counter, after, upto = live[k]
            return await self._aggregate_parts(namespace, counter, after, upto, part, parts[k])
        results = await run_bounded(range(len(live)), one, max(1, self._x.concurrency), missing_ok=False)
        for (i, *_window), agg in zip(live, results, strict=True):
            out[i] = agg or EMPTY_AGGREGATE
        return out

    async def write_and_aggregate(self, rows: Sequence[EventRow], namespace: str,
                                  windows: Sequence[tuple[str, int, int]]) -> list[Aggregate]:
        """The write, then the reads: at a quorum consistency (the default, LOCAL_QUORUM) they see the write."""
        await self.write_events(rows)
        return await self.aggregate_many(namespace, windows)

    async def bucket_sums_many(self, namespace: str, windows: Sequence[tuple[str, int, int]],
                               width_us: int) -> list[list[BucketSum]]:
        """The windows' bucket-index rows in one fan-out, then every event partition of every window in another;
        the rows are summed per bucket here (CQL cannot group by a time expression). Cost: the events of the
        ranges, which for a rollup are those of the minutes it touches."""
        if width_us <= 0:
            raise ValueError(f"bucket width must be positive (got {width_us})")
        rows = await self._window_rows(namespace, windows)
        return [bucket_sums_of(((int(t), int(d or 0), bool(clear)) for t, _id, _key, d, clear in rows.get(i, ())),
                               width_us) for i in range(len(windows))]

    async def bucket_items_many(self, namespace: str, windows: Sequence[tuple[str, int, int]],
                                width_us: int) -> list[list[BucketItems]]:
        """As ``bucket_sums_many`` (the same reads), grouping the rows' item keys instead of summing deltas."""
        if width_us <= 0:
            raise ValueError(f"bucket width must be positive (got {width_us})")
        rows = await self._window_rows(namespace, windows)
        return [bucket_items_of(((int(t), str(key or ""), bool(clear)) for t, _id, key, _d, clear in rows.get(i, ())),
                                width_us) for i in range(len(windows))]

    async def _window_rows(self, namespace: str, windows: Sequence[tuple[str, int, int]]) -> dict[int, list[tuple]]:
        """The event rows ``(event_time, event_id, event_item_key, delta, is_clear)`` of each window (by index):
        the windows' bucket-index rows in one fan-out, then every event partition of every window in another."""
        found = await self._window_parts(namespace, windows)
        if found is None:
            return {}
        _part, live, parts = found
        stmts: list[Stmt] = []
        owners: list[int] = []
        for (i, c, after, upto), ps in zip(live, parts, strict=True):
            stmts += [self._rows(p, namespace, c, after, upto) for p in ps]
            owners += [i] * len(ps)
        events: dict[int, list[tuple]] = {}
        for i, rows in zip(owners, await self._read(namespace, stmts), strict=True):
            events.setdefault(i, []).extend(rows or ())
        return events

    async def _window_parts(self, namespace: str, windows: Sequence[tuple[str, int, int]]
                            ) -> tuple[Partitioning, list[tuple[int, str, int, int]], list[list[Part]]] | None:
        """The non-empty windows ``(index, counter, after, upto)`` and their event partitions: the bucket-index
        rows in one fan-out, then (as ``_parts``) one catalog refresh if some table is unknown. None when
        nothing of the namespace is stored."""
        live = [(i, c, after, upto) for i, (c, after, upto) in enumerate(windows) if upto > after]
        part = await self._pin(namespace, create=False) if live else None
        if part is None:
            return None
        index = await self._x.run_all([self._cql.index_range(namespace, c, *index_bounds(after, upto, part))
                                       for _i, c, after, upto in live])
        parts = [parts_for(namespace, rows or (), after, upto, part)
                 for (_i, _c, after, upto), rows in zip(live, index, strict=True)]
        known = self._known.get(namespace, set())
        if any(p.table not in known for ps in parts for p in ps):
            known = await self._refresh_catalog(namespace)
            parts = [[p for p in ps if p.table in known] for ps in parts]
        return part, live, parts

    async def scan(self, namespace: str, counter: str, after_us: int, upto_us: int, *,
                   after: ScanCursor | None = None, limit: int = 10_000) -> list[EventRow]:
        if upto_us <= after_us or limit <= 0 or (after is not None and after[0] > upto_us):
            return []
        part = await self._pin(namespace, create=False)
        if part is None:
            return []
        cursor = after if after is not None and after[0] > after_us else None
        low = cursor[0] - 1 if cursor is not None else after_us
        parts = await self._parts(namespace, counter, low, upto_us, part)
        buckets = sorted({p.time_bucket for p in parts})
        out: list[EventRow] = []
        for start in range(0, len(buckets), _SCAN_BUCKETS_PER_ROUND):
            chunk = set(buckets[start:start + _SCAN_BUCKETS_PER_ROUND])
            chosen = [p for p in parts if p.time_bucket in chunk]
            results = await self._read(namespace, [self._rows(p, namespace, counter, low, upto_us) for p in chosen])
            merged = sorted(((int(t), eid, key, int(d or 0), bool(c)) for result in results
                             for t, eid, key, d, c in (result or ())), key=lambda r: (r[0], r[1], r[2]))
            for t, eid, key, d, c in merged:  # time buckets are disjoint and ascending: global order
                if cursor is not None and (t, eid, key) <= cursor:
                    continue
                out.append((namespace, counter, t, eid, key, d, c))
                if len(out) >= limit:
                    return out
        return out

    async def contains(self, namespace: str, keys: Sequence[tuple[str, int, str, str]]) -> list[bool]:
        """Each identity read from its one partition (an event's slice, time bucket and event bucket follow from
        its identity, as on write), its one microsecond; up to the session's concurrency at once. A slice table
        that does not exist (never written, or dropped by retention) holds none of them."""
        part = await self._pin(namespace, create=False) if keys else None
        if part is None:
            return [False] * len(keys)
        stmts = [self._cql.rows(slice_table_name(namespace, part.slice_of(t)), namespace, counter, part.time_bucket(t),
                                part.event_bucket(event_id), t - 1, t) for counter, t, event_id, _key in keys]
        found = await self._read(namespace, stmts)
        return [any(r[1] == event_id and r[2] == item_key for r in rows or ())
                for (_c, _t, event_id, item_key), rows in zip(keys, found, strict=True)]

    async def counters(self, namespace: str, *, after: str | None = None, limit: int = 1000) -> list[str]:
        """Names from the ``event_counters`` registry (one partition per shard, each in name order:
        the page is a merge of every shard's next names), keeping those with stored events: the
        counter's newest bucket-index row must lie in a slice that still exists (retention drops
        the oldest slices first, so an older live row cannot hide behind a dropped newest one)."""
        if limit <= 0:
            return []
        part = await self._pin(namespace, create=False)
        if part is None:
            return []
        live = await self._refresh_catalog(namespace)
        out: list[str] = []
        cursor = after
        while len(out) < limit:
            want = limit - len(out)
            pages = await self._x.run_all([self._cql.counters_page(namespace, shard, cursor, want)
                                           for shard in range(COUNTER_SHARDS)])
            names = sorted({str(row[0]) for page in pages for row in (page or ())})[:want]
            if not names:
                break
            newest = await self._x.run_all([self._cql.index_newest(namespace, name) for name in names])
            for name, rows in zip(names, newest, strict=True):
                if rows and any(slice_table_name(namespace, s) in live
                                for s in bucket_slices(int(rows[0][0]), MIN_BIGINT, 2**63 - 1, part)):
                    out.append(name)
            cursor = names[-1]
            if len(names) < want:
                break  # every shard is exhausted
        return out

    async def delete_rolled_up(self, namespace: str, counter: str, before_us: int, rolled_up_to_us: int) -> int:
        cutoff = retention_cutoff(before_us, rolled_up_to_us)
        part = await self._pin(namespace, create=False)
        if part is None:
            return 0
        parts = await self._parts(namespace, counter, MIN_BIGINT, cutoff - 1, part)
        c = self._cql
        tail = self._settled_tail(parts, cutoff, rolled_up_to_us, part)
        found = await self._read(namespace, [
            *(c.count_before(p.table, namespace, counter, p.time_bucket, p.event_bucket, cutoff) for p in parts),
            *(c.sum(p.table, namespace, counter, p.time_bucket, p.event_bucket, cutoff - 1, 2**63 - 1) for p in tail)])
        counts, left = found[:len(parts)], found[len(parts):]
        if len(self._cutoffs) >= _REGISTERED_MAX:
            self._cutoffs.clear()
        self._cutoffs[(namespace, counter)] = max(cutoff, self._cutoffs.get((namespace, counter), cutoff))
        await self._x.run_all([c.delete_before(p.table, namespace, counter, p.time_bucket, p.event_bucket, cutoff)
                               for p in parts], missing_ok=True)
        # index rows of buckets that ended before the cutoff point at nothing any more, nor do those of the
        # cutoff's bucket whose partition kept no event (else counters() would list a counter without events)
        emptied = {p.event_bucket for p, r in zip(tail, left, strict=True) if not (r and int(r[0][1] or 0))}
        await self._x.run_all([c.index_trim(namespace, counter, cutoff // part.bucket_us),
                               *(c.index_remove(namespace, counter, cutoff // part.bucket_us, eb)
                                 for eb in sorted(emptied))])
        return sum(int(r[0][0] or 0) for r in counts if r)

    @staticmethod
    def _settled_tail(parts: list[Part], cutoff: int, rolled_up_to_us: int, part: Partitioning) -> list[Part]:
        """The partitions of the bucket holding ``cutoff`` whose index rows may go once they hold no event: only
        when the whole bucket is rolled up (no event of it can still arrive, so no writer is between its index
        row and its events) and lies in one slice (its partitions here are all it has)."""
        edge = cutoff // part.bucket_us
        first, last = edge * part.bucket_us, (edge + 1) * part.bucket_us - 1
        if last > rolled_up_to_us or part.slice_of(first) != part.slice_of(last):
            return []
        return [p for p in parts if p.time_bucket == edge]

    async def drop_expired_slices(self, namespace: str, before_us: int, rolled_up_to_us: int) -> int:
        cutoff = retention_cutoff(before_us, rolled_up_to_us)
        dropped = [(s, table) for s, table, _start, end in await self._x.run(self._cql.list_slices(namespace))
                   if int(end) <= cutoff]
        for slice_no, table in dropped:
            await self._x.ddl(self._cql.drop_slice(table))
            await self._x.run(self._cql.remove_slice(namespace, int(slice_no)))
            self._known.get(namespace, set()).discard(table)
        if dropped:
            log.info("namespace %r: dropped %d expired slice(s) before %d", namespace, len(dropped), cutoff)
        return len(dropped)

    async def close(self) -> None:
        await self._x.close()

    # -- extras (ops, tests) ------------------------------------------------------------------

    async def slices(self, namespace: str) -> list[tuple[str, int, int]]:
        """(table, start_us, end_us) of the namespace's slice tables, oldest first."""
        rows = await self._x.run(self._cql.list_slices(namespace))
        return [(table, int(start), int(end)) for _s, table, start, end in sorted(rows, key=lambda r: r[0])]

    async def drop_namespace(self, namespace: str) -> int:
        """Drop every slice table of a namespace, its catalog rows and its counter registry (ops, test
        cleanup). Bucket-index rows are left to their TTL: they point at tables that no longer exist."""
        count = await self.drop_expired_slices(namespace, 2**62, 2**62)
        await self._x.run_all([self._cql.forget_counters(namespace, shard) for shard in range(COUNTER_SHARDS)])
        self._registered = {k for k in self._registered if k[0] != namespace}
        self._pinned.pop(namespace, None)
        self._known.pop(namespace, None)
        return count

    # -- internals ----------------------------------------------------------------------------

    async def _pin(self, namespace: str, *, create: bool) -> Partitioning | None:
        """The namespace's stored partitioning; on the write path pinned first (first writer wins)."""
        pinned = self._pinned.get(namespace)
        if pinned is not None:
            return pinned
        rows = await self._x.run(self._cql.get_namespace(namespace))
        configured: Partitioning | None = None
        if not rows:
            if not create:
                return None  # never written: nothing stored (not cached: it may appear later)
            configured = self._partitioning_for(namespace)
            await self._x.run(self._cql.pin_namespace(namespace, configured))
            rows = await self._x.run(self._cql.get_namespace(namespace, serial=True))
            if not rows:
                raise RuntimeError(f"namespace {namespace!r}: partitioning pin not readable after writing it")
        stored = Partitioning(*(int(v) for v in rows[0]))
        if create:
            if configured is None:
                try:
                    configured = self._partitioning_for(namespace)
                except KeyError:
                    configured = stored
            if stored != configured:
                log.warning("namespace %r: event store keeps its original partitioning %s (configured %s); "
                            "re-keying stored events would break idempotency", namespace, stored, configured)
        self._pinned[namespace] = stored
        return stored

    def _delete_after(self, namespace: str) -> float | None:
        if self._delete_after_for is None:
            return None
        try:
            return self._delete_after_for(namespace)
        except KeyError:
            return None

    def _ttl(self, namespace: str, part: Partitioning) -> int:
        """The namespace's event TTL, capped below the 2038 expiry limit as of now. Every event write binds it
        (overriding the table's ``default_time_to_live``, which was capped when the table was created); bucket-
        index rows get an hour more, unless that crosses the limit too (then they expire with their events)."""
        return self._cap(event_ttl_seconds(self._delete_after(namespace), part.seconds_per_slice, self._ttl_grace_s),
                         f"namespace {namespace!r} events")

    def _floor(self, namespace: str, counter: str) -> int:
        """Event times below which a re-sent event may have been deleted by ``delete_rolled_up``, whose range
        tombstone (stamped later than any event time) then shadows the re-insert: this process's own cutoffs,
        and ``delete_after`` ago (how far back retention deletes)."""
        floor = self._cutoffs.get((namespace, counter), MIN_BIGINT)
        delete_after = self._delete_after(namespace)
        if delete_after:
            floor = max(floor, self._clock_us() - int(delete_after * 1_000_000))
        return floor

    async def _shadowed(self, doubtful: dict[tuple[str, str, str, int, int], list[tuple[int, str, str]]]) -> int:
        """How many of the identities just inserted below their floor stay invisible (shadowed by a range delete):
        read back, one range per partition. Only old re-sends (replays) pay for it."""
        keys = list(doubtful)
        found = await self._x.run_all([self._cql.span_keys(*k, min(i[0] for i in doubtful[k]),
                                                           max(i[0] for i in doubtful[k])) for k in keys],
                                      missing_ok=True)
        return sum(len(set(doubtful[k]) - {(int(t), eid, key) for t, eid, key in rows or ()})
                   for k, rows in zip(keys, found, strict=True))

    async def _refresh_catalog(self, namespace: str) -> set[str]:
        """The namespace's slice tables as the catalog lists them now (and remember them)."""
        return set(await self._catalog_ends(namespace))

    async def _catalog_ends(self, namespace: str) -> dict[str, int]:
        """Each slice table the catalog lists now, with the end of its slice (and remember them)."""
        ends = {row[1]: int(row[3]) for row in await self._x.run(self._cql.list_slices(namespace))}
        self._known[namespace] = set(ends)
        return ends

    async def _parts(self, namespace: str, counter: str, after_us: int, upto_us: int,
                     part: Partitioning) -> list[Part]:
        """Event partitions of the range, from the counter's bucket index.

        A part whose table this process does not know yet (another process created the slice)
        re-reads the catalog once: a table missing from a fresh catalog was dropped by retention
        (catalog rows are written before any event, and removed only after the DROP), so it is
        skipped. A known table that answers "unconfigured table" is read as empty only when retention can have
        dropped it meanwhile; otherwise its coordinator lags on its schema (`_read`).
        """
        tb_lo, tb_hi = index_bounds(after_us, upto_us, part)
        index_rows = await self._x.run(self._cql.index_range(namespace, counter, tb_lo, tb_hi))
        parts = parts_for(namespace, index_rows, after_us, upto_us, part)
        known = self._known.get(namespace, set())
        if any(p.table not in known for p in parts):
            known = await self._refresh_catalog(namespace)
            parts = [p for p in parts if p.table in known]
        return parts

    async def _read(self, namespace: str, stmts: Sequence[Stmt]) -> list[list[tuple] | None]:
        """Reads of slice tables, a table that does not exist reading as None (empty): one never written, or one
        retention dropped whose catalog row is not yet removed. A table the catalog lists that retention cannot
        have dropped (its slice ends after now - delete_after, or the namespace keeps events forever) is one the
        coordinator does not know yet: SliceTableUnknown, an outage the caller waits out. Read as empty, a rollup
        certified a count without its events (a review)."""
        results = await self._x.run_all(stmts, missing_ok=True)
        missing = {s.table for s, r in zip(stmts, results, strict=True) if r is None and s.table is not None}
        if missing:
            ends = await self._catalog_ends(namespace)
            delete_after = self._delete_after(namespace)
            horizon = self._clock_us() - int(delete_after * 1_000_000) if delete_after else None
            unknown = sorted(table for table in missing & set(ends) if horizon is None or ends[table] > horizon)
            if unknown:
                raise SliceTableUnknown(namespace, unknown)
        return results

    async def _aggregate_parts(self, namespace: str, counter: str, after_us: int, upto_us: int, part: Partitioning,
                               parts: list[Part]) -> Aggregate:
        """Aggregate of one window from its event partitions: flagged ones read row by row, the rest summed."""
        if not parts:
            return EMPTY_AGGREGATE
        flagged = [p for p in parts if p.has_clear]
        plain = [p for p in parts if not p.has_clear]
        rows: list[tuple] = []
        for result in await self._read(namespace, [self._rows(p, namespace, counter, after_us, upto_us)
                                                   for p in flagged]):
            rows.extend(result or ())
        return await self._combine(namespace, counter, after_us, upto_us, part, rows, plain)

    def _rows(self, p: Part, namespace: str, counter: str, after_us: int, upto_us: int) -> Stmt:
        return self._cql.rows(p.table, namespace, counter, p.time_bucket, p.event_bucket, after_us, upto_us)

    async def _combine(self, namespace: str, counter: str, after_us: int, upto_us: int, part: Partitioning,
                       flagged_rows: list[tuple], plain: list[Part]) -> Aggregate:
        """Aggregate from the rows of the clear-flagged partitions plus server-side sums of the rest."""
        c = self._cql
        clears = [int(r[0]) for r in flagged_rows if r[4]]
        last_clear = max(clears) if clears else None
        if last_clear is None:
            delta = sum(int(r[3] or 0) for r in flagged_rows)
            events = len(flagged_rows)
            sums = await self._read(namespace, [c.sum(p.table, namespace, counter, p.time_bucket, p.event_bucket,
                                                      after_us, upto_us) for p in plain])
            for result in sums:
                if result:
                    delta += int(result[0][0] or 0)
                    events += int(result[0][1] or 0)
            return Aggregate(delta, False, None, events)
        # adds strictly after the latest clear count; events at or after it are what the result depends on
        delta = sum(int(r[3] or 0) for r in flagged_rows if int(r[0]) > last_clear and not r[4])
        events = sum(1 for r in flagged_rows if int(r[0]) >= last_clear)
        clear_bucket = last_clear // part.bucket_us
        stmts: list[Stmt] = []
        at_clear: list[bool] = []
        for p in plain:
            if p.time_bucket < clear_bucket:
                continue  # ends before the clear
            stmts.append(c.sum(p.table, namespace, counter, p.time_bucket, p.event_bucket, last_clear, upto_us))
            at_clear.append(False)
            if p.time_bucket == clear_bucket:  # adds at the clear's own instant: erased, but depended on
                stmts.append(c.sum(p.table, namespace, counter, p.time_bucket, p.event_bucket, last_clear - 1,
                                   last_clear))
                at_clear.append(True)
        for erased, result in zip(at_clear, await self._read(namespace, stmts), strict=True):
            if result:
                if not erased:
                    delta += int(result[0][0] or 0)
                events += int(result[0][1] or 0)
        return Aggregate(delta, True, last_clear, events)

    async def _write(self, rows: list[EventRow], recreate: set[str]) -> int:
        c = self._cql
        parts: dict[str, Partitioning] = {}
        for namespace in {r[0] for r in rows}:
            p = await self._pin(namespace, create=True)
            assert p is not None
            parts[namespace] = p
        ttls = {ns: self._ttl(ns, p) for ns, p in parts.items()}  # capped below 2038 now, bound by every write below
        new_tables: dict[str, tuple[str, int]] = {}
        index: dict[tuple[str, str, int, int], bool] = {}
        groups: dict[tuple[str, str, str, int, int], list[EventRow]] = {}
        for row in rows:
            namespace, counter, event_time, event_id = row[0], row[1], row[2], row[3]
            p = parts[namespace]
            slice_no = p.slice_of(event_time)
            table = slice_table_name(namespace, slice_no)
            if table not in self._known.get(namespace, ()):
                new_tables[table] = (namespace, slice_no)
            tb, eb = p.time_bucket(event_time), p.event_bucket(event_id)
            key = (namespace, counter, tb, eb)
            index[key] = index.get(key, False) or bool(row[6])
            groups.setdefault((table, namespace, counter, tb, eb), []).append(row)
        # 1. tables (one DDL at a time), then their catalog rows: before any event lands in them.
        #    Slices another process created are found in the catalog and need no DDL.
        #    A table that vanished under a write (dropped by hand) is re-created even if still listed.
        for namespace in {ns for ns, _ in new_tables.values()}:
            listed = await self._refresh_catalog(namespace)
            new_tables = {t: v for t, v in new_tables.items() if t not in listed or t in recreate}
        for table, (namespace, slice_no) in sorted(new_tables.items()):
            p = parts[namespace]
            await self._x.ddl(c.create_slice(table, ttl_s=ttls[namespace],
                                             seconds_per_slice=p.seconds_per_slice, table_ids=self._table_ids))
            await self._x.run(c.add_slice(namespace, slice_no, table, p))
            self._known.setdefault(namespace, set()).add(table)
        # 2. index rows (and clear flags), and the counter registry, before the events they point at
        unregistered = {(ns, counter) for ns, counter, _tb, _eb in index} - self._registered
        await self._x.run_all([
            *(c.index_add(ns, counter, tb, eb, has_clear=clear, ttl_s=self._cap(index_ttl_seconds(ttls[ns])))
              for (ns, counter, tb, eb), clear in index.items()),
            *(c.register_counter(ns, counter) for ns, counter in sorted(unregistered))])
        if len(self._registered) + len(unregistered) > _REGISTERED_MAX:
            self._registered.clear()
        self._registered |= unregistered
        # 3. which identities are stored already: one range read per partition of the batch
        keys = list(groups)
        spans = await self._x.run_all([
            c.span_keys(*k, min(r[2] for r in groups[k]), max(r[2] for r in groups[k])) for k in keys])
        inserts: list[Stmt] = []
        doubtful: dict[tuple[str, str, str, int, int], list[tuple[int, str, str]]] = {}  # maybe deleted before
        for k, found in zip(keys, spans, strict=True):
            table, ns, counter, tb, eb = k
            stored = {(int(t), eid, key) for t, eid, key in (found or ())}
            floor = self._floor(ns, counter)
            for row in groups[k]:
                if (row[2], row[3], row[4]) not in stored:
                    inserts.append(c.insert(table, ns, counter, tb, eb, *row[2:7], ttls[ns]))
                    if row[2] < floor:
                        doubtful.setdefault(k, []).append((row[2], row[3], row[4]))
        # 4. the new events; those a range delete shadows were not new
        await self._x.run_all(inserts)
        return len(inserts) - (await self._shadowed(doubtful) if doubtful else 0)
