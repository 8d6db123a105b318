"""The store contract every backend passes (SQLite, and Cassandra when one is reachable; see BACKENDS).

Tests use a fresh namespace each, so a shared external backend (a Cassandra keyspace) stays isolated.
The end of the file holds SQLite-specific checks: query plans and several processes on one file.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import re
import sqlite3
import uuid
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import orjson
import pytest

from sinks import (
    Aggregate,
    BucketStore,
    EventRow,
    EventStore,
    Partitioning,
    RollupState,
    RollupStore,
    SqliteEventStore,
    SqliteRollupStore,
    apply_aggregate,
    open_stores,
)
from sinks import Stores as OpenedStores
from sinks.model import PendingRollups, join_halves
from sinks.sqlite.bulk import bulk_statement
from sinks.sqlite.events import (
    aggregate_statement,
    bucket_sums_statement,
    contains_statement,
    counters_statement,
)
from sinks.windows import Granularity, RankPage

T = TypeVar("T")

S = 1_000_000  # µs per second
BASE = 1_700_000_040 * S  # an event time on a slice boundary (a multiple of 60 s)
PART = Partitioning(buckets_per_id=4, seconds_per_bucket=10, seconds_per_slice=60)
BACKENDS = ["sqlite", "cassandra"]  # cassandra: COUNTER_TEST_CASSANDRA=host:port or testcontainers, else skipped


@dataclass
class Stores:
    events: EventStore
    rollups: RollupStore
    buckets: BucketStore
    namespace: str

    def run(self, awaitable: Awaitable[T]) -> T:
        return asyncio.run(_awaited(awaitable))


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _open(backend: str, directory: Path) -> OpenedStores:
    if backend == "sqlite":
        return open_stores(f"sqlite://{directory}", directory, lambda ns: PART)
    raise AssertionError(f"unknown backend {backend}")


@pytest.fixture(params=BACKENDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        if request.param == "cassandra":  # skips, naming why, when no cluster is reachable
            from tests.cassandra_support import contract_stores

            events, rollups, buckets, namespace = stack.enter_context(contract_stores(lambda ns: PART))
        else:
            events, rollups, buckets = _open(request.param, tmp_path)
            namespace = f"ns_{uuid.uuid4().hex[:8]}"
        yield Stores(events, rollups, buckets, namespace)

        async def close() -> None:
            await events.close()
            await rollups.close()
            await buckets.close()
        asyncio.run(close())


def ev(ns: str, t: int, eid: str, delta: int = 1, *, counter: str = "c", key: str = "",
       clear: bool = False) -> EventRow:
    return (ns, counter, t, eid, key, delta, clear)


def oracle(rows: list[EventRow], after: int, upto: int) -> tuple[int, bool, int | None]:
    """(delta, cleared, last_clear) of distinct events in (after, upto], by the DESIGN's clear rule."""
    distinct: dict[tuple, EventRow] = {}
    for row in rows:
        distinct.setdefault((row[0], row[1], row[2], row[3], row[4]), row)
    chosen = [r for r in distinct.values() if after < r[2] <= upto]
    clears = [r[2] for r in chosen if r[6]]
    last = max(clears) if clears else None
    delta = sum(r[5] for r in chosen if not r[6] and (last is None or r[2] > last))
    return delta, last is not None, last


def oracle_events(rows: list[EventRow], after: int, upto: int) -> int:
    """Aggregate.events: distinct events the result depends on (at or after the latest clear; all if none)."""
    _, _, last = oracle(rows, after, upto)
    distinct = {(r[0], r[1], r[2], r[3], r[4]) for r in rows if after < r[2] <= upto}
    return sum(1 for k in distinct if last is None or k[2] >= last)


def check(agg: Aggregate, expected: tuple[int, bool, int | None]) -> None:
    assert (agg.delta, agg.cleared, agg.last_clear_us) == expected


# -- event store ----------------------------------------------------------------------------------


def test_writes_are_idempotent(stores: Stores) -> None:
    ns, es = stores.namespace, stores.events
    rows = [ev(ns, BASE + 1, "a", 5), ev(ns, BASE + 1, "b", 7), ev(ns, BASE + 1, "a", 5, key="item-2")]
    assert stores.run(es.write_events(rows)) == 3
    assert stores.run(es.write_events(rows)) == 0
    # same identity, different delta: still the same event, the first write wins
    assert stores.run(es.write_events([ev(ns, BASE + 1, "a", 100)])) == 0
    # duplicates inside one batch are stored once too (the first one in the batch wins)
    assert stores.run(es.write_events([ev(ns, BASE + 2, "c", 1), ev(ns, BASE + 2, "c", 50)])) == 1
    assert stores.run(es.write_events([])) == 0
    agg = stores.run(es.aggregate(ns, "c", 0, BASE + 10 * S))
    assert agg == Aggregate(5 + 7 + 5 + 1, False, None, 4)
    assert len(stores.run(es.scan(ns, "c", 0, BASE + 10 * S))) == 4


def test_aggregate_bounds_are_half_open(stores: Stores) -> None:
    ns, es = stores.namespace, stores.events
    stores.run(es.write_events([ev(ns, BASE + 10, "x", 1), ev(ns, BASE + 20, "y", 10), ev(ns, BASE + 30, "z", 100)]))
    assert stores.run(es.aggregate(ns, "c", BASE + 10, BASE + 30)).delta == 110  # (10, 30]
    assert stores.run(es.aggregate(ns, "c", BASE + 9, BASE + 10)).delta == 1
    assert stores.run(es.aggregate(ns, "c", BASE + 10, BASE + 29)).delta == 10
    assert stores.run(es.aggregate(ns, "c", BASE + 30, BASE + 30)) == Aggregate(0, False, None, 0)
    assert stores.run(es.aggregate(ns, "c", BASE + 40, BASE + 20)) == Aggregate(0, False, None, 0)
    assert stores.run(es.aggregate(ns, "other", 0, BASE + 100)) == Aggregate(0, False, None, 0)
    assert stores.run(es.aggregate("no_such_namespace", "c", 0, BASE + 100)).events == 0


def test_clears_latest_wins_and_erase_their_own_instant(stores: Stores) -> None:
    ns, es = stores.namespace, stores.events
    t = BASE + 5 * S
    rows = [ev(ns, t + 100, "a", 5), ev(ns, t + 150, "k1", 0, clear=True), ev(ns, t + 170, "b", 2),
            ev(ns, t + 200, "k2", 9, clear=True), ev(ns, t + 200, "same-instant", 7), ev(ns, t + 300, "c", 3)]
    random.Random(1).shuffle(rows)
    stores.run(es.write_events(rows))
    agg = stores.run(es.aggregate(ns, "c", 0, t + 400))
    assert agg.cleared and agg.last_clear_us == t + 200 and agg.delta == 3  # the add at t+200 is erased
    assert agg.events == 3  # the clear, the erased add at its instant, and the add after it
    check(stores.run(es.aggregate(ns, "c", 0, t + 199)), (2, True, t + 150))
    check(stores.run(es.aggregate(ns, "c", t + 200, t + 400)), (3, False, None))  # the clear is outside
    check(stores.run(es.aggregate(ns, "c", 0, t + 149)), (5, False, None))
    # clears are idempotent like any event
    assert stores.run(es.write_events([ev(ns, t + 200, "k2", 9, clear=True)])) == 0
    check(stores.run(es.aggregate(ns, "c", 0, t + 400)), (3, True, t + 200))
    assert apply_aggregate(1000, agg) == 3 and apply_aggregate(1000, Aggregate(4, False, None, 1)) == 1004


def test_ranges_across_buckets_and_slices_match_the_oracle(stores: Stores) -> None:
    ns, es = stores.namespace, stores.events
    rng = random.Random(7)
    rows: list[EventRow] = []
    for i in range(300):  # ~5 minutes: 30 buckets of 10 s, 5 slices of 60 s, ties and edges included
        t = BASE + rng.choice([rng.randrange(0, 300 * S), rng.randrange(0, 30) * 10 * S,
                               rng.randrange(1, 6) * 60 * S - 1])
        rows.append(ev(ns, t, f"e{i}", rng.randint(-5, 9), clear=rng.random() < 0.03))
    rows.append(ev(ns, BASE + 250 * S, "late-clear", clear=True))  # latest clear in a later slice
    rows += rows[:40]  # redeliveries
    for start in range(0, len(rows), 37):
        stores.run(es.write_events(rows[start:start + 37]))
    edges = [BASE + k * 10 * S + d for k in range(31) for d in (-1, 0, 1)]
    for _ in range(150):
        a, b = sorted(rng.sample([*edges, *(r[2] for r in rows)], 2))
        agg = stores.run(es.aggregate(ns, "c", a, b))
        check(agg, oracle(rows, a, b))
        assert agg.events == oracle_events(rows, a, b)
    check(stores.run(es.aggregate(ns, "c", 0, BASE + 10**4 * S)), oracle(rows, 0, BASE + 10**4 * S))
    # rolling up in arbitrary steps gives the same count as one big window
    count, ts = 0, 0
    for boundary in [*sorted(rng.sample(edges, 12)), BASE + 400 * S]:
        count, ts = apply_aggregate(count, stores.run(es.aggregate(ns, "c", ts, boundary))), boundary
    assert count == oracle(rows, 0, BASE + 400 * S)[0]


def test_aggregate_many_equals_one_aggregate_per_window(stores: Stores) -> None:
    ns, es = stores.namespace, stores.events
    rng = random.Random(11)
    rows = [ev(ns, BASE + rng.randrange(0, 200 * S), f"e{i}", rng.randint(-3, 9), counter=f"c{i % 5}",
               clear=rng.random() < 0.05) for i in range(200)]
    stores.run(es.write_events(rows))
    windows = [(f"c{rng.randrange(6)}", *sorted(rng.sample(range(BASE - S, BASE + 210 * S), 2))) for _ in range(40)]
    windows += [("c1", BASE + 50 * S, BASE + 50 * S), ("c2", BASE + 60 * S, BASE)]  # empty and reversed
    many = stores.run(es.aggregate_many(ns, windows))
    assert len(many) == len(windows)
    for (counter, after, upto), agg in zip(windows, many, strict=True):
        assert agg == stores.run(es.aggregate(ns, counter, after, upto))
        check(agg, oracle([r for r in rows if r[1] == counter], after, upto))
    assert stores.run(es.aggregate_many(ns, [])) == []


