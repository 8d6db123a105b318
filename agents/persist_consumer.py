"""The persist path's consumer: counter-mutations read thousands of records at a time with aiokafka.

Why not a Faust agent: Faust's stream and event machinery costs about 180-270 µs per record here, so a topic of
one mutation per record (what users' own clients send) persisted at ~3K/s, while aiokafka's `getmany` reads the
same records at hundreds of thousands per second. Faust still hosts the worker (the rollup agent, timers, web
views); this consumer runs inside it as a task, in its own consumer group (`<worker id>.persist`: Faust's group
speaks its own assignment protocol, which a plain Kafka consumer cannot join).

Per batch: decode in one pass, store in one transaction, signal, and only then commit the offsets. A crash or a
rebalance anywhere before the commit hands the records to the next owner again, which the idempotent event
identity makes harmless: at-least-once delivery plus idempotent events gives exact counts. A revocation waits
for the batch in hand to be stored and committed, so the next owner rarely re-reads anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from agents.persist import KafkaRecord

log = logging.getLogger("counter.persist")

Persist = Callable[[list[KafkaRecord]], Awaitable[None]]


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, owner: PersistConsumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        async with self.owner.batch_lock:  # the batch in hand is stored and committed before the handover
            self.owner.on_revoked({tp.partition for tp in revoked})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("persist owns mutations partitions %s", sorted(tp.partition for tp in assigned))


class PersistConsumer:
    """Reads `topic` in bulk and hands each batch to `persist`, committing offsets once it returned.

    `batch_bytes` bounds a batch by its values' size (one transaction); `max_records` by its record count.
    `on_revoked(partitions)` lets the owner forget per-partition state (the arrival floor) on a handover.
    """

    def __init__(self, *, bootstrap: str, topic: str, group_id: str, persist: Persist,
                 max_records: int = 20_000, batch_bytes: int = 8 << 20, wait_ms: int = 50,
                 session_timeout_ms: int = 10_000, rebalance_timeout_ms: int = 5_000,
                 on_revoked: Callable[[set[int]], None] = lambda _partitions: None) -> None:
        self.topic = topic
        self.persist = persist
        self.max_records = max_records
        self.batch_bytes = batch_bytes
        self.wait_ms = wait_ms
        self.on_revoked = on_revoked
        self.batch_lock = asyncio.Lock()
        self._record_size = 256.0  # moving average of a record's value size: sizes the next fetch
        self._config = dict(
            bootstrap_servers=bootstrap, group_id=group_id, client_id=f"{group_id}-consumer",
            enable_auto_commit=False, auto_offset_reset="earliest",
            fetch_max_wait_ms=wait_ms, max_partition_fetch_bytes=4 << 20, fetch_max_bytes=64 << 20,
            session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=max(500, session_timeout_ms // 5),
            rebalance_timeout_ms=rebalance_timeout_ms, max_poll_interval_ms=300_000)
        self._consumer: AIOKafkaConsumer | None = None  # aiokafka objects are made inside the running loop

    def assignment(self) -> set[int]:
        """The mutations partitions this worker owns now."""
        if self._consumer is None:
            return set()
        return {tp.partition for tp in self._consumer.assignment() if tp.topic == self.topic}

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(**self._config)
        await self._consumer.start()
        self._consumer.subscribe([self.topic], listener=_Rebalance(self))

    async def stop(self) -> None:
        """Leave the group (a prompt rebalance for the others); the batch in hand was committed or is re-read."""
        if self._consumer is not None:
            await self._consumer.stop()

    async def run(self) -> None:
        """Consume until cancelled (after `start`)."""
        assert self._consumer is not None, "start() first"
        while True:
            wanted = max(100, min(self.max_records, int(self.batch_bytes / self._record_size)))
            batch = await self._consumer.getmany(timeout_ms=self.wait_ms, max_records=wanted)
            if not batch:
                continue
            async with self.batch_lock:
                await self._handle(batch)

    async def _handle(self, batch: dict[TopicPartition, list]) -> None:
        records: list[KafkaRecord] = [r for recs in batch.values() for r in recs]
        size = sum(r.serialized_value_size for r in records if r.serialized_value_size > 0)
        self._record_size = 0.8 * self._record_size + 0.2 * max(16.0, size / len(records))
        await self.persist(records)
        offsets = {tp: recs[-1].offset + 1 for tp, recs in batch.items()}
        try:
            await self._consumer.commit(offsets)  # type: ignore[union-attr]
        except (CommitFailedError, KafkaError) as exc:  # a rebalance moved them: the next owner re-reads them
            log.warning("persisted %d records but could not commit their offsets (%s); their next owner "
                        "re-reads them, which idempotent events make harmless", len(records), exc)


async def run_consumer(consumer: PersistConsumer) -> None:
    """Start, consume until cancelled, then leave the group."""
    started = time.monotonic()
    await consumer.start()
    log.info("persist consumer started in %.1fs", time.monotonic() - started)
    try:
        await consumer.run()
    finally:
        await asyncio.shield(consumer.stop())
