"""Many rows in few statements: ``INSERT ... VALUES (...), (...), ...`` instead of ``executemany``.

Why: Python's sqlite3 releases the GIL around every step, so ``executemany`` hands the GIL over once per row.
While the store's thread holds SQLite's write lock, any busy thread of the same process (the event loop, decoding
or serving) then delays every row by up to the interpreter's switch interval (5 ms). Measured here, 2,000 event
rows took 7 ms alone and 1.2 s beside a busy thread; as statements of up to 1,000 rows, 30 ms. The write lock
is held that much less, so the other processes (the API's early store, the workers' persists) wait that much
less for it. Statements come in a few fixed sizes, so the connection's statement cache keeps every one of them.
"""

from __future__ import annotations

import functools
import sqlite3
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import NamedTuple

SIZES = (1000, 250, 64, 16, 4, 1)  # rows per statement; 1,000 x 9 columns stays below SQLite's 32,766 variables


class RowsInsert(NamedTuple):
    """``{head} {row}, {row}, ... {tail}``: e.g. ``INSERT INTO t (a, b) VALUES``, ``(?, ?)``, ``ON CONFLICT ...``."""

    head: str
    row: str
    tail: str = ""


@functools.lru_cache(maxsize=512)
def _statement(insert: RowsInsert, size: int) -> str:
    return f"{insert.head} {', '.join([insert.row] * size)} {insert.tail}"


def insert_rows(conn: sqlite3.Connection, insert: RowsInsert, rows: Sequence[Sequence[object]]) -> int:
    """`insert` over `rows` (each filling one row's placeholders), in statements of the fixed sizes, largest
    first; the rows changed. The same result as ``executemany`` of one row at a time: SQLite applies a
    statement's rows in order, a later one meeting an earlier one's conflict."""
    before = conn.total_changes
    for _ in _run(conn, insert, rows):
        pass
    return conn.total_changes - before


def insert_returning(conn: sqlite3.Connection, insert: RowsInsert, rows: Sequence[Sequence[object]]) -> list[tuple]:
    """As `insert_rows` for an `insert` whose tail ends in ``RETURNING ...``: the rows it returned, in the order
    SQLite applied them (only rows it changed: an upsert whose ``DO UPDATE ... WHERE`` refused returns none)."""
    return [row for cursor in _run(conn, insert, rows) for row in cursor.fetchall()]


def upserts_applied(conn: sqlite3.Connection, upsert: RowsInsert, rows: Sequence[Sequence[object]],
                    keys: Sequence[tuple]) -> list[bool]:
    """Per row, whether a conditional `upsert` applied it: `upsert` returns (``RETURNING``) the columns that make
    `keys`, one key per row. A row given twice is applied once at most: the first one, as SQLite applies them."""
    applied = Counter(insert_returning(conn, upsert, rows))
    out = []
    for key in keys:
        out.append(applied[key] > 0)
        applied[key] -= 1
    return out


def _run(conn: sqlite3.Connection, insert: RowsInsert, rows: Sequence[Sequence[object]]) -> Iterator[sqlite3.Cursor]:
    done, n = 0, len(rows)
    for size in SIZES:
        while n - done >= size:
            yield conn.execute(_statement(insert, size), [v for r in rows[done:done + size] for v in r])
            done += size
