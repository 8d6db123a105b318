"""The persist watermark (DESIGN invariant 3), by punctuation: heartbeats through the mutations partitions.

Every `watermark_interval` the worker appends a tiny heartbeat record (header `counter.heartbeat`, empty
value) to each mutations partition it owns. Partitions are consumed in order, so once the persist agent
has persisted the batch holding a heartbeat, every record appended before it is in the store: the
partition's watermark becomes the heartbeat's timestamp (less the clock skew). A paused or lagging agent
reads its heartbeats late, so its watermark, and every rollup behind it, waits.

An idle worker sends them every `idle_s` instead (`HeartbeatPace`): a Tansu partition's fetches cost by its
length in batches, and heartbeats every 250 ms over 8 partitions add about 115,000 batches an hour to a stack
nobody writes to. The watermark then lags further behind, which only holds rollups back (never lets one
through early), and the worker sets `idle_s` where the rollup window hides it.

Why not end offsets: they would do on Apache Kafka, but the local broker (Tansu) reports the base offset
of the last batch + 1 as the high watermark, which would declare a half-read batch "caught up".
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable

from schemas import MICROS
from schemas.dead_letter import AnyHeaders
from schemas.record_headers import has_header

HEARTBEAT_HEADER = "counter.heartbeat"


def is_heartbeat(headers: AnyHeaders) -> bool:
    """Whether a record's headers (list of pairs or mapping, str or bytes names) mark a heartbeat."""
    return has_header(headers, HEARTBEAT_HEADER)


class WatermarkTracker:
    """Per-partition watermarks from the heartbeats this worker has persisted past."""

    def __init__(self, skew_s: float) -> None:
        self.skew_us = int(skew_s * MICROS)
        self._seen: dict[int, int] = {}
        self._lock = threading.Lock()

    def heartbeat_persisted(self, partition: int, timestamp_us: int) -> None:
        """Everything on `partition` appended before this heartbeat is now in the store."""
        with self._lock:
            if timestamp_us > self._seen.get(partition, 0):
                self._seen[partition] = timestamp_us

    def marks(self, partitions: Iterable[int]) -> dict[int, int]:
        """Watermarks (µs) of the given partitions that have seen a heartbeat."""
        with self._lock:
            return {p: self._seen[p] - self.skew_us for p in partitions if p in self._seen}


class HeartbeatPace:
    """Whether the next heartbeats are due: at every tick while writes are persisted, once every `idle_s` after
    only heartbeats were persisted for `idle_s`."""

    __slots__ = ("_data_at", "_sent_at", "idle_s")

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self._data_at = -math.inf  # monotonic time a batch with writes (not only heartbeats) was last persisted
        self._sent_at = -math.inf

    def writes_persisted(self, now: float) -> None:
        self._data_at = now

    def due(self, now: float) -> bool:
        return now - self._data_at < self.idle_s or now - self._sent_at >= self.idle_s

    def sent(self, now: float) -> None:
        self._sent_at = now
