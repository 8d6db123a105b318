"""`GroupCommitProducer`: durable mutations from an asyncio service, sharing one record per loop pass.

Why: an HTTP service answers a durable write once the broker has acknowledged it. Sent one record per
request, every write pays the client's and the broker's per-record cost (and, from a thread pool, a thread
hop). Here the writes that arrive during one pass of the event loop are packed, at the end of that pass, into
one Avro record (a MutationBatch of bodies encoded on arrival), and every write of the pass shares that
record's acknowledgement future. There is no timer: a lone write is produced at the end of the very pass it
arrived in. Under load, once `max_in_flight` records await their acknowledgement, the next record keeps
gathering writes until one is acknowledged (classic group commit): the records grow with the load, and the
broker, librdkafka and the persist workers pay their per-record costs once per many writes. When the broker is
free but the clients the last acknowledgement answered have not yet sent their next writes, the gathering record
waits for them, briefly and only while writes keep coming (`producers.cohort_hold`; `hold_max_s` 0 never waits):
closed-loop clients then ride one record per cycle instead of every other one.

One record per pass rather than one per partition: measured here at concurrency 32, one record per partition
(2 writes per record) ran at 9-12K writes/s, one record per pass (30 per record) at 49K/s, because the broker's
and librdkafka's cost is per record and per request. A record's mutations may therefore be for counters of any
partition; nothing downstream depends on it (events are identified by their tokens and ordered by their event
times, rollup signals are keyed by counter), and successive records rotate over the partitions so the persist
workers share the load. The record key is null: no single counter names it.

Records go out through `AsyncProducer` (confluent-kafka; one thread hop per record, none per write).

A write whose client waits until the worker has persisted it marks its record with the read-your-write
header (`schemas.record_headers`): the persist consumer then fetches promptly, and otherwise gathers larger
batches, which cost the worker and the broker less per write.

Durability is unchanged: acks=all with the idempotent producer. A record is acknowledged or failed as a
whole, so a request's mutations (a batch request's too: they travel in one record) are never half-sent.

An acknowledgement (`Acknowledgement`) settles with None when the record's timestamp (LogAppendTime, the broker's
clock, on the service's topics; else the CreateTime librdkafka stamped) lies where this process's clock put the
record: no earlier than the millisecond it was produced in, no later than its acknowledgement. The API judged each
write by its own clock (admission on arrival, the accept_limit on acknowledgement), and then no more leniently than
the worker judges it by that timestamp. Otherwise the broker's clock and this one disagree, and it settles with the
record's timestamp (µs), by which each of its writes must be judged again: the worker dead-letters what admission
refuses by it (a review: with the API's clock ahead of the broker's, a write dated within max_clock_skew of the API's
now answered 200 and was never counted).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from producers.asyncio_producer import AsyncProducer
from producers.client import MAX_RECORD_BYTES
from producers.cohort_hold import CohortHold
from producers.errors import DeliveryError
from schemas import Mutation, is_v2, mutation_body, record_of_bodies, v2_body
from schemas.record_headers import READ_YOUR_WRITE_HEADERS

log = logging.getLogger(__name__)

Acknowledgement = asyncio.Future[int | None]
"""A write's future from `GroupCommitProducer.send`: None once acknowledged, or the record's timestamp (µs) when the
clocks disagree (see the module's docstring); DeliveryError when the record failed."""

RETRY_RULE = ("retry with the same idempotency token and generation_time, while that generation_time is within the "
              "namespace's accept_limit: it is counted once")


class GroupCommitObserver(Protocol):
    """What an operator wants to see of group commit: how many writes each record carries, and how long the
    broker takes to acknowledge one (the API exports both as metrics, query_api.metrics)."""

    def record_sent(self, mutations: int) -> None:
        """A record holding `mutations` was handed to the producer."""

    def record_done(self, seconds: float, ok: bool) -> None:
        """A record was acknowledged (`ok`) or failed, `seconds` after it was handed over, as seen on the loop."""

    def record_held(self, gave_up: bool) -> None:
        """A record free to go waited for the clients the last acknowledgement answered (`CohortHold`): until all
        their writes came, or (`gave_up`) until writes stopped coming or the hold's bound passed."""


class _Pending:
    """The bodies of this pass of the loop, and the future they all wait on. `v2`: some mutation has dimensions
    or an item, so the record is a v2 one (its v1 bodies get the v2 defaults when it is produced).
    `read_your_write`: some client waits until its write is persisted. `overdue`: the timer that fails the writes
    the broker has not acknowledged within the producer's timeout of the first of them."""

    __slots__ = ("bodies", "future", "number", "overdue", "read_your_write", "requests", "size", "v2")

    def __init__(self, future: Acknowledgement, number: int) -> None:
        self.number = number  # records are numbered 1, 2, ... in the order they are started
        self.bodies: list[bytes] = []
        self.requests = 0  # the calls that added bodies: one client each (a batch request's bodies are one)
        self.size = 0
        self.future = future
        self.v2: list[bool] | None = None  # per body, once a v2 body joined
        self.read_your_write = False
        self.overdue: asyncio.TimerHandle | None = None


class GroupCommitProducer:
    """Produce validated mutations (with token and event time) to `topic`, group-committed per loop pass.

    `send(mutations)` returns a future that resolves once the broker acknowledged the record holding them, or
    fails with DeliveryError (the broker refused it, or did not answer within the producer's timeout). Use it
    from one event loop: `start()` there first, `stop()` at the end.
    """

    def __init__(self, producer: AsyncProducer, *, topic: str, max_in_flight: int = 1,
                 observer: GroupCommitObserver | None = None, hold_max_s: float = 0.0) -> None:
        self.kafka = producer
        self.topic = topic
        self.max_in_flight = max_in_flight
        self.hold = CohortHold(hold_max_s)  # 0: never held (producers.cohort_hold)
        self.observer = observer
        # since when every record failed (monotonic), and why; None while they are acknowledged: the API's /readyz
        # (a broker that answered metadata and refused every produce read as ready, a review)
        self.failing_since: float | None = None
        self.last_failure = ""
        self.last_failure_at = 0.0
        self._in_flight = 0
        self._partitions = 0
        self._unavailable = f"broker {producer.bootstrap} unreachable"  # why writes fail while _partitions is 0
        self._next_partition = 0
        self._pending: _Pending | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Task[None] | None = None
        self._closed = False
        self.records_sent = 0
        self.records_started = 0  # the number of the latest record started (a write joins the one started last)
        self.records_settled = 0  # every record up to this number is acknowledged or failed
        self._settled_early: set[int] = set()  # settled numbers above records_settled (with several in flight)

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Learn the topic's partitions now if the broker answers; otherwise keep trying in the background
        (writes meanwhile fail with DeliveryError: 503 in the API)."""
        self._loop = asyncio.get_running_loop()
        self.kafka.start()
        try:
            self._partitions = await self.kafka.partitions(self.topic)
        except DeliveryError as exc:
            log.warning("%s; retrying in the background", exc)
            self._unavailable = str(exc)
            self._starting = asyncio.ensure_future(self._connect_forever())

    async def _connect_forever(self) -> None:
        delay = 0.5
        while not self._closed and not self._partitions:
            await asyncio.sleep(delay)
            try:
                self._partitions = await self.kafka.partitions(self.topic)
                log.warning("broker %s reachable again", self.kafka.bootstrap)
            except DeliveryError as exc:
                delay = min(delay * 2, 10.0)
                self._unavailable = str(exc)
                log.debug("%s", exc)

    async def stop(self) -> None:
        """Send what is pending; the caller stops the AsyncProducer (which waits for acknowledgements)."""
        self._closed = True
        if self._starting is not None:
            self._starting.cancel()
        self._flush()

    # -- writes ------------------------------------------------------------------------------------------

    def send(self, mutations: Sequence[Mutation], *, read_your_write: bool = False) -> Acknowledgement:
        """Queue mutations for this pass's record (all of them in that one record). `read_your_write`: the
        caller will wait until they are persisted, so the record asks the persist consumer to hurry."""
        kinds: list[bool] | None = None  # per body, whether it is a v2 body: only when one is
        if len(mutations) == 1:
            m = mutations[0]
            bodies = [mutation_body(m)]
            if m.dimensions or m.item:
                kinds = [True]
        else:
            bodies = [mutation_body(m) for m in mutations]
            if any(is_v2(m) for m in mutations):
                kinds = [is_v2(m) for m in mutations]
        return self._queue(bodies, kinds, read_your_write)

    def send_body(self, body: bytes) -> Acknowledgement:
        """`send` for one mutation already encoded as a v1 body (`schemas.mutation_body`'s bytes; the API's plain
        AddCount encodes it in C, query_api.plain_add). Joining a plain record that has room is done here, the
        rest by `_queue`: this is the API's hottest write."""
        pending = self._pending
        if pending is not None and pending.v2 is None and pending.size + len(body) <= MAX_RECORD_BYTES:
            pending.bodies.append(body)
            pending.size += len(body)
            pending.requests += 1
            if self.hold.expected:
                self._arrived()
            return pending.future  # a pending record exists only while the producer is open and connected
        return self._queue([body], None, False)

    def _queue(self, bodies: list[bytes], kinds: list[bool] | None, read_your_write: bool) -> Acknowledgement:
        loop = self._loop
        assert loop is not None, "start() first"
        if not self._partitions or self._closed:
            failed = loop.create_future()
            # the broker away, or the topic missing (a review: "broker unreachable" while /readyz said the broker ok)
            failed.set_exception(DeliveryError(f"{self._unavailable}; {RETRY_RULE}"))
            return failed
        size = len(bodies[0]) if len(bodies) == 1 else sum(map(len, bodies))
        pending = self._pending
        if pending is not None and pending.size + size > MAX_RECORD_BYTES:
            self._flush()
            pending = None
        if self.hold.expected:
            self._arrived()
        if pending is None:
            loop.call_soon(self._flush_pass)  # end of this pass: no timer a lone write must wait out
            self.records_started += 1
            pending = self._pending = _Pending(loop.create_future(), self.records_started)
            pending.overdue = loop.call_later(self.kafka.timeout_s, self._overdue, pending)
        if kinds is not None and pending.v2 is None:
            pending.v2 = [False] * len(pending.bodies)
        if pending.v2 is not None:
            pending.v2.extend(kinds or [False] * len(bodies))
        pending.bodies.extend(bodies)
        pending.size += size
        pending.requests += 1
        pending.read_your_write |= read_your_write
        return pending.future

    def _flush_pass(self) -> None:
        """Produce the gathering record if the broker is free for it, unless the clients answered by the last
        acknowledgement are about to add to it (`CohortHold`): then at the hold's end or their last write."""
        if self._pending is None or self._in_flight >= self.max_in_flight:
            return
        loop = self._loop
        assert loop is not None, "start() first"
        if not self._in_flight and self.hold.wait(loop, self._hold_over):
            return
        self._flush()

    def _arrived(self) -> None:
        """A request joined the gathering record while requests were expected back (`CohortHold`); if it ends a
        hold in progress, the record goes at the end of this pass."""
        loop = self._loop
        assert loop is not None, "start() first"
        if self.hold.came(loop):
            if self.observer is not None:
                self.observer.record_held(False)
            loop.call_soon(self._flush_pass)

    def _hold_over(self) -> None:
        """The hold's bound, or a gap, passed before its requests all came."""
        if self.observer is not None:
            self.observer.record_held(True)
        self._flush_pass()

    def _flush(self) -> None:
        batch, self._pending = self._pending, None
        self.hold.cancel()
        if batch is None:
            return
        partition = self._next_partition
        self._next_partition = (partition + 1) % self._partitions
        if batch.v2 is None:
            value = record_of_bodies(batch.bodies)
        else:  # the plain bodies take the v2 defaults (an empty map, an empty item)
            value = record_of_bodies([b if v2 else v2_body(b) for b, v2 in zip(batch.bodies, batch.v2, strict=True)],
                                     v2=True)
        produced_us = time.time_ns() // 1000  # before librdkafka stamps a CreateTime
        record = self.kafka.produce(self.topic, value, None, partition=partition,
                                    headers=READ_YOUR_WRITE_HEADERS if batch.read_your_write else None)
        self._in_flight += 1
        self.records_sent += 1
        if self.observer is not None:
            self.observer.record_sent(len(batch.bodies))
        record.add_done_callback(functools.partial(self._acknowledged, batch, time.perf_counter(), produced_us))

    def acked_ends(self) -> dict[int, int]:
        """Per partition, the offset after the latest record acknowledged (`AsyncProducer.acked_ends`)."""
        return self.kafka.acked_ends(self.topic)

    def _settled(self, number: int) -> None:
        if number == self.records_settled + 1:
            self.records_settled = number
            while self.records_settled + 1 in self._settled_early:
                self.records_settled += 1
                self._settled_early.discard(self.records_settled)
        else:
            self._settled_early.add(number)

    def _overdue(self, batch: _Pending) -> None:
        """The producer's timeout has passed since the batch's first write: fail its writes now (503 in the API),
        whether the record is still gathering behind one in flight or waits in librdkafka, whose own timeout is
        checked about once a second. Why: a 503 asks for a retry with the same token and generation_time, which is
        admitted only within the namespace's accept_limit of that time (query_api.service.broker_timeout_s); a
        write that waited behind a record in flight and then its own timeout answered too late for it. A record
        already produced may still be stored: the retry is then the same event, counted once."""
        if batch.future.done():
            return
        if self._pending is batch:  # never produced: nothing of it reaches the broker
            self._pending = None
            self._settled(batch.number)
            if self.hold.cancel():  # held: no record waits for its clients any more
                self.hold.release()
        why = f"broker {self.kafka.bootstrap} did not acknowledge within {self.kafka.timeout_s:g}s"
        self._failed(why)
        batch.future.set_exception(DeliveryError(f"{why}; {RETRY_RULE}"))

    def _failed(self, why: str) -> None:
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        self.last_failure, self.last_failure_at = why, now

    def _acknowledged(self, batch: _Pending, sent: float, produced_us: int, record: asyncio.Future[int | None]) -> None:
        future = batch.future
        if batch.overdue is not None:
            batch.overdue.cancel()
        self._in_flight -= 1
        self._settled(batch.number)
        error = asyncio.CancelledError() if record.cancelled() else record.exception()
        if self.observer is not None:
            self.observer.record_done(time.perf_counter() - sent, error is None)
        if error is None:
            self.failing_since = None
        else:
            self._failed(str(error))
        if not future.done():
            if error is None:
                future.set_result(_disagreed(record.result(), produced_us))
            else:
                future.set_exception(DeliveryError(f"{error}; {RETRY_RULE}"))
        # the clients answered now may come back at once; read-your-write ones are answered later
        loop = self._loop
        assert loop is not None, "start() first"
        self.hold.acknowledged(0 if batch.read_your_write else batch.requests,
                               None if error else time.perf_counter() - sent, loop.time())
        self._flush_pass()  # the writes that gathered while the broker was busy, unless their cohort is coming


def _disagreed(stamp_us: int | None, produced_us: int) -> int | None:
    """The record's timestamp when it lies outside [the millisecond it was produced in, now] by this process's clock,
    else None (see the module's docstring)."""
    if stamp_us is None or produced_us - produced_us % 1000 <= stamp_us <= time.time_ns() // 1000:
        return None
    return stamp_us
