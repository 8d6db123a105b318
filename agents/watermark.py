"""The persist watermark (DESIGN invariant 3), by punctuation: heartbeats through the mutations partitions.

Every `watermark_interval` the worker appends a tiny heartbeat record (header `counter.heartbeat`, empty
value) to each mutations partition it owns. Partitions are consumed in order, so once the persist agent
has persisted the batch holding a heartbeat, every record appended before it is in the store: the
partition's watermark becomes the heartbeat's timestamp (less the clock skew). A paused or lagging agent
reads its heartbeats late, so its watermark, and every rollup behind it, waits.

An idle worker sends them every `idle_s` instead (`HeartbeatPace`), and none at all once the watermark covers
every write persisted so far (`heartbeats_needed`, `control_plane.admission.covering_watermark`): then no rollup
waits for it. A Tansu partition's fetches cost by its length in batches, and heartbeats every 250 ms over 8
partitions added about 115,000 batches an hour to a stack nobody writes to (every 2 s, 14,000), so an idle local
stack grew slower by the hour. A slower or stopped watermark only holds rollups back (never lets one through
early), and the worker sets `idle_s` where the rollup window hides it. With several workers, each publishes when
its partitions' latest writes reached Kafka (`sinks.written_key`), and every worker keeps heartbeating until its
own partitions' watermarks cover the latest write of any partition: a rollup needs all of them.

Why not end offsets: they would do on Apache Kafka, but the local broker (Tansu) reports the base offset
of the last batch + 1 as the high watermark, which would declare a half-read batch "caught up".
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

from control_plane import CounterType, Namespace
from schemas import MICROS
from sinks import RollupStore, written_key

log = logging.getLogger(__name__)


def heartbeat_skew_s(namespaces: Iterable[Namespace]) -> float:
    """How far ahead of a worker's clock another worker's heartbeat may be stamped (seconds): the largest
    max_clock_skew of the namespaces with rollups (1 s without one), which `agents.worker.build` also gives the
    WatermarkTracker.

    Heartbeats are the workers' own records, but the worker that reads one need not be the one that sent it (a
    partition handed over, a floor published by the previous owner), and on a CreateTime broker the sender's clock
    stamps it. A heartbeat is read after it was sent, so it is ahead of the reader's clock by at most the difference
    between the two workers' clocks. The watermark already trusts that difference to be within this skew: it takes a
    heartbeat at T to mean that every record before it reached Kafka by T - skew. A heartbeat further ahead would break
    that watermark anyway, so no larger bound is worth accepting; a smaller one (a namespace's own skew, or none) would
    refuse the heartbeats of a worker whose clock is ahead within what the deployment declares it allows, and the
    watermark would stand still. Anything past it is no worker's heartbeat: a client's record, or a worker whose clock
    is wrong beyond what every namespace allows."""
    return max((ns.max_clock_skew_s for ns in namespaces if ns.counter_type is not CounterType.BEST_EFFORT),
               default=1.0)


class WatermarkTracker:
    """Per-partition watermarks from the heartbeats this worker has persisted past, and when the latest writes it
    persisted reached Kafka."""

    def __init__(self, skew_s: float) -> None:
        self.skew_us = int(skew_s * MICROS)
        self._seen: dict[int, int] = {}
        self._written: dict[int, int] = {}
        self._lock = threading.Lock()

    def writes_persisted(self, written: Mapping[int, int]) -> None:
        """Records with writes that reached Kafka by these times (partition -> µs) are in the store."""
        with self._lock:
            for partition, arrived_us in written.items():
                if arrived_us > self._written.get(partition, 0):
                    self._written[partition] = arrived_us

    def written(self, partitions: Iterable[int]) -> dict[int, int]:
        """When the latest persisted write of each given partition reached Kafka (µs), where there was one."""
        with self._lock:
            return {p: self._written[p] for p in partitions if p in self._written}

    def heartbeat_persisted(self, partition: int, timestamp_us: int) -> None:
        """Everything on `partition` appended before this heartbeat is now in the store."""
        with self._lock:
            if timestamp_us > self._seen.get(partition, 0):
                self._seen[partition] = timestamp_us

    def forget(self, partitions: Iterable[int]) -> None:
        """A handover: the heartbeats seen on these partitions no longer make watermarks here. A worker given a
        partition back must not publish the watermark of a heartbeat whose floor it never published (the revoke's
        last commit counts one, `agents.arrival`): the owners in between judged by an older floor."""
        with self._lock:
            for partition in partitions:
                self._seen.pop(partition, None)

    def marks(self, partitions: Iterable[int]) -> dict[int, int]:
        """Watermarks (µs) of the given partitions that have seen a heartbeat."""
        with self._lock:
            return {p: self._seen[p] - self.skew_us for p in partitions if p in self._seen}


NO_PARTITION = -1  # where `request_heartbeats` records its asks among the partitions' latest writes


async def request_heartbeats(rollups: RollupStore, topic: str, now_us: int) -> None:
    """Have the workers move the watermark past the covering mark of a write at `now_us` that did not go through
    them: a replay's writes to the store, or a recount whose counters' rollups already sit at the standing
    watermark's boundary. Recorded as a write on no partition, which every worker's `heartbeats_needed` sees."""
    await rollups.set_watermarks(written_key(topic), {NO_PARTITION: now_us})


def heartbeats_needed(marks: Mapping[int, int], owned: Iterable[int], covering: int | None) -> bool:
    """Whether the owned partitions need more heartbeats: some owned partition's watermark (`marks`) is short of
    `covering`, the watermark that covers the latest write persisted anywhere (None: no write yet)."""
    return covering is not None and any(marks.get(p, -1) < covering for p in owned)


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


class PartitionCount:
    """How many mutations partitions the global watermark waits for, read again from the broker every `every_s`.

    Partitions added to the topic while workers run were left out of the watermark until every worker restarted:
    rollups passed the writes waiting in the new partitions, which were then stored and never counted. A worker that
    sees more partitions holds rollups until the new ones have watermarks (their owners heartbeat them once the
    consumer group has handed them out, `persist_consumer`'s metadata refresh). Writes that reach a new partition
    before the next read here can still fall behind a rollup; admission dead-letters those (`sinks.rolled`).
    The read runs on the heartbeat timer, never on the rollup path; a broker that does not answer keeps the count."""

    __slots__ = ("_due", "count", "every_s", "topic")

    def __init__(self, topic: str, count: int, every_s: float = 10.0) -> None:
        self.topic = topic
        self.count = count
        self.every_s = every_s
        self._due = time.monotonic() + every_s  # the worker has just read it

    async def refresh(self, read: Callable[[str], Awaitable[int]]) -> int:
        """The count, read again with `read(topic)` when due."""
        now = time.monotonic()
        if now < self._due:
            return self.count
        self._due = now + self.every_s
        try:
            count = await read(self.topic)
        except Exception as exc:  # a broker away: its outage shows elsewhere, the count stands
            log.debug("could not read the partition count of %s: %r", self.topic, exc)
            return self.count
        if count != self.count:
            log.warning("topic %s now has %d partitions (was %d): rollups wait for the watermarks of all %d",
                        self.topic, count, self.count, count)
            self.count = count
        return self.count
