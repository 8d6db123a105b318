"""Kafka positions: where a read of a topic starts, and when each partition has been read to its end.

Used by the long-running jobs (`jobs.replay`, `jobs.dlq`) and the CLI's argument checks:

* `parse_position` turns `--from`/`--to` text (`earliest`, an ISO-8601 time or epoch, `P:O[,P:O...]`) into a
  `Position`;
* `watermarks` and `resolve_start` turn a start `Position` into an offset per partition with a consumer;
* `PartitionEnds` decides when each partition has been read to the end it had when reading started (and
  enforces `--to`), `fetch_positions` feeds it the consumer's fetch positions.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition

from schemas import MICROS, ValidationError, parse_generation_time

_OFFSETS = re.compile(r"^\s*\d+\s*:\s*\d+\s*(,\s*\d+\s*:\s*\d+\s*)*$")


class PositionError(ValueError):
    """A position that does not fit the topic (e.g. offsets for partitions it does not have)."""


@dataclass(frozen=True, slots=True)
class Position:
    """`earliest`, a time (epoch µs) or explicit offsets per partition."""

    kind: str  # "earliest" | "time" | "offsets"
    time_us: int | None = None
    offsets: dict[int, int] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.kind == "offsets":
            return ",".join(f"{p}:{o}" for p, o in sorted(self.offsets.items()))
        if self.kind == "time":
            return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((self.time_us or 0) / MICROS)) + "Z"
        return self.kind


def parse_position(text: str, *, allow_earliest: bool = True) -> Position:
    """`earliest` | `P:O[,P:O...]` | an ISO-8601 time (or epoch s/ms/µs); ValueError naming what was expected."""
    value = text.strip()
    if value.lower() == "earliest":
        if not allow_earliest:
            raise ValueError("'earliest' is a start, not an end; give a time or P:O,...")
        return Position("earliest")
    if _OFFSETS.match(value):
        offsets: dict[int, int] = {}
        for part in value.split(","):
            p, o = (int(x) for x in part.split(":"))
            if p in offsets:
                raise ValueError(f"partition {p} given twice in {text!r}")
            offsets[p] = o
        return Position("offsets", offsets=offsets)
    try:
        return Position("time", time_us=parse_generation_time(value, field="position"))
    except ValidationError as exc:
        raise ValueError(f"expected 'earliest', an ISO-8601 time or P:O[,P:O...], got {text!r} ({exc})") from None


# -- resolving a start position to offsets ------------------------------------------------------------------


def watermarks(consumer: Any, topic: str, partitions: list[int], timeout: float = 10) -> dict[int, tuple[int, int]]:
    """(low, reported high) watermark per partition, from a confluent-kafka `Consumer`."""
    return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout) for p in partitions}


def resolve_start(consumer: Any, topic: str, position: Position, marks: dict[int, tuple[int, int]],
                  timeout: float = 10) -> dict[int, int]:
    """The offset to start at per partition (those of `marks`, or those `position` lists).

    `earliest`: each partition's low watermark; a time: the first record appended at or after it (the end of a
    partition with none); offsets: as given, for partitions the topic has. Never before a low watermark."""
    if position.kind == "earliest":
        starts = {p: low for p, (low, _high) in marks.items()}
    elif position.kind == "time":
        ms = (position.time_us or 0) // 1000
        found = consumer.offsets_for_times([TopicPartition(topic, p, ms) for p in sorted(marks)], timeout=timeout)
        starts = {tp.partition: tp.offset if tp.offset >= 0 else marks[tp.partition][1] for tp in found}
    else:
        unknown = sorted(set(position.offsets) - set(marks))
        if unknown:
            raise PositionError(f"--from names partition(s) {unknown} that {topic!r} does not have "
                                f"(it has {len(marks)})")
        starts = dict(position.offsets)
    return {p: max(o, marks[p][0]) for p, o in starts.items()}


def fetch_positions(consumer: Any, topic: str, ends: PartitionEnds) -> dict[int, int]:
    """The consumer's fetch position of every partition `ends` still reads (for `PartitionEnds.idle`)."""
    live = [TopicPartition(topic, p) for p in ends.parts if not ends.done(p)]
    if not live:
        return {}
    return {tp.partition: tp.offset for tp in consumer.position(live) if tp.offset >= 0}