def test_write_and_aggregate_counts_the_rows_it_writes_once(stores: Stores) -> None:
    ns, es = stores.namespace, stores.events
    stores.run(es.write_events([ev(ns, BASE + 1, "old", 4)]))
    rows = [ev(ns, BASE + 2, "a", 5), ev(ns, BASE + 3, "b", 7, counter="d"), ev(ns, BASE + 1, "old", 100)]
    windows = [("c", 0, BASE + 10), ("d", 0, BASE + 10), ("c", BASE + 1, BASE + 10), ("e", 0, BASE + 10)]
    aggs = stores.run(es.write_and_aggregate(rows, ns, windows))
    assert [(a.delta, a.events) for a in aggs] == [(9, 2), (7, 1), (5, 1), (0, 0)]  # "old" kept its first delta
    assert stores.run(es.write_and_aggregate(rows, ns, windows)) == aggs  # idempotent
    assert stores.run(es.write_and_aggregate([], ns, windows[:1])) == aggs[:1]
    assert stores.run(es.write_and_aggregate([ev(ns, BASE + 4, "f", 1)], ns, [])) == []
    assert stores.run(es.aggregate(ns, "c", 0, BASE + 10)).delta == 10


def test_counters_page_through_distinct_names_in_order(stores: Stores) -> None:
    """`counters` (what `counter recount --all` walks): distinct names with events, ascending, paged."""
    ns, es = stores.namespace, stores.events
    names = [f"k{i:03d}" for i in range(0, 60, 3)] + ["Z", "a", "é", "视频"]
    stores.run(es.write_events([ev(ns, BASE + (i % 5) * 70 * S + i, f"e{i}", counter=n) for i, n in enumerate(names)]
                               + [ev(ns, BASE + 7, "again", counter="a")]))
    stores.run(es.write_events([ev(f"{ns}_other", BASE + 1, "x", counter="k000")]))

    def pages(limit: int) -> list[str]:
        out: list[str] = []
        after = None
        while True:
            page = stores.run(es.counters(ns, after=after, limit=limit))
            assert len(page) <= limit
            out += page
            if len(page) < limit:
                return out
            after = page[-1]

    for limit in (1, 7, 24, 1000):
        assert pages(limit) == sorted(set(names))
    assert stores.run(es.counters(ns, after="k030", limit=3)) == ["k033", "k036", "k039"]
    assert stores.run(es.counters(ns, limit=0)) == []
    assert stores.run(es.counters(f"{ns}_none")) == []


def test_scan_pages_with_a_cursor_return_each_event_once(stores: Stores) -> None:
    ns, es = stores.namespace, stores.events
    rows = [ev(ns, BASE + 60 * S - 1, f"tie{i:02d}", i) for i in range(23)]  # 23 events on one instant
    rows += [ev(ns, BASE + 60 * S, f"next{i}", 1, key=k) for i in range(5) for k in ("", "k")]  # next slice
    rows += [ev(ns, BASE + j * 7 * S, f"spread{j}", 2, clear=j == 9) for j in range(40)]
    rows += [ev(ns, BASE + 61 * S, "other", 1, counter="c2")]
    stores.run(es.write_events(rows))
    mine = sorted((r for r in rows if r[1] == "c"), key=lambda r: (r[2], r[3], r[4]))
    lo, hi = BASE, BASE + 200 * S
    expected = [r for r in mine if lo < r[2] <= hi]
    for limit in (1, 7, 23, 1000):
        got: list[EventRow] = []
        cursor = None
        while True:
            page = stores.run(es.scan(ns, "c", lo, hi, after=cursor, limit=limit))
            assert len(page) <= limit
            got += page
            if len(page) < limit:
                break
            cursor = (page[-1][2], page[-1][3], page[-1][4])
        assert got == expected
    assert all(isinstance(r[6], bool) for r in got) and any(r[6] for r in got)
    assert stores.run(es.scan(ns, "c", hi, lo)) == []


def test_contains_finds_exactly_the_stored_identities(stores: Stores) -> None:
    ns, es = stores.namespace, stores.events
    rows = [ev(ns, BASE + 60 * S - 1, "edge", 1), ev(ns, BASE + 60 * S, "next", 1, key="k"),
            ev(ns, BASE + 5 * S, "clear", 0, clear=True), ev(ns, BASE + 5 * S, "other", 1, counter="c2")]
    stores.run(es.write_events(rows))
    keys = [("c", BASE + 60 * S - 1, "edge", ""), ("c", BASE + 60 * S, "next", "k"), ("c", BASE + 5 * S, "clear", ""),
            ("c2", BASE + 5 * S, "other", ""),
            ("c", BASE + 60 * S, "next", ""),  # another item key
            ("c", BASE + 60 * S - 2, "edge", ""),  # another time
            ("c", BASE + 5 * S, "other", ""),  # another counter's token
            ("c", BASE + 600 * S, "edge", "")]  # a slice that does not exist
    assert stores.run(es.contains(ns, keys)) == [True] * 4 + [False] * 4
    assert stores.run(es.contains(ns, [])) == []
    assert stores.run(es.contains(f"{ns}_none", keys[:1])) == [False]


def test_scan_returns_values_exactly(stores: Stores) -> None:
    """Extreme deltas, non-ASCII and quoting characters in ids and item keys come back as written."""
    ns, es = stores.namespace, stores.events
    rows = [ev(ns, BASE + 1, 'q"\\\n', 2**63 - 1, key="ключ 🗝"), ev(ns, BASE + 2, "é", -(2**63), key="{}"),
            ev(ns, BASE + 3, "0", 0, clear=True)]
    stores.run(es.write_events(rows))
    assert stores.run(es.scan(ns, "c", BASE, BASE + 10 * S)) == rows


def test_contains_many_identities_across_slices(stores: Stores) -> None:
    """Over a thousand identities in one call, in two slices, present and absent ones shuffled: exactly the
    stored ones are found."""
    ns, es = stores.namespace, stores.events
    rows = [ev(ns, BASE + (j * 97_003) % (120 * S), f"e{j}", 1, counter=f"c{j % 7}", key=f"k{j % 3}")
            for j in range(1_200)]
    stores.run(es.write_events(rows))
    present = [(c, t, eid, key) for _ns, c, t, eid, key, _d, _clear in rows]
    absent = [(c, t, eid, "other") for c, t, eid, _key in present[:150]] + [
        (c, t + 1, eid, key) for c, t, eid, key in present[150:300]]
    keys = present + absent
    random.Random(7).shuffle(keys)
    wanted = set(present)
    assert stores.run(es.contains(ns, keys)) == [k in wanted for k in keys]


def test_retention_deletes_only_old_rolled_up_events(stores: Stores) -> None:
    ns, es = stores.namespace, stores.events
    rows = [ev(ns, BASE + s * S, f"e{s}", 1, counter=c) for s in range(0, 300, 5) for c in ("c", "d")]
    stores.run(es.write_events(rows))
    total = len(rows) // 2

    # rolled up only to 100 s: events after it stay even though "before" is later
    deleted = stores.run(es.delete_rolled_up(ns, "c", BASE + 200 * S, BASE + 100 * S))
    assert deleted == len(range(0, 101, 5))
    left = stores.run(es.scan(ns, "c", 0, BASE + 10**4 * S))
    assert min(r[2] for r in left) == BASE + 105 * S
    # "before" earlier than the rollup bounds it; the other counter is untouched
    deleted = stores.run(es.delete_rolled_up(ns, "c", BASE + 150 * S, BASE + 250 * S))
    assert deleted == len(range(105, 150, 5))
    assert stores.run(es.aggregate(ns, "c", BASE + 149 * S, BASE + 10**4 * S)).delta == total - 30
    assert stores.run(es.aggregate(ns, "d", 0, BASE + 10**4 * S)).delta == total

    # whole slices only: slices end at 60 s, 120 s, ...; only those entirely before both bounds go
    assert stores.run(es.drop_expired_slices(ns, BASE + 130 * S, BASE + 119 * S)) == 1  # [0, 60) only
    assert stores.run(es.drop_expired_slices(ns, BASE + 130 * S, BASE + 120 * S - 1)) == 1  # [60, 120)
    assert stores.run(es.drop_expired_slices(ns, BASE + 10**4 * S, BASE + 179 * S)) == 0
    remaining_d = stores.run(es.scan(ns, "d", 0, BASE + 10**4 * S))
    assert min(r[2] for r in remaining_d) == BASE + 120 * S and len(remaining_d) == total - 24
    assert stores.run(es.aggregate(ns, "d", BASE + 119 * S, BASE + 10**4 * S)).delta == total - 24
    stores.run(es.write_events([ev(ns, BASE + 299 * S, "new", 1)]))  # writing after drops still works
    assert stores.run(es.aggregate(ns, "c", BASE + 298 * S, BASE + 300 * S)).delta == 1


