"""The persist consumer's adaptive fetch wait against the real broker: after a record marked read-your-write its
fetches wait briefly (the next record is persisted well within the long wait), and once no such record came for
`prompt_for_s` they wait long again; records of a namespace that tolerates a longer wait space the fetches for as
long, and records arriving all the time are fetched once per wait. The FetchRequests aiokafka builds are watched,
so this also proves the lean on aiokafka's Fetcher (agents.persist_consumer.set_fetch_wait) on the installed
version."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiokafka.consumer.fetcher as fetcher_module
import pytest
from aiokafka import AIOKafkaProducer

from agents.persist_consumer import PersistConsumer
from schemas.record_headers import READ_YOUR_WRITE_HEADERS
from tests.helpers import make_topic

pytestmark = pytest.mark.integration

LONG_MS, PROMPT_MS, PROMPT_FOR_S = 3000, 10, 1.0


async def until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def spy_on_fetch_waits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The max_wait of every FetchRequest aiokafka builds from now on, in order."""
    waits: list[int] = []
    real = fetcher_module.FetchRequest

    def spy(max_wait: int, *args: Any, **kw: Any) -> Any:
        waits.append(max_wait)
        return real(max_wait, *args, **kw)

    monkeypatch.setattr(fetcher_module, "FetchRequest", spy)
    return waits


async def checkpoint(_keys: Any) -> None:
    return None


