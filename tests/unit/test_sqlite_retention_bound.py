"""The SQLite retention bound (`SqliteRollupStore.min_rollup_ts`): the workers read it for every namespace every
retention interval, on the store's one thread. It must cost the namespace's pending counters only, never its
converged ones, and give the value of the query it replaced (a read of every row of the namespace), or an earlier one
(conservative) after a delete."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from sinks.sqlite.rollups import SqliteRollupStore

T = TypeVar("T")

# the query min_rollup_ts ran before rollup_bounds: the reference value
_OLD = ("SELECT MIN(CASE WHEN last_write_ts > rollup_ts THEN rollup_ts END), MAX(rollup_ts) "
        "FROM rollups WHERE namespace = ?")
# the rollups table of files made before rollup_bounds
_OLD_SCHEMA = """
CREATE TABLE rollups (
    namespace TEXT NOT NULL, counter TEXT NOT NULL, count INTEGER NOT NULL DEFAULT 0,
    rollup_ts INTEGER NOT NULL DEFAULT 0, last_write_ts INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, counter)) WITHOUT ROWID;
CREATE INDEX rollups_stale ON rollups (namespace, counter) WHERE last_write_ts > rollup_ts;
"""
CONVERGED = 40_000
PENDING = [("p0", 3_000, 9_000), ("p1", 3_500, 9_100), ("p2", 0, 8_000)]  # (counter, rollup_ts, last_write_ts)


def run(awaitable: Awaitable[T]) -> T:
    async def wrapped() -> T:
        return await awaitable
    return asyncio.run(wrapped())


def old_bound(path: Path, namespace: str) -> int:
    """What min_rollup_ts answered before rollup_bounds, read off the file's rows."""
    conn = sqlite3.connect(path)
    try:
        pending, newest = conn.execute(_OLD, (namespace,)).fetchone()
    finally:
        conn.close()
    return int(pending if pending is not None else (newest or 0))


def fill(path: Path, rows: list[tuple[str, str, int, int, int]]) -> None:
    """(namespace, counter, count, rollup_ts, last_write_ts) rows written straight into the file (fast)."""
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.executemany("INSERT INTO rollups (namespace, counter, count, rollup_ts, last_write_ts) "
                             "VALUES (?, ?, ?, ?, ?)", rows)
    finally:
        conn.close()


def converged(namespace: str, n: int) -> list[tuple[str, str, int, int, int]]:
    """n converged counters (last write at or before their rollup), rolled up to 1,000..1,999."""
    return [(namespace, f"c{i:06d}", i, 1_000 + i % 1_000, 500 + i % 1_000) for i in range(n)]


def pending(namespace: str) -> list[tuple[str, str, int, int, int]]:
    return [(namespace, c, 1, ts, last) for c, ts, last in PENDING]


def measured(rs: SqliteRollupStore, call: Callable[[], Awaitable[T]]) -> tuple[T, int, list[str]]:
    """`call()`'s result, the SQLite VM instructions (in units of 10) it ran on the store's connection and the
    statements it ran there (with their parameters filled in)."""
    steps, statements = 0, []

    def tick() -> int:
        nonlocal steps
        steps += 1
        return 0

    def watch(conn: sqlite3.Connection) -> None:
        conn.set_progress_handler(tick, 10)
        conn.set_trace_callback(statements.append)

    def stop(conn: sqlite3.Connection) -> None:
        conn.set_progress_handler(None, 0)
        conn.set_trace_callback(None)
    rs._db.run_sync(watch)
    try:
        result = run(call())
    finally:
        rs._db.run_sync(stop)
    return result, steps, statements


