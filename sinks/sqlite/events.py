"""SQLite TimeSeries event store: one table per (namespace, time slice), mirroring the Cassandra layout.

Layout (why):
* Table ``events_<ns>_<hash>_<slice>`` per namespace and slice: slice numbers are only comparable
  within one namespace's ``seconds_per_slice``, and retention drops a whole slice with one DROP TABLE.
* PRIMARY KEY (namespace, counter, time_bucket, event_time, event_id, event_item_key) WITHOUT ROWID:
  the event identity (time_bucket is a function of event_time, so uniqueness is exactly the
  identity's); INSERT OR IGNORE makes writes idempotent (first write wins). The table is its own
  time index: aggregation and scans seek with a range predicate on (time_bucket, event_time), so
  their cost depends only on the events in the range, never on how many old (rolled-up) events the
  counter has. ``event_bucket`` is stored (Cassandra's partition key is (namespace, counter,
  time_bucket, event_bucket)) but deliberately not in the SQLite key: a B-tree has no wide-partition
  problem, and keying on it scattered every batch over counters x buckets leaf pages and needed a
  second, covering time index: 2.5x slower writes and 2x the file size (measured, 1000 counters).
* Partial index on clears: the latest clear of a range is one index seek.
* Catalog ``event_slices`` lists every slice table with its time range, so a range touches only the
  slices that overlap it (a never-rolled-up counter aggregates from 0 without enumerating empty
  slices). It is re-read whenever ``PRAGMA schema_version`` moves, i.e. when any process created or
  dropped a slice.
* Catalog ``event_namespaces`` pins each namespace's partitioning on first write: time_bucket is in
  the key, so a later config change must not re-key (and double) events.
* ``PRAGMA user_version`` records the layout; a file of another layout is refused, never misread.
"""

from __future__ import annotations

import functools
import logging
import re
import sqlite3
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import orjson
import xxhash

from sinks.base import ScanCursor
from sinks.keys import retention_cutoff
from sinks.model import EMPTY_AGGREGATE, Aggregate, EventRow, Partitioning, join_halves
from sinks.sketches import BucketItems, bucket_items_of, combine_items
from sinks.sqlite.bulk import RowsStatement, bulk_statement, insert_rows, json_rows
from sinks.sqlite.sliced import open_layout
from sinks.sqlite.thread import SqliteThread
from sinks.windows import BucketSum, combine_sums

__all__ = ["SqliteEventStore"]

T = TypeVar("T")

log = logging.getLogger(__name__)

_CATALOG = """
CREATE TABLE IF NOT EXISTS event_namespaces (
    namespace TEXT PRIMARY KEY, buckets_per_id INTEGER NOT NULL,
    seconds_per_bucket INTEGER NOT NULL, seconds_per_slice INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS event_slices (
    table_name TEXT PRIMARY KEY, namespace TEXT NOT NULL, slice INTEGER NOT NULL,
    start_us INTEGER NOT NULL, end_us INTEGER NOT NULL, bucket_us INTEGER NOT NULL) WITHOUT ROWID;
"""
LAYOUT = 2  # PRAGMA user_version of files in this layout

_SLICE_DDL = """
CREATE TABLE IF NOT EXISTS "{t}" (
    namespace TEXT NOT NULL, counter TEXT NOT NULL, time_bucket INTEGER NOT NULL,
    event_bucket INTEGER NOT NULL, event_time INTEGER NOT NULL, event_id TEXT NOT NULL,
    event_item_key TEXT NOT NULL, delta INTEGER NOT NULL, is_clear INTEGER NOT NULL,
    PRIMARY KEY (namespace, counter, time_bucket, event_time, event_id, event_item_key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS "{t}_clears" ON "{t}" (namespace, counter, event_time) WHERE is_clear = 1;
"""

_INSERT = 'INSERT OR IGNORE INTO "{t}" VALUES'
_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?)"

# Reads of many windows of one slice in one statement: the windows are a VALUES list `k`, each row (window index,
# namespace, counter, after_us, upto_us, time bucket low, time bucket high, width), and the result is one row, a JSON
# array of rows naming their window. Why: Python's sqlite3 releases the GIL at every step, one per result row, and
# beside a busy thread each hand-over can cost a switch interval (5 ms). Beside a busy thread, 32 aggregates took
# 25-82 ms (p90 126-134 ms) as a statement each and 32-35 ms (p90 54-58 ms) this way, alone 1.8 and 1.0 ms; bucket
# sums of 300 windows 2.2-7.1 s and 0.2-0.41 s (scratch benchmarks).
# (time_bucket, event_time) > (time_bucket(x), x) holds exactly when event_time > x: buckets are monotone.
_WINDOWS_HEAD = "WITH k (i, namespace, counter, after_us, upto_us, tb_lo, tb_hi, width) AS (VALUES"
_WINDOW_ROW = "(?, ?, ?, ?, ?, ?, ?, ?)"

