"""`CounterProducer`: produce count mutations to Kafka, durably and idempotently.

A small explicit client over confluent-kafka: acks=all with the idempotent producer, records keyed
`namespace:counter` (`namespace:counter#k` in a namespace with shards, `schemas.shard_key`) on the partition the
Java murmur2 partitioner picks, optional client-side batching of many mutations into one record per partition,
and delivery failures that always reach the caller, carrying the mutations they failed so that a retry re-sends
them unchanged (same tokens and event times: counted once).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any, NamedTuple

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, KafkaException

from control_plane import NamespaceRegistry
from control_plane.admission import admission_error, mutation_refusal
from producers.errors import DeliveryError
from producers.handle import RenewingProducer
from producers.partitioner import partition_for
from producers.topic_metadata import TopicUnavailable, topic_partitions
from schemas import (
    MAX_SHARDS,
    Mutation,
    MutationOp,
    ValidationError,
    encode_batch,
    encode_mutation,
    parse_generation_time,
    validate_dimensions,
    validate_mutation,
)

log = logging.getLogger(__name__)

DEFAULT_TOPIC = "counter-mutations"
MAX_RECORD_BYTES = 900_000  # below the broker's default message.max.bytes (1 MB): larger batches are split


class NotAdmitted(Exception):
    """Mutations the broker acknowledged that the pipeline will refuse: judged by the worker's admission rule
    (`control_plane.admission`) on the timestamp of the record the acknowledgement carries; for example a record
    that reached Kafka after its namespace's accept_limit, behind a stalled broker. (On a CreateTime topic that is
    the client's own time, and the worker also judges arrival by its heartbeats: a record stalled in the client can
    be refused there unnoticed here.) They are dead-lettered and not counted.
    Not a DeliveryError: a `retry` re-sends the same times and would be refused again; send each again as a new write
    (a new token and time), which cannot count twice, unless it was itself a retry: a DeliveryError leaves unknown
    whether the first attempt reached Kafka in time, and one that did was counted (a review counted such writes
    twice). `refusals` holds (mutation, reason) pairs. With batch_size > 1 a future stands for its batch: this names
    the mutations it concerns, and the batch's others were delivered."""

    def __init__(self, refusals: list[tuple[Mutation, str]]) -> None:
        first = refusals[0][1]
        super().__init__(f"{len(refusals)} mutation(s) acknowledged but not admitted (dead-lettered, not counted; "
                         f"send them again as new writes, but not a retry's: its first attempt may have been "
                         f"counted); first: {first}")
        self.refusals = refusals
        self.mutations = [m for m, _ in refusals]


_token_prefix = ""
_token_numbers = itertools.count()


def _draw_token_prefix() -> None:
    global _token_prefix, _token_numbers
    _token_prefix, _token_numbers = os.urandom(8).hex(), itertools.count()


_draw_token_prefix()
os.register_at_fork(after_in_child=_draw_token_prefix)  # a forked child draws its own


def new_token() -> str:
    """A unique idempotency token for callers that do not bring their own: 32 hex digits, 64 random bits drawn once
    per process (again in a forked child) followed by the process's next sequence number. Why not 128 fresh random
    bits per token: that is a system call per write, which the API's event loop paid on every durable write without a
    token (8% of its samples at concurrency 32, the GIL handed over and taken back each time). The number is written
    by bytes.hex, 0.14 µs against 0.26 for a format spec (the same 16 digits below 2**64)."""
    return _token_prefix + next(_token_numbers).to_bytes(8, "big").hex()


def now_micros() -> int:
    return time.time_ns() // 1000


class Delivery(Future[None]):
    """A write's future that notes whether its caller has read its outcome (`result()`, `exception()`, or a done
    callback reading either): `flush` and `close` then leave that failure to the caller rather than raise it again.
    (A review: writes whose failures the caller had read from their futures and retried until acknowledged were
    raised again by `close`, and a caller that sent them once more counted them twice.) A future standing for
    several records (`parts`) counts as read for all of them."""

    def __init__(self, parts: Iterable[Delivery] = ()) -> None:
        super().__init__()
        self.seen = False
        self.parts = tuple(parts)

    def result(self, timeout: float | None = None) -> None:
        try:
            super().result(timeout)
        except TimeoutError:  # not settled when the wait ended (even if it is by now): nothing was read
            raise
        except BaseException:
            self.see()
            raise
        self.see()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        error = super().exception(timeout)  # TimeoutError: nothing read
        self.see()
        return error

    def see(self) -> None:
        """Mark the outcome read (and its parts')."""
        self.seen = True
        for part in self.parts:
            part.see()


