"""Time buckets of windowed counts (DESIGN invariant 7): granularities, alignment, clear masking, range tiling.

Pure values and functions, no I/O: the rollup side (``agents.windows``), the read side (``query_api.windows``)
and both storage backends share them, so every process cuts time the same way.

* A bucket of granularity ``g`` covers ``[start, start + g.width_us)``, ``start`` a multiple of the width
  (aligned to the UTC epoch). Times are epoch microseconds.
* A minute holds the sum of the deltas of its events; an hour the sum of its minutes; a day of its hours.
* Clears are applied by **masking at read time**: with a counter's latest clear at ``c``, a bucket whose end is
  ``<= c`` reads 0, and the bucket holding ``c`` was computed from the adds strictly after ``c`` only. Windows
  ending at or before a clear then read 0 without rewriting old buckets, and the buckets since the clear sum to
  the counter's total. A bucket computed up to a boundary before ``c`` holds only events before it and reads 0
  too: the worker bumps the clear before it rewrites the buckets, and a reader in between sees the old ones.
* Storage partitions buckets by ``slice``: ``start // g.slice_us``, so a partition never holds more than
  1440 minutes, 768 hours or 366 days of one counter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from itertools import pairwise
from typing import NamedTuple

from control_plane.durations import format_duration
from schemas.validation import micros_iso

__all__ = [
    "CHAIN",
    "BucketRange",
    "BucketRow",
    "BucketSum",
    "Granularity",
    "RankEntry",
    "RankPage",
    "Segment",
    "SignedSegment",
    "StoredBucket",
    "Tiling",
    "TooManyBuckets",
    "WindowError",
    "align_down",
    "align_up",
    "bucket_sums_of",
    "combine_sums",
    "cover",
    "expiry_cutoff",
    "fill_series",
    "holds",
    "is_masked",
    "masked",
    "retained_from",
    "series_range",
    "signed_cover",
    "slice_bounds",
    "tile",
]

_MINUTE_US = 60 * 1_000_000


class Granularity(StrEnum):
    """A bucket width. The values are the control plane's names (``ns.windows.granularities``)."""

    MINUTE = "minute"
    HOUR = "hour"
    DAY = "day"

    @property
    def width_us(self) -> int:
        return _WIDTH_US[self]

    @property
    def slice_us(self) -> int:
        """Width of a storage partition of this granularity (a multiple of the bucket width)."""
        return _SLICE_US[self]

    @property
    def child(self) -> Granularity | None:
        """The finer granularity this one is summed from (None for minutes: they come from events)."""
        i = CHAIN.index(self)
        return CHAIN[i - 1] if i else None

    @property
    def parent(self) -> Granularity | None:
        i = CHAIN.index(self)
        return CHAIN[i + 1] if i + 1 < len(CHAIN) else None


_WIDTH_US = {Granularity.MINUTE: _MINUTE_US, Granularity.HOUR: 60 * _MINUTE_US, Granularity.DAY: 1440 * _MINUTE_US}
_SLICE_US = {Granularity.MINUTE: 1440 * _MINUTE_US,  # a day of minutes
             Granularity.HOUR: 32 * 1440 * _MINUTE_US,  # 32 days of hours
             Granularity.DAY: 366 * 1440 * _MINUTE_US}  # a year of days
CHAIN: tuple[Granularity, ...] = (Granularity.MINUTE, Granularity.HOUR, Granularity.DAY)

# (counter, granularity, start_us, value, computed_upto_us): one bucket to write, recomputed at boundary
# computed_upto_us (forward-only: it replaces a stored bucket only if computed at a strictly later boundary).
BucketRow = tuple[str, Granularity, int, int, int]
# (start_us, value, computed_upto_us): a stored bucket as read back.
StoredBucket = tuple[int, int, int]
# (counter, granularity, from_start_us, to_start_us): the buckets whose start lies in [from, to).
BucketRange = tuple[str, Granularity, int, int]
# (base counter, stored value): an entry of a rank list, as read back.
RankEntry = tuple[str, int]
# (bucket_start_us, sum of adds strictly after the latest clear in the bucket, that clear or None, events):
# what ``EventStore.bucket_sums_many`` reports per bucket holding events.
BucketSum = tuple[int, int, int | None, int]


