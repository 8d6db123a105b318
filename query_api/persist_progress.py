"""How far the worker has persisted this process's writes, from the broker: for AddAndGetCount's read-your-write.

`query_api.early_persist` remembers this process's recent writes so that an AddAndGetCount stores the ones the
worker has not persisted yet with its own. A write it has forgotten, or may not store itself, must be the
worker's by then: with the worker lagging (a restart, a rebalance) it may not be, and a count without an
acknowledged ClearCount before it is wrong. Whether the worker has it is decided by offsets: the group commit
knows, per partition, the offset after the last record the broker acknowledged (`acked_ends`), and the persist
group commits an offset only once the records before it are stored (agents.persist_consumer). `covers(ends)`: the
committed offsets have reached `ends` on every partition.

The committed offsets are read from the broker every `interval_s` (one OffsetFetch; the local broker answers it in
well under a millisecond), while read-your-write is in use: after `idle_s` without a question the polling pauses,
and the next question resumes it (answered "no" until a fresh read arrives, which sends the call to the worker).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from producers.group_commit import GroupCommitProducer
from query_api.broker_offsets import BrokerOffsets

log = logging.getLogger(__name__)


class PersistProgress:
    """This process's records (the group commit's) against the persist group's committed offsets of the mutations
    topic, polled while asked about: `early_persist.WriteProgress`."""

    def __init__(self, producer: GroupCommitProducer, broker: BrokerOffsets, *, group: str, interval_s: float = 0.1,
                 idle_s: float = 30.0) -> None:
        self.producer = producer
        self.broker = broker
        self.topic = producer.topic
        self.group = group
        self.interval_s = interval_s
        self.idle_s = idle_s
        self.committed: dict[int, int] = {}
        self._read_at = -float("inf")  # monotonic time of the last committed offsets read
        self._asked_at = -float("inf")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.to_thread(self.broker.close)

    def started(self) -> int:
        return self.producer.records_started

    def settled(self) -> int:
        return self.producer.records_settled

    def acked_ends(self) -> dict[int, int]:
        return self.producer.acked_ends()

    def readable(self) -> bool:
        """Whether the committed offsets were read within the last few polls (and keep them polled a while). Not
        readable (just started or idle, the broker not answering, or no right to describe the persist group on a
        secured cluster): read-your-write then does without them, as it did before they were read."""
        now = time.monotonic()
        self._asked_at = now
        if not self._wake.is_set():
            self._wake.set()
        return now - self._read_at <= 10 * self.interval_s

    def covers(self, ends: Mapping[int, int]) -> bool:
        """Whether the worker has persisted every record before `ends` (partition -> offset), by offsets read within
        the last few polls (False when they were not)."""
        if not self.readable():
            return False
        committed = self.committed
        return all(committed.get(partition, -1) >= end for partition, end in ends.items())

    async def wait_covers(self, ends: Mapping[int, int], timeout_s: float) -> bool:
        """`covers(ends)` within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not self.covers(ends):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(self.interval_s / 2)
        return True

    async def _run(self) -> None:
        partitions: list[int] = []
        while True:
            if time.monotonic() - self._asked_at > self.idle_s:
                self._wake.clear()
                await self._wake.wait()
            try:
                if not partitions:
                    partitions = await asyncio.to_thread(self.broker.partitions, self.topic)
                read = await asyncio.to_thread(self.broker.committed, self.topic, self.group, partitions)
                self.committed = {p: offset for p, offset in read.items() if offset is not None}
                self._read_at = time.monotonic()
                if self._failing:
                    self._failing = False
                    log.warning("the persist group's offsets are readable again")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker is away: read-your-write waits for the worker meanwhile
                partitions = []
                if not self._failing:
                    self._failing = True
                    log.warning("cannot read the persist group's offsets (%s); AddAndGetCount waits for the worker "
                                "until they are readable", exc)
            await asyncio.sleep(self.interval_s)