class _Unreported(NamedTuple):
    """A failure or refusal kept for the next `flush`/`close`, unless its caller reads it from `future` first."""

    future: Delivery
    failures: list[tuple[str, str]]  # (record key, reason) per failed mutation
    mutations: list[Mutation]  # failed, for `retry`
    refusals: list[tuple[Mutation, str]]  # acknowledged, not admitted


class _Pending:
    """Mutations waiting to become one batch record on one partition."""

    __slots__ = ("future", "mutations", "since")

    def __init__(self) -> None:
        self.mutations: list[Mutation] = []
        self.future = Delivery()
        self.since = time.monotonic()


def _check_arguments(batch_size: int, linger_ms: float, delivery_timeout_ms: int) -> None:
    """Refuse settings that would silently never send (a negative linger) or that librdkafka reads otherwise."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1 (got {batch_size!r})")
    if isinstance(linger_ms, bool) or not isinstance(linger_ms, int | float) or not math.isfinite(linger_ms) \
            or linger_ms < 0:
        raise ValueError(f"linger_ms must be a finite number >= 0 (got {linger_ms!r})")
    if isinstance(delivery_timeout_ms, bool) or not isinstance(delivery_timeout_ms, int) or delivery_timeout_ms < 1:
        raise ValueError(f"delivery_timeout_ms must be an integer >= 1 (got {delivery_timeout_ms!r})")


def _records(ms: list[Mutation]) -> list[tuple[list[Mutation], bytes]]:
    """The records carrying `ms`: one, or as many as keep each within MAX_RECORD_BYTES (a lone mutation larger
    than that goes as it is, and fails with librdkafka's reason)."""
    value = encode_mutation(ms[0]) if len(ms) == 1 else encode_batch(ms)
    if len(value) <= MAX_RECORD_BYTES or len(ms) == 1:
        return [(ms, value)]
    parts = min(len(ms), -(-len(value) // MAX_RECORD_BYTES) + 1)
    step = -(-len(ms) // parts)
    return [record for i in range(0, len(ms), step) for record in _records(ms[i:i + step])]


def _settle_when_all(parts: list[Delivery], whole: Future[None]) -> None:
    """Settle `whole` once every part has: failed with all the parts' failed mutations if any part failed. (The
    parts' outcomes are read here without marking them read: the caller reads `whole`.)"""
    left = [len(parts)]
    lock = threading.Lock()

    def part_done(_: Future[None]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        failed = [Future.exception(p) for p in parts]
        errors = [e for e in failed if isinstance(e, DeliveryError)]
        refused = [r for e in failed if isinstance(e, NotAdmitted) for r in e.refusals]
        if errors:
            whole.set_exception(DeliveryError(str(errors[0]), [f for e in errors for f in e.failures],
                                              [m for e in errors for m in e.mutations], refused))
        elif refused:  # a part acknowledged and refused by admission (a review: the whole resolved as delivered)
            whole.set_exception(NotAdmitted(refused))
        else:
            whole.set_result(None)

    for part in parts:
        part.add_done_callback(part_done)


def _shard_counts(shards: Mapping[str, int] | NamespaceRegistry | None) -> dict[str, int]:
    """Namespace -> shards (only those above 1), checked: a bad count fails at construction, not per send."""
    if shards is None:
        return {}
    if isinstance(shards, NamespaceRegistry):
        return shards.shard_counts()
    out: dict[str, int] = {}
    for namespace, count in shards.items():
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SHARDS:
            raise ValueError(f"shards[{namespace!r}] must be an integer from 1 to {MAX_SHARDS} (got {count!r})")
        if count > 1:
            out[namespace] = count
    return out


def add_delta(delta: int | None, item: str) -> int:
    """An add's delta: as given, or 1 for a write naming an item (a UNIQUE namespace's, which counts it once);
    without either a ValidationError naming `delta`."""
    if delta is not None:
        return delta
    if item:
        return 1
    raise ValidationError("delta", "is required for an add (only a write with an item, in a UNIQUE namespace, may "
                                   "leave it out: it is 1 then)")


FLUSH_MARGIN_S = 5.0


class CounterProducer:
    """Produce AddCount / ClearCount mutations to the mutations topic.

    `batch_size` > 1 turns on client-side batching: up to that many mutations for one partition travel as one
    Avro MutationBatch record, sent when full, after `linger_ms`, or on `flush()`. Every `send` returns a
    future that resolves when the broker has acknowledged the mutation (for a batch: its record); failures
    are also collected and raised by the next `flush()`/`close()` so that ignoring futures never hides them.

    `namespaces` (the loaded `NamespaceRegistry` the workers use) gives each namespace's `shards` option, over how
    many Kafka keys it spreads a counter's writes, and has every acknowledgement judged as the worker will judge its
    record (`NotAdmitted`); without it, `shards` gives the counts alone (`{"plays": 32}`) and nothing is judged. A
    namespace left out has one key per counter.
    A write then goes to `namespace:counter#k`, k chosen by its idempotency token (`schemas.shard_key`), so a
    retry lands on the same partition and one hot counter spreads over many.

    A DeliveryError (from a future, `flush` or `close`) carries the mutations it failed: `retry(error)` re-sends
    them unchanged, so a write whose first attempt did reach the broker is still counted once. After a broker
    stall the librdkafka handle may be fenced; it is replaced by a new one (`handle.RenewingProducer`).
    """

    def __init__(self, bootstrap_servers: str, *, topic: str = DEFAULT_TOPIC, batch_size: int = 1,
                 linger_ms: float = 5.0, delivery_timeout_ms: int = 30_000,
                 config: Mapping[str, Any] | None = None, track_failures: bool = True,
                 shards: Mapping[str, int] | None = None, namespaces: NamespaceRegistry | None = None) -> None:
        _check_arguments(batch_size, linger_ms, delivery_timeout_ms)
        self.shards = _shard_counts(namespaces if shards is None else shards)
        self.namespaces = namespaces  # when given: each acknowledgement is judged as the worker will (NotAdmitted)
        self.topic = topic
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000.0
        # A long-lived caller that awaits every future (the API) turns this off so failures do not pile up.
        self.track_failures = track_failures
        self.metadata_timeout_s = 10.0
        # flush's and close's default wait: past the delivery timeout, so the broker's verdict on every record (its
        # failure carrying its mutations, for `retry`) comes before they give up (a review's error carried none)
        self.wait_s = delivery_timeout_ms / 1000 + FLUSH_MARGIN_S
        self._kafka = RenewingProducer({
            "bootstrap.servers": bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "message.timeout.ms": delivery_timeout_ms,
            "client.id": "counter-producer",
            "allow.auto.create.topics": False,  # see producers.asyncio_producer's docstring
            **(config or {}),
        }, name="counter-producer")
        self._num_partitions: int | None = None
        self.records_sent = 0  # Kafka records produced (a batch record carries many mutations)
        self._pending: dict[int, _Pending] = {}
        self._unreported: list[_Unreported] = []  # for the next flush/close, unless their futures are read first
        self._lock = threading.Lock()
        self._sending = 0  # batches taken out of _pending and not yet handed to librdkafka
        self._sent = threading.Condition(self._lock)  # notified when _sending drops to 0
        self._closed = False  # the sending thread's end
        self._closing = False  # close() began: no more sends
        self._wake = threading.Event()  # set by sends: the idle poller sleeps on it instead of polling
        self._poller = threading.Thread(target=self._poll_loop, name="counter-producer-poll", daemon=True)
        self._poller.start()

    # -- public API -------------------------------------------------------------------------------------

    def add(self, namespace: str, counter_name: str, delta: int | None = None, *, token: str | None = None,
            generation_time: str | float | int | None = None, item_key: str = "",
            dimensions: Mapping[str, str] | None = None, item: str = "") -> Future[None]:
        """AddCount: adjust a counter by `delta` (negative allowed). Returns the delivery future.

        `dimensions` (e.g. {"country": "US", "device": "tv"}; keys the namespace declares) count the write in
        every combination too; such a mutation travels as a v2 record. A namespace that refuses them (an
        undeclared key, a counter at max_combinations) dead-letters the mutation with the reason. `item` is what a
        UNIQUE namespace counts: `delta` may then be left out (it is 1); without an item it is required
        (ValidationError naming `delta`)."""
        return self._queue(self._timed(self.mutation(MutationOp.ADD, namespace, counter_name, add_delta(delta, item),
                                                   token, generation_time, item_key, dimensions, item),
                                     generation_time))

    def clear(self, namespace: str, counter_name: str, *, token: str | None = None,
              generation_time: str | float | int | None = None) -> Future[None]:
        """ClearCount: reset a counter to zero as of `generation_time` (default: now)."""
        return self._queue(self._timed(self.mutation(MutationOp.CLEAR, namespace, counter_name, 0, token,
                                                   generation_time), generation_time))

    @staticmethod
    def mutation(op: MutationOp, namespace: str, counter_name: str, delta: int, token: str | None = None,
                 generation_time: str | float | int | None = None, item_key: str = "",
                 dimensions: Mapping[str, str] | None = None, item: str = "") -> Mutation:
        """Build and validate a mutation, filling a generated token and `now` when not given."""
        event_time = now_micros() if generation_time is None else parse_generation_time(generation_time)
        return validate_mutation(Mutation(
            namespace=namespace, counter_name=counter_name, delta=delta, event_time=event_time,
            event_id=new_token() if token is None else token, event_item_key=item_key, op=op,
            dimensions=validate_dimensions(dimensions), item=item))

    def _refuse(self, mutation: Mutation) -> None:
        """Raise ValidationError, naming the field, for a mutation the pipeline dead-letters whatever its time (given
        the namespaces)."""
        if self.namespaces is not None and (refused := mutation_refusal(self.namespaces, mutation)) is not None:
            raise ValidationError(*refused)

    def _timed(self, mutation: Mutation, generation_time: object) -> Mutation:
        """`mutation` (validated), its generated time drawn again after the first wait for the topic's metadata:
        drawn before a 10 s wait for a slow broker, its record reached Kafka past a 5 s accept_limit and was
        dead-lettered, silently (a review). A mutation `send` would refuse is refused before that wait."""
        self._refuse(mutation)
        if generation_time is not None or self._num_partitions is not None:
            return mutation
        try:
            self._partitions()
        except DeliveryError as exc:
            exc.mutations = [mutation]
            raise
        return mutation._replace(event_time=now_micros())

    def send(self, mutation: Mutation) -> Delivery:
        """Queue one validated mutation; the future resolves on broker acknowledgement. With `namespaces`, a
        mutation the pipeline would dead-letter whatever its time (an unknown namespace, an undeclared dimension)
        raises ValidationError naming the field, and nothing is sent."""
        self._refuse(mutation)
        return self._queue(mutation)

    def _queue(self, mutation: Mutation) -> Delivery:
        """`send` for a mutation already judged (`add` and `clear` judge it in `_timed`, before the metadata wait)."""
        if self._closing:
            raise RuntimeError("CounterProducer is closed")
        key = self.key_of(mutation)
        try:
            partition = partition_for(key, self._partitions())
        except DeliveryError as exc:
            exc.mutations = [mutation]
            raise
        if self.batch_size == 1:
            future = Delivery()
            try:
                self._produce(key, encode_mutation(mutation), partition, future, [mutation])
            except DeliveryError:
                future.see()  # raised to the caller here: told
                raise
            return future
        with self._lock:
            if self._closing:  # checked again under the lock close() takes: nothing is buffered after its flush
                raise RuntimeError("CounterProducer is closed")
            pending = self._pending.get(partition)
            if pending is None:
                pending = self._pending[partition] = _Pending()
                self._wake.set()
            pending.mutations.append(mutation)
            future = pending.future
            full = len(pending.mutations) >= self.batch_size
            if full:
                del self._pending[partition]
                self._sending += 1
        if full:
            try:
                self._send_taken([(partition, pending)])
            except DeliveryError:
                future.see()  # raised to the caller here, with the batch's mutations: told
                raise
        return future

    def retry(self, error: DeliveryError) -> Delivery:
        """Send the mutations `error` failed again, unchanged (tokens and event times), so that each is counted
        once even if its first attempt reached the broker. The future fails with a DeliveryError to retry in turn.
        A caller may equally `send` each of `error.mutations` itself."""
        if not error.mutations:
            raise ValueError("this DeliveryError names no mutations to retry (records left in flight by flush(): "
                             "their own futures fail with them if they are not delivered)")
        sent: list[Delivery] = []
        for i, m in enumerate(error.mutations):
            try:
                sent.append(self.send(m))
            except DeliveryError as exc:  # the rest would be lost without a word (a review): they fail with it
                exc.mutations = [*exc.mutations, *error.mutations[i + 1:]]
                raise
        futures = list({id(f): f for f in sent}.values())
        if len(futures) == 1:
            return futures[0]
        whole = Delivery(futures)
        _settle_when_all(futures, whole)
        return whole

    def key_of(self, mutation: Mutation) -> bytes:
        """The record key `send` gives `mutation`: `namespace:counter`, or its shard's key (`schemas.shard_key`)."""
        shards = self.shards.get(mutation.namespace, 1) if self.shards else 1
        return (mutation.key if shards == 1 else mutation.sharded_key(shards)).encode()

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered and wait for acknowledgements (by default a little past the delivery timeout);
        raise DeliveryError on any failure, with the failed mutations (`retry` them), else NotAdmitted for the
        acknowledged mutations the pipeline will refuse (with `namespaces`)."""
        timeout = self.wait_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            self._drain(older_than=None)
            drained: DeliveryError | None = None
        except DeliveryError as exc:  # recorded with the others below, unless failures are not tracked
            drained = exc
        with self._sent:  # batches another thread took out of _pending are handed to librdkafka first
            self._sent.wait_for(lambda: not self._sending, max(0.0, deadline - time.monotonic()))
        remaining = self._kafka.flush(max(0.0, deadline - time.monotonic())) + self._sending
        failures, failed, refused = self._take_unreported()
        also = f"; and {len(refused)} acknowledged but not admitted (`refusals`)" if refused else ""
        if failures:
            raise DeliveryError(
                f"{len(failures)} mutation(s) were not delivered to {self.topic!r}; first: {failures[0][1]}{also}",
                failures, failed, refused)
        if drained is not None:
            drained.refusals.extend(refused)
            raise drained
        if remaining:
            raise DeliveryError(f"{remaining} record(s) not acknowledged by the broker within {timeout:.1f}s{also}",
                                refusals=refused)
        if refused:
            raise NotAdmitted(refused)

    def ping(self, timeout: float = 1.0) -> None:
        """Raise DeliveryError unless the broker answers a metadata request within `timeout`."""
        try:
            self._kafka.current.list_topics(self.topic, timeout=timeout)
        except KafkaException as exc:
            raise DeliveryError(f"broker unreachable: {exc.args[0].str()}") from exc

    def close(self, timeout: float | None = None) -> None:
        """Flush and stop; raises DeliveryError if anything was not delivered, with the mutations of the records
        given up. Records still unacknowledged after `timeout` (by default a little past the delivery timeout) are
        given up: their futures fail with DeliveryError rather than never settling."""
        with self._lock:
            if self._closing:
                return
            self._closing = True  # sends from other threads refused from here (a review's 136 were left buffered)
        error: DeliveryError | None = None
        try:
            self.flush(timeout)
        except DeliveryError as exc:
            error = exc
        finally:
            self._closed = True
            self._wake.set()
            self._poller.join(timeout=2.0)
            if not self._poller.is_alive():
                self._kafka.close()
        failures, failed, _ = self._take_unreported()  # records given up when the handle closed, for `retry`
        if failed and (error is None or not error.mutations):
            raise DeliveryError(f"{len(failed)} mutation(s) given up at close, not acknowledged by the broker"
                                + (f" ({error})" if error else ""), failures, failed) from error
        if error is not None:
            raise error

    def __enter__(self) -> CounterProducer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:  # do not mask the caller's exception with a delivery error
            with contextlib.suppress(DeliveryError, NotAdmitted):
                self.close()

    # -- internals --------------------------------------------------------------------------------------

    def _partitions(self) -> int:
        if self._num_partitions is None:
            try:
                metadata = self._kafka.current.list_topics(self.topic, timeout=self.metadata_timeout_s)
                self._num_partitions = len(topic_partitions(metadata, self.topic))
            except KafkaException as exc:
                raise DeliveryError(f"broker unreachable: {exc.args[0].str()}") from exc
            except TopicUnavailable as exc:
                raise DeliveryError(f"topic {self.topic!r} is not available ({exc.reason}); "
                                    "create it with `counter up` or streams.topics.ensure_topics") from None
        return self._num_partitions

    def _send_taken(self, taken: list[tuple[int, _Pending]]) -> None:
        """Send batches taken out of _pending (counted in _sending until handed over, which `flush` waits for).
        Each batch is tried; the first failure is raised once all are (every failure is recorded)."""
        errors: list[DeliveryError] = []
        try:
            for partition, pending in taken:
                try:
                    self._send_batch(partition, pending)
                except DeliveryError as exc:
                    errors.append(exc)
        finally:
            with self._sent:
                self._sending -= len(taken)
                if not self._sending:
                    self._sent.notify_all()
        if errors:
            raise errors[0]

    def _send_batch(self, partition: int, pending: _Pending) -> None:
        records = _records(pending.mutations)
        futures = [pending.future] if len(records) == 1 else [Delivery() for _ in records]
        if len(records) > 1:
            pending.future.parts = tuple(futures)
            _settle_when_all(futures, pending.future)
        errors: list[DeliveryError] = []
        for (ms, value), future in zip(records, futures, strict=True):
            try:
                self._produce(self.key_of(ms[0]), value, partition, future, ms)
            except DeliveryError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _produce(self, key: bytes, value: bytes, partition: int, future: Delivery,
                 mutations: list[Mutation]) -> None:
        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                self._fail(future, key, "not delivered", err.str(), mutations)
            elif refused := self._not_admitted(mutations, msg):
                self._keep(_Unreported(future, [], [], refused))
                future.set_exception(NotAdmitted(refused))
            else:
                future.set_result(None)

        while True:
            try:
                self._kafka.produce(self.topic, value, key, partition=partition, on_delivery=on_delivery)
                self.records_sent += 1
                self._wake.set()
                return
            except BufferError:  # local queue full: serve callbacks until there is room
                self._kafka.current.poll(0.05)
            except KafkaException as exc:
                error = self._fail(future, key, f"cannot produce to {self.topic!r}", str(exc), mutations)
                raise error from exc

    def _not_admitted(self, mutations: list[Mutation], msg: Any) -> list[tuple[Mutation, str]]:
        """The mutations of an acknowledged record the worker will dead-letter, judged by the record's timestamp
        (LogAppendTime on the service's topics, which Apache Kafka's acknowledgement carries; else the producer's
        CreateTime), with the namespaces given (none: nothing is judged)."""
        if self.namespaces is None:
            return []
        kind, stamped_ms = msg.timestamp()
        if kind == TIMESTAMP_NOT_AVAILABLE or stamped_ms < 0:
            return []
        refused = []
        for m in mutations:
            ns = self.namespaces.get(m.namespace)
            # (what is refused whatever the time was refused by `send`)
            if ns is not None and (reason := admission_error(m.event_time or 0, stamped_ms * 1000, ns)):
                refused.append((m, reason))
        return refused

    def _fail(self, future: Delivery, key: bytes, what: str, reason: str,
              mutations: list[Mutation]) -> DeliveryError:
        """Fail a record's future with its mutations, and keep them for the next `flush`/`close`."""
        failure = (key.decode(errors="replace"), reason)
        self._keep(_Unreported(future, [failure] * len(mutations), mutations, []))
        error = DeliveryError(f"{what}: {reason}", [failure], mutations)
        future.set_exception(error)
        return error

    def _keep(self, unreported: _Unreported) -> None:
        if self.track_failures:
            with self._lock:
                self._unreported.append(unreported)

    def _take_unreported(self) -> tuple[list[tuple[str, str]], list[Mutation], list[tuple[Mutation, str]]]:
        """The failures, failed mutations and refusals kept since the last call whose futures nobody read."""
        with self._lock:
            kept, self._unreported = self._unreported, []
        kept = [u for u in kept if not u.future.seen]
        return ([f for u in kept for f in u.failures], [m for u in kept for m in u.mutations],
                [r for u in kept for r in u.refusals])

    def _drain(self, older_than: float | None) -> None:
        now = time.monotonic()
        with self._lock:
            ready = [(p, b) for p, b in self._pending.items() if older_than is None or now - b.since >= older_than]
            for partition, _ in ready:
                del self._pending[partition]
            self._sending += len(ready)
        if ready:
            self._send_taken(ready)

    def _poll_loop(self) -> None:
        """Serve delivery callbacks and send batches that have lingered long enough; with nothing buffered or
        in flight, sleep until the next send. (Polling every linger_ms while idle woke this thread 1,000 times
        a second in the API, and each wake-up took the GIL from the event loop.) A batch that cannot be sent
        is recorded for `flush`/`close`; nothing ends this thread but `close`."""
        while not self._closed:
            try:
                self._poll_once()
            except DeliveryError as exc:
                log.warning("counter-producer: a lingered batch was not sent (flush() reports it): %s", exc)
            except Exception:
                log.exception("counter-producer: the sending thread failed; continuing")
                self._wake.wait(0.05)

    def _poll_once(self) -> None:
        producer = self._kafka.current
        if self._pending:
            producer.poll(min(0.05, self.linger_s))
            self._drain(older_than=self.linger_s)
        elif len(producer):  # in flight: a delivery report ends the wait at once
            producer.poll(0.05)
        else:
            self._wake.wait(0.05)
            self._wake.clear()  # a send racing this clear is seen by the checks above
            producer.poll(0)
