"""The sketch store's contract (unique counts) and the event store's bucket_items_many, on every backend: SQLite
files, the Cassandra stores on the in-memory fake of tests/unit/test_cassandra_fake.py, and a real Cassandra when
one is configured (COUNTER_TEST_CASSANDRA or testcontainers; skipped naming why otherwise).

Each test works in a fresh namespace. The end of the file holds SQLite-specific checks (query plan, layout).
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import uuid
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import orjson
import pytest

from sinks import EventStore, SketchStore, SqliteEventStore, SqliteSketchStore, open_sketch_store, open_stores
from sinks.sketches import Union, bucket_items_of, estimate, sketch_of, union
from sinks.sqlite.bulk import bulk_statement
from sinks.sqlite.events import bucket_items_statement
from sinks.windows import Granularity
from tests.integration.test_store_contract import BASE, PART, S, ev

T = TypeVar("T")
M, H, D = Granularity.MINUTE, Granularity.HOUR, Granularity.DAY
MIN = 60 * S
DAY = 1440 * MIN
T0 = 1_700_006_400 * S  # a day boundary (a multiple of 86400 s)
BACKENDS = ["sqlite", "fake", "cassandra"]


@dataclass
class Stores:
    events: EventStore
    sketches: SketchStore
    namespace: str

    def run(self, awaitable: Awaitable[T]) -> T:
        async def wait() -> T:
            return await awaitable
        return asyncio.run(wait())


@pytest.fixture(params=BACKENDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        if request.param == "cassandra":  # skips, naming why, when no cluster is reachable
            from tests.cassandra_support import contract_sketch_stores

            events, sketches, namespace = stack.enter_context(contract_sketch_stores(lambda ns: PART))
        elif request.param == "fake":
            from tests.unit.test_cassandra_fake import FakeCassandra, fake_bucket_store, fake_stores

            fake = FakeCassandra()
            _, events, rollups = fake_stores(fake)
            buckets = fake_bucket_store(fake)
            sketches = open_sketch_store(buckets)  # beside the bucket store, on its session
            asyncio.run(rollups.close())
            asyncio.run(buckets.close())
            namespace = f"ns_{uuid.uuid4().hex[:8]}"
        else:
            events, rollups, buckets = open_stores(f"sqlite://{tmp_path}", tmp_path, lambda ns: PART)
            sketches = open_sketch_store(buckets)
            asyncio.run(rollups.close())
            asyncio.run(buckets.close())
            namespace = f"ns_{uuid.uuid4().hex[:8]}"
        yield Stores(events, sketches, namespace)  # type: ignore[arg-type]

        async def close() -> None:
            await events.close()
            await sketches.close()
        asyncio.run(close())
    if request.param == "fake":
        assert fake.closed, "the sketch store released its reference to the shared session"


def sk(*items: str, lg_k: int = 12) -> bytes:
    return sketch_of(items, lg_k)


# -- the sketch store -----------------------------------------------------------------------------


def test_sketches_round_trip_by_range(stores: Stores) -> None:
    ns, ss = stores.namespace, stores.sketches
    rows = [("c", M, T0 + i * MIN, sk(*(f"u{j}" for j in range(i + 1))), T0 + 10 * MIN) for i in range(5)]
    rows += [("c", H, T0, sk("u0", "u1"), T0 + 10 * MIN), ("d", M, T0, sk("x"), T0 + 10 * MIN)]
    assert stores.run(ss.write_sketches(ns, list(reversed(rows)))) == [True] * len(rows)
    [minutes, one, hours, other, none] = stores.run(ss.read_sketches_many(ns, [
        ("c", M, T0, T0 + 5 * MIN), ("c", M, T0 + MIN, T0 + 2 * MIN), ("c", H, T0, T0 + DAY), ("d", M, 0, 2**62),
        ("c", D, T0, T0 + DAY)]))
    assert [(s, b, u) for s, b, u in minutes] == [(T0 + i * MIN, rows[i][3], T0 + 10 * MIN) for i in range(5)]
    assert [round(estimate(b).estimate) for _s, b, _u in minutes] == [1, 2, 3, 4, 5]
    assert one == [minutes[1]]
    assert [s for s, _b, _u in hours] == [T0] and [s for s, _b, _u in other] == [T0] and none == []
    assert stores.run(ss.read_sketches_many(ns, [])) == []
    assert stores.run(ss.read_sketches_many(ns, [("c", M, T0 + MIN, T0 + MIN)])) == [[]]
    # another namespace sees nothing
    assert stores.run(ss.read_sketches_many(ns + "x", [("c", M, T0, T0 + 5 * MIN)])) == [[]]


def test_sketch_writes_are_forward_only(stores: Stores) -> None:
    ns, ss = stores.namespace, stores.sketches
    first, later, stale = sk("a"), sk("a", "b"), sk("z")
    assert stores.run(ss.write_sketches(ns, [("c", M, T0, first, T0 + 100)])) == [True]
    # the same boundary or an earlier one is refused; a later one replaces it
    assert stores.run(ss.write_sketches(ns, [("c", M, T0, stale, T0 + 100), ("c", M, T0, stale, T0 + 50)])) == [
        False, False]
    assert stores.run(ss.write_sketches(ns, [("c", M, T0, later, T0 + 200)])) == [True]
    [[(start, stored, upto)]] = stores.run(ss.read_sketches_many(ns, [("c", M, T0, T0 + MIN)]))
    assert (start, stored, upto) == (T0, later, T0 + 200)
    # one call with the same bucket twice: the later boundary wins, whichever comes first
    got = stores.run(ss.write_sketches(ns, [("c", M, T0, sk("p"), T0 + 400), ("c", M, T0, stale, T0 + 300)]))
    assert got[1] is False
    [[(_, stored, upto)]] = stores.run(ss.read_sketches_many(ns, [("c", M, T0, T0 + MIN)]))
    assert (stored, upto) == (sk("p"), T0 + 400)
    assert stores.run(ss.write_sketches(ns, [])) == []


def test_sketch_ranges_across_slices(stores: Stores) -> None:
    """Minutes across day slices, days over more than four yearly slices, and a range from the epoch."""
    ns, ss = stores.namespace, stores.sketches
    minutes = [T0 - 2 * MIN, T0 - MIN, T0, T0 + MIN]  # two day slices
    days = [T0 - k * 400 * DAY for k in range(6)]  # six yearly slices
    rows = [("c", M, t, sk(str(t)), T0 + DAY) for t in minutes] + [("c", D, t, sk(str(t)), T0 + DAY) for t in days]
    assert all(stores.run(ss.write_sketches(ns, rows)))
    [got_minutes, got_days, since_epoch] = stores.run(ss.read_sketches_many(ns, [
        ("c", M, T0 - 3 * MIN, T0 + 2 * MIN), ("c", D, days[-1], T0 + DAY), ("c", D, 0, T0 + DAY)]))
    assert [s for s, _b, _u in got_minutes] == minutes
    assert [s for s, _b, _u in got_days] == sorted(days) == [s for s, _b, _u in since_epoch]
    assert round(union([b for _s, b, _u in since_epoch], 12).estimate().estimate) == 6


def test_sketch_retention_drops_expired_slices_only(stores: Stores) -> None:
    ns, ss = stores.namespace, stores.sketches
    rows = [("c", M, T0 - DAY + 5 * MIN, sk("old"), T0), ("c", M, T0 + 5 * MIN, sk("mid"), T0 + DAY),
            ("c", M, T0 + 30 * MIN, sk("new"), T0 + DAY), ("c", H, T0 - DAY, sk("hour"), T0),
            ("d", M, T0 - DAY + MIN, sk("d"), T0)]
    assert all(stores.run(ss.write_sketches(ns, rows)))
    assert all(stores.run(ss.write_sketches(ns + "y", [("c", M, T0 - DAY, sk("other"), T0)])))
    # a cutoff on a slice boundary empties the older day of minutes, of both counters
    assert stores.run(ss.drop_expired(ns, M, T0)) == 1
    # a cutoff inside a slice drops the minutes that ended by then, and empties no slice
    assert stores.run(ss.drop_expired(ns, M, T0 + 10 * MIN)) == 0
    [c_minutes, d_minutes, hours] = stores.run(ss.read_sketches_many(ns, [
        ("c", M, 0, 2**62), ("d", M, 0, 2**62), ("c", H, 0, 2**62)]))
    assert [s for s, _b, _u in c_minutes] == [T0 + 30 * MIN] and d_minutes == []
    assert [s for s, _b, _u in hours] == [T0 - DAY]  # another granularity is left alone
    assert stores.run(ss.read_sketches_many(ns + "y", [("c", M, 0, 2**62)]))[0] != []  # another namespace too
    assert stores.run(ss.drop_expired(ns + "y", M, T0 + DAY)) == 1


# -- the event store's items per bucket -------------------------------------------------------------


def test_bucket_items_follow_the_clear_rule(stores: Stores) -> None:
    ns, es = stores.namespace, stores.events
    b = BASE  # a minute boundary
    rows = [ev(ns, b + 1, "t1", key="alice"), ev(ns, b + 2, "t2", key="bob"), ev(ns, b + 2, "t2", key="bob"),
            ev(ns, b + 3, "t3", key="alice"),  # another event, the same item
            ev(ns, b + 4, "t4", key=""),  # no item: not counted
            ev(ns, b + MIN + 1, "t5", key="carol"), ev(ns, b + MIN + 2, "clr", clear=True),
            ev(ns, b + MIN + 2, "t6", key="dave"),  # at the clear's instant: erased
            ev(ns, b + MIN + 3, "t7", key="erin"), ev(ns, b + 2 * MIN + 1, "t8", key="frank", counter="other")]
    stores.run(es.write_events(rows))
    [whole, tail, empty, other] = stores.run(es.bucket_items_many(ns, [
        ("c", b - 1, b + 2 * MIN), ("c", b + 2, b + 2 * MIN), ("c", b + 5 * MIN, b + 6 * MIN),
        ("other", 0, b + 3 * MIN)], MIN))
    assert whole == [(b, frozenset({"alice", "bob"}), None, 4), (b + MIN, frozenset({"erin"}), b + MIN + 2, 4)]
    assert tail == [(b, frozenset({"alice"}), None, 2), (b + MIN, frozenset({"erin"}), b + MIN + 2, 4)]
    assert empty == [] and other == [(b + 2 * MIN, frozenset({"frank"}), None, 1)]
    assert stores.run(es.bucket_items_many(ns, [], MIN)) == []
    with pytest.raises(ValueError, match="positive"):
        stores.run(es.bucket_items_many(ns, [("c", 0, b)], 0))


def test_bucket_items_equal_an_oracle_over_slices(stores: Stores) -> None:
    """Random events over several event slices (PART: 60 s) and buckets of 90 s straddling them."""
    ns, es = stores.namespace, stores.events
    rng = random.Random(7)
    rows = [ev(ns, BASE + rng.randrange(0, 400 * S), f"t{i}", key=f"u{rng.randrange(40)}",
               clear=rng.random() < 0.02) for i in range(600)]
    stores.run(es.write_events(rows))
    after, upto = BASE + 17 * S, BASE + 377 * S
    [got] = stores.run(es.bucket_items_many(ns, [("c", after, upto)], 90 * S))
    chosen = {(r[2], r[3], r[4]): r for r in rows if after < r[2] <= upto}
    expected = bucket_items_of(((t, "" if r[6] else key, r[6]) for (t, _id, key), r in chosen.items()), 90 * S)
    assert got == expected and len(got) >= 4


# -- the pure part ----------------------------------------------------------------------------------


def test_union_is_idempotent_and_mergeable() -> None:
    a, b = sk(*(f"u{i}" for i in range(1000))), sk(*(f"u{i}" for i in range(500, 1500)))
    once = union([a, b], 12).sketch()
    assert union([a, b, a, b, once], 12).sketch() == once
    u = Union(12)
    u.add_sketch(once)
    u.add_items(f"u{i}" for i in range(1500))
    assert u.sketch() == once
    est = estimate(once)
    assert est.lower_bound <= 1500 <= est.upper_bound and est.rounded == round(est.estimate)
    assert estimate(sk()) == (0.0, 0.0, 0.0) and estimate(union([], 12).sketch()) == (0.0, 0.0, 0.0)


# -- SQLite-specific --------------------------------------------------------------------------------


def test_sqlite_bucket_items_read_the_range_by_primary_key(tmp_path: Path) -> None:
    es = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: PART)
    asyncio.run(es.write_events([ev("ns", BASE + i * S, f"e{i}", key=f"u{i}") for i in range(50)]))
    ((table, _, _),) = asyncio.run(es.slices("ns"))[:1]
    asyncio.run(es.close())
    conn = sqlite3.connect(tmp_path / "events.sqlite3")
    try:
        args = (0, "ns", "c", BASE, BASE + 30 * S, PART.time_bucket(BASE), PART.time_bucket(BASE + 30 * S), 60 * S)
        sql = bulk_statement(bucket_items_statement(table), 1)
        plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args)]
        ((rows,),) = conn.execute(sql, args).fetchall()
    finally:
        conn.close()
    events_reads = [line for line in plan if line.startswith(("SEARCH ev", "SCAN ev"))]
    assert events_reads and all("USING PRIMARY KEY" in line and "(time_bucket,event_time)>(?,?)" in line
                                for line in events_reads), plan
    assert sorted(orjson.loads(rows)) == [[0, BASE + i * S, f"u{i}", 0] for i in range(1, 31)]


def test_sqlite_sketches_refuse_a_file_of_another_layout(tmp_path: Path) -> None:
    path = tmp_path / "sketches.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 9")
    conn.close()
    ss = SqliteSketchStore(path)
    with pytest.raises(RuntimeError, match="layout 9"):
        asyncio.run(ss.read_sketches_many("ns", [("c", M, 0, 1)]))
    asyncio.run(ss.close())