def sums_oracle(rows: list[EventRow], counter: str, after: int, upto: int,
                width: int) -> list[tuple[int, int, int | None, int]]:
    """bucket_sums of distinct events: per bucket, adds strictly after its latest clear, that clear, events."""
    distinct: dict[tuple, EventRow] = {}
    for row in rows:
        distinct.setdefault(row[:5], row)
    per: dict[int, list[EventRow]] = {}
    for r in distinct.values():
        if r[1] == counter and after < r[2] <= upto:
            per.setdefault(r[2] // width * width, []).append(r)
    out = []
    for start, chosen in sorted(per.items()):
        last = max((r[2] for r in chosen if r[6]), default=None)
        out.append((start, sum(r[5] for r in chosen if not r[6] and (last is None or r[2] > last)), last,
                    len(chosen)))
    return out


def test_bucket_sums_match_the_oracle(stores: Stores) -> None:
    """Minute (and odd-width) sums of ranges across event buckets and slices: clears, ties, redeliveries."""
    ns, es = stores.namespace, stores.events
    rng = random.Random(5)
    rows: list[EventRow] = []
    for i in range(400):  # ~5 minutes of two counters: 10 s event buckets, 60 s slices
        t = BASE + rng.choice([rng.randrange(0, 300 * S), rng.randrange(0, 30) * 10 * S,
                               rng.randrange(1, 6) * 60 * S - 1, rng.randrange(0, 5) * 60 * S])
        rows.append(ev(ns, t, f"e{i}", rng.randint(-5, 9), counter=rng.choice("cd"), clear=rng.random() < 0.04))
    clear_at = BASE + 150 * S + 7
    rows += [ev(ns, clear_at, "k", clear=True), ev(ns, clear_at, "erased", 1000), ev(ns, clear_at + 1, "kept", 3)]
    rows += rows[:50]  # redeliveries
    for start in range(0, len(rows), 61):
        stores.run(es.write_events(rows[start:start + 61]))
    edges = [BASE + k * 30 * S + d for k in range(11) for d in (-1, 0, 1)]
    for width in (60 * S, 90 * S, 7 * S):  # 90 s buckets straddle the 60 s event slices
        windows = [(rng.choice("cdx"), *sorted(rng.sample([*edges, *(r[2] for r in rows)], 2))) for _ in range(30)]
        windows += [("c", 0, BASE + 10**4 * S), ("c", BASE + 5 * S, BASE + 5 * S), ("d", BASE + 9 * S, BASE)]
        got = stores.run(es.bucket_sums_many(ns, windows, width))
        assert len(got) == len(windows)
        for (counter, after, upto), sums in zip(windows, got, strict=True):
            assert sums == sums_oracle(rows, counter, after, upto, width), (counter, after, upto, width)
    minute = stores.run(es.bucket_sums_many(ns, [("c", clear_at - 1, clear_at + 1)], 60 * S))[0]
    assert minute == [(clear_at // (60 * S) * 60 * S, 3, clear_at, 3)]  # the add at the clear's instant: erased
    assert stores.run(es.bucket_sums_many(ns, [], 60 * S)) == []
    assert stores.run(es.bucket_sums_many(f"{ns}_none", [("c", 0, BASE + S)], 60 * S)) == [[]]


def test_bucket_sums_total_after_the_last_clear_equals_the_aggregate(stores: Stores) -> None:
    """What the windows rest on: the buckets after a range's latest clear sum to the range's aggregate."""
    ns, es = stores.namespace, stores.events
    rng = random.Random(9)
    rows = [ev(ns, BASE + rng.randrange(0, 600 * S), f"e{i}", rng.randint(-3, 9), clear=rng.random() < 0.02)
            for i in range(300)]
    stores.run(es.write_events(rows))
    for _ in range(20):
        after, upto = sorted(rng.sample(range(BASE - S, BASE + 610 * S), 2))
        agg = stores.run(es.aggregate(ns, "c", after, upto))
        sums = stores.run(es.bucket_sums_many(ns, [("c", after, upto)], 60 * S))[0]
        last = max((c for _s, _v, c, _n in sums if c is not None), default=None)
        assert last == agg.last_clear_us
        assert sum(v for start, v, _c, _n in sums if last is None or start + 60 * S > last) == agg.delta


def test_sums_past_int64_are_exact_and_a_rollup_saturates(stores: Stores) -> None:
    """Each delta fits int64, their sum need not: aggregates and bucket sums stay exact, in the stores' own sums (of
    plain partitions on Cassandra) and the rows read around a clear (SQLite's SUM failed past int64, Cassandra's
    bigint sum wrapped); the count a rollup keeps saturates at the int64 bounds."""
    ns, es = stores.namespace, stores.events
    top, bottom = 2**63 - 1, -(2**63)
    rows = [ev(ns, BASE + i * 2 * S, f"e{i}", bottom if i % 4 == 3 else top) for i in range(60)]  # 2 minutes
    clear_at = BASE + 61 * S
    rows += [ev(ns, clear_at, "k", clear=True), ev(ns, clear_at, "erased", top), ev(ns, clear_at + 1, "kept", top)]
    stores.run(es.write_events(rows))
    windows = [("c", 0, BASE + 59 * S), ("c", BASE + 9 * S, BASE + 31 * S), ("c", 0, BASE + 200 * S),
               ("c", clear_at, BASE + 200 * S)]
    for (counter, after, upto), agg in zip(windows, stores.run(es.aggregate_many(ns, windows)), strict=True):
        check(agg, oracle(rows, after, upto))
        assert abs(agg.delta) > top or after == BASE + 9 * S, agg  # the sums do leave int64
        sums = stores.run(es.bucket_sums_many(ns, [(counter, after, upto)], 60 * S))[0]
        assert sums == sums_oracle(rows, counter, after, upto, 60 * S)
    total = stores.run(es.aggregate(ns, "c", 0, BASE + 59 * S))
    assert total.delta == 23 * top + 7 * bottom and apply_aggregate(0, total) == top
    assert apply_aggregate(-5, Aggregate(bottom, False, None, 1)) == bottom
    assert stores.run(stores.rollups.write_rollup(ns, "c", apply_aggregate(0, total), BASE + 59 * S))
    assert stores.run(stores.rollups.get(ns, "c")).count == top


# -- bucket store ---------------------------------------------------------------------------------

MINUTE, HOUR, DAY = Granularity.MINUTE, Granularity.HOUR, Granularity.DAY
M = 60 * S
DAY0 = (BASE // (86400 * S) + 1) * 86400 * S  # a day (and minute-slice) boundary after BASE


def test_buckets_only_move_forward(stores: Stores) -> None:
    ns, bs = stores.namespace, stores.buckets
    t = DAY0 + 5 * M
    assert stores.run(bs.write_buckets(ns, [("c", MINUTE, t, 7, t + 10), ("c", HOUR, DAY0, 7, t + 10)])) == [True, True]
    applied = stores.run(bs.write_buckets(ns, [("c", MINUTE, t, 99, t + 9),  # computed earlier: refused
                                               ("c", MINUTE, t, 99, t + 10),  # same boundary: refused
                                               ("c", HOUR, DAY0, 12, t + 30),  # later: replaces
                                               ("d", MINUTE, t, 1, t + 1)]))
    assert applied == [False, False, True, True]
    got = stores.run(bs.read_buckets_many(ns, [("c", MINUTE, DAY0, DAY0 + M * 60), ("c", HOUR, DAY0, DAY0 + 3600 * S),
                                               ("d", MINUTE, t, t + M)]))
    assert got == [[(t, 7, t + 10)], [(DAY0, 12, t + 30)], [(t, 1, t + 1)]]
    assert stores.run(bs.write_buckets(ns, [])) == []
    # a re-run of the same step changes nothing
    assert stores.run(bs.write_buckets(ns, [("c", MINUTE, t, 7, t + 10)])) == [False]


def test_read_buckets_many_returns_each_range_in_order(stores: Stores) -> None:
    ns, bs = stores.namespace, stores.buckets
    minutes = [DAY0 + k * M for k in range(-30, 30, 3)]  # across a minute-slice (day) boundary
    hours = [DAY0 + k * 3600 * S for k in range(-40, 40, 7)]
    days = [DAY0 + k * 86400 * S for k in (-400, -1, 0, 365, 400)]  # across day slices (a year each)
    rows = [("c", MINUTE, t, i, t + M) for i, t in enumerate(minutes)]
    rows += [("c", HOUR, t, 100 + i, t + M) for i, t in enumerate(hours)]
    rows += [("c", DAY, t, 200 + i, t + M) for i, t in enumerate(days)]
    rows += [("other", MINUTE, DAY0, 5, DAY0 + 1)]
    random.Random(3).shuffle(rows)
    stores.run(bs.write_buckets(ns, rows))
    stores.run(bs.write_buckets(f"{ns}_x", [("c", MINUTE, DAY0, 555, DAY0 + 1)]))
    ranges = [("c", MINUTE, DAY0 - 10 * M, DAY0 + 10 * M), ("c", MINUTE, DAY0 - 30 * M, DAY0 + 30 * M),
              ("c", HOUR, DAY0 - 40 * 3600 * S, DAY0), ("c", DAY, DAY0 - 400 * 86400 * S, DAY0 + 401 * 86400 * S),
              ("c", MINUTE, DAY0 - 9 * M, DAY0 - 9 * M), ("c", MINUTE, DAY0 + M, DAY0 - M), ("none", HOUR, 0, 2**60),
              ("c", MINUTE, DAY0 - 9 * M, DAY0 - 8 * M)]
    got = stores.run(bs.read_buckets_many(ns, ranges))
    ordered = sorted(rows, key=lambda r: r[2])
    expected = [[(t, v, u) for c, g, t, v, u in ordered if c == rc and g == rg and lo <= t < hi]
                for rc, rg, lo, hi in ranges]
    assert got == expected
    assert [len(x) for x in got] == [7, 20, 6, 5, 0, 0, 0, 1]
    assert stores.run(bs.read_buckets_many(ns, [])) == []


def test_clears_only_move_forward(stores: Stores) -> None:
    ns, bs = stores.namespace, stores.buckets
    assert stores.run(bs.clears(ns, ["a"])) == {}
    stores.run(bs.bump_clears(ns, [("a", 500), ("a", 900), ("a", 700), ("b", 100)]))
    stores.run(bs.bump_clears(ns, [("a", 800), ("b", 150)]))
    stores.run(bs.bump_clears(f"{ns}_x", [("a", 10**6)]))
    stores.run(bs.bump_clears(ns, []))
    assert stores.run(bs.clears(ns, ["a", "b", "c", "a"])) == {"a": 900, "b": 150}
    assert stores.run(bs.clears(ns, [])) == {}


def test_retention_drops_only_expired_buckets(stores: Stores) -> None:
    ns, bs, rs = stores.namespace, stores.buckets, stores.rollups
    day = 86400 * S
    minutes = [DAY0 + k * 30 * M for k in range(-96, 48)]  # 2 days before DAY0 and 1 after: 3 minute slices
    hours = [DAY0 + k * 3600 * S for k in range(-48, 24)]
    rows = [("c", MINUTE, t, 1, t + M) for t in minutes] + [("d", MINUTE, t, 2, t + M) for t in minutes[::5]]
    rows += [("c", HOUR, t, 60, t + M) for t in hours] + [("c", DAY, DAY0 - day, 1440, DAY0)]
    stores.run(bs.write_buckets(ns, rows))
    stores.run(bs.write_buckets(f"{ns}_x", [("c", MINUTE, DAY0 - 2 * day, 9, DAY0)]))
    stores.run(bs.bump_clears(ns, [("c", DAY0 - 2 * day + 1)]))
    stores.run(rs.write_rollup(ns, "c", 42, DAY0))

    cutoff = DAY0 - 10 * M - 1  # inside the slice [DAY0 - 1 day, DAY0): minutes ending <= cutoff go
    assert stores.run(bs.drop_expired(ns, MINUTE, cutoff)) == 1  # the slice before it, emptied entirely

    def left(counter: str, g: Granularity) -> list[int]:
        [got] = stores.run(bs.read_buckets_many(ns, [(counter, g, 0, 2**60)]))
        return [start for start, _v, _u in got]

    assert left("c", MINUTE) == [t for t in minutes if t + M > cutoff]
    assert left("d", MINUTE) == [t for t in minutes[::5] if t + M > cutoff]
    assert left("c", HOUR) == hours and left("c", DAY) == [DAY0 - day]  # other granularities untouched
    assert stores.run(bs.clears(ns, ["c"])) == {"c": DAY0 - 2 * day + 1}
    assert stores.run(rs.get(ns, "c")) == RollupState(42, DAY0, 0)
    [[other]] = stores.run(bs.read_buckets_many(f"{ns}_x", [("c", MINUTE, 0, 2**60)]))
    assert other == (DAY0 - 2 * day, 9, DAY0)  # other namespaces untouched
    # newer buckets stay writable forward-only; the next slice-aligned cutoff empties the partial slice
    newest = minutes[-1]
    assert stores.run(bs.write_buckets(ns, [("c", MINUTE, newest, 5, newest + 2 * M)])) == [True]
    assert stores.run(bs.drop_expired(ns, MINUTE, cutoff)) == 0
    assert stores.run(bs.drop_expired(ns, MINUTE, DAY0)) == 1
    assert left("c", MINUTE) == [t for t in minutes if t >= DAY0]
    assert stores.run(bs.read_buckets_many(ns, [("c", MINUTE, newest, newest + 1)])) == [[(newest, 5, newest + 2 * M)]]
    assert stores.run(bs.drop_expired(ns, HOUR, DAY0 - day)) == 0  # hour slices are 32 days: none ended yet
    assert left("c", HOUR) == [t for t in hours if t + 3600 * S > DAY0 - day]


def _ranks(stores: Stores, signature: str, g: Granularity, start: int, ns: str | None = None) -> list[tuple[str, int]]:
    [entries] = stores.run(stores.buckets.read_ranks_many(ns or stores.namespace, [(signature, g, start, None, 1000)]))
    return entries


def _paged(stores: Stores, signature: str, g: Granularity, start: int, limit: int,
           ascending: bool = False) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    after = None
    while True:
        [page] = stores.run(stores.buckets.read_ranks_many(stores.namespace, [
            RankPage(signature, g, start, after, limit, ascending)]))
        assert len(page) <= limit
        out += page
        if len(page) < limit:
            return out
        after = (page[-1][1], page[-1][0])


def test_rank_lists_follow_the_buckets(stores: Stores) -> None:
    """Every bucket is an entry of its signature's rank list for its (granularity, start): by value descending,
    ties by base name ascending (code points), paged by the last entry, isolated per namespace and signature."""
    ns, bs = stores.namespace, stores.buckets
    t = DAY0 + 7 * M
    bases = ["a", "ab", "a-b", "b", "é", "z9", "Z", "m"]
    values = [5, 5, 7, -2, 5, 0, 7, 1]  # ties, a negative, a zero
    rows = [(b, MINUTE, t, v, t + M) for b, v in zip(bases, values, strict=True)]
    rows += [(f"{b} country=BR", MINUTE, t, v * 10, t + M) for b, v in zip(bases[:5], values, strict=False)]
    rows += [(f"{b} country=BR device=tv", MINUTE, t, 3, t + M) for b in ("b", "a")]
    rows += [("a country=US", MINUTE, t, 4, t + M), ("a", MINUTE, t + M, 9, t + 2 * M), ("a", HOUR, DAY0, 14, t + M)]
    random.Random(5).shuffle(rows)
    assert all(stores.run(bs.write_buckets(ns, rows)))
    stores.run(bs.write_buckets(f"{ns}_x", [("a", MINUTE, t, 99, t + M), ("q country=BR", MINUTE, t, 1, t + M)]))

    expected = sorted(zip(bases, values, strict=True), key=lambda e: (-e[1], e[0]))
    assert _ranks(stores, "", MINUTE, t) == expected
    assert _ranks(stores, "country=BR", MINUTE, t) == sorted(
        ((b, v * 10) for b, v in zip(bases[:5], values, strict=False)), key=lambda e: (-e[1], e[0]))
    assert _ranks(stores, "country=BR device=tv", MINUTE, t) == [("a", 3), ("b", 3)]
    assert _ranks(stores, "country=US", MINUTE, t) == [("a", 4)]
    assert _ranks(stores, "", MINUTE, t + M) == [("a", 9)] and _ranks(stores, "", HOUR, DAY0) == [("a", 14)]
    for empty in (("", MINUTE, t + 2 * M), ("", HOUR, DAY0 + 3600 * S), ("", DAY, DAY0), ("device=tv", MINUTE, t),
                  ("country=B", MINUTE, t)):
        assert _ranks(stores, *empty) == [], empty
    assert _ranks(stores, "", MINUTE, t, f"{ns}_x") == [("a", 99)]
    assert _ranks(stores, "country=BR", MINUTE, t, f"{ns}_x") == [("q", 1)]
    for limit in (1, 2, 3, 7, 8, 9):  # pages end inside ties and between them, either way
        assert _paged(stores, "", MINUTE, t, limit) == expected, limit
        assert _paged(stores, "", MINUTE, t, limit, ascending=True) == expected[::-1], limit
    # several pages in one call, in order; a zero limit reads nothing
    got = stores.run(bs.read_ranks_many(ns, [("", MINUTE, t, (5, "a"), 2), ("country=US", MINUTE, t, None, 5),
                                             ("", MINUTE, t, (7, "Z"), 1), ("", MINUTE, t, None, 0),
                                             ("", MINUTE, t, (-2, "b"), 5)]))
    assert got == [[("ab", 5), ("é", 5)], [("a", 4)], [("a-b", 7)], [], []]
    back = stores.run(bs.read_ranks_many(ns, [RankPage("", MINUTE, t, None, 3, True),
                                              RankPage("", MINUTE, t, (5, "é"), 2, True),
                                              RankPage("country=BR", MINUTE, t, (-20, "b"), 2, True),
                                              RankPage("", MINUTE, t, (7, "Z"), 4, True)]))
    assert back == [[("b", -2), ("z9", 0), ("m", 1)], [("ab", 5), ("a", 5)], [("é", 50), ("ab", 50)], []]
    assert stores.run(bs.read_ranks_many(ns, [])) == []


def test_rank_entries_move_forward_with_their_buckets(stores: Stores) -> None:
    ns, bs = stores.namespace, stores.buckets
    t = DAY0 + 3 * M
    stores.run(bs.write_buckets(ns, [("a country=BR", MINUTE, t, 5, t + 10), ("b country=BR", MINUTE, t, 6, t + 10)]))
    assert stores.run(bs.write_buckets(ns, [("a country=BR", MINUTE, t, 50, t + 9)])) == [False]  # earlier: refused
    assert _ranks(stores, "country=BR", MINUTE, t) == [("b", 6), ("a", 5)]
    assert stores.run(bs.write_buckets(ns, [("a country=BR", MINUTE, t, 8, t + 20)])) == [True]  # later: replaces
    assert _ranks(stores, "country=BR", MINUTE, t) == [("a", 8), ("b", 6)]  # the old entry is gone
    # the same bucket twice in one call: the later boundary's value stays, once
    stores.run(bs.write_buckets(ns, [("b country=BR", MINUTE, t, 1, t + 30), ("b country=BR", MINUTE, t, 9, t + 40)]))
    assert _ranks(stores, "country=BR", MINUTE, t) == [("b", 9), ("a", 8)]
    assert stores.run(bs.write_buckets(ns, [("b country=BR", MINUTE, t, 9, t + 50)])) == [True]  # same value: one entry
    assert _ranks(stores, "country=BR", MINUTE, t) == [("b", 9), ("a", 8)]
    [[bucket]] = stores.run(bs.read_buckets_many(ns, [("b country=BR", MINUTE, t, t + M)]))
    assert bucket == (t, 9, t + 50)


def test_retention_drops_rank_entries_with_their_buckets(stores: Stores) -> None:
    ns, bs = stores.namespace, stores.buckets
    day = 86400 * S
    minutes = [DAY0 - day + k * 90 * M for k in range(32)]  # the day before DAY0 and the day after: 2 slices
    rows = [(c, MINUTE, t, i + 1, t + M) for i, t in enumerate(minutes) for c in ("a", "b country=BR")]
    rows += [("a", HOUR, DAY0 - 3600 * S, 60, DAY0)]
    stores.run(bs.write_buckets(ns, rows))
    stores.run(bs.write_buckets(f"{ns}_x", [("a", MINUTE, minutes[0], 1, minutes[0] + M)]))
    cutoff = DAY0 + 3 * 3600 * S  # slice-aligned cutoffs drop whole slices; this one also cuts into the next
    stores.run(bs.drop_expired(ns, MINUTE, DAY0))
    stores.run(bs.drop_expired(ns, MINUTE, cutoff))
    for i, t in enumerate(minutes):
        kept = t + M > cutoff
        assert _ranks(stores, "", MINUTE, t) == ([("a", i + 1)] if kept else []), t
        assert _ranks(stores, "country=BR", MINUTE, t) == ([("b", i + 1)] if kept else []), t
    assert _ranks(stores, "", HOUR, DAY0 - 3600 * S) == [("a", 60)]  # other granularities and namespaces stay
    assert _ranks(stores, "", MINUTE, minutes[0], f"{ns}_x") == [("a", 1)]
    # buckets written again after retention rank again
    assert stores.run(bs.write_buckets(ns, [("a", MINUTE, minutes[-1], 77, minutes[-1] + 2 * M)])) == [True]
    assert _ranks(stores, "", MINUTE, minutes[-1]) == [("a", 77)]


# -- rollup store ---------------------------------------------------------------------------------


def test_rollups_only_move_forward(stores: Stores) -> None:
    ns, rs = stores.namespace, stores.rollups
    assert stores.run(rs.get(ns, "c")) is None
    assert stores.run(rs.write_rollup(ns, "c", 10, 1000)) is True  # creates the row
    assert stores.run(rs.write_rollup(ns, "c", 99, 999)) is False  # older: refused
    assert stores.run(rs.write_rollup(ns, "c", 99, 1000)) is False  # same boundary: refused
    assert stores.run(rs.get(ns, "c")) == RollupState(10, 1000, 0)
    assert stores.run(rs.write_rollup(ns, "c", 12, 2000)) is True
    assert stores.run(rs.get(ns, "c")) == RollupState(12, 2000, 0)


def test_write_rollups_is_write_rollup_per_item(stores: Stores) -> None:
    ns, rs = stores.namespace, stores.rollups
    assert stores.run(rs.write_rollup(ns, "b", 5, 2000))
    applied = stores.run(rs.write_rollups(ns, [("a", 1, 1000), ("b", 6, 1500), ("c", 3, 3000), ("b", 7, 2500)]))
    assert applied == [True, False, True, True]  # b: older refused, then later applied
    got = stores.run(rs.get_many([(ns, "a"), (ns, "b"), (ns, "c")]))
    assert got == {(ns, "a"): RollupState(1, 1000, 0), (ns, "b"): RollupState(7, 2500, 0),
                   (ns, "c"): RollupState(3, 3000, 0)}
    assert stores.run(rs.write_rollups(ns, [])) == []


def test_last_write_keeps_the_max_and_stale_finds_pending_counters(stores: Stores) -> None:
    ns, rs = stores.namespace, stores.rollups
    stores.run(rs.bump_last_write([(ns, "a", 500), (ns, "a", 300), (ns, "b", 100)]))
    stores.run(rs.bump_last_write([(ns, "a", 400)]))
    assert stores.run(rs.get(ns, "a")) == RollupState(0, 0, 500)  # row created as (0, 0), max kept
    assert stores.run(rs.get(ns, "b")).last_write_ts == 100
    stale = set(stores.run(rs.stale(limit=1000)))
    assert {(ns, "a"), (ns, "b")} <= stale
    stores.run(rs.write_rollup(ns, "b", 4, 100))  # caught up
    stores.run(rs.write_rollup(ns, "a", 7, 450))  # still behind
    stale = set(stores.run(rs.stale()))
    assert (ns, "a") in stale and (ns, "b") not in stale
    assert stores.run(rs.get(ns, "a")) == RollupState(7, 450, 500)
    stores.run(rs.bump_last_write([(ns, "b", 50)]))  # older event time: no change, not stale
    assert stores.run(rs.get(ns, "b")) == RollupState(4, 100, 100)


def test_stale_rotates_through_all_pending_counters(stores: Stores) -> None:
    ns, rs = stores.namespace, stores.rollups
    pending = {(ns, f"c{i:02d}") for i in range(25)}
    stores.run(rs.bump_last_write([(n, c, 10) for n, c in pending]))
    seen: set[tuple[str, str]] = set()
    for _ in range(4):
        batch = [k for k in stores.run(rs.stale(limit=10)) if k[0] == ns]
        assert len(batch) == len(set(batch))
        seen |= set(batch)
    assert seen == pending


def test_min_rollup_ts_bounds_retention(stores: Stores) -> None:
    ns, rs = stores.namespace, stores.rollups
    assert stores.run(rs.min_rollup_ts(ns)) == 0
    stores.run(rs.bump_last_write([(ns, "a", 90), (ns, "b", 500)]))
    assert stores.run(rs.min_rollup_ts(ns)) == 0  # both pending, never rolled up
    stores.run(rs.write_rollup(ns, "a", 1, 100))  # a converged at 100
    stores.run(rs.write_rollup(ns, "b", 1, 400))  # b still pending above 400
    assert stores.run(rs.min_rollup_ts(ns)) == 400
    stores.run(rs.write_rollup(ns, "b", 2, 600))  # all converged: the newest rollup bounds it
    assert stores.run(rs.min_rollup_ts(ns)) == 600


def test_newest_rollup_ts_is_the_latest_rollup_of_any_counter(stores: Stores) -> None:
    """What admission keeps events after (a raised accept_limit): pending counters' rollups count as converged ones."""
    ns, rs = stores.namespace, stores.rollups
    assert stores.run(rs.newest_rollup_ts(ns)) == 0
    stores.run(rs.bump_last_write([(ns, "a", 90), (ns, "b", 900)]))
    stores.run(rs.write_rollup(ns, "a", 1, 100))  # converged at 100
    assert stores.run(rs.newest_rollup_ts(ns)) == 100
    stores.run(rs.write_rollup(ns, "b", 1, 400))  # pending above 400
    assert stores.run(rs.newest_rollup_ts(ns)) == 400
    stores.run(rs.write_rollup(ns, "b", 2, 950))  # converged at 950
    assert stores.run(rs.newest_rollup_ts(ns)) == 950
    assert stores.run(rs.newest_rollup_ts(f"{ns}_other")) == 0


def test_pending_rollups_start_a_never_rolled_up_counter_at_its_last_write(stores: Stores) -> None:
    """The operator's figure: where the oldest un-rolled-up work starts. A counter never rolled up counts from its
    last write, not from 0 (which min_rollup_ts, the retention bound, must keep)."""
    ns, rs = stores.namespace, stores.rollups
    empty = f"{ns}_none"
    assert stores.run(rs.pending_rollups([ns, empty])) == {ns: PendingRollups(), empty: PendingRollups()}
    stores.run(rs.bump_last_write([(ns, "done", 100), (ns, "new", 500)]))
    stores.run(rs.write_rollup(ns, "done", 1, 100))  # converged: not pending, however old its rollup
    assert stores.run(rs.pending_rollups([ns])) == {ns: PendingRollups(1, 500, False)}
    assert stores.run(rs.min_rollup_ts(ns)) == 0  # retention still waits for "new"
    stores.run(rs.bump_last_write([(ns, "done", 900)]))  # pending again since 900, rolled up to 100
    # Where work starts lies between a pending counter's rollup_ts and its first write since: SQLite keeps that write
    # (the oldest is then "new" at 500), Cassandra only the rollup_ts ("done" at 100).
    sqlite = isinstance(rs, SqliteRollupStore)
    assert stores.run(rs.pending_rollups([ns, ns])) == {ns: PendingRollups(2, 500 if sqlite else 100, False)}
    stores.run(rs.write_rollup(ns, "done", 2, 900))
    stores.run(rs.write_rollup(ns, "new", 3, 400))  # rolled up, still short of its last write
    assert stores.run(rs.pending_rollups([ns])) == {ns: PendingRollups(1, 500 if sqlite else 400, False)}
    assert stores.run(rs.pending_rollups([])) == {}


def test_pending_rollups_are_capped_per_namespace_and_leave_the_sweep_alone(stores: Stores) -> None:
    ns, rs = stores.namespace, stores.rollups
    crowd, few = f"{ns}_a", f"{ns}_b"  # the crowd sorts first: it must not hide the few
    stores.run(rs.bump_last_write([(crowd, f"c{i:02d}", 10) for i in range(40)]))
    stores.run(rs.bump_last_write([(few, f"c{i}", 20 + i) for i in range(3)]))
    first = [k for k in stores.run(rs.stale(limit=10)) if k[0] in (crowd, few)]
    for _ in range(2):  # the same figures every time: not a rotating slice
        got = stores.run(rs.pending_rollups([crowd, few], limit=20))
        assert got == {crowd: PendingRollups(20, 10, True), few: PendingRollups(3, 20, False)}
    after = [k for k in stores.run(rs.stale(limit=10)) if k[0] in (crowd, few)]
    assert first and after and not set(first) & set(after)  # the sweep went on where it was
    assert stores.run(rs.pending_rollups([few], limit=3)) == {few: PendingRollups(3, 20, False)}
    capped = stores.run(rs.pending_rollups([few], limit=2))[few]  # its oldest: of the two counted
    assert (capped.counters, capped.truncated) == (2, True) and capped.oldest_us in (20, 21, 22)


def test_watermarks_never_move_backwards(stores: Stores) -> None:
    rs, topic = stores.rollups, f"topic-{stores.namespace}"
    assert stores.run(rs.watermarks(topic)) == {}
    stores.run(rs.set_watermarks(topic, {0: 100, 1: 200}))
    stores.run(rs.set_watermarks(topic, {0: 50, 1: 300, 2: 10}))
    assert stores.run(rs.watermarks(topic)) == {0: 100, 1: 300, 2: 10}
    assert stores.run(rs.watermarks(topic + "-other")) == {}


def test_a_claim_fences_the_publications_of_earlier_claims(stores: Stores) -> None:
    """A worker given a partition claims it before loading what was published there: what an earlier claimant
    publishes afterwards (a worker the group dropped while it stalled) is refused, on that partition only, for every
    key of the topic; the claimant's own publications apply, never backwards, and read back with unfenced ones."""
    rs, topic = stores.rollups, f"topic-{stores.namespace}"
    floor_key = f"{topic}/arrival-floor"
    first = stores.run(rs.claim_partitions(topic, [0, 1]))
    assert stores.run(rs.set_watermarks(floor_key, {0: 100, 1: 100}, claims=first)) == set()
    assert stores.run(rs.set_watermarks(topic, {0: 90, 1: 90}, claims=first)) == set()
    second = stores.run(rs.claim_partitions(topic, [0]))  # partition 0 changes hands
    assert second[0] != first[0]
    assert stores.run(rs.set_watermarks(floor_key, {0: 200, 1: 200}, claims=first)) == {0}
    assert stores.run(rs.set_watermarks(topic, {0: 190}, claims=first)) == {0}
    assert stores.run(rs.watermarks(floor_key)) == {0: 100, 1: 200}
    assert stores.run(rs.watermarks(topic)) == {0: 90, 1: 90}
    assert stores.run(rs.set_watermarks(floor_key, {0: 150}, claims=second)) == set()
    assert stores.run(rs.set_watermarks(floor_key, {0: 120}, claims=second)) == set()  # applies, never backwards
    stores.run(rs.set_watermarks(floor_key, {0: 170, 2: 5}))  # unfenced writes (tools, tests) are not refused
    assert stores.run(rs.watermarks(floor_key)) == {0: 170, 1: 200, 2: 5}
    assert stores.run(rs.set_watermarks(topic, {2: 1}, claims={2: 1})) == {2}  # a claim the store never gave
    stores.run(rs.claim_partitions(f"{topic}-other", [0]))  # claims are per topic: this one's stay
    assert stores.run(rs.set_watermarks(floor_key, {0: 180}, claims=second)) == set()
    with pytest.raises(ValueError, match="no claim"):
        stores.run(rs.set_watermarks(topic, {0: 1, 1: 1}, claims=second))


def test_a_store_has_one_identity_for_every_process_on_it(stores: Stores) -> None:
    """What the rollup cache's keys carry (`sinks.cache.open_cache`): the first caller draws it, racing callers and
    later ones read the same, and claims leave it alone."""
    async def race() -> list[str]:
        return list(await asyncio.gather(*(stores.rollups.identity() for _ in range(3))))

    ids = stores.run(race())
    assert len(set(ids)) == 1 and re.fullmatch("[0-9a-f]{16}", ids[0]), ids
    stores.run(stores.rollups.claim_partitions(f"topic-{stores.namespace}", [0, 1]))
    assert stores.run(stores.rollups.identity()) == ids[0]


def test_sqlite_identity_is_the_file_s(tmp_path: Path) -> None:
    """Another process's store on the same file reads the identity the first drew; a fresh file has another."""
    first, same, fresh = (SqliteRollupStore(tmp_path / name) for name in ("a.sqlite3", "a.sqlite3", "b.sqlite3"))
    try:
        drawn = asyncio.run(first.identity())
        assert asyncio.run(same.identity()) == drawn != asyncio.run(fresh.identity())
    finally:
        for store in (first, same, fresh):
            asyncio.run(store.close())


def test_racing_claims_differ_and_only_the_latest_publishes(stores: Stores) -> None:
    rs, topic = stores.rollups, f"topic-{stores.namespace}"

    async def race() -> list[dict[int, int]]:
        return list(await asyncio.gather(*(rs.claim_partitions(topic, [0, 3]) for _ in range(3))))

    claims = stores.run(race())
    assert len({c[0] for c in claims}) == 3 and len({c[3] for c in claims}) == 3
    refused = [stores.run(rs.set_watermarks(topic, {0: 10 + i, 3: 10 + i}, claims=c)) for i, c in enumerate(claims)]
    # latest per partition: on Cassandra each partition's claim is a transaction of its own, so the racers may end
    # with one holding partition 0 and another partition 3
    latest = {p: [i for i, r in enumerate(refused) if p not in r] for p in (0, 3)}
    assert all(len(holders) == 1 for holders in latest.values()), refused
    assert stores.run(rs.watermarks(topic)) == {p: 10 + holders[0] for p, holders in latest.items()}


def test_cassandra_marks_of_a_partition_claimed_elsewhere_since_are_read(stores: Stores) -> None:
    """Cassandra keeps each partition's claim and marks in a partition of its own and lists the claimed partitions:
    a reader (another process's store) finds a partition claimed after its last read, under every key."""
    from sinks.cassandra.rollups import CassandraRollupStore

    if not isinstance(stores.rollups, CassandraRollupStore):
        pytest.skip("Cassandra's layout of claims")
    rs, topic = stores.rollups, f"topic-{stores.namespace}"
    floor_key = f"{topic}/arrival-floor"
    reader = CassandraRollupStore(rs._x)  # another process: its own list of claimed partitions, the same session
    assert stores.run(reader.watermarks(topic)) == {}
    first = stores.run(rs.claim_partitions(topic, [0]))
    assert stores.run(rs.set_watermarks(topic, {0: 100}, claims=first)) == set()
    assert stores.run(reader.watermarks(topic)) == {0: 100}
    later = stores.run(rs.claim_partitions(topic, [5, 2]))
    assert stores.run(rs.set_watermarks(floor_key, {5: 70, 2: 80}, claims=later)) == set()
    assert stores.run(rs.set_watermarks(topic, {5: 50, 2: 60}, claims=later)) == set()
    assert stores.run(reader.watermarks(floor_key)) == {5: 70, 2: 80}
    assert stores.run(reader.watermarks(topic)) == {0: 100, 5: 50, 2: 60}


def test_get_many_and_delete(stores: Stores) -> None:
    ns, rs = stores.namespace, stores.rollups
    for i in range(5):
        stores.run(rs.write_rollup(ns, f"c{i}", i * 10, 1000 + i))
    keys = [(ns, f"c{i}") for i in range(7)]
    got = stores.run(rs.get_many(keys))
    assert got == {(ns, f"c{i}"): RollupState(i * 10, 1000 + i, 0) for i in range(5)}
    assert stores.run(rs.get_many([])) == {}
    assert stores.run(rs.delete(ns, "c0")) == 1
    assert stores.run(rs.get(ns, "c0")) is None
    assert stores.run(rs.delete(ns)) == 4
    assert stores.run(rs.get_many(keys)) == {}


# -- the combination registry (dimensions) ---------------------------------------------------------


def _pages(stores: Stores, counter: str, limit: int, **kw: object) -> list[str]:
    """Every combination of `counter` (with the filters in kw), page by page."""
    out: list[str] = []
    after = None
    while True:
        page = stores.run(stores.rollups.combinations(stores.namespace, counter, after=after, limit=limit, **kw))
        assert len(page) <= limit
        out += page
        if len(page) < limit:
            return out
        after = page[-1]


def test_combinations_are_registered_once_and_listed_in_order(stores: Stores) -> None:
    ns, rs = stores.namespace, stores.rollups
    assert stores.run(rs.combinations(ns, "views")) == []
    names = ["views country=US", "views device=tv", "views country=US device=tv", "views country=FR",
             "views country=FR device=tv", "views country=\u00e9t\u00e9", "views country=\U0001f600",
             "views country=\uffef device=tv"]
    stores.run(rs.register_combinations(ns, [("views", n) for n in names]))
    stores.run(rs.register_combinations(ns, [("views", names[0]), ("views", names[0])]))  # idempotent
    stores.run(rs.register_combinations(ns, [("plays", "plays country=US")]))
    stores.run(rs.register_combinations(ns, []))
    expected = sorted(names)  # code point order: the UTF-8 byte order both backends keep
    assert stores.run(rs.combinations(ns, "views")) == expected
    for limit in (1, 2, 3, 8, 100):
        assert _pages(stores, "views", limit) == expected
    assert stores.run(rs.combinations(ns, "plays")) == ["plays country=US"]
    assert stores.run(rs.combinations(ns + "x", "views")) == []
    assert stores.run(rs.combinations(ns, "views", limit=0)) == []
    assert stores.run(rs.delete(ns)) == 0  # deleting rollups leaves the registry alone
    assert stores.run(rs.combinations(ns, "views")) == expected


def test_combinations_by_prefix(stores: Stores) -> None:
    ns, rs = stores.namespace, stores.rollups
    names = ["v a=1", "v a=1 b=2", "v a=10", "v a=1\U0010ffff", "v a=2 b=2", "v b=1", "v a=\U0010ffff b=1"]
    stores.run(rs.register_combinations(ns, [("v", n) for n in names]))
    for prefix in ("v a=1", "v a=", "v a=1 b=", "v b=", "v c=", "v a=\U0010ffff", "v", ""):
        expected = sorted(n for n in names if n.startswith(prefix))
        assert stores.run(rs.combinations(ns, "v", prefix=prefix)) == expected, prefix
        for limit in (1, 2):
            assert _pages(stores, "v", limit, prefix=prefix) == expected, (prefix, limit)
    # `after` below the prefix starts at the prefix; after it, strictly after
    assert stores.run(rs.combinations(ns, "v", prefix="v a=2", after="v a=")) == ["v a=2 b=2"]
    assert stores.run(rs.combinations(ns, "v", prefix="v a=1", after="v a=1 b=2")) == ["v a=10", "v a=1\U0010ffff"]


def test_full_combinations_stay_full(stores: Stores) -> None:
    ns, rs = stores.namespace, stores.rollups
    stores.run(rs.register_combinations(ns, [("v", "v a=1"), ("v", "v a=1 b=1"), ("v", "v b=1")]))
    stores.run(rs.register_combinations(ns, [("v", "v a=1 b=1")], full=True))
    stores.run(rs.register_combinations(ns, [("v", "v a=2")], full=True))  # full on its first registration
    stores.run(rs.register_combinations(ns, [("v", "v a=1 b=1"), ("v", "v a=2")]))  # not unset by a plain one
    assert stores.run(rs.combinations(ns, "v", full_only=True)) == ["v a=1 b=1", "v a=2"]
    assert stores.run(rs.combinations(ns, "v")) == ["v a=1", "v a=1 b=1", "v a=2", "v b=1"]
    many = [("w", f"w k={i:03d}") for i in range(40)]
    stores.run(rs.register_combinations(ns, many))
    stores.run(rs.register_combinations(ns, many[::7], full=True))
    full = [c for _, c in many[::7]]
    assert stores.run(rs.combinations(ns, "w", full_only=True)) == full
    assert _pages(stores, "w", 2, full_only=True) == full
    assert stores.run(rs.combinations(ns, "w", full_only=True, limit=3)) == full[:3]


# -- SQLite specifics -----------------------------------------------------------------------------


def _vm_steps(db: Path, table: str, args: tuple[object, ...]) -> tuple[list, int]:
    """Result and SQLite VM instructions (in units of 10) of the aggregate statement: a cost measure
    that does not depend on machine speed."""
    conn = sqlite3.connect(db)
    steps = 0

    def tick() -> int:
        nonlocal steps
        steps += 1
        return 0
    conn.set_progress_handler(tick, 10)
    try:
        (row,) = conn.execute(bulk_statement(aggregate_statement(table), 1), args).fetchone()
    finally:
        conn.close()
    return orjson.loads(row), steps


def test_sqlite_aggregate_cost_depends_only_on_new_events(tmp_path: Path) -> None:
    es = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: PART)

    async def body() -> None:
        old = BASE + 10 * S
        for start in range(0, 200_000, 10_000):  # a counter with 200k old (rolled-up) events
            await es.write_events([ev("ns", old + i, f"o{i}", 1, counter="big") for i in range(start, start + 10_000)])
        recent = BASE + 40 * S  # same slice, even the same kind of bucket range
        await es.write_events([ev("ns", recent + i, f"r{i}", 1, counter=c) for i in range(10) for c in ("big", "tiny")])
        await es.write_events([ev("ns", recent + 5, "clr", clear=True, counter="big")])
        for counter in ("big", "tiny"):
            agg = await es.aggregate("ns", counter, recent - 1, recent + S)
            assert agg.delta == (4 if counter == "big" else 10)
        plan = await es.query_plan("ns", "big", recent - 1, recent + S)
        # the windows' list, or a scan's own rows on their way into its JSON row; never an events table
        scans = [line for line in plan if line.startswith("SCAN")]
        assert plan and all(line in ("SCAN k", "SCAN c", "SCAN (subquery-1)")
                            or line.endswith(("CONSTANT ROW", "CONSTANT ROWS")) for line in scans), plan
        assert not any("TEMP B-TREE" in line for line in plan), plan  # pages come off the primary key, unsorted
        assert any("USING PRIMARY KEY" in line and "(time_bucket,event_time)>(?,?)" in line for line in plan), plan
        ((table, _, _),) = await es.slices("ns")
        args = (recent - 1, recent + S, PART.time_bucket(recent), PART.time_bucket(recent + S), PART.bucket_us)
        ((_, _, (big_high, big_low, _)),), big_steps = _vm_steps(es.path, table, (0, "ns", "big", *args))
        ((_, _, (tiny_high, tiny_low, _)),), tiny_steps = _vm_steps(es.path, table, (0, "ns", "tiny", *args))
        assert (join_halves(big_high, big_low), join_halves(tiny_high, tiny_low)) == (4, 10)
        assert big_steps <= tiny_steps + 2, (big_steps, tiny_steps)  # 200k old events cost nothing
        await es.close()
    asyncio.run(body())


def _fifty_events(tmp_path: Path) -> tuple[sqlite3.Connection, str]:
    """A file with 50 events of counter "c", one a second from BASE, all in one slice: a connection and its table."""
    es = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: PART)
    asyncio.run(es.write_events([ev("ns", BASE + i * S, f"e{i}", 1) for i in range(50)]))
    ((table, _, _),) = asyncio.run(es.slices("ns"))[:1]
    asyncio.run(es.close())
    return sqlite3.connect(tmp_path / "events.sqlite3"), table


def test_sqlite_bucket_sums_read_the_range_by_primary_key(tmp_path: Path) -> None:
    conn, table = _fifty_events(tmp_path)
    try:
        args = (0, "ns", "c", BASE, BASE + 30 * S, PART.time_bucket(BASE), PART.time_bucket(BASE + 30 * S), 60 * S)
        plans, found = [], []
        for split in (False, True):  # SQLite's SUM, and the sums of halves used once a sum leaves int64
            sql = bulk_statement(bucket_sums_statement(table, split), 1)
            plans.append([r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args)])
            ((rows,),) = conn.execute(sql, args).fetchall()
            found.append(orjson.loads(rows))
    finally:
        conn.close()
    for plan in plans:
        events_reads = [line for line in plan if table in line and f"USING INDEX {table}_clears" not in line]
        assert events_reads and all("USING PRIMARY KEY" in line and "(time_bucket,event_time)>(?,?)" in line
                                    for line in events_reads), plan
        assert not any(line.startswith(f"SCAN {table}") for line in plan), plan
    assert found == [[[0, [[BASE, None, 30, None, 30]]]],  # [bucket, NULL, sum, clear, events]
                     [[0, [[BASE, 0, 30, None, 30]]]]]  # the sum as its high and low halves


def test_sqlite_contains_seeks_each_identity_by_primary_key(tmp_path: Path) -> None:
    conn, table = _fifty_events(tmp_path)
    try:
        sql = bulk_statement(contains_statement(table), 4)
        args = [v for i in range(4) for v in (i, "ns", "c", PART.time_bucket(BASE + i * S), BASE + i * S, f"e{i}", "")]
        plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args)]
        ((found,),) = conn.execute(sql, [*args[:-1], "other"]).fetchall()
    finally:
        conn.close()
    assert ("SEARCH e USING PRIMARY KEY (namespace=? AND counter=? AND time_bucket=? AND event_time=? AND event_id=? "
            "AND event_item_key=?)") in plan, plan
    assert not any(line.startswith(f"SCAN {table}") or line == "SCAN e" for line in plan), plan
    assert orjson.loads(found) == [[0], [1], [2]]  # the fourth has another item key


