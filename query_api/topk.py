"""Top-K: the k counters of one dimension filter with the highest counts in a window, exact for the rolled-up counts,
without reading every counter of the namespace.

The window is tiled into buckets as a windowed GetCount tiles it (``query_api.windows.window_tiling``: days, then
hours, then minutes at the edges), then covered with fewer buckets where an edge fills most of a coarser one: the
last hour from 13:10 to 14:11 is the hour 13:00 minus its first ten minutes, plus the hour 14:00 (minus its
minutes after 14:10, which nothing has reached yet), instead of 61 minutes (``sinks.windows.signed_cover``; a
coarser bucket always holds the masked sum of its finer ones). Every bucket of the cover is a *rank list*: the
entries ``(counter, value)`` of the filter's counters that have that bucket, sorted by value
(``BucketStore.read_ranks_many``, maintained with the buckets). A counter's window count is the signed sum of its
entries over the lists (masked by its latest clear), 0 where it has none. Fagin's Threshold Algorithm finds the
top k over such lists:

* **sorted access**: rounds of pages, one batched store call a round: added lists from their top, subtracted ones
  from their bottom (most negative first);
* **random access**: a candidate's exact count over the window: its buckets in the cover, masked by its latest
  clear and signed (``query_api.windows.tiled_counts``, the reading of a windowed GetCount), a batch at a time;
  buckets of lists already read to their end are known without a read (the counter's entry there, or none);
* **threshold**: a counter not seen yet counts at most ``T``, the sum over the open lists of what the next entry
  can add: ``max(value, 0)`` of the last value read in an added list (a clear can mask a negative bucket up to 0),
  ``max(-value, 0)`` in a subtracted one. A list read to its end, or past its last positive contribution, adds
  nothing more. The answer is final once the k-th best exact count beats ``T``, or ties it while losing nothing to
  an unseen name (equal values are read in name order, so an unseen counter at exactly ``T`` sorts after the
  last name read in each added list), or ``T`` is 0.

Candidates are verified lazily, as in Fagin's combined algorithm: a candidate's upper bound is what its entries
read can add plus ``T``'s share of the lists it was not read in; it is verified only while that bound could still
place it in the top k, and sorted access goes on while the lists are above what the k-th seems to count. Only
counters whose count in the window is positive are ranked (ties by name). The counts are rolled-up counts: an
ACCURATE namespace's live events after the last rollup are not included. A stale entry (Cassandra, after racing
writers) costs a verification, never a wrong count: a counter read twice in one list has that bucket read.

A bucket at an int64 bound (a counter's sum saturated there) breaks the cover's premise: a saturated hour is not
the sum of its minutes, so the hour minus the minutes outside the window is not the count inside it (a review: a
counter of 2^63 - 1 in the window ranked at 0). When a list entry or a candidate's bucket read holds a bound, the
search starts again over the tiling itself, which adds buckets and subtracts none, as a windowed GetCount does.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from control_plane import Namespace
from query_api.windows import tiled_counts, window_tiling
from schemas import INT64_MAX, INT64_MIN, MICROS, Dimensions
from schemas.dimensions import dimension_signature
from sinks import BucketStore
from sinks.windows import Granularity, RankPage, SignedSegment, WindowError, retained_from, signed_cover

__all__ = ["MAX_K", "MAX_LISTS", "TopK", "top_k"]

MAX_K = 100
MAX_LISTS = 1500  # buckets covering one window: four years of days with their edges
FIRST_PAGE_MIN = 8  # entries of each list read in the first round, at least (k when larger)
MAX_PAGE = 1000  # entries of one list read in one round, at most
GROW_AFTER = 2  # rounds read with the first page size; then each round's pages double


@dataclass(frozen=True, slots=True)
class TopK:
    """``items``: ``(counter, count)`` of the top counters, count descending, ties by name ascending; the window
    ``[start_us, end_us)`` actually covered; ``upto_us``: the latest boundary among the buckets read (0: every count
    came from rank lists read to their end)."""

    items: tuple[tuple[str, int], ...]
    start_us: int
    end_us: int
    upto_us: int
    lists: int  # rank lists (buckets) the window was covered with
    rounds: int  # rounds of sorted access
    rank_rows: int  # entries read by sorted access
    bucket_rows: int  # rows read by random access (the candidates' buckets and clears)
    candidates: int  # counters whose exact count was read
    marks: tuple[int, ...] = ()  # per item, its rollup_ts read before its count (`top_k`'s rollups_of), else empty

    @property
    def rows_read(self) -> int:
        return self.rank_rows + self.bucket_rows


@dataclass(slots=True)
class _List:
    sign: int  # +1: an added bucket, read from its top; -1: a subtracted one, read from its bottom
    granularity: Granularity
    start_us: int
    last: tuple[int, str] | None = None  # (value, counter) of the last entry read
    open: bool = True
    ended: bool = False  # read to its end: a counter not read in it has no bucket there

    def gain(self, value: int) -> int:
        """The most a bucket of this value adds to a count through this list (masking can make it 0)."""
        return max(self.sign * value, 0)

    @property
    def bound(self) -> int:
        """The most a counter not read in this list yet adds through it."""
        return self.gain(self.last[0]) if self.open and self.last is not None else 0


@dataclass(slots=True)
class _Search:
    k: int
    lists: list[_List]
    seen: dict[str, dict[int, int]] = field(default_factory=dict)  # counter -> list -> its largest gain read there
    values: dict[str, dict[int, int]] = field(default_factory=dict)  # counter -> list -> value read (estimates)
    twice: set[tuple[str, int]] = field(default_factory=set)  # (counter, list) read more than once (stale entries)
    exact: dict[str, int] = field(default_factory=dict)  # verified counts
    marks: dict[str, int] = field(default_factory=dict)  # verified counters' rollup_ts, read before their counts
    upto: int = 0
    saturated: bool = False  # a value read was at an int64 bound (see the module doc)

    def read(self, i: int, entries: Iterable[tuple[str, int]], limit: int) -> int:
        """Take a page of list ``i``; returns how many entries it held."""
        lst, n = self.lists[i], 0
        for counter, value in entries:
            n += 1
            gains = self.seen.setdefault(counter, {})
            if i in gains:
                self.twice.add((counter, i))
            gains[i] = max(lst.gain(value), gains.get(i, 0))
            self.values.setdefault(counter, {})[i] = value
            lst.last = (value, counter)
            if value in (INT64_MAX, INT64_MIN):
                self.saturated = True
        if n < limit:
            lst.open, lst.ended = False, True
        elif lst.last is not None and lst.bound == 0:  # the rest of the list adds nothing
            lst.open = False
        return n

    def known(self, counter: str) -> dict[tuple[Granularity, int], int]:
        """The counter's buckets known from lists read to their end: its one entry there, or 0 without one (a
        counter read twice in a list may have a stale entry there: its bucket is read instead)."""
        mine = self.values.get(counter, {})
        return {(lst.granularity, lst.start_us): mine.get(i, 0) for i, lst in enumerate(self.lists)
                if lst.ended and (counter, i) not in self.twice}

    def to_read(self) -> list[int]:
        """The lists to read next: every open one at first, then those whose bound is at least their mean (the
        ones that can lower the threshold most; the others are read once these have come down)."""
        open_ = [i for i, lst in enumerate(self.lists) if lst.open]
        if open_ and all(self.lists[i].last is not None for i in open_):
            mean = sum(self.lists[i].bound for i in open_) / len(open_)
            return [i for i in open_ if self.lists[i].bound >= mean]
        return open_

    def threshold(self) -> int:
        return sum(lst.bound for lst in self.lists)

    def upper_bound(self, counter: str, threshold: int, bounds: list[int]) -> int:
        """``threshold`` and ``bounds``: the current threshold and each list's bound (computed once per pass)."""
        return threshold + sum(gain - bounds[i] for i, gain in self.seen[counter].items())

    def estimate(self) -> int:
        """What the k-th best seems to count: verified counts, else the values read (masking or unread buckets
        can make a count differ: an estimate to decide when to verify, never a bound)."""
        values = sorted((self.exact[c] if c in self.exact else
                         sum(self.lists[i].sign * v for i, v in self.values[c].items()) for c in self.seen),
                        reverse=True)
        return values[self.k - 1] if len(values) >= self.k else 0

    def ranked(self) -> list[tuple[str, int]]:
        return sorted(((c, n) for c, n in self.exact.items() if n > 0), key=lambda e: (-e[1], e[0]))

    def kth(self) -> tuple[str, int] | None:
        ranked = self.ranked()
        return ranked[self.k - 1] if len(ranked) >= self.k else None

    def to_verify(self) -> list[str]:
        """Unverified candidates that could still make the top k, best bound first."""
        kth = self.kth()
        per_list = [lst.bound for lst in self.lists]
        t = sum(per_list)
        bounds = [(self.upper_bound(c, t, per_list), c) for c in self.seen if c not in self.exact]
        hopeful = [(b, c) for b, c in bounds if b > 0 and (kth is None or b > kth[1] or (b == kth[1] and c < kth[0]))]
        hopeful.sort(key=lambda e: (-e[0], e[1]))
        return [c for _b, c in hopeful]

    def unseen_settled(self) -> bool:
        """No counter not read in any list yet can displace the k-th (see the module doc)."""
        t = self.threshold()
        if t == 0:
            return True
        kth = self.kth()
        if kth is None:
            return False
        name, count = kth
        if count != t:
            return count > t
        # a tie at T: an unseen counter sits at the last value read in every list that still adds, after its last
        # name in the added ones (subtracted lists are read backwards: no such order there)
        adding = [lst for lst in self.lists if lst.bound > 0]
        return all(lst.sign > 0 for lst in adding) and max(lst.last[1] for lst in adding if lst.last) >= name