# Aggregates: per window the latest clear via the clears index, then one primary-key range scan starting at that
# clear (or just after after_us), summing adds strictly after the clear; [window, latest clear, [NULL, sum, events]].
# Each delta fits int64, but their sum need not, and SQLite's SUM then fails ("integer overflow"): `_summed` runs
# the statement again summing the deltas' high and low 32-bit halves (sinks.model.join_halves).
# The windows are materialized with their clears so each clear is looked up once. Time buckets: of after_us + 1 and
# upto_us; width: the slice's bucket width (the clear's bucket is lc / width).
_AGGREGATE_TAIL = """), c AS MATERIALIZED (
SELECT k.*, (SELECT MAX(event_time) FROM "{t}" INDEXED BY "{t}_clears"
             WHERE namespace = k.namespace AND counter = k.counter AND is_clear = 1
               AND event_time > k.after_us AND event_time <= k.upto_us) AS lc
FROM k)
SELECT json_group_array(json_array(c.i, c.lc, (
    SELECT json_array(NULL, COALESCE(SUM(d), 0), COUNT(*)) FROM (
    SELECT CASE WHEN e.is_clear = 0 AND (c.lc IS NULL OR e.event_time > c.lc) THEN e.delta END AS d
    FROM "{t}" AS e
    WHERE e.namespace = c.namespace AND e.counter = c.counter
      AND (e.time_bucket, e.event_time) >= (COALESCE(c.lc / c.width, c.tb_lo), COALESCE(c.lc, c.after_us + 1))
      AND (e.time_bucket, e.event_time) <= (c.tb_hi, c.upto_us)))))
FROM c
"""
# The same with the sums of the deltas' high and low halves, [high, low, events] (`_summed`)
_AGGREGATE_SPLIT_TAIL = _AGGREGATE_TAIL.replace("NULL, COALESCE(SUM(d), 0)", "SUM(d >> 32), SUM(d & 4294967295)")


@functools.lru_cache(maxsize=256)
def aggregate_statement(table: str, split: bool = False) -> RowsStatement:
    """The aggregate statement of one slice table (see ``_AGGREGATE_TAIL``; `split`: the sums in halves)."""
    tail = _AGGREGATE_SPLIT_TAIL if split else _AGGREGATE_TAIL
    return RowsStatement(_WINDOWS_HEAD, _WINDOW_ROW, tail.format(t=table))


# Bucket sums: per window (a correlated subquery: one window's rows sorted at a time, not all windows' at once, which
# cost half as much again after a burst) the events of its range by one primary-key range scan (as _SCAN_FROM),
# grouped by bucket start (floor-aligned to the width, the buckets' own), each bucket's latest clear (by the clears
# index) bounding the adds summed: [window, [[bucket, NULL, sum, clear, events], ...]] (in halves again past int64,
# as the aggregates'). Time buckets: of after_us and upto_us.
_BUCKET_SUMS_TAIL = """)
SELECT json_group_array(json_array(k.i, (
  SELECT json_group_array(json_array(b, high, low, lc, n)) FROM (
    SELECT b, lc, COUNT(*) AS n, NULL AS high, COALESCE(SUM(d), 0) AS low FROM (
    SELECT e.b AS b, cl.lc AS lc,
           CASE WHEN e.is_clear = 0 AND (cl.lc IS NULL OR e.event_time > cl.lc) THEN e.delta END AS d
    FROM (SELECT event_time - ((event_time % k.width) + k.width) % k.width AS b, event_time, delta, is_clear
          FROM "{t}" WHERE namespace = k.namespace AND counter = k.counter
           AND (time_bucket, event_time) > (k.tb_lo, k.after_us) AND (time_bucket, event_time) <= (k.tb_hi, k.upto_us)
         ) AS e
    LEFT JOIN (SELECT event_time - ((event_time % k.width) + k.width) % k.width AS b, MAX(event_time) AS lc
               FROM "{t}" INDEXED BY "{t}_clears" WHERE namespace = k.namespace AND counter = k.counter
                AND is_clear = 1 AND event_time > k.after_us AND event_time <= k.upto_us GROUP BY 1) AS cl
      ON cl.b = e.b)
    GROUP BY b))))
FROM k
"""
_BUCKET_SUMS_SPLIT_TAIL = _BUCKET_SUMS_TAIL.replace("NULL AS high, COALESCE(SUM(d), 0) AS low",
                                                  "SUM(d >> 32) AS high, SUM(d & 4294967295) AS low")