def test_sqlite_counters_skip_from_name_to_name_by_primary_key(tmp_path: Path) -> None:
    conn, table = _fifty_events(tmp_path)
    try:
        args = {"ns": "ns", "from": "", "limit": 10, "upto": None}
        plans = [[r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + counters_statement(table, after=after), args)]
                 for after in (False, True)]
    finally:
        conn.close()
    for plan in plans:
        reads = [line for line in plan if table in line]
        assert len(reads) == 2 and all(f"SEARCH {table} USING PRIMARY KEY (namespace=? AND counter>?)" == line
                                       for line in reads), plan


def test_sqlite_pending_rollups_read_the_pending_index_only(tmp_path: Path) -> None:
    """The operator view's figures, every few seconds: one range of the partial index of pending rows per
    namespace, at most the limit (and a row lookup each), never the namespace's converged rows."""
    from sinks.sqlite.rollups import _PENDING

    rs = SqliteRollupStore(tmp_path / "rollups.sqlite3")
    asyncio.run(rs.bump_last_write([("ns", "c", 10)]))
    asyncio.run(rs.close())
    conn = sqlite3.connect(tmp_path / "rollups.sqlite3")
    try:
        plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + _PENDING, ("ns", 10_001))]
    finally:
        conn.close()
    reads = [line for line in plan if "rollups" in line]
    assert reads == ["SEARCH rollups USING INDEX rollups_stale (namespace=?)"], plan


