"""SQLite sketch store: the HLL sketches of unique counts, one per (counter, granularity, bucket) of a UNIQUE
namespace (``sinks.sketches``).

Its own file (``sketches.sqlite3``, beside ``buckets.sqlite3``): sketch writes follow a UNIQUE namespace's rollup
batches and must not wait on the buckets' write lock, and the blobs stay out of the buckets' pages. WAL, one
dedicated thread, one transaction per call.

Layout (why):
* ``sketches`` PRIMARY KEY (namespace, counter, granularity, start_us), a rowid table: a sketch is up to
  2^(lg_k-1) bytes (2 KiB at lg_k 12), too big for a WITHOUT ROWID b-tree's cells, so the key is an index and
  the blob sits in the row. A series or a window's segment is one range seek of the key.
* Forward-only by a conditional upsert (``WHERE excluded.computed_upto > sketches.computed_upto``), as buckets.
* Index ``sketches_expiry`` (namespace, granularity, start_us): retention deletes by time.
* ``sketch_slices`` lists the (namespace, granularity, slice) storage slices holding sketches, mirroring the
  Cassandra partitions, so retention reports the same number of emptied slices on both backends.
  The writes, range reads and retention are the bucket store's too (``sinks.sqlite.sliced.SlicedTable``).
* ``PRAGMA user_version`` records the layout; a file of another layout is refused, never misread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from sinks.sketches import SketchRow, StoredSketch
from sinks.sqlite.sliced import SlicedTable, open_layout
from sinks.sqlite.thread import SqliteThread
from sinks.windows import BucketRange, Granularity

__all__ = ["LAYOUT", "SqliteSketchStore"]

LAYOUT = 1  # PRAGMA user_version of files in this layout

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sketches (
    namespace TEXT NOT NULL, counter TEXT NOT NULL, granularity TEXT NOT NULL, start_us INTEGER NOT NULL,
    sketch BLOB NOT NULL, computed_upto INTEGER NOT NULL,
    PRIMARY KEY (namespace, counter, granularity, start_us));
CREATE INDEX IF NOT EXISTS sketches_expiry ON sketches (namespace, granularity, start_us);
CREATE TABLE IF NOT EXISTS sketch_slices (
    namespace TEXT NOT NULL, granularity TEXT NOT NULL, slice INTEGER NOT NULL,
    PRIMARY KEY (namespace, granularity, slice)) WITHOUT ROWID;
"""


class SqliteSketchStore:
    """The embedded sketch store (one file, WAL); safe for several processes at once."""

    def __init__(self, path: str | Path, *, lock_wait_s: float | None = None) -> None:
        self._db = SqliteThread(path, "sqlite-sketches", self._setup, lock_wait_s=lock_wait_s)
        self._table = SlicedTable("sketches", "sketch", "sketch_slices", blob=True)

    @property
    def path(self) -> Path:
        return self._db.path

    # -- SketchStore ----------------------------------------------------------------------------

    async def write_sketches(self, namespace: str, rows: Sequence[SketchRow]) -> list[bool]:
        if not rows:
            return []
        return await self._db.run(lambda conn: self._db.write(conn, self._table.write, namespace, rows))

    async def read_sketches_many(self, namespace: str, ranges: Sequence[BucketRange]) -> list[list[StoredSketch]]:
        def read(conn: sqlite3.Connection) -> list[list[StoredSketch]]:
            return [[(s, bytes(v), u) for s, v, u in rows] for rows in self._table.ranges(conn, namespace, ranges)]
        if not ranges:
            return []
        return await self._db.run(lambda conn: self._db.read(conn, read))

    async def drop_expired(self, namespace: str, granularity: Granularity, before_us: int) -> int:
        g = Granularity(granularity)
        return await self._db.run(lambda conn: self._db.write(conn, self._table.drop_expired, namespace, g,
                                                                before_us))

    async def close(self) -> None:
        await self._db.close()

    # -- thread side --------------------------------------------------------------------------

    def _setup(self, conn: sqlite3.Connection) -> None:
        open_layout(conn, self.path, what="sketches", layout=LAYOUT, schema=_SCHEMA,
                    remedy="move the file away (sketches are recomputed by a recount) or use the matching version")
