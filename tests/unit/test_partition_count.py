"""Partitions added to the mutations topic while workers run (`agents.watermark.PartitionCount`).

Before: a worker read the partition count once, at start, so its global watermark left partitions added later out,
and rollups passed the writes waiting there (stored, never counted) until every worker restarted. Now the heartbeat
timer reads the count again, and the watermark holds until the new partitions have watermarks of their own."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agents.watermark import PartitionCount
from agents.worker import _persist
from schemas import MICROS
from tests.unit.test_arrival_floors import TOPIC, Stack, T, heartbeat, run, write


class Broker:
    """Answers the partition count it is given; counts the reads; raises while `down`."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.reads = 0
        self.down = False

    async def partitions(self, topic: str) -> int:
        assert topic == TOPIC
        self.reads += 1
        if self.down:
            raise ConnectionError("broker away")
        return self.count


def test_the_watermark_holds_for_added_partitions_until_they_have_heartbeats(tmp_path: Path) -> None:
    async def scenario(stack: Stack) -> None:
        worker = stack.worker()
        worker.mutation_partitions = PartitionCount(TOPIC, 1, every_s=0)
        worker.owned_mutation_partitions = lambda: [0, 1]  # type: ignore[method-assign]  # handed both at once
        worker.arrivals.assigned({0})
        broker = Broker(1)
        await _persist(worker, [write(0, T - 5 * MICROS, "a"), heartbeat(1, T)])
        worker.offsets_committed({0: 2})
        await worker.publish_watermarks()
        before = await worker.watermark()
        assert before > 0

        broker.count = 2  # an operator adds a partition
        assert await worker.mutation_partitions.refresh(broker.partitions) == 2
        assert await worker.watermark() == 0, "rollups must wait for the new partition's watermark"

        worker.arrivals.assigned({1})
        await _persist(worker, [heartbeat(0, T + MICROS, partition=1)])
        worker.offsets_committed({1: 1})
        await worker.publish_watermarks()
        assert await worker.watermark() == before, "the new partition's heartbeat lets rollups go on"
    run(tmp_path, scenario)


def test_the_count_is_read_when_due_only_and_a_broker_away_keeps_it() -> None:
    async def scenario() -> None:
        broker = Broker(4)
        count = PartitionCount(TOPIC, 4, every_s=3600)
        assert await count.refresh(broker.partitions) == 4 and broker.reads == 0, "just read at start"
        count = PartitionCount(TOPIC, 4, every_s=0)
        broker.count = 6
        assert await count.refresh(broker.partitions) == 6 and broker.reads == 1
        broker.down = True
        assert await count.refresh(broker.partitions) == 6 and broker.reads == 2
        assert count.count == 6
    asyncio.run(scenario())