# Bucket items (UNIQUE namespaces), by the same primary-key range scans: [window, event_time, item, is_clear] per
# event, grouped per bucket in Python. Windows as the bucket sums' (the width unused).
_BUCKET_ITEMS_TAIL = """)
SELECT json_group_array(json_array(k.i, ev.event_time, ev.event_item_key, ev.is_clear))
FROM k JOIN "{t}" AS ev
  ON ev.namespace = k.namespace AND ev.counter = k.counter
 AND (ev.time_bucket, ev.event_time) > (k.tb_lo, k.after_us) AND (ev.time_bucket, ev.event_time) <= (k.tb_hi, k.upto_us)
"""


@functools.lru_cache(maxsize=256)
def bucket_sums_statement(table: str, split: bool = False) -> RowsStatement:
    """The bucket sums statement of one slice table (see ``_BUCKET_SUMS_TAIL``; `split`: the sums in halves)."""
    return RowsStatement(_WINDOWS_HEAD, _WINDOW_ROW,
                         (_BUCKET_SUMS_SPLIT_TAIL if split else _BUCKET_SUMS_TAIL).format(t=table))


@functools.lru_cache(maxsize=256)
def bucket_items_statement(table: str) -> RowsStatement:
    """The bucket items statement of one slice table (see ``_BUCKET_ITEMS_TAIL``)."""
    return RowsStatement(_WINDOWS_HEAD, _WINDOW_ROW, _BUCKET_ITEMS_TAIL.format(t=table))


# A scan's page of one slice, as one JSON row of [event_time, event_id, event_item_key, delta, is_clear] (a row per
# event would cost a step, and a GIL hand-over, each: beside a busy thread 10,000 events took 4.8 s that way, see
# sinks.sqlite.bulk). Key order (time_bucket, event_time, event_id, event_item_key) is (event_time, event_id,
# event_item_key) order, so pages come straight off the primary key with no sort.
_SCAN_COLUMNS = "event_time, event_id, event_item_key, delta, is_clear"
_SCAN_FROM = f"""
SELECT {_SCAN_COLUMNS} FROM "{{t}}"
WHERE namespace = ? AND counter = ? AND (time_bucket, event_time) > (?, ?) AND (time_bucket, event_time) <= (?, ?)
ORDER BY time_bucket, event_time, event_id, event_item_key LIMIT ?
"""
_SCAN_AFTER = f"""
SELECT {_SCAN_COLUMNS} FROM "{{t}}"
WHERE namespace = ? AND counter = ? AND (time_bucket, event_time, event_id, event_item_key) > (?, ?, ?, ?)
  AND (time_bucket, event_time) <= (?, ?)
ORDER BY time_bucket, event_time, event_id, event_item_key LIMIT ?
"""


@functools.lru_cache(maxsize=512)
def scan_statement(scan: str, table: str) -> str:
    """`scan` (``_SCAN_FROM`` or ``_SCAN_AFTER``) of one slice table, its rows as one JSON row."""
    return f"SELECT json_group_array(json_array({_SCAN_COLUMNS})) FROM ({scan.format(t=table)})"


# Which of many event identities one slice holds: [[index], ...], one primary-key seek per identity.
_CONTAINS_HEAD = "WITH k (i, namespace, counter, time_bucket, event_time, event_id, event_item_key) AS (VALUES"
_CONTAINS_ROW = "(?, ?, ?, ?, ?, ?, ?)"
_CONTAINS_TAIL = (') SELECT json_group_array(json_array(k.i)) FROM k CROSS JOIN "{t}" AS e '
                  'USING (namespace, counter, time_bucket, event_time, event_id, event_item_key)')


@functools.lru_cache(maxsize=256)
def contains_statement(table: str) -> RowsStatement:
    """The identity lookup statement of one slice table (see ``_CONTAINS_TAIL``)."""
    return RowsStatement(_CONTAINS_HEAD, _CONTAINS_ROW, _CONTAINS_TAIL.format(t=table))
