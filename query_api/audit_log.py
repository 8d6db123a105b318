"""A counter's newest events (its audit log), newest first, paged backwards: what the UI's audit panel shows.

The event store only scans forwards (`EventStore.scan`: ascending, cursor-paged), and the audit job lives in
`jobs/`, which the API must not import. So the newest events are found by scanning time ranges that walk back
from now: a short range first, growing while ranges come back sparse, narrowing towards its newest part when
one holds more than a page (a hot counter can hold millions of events in an hour: only its newest few are read).
Ranges stop at the namespace's event retention (`delete_after`, plus a day of slack for events not yet rolled
up): no scan ever covers more than that, which keeps Cassandra's range scans bounded too.

The cursor of the next page is the oldest entry returned, as (event_time, event_id, event_item_key): entries
strictly before it in the store's order, so events sharing one event_time are each listed exactly once.
"""

from __future__ import annotations

import base64
import json
from collections import deque

from control_plane import Namespace
from schemas import MAX_EVENT_TIME, MICROS, MIN_EVENT_TIME
from sinks import EventStore
from sinks.base import ScanCursor
from sinks.model import EventRow

PAGE = 1000  # rows per store scan, at most
PROBE_MIN = 100  # a range is read whole when it holds fewer than max(PROBE_MIN, 4 x wanted) rows
FIRST_SPAN_US = 60 * MICROS  # the first range: the last minute
MIN_SPAN_US = 1000  # narrower than a millisecond, a crowded range is paged through instead of narrowed
DAY_US = 86_400 * MICROS


class BadCursor(ValueError):
    """The `before` cursor is not one this module issued."""


def encode_cursor(row: EventRow) -> str:
    """An opaque cursor for the entries older than `row`."""
    raw = json.dumps([row[2], row[3], row[4]], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> ScanCursor:
    try:
        t, event_id, item_key = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if (type(t) is not int or not MIN_EVENT_TIME <= t <= MAX_EVENT_TIME or not isinstance(event_id, str)
                or not isinstance(item_key, str)):  # a time no event has (2**70 answered 500: SQLite's int64)
            raise TypeError
    except (ValueError, TypeError, RecursionError) as exc:  # '[' x 1000 is within the query's 2048 characters
        raise BadCursor(f"not a cursor this API issued: {text[:40]!r}") from exc
    return t, event_id, item_key


def oldest_kept_us(ns: Namespace, now_us: int) -> int:
    """Events older than this are gone (deleted after `delete_after` once rolled up), give or take a day."""
    return now_us - int(ns.retention.delete_after_s * MICROS) - DAY_US


async def newest_events(events: EventStore, ns: Namespace, counter: str, *, limit: int, now_us: int,
                        before: ScanCursor | None = None) -> tuple[list[EventRow], ScanCursor | None]:
    """Up to `limit` of the counter's events, newest first, strictly before `before` (default: the newest held,
    including events stamped up to a minute past max_clock_skew in the future); and the cursor of the next page
    (None when the events held are exhausted)."""
    floor = oldest_kept_us(ns, now_us)
    hi = before[0] if before else now_us + int((ns.max_clock_skew_s + 60) * MICROS)
    found: list[EventRow] = []
    span = FIRST_SPAN_US
    while len(found) < limit and hi > floor:
        wide = max(floor, hi - span)
        rows, lo = await _newest_in(events, ns.name, counter, wide, hi, limit - len(found), before)
        found.extend(reversed(rows))
        span = hi - lo if lo > wide else (hi - lo) * 4  # crowded: keep the narrowed width; sparse: widen
        hi = lo
    if len(found) < limit:
        return found, None
    last = found[-1]
    return found, (last[2], last[3], last[4])


async def _newest_in(events: EventStore, namespace: str, counter: str, lo: int, hi: int, want: int,
                     before: ScanCursor | None) -> tuple[list[EventRow], int]:
    """The newest `want` events of (lo, hi] that sort before `before`, ascending, and the `lo` actually covered:
    a range holding more than a few times `want` events is narrowed to its newest quarter until it does not (the
    older part is left for the next range), so a page costs a few small scans however hot the counter."""
    probe = min(PAGE, max(PROBE_MIN, 4 * want))
    while True:
        page = await events.scan(namespace, counter, lo, hi, limit=probe)
        if len(page) < probe:
            return _before(page, before)[-want:], lo
        if hi - lo <= MIN_SPAN_US:  # a crowd of events within a millisecond: page through it, keep the last
            tail: deque[EventRow] = deque(_before(page, before), maxlen=want)
            while len(page) == probe:
                last = page[-1]
                page = await events.scan(namespace, counter, lo, hi, after=(last[2], last[3], last[4]), limit=PAGE)
                tail.extend(_before(page, before))
                probe = PAGE
            return list(tail), lo
        lo = hi - max(MIN_SPAN_US, (hi - lo) // 4)


def _before(rows: list[EventRow], before: ScanCursor | None) -> list[EventRow]:
    if before is None:
        return rows
    return [r for r in rows if (r[2], r[3], r[4]) < before]
