"""agents.retention.drop_expired_events: the mark where events may be gone reaches the rollup store before the
slices go (real SQLite stores). A stop between the two, the other way round, left slices gone and no mark, and a
recount then set a count of 71 to the 1 its remaining events held (a review)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agents.retention import drop_expired_events
from control_plane import parse_namespaces
from schemas import MICROS
from sinks import Partitioning, SqliteEventStore, SqliteRollupStore, dropped_key

REGISTRY = parse_namespaces({"namespaces": {"ev": {
    "counter_type": "EVENTUAL", "accept_limit": "2s", "max_clock_skew": "500ms",
    "retention": {"close_after": "1h", "delete_after": "1h"},
    "time_partition": {"buckets_per_id": 1, "seconds_per_bucket": 60, "seconds_per_slice": 600}}}})
NS = REGISTRY["ev"]
T = 1_795_000_000 * MICROS
H = 3600 * MICROS


class StoppedInTheDrop(SqliteEventStore):
    """The worker stopped (kill -9, power) as it dropped the slices: they stay."""

    async def drop_expired_slices(self, namespace: str, before_us: int, rolled_up_to_us: int) -> int:
        raise KeyboardInterrupt


def stores(tmp_path: Path, events_class: type[SqliteEventStore] = SqliteEventStore
           ) -> tuple[SqliteEventStore, SqliteRollupStore]:
    return (events_class(tmp_path / "events.sqlite3", lambda _ns: Partitioning.of(NS.time_partition)),
            SqliteRollupStore(tmp_path / "rollups.sqlite3"))


def test_the_mark_is_stored_before_the_slices_are_dropped(tmp_path: Path) -> None:
    async def scenario() -> None:
        events, rollups = stores(tmp_path, StoppedInTheDrop)
        await events.write_events([("ev", "c", T + 10 * MICROS, "old", "", 70, False),
                                   ("ev", "c", T + 2 * H, "new", "", 1, False)])
        await rollups.write_rollup("ev", "c", 71, T + 2 * H + MICROS)
        with pytest.raises(KeyboardInterrupt):
            await drop_expired_events(events, rollups, NS, T + 2 * H + 10 * MICROS)
        assert await rollups.watermarks(dropped_key("ev")) == {0: T + H + 10 * MICROS}
        assert len(await events.slices("ev")) == 2  # nothing dropped: the mark is only early
        await events.close()
        await rollups.close()
    asyncio.run(scenario())


def test_nothing_to_drop_marks_nothing_and_a_drop_marks_its_cutoff(tmp_path: Path) -> None:
    """A namespace whose events are all kept has no mark (a recount checks its totals from zero)."""
    async def scenario() -> None:
        events, rollups = stores(tmp_path)
        await events.write_events([("ev", "c", T + 10 * MICROS, "old", "", 70, False),
                                   ("ev", "c", T + 2 * H, "new", "", 1, False)])
        await rollups.write_rollup("ev", "c", 71, T + 2 * H + MICROS)
        assert await drop_expired_events(events, rollups, NS, T + H) == 0  # within delete_after
        assert await rollups.watermarks(dropped_key("ev")) == {}
        assert await drop_expired_events(events, rollups, NS, T + 2 * H + 10 * MICROS) == 1
        assert await rollups.watermarks(dropped_key("ev")) == {0: T + H + 10 * MICROS}
        [(_table, start, end)] = await events.slices("ev")  # the new event's slice stays
        assert start <= T + 2 * H < end
        await events.close()
        await rollups.close()
    asyncio.run(scenario())