def test_sqlite_buckets_refuse_a_file_of_another_layout(tmp_path: Path) -> None:
    from sinks import SqliteBucketStore

    path = tmp_path / "buckets.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 7")
    conn.close()
    bs = SqliteBucketStore(path)
    with pytest.raises(RuntimeError, match="layout 7"):
        asyncio.run(bs.clears("ns", ["c"]))
    asyncio.run(bs.close())


_LAYOUT_1 = """
CREATE TABLE buckets (
    namespace TEXT NOT NULL, counter TEXT NOT NULL, granularity TEXT NOT NULL, start_us INTEGER NOT NULL,
    value INTEGER NOT NULL, computed_upto INTEGER NOT NULL,
    PRIMARY KEY (namespace, counter, granularity, start_us)) WITHOUT ROWID;
CREATE INDEX buckets_expiry ON buckets (namespace, granularity, start_us);
CREATE TABLE bucket_slices (namespace TEXT NOT NULL, granularity TEXT NOT NULL, slice INTEGER NOT NULL,
    PRIMARY KEY (namespace, granularity, slice)) WITHOUT ROWID;
CREATE TABLE bucket_clears (namespace TEXT NOT NULL, counter TEXT NOT NULL, clear_us INTEGER NOT NULL,
    PRIMARY KEY (namespace, counter)) WITHOUT ROWID;
PRAGMA user_version = 1;
"""


