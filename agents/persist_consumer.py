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
offset commit per batch (under load the batches come every few milliseconds). For `prompt_for_s` after a record
whose client waits (the read-your-write header, below), every batch is checkpointed at once: an API process that
cannot store the event itself learns that the worker has it, and every record before it, from the committed offsets
(query_api.persist_progress).

How often the consumer fetches adapts to what the recent records need (`FetchPace`). After a batch that took
all there was, the consumer pauses its partitions for the pace's wait before it fetches again, and each fetch asks
for 1 byte at least, so it is answered as soon as it finds records: at most one fetch with records per wait, which
then brings everything written meanwhile. The wait bounds the persist latency of a write, and a longer one gathers
larger batches, which cost the worker and the broker less per write. So each namespace names the longest wait its
writes tolerate (`namespace_waits`: EVENTUAL reads come from rollups that wait out `coalesce_ms` anyway, ACCURATE
reads add the persisted events live), and a client waiting until the worker has persisted its write
(AddAndGetCount with dimensions or items, or through an API process that shares the pipeline with others; a lone
process stores plain ones itself) marks its record with the
read-your-write header, which asks for `prompt_wait_ms`. The next fetches wait the shortest of what the records of
the last `prompt_for_s` asked for; `wait_ms` with none (idle, or only namespaces this worker does not know), so the
first write after a quiet spell is not held for a long wait. With nothing to read, a fetch waits at the broker
for up to the same wait.

Why the consumer paces itself rather than leaving it to the broker's `min_bytes` and wait: the local broker
(Tansu) answers a waiting fetch in passes, the first at once and then at halves of the remaining wait, and every
pass that finds records lists the objects of the partitions it reads, so its cost grows with the topic's length.
A 64 KiB minimum with a 1 s wait took two such passes every half second; one paced fetch a second is a quarter of
that (`counter bench broker-fetch` measures a pass; bench/RESULTS.md has the growth with and without pacing).
Apache Kafka answers either from its offset index, and pacing costs it nothing either.

A clean stop can drain (`drain_s`, COUNTER_PERSIST_DRAIN_S): the consumer persists its partitions up to the end
offsets they had when the stop began, from the committed offsets on, before it leaves. Kafka keeps unread records
for the next owner, so by default a stopping worker leaves them; `counter up`'s broker keeps its topics in memory
and stops after the worker, so there every write it acknowledged and no worker had read would be lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from operator import attrgetter
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition, codec
from aiokafka.errors import CommitFailedError, KafkaError

from agents import metrics
from agents.persist import KafkaRecord
from schemas.record_headers import READ_YOUR_WRITE_HEADER, has_header

log = logging.getLogger("counter.persist")


def missing_codecs() -> list[str]:
    """The compression codecs aiokafka cannot read here (it reads snappy, lz4 and zstd with cramjam, the extras of
    its requirement in pyproject.toml). Any client may compress its batches, and a topic's compression.type may
    have the broker do it; a batch the consumer cannot read fails every fetch of its partition, so a worker without
    them refuses to start (`agents.worker.build`)."""
    checks = {"gzip": codec.has_gzip, "snappy": codec.has_snappy, "lz4": codec.has_lz4, "zstd": codec.has_zstd}
    return [name for name, present in checks.items() if not present()]

Key = tuple[str, str]
Persist = Callable[[list[KafkaRecord]], Awaitable[Iterable[Key]]]  # stores a batch; the counters it touched
Checkpoint = Callable[[set[Key]], Awaitable[None]]  # signals the touched counters (acknowledged on return)


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, owner: PersistConsumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        async with self.owner.batch_lock:  # the batch in hand is stored, signalled and committed first
            await self.owner.checkpoint_now()
            await self.owner.on_revoked({tp.partition for tp in revoked if tp.topic == self.owner.topic})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("persist owns mutations partitions %s", sorted(tp.partition for tp in assigned))
        mine = [tp for tp in assigned if tp.topic == self.owner.topic]
        consumer = self.owner._consumer
        committed = []
        if consumer is not None:
            try:
                committed = [await consumer.committed(tp) for tp in mine]
            except KafkaError as exc:  # not known: as if some were, the owner then assumes a previous owner
                log.warning("could not read the committed offsets of %s: %s", sorted(tp.partition for tp in mine),
                            exc)
                committed = [-1]
        if consumer is not None and committed and committed != [-1]:
            await self.owner.restart_past_the_end(consumer, mine, committed)
        self.owner.on_assigned({tp.partition for tp in mine}, any(c is not None for c in committed))


