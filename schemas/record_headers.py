"""Kafka record headers the service's own records carry, and the one test for them.

`READ_YOUR_WRITE_HEADER` marks a counter-mutations record that holds a write a client is waiting on until the
worker has persisted it (AddAndGetCount with dimensions or items): the persist consumer then fetches with its
short wait for a while (see `agents.persist_consumer`), and gathers larger, cheaper batches the rest of the time.
`HEARTBEAT_HEADER` marks a worker's heartbeat, an empty record (see `agents.watermark`).
"""

from __future__ import annotations

from schemas.dead_letter import AnyHeaders, Headers

READ_YOUR_WRITE_HEADER = "counter.read-your-write"
READ_YOUR_WRITE_HEADERS: Headers = [(READ_YOUR_WRITE_HEADER, b"1")]  # as a producer sends them
HEARTBEAT_HEADER = "counter.heartbeat"
HEARTBEAT_HEADERS: Headers = [(HEARTBEAT_HEADER, b"1")]  # as a worker sends them (read, never changed)


def has_header(headers: AnyHeaders, name: str) -> bool:
    """Whether a record's headers (list of pairs or mapping, str or bytes names: any client's) include `name`."""
    if not headers:
        return False
    names = headers.keys() if isinstance(headers, dict) else (h[0] for h in headers)
    raw = name.encode()
    return any(n in (name, raw) for n in names)


def is_heartbeat(headers: AnyHeaders) -> bool:
    """Whether a record's headers (list of pairs or mapping, str or bytes names) mark a heartbeat."""
    return has_header(headers, HEARTBEAT_HEADER)