def test_sqlite_buckets_of_layout_1_are_ranked_after_the_upgrade(tmp_path: Path) -> None:
    """A file written before rank lists (layout 1) is upgraded in place: its buckets rank at once, new writes too."""
    from sinks import SqliteBucketStore

    path = tmp_path / "buckets.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(_LAYOUT_1)
    conn.executemany("INSERT INTO buckets VALUES ('ns', ?, 'minute', ?, ?, ?)",
                     [("a", DAY0, 3, DAY0 + M), ("b country=BR", DAY0, 4, DAY0 + M), ("b", DAY0, 8, DAY0 + M)])
    conn.commit()
    conn.close()
    bs = SqliteBucketStore(path)

    async def body() -> None:
        assert await bs.read_ranks_many("ns", [("", MINUTE, DAY0, None, 5), ("country=BR", MINUTE, DAY0, None, 5)]
                                        ) == [[("b", 8), ("a", 3)], [("b", 4)]]
        assert await bs.write_buckets("ns", [("a", MINUTE, DAY0, 9, DAY0 + 2 * M)]) == [True]
        assert await bs.read_ranks_many("ns", [("", MINUTE, DAY0, None, 5)]) == [[("a", 9), ("b", 8)]]
        await bs.close()
    asyncio.run(body())
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA user_version").fetchone() == (2,)
    check.close()
    again = SqliteBucketStore(path)  # opening an upgraded file changes nothing
    assert asyncio.run(again.read_ranks_many("ns", [("", MINUTE, DAY0, None, 1)])) == [[("a", 9)]]
    asyncio.run(again.close())


