"""SQLite bucket store: the minute/hour/day buckets of windowed counts and each counter's latest clear.

Its own file (``buckets.sqlite3``): bucket writes follow every rollup batch, and must not wait on the event
batches' or the rollups' write lock. WAL, one dedicated thread, one transaction per call.

Layout (why):
* ``buckets`` PRIMARY KEY (namespace, counter, granularity, start_us) WITHOUT ROWID: a counter's buckets of one
  granularity are one contiguous key range, so a series or a window's segment is one range seek.
* Forward-only by a conditional upsert (``WHERE excluded.computed_upto > buckets.computed_upto``): a bucket is
  replaced only by one recomputed at a later boundary, across processes, without application locks.
* Index ``buckets_expiry`` (namespace, granularity, start_us): retention deletes by time without visiting every
  counter. Rewriting a bucket changes no indexed column, so the index costs only when a bucket first appears.
* ``bucket_slices`` lists the (namespace, granularity, slice) storage slices holding buckets, mirroring the
  Cassandra partitions, so retention reports the same number of emptied slices on both backends.
  The writes, range reads and retention are the sketch store's too (``sinks.sqlite.sliced.SlicedTable``).
* ``bucket_clears`` keeps each counter's latest clear (max, by upsert), for masking at read time.
* Rank lists (Top-K) are an index of the bucket table itself: ``signature``, a virtual generated column (the
  dimensions part of the counter's name: ``country=BR`` of ``title_1 country=BR``, "" for a base counter), and
  index ``bucket_ranks`` (namespace, signature, granularity, start_us, value DESC, counter). A page of a rank list
  is one seek. SQLite updates the entry in the statement that writes the bucket, so the list is forward-only with
  the buckets and transactional by construction (nothing can write a bucket without its entry, not even SQL by
  hand), retention's deletes remove the entries, and it costs one b-tree (a table of its own would cost two).
  Within one signature, names order like their base names: ' ' sorts before every character a name may hold.
* ``PRAGMA user_version`` records the layout; a file of another layout is refused, never misread. A file of
  layout 1 (before rank lists) is upgraded in place when opened: the column is virtual (no row is rewritten) and
  the index is built from the buckets already stored.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from sinks.sqlite.bulk import RowsStatement, insert_rows, json_rows
from sinks.sqlite.sliced import SlicedTable, open_layout
from sinks.sqlite.thread import SqliteThread
from sinks.windows import BucketRange, BucketRow, Granularity, RankEntry, RankPage, StoredBucket

__all__ = ["SqliteBucketStore"]

LAYOUT = 2  # PRAGMA user_version of files in this layout
_UPGRADABLE = (1,)  # layouts upgraded in place when opened

# the dimensions part of a counter's name (schemas.dimensions.dimension_signature), in SQL
_SIGNATURE = "CASE instr(counter, ' ') WHEN 0 THEN '' ELSE substr(counter, instr(counter, ' ') + 1) END"
_SIGNATURE_COLUMN = f"signature TEXT GENERATED ALWAYS AS ({_SIGNATURE}) VIRTUAL"
_RANK_INDEX = ("CREATE INDEX IF NOT EXISTS bucket_ranks "
               "ON buckets (namespace, signature, granularity, start_us, value DESC, counter)")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS buckets (
    namespace TEXT NOT NULL, counter TEXT NOT NULL, granularity TEXT NOT NULL, start_us INTEGER NOT NULL,
    value INTEGER NOT NULL, computed_upto INTEGER NOT NULL, {_SIGNATURE_COLUMN},
    PRIMARY KEY (namespace, counter, granularity, start_us)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS buckets_expiry ON buckets (namespace, granularity, start_us);
CREATE TABLE IF NOT EXISTS bucket_slices (
    namespace TEXT NOT NULL, granularity TEXT NOT NULL, slice INTEGER NOT NULL,
    PRIMARY KEY (namespace, granularity, slice)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS bucket_clears (
    namespace TEXT NOT NULL, counter TEXT NOT NULL, clear_us INTEGER NOT NULL,
    PRIMARY KEY (namespace, counter)) WITHOUT ROWID;
"""