def test_the_bound_costs_the_pending_counters_not_the_converged_ones(tmp_path: Path) -> None:
    """Two namespaces with the same pending counters, one of them also with 40,000 converged counters: the bound
    costs both the same, and reads no row that is not pending (no scan of rollups, the partial index only)."""
    path = tmp_path / "rollups.sqlite3"
    rs = SqliteRollupStore(path)
    try:
        run(rs.get("crowd", "none"))  # opens the file: the schema
        fill(path, converged("crowd", CONVERGED) + converged("few", 3) + pending("crowd") + pending("few"))
        for ns in ("crowd", "few"):
            run(rs.write_rollups(ns, [("newest", 1, 5_000)]))  # the newest rollup, through the store
        costs, plans = {}, {}
        for ns in ("crowd", "few"):
            bound, costs[ns], statements = measured(rs, lambda ns=ns: rs.min_rollup_ts(ns))
            assert bound == old_bound(path, ns) == 0  # p2 was never rolled up
            (sql,) = statements
            plans[ns] = explain(path, sql)
        assert costs["crowd"] <= costs["few"] + 2, costs  # 40,000 converged counters cost nothing
        for plan in plans.values():
            assert [line for line in plan if "rollup" in line] == [
                "SEARCH rollups USING INDEX rollups_stale (namespace=?)",
                "SEARCH rollup_bounds USING PRIMARY KEY (namespace=?)"], plan
        run(rs.write_rollups("crowd", [("p2", 5, 8_000)]))  # p2 converges: p0 (3,000) holds the bound
        assert run(rs.min_rollup_ts("crowd")) == old_bound(path, "crowd") == 3_000
        run(rs.write_rollups("crowd", [("p0", 5, 9_000), ("p1", 5, 9_100)]))  # none pending: the newest rollup
        bound, cost, _ = measured(rs, lambda: rs.min_rollup_ts("crowd"))
        assert bound == old_bound(path, "crowd") == 9_100
        assert cost <= costs["few"] + 2, (cost, costs)
    finally:
        run(rs.close())


def explain(path: Path, sql: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql)]
    finally:
        conn.close()


def test_a_file_from_before_the_bounds_keeps_its_bound(tmp_path: Path) -> None:
    """Opened by this version, a file with rows and no rollup_bounds answers what the old query did, for every
    namespace, and goes on doing so as rollups are written."""
    path = tmp_path / "rollups.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(_OLD_SCHEMA)
    conn.close()
    fill(path, converged("converged", 500) + converged("mixed", 500) + pending("mixed")
         + [("bumped", "b", 0, 0, 700)])
    names = ["converged", "mixed", "bumped", "absent"]
    before = {ns: old_bound(path, ns) for ns in names}
    assert before == {"converged": 1_499, "mixed": 0, "bumped": 0, "absent": 0}
    rs = SqliteRollupStore(path)
    try:
        assert {ns: run(rs.min_rollup_ts(ns)) for ns in names} == before
        assert bounds(path) == {"converged": 1_499, "mixed": 3_500, "bumped": 0}  # from the rows, when opened
        run(rs.write_rollups("mixed", [("p2", 1, 8_000)]))
        run(rs.write_rollup("bumped", "b", 1, 700))
        after = {ns: run(rs.min_rollup_ts(ns)) for ns in names}
        assert after == {ns: old_bound(path, ns) for ns in names}
        assert after == {"converged": 1_499, "mixed": 3_000, "bumped": 700, "absent": 0}
    finally:
        run(rs.close())
    reopened = SqliteRollupStore(path)  # seeded once: a reopened file keeps the bounds it has
    try:
        assert {ns: run(reopened.min_rollup_ts(ns)) for ns in names} == after
        # the operator view's column came with the upgrade too: a counter turning pending notes where its work starts
        run(reopened.bump_last_write([("converged", "c000000", 8_000)]))
        assert run(reopened.pending_rollups(["converged"]))["converged"].oldest_us == 8_000
    finally:
        run(reopened.close())