def test_sqlite_rank_pages_seek_the_rank_index(tmp_path: Path) -> None:
    """A page of a rank list is an index seek, wherever it starts: its cost does not grow with the list's length."""
    from sinks import SqliteBucketStore
    from sinks.sqlite.buckets import _FIRST_PAGES, _LAST_PAGES, _NEXT_PAGES, _PREVIOUS_PAGES

    path = tmp_path / "buckets.sqlite3"
    bs = SqliteBucketStore(path)
    asyncio.run(bs.write_buckets("ns", [(f"c{i} country=BR", MINUTE, DAY0, i % 50, DAY0 + M) for i in range(5000)]))
    asyncio.run(bs.close())
    conn = sqlite3.connect(path)
    try:
        page = (0, "ns", "country=BR", "minute", DAY0, 10)
        after = (*page, 7, "c7 country=BR")
        seek = "SEARCH buckets USING INDEX bucket_ranks (namespace=? AND signature=? AND granularity=? AND start_us=?"
        for stmt, args in ((_FIRST_PAGES, page), (_LAST_PAGES, page), (_NEXT_PAGES, after), (_PREVIOUS_PAGES, after)):
            plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + bulk_statement(stmt, 1), args)]
            reads = [line for line in plan if "buckets" in line]
            assert reads and all(line.startswith(seek) for line in reads), plan
            assert "TEMP B-TREE" not in " ".join(plan), plan  # no sort: the index's order
        steps = []
        for value in (49, 25, 1):  # deep pages cost what the first does
            n = 0

            def tick() -> int:
                nonlocal n
                n += 1
                return 0
            conn.set_progress_handler(tick, 10)
            ((found,),) = conn.execute(bulk_statement(_NEXT_PAGES, 1), (*page, value, "c0 country=BR")).fetchall()
            ((_, tie, below),) = orjson.loads(found)
            assert len(tie) == 10 and len(below) == 10
            steps.append(n)
        assert max(steps) <= min(steps) + 5, steps
    finally:
        conn.close()