# A slice's distinct counters from :from ({op} is ">=", from "": all of them) or after it (">"), up to :limit of them
# and none past :upto (when not NULL), as one JSON row: a skip scan, each next name one primary-key seek (the key
# starts with (namespace, counter)), never a scan of the events; a name per step would cost a GIL hand-over each.
_COUNTERS = """
WITH RECURSIVE names (counter, n) AS (
  SELECT (SELECT counter FROM "{t}" WHERE namespace = :ns AND counter {op} :from ORDER BY counter LIMIT 1), 1
  UNION ALL
  SELECT (SELECT counter FROM "{t}" WHERE namespace = :ns AND counter > names.counter ORDER BY counter LIMIT 1), n + 1
  FROM names WHERE names.counter IS NOT NULL AND n < :limit AND (:upto IS NULL OR names.counter < :upto)
)
SELECT json_group_array(counter) FROM names WHERE counter IS NOT NULL AND (:upto IS NULL OR counter <= :upto)
"""


@functools.lru_cache(maxsize=512)
def counters_statement(table: str, *, after: bool) -> str:
    """The skip scan of one slice table (see ``_COUNTERS``): names after :from, or (``after`` False) all names."""
    return _COUNTERS.format(t=table, op=">" if after else ">=")


@dataclass(frozen=True, slots=True)
class _Slice:
    table: str
    start_us: int  # inclusive
    end_us: int  # exclusive
    bucket_us: int  # the namespace's pinned bucket width

    def bucket(self, event_time_us: int) -> int:
        return event_time_us // self.bucket_us


def _table_prefix(namespace: str) -> str:
    """ASCII-safe, collision-free table name prefix for a namespace ("a.b" and "a_b" differ by hash)."""
    safe = re.sub(r"[^A-Za-z0-9_]", "_", namespace)[:40]
    return f"events_{safe}_{xxhash.xxh32_hexdigest(namespace.encode())}"


def _table_name(prefix: str, slice_no: int) -> str:
    return f"{prefix}_{slice_no}" if slice_no >= 0 else f"{prefix}_m{-slice_no}"


