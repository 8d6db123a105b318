"""Rollups while the store is away (agents.rollup.rollup_many): an outage is told apart from one bad counter.

A failed batch is rolled up a counter at a time so that one bad counter holds back no other. With the store away
every counter failed that way, each after the store's timeout, and was left to the sweep: the worker took the
signals as handled. Now the first counters failing alone like the batch stop the pass, and the batch waits for the
store (retried with backoff, logged once) so its counters converge when it is back, with no sweep; a bad counter
is still left behind, and a stopping worker does not wait for the store: Faust waits for the batch in hand before a
stop or a rebalance, so the wait is given up then and its counters signalled again.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agents.rollup import PROBES, BackPressure, RollupResult, rollup_many
from agents.worker import _rollup
from control_plane import parse_namespaces
from sinks import Aggregate, InProcessRollupCache, Partitioning, SqliteEventStore, SqliteRollupStore

S = 1_000_000
REGISTRY = parse_namespaces({"namespaces": {"ev": {
    "counter_type": "EVENTUAL", "accept_limit": "5s", "max_clock_skew": "1s", "rollup_batch_count": 10,
    "time_partition": {"buckets_per_id": 2, "seconds_per_bucket": 60, "seconds_per_slice": 3600},
}}})
NS = REGISTRY["ev"]
COUNTERS = [f"c{i:02d}" for i in range(40)]  # four batches
DEADLINE_S = 20.0


class CountingRollups(SqliteRollupStore):
    """The real rollup store, counting the rollup writes tried (one per batch or counter rolled up) and waking
    whoever waits for a number of them; `down` makes them time out as an unreachable Cassandra would."""

    down = False

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writes: list[int] = []  # counters per write_rollups call
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    async def write_rollups(self, namespace: str, items: Sequence[tuple[str, int, int]]) -> list[bool]:
        self.writes.append(len(items))
        for n, waiter in self._waiters:
            if len(self.writes) >= n and not waiter.done():
                waiter.set_result(None)
        if self.down:
            raise TimeoutError("no replica answered")
        return await super().write_rollups(namespace, items)

    async def tried_or_done(self, n: int, task: asyncio.Task[Any]) -> None:
        """Return once `n` rollup writes were tried or the task is over (fails the test after DEADLINE_S)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((n, waiter))
        if len(self.writes) >= n:
            return
        done, _ = await asyncio.wait({task, waiter}, timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
        assert done, f"{len(self.writes)} rollup writes tried in {DEADLINE_S}s"

    def shares(self) -> tuple[int, int]:
        """How many writes were of a whole batch, and how many of a counter alone."""
        return sum(1 for n in self.writes if n > 1), sum(1 for n in self.writes if n == 1)


class PoisonedEvents(SqliteEventStore):
    """The real event store, failing every aggregate that reads counter "bad" (as SQLite's overflowing SUM did)."""

    async def aggregate_many(self, namespace: str, windows: Sequence[tuple[str, int, int]]) -> list[Aggregate]:
        if any(counter == "bad" for counter, _after, _upto in windows):
            raise sqlite3.OperationalError("integer overflow")
        return await super().aggregate_many(namespace, windows)


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A lock held by another connection fails a write after 10 ms, not after 30 s and 8 retries; the rollups retry
    a store that is away every 10-50 ms, not every 0.2-5 s."""
    monkeypatch.setattr("sinks.sqlite.thread.BUSY_TIMEOUT_S", 0.01)
    monkeypatch.setattr("sinks.sqlite.thread._RETRIES", 0)
    monkeypatch.setattr("agents.rollup.RETRY_FIRST_S", 0.01)
    monkeypatch.setattr("agents.rollup.RETRY_MAX_S", 0.05)
    yield


def expected(counters: list[str]) -> dict[str, int]:
    return {c: 10 + 2 * i + 1 for i, c in enumerate(counters)}  # two events each: 5 + i and 6 + i


async def written(events: SqliteEventStore, rollups: SqliteRollupStore, counters: list[str]) -> int:
    """Two events per counter a minute ago; returns a watermark that lets the rollups count them."""
    t = time.time_ns() // 1000 - 60 * S
    await events.write_events([(NS.name, c, t, f"{c}-{k}", "", 5 + i + k, False)
                               for i, c in enumerate(counters) for k in range(2)])
    await rollups.bump_last_write([(NS.name, c, t) for c in counters])
    return time.time_ns() // 1000 + 10 * S


def rollup_task(counters: list[str], events: SqliteEventStore, rollups: SqliteRollupStore,
                mark: int) -> asyncio.Task[list[RollupResult]]:
    async def watermark() -> int:
        return mark
    return asyncio.create_task(rollup_many([(NS.name, c) for c in counters], REGISTRY, events=events, rollups=rollups,
                                           cache=InProcessRollupCache(), watermark=watermark, pressure=BackPressure()))


async def converged(rollups: SqliteRollupStore, counts: dict[str, int]) -> dict[str, tuple[int, bool] | None]:
    """Per counter its stored count and whether its rollup caught up with its last write."""
    states = await rollups.get_many([(NS.name, c) for c in counts])
    return {c: (s.count, not s.stale) if (s := states.get((NS.name, c))) else None for c in counts}


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_locked_store_holds_the_rollups_until_it_is_back_and_is_not_tried_counter_by_counter(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Another connection holds the rollup file's write lock: every rollup write fails with SQLITE_BUSY. The call
    keeps waiting (its signals unacknowledged) past the writes a pass over every counter alone would take, each retry
    trying the batch and at most PROBES counters alone; one line says the store is away and one that it is back;
    once the lock goes, every counter converges in that same call, with no sweep."""
    async def scenario() -> None:
        events = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: Partitioning.of(NS.time_partition))
        rollups = CountingRollups(tmp_path / "rollups.sqlite3")
        lock = sqlite3.connect(tmp_path / "rollups.sqlite3", isolation_level=None)
        try:
            mark = await written(events, rollups, COUNTERS)
            lock.execute("BEGIN IMMEDIATE")
            task = rollup_task(COUNTERS, events, rollups, mark)
            await rollups.tried_or_done(len(COUNTERS) + 10, task)  # more than every counter alone and every batch
            assert not task.done(), f"the rollups gave up while the store was away: {rollups.writes}"
            batches, alone = rollups.shares()
            assert alone <= PROBES * batches, rollups.writes  # never the whole batch counter by counter
            lock.execute("ROLLBACK")
            results = await asyncio.wait_for(task, DEADLINE_S)
            assert {r.key[1]: r.count for r in results} == expected(COUNTERS)
            assert await converged(rollups, expected(COUNTERS)) == {c: (n, True) for c, n in expected(COUNTERS).items()}
            assert len(lines(caplog, "looks unavailable")) == 1 and len(lines(caplog, "is back")) == 1, caplog.text
            assert not lines(caplog, "left for"), caplog.text  # no counter was left to the sweep
        finally:
            lock.close()
            await events.close()
            await rollups.close()
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())


