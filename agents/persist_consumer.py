"""The persist path's consumer: counter-mutations read thousands of records at a time with aiokafka.

Why not a Faust agent: Faust's stream and event machinery costs about 180-270 µs per record here, so a topic of
one mutation per record (what users' own clients send) persisted at ~3K/s, while aiokafka's `getmany` reads the
same records at hundreds of thousands per second. Faust still hosts the worker (the rollup agent, timers, web
views); this consumer runs inside it as a service of the app (agents.worker.PersistService), in its own
consumer group (`<worker id>.persist`: Faust's group speaks its own assignment protocol, which a plain Kafka
consumer cannot join).

Per batch: decode in one pass and store in one transaction. Every `checkpoint_ms` (and before a handover or a
stop) the counters the batches since the last checkpoint touched are signalled for rollup, and only once the
signals are acknowledged are those batches' offsets committed. A crash or a rebalance anywhere before the commit
hands the records to the next owner again, which the idempotent event identity makes harmless: at-least-once
delivery plus idempotent events gives exact counts. Checkpointing every few batches rather than every batch
costs the rollups at most `checkpoint_ms` of latency and saves a signal record per rollup partition and an
offset commit per batch (under load the batches come every few milliseconds).

How long a fetch waits for records adapts to who is waiting. A client waiting until the worker has persisted
its write (AddAndGetCount with dimensions or items; the API stores plain ones itself) marks its record with the
read-your-write header; for `prompt_for_s` after such a record the consumer fetches with the short
`prompt_wait_ms`, and otherwise with `wait_ms`, gathering larger batches. Measured here with the API
at concurrency 32 (bench/RESULTS.md), a 200 ms wait instead of 10 ms cut the worker's and the broker's CPU per
write by about a third (fewer, larger transactions; fewer fetches, which the local broker pays by the length of
the partition): EVENTUAL AddCount, which nobody waits to see persisted, ran faster by the same margin.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from operator import attrgetter

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from agents.persist import KafkaRecord
from schemas.record_headers import READ_YOUR_WRITE_HEADER, has_header

log = logging.getLogger("counter.persist")

Key = tuple[str, str]
Persist = Callable[[list[KafkaRecord]], Awaitable[Iterable[Key]]]  # stores a batch; the counters it touched
Checkpoint = Callable[[set[Key]], Awaitable[None]]  # signals the touched counters (acknowledged on return)


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, owner: PersistConsumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        async with self.owner.batch_lock:  # the batch in hand is stored, signalled and committed first
            await self.owner.checkpoint_now()
            self.owner.on_revoked({tp.partition for tp in revoked})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("persist owns mutations partitions %s", sorted(tp.partition for tp in assigned))


def set_fetch_wait(consumer: AIOKafkaConsumer, wait_ms: int) -> bool:
    """Make the consumer's next fetches wait up to `wait_ms` at the broker; False if this aiokafka cannot.

    aiokafka has no public call for it: this sets the private `Fetcher._fetch_max_wait_ms`, from which it builds
    each FetchRequest (aiokafka is pinned in constraints.txt; tests/unit/test_persist_consumer.py and
    tests/integration/test_persist_wait.py check the lean). Without it the fetch wait stays the configured one.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None or not isinstance(getattr(fetcher, "_fetch_max_wait_ms", None), int):
        return False
    fetcher._fetch_max_wait_ms = wait_ms
    return True


_HEADERS = attrgetter("headers")


def read_your_write_in(records: Iterable[KafkaRecord]) -> bool:
    """Whether any record carries the read-your-write header. It runs on every record of every batch: records
    without headers are passed over in C (filter/map), only the others reach the Python test."""
    return any(has_header(h, READ_YOUR_WRITE_HEADER) for h in filter(None, map(_HEADERS, records)))


