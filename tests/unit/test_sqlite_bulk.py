"""`insert_rows` and `insert_returning`: the result of executemany, in a few statements of fixed sizes (one GIL
hand-over each, not one per row)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from sinks.sqlite.bulk import SIZES, RowsInsert, insert_returning, insert_rows

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


@pytest.mark.parametrize("n", [0, 1, 3, 250, 1337])
def test_returning_names_exactly_the_rows_applied_in_order(n: int) -> None:
    """What `write_rollups` relies on to say per row whether it applied: a refused upsert returns nothing."""
    bulk, one = table(), table()
    for conn in (bulk, one):
        conn.execute("INSERT INTO t VALUES ('k0', 50)")
    returning = UPSERT._replace(tail=UPSERT.tail + " RETURNING k, v")
    applied = insert_returning(bulk, returning, rows(n))
    expected = [row for row in rows(n) if one.execute(f"{UPSERT.head} {UPSERT.row} {UPSERT.tail}", row).rowcount]
    assert applied == expected
    everything = "SELECT * FROM t ORDER BY k"
    assert bulk.execute(everything).fetchall() == one.execute(everything).fetchall()


def test_rollups_say_per_row_whether_they_applied_even_for_a_repeated_row(tmp_path) -> None:
    from sinks.sqlite.rollups import SqliteRollupStore

    async def scenario() -> list[list[bool]]:
        store = SqliteRollupStore(tmp_path / "rollups.sqlite3")
        try:
            first = await store.write_rollups("ns", [("a", 1, 10), ("a", 1, 10), ("b", 2, 20), ("a", 3, 30)])
            many = [(f"c{i}", i, 5) for i in range(300)]
            again = await store.write_rollups("ns", [("b", 5, 20), ("b", 6, 21), *many])
            return [first, again]
        finally:
            await store.close()
    first, again = asyncio.run(scenario())
    assert first == [True, False, True, True]
    assert again == [False, True] + [True] * 300


def test_buckets_say_per_row_whether_they_applied_even_for_a_repeated_row(tmp_path) -> None:
    from sinks.sqlite.buckets import SqliteBucketStore
    from sinks.windows import Granularity

    h, m = Granularity.HOUR, Granularity.MINUTE

    async def scenario() -> tuple[list[bool], list[bool], list[list[tuple[int, int, int]]]]:
        store = SqliteBucketStore(tmp_path / "buckets.sqlite3")
        try:
            first = await store.write_buckets("ns", [("a", h, 0, 5, 10), ("a", h, 0, 5, 10), ("a", m, 0, 1, 10),
                                                     ("a", h, 0, 6, 20)])
            again = await store.write_buckets("ns", [("a", h, 0, 9, 20), ("a", m, 0, 2, 11)])
            return first, again, await store.read_buckets_many("ns", [("a", h, 0, 1), ("a", m, 0, 1)])
        finally:
            await store.close()
    first, again, stored = asyncio.run(scenario())
    assert first == [True, False, True, True]
    assert again == [False, True]
    assert stored == [[(0, 6, 20)], [(0, 2, 11)]]
