"""The API's view of how far the worker has persisted its writes (query_api.persist_progress), against the real
session broker: the group commit's acknowledged ends per partition, and a consumer group's commits read back."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from producers.asyncio_producer import AsyncProducer
from producers.group_commit import GroupCommitProducer
from query_api.broker_offsets import BrokerOffsets
from query_api.persist_progress import PersistProgress
from schemas import Mutation
from tests.helpers import make_topic, read_all

pytestmark = pytest.mark.integration

PARTITIONS = 3


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """What the persist consumer does once a batch is stored."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def test_progress_follows_acknowledged_records_and_the_persist_groups_commits(kafka_bootstrap: str,
                                                                              topic_name: str) -> None:
    make_topic(kafka_bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}.persist"
    now = time.time_ns() // 1000

    async def scenario() -> tuple[dict[int, int], list[bool]]:
        kafka = AsyncProducer(kafka_bootstrap, client_id="test-progress", timeout_s=10.0)
        gc = GroupCommitProducer(kafka, topic=topic_name)
        await gc.start()
        progress = PersistProgress(gc, BrokerOffsets(kafka_bootstrap), group=group, interval_s=0.05)
        progress.start()
        for i in range(7):  # one record a pass, round-robin over the partitions
            await gc.send([Mutation("my_dataset", "c", 1, now + i, f"t{i}", "")])
        assert gc.records_started == gc.records_settled == 7
        ends = progress.acked_ends()
        seen = [progress.covers(ends)]  # nothing committed (and nothing read yet)
        await asyncio.to_thread(commit, kafka_bootstrap, group, topic_name, {p: e - 1 for p, e in ends.items()})
        seen.append(await progress.wait_covers(ends, 1.0))  # one record short on each partition: never
        await asyncio.to_thread(commit, kafka_bootstrap, group, topic_name, ends)
        seen.append(await progress.wait_covers(ends, 10.0))
        await progress.stop()
        await gc.stop()
        await kafka.stop()
        return ends, seen

    ends, seen = asyncio.run(asyncio.wait_for(scenario(), 60))
    last = {}
    for record in read_all(kafka_bootstrap, topic_name):
        last[record.partition] = record.offset + 1
    assert ends == last and sum(1 for _ in ends) == PARTITIONS
    assert seen == [False, False, True]


def test_topic_ends_cover_what_another_process_had_acknowledged(kafka_bootstrap: str, topic_name: str) -> None:
    """A shared pipeline (query_api.service.earlier_ends): the topic's end offsets read after another API
    process's writes were acknowledged are at or past that process's acknowledged ends on every partition, and
    callers that ask together share reads."""
    make_topic(kafka_bootstrap, topic_name, PARTITIONS)
    now = time.time_ns() // 1000

    async def scenario() -> tuple[dict[int, int], list[dict[int, int]], int]:
        kafka_a = AsyncProducer(kafka_bootstrap, client_id="test-process-a", timeout_s=10.0)
        kafka_b = AsyncProducer(kafka_bootstrap, client_id="test-process-b", timeout_s=10.0)
        a, b = GroupCommitProducer(kafka_a, topic=topic_name), GroupCommitProducer(kafka_b, topic=topic_name)
        await a.start()
        await b.start()
        broker = CountingReads(kafka_bootstrap)
        progress = PersistProgress(b, broker, group=f"{topic_name}.persist")
        for i in range(5):  # process A's writes, one record a pass over the partitions
            await a.send([Mutation("my_dataset", "c", 1, now + i, f"a{i}", "")])
        acked_by_a = a.acked_ends()
        read = await asyncio.gather(*(progress.topic_ends() for _ in range(20)))
        await progress.stop()
        for gc, kafka in ((a, kafka_a), (b, kafka_b)):
            await gc.stop()
            await kafka.stop()
        return acked_by_a, read, broker.reads

    acked_by_a, read, reads = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert set(acked_by_a) == set(range(PARTITIONS))
    assert all(ends[p] >= end for ends in read for p, end in acked_by_a.items())
    assert 1 <= reads <= 2  # twenty callers, one read (or one more, for those that came during it)


class CountingReads(BrokerOffsets):
    """The broker's client, counting end-offset reads."""

    reads = 0

    def ends(self, topic: str, partitions: list[int]) -> dict[int, int]:
        self.reads += 1
        return super().ends(topic, partitions)


def test_a_waiting_caller_sees_a_commit_long_before_the_next_idle_read(kafka_bootstrap: str, topic_name: str) -> None:
    """While a caller waits for the worker (wait_covers), the committed offsets are read every waiting_interval_s,
    not every interval_s (5 s here; the wait gives up after 3 s): an AddAndGetCount learns of the worker's commit
    within milliseconds."""
    make_topic(kafka_bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}.persist"
    now = time.time_ns() // 1000

    async def scenario() -> bool:
        kafka = AsyncProducer(kafka_bootstrap, client_id="test-progress-wait", timeout_s=10.0)
        gc = GroupCommitProducer(kafka, topic=topic_name)
        await gc.start()
        progress = PersistProgress(gc, BrokerOffsets(kafka_bootstrap), group=group, interval_s=5.0,
                                   waiting_interval_s=0.01)
        progress.start()
        await gc.send([Mutation("my_dataset", "c", 1, now, "t0", "")])
        ends = progress.acked_ends()
        waiting = asyncio.ensure_future(progress.wait_covers(ends, 3.0))
        deadline = time.monotonic() + 3.0
        while not progress.readable():  # a first read, without the commit; the next idle one is 5 s away
            assert time.monotonic() < deadline, "the offsets were never read"
            await asyncio.sleep(0.005)
        assert not waiting.done()
        await asyncio.to_thread(commit, kafka_bootstrap, group, topic_name, ends)
        covered = await waiting
        await progress.stop()
        await gc.stop()
        await kafka.stop()
        return covered

    assert asyncio.run(asyncio.wait_for(scenario(), 60))
