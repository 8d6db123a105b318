"""BEST_EFFORT counters without memcached (`sinks.memory.counters.InProcessCounters`): bounded as memcached is.

Before: a counter past its TTL read 0 but stayed in the dict for the process's life; 200,000 names written once held
about 48 MB of the API (a review)."""

from __future__ import annotations

import asyncio

from sinks.memory.counters import InProcessCounters


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_expired_counters_are_dropped_and_live_ones_kept() -> None:
    async def scenario() -> None:
        clock = Clock()
        counters = InProcessCounters(clock=clock)
        for i in range(10_000):
            await counters.add("be", f"c{i}", 1, 60.0)
        await counters.add("forever", "f", 5, None)
        assert len(counters) == 10_001
        clock.now += 30
        await counters.add("be", "c7", 2, 60.0)  # written again: lives 60 s from now
        clock.now += 31
        await counters.add("be", "fresh", 1, 60.0)
        assert len(counters) == 3, "the 9,999 counters past their TTL are gone"
        assert await counters.get("be", "c7") == 3
        assert await counters.get("be", "c8") == 0
        assert await counters.get("forever", "f") == 5
        await counters.add("be", "c8", 4, 60.0)
        assert await counters.get("be", "c8") == 4, "an expired counter starts again from its delta"
    asyncio.run(scenario())


def test_past_the_bound_the_least_recently_written_goes_never_the_write_itself() -> None:
    async def scenario() -> None:
        counters = InProcessCounters(max_counters=3, clock=Clock())
        for name in ("a", "b", "c"):
            await counters.add("ns", name, 1, None)
        await counters.add("ns", "a", 1, None)  # a is now the most recent
        await counters.add("ns", "d", 1, None)
        assert len(counters) == 3
        assert [await counters.get("ns", n) for n in "abcd"] == [2, 0, 1, 1]
        await counters.add("other", "x", 7, None)  # alone in its namespace: another namespace's oldest goes
        assert await counters.get("other", "x") == 7 and len(counters) == 3
        await counters.clear("other", "x")
        assert len(counters) == 2 and await counters.get("other", "x") == 0
    asyncio.run(scenario())


def test_a_count_saturates_at_the_int64_bounds_as_memcacheds_does() -> None:
    async def scenario() -> None:
        counters = InProcessCounters(clock=Clock())
        assert await counters.add("ns", "c", 2**63 - 1, None) == 2**63 - 1
        assert await counters.add("ns", "c", 5, None) == 2**63 - 1
        assert await counters.add("ns", "c", -(2**63), None) == -1
        assert await counters.add("ns", "c", -(2**63), None) == -(2**63)
    asyncio.run(scenario())


def test_a_namespace_no_longer_written_empties_as_others_are_written() -> None:
    """A review: expired counters were dropped only when their own namespace was written again."""
    async def scenario() -> None:
        clock = Clock()
        counters = InProcessCounters(clock=clock)
        for i in range(100):
            await counters.add("old", f"c{i}", 1, 10.0)
        clock.now += 11
        for i in range(3):
            await counters.add("new", f"n{i}", 1, 10.0)
        assert len(counters) == 3, "the old namespace's expired counters went with the new one's writes"
    asyncio.run(scenario())
