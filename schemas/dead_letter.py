"""Dead-letter records: the original bytes plus why, where from (topic, partition, offset) in headers.

Wire format of `counter-mutations-dlq`: the record key and value are the original record's (for a rejected
mutation of a batch record, that mutation alone, re-encoded with the identity it was given); the headers
below say why it was rejected and where it came from. The persist agent writes them, `counter dlq` reads them.
A value too large for a DLQ record next to its headers is cut, and `dlq.truncated` holds its original size: the
source headers still locate the whole record in its topic. A rejected mutation of a batch record that cannot be
encoded alone (no valid time to encode it with) is dead-lettered as the whole record, and `dlq.whole_record` holds
its index in it: re-sending that record would count its other mutations again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.codec import DecodeError, decode_mutations
from schemas.model import position_identity

REASON = "dlq.reason"
SOURCE_TOPIC = "dlq.topic"
SOURCE_PARTITION = "dlq.partition"
SOURCE_OFFSET = "dlq.offset"
SOURCE_TIMESTAMP = "dlq.timestamp_us"
TRUNCATED = "dlq.truncated"  # the original value's size in bytes, when only its start is carried
KEY_TRUNCATED = "dlq.key_truncated"  # the original key's size in bytes, when only its start is carried
WHOLE_RECORD = "dlq.whole_record"  # the rejected mutation's index, when the value is its whole batch record
INDEX = "dlq.index"  # the rejected mutation's index in its batch record, when the value is that mutation alone
RESENT = "dlq.resent"  # on a record `counter dlq replay` re-submitted: the identity of the dead letter it came from

MAX_RECORD_BYTES = (1 << 20) - 1024
"""Key, value and headers of a DLQ record at most: the producers' message.max.bytes (1 MiB), less room for the
record batch's framing, so a broker at its default max.message.bytes (1 MiB + 12) takes it too. A record the
client refuses (MSG_SIZE_TOO_LARGE) would otherwise fail its batch on every retry."""
MAX_KEY_BYTES = 1024  # of an oversized record's key (any Kafka client may write a huge one)
MAX_REASON_CHARS = 4096  # a reason may quote the offending input (an unknown field's name, of any length)

Headers = list[tuple[str, str | bytes | None]]  # Kafka record headers as confluent-kafka takes them
AnyHeaders = Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None  # any client's: (name, value) pairs or a mapping


@dataclass(frozen=True, slots=True)
class DeadLetter:
    key: bytes | None
    value: bytes
    reason: str
    topic: str
    partition: int
    offset: int
    timestamp_us: int
    whole_record_of: int | None = None  # the value is the whole batch record; the rejected mutation is this one
    index: int | None = None  # the value is the rejected mutation alone, this one of its batch record

    def headers(self) -> Headers:
        reason = self.reason if len(self.reason) <= MAX_REASON_CHARS else self.reason[:MAX_REASON_CHARS] + "…"
        headers: Headers = [
            # a reason quotes input, which may hold a lone surrogate (a JSON escape the parser takes): encode() raised
            # and the persist retried the batch forever, stalling every partition behind it (a review)
            (REASON, reason.encode("utf-8", "backslashreplace")), (SOURCE_TOPIC, self.topic.encode()),
            (SOURCE_PARTITION, str(self.partition).encode()), (SOURCE_OFFSET, str(self.offset).encode()),
            (SOURCE_TIMESTAMP, str(self.timestamp_us).encode())]
        if self.whole_record_of is not None:
            headers.append((WHOLE_RECORD, str(self.whole_record_of).encode()))
        if self.index is not None:
            headers.append((INDEX, str(self.index).encode()))
        return headers

    def record(self, max_bytes: int = MAX_RECORD_BYTES) -> tuple[bytes | None, bytes, Headers]:
        """Key, value and headers to produce: within `max_bytes`, the key and value cut (and said so in a header)
        when the original does not fit next to the headers."""
        key, value, headers = self.key, self.value, self.headers()
        if len(key or b"") + len(value) + _size(headers) <= max_bytes:
            return key, value, headers
        if key is not None and len(key) > MAX_KEY_BYTES:
            headers.append((KEY_TRUNCATED, str(len(key)).encode()))
            key = key[:MAX_KEY_BYTES]
        room = max_bytes - len(key or b"") - _size(headers)
        if len(value) > room:
            headers.append((TRUNCATED, str(len(value)).encode()))
            value = value[:max(0, room - _size(headers[-1:]))]
        return key, value, headers


def _size(headers: Headers) -> int:
    return sum(len(name) + len(value or b"") for name, value in headers)


def parse_headers(headers: AnyHeaders) -> dict[str, str]:
    """DLQ headers as text, from any client's header representation (list of pairs or mapping)."""
    items = headers.items() if isinstance(headers, dict) else (headers or [])
    out: dict[str, str] = {}
    for name, value in items:
        name = name.decode() if isinstance(name, bytes) else str(name)
        out[name] = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return out


