"""query_api.live_reads.LiveReads: the live counts of one loop pass read with one store call per namespace, on a
real SQLite event store; the answers are the scan semantics (a clear resets, an add at the clear's time is erased)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from query_api.live_reads import MAX_WINDOWS_PER_CALL, LiveReads
from sinks import Aggregate, Partitioning, SqliteEventStore
from sinks.model import EventRow

T = 1_700_000_000_000_000
S = 1_000_000
PART = Partitioning(buckets_per_id=4, seconds_per_bucket=10, seconds_per_slice=60)


class CountingStore(SqliteEventStore):
    """The real store, recording each aggregate_many call (namespace, windows) and failing on demand."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: list[tuple[str, int]] = []
        self.fail = False

    async def aggregate_many(self, namespace: str, windows: Sequence[tuple[str, int, int]]) -> list[Aggregate]:
        self.calls.append((namespace, len(windows)))
        if self.fail:
            raise ConnectionError("store unreachable")
        return await super().aggregate_many(namespace, windows)


@pytest.fixture
def events(tmp_path):
    store = CountingStore(tmp_path / "events.sqlite3", lambda ns: PART)
    yield store
    asyncio.run(store.close())


def add(ns: str, counter: str, at: int, delta: int, token: str) -> EventRow:
    return (ns, counter, at, token, "", delta, False)


def clear(ns: str, counter: str, at: int, token: str) -> EventRow:
    return (ns, counter, at, token, "", 0, True)


def test_one_store_call_per_namespace_per_pass_with_the_scan_semantics(events):
    async def scenario():
        await events.write_events([
            add("a", "plain", T + 1 * S, 5, "p1"), add("a", "plain", T + 2 * S, 7, "p2"),
            add("a", "plain", T - 1 * S, 100, "before"),  # at or before the rollup: already counted
            add("a", "cleared", T + 1 * S, 5, "c1"), clear("a", "cleared", T + 2 * S, "c2"),
            add("a", "cleared", T + 2 * S, 40, "c3"),  # at the clear's very time: erased by it
            add("a", "cleared", T + 3 * S, 2, "c4"),
            add("a", "late", T + 90 * S, 9, "l1"),  # in a later slice than the others
            add("b", "plain", T + 1 * S, 11, "b1"),
        ])
        live = LiveReads(events)
        upto = T + 120 * S
        answers = [live.plus_live("a", "plain", 1_000, T, upto), live.plus_live("a", "cleared", 1_000, T, upto),
                   live.plus_live("a", "late", 3, T, upto), live.plus_live("a", "none", 8, T, upto),
                   live.plus_live("b", "plain", 1, T, upto), live.plus_live("a", "plain", 1_000, T + 1 * S, upto)]
        return await asyncio.gather(*answers)

    assert asyncio.run(scenario()) == [1_012, 2, 12, 8, 12, 1_007]
    assert sorted(events.calls) == [("a", 5), ("b", 1)]  # every read of the pass in one call per namespace


def test_reads_of_later_passes_are_read_again_and_an_empty_range_reads_nothing(events):
    async def scenario():
        live = LiveReads(events)
        first = await live.plus_live("a", "c", 4, T, T + S)
        await events.write_events([add("a", "c", T + S, 6, "t1")])
        second = await live.plus_live("a", "c", 4, T, T + S)
        empty = await live.plus_live("a", "c", 4, T + S, T + S)  # nothing can be after the rollup
        return first, second, empty

    assert asyncio.run(scenario()) == (4, 10, 4)
    assert events.calls == [("a", 1), ("a", 1)]


def test_a_busy_pass_is_split_into_bounded_store_calls(events):
    async def scenario():
        live = LiveReads(events)
        n = MAX_WINDOWS_PER_CALL + 3
        return await asyncio.gather(*(live.plus_live("a", f"c{i}", i, T, T + S) for i in range(n)))

    assert asyncio.run(scenario()) == list(range(MAX_WINDOWS_PER_CALL + 3))
    assert events.calls == [("a", MAX_WINDOWS_PER_CALL), ("a", 3)]


def test_a_store_error_reaches_every_reader_of_the_batch(events):
    async def scenario():
        live = LiveReads(events)
        events.fail = True
        results = await asyncio.gather(live.plus_live("a", "x", 1, T, T + S), live.plus_live("a", "y", 1, T, T + S),
                                       return_exceptions=True)
        events.fail = False
        return results, await live.plus_live("a", "x", 1, T, T + S)  # the next pass reads again

    results, after = asyncio.run(scenario())
    assert [type(r) for r in results] == [ConnectionError, ConnectionError]
    assert after == 1


def test_a_clear_after_a_window_zeros_it_and_one_before_the_window_does_not(events):
    """A window's read (`clears_upto_us`): a clear after the window's end and after the rollup erases every event of
    the window, the counted part too; a clear inside the window resets as for a total; one at or before the read's
    start changes nothing. Still one store call for the pass."""
    async def scenario():
        await events.write_events([add("a", "c", T + 1 * S, 5, "a1"), add("a", "c", T + 2 * S, 7, "a2"),
                                   clear("a", "c", T + 5 * S, "x"), add("a", "c", T + 6 * S, 3, "a3")])
        live = LiveReads(events)
        horizon = T + 60 * S
        return await asyncio.gather(
            live.plus_live("a", "c", 100, T, T + 3 * S, clears_upto_us=horizon),  # clear after the window: 0
            live.plus_live("a", "c", 100, T, T + 3 * S),  # the range alone, as before: 100 + 12
            live.plus_live("a", "c", 100, T + 4 * S, T + 3 * S, clears_upto_us=horizon),  # all rolled up: still 0
            live.plus_live("a", "c", 100, T, T + 8 * S, clears_upto_us=horizon),  # the clear inside: the adds after it
            live.plus_live("a", "c", 100, T + 5 * S, T + 8 * S, clears_upto_us=horizon),  # the clear not after: +3
            live.plus_live("a", "c", 100, T + 6 * S, T + 6 * S, clears_upto_us=T + 6 * S))  # nothing to read

    assert asyncio.run(scenario()) == [0, 112, 0, 3, 103, 100]
    assert events.calls == [("a", 4 + 4)]  # four ranges and four after a window (the third read has none): one call
