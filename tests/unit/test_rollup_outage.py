"""Rollups while the store is away (agents.rollup_batches.rollup_many): an outage is told apart from one bad counter.

A failed batch is rolled up a counter at a time so that one bad counter holds back no other. With the store away
every counter failed that way, each after the store's timeout, and was left to the sweep: the worker took the
signals as handled. Now counters failing alone with errors saying the store is away stop the pass once more than one
counter says so (several counters, or a store read failing too), and the batch waits for the store (retried with
backoff, each retry one try of the batch, logged once an outage however many calls it spans) so its counters converge
when it is back, with no sweep; a bad counter, a counter failing alone as if the store were away while it answers, and
an error of a whole namespace that does not say the store is away are still left behind at once; and a stopping worker
does not wait for the store: Faust waits for the batch in hand before a stop or a rebalance, so the call is given up
then, between any two store calls, and its counters signalled again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agents import metrics
from agents.rollup import BackPressure, RollupResult
from agents.rollup_batches import (
    BACKLOG_BATCHES,
    PROBES,
    Outage,
    OverBudget,
    RollupsAbandoned,
    batch_size,
    rollup_many,
)
from agents.worker import _rollup, set_budget_s
from control_plane import parse_namespaces
from sinks import (
    Aggregate,
    InProcessRollupCache,
    Partitioning,
    RollupState,
    SqliteEventStore,
    SqliteRollupStore,
    store_unavailable,
)
from streams.settings import load_settings

S = 1_000_000
REGISTRY = parse_namespaces({"namespaces": {name: {
    "counter_type": "EVENTUAL", "accept_limit": "5s", "max_clock_skew": "1s", "rollup_batch_count": 10,
    "time_partition": {"buckets_per_id": 2, "seconds_per_bucket": 60, "seconds_per_slice": 3600},
} for name in ("ev", "a", "b", "c")}})
NS = REGISTRY["ev"]
COUNTERS = [f"c{i:02d}" for i in range(40)]  # four batches
DEADLINE_S = 20.0
Key = tuple[str, str]


def timed_out() -> Exception:
    return TimeoutError("no replica answered")


class CountingRollups(SqliteRollupStore):
    """The real rollup store, counting the rollup writes tried (one per batch or counter rolled up) and waking
    whoever waits for a number of them. They time out as an unreachable Cassandra's would (or fail with `error()`)
    while `down`, or their namespace is in `down_ns`, and whenever they hold a counter of `huge` (a partition too large
    to read in time, the store answering every other); with `reads_down` its reads time out too. `on_write(namespace,
    counters)` runs first."""

    down = False

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writes: list[int] = []  # counters per write_rollups call
        self.reads = 0  # get_many calls
        self.down_ns: set[str] = set()
        self.huge: set[str] = set()
        self.reads_down = False
        self.error: Callable[[], Exception] = timed_out
        self.on_write: Callable[[str, list[str]], None] | None = None
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    async def write_rollups(self, namespace: str, items: Sequence[tuple[str, int, int]]) -> list[bool]:
        counters = [c for c, _n, _ts in items]
        if self.on_write is not None:
            self.on_write(namespace, counters)
        self.writes.append(len(items))
        self._wake()
        if self.down or namespace in self.down_ns:
            raise self.error()
        if self.huge.intersection(counters):
            raise timed_out()
        return await super().write_rollups(namespace, items)

    async def get_many(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], RollupState]:
        self.reads += 1
        self._wake()
        if self.reads_down:
            raise timed_out()
        return await super().get_many(keys)

    async def tried_or_done(self, n: int, task: asyncio.Task[Any], *, reads: bool = False) -> None:
        """Return once `n` rollup writes (or reads) were tried or the task is over (fails the test after DEADLINE_S).
        """
        def count() -> int:
            return self.reads if reads else len(self.writes)
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((lambda: count() >= n, waiter))
        if count() >= n:
            return
        done, _ = await asyncio.wait({task, waiter}, timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
        assert done, f"{count()} rollup {'reads' if reads else 'writes'} tried in {DEADLINE_S}s"

    def _wake(self) -> None:
        for reached, waiter in self._waiters:
            if reached() and not waiter.done():
                waiter.set_result(None)

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
    monkeypatch.setattr("agents.rollup_batches.RETRY_FIRST_S", 0.01)
    monkeypatch.setattr("agents.rollup_batches.RETRY_MAX_S", 0.05)
    yield


def expected(counters: list[str]) -> dict[str, int]:
    return {c: 10 + 2 * i + 1 for i, c in enumerate(counters)}  # two events each: 5 + i and 6 + i


def keys_of(counters: Sequence[str], ns: str = NS.name) -> list[Key]:
    return [(ns, c) for c in counters]


async def written(events: SqliteEventStore, rollups: SqliteRollupStore, counters: list[str], ns: str = NS.name, *,
                  last_write_ahead: bool = False) -> int:
    """Two events per counter a minute ago; returns a watermark that lets the rollups count them (with
    `last_write_ahead`, their last write is now: still ahead of any rollup, which then asks to be signalled again)."""
    now = time.time_ns() // 1000
    t = now - 60 * S
    await events.write_events([(ns, c, t, f"{c}-{k}", "", 5 + i + k, False)
                               for i, c in enumerate(counters) for k in range(2)])
    await rollups.bump_last_write([(ns, c, now if last_write_ahead else t) for c in counters])
    return now + 10 * S


@contextlib.asynccontextmanager
async def stores(tmp_path: Path, events_class: type[SqliteEventStore] = SqliteEventStore
                 ) -> AsyncIterator[tuple[SqliteEventStore, CountingRollups]]:
    """The real event store (of `events_class`) and the counting rollup store, closed after."""
    events = events_class(tmp_path / "events.sqlite3", lambda ns: Partitioning.of(NS.time_partition))
    rollups = CountingRollups(tmp_path / "rollups.sqlite3")
    try:
        yield events, rollups
    finally:
        await events.close()
        await rollups.close()


def rollup_task(counters: list[str] | list[Key], events: SqliteEventStore, rollups: SqliteRollupStore, mark: int,
                **kwargs: Any) -> asyncio.Task[list[RollupResult]]:
    """`rollup_many` of the counters (of namespace "ev" when given by name), with `kwargs` (give_up, outage...)."""
    async def watermark() -> int:
        return mark
    keys = [k if isinstance(k, tuple) else (NS.name, k) for k in counters]
    kwargs.setdefault("pressure", BackPressure())
    return asyncio.create_task(rollup_many(keys, REGISTRY, events=events, rollups=rollups, cache=InProcessRollupCache(),
                                           watermark=watermark, **kwargs))


def worker(events: SqliteEventStore, rollups: SqliteRollupStore, mark: int,
           send_signals: Callable[[list[Key]], Any]) -> SimpleNamespace:
    """What the worker's rollup step (`agents.worker._rollup`) uses of its Pipeline."""
    async def watermark() -> int:
        return mark
    return SimpleNamespace(registry=REGISTRY, events=events, rollups=rollups, cache=InProcessRollupCache(),
                           watermark=watermark, pressure=BackPressure(), buckets=None, sketches=None,
                           app=SimpleNamespace(should_stop=False, rebalancing=False), send_signals=send_signals,
                           outage=Outage(), settings=SimpleNamespace(rollup_batch_max=512), set_budget_s=60.0)