def test_a_store_timing_out_then_back_rolls_every_counter_up_but_a_bad_one(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """Rollup writes time out (an unreachable cluster) for a while, and one counter's sum fails whatever the store
    does: after the outage every other counter converges in the same call, and the bad one is left behind for the
    sweep (logged by name) instead of blocking the rest."""
    async def scenario() -> None:
        events = PoisonedEvents(tmp_path / "events.sqlite3", lambda ns: Partitioning.of(NS.time_partition))
        rollups = CountingRollups(tmp_path / "rollups.sqlite3")
        counters = ["bad", *COUNTERS[:14]]  # two batches
        try:
            mark = await written(events, rollups, counters)
            rollups.down = True
            task = rollup_task(counters, events, rollups, mark)
            await rollups.tried_or_done(len(counters) + 10, task)
            assert not task.done(), f"the rollups gave up while the store was away: {rollups.writes}"
            batches, alone = rollups.shares()
            assert alone <= PROBES * (batches + 1), rollups.writes  # the first batch failed before its write
            rollups.down = False
            results = await asyncio.wait_for(task, DEADLINE_S)
            good = {c: n for c, n in expected(counters).items() if c != "bad"}
            assert {r.key[1]: r.count for r in results} == good
            assert await converged(rollups, good) == {c: (n, True) for c, n in good.items()}
            bad = await rollups.get(NS.name, "bad")
            assert bad is not None and bad.stale
            [line] = lines(caplog, "left for")
            assert "1 counter(s) of 'ev'" in line and "'bad'" in line, line
        finally:
            await events.close()
            await rollups.close()
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())


