"""The job logic of recounting and auditing time buckets: what the recount reports through Progress and its
tallies, resume, the forward-only cases (a bucket stamped at or after the new boundary, a watermark that has not
moved), the zero minutes given for stored buckets without events, and `audit --by` paging, stop and resume.
Real SQLite stores (tests/windows_world.py), no broker."""

from __future__ import annotations

import asyncio
import io
import random
from pathlib import Path

import pytest

from jobs.audit import SERIES_FIELDS, RowWriter, SeriesOptions, audit_series
from jobs.recount import BucketDrift, CounterRecount, RecountJob, RecountOptions, _ZeroFilled
from query_api.windows import TooManyBuckets as ApiTooManyBuckets
from query_api.windows import series
from sinks.windows import TooManyBuckets, WindowError, align_down, fill_series, series_range
from tests.unit.test_jobs import FakeProgress
from tests.windows_world import DAY, HOUR, MINUTE, REGISTRY, H, M, S, World, ev, now_us, oracle

WIN = REGISTRY["win"]


@pytest.fixture
def world(tmp_path: Path):
    """Counters a and b: 8 hours of events up to 2 minutes ago (a cleared 3 hours ago), rolled up hourly."""
    now = now_us() - 5 * S
    w = World(tmp_path, now)
    rng = random.Random(3)
    w.rows = [ev("win", c, now - 8 * H + rng.randrange(8 * H - 2 * M), f"{c}{i}", rng.randint(1, 5))
              for c in "ab" for i in range(150)]
    w.rows.append(ev("win", "a", now - 3 * H, "clear", clear=True))
    w.write(w.rows)
    steps = [*range(now - 7 * H, now - M, H), now - M]
    for boundary in steps:
        w.worker_step(WIN, "ab", boundary)
    w.last_step = steps[-1]
    yield w
    w.close()


class NoteProgress(FakeProgress):
    """FakeProgress that also keeps the notes beside the bar."""

    def __init__(self) -> None:
        super().__init__()
        self.notes: list[str | None] = []

    def advance(self, n=1, *, note=None):
        super().advance(n, note=note)
        self.notes.append(note)


def recount(w: World, **options) -> tuple[object, list[CounterRecount], NoteProgress]:
    reported: list[CounterRecount] = []
    progress = NoteProgress()
    opts = RecountOptions("win", **({"all": True} | options))
    summary = w.run(RecountJob(opts, w.runtime, report=reported.append, progress=progress).run())
    return summary, reported, progress


def an_hour(w: World, counter: str = "b") -> tuple[int, int]:
    hours = oracle(w.rows, "win", counter, w.last_step)[0][HOUR]
    start = max(s for s, v in hours.items() if v)
    return start, hours[start]


def test_bucket_drift_is_reported_tallied_and_shown_in_the_progress_note(world: World) -> None:
    start, value = an_hour(world)
    world.set_bucket("win", "b", HOUR, start, value + 9)
    summary, reported, progress = recount(world, dry_run=True)
    [b] = [r for r in reported if r.counter == "b"]
    assert [(d.granularity, d.start_us, d.stored, d.recomputed, d.action) for d in b.buckets] == [
        ("hour", start, value + 9, value, "dry-run")]
    assert b.status == "ok" and b.buckets_checked > 0
    row = b.as_json()
    assert row["buckets"] == [{"granularity": "hour", "start": BucketDrift("hour", start, 0, 0).as_json()["start"],
                               "start_us": start, "stored": value + 9, "recomputed": value, "action": "dry-run"}]
    assert row["buckets"][0]["start"].endswith(":00:00Z")
    assert summary.bucket_drift == 1 and summary.count("bucket_drift_counters") == 1
    assert summary.count("buckets_checked") == sum(r.buckets_checked for r in reported)
    assert progress.of("advance") == [("advance", 1), ("advance", 1)]
    assert progress.notes == ["drift 0", "drift 0, 1 bucket(s)"]  # a, then b
    assert "minute/hour/day buckets" in progress.of("log")[0][1]


def test_a_stopped_recount_resumes_with_its_bucket_tallies(world: World) -> None:
    start, value = an_hour(world, "a")
    world.set_bucket("win", "a", HOUR, start, value + 1)
    opts = RecountOptions("win", all=True, dry_run=True)
    reported: list[CounterRecount] = []
    first = world.run(RecountJob(opts, world.runtime, report=reported.append, stop=lambda: bool(reported)).run())
    assert first.interrupted and first.after == "a" and first.bucket_drift == 1
    again = world.run(RecountJob(opts, world.runtime, report=reported.append).run())
    assert not again.interrupted and [r.counter for r in reported] == ["a", "b"]
    assert again.bucket_drift == 1 and again.count("counters") == 2  # carried over from the first run


