"""query_api.windows on real SQLite: a window's count equals the events it covers after the last clear, read from
a few coarse buckets; series are ordered, zero-filled, masked and bounded; bad requests name their field."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from agents.windows import BucketWork, maintain_buckets
from control_plane import Namespace, parse_namespaces
from query_api.windows import (
    DEFAULT_MAX_BUCKETS,
    TooManyBuckets,
    WindowError,
    granularity_of,
    parse_window,
    series,
    tiled_counts,
    window_count,
)
from schemas import MIN_EVENT_TIME
from sinks import EventRow, Partitioning, SqliteBucketStore, SqliteEventStore
from sinks.windows import Granularity, Segment, SignedSegment, align_down

S = 1_000_000
M, H, D = 60 * S, 3600 * S, 86400 * S
MINUTE, HOUR, DAY = Granularity.MINUTE, Granularity.HOUR, Granularity.DAY
DAY0 = 19_700 * D
START = DAY0 - 3 * D + 5 * H + 17 * S  # events over the 5 days before NOW
NOW = DAY0 + 2 * D + 7 * H + 11 * M + 3 * S


def namespace(windows: dict | None = None) -> Namespace:
    fields = {"counter_type": "ACCURATE", "windows": windows} if windows is not None else {"counter_type": "ACCURATE"}
    return parse_namespaces({"namespaces": {"ns": fields}})["ns"]


NS = namespace()  # minutes kept 48 h, hours 90 days, days forever


class CountingStore:
    """The bucket store, counting the rows and calls reads cost."""

    def __init__(self, store: SqliteBucketStore) -> None:
        self.store = store
        self.rows_read = 0
        self.calls = 0

    async def clears(self, namespace, counters):
        self.calls += 1
        return await self.store.clears(namespace, counters)

    async def read_buckets_many(self, namespace, ranges):
        self.calls += 1
        found = await self.store.read_buckets_many(namespace, ranges)
        self.rows_read += sum(len(rows) for rows in found)
        return found


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory):
    """Five days of a counter's events (clears included), rolled up every two hours as the worker would."""
    directory = tmp_path_factory.mktemp("reads")
    rng = random.Random(12)
    times = [START + rng.randrange(NOW - START - M) for _ in range(3000)]
    rows: list[EventRow] = [("ns", "c", t, f"e{i}", "", rng.randint(-2, 9), t < DAY0 - D and rng.random() < 0.01)
                            for i, t in enumerate(times)]  # a few clears in the first days
    rows += [("ns", "d", *r[2:]) for r in rows]  # counter d: the same events, without the late clear below
    rows.append(("ns", "c", DAY0 + 12 * H, "late-clear", "", 0, True))  # the latest: inside the minutes' 48 h
    part = Partitioning.of(NS.time_partition)

    async def build() -> None:
        events = SqliteEventStore(directory / "events.sqlite3", lambda _: part)
        buckets = SqliteBucketStore(directory / "buckets.sqlite3")
        for i in range(0, len(rows), 500):
            await events.write_events(rows[i:i + 500])
        previous = 0
        for boundary in [*range(START + 2 * H, NOW - M, 2 * H), NOW - 6 * S]:
            aggs = {c: await events.aggregate("ns", c, previous, boundary) for c in "cd"}
            work = [BucketWork(c, previous, boundary, agg.last_clear_us) for c, agg in aggs.items()]
            await maintain_buckets(NS, work, events=events, buckets=buckets, now_us=boundary + 6 * S)
            previous = boundary
        await events.close()
        await buckets.close()
    asyncio.run(build())
    return directory, rows


def reading(directory: Path):
    return CountingStore(SqliteBucketStore(directory / "buckets.sqlite3"))


class Known(dict):
    """Known bucket values that count their lookups."""

    lookups = 0

    def __contains__(self, key: object) -> bool:
        self.lookups += 1
        return super().__contains__(key)