RollupsOf = Callable[[list[str]], Awaitable[Mapping[str, int]]]  # counter names -> their rollup_ts (0: none)


async def top_k(buckets: BucketStore, ns: Namespace, k: int, start_us: int, end_us: int,
                dimensions: Dimensions = (), *, now_us: int | None = None, rollups_of: RollupsOf | None = None) -> TopK:
    """The ``k`` counters with the highest positive counts in ``[start_us, end_us)`` among the counters with the
    given ``dimensions`` (none: the base counters), exact for the rolled-up counts (see the module doc).
    ``rollups_of``: read right before each batch of candidates' counts, so that each item's ``marks`` entry is a
    rollup_ts its count includes (a rollup writes its buckets before its rollup_ts; read after the counts, a rollup
    landing in between claimed a boundary the counts did not hold: a review).
    WindowError naming ``window`` when the namespace cannot answer the window."""
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be 1..{MAX_K}, got {k}")
    now = time.time_ns() // 1000 if now_us is None else now_us
    tiling = window_tiling(ns, start_us, end_us, now)
    if tiling.buckets > MAX_LISTS:
        raise WindowError(f"the window is tiled into {tiling.buckets} buckets, more than {MAX_LISTS}: ask for a "
                          "shorter window", field="window")
    floors = {Granularity(g): retained_from(Granularity(g), now, ns.windows.retention_s(g))
              for g in ns.windows.granularities}
    # Buckets starting at or after the horizon hold nothing yet: no rollup has reached them (a boundary trails its
    # worker's clock by accept_limit, and an event is at most max_clock_skew ahead; the service's clocks agree within
    # that). They are free to subtract and known empty, never read. The cover adds at most a day's hours and an
    # hour's minutes to the tiling's buckets.
    horizon = now + int((ns.accept_limit_s + ns.max_clock_skew_s) * MICROS)
    parts = signed_cover(tiling, floors, cost_of=lambda _g, start: 0 if start >= horizon else 1)
    top = await _ranked(buckets, ns, k, tuple(parts), horizon, dimension_signature(dimensions), tiling.start_us,
                        tiling.end_us, rollups_of)
    if top is None:  # a bucket at an int64 bound: the tiling, whose buckets are only added
        top = await _ranked(buckets, ns, k, tuple(SignedSegment(1, seg) for seg in tiling.segments), horizon,
                            dimension_signature(dimensions), tiling.start_us, tiling.end_us, rollups_of)
        assert top is not None, "a cover without subtracted buckets is exact whatever their values"
    return top


