"""What the SQLite stores share about their files' layout, and what the bucket and sketch stores share about slices.

* ``open_layout``: a file records its layout in ``PRAGMA user_version``; a file of another layout is refused, never
  misread, and the schema is created in the setup's transaction.
* ``SlicedTable``: the bucket and sketch tables are keyed (namespace, counter, granularity, start_us), written
  forward-only, each with a table listing the (namespace, granularity, slice) storage slices holding rows. The
  catalog mirrors the Cassandra partitions (``sinks.cassandra.slices``), so retention reports the same number of
  emptied slices on both backends. One class keeps the statements, writes, range reads and retention, so the two
  stores cannot drift apart.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from sinks.model import later_than_stored
from sinks.sqlite.bulk import RowsStatement, insert_rows, json_rows
from sinks.windows import Granularity, slice_bounds

__all__ = ["SlicedTable", "open_layout"]


def open_layout(conn: sqlite3.Connection, path: Path, *, what: str, layout: int, schema: str,
                remedy: str, readable: Iterable[int] = (), found: int | None = None) -> int:
    """Check the file's layout (``found``, else its ``user_version``; 0 is a new file), create ``schema`` (statements
    separated by ``;``) and record ``layout``. ``readable``: older layouts the caller upgrades in place. Returns the
    layout found. Raises RuntimeError naming the file, both layouts and ``remedy`` for any other layout."""
    if found is None:
        found = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if found not in (0, *readable, layout):
        raise RuntimeError(f"{path} holds {what} in storage layout {found}, this version reads layout {layout}: "
                           f"{remedy}")
    for stmt in schema.split(";"):
        if stmt.strip():
            conn.execute(stmt)
    conn.execute(f"PRAGMA user_version = {layout}")
    return found


class SlicedTable:
    """A table keyed (namespace, counter, granularity, start_us) holding ``value`` (``blob``: bytes) and
    ``computed_upto``, with an index ``<table>_expiry`` (namespace, granularity, start_us), and its slice catalog
    ``slices`` (namespace, granularity, slice). Writes are forward-only by a conditional upsert: a row is replaced
    only by one computed at a later boundary, across processes, without application locks. Call the methods on the
    store's thread, inside its transaction."""

    def __init__(self, table: str, value: str, slices: str, *, blob: bool = False) -> None:
        self._write = RowsStatement(
            f"INSERT INTO {table} (namespace, counter, granularity, start_us, {value}, computed_upto) VALUES",
            "(?, ?, ?, ?, ?, ?)", f"ON CONFLICT (namespace, counter, granularity, start_us) DO UPDATE SET {value} = "
            f"excluded.{value}, computed_upto = excluded.computed_upto WHERE excluded.computed_upto > "
            f"{table}.computed_upto")
        self._stored = RowsStatement(
            "WITH k (namespace, counter, granularity, start_us) AS (VALUES", "(?, ?, ?, ?)",
            f") SELECT json_group_array(json_array(counter, granularity, start_us, computed_upto)) FROM k JOIN {table} "
            "USING (namespace, counter, granularity, start_us)")
        # one JSON row for every range of a call (JSON holds no blobs: those travel as hex)
        shown = f"hex(t.{value})" if blob else f"t.{value}"
        self._blob = blob
        self._ranges = RowsStatement(
            "WITH k (i, namespace, counter, granularity, lo, hi) AS (VALUES", "(?, ?, ?, ?, ?, ?)",
            f") SELECT json_group_array(json_array(k.i, t.start_us, {shown}, t.computed_upto)) FROM k "
            f"JOIN {table} AS t ON t.namespace = k.namespace AND t.counter = k.counter "
            "AND t.granularity = k.granularity AND t.start_us >= k.lo AND t.start_us < k.hi")
        self._add = RowsStatement(f"INSERT OR IGNORE INTO {slices} (namespace, granularity, slice) VALUES", "(?, ?, ?)")
        self._expire = (f"DELETE FROM {table} INDEXED BY {table}_expiry "
                        "WHERE namespace = ? AND granularity = ? AND start_us <= ?")
        self._list = f"SELECT slice FROM {slices} WHERE namespace = ? AND granularity = ? AND slice <= ?"
        self._forget = f"DELETE FROM {slices} WHERE namespace = ? AND granularity = ? AND slice = ?"

    def write(self, conn: sqlite3.Connection, namespace: str,
              rows: Sequence[tuple[str, Granularity, int, object, int]]) -> list[bool]:
        """Rows ``(counter, granularity, start_us, value, computed_upto)``, their slices listed first: per row,
        whether it was written (False: a row computed at the same or a later boundary is stored)."""
        slices = {(Granularity(g).value, start // Granularity(g).slice_us) for _c, g, start, _v, _u in rows}
        insert_rows(conn, self._add, [(namespace, g, s) for g, s in sorted(slices)])
        params = [(namespace, counter, Granularity(g).value, start, value, upto)
                  for counter, g, start, value, upto in rows]
        # Which rows apply, from the stored boundaries read in this write transaction (so exact): one step, where
        # RETURNING would hand the GIL over once per row applied.
        keys = [(c, g, start) for _ns, c, g, start, _v, _u in params]
        stored = {(c, g, start): upto for c, g, start, upto in json_rows(
            conn, self._stored, [(namespace, *key) for key in dict.fromkeys(keys)])}
        applied = set(later_than_stored([(key, p[-1]) for key, p in zip(keys, params, strict=True)], stored))
        insert_rows(conn, self._write, params)
        return [i in applied for i in range(len(rows))]

    def ranges(self, conn: sqlite3.Connection, namespace: str,
               ranges: Sequence[tuple[str, Granularity, int, int]]) -> list[list[tuple]]:
        """Rows ``(start_us, value, computed_upto)`` of each range ``(counter, granularity, lo, hi)`` whose start lies
        in ``[lo, hi)``, ascending: one range seek of the key each, all in one statement per 1,000 ranges."""
        out: list[list[tuple]] = [[] for _ in ranges]
        wanted = [(i, namespace, counter, Granularity(g).value, lo, hi)
                  for i, (counter, g, lo, hi) in enumerate(ranges) if hi > lo]
        for i, start, value, upto in json_rows(conn, self._ranges, wanted):
            out[i].append((start, bytes.fromhex(value) if self._blob else value, upto))
        for rows in out:
            rows.sort()
        return out

    def drop_expired(self, conn: sqlite3.Connection, namespace: str, g: Granularity, before_us: int) -> int:
        """Delete the rows that ended at or before ``before_us`` and forget the slices they emptied: how many."""
        last_start = before_us - g.width_us  # rows starting at or before it ended at or before before_us
        conn.execute(self._expire, (namespace, g.value, last_start))
        emptied = [s for (s,) in conn.execute(self._list, (namespace, g.value, last_start // g.slice_us))
                   if slice_bounds(g, s)[1] <= before_us]
        conn.executemany(self._forget, [(namespace, g.value, s) for s in emptied])
        return len(emptied)
