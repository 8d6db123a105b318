"""`insert_rows`: the result of executemany, in a few statements of fixed sizes (one GIL hand-over each, not one
per row)."""

from __future__ import annotations

import sqlite3

import pytest

from sinks.sqlite.bulk import SIZES, RowsInsert, insert_rows

UPSERT = RowsInsert("INSERT INTO t (k, v) VALUES", "(?, ?)",
                    "ON CONFLICT (k) DO UPDATE SET v = excluded.v WHERE excluded.v > t.v")
IGNORE = RowsInsert("INSERT OR IGNORE INTO t VALUES", "(?, ?)")


def table() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INT)")
    return conn


def rows(n: int) -> list[tuple[str, int]]:
    """Keys repeat (every 7th row meets an earlier one), values go up and down."""
    return [(f"k{i % max(1, n - n // 7)}", (i * 37) % 101) for i in range(n)]


@pytest.mark.parametrize("insert", [UPSERT, IGNORE])
@pytest.mark.parametrize("n", [0, 1, 3, 250, 1337, 2600])
def test_the_same_rows_and_changes_as_executemany(insert: RowsInsert, n: int) -> None:
    bulk, many = table(), table()
    for conn in (bulk, many):
        conn.execute("INSERT INTO t VALUES ('k0', 50)")
    changed = insert_rows(bulk, insert, rows(n))
    before = many.total_changes
    many.executemany(f"{insert.head} {insert.row} {insert.tail}", rows(n))
    assert changed == many.total_changes - before
    everything = "SELECT * FROM t ORDER BY k"
    assert bulk.execute(everything).fetchall() == many.execute(everything).fetchall()


def test_rows_go_in_statements_of_the_fixed_sizes_largest_first() -> None:
    conn = table()
    statements: list[int] = []
    conn.set_trace_callback(lambda sql: statements.append(sql.count("(")) if sql.startswith("INSERT") else None)
    insert_rows(conn, IGNORE, [(f"k{i}", i) for i in range(1337)])
    assert statements == [1000, 250, 64, 16, 4, 1, 1, 1]
    assert SIZES[0] * 9 <= 32766  # the events table has 9 columns; SQLite binds at most 32,766 variables