def has_unread(consumer: AIOKafkaConsumer) -> bool | None:
    """Whether some assigned partition holds records the consumer has not taken yet, by the high watermark of its
    last fetch; None if this aiokafka cannot tell.

    A batch of a backlog can be short of what was asked for (the broker caps a fetch's bytes, 5 MiB on the local
    one, and fills partitions in turn), so "fewer records than asked for" does not mean "all there was". aiokafka
    has no synchronous call for a partition's position: this reads its private subscription state (aiokafka is
    pinned in constraints.txt; tests/unit/test_persist_consumer.py and tests/integration/test_persist_wait.py check
    the lean). The local broker reports the base offset of the last batch + 1 as the high watermark, so a position
    past the last batch's first record counts as read to the end, which it is once that batch is taken whole.
    """
    try:
        subscription = consumer._subscription.subscription
        assignment = subscription.assignment if subscription is not None else None
        if assignment is None:
            return False  # nothing assigned (before the first assignment, or during a rebalance)
        states = [assignment.state_value(tp) for tp in assignment.tps]
        return any(state.has_valid_position and state.highwater is not None and state.position < state.highwater
                   for state in states)
    except AttributeError:
        return None


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
DRAIN_FETCH_WAIT_MS = 100  # while draining at a stop: answered at once while records remain
# after this worker noticed a recreated topic, partitions it is given are read from their start: their last owner
# may have committed old positions onto the new topic before it noticed (it checks every few seconds)
RECREATED_WINDOW_S = 60.0


def read_your_write_in(records: Iterable[KafkaRecord]) -> bool:
    """Whether any record carries the read-your-write header. It runs on every record of every batch: records
    without headers are passed over in C (filter/map), only the others reach the Python test."""
    return any(has_header(h, READ_YOUR_WRITE_HEADER) for h in filter(None, map(_HEADERS, records)))


class FetchPace:
    """The persist fetch wait that recent records ask for: each ask holds its wait for `hold_s`, and the wait is the
    shortest one held, or `idle_ms` when none is."""

    __slots__ = ("_held", "hold_s", "idle_ms")

    def __init__(self, idle_ms: int, hold_s: float) -> None:
        self.idle_ms = idle_ms
        self.hold_s = hold_s
        self._held: dict[int, float] = {}  # wait in ms -> monotonic time until which it holds

    def ask(self, wait_ms: int, now: float) -> None:
        self._held[wait_ms] = now + self.hold_s

    def wait_ms(self, now: float) -> int:
        for wait_ms in [w for w, until in self._held.items() if until <= now]:
            del self._held[wait_ms]
        return min(self._held, default=self.idle_ms)


async def _nothing_revoked(_partitions: set[int]) -> None:
    return None