async def converged(rollups: SqliteRollupStore, counts: dict[str, int]) -> dict[str, tuple[int, bool] | None]:
    """Per counter its stored count and whether its rollup caught up with its last write."""
    states = await rollups.get_many([(NS.name, c) for c in counts])
    return {c: (s.count, not s.stale) if (s := states.get((NS.name, c))) else None for c in counts}


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.mark.parametrize(("queued", "batch_max", "size"), [
    (10 * BACKLOG_BATCHES, 512, 10),  # up to BACKLOG_BATCHES batches: rollup_batch_count
    (10 * BACKLOG_BATCHES + 1, 512, 11),  # one more counter: about BACKLOG_BATCHES batches
    (400, 512, 50),
    (50_000, 512, 512),  # a burst: at most batch_max
    (50_000, 4, 10),  # never below rollup_batch_count
    (50_000, None, 10),  # no batch_max: rollup_batch_count whatever is queued
])
def test_a_long_set_is_rolled_up_in_larger_batches(queued: int, batch_max: int | None, size: int) -> None:
    assert batch_size(10, queued, batch_max) == size


def test_a_burst_of_counters_costs_fewer_store_round_trips(tmp_path: Path) -> None:
    """200 counters of a namespace whose rollup_batch_count is 10: 8 batches of 25 with a batch_max (each batch costs
    its store round trips whatever its size), 20 batches of 10 without one; every count exact either way."""
    counters = [f"c{i:03d}" for i in range(200)]

    async def scenario(batch_max: int | None) -> list[int]:
        async with stores(tmp_path / str(batch_max)) as (events, rollups):
            mark = await written(events, rollups, counters)
            results = await asyncio.wait_for(rollup_task(counters, events, rollups, mark, batch_max=batch_max),
                                             DEADLINE_S)
            assert {r.key[1]: r.count for r in results} == expected(counters)
            return rollups.writes

    (tmp_path / "25").mkdir()
    (tmp_path / "None").mkdir()
    assert asyncio.run(scenario(25)) == [25] * 8
    assert asyncio.run(scenario(None)) == [10] * 20


