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
from collections.abc import Sequence
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
    done, n = 0, len(rows)
    for size in SIZES:
        while n - done >= size:
            conn.execute(_statement(insert, size), [v for r in rows[done:done + size] for v in r])
            done += size
    return conn.total_changes - before