class RankPage(NamedTuple):
    """A page of the rank list of the buckets ``(granularity, start_us)`` of the counters with dimension signature
    ``signature`` ("" for base counters, "country=BR" for their `country=BR` combinations:
    ``schemas.dimensions.dimension_signature``): up to ``limit`` entries after ``after``, the ``(value, base
    counter)`` of the previous page's last entry (None: from the start). The list's order is value descending, then
    name ascending; ``ascending`` reads it from its end (value ascending, then name descending). See
    ``BucketStore.read_ranks_many``; a plain 5-tuple is a descending page."""

    signature: str
    granularity: Granularity
    start_us: int
    after: tuple[int, str] | None
    limit: int
    ascending: bool = False


class WindowError(ValueError):
    """A window or series that cannot be answered (bad range, too many buckets, nothing retained); ``field``
    names the request field at fault when one is (an API answers 422 with it)."""

    def __init__(self, reason: str, *, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


class TooManyBuckets(WindowError):
    """A series longer than the per-call limit (the caller should page, or ask for a coarser granularity)."""

    def __init__(self, requested: int, limit: int, granularity: Granularity) -> None:
        coarser = f" or a coarser granularity than {granularity}" if granularity.parent is not None else ""
        super().__init__(f"the range holds {requested} {granularity} buckets, more than the limit of {limit} per "
                         f"call: ask for a shorter range{coarser}", field="end")
        self.requested = requested
        self.limit = limit


def align_down(t_us: int, g: Granularity) -> int:
    """Start of the bucket holding ``t_us``."""
    return t_us - t_us % g.width_us


def align_up(t_us: int, g: Granularity) -> int:
    """The first bucket start at or after ``t_us``."""
    return -(-t_us // g.width_us) * g.width_us


def slice_bounds(g: Granularity, slice_no: int) -> tuple[int, int]:
    """``[start, end)`` of a storage slice."""
    return slice_no * g.slice_us, (slice_no + 1) * g.slice_us


def is_masked(g: Granularity, start_us: int, last_clear_us: int | None, computed_upto_us: int | None = None) -> bool:
    """Whether a clear at ``last_clear_us`` erased the whole bucket: it ended at or before the clear, or (given its
    ``computed_upto_us``) it was computed up to a boundary before the clear, so it holds only events the clear
    erased (a bucket read between the worker's clear bump and its rewrite)."""
    if last_clear_us is None:
        return False
    return start_us + g.width_us <= last_clear_us or (computed_upto_us is not None and computed_upto_us < last_clear_us)


def masked(g: Granularity, start_us: int, value: int, last_clear_us: int | None,
           computed_upto_us: int | None = None) -> int:
    """A stored bucket's value as read after the counter's latest clear (see :func:`is_masked`)."""
    return 0 if is_masked(g, start_us, last_clear_us, computed_upto_us) else value


def holds(g: Granularity, start_us: int, t_us: int | None) -> bool:
    """Whether the bucket holds the time ``t_us`` (None: no time)."""
    return t_us is not None and start_us <= t_us < start_us + g.width_us


def retained_from(g: Granularity, now_us: int, retention_s: float | None) -> int | None:
    """Start of the oldest bucket still within retention at ``now_us`` (its end is after ``now - retention``);
    None when the granularity is kept forever."""
    if retention_s is None:
        return None
    return align_down(now_us - int(retention_s * 1_000_000), g)


def expiry_cutoff(g: Granularity, now_us: int, retention_s: float | None) -> int | None:
    """The ``before_us`` for ``BucketStore.drop_expired`` at ``now_us``: ``now - retention`` rounded down to a
    storage slice, so retention drops whole partitions (never a per-counter range delete on Cassandra) and a
    bucket lives at most one slice past its retention (reads never use it: see :func:`retained_from`).
    None when the granularity is kept forever."""
    if retention_s is None:
        return None
    cutoff = now_us - int(retention_s * 1_000_000)
    return cutoff - cutoff % g.slice_us


# -- bucket sums from events ---------------------------------------------------------------------------

def bucket_sums_of(events: Iterable[tuple[int, int, bool]], width_us: int) -> list[BucketSum]:
    """Bucket sums of ``(event_time, delta, is_clear)`` events (any order), ascending by bucket start.

    Per bucket: the adds strictly after the bucket's latest clear count (an add at the clear's own instant is
    erased by it, as in the total's aggregation), the clear is reported, every event is counted.
    """
    per: dict[int, list[tuple[int, int, bool]]] = {}
    for t, delta, is_clear in events:
        per.setdefault(t - t % width_us, []).append((t, delta, is_clear))
    out: list[BucketSum] = []
    for start in sorted(per):
        rows = per[start]
        clears = [t for t, _d, c in rows if c]
        last = max(clears) if clears else None
        total = sum(d for t, d, c in rows if not c and (last is None or t > last))
        out.append((start, total, last, len(rows)))
    return out


def combine_sums(earlier: BucketSum, later: BucketSum) -> BucketSum:
    """One bucket's sums from two consecutive, disjoint time ranges of it (``earlier`` entirely before
    ``later``): a clear in the later part erases the earlier part."""
    start, sum_a, clear_a, n_a = earlier
    _, sum_b, clear_b, n_b = later
    if clear_b is not None:
        return start, sum_b, clear_b, n_a + n_b
    return start, sum_a + sum_b, clear_a, n_a + n_b


# -- tiling a range with the coarsest buckets ---------------------------------------------------------

class Segment(NamedTuple):
    """A run of consecutive buckets of one granularity: starts in ``[start_us, end_us)``."""

    granularity: Granularity
    start_us: int
    end_us: int

    @property
    def buckets(self) -> int:
        return (self.end_us - self.start_us) // self.granularity.width_us


class Tiling(NamedTuple):
    """How a window is answered: the aligned range ``[start_us, end_us)`` it actually covers, cut into runs of
    the coarsest buckets that fit (finer ones only at the edges), in time order."""

    start_us: int
    end_us: int
    segments: tuple[Segment, ...]

    @property
    def buckets(self) -> int:
        return sum(s.buckets for s in self.segments)


def tile(start_us: int, end_us: int, granularities: Sequence[Granularity],
         floors: Mapping[Granularity, int | None]) -> Tiling:
    """Cover ``[start_us, end_us)`` with the coarsest buckets of ``granularities`` (days, then hours, then
    minutes at the edges), reading only retained buckets.

    ``floors[g]`` is the start of the oldest retained ``g`` bucket (None: kept forever; see
    :func:`retained_from`); coarser granularities must be retained at least as long as finer ones (the control
    plane checks it). Each edge is aligned outwards to the finest granularity that keeps the tiling within
    retention there: a start older than the minutes' retention rounds to its hour, and so on; an end whose
    last hours fell out of retention rounds up to its day. A start older than every retention is clamped to
    the oldest retained bucket. The result says which range it covers.
    """
    chain = tuple(g for g in CHAIN if g in granularities)
    if not chain:
        raise WindowError("this namespace keeps no time windows")
    if end_us <= start_us:
        raise WindowError(f"the window is empty: end ({micros_iso(end_us)}) must be after start "
                          f"({micros_iso(start_us)})")
    if not all(_floor_le(floors.get(coarse), floors.get(fine)) for fine, coarse in pairwise(chain)):
        raise ValueError(f"coarser buckets must be retained at least as long as finer ones: {dict(floors)}")
    # The start: buckets after a retained one are retained too (coarser ones are kept longer), so the finest
    # granularity retained at the start is safe whatever follows.
    low = next((g for g in chain if _kept(align_down(start_us, g), g, floors)), None)
    lo = align_down(start_us, low) if low is not None else floors[chain[-1]]
    assert lo is not None  # low is None only when every granularity, the coarsest too, has a floor
    # The end: the finest rounding whose tail of finer buckets is still retained (the coarsest always is).
    for g in chain:
        hi = align_up(end_us, g)
        if hi <= lo or not _kept(hi - g.width_us, g, floors):
            continue
        segments = cover(lo, hi, chain)
        if all(_kept(seg.start_us, seg.granularity, floors) for seg in segments):
            return Tiling(lo, hi, segments)
    oldest = ", ".join(f"{g}s {_since(floors[g])}" for g in chain)
    raise WindowError(f"the window ends before the oldest retained bucket ({oldest})")


def _since(floor: int | None) -> str:
    """A retention floor as a reader would write it (None: the granularity is kept forever)."""
    return "kept forever" if floor is None else f"since {micros_iso(floor)}"


class SignedSegment(NamedTuple):
    """A run of buckets counted with ``sign`` (+1 or -1) in a signed cover."""

    sign: int
    segment: Segment


def signed_cover(tiling: Tiling, floors: Mapping[Granularity, int | None], *,
                 cost_of: Callable[[Granularity, int], int] | None = None) -> tuple[SignedSegment, ...]:
    """The fewest buckets whose signed sum covers ``tiling``'s range exactly: an edge that fills most of a coarser
    bucket is that bucket minus the finer buckets outside the range (the last hour from 13:10 to 14:11 is the
    hour 13:00 minus ten minutes, plus the hour 14:00, rather than 61 minutes). The counts match because a coarser
    bucket always holds the masked sum of its finer ones (invariant 7; a clear inside it recomputes it).

    Only retained buckets of the granularities ``floors`` lists are used (``floors`` as for :func:`tile`: the
    namespace's granularities, each with its oldest retained bucket or None); ``cost_of(g, start)`` weighs a
    bucket (default 1; a caller may make buckets that cannot hold anything yet cheaper). Never worse than the
    tiling itself, which is one of the candidates. Segments come in time order per sign, positive ones first."""
    chain = tuple(g for g in CHAIN if g in floors)
    if not chain:
        raise ValueError("signed_cover needs the floors of the namespace's granularities")
    weigh = cost_of or (lambda _g, _s: 1)
    inf = float("inf")

    def usable(g: Granularity, start: int) -> bool:
        return _kept(start, g, floors)

    def run(g: Granularity, lo: int, hi: int) -> tuple[float, list[tuple[int, Granularity, int]]]:
        starts = range(lo, hi, g.width_us)
        if any(not usable(g, s) for s in starts):
            return inf, []
        return float(sum(weigh(g, s) for s in starts)), [(1, g, s) for s in starts]

    def neg(parts: list[tuple[int, Granularity, int]]) -> list[tuple[int, Granularity, int]]:
        return [(-sign, g, s) for sign, g, s in parts]

    def best(lo: int, hi: int, level: int) -> tuple[float, list[tuple[int, Granularity, int]]]:
        """[lo, hi) with chain[:level + 1] (lo, hi aligned to chain[0])."""
        if lo >= hi:
            return 0.0, []
        g = chain[level]
        if level == 0:
            return run(g, lo, hi)
        w = g.width_us
        a, b = align_up(lo, g), align_down(hi, g)
        options = []
        if a > b:  # inside one bucket of g: finer buckets, or the bucket minus its two outer parts
            options.append(best(lo, hi, level - 1))
            if usable(g, b):
                left, right = best(b, lo, level - 1), best(hi, a, level - 1)
                options.append((weigh(g, b) + left[0] + right[0], [(1, g, b), *neg(left[1]), *neg(right[1])]))
            return min(options, key=lambda o: o[0])
        middle = run(g, a, b)
        left_in = best(lo, a, level - 1)
        left = left_in
        if lo < a and usable(g, a - w):
            out = best(a - w, lo, level - 1)
            if weigh(g, a - w) + out[0] < left_in[0]:
                left = (weigh(g, a - w) + out[0], [(1, g, a - w), *neg(out[1])])
        right_in = best(b, hi, level - 1)
        right = right_in
        if b < hi and usable(g, b):
            out = best(hi, b + w, level - 1)
            if weigh(g, b) + out[0] < right_in[0]:
                right = (weigh(g, b) + out[0], [(1, g, b), *neg(out[1])])
        return left[0] + middle[0] + right[0], [*left[1], *middle[1], *right[1]]

    cost, parts = best(tiling.start_us, tiling.end_us, len(chain) - 1)
    plain = [SignedSegment(1, seg) for seg in tiling.segments]
    if cost == inf or cost >= sum(weigh(s.granularity, t) for s in tiling.segments
                                  for t in range(s.start_us, s.end_us, s.granularity.width_us)):
        return tuple(plain)
    out: list[SignedSegment] = []
    for sign, g, start in sorted(parts, key=lambda p: (-p[0], p[2], p[1].width_us)):
        last = out[-1] if out else None
        if last is not None and last.sign == sign and last.segment.granularity == g and last.segment.end_us == start:
            out[-1] = SignedSegment(sign, Segment(g, last.segment.start_us, start + g.width_us))
        else:
            out.append(SignedSegment(sign, Segment(g, start, start + g.width_us)))
    return tuple(out)


def cover(lo: int, hi: int, chain: Sequence[Granularity]) -> tuple[Segment, ...]:
    """Segments covering ``[lo, hi)`` exactly, greedily with the coarsest granularity of ``chain`` (ordered
    finest first) that fits a whole bucket, recursing into the finer edges. ``lo`` and ``hi`` must be aligned
    to some granularity of ``chain``."""
    chain = tuple(chain)
    for i in range(len(chain) - 1, -1, -1):
        g = chain[i]
        a, b = align_up(lo, g), align_down(hi, g)
        if a < b:
            return (*cover(lo, a, chain[:i]), Segment(g, a, b), *cover(b, hi, chain[:i]))
    if lo != hi:
        raise ValueError(f"[{lo}, {hi}) is not aligned to any of {chain}")
    return ()


def _floor_le(coarse: int | None, fine: int | None) -> bool:
    return coarse is None or (fine is not None and coarse <= fine)


def _kept(start_us: int, g: Granularity, floors: Mapping[Granularity, int | None]) -> bool:
    floor = floors.get(g)
    return floor is None or start_us >= floor


# -- series: one granularity's buckets over a range ---------------------------------------------------

def series_range(g: Granularity, start_us: int, end_us: int, *, now_us: int, retention_s: float | None,
                 max_buckets: int | None = None) -> tuple[int, int]:
    """The ``[lo, hi)`` bucket starts of ``g``'s series over ``[start_us, end_us)``: edges aligned outwards, a
    start older than the granularity's retention clamped to its oldest retained bucket (see
    :func:`retained_from`). ``WindowError`` for an empty range or one ending before that bucket;
    ``TooManyBuckets`` beyond ``max_buckets`` (None: no limit)."""
    if end_us <= start_us:  # a start in the future is at fault even when end was given (or defaulted to now)
        if start_us > now_us:
            raise WindowError(f"must not be in the future (now is {micros_iso(now_us)}) unless end is after it",
                              field="start")
        raise WindowError(f"must be after start ({micros_iso(start_us)})", field="end")
    lo, hi = align_down(start_us, g), align_up(end_us, g)
    oldest = retained_from(g, now_us, retention_s)
    if oldest is not None and retention_s is not None and lo < oldest:
        if hi <= oldest:
            raise WindowError(f"the range ends before the oldest retained {g} bucket ({micros_iso(oldest)}): {g} "
                              f"buckets are kept {format_duration(retention_s)}", field="end")
        lo = oldest
    if max_buckets is not None and (hi - lo) // g.width_us > max_buckets:
        raise TooManyBuckets((hi - lo) // g.width_us, max_buckets, g)
    return lo, hi


def fill_series(g: Granularity, lo: int, hi: int, rows: Iterable[StoredBucket],
                last_clear_us: int | None) -> tuple[tuple[int, int], ...]:
    """``(start_us, count)`` of every ``g`` bucket starting in ``[lo, hi)`` (aligned), ascending: the stored
    ``rows`` (as ``BucketStore.read_buckets_many`` returns them) masked by the counter's latest clear (read after
    them: see :func:`is_masked`), and 0 where nothing is stored."""
    stored = {start: masked(g, start, value, last_clear_us, upto) for start, value, upto in rows}
    return tuple((start, stored.get(start, 0)) for start in range(lo, hi, g.width_us))