def test_a_bucket_stamped_at_or_after_the_new_boundary_is_behind_and_retried(world: World) -> None:
    """Forward-only: a corrected bucket is written at the recount's boundary B, later than every bucket the
    stored rollup certifies; one stamped at or after B (here: far ahead) refuses it, and the counter is 'behind'
    (retried while the watermark moves) instead of being reported fixed."""
    # the hour still open at the stored rollup's boundary (the latest hour with events has already ended when the
    # test runs in an hour's first two minutes, and an ended bucket is compared, as below)
    start = align_down(world.last_step, HOUR)
    value = oracle(world.rows, "win", "b", world.last_step)[0][HOUR].get(start, 0)
    ahead = now_us() + 10 * H
    world.set_bucket("win", "b", HOUR, start, value + 9, computed_upto=ahead)
    # measured at the stored rollup's boundary, the bucket stamped after it is in flight: not compared ...
    _summary, reported, _ = recount(world, dry_run=True)
    assert all(r.buckets == [] for r in reported)
    # ... unless it ended before that boundary (no event after it can change it): then it is drift
    start = min(s for s, v in oracle(world.rows, "win", "b", world.last_step)[0][HOUR].items() if v)
    value = oracle(world.rows, "win", "b", world.last_step)[0][HOUR][start]
    world.set_bucket("win", "b", HOUR, start, value + 3, computed_upto=ahead)
    summary, reported, _ = recount(world, wait_s=0)
    [b] = [r for r in reported if r.counter == "b"]
    assert [(d.start_us, d.action) for d in b.buckets] == [(start, "behind")] and b.action == "behind"
    assert summary.not_written == 1
    assert world.stored("win", "b")[(HOUR, start)] == (value + 3, ahead)  # refused
    assert world.run(world.rollups.get("win", "b")).rollup_ts == world.recount_boundary(WIN)  # the rollup moved


def test_nothing_is_written_while_the_watermark_has_not_passed_the_stored_rollup(world: World) -> None:
    start, value = an_hour(world)
    world.set_bucket("win", "b", HOUR, start, value + 9)
    # the stored rollups already at the boundary a recount reaches now (the watermark has not moved since)
    boundary = world.recount_boundary(WIN)
    for c in "ab":
        assert world.run(world.rollups.write_rollup("win", c, oracle(world.rows, "win", c, boundary)[2], boundary))
    before = world.stored("win", "b")
    _summary, reported, _ = recount(world, wait_s=0)
    [b] = [r for r in reported if r.counter == "b"]
    assert b.action == "behind" and [d.action for d in b.buckets] == ["behind"]
    assert world.stored("win", "b") == before
    [a] = [r for r in reported if r.counter == "a"]
    assert a.action == "unchanged" and a.buckets == []


def test_zero_minutes_are_given_for_stored_buckets_without_events() -> None:
    class Events:
        async def bucket_sums_many(self, namespace, windows, width_us):
            return [[(10 * M, 4, None, 2)] for _ in windows]

    spans = [(0, H), (10 * M, 11 * M), (20 * M, 21 * M), (2 * H, 3 * H)]
    zero = _ZeroFilled(Events(), spans)  # type: ignore[arg-type]
    [got] = asyncio.run(zero.bucket_sums_many("ns", [("c", 5 * M - 1, 2 * H + 30 * M)], M))
    # the hour [0, H) meets the window from 5 min on; the minute at 10 min holds events; the minute at 20 min is
    # given as 0; the hour at 2 h from its start
    assert got == [(5 * M, 0, None, 0), (10 * M, 4, None, 2), (20 * M, 0, None, 0), (2 * H, 0, None, 0)]
    [none] = asyncio.run(zero.bucket_sums_many("ns", [("c", 3 * H - 1, 4 * H)], M))  # no stored bucket there
    assert none == [(10 * M, 4, None, 2)]


# -- audit --by ----------------------------------------------------------------------------------------


