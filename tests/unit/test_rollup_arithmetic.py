"""Rollup arithmetic is exact: any mix of adds, clears and redeliveries, in any order and chunking,
rolled up at any increasing boundaries, ends at the oracle's count.

Runs against the real (embedded) SQLite store. Boundaries respect immutability the way admission +
the persist watermark guarantee it: a rollup to B happens only once every event with
event_time <= B has been written (redeliveries of older events may still arrive afterwards).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sinks import Aggregate, EventRow, Partitioning, SqliteEventStore, SqliteRollupStore, apply_aggregate

STEP_US = 500_000  # event times: 16 half seconds, so ties are common and buckets (1 s), slices (2 s) crossed
PART = Partitioning(buckets_per_id=2, seconds_per_bucket=1, seconds_per_slice=2)
NS = "arith"

Identity = tuple[int, str, str]  # (event_time, event_id, event_item_key) within one counter

identities = st.tuples(st.integers(1, 16).map(lambda k: k * STEP_US), st.sampled_from("abcd"),
                       st.sampled_from(["", "item"]))
payloads = st.tuples(st.integers(-5, 9), st.booleans().flatmap(
    lambda maybe: st.booleans() if maybe else st.just(False)))  # clears ~1 in 4
_counters = itertools.count()


class Harness:
    def __init__(self, directory: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.events = SqliteEventStore(directory / "events.sqlite3", lambda ns: PART)
        self.rollups = SqliteRollupStore(directory / "rollups.sqlite3")

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.events.close())
        self.run(self.rollups.close())
        self.loop.close()


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    h = Harness(tmp_path_factory.mktemp("arith"))
    yield h
    h.close()


def expected(events: dict[Identity, tuple[int, bool]], upto: int) -> int:
    """Sum of distinct adds after the latest clear, over events with event_time <= upto."""
    chosen = {k: v for k, v in events.items() if k[0] <= upto}
    clears = [k[0] for k, (_, is_clear) in chosen.items() if is_clear]
    last = max(clears, default=None)
    return sum(d for k, (d, is_clear) in chosen.items() if not is_clear and (last is None or k[0] > last))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.dictionaries(identities, payloads, max_size=30), data=st.data())
def test_rollups_converge_to_the_oracle(harness: Harness, events: dict[Identity, tuple[int, bool]],
                                        data: st.DataObject) -> None:
    counter = f"c{next(_counters)}"
    deliveries: list[EventRow] = []
    for identity, (delta, is_clear) in events.items():
        copies = data.draw(st.integers(1, 3), label="deliveries")
        deliveries += [(NS, counter, *identity, delta, is_clear)] * copies
    deliveries = data.draw(st.permutations(deliveries), label="order")

    count, rollup_ts = 0, 0

    def roll_up(boundary: int) -> None:
        nonlocal count, rollup_ts
        agg: Aggregate = harness.run(harness.events.aggregate(NS, counter, rollup_ts, boundary))
        count = apply_aggregate(count, agg)
        assert harness.run(harness.rollups.write_rollup(NS, counter, count, boundary))
        rollup_ts = boundary
        assert count == expected(events, boundary)  # exact at every boundary, not only at the end

    written: set[Identity] = set()
    pos = 0
    while pos < len(deliveries):
        size = data.draw(st.integers(1, 8), label="chunk")
        chunk = deliveries[pos:pos + size]
        pos += size
        harness.run(harness.events.write_events(chunk))
        written.update((t, eid, key) for _, _, t, eid, key, _, _ in chunk)
        # Immutability: B may only cover event times whose every event is already in the store.
        unwritten = [k[0] for k in events if k not in written]
        ceiling = min(unwritten, default=17 * STEP_US) - 1
        if ceiling > rollup_ts and data.draw(st.booleans(), label="roll up now"):
            roll_up(data.draw(st.integers(rollup_ts + 1, ceiling), label="boundary"))

    roll_up(max(rollup_ts, 17 * STEP_US) + 1)  # a final rollup past every event
    stored = harness.run(harness.rollups.get(NS, counter))
    assert stored is not None and (stored.count, stored.rollup_ts) == (count, rollup_ts)
    assert count == expected(events, 10**12)


def test_a_stale_rollup_cannot_overwrite_a_newer_one(harness: Harness) -> None:
    """Racing rollup workers: the one with the older boundary loses, whatever the order."""
    counter = f"race{next(_counters)}"
    assert harness.run(harness.rollups.write_rollup(NS, counter, 7, 2 * STEP_US))
    assert not harness.run(harness.rollups.write_rollup(NS, counter, 3, STEP_US))
    assert harness.run(harness.rollups.get(NS, counter)).count == 7
