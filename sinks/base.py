"""Store interfaces every backend implements (SQLite and Cassandra).

They are async so a network backend can implement them natively; the SQLite backend runs its
work on one dedicated thread per store so the Faust event loop never blocks on disk.
All times are epoch microseconds.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from sinks.model import Aggregate, EventRow, PendingRollups, RollupState
from sinks.sketches import BucketItems, SketchRow, StoredSketch
from sinks.windows import BucketRange, BucketRow, BucketSum, Granularity, RankEntry, RankPage, StoredBucket

__all__ = ["BucketStore", "EventStore", "RollupStore", "ScanCursor", "SketchStore", "Stores"]

# Position of the last event returned by ``scan``: (event_time, event_id, event_item_key).
ScanCursor = tuple[int, str, str]


@runtime_checkable
class EventStore(Protocol):
    """The TimeSeries event store: idempotent, immutable events partitioned by time."""

    async def write_events(self, rows: Sequence[EventRow]) -> int:
        """Store rows in one transaction; returns how many were new.

        Idempotent on (namespace, counter, event_time, event_id, event_item_key): the first
        write of an identity wins, later ones (even with another delta) are ignored.
        """
        ...

    async def aggregate(self, namespace: str, counter: str, after_us: int, upto_us: int) -> Aggregate:
        """Aggregate of the events with ``after_us < event_time <= upto_us`` (clears honoured)."""
        ...

    async def aggregate_many(self, namespace: str, windows: Sequence[tuple[str, int, int]]) -> list[Aggregate]:
        """``aggregate`` of each ``(counter, after_us, upto_us)``, in order: a rollup batch in one call."""
        ...

    async def write_and_aggregate(self, rows: Sequence[EventRow], namespace: str,
                                  windows: Sequence[tuple[str, int, int]]) -> list[Aggregate]:
        """``write_events(rows)``, then ``aggregate_many(namespace, windows)``, whose windows include the rows: a
        write and the counts that must include it in one call (AddAndGetCount's own event and its count)."""
        ...

    async def bucket_sums_many(self, namespace: str, windows: Sequence[tuple[str, int, int]],
                               width_us: int) -> list[list[BucketSum]]:
        """Per ``(counter, after_us, upto_us)``, in order: the buckets of ``width_us`` (aligned to the epoch)
        holding events with ``after_us < event_time <= upto_us``, ascending, as ``(bucket_start_us, sum of the
        adds strictly after the latest clear inside the bucket, that clear's time or None, events)``, where
        events counts every event of the bucket within the range. A rollup batch's minutes in one call."""
        ...

    async def bucket_items_many(self, namespace: str, windows: Sequence[tuple[str, int, int]],
                                width_us: int) -> list[list[BucketItems]]:
        """As ``bucket_sums_many``, with the items instead of the sum: per ``(counter, after_us, upto_us)``, in
        order, the buckets of ``width_us`` holding events with ``after_us < event_time <= upto_us``, ascending, as
        ``(bucket_start_us, the distinct event_item_keys of the adds strictly after the latest clear inside the
        bucket, that clear's time or None, events)``; an empty item key is no item. In a UNIQUE namespace an
        event's item key is its item, so this is what the minutes' sketches are made of (``sinks.sketches``). A
        rollup batch's minutes in one call."""
        ...

    async def scan(self, namespace: str, counter: str, after_us: int, upto_us: int, *,
                   after: ScanCursor | None = None, limit: int = 10_000) -> list[EventRow]:
        """Up to ``limit`` events of ``after_us < event_time <= upto_us`` in ascending
        (event_time, event_id, event_item_key) order, for ACCURATE live deltas and audits.

        Paging: pass the last row's ``(event_time, event_id, event_item_key)`` as ``after`` to
        continue strictly after it; a cursor (not a time) so many events sharing one event_time
        across a page edge are each returned exactly once. A page shorter than ``limit`` is the last.
        """
        ...

    async def contains(self, namespace: str, keys: Sequence[tuple[str, int, str, str]]) -> list[bool]:
        """Whether each event identity ``(counter, event_time, event_id, event_item_key)`` is stored, in order:
        one call for every read-your-write waiting in the API (point lookups, never scans)."""
        ...

    async def counters(self, namespace: str, *, after: str | None = None, limit: int = 1000) -> list[str]:
        """Up to ``limit`` distinct names of the namespace's counters that have stored events, in
        ascending order, strictly after ``after`` (paging: pass the last name of the previous page).
        A page shorter than ``limit`` is the last. For recounts of a whole namespace."""
        ...

    async def delete_rolled_up(self, namespace: str, counter: str, before_us: int, rolled_up_to_us: int) -> int:
        """Delete the counter's events with ``event_time < min(before_us, rolled_up_to_us + 1)``:
        only old events that a rollup already counted. Returns how many were deleted."""
        ...

    async def drop_expired_slices(self, namespace: str, before_us: int, rolled_up_to_us: int) -> int:
        """Retention by whole slices: drop the namespace's slices whose every possible event time
        is ``< before_us`` and ``<= rolled_up_to_us``. Returns how many slices were dropped."""
        ...

    async def slices(self, namespace: str) -> list[tuple[str, int, int]]:
        """(table, start_us, end_us) of the namespace's slices, oldest first (an end is exclusive)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class RollupStore(Protocol):
    """Per-counter rollups ``(count, rollup_ts, last_write_ts)`` and the persist watermarks."""

    async def get(self, namespace: str, counter: str) -> RollupState | None: ...

    async def get_many(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], RollupState]:
        """States of the keys that exist (missing keys are absent from the result)."""
        ...

    async def bump_last_write(self, items: Sequence[tuple[str, str, int]]) -> None:
        """``last_write_ts = max(old, new)`` per (namespace, counter, event_time); creates missing rows
        as (count 0, rollup_ts 0) so the sweep finds them."""
        ...

    async def write_rollup(self, namespace: str, counter: str, count: int, rollup_ts: int) -> bool:
        """Forward-only: applied only if ``rollup_ts`` is later than the stored one (or no row).
        Returns whether it was applied; racing rollup workers converge without locks."""
        ...

    async def write_rollups(self, namespace: str, items: Sequence[tuple[str, int, int]]) -> list[bool]:
        """``write_rollup`` of each ``(counter, count, rollup_ts)``, in order: a rollup batch in one call."""
        ...

    async def stale(self, limit: int = 1000) -> list[tuple[str, str]]:
        """Counters with ``last_write_ts > rollup_ts`` (the convergence sweep); successive calls
        rotate through all of them so a few hot counters cannot starve the rest."""
        ...

    async def min_rollup_ts(self, namespace: str) -> int:
        """Time up to which every stored event of the namespace is rolled up (retention bound)."""
        ...

    async def newest_rollup_ts(self, namespace: str) -> int:
        """The latest rollup_ts of any counter of the namespace (0 when nothing was rolled up): no event dated at or
        before it can be counted any more, so admission refuses such events once the admission window grew past it
        (a raised accept_limit, `agents.persist`), every few seconds: SQLite reads one row (its bound is raised by every
        rollup write), Cassandra the namespace's pending counters and its bounds."""
        ...

    async def pending_rollups(self, namespaces: Sequence[str], limit: int = 10_000) -> dict[str, PendingRollups]:
        """Per namespace (every one asked, in one call): its pending counters (``last_write_ts > rollup_ts``)
        counted up to ``limit``, and where the oldest pending work starts (``PendingRollups``). For the operator
        view, every few seconds: reads only pending counters, at most ``limit`` per namespace (never a whole
        namespace, however many converged counters it holds), writes nothing, and leaves the sweep's rotation
        (``stale``) where it was."""
        ...

    async def set_watermarks(self, topic: str, marks: Mapping[int, int], *,
                             claims: Mapping[int, int] | None = None) -> set[int]:
        """Per-partition persist watermark (µs); never moves a partition's mark backwards.

        With ``claims`` (partition -> the claim ``claim_partitions`` gave this writer on that partition of
        ``claim_topic(topic)``, one per partition of ``marks``) a partition's mark is written only while that claim
        is the partition's latest, checked atomically with the write. Returns the partitions refused: another
        worker claimed them since, so this one lost them (empty without ``claims``)."""
        ...

    async def claim_partitions(self, topic: str, partitions: Collection[int]) -> dict[int, int]:
        """A new claim on each of ``topic``'s ``partitions`` (partition -> claim), unlike any claim before it, and
        the partition's latest until the next claim. A worker given partitions claims them before it loads what was
        published for them and publishes under its claims, so the store refuses what a previous owner still
        publishes (a worker the group dropped while it stalled, `agents.arrival`)."""
        ...

    async def watermarks(self, topic: str) -> dict[int, int]: ...

    async def identity(self) -> str:
        """This store's id: drawn by the first process that asks (first writer wins), the same for every process
        on the store since, and another for a fresh store (a new data directory or keyspace). The rollup cache's
        keys carry it (`sinks.cache.open_cache`), so a new store never reads an earlier one's cached counts."""
        ...

    async def new_identity(self) -> str:
        """Replace this store's id with a new one, and return it. A copy of a store (a restored backup, a cloned disk)
        carries the original's id, so nothing could tell them apart (`counter store rebind --new-store`); processes
        that read the old id keep it until they restart."""
        ...

    async def delete(self, namespace: str, counter: str | None = None) -> int:
        """Drop rollup rows of one counter or a whole namespace (ops, recounts); returns rows dropped. The
        combination registry below is left alone."""
        ...

    async def register_combinations(self, namespace: str, items: Sequence[tuple[str, str]], *,
                                    full: bool = False) -> None:
        """Record dimension combinations of base counters: ``(counter, combination)`` pairs, e.g. ``("views",
        "views country=US")`` (``schemas.dimensions``). Idempotent. ``full``: each is some write's full
        combination (all its dimensions), which ``max_combinations`` bounds; a combination once registered
        full stays full, whatever later registrations say."""
        ...

    async def combinations(self, namespace: str, counter: str, *, prefix: str = "", after: str | None = None,
                           limit: int = 1000, full_only: bool = False) -> list[str]:
        """Up to ``limit`` registered combinations of ``counter`` in ascending (UTF-8 byte, i.e. code point)
        order: those starting with ``prefix``, strictly after ``after`` (paging: pass the last one of the
        previous page); ``full_only``: only the full ones. A page shorter than ``limit`` is the last. For
        group_by (the combinations of a key set), clears (every combination) and the max_combinations bound."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class BucketStore(Protocol):
    """Time buckets of windowed counts (DESIGN invariant 7) and each counter's latest clear.

    A bucket ``(namespace, counter, granularity, start_us) -> (value, computed_upto_us)`` is always written as
    a value recomputed at a rollup boundary, never incremented, so re-running a rollup, replay or recount
    cannot double-count. Clears are applied when reading (``sinks.windows.masked``).

    **Rank lists** (Top-K): every stored bucket is also the entry ``(base counter, value)`` of the rank list
    ``(namespace, signature, granularity, start_us)``, where ``(base, signature) = split_signature(counter)``
    (``schemas.dimensions``): the list of one bucket of one filter's counters, sorted by value. ``write_buckets``
    maintains the entries with the buckets it applies (forward-only with them) and ``drop_expired`` drops them
    with the buckets, so every writer of buckets (rollups, recounts, seeding) keeps them.
    """

    async def write_buckets(self, namespace: str, rows: Sequence[BucketRow]) -> list[bool]:
        """Forward-only per bucket: a row replaces the stored bucket only if its ``computed_upto_us`` is
        strictly later (or nothing is stored). Returns, per row in order, whether it was applied."""
        ...

    async def read_buckets_many(self, namespace: str, ranges: Sequence[BucketRange]) -> list[list[StoredBucket]]:
        """Per ``(counter, granularity, from_start_us, to_start_us)``, in order: the stored buckets whose start
        lies in ``[from, to)``, ascending by start, unmasked. A batch of ranges in one call."""
        ...

    async def read_ranks_many(self, namespace: str, pages: Sequence[RankPage]) -> list[list[RankEntry]]:
        """Per page ``(signature, granularity, start_us, after, limit[, ascending])`` (``sinks.windows.RankPage``),
        in order: up to ``limit`` entries ``(base counter, stored value)`` of that rank list, by value descending,
        then base counter ascending (code point order), strictly after ``after`` (the previous page's last entry;
        None: from the top); ``ascending`` reads the same order backwards, from the list's end. A page shorter
        than ``limit`` is the last. Values are as stored (unmasked). Every stored bucket has its entry; a backend
        without transactions (Cassandra) may also hold stale entries of values since replaced, left by racing
        writers or crashes, so a reader verifies what it finds against the buckets. A batch in one call."""
        ...

    async def bump_clears(self, namespace: str, items: Sequence[tuple[str, int]]) -> None:
        """Per ``(counter, clear_us)``: the counter's latest clear becomes ``max(stored, clear_us)``."""
        ...

    async def clears(self, namespace: str, counters: Sequence[str]) -> dict[str, int]:
        """The latest clear of each of ``counters`` that has one."""
        ...

    async def drop_expired(self, namespace: str, granularity: Granularity, before_us: int) -> int:
        """Retention: remove the namespace's ``granularity`` buckets whose end is ``<= before_us`` and their rank
        list entries, never a newer bucket, another granularity or namespace, a clear or a rollup. Returns how
        many storage slices (``Granularity.slice_us``) it emptied entirely; pass a slice-aligned ``before_us`` to
        drop whole partitions only (cheapest on Cassandra)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class SketchStore(Protocol):
    """HLL sketches of unique counts, one per (counter, granularity, bucket) of a UNIQUE namespace (DESIGN
    invariant 7; ``sinks.sketches``), opened beside the bucket store (``sinks.factory.open_sketch_store``).

    A sketch is always written as recomputed at a rollup boundary (``computed_upto_us``), forward-only per bucket
    like the buckets: a re-run, replay or recount recomputes the same union, so it never moves an estimate.
    Clears are applied when reading, with the bucket store's clears (``sinks.windows.is_masked``).
    """

    async def write_sketches(self, namespace: str, rows: Sequence[SketchRow]) -> list[bool]:
        """Forward-only per bucket: a row replaces the stored sketch only if its ``computed_upto_us`` is strictly
        later (or nothing is stored). Returns, per row in order, whether it was applied."""
        ...

    async def read_sketches_many(self, namespace: str, ranges: Sequence[BucketRange]) -> list[list[StoredSketch]]:
        """Per ``(counter, granularity, from_start_us, to_start_us)``, in order: the stored sketches whose start
        lies in ``[from, to)``, ascending by start, unmasked. A batch of ranges in one call."""
        ...

    async def drop_expired(self, namespace: str, granularity: Granularity, before_us: int) -> int:
        """Retention, as ``BucketStore.drop_expired``: remove the namespace's ``granularity`` sketches whose end is
        ``<= before_us``, never a newer one, another granularity or namespace. Returns how many storage slices
        (``Granularity.slice_us``) it emptied entirely."""
        ...

    async def close(self) -> None: ...


class Stores(NamedTuple):
    """The stores of one backend, as ``sinks.factory.open_stores`` opens them (on Cassandra they share one
    session, shut down when the last of them is closed): ``events, rollups, buckets = open_stores(...)``."""

    events: EventStore
    rollups: RollupStore
    buckets: BucketStore