class SqliteEventStore:
    """The embedded event store. One file, WAL, one transaction per batch; safe across processes.

    ``partitioning_for(namespace)`` gives the configured partitioning, used (and pinned) on a
    namespace's first write.
    """

    def __init__(self, path: str | Path, partitioning_for: Callable[[str], Partitioning], *,
                 lock_wait_s: float | None = None) -> None:
        self._partitioning_for = partitioning_for
        self._db = SqliteThread(path, "sqlite-events", self._setup, self._forget, lock_wait_s=lock_wait_s)
        # Thread-confined caches (only touched on the store's thread):
        self._pinned: dict[str, tuple[Partitioning, str]] = {}  # namespace -> (partitioning, prefix)
        self._slices: dict[str, list[_Slice]] = {}  # namespace -> slices sorted by start
        self._starts: dict[str, list[int]] = {}  # namespace -> [slice.start_us] for bisect
        self._tables: set[str] = set()
        self._schema_version = -1

    @property
    def path(self) -> Path:
        return self._db.path

    # -- EventStore ---------------------------------------------------------------------------

    async def write_events(self, rows: Sequence[EventRow]) -> int:
        if not rows:
            return 0
        return await self._db.run(self._write, rows)

    async def aggregate(self, namespace: str, counter: str, after_us: int, upto_us: int) -> Aggregate:
        if upto_us <= after_us:
            return EMPTY_AGGREGATE
        (aggregate,) = await self._db.run(self._read, self._aggregates, namespace, [(counter, after_us, upto_us)])
        return aggregate

    async def aggregate_many(self, namespace: str, windows: Sequence[tuple[str, int, int]]) -> list[Aggregate]:
        if not windows:
            return []
        return await self._db.run(self._aggregate_many, namespace, windows)

    async def write_and_aggregate(self, rows: Sequence[EventRow], namespace: str,
                                  windows: Sequence[tuple[str, int, int]]) -> list[Aggregate]:
        """One trip to the store's thread: the write's transaction, then the reads' snapshot (the write lock is
        not held while reading)."""
        def both(conn: sqlite3.Connection) -> list[Aggregate]:
            if rows:
                self._write(conn, rows)
            return self._aggregate_many(conn, namespace, windows) if windows else []
        return await self._db.run(both)

    def _aggregate_many(self, conn: sqlite3.Connection, namespace: str,
                        windows: Sequence[tuple[str, int, int]]) -> list[Aggregate]:
        return self._read(conn, self._aggregates, namespace, windows)

    async def bucket_sums_many(self, namespace: str, windows: Sequence[tuple[str, int, int]],
                               width_us: int) -> list[list[BucketSum]]:
        return await self._per_bucket(self._bucket_sums, namespace, windows, width_us)

    async def bucket_items_many(self, namespace: str, windows: Sequence[tuple[str, int, int]],
                                width_us: int) -> list[list[BucketItems]]:
        return await self._per_bucket(self._bucket_items, namespace, windows, width_us)

    async def _per_bucket(self, read: Callable[[sqlite3.Connection, str, Sequence[tuple[str, int, int]], int], list[T]],
                          namespace: str, windows: Sequence[tuple[str, int, int]], width_us: int) -> list[T]:
        """``read(conn, namespace, windows, width_us)`` on one snapshot."""
        if width_us <= 0:
            raise ValueError(f"bucket width must be positive (got {width_us})")
        if not windows:
            return []
        return await self._db.run(self._read, read, namespace, windows, width_us)

    async def scan(self, namespace: str, counter: str, after_us: int, upto_us: int, *,
                   after: ScanCursor | None = None, limit: int = 10_000) -> list[EventRow]:
        if upto_us <= after_us or limit <= 0 or (after is not None and after[0] > upto_us):
            return []
        return await self._db.run(self._read, self._scan, namespace, counter, after_us, upto_us, after, limit)

    async def contains(self, namespace: str, keys: Sequence[tuple[str, int, str, str]]) -> list[bool]:
        if not keys:
            return []
        return await self._db.run(self._read, self._contains, namespace, keys)

    async def counters(self, namespace: str, *, after: str | None = None, limit: int = 1000) -> list[str]:
        if limit <= 0:
            return []
        return await self._db.run(self._read, self._counters, namespace, after, limit)

    async def delete_rolled_up(self, namespace: str, counter: str, before_us: int, rolled_up_to_us: int) -> int:
        cutoff = retention_cutoff(before_us, rolled_up_to_us)
        return await self._db.run(self._write_txn, self._delete_rolled_up, namespace, counter, cutoff)

    async def drop_expired_slices(self, namespace: str, before_us: int, rolled_up_to_us: int) -> int:
        cutoff = retention_cutoff(before_us, rolled_up_to_us)
        return await self._db.run(self._write_txn, self._drop_slices, namespace, cutoff)

    async def close(self) -> None:
        await self._db.close()

    # -- extras (ops, tests) ------------------------------------------------------------------

    async def slices(self, namespace: str) -> list[tuple[str, int, int]]:
        """(table, start_us, end_us) of the namespace's slice tables, oldest first."""
        return await self._db.run(self._read, lambda conn: [
            (s.table, s.start_us, s.end_us) for s in self._slices_of(conn, namespace)])

    async def query_plan(self, namespace: str, counter: str, after_us: int, upto_us: int) -> list[str]:
        """EXPLAIN QUERY PLAN of the aggregate and scan statements for every slice the range touches."""
        def plan(conn: sqlite3.Connection) -> list[str]:
            lines: list[str] = []
            for s in self._overlapping(conn, namespace, after_us, upto_us):
                aggregate = bulk_statement(aggregate_statement(s.table), 1)
                for sql, args in ((aggregate, self._aggregate_args(s, 0, namespace, counter, after_us, upto_us)),
                                  (scan_statement(_SCAN_FROM, s.table),
                                   self._scan_from_args(s, namespace, counter, after_us, upto_us, 10)),
                                  (scan_statement(_SCAN_AFTER, s.table), (namespace, counter, s.bucket(after_us),
                                                                          after_us, "", "", s.bucket(upto_us), upto_us,
                                                                          10))):
                    lines += [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args)]
            return lines
        return await self._db.run(self._read, plan)

    # -- thread side: setup and caches --------------------------------------------------------

    def _setup(self, conn: sqlite3.Connection) -> None:
        layout = conn.execute("PRAGMA user_version").fetchone()[0]
        if layout == 0 and conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'event_slices'").fetchone():
            layout = 1  # written before the layout was versioned
        open_layout(conn, self.path, what="events", layout=LAYOUT, schema=_CATALOG, found=layout,
                    remedy="move the file away (and recount) or use the matching version")

    def _forget(self) -> None:
        """After a rollback the caches may describe uncommitted tables: reload them next time."""
        self._pinned.clear()
        self._schema_version = -1

    def _sync(self, conn: sqlite3.Connection) -> None:
        """Reload the slice catalog if any process changed the schema (created or dropped a slice)."""
        version = conn.execute("PRAGMA schema_version").fetchone()[0]
        if version == self._schema_version:
            return
        slices: dict[str, list[_Slice]] = {}
        for table, namespace, start, end, bucket_us in conn.execute(
                "SELECT table_name, namespace, start_us, end_us, bucket_us FROM event_slices "
                "ORDER BY namespace, start_us"):
            slices.setdefault(namespace, []).append(_Slice(table, start, end, bucket_us))
        self._slices = slices
        self._starts = {ns: [s.start_us for s in lst] for ns, lst in slices.items()}
        self._tables = {s.table for lst in slices.values() for s in lst}
        self._schema_version = version

    def _slices_of(self, conn: sqlite3.Connection, namespace: str) -> list[_Slice]:
        self._sync(conn)
        return self._slices.get(namespace, [])

    def _overlapping(self, conn: sqlite3.Connection, namespace: str, after_us: int, upto_us: int) -> list[_Slice]:
        """Slices holding some event_time in (after_us, upto_us], oldest first."""
        self._sync(conn)
        return self._synced_overlapping(namespace, after_us, upto_us)

    def _synced_overlapping(self, namespace: str, after_us: int, upto_us: int) -> list[_Slice]:
        """As ``_overlapping``, from the catalog as last synced: a call reading many ranges syncs once, not once per
        range (each sync is a statement, and a GIL hand-over: beside a busy thread 1,000 lookups took 0.7 s more)."""
        slices = self._slices.get(namespace)
        if not slices:
            return []
        hi = bisect_right(self._starts[namespace], upto_us)  # slices starting at or before upto
        lo = hi
        while lo > 0 and slices[lo - 1].end_us > after_us + 1:
            lo -= 1
        return slices[lo:hi]

    def _pin(self, conn: sqlite3.Connection, namespace: str) -> tuple[Partitioning, str]:
        """The namespace's partitioning as stored on its first write (inside a write transaction)."""
        pinned = self._pinned.get(namespace)
        if pinned is not None:
            return pinned
        configured = self._partitioning_for(namespace)
        conn.execute("INSERT OR IGNORE INTO event_namespaces VALUES (?, ?, ?, ?)",
                     (namespace, configured.buckets_per_id, configured.seconds_per_bucket,
                      configured.seconds_per_slice))
        row = conn.execute("SELECT buckets_per_id, seconds_per_bucket, seconds_per_slice FROM event_namespaces "
                           "WHERE namespace = ?", (namespace,)).fetchone()
        stored = Partitioning(*row)
        if stored != configured:
            log.warning("namespace %r: event store keeps its original partitioning %s (configured %s); "
                        "re-keying stored events would break idempotency", namespace, stored, configured)
        pinned = self._pinned[namespace] = (stored, _table_prefix(namespace))
        return pinned

    # -- thread side: operations --------------------------------------------------------------

    def _read(self, conn: sqlite3.Connection, fn: Callable[..., object], *args: object):
        return self._db.read(conn, fn, *args)

    def _write_txn(self, conn: sqlite3.Connection, fn: Callable[..., object], *args: object):
        return self._db.write(conn, fn, *args)

    def _write(self, conn: sqlite3.Connection, rows: Sequence[EventRow]) -> int:
        return self._db.write(conn, self._write_in_txn, rows)

    def _write_in_txn(self, conn: sqlite3.Connection, rows: Sequence[EventRow]) -> int:
        self._sync(conn)
        by_table: dict[str, list[tuple]] = {}
        new_slices: dict[str, tuple[str, int, Partitioning, str]] = {}
        ns_cache: dict[str, tuple[int, int, int, Partitioning, str]] = {}
        hash64 = xxhash.xxh64_intdigest
        current_key: tuple[str, int] | None = None
        current: list[tuple] = []
        for namespace, counter, event_time, event_id, item_key, delta, is_clear in rows:
            info = ns_cache.get(namespace)
            if info is None:
                part, prefix = self._pin(conn, namespace)
                info = ns_cache[namespace] = (part.slice_us, part.bucket_us, part.buckets_per_id, part, prefix)
            slice_us, bucket_us, buckets, part, prefix = info
            slice_no = event_time // slice_us
            if (namespace, slice_no) != current_key:
                current_key = (namespace, slice_no)
                table = _table_name(prefix, slice_no)
                if table in by_table:
                    current = by_table[table]
                else:
                    current = by_table[table] = []
                    if table not in self._tables:
                        new_slices[table] = (namespace, slice_no, part, prefix)
            current.append((namespace, counter, event_time // bucket_us, hash64(event_id.encode()) % buckets,
                            event_time, event_id, item_key, delta, 1 if is_clear else 0))
        for table, (namespace, slice_no, part, _prefix) in new_slices.items():
            for stmt in _SLICE_DDL.format(t=table).split(";"):  # not executescript: it would COMMIT
                if stmt.strip():
                    conn.execute(stmt)
            conn.execute("INSERT OR IGNORE INTO event_slices VALUES (?, ?, ?, ?, ?, ?)",
                         (table, namespace, slice_no, slice_no * part.slice_us, (slice_no + 1) * part.slice_us,
                          part.bucket_us))
        return sum(insert_rows(conn, RowsStatement(_INSERT.format(t=table), _ROW), params)
                   for table, params in by_table.items())

    @staticmethod
    def _aggregate_args(s: _Slice, i: int, namespace: str, counter: str, after_us: int, upto_us: int) -> tuple:
        return i, namespace, counter, after_us, upto_us, s.bucket(after_us + 1), s.bucket(upto_us), s.bucket_us

    @staticmethod
    def _range_args(s: _Slice, i: int, namespace: str, counter: str, after_us: int, upto_us: int,
                    width_us: int) -> tuple:
        return i, namespace, counter, after_us, upto_us, s.bucket(after_us), s.bucket(upto_us), width_us

    @staticmethod
    def _scan_from_args(s: _Slice, namespace: str, counter: str, after_us: int, upto_us: int, limit: int) -> tuple:
        return namespace, counter, s.bucket(after_us), after_us, s.bucket(upto_us), upto_us, limit

    def _by_slice(self, conn: sqlite3.Connection, namespace: str,
                  windows: Sequence[tuple[str, int, int]]) -> list[tuple[_Slice, list[int]]]:
        """The slices holding some event of the windows ``(counter, after_us, upto_us]``, oldest first, each with the
        indexes of the windows it overlaps."""
        by_slice: dict[str, tuple[_Slice, list[int]]] = {}
        self._sync(conn)
        for i, (_counter, after, upto) in enumerate(windows):
            if upto > after:
                for s in self._synced_overlapping(namespace, after, upto):
                    by_slice.setdefault(s.table, (s, []))[1].append(i)
        return sorted(by_slice.values(), key=lambda entry: entry[0].start_us)

    def _aggregates(self, conn: sqlite3.Connection, namespace: str,
                    windows: Sequence[tuple[str, int, int]]) -> list[Aggregate]:
        """The aggregate of every window ``(counter, after_us, upto_us)``: one statement per slice for all the windows
        it overlaps. Newest slice first: the latest clear may sit in a later slice than most of a window, and once
        a window met a clear, older slices cannot change its result."""
        delta = [0] * len(windows)
        events = [0] * len(windows)
        cleared: dict[int, int] = {}  # window -> its latest clear
        for s, members in reversed(self._by_slice(conn, namespace, windows)):
            params = [self._aggregate_args(s, i, namespace, *windows[i]) for i in members if i not in cleared]
            for i, last_clear, (high, low, n) in _summed(conn, aggregate_statement, s.table, params):
                delta[i] += join_halves(high, low)
                events[i] += n
                if last_clear is not None:
                    cleared[i] = last_clear
        return [Aggregate(delta[i], i in cleared, cleared.get(i), events[i]) for i in range(len(windows))]

    def _bucket_sums(self, conn: sqlite3.Connection, namespace: str, windows: Sequence[tuple[str, int, int]],
                     width_us: int) -> list[list[BucketSum]]:
        """One statement per slice for all the windows it overlaps, oldest slice first; a bucket straddling two
        slices (a slice width that is no multiple of the bucket width) is combined from its parts, the later part's
        clear erasing the earlier part."""
        out: list[list[BucketSum]] = [[] for _ in windows]
        for s, members in self._by_slice(conn, namespace, windows):
            found = _summed(conn, bucket_sums_statement, s.table,
                              [self._range_args(s, i, namespace, *windows[i], width_us) for i in members])
            for i, buckets in found:
                sums = out[i]
                for start, high, low, last_clear, n in sorted(buckets or ()):
                    part = (start, join_halves(high, low), last_clear, n)
                    sums.append(combine_sums(sums.pop(), part) if sums and sums[-1][0] == start else part)
        return out

    def _bucket_items(self, conn: sqlite3.Connection, namespace: str, windows: Sequence[tuple[str, int, int]],
                      width_us: int) -> list[list[BucketItems]]:
        """As ``_bucket_sums``: one statement per slice, oldest first, straddling buckets combined."""
        out: list[list[BucketItems]] = [[] for _ in windows]
        for s, members in self._by_slice(conn, namespace, windows):
            events: dict[int, list[tuple[int, str, bool]]] = {i: [] for i in members}
            for i, t, item, clear in json_rows(conn, bucket_items_statement(s.table),
                                               [self._range_args(s, i, namespace, *windows[i], width_us)
                                                for i in members]):
                events[i].append((t, item, bool(clear)))
            for i, found in events.items():
                items = out[i]
                for part in bucket_items_of(found, width_us):
                    items.append(combine_items(items.pop(), part) if items and items[-1][0] == part[0] else part)
        return out

    def _scan(self, conn: sqlite3.Connection, namespace: str, counter: str, after_us: int, upto_us: int,
              after: ScanCursor | None, limit: int) -> list[EventRow]:
        use_cursor = after is not None and after[0] > after_us
        low = after[0] - 1 if use_cursor and after is not None else after_us
        out: list[EventRow] = []
        for s in self._overlapping(conn, namespace, low, upto_us):
            want = limit - len(out)
            if use_cursor and after is not None:
                sql = scan_statement(_SCAN_AFTER, s.table)
                args: tuple = (namespace, counter, s.bucket(after[0]), *after, s.bucket(upto_us), upto_us, want)
            else:
                sql = scan_statement(_SCAN_FROM, s.table)
                args = self._scan_from_args(s, namespace, counter, after_us, upto_us, want)
            ((found,),) = conn.execute(sql, args).fetchall()
            # sorted: a JSON aggregate's order is not guaranteed (the scan's own order: no work on sorted rows)
            out.extend(sorted((namespace, counter, t, eid, key, d, bool(clear))
                              for t, eid, key, d, clear in orjson.loads(found)))
            if len(out) >= limit:
                break
        return out

    def _contains(self, conn: sqlite3.Connection, namespace: str,
                  keys: Sequence[tuple[str, int, str, str]]) -> list[bool]:
        """One statement per slice for all the identities of its time range (see ``_CONTAINS_TAIL``)."""
        by_slice: dict[str, tuple[_Slice, list[tuple]]] = {}
        self._sync(conn)
        for i, (counter, event_time, event_id, item_key) in enumerate(keys):
            for s in self._synced_overlapping(namespace, event_time - 1, event_time):
                rows = by_slice.setdefault(s.table, (s, []))[1]
                rows.append((i, namespace, counter, s.bucket(event_time), event_time, event_id, item_key))
        out = [False] * len(keys)
        for s, rows in by_slice.values():
            for (i,) in json_rows(conn, contains_statement(s.table), rows):
                out[i] = True
        return out

    def _counters(self, conn: sqlite3.Connection, namespace: str, after: str | None, limit: int) -> list[str]:
        """Distinct counters over every slice, one skip scan per slice (``_COUNTERS``); once the page is full, a
        later slice only looks for names before its last."""
        page: list[str] = []  # sorted, distinct, at most `limit`
        for s in self._slices_of(conn, namespace):
            args = {"ns": namespace, "from": after or "", "limit": limit,
                    "upto": page[-1] if len(page) >= limit else None}
            ((found,),) = conn.execute(counters_statement(s.table, after=after is not None), args).fetchall()
            page = sorted(set(page).union(orjson.loads(found)))[:limit]
        return page

    def _delete_rolled_up(self, conn: sqlite3.Connection, namespace: str, counter: str, cutoff: int) -> int:
        before = conn.total_changes
        for s in self._slices_of(conn, namespace):
            if s.start_us >= cutoff:
                break
            conn.execute(f'DELETE FROM "{s.table}" WHERE namespace = ? AND counter = ? '
                         "AND (time_bucket, event_time) < (?, ?)", (namespace, counter, s.bucket(cutoff), cutoff))
        return conn.total_changes - before

    def _drop_slices(self, conn: sqlite3.Connection, namespace: str, cutoff: int) -> int:
        dropped = [s for s in self._slices_of(conn, namespace) if s.end_us <= cutoff]
        for s in dropped:
            conn.execute(f'DROP TABLE IF EXISTS "{s.table}"')
            conn.execute("DELETE FROM event_slices WHERE table_name = ?", (s.table,))
        if dropped:
            log.info("namespace %r: dropped %d expired slice(s) before %d", namespace, len(dropped), cutoff)
        return len(dropped)


def _summed(conn: sqlite3.Connection, statement: Callable[[str, bool], RowsStatement], table: str,
            params: Sequence[Sequence[object]]) -> list[list]:
    """`json_rows` of a statement summing deltas (`aggregate_statement`, `bucket_sums_statement`): with SQLite's
    SUM, whose result holds [NULL, sum]; when a sum leaves int64 (SUM fails: "integer overflow"), again with the
    sums of the deltas' halves, [high, low] (sinks.model.join_halves joins either). Summing in halves always cost a
    sixth more per aggregate; a counter past int64 is rare."""
    try:
        return json_rows(conn, statement(table, False), params)
    except sqlite3.OperationalError as exc:
        if "integer overflow" not in str(exc):
            raise
        return json_rows(conn, statement(table, True), params)
