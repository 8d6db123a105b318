"""Dead-letter records: the original bytes plus why, where from (topic, partition, offset) in headers.

Wire format of `counter-mutations-dlq`: the record key and value are the original record's (for a rejected
mutation of a batch record, that mutation alone, re-encoded with the identity it was given); the headers
below say why it was rejected and where it came from. The persist agent writes them, `counter dlq` reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

REASON = "dlq.reason"
SOURCE_TOPIC = "dlq.topic"
SOURCE_PARTITION = "dlq.partition"
SOURCE_OFFSET = "dlq.offset"
SOURCE_TIMESTAMP = "dlq.timestamp_us"

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

    def headers(self) -> Headers:
        return [(REASON, self.reason.encode()), (SOURCE_TOPIC, self.topic.encode()),
                (SOURCE_PARTITION, str(self.partition).encode()), (SOURCE_OFFSET, str(self.offset).encode()),
                (SOURCE_TIMESTAMP, str(self.timestamp_us).encode())]


def parse_headers(headers: AnyHeaders) -> dict[str, str]:
    """DLQ headers as text, from any client's header representation (list of pairs or mapping)."""
    items = headers.items() if isinstance(headers, dict) else (headers or [])
    out: dict[str, str] = {}
    for name, value in items:
        name = name.decode() if isinstance(name, bytes) else str(name)
        out[name] = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return out