class PersistConsumer:
    """Reads `topic` in bulk and hands each batch to `persist`; every `checkpoint_ms` hands the touched counters
    to `checkpoint` and then commits the offsets of the batches it covers.

    `batch_bytes` bounds a batch by its values' size (one transaction); `max_records` by its record count.
    After a batch that took all there was (read to the high watermark) the partitions pause for the wait, so a batch
    gathers for its wait instead of costing a fetch, a transaction and the broker's per-request work each; the
    broker answers a fetch once it holds `min_bytes`, or after the wait with none. The wait is `FetchPace`'s: for
    `prompt_for_s` after a batch, the shortest of `prompt_wait_ms` (a record carried the read-your-write header)
    and `namespace_waits[ns]` for the namespaces it persisted; `wait_ms` otherwise.
    `on_assigned(partitions, persisted_before)` (whether the group had committed offsets there: a previous owner
    persisted some) and `on_revoked(partitions)` tell the owner of a handover (the arrival floors), and
    `on_committed({partition: next offset}, sent)` of each commit, once the broker has it; `sent` numbers the commits
    in the order they were sent (`commits_sent` counts them), so a reply that comes late can be told from a commit
    sent after something the owner learnt meanwhile (a refused publication, `agents.arrival`).
    """

    def __init__(self, *, bootstrap: str, topic: str, group_id: str, persist: Persist, checkpoint: Checkpoint,
                 checkpoint_ms: int = 100, max_records: int = 20_000, batch_bytes: int = 8 << 20, wait_ms: int = 200,
                 prompt_wait_ms: int = 10, prompt_for_s: float = 2.0, namespace_waits: Mapping[str, int] | None = None,
                 min_bytes: int = 1, drain_s: float = 0.0,
                 session_timeout_ms: int = 10_000, rebalance_timeout_ms: int = 5_000,
                 on_assigned: Callable[[set[int], bool], None] = lambda _partitions, _before: None,
                 on_revoked: Callable[[set[int]], Awaitable[None]] = _nothing_revoked,
                 on_committed: Callable[[dict[int, int], int], None] = lambda _offsets, _sent: None,
                 security: Mapping[str, Any] | None = None) -> None:
        """`security`: the Kafka clients' (`Settings.kafka_security.aiokafka()`: protocol, SASL, TLS context)."""
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
        self.namespace_waits = dict(namespace_waits or {})
        self.pace = FetchPace(wait_ms, prompt_for_s)
        self.prompt_for_s = prompt_for_s
        self._waited_on_until = 0.0  # monotonic time until which every batch is checkpointed at once
        self._lean_warned = False
        self._unread_warned = False
        self.fetch_wait_ms = wait_ms  # what the next fetches wait at the broker, and the pause after a batch
        self._held_until = 0.0  # when the partitions paused after a batch resume (monotonic); 0: none paused
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.on_committed = on_committed
        self.commits_sent = 0
        self.topic_epoch = 0  # moved by `topic_recreated`: a batch fetched before belongs to the old topic
        self.recreated_at = 0.0  # monotonic time of the last `topic_recreated` (0: never)
        self.drain_s = drain_s
        self.batch_lock = asyncio.Lock()
        self._record_size = 256.0  # moving average of a record's value size: sizes the next fetch
        self._config = dict(
            bootstrap_servers=bootstrap, group_id=group_id, client_id=f"{group_id}-consumer",
            enable_auto_commit=False, auto_offset_reset="earliest",
            # an outside transactional producer's aborted writes are not writes (aiokafka's default reads them, and
            # records of a transaction still open); librdkafka's consumers (counter replay) default to this too
            isolation_level="read_committed",
            fetch_max_wait_ms=wait_ms, fetch_min_bytes=min_bytes, max_partition_fetch_bytes=4 << 20,
            fetch_max_bytes=64 << 20,
            session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=max(500, session_timeout_ms // 5),
            rebalance_timeout_ms=rebalance_timeout_ms, max_poll_interval_ms=300_000,
            # partitions added to the topic are handed out at the group's next metadata refresh (aiokafka rejoins
            # when a subscribed topic's partitions change); 5 min by default, while rollups wait for them
            # (`agents.watermark.PartitionCount`)
            metadata_max_age_ms=30_000, **(security or {}))
        self._consumer: AIOKafkaConsumer | None = None  # aiokafka objects are made inside the running loop

    def assignment(self) -> set[int]:
        """The mutations partitions this worker owns now."""
        if self._consumer is None:
            return set()
        return {tp.partition for tp in self._consumer.assignment() if tp.topic == self.topic}

    @property
    def holding(self) -> bool:
        """Whether the partitions are paused after a batch, for the rest of its wait."""
        return bool(self._held_until)

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(**self._config)
        await self._consumer.start()
        self._consumer.subscribe([self.topic], listener=_Rebalance(self))

    async def stop(self) -> None:
        """Persist what the partitions held when the stop began (for up to `drain_s`), checkpoint what is stored,
        then leave the group (a prompt rebalance for the others)."""
        if self._consumer is not None:
            if self.drain_s > 0:
                try:
                    await asyncio.wait_for(self._drain(self._consumer), self.drain_s)
                except TimeoutError:
                    log.warning("stopping with records not yet persisted after %.0f s of draining "
                                "(COUNTER_PERSIST_DRAIN_S): their next owner reads them, if the broker keeps them",
                                self.drain_s)
                except Exception as exc:  # the broker is gone, or a rebalance took the partitions
                    log.warning("could not drain the partitions before stopping: %s", exc)
            async with self.batch_lock:
                try:
                    await self.checkpoint_now()
                except Exception as exc:  # the records are re-read by the next owner
                    log.warning("final checkpoint failed: %s", exc)
            await self._consumer.stop()

    async def _drain(self, consumer: AIOKafkaConsumer) -> None:
        """Persist the assigned partitions up to their end offsets as of now: a broker that keeps its topics in
        memory (`counter up`'s) loses with its stop what no worker persisted, though every record of it was
        acknowledged. It starts from the committed offsets, after committing what is stored: the stop may have
        cancelled `run` inside a batch, past whose records the consumer's position has already moved. Batches are
        handled as `run` handles them; the fetch pace is off."""
        async with self.batch_lock:
            await self.checkpoint_now()
        for tp in consumer.assignment():
            committed = await consumer.committed(tp)
            if committed is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, committed)
        self._held_until = 0.0
        consumer.resume(*consumer.paused())
        set_fetch_wait(consumer, DRAIN_FETCH_WAIT_MS)
        ends = await consumer.end_offsets(list(consumer.assignment()))
        started, records = time.monotonic(), 0
        while True:
            unread = [tp for tp, end in ends.items()
                      if tp in consumer.assignment() and await consumer.position(tp) < end]
            if not unread:
                break
            batch = await consumer.getmany(*unread, timeout_ms=DRAIN_FETCH_WAIT_MS, max_records=self.max_records)
            async with self.batch_lock:
                if batch:
                    records += sum(map(len, batch.values()))
                    await self._handle(batch)
                if self._offsets and time.monotonic() >= self._checkpointed + self.checkpoint_s:
                    await self.checkpoint_now()
        if records:
            log.info("persisted %d records left at the stop in %.1f s", records, time.monotonic() - started)

    async def restart_past_the_end(self, consumer: AIOKafkaConsumer, parts: list[TopicPartition],
                                   committed: list[int | None]) -> None:
        """At an assignment: a partition whose committed offset lies past its end belongs to a topic deleted and
        created again (a worker started after the recreation has no older topic id to tell it by, `topic_watch`):
        read it from its start, or its first records would be passed over. On Apache Kafka the fetch would reset it
        (out of range); the local broker answers such a fetch with nothing. Its reported end is the last batch's base
        offset + 1, so an offset past it is checked against the end of that batch (`true_ends`) first."""
        past = [(tp, c) for tp, c in zip(parts, committed, strict=True) if c]
        if not past:
            return
        if self.recreated_at and time.monotonic() - self.recreated_at < RECREATED_WINDOW_S:
            # partitions another worker owned when the topic was recreated: it may have committed old positions onto
            # the new topic before it noticed, within the new topic's ends (the review of this change)
            await self._from_start(consumer, [tp for tp, _ in past],
                                   "they may carry offsets of the topic before it was recreated")
            return
        try:
            ends = await consumer.end_offsets([tp for tp, _ in past])
            past = [(tp, c) for tp, c in past if c > ends[tp]]
            if past:
                true = await true_ends(self._config, {tp: ends[tp] for tp, _ in past})
                past = [(tp, c) for tp, c in past if c > true[tp]]
        except Exception as exc:  # not known: the fetches go on from the committed offsets, as before
            log.warning("could not check the committed offsets of %s against their ends: %r",
                        sorted(tp.partition for tp, _ in past), exc)
            return
        if not past:
            return
        metrics.TOPIC_RECREATIONS.inc()
        log.error("the committed offsets of %s lie past the ends of those partitions (the topic was deleted and "
                  "created again, or truncated): records of the old topic that no worker had persisted are lost with "
                  "it", ", ".join(f"{self.topic}:{tp.partition} at {c} (ends {ends[tp]})" for tp, c in past))
        await self._from_start(consumer, [tp for tp, _ in past], "their committed offsets lie past their ends")

    async def _from_start(self, consumer: AIOKafkaConsumer, parts: list[TopicPartition],
                          why: str) -> dict[TopicPartition, int]:
        """Seek `parts` to their first offsets kept, and return those."""
        starts = dict(await consumer.beginning_offsets(parts))
        for tp, start in starts.items():
            consumer.seek(tp, start)
        log.warning("reading partitions %s of %s from their start: %s", sorted(tp.partition for tp in parts),
                    self.topic, why)
        return starts

    async def topic_recreated(self) -> None:
        """The topic was deleted and created again under this consumer (`agents.topic_watch`): its positions and the
        offsets not committed yet are the old topic's, past the new one's first records, which it would never read
        (the local broker answers a fetch past a partition's end with nothing). Every record of the new topic is
        new: signal what the stored batches touched, drop their offsets, read each assigned partition from its
        start, and commit that start, so that no owner after a rebalance starts at an old offset either."""
        consumer = self._consumer
        if consumer is None:
            return
        async with self.batch_lock:
            self.topic_epoch += 1
            self.recreated_at = time.monotonic()
            self._offsets = {}  # the old topic's: committed, they would pass over the new topic's first records
            await self.checkpoint_now()  # signals only: nothing left to commit
            parts = [tp for tp in consumer.assignment() if tp.topic == self.topic]
            if not parts:
                return
            starts = await self._from_start(consumer, parts, "the topic was recreated")
            self._held_until = 0.0
            consumer.resume(*consumer.paused())
            try:  # not reported to `on_committed`: no heartbeat of the new topic is behind it yet
                await consumer.commit(starts)
            except (CommitFailedError, KafkaError) as exc:  # a rebalance took them: their next owner reads them
                log.warning("could not commit the start of the recreated topic %s (%s)", self.topic, exc)  # from
                # their start too (within RECREATED_WINDOW_S of its own notice, or when their offsets pass the ends)

    async def run(self) -> None:
        """Consume until cancelled (after `start`)."""
        consumer = self._consumer
        assert consumer is not None, "start() first"
        while True:
            now = time.monotonic()
            self._release(consumer, now)
            wait_s = self.fetch_wait_ms / 1000 if not self._held_until else self._held_until - now
            if self._offsets:
                wait_s = min(wait_s, self._checkpointed + self.checkpoint_s - now)
            wanted = max(100, min(self.max_records, int(self.batch_bytes / self._record_size)))
            epoch = self.topic_epoch
            batch = await consumer.getmany(timeout_ms=max(0, int(wait_s * 1000)), max_records=wanted)
            fetched_at = time.monotonic()
            self._note_fetched(batch)
            self._pace(consumer)  # before any await: aiokafka builds the next fetch once this one is taken
            caught_up = self._took_all(consumer, batch, wanted)
            if caught_up:
                self._hold(consumer, fetched_at)  # before any await too, or that next fetch is already sent
            async with self.batch_lock:
                if batch and epoch != self.topic_epoch:
                    batch = {}  # fetched at the old topic's positions: persisted, its offsets would be committed
                if batch:
                    await self._handle(batch)
                    self._pace(consumer)  # what the namespaces just persisted ask for, from the fetch after next
                    if caught_up and self._held_until:
                        self._hold(consumer, fetched_at)  # again: the wait may have changed with what was persisted
                now = time.monotonic()
                if self._offsets and (now < self._waited_on_until or now >= self._checkpointed + self.checkpoint_s):
                    await self.checkpoint_now()

    def _took_all(self, consumer: AIOKafkaConsumer, batch: dict[TopicPartition, list], wanted: int) -> bool:
        """Whether the batch took all there was (then the partitions pause for the wait)."""
        if not batch or sum(map(len, batch.values())) >= wanted:
            return False
        unread = has_unread(consumer)
        if unread is None and not self._unread_warned:
            self._unread_warned = True
            log.warning("this aiokafka cannot tell whether a fetch read to the end: a backlog may pause")
        return not unread

    def _hold(self, consumer: AIOKafkaConsumer, fetched_at: float) -> None:
        """Fetch nothing more until the wait from `fetched_at` is out: the batch took all there was. Pausing a
        paused partition changes nothing, so a second call only moves the end of the wait."""
        self._held_until = fetched_at + self.fetch_wait_ms / 1000
        consumer.pause(*consumer.assignment())

    def _release(self, consumer: AIOKafkaConsumer, now: float) -> None:
        """Resume the paused partitions (those still assigned) once their wait is out."""
        if self._held_until and now >= self._held_until:
            self._held_until = 0.0
            consumer.resume(*consumer.paused())

    def _note_fetched(self, batch: dict[TopicPartition, list]) -> None:
        """A record waited on (the read-your-write header) asks for the prompt wait, and for `prompt_for_s` every
        batch is checkpointed at once: its client (in a shared pipeline) waits until the committed offsets reach the
        topic's ends as they were after its acknowledgement, which records of other writers may have moved."""
        if batch and any(read_your_write_in(records) for records in batch.values()):
            now = time.monotonic()
            self.pace.ask(self.prompt_wait_ms, now)
            self._waited_on_until = now + self.prompt_for_s

    def _note_persisted(self, touched: set[Key]) -> None:
        """Each namespace just persisted asks for its wait."""
        now = time.monotonic()
        for namespace in {namespace for namespace, _counter in touched}:
            if (wait_ms := self.namespace_waits.get(namespace)) is not None:
                self.pace.ask(wait_ms, now)

    def _pace(self, consumer: AIOKafkaConsumer) -> None:
        """Set the wait the recent records ask for on the consumer's next fetches."""
        wanted = self.pace.wait_ms(time.monotonic())
        if wanted == self.fetch_wait_ms:
            return
        if set_fetch_wait(consumer, wanted):
            self.fetch_wait_ms = wanted
        elif not self._lean_warned:
            self._lean_warned = True
            log.warning("this aiokafka cannot change a consumer's fetch wait: every fetch waits up to %d ms",
                        self.fetch_wait_ms)

    async def _handle(self, batch: dict[TopicPartition, list]) -> None:
        records = [r for recs in batch.values() for r in recs]  # aiokafka's ConsumerRecords: KafkaRecords and more
        size = sum(r.serialized_value_size for r in records if r.serialized_value_size > 0)
        self._record_size = 0.8 * self._record_size + 0.2 * max(16.0, size / len(records))
        touched = set(await self.persist(records))
        self._touched |= touched
        self._note_persisted(touched)
        for tp, recs in batch.items():
            self._offsets[tp] = recs[-1].offset + 1

    async def checkpoint_now(self) -> None:
        """Signal what the stored batches touched, then commit their offsets (call under `batch_lock`)."""
        self._checkpointed = time.monotonic()
        touched, self._touched = self._touched, set()
        if touched:
            try:
                await self.checkpoint(touched)
            except BaseException:  # failed or cancelled (a stop): the next checkpoint signals them, not the sweep
                self._touched |= touched
                raise
        offsets, self._offsets = self._offsets, {}
        if not offsets or self._consumer is None:
            return
        self.commits_sent += 1
        sent = self.commits_sent
        try:
            await self._consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:  # a rebalance moved them: the next owner re-reads them
            log.warning("stored and signalled records up to %s but could not commit their offsets (%s); their "
                        "next owner re-reads them, which idempotent events make harmless", offsets, exc)
            return
        self.on_committed({tp.partition: offset for tp, offset in offsets.items() if tp.topic == self.topic}, sent)


