"""Counts whose deltas sum past int64: each delta fits int64 (the API checks it), their sum need not.

* The stores' sums are exact: SQLite sums the deltas' 32-bit halves (its SUM fails with "integer overflow" past
  int64: the rollup batch failed for ever, AddAndGetCount and ACCURATE reads answered 500), Cassandra sums them as
  varint (a bigint sum wraps silently); both against Python's sums, with hypothesis, on many int64 extremes.
* A count kept or answered saturates at the int64 bounds (sinks.model.saturate): the rollup's count, the buckets,
  the live counts and the windows, on the real SQLite stores and CounterService, and on the Cassandra fake.
* One counter whose rollup fails holds back no other (agents.rollup_batches.rollup_many).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sqlite3
import time
from collections.abc import Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.rollup import BackPressure, rollup_counters
from agents.rollup_batches import rollup_many
from control_plane import parse_namespaces
from query_api.service import CounterService
from query_api.windows import window_count
from sinks import (
    Aggregate,
    InProcessRollupCache,
    Partitioning,
    SqliteBucketStore,
    SqliteEventStore,
    SqliteRollupStore,
)
from sinks.model import INT64_MAX, INT64_MIN, join_halves, saturate
from sinks.windows import CHAIN, Granularity, align_down, bucket_sums_of
from tests.unit.test_cassandra_fake import FakeCassandra, fake_bucket_store, fake_stores
from tests.unit.test_read_your_write import KeepingProducer, NoSignals

S = 1_000_000
M = 60 * S
T0 = 1_700_000_040 * S  # a minute and a slice boundary
PART = Partitioning(buckets_per_id=2, seconds_per_bucket=10, seconds_per_slice=60)
# one event bucket per hour, a slice per day: two events of an hour are one SQLite sum, one Cassandra partition sum
REGISTRY = parse_namespaces({"namespaces": {"acc": {
    "counter_type": "ACCURATE", "accept_limit": "5s", "max_clock_skew": "1s",
    "time_partition": {"buckets_per_id": 1, "seconds_per_bucket": 3600, "seconds_per_slice": 86400},
    "windows": {"retention": {"minute": "30d", "hour": "90d", "day": "forever"}},
}}})
NS = REGISTRY["acc"]

# int64 deltas, most of them at or near the extremes: sums leave int64 after two of them
EXTREMES = [INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1, 2**32, -(2**32), 2**32 - 1, 2**31, -(2**31) - 1,
            -1, 0, 1]
deltas = st.one_of(st.sampled_from(EXTREMES), st.integers(INT64_MIN, INT64_MAX))


def now_us() -> int:
    return time.time_ns() // 1000


# -- the halves -------------------------------------------------------------------------------------


@given(st.lists(deltas, min_size=1, max_size=20))
def test_sqlite_halves_rebuild_each_delta_and_their_exact_sum(values: list[int]) -> None:
    """SQLite's >> is arithmetic and & two's complement: high * 2**32 + low is each delta, and the halves' sums
    rebuild the exact sum where SUM(delta) fails."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (d INTEGER NOT NULL)")
    conn.executemany("INSERT INTO t VALUES (?)", [(v,) for v in values])
    for v, high, low in conn.execute("SELECT d, d >> 32, d & 4294967295 FROM t"):
        assert 0 <= low < 2**32 and join_halves(high, low) == v
    (high, low), = conn.execute("SELECT SUM(d >> 32), SUM(d & 4294967295) FROM t")
    assert join_halves(high, low) == sum(values)
    assert join_halves(None, None) == 0  # SUM of no rows is NULL


# -- exact aggregates and bucket sums against Python's, both backends --------------------------------

