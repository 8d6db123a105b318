"""Unique counts as HyperLogLog sketches (DESIGN invariant 7): values and pure functions, no I/O.

A UNIQUE namespace counts the distinct ``item`` values of its writes per counter, per time bucket and per dimension
combination. Each bucket keeps an HLL sketch (Apache DataSketches, compact ``HLL_4``, ``lg_k`` from the control
plane) of the items of its events instead of a sum: a minute's sketch holds the items of the minute's events after
the latest clear inside it, an hour's is the union of its minutes, a day's the union of its hours. A union is
idempotent (adding an item twice, or merging a sketch into one that already holds it, changes nothing), so retries,
replays, re-run rollups and recounts cannot move an estimate, and sketches merge across partitions, windows and
workers. The rollup side (``agents.sketches``), the read side (``query_api.unique``) and both storage backends
share what is here.

* ``sketch_of(items, lg_k)``: the compact serialization of a sketch of some items.
* ``union(sketches, lg_k)`` / ``Union``: merge serialized sketches (and loose items); ``estimate`` of the result.
* ``Estimate``: the estimate and its bounds at ``BOUND_STD_DEVS`` standard deviations (2: about 95%).
* ``bucket_items_of``: the per-bucket items of events, as ``EventStore.bucket_items_many`` reports them.

Items are hashed as their UTF-8 bytes, so every process, language or backend that feeds a sketch the same item
string agrees. Events without an item (``event_item_key`` "", e.g. written before a namespace became UNIQUE) are
not items and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from datasketches import hll_sketch, hll_union, tgt_hll_type

from sinks.windows import Granularity

__all__ = [
    "BOUND_STD_DEVS",
    "BucketItems",
    "Estimate",
    "SketchRow",
    "StoredSketch",
    "Union",
    "bucket_items_of",
    "combine_items",
    "estimate",
    "sketch_of",
    "union",
]

BOUND_STD_DEVS = 2  # the bounds answered: 2 standard deviations, about 95% confidence

# (counter, granularity, start_us, sketch, computed_upto_us): one bucket's sketch to write, recomputed at boundary
# computed_upto_us (forward-only, like a bucket: it replaces a stored sketch only if computed at a later boundary).
SketchRow = tuple[str, Granularity, int, bytes, int]
# (start_us, sketch, computed_upto_us): a stored sketch as read back.
StoredSketch = tuple[int, bytes, int]
# (bucket_start_us, the distinct items of the adds strictly after the latest clear in the bucket, that clear or
# None, events): what ``EventStore.bucket_items_many`` reports per bucket holding events.
BucketItems = tuple[int, frozenset[str], int | None, int]

_HLL_4 = tgt_hll_type.HLL_4


class Estimate(NamedTuple):
    """A distinct count: the estimate and its lower and upper bounds (``BOUND_STD_DEVS`` standard deviations)."""

    estimate: float
    lower_bound: float
    upper_bound: float

    @property
    def rounded(self) -> int:
        """The estimate rounded to a count."""
        return round(self.estimate)


class Union:
    """An HLL union being built: add serialized sketches and loose items, then ``sketch()`` or ``estimate()``.

    ``lg_k`` is the largest resolution kept; merging a sketch of a lower lg_k lowers the result's to it."""

    __slots__ = ("_loose", "_union", "lg_k")

    def __init__(self, lg_k: int) -> None:
        self.lg_k = lg_k
        self._union = hll_union(lg_k)
        self._loose: hll_sketch | None = None

    def add_sketch(self, serialized: bytes) -> None:
        if serialized:
            self._union.update(hll_sketch.deserialize(serialized))

    def add_items(self, items: Iterable[str]) -> None:
        if self._loose is None:
            self._loose = hll_sketch(self.lg_k, _HLL_4)
        update = self._loose.update
        for item in items:
            if item:
                update(item)

    def result(self) -> hll_sketch:
        if self._loose is not None:
            self._union.update(self._loose)
            self._loose = None
        return self._union.get_result(_HLL_4)

    def sketch(self) -> bytes:
        """The union as a compact serialized sketch."""
        return bytes(self.result().serialize_compact())

    def estimate(self) -> Estimate:
        return estimate(self.result())


def sketch_of(items: Iterable[str], lg_k: int) -> bytes:
    """A compact ``HLL_4`` sketch of ``items`` (empty strings left out), serialized."""
    sketch = hll_sketch(lg_k, _HLL_4)
    update = sketch.update
    for item in items:
        if item:
            update(item)
    return bytes(sketch.serialize_compact())


def union(sketches: Iterable[bytes], lg_k: int) -> Union:
    """The union of serialized sketches (empty byte strings are no sketch)."""
    u = Union(lg_k)
    for s in sketches:
        u.add_sketch(s)
    return u


def estimate(sketch: hll_sketch | bytes) -> Estimate:
    """The estimate of a sketch (or of a serialized one) with its bounds at ``BOUND_STD_DEVS``."""
    s = hll_sketch.deserialize(sketch) if isinstance(sketch, bytes | bytearray) else sketch
    if s.is_empty():
        return Estimate(0.0, 0.0, 0.0)
    return Estimate(s.get_estimate(), s.get_lower_bound(BOUND_STD_DEVS), s.get_upper_bound(BOUND_STD_DEVS))


def bucket_items_of(events: Iterable[tuple[int, str, bool]], width_us: int) -> list[BucketItems]:
    """The items of ``(event_time, item, is_clear)`` events (any order) per bucket of ``width_us`` (aligned to the
    epoch), ascending by bucket start: per bucket the distinct items of the adds strictly after the bucket's latest
    clear (an add at the clear's own instant is erased by it, as in the sums), that clear, and every event."""
    per: dict[int, list[tuple[int, str, bool]]] = {}
    for t, item, is_clear in events:
        per.setdefault(t - t % width_us, []).append((t, item, is_clear))
    out: list[BucketItems] = []
    for start in sorted(per):
        rows = per[start]
        clears = [t for t, _i, c in rows if c]
        last = max(clears) if clears else None
        items = frozenset(i for t, i, c in rows if not c and i and (last is None or t > last))
        out.append((start, items, last, len(rows)))
    return out


def combine_items(earlier: BucketItems, later: BucketItems) -> BucketItems:
    """One bucket's items from two consecutive, disjoint time ranges of it (``earlier`` entirely before
    ``later``): a clear in the later part erases the earlier part."""
    start, items_a, clear_a, n_a = earlier
    _, items_b, clear_b, n_b = later
    if clear_b is not None:
        return start, items_b, clear_b, n_a + n_b
    return start, items_a | items_b, clear_a, n_a + n_b