def test_sqlite_partitioning_is_pinned_on_first_write(tmp_path: Path) -> None:
    path = tmp_path / "events.sqlite3"
    first = SqliteEventStore(path, lambda ns: PART)
    asyncio.run(first.write_events([ev("ns", BASE + 1, "a", 1)]))
    asyncio.run(first.close())
    changed = SqliteEventStore(path, lambda ns: Partitioning(16, 5, 30))  # config changed afterwards
    assert asyncio.run(changed.write_events([ev("ns", BASE + 1, "a", 1)])) == 0  # still the same identity
    assert asyncio.run(changed.aggregate("ns", "c", 0, BASE + S)).delta == 1
    asyncio.run(changed.close())


def _writer_process(directory: str, worker: int, ids: list[int], seed: int, barrier) -> None:
    """One OS process hammering the shared files: overlapping events (each delivered twice),
    last-write bumps, rollups and watermarks, one transaction each."""
    async def body() -> None:
        events, rollups, _buckets = open_stores(f"sqlite://{directory}", Path(directory), lambda ns: PART)
        rng = random.Random(seed)
        await rollups.watermarks("t")  # open both files before the start line
        await events.aggregate("shared", "c0", 0, 1)
        barrier.wait(30)
        for attempt in range(2):
            order = ids[:]
            rng.shuffle(order)
            for start in range(0, len(order), 50):
                chunk = [ev("shared", BASE + (i % 400) * S // 2, f"id{i}", i % 7 - 2, counter=f"c{i % 3}")
                         for i in order[start:start + 50]]
                await events.write_events(chunk)
                await rollups.bump_last_write([(r[0], r[1], r[2]) for r in chunk])
                await rollups.write_rollup("shared", f"w{worker}", start, attempt * 10_000 + start + 1)
                await rollups.set_watermarks("t", {worker: start, 9: rng.randrange(10_000)})
        await events.close()
        await rollups.close()
    asyncio.run(body())


def test_sqlite_two_processes_write_overlapping_batches(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    n = 6000
    plan = {0: list(range(0, 4000)), 1: list(range(2000, n))}  # ids 2000..3999 written by both
    barrier = ctx.Barrier(len(plan))
    procs = [ctx.Process(target=_writer_process, args=(str(tmp_path), w, ids, w, barrier))
             for w, ids in plan.items()]
    for p in procs:
        p.start()
    reader = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: PART)
    seen_while_writing = 0
    while any(p.is_alive() for p in procs):  # a third party (the API) reads during the writes
        seen_while_writing = max(seen_while_writing,
                                 asyncio.run(reader.aggregate("shared", "c0", 0, BASE + 10**4 * S)).events)
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, "a writer process failed (see its traceback above)"

    events, rollups, _buckets = open_stores(f"sqlite://{tmp_path}", tmp_path, lambda ns: PART)

    async def verify() -> None:
        everything: list[EventRow] = []
        for c in ("c0", "c1", "c2"):
            cursor = None
            while page := await events.scan("shared", c, 0, BASE + 10**4 * S, after=cursor, limit=999):
                everything += page
                cursor = (page[-1][2], page[-1][3], page[-1][4])
            agg = await events.aggregate("shared", c, 0, BASE + 10**4 * S)
            assert agg.delta == sum(i % 7 - 2 for i in range(n) if i % 3 == int(c[1]))
        assert sorted(int(r[3][2:]) for r in everything) == list(range(n))  # nothing lost, nothing doubled
        assert (await rollups.watermarks("t"))[0] == 3950 and (await rollups.watermarks("t"))[1] == 3950
        assert (await rollups.get("shared", "w0")).rollup_ts == 13951
        last = max(BASE + (i % 400) * S // 2 for i in range(n) if i % 3 == 0)
        assert (await rollups.get("shared", "c0")).last_write_ts == last
        await events.close()
        await rollups.close()
        await reader.close()
    asyncio.run(verify())
    assert seen_while_writing <= n // 3



def test_sqlite_write_waits_for_a_lock_held_by_another_process(tmp_path: Path) -> None:
    es = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: PART)
    asyncio.run(es.write_events([ev("ns", BASE + 1, "first")]))  # the file and schema exist
    holder = sqlite3.connect(tmp_path / "events.sqlite3", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock for a while

    async def body() -> int:
        write = asyncio.ensure_future(es.write_events([ev("ns", BASE + 2, "second")]))
        await asyncio.sleep(0.5)
        assert not write.done()  # waiting on the busy timeout, not failing
        holder.execute("COMMIT")
        return await write
    try:
        assert asyncio.run(body()) == 1
    finally:
        holder.close()
    assert asyncio.run(es.aggregate("ns", "c", 0, BASE + S)).delta == 2
    asyncio.run(es.close())


def test_sqlite_refuses_a_file_of_another_layout(tmp_path: Path) -> None:
    path = tmp_path / "events.sqlite3"
    with sqlite3.connect(path) as conn:  # the unversioned first layout
        conn.execute("CREATE TABLE event_slices (table_name TEXT PRIMARY KEY, namespace TEXT, slice INTEGER, "
                     "start_us INTEGER, end_us INTEGER)")
    conn.close()
    es = SqliteEventStore(path, lambda ns: PART)
    with pytest.raises(RuntimeError, match="layout 1"):
        asyncio.run(es.aggregate("ns", "c", 0, BASE))
    asyncio.run(es.close())


def test_sqlite_claims_come_to_a_file_made_before_them(tmp_path: Path) -> None:
    """A rollup file from before claims existed keeps its watermarks and takes claims on open."""
    path = tmp_path / "rollups.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE watermarks (topic TEXT NOT NULL, partition INTEGER NOT NULL, mark_us INTEGER NOT "
                     "NULL, PRIMARY KEY (topic, partition)) WITHOUT ROWID")
        conn.execute("INSERT INTO watermarks VALUES ('t', 0, 100)")
    conn.close()

    async def body() -> tuple[set[int], dict[int, int]]:
        rollups = SqliteRollupStore(path)
        try:
            claims = await rollups.claim_partitions("t", [0])
            return await rollups.set_watermarks("t", {0: 200}, claims=claims), await rollups.watermarks("t")
        finally:
            await rollups.close()
    assert asyncio.run(body()) == (set(), {0: 200})


def test_sqlite_claims_never_repeat_after_the_claims_were_lost(tmp_path: Path) -> None:
    """Claims were the previous one + 1 from 1: after the claims table was lost (a file restored from a backup taken
    before, rows deleted by hand) a stale worker's claim equalled the next owner's, and its publications landed."""
    path = tmp_path / "rollups.sqlite3"

    async def body() -> tuple[set[int], dict[int, int]]:
        rollups = SqliteRollupStore(path)
        try:
            stale = await rollups.claim_partitions("t", [0])  # the worker that will stall
            await rollups.set_watermarks("t", {0: 100}, claims=stale)
            with sqlite3.connect(path) as conn:
                conn.execute("DELETE FROM watermark_claims")
            conn.close()
            await rollups.claim_partitions("t", [0])  # the next owner
            return await rollups.set_watermarks("t", {0: 500}, claims=stale), await rollups.watermarks("t")
        finally:
            await rollups.close()
    assert asyncio.run(body()) == ({0}, {0: 100})
