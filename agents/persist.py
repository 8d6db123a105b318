"""Persist: mutations from Kafka become idempotent events in the TimeSeries store.

Per batch, in this order: write events (idempotent), raise `last_write_ts`, dead-letter what cannot be
accepted, send one rollup signal per distinct counter; only then may the caller ack (commit) the offsets.
A crash anywhere before the ack replays the batch, which the event identity makes harmless.

A write with dimensions is admitted here but expanded by the persist path (agents.dimensions): its events in the
base counter and every combination depend on the namespace's max_combinations and on the combination registry.

In a UNIQUE namespace every add carries an ``item`` (what is counted, e.g. a user id), stored as the event's
``event_item_key`` with delta 1: a retry of the same token and item is one event, two items under one token are
two events. A write without an item, with another delta or with an event_item_key of its own is dead-lettered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from agents.dimensions import Clear, DimensionedWrite, dimensioned_write
from agents.watermark import heartbeat_skew_s
from control_plane import CounterType, Namespace, NamespaceRegistry
from control_plane.admission import admission_error, ahead_allowed_us, extras_refusal, kafka_refusal, rolled_past
from schemas import (
    MICROS,
    MIN_EVENT_TIME,
    DecodeError,
    Mutation,
    MutationOp,
    decode_mutations,
    encode_mutation,
    position_identity,
    tokenless_json,
)
from schemas.codec import InvalidItems
from schemas.dead_letter import AnyHeaders, DeadLetter
from schemas.record_headers import is_heartbeat
from schemas.validation import micros_iso
from sinks import EventRow, EventStore

log = logging.getLogger("counter.persist")


class KafkaRecord(Protocol):
    """What the persist path reads of a Kafka record: the shape of aiokafka's ConsumerRecord, so the worker
    hands its records over without copying them (`timestamp` in epoch milliseconds, as on the wire)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> AnyHeaders: ...


