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
* ``PRAGMA user_version`` records the layout; a file of another layout is refused, never misread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from sinks.sketches import SketchRow, StoredSketch
from sinks.sqlite.thread import SqliteThread
from sinks.windows import BucketRange, Granularity, slice_bounds

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

_WRITE = """
INSERT INTO sketches (namespace, counter, granularity, start_us, sketch, computed_upto) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (namespace, counter, granularity, start_us) DO UPDATE
SET sketch = excluded.sketch, computed_upto = excluded.computed_upto
WHERE excluded.computed_upto > sketches.computed_upto
"""
_SLICE = "INSERT OR IGNORE INTO sketch_slices (namespace, granularity, slice) VALUES (?, ?, ?)"
_RANGE = """
SELECT start_us, sketch, computed_upto FROM sketches
WHERE namespace = ? AND counter = ? AND granularity = ? AND start_us >= ? AND start_us < ? ORDER BY start_us
"""
_EXPIRE = ("DELETE FROM sketches INDEXED BY sketches_expiry "
           "WHERE namespace = ? AND granularity = ? AND start_us <= ?")
_SLICES = "SELECT slice FROM sketch_slices WHERE namespace = ? AND granularity = ? AND slice <= ?"
_FORGET_SLICE = "DELETE FROM sketch_slices WHERE namespace = ? AND granularity = ? AND slice = ?"


class SqliteSketchStore:
    """The embedded sketch store (one file, WAL); safe for several processes at once."""

    def __init__(self, path: str | Path) -> None:
        self._db = SqliteThread(path, "sqlite-sketches", self._setup)

    @property
    def path(self) -> Path:
        return self._db.path

    # -- SketchStore ----------------------------------------------------------------------------

    async def write_sketches(self, namespace: str, rows: Sequence[SketchRow]) -> list[bool]:
        def apply(conn: sqlite3.Connection) -> list[bool]:
            slices = {(Granularity(g).value, start // Granularity(g).slice_us) for _c, g, start, _s, _u in rows}
            conn.executemany(_SLICE, [(namespace, g, s) for g, s in sorted(slices)])
            return [conn.execute(_WRITE, (namespace, counter, Granularity(g).value, start, sketch, upto)).rowcount > 0
                    for counter, g, start, sketch, upto in rows]
        if not rows:
            return []
        return await self._db.run(lambda conn: self._db.write(conn, apply))

    async def read_sketches_many(self, namespace: str, ranges: Sequence[BucketRange]) -> list[list[StoredSketch]]:
        def read(conn: sqlite3.Connection) -> list[list[StoredSketch]]:
            return [[(s, bytes(b), u) for s, b, u in conn.execute(_RANGE, (namespace, counter, Granularity(g).value,
                                                                            lo, hi))]
                    if hi > lo else [] for counter, g, lo, hi in ranges]
        if not ranges:
            return []
        return await self._db.run(lambda conn: self._db.read(conn, read))

    async def drop_expired(self, namespace: str, granularity: Granularity, before_us: int) -> int:
        g = Granularity(granularity)
        last_start = before_us - g.width_us  # sketches starting at or before it ended at or before before_us

        def apply(conn: sqlite3.Connection) -> int:
            conn.execute(_EXPIRE, (namespace, g.value, last_start))
            emptied = [s for (s,) in conn.execute(_SLICES, (namespace, g.value, last_start // g.slice_us))
                       if slice_bounds(g, s)[1] <= before_us]
            conn.executemany(_FORGET_SLICE, [(namespace, g.value, s) for s in emptied])
            return len(emptied)
        return await self._db.run(lambda conn: self._db.write(conn, apply))

    async def close(self) -> None:
        await self._db.close()

    # -- thread side --------------------------------------------------------------------------

    def _setup(self, conn: sqlite3.Connection) -> None:
        layout = conn.execute("PRAGMA user_version").fetchone()[0]
        if layout not in (0, LAYOUT):
            raise RuntimeError(f"{self.path} holds sketches in storage layout {layout}, this version reads layout "
                               f"{LAYOUT}: move the file away (sketches are recomputed by a recount) or use the "
                               "matching version")
        for stmt in _SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        conn.execute(f"PRAGMA user_version = {LAYOUT}")
