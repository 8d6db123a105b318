"""Persist: mutations from Kafka become idempotent events in the TimeSeries store.

Per batch, in this order: write events (idempotent), raise `last_write_ts`, dead-letter what cannot be
accepted, send one rollup signal per distinct counter; only then may the caller ack (commit) the offsets.
A crash anywhere before the ack replays the batch, which the event identity makes harmless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from control_plane import CounterType, NamespaceRegistry
from control_plane.admission import admission_error
from schemas import DecodeError, Mutation, MutationOp, decode_mutations, encode_mutation
from schemas.dead_letter import DeadLetter
from sinks import EventRow


@dataclass(frozen=True, slots=True)
class RawRecord:
    """What the persist path needs of a Kafka record, independent of the client library."""

    topic: str
    partition: int
    offset: int
    timestamp_us: int
    key: bytes | None
    value: bytes
    heartbeat: bool = False


@dataclass(slots=True)
class PreparedBatch:
    rows: list[EventRow] = field(default_factory=list)
    last_write: dict[tuple[str, str], int] = field(default_factory=dict)
    dead: list[DeadLetter] = field(default_factory=list)
    records: int = 0


def prepare(records: Sequence[RawRecord], registry: NamespaceRegistry,
            arrival_floor: dict[int, int] | None = None) -> PreparedBatch:
    """Decode, identify and admit every mutation of a batch of records (no I/O).

    Admission judges an event against when its record reached Kafka. A LogAppendTime topic stamps exactly
    that; a CreateTime one (the local Tansu broker) stamps when the producer built the record, which can be a
    second or more earlier. `arrival_floor` (partition -> µs, updated in place, records in partition order)
    holds the timestamp of the last heartbeat seen: a record after it reached Kafka after it, so its arrival
    is at least that. Without this, a record appended late could carry events behind a rollup boundary the
    heartbeat watermark already allowed, and be silently skipped; with it, it is dead-lettered with a reason.
    """
    out = PreparedBatch(records=len(records))
    rows_append = out.rows.append
    last_write = out.last_write
    floor = {} if arrival_floor is None else arrival_floor
    for rec in records:
        if rec.heartbeat:
            if rec.timestamp_us > floor.get(rec.partition, 0):
                floor[rec.partition] = rec.timestamp_us
            continue
        arrived = max(rec.timestamp_us, floor.get(rec.partition, 0))
        try:
            mutations = decode_mutations(rec.value)
        except DecodeError as exc:
            out.dead.append(_dead(rec, rec.value, f"undecodable record: {exc}"))
            continue
        single = len(mutations) == 1
        for index, m in enumerate(mutations):
            ns = registry.get(m.namespace)
            event_time = rec.timestamp_us if m.event_time is None else m.event_time
            event_id = m.event_id
            if event_id is None:  # a JSON record without a token: its Kafka position is its identity
                event_id = f"kafka:{rec.topic}:{rec.partition}:{rec.offset}:{index}"
            if ns is None:
                reason = f"unknown namespace {m.namespace!r}"
            elif ns.counter_type is CounterType.BEST_EFFORT:
                reason = (f"namespace {m.namespace!r} is BEST_EFFORT: its counts live in the cache only; "
                          "write them through the API, not Kafka")
            else:
                reason = admission_error(event_time, arrived, ns)
            if reason is not None:
                value = rec.value if single else _reencode(m, event_time, event_id)
                out.dead.append(_dead(rec, value, reason))
                continue
            is_clear = m.op is MutationOp.CLEAR
            rows_append((m.namespace, m.counter_name, event_time, event_id, m.event_item_key,
                         0 if is_clear else m.delta, is_clear))
            key = (m.namespace, m.counter_name)
            if event_time > last_write.get(key, -1):
                last_write[key] = event_time
    return out


def _reencode(m: Mutation, event_time: int, event_id: str) -> bytes:
    """A rejected mutation of a batch record, alone, with the identity it was given (so a re-submit keeps it)."""
    return encode_mutation(Mutation(m.namespace, m.counter_name, m.delta, event_time, event_id,
                                    m.event_item_key, m.op))


def _dead(rec: RawRecord, value: bytes, reason: str) -> DeadLetter:
    return DeadLetter(rec.key, value, reason, rec.topic, rec.partition, rec.offset, rec.timestamp_us)