def expected_count(rows: list[EventRow], lo: int, hi: int, upto: int, counter: str = "c") -> int:
    """The window's count from the events: the adds in [lo, hi) rolled up (<= upto) after the latest clear."""
    rows = [r for r in rows if r[1] == counter and r[2] <= upto]
    last = max((r[2] for r in rows if r[6]), default=None)
    return sum(r[5] for r in rows if lo <= r[2] < hi and not r[6] and (last is None or r[2] > last))


# -- window counts ---------------------------------------------------------------------------------------


def test_window_counts_equal_the_events_they_cover(history) -> None:
    directory, rows = history
    store = reading(directory)
    rng = random.Random(3)

    async def body() -> None:
        for i in range(120):
            counter = "cd"[i % 2]
            start = rng.randrange(START - H, NOW)
            end = rng.randrange(start + 1, NOW + H)
            got = await window_count(store, NS, counter, start, end, now_us=NOW)
            assert got.start_us <= start and got.end_us >= end  # aligned outwards, never narrower
            assert got.count == expected_count(rows, got.start_us, got.end_us, NOW - 6 * S, counter), (start, end)
            assert got.segments[0].start_us == got.start_us and got.segments[-1].end_us == got.end_us
        await store.store.close()
    asyncio.run(body())


def test_a_long_window_reads_tens_of_rows(history) -> None:
    directory, rows = history
    store = reading(directory)

    async def body():
        result = await window_count(store, NS, "c", NOW - 4 * D - 3 * H, NOW, now_us=NOW)
        await store.store.close()
        return result
    result = asyncio.run(body())
    assert result.count == expected_count(rows, result.start_us, result.end_us, NOW - 6 * S)
    assert {s.granularity for s in result.segments} == {MINUTE, HOUR, DAY}
    assert store.rows_read < 100 and store.calls == 2  # not the 5,940 minutes of the window


def test_windows_ending_before_the_clear_read_zero_and_the_one_holding_it_counts_what_follows(history) -> None:
    directory, rows = history
    store = reading(directory)
    clear = DAY0 + 12 * H
    assert max(r[2] for r in rows if r[6] and r[1] == "c") == clear  # the fixture's latest clear

    async def body() -> None:
        before = await window_count(store, NS, "c", clear - 20 * H, clear - 1, now_us=NOW)
        assert before.end_us <= clear and before.count == 0
        holding = await window_count(store, NS, "c", clear - 30 * M, clear + 30 * M, now_us=NOW)
        assert holding.count == expected_count(rows, holding.start_us, holding.end_us, NOW)
        assert holding.count == sum(r[5] for r in rows if r[1] == "c" and clear < r[2] < holding.end_us and not r[6])
        await store.store.close()
    asyncio.run(body())


def test_window_errors_name_the_window(history) -> None:
    directory, _rows = history
    store = reading(directory)

    async def body() -> None:
        with pytest.raises(WindowError, match="empty") as info:
            await window_count(store, NS, "c", NOW, NOW, now_us=NOW)
        assert info.value.field == "window"
        with pytest.raises(WindowError, match="keeps no time windows"):
            await window_count(store, namespace({"granularities": []}), "c", NOW - H, NOW, now_us=NOW)
        short = namespace({"granularities": ["minute"], "retention": {"minute": "2h"}})
        with pytest.raises(WindowError, match="before the oldest retained bucket") as info:
            await window_count(store, short, "c", NOW - 5 * H, NOW - 3 * H, now_us=NOW)
        assert info.value.field == "window"
        clamped = await window_count(store, short, "c", NOW - 5 * H, NOW, now_us=NOW)
        assert clamped.start_us == align_down(NOW - 2 * H, MINUTE)  # older than the retention: clamped
        await store.store.close()
    asyncio.run(body())


# -- series ----------------------------------------------------------------------------------------------


