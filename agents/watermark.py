"""The persist watermark (DESIGN invariant 3): per partition, a time before which every record is persisted.

For a partition this worker owns: if everything the broker holds (end offset fetched *now*) is persisted,
the mark is the time taken *before* that fetch, less the clock skew: any later record is appended after it.
Otherwise the mark is the timestamp of the last persisted record (less skew), since the next record cannot
be older on a LogAppendTime topic. Marks only hold rollups back; they never let one skip an event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from confluent_kafka import Consumer, TopicPartition

from schemas import MICROS


class WatermarkTracker:
    """Tracks persisted positions in memory and turns them into per-partition watermarks."""

    def __init__(self, bootstrap: str, topic: str, group_id: str, skew_s: float) -> None:
        self.topic = topic
        self.skew_us = int(skew_s * MICROS)
        self._persisted: dict[int, tuple[int, int]] = {}  # partition -> (next offset, last record ts µs)
        self._lock = threading.Lock()
        # A query-only client: it never subscribes, so it never joins (or disturbs) the worker's group.
        self._client = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id,
                                 "enable.auto.commit": False, "client.id": "counter-watermark"})

    def persisted(self, partition: int, offset: int, timestamp_us: int) -> None:
        """Record that everything up to and including `offset` on `partition` is in the store."""
        with self._lock:
            nxt, ts = self._persisted.get(partition, (0, 0))
            self._persisted[partition] = (max(nxt, offset + 1), max(ts, timestamp_us))

    def compute(self, partitions: Iterable[int], timeout: float = 5.0) -> dict[int, int]:
        """Watermarks (µs) for the given owned partitions; blocking, call from a thread."""
        partitions = sorted(partitions)
        if not partitions:
            return {}
        t0 = time.time_ns() // 1000 - self.skew_us
        committed = {tp.partition: tp.offset for tp in self._client.committed(
            [TopicPartition(self.topic, p) for p in partitions], timeout=timeout)}
        marks: dict[int, int] = {}
        for p in partitions:
            _low, end = self._client.get_watermark_offsets(TopicPartition(self.topic, p), timeout=timeout,
                                                           cached=False)
            with self._lock:
                nxt, last_ts = self._persisted.get(p, (0, 0))
            position = max(nxt, committed.get(p, -1))
            if position >= end:
                marks[p] = t0
            elif last_ts:
                marks[p] = last_ts - self.skew_us
        return marks

    def close(self) -> None:
        self._client.close()