_BUMP_CLEAR = RowsStatement("INSERT INTO bucket_clears (namespace, counter, clear_us) VALUES", "(?, ?, ?)",
                            "ON CONFLICT (namespace, counter) DO UPDATE SET clear_us = excluded.clear_us "
                            "WHERE excluded.clear_us > bucket_clears.clear_us")
_CLEARS = RowsStatement("WITH k (namespace, counter) AS (VALUES", "(?, ?)",
                        ") SELECT json_group_array(json_array(counter, clear_us)) FROM k JOIN bucket_clears "
                        "USING (namespace, counter)")
# Pages of many rank lists in one statement: the pages are a VALUES list `k` of (page index, rank list key, limit[,
# after value, after name]), every page of one statement with the same limit, and the result is one row, a JSON array
# of [page, entries...]. Why: Python's sqlite3 hands the GIL over at every step, and beside a busy thread each
# statement costs a switch interval (5 ms) or more: a Top-K round of 48 pages of 20 took 427 ms as a statement per
# page, rows one step each (400 ms as one JSON row per page). Each page is one seek of the rank index.
_PAGES_HEAD = "WITH k (i, namespace, signature, granularity, start_us, lim) AS (VALUES"
_PAGES_ROW = "(?, ?, ?, ?, ?, ?)"
_AFTER_HEAD = "WITH k (i, namespace, signature, granularity, start_us, lim, v, name) AS (VALUES"
_AFTER_ROW = "(?, ?, ?, ?, ?, ?, ?, ?)"
_DOWN, _UP = "value DESC, counter", "value, counter DESC"  # the list's order, and read from its end


def _entries(where: str, order: str) -> str:
    """A page's entries (a JSON array of [counter, value]): one seek of the rank index, the index's own order."""
    return ("(SELECT json_group_array(json_array(counter, value)) FROM (SELECT counter, value FROM buckets INDEXED BY "
            "bucket_ranks WHERE namespace = k.namespace AND signature = k.signature AND granularity = k.granularity "
            f"AND start_us = k.start_us{where} ORDER BY {order} LIMIT (SELECT MAX(lim) FROM k)))")


def _pages(head: str, row: str, *entries: str) -> RowsStatement:
    return RowsStatement(head, row, f") SELECT json_group_array(json_array(k.i, {', '.join(entries)})) FROM k")


# from the start of each list; after (value, counter): the rest of its tie, then the lower values (two seeks)
_FIRST_PAGES = _pages(_PAGES_HEAD, _PAGES_ROW, _entries("", _DOWN))
_NEXT_PAGES = _pages(_AFTER_HEAD, _AFTER_ROW, _entries(" AND value = k.v AND counter > k.name", "counter"),
                     _entries(" AND value < k.v", _DOWN))
# the same from the list's end (the index read backwards)
_LAST_PAGES = _pages(_PAGES_HEAD, _PAGES_ROW, _entries("", _UP))
_PREVIOUS_PAGES = _pages(_AFTER_HEAD, _AFTER_ROW, _entries(" AND value = k.v AND counter < k.name", "counter DESC"),
                         _entries(" AND value > k.v", _UP))