@dataclass(frozen=True, slots=True)
class RawRecord:
    """A `KafkaRecord` built by hand: by `counter replay` (confluent-kafka) and by tests."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # epoch ms
    key: bytes | None
    value: bytes | None
    headers: AnyHeaders = ()


@dataclass(frozen=True, slots=True)
class PublishedFloor(RawRecord):
    """A heartbeat record put in by `agents.arrival` before a partition's first record: the arrival floor a previous
    owner published, not a record read from Kafka. One stamped too far ahead (`prepare`) is ignored with a warning,
    not dead-lettered: it has no position in the topic of its own."""


@dataclass(slots=True)
class PreparedBatch:
    rows: list[EventRow] = field(default_factory=list)
    last_write: dict[tuple[str, str], int] = field(default_factory=dict)
    dead: list[DeadLetter] = field(default_factory=list)
    records: int = 0
    heartbeats: list[tuple[int, int]] = field(default_factory=list)  # (partition, timestamp µs), in order
    written: dict[int, int] = field(default_factory=dict)  # partition -> latest arrival (µs) of a record with writes
    dimensioned: list[DimensionedWrite] = field(default_factory=list)  # expanded by the persist path
    clears: list[Clear] = field(default_factory=list)  # clears in namespaces with dimensions (to expand)
    # events dated at or before their namespace's rollups (`prepare(rolled=...)`): (namespace, (counter, event_time,
    # event_id, item_key)) and the dead letter each is unless already stored (`settle_behind`)
    behind: list[tuple[str, tuple[str, int, str, str], DeadLetter]] = field(default_factory=list)

    def extend(self, other: PreparedBatch) -> None:
        """Append a later chunk of the same batch."""
        self.rows.extend(other.rows)
        self.dead.extend(other.dead)
        self.behind.extend(other.behind)
        self.records += other.records
        self.heartbeats.extend(other.heartbeats)
        written = self.written
        for partition, arrived in other.written.items():
            if arrived > written.get(partition, 0):
                written[partition] = arrived
        self.dimensioned.extend(other.dimensioned)
        self.clears.extend(other.clears)
        last_write = self.last_write
        for key, ts in other.last_write.items():
            if ts > last_write.get(key, -1):
                last_write[key] = ts


class _Admission:
    """Per namespace, what admission needs on the hot path: the accept window in µs (computed once)."""

    __slots__ = ("accept_us", "ahead_us", "dimensions", "ns", "refusal", "rolled_us", "skew_us", "unique")

    def __init__(self, ns: Namespace | None, name: str, rolled_us: int = -1) -> None:
        self.ns: Namespace | None = ns
        self.refusal: str | None = None
        if ns is None:
            self.refusal = f"unknown namespace {name!r}"
        else:
            self.refusal = kafka_refusal(ns)
        self.accept_us = int(ns.accept_limit_s * MICROS) if ns else 0
        self.skew_us = int(ns.max_clock_skew_s * MICROS) if ns else 0
        self.ahead_us = ahead_allowed_us(ns) if ns else 0  # how far after its record's time an event may be
        self.rolled_us = rolled_us  # the namespace's rollups had passed this: an event at or before it is not counted
        self.dimensions = bool(ns and ns.dimensions)  # its clears reach the combinations
        self.unique = bool(ns and ns.counts_unique)  # every add carries an item, the event's item key


def prepare(records: Sequence[KafkaRecord], registry: NamespaceRegistry,
            arrival_floor: dict[int, int] | None = None, *, identity_topic: str | None = None,
            now_us: int | None = None, rolled: Mapping[str, int] | None = None) -> PreparedBatch:
    """Decode, identify and admit every mutation of a batch of records (no I/O).

    Admission judges an event against when its record reached Kafka. A LogAppendTime topic stamps exactly
    that; a CreateTime one (the local Tansu broker) stamps when the producer built the record, which can be a
    second or more earlier. `arrival_floor` (partition -> µs, updated in place, records in partition order)
    holds the timestamp of the last heartbeat seen: a record after it reached Kafka after it, so its arrival
    is at least that. Without this, a record appended late could carry events behind a rollup boundary the
    heartbeat watermark already allowed, and be silently skipped; with it, it is dead-lettered with a reason.
    A caller that may prepare the same records again (a retry) passes a copy, and raises its floor from
    `heartbeats` once the batch is stored: else the retry judges earlier records by a later heartbeat.

    On a CreateTime topic any client sets the timestamp, so a record's timestamp is bounded by this worker's
    clock (`now_us`, read once per call; tests pass it): a record reached Kafka before it is read, so a timestamp
    ahead of the clock by more than a clock's allowed error is no arrival time. A mutation in a record stamped
    ahead of the worker's clock by more than its namespace's max_clock_skew is dead-lettered with the timestamp in
    the reason: admitted, a token-less one would take that time as its event time (no rollup would count it until
    then), and the record's arrival would keep every worker heartbeating until then. A heartbeat stamped ahead by
    more than a worker's own heartbeat can be (`agents.watermark.heartbeat_skew_s`) is not one: it is
    dead-lettered (a published floor, `PublishedFloor`, ignored with a warning) instead of raising the partition's
    floor and watermark into the future, which would dead-letter every valid record after it (a floor published
    to the store survives restarts). Consumer lag only moves the clock further past a timestamp: it never rejects.

    `identity_topic` names the topic in the identity of token-less JSON mutations (their Kafka position):
    a replay from a restored copy of the topic passes the original name.

    `rolled` (the worker's, not a replay's: namespace -> `RollupStore.newest_rollup_ts` lately) holds back an event
    dated at or before its namespace's rollups, which no rollup would count: admission never admits one unless its
    window grew since those rollups (a raised accept_limit: a review's write dated 60 s back was stored, not
    counted, and not dead-lettered), or the record is delivered again (a group's offsets lost). Such events go to
    `behind`: `settle_behind` dead-letters those not stored yet and drops the others (counted already).

    A record that fails in an unexpected way (a bug, or input the decoder did not foresee) must not stall the
    persist path, which would retry the batch forever: the batch is then prepared again record by record, and
    the failing ones dead-lettered with the exception as reason. The bulk pass stays free of per-record guards.
    """
    floor = {} if arrival_floor is None else arrival_floor
    start = dict(floor)
    clock = _Clock(registry, wall_clock_us() if now_us is None else now_us, rolled)
    try:
        return _prepare(records, registry, floor, identity_topic, clock)
    except Exception:
        log.warning("a batch failed to prepare; preparing its %d records one by one", len(records))
        floor.clear()
        floor.update(start)  # the failed pass may have raised it past records it is about to judge again
        return _one_by_one(records, registry, floor, identity_topic, clock)


async def settle_behind(batch: PreparedBatch, events: EventStore) -> None:
    """Dead-letter the batch's `behind` events that are not stored; drop the stored ones, which a record delivered
    again carries (dead-lettered, a `counter dlq replay` would count them again, as new writes)."""
    by_namespace: dict[str, list[tuple[tuple[str, int, str, str], DeadLetter]]] = {}
    for namespace, key, letter in batch.behind:
        by_namespace.setdefault(namespace, []).append((key, letter))
    for namespace, items in by_namespace.items():
        stored = await events.contains(namespace, [key for key, _letter in items])
        batch.dead.extend(letter for (_key, letter), found in zip(items, stored, strict=True) if not found)
    batch.behind.clear()


def wall_clock_us() -> int:
    """This worker's clock (epoch µs): what `prepare` bounds record timestamps by, unless given `now_us`."""
    return time.time_ns() // 1000


class _Clock:
    """The worker's clock for one `prepare` call and the limits it puts on record timestamps (µs)."""

    __slots__ = ("heartbeat_skew_s", "heartbeat_us", "now_us", "rolled", "stamp_us")

    def __init__(self, registry: NamespaceRegistry, now_us: int, rolled: Mapping[str, int] | None = None) -> None:
        self.now_us = now_us
        self.rolled = rolled or {}  # namespace -> its rollups' newest rollup_ts (`prepare`)
        self.heartbeat_skew_s, smallest_skew_us = _skews(registry)
        # the latest timestamp of a heartbeat (and of a record's arrival) the worker believes
        self.heartbeat_us = now_us + int(self.heartbeat_skew_s * MICROS)
        # below this no namespace finds a record stamped ahead: the one comparison the common path pays
        self.stamp_us = now_us + smallest_skew_us

    def ahead_s(self, timestamp_us: int) -> float:
        return (timestamp_us - self.now_us) / MICROS


_SKEWS: dict[int, tuple[NamespaceRegistry, float, int]] = {}  # id(registry) -> (it, largest skew s, smallest µs)


def _skews(registry: NamespaceRegistry) -> tuple[float, int]:
    """The registry's largest max_clock_skew (heartbeat_skew_s) and its smallest in µs, computed once per registry:
    `prepare` runs per batch, and walking a registry of thousands of namespaces cost 0.8 ms a call (review)."""
    known = _SKEWS.get(id(registry))
    if known is None or known[0] is not registry:
        if len(_SKEWS) >= 64:  # a registry per worker; tests make many: keep no more than a few alive
            _SKEWS.clear()
        rolled = [ns for ns in registry.values() if ns.counter_type is not CounterType.BEST_EFFORT]
        known = _SKEWS[id(registry)] = (registry, heartbeat_skew_s(rolled),
                                        min((int(ns.max_clock_skew_s * MICROS) for ns in rolled), default=0))
    return known[1], known[2]


def _one_by_one(records: Sequence[KafkaRecord], registry: NamespaceRegistry, floor: dict[int, int],
                identity_topic: str | None, clock: _Clock) -> PreparedBatch:
    """`prepare`, each record on its own: one that raises is dead-lettered ("ExceptionType: message")."""
    out = PreparedBatch()
    for rec in records:
        try:
            out.extend(_prepare((rec,), registry, floor, identity_topic, clock))
        except Exception as exc:
            log.warning("dead-lettering %s[%d]@%d: preparing it raised", rec.topic, rec.partition, rec.offset,
                        exc_info=True)
            reason = f"{type(exc).__name__}: {exc}"[:500]
            out.dead.append(_dead(rec, rec.value or b"", reason, rec.timestamp * 1000))
            out.records += 1
    return out


def _prepare(records: Sequence[KafkaRecord], registry: NamespaceRegistry, floor: dict[int, int],
             identity_topic: str | None, clock: _Clock) -> PreparedBatch:
    out = PreparedBatch()
    rows_append = out.rows.append
    last_write = out.last_write
    admissions: dict[str, _Admission] = {}
    written = out.written
    heartbeat_limit, stamp_limit = clock.heartbeat_us, clock.stamp_us
    n = 0
    for rec in records:
        n += 1
        value = rec.value
        partition = rec.partition
        timestamp_us = rec.timestamp * 1000
        if not value and is_heartbeat(rec.headers):
            if timestamp_us > heartbeat_limit:
                _heartbeat_ahead(out, rec, timestamp_us, clock)
                continue
            if timestamp_us > floor.get(partition, 0):
                floor[partition] = timestamp_us
            out.heartbeats.append((partition, timestamp_us))
            continue
        arrived = floor.get(partition, 0)
        if timestamp_us > arrived:
            arrived = timestamp_us
        if written.get(partition, 0) < arrived <= heartbeat_limit:  # not a record stamped ahead (dead-lettered)
            written[partition] = arrived
        pairs: Iterable[tuple[int, Mutation]]
        try:
            mutations = decode_mutations(value or b"")
        except DecodeError as exc:
            if type(exc) is not InvalidItems:
                out.dead.append(_dead(rec, value or b"", f"undecodable record: {exc}", timestamp_us))
                continue
            pairs, single = _valid_items(out, rec, exc, timestamp_us), False
        else:
            pairs, single = enumerate(mutations), len(mutations) == 1
        if timestamp_us > stamp_limit:
            pairs = _stamped_ahead(out, rec, pairs, single, registry, admissions, clock, identity_topic)
        for index, m in pairs:
            namespace, counter, delta, event_time, event_id, item_key, op, dimensions, item = m
            admission = admissions.get(namespace)
            if admission is None:
                admission = admissions[namespace] = _Admission(registry.get(namespace), namespace,
                                                               clock.rolled.get(namespace, -1))
            if event_time is None:
                event_time = timestamp_us
                if event_time < MIN_EVENT_TIME:  # a record stamped 0 or -1 (none) by its client: no time to count at
                    out.dead.append(_dead_mutation(
                        rec, m, index, single, event_time, event_id or "", timestamp_us,
                        f"the mutation has no generation_time and its record's timestamp ({rec.timestamp} ms) is no "
                        "time"))
                    continue
            if event_id is None:  # a JSON record without a token: its Kafka position is its identity
                event_id = position_identity(identity_topic or rec.topic, partition, rec.offset, index)
            if (admission.refusal is None and arrived - admission.accept_us <= event_time
                    <= arrived + admission.ahead_us and event_time > admission.rolled_us):
                is_clear = op is MutationOp.CLEAR
                if dimensions or item or admission.unique:
                    ns: Namespace = admission.ns  # type: ignore[assignment]  # None only with a refusal
                    extra = extras_refusal(ns, dimensions, item, is_clear, delta=delta, item_key=item_key)
                    if extra is not None:
                        out.dead.append(_dead_mutation(rec, m, index, single, event_time, event_id, timestamp_us,
                                                       f"field '{extra[0]}': {extra[1]}"))
                        continue
                    if item:  # a UNIQUE namespace's add: its item is the event's item key, the event counts one
                        item_key, delta = item, 1
                    if dimensions:
                        out.dimensioned.append(dimensioned_write(
                            namespace, counter, dimensions, event_time, event_id, item_key, delta,
                            ns.dimensions.max_combinations,
                            _dead_mutation(rec, m, index, single, event_time, event_id, timestamp_us, ""),
                            arrived - admission.accept_us))
                        continue
                rows_append((namespace, counter, event_time, event_id, item_key, 0 if is_clear else delta, is_clear))
                key = (namespace, counter)
                if event_time > last_write.get(key, -1):
                    last_write[key] = event_time
                if is_clear and admission.dimensions:
                    out.clears.append((namespace, counter, event_time, event_id, item_key))
                continue
            reason = admission.refusal or admission_error(
                event_time, arrived, admission.ns)  # type: ignore[arg-type]  # None only with a refusal (above)
            if reason is None:  # admissible, but at or before the namespace's rollups: refused unless stored before
                letter = _dead_mutation(rec, m, index, single, event_time, event_id, timestamp_us, rolled_past(
                    event_time, admission.rolled_us, admission.ns) or "")  # type: ignore[arg-type]  # not None here
                # stored as admitted: a UNIQUE add's item is its event's item key (above)
                out.behind.append((namespace, (counter, event_time, event_id, item or item_key), letter))
                continue
            if admission.refusal is None and timestamp_us < arrived:
                reason += _ARRIVAL_FROM_FLOOR % micros_iso(timestamp_us)
            out.dead.append(_dead_mutation(rec, m, index, single, event_time, event_id, timestamp_us,
                                           reason or "not admitted"))
    out.records = n
    return out


_ARRIVAL_FROM_FLOOR = (" (the record reached Kafka then at the earliest, the partition's last heartbeat before it: "
                       "its own timestamp, %s, is older, set by its client; a topic with LogAppendTime, as the service "
                       "creates on Apache Kafka, gives the exact time)")
"""The admission reason's note when the record's own timestamp is older than its partition's heartbeat floor: the
time it quotes as the arrival is the floor, and a review read it as wrong."""

HEARTBEAT_WARN_EVERY_S = 60.0
_heartbeat_warned = -HEARTBEAT_WARN_EVERY_S


def _heartbeat_ahead(out: PreparedBatch, rec: KafkaRecord, timestamp_us: int, clock: _Clock) -> None:
    """A heartbeat stamped further ahead of this worker's clock than any worker's heartbeat can be: not taken as
    one (`prepare`). A record read from Kafka is dead-lettered; a published floor put in by `agents.arrival` is
    ignored, with a warning."""
    ahead = (f"{clock.ahead_s(timestamp_us):.3f}s ahead of this worker's clock ({micros_iso(clock.now_us)}), more "
             f"than the {clock.heartbeat_skew_s}s a worker's own heartbeat can be (the largest max_clock_skew)")
    global _heartbeat_warned
    if time.monotonic() - _heartbeat_warned >= HEARTBEAT_WARN_EVERY_S:  # a forged one, or this clock is behind
        _heartbeat_warned = time.monotonic()
        log.warning("a heartbeat on %s[%d] is stamped %s: refused. A client's forged record, or this worker's clock "
                    "is behind the broker's or the other workers' by more than the skew: then every heartbeat is "
                    "refused and rollups stand still (said at most every %gs)", rec.topic, rec.partition, ahead,
                    HEARTBEAT_WARN_EVERY_S)
    if type(rec) is PublishedFloor:
        log.warning("the arrival floor published for %s[%d] (%d µs) is %s: not trusted; judging its records by their "
                    "own timestamps until this worker's next heartbeat", rec.topic, rec.partition, timestamp_us,
                    ahead)
        return
    out.dead.append(_dead(rec, rec.value or b"", f"heartbeat (header counter.heartbeat) stamped {rec.timestamp} ms, "
                          f"{ahead}: not taken as a heartbeat", timestamp_us))


def _valid_items(out: PreparedBatch, rec: KafkaRecord, exc: InvalidItems,
                 timestamp_us: int) -> list[tuple[int, Mutation]]:
    """A batch record with invalid items: each invalid item is dead-lettered alone, with its reason (the whole record,
    marked with its index, when it cannot be written alone); the valid ones, with their index, go on to admission."""
    value = rec.value or b""
    for item in exc.rejected:
        reason = f"undecodable mutation: {item.reason}"
        if item.alone is None:
            out.dead.append(replace(_dead(rec, value, reason, timestamp_us), whole_record_of=item.index))
        else:
            out.dead.append(_dead(rec, item.alone, reason, timestamp_us))
    return exc.valid


def _stamped_ahead(out: PreparedBatch, rec: KafkaRecord, pairs: Iterable[tuple[int, Mutation]], single: bool,
                   registry: NamespaceRegistry, admissions: dict[str, _Admission], clock: _Clock,
                   identity_topic: str | None) -> list[tuple[int, Mutation]]:
    """The mutations of a record stamped ahead of the worker's clock that their namespace's max_clock_skew still
    admits (or that admission refuses for another reason); the others are dead-lettered with the timestamp in the
    reason (`prepare`). Off the common path: only records stamped ahead by more than the smallest skew come here."""
    timestamp_us = rec.timestamp * 1000
    kept = []
    for index, m in pairs:
        admission = admissions.get(m.namespace)
        if admission is None:
            admission = admissions[m.namespace] = _Admission(registry.get(m.namespace), m.namespace,
                                                             clock.rolled.get(m.namespace, -1))
        ns = admission.ns
        if ns is None or admission.refusal is not None or timestamp_us <= clock.now_us + admission.skew_us:
            kept.append((index, m))
            continue
        event_time = timestamp_us if m.event_time is None else m.event_time
        event_id = (position_identity(identity_topic or rec.topic, rec.partition, rec.offset, index)
                    if m.event_id is None else m.event_id)
        # A token-less one is written with the identity it was given, even alone in its record: whether a record
        # is ahead depends on when it is read, so a redelivery may count it, and the DLQ's raw bytes, re-sent,
        # would be another event.
        out.dead.append(_dead_mutation(
            rec, m, index, single and m.event_id is not None, event_time, event_id, timestamp_us, keep_identity=True,
            reason=f"record timestamp {micros_iso(timestamp_us)} is {clock.ahead_s(timestamp_us):.3f}s ahead of the "
            f"worker's clock ({micros_iso(clock.now_us)}), so it is not when the record reached Kafka; namespace "
            f"{ns.name!r} allows max_clock_skew={ns.max_clock_skew_s}s (a producer clock that far ahead, or a "
            "timestamp set by the client)"))
    return kept


def _dead_mutation(rec: KafkaRecord, m: Mutation, index: int, single: bool, event_time: int, event_id: str,
                   timestamp_us: int, reason: str, *, keep_identity: bool = False) -> DeadLetter:
    """A rejected mutation's dead letter: the record as it arrived when it holds only that mutation (unless it is
    a token without a generation_time, below); else that mutation alone: a token-less item of a JSON array as its
    JSON text without a token, which re-sent takes its new record's time and position as a token-less record does
    (given an identity of its Kafka position and the record's time, it could never be replayed once older than
    accept_limit: a review lost an unknown namespace's writes so), unless `keep_identity`; any other re-encoded
    with the identity it was given (so a re-submit keeps it), or, when it cannot be encoded (e.g. a token-less
    one stamped before 2000), the whole record, marked with the mutation's index (`dlq.whole_record`): re-sent,
    it would count its other mutations again.

    A token without a generation_time takes its record's timestamp as its event time, so the record as it arrived,
    re-sent, would be another event under the same token: a review counted one such write 5, then 10 after a
    `dlq replay --force`, then 15 after a `counter replay` (the guards that keep a re-send from counting twice
    cover token-less letters only). Its letter carries the identity it was given, as a batch item's does."""
    if single and (m.event_id is None or m.event_time is not None or event_time < MIN_EVENT_TIME):
        return replace(_dead(rec, rec.value or b"", reason, timestamp_us), index=index)
    if m.event_id is None and not keep_identity:
        return replace(_dead(rec, tokenless_json(m), reason, timestamp_us), index=index)
    try:
        value = encode_mutation(m._replace(event_time=event_time, event_id=event_id))
    except Exception:  # e.g. a ValidationError: the DLQ keeps what arrived instead
        return replace(_dead(rec, rec.value or b"", reason, timestamp_us), whole_record_of=index)
    return replace(_dead(rec, value, reason, timestamp_us), index=index)


def _dead(rec: KafkaRecord, value: bytes, reason: str, timestamp_us: int) -> DeadLetter:
    return DeadLetter(rec.key, value, reason, rec.topic, rec.partition, rec.offset, timestamp_us)