def test_series_are_ordered_zero_filled_and_masked(history) -> None:
    directory, rows = history
    store = reading(directory)
    clear = DAY0 + 12 * H

    async def body() -> None:
        got = await series(store, NS, "c", "hour", clear - 5 * H - 1, clear + 5 * H + 1, now_us=NOW)
        assert (got.granularity, got.start_us, got.end_us) == (HOUR, clear - 6 * H, clear + 6 * H)
        assert [start for start, _ in got.buckets] == list(range(got.start_us, got.end_us, H))  # zero-filled
        for start, value in got.buckets:
            if start + H <= clear:
                assert value == 0
            else:
                assert value == expected_count(rows, start, start + H, NOW)
        assert any(value for _start, value in got.buckets)
        minutes = await series(store, NS, "c", MINUTE, NOW - 90 * M, NOW, now_us=NOW)
        assert len(minutes.buckets) == 91 and sum(v for _s, v in minutes.buckets) == expected_count(
            rows, minutes.start_us, minutes.end_us, NOW - 6 * S)
        assert any(v == 0 for _s, v in minutes.buckets)  # empty minutes are there, as 0
        days = await series(store, NS, "c", DAY, START - 10 * D, NOW, now_us=NOW)  # days are kept forever
        assert days.start_us == align_down(START - 10 * D, DAY) and sum(v for _s, v in days.buckets) == \
            expected_count(rows, days.start_us, days.end_us, NOW - 6 * S)
        await store.store.close()
    asyncio.run(body())


def test_series_clamp_to_retention_and_refuse_too_many_buckets(history) -> None:
    directory, _rows = history
    store = reading(directory)

    async def body() -> None:
        old = await series(store, NS, "c", MINUTE, NOW - 3 * D, NOW - 47 * H, now_us=NOW)
        assert old.start_us == align_down(NOW - 48 * H, MINUTE) and len(old.buckets) == (old.end_us - old.start_us) // M
        with pytest.raises(WindowError, match="ends before the oldest retained minute bucket"):
            await series(store, NS, "c", MINUTE, NOW - 3 * D, NOW - 2 * D - H, now_us=NOW)
        with pytest.raises(TooManyBuckets, match=f"more than the limit of {DEFAULT_MAX_BUCKETS}") as info:
            await series(store, NS, "c", MINUTE, NOW - 2 * D, NOW, now_us=NOW)
        assert (info.value.limit, info.value.requested) == (DEFAULT_MAX_BUCKETS, 2 * 1440 + 1)
        assert "coarser granularity than minute" in str(info.value)
        exactly = await series(store, NS, "c", HOUR, DAY0 - 10 * H, DAY0, now_us=NOW, max_buckets=10)
        assert len(exactly.buckets) == 10
        with pytest.raises(TooManyBuckets):
            await series(store, NS, "c", HOUR, DAY0 - 10 * H, DAY0 + 1, now_us=NOW, max_buckets=10)
        with pytest.raises(WindowError) as info:
            await series(store, NS, "c", HOUR, NOW, NOW - 1, now_us=NOW)
        assert info.value.field == "end"
        await store.store.close()
    asyncio.run(body())


@pytest.mark.parametrize(("windows", "value", "reason"), [
    (None, "week", "must be one of minute, hour, day"),
    (None, 3, "must be one of"),
    ({"granularities": ["minute"]}, "day", "keeps no day buckets (it keeps: minute)"),
    ({"granularities": []}, "minute", "keeps no minute buckets (it keeps: none)"),
])
def test_granularity_errors_name_the_field(windows, value, reason) -> None:
    with pytest.raises(WindowError, match=reason.replace("(", r"\(").replace(")", r"\)")) as info:
        granularity_of(namespace(windows), value)
    assert info.value.field == "granularity"
    assert granularity_of(NS, " Hour ") is HOUR