def test_a_quiet_namespace_is_rolled_up_before_a_burst_of_another(tmp_path: Path) -> None:
    """One coalesced set: a burst of 300 counters of "a", signalled first, and 3 of "b". The rollup queues are shared by
    every namespace, so "b" is rolled up first rather than after all of "a"'s batches."""
    burst, quiet = [f"c{i:03d}" for i in range(300)], ["x", "y", "z"]

    async def scenario() -> list[str]:
        async with stores(tmp_path) as (events, rollups):
            await written(events, rollups, burst, "a")
            mark = await written(events, rollups, quiet, "b")
            order: list[str] = []
            rollups.on_write = lambda namespace, counters: order.append(namespace)
            results = await asyncio.wait_for(rollup_task([*keys_of(burst, "a"), *keys_of(quiet, "b")], events,
                                                         rollups, mark), DEADLINE_S)
            assert {r.key: r.count for r in results if r.key[0] == "b"} == {("b", c): n for c, n in
                                                                          expected(quiet).items()}
            return order

    order = asyncio.run(scenario())
    assert order[0] == "b" and order.count("b") == 1 and order.count("a") == 30, order


def budget_resignals() -> float:
    return metrics.REGISTRY.get_sample_value("counter_rollup_resignals_total", {"source": "set_budget"}) or 0.0


def test_a_set_past_its_budget_signals_the_rest_again_behind_newer_signals(tmp_path: Path) -> None:
    """A set of four batches whose budget is over after the first: the first batch is rolled up and the worker signals
    the other 30 counters again (behind whatever signals came meanwhile), counted as such; rolling those up converges
    every counter."""
    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            mark = await written(events, rollups, COUNTERS)
            sent: list[list[Key]] = []

            async def send_signals(keys: list[Key]) -> None:
                sent.append(list(keys))
            p = worker(events, rollups, mark, send_signals)
            p.set_budget_s = 1e-9
            before = budget_resignals()
            await asyncio.wait_for(_rollup(p, set(keys_of(COUNTERS))), DEADLINE_S)
            assert rollups.writes == [10] and len(sent) == 1 and len(sent[0]) == 30, (rollups.writes, sent)
            assert budget_resignals() - before == 30
            p.set_budget_s = 60.0
            await asyncio.wait_for(_rollup(p, set(sent[0])), DEADLINE_S)
            counts = expected(COUNTERS)
            assert await converged(rollups, counts) == {c: (n, True) for c, n in counts.items()}
    asyncio.run(scenario())


@pytest.mark.parametrize(("configured", "window_s", "budget"), [
    (None, 0.5, 5.0),  # at least MIN_SET_BUDGET_S
    (None, 10.0, 40.0),  # the LOW preset's window: four of them
    (0.1, 10.0, 0.1),  # set: as set
])
def test_a_sets_budget_is_four_rollup_windows_unless_set(configured: float | None, window_s: float,
                                                         budget: float) -> None:
    """Each set waits out a rollup window before the agent gets it (Faust's take_events): a budget of 5 s against the
    LOW preset's 10 s window would leave a burst's rollups a third of their rate."""
    assert set_budget_s(load_settings(rollup_set_budget_s=configured), window_s) == budget


def test_a_set_cut_by_its_budget_has_rolled_up_a_batch_of_every_namespace(tmp_path: Path) -> None:
    """Namespaces go fewest counters first, and a budget cut re-signals the rest: were the budget checked after the
    first batch, a set with 100 counters of "a" and a few of "b" would roll up only "b" in every set while "b" kept
    coming, "a" signalled again each time and never rolled up. A set is cut only after a batch of each namespace."""
    big, small = [f"c{i:03d}" for i in range(100)], [f"s{i:02d}" for i in range(11)]

    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            await written(events, rollups, big, "a")
            mark = await written(events, rollups, small, "b")
            task = rollup_task([*keys_of(big, "a"), *keys_of(small, "b")], events, rollups, mark, budget_s=1e-9)
            with pytest.raises(OverBudget) as cut:
                await asyncio.wait_for(task, DEADLINE_S)
            done = sorted(r.key for r in cut.value.done)
            assert done == sorted([*keys_of(small[:10], "b"), *keys_of(big[:10], "a")]), done
            assert sorted(cut.value.left) == sorted([*keys_of(small[10:], "b"), *keys_of(big[10:], "a")])
    asyncio.run(scenario())


def test_a_set_waiting_for_its_store_is_not_cut_by_its_budget(tmp_path: Path) -> None:
    """The budget cuts a set only while its store answers: with the store away, the set waits for it as before (an
    outage proven by PROBES counters alone), and rolls every counter up once it is back."""
    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            mark = await written(events, rollups, COUNTERS)
            rollups.down = True
            task = rollup_task(COUNTERS, events, rollups, mark, budget_s=1e-9)
            await rollups.tried_or_done(1 + PROBES + 3, task)
            assert not task.done(), f"the set was cut while its store was away: {rollups.writes}"
            rollups.down = False
            results = await asyncio.wait_for(task, DEADLINE_S)
            assert {r.key[1]: r.count for r in results} == expected(COUNTERS)
    asyncio.run(scenario())