@contextlib.asynccontextmanager
async def consuming(pc: PersistConsumer, bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    """`pc` running and owning the topic's one partition; yields a producer to write to it."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    await pc.start()
    task = asyncio.ensure_future(pc.run())
    try:
        await until(lambda: pc.assignment() == {0}, 30, "the partition's assignment")
        yield producer
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pc.stop()
        await producer.stop()


def test_a_read_your_write_record_makes_the_next_fetches_prompt_until_prompt_for_s_passes(
        kafka_bootstrap: str, topic_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make_topic(kafka_bootstrap, topic_name, 1)
    waits = spy_on_fetch_waits(monkeypatch)
    persisted: dict[bytes, float] = {}

    async def persist(records: Any) -> list[tuple[str, str]]:
        persisted.update((r.value, time.monotonic()) for r in records)
        return []

    async def scenario() -> None:
        pc = PersistConsumer(bootstrap=kafka_bootstrap, topic=topic_name, group_id=f"{topic_name}.persist",
                             persist=persist, checkpoint=checkpoint, checkpoint_ms=50, wait_ms=LONG_MS,
                             prompt_wait_ms=PROMPT_MS, prompt_for_s=PROMPT_FOR_S)
        async with consuming(pc, kafka_bootstrap) as producer:
            await producer.send_and_wait(topic_name, b"plain", partition=0)
            await until(lambda: b"plain" in persisted, 30, "the plain record")
            assert pc.fetch_wait_ms == LONG_MS and set(waits) == {LONG_MS}  # nobody waited: long fetches only

            await producer.send_and_wait(topic_name, b"waited-on", partition=0, headers=READ_YOUR_WRITE_HEADERS)
            await until(lambda: b"waited-on" in persisted, 30, "the read-your-write record")
            assert pc.fetch_wait_ms == PROMPT_MS
            sent = time.monotonic()
            await producer.send_and_wait(topic_name, b"next", partition=0)
            await until(lambda: b"next" in persisted, 30, "the record after it")
            assert persisted[b"next"] - sent < LONG_MS / 2000, "persisted as slowly as with the long wait"
            assert PROMPT_MS in waits

            prompt_at = len(waits)
            await until(lambda: pc.fetch_wait_ms == LONG_MS, 10 + PROMPT_FOR_S, "the long wait again")
            await until(lambda: LONG_MS in waits[prompt_at:], 10, "a long fetch after the prompt ones")

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_records_of_a_namespace_that_tolerates_a_longer_wait_space_the_fetches_for_prompt_for_s(
        kafka_bootstrap: str, topic_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An EVENTUAL namespace's writes (agents.worker.persist_waits) gather larger batches: after one, the next is
    fetched only once the namespace's wait is out. When they stop, the consumer returns to the idle wait, so the
    next lone write is not held for the long one."""
    idle_ms, bulk_ms, hold_s = 100, 1500, 1.0
    make_topic(kafka_bootstrap, topic_name, 1)
    waits = spy_on_fetch_waits(monkeypatch)
    persisted: dict[bytes, float] = {}

    async def persist(records: Any) -> list[tuple[str, str]]:  # every record is a write of namespace "bulk"
        persisted.update((r.value, time.monotonic()) for r in records)
        return [("bulk", r.value.decode()) for r in records]

    async def scenario() -> None:
        pc = PersistConsumer(bootstrap=kafka_bootstrap, topic=topic_name, group_id=f"{topic_name}.persist",
                             persist=persist, checkpoint=checkpoint, checkpoint_ms=50, wait_ms=idle_ms,
                             prompt_wait_ms=PROMPT_MS, prompt_for_s=hold_s, namespace_waits={"bulk": bulk_ms})
        async with consuming(pc, kafka_bootstrap) as producer:
            await until(lambda: waits, 10, "a first fetch")
            assert set(waits) == {idle_ms}  # idle: the short default
            await producer.send_and_wait(topic_name, b"c1", partition=0)
            await until(lambda: b"c1" in persisted, 30, "the first write")
            assert pc.fetch_wait_ms == bulk_ms
            await producer.send_and_wait(topic_name, b"c2", partition=0)
            await until(lambda: b"c2" in persisted, 30, "the second write")
            assert persisted[b"c2"] - persisted[b"c1"] > 0.8 * bulk_ms / 1000, "fetched before the namespace's wait"

            await until(lambda: pc.fetch_wait_ms == idle_ms and not pc.holding, 10 + hold_s + bulk_ms / 1000,
                        "the idle wait once hold_s passed")
            sent = time.monotonic()
            await producer.send_and_wait(topic_name, b"c3", partition=0)
            await until(lambda: b"c3" in persisted, 30, "the lone write after them")
            assert persisted[b"c3"] - sent < bulk_ms / 2000, "a lone write held for the namespace's wait"

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_under_a_steady_stream_the_consumer_fetches_records_once_per_wait(
        kafka_bootstrap: str, topic_name: str) -> None:
    """Records arriving all the time are taken once per wait, all that came meanwhile in one batch, although each
    fetch asks for a single byte (the local broker pays each fetch that finds records by the partition's length)."""
    wait_ms, seconds = 400, 2.4
    make_topic(kafka_bootstrap, topic_name, 1)
    batches: list[int] = []

    async def persist(records: Any) -> list[tuple[str, str]]:
        batches.append(len(records))
        return []

    async def scenario() -> None:
        pc = PersistConsumer(bootstrap=kafka_bootstrap, topic=topic_name, group_id=f"{topic_name}.persist",
                             persist=persist, checkpoint=checkpoint, checkpoint_ms=50, wait_ms=wait_ms, min_bytes=1)
        async with consuming(pc, kafka_bootstrap) as producer:
            sent, started = 0, time.monotonic()
            while time.monotonic() - started < seconds:
                await producer.send_and_wait(topic_name, b"r%d" % sent, partition=0)
                sent += 1
                await asyncio.sleep(0.005)
            await until(lambda: sum(batches) == sent, 30, "every record")
            assert sent > 100
            assert len(batches) <= seconds * 1000 / wait_ms + 3, f"{len(batches)} batches for {sent} records"

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_backlog_larger_than_one_fetch_is_read_without_pausing(kafka_bootstrap: str, topic_name: str) -> None:
    """A fetch's answer is capped (5 MiB on the local broker, filled partition by partition), so a batch of a
    backlog can be short of what was asked for while partitions it did not reach hold records: the consumer reads
    on without pausing for the wait (agents.persist_consumer.has_unread)."""
    wait_ms, partitions, per_partition, size = 3000, 4, 40, 100_000  # 16 MB in all
    make_topic(kafka_bootstrap, topic_name, partitions)
    persisted: list[float] = []

    async def persist(records: Any) -> list[tuple[str, str]]:
        persisted.extend(time.monotonic() for _ in records)
        return []

    async def scenario() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", max_request_size=1 << 20)
        await producer.start()
        try:
            for _ in range(per_partition):
                await asyncio.gather(*(producer.send_and_wait(topic_name, bytes(size), partition=p)
                                       for p in range(partitions)))
        finally:
            await producer.stop()
        pc = PersistConsumer(bootstrap=kafka_bootstrap, topic=topic_name, group_id=f"{topic_name}.persist",
                             persist=persist, checkpoint=checkpoint, checkpoint_ms=50, wait_ms=wait_ms,
                             max_records=10_000, batch_bytes=64 << 20)
        await pc.start()
        task = asyncio.ensure_future(pc.run())
        try:
            await until(lambda: len(persisted) == partitions * per_partition, 60, "the whole backlog")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await pc.stop()
        assert persisted[-1] - persisted[0] < wait_ms / 2000, "the backlog paused for the wait"

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_batch_with_a_read_your_write_record_is_committed_at_once(kafka_bootstrap: str, topic_name: str) -> None:
    """A client waits for that record, and an API process that cannot store it itself (a shared pipeline) learns
    the worker has it from the committed offsets: its batch is checkpointed at once, not `checkpoint_ms` later
    (an hour here), and so is every batch for `prompt_for_s` after it (the client waits for the topic's ends, which
    other writers' records move)."""
    make_topic(kafka_bootstrap, topic_name, 1)
    committed: list[dict[int, int]] = []

    async def persist(records: Any) -> list[tuple[str, str]]:
        return []

    async def scenario() -> None:
        pc = PersistConsumer(bootstrap=kafka_bootstrap, topic=topic_name, group_id=f"{topic_name}.persist",
                             persist=persist, checkpoint=checkpoint, checkpoint_ms=3_600_000, wait_ms=PROMPT_MS,
                             prompt_wait_ms=PROMPT_MS, prompt_for_s=60.0,
                             on_committed=lambda offsets, _sent: committed.append(offsets))
        async with consuming(pc, kafka_bootstrap) as producer:
            plain = await producer.send_and_wait(topic_name, b"plain", partition=0)
            waited = await producer.send_and_wait(topic_name, b"waited-on", partition=0,
                                                  headers=READ_YOUR_WRITE_HEADERS)
            assert plain.offset < waited.offset
            await until(lambda: committed, 10, "a commit of the read-your-write record's batch")
            assert committed == [{0: waited.offset + 1}]
            after = await producer.send_and_wait(topic_name, b"plain-after", partition=0)
            await until(lambda: committed[-1] == {0: after.offset + 1}, 10, "a commit of the next plain record")

    asyncio.run(asyncio.wait_for(scenario(), 120))