class OneTimingOut(CountingRollups):
    """The store answers, but the rollup of counter "huge" times out every time (a partition too large to read in
    time): alone, it looks like an outage."""

    async def write_rollups(self, namespace: str, items: Sequence[tuple[str, int, int]]) -> list[bool]:
        self.down = any(counter == "huge" for counter, _n, _ts in items)
        return await super().write_rollups(namespace, items)


def test_a_counter_timing_out_alone_holds_the_rollups_no_longer_than_the_wait_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A sweep's batch of one counter that times out whatever the store does is judged an outage; the call waits for
    the store at most `MAX_WAIT_S`, then leaves it stale for the sweep and returns, so the signals behind it (other
    namespaces' too) are not held for ever."""
    monkeypatch.setattr("agents.rollup.MAX_WAIT_S", 0.3)

    async def scenario() -> None:
        events = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: Partitioning.of(NS.time_partition))
        rollups = OneTimingOut(tmp_path / "rollups.sqlite3")
        try:
            mark = await written(events, rollups, ["huge"])
            task = rollup_task(["huge"], events, rollups, mark)
            done, _ = await asyncio.wait({task}, timeout=DEADLINE_S)
            assert done, f"still waiting for the store after {DEADLINE_S}s: {len(rollups.writes)} tries"
            assert task.result() == [] and len(rollups.writes) > 2  # waited, retried, then let go
            huge = await rollups.get(NS.name, "huge")
            assert huge is not None and huge.stale  # the sweep finds it
            [line] = lines(caplog, "left for the sweep")
            assert "1 counter(s) of ['ev']" in line, line
        finally:
            await events.close()
            await rollups.close()
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())


def test_rollups_waiting_for_the_store_stop_at_once_when_cancelled(tmp_path: Path) -> None:
    """A worker stopping cancels its rollup agent (Faust cancels the actor): the wait for the store ends at once."""
    async def scenario() -> None:
        events = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: Partitioning.of(NS.time_partition))
        rollups = CountingRollups(tmp_path / "rollups.sqlite3")
        try:
            mark = await written(events, rollups, COUNTERS[:3])
            rollups.down = True
            task = rollup_task(COUNTERS[:3], events, rollups, mark)
            await rollups.tried_or_done(3 * (1 + PROBES), task)  # waiting for the store, beyond the first pass
            assert not task.done(), f"the rollups gave up while the store was away: {rollups.writes}"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 1.0)
        finally:
            await events.close()
            await rollups.close()
    asyncio.run(scenario())


@pytest.mark.parametrize("event", ["stop", "rebalance"])
def test_a_worker_stopping_or_handing_over_while_rollups_wait_for_the_store_signals_them_again(
        tmp_path: Path, event: str) -> None:
    """Faust waits for the rollup batch in hand before it stops or rebalances (stream_wait_empty): a wait for the
    store would hold either for ever. The worker's rollup step gives it up then, and signals the counters again
    (their signals are acknowledged with the batch), rolling up what it had."""
    async def scenario() -> None:
        events = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: Partitioning.of(NS.time_partition))
        rollups = CountingRollups(tmp_path / "rollups.sqlite3")
        try:
            mark = await written(events, rollups, COUNTERS[:12])
            sent: list[tuple[str, str]] = []

            async def watermark() -> int:
                return mark

            async def send_signals(keys: list[tuple[str, str]]) -> None:
                sent.extend(keys)

            app = SimpleNamespace(should_stop=False, rebalancing=False)
            worker = SimpleNamespace(registry=REGISTRY, events=events, rollups=rollups, cache=InProcessRollupCache(),
                                     watermark=watermark, pressure=BackPressure(), buckets=None, sketches=None,
                                     app=app, send_signals=send_signals)
            rollups.down = True
            task = asyncio.create_task(_rollup(worker, {(NS.name, c) for c in COUNTERS[:12]}))
            await rollups.tried_or_done(3 * (1 + PROBES), task)  # waiting for the store, beyond the first pass
            assert not task.done(), f"the rollups gave up while the store was away: {rollups.writes}"
            setattr(app, "should_stop" if event == "stop" else "rebalancing", True)
            await asyncio.wait_for(task, 2.0)
            assert sorted(sent) == sorted((NS.name, c) for c in COUNTERS[:12])
        finally:
            await events.close()
            await rollups.close()
    asyncio.run(scenario())