async def _ranked(buckets: BucketStore, ns: Namespace, k: int, parts: tuple[SignedSegment, ...], horizon: int,
                  signature: str, start_us: int, end_us: int, rollups_of: RollupsOf | None) -> TopK | None:
    """The search over the cover ``parts``; None when it subtracts buckets and a value read was at an int64 bound.

    A candidate's count is read in one store call (`tiled_counts`), with the values its rank lists gave only where
    the cover subtracts nothing a rollup could still write (buckets past the horizon are known empty). A cover that
    subtracts a bucket from its parent (an hour less some of its minutes) must read the two from one snapshot: the
    parent from a rank list read earlier and its child read now, a rollup landing in between, made the old hour
    less the new minute, a count the window never had (a review)."""
    search = _Search(k, [_List(sign, seg.granularity, start) for sign, seg in parts
                         for start in range(seg.start_us, seg.end_us, seg.granularity.width_us)])
    subtracts = any(sign < 0 for sign, _seg in parts)
    for lst in search.lists:
        if lst.start_us >= horizon:
            lst.open, lst.ended = False, True
    # a subtracted bucket before the horizon may change under the read (one past it is known empty)
    one_snapshot = any(lst.sign < 0 and lst.start_us < horizon for lst in search.lists)
    rounds = rank_rows = bucket_rows = 0
    page = max(k, FIRST_PAGE_MIN)
    while True:
        todo = search.to_read()
        if todo:
            # a subtracted list's first page is its smallest entry: if it is not negative, the list adds nothing
            limits = [1 if search.lists[i].sign < 0 and search.lists[i].last is None else page for i in todo]
            found = await buckets.read_ranks_many(ns.name, [
                RankPage(signature, search.lists[i].granularity, search.lists[i].start_us, search.lists[i].last, limit,
                         search.lists[i].sign < 0) for i, limit in zip(todo, limits, strict=True)])
            rounds += 1
            for i, entries, limit in zip(todo, found, limits, strict=True):
                rank_rows += search.read(i, entries, limit)
            if rounds >= GROW_AFTER:
                page = min(page * 2, MAX_PAGE)
            if search.threshold() > search.estimate():
                continue  # keep reading: the lists are still above what the k-th seems to count
        # random access, lazily: the best-bounded candidates, then (once no unread counter can place) every one
        # that still could
        while batch := search.to_verify()[:k]:
            names = [f"{c} {signature}" if signature else c for c in batch]
            marks = await rollups_of(names) if rollups_of is not None else {}
            counts = await tiled_counts(buckets, ns, names, parts,
                                        None if one_snapshot else [search.known(c) for c in batch])
            for counter, name, counted in zip(batch, names, counts, strict=True):
                search.exact[counter] = counted.count
                search.marks[counter] = marks.get(name, 0)
                search.upto = max(search.upto, counted.upto_us)
                search.saturated |= counted.saturated
                bucket_rows += counted.rows
            if not search.unseen_settled():
                break
        if subtracts and search.saturated:
            return None
        if search.unseen_settled() and not search.to_verify():
            break
    items = tuple(search.ranked()[:k])
    return TopK(items, start_us, end_us, search.upto, len(search.lists), rounds, rank_rows, bucket_rows,
                len(search.exact), tuple(search.marks[c] for c, _n in items) if rollups_of is not None else ())