def bounds(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT namespace, newest FROM rollup_bounds").fetchall())
    finally:
        conn.close()


def test_the_bound_is_kept_per_namespace(tmp_path: Path) -> None:
    path = tmp_path / "rollups.sqlite3"
    rs = SqliteRollupStore(path)
    try:
        assert run(rs.write_rollups("a", [("x", 1, 100), ("y", 2, 300), ("z", 3, 200)])) == [True] * 3
        assert run(rs.write_rollups("b", [("x", 1, 200)])) == [True]
        assert run(rs.write_rollups("a", [("x", 4, 250), ("y", 5, 250)])) == [True, False]  # y stays at 300
        run(rs.write_rollup("c", "x", 1, 50))
        run(rs.write_rollup("c", "x", 1, 40))  # refused: never lowers the bound
        assert bounds(path) == {"a": 300, "b": 200, "c": 50}
        names = ["a", "b", "c", "d"]
        assert {ns: run(rs.min_rollup_ts(ns)) for ns in names} == {ns: old_bound(path, ns) for ns in names}
    finally:
        run(rs.close())


def test_deletes_only_ever_lower_the_bound(tmp_path: Path) -> None:
    """A delete may take the rows holding the namespace's newest rollup_ts: the bound is then 0 until the next
    rollup, never later than the old query (the newest of the rows left); a namespace delete leaves 0, as before."""
    path = tmp_path / "rollups.sqlite3"
    rs = SqliteRollupStore(path)
    try:
        run(rs.write_rollups("ns", [("old", 1, 100), ("mid", 1, 200), ("new", 1, 300)]))
        assert run(rs.delete("ns", "mid")) == 1  # not the newest: the bound stays exact
        assert run(rs.min_rollup_ts("ns")) == old_bound(path, "ns") == 300
        assert run(rs.delete("ns", "new")) == 1  # the newest: the rows left are older
        assert run(rs.min_rollup_ts("ns")) == 0 < old_bound(path, "ns") == 100
        run(rs.write_rollup("ns", "other", 1, 150))
        assert run(rs.min_rollup_ts("ns")) == old_bound(path, "ns") == 150
        assert run(rs.delete("ns", "absent")) == 0
        assert run(rs.delete("ns")) == 2
        assert run(rs.min_rollup_ts("ns")) == old_bound(path, "ns") == 0
    finally:
        run(rs.close())


def test_a_lost_rollups_table_takes_its_bounds_along(tmp_path: Path) -> None:
    """Bounds the rows no longer back would let retention drop events no rollup counts: a file whose rollups table
    was dropped gets its bounds again from the (recreated, empty) table when opened."""
    path = tmp_path / "rollups.sqlite3"
    rs = SqliteRollupStore(path)
    run(rs.write_rollup("ns", "c", 1, 300))
    run(rs.close())
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE rollups")
    conn.close()
    rs = SqliteRollupStore(path)
    try:
        assert run(rs.min_rollup_ts("ns")) == 0
    finally:
        run(rs.close())


def test_the_bound_follows_the_old_query_through_any_writes(tmp_path: Path) -> None:
    """Random bumps, rollups and deletes over two namespaces: the bound equals the old query's value until a delete,
    and is never later than it after one."""
    path = tmp_path / "rollups.sqlite3"
    rng = random.Random(7)
    counters = [f"c{i}" for i in range(6)]
    rs = SqliteRollupStore(path)
    try:
        deleted: set[str] = set()
        for step in range(300):
            ns, counter, ts = rng.choice(["a", "b"]), rng.choice(counters), rng.randrange(1, 1_000)
            op = rng.random()
            if op < 0.3:
                run(rs.bump_last_write([(ns, counter, ts)]))
            elif op < 0.6:
                run(rs.write_rollup(ns, counter, 1, ts))
            elif op < 0.9:
                run(rs.write_rollups(ns, [(c, 1, rng.randrange(1, 1_000)) for c in rng.sample(counters, 3)]))
            elif step > 150:  # deletes in the second half only
                run(rs.delete(ns, counter if op < 0.97 else None))
                deleted.add(ns)
            for name in ("a", "b"):
                bound, old = run(rs.min_rollup_ts(name)), old_bound(path, name)
                assert bound <= old if name in deleted else bound == old, (step, name, bound, old)
    finally:
        run(rs.close())
