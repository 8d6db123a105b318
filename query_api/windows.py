"""The read side of time-windowed counts: a window's count and a granularity's series, from the bucket store.

Plain functions over a ``BucketStore`` and the namespace's configuration, returning plain values; the routes add
``as_of`` (the counter's rollup_ts: buckets are maintained before the rollup that certifies them) and, for
ACCURATE, the live events in the window. Every failure is a ``WindowError`` naming the request field, which
an API answers with 422.

* ``window_count`` answers ``[start, end)`` from the coarsest buckets that tile it (``sinks.windows.tile``):
  a 30-day window reads tens of rows, not 43,200 minutes. Its edges are aligned outwards to the finest
  granularity retained there, and the range actually covered is returned with the count.
* ``series`` lists one granularity's buckets over ``[start, end)``, in order, zero-filled, at most
  ``max_buckets`` of them (its pure part, ``series_range`` and ``fill_series``, lives in ``sinks.windows``:
  `counter audit --by` prints the same series).

Both read the counter's latest clear and mask with it: a bucket that ended at or before the clear reads 0.
Two store calls per request (the clear, then the buckets in one batched read). ``tiled_counts`` is the same
reading for many counters at once, still two store calls, over a tiling or a signed cover of it
(``sinks.windows.signed_cover``): Top-K's exact counts of its candidates.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from control_plane import Namespace, parse_duration
from schemas import parse_generation_time
from schemas.validation import ValidationError
from sinks import BucketStore
from sinks.windows import (
    CHAIN,
    Granularity,
    Segment,
    SignedSegment,
    Tiling,
    TooManyBuckets,
    WindowError,
    fill_series,
    masked,
    retained_from,
    series_range,
    tile,
)

__all__ = [
    "DEFAULT_MAX_BUCKETS",
    "Series",
    "TiledCount",
    "TooManyBuckets",
    "WindowCount",
    "WindowError",
    "granularity_of",
    "parse_window",
    "series",
    "tiled_counts",
    "window_count",
    "window_tiling",
]

DEFAULT_MAX_BUCKETS = 1440  # a day of minutes, two months of hours, four years of days
_US = 1_000_000


@dataclass(frozen=True, slots=True)
class WindowCount:
    """A window's count over ``[start_us, end_us)``, the aligned range the buckets actually cover, and the
    segments of buckets it was read from."""

    count: int
    start_us: int
    end_us: int
    segments: tuple[Segment, ...]
    upto_us: int = 0  # the latest boundary the buckets read were computed at: they are exact up to it


@dataclass(frozen=True, slots=True)
class TiledCount:
    """One counter's count over a tiling or cover, the latest boundary its buckets read were computed at (0: none
    read), and how many rows were read (buckets, and its clear if it has one)."""

    count: int
    upto_us: int
    rows: int


@dataclass(frozen=True, slots=True)
class Series:
    """``buckets``: ``(start_us, count)`` of every ``granularity`` bucket in ``[start_us, end_us)``, ascending,
    zero-filled and masked by the counter's latest clear."""

    granularity: Granularity
    start_us: int
    end_us: int
    buckets: tuple[tuple[int, int], ...]
    upto_us: int = 0  # the latest boundary the buckets read were computed at


def granularity_of(ns: Namespace, value: object, *, field: str = "granularity") -> Granularity:
    """A granularity the namespace keeps, from its name ("minute", "HOUR", ...)."""
    kept = ", ".join(ns.windows.granularities) or "none"
    name = value.strip().lower() if isinstance(value, str) else value
    if name not in {g.value for g in CHAIN}:
        raise WindowError(f"must be one of {', '.join(g.value for g in CHAIN)} (got {value!r})", field=field)
    if not ns.windows.enabled(str(name)):
        raise WindowError(f"namespace {ns.name!r} keeps no {name} buckets (it keeps: {kept})", field=field)
    return Granularity(str(name))


def parse_window(spec: Mapping[str, object], now_us: int, *, field: str = "window") -> tuple[int, int]:
    """``[start_us, end_us)`` of ``{"last": "1h"}`` (ending now) or ``{"start": ..., "end": ...}`` (RFC 3339 or
    epoch, as a generation_time; ``end`` defaults to now)."""
    if not isinstance(spec, Mapping):
        raise WindowError('must be {"last": "1h"} or {"start": ..., "end": ...}', field=field)
    unknown = sorted(set(spec) - {"last", "start", "end"})
    if unknown:
        raise WindowError(f"unknown key {unknown[0]!r}; expected last, or start and end", field=f"{field}.{unknown[0]}")
    if "last" in spec:
        if "start" in spec or "end" in spec:
            raise WindowError("give either last or start/end, not both", field=f"{field}.last")
        try:
            seconds = parse_duration(spec["last"])
        except ValueError as exc:
            raise WindowError(str(exc), field=f"{field}.last") from None
        if seconds <= 0:
            raise WindowError(f"must be a positive duration (got {spec['last']!r})", field=f"{field}.last")
        return now_us - int(seconds * _US), now_us
    if "start" not in spec:
        raise WindowError("needs last, or start (and optionally end)", field=field)
    try:
        start = parse_generation_time(spec["start"], field=f"{field}.start")
        end = parse_generation_time(spec["end"], field=f"{field}.end") if "end" in spec else now_us
    except ValidationError as exc:
        raise WindowError(exc.reason, field=exc.field) from None
    if end <= start:
        raise WindowError("must be after start", field=f"{field}.end" if "end" in spec else f"{field}.start")
    return start, end


