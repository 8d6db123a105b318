"""Many rows in few statements: ``INSERT ... VALUES (...), (...), ...`` instead of ``executemany``, and lookups of
many keys as one ``WITH k AS (VALUES (...), ...) SELECT ... JOIN`` instead of a query per key.

Why: Python's sqlite3 releases the GIL around every step, so ``executemany`` hands the GIL over once per row.
While the store's thread holds SQLite's write lock, any busy thread of the same process (the event loop, decoding
or serving) then delays every row by up to the interpreter's switch interval (5 ms). Measured here, 2,000 event
rows took 7 ms alone and 1.2 s beside a busy thread; as statements of up to 1,000 rows, 30 ms. The write lock
is held that much less, so the other processes (the API's early store, the workers' persists) wait that much
less for it. Reads pay it per step, and a step per result row: a read of many keys returns its rows as one JSON
row (``json_rows``); beside a busy thread 1,000 rollups read one query per key took 1.5 s, as rows of one
statement 0.8 s, as one JSON row 16 ms. Statements come in a few fixed sizes, so the connection's statement cache
keeps every one of them.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import orjson

SIZES = (1000, 250, 64, 16, 4, 1)  # rows per statement; 1,000 x 9 columns stays below SQLite's 32,766 variables


class RowsStatement(NamedTuple):
    """``{head} {row}, {row}, ... {tail}``: e.g. ``INSERT INTO t (a, b) VALUES``, ``(?, ?)``, ``ON CONFLICT ...``; or
    ``WITH k (a, b) AS (VALUES``, ``(?, ?)``, ``) SELECT ... FROM k JOIN t USING (a, b)``."""

    head: str
    row: str
    tail: str = ""


@functools.lru_cache(maxsize=512)
def bulk_statement(stmt: RowsStatement, size: int) -> str:
    """The SQL of `stmt` over `size` rows."""
    return f"{stmt.head} {', '.join([stmt.row] * size)} {stmt.tail}"


def insert_rows(conn: sqlite3.Connection, insert: RowsStatement, rows: Sequence[Sequence[object]]) -> int:
    """`insert` over `rows` (each filling one row's placeholders), in statements of the fixed sizes, largest
    first; the rows changed. The same result as ``executemany`` of one row at a time: SQLite applies a
    statement's rows in order, a later one meeting an earlier one's conflict."""
    before = conn.total_changes
    for _ in _run(conn, insert, rows):
        pass
    return conn.total_changes - before


def returned_rows(conn: sqlite3.Connection, stmt: RowsStatement, rows: Sequence[Sequence[object]]) -> list[tuple]:
    """The rows `stmt` over `rows` returns: a SELECT's, or an insert's ``RETURNING`` (in the order SQLite applied
    them, only rows it changed: an upsert whose ``DO UPDATE ... WHERE`` refused returns none)."""
    return [row for cursor in _run(conn, stmt, rows) for row in cursor.fetchall()]


def json_rows(conn: sqlite3.Connection, stmt: RowsStatement, rows: Sequence[Sequence[object]]) -> list[list]:
    """The rows of a `stmt` that returns its results as one row, a JSON array of rows (``SELECT
    json_group_array(json_array(...))``): one step per statement, where a row per result costs a step (and a GIL
    hand-over) each."""
    return [r for (found,) in returned_rows(conn, stmt, rows) for r in orjson.loads(found)]


def _run(conn: sqlite3.Connection, stmt: RowsStatement, rows: Sequence[Sequence[object]]) -> Iterator[sqlite3.Cursor]:
    done, n = 0, len(rows)
    for size in SIZES:
        while n - done >= size:
            yield conn.execute(bulk_statement(stmt, size), [v for r in rows[done:done + size] for v in r])
            done += size
