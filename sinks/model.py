"""Plain values shared by every storage backend: partitioning, event rows, aggregates, rollup state.

Times are epoch microseconds (int) everywhere. Events travel as plain tuples (``EventRow``) so the
persist hot path allocates no per-event objects.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import xxhash

from schemas.validation import INT64_MAX, INT64_MIN  # the one definition: a delta's bounds are a count's

__all__ = ["EMPTY_AGGREGATE", "INT64_MAX", "INT64_MIN", "Aggregate", "EventRow", "Partitioning", "PendingRollups",
           "RollupState", "apply_aggregate", "join_halves", "later_than_stored", "prefix_end", "saturate"]

log = logging.getLogger(__name__)

_US = 1_000_000
K = TypeVar("K", bound=Hashable)

# (namespace, counter, event_time_us, event_id, event_item_key, delta, is_clear)
EventRow = tuple[str, str, int, str, str, int, bool]


@dataclass(frozen=True, slots=True)
class Partitioning:
    """How a namespace's events are spread: (time_bucket, event_bucket) partitions inside time slices.

    time_bucket and event_bucket keep a hot counter from building one wide partition; slices are
    the unit retention drops. Integer math only, so every process computes identical keys.
    """

    buckets_per_id: int
    seconds_per_bucket: int
    seconds_per_slice: int

    def __post_init__(self) -> None:
        if min(self.buckets_per_id, self.seconds_per_bucket, self.seconds_per_slice) <= 0:
            raise ValueError(f"partitioning values must be positive: {self}")

    @classmethod
    def of(cls, time_partition: Any) -> Partitioning:
        """From anything with the three fields (e.g. control_plane's ``TimePartition``)."""
        return cls(int(time_partition.buckets_per_id), int(time_partition.seconds_per_bucket),
                   int(time_partition.seconds_per_slice))

    @property
    def bucket_us(self) -> int:
        return self.seconds_per_bucket * _US

    @property
    def slice_us(self) -> int:
        return self.seconds_per_slice * _US

    def time_bucket(self, event_time_us: int) -> int:
        return event_time_us // (self.seconds_per_bucket * _US)

    def slice_of(self, event_time_us: int) -> int:
        return event_time_us // (self.seconds_per_slice * _US)

    def event_bucket(self, event_id: str) -> int:
        return xxhash.xxh64_intdigest(event_id.encode()) % self.buckets_per_id  # xxh64 of UTF-8


@dataclass(frozen=True, slots=True)
class Aggregate:
    """What a range of events does to a count.

    cleared: the range holds a clear; then ``delta`` is the sum of adds strictly after the latest
    clear (``last_clear_us``) and replaces the count instead of adding to it.
    events: events the result depends on (those at or after the latest clear; all when none).
    """

    delta: int
    cleared: bool
    last_clear_us: int | None
    events: int


EMPTY_AGGREGATE = Aggregate(0, False, None, 0)


@dataclass(frozen=True, slots=True)
class RollupState:
    """A counter's rolled-up value: exact for every event with event_time <= rollup_ts.

    rollup_ts 0 means never rolled up; last_write_ts is the newest persisted event time, so
    ``last_write_ts > rollup_ts`` means events are waiting for a rollup.
    """

    count: int
    rollup_ts: int
    last_write_ts: int

    @property
    def stale(self) -> bool:
        return self.last_write_ts > self.rollup_ts

    @property
    def pending_since(self) -> int:
        """Where this counter's un-rolled-up events start, for operators: its rollup_ts, or while it was never
        rolled up its last write, the only time of it stored (0 would read as decades of lag)."""
        return self.rollup_ts or self.last_write_ts


@dataclass(frozen=True, slots=True)
class PendingRollups:
    """A namespace's counters waiting for a rollup (``last_write_ts > rollup_ts``), as the operator view shows them
    (``RollupStore.pending_rollups``).

    ``counters``: how many, at most the limit asked; ``truncated``: there are more, and both figures cover only
    those counted. ``oldest_us``: where the oldest un-rolled-up work among them starts; 0 when none is pending.
    SQLite keeps when each counter turned pending (the newest event of the batch that turned it, so up to the
    accept window late), so a counter idle for a day and written once shows seconds of lag; Cassandra uses
    ``RollupState.pending_since`` (its rollup_ts), which makes that counter show a day until its rollup. Not the
    retention bound (``min_rollup_ts``), which must stay 0 while any counter was never rolled up.
    """

    counters: int = 0
    oldest_us: int = 0
    truncated: bool = False


def apply_aggregate(count: int, agg: Aggregate, key: Hashable = None) -> int:
    """The count after the aggregated range: a clear resets, otherwise deltas add; saturated at the int64 bounds
    (see :func:`saturate`; ``key`` names the counter in its warning)."""
    return saturate(agg.delta if agg.cleared else count + agg.delta, key)


# Counters already warned about (bounded: once full it starts over, so a key may be warned about again).
_SATURATED: set[Hashable] = set()
_SATURATED_MAX = 10_000


def saturate(value: int, key: Hashable = None) -> int:
    """``value`` clamped to ``[INT64_MIN, INT64_MAX]``: every count a store keeps or an API answers (a rollup's count,
    a time bucket, a window's count) is an int64, while each delta alone fits int64 but their sum need not. Sums are
    exact in Python ints (the stores' SQL sums too: see ``join_halves``) and saturate only here; the first time a
    counter (``key``) saturates, a warning names it. Later deltas apply to the saturated value."""
    if INT64_MIN <= value <= INT64_MAX:
        return value
    if key not in _SATURATED:
        if len(_SATURATED) >= _SATURATED_MAX:
            _SATURATED.clear()
        _SATURATED.add(key)
        name = ":".join(map(str, key)) if isinstance(key, tuple) else "a counter" if key is None else key
        log.warning("count of %s left the int64 range (%d): saturated at %d (reported once per counter)", name,
                    value, INT64_MAX if value > 0 else INT64_MIN)
    return INT64_MAX if value > 0 else INT64_MIN


def join_halves(high: int | None, low: int | None) -> int:
    """A sum of int64 deltas from the sums of their high and low 32-bit halves (``SUM(delta >> 32)`` and
    ``SUM(delta & 4294967295)``, None for no rows): exact, where ``SUM(delta)`` fails (SQLite: "integer overflow")
    or wraps (Cassandra's bigint sum) once the total leaves int64. Each half's sum fits int64 for fewer than 2**31
    rows (``>>`` is arithmetic, so ``high * 2**32 + low`` is each delta)."""
    return ((high or 0) << 32) + (low or 0)


def prefix_end(prefix: str) -> str | None:
    """The least string greater than every string starting with ``prefix`` (its last character incremented,
    carrying past U+10FFFF and skipping the surrogates), or None when there is none ("" or all U+10FFFF). Text
    sorts by code point in Python and by UTF-8 bytes in SQLite and Cassandra, which is the same order, so
    ``prefix <= name < prefix_end(prefix)`` selects the names with the prefix in every backend."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            nxt = last + 1
            if 0xD800 <= nxt <= 0xDFFF:
                nxt = 0xE000
            return "".join(chars) + chr(nxt)
    return None


def later_than_stored(rows: Sequence[tuple[K, int]], stored: Mapping[K, int]) -> list[int]:
    """The indexes of ``rows`` (key, boundary) that a forward-only write applies: computed at a later boundary than
    the stored one (``stored``: key -> boundary, absent when none) and than an earlier row of the same call. An equal
    boundary is refused (on Cassandra it would tie on write timestamps), as SQLite's conditional upserts do."""
    latest = dict(stored)
    chosen: list[int] = []
    for i, (key, upto) in enumerate(rows):
        if upto > latest.get(key, upto - 1):
            latest[key] = upto
            chosen.append(i)
    return chosen
