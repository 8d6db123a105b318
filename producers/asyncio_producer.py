"""`AsyncProducer`: confluent-kafka's producer for asyncio code, acknowledgements as asyncio futures.

Why confluent-kafka and not aiokafka: aiokafka's idempotent producer sends InitProducerId v0, which the local
broker (Tansu) refuses, and librdkafka does the per-record work in C. `produce` is a non-blocking call made on
the event loop; one thread waits in librdkafka's `poll` for delivery reports and settles each record's future
on the loop: one thread hop per record, none per caller (callers that share a record share its future).
Used by the API's group commit, the rollup-signal sender and the worker's dead letters and heartbeats.
A handle fenced after a broker stall is replaced (`handle.RenewingProducer`), on the poll thread, not the loop.

Neither producer lets the broker create a topic it does not hold (`allow.auto.create.topics`, true by default for
librdkafka's producer): a metadata request or a record for a missing topic would have the broker create it with its
own defaults (Tansu does, and Kafka with its default `auto.create.topics.enable`), and an API started before `counter
up`, or given a misspelt topic, would leave a mutations topic of the wrong shape, which `ensure_topics` leaves alone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Mapping
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, KafkaException

from producers.errors import DeliveryError
from producers.handle import RenewingProducer
from producers.topic_metadata import TopicUnavailable, topic_partitions
from schemas.dead_letter import Headers

log = logging.getLogger(__name__)


class AsyncProducer:
    """acks=all, idempotent; `produce` returns a future of the broker's acknowledgement (DeliveryError on
    failure or after `timeout_s`), which settles with the record's timestamp in µs (its delivery report's:
    LogAppendTime, the broker's clock, on a topic that has it, else the CreateTime librdkafka gave it; None when
    the report has none). Create and use it on one event loop; `start()` before, `stop()` after."""

    def __init__(self, bootstrap_servers: str, *, timeout_s: float = 5.0, client_id: str = "counter",
                 config: Mapping[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap_servers
        self.timeout_s = timeout_s
        self._kafka = RenewingProducer({
            "bootstrap.servers": bootstrap_servers, "client.id": client_id, "acks": "all",
            "enable.idempotence": True, "linger.ms": 0, "socket.nagle.disable": True,
            "message.timeout.ms": int(timeout_s * 1000), "message.max.bytes": 1 << 20,
            "allow.auto.create.topics": False, **(config or {}),  # see the module docstring
        }, name=client_id)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._acked: dict[tuple[str, int], int] = {}  # (topic, partition) -> offset after its latest acknowledged
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name=f"{client_id}-poll", daemon=True)

    def start(self) -> None:
        """Bind to the running loop and start serving delivery reports."""
        self._loop = asyncio.get_running_loop()
        if not self._poller.is_alive():
            self._poller.start()

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Wait up to `timeout_s` for what is in flight, then disconnect: records still unacknowledged then fail
        at once (DeliveryError), rather than hold the shutdown up for the producer's whole delivery timeout."""
        await asyncio.to_thread(self._kafka.flush, timeout_s)
        self._closed.set()
        if self._poller.is_alive():
            await asyncio.to_thread(self._poller.join, 2.0)
        await asyncio.to_thread(self._kafka.close)

    def produce(self, topic: str, value: bytes, key: bytes | None = None, *, partition: int = -1,
                headers: Headers | None = None) -> asyncio.Future[int | None]:
        """Queue one record; the future settles on the loop, with the record's timestamp, when the broker has
        acknowledged it."""
        loop = self._loop
        if loop is None:
            self.start()
            loop = self._loop
            assert loop is not None  # start() bound it
        future: asyncio.Future[int | None] = loop.create_future()
        try:
            self._kafka.produce(topic, value, key, partition=partition, headers=headers,
                                on_delivery=functools.partial(self._delivered, future))
        except (BufferError, KafkaException) as exc:  # local queue full, or the client is failing
            future.set_exception(DeliveryError(f"cannot produce to {topic!r}: {type(exc).__name__}: {exc}"))
        return future

    async def partitions(self, topic: str, timeout_s: float = 3.0) -> int:
        """The topic's partition count; DeliveryError when the broker or the topic is not there."""
        def ask() -> int:
            try:
                return len(topic_partitions(self._kafka.current.list_topics(topic, timeout=timeout_s), topic))
            except KafkaException as exc:
                raise DeliveryError(f"broker {self.bootstrap} unreachable: {exc.args[0].str()}") from exc
            except TopicUnavailable:
                raise DeliveryError(f"topic {topic!r} is not available on broker {self.bootstrap} (the worker and "
                                    "`counter up` create the service's topics; check the COUNTER_*_TOPIC settings)"
                                    ) from None
        return await asyncio.to_thread(ask)

    def acked_ends(self, topic: str) -> dict[int, int]:
        """Per partition of `topic`, the offset after the latest record this producer had acknowledged (a record's
        offset may show here a moment before its future settles)."""
        return {partition: end for (t, partition), end in list(self._acked.items()) if t == topic}

    def _delivered(self, future: asyncio.Future[int | None], err: KafkaError | None, msg: Any) -> None:
        """librdkafka's delivery report, on the poll thread."""
        assert self._loop is not None
        stamp = None
        if err is None:
            key = (msg.topic(), msg.partition())
            end = msg.offset() + 1
            if end > self._acked.get(key, 0):
                self._acked[key] = end
            kind, stamp_ms = msg.timestamp()
            if kind != TIMESTAMP_NOT_AVAILABLE and stamp_ms >= 0:
                stamp = stamp_ms * 1000
        self._loop.call_soon_threadsafe(_settle, future, None if err is None else err.str(), self.timeout_s, stamp)

    def _poll_loop(self) -> None:
        """Wait in librdkafka for delivery reports (the GIL is released while it waits)."""
        while not self._closed.is_set():
            self._kafka.current.poll(0.2)


def _settle(future: asyncio.Future[int | None], error: str | None, timeout_s: float, stamp: int | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(stamp)
    else:
        future.set_exception(DeliveryError(
            f"the broker did not acknowledge the record within {timeout_s:g}s or refused it ({error})"))