def window_tiling(ns: Namespace, start_us: int, end_us: int, now_us: int) -> Tiling:
    """The coarsest retained buckets of the namespace tiling ``[start_us, end_us)`` at ``now_us`` (edges aligned
    outwards; see ``sinks.windows.tile``); WindowError naming ``window`` when there is none."""
    chain = tuple(Granularity(g) for g in ns.windows.granularities)
    if not chain:
        raise WindowError(f"namespace {ns.name!r} keeps no time windows", field="window")
    try:
        return tile(start_us, end_us, chain, _floors(ns, chain, now_us))
    except WindowError as exc:
        raise WindowError(exc.reason, field=exc.field or "window") from None


async def tiled_counts(buckets: BucketStore, ns: Namespace, counters: Sequence[str], parts: Sequence[SignedSegment],
                       known: Sequence[Mapping[tuple[Granularity, int], int]] | None = None) -> list[TiledCount]:
    """Each counter's count over the buckets of ``parts`` (a tiling's segments, each +1, or a signed cover), in
    order: its stored buckets there, masked by its latest clear, each counted with its part's sign. Two store
    calls for the whole batch (the clears, then every counter's runs of buckets).

    ``known`` (per counter): stored values of some of its buckets the caller already holds, by ``(granularity,
    start)`` (0 for a bucket known not to exist); only the others are read, as runs of consecutive buckets. Known
    values are masked and signed like read ones. ``rows`` counts the buckets read and the clears found."""
    if not counters:
        return []
    clears = await buckets.clears(ns.name, counters)
    ranges: list[tuple[str, Granularity, int, int]] = []
    owners: list[tuple[int, int]] = []  # (counter index, sign)
    for i, counter in enumerate(counters):
        mine = known[i] if known is not None else {}
        for sign, seg in parts:
            g, width = seg.granularity, seg.granularity.width_us
            start = seg.start_us
            while start < seg.end_us:  # runs of buckets not known
                if (g, start) in mine:
                    start += width
                    continue
                end = start + width
                while end < seg.end_us and (g, end) not in mine:
                    end += width
                ranges.append((counter, g, start, end))
                owners.append((i, sign))
                start = end
    found = await buckets.read_buckets_many(ns.name, ranges) if ranges else []
    counts = [0] * len(counters)
    uptos = [0] * len(counters)
    rows = [int(c in clears) for c in counters]
    for (i, sign), (_c, g, _lo, _hi), got in zip(owners, ranges, found, strict=True):
        clear = clears.get(counters[i])
        counts[i] += sign * sum(masked(g, start, value, clear) for start, value, _upto in got)
        uptos[i] = max([uptos[i], *(upto for _s, _v, upto in got)])
        rows[i] += len(got)
    if known is not None:
        signs = {(seg.granularity, start): sign for sign, seg in parts
                 for start in range(seg.start_us, seg.end_us, seg.granularity.width_us)}
        for i, mine in enumerate(known):
            clear = clears.get(counters[i])
            counts[i] += sum(signs[(g, start)] * masked(g, start, value, clear) for (g, start), value in mine.items())
    return [TiledCount(n, u, r) for n, u, r in zip(counts, uptos, rows, strict=True)]


async def window_count(buckets: BucketStore, ns: Namespace, counter: str, start_us: int, end_us: int, *,
                       now_us: int | None = None) -> WindowCount:
    """The count of ``[start_us, end_us)`` from the coarsest retained buckets that tile it (see the module doc)."""
    now = time.time_ns() // 1000 if now_us is None else now_us
    tiling = window_tiling(ns, start_us, end_us, now)
    [counted] = await tiled_counts(buckets, ns, [counter], [SignedSegment(1, seg) for seg in tiling.segments])
    return WindowCount(counted.count, tiling.start_us, tiling.end_us, tiling.segments, counted.upto_us)


async def series(buckets: BucketStore, ns: Namespace, counter: str, granularity: Granularity | str, start_us: int,
                 end_us: int, *, now_us: int | None = None, max_buckets: int = DEFAULT_MAX_BUCKETS) -> Series:
    """Every ``granularity`` bucket of ``[start_us, end_us)`` (edges aligned outwards), zero-filled and masked.

    A start older than the granularity's retention is clamped to its oldest retained bucket (the result says
    so); more than ``max_buckets`` buckets to return is ``TooManyBuckets``.
    """
    g = granularity_of(ns, granularity)
    now = time.time_ns() // 1000 if now_us is None else now_us
    lo, hi = series_range(g, start_us, end_us, now_us=now, retention_s=ns.windows.retention_s(g),
                          max_buckets=max_buckets)
    clear = (await buckets.clears(ns.name, [counter])).get(counter)
    [rows] = await buckets.read_buckets_many(ns.name, [(counter, g, lo, hi)])
    filled = fill_series(g, lo, hi, rows, clear)
    return Series(g, lo, hi, filled, max((row[2] for row in rows), default=0))


def _floors(ns: Namespace, chain: tuple[Granularity, ...], now_us: int) -> dict[Granularity, int | None]:
    return {g: retained_from(g, now_us, ns.windows.retention_s(g)) for g in chain}
