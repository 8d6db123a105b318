"""Reads racing the worker's rollup step on real SQLite: a window, a series, Top-K and unique counts never count
events a clear erased, whichever of their store calls the step lands between, nor while the step has bumped the
clear but not rewritten the buckets yet; a unique count's live items start where its sketches end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agents.rollup import rollup_counters
from control_plane import Namespace, parse_namespaces
from query_api.service import CounterService
from query_api.topk import top_k
from query_api.unique import get_unique, unique_series
from query_api.windows import series, tiled_counts, window_count, window_tiling
from sinks import (
    InProcessRollupCache,
    Partitioning,
    SqliteBucketStore,
    SqliteEventStore,
    SqliteRollupStore,
    open_sketch_store,
)
from sinks.windows import Granularity, Segment, SignedSegment, align_down

S = 1_000_000
M, H = 60 * S, 3600 * S
MINUTE, HOUR = Granularity.MINUTE, Granularity.HOUR
_COMMON: dict[str, Any] = {"accept_limit": "2s", "max_clock_skew": "500ms",
                           "retention": {"close_after": "1h", "delete_after": "7d"}}
REGISTRY = parse_namespaces({"namespaces": {
    "ev": {**_COMMON, "counter_type": "EVENTUAL"},
    "u": {**_COMMON, "counter_type": "EVENTUAL", "aggregation": "UNIQUE"},
    "ua": {**_COMMON, "counter_type": "ACCURATE", "aggregation": "UNIQUE"},
}})
EV, U, UA = REGISTRY["ev"], REGISTRY["u"], REGISTRY["ua"]
NOW = time.time_ns() // 1000
HOUR0 = align_down(NOW - 3 * H, HOUR)  # hh:00, well within every retention
T0 = HOUR0 + 30 * M  # hh:30


class Signals:
    def emit(self, namespace: str, counter: str) -> None:
        pass


class Race:
    """Runs ``hook`` once, right after the reader's ``after``-th read call (buckets, clears, sketches or ranks)."""

    def __init__(self, after: int, hook: Callable[[], Awaitable[None]]) -> None:
        self.after, self.hook, self.calls = after, hook, 0

    async def read(self, awaitable: Awaitable[Any]) -> Any:
        got = await awaitable
        self.calls += 1
        if self.calls == self.after:
            await self.hook()
        return got

    async def finish(self) -> None:
        """Run the hook now if no read has reached it (the reader made fewer calls)."""
        if self.calls < self.after:
            self.calls = self.after
            await self.hook()


class Racing:
    """A store whose reads go through a Race; everything else is the store's."""

    def __init__(self, store: Any, race: Race) -> None:
        self.store, self.race = store, race

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if name in ("read_buckets_many", "clears", "read_sketches_many", "read_ranks_many"):
            return lambda *args, **kwargs: self.race.read(attr(*args, **kwargs))
        return attr