class PersistConsumer:
    """Reads `topic` in bulk and hands each batch to `persist`; every `checkpoint_ms` hands the touched counters
    to `checkpoint` and then commits the offsets of the batches it covers.

    `batch_bytes` bounds a batch by its values' size (one transaction); `max_records` by its record count.
    The broker answers a fetch once it holds `min_bytes` or after `wait_ms`: under a trickle of records a batch
    gathers for `wait_ms` instead of costing a fetch, a transaction and the broker's per-request work each.
    For `prompt_for_s` after a record with the read-your-write header the wait is `prompt_wait_ms` instead.
    `on_revoked(partitions)` lets the owner forget per-partition state (the arrival floor) on a handover.
    """

    def __init__(self, *, bootstrap: str, topic: str, group_id: str, persist: Persist, checkpoint: Checkpoint,
                 checkpoint_ms: int = 100, max_records: int = 20_000, batch_bytes: int = 8 << 20, wait_ms: int = 200,
                 prompt_wait_ms: int = 10, prompt_for_s: float = 2.0, min_bytes: int = 64 << 10,
                 session_timeout_ms: int = 10_000, rebalance_timeout_ms: int = 5_000,
                 on_revoked: Callable[[set[int]], None] = lambda _partitions: None) -> None:
        self.topic = topic
        self.persist = persist
        self.checkpoint = checkpoint
        self.checkpoint_s = checkpoint_ms / 1000
        self._touched: set[Key] = set()
        self._offsets: dict[TopicPartition, int] = {}
        self._checkpointed = time.monotonic()
        self.max_records = max_records
        self.batch_bytes = batch_bytes
        self.wait_ms = wait_ms
        self.prompt_wait_ms = min(prompt_wait_ms, wait_ms)
        self.prompt_for_s = prompt_for_s
        self._prompt_until = 0.0
        self._lean_warned = False
        self.fetch_wait_ms = wait_ms  # what the next fetches wait at the broker
        self.on_revoked = on_revoked
        self.batch_lock = asyncio.Lock()
        self._record_size = 256.0  # moving average of a record's value size: sizes the next fetch
        self._config = dict(
            bootstrap_servers=bootstrap, group_id=group_id, client_id=f"{group_id}-consumer",
            enable_auto_commit=False, auto_offset_reset="earliest",
            fetch_max_wait_ms=wait_ms, fetch_min_bytes=min_bytes, max_partition_fetch_bytes=4 << 20,
            fetch_max_bytes=64 << 20,
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
        """Checkpoint what is stored, then leave the group (a prompt rebalance for the others)."""
        if self._consumer is not None:
            async with self.batch_lock:
                try:
                    await self.checkpoint_now()
                except Exception as exc:  # the records are re-read by the next owner
                    log.warning("final checkpoint failed: %s", exc)
            await self._consumer.stop()

    async def run(self) -> None:
        """Consume until cancelled (after `start`)."""
        consumer = self._consumer
        assert consumer is not None, "start() first"
        while True:
            due = self._checkpointed + self.checkpoint_s - time.monotonic()
            wait_ms = self.fetch_wait_ms if not self._offsets else max(0, min(self.fetch_wait_ms, int(due * 1000)))
            wanted = max(100, min(self.max_records, int(self.batch_bytes / self._record_size)))
            batch = await consumer.getmany(timeout_ms=wait_ms, max_records=wanted)
            self._pace(consumer, batch)  # before any await: aiokafka builds the next fetch once this one is taken
            async with self.batch_lock:
                if batch:
                    await self._handle(batch)
                if self._offsets and time.monotonic() >= self._checkpointed + self.checkpoint_s:
                    await self.checkpoint_now()

    def _pace(self, consumer: AIOKafkaConsumer, batch: dict[TopicPartition, list]) -> None:
        """The short fetch wait while read-your-write records keep coming, the long one otherwise."""
        now = time.monotonic()
        if any(read_your_write_in(records) for records in batch.values()):
            self._prompt_until = now + self.prompt_for_s
        wanted = self.prompt_wait_ms if now < self._prompt_until else self.wait_ms
        if wanted != self.fetch_wait_ms and set_fetch_wait(consumer, wanted):
            self.fetch_wait_ms = wanted
        elif wanted != self.fetch_wait_ms and not self._lean_warned:
            self._lean_warned = True
            log.warning("this aiokafka cannot change a consumer's fetch wait: read-your-write waits up to %d ms",
                        self.wait_ms)

    async def _handle(self, batch: dict[TopicPartition, list]) -> None:
        records = [r for recs in batch.values() for r in recs]  # aiokafka's ConsumerRecords: KafkaRecords and more
        size = sum(r.serialized_value_size for r in records if r.serialized_value_size > 0)
        self._record_size = 0.8 * self._record_size + 0.2 * max(16.0, size / len(records))
        self._touched.update(await self.persist(records))
        for tp, recs in batch.items():
            self._offsets[tp] = recs[-1].offset + 1

    async def checkpoint_now(self) -> None:
        """Signal what the stored batches touched, then commit their offsets (call under `batch_lock`)."""
        self._checkpointed = time.monotonic()
        touched, self._touched = self._touched, set()
        if touched:
            await self.checkpoint(touched)
        offsets, self._offsets = self._offsets, {}
        if not offsets or self._consumer is None:
            return
        try:
            await self._consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:  # a rebalance moved them: the next owner re-reads them
            log.warning("stored and signalled records up to %s but could not commit their offsets (%s); their "
                        "next owner re-reads them, which idempotent events make harmless", offsets, exc)


async def run_consumer(consumer: PersistConsumer) -> None:
    """Start, consume until cancelled, then leave the group."""
    started = time.monotonic()
    await consumer.start()
    log.info("persist consumer started in %.1fs", time.monotonic() - started)
    try:
        await consumer.run()
    finally:
        await asyncio.shield(consumer.stop())
