"""`insert_rows` and `returned_rows`: the result of executemany, in a few statements of fixed sizes (one GIL
hand-over each, not one per row)."""

from __future__ import annotations

import asyncio
import importlib
import sqlite3

import pytest

from sinks.sqlite.bulk import SIZES, RowsStatement, bulk_statement, insert_rows, returned_rows

UPSERT = RowsStatement("INSERT INTO t (k, v) VALUES", "(?, ?)",
                       "ON CONFLICT (k) DO UPDATE SET v = excluded.v WHERE excluded.v > t.v")
IGNORE = RowsStatement("INSERT OR IGNORE INTO t VALUES", "(?, ?)")


def table() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INT)")
    return conn


def rows(n: int) -> list[tuple[str, int]]:
    """Keys repeat (every 7th row meets an earlier one), values go up and down."""
    return [(f"k{i % max(1, n - n // 7)}", (i * 37) % 101) for i in range(n)]


@pytest.mark.parametrize("insert", [UPSERT, IGNORE])
@pytest.mark.parametrize("n", [0, 1, 3, 250, 1337, 2600])
def test_the_same_rows_and_changes_as_executemany(insert: RowsStatement, n: int) -> None:
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
    """A refused upsert returns nothing."""
    bulk, one = table(), table()
    for conn in (bulk, one):
        conn.execute("INSERT INTO t VALUES ('k0', 50)")
    returning = UPSERT._replace(tail=UPSERT.tail + " RETURNING k, v")
    applied = returned_rows(bulk, returning, rows(n))
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


def test_rollups_of_many_keys_are_one_lookup_by_primary_key_per_statement(tmp_path) -> None:
    from sinks.model import RollupState
    from sinks.sqlite.rollups import SqliteRollupStore

    async def scenario() -> dict[tuple[str, str], RollupState]:
        store = SqliteRollupStore(tmp_path / "rollups.sqlite3")
        try:
            await store.write_rollups("ns", [(f"c{i}", i, 10 + i) for i in range(0, 1337, 2)])
            return await store.get_many([("ns", f"c{i}") for i in range(1337)] + [("other", "c0"), ("ns", "c0")])
        finally:
            await store.close()
    assert asyncio.run(scenario()) == {("ns", f"c{i}"): RollupState(i, 10 + i, 0) for i in range(0, 1337, 2)}


def test_clears_of_many_counters_are_one_statement(tmp_path) -> None:
    from sinks.sqlite.buckets import SqliteBucketStore

    async def scenario() -> dict[str, int]:
        store = SqliteBucketStore(tmp_path / "buckets.sqlite3")
        try:
            await store.bump_clears("ns", [(f"c{i}", 100 + i) for i in range(0, 300, 3)] + [("c0", 7)])
            await store.bump_clears("other", [("c1", 1)])
            return await store.clears("ns", [f"c{i}" for i in range(300)] + ["c0"])
        finally:
            await store.close()
    assert asyncio.run(scenario()) == {f"c{i}": 100 + i for i in range(0, 300, 3)}


@pytest.mark.parametrize("module, stmt, table", [("rollups", "_GET_MANY", "rollups"),
                                                 ("rollups", "_ROLLUP_TS", "rollups"),
                                                 ("buckets", "_CLEARS", "bucket_clears")])
def test_key_lookups_search_the_primary_key(module: str, stmt: str, table: str) -> None:
    """A lookup of many keys joins them to the table by its primary key: never a scan of the table."""
    source = importlib.import_module(f"sinks.sqlite.{module}")
    conn = sqlite3.connect(":memory:")
    conn.executescript(source._SCHEMA)
    plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + bulk_statement(getattr(source, stmt), 4), ["k"] * 8)]
    assert f"SEARCH {table} USING PRIMARY KEY (namespace=? AND counter=?)" in plan, plan


def test_bucket_writes_and_range_reads_seek_the_primary_key(tmp_path) -> None:
    """The read that decides which rows of a bucket write apply, and a read of many ranges, seek the primary key."""
    from sinks.sqlite.buckets import _SCHEMA
    from sinks.sqlite.sliced import SlicedTable

    conn = sqlite3.connect(":memory:")
    conn.executescript(_SCHEMA)
    table = SlicedTable("buckets", "value", "bucket_slices")
    plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + bulk_statement(table._stored, 4), ["k"] * 16)]
    assert any(line.startswith("SEARCH buckets USING PRIMARY KEY (namespace=? AND counter=? AND granularity=? AND "
                               "start_us=?)") for line in plan), plan
    plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + bulk_statement(table._ranges, 4), ["k"] * 24)]
    assert any(line.startswith("SEARCH t USING PRIMARY KEY (namespace=? AND counter=? AND granularity=? AND "
                               "start_us>? AND start_us<?)") for line in plan), plan