async def true_ends(config: Mapping[str, Any], reported: Mapping[TopicPartition, int],
                    timeout_s: float = 5.0) -> dict[TopicPartition, int]:
    """The end of each partition past the last batch the broker reported the base offset of (`reported`: its end
    offsets, the local broker's base + 1; Apache Kafka's are exact, and so come back unchanged): read with a consumer
    of its own that joins no group, from the reported end - 1 to the end of that batch."""
    out = dict(reported)
    reader = AIOKafkaConsumer(**{k: v for k, v in config.items() if k not in ("group_id", "client_id")},
                              group_id=None, client_id="counter-persist-ends")
    await reader.start()
    try:
        wanted = [tp for tp, end in reported.items() if end > 0]
        if not wanted:
            return out
        reader.assign(wanted)
        for tp in wanted:
            reader.seek(tp, reported[tp] - 1)
        deadline = time.monotonic() + timeout_s
        left = set(wanted)
        while left and time.monotonic() < deadline:
            batch = await reader.getmany(*left, timeout_ms=200)
            for tp, records in batch.items():
                if records:
                    out[tp] = max(out[tp], records[-1].offset + 1)
                    left.discard(tp)  # a fetch returns the batch whole
        if left:
            raise TimeoutError(f"no record read at the reported ends of {sorted(tp.partition for tp in left)}")
        return out
    finally:
        await reader.stop()


async def run_consumer(consumer: PersistConsumer) -> None:
    """Start, consume until cancelled, then leave the group."""
    started = time.monotonic()
    await consumer.start()
    log.info("persist consumer started in %.1fs", time.monotonic() - started)
    try:
        await consumer.run()
    finally:
        await asyncio.shield(consumer.stop())
