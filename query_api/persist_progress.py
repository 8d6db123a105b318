"""How far the worker has persisted this process's writes, from the broker: for AddAndGetCount's read-your-write.

`query_api.early_persist` remembers this process's recent writes so that an AddAndGetCount stores the ones the
worker has not persisted yet with its own. A write it has forgotten, or may not store itself, must be the
worker's by then: with the worker lagging (a restart, a rebalance) it may not be, and a count without an
acknowledged ClearCount before it is wrong. Whether the worker has it is decided by offsets: the group commit
knows, per partition, the offset after the last record the broker acknowledged (`acked_ends`), and the persist
group commits an offset only once the records before it are stored (agents.persist_consumer). `covers(ends)`: the
committed offsets have reached `ends` on every partition.

Where several API processes share the pipeline, this process's ends are not enough: `topic_ends` reads the topic's
end offsets after the caller's write was acknowledged (one read for the callers that ask together), below which lies
every record any process had acknowledged by then.

The committed offsets are read from the broker (one OffsetFetch; the local broker answers it in well under a
millisecond) every `interval_s` while read-your-write is in use, and every `waiting_interval_s` (10 ms) while a
caller waits for them (`wait_covers`; the worker commits at once while clients wait, agents.persist_consumer).
After `idle_s` without a question the polling pauses, and the next question resumes it: `readable` answers "no"
until a fresh read arrives (the early path then sends the call to the worker if it has forgotten a write the worker
may not have), and a wait waits for that read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from producers.group_commit import GroupCommitProducer
from query_api.broker_offsets import BrokerOffsets

log = logging.getLogger(__name__)
_T = TypeVar("_T")
PARTITIONS_S = 30.0  # how long the topic's partition list is trusted


class PersistProgress:
    """This process's records (the group commit's) against the persist group's committed offsets of the mutations
    topic, polled while asked about: `early_persist.WriteProgress`."""

    def __init__(self, producer: GroupCommitProducer, broker: BrokerOffsets, *, group: str, interval_s: float = 0.1,
                 waiting_interval_s: float = 0.01, ends_interval_s: float = 0.01, idle_s: float = 30.0) -> None:
        self.producer = producer
        self.broker = broker
        self.topic = producer.topic
        self.group = group
        self.interval_s = interval_s
        self.waiting_interval_s = waiting_interval_s  # between reads while a caller waits for the offsets to move
        # between the starts of two end-offset reads: the local broker lists a partition's batches to find its end
        # (0.6 ms of a read with nothing stored, 2.5 ms at 40,000 records), and back-to-back reads took its cores
        self.ends_interval_s = ends_interval_s
        self.idle_s = idle_s
        self.committed: dict[int, int] = {}
        self._read_at = -float("inf")  # monotonic time of the last committed offsets read
        self._asked_at = -float("inf")
        self._wake = asyncio.Event()
        self._waiters = 0  # callers in wait_covers
        self._hurry = asyncio.Event()  # a caller began to wait: read now
        self._read_done: asyncio.Future[None] | None = None  # resolved by the next read, for the waiting callers
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._partitions: list[int] = []  # of the topic, read again after a failed read and every PARTITIONS_S
        self._partitions_at = -float("inf")
        self._broker_turn = asyncio.Lock()  # the broker's clients serve one read at a time (query_api.broker_offsets)
        self._ends_next: asyncio.Future[dict[int, int]] | None = None  # the ends read the next callers share
        self._ends_reader: asyncio.Task[None] | None = None
        self._ends_started = -float("inf")  # monotonic time the last end-offset read began

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        for task in (self._task, self._ends_reader):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._ends_next is not None:  # callers waiting for a read that will not be made
            self._ends_next.cancel()
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
        secured cluster): the early path then stores and counts only while it has forgotten no write, and otherwise
        sends the call to the worker (query_api.early_persist)."""
        now = time.monotonic()
        self._asked_at = now
        if not self._wake.is_set():
            self._wake.set()
        return now - self._read_at <= 10 * self.interval_s

    @property
    def failing(self) -> bool:
        """Whether the last read of the committed offsets failed (the broker away, or no right to describe the
        persist group): waiting for them would only time out."""
        return self._failing

    def covers(self, ends: Mapping[int, int]) -> bool:
        """Whether the worker has persisted every record before `ends` (partition -> offset), by offsets read within
        the last few polls (False when they were not)."""
        if not self.readable():
            return False
        committed = self.committed
        # a partition without a commit holds nothing the worker has: covered only while it is empty (end 0)
        return all(committed.get(partition, 0) >= end for partition, end in ends.items())

    async def wait_covers(self, ends: Mapping[int, int], timeout_s: float) -> bool:
        """`covers(ends)` within `timeout_s`. While anyone waits, the offsets are read every `waiting_interval_s`
        (the worker commits a batch holding a read-your-write record at once), each wait judged after each read."""
        deadline = time.monotonic() + timeout_s
        self._waiters += 1
        self._hurry.set()
        try:
            while not self.covers(ends):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if self._read_done is None:
                    self._read_done = asyncio.get_running_loop().create_future()
                await asyncio.wait({self._read_done}, timeout=remaining)  # never cancels it: others wait on it too
            return True
        finally:
            self._waiters -= 1

    async def _pause(self) -> None:
        """Between two reads: `interval_s`, cut short when a caller begins to wait; `waiting_interval_s` while any
        caller waits."""
        self._hurry.clear()
        if self._waiters:
            await asyncio.sleep(self.waiting_interval_s)
            return
        # asyncio.wait, not wait_for: Python 3.11's wait_for swallows a cancellation that meets the event being set,
        # and stop() then waited for ever
        hurry = asyncio.ensure_future(self._hurry.wait())
        try:
            await asyncio.wait({hurry}, timeout=self.interval_s)
        finally:
            hurry.cancel()

    async def topic_ends(self) -> dict[int, int]:
        """The topic's end offsets, by a read made after this call: every record the broker acknowledged to any
        producer before the call lies below them. Callers arriving while a read is under way share the next one.
        Raises what the broker's client raised."""
        if self._ends_next is None:
            self._ends_next = asyncio.get_running_loop().create_future()
            if self._ends_reader is None or self._ends_reader.done():
                self._ends_reader = asyncio.ensure_future(self._read_ends())
        return await asyncio.shield(self._ends_next)

    async def _read_ends(self) -> None:
        while self._ends_next is not None:
            if (spacing := self._ends_started + self.ends_interval_s - time.monotonic()) > 0:
                await asyncio.sleep(spacing)  # callers arriving meanwhile share this read: it starts after them
            future, self._ends_next = self._ends_next, None  # callers from now on wait for the read after this one
            self._ends_started = time.monotonic()
            try:
                ends = await self._read(lambda partitions: self.broker.ends(self.topic, partitions))
            except asyncio.CancelledError:
                future.cancel()
                raise
            except Exception as exc:
                future.set_exception(exc)
                future.exception()  # retrieved: a caller that gave up must not leave it unretrieved
            else:
                future.set_result(ends)

    async def _read(self, read: Callable[[list[int]], _T]) -> _T:
        """`read(partitions)` on a worker thread, one broker call at a time; the partitions are read again after a
        failure (the topic may have been recreated) and every PARTITIONS_S (an operator may add some: ends that
        left a new partition out would let a shared AddAndGetCount pass over a write there)."""
        async with self._broker_turn:
            try:
                if not self._partitions or time.monotonic() - self._partitions_at > PARTITIONS_S:
                    self._partitions = await asyncio.to_thread(self.broker.partitions, self.topic)
                    self._partitions_at = time.monotonic()
                partitions = self._partitions
                return await asyncio.to_thread(read, partitions)
            except Exception:
                self._partitions = []
                raise

    async def _run(self) -> None:
        while True:
            if time.monotonic() - self._asked_at > self.idle_s:
                self._wake.clear()
                await self._wake.wait()
            try:
                read = await self._read(lambda partitions: self.broker.committed(self.topic, self.group, partitions))
                self.committed = {p: offset for p, offset in read.items() if offset is not None}
                self._read_at = time.monotonic()
                if self._failing:
                    self._failing = False
                    log.warning("the persist group's offsets are readable again")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker is away: read-your-write waits for the worker meanwhile
                if not self._failing:
                    self._failing = True
                    log.warning("cannot read the persist group's offsets (%s); AddAndGetCount waits for the worker "
                                "until they are readable", exc)
            done, self._read_done = self._read_done, None
            if done is not None:
                done.set_result(None)
            await self._pause()