events_strategy = st.lists(
    st.tuples(st.integers(1, 240).map(lambda k: T0 + k * S // 2),  # 2 minutes: buckets, slices, minutes crossed
              deltas, st.integers(0, 9).map(lambda k: k == 0)),  # a clear ~1 in 10
    min_size=1, max_size=40)


class Backend:
    """An event store (a fresh counter per example), driven from synchronous tests."""

    def __init__(self, kind: str, directory: Path) -> None:
        self.loop = asyncio.new_event_loop()
        if kind == "sqlite":
            self.events: Any = SqliteEventStore(directory / "events.sqlite3", lambda ns: PART)
        else:
            _fake, self.events, _rollups = fake_stores(part=PART)
        self.n = 0

    def run(self, awaitable):
        return self.loop.run_until_complete(awaitable)

    def counter(self) -> str:
        self.n += 1
        return f"c{self.n}"

    def close(self) -> None:
        self.run(self.events.close())
        self.loop.close()


@pytest.fixture(scope="module", params=["sqlite", "cassandra-fake"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    b = Backend(request.param, tmp_path_factory.mktemp("overflow"))
    yield b
    b.close()


def oracle(rows: Sequence[tuple[int, int, bool]], after: int, upto: int) -> Aggregate:
    """The aggregate of (after, upto] in Python ints: adds strictly after the latest clear, events from it on."""
    chosen = [r for r in rows if after < r[0] <= upto]
    last = max((t for t, _d, c in chosen if c), default=None)
    return Aggregate(sum(d for t, d, c in chosen if not c and (last is None or t > last)), last is not None, last,
                     sum(1 for t, _d, _c in chosen if last is None or t >= last))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=events_strategy, data=st.data())
def test_aggregates_and_bucket_sums_are_exact_beyond_int64(backend: Backend, rows: list[tuple[int, int, bool]],
                                                          data: st.DataObject) -> None:
    counter = backend.counter()
    # one event per instant: an identity written twice keeps one delta, which the oracle would have to guess
    distinct = list({t: (t, d, c) for t, d, c in rows}.values())
    backend.run(backend.events.write_events([("ns", counter, t, f"e{t}", "", d, c) for t, d, c in distinct]))
    cuts = sorted(data.draw(st.lists(st.integers(T0, T0 + 121 * S), min_size=2, max_size=4), label="cuts"))
    windows = [(counter, lo, hi) for lo, hi in pairwise(cuts)] + [(counter, 0, T0 + 200 * S)]
    aggregates = backend.run(backend.events.aggregate_many("ns", windows))
    assert aggregates == [oracle(distinct, lo, hi) for _c, lo, hi in windows]
    for width in (10 * S, M):
        sums = backend.run(backend.events.bucket_sums_many("ns", windows, width))
        assert sums == [bucket_sums_of(((t, d, c) for t, d, c in distinct if lo < t <= hi), width)
                        for _c, lo, hi in windows]


def test_the_fake_sums_bigints_as_cassandra_does_wrapping() -> None:
    """The fake is in step with Cassandra: a bigint sum wraps (the bug, now unreachable), a varint sum does not."""
    fake, events, _rollups = fake_stores(part=PART)

    async def scenario() -> tuple[Aggregate, list[tuple[int, int]]]:
        await events.write_events([("ns", "c", T0 + S, "a", "", INT64_MAX, False), ("ns", "c", T0 + 2 * S, "b", "", 1,
                                                                                   False)])
        agg = await events.aggregate("ns", "c", 0, T0 + 10 * S)
        sums = [stmt for stmt in fake.log if stmt.op == "event.sum"]
        wrapping = dataclasses.replace(sums[0], cql=sums[0].cql.replace("cast(delta AS varint)", "delta"))
        return agg, await fake.run(wrapping)

    agg, wrapped = asyncio.run(scenario())
    assert agg.delta == INT64_MAX + 1
    assert wrapped == [(INT64_MIN, 2)]


# -- saturation --------------------------------------------------------------------------------------


def test_saturate_clamps_to_int64_and_warns_once_per_counter(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="sinks.model"):
        assert saturate(INT64_MAX) == INT64_MAX and saturate(INT64_MIN) == INT64_MIN and saturate(-7) == -7
        assert saturate(INT64_MAX + 1, ("ns", "once")) == INT64_MAX
        assert saturate(10 * INT64_MIN, ("ns", "once")) == INT64_MIN
        assert saturate(2**100, ("ns", "other")) == INT64_MAX
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "ns:once" in warned[0] and "ns:other" in warned[1]


class Stack:
    """The real CounterService and a worker's rollups on SQLite stores (events, rollups, buckets)."""

    def __init__(self, directory: Path) -> None:
        self.events = SqliteEventStore(directory / "events.sqlite3", lambda ns: Partitioning.of(NS.time_partition))
        self.rollups = SqliteRollupStore(directory / "rollups.sqlite3")
        self.buckets = SqliteBucketStore(directory / "buckets.sqlite3")
        self.cache = InProcessRollupCache()
        self.svc = CounterService(REGISTRY, producer=KeepingProducer(), signals=NoSignals(),  # type: ignore[arg-type]
                                  events=self.events, rollups=self.rollups, cache=self.cache,
                                  counters=None, buckets=self.buckets)  # type: ignore[arg-type]

    async def rollup(self, now: int, counter: str = "c"):
        [result] = await rollup_counters(NS, [counter], events=self.events, rollups=self.rollups, cache=self.cache,
                                         watermark_us=now, now_us=now, buckets=self.buckets)
        return result

    async def close(self) -> None:
        for store in (self.events, self.rollups, self.buckets):
            await store.close()


def test_two_valid_writes_past_int64_saturate_everywhere_on_sqlite(tmp_path: Path) -> None:
    """delta 2**63-1, then delta 1, in different minutes: AddAndGetCount, an ACCURATE GetCount and the windows
    answer INT64_MAX (they failed: "integer overflow"), the rollup converges at INT64_MAX with its buckets (it failed
    for ever), and a later delta applies to the saturated count."""
    async def scenario() -> None:
        stack = Stack(tmp_path)
        try:
            # persisted by the worker a minute before the AddAndGetCount's own write (at now), in the same slice (one
            # SQLite sum; in the first minute of a UTC day, the same minute instead)
            now = now_us()
            first = now - M - S if align_down(now - M - S, Granularity.DAY) == align_down(now, Granularity.DAY) \
                else now - 1
            await stack.events.write_events([(NS.name, "c", first, "w0", "", INT64_MAX, False)])
            assert (await stack.svc.add_and_get(NS, "c", 1, None, None)).count == INT64_MAX
            second = max(t for _ns, _c, t, *_ in await stack.events.scan(NS.name, "c", 0, now_us() + M))
            assert (await stack.svc.get(NS, "c")).count == INT64_MAX  # ACCURATE: the live events
            assert (await stack.svc.get_window(NS, "c", {"last": "1h"})).count == INT64_MAX

            settled = now_us() + 10 * S  # a boundary past both writes
            result = await stack.rollup(settled)
            assert result.applied and result.count == INT64_MAX and result.rollup_ts > second
            assert (await stack.rollups.get(NS.name, "c")).count == INT64_MAX
            for g in CHAIN:  # each bucket an int64: the minutes hold their sums, a bucket holding both saturates
                starts = {align_down(first, g), align_down(second, g)}
                [stored] = await stack.buckets.read_buckets_many(NS.name, [("c", g, min(starts), max(starts) + 1)])
                values = {start: value for start, value, _upto in stored}
                expected = {align_down(first, g): INT64_MAX, align_down(second, g): 1} if len(starts) == 2 else \
                    {align_down(first, g): INT64_MAX}
                assert values == expected, g
            # two minutes summed from their buckets: INT64_MAX + 1, answered saturated
            minute_a, minute_b = align_down(first, Granularity.MINUTE), align_down(second, Granularity.MINUTE)
            counted = await window_count(stack.buckets, NS, "c", minute_a, minute_b + M, now_us=settled)
            assert counted.count == INT64_MAX
            assert (await stack.svc.get(NS, "c")).count == INT64_MAX
            assert (await stack.svc.get_window(NS, "c", {"last": "1h"}, now_us=settled)).count == INT64_MAX

            # a later delta (after the rollup's boundary) applies to the saturated count, live and rolled up
            await stack.events.write_events([(NS.name, "c", result.rollup_ts + 1, "w2", "", -5, False)])
            assert (await stack.svc.get(NS, "c")).count == INT64_MAX - 5
            again = await stack.rollup(settled + 10 * S)
            assert again.applied and again.count == INT64_MAX - 5
        finally:
            await stack.close()
    asyncio.run(scenario())


def test_sums_below_int64_min_saturate_too(tmp_path: Path) -> None:
    async def scenario() -> None:
        stack = Stack(tmp_path)
        try:
            t = now_us() - 3
            await stack.events.write_events([(NS.name, "c", t + i, f"w{i}", "", INT64_MIN, False) for i in range(3)])
            assert (await stack.svc.get(NS, "c")).count == INT64_MIN
            result = await stack.rollup(now_us() + 10 * S)
            assert result.applied and result.count == INT64_MIN
        finally:
            await stack.close()
    asyncio.run(scenario())


def test_two_valid_writes_past_int64_on_the_cassandra_fake() -> None:
    """The same on the Cassandra stores (the fake): the rollup's count and the buckets saturate (a bigint sum
    wrapped to INT64_MIN; an unsaturated count or bucket fails the driver's bigint serialization)."""
    fake = FakeCassandra()
    fake, events, rollups = fake_stores(fake, part=Partitioning.of(NS.time_partition))
    buckets = fake_bucket_store(fake)

    async def scenario() -> None:
        first = align_down(now_us(), Granularity.HOUR) - 30 * M  # both in one hour: one partition, summed by Cassandra
        second = first + M
        await events.write_events([(NS.name, "c", first, "w0", "", INT64_MAX, False),
                                   (NS.name, "c", second, "w1", "", 1, False)])
        assert (await events.aggregate(NS.name, "c", 0, now_us())).delta == INT64_MAX + 1
        settled = now_us() + 10 * S
        [result] = await rollup_counters(NS, ["c"], events=events, rollups=rollups, cache=InProcessRollupCache(),
                                         watermark_us=settled, now_us=settled, buckets=buckets)
        assert result.applied and result.count == INT64_MAX
        assert (await rollups.get(NS.name, "c")).count == INT64_MAX
        hour = align_down(first, Granularity.HOUR)
        [stored] = await buckets.read_buckets_many(NS.name, [("c", Granularity.HOUR, hour, hour + 1)])
        assert [value for _start, value, _upto in stored] == [INT64_MAX]
        for store in (events, rollups, buckets):
            await store.close()
    asyncio.run(scenario())


# -- isolation ---------------------------------------------------------------------------------------


class PoisonedEvents(SqliteEventStore):
    """The real store, failing every aggregate that reads a poisoned counter (as "integer overflow" did)."""

    poisoned: frozenset[str] = frozenset({"bad"})

    async def aggregate_many(self, namespace: str, windows: Sequence[tuple[str, int, int]]) -> list[Aggregate]:
        if any(counter in self.poisoned for counter, _after, _upto in windows):
            raise sqlite3.OperationalError("integer overflow")
        return await super().aggregate_many(namespace, windows)


def test_a_counter_whose_rollup_fails_does_not_block_the_others(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """The batch fails, so its counters are rolled up one by one: the others converge, the failing one is logged by
    name and left stale (the sweep signals it again); the call does not raise (the worker retried it for ever)."""
    async def scenario() -> None:
        events = PoisonedEvents(tmp_path / "events.sqlite3", lambda ns: Partitioning.of(NS.time_partition))
        rollups = SqliteRollupStore(tmp_path / "rollups.sqlite3")
        try:
            t = now_us() - M
            await events.write_events([(NS.name, c, t, f"{c}-{i}", "", 10 + i, False)
                                       for c in ("good", "bad", "fine") for i in range(2)])
            await rollups.bump_last_write([(NS.name, c, t) for c in ("good", "bad", "fine")])
            settled = now_us() + 10 * S

            async def watermark() -> int:
                return settled

            with caplog.at_level(logging.ERROR, logger="agents.rollup"):
                results = await rollup_many([(NS.name, "good"), (NS.name, "bad"), (NS.name, "fine")], REGISTRY,
                                            events=events, rollups=rollups, cache=InProcessRollupCache(),
                                            watermark=watermark, pressure=BackPressure())
            assert {r.key: (r.count, r.applied) for r in results} == {(NS.name, "good"): (21, True),
                                                                     (NS.name, "fine"): (21, True)}
            assert (await rollups.get(NS.name, "fine")).count == 21
            bad = await rollups.get(NS.name, "bad")
            assert bad is not None and bad.stale and bad.rollup_ts == 0  # left for the sweep
            assert (NS.name, "bad") in await rollups.stale(limit=10)
            [line] = [r.getMessage() for r in caplog.records if "left for" in r.getMessage()]  # one, naming the first
            assert "1 counter(s) of 'acc'" in line and "'bad'" in line, line
        finally:
            await events.close()
            await rollups.close()
    asyncio.run(scenario())