class SqliteBucketStore:
    """The embedded bucket store (one file, WAL); safe for several processes at once."""

    def __init__(self, path: str | Path, *, lock_wait_s: float | None = None) -> None:
        self._db = SqliteThread(path, "sqlite-buckets", self._setup, lock_wait_s=lock_wait_s)
        self._table = SlicedTable("buckets", "value", "bucket_slices")

    @property
    def path(self) -> Path:
        return self._db.path

    # -- BucketStore ----------------------------------------------------------------------------

    async def write_buckets(self, namespace: str, rows: Sequence[BucketRow]) -> list[bool]:
        if not rows:
            return []
        return await self._db.run(lambda conn: self._db.write(conn, self._table.write, namespace, rows))

    async def read_buckets_many(self, namespace: str, ranges: Sequence[BucketRange]) -> list[list[StoredBucket]]:
        def read(conn: sqlite3.Connection) -> list[list[StoredBucket]]:
            return [[(s, v, u) for s, v, u in rows] for rows in self._table.ranges(conn, namespace, ranges)]
        if not ranges:
            return []
        return await self._db.run(lambda conn: self._db.read(conn, read))

    async def read_ranks_many(self, namespace: str, pages: Sequence[RankPage]) -> list[list[RankEntry]]:
        """The pages in one statement per kind of page and limit (see ``_FIRST_PAGES``)."""
        ranked = [RankPage(*q) for q in pages]  # a plain 5-tuple is a descending page

        def read(conn: sqlite3.Connection) -> list[list[RankEntry]]:
            statements: dict[tuple[RowsStatement, int], list[tuple]] = {}
            for i, p in enumerate(ranked):
                if p.limit <= 0:
                    continue
                key: tuple = (i, namespace, p.signature, Granularity(p.granularity).value, p.start_us, p.limit)
                if p.after is None:
                    stmt, row = (_LAST_PAGES if p.ascending else _FIRST_PAGES), key
                else:
                    value, base = p.after
                    stmt = _PREVIOUS_PAGES if p.ascending else _NEXT_PAGES
                    row = (*key, value, f"{base} {p.signature}" if p.signature else base)
                statements.setdefault((stmt, p.limit), []).append(row)
            out: list[list[RankEntry]] = [[] for _ in ranked]
            for (stmt, limit), rows in statements.items():
                for i, *parts in json_rows(conn, stmt, rows):
                    # a tie's rest, then past it; in the list's order (value descending, then name; an ascending
                    # page reads it from its end), sorted here as a JSON aggregate's own order is not guaranteed
                    entries = sorted((e for part in parts for e in part or ()), key=lambda e: (-e[1], e[0]),
                                     reverse=ranked[i].ascending)[:limit]
                    out[i] = [(counter.partition(" ")[0], value) for counter, value in entries]
            return out
        if not pages:
            return []
        return await self._db.run(lambda conn: self._db.read(conn, read))

    async def bump_clears(self, namespace: str, items: Sequence[tuple[str, int]]) -> None:
        latest: dict[str, int] = {}
        for counter, clear_us in items:  # one row per counter per call
            if clear_us > latest.get(counter, clear_us - 1):
                latest[counter] = clear_us
        if latest:
            params = [(namespace, c, t) for c, t in latest.items()]
            await self._db.run(lambda conn: self._db.write(conn, insert_rows, _BUMP_CLEAR, params))

    async def clears(self, namespace: str, counters: Sequence[str]) -> dict[str, int]:
        def read(conn: sqlite3.Connection) -> dict[str, int]:
            return dict(json_rows(conn, _CLEARS, [(namespace, c) for c in dict.fromkeys(counters)]))
        if not counters:
            return {}
        return await self._db.run(lambda conn: self._db.read(conn, read))

    async def drop_expired(self, namespace: str, granularity: Granularity, before_us: int) -> int:
        g = Granularity(granularity)
        return await self._db.run(lambda conn: self._db.write(conn, self._table.drop_expired, namespace, g,
                                                                before_us))

    async def close(self) -> None:
        await self._db.close()

    # -- thread side --------------------------------------------------------------------------

    def _setup(self, conn: sqlite3.Connection) -> None:
        open_layout(conn, self.path, what="buckets", layout=LAYOUT, readable=_UPGRADABLE, schema=_SCHEMA,
                    remedy="move the file away (buckets are recomputed by a recount) or use the matching version")
        columns = {row[1] for row in conn.execute("PRAGMA table_xinfo(buckets)")}
        if "signature" not in columns:  # layout 1: rank lists are new (inside setup's write transaction)
            conn.execute(f"ALTER TABLE buckets ADD COLUMN {_SIGNATURE_COLUMN}")
        conn.execute(_RANK_INDEX)