class Stack:
    def __init__(self, directory: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.events = SqliteEventStore(directory / "events.sqlite3",
                                       lambda name: Partitioning.of(REGISTRY[name].time_partition))
        self.rollups = SqliteRollupStore(directory / "rollups.sqlite3")
        self.buckets = SqliteBucketStore(directory / "buckets.sqlite3")
        self.sketches = open_sketch_store(self.buckets)
        self.service = CounterService(REGISTRY, producer=None, signals=Signals(), events=self.events,  # type: ignore[arg-type]
                                      rollups=self.rollups, cache=InProcessRollupCache(), counters=None,  # type: ignore[arg-type]
                                      buckets=self.buckets, sketches=self.sketches)

    def run(self, awaitable: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        for store in (self.events, self.rollups, self.buckets, self.sketches):
            self.run(store.close())
        self.loop.close()

    async def step(self, ns: Namespace, counter: str, boundary: int) -> None:
        """The worker's rollup step to ``boundary``: buckets, sketches, then the rollup."""
        accept, skew = int(ns.accept_limit_s * S), int(ns.max_clock_skew_s * S)
        await rollup_counters(ns, [counter], events=self.events, rollups=self.rollups, cache=self.service.cache,
                              watermark_us=boundary + accept + 1, now_us=boundary + accept + skew + 1,
                              buckets=self.buckets, sketches=self.sketches)

    def racing(self, after: int, hook: Callable[[], Awaitable[None]]) -> Race:
        race = Race(after, hook)
        self.service.buckets = Racing(self.buckets, race)  # type: ignore[assignment]
        self.service.sketches = Racing(self.sketches, race)  # type: ignore[assignment]
        return race

    def settle(self, race: Race) -> None:
        """The race is over: the hook has run, and reads go to the stores again."""
        self.run(race.finish())
        self.service.buckets, self.service.sketches = self.buckets, self.sketches


@pytest.fixture
def stack(tmp_path: Path):
    s = Stack(tmp_path)
    yield s
    s.close()


def history(stack: Stack, ns: Namespace) -> int:
    """+1 at hh:05 and +5 (items a..e) at hh:30 rolled up to hh:32; then, persisted but not rolled up, a clear at
    hh:40 and +2 (items f, g) at hh:45. Returns the boundary of the step that rolls those up."""
    n = ns.name
    stack.run(stack.events.write_events([(n, "c", HOUR0 + 5 * M, "e0", "z", 1, False),
                                         *((n, "c", T0 + 5 * S + i, f"e{i + 1}", "abcde"[i], 1, False)
                                           for i in range(5))]))
    stack.run(stack.step(ns, "c", T0 + 2 * M))
    stack.run(stack.events.write_events([(n, "c", T0 + 10 * M, "clr", "", 0, True),
                                         (n, "c", T0 + 15 * M, "f", "f", 1, False),
                                         (n, "c", T0 + 15 * M + 1, "g", "g", 1, False)]))
    return T0 + 18 * M


# What [hh:00, hh:50) counted at some moment: nothing yet, 1, 6, 0 after the clear, 2 after it. Never 8 or 7: the
# events before the clear with those after it.
SEEN = {0, 1, 6, 2}


def window_of(stack: Stack) -> int:
    return stack.run(window_count(stack.service.buckets, EV, "c", HOUR0, T0 + 20 * M, now_us=NOW)).count  # type: ignore[arg-type]


def series_of(stack: Stack) -> int:
    got = stack.run(series(stack.service.buckets, EV, "c", MINUTE, HOUR0, T0 + 20 * M, now_us=NOW))  # type: ignore[arg-type]
    return sum(count for _start, count in got.buckets)


def top_of(stack: Stack) -> int:
    got = stack.run(top_k(stack.service.buckets, EV, 1, HOUR0, T0 + 20 * M, now_us=NOW))  # type: ignore[arg-type]
    return got.items[0][1] if got.items else 0


def unique_of(stack: Stack) -> int:
    return stack.run(get_unique(stack.service, U, "c", {"start": HOUR0, "end": T0 + 20 * M}, now_us=NOW)
                     ).estimate.rounded


def unique_total_of(stack: Stack) -> int:
    return stack.run(get_unique(stack.service, U, "c", now_us=NOW)).estimate.rounded


def unique_series_of(stack: Stack) -> int:
    got, _as_of = stack.run(unique_series(stack.service, U, "c", "minute", HOUR0, T0 + 20 * M))
    return sum(count for _start, count in got.buckets)


@pytest.mark.parametrize("after", [1, 2, 3])
@pytest.mark.parametrize(("ns", "read"), [(EV, window_of), (EV, series_of), (EV, top_of), (U, unique_of),
                                          (U, unique_total_of), (U, unique_series_of)])
def test_a_read_racing_a_step_that_carries_a_clear_never_counts_what_it_erased(
        stack: Stack, ns: Namespace, read: Callable[[Stack], int], after: int) -> None:
    boundary = history(stack, ns)
    assert read(stack) == 6
    race = stack.racing(after, lambda: stack.step(ns, "c", boundary))
    assert read(stack) in SEEN
    stack.settle(race)
    assert read(stack) == 2


def test_reads_between_the_clear_bump_and_the_rewrite_agree_with_every_bucket(stack: Stack) -> None:
    """The worker bumps the clear, then rewrites the buckets: in between, the hour holding the clear still holds
    the events before it. It reads 0 like its minutes (it was computed before the clear), through a series, a
    signed cover and a value Top-K knew from its rank list, and so does its sketch."""
    for ns in (EV, U):
        boundary = history(stack, ns)
        stack.run(stack.buckets.bump_clears(ns.name, [("c", T0 + 10 * M)]))  # the step's first write, alone
        assert unique_of(stack) == 0 if ns is U else window_of(stack) == 0
    hourly = stack.run(series(stack.buckets, EV, "c", HOUR, HOUR0, HOUR0 + H, now_us=NOW))
    assert hourly.buckets == ((HOUR0, 0),) and series_of(stack) == 0
    minus_tail = [SignedSegment(1, Segment(HOUR, HOUR0, HOUR0 + H)),
                  SignedSegment(-1, Segment(MINUTE, HOUR0 + 50 * M, HOUR0 + H))]  # [hh:00, hh:50), as Top-K covers it
    tiling = window_tiling(EV, HOUR0, HOUR0 + 50 * M, NOW)
    [plain] = stack.run(tiled_counts(stack.buckets, EV, ["c"], [SignedSegment(1, s) for s in tiling.segments]))
    [signed] = stack.run(tiled_counts(stack.buckets, EV, ["c"], minus_tail))
    [known] = stack.run(tiled_counts(stack.buckets, EV, ["c"], minus_tail, [{(HOUR, HOUR0): 6}]))
    assert plain.count == signed.count == known.count == 0
    assert unique_total_of(stack) == 0
    stack.run(stack.step(EV, "c", boundary))
    stack.run(stack.step(U, "c", boundary))
    assert window_of(stack) == series_of(stack) == unique_of(stack) == 2
    [known] = stack.run(tiled_counts(stack.buckets, EV, ["c"], minus_tail, [{(HOUR, HOUR0): 2}]))
    assert known.count == 2


@pytest.mark.parametrize("after", [1, 2, 3])
def test_an_accurate_unique_count_racing_a_step_misses_no_item(stack: Stack, after: int) -> None:
    """The rollup is read before the sketches: a step landing after the sketches' read moves as_of past items they
    did not hold, and the live items would start after them."""
    t0 = NOW - 10 * M
    stack.run(stack.events.write_events([("ua", "home", t0, "v1", "user-1", 1, False)]))
    stack.run(stack.step(UA, "home", t0 + M))
    stack.run(stack.events.write_events([("ua", "home", t0 + 3 * M, "v2", "user-2", 1, False)]))
    assert stack.run(get_unique(stack.service, UA, "home")).estimate.rounded == 2
    race = stack.racing(after, lambda: stack.step(UA, "home", t0 + 5 * M))  # the clear, sketches, clear again
    assert stack.run(get_unique(stack.service, UA, "home")).estimate.rounded == 2
    stack.settle(race)
    assert stack.run(get_unique(stack.service, UA, "home")).estimate.rounded == 2


@pytest.mark.parametrize("after", [1, 2])
def test_a_series_as_of_never_claims_a_step_its_buckets_do_not_hold(stack: Stack, after: int) -> None:
    """GetCountSeries reads the rollup before the buckets, as a windowed GetCount does: read after them, a step
    landing in between moved as_of past buckets that did not hold it (a review)."""
    boundary = history(stack, EV)
    race = stack.racing(after, lambda: stack.step(EV, "c", boundary))
    got, as_of = stack.run(stack.service.get_series(EV, "c", "minute", HOUR0, T0 + 20 * M))
    stack.settle(race)
    counted = sum(count for _start, count in got.buckets)
    assert as_of is not None and (as_of < boundary or counted == 2), (as_of, boundary, counted)


@pytest.mark.parametrize("after", [1, 2, 3, 4, 5])
def test_a_top_k_as_of_never_claims_a_step_its_counts_do_not_hold(stack: Stack, after: int) -> None:
    """GetTopK read the returned counters' rollups after their counts: a step landing in between moved as_of past
    buckets that did not hold it (a review: 5 "exact as of" the boundary where GetCount said 8). Each count's rollup
    is now read before it."""
    boundary = history(stack, EV)
    race = stack.racing(after, lambda: stack.step(EV, "c", boundary))
    got = stack.run(stack.service.get_top_k(EV, 1, {"start": HOUR0, "end": T0 + 20 * M}))
    stack.settle(race)
    if not got.top.items:  # the step's clear read with its buckets: 0, no counter to vouch for
        assert got.as_of is None
        return
    [(_name, counted)] = got.top.items
    assert got.as_of is not None and (got.as_of < boundary or counted == 2), (got.as_of, boundary, counted)


@pytest.mark.parametrize("after", [1, 2, 3])
def test_a_top_k_cover_that_subtracts_never_mixes_two_steps(stack: Stack, after: int) -> None:
    """[hh:00, hh:50) is covered as the hour less its minutes from hh:50. The hour's value came from its rank list and
    a subtracted minute's from a later read: a step adding events at hh:57 in between (outside the window, inside
    the hour) made the old hour less the new minute, 5 - 3 = 2, a count the window never had (a review)."""
    n = EV.name
    stack.run(stack.events.write_events([*((n, "c", T0 + i * S, f"c{i}", "", 1, False) for i in range(5)),
                                         (n, "z", HOUR0 + 57 * M, "z0", "", 1, False)]))
    for counter in ("c", "z"):
        stack.run(stack.step(EV, counter, HOUR0 + 57 * M + 30 * S))

    async def late() -> None:
        await stack.events.write_events([(n, "c", HOUR0 + 57 * M + 40 * S + i, f"late{i}", "", 1, False)
                                         for i in range(3)])
        await stack.step(EV, "c", HOUR0 + 58 * M)

    def top() -> tuple[tuple[str, int], ...]:
        return stack.run(top_k(stack.service.buckets, EV, 2, HOUR0, HOUR0 + 50 * M, now_us=NOW)).items  # type: ignore[arg-type]

    assert top() == (("c", 5),)
    race = stack.racing(after, late)
    assert top() == (("c", 5),)
    stack.settle(race)
    assert top() == (("c", 5),)