# -- reading a partition to its end ----------------------------------------------------------------------


@dataclass(slots=True)
class _Part:
    high: int  # high watermark reported when reading started
    stop_offset: int | None  # exclusive, from --to P:O
    position: int  # next offset to read
    last_seen: float  # monotonic time of the last record (or of the start)
    done: bool = False


class PartitionEnds:
    """Decides when each partition has been read to the end it had when reading started.

    Why not just "position >= high watermark": the local broker (Tansu) reports the base offset of the
    partition's last record batch + 1 as the high watermark, not the true end, so records of that last batch
    lie beyond it. A fetch returns whole batches, so they arrive right after the record at high - 1. Hence a
    partition is finished only when its position has reached the reported high watermark AND one of:
    * a bounded poll (`quiet_s`) brought nothing more for it (the end of a quiet topic), or
    * a record stamped after reading started (+ `margin_us` for clock skew) shows up: it was appended later
      (a live topic never goes quiet: workers append heartbeats to counter-mutations every 250 ms, and
      producers keep writing). Records stamped earlier but appended later are read too, which is harmless.
    With Apache Kafka the high watermark is exact and the same rule holds (the extra poll costs `quiet_s`).
    `--to` ends are enforced too: the first record at or after `stop_offset`, or stamped after `stop_after_us`.
    """

    def __init__(self, *, snapshot_us: int, margin_us: int = MICROS, quiet_s: float = 1.0,
                 stop_after_us: int | None = None) -> None:
        self.snapshot_us = snapshot_us
        self.margin_us = margin_us
        self.quiet_s = quiet_s
        self.stop_after_us = stop_after_us
        self.parts: dict[int, _Part] = {}
        self._drained_at = float("-inf")  # monotonic time of the last poll that left the consumer's queue empty

    def add(self, partition: int, *, start: int, high: int, stop_offset: int | None = None) -> None:
        part = _Part(high, stop_offset, start, time.monotonic())
        part.done = stop_offset is not None and start >= stop_offset
        self.parts[partition] = part

    def accept(self, partition: int, offset: int, timestamp_us: int) -> bool:
        """Whether this record belongs to the read; a record that does not ends its partition."""
        part = self.parts.get(partition)
        if part is None or part.done:
            return False
        part.last_seen = time.monotonic()
        if part.stop_offset is not None and offset >= part.stop_offset:
            part.done = True
            return False
        if self.stop_after_us is not None and timestamp_us > self.stop_after_us:
            part.done = True
            return False
        if offset >= part.high and timestamp_us > self.snapshot_us + self.margin_us:
            part.done = True
            return False
        part.position = offset + 1
        return True

    def idle(self, positions: dict[int, int] | None = None, *, drained: bool = True) -> list[int]:
        """Mark partitions finished that reached their high watermark and stayed quiet; returns them.

        `positions` (the consumer's fetch positions) cover offsets consumed without a record to show for
        them (transaction markers, compacted gaps). `drained`: the poll just made returned fewer records than it
        asked for, so nothing waited in the consumer's queue. A partition is quiet only after such a poll since
        its last record: the rest of its last batch arrives in the same fetch, but can wait in the queue behind
        other partitions' records while a long batch is handled (a replay on a loaded machine took 15 of 20
        records, its last batches left in the queue past the quiet time)."""
        now = time.monotonic()
        if drained:
            self._drained_at = now
        finished = []
        for p, part in self.parts.items():
            if part.done:
                continue
            if positions and positions.get(p, -1) > part.position:
                part.position = positions[p]
            reached_stop = part.stop_offset is not None and part.position >= part.stop_offset
            quiet_at_end = (part.position >= part.high and now - part.last_seen >= self.quiet_s
                            and self._drained_at >= part.last_seen)
            if reached_stop or quiet_at_end:
                part.done = True
                finished.append(p)
        return finished

    def done(self, partition: int) -> bool:
        part = self.parts.get(partition)
        return part is None or part.done

    @property
    def all_done(self) -> bool:
        return all(part.done for part in self.parts.values())

    def remaining(self) -> int:
        """Records still to read up to the reported high watermarks (an estimate: see the class doc)."""
        return sum(max(0, part.high - part.position) for part in self.parts.values() if not part.done)
