"""streams.positions: --from/--to syntax, resolving a start to offsets, and reading partitions to their end."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import TopicPartition

from schemas import MICROS
from streams.positions import (
    PartitionEnds,
    Position,
    PositionError,
    fetch_positions,
    parse_position,
    resolve_start,
    watermarks,
)

T = 1_700_000_000 * MICROS


def test_positions():
    assert parse_position("earliest").kind == "earliest"
    assert parse_position(" EARLIEST ") == Position("earliest")
    assert parse_position("0:12, 3:7").offsets == {0: 12, 3: 7}
    p = parse_position("2024-10-05T14:48:00Z")
    assert p.kind == "time" and p.time_us == 1728139680 * MICROS and str(p) == "2024-10-05T14:48:00Z"
    assert parse_position("1728139680").time_us == 1728139680 * MICROS  # epoch seconds
    assert str(parse_position("3:7,0:12")) == "0:12,3:7"
    with pytest.raises(ValueError, match="a start, not an end"):
        parse_position("earliest", allow_earliest=False)
    with pytest.raises(ValueError, match="expected 'earliest'"):
        parse_position("yesterday")
    with pytest.raises(ValueError, match="given twice"):
        parse_position("1:2,1:3")


class FakeConsumer:
    """The confluent-kafka Consumer calls the position helpers make, over fixed per-partition data."""

    def __init__(self, marks: dict[int, tuple[int, int]], by_time: dict[int, int], fetch: dict[int, int]) -> None:
        self.marks = marks
        self.by_time = by_time  # partition -> first offset at or after any asked time (-1: none)
        self.fetch = fetch
        self.asked: list[tuple[str, int, int]] = []

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return self.marks[tp.partition]

    def offsets_for_times(self, tps: list[TopicPartition], timeout: float) -> list:
        self.asked += [(tp.topic, tp.partition, tp.offset) for tp in tps]
        return [SimpleNamespace(partition=tp.partition, offset=self.by_time[tp.partition]) for tp in tps]

    def position(self, tps: list[TopicPartition]) -> list:
        return [SimpleNamespace(partition=tp.partition, offset=self.fetch.get(tp.partition, -1001)) for tp in tps]


def test_resolve_start_for_each_kind_of_position():
    consumer = FakeConsumer({0: (5, 100), 1: (0, 40), 2: (0, 0)}, {0: 60, 1: -1, 2: -1}, {})
    marks = watermarks(consumer, "t", [0, 1, 2])
    assert marks == {0: (5, 100), 1: (0, 40), 2: (0, 0)}
    assert resolve_start(consumer, "t", parse_position("earliest"), marks) == {0: 5, 1: 0, 2: 0}
    # A time: the first record appended at or after it (asked in ms); a partition without one starts at its end.
    assert resolve_start(consumer, "t", Position("time", time_us=T), marks) == {0: 60, 1: 40, 2: 0}
    assert consumer.asked == [("t", 0, T // 1000), ("t", 1, T // 1000), ("t", 2, T // 1000)]
    # Offsets: only the partitions named, never before the low watermark (deleted records).
    assert resolve_start(consumer, "t", parse_position("0:2,2:0"), marks) == {0: 5, 2: 0}
    with pytest.raises(PositionError, match=r"partition\(s\) \[7\] that 't' does not have \(it has 3\)"):
        resolve_start(consumer, "t", parse_position("0:1,7:3"), marks)


def test_partition_end_reads_past_a_high_watermark_that_stops_at_the_last_batch_base():
    """Tansu reports base offset of the last batch + 1: the rest of that batch must still be read."""
    ends = PartitionEnds(snapshot_us=T, margin_us=MICROS, quiet_s=3600)
    ends.add(0, start=0, high=51)  # true end: 60
    for offset in range(60):
        assert ends.accept(0, offset, T - MICROS)
    assert not ends.done(0) and ends.idle() == []  # at/after the reported end, but not quiet yet
    # A record stamped after the read started (a heartbeat, a new mutation) ends the partition, unread.
    assert not ends.accept(0, 60, T + 2 * MICROS)
    assert ends.done(0) and ends.all_done
    assert not ends.accept(0, 61, T - MICROS)  # and nothing after it is taken


def test_partition_end_by_quiet_poll_and_by_to_limits():
    ends = PartitionEnds(snapshot_us=T, quiet_s=0.0, stop_after_us=T - 10)
    ends.add(0, start=0, high=5)
    ends.add(1, start=0, high=3, stop_offset=2)
    ends.add(2, start=4, high=4)  # empty range: done once quiet
    ends.add(3, start=0, high=2)
    assert ends.remaining() == 5 + 3 + 0 + 2
    assert ends.accept(0, 0, T - 20)
    assert not ends.accept(0, 1, T - 5)  # stamped after --to
    assert ends.done(0)
    assert ends.accept(1, 0, T - 20) and ends.accept(1, 1, T - 20)
    assert not ends.accept(1, 2, T - 20)  # --to 1:2 is exclusive
    assert ends.accept(3, 0, T - 20)
    assert set(ends.idle()) == {2}  # partition 3 is below its high watermark: keep polling
    assert set(ends.idle({3: 2})) == {3}  # the consumer's position moved past a gap (e.g. a txn marker)
    assert ends.all_done


def test_fetch_positions_asks_only_for_partitions_still_read():
    ends = PartitionEnds(snapshot_us=T, quiet_s=3600)
    ends.add(0, start=0, high=10)
    ends.add(1, start=3, high=3, stop_offset=3)  # done from the start
    ends.add(2, start=0, high=10)
    consumer = FakeConsumer({}, {}, {0: 7})  # partition 2 has no fetch position yet (negative)
    assert fetch_positions(consumer, "t", ends) == {0: 7}
    ends.idle({0: 10})
    for p in (0, 2):
        ends.parts[p].done = True
    assert fetch_positions(consumer, "t", ends) == {}


def test_a_quiet_partition_ends_only_after_a_poll_that_left_the_queue_empty():
    """The rest of a partition's last batch can wait in the consumer's queue behind other partitions' records while
    a long batch is handled: past its quiet time it ends only once a poll returned less than it asked for."""
    ends = PartitionEnds(snapshot_us=T, quiet_s=0.0)
    ends.add(0, start=0, high=4)  # the last batch starts at 3; its other records are still queued
    for offset in range(4):
        assert ends.accept(0, offset, T - MICROS)
    assert ends.idle(drained=False) == [] and not ends.done(0)  # the poll was full: more may be queued
    assert ends.accept(0, 4, T - MICROS)  # the queued record comes in the next poll, and is taken
    assert ends.idle(drained=True) == [0] and ends.done(0)
