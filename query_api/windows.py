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

Both read the counter's latest clear and mask with it: a bucket that ended at or before the clear reads 0, and so
does one computed up to a boundary before it (``sinks.windows.is_masked``). Two store calls per request: the
buckets in one batched read, then the clear. The clear comes *after* the buckets: the worker bumps a clear before
it writes the buckets computed with it, so every bucket read is masked by a clear at least as recent as the one it
was computed under (read the other way round, a rollup step landing in between shows its new buckets under the old
clear: the erased buckets count). A bucket written before the clear read it holds only events the clear erased, or
none. ``tiled_counts`` is the same reading for many counters at once, still two store calls, over a tiling or a
signed cover of it (``sinks.windows.signed_cover``): Top-K's exact counts of its candidates.

Windows start in the year 2000 at the earliest, as event times do (``schemas.MIN_EVENT_TIME``): a longer ``last``
is refused, not clamped, so an answer never claims a range it could not hold.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from control_plane import Namespace, parse_duration
from schemas import INT64_MAX, INT64_MIN, MIN_EVENT_TIME, parse_generation_time
from schemas.validation import ValidationError
from sinks import BucketStore
from sinks.model import saturate
from sinks.windows import (
    CHAIN,
    Granularity,
    Segment,
    SignedSegment,
    Tiling,
    TooManyBuckets,
    WindowError,
    fill_series,
    holds,
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
    "windowed",
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
    saturated: bool = False  # a bucket held an int64 bound: a coarser bucket may not be the sum of its finer ones


@dataclass(frozen=True, slots=True)
class Series:
    """``buckets``: ``(start_us, count)`` of every ``granularity`` bucket in ``[start_us, end_us)``, ascending,
    zero-filled and masked by the counter's latest clear."""

    granularity: Granularity
    start_us: int
    end_us: int
    buckets: tuple[tuple[int, int], ...]
    upto_us: int = 0  # the latest boundary the buckets read were computed at


def windowed(ns: Namespace, *, field: str = "window") -> None:
    """WindowError naming ``field`` unless the namespace keeps time buckets (never a BEST_EFFORT one): the field of
    the request that asked for them (GetCount's ``window``, GetCountSeries's ``namespace``: it has no window)."""
    if not ns.windows:
        raise WindowError(f"namespace {ns.name!r} ({ns.counter_type.value}) keeps no time windows", field=field)


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
        return _last(spec["last"], seconds, now_us, field=f"{field}.last"), now_us
    if "start" not in spec:
        raise WindowError("needs last, or start (and optionally end)", field=field)
    try:
        start = parse_generation_time(spec["start"], field=f"{field}.start")
        end = parse_generation_time(spec["end"], field=f"{field}.end") if "end" in spec else now_us
    except ValidationError as exc:
        raise WindowError(exc.reason, field=exc.field) from None
    if end <= start:
        if "end" in spec:
            raise WindowError("must be after start", field=f"{field}.end")
        # the end defaulted to now: the start is what is wrong (it is in the future), not an end never given
        raise WindowError(f"must be before now ({_rfc3339(now_us)}), where a window without an end ends: give an "
                          f"end after the start", field=f"{field}.start")
    return start, end


def _rfc3339(us: int) -> str:
    return datetime.fromtimestamp(us / _US, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _last(value: object, seconds: float, now_us: int, *, field: str) -> int:
    """The start of a window of ``seconds`` ending at ``now_us``: at least a microsecond long, and not before the
    earliest time an event can have (checked before the multiplication: the duration may be astronomical)."""
    if seconds * _US < 1:
        raise WindowError(f"must be a positive duration of a microsecond or more (got {value!r})", field=field)
    if seconds * _US > now_us - MIN_EVENT_TIME:
        raise WindowError(f"reaches before 2000-01-01T00:00:00Z, the earliest time counted (got {value!r})",
                          field=field)
    return now_us - int(seconds * _US)


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


# (sign, granularity, start, value, computed_upto or None for a value known without a read): one bucket of a count
_Counted = tuple[int, Granularity, int, int, int | None]


_BOUNDS = (INT64_MIN, INT64_MAX)


async def tiled_counts(buckets: BucketStore, ns: Namespace, counters: Sequence[str], parts: Sequence[SignedSegment],
                       known: Sequence[Mapping[tuple[Granularity, int], int]] | None = None) -> list[TiledCount]:
    """Each counter's count over the buckets of ``parts`` (a tiling's segments, each +1, or a signed cover), in
    order: its stored buckets there, masked by its latest clear, each counted with its part's sign. Two store
    calls for the whole batch (every counter's runs of buckets, then the clears: see the module doc).

    ``known`` (per counter): stored values of some of its buckets the caller already holds, by ``(granularity,
    start)`` (0 for a bucket known not to exist); only the others are read, as runs of consecutive buckets (a run
    without known buckets is one range, however long). Known values are masked and signed like read ones, but a
    known non-zero bucket holding the clear is read again (a third call, only then): it was read before the clear,
    without the boundary that tells whether it predates it. ``rows`` counts the buckets read and the clears found."""
    if not counters:
        return []
    mines: Sequence[Mapping[tuple[Granularity, int], int]] = known if known is not None else [{}] * len(counters)
    ranges, owners = _unknown_runs(counters, parts, mines)
    got: list[list[_Counted]] = [[] for _ in counters]
    rows = [0] * len(counters)
    await _read_into(buckets, ns, ranges, owners, got, rows)
    clears = await buckets.clears(ns.name, counters)  # after the buckets: see the module doc
    signs = {(seg.granularity, start): sign for sign, seg in parts
             for start in range(seg.start_us, seg.end_us, seg.granularity.width_us)} if known is not None else {}
    again: list[tuple[str, Granularity, int, int]] = []
    again_owners: list[tuple[int, int]] = []
    for i, mine in enumerate(mines):
        clear = clears.get(counters[i])
        rows[i] += int(clear is not None)
        for (g, start), value in mine.items():
            if value and holds(g, start, clear):
                again.append((counters[i], g, start, start + g.width_us))
                again_owners.append((i, signs[(g, start)]))
            else:
                got[i].append((signs[(g, start)], g, start, value, None))
    await _read_into(buckets, ns, again, again_owners, got, rows)
    out = []
    for i, counted in enumerate(got):
        clear = clears.get(counters[i])
        count = saturate(sum(sign * masked(g, start, value, clear, upto) for sign, g, start, value, upto in counted),
                         (ns.name, counters[i]))  # each bucket is an int64, their sum need not be
        out.append(TiledCount(count, max((upto or 0 for *_rest, upto in counted), default=0), rows[i],
                              any(value in _BOUNDS for _sign, _g, _start, value, _upto in counted)))
    return out


def _unknown_runs(counters: Sequence[str], parts: Sequence[SignedSegment],
                  mines: Sequence[Mapping[tuple[Granularity, int], int]]
                  ) -> tuple[list[tuple[str, Granularity, int, int]], list[tuple[int, int]]]:
    """The ranges of buckets to read (each counter's runs of buckets not known, per part) and their owners
    ``(counter index, sign)``: a run spans the gap between two known buckets, never stepped bucket by bucket."""
    ranges: list[tuple[str, Granularity, int, int]] = []
    owners: list[tuple[int, int]] = []
    for i, counter in enumerate(counters):
        for sign, seg in parts:
            g = seg.granularity
            start = seg.start_us
            for k in sorted(s for kg, s in mines[i] if kg == g and seg.start_us <= s < seg.end_us):
                if start < k:
                    ranges.append((counter, g, start, k))
                    owners.append((i, sign))
                start = k + g.width_us
            if start < seg.end_us:
                ranges.append((counter, g, start, seg.end_us))
                owners.append((i, sign))
    return ranges, owners


async def _read_into(buckets: BucketStore, ns: Namespace, ranges: Sequence[tuple[str, Granularity, int, int]],
                     owners: Sequence[tuple[int, int]], got: list[list[_Counted]], rows: list[int]) -> None:
    """Read ``ranges`` in one call (none if empty) and add their buckets to their owners' ``got`` and ``rows``."""
    found = await buckets.read_buckets_many(ns.name, ranges) if ranges else []
    for (i, sign), (_c, g, _lo, _hi), stored in zip(owners, ranges, found, strict=True):
        got[i].extend((sign, g, start, value, upto) for start, value, upto in stored)
        rows[i] += len(stored)


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
    [rows] = await buckets.read_buckets_many(ns.name, [(counter, g, lo, hi)])
    clear = (await buckets.clears(ns.name, [counter])).get(counter)  # after the buckets: see the module doc
    filled = fill_series(g, lo, hi, rows, clear)
    return Series(g, lo, hi, filled, max((row[2] for row in rows), default=0))


def _floors(ns: Namespace, chain: tuple[Granularity, ...], now_us: int) -> dict[Granularity, int | None]:
    return {g: retained_from(g, now_us, ns.windows.retention_s(g)) for g in chain}
