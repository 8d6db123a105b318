"""`RenewingProducer`: a librdkafka producer handle that replaces itself once it is fenced or failed fatally.

Why: with `enable.idempotence`, a record that times out in flight makes librdkafka bump its producer epoch. A broker
that does not take the bumped epoch (the local Tansu broker) then answers every later write "producer fenced", and
a fatal idempotence error makes librdkafka refuse every later write: the handle never recovers by itself. A new
handle gets a new producer id and writes again. Records still queued or in flight on the old handle fail (purged),
as they would have anyway; their callers retry them with the same idempotency tokens, which are counted once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

log = logging.getLogger(__name__)

Delivered = Callable[[KafkaError | None, Any], None]

# Delivery or produce errors after which the handle never writes again.
FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
                    KafkaError._FATAL})
# Delivery errors by which the broker refused a record of a fenced producer: it was never written, so it is sent
# again on the new handle.
REFUSED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
SERVE_PURGED_S = 5.0  # how long a retired handle may take to report its purged records as failed


def release(producer: Producer) -> None:
    """Shut a flushed librdkafka handle down now, rather than when it is garbage collected: until then it
    keeps reconnecting (and logging it) to a broker that may be gone. Older confluent-kafka releases have no
    `Producer.close` and free the handle only on collection."""
    close = getattr(producer, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            close()


def is_fenced(err: KafkaError) -> bool:
    """Whether `err` means the handle that reported it will never write again."""
    return err.fatal() or err.code() in FENCED


def abandon(producer: Producer, timeout_s: float = SERVE_PURGED_S) -> None:
    """Fail every record still queued or in flight on `producer` and serve their delivery reports, so that no
    caller waits forever on a record of a handle about to be closed."""
    with contextlib.suppress(Exception):
        if len(producer):
            producer.purge(in_queue=True, in_flight=True, blocking=True)
            producer.flush(timeout_s)


class RenewingProducer:
    """The current librdkafka handle for `config`, replaced by a fresh one when a delivery report or the error
    callback says it is fenced or failed fatally (logged once per renewal). Records go through `produce`;
    whoever polls reads `current` each time, since it may change."""

    def __init__(self, config: Mapping[str, Any], *, name: str) -> None:
        self.name = name
        self._config = dict(config)
        self._user_error_cb: Callable[[KafkaError], None] | None = self._config.pop("error_cb", None)
        self._lock = threading.Lock()
        self._closed = False
        self._retiring: list[threading.Thread] = []
        self.handle: tuple[int, Producer] = (0, self._build(0))  # (generation, handle), replaced as one

    @property
    def current(self) -> Producer:
        return self.handle[1]

    def produce(self, topic: str, value: bytes, key: bytes | None, *, partition: int, on_delivery: Delivered,
                headers: Any = None) -> None:
        """Produce on the current handle (BufferError when its queue is full). A handle that refuses the record
        as fenced is renewed and the record produced on the new one; so is a record the broker refused as fenced
        (`REFUSED`: never written), once, so that the first write after a stall does not fail too."""
        self._produce(topic, value, key, partition, on_delivery, headers, resent=False)

    def _produce(self, topic: str, value: bytes, key: bytes | None, partition: int, on_delivery: Delivered,
                 headers: Any, *, resent: bool) -> None:
        resend = None if resent else functools.partial(self._produce, topic, value, key, partition, on_delivery,
                                                       headers, resent=True)
        for attempt in range(2):
            generation, producer = self.handle
            try:
                producer.produce(topic, value, key, partition=partition, headers=headers,
                                 on_delivery=self._watch(generation, on_delivery, resend))
                return
            except KafkaException as exc:
                if attempt or not self.check(generation, exc.args[0]):
                    raise

    def check(self, generation: int, err: KafkaError) -> bool:
        """Renew the handle of `generation` if `err` says it is fenced; True if it was (now or before)."""
        if not is_fenced(err):
            return False
        self._renew(generation, err.str())
        return True

    def flush(self, timeout_s: float) -> int:
        """Wait for the current handle's records and the retiring handles' reports; the records left in flight."""
        deadline = time.monotonic() + timeout_s
        remaining = self.current.flush(timeout_s)
        self.wait_retired(max(0.0, deadline - time.monotonic()))
        return int(remaining)

    def wait_retired(self, timeout_s: float) -> None:
        """Wait until the handles replaced so far have reported their records as failed."""
        deadline = time.monotonic() + timeout_s
        for thread in list(self._retiring):
            thread.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Fail what is still queued or in flight (delivery reports say so) and shut the handle down."""
        with self._lock:
            self._closed = True
        producer = self.current
        abandon(producer)
        self.wait_retired(SERVE_PURGED_S)
        release(producer)

    # -- internals --------------------------------------------------------------------------------------

    def _build(self, generation: int) -> Producer:
        def on_error(err: KafkaError) -> None:
            if err.fatal():
                self._renew(generation, err.str())
            if self._user_error_cb is not None:
                self._user_error_cb(err)

        return Producer({**self._config, "error_cb": on_error})

    def _watch(self, generation: int, on_delivery: Delivered, resend: Callable[[], None] | None) -> Delivered:
        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is not None and self.check(generation, err) and resend is not None and err.code() in REFUSED:
                try:
                    resend()  # on the renewed handle: its own report settles the caller
                    return
                except Exception:  # it could not be queued: report the refusal
                    log.debug("re-sending a record refused as fenced failed", exc_info=True)
            on_delivery(err, msg)

        return delivered

    def _renew(self, generation: int, reason: str) -> None:
        with self._lock:
            if self._closed or generation != self.handle[0]:
                return  # renewed already (its other records report the same), or shutting down
            old = self.handle[1]
            self.handle = (generation + 1, self._build(generation + 1))
            self._retiring = [t for t in self._retiring if t.is_alive()]
            retire = threading.Thread(target=_retire, args=(old,), name=f"{self.name}-retire", daemon=True)
            self._retiring.append(retire)
            retire.start()
        log.warning("%s: the Kafka producer is fenced or failed (%s); replaced it with a new one "
                    "(its unacknowledged records fail: retry them with the same tokens)", self.name, reason)


def _retire(producer: Producer) -> None:
    """A replaced handle: its records fail at once (they would only fail later), then it is shut down."""
    abandon(producer)
    release(producer)
