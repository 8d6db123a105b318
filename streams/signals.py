"""Rollup signals: the one way anything asks for a counter's rollup (the persist path, replays, reads).

A signal is a light `{namespace, counter}` record on the rollups topic; its partitions are the rollup queues
(DESIGN: the topic replaces Netflix's in-memory rollup queues, so a crash loses no signal). One counter's signals
always go to one partition (xxhash of `counter_key`), so one queue coalesces them. Signals bound for the same
partition travel together, up to SIGNALS_PER_RECORD per RollupSignalBatch record.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable

from producers.asyncio_producer import AsyncProducer
from schemas import counter_key, encode_signals
from streams.topics import signal_partition

Key = tuple[str, str]
SIGNALS_PER_RECORD = 500  # counters per RollupSignalBatch record: about 20 KB


class SignalSender:
    """Send rollup signals through an AsyncProducer; `partitions` is the rollups topic's partition count
    (None: asked of the broker on `start`)."""

    def __init__(self, producer: AsyncProducer, topic: str, partitions: int | None = None) -> None:
        self.producer = producer
        self.topic = topic
        self.partitions = partitions or 0

    async def start(self) -> None:
        if not self.partitions:
            self.partitions = await self.producer.partitions(self.topic)

    def send(self, keys: Iterable[Key]) -> asyncio.Future[list[int | None]]:
        """Signal every counter in `keys`: one record per partition (or per SIGNALS_PER_RECORD counters).
        The future resolves once the broker acknowledged all of them (DeliveryError otherwise)."""
        if not self.partitions:
            raise RuntimeError("SignalSender.start() first (the rollups topic's partitions are unknown)")
        by_partition: dict[int, list[Key]] = defaultdict(list)
        for ns, counter in keys:
            by_partition[signal_partition(counter_key(ns, counter).encode(), self.partitions)].append((ns, counter))
        records = []
        for partition, group in by_partition.items():
            for i in range(0, len(group), SIGNALS_PER_RECORD):
                chunk = group[i:i + SIGNALS_PER_RECORD]
                records.append(self.producer.produce(self.topic, encode_signals(chunk),
                                                     counter_key(*chunk[0]).encode(), partition=partition))
        return asyncio.gather(*records)