def test_a_long_run_of_buckets_is_read_as_one_range_never_stepped(history) -> None:
    """A run of buckets between two known ones (or a whole segment) is one range, found without visiting its
    buckets one by one: a million minutes cost what two ranges cost."""
    directory, rows = history
    store = reading(directory)
    busy = align_down(min(r[2] for r in rows if r[1] == "d" and r[2] >= DAY0 + 8 * H), MINUTE)  # minutes kept
    known = Known({(MINUTE, busy): 0})
    parts = [SignedSegment(1, Segment(MINUTE, DAY0, DAY0 + 10**6 * M)), SignedSegment(1, Segment(DAY, 0, DAY0))]
    [got] = asyncio.run(tiled_counts(store, NS, ["d"], parts, [known]))
    assert known.lookups == 0 and store.calls == 2
    [whole] = asyncio.run(tiled_counts(store, NS, ["d"], parts))
    [minute] = asyncio.run(tiled_counts(store, NS, ["d"], [SignedSegment(1, Segment(MINUTE, busy, busy + M))]))
    assert minute.count != 0 and got.count == whole.count - minute.count


def test_a_series_starting_in_the_future_names_its_start(history) -> None:
    """Without an end (now), the start is at fault, not the end the client never gave."""
    directory, _rows = history
    with pytest.raises(WindowError, match="future") as info:
        asyncio.run(series(reading(directory), NS, "c", HOUR, NOW + D, NOW, now_us=NOW))
    assert info.value.field == "start"


# -- window specs ----------------------------------------------------------------------------------------


def test_parse_window() -> None:
    assert parse_window({"last": "1h"}, NOW) == (NOW - H, NOW)
    assert parse_window({"last": "0.000001s"}, NOW) == (NOW - 1, NOW)
    assert parse_window({"last": f"{NOW - MIN_EVENT_TIME}us"}, NOW) == (MIN_EVENT_TIME, NOW)  # back to 2000 exactly
    assert parse_window({"last": 90}, NOW) == (NOW - 90 * S, NOW)
    assert parse_window({"start": "2023-12-09T00:00:00Z", "end": "2023-12-10T00:00:00Z"}, NOW) == (
        1_702_080_000 * S, 1_702_166_400 * S)
    assert parse_window({"start": "2023-12-09T00:00:00+01:00"}, NOW) == (1_702_076_400 * S, NOW)


@pytest.mark.parametrize(("spec", "field", "reason"), [
    ({"last": "soon"}, "window.last", "cannot parse duration"),
    ({"last": 0}, "window.last", "positive"),
    ({"last": "0.0000001s"}, "window.last", "a microsecond or more"),  # not an empty window past the parse
    ({"last": "1000000d"}, "window.last", "before 2000-01-01"),  # refused before any bucket is tiled or read
    ({"last": "99999999999999999999999d"}, "window.last", "before 2000-01-01"),
    ({"start": "1999-12-31T23:59:59Z"}, "window.start", "2000..2200"),
    ({"start": "2200-12-31T00:00:00Z", "end": "2201-01-01T00:00:00Z"}, "window.end", "2000..2200"),
    # a future start, end defaulting to now: the start is at fault, and the message says so (it said "must be
    # after start", of the start itself: from a review)
    ({"start": "2100-01-01T00:00:00Z"}, "window.start", r"^must be before now \(2023-12-11T07:11:03\.000000Z\), "
                                                        "where a window without an end ends"),
    ({"start": NOW}, "window.start", "must be before now"),  # an empty window
    ({"last": "1h", "start": "2023-12-09T00:00:00Z"}, "window.last", "not both"),
    ({"end": "2023-12-09T00:00:00Z"}, "window", "needs last, or start"),
    ({"start": "yesterday"}, "window.start", "."),
    ({"start": "2023-12-09T00:00:00Z", "end": "2023-12-08T00:00:00Z"}, "window.end", "after start"),
    ({"since": "1h"}, "window.since", "unknown key"),
    ("1h", "window", "must be"),
])
def test_parse_window_errors_name_the_field(spec, field, reason) -> None:
    with pytest.raises(WindowError, match=reason) as info:
        parse_window(spec, NOW)
    assert info.value.field == field
