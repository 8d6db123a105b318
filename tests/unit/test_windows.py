"""sinks.windows: granularities, alignment, clear masking, bucket sums and the tiling of a range (pure)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from schemas.validation import micros_iso
from sinks.windows import (
    CHAIN,
    Granularity,
    Segment,
    WindowError,
    align_down,
    align_up,
    bucket_sums_of,
    combine_sums,
    cover,
    expiry_cutoff,
    is_masked,
    masked,
    retained_from,
    signed_cover,
    slice_bounds,
    tile,
)

S = 1_000_000
MIN, HOUR, DAY = 60 * S, 3600 * S, 86400 * S
MINUTE_G, HOUR_G, DAY_G = Granularity.MINUTE, Granularity.HOUR, Granularity.DAY
NOW = 1_750_000_123_456_789  # an arbitrary instant, aligned to nothing
DEFAULT = {MINUTE_G: 48 * 3600.0, HOUR_G: 90 * 86400.0, DAY_G: None}


def floors(now: int = NOW, retention: dict[Granularity, float | None] | None = None) -> dict[Granularity, int | None]:
    return {g: retained_from(g, now, r) for g, r in (retention or DEFAULT).items()}


# -- granularities and alignment -------------------------------------------------------------------


def test_granularities_chain_widths_and_slices():
    assert CHAIN == (MINUTE_G, HOUR_G, DAY_G) and [g.value for g in CHAIN] == ["minute", "hour", "day"]
    assert (MINUTE_G.width_us, HOUR_G.width_us, DAY_G.width_us) == (MIN, HOUR, DAY)
    assert (MINUTE_G.child, MINUTE_G.parent, HOUR_G.child, DAY_G.parent) == (None, HOUR_G, MINUTE_G, None)
    for g in CHAIN:
        assert g.slice_us % g.width_us == 0 and g.slice_us // g.width_us <= 1440  # bounded partitions
        if g.parent is not None:
            assert g.parent.width_us % g.width_us == 0
    assert Granularity("hour") is HOUR_G and HOUR_G == "hour"  # the control plane's names
    assert slice_bounds(MINUTE_G, 3) == (3 * DAY, 4 * DAY)


@given(st.integers(min_value=-(10**17), max_value=10**17), st.sampled_from(CHAIN))
def test_alignment(t: int, g: Granularity):
    lo, hi = align_down(t, g), align_up(t, g)
    assert lo % g.width_us == 0 and hi % g.width_us == 0
    assert lo <= t <= hi and t - lo < g.width_us and hi - t < g.width_us
    assert (lo == hi) == (t % g.width_us == 0)


def test_masking_erases_buckets_that_ended_at_or_before_the_clear():
    start = 100 * MIN
    assert masked(MINUTE_G, start, 7, None) == 7
    assert masked(MINUTE_G, start, 7, start + MIN) == 0  # ended exactly at the clear
    assert masked(MINUTE_G, start, 7, start + MIN - 1) == 7  # holds the clear: stores what follows it
    assert masked(MINUTE_G, start, 7, start) == 7
    assert is_masked(HOUR_G, 0, HOUR) and not is_masked(HOUR_G, 0, HOUR - 1)


def test_retained_from_is_the_oldest_bucket_ending_after_now_minus_retention():
    oldest = retained_from(MINUTE_G, NOW, 3600.0)
    assert oldest is not None and oldest % MIN == 0
    assert oldest + MIN > NOW - HOUR >= oldest
    assert retained_from(DAY_G, NOW, None) is None


def test_expiry_cutoff_drops_whole_slices_never_a_retained_bucket():
    for g, retention in ((MINUTE_G, 48 * 3600.0), (HOUR_G, 90 * 86400.0), (DAY_G, 400 * 86400.0)):
        cutoff = expiry_cutoff(g, NOW, retention)
        assert cutoff is not None and cutoff % g.slice_us == 0
        oldest_kept = retained_from(g, NOW, retention)
        assert oldest_kept is not None and cutoff < oldest_kept + g.width_us  # what reads use is never dropped
        assert NOW - int(retention * S) - cutoff < g.slice_us  # at most a slice late
    assert expiry_cutoff(DAY_G, NOW, None) is None


# -- bucket sums ---------------------------------------------------------------------------------------


def test_bucket_sums_of_honour_the_latest_clear_per_bucket():
    events = [(10, 5, False), (20, 0, True), (20, 100, False), (30, 2, False),  # bucket 0: clear at 20
              (65, 1, False), (70, 0, True), (61, 0, True), (75, 4, False),  # bucket 60: latest clear 70
              (130, 3, False)]
    assert bucket_sums_of(reversed(events), 60) == [(0, 2, 20, 4), (60, 4, 70, 4), (120, 3, None, 1)]
    assert bucket_sums_of([], 60) == []
    assert bucket_sums_of([(-1, 3, False)], 60) == [(-60, 3, None, 1)]  # floor, not truncation


events_in_a_bucket = st.lists(st.tuples(st.integers(0, 59), st.integers(-9, 9), st.booleans()), max_size=12)


@given(events_in_a_bucket, st.integers(0, 60))
def test_combining_two_parts_of_a_bucket_equals_summing_it_whole(events, split):
    earlier = [e for e in events if e[0] < split]
    later = [e for e in events if e[0] >= split]
    assume(earlier and later)
    [whole] = bucket_sums_of(events, 60)
    [a], [b] = bucket_sums_of(earlier, 60), bucket_sums_of(later, 60)
    assert combine_sums(a, b) == whole


# -- tiling ----------------------------------------------------------------------------------------------


def test_a_30_day_window_reads_tens_of_buckets_not_43200():
    start = NOW - 30 * DAY  # older than the minutes' 48 h: the start rounds to its hour
    tiling = tile(start, NOW, CHAIN, floors())
    assert (tiling.start_us, tiling.end_us) == (align_down(start, HOUR_G), align_up(NOW, MINUTE_G))
    assert [s.granularity for s in tiling.segments] == [HOUR_G, DAY_G, HOUR_G, MINUTE_G]
    assert tiling.buckets <= 23 + 30 + 23 + 59 and tiling.buckets < 150
    assert sum(s.buckets for s in tiling.segments if s.granularity is DAY_G) == 29
    # with minutes kept long enough, both edges are exact to the minute, still under 200 buckets
    tiling = tile(start, NOW, CHAIN, floors(retention={MINUTE_G: 60 * 86400.0, HOUR_G: None, DAY_G: None}))
    assert (tiling.start_us, tiling.end_us) == (align_down(start, MINUTE_G), align_up(NOW, MINUTE_G))
    assert [s.granularity for s in tiling.segments] == [MINUTE_G, HOUR_G, DAY_G, HOUR_G, MINUTE_G]
    assert tiling.buckets < 200


def test_an_end_whose_last_hours_left_retention_rounds_up_to_its_day():
    end = align_down(NOW - 90 * DAY, HOUR_G) + 2 * HOUR  # its own hour is kept, the hours before it are not
    tiling = tile(end - 40 * DAY, end, CHAIN, floors())
    assert tiling.end_us == align_up(end, DAY_G) and {s.granularity for s in tiling.segments} == {DAY_G}


def test_edges_older_than_a_granularity_retention_round_to_the_next_one():
    start = NOW - 10 * DAY  # minutes are kept 48 h: the start rounds to its hour
    tiling = tile(start, NOW, CHAIN, floors())
    assert tiling.start_us == align_down(start, HOUR_G) and tiling.segments[0].granularity is HOUR_G
    start = NOW - 200 * DAY  # hours are kept 90 days: the start rounds to its day
    tiling = tile(start, NOW - 100 * DAY, CHAIN, floors())
    assert (tiling.start_us, tiling.end_us) == (align_down(start, DAY_G), align_up(NOW - 100 * DAY, DAY_G))
    assert tiling.segments == (Segment(DAY_G, tiling.start_us, tiling.end_us),)


def test_a_start_older_than_every_retention_is_clamped_and_a_window_wholly_older_refused():
    kept = floors(retention={MINUTE_G: 3 * 3600.0, HOUR_G: 10 * 86400.0})
    tiling = tile(NOW - 30 * DAY, NOW, [MINUTE_G, HOUR_G], kept)
    assert tiling.start_us == kept[HOUR_G] and tiling.end_us == align_up(NOW, MINUTE_G)
    with pytest.raises(WindowError, match="before the oldest retained bucket") as info:
        tile(NOW - 30 * DAY, NOW - 20 * DAY, [MINUTE_G, HOUR_G], kept)
    # the floors are told as times a reader can compare with their window, not as epoch microseconds
    assert f"hours since {micros_iso(kept[HOUR_G])}" in str(info.value) and str(kept[HOUR_G]) not in str(info.value)
    with pytest.raises(WindowError, match="empty") as info:
        tile(NOW, NOW, CHAIN, floors())
    assert str(info.value).count(micros_iso(NOW)) == 2 and str(NOW) not in str(info.value)


@pytest.mark.parametrize(("start", "end", "chain", "reason"), [
    (NOW, NOW, CHAIN, "empty"),
    (NOW, NOW - 1, CHAIN, "empty"),
    (NOW - DAY, NOW, (), "keeps no time windows"),
])
def test_bad_ranges(start, end, chain, reason):
    with pytest.raises(WindowError, match=reason):
        tile(start, end, chain, floors())


def test_retention_must_not_shrink_towards_coarser_buckets():
    with pytest.raises(ValueError, match="at least as long"):
        tile(NOW - DAY, NOW, CHAIN, floors(retention={MINUTE_G: 90 * 86400.0, HOUR_G: 2 * 86400.0, DAY_G: None}))


def test_only_enabled_granularities_are_used():
    tiling = tile(NOW - 3 * DAY - 7 * MIN, NOW, [MINUTE_G, HOUR_G], floors())
    assert {s.granularity for s in tiling.segments} == {MINUTE_G, HOUR_G}
    tiling = tile(NOW - 3 * HOUR, NOW, [MINUTE_G], floors())
    assert [s.granularity for s in tiling.segments] == [MINUTE_G] and tiling.buckets in (180, 181)


chains = st.sampled_from([(MINUTE_G,), (MINUTE_G, HOUR_G), CHAIN])


@st.composite
def retentions(draw, chain: tuple[Granularity, ...]) -> dict[Granularity, float | None]:
    """Retention per granularity, never shorter for a coarser one (what the control plane enforces)."""
    out: dict[Granularity, float | None] = {}
    floor_s = 60.0
    for g in chain:
        if floor_s is None or (g is not MINUTE_G and draw(st.booleans()) and draw(st.booleans())):
            out[g] = None
            floor_s = None
            continue
        seconds = float(draw(st.integers(max(int(floor_s), g.width_us // S), 400 * 86400)))
        out[g] = seconds
        floor_s = seconds
    return out


@given(data=st.data(), chain=chains, now=st.integers(10**15, 2 * 10**15))
def test_tiling_covers_exactly_the_aligned_range_with_the_coarsest_retained_buckets(data, chain, now):
    retention = data.draw(retentions(chain))
    kept = {g: retained_from(g, now, r) for g, r in retention.items()}
    start = data.draw(st.integers(now - 500 * DAY, now + DAY))
    end = data.draw(st.integers(start + 1, start + 500 * DAY))

    def retained(g: Granularity, bucket_start: int) -> bool:
        return kept[g] is None or bucket_start >= kept[g]

    def valid(lo: int, hi: int) -> bool:
        return hi > lo and all(retained(seg.granularity, seg.start_us) for seg in cover(lo, hi, chain))

    start_g = next((g for g in chain if retained(g, align_down(start, g))), None)
    lo = align_down(start, start_g) if start_g is not None else kept[chain[-1]]  # older than all: clamped
    end_g = next((g for g in chain if retained(g, align_up(end, g) - g.width_us) and valid(lo, align_up(end, g))),
                 None)
    if end_g is None:
        with pytest.raises(WindowError):
            tile(start, end, chain, kept)
        return
    tiling = tile(start, end, chain, kept)
    # the edges: outwards to the finest granularity that keeps every bucket read within retention
    assert (tiling.start_us, tiling.end_us) == (lo, align_up(end, end_g))
    assert tiling.segments == cover(lo, tiling.end_us, chain)
    # contiguous, no overlap, exactly the range, every segment aligned, non-empty and retained
    cursor = tiling.start_us
    for seg in tiling.segments:
        g = seg.granularity
        assert g in chain and seg.start_us == cursor and seg.end_us > seg.start_us
        assert seg.start_us % g.width_us == 0 and seg.end_us % g.width_us == 0
        assert retained(g, seg.start_us)
        cursor = seg.end_us
    assert cursor == tiling.end_us
    # the coarsest possible: no segment holds a whole bucket of a coarser granularity it could have used
    for seg in tiling.segments:
        for coarser in chain[chain.index(seg.granularity) + 1:]:
            assert align_up(seg.start_us, coarser) + coarser.width_us > seg.end_us, (seg, coarser)
    # hence few rows: fewer than one parent's worth of buckets per fine edge
    for g in chain[:-1]:
        per_parent = g.parent.width_us // g.width_us  # type: ignore[union-attr]
        assert sum(s.buckets for s in tiling.segments if s.granularity is g) <= 2 * (per_parent - 1)


# -- signed covers (Top-K) --------------------------------------------------------------------------


def _signed_sum_is_the_range(parts, lo: int, hi: int) -> None:
    """Every instant of [lo, hi) is counted once, every other instant not at all: checked at every edge (the sum
    of indicator functions is constant between consecutive edges)."""
    edges = sorted({lo, hi, *(p.segment.start_us for p in parts), *(p.segment.end_us for p in parts)})
    for t in edges:
        total = sum(p.sign for p in parts if p.segment.start_us <= t < p.segment.end_us)
        assert total == (1 if lo <= t < hi else 0), (t, parts)


def test_the_last_hour_is_hours_minus_minutes_not_61_minutes():
    now = align_down(NOW, HOUR_G) + 10 * MIN + 3 * S
    f = floors(now)
    tiling = tile(now - HOUR, now, CHAIN, f)
    assert tiling.buckets == 50 + 11
    parts = signed_cover(tiling, f)  # the previous hour less its first 10 minutes, then 11 minutes
    assert [(p.sign, p.segment.granularity, p.segment.buckets) for p in parts] == [
        (1, HOUR_G, 1), (1, MINUTE_G, 11), (-1, MINUTE_G, 10)]
    _signed_sum_is_the_range(parts, tiling.start_us, tiling.end_us)
    # minutes after now weigh nothing: the current hour is its bucket, less the (empty) rest of it
    cheap = signed_cover(tiling, f, cost_of=lambda _g, start: 0 if start > now else 1)
    assert [(p.sign, p.segment.granularity, p.segment.buckets) for p in cheap] == [
        (1, HOUR_G, 2), (-1, MINUTE_G, 10), (-1, MINUTE_G, 49)]
    _signed_sum_is_the_range(cheap, tiling.start_us, tiling.end_us)


def test_covers_never_use_buckets_out_of_retention_and_keep_aligned_whole_buckets():
    f = floors()
    day = tile(align_down(NOW, DAY_G) - DAY, align_down(NOW, DAY_G), CHAIN, f)
    assert signed_cover(day, f) == tuple((1, seg) for seg in day.segments)  # a whole day stays a day
    # an hour whose first minutes are past the minutes' retention cannot be one hour minus them
    old = f[MINUTE_G]
    assert old is not None
    edge = tile(old + 5 * MIN, old + 2 * HOUR, CHAIN, f)
    parts = signed_cover(edge, f)
    assert all(p.segment.start_us >= (f[p.segment.granularity] or 0) for p in parts)
    _signed_sum_is_the_range(parts, edge.start_us, edge.end_us)


@settings(deadline=None)  # 300 ms for one example on this shared 2-core machine (a flaky DeadlineExceeded)
@given(data=st.data(), chain=chains, now=st.integers(10**15, 2 * 10**15))
def test_signed_covers_count_exactly_the_tiled_range_with_no_more_buckets(data, chain, now):
    retention = data.draw(retentions(chain))
    kept = {g: retained_from(g, now, r) for g, r in retention.items()}
    start = data.draw(st.integers(now - 200 * DAY, now))
    end = data.draw(st.integers(start + 1, start + 100 * DAY))
    try:
        tiling = tile(start, end, chain, kept)
    except WindowError:
        return
    weights = data.draw(st.sampled_from(["flat", "future free"]))
    parts = signed_cover(tiling, kept, cost_of=None if weights == "flat" else (lambda _g, s: 0 if s > now else 1))
    _signed_sum_is_the_range(parts, tiling.start_us, tiling.end_us)
    for p in parts:
        g = p.segment.granularity
        assert g in chain and p.sign in (1, -1) and p.segment.start_us % g.width_us == 0
        assert p.segment.end_us % g.width_us == 0 and p.segment.end_us > p.segment.start_us
        assert kept[g] is None or p.segment.start_us >= kept[g]
    buckets = [(p.segment.granularity, t) for p in parts
               for t in range(p.segment.start_us, p.segment.end_us, p.segment.granularity.width_us)]
    assert len(set(buckets)) == len(buckets)  # no bucket twice
    if weights == "flat":
        assert len(buckets) <= tiling.buckets