def test_audit_series_pages_stops_on_a_whole_page_and_resumes(world: World, tmp_path: Path) -> None:
    full: list[dict] = []
    world.run(audit_series(WIN, world.buckets, world.rollups, SeriesOptions("win", "b", MINUTE), full.extend))
    out = tmp_path / "b.csv"
    pages: list[int] = []
    progress = FakeProgress()
    with out.open("w") as f:
        writer = RowWriter(f, "csv", True, SERIES_FIELDS)

        def rows(batch: list[dict]) -> None:
            pages.append(len(batch))
            writer(batch)

        first = world.run(audit_series(WIN, world.buckets, world.rollups, SeriesOptions("win", "b", MINUTE), rows,
                                       progress=progress, stop=lambda: len(pages) >= 2, page=50))
    assert first.interrupted and pages == [50, 50] and first.buckets == 100
    assert progress.of("start") == [("start", "auditing", len(full), "buckets", 0)]
    assert progress.of("advance") == [("advance", 50), ("advance", 50)] and progress.calls[-1] == ("finish",)
    resumed = SeriesOptions("win", "b", MINUTE).resumed(out, "csv")
    assert resumed.start_us == full[99]["bucket_start_us"] + M and resumed.start_total == full[99]["running_total"]
    with out.open("a") as f:
        rest = world.run(audit_series(WIN, world.buckets, world.rollups, resumed, RowWriter(f, "csv", False,
                                                                                             SERIES_FIELDS)))
    assert not rest.interrupted and rest.total == full[-1]["running_total"]
    lines = out.read_text().splitlines()
    assert lines[0] == ",".join(SERIES_FIELDS) and len(lines) == 1 + len(full)
    assert [int(line.split(",")[3]) for line in lines[1:]] == [r["count"] for r in full]
    assert rest.matches is None  # a resumed range does not start at the counter's first bucket


def test_audit_series_is_the_api_series(world: World) -> None:
    start, end = world.now - 5 * H - 7 * M, world.now
    for g in (MINUTE, HOUR, DAY):
        rows: list[dict] = []
        got = world.run(audit_series(WIN, world.buckets, world.rollups, SeriesOptions("win", "a", g, start, end),
                                     rows.extend))
        api = world.run(series(world.buckets, WIN, "a", g, start, end, max_buckets=10_000))
        assert (got.start_us, got.end_us) == (api.start_us, api.end_us)
        assert [(r["bucket_start_us"], r["count"]) for r in rows] == list(api.buckets)
    assert ApiTooManyBuckets is TooManyBuckets  # the public name still answers from query_api
    with pytest.raises(TooManyBuckets):
        series_range(MINUTE, 0, 2 * H, now_us=2 * H, retention_s=None, max_buckets=60)
    with pytest.raises(WindowError, match=r"minute buckets are kept 1h$"):  # not "3600s", nor 7.776e+06s for 90d
        series_range(MINUTE, 0, H, now_us=10 * H, retention_s=3600)  # ends before the oldest retained minute
    assert series_range(MINUTE, 30 * S, H, now_us=H + 5 * M, retention_s=3600) == (5 * M, H)  # clamped
    assert fill_series(HOUR, 0, 3 * H, [(H, 5, 3 * H), (2 * H, 7, 3 * H)], 2 * H) == ((0, 0), (H, 0), (2 * H, 7))
    # computed before the clear (read between the worker's clear bump and its rewrite): only erased events
    assert fill_series(HOUR, 2 * H, 3 * H, [(2 * H, 7, 2 * H - 1)], 2 * H) == ((2 * H, 0),)


def test_audit_series_says_why_a_total_is_not_compared(world: World) -> None:
    def audit(counter: str, g, start=None) -> object:
        return world.run(audit_series(WIN, world.buckets, world.rollups, SeriesOptions("win", counter, g, start),
                                      lambda rows: None))

    assert audit("a", HOUR).matches is True  # from the first stored hour, past the clear
    assert audit("b", DAY).matches is True  # kept forever, from the first stored day
    assert "kept" in audit("b", HOUR).not_compared
    after_clear = align_down(world.now - 3 * H, HOUR) + H
    assert "after the bucket of the latest clear" in audit("a", HOUR, after_clear).not_compared
    assert audit("nobody", HOUR).not_compared == "no stored rollup yet"
    # a bucket computed after the stored rollup: a rollup in progress, not a difference
    start, _value = an_hour(world)
    world.set_bucket("win", "b", DAY, align_down(start, DAY), 1, computed_upto=world.last_step + S)
    assert "in progress" in audit("b", DAY).not_compared
    world.set_bucket("win", "b", DAY, align_down(start, DAY), 1, computed_upto=world.last_step)
    assert audit("b", DAY).matches is False


def test_row_writer_keeps_the_event_columns_by_default() -> None:
    out = io.StringIO()
    RowWriter(out, "csv", True)([])
    assert out.getvalue().startswith("event_time,event_time_us,op,")
