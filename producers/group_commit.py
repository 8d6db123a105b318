"""`GroupCommitProducer`: durable mutations from an asyncio service, sharing one record per loop pass.

Why: an HTTP service answers a durable write once the broker has acknowledged it. Sent one record per
request, every write pays the client's and the broker's per-record cost (and, from a thread pool, a thread
hop). Here the writes that arrive during one pass of the event loop are packed, at the end of that pass, into
one Avro record (a MutationBatch of bodies encoded on arrival), and every write of the pass shares that
record's acknowledgement future. There is no timer: a lone write is produced at the end of the very pass it
arrived in. Under load, once `max_in_flight` records await their acknowledgement, the next record keeps
gathering writes until one is acknowledged (classic group commit): the records grow with the load, and the
broker, librdkafka and the persist workers pay their per-record costs once per many writes.

One record per pass rather than one per partition: measured here at concurrency 32, one record per partition
(2 writes per record) ran at 9-12K writes/s, one record per pass (30 per record) at 49K/s, because the broker's
and librdkafka's cost is per record and per request. A record's mutations may therefore be for counters of any
partition; nothing downstream depends on it (events are identified by their tokens and ordered by their event
times, rollup signals are keyed by counter), and successive records rotate over the partitions so the persist
workers share the load. The record key is null: no single counter names it.

confluent-kafka rather than aiokafka: aiokafka's idempotent producer sends InitProducerId v0, which the local
broker (Tansu) refuses. `produce` is a non-blocking C call made on the event loop; one thread waits in
librdkafka's `poll` for delivery reports and settles each record's future on the loop (one hop per record,
not per write).

Durability is unchanged: acks=all with the idempotent producer. A record is acknowledged or failed as a
whole, so a request's mutations (a batch request's too: they travel in one record) are never half-sent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, Producer

from producers.client import DeliveryError, release
from schemas import Mutation, mutation_body, record_of_bodies

log = logging.getLogger(__name__)

RETRY_RULE = "retry with the same idempotency token and generation_time: it is counted once"
MAX_RECORD_BYTES = 900_000  # below the broker's default message.max.bytes (1 MB)


class _Pending:
    """The bodies of this pass of the loop, and the future they all wait on."""

    __slots__ = ("bodies", "future", "size")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.bodies: list[bytes] = []
        self.size = 0
        self.future = future


class GroupCommitProducer:
    """Produce validated mutations (with token and event time) to `topic`, group-committed per loop pass.

    `send(mutations)` returns a future that resolves once the broker acknowledged the record holding them, or
    fails with DeliveryError (the broker refused it, or did not answer within `timeout_s`). Use it from one
    event loop: `start()` there first, `stop()` at the end.
    """

    def __init__(self, bootstrap_servers: str, *, topic: str, timeout_s: float = 5.0, max_in_flight: int = 2,
                 client_id: str = "counter-api") -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        self._bootstrap = bootstrap_servers
        self._producer = Producer({
            "bootstrap.servers": bootstrap_servers, "client.id": client_id, "acks": "all",
            "enable.idempotence": True, "linger.ms": 0, "socket.nagle.disable": True,
            "message.timeout.ms": int(timeout_s * 1000), "message.max.bytes": 1 << 20,
        })
        self._partitions = 0
        self._next_partition = 0
        self._pending: _Pending | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Task[None] | None = None
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="group-commit-poll", daemon=True)
        self.records_sent = 0

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Learn the topic's partitions now if the broker answers; otherwise keep trying in the background
        (writes meanwhile fail with DeliveryError: 503 in the API)."""
        self._loop = asyncio.get_running_loop()
        self._poller.start()
        try:
            await self._connect()
        except DeliveryError as exc:
            log.warning("%s; retrying in the background", exc)
            self._starting = asyncio.ensure_future(self._connect_forever())

    async def _connect(self) -> None:
        def partitions() -> int:
            try:
                meta = self._producer.list_topics(self.topic, timeout=3.0).topics.get(self.topic)
            except KafkaException as exc:
                raise DeliveryError(f"broker {self._bootstrap} unreachable: {exc.args[0].str()}") from exc
            if meta is None or meta.error is not None or not meta.partitions:
                raise DeliveryError(f"topic {self.topic!r} is not available; create it with `counter up`")
            return len(meta.partitions)
        self._partitions = await asyncio.to_thread(partitions)

    async def _connect_forever(self) -> None:
        delay = 0.5
        while not self._closed.is_set() and not self._partitions:
            await asyncio.sleep(delay)
            try:
                await self._connect()
                log.warning("broker %s reachable again", self._bootstrap)
            except DeliveryError as exc:
                delay = min(delay * 2, 10.0)
                log.debug("%s", exc)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Send what is pending, wait for the acknowledgements, disconnect."""
        if self._starting is not None:
            self._starting.cancel()
        self._flush()
        await asyncio.to_thread(self._producer.flush, timeout_s)
        self._closed.set()
        if self._poller.is_alive():
            await asyncio.to_thread(self._poller.join, 2.0)
        release(self._producer)

    async def ping(self, timeout_s: float = 1.0) -> None:
        """Raise DeliveryError unless the broker answers a metadata request within `timeout_s`."""
        def ask() -> None:
            try:
                self._producer.list_topics(self.topic, timeout=timeout_s)
            except KafkaException as exc:
                raise DeliveryError(f"broker {self._bootstrap} unreachable: {exc.args[0].str()}") from exc
        await asyncio.to_thread(ask)

    # -- writes ------------------------------------------------------------------------------------------

    def send(self, mutations: Sequence[Mutation]) -> asyncio.Future[None]:
        """Queue mutations for this pass's record (all of them in that one record)."""
        loop = self._loop
        assert loop is not None, "start() first"
        if not self._partitions or self._closed.is_set():
            failed = loop.create_future()
            failed.set_exception(DeliveryError(f"broker {self._bootstrap} unreachable; {RETRY_RULE}"))
            return failed
        bodies = [mutation_body(m) for m in mutations]
        size = sum(len(b) for b in bodies)
        pending = self._pending
        if pending is not None and pending.size + size > MAX_RECORD_BYTES:
            self._flush()
            pending = None
        if pending is None:
            loop.call_soon(self._flush_pass)  # end of this pass: no timer a lone write must wait out
            pending = self._pending = _Pending(loop.create_future())
        pending.bodies.extend(bodies)
        pending.size += size
        return pending.future

    def _flush_pass(self) -> None:
        if self._pending is not None and self._in_flight < self.max_in_flight:
            self._flush()

    def _flush(self) -> None:
        batch, self._pending = self._pending, None
        if batch is None:
            return
        partition = self._next_partition
        self._next_partition = (partition + 1) % self._partitions
        try:
            self._producer.produce(self.topic, record_of_bodies(batch.bodies), None, partition=partition,
                                   on_delivery=functools.partial(self._delivered, batch.future))
        except (BufferError, KafkaException) as exc:  # local queue full, or the client is failing
            self._fail(batch.future, f"{type(exc).__name__}: {exc}")
            return
        self._in_flight += 1
        self.records_sent += 1

    def _delivered(self, future: asyncio.Future[None], err: KafkaError | None, _msg: object) -> None:
        """librdkafka's delivery report, on the poll thread: settle the record's future on the loop."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._acknowledged, future, None if err is None else err.str())

    def _acknowledged(self, future: asyncio.Future[None], error: str | None) -> None:
        self._in_flight -= 1
        if error is None:
            if not future.done():
                future.set_result(None)
        else:
            self._fail(future, error)
        if self._pending is not None and self._in_flight < self.max_in_flight:
            self._flush()  # the writes that gathered while the broker was busy

    def _fail(self, future: asyncio.Future[None], error: str) -> None:
        if not future.done():
            future.set_exception(DeliveryError(
                f"the broker did not acknowledge the write within {self.timeout_s:g}s or refused it ({error}); "
                f"{RETRY_RULE}"))

    def _poll_loop(self) -> None:
        """Wait in librdkafka for delivery reports (the GIL is released while it waits)."""
        while not self._closed.is_set():
            self._producer.poll(0.2)