@dataclass(frozen=True, slots=True)
class DeadRecord:
    """One record read back from the DLQ topic: the original key and value, and the headers saying why and where
    from (`counter dlq` and the health page read them alike)."""

    partition: int
    offset: int
    timestamp_us: int
    key: bytes | None
    value: bytes
    headers: dict[str, str]

    @property
    def position(self) -> str:
        return f"{self.partition}:{self.offset}"

    @property
    def reason(self) -> str:
        return self.headers.get(REASON, "?")

    @property
    def identity(self) -> str:
        """The dead-lettered mutation: its source record's topic, partition, offset and time, its index in that
        record (`dlq.index`, when it was one of a batch) and its bytes (the rejected mutations of one batch record
        share the source position; a restarted local broker reuses offsets, not times). Every dead letter of one
        source mutation has it; none of another has. Without the index, two equal token-less items of one JSON
        array were one identity, and `counter dlq replay` re-sent only one (a review: 8 writes lost)."""
        index = self.headers.get(INDEX)
        return self.legacy_identity if index is None else f"{self.legacy_identity}/{index}"

    @property
    def legacy_identity(self) -> str:
        """The identity before it held the index, which progress files written before then are keyed by."""
        h = self.headers
        digest = hashlib.sha256(self.value).hexdigest()[:16]
        return (f"{h.get(SOURCE_TOPIC, '?')}:{h.get(SOURCE_PARTITION, '?')}:{h.get(SOURCE_OFFSET, '?')}:"
                f"{h.get(SOURCE_TIMESTAMP, '?')}:{digest}")

    @property
    def source(self) -> str:
        h = self.headers
        return f"{h.get(SOURCE_TOPIC, '?')}[{h.get(SOURCE_PARTITION, '?')}]@{h.get(SOURCE_OFFSET, '?')}"

    def namespaces(self) -> list[str]:
        """The namespaces its mutations name, first one first; [] when it does not decode."""
        try:
            return list(dict.fromkeys(m.namespace for m in decode_mutations(self.value)))
        except DecodeError:
            return []

    def preview(self, width: int = 80) -> str:
        """What it held, on one line: its first mutation, or the start of its bytes."""
        try:
            ms = decode_mutations(self.value)
        except DecodeError:
            try:
                text = self.value[:120].decode()
                if text.isprintable():
                    return f"undecodable, {len(self.value)} bytes: {text}"[:width]
            except UnicodeDecodeError:
                pass
            return f"undecodable, {len(self.value)} bytes: {self.value[:40].hex(' ')}"[:width]
        m = ms[0]  # never empty: decode_mutations refuses an empty batch
        what = "clear" if m.op == "CLEAR" else f"{m.delta:+d}"
        token = m.event_id if m.event_id is not None else "(no token)"
        more = f" (+{len(ms) - 1} more)" if len(ms) > 1 else ""
        return f"{m.namespace}:{m.counter_name} {what} token={token}{more}"[:width]

    def tokenless(self) -> tuple[str, tuple[str, int, str, str]] | None:
        """The event the persist path makes of this dead letter's mutation when it is token-less, as a `counter
        replay` of its source record stores it: (namespace, (counter, event_time, "kafka:<topic>:<partition>:<offset>:
        <index>", item key)); None for a tokened one, or one dead-lettered before `dlq.index` said which mutation of
        its record it is."""
        h = self.headers
        if INDEX not in h:
            return None
        try:
            ms = decode_mutations(self.value)
            event_time = int(h[SOURCE_TIMESTAMP])
            identity = position_identity(h[SOURCE_TOPIC], int(h[SOURCE_PARTITION]), int(h[SOURCE_OFFSET]),
                                         int(h[INDEX]))
        except (DecodeError, KeyError, ValueError):
            return None
        if len(ms) != 1 or ms[0].event_id is not None:
            return None
        m = ms[0]
        return m.namespace, (m.counter_name, event_time if m.event_time is None else m.event_time, identity,
                             m.item or m.event_item_key)

    def produce_key(self, shards: Mapping[str, int] | None = None) -> bytes | None:
        """The key a producer would give the mutation now, from its value (`namespace:counter`, or its shard's key
        with `shards`, namespace -> shards), when it decodes to one mutation; else the record's original key."""
        try:
            ms = decode_mutations(self.value)
        except DecodeError:
            return self.key
        if len(ms) != 1:
            return self.key
        return ms[0].sharded_key((shards or {}).get(ms[0].namespace, 1)).encode()