def test_a_set_within_its_budget_is_rolled_up_whole(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            mark = await written(events, rollups, COUNTERS)
            results = await asyncio.wait_for(rollup_task(COUNTERS, events, rollups, mark, budget_s=60.0), DEADLINE_S)
            assert {r.key[1]: r.count for r in results} == expected(COUNTERS) and rollups.writes == [10] * 4
    asyncio.run(scenario())


def test_a_locked_store_holds_the_rollups_until_it_is_back_and_is_not_tried_counter_by_counter(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Another connection holds the rollup file's write lock: every rollup write fails with SQLITE_BUSY. The call
    keeps waiting (its signals unacknowledged) past the writes a pass over every counter alone would take: PROBES
    counters alone prove the outage, then each retry tries the batch once; one line says the store is away and one
    that it is back; once the lock goes, every counter converges in that same call, with no sweep."""
    async def scenario() -> None:
        lock = sqlite3.connect(tmp_path / "rollups.sqlite3", isolation_level=None)
        async with stores(tmp_path) as (events, rollups):
            try:
                mark = await written(events, rollups, COUNTERS)
                lock.execute("BEGIN IMMEDIATE")
                task = rollup_task(COUNTERS, events, rollups, mark)
                await rollups.tried_or_done(len(COUNTERS) + 10, task)  # more than every counter alone and every batch
                assert not task.done(), f"the rollups gave up while the store was away: {rollups.writes}"
                _, alone = rollups.shares()
                assert alone == PROBES, rollups.writes  # never the whole batch counter by counter, nor again a retry
                lock.execute("ROLLBACK")
                results = await asyncio.wait_for(task, DEADLINE_S)
                assert {r.key[1]: r.count for r in results} == expected(COUNTERS)
                counts = expected(COUNTERS)
                assert await converged(rollups, counts) == {c: (n, True) for c, n in counts.items()}
                assert len(lines(caplog, "looks unavailable")) == 1 and len(lines(caplog, "is back")) == 1, caplog.text
                assert not lines(caplog, "left for"), caplog.text  # no counter was left to the sweep
            finally:
                lock.close()
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())


def test_a_store_timing_out_then_back_rolls_every_counter_up_but_a_bad_one(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """Rollup writes time out (an unreachable cluster) for a while, and one counter's sum fails whatever the store
    does: after the outage every other counter converges in the same call, and the bad one is left behind for the
    sweep (logged by name) instead of blocking the rest."""
    async def scenario() -> None:
        counters = ["bad", *COUNTERS[:14]]  # two batches
        async with stores(tmp_path, PoisonedEvents) as (events, rollups):
            mark = await written(events, rollups, counters)
            rollups.down = True
            task = rollup_task(counters, events, rollups, mark)
            await rollups.tried_or_done(len(counters) + 10, task)
            assert not task.done(), f"the rollups gave up while the store was away: {rollups.writes}"
            _, alone = rollups.shares()
            assert alone == PROBES, rollups.writes  # "bad" failed before its write; a retry is the batch alone
            rollups.down = False
            results = await asyncio.wait_for(task, DEADLINE_S)
            good = {c: n for c, n in expected(counters).items() if c != "bad"}
            assert {r.key[1]: r.count for r in results} == good
            assert await converged(rollups, good) == {c: (n, True) for c, n in good.items()}
            bad = await rollups.get(NS.name, "bad")
            assert bad is not None and bad.stale
            [line] = lines(caplog, "left for")
            assert "1 counter(s) of 'ev'" in line and "'bad'" in line, line
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())


def test_rollups_waiting_for_the_store_stop_at_once_when_cancelled(tmp_path: Path) -> None:
    """A worker stopping cancels its rollup agent (Faust cancels the actor): the wait for the store ends at once."""
    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            mark = await written(events, rollups, COUNTERS[:3])
            rollups.down = True
            task = rollup_task(COUNTERS[:3], events, rollups, mark)
            await rollups.tried_or_done(3 * (1 + PROBES), task)  # waiting for the store, beyond the first pass
            assert not task.done(), f"the rollups gave up while the store was away: {rollups.writes}"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 1.0)
    asyncio.run(scenario())


@pytest.mark.parametrize("event", ["stop", "rebalance"])
def test_a_worker_stopping_or_handing_over_while_rollups_wait_for_the_store_signals_them_again(
        tmp_path: Path, event: str) -> None:
    """Faust waits for the rollup batch in hand before it stops or rebalances (stream_wait_empty): a wait for the
    store would hold either for ever. The worker's rollup step gives it up then, and signals the counters again
    (their signals are acknowledged with the batch), rolling up what it had."""
    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            mark = await written(events, rollups, COUNTERS[:12])
            sent: list[tuple[str, str]] = []

            async def send_signals(keys: list[tuple[str, str]]) -> None:
                sent.extend(keys)

            pipeline = worker(events, rollups, mark, send_signals)
            rollups.down = True
            task = asyncio.create_task(_rollup(pipeline, {(NS.name, c) for c in COUNTERS[:12]}))
            await rollups.tried_or_done(3 * (1 + PROBES), task)  # waiting for the store, beyond the first pass
            assert not task.done(), f"the rollups gave up while the store was away: {rollups.writes}"
            setattr(pipeline.app, "should_stop" if event == "stop" else "rebalancing", True)
            await asyncio.wait_for(task, 2.0)
            assert sorted(sent) == sorted((NS.name, c) for c in COUNTERS[:12])
    asyncio.run(scenario())


def test_a_counter_failing_alone_as_if_the_store_were_away_while_it_answers_is_left_to_the_sweep_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Counter "huge" times out whatever the store does (a Cassandra partition too large to read in time), the store
    answering every other. Alone in its namespace's batch (a read's or the sweep's signal), it was judged an outage and
    held the call for MAX_WAIT_S, at every call. One counter proves no outage now: the store read that would confirm
    one answers, so each call tries it in its batch and alone, leaves it to the sweep and goes on at once."""
    monkeypatch.setattr("agents.rollup_batches.MAX_WAIT_S", 0.3)

    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            mark = await written(events, rollups, ["huge", *COUNTERS[:10]])
            rollups.huge = {"huge"}
            outage = Outage()
            for counters in (["huge"], ["huge"], [*COUNTERS[:10], "huge"]):  # last: alone in the second batch
                before = len(rollups.writes)
                results = await asyncio.wait_for(rollup_task(counters, events, rollups, mark, outage=outage),
                                                 DEADLINE_S)
                assert rollups.writes[before:] == ([10] if len(counters) > 1 else []) + [1, 1], rollups.writes
                assert [r.key[1] for r in results] == counters[:-1]
            assert not lines(caplog, "looks unavailable") and not lines(caplog, "waiting for the store"), caplog.text
            assert len(lines(caplog, "left for their next signal")) == 3
            huge = await rollups.get(NS.name, "huge")
            assert huge is not None and huge.stale  # the sweep finds it
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())


def test_a_counter_failing_alone_waits_for_the_store_when_the_store_read_fails_too(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The same lone counter, with the store away for reads too (Cassandra without replicas): the confirming read
    fails as well, so the call waits for the store, and rolls the counter up once it is back."""
    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            mark = await written(events, rollups, ["c00"])
            rollups.down = rollups.reads_down = True
            task = rollup_task(["c00"], events, rollups, mark)
            # its batch, it alone, the confirming read (each a rollup's first read, or the read), then retries
            await rollups.tried_or_done(3 + 3, task, reads=True)
            assert not task.done(), f"the rollups gave up while the store was away: {rollups.reads} reads"
            rollups.down = rollups.reads_down = False
            results = await asyncio.wait_for(task, DEADLINE_S)
            assert {r.key[1]: r.count for r in results} == expected(["c00"])
            assert len(lines(caplog, "looks unavailable")) == 1 and len(lines(caplog, "is back")) == 1, caplog.text
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())


def test_counters_given_up_after_a_wait_are_left_to_the_sweep_at_once_the_next_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Five counters time out alone whatever the store does: together they look like an outage, and the call waits
    for the store until MAX_WAIT_S, then leaves them to the sweep. The worker remembers them: when the sweep signals
    them again, with the store answering, they prove no outage. Tried after the batch's other counters, PROBES of them
    failing alone leave the rest to the sweep untried, at once."""
    monkeypatch.setattr("agents.rollup_batches.MAX_WAIT_S", 0.3)

    async def scenario() -> None:
        huge = [f"h{i}" for i in range(5)]
        async with stores(tmp_path) as (events, rollups):
            mark = await written(events, rollups, [*huge, "c00", "c01"])
            rollups.huge = set(huge)
            outage = Outage()
            first = await asyncio.wait_for(rollup_task(huge, events, rollups, mark, outage=outage), DEADLINE_S)
            assert first == [] and len(rollups.writes) > 1 + PROBES  # waited, retried, then let go
            [line] = lines(caplog, "left for the sweep after")
            assert "5 counter(s) of ['ev']" in line, line
            await asyncio.wait_for(rollup_task(["c01"], events, rollups, mark, outage=outage), DEADLINE_S)
            assert not outage.active  # the store answered
            before = len(rollups.writes)
            third = await asyncio.wait_for(rollup_task([*huge, "c00"], events, rollups, mark, outage=outage),
                                           DEADLINE_S)
            assert [r.key[1] for r in third] == ["c00"]
            assert rollups.writes[before:] == [6] + [1] * (1 + PROBES), rollups.writes[before:]  # no wait
            assert len(lines(caplog, "left for the sweep after")) == 1, caplog.text
            [line] = lines(caplog, "left for their next signal")
            assert f"{PROBES} counter(s) of 'ev'" in line and "'h0'" in line, line
            [line] = lines(caplog, "left for the sweep untried")
            assert f"{5 - PROBES} counter(s) of 'ev'" in line, line
            for c in huge:
                state = await rollups.get(NS.name, c)
                assert state is not None and state.stale
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())


def test_a_store_away_for_longer_than_a_call_waits_is_not_tried_counter_by_counter_by_the_next_calls(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Rollup writes fail for longer than a call waits. The counters a call left to the sweep come back with the
    sweep's signals while the store is still away: they do not wait again, nor are they tried alone, each maybe after
    the store's timeout; one try of their namespace's first batch leaves them all to the sweep untried."""
    monkeypatch.setattr("agents.rollup_batches.MAX_WAIT_S", 0.2)
    counters = COUNTERS[:25]  # three batches

    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            mark = await written(events, rollups, counters)
            rollups.down = True
            outage = Outage()
            assert await asyncio.wait_for(rollup_task(counters, events, rollups, mark, outage=outage),
                                          DEADLINE_S) == []
            before = len(rollups.writes)
            assert await asyncio.wait_for(rollup_task(counters, events, rollups, mark, outage=outage),
                                          DEADLINE_S) == []
            assert rollups.writes[before:] == [10], rollups.writes[before:]
            untried = lines(caplog, "left for the sweep untried")
            assert [line.split(" counter(s)")[0] for line in untried] == [f"rollup of {n}" for n in (10, 10, 5)]
            assert len(lines(caplog, "left for the sweep after")) == 1, caplog.text
            rollups.down = False
            results = await asyncio.wait_for(rollup_task(counters, events, rollups, mark, outage=outage),
                                             DEADLINE_S)
            assert {r.key[1]: r.count for r in results} == expected(counters)
            assert not outage.given_up and len(lines(caplog, "is back")) == 1, caplog.text
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())


def test_an_error_of_a_whole_namespace_that_does_not_say_the_store_is_away_is_no_outage(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every rollup of the namespace fails with SQLite's "no such table" (SQLITE_ERROR: a missing slice table, a
    schema not migrated): that the counters alone fail like their batch was taken as an outage, waited for up to
    MAX_WAIT_S at every call. It is no outage: each counter is tried alone once and left to the sweep, at once."""
    async def scenario() -> None:
        memory = sqlite3.connect(":memory:")

        def no_such_table() -> Exception:
            try:
                memory.execute("SELECT * FROM events_missing_slice")
            except sqlite3.OperationalError as exc:
                return exc
            raise AssertionError("the table exists")
        async with stores(tmp_path) as (events, rollups):
            try:
                mark = await written(events, rollups, COUNTERS[:10])
                rollups.down, rollups.error = True, no_such_table
                results = await asyncio.wait_for(rollup_task(COUNTERS[:10], events, rollups, mark), DEADLINE_S)
                assert results == [] and rollups.writes == [10] + [1] * 10
                assert not lines(caplog, "looks unavailable") and not lines(caplog, "is back"), caplog.text
                [line] = lines(caplog, "left for their next signal")
                assert "10 counter(s) of 'ev'" in line and "no such table" in line, line
            finally:
                memory.close()
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())


def test_a_corrupt_page_says_no_store_outage() -> None:
    """SQLITE_CORRUPT may hold one counter's rows only (a corrupt page), and waiting does not mend it: the counter's
    own failure, while a locked or missing file still says the store is away."""
    corrupt = sqlite3.DatabaseError("database disk image is malformed")
    corrupt.sqlite_errorcode = 11  # type: ignore[attr-defined]  # set by sqlite3 on the errors it raises
    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorcode = 5  # type: ignore[attr-defined]
    cantopen = sqlite3.OperationalError("unable to open database file")
    cantopen.sqlite_errorcode = 14  # type: ignore[attr-defined]
    assert not store_unavailable(corrupt)
    assert store_unavailable(busy) and store_unavailable(cantopen)


def test_a_lightweight_transaction_of_unknown_outcome_says_the_store_is_away() -> None:
    """A review: protocol v5 reports an LWT of unknown outcome as error 0x1700, which cassandra-driver decodes as the
    bare ErrorMessage: the API's namespace pin answered it 500. Other server errors (an invalid query) stay bugs."""
    import io
    import struct

    from cassandra import ProtocolVersion
    from cassandra.protocol import ErrorMessage

    def server_error(code: int, extra: bytes = b"") -> Exception:
        text = b"CAS operation result is unknown"
        body = struct.pack(">i", code) + struct.pack(">H", len(text)) + text + extra
        return ErrorMessage.recv_body(io.BytesIO(body), ProtocolVersion.V5).to_exception()

    assert store_unavailable(server_error(0x1700, struct.pack(">Hii", 6, 1, 2)))  # LOCAL_QUORUM, 1 of 2
    assert not store_unavailable(server_error(0x2200))  # an invalid query


@pytest.mark.parametrize("when", ["after a batch done", "after a batch failing", "after a counter alone"])
def test_a_stop_is_seen_between_any_two_store_calls_of_a_pass(tmp_path: Path, when: str) -> None:
    """The store of three namespaces is away, each of its calls maybe a timeout; the worker stops (or hands its
    partitions over) during the batch done before them, or the first call that fails. The stop was seen only in the
    wait after the pass, PROBES + 1 store calls a namespace later. Now the call gives up before its next store call:
    what it rolled up is kept, and every counter not rolled up is handed back, once."""
    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            done_keys = keys_of(COUNTERS[:3])
            down_keys = [k for ns in "abc" for k in keys_of(COUNTERS[:5], ns)]
            mark = await written(events, rollups, COUNTERS[:3])
            for ns in "abc":
                await written(events, rollups, COUNTERS[:5], ns)
            rollups.down_ns = {"a", "b", "c"}
            stop = [False]

            def on_write(namespace: str, counters: list[str]) -> None:
                stop[0] = stop[0] or {"after a batch done": namespace == NS.name,
                                      "after a batch failing": namespace == "a",
                                      "after a counter alone": len(counters) == 1}[when]
            rollups.on_write = on_write
            with pytest.raises(RollupsAbandoned) as abandoned:
                await asyncio.wait_for(rollup_task(done_keys + down_keys, events, rollups, mark,
                                                   give_up=lambda: stop[0]), DEADLINE_S)
            assert [r.key for r in abandoned.value.done] == done_keys
            assert sorted(abandoned.value.left) == sorted(down_keys)
            assert rollups.writes == {"after a batch done": [3], "after a batch failing": [3, 5],
                                      "after a counter alone": [3, 5, 1]}[when], rollups.writes
    asyncio.run(scenario())


def test_a_retry_while_the_store_is_away_is_one_try_of_each_batch(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Once an outage is proven (PROBES counters alone), every retry, and the first try of another namespace's
    batch, is one try of the batch: no counter alone again, each of which may cost the store's timeout."""
    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            keys = keys_of(COUNTERS[:12], "a") + keys_of(COUNTERS[:5], "b")  # a: two batches, b: one
            mark = await written(events, rollups, COUNTERS[:12], "a")
            await written(events, rollups, COUNTERS[:5], "b")
            rollups.down = True
            task = rollup_task(keys, events, rollups, mark)
            await rollups.tried_or_done(30, task)
            assert not task.done(), f"the rollups gave up while the store was away: {rollups.writes}"
            assert rollups.writes[:1 + PROBES] == [5] + [1] * PROBES  # b first: the namespace of fewer counters
            assert set(rollups.writes[1 + PROBES:]) == {10, 5}, rollups.writes  # a's first batch and b's, in turn
            rollups.down = False
            results = await asyncio.wait_for(task, DEADLINE_S)
            assert sorted(r.key for r in results) == sorted(keys)
            assert len(lines(caplog, "looks unavailable")) == 1 and len(lines(caplog, "is back")) == 1, caplog.text
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())


def test_the_wait_for_the_store_ends_on_time_when_its_store_calls_are_slow(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each failing store call takes a second (a timeout; on a clock of the test's, moved forward by the store
    instead of sleeping), for four namespaces. The wait bound was checked only after a whole pass, every pass trying
    each namespace's batch and PROBES counters alone: the call outlasted it by passes. Now it is checked before every
    store call, so the call waits no more than `max_wait_s` and one store call."""
    ahead = [0.0]
    monkeypatch.setattr("agents.rollup_batches.time", SimpleNamespace(monotonic=lambda: time.monotonic() + ahead[0],
                                                              time_ns=time.time_ns))

    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            namespaces = ["a", "b", "c", "ev"]
            keys = [k for ns in namespaces for k in keys_of(COUNTERS[:5], ns)]
            mark = 0
            for ns in namespaces:
                mark = await written(events, rollups, COUNTERS[:5], ns)
            rollups.down = True
            calls: list[float] = []

            def timeout(namespace: str, counters: list[str]) -> None:
                ahead[0] += 1.0
                calls.append(time.monotonic() + ahead[0])
            rollups.on_write = timeout
            # the first pass takes 4 + 1 + 1 + 1 s, so the bound runs out during the second
            results = await asyncio.wait_for(rollup_task(keys, events, rollups, mark, max_wait_s=3.5,
                                                         pressure=BackPressure(ratio=0)), DEADLINE_S)
            ended = time.monotonic() + ahead[0]
            assert results == []
            proven = calls[PROBES]  # a's batch and PROBES counters alone: the call waits for the store from there
            assert ended - proven <= 3.5 + 1.0 + 0.5, (ended - proven, rollups.writes)
            assert rollups.writes[:1 + PROBES] == [5] + [1] * PROBES and set(rollups.writes[1 + PROBES:]) == {5}
            for ns in namespaces:
                assert all(s.stale for s in (await rollups.get_many(keys_of(COUNTERS[:5], ns))).values())
    asyncio.run(scenario())


def test_counters_whose_new_rollup_is_still_behind_and_cannot_be_signalled_again_are_left_for_the_sweep(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The rollups are done, but their counters' last write is still ahead of them, and the broker refuses the
    signals asking for their next rollup: the rollup step raised, and the worker rolled the whole batch up again. The
    counters are stale, so the sweep signals them again: one line, and the step is done."""
    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            mark = await written(events, rollups, COUNTERS[:3], last_write_ahead=True)
            tried: list[list[Key]] = []

            async def broker_away(keys: list[Key]) -> None:
                tried.append(list(keys))
                raise ConnectionError("broker away")
            await asyncio.wait_for(_rollup(worker(events, rollups, mark, broker_away), set(keys_of(COUNTERS[:3]))),
                                   DEADLINE_S)
            assert [sorted(k) for k in tried] == [keys_of(COUNTERS[:3])] and rollups.writes == [3]
            states = await rollups.get_many(keys_of(COUNTERS[:3]))
            assert all(s.rollup_ts > 0 and s.stale for s in states.values())  # rolled up, still behind: swept
            assert (NS.name, "c00") in await rollups.stale(limit=10)
            [line] = lines(caplog, "could not be signalled again")
            assert "3 counter(s)" in line and "left for the sweep" in line, line
    with caplog.at_level(logging.WARNING, logger="counter.worker"):
        asyncio.run(scenario())


def test_one_outage_over_several_calls_is_logged_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The worker's outage outlives a call: a store away for longer than the calls' wait is one "looks unavailable"
    line, one traceback and one "is back" line, not a pair (or none) and a traceback for every call."""
    monkeypatch.setattr("agents.rollup_batches.MAX_WAIT_S", 0.2)

    async def scenario() -> None:
        async with stores(tmp_path) as (events, rollups):
            mark = await written(events, rollups, COUNTERS[:15])

            async def send_signals(keys: list[Key]) -> None:
                pass
            p = worker(events, rollups, mark, send_signals)
            rollups.down = True
            for part in (COUNTERS[:5], COUNTERS[5:10]):  # each waits 0.2 s, then leaves its counters to the sweep
                await asyncio.wait_for(_rollup(p, set(keys_of(part))), DEADLINE_S)
            assert p.outage.active
            rollups.down = False
            await asyncio.wait_for(_rollup(p, set(keys_of(COUNTERS[10:15]))), DEADLINE_S)
            assert not p.outage.active
            assert len(lines(caplog, "looks unavailable")) == 1 and len(lines(caplog, "is back")) == 1, caplog.text
            assert len(lines(caplog, "left for the sweep")) == 2, caplog.text
            assert len([r for r in caplog.records if r.exc_info]) == 1, caplog.text
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())


def test_a_store_going_away_during_the_last_counters_tried_alone_is_waited_for(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A batch fails for its bad counter, and the store goes away while its last two counters are rolled up alone:
    too few failures to prove an outage before the batch ends, they were left to the sweep while the next batch of
    the namespace waited for the store. Failing again when tried once more, they now wait for it too."""
    async def scenario() -> None:
        counters = ["bad", *COUNTERS[:9]]  # one batch; "bad" fails before its write
        async with stores(tmp_path, PoisonedEvents) as (events, rollups):
            mark = await written(events, rollups, counters)

            def away_at_the_eighth(namespace: str, batch: list[str]) -> None:
                rollups.down = rollups.down or batch == [COUNTERS[7]]
            rollups.on_write = away_at_the_eighth
            task = rollup_task(counters, events, rollups, mark)
            await rollups.tried_or_done(9 + 2 + 3, task)  # 7 done alone, 2 failing, 2 tried again, then retries
            assert not task.done(), f"the rollups gave up while the store was away: {rollups.writes}"
            rollups.on_write, rollups.down = None, False
            results = await asyncio.wait_for(task, DEADLINE_S)
            assert sorted(r.key[1] for r in results) == COUNTERS[:9]
            [line] = lines(caplog, "left for")
            assert "1 counter(s) of 'ev'" in line and "'bad'" in line, line
            assert len(lines(caplog, "looks unavailable")) == 1 and len(lines(caplog, "is back")) == 1, caplog.text
    with caplog.at_level(logging.WARNING, logger="agents.rollup"):
        asyncio.run(scenario())
