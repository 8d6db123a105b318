"""`counter recount` and `counter audit --by` over time buckets, on real SQLite files: events (duplicates and a
clear included) over 30 hours, rolled up as the worker does (agents.windows then agents.rollup), then a few
stored buckets corrupted by hand. A recount reports exactly those, with the values an oracle computes from the
events, and repairs them (a dry run writes nothing); buckets whose events are past delete_after are left alone;
`audit --by` prints the oracle's series and totals. The CLI tests run the real `counter` command."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.audit import SeriesOptions, audit_series
from jobs.recount import CounterRecount, RecountJob, RecountOptions
from sinks import EventRow
from sinks.windows import CHAIN, Granularity, align_down, align_up, masked
from tests.helpers import make_topic
from tests.unit.test_jobs import FakeProgress
from tests.windows_world import CONFIG, DAY, HOUR, MINUTE, REGISTRY, D, H, M, S, World, ev, now_us, oracle

WIN = REGISTRY["win"]
SHORT = REGISTRY["short"]
COUNTER = [sys.executable, "-m", "counter_cli.main"]


def history(now: int, seed: int = 7) -> list[EventRow]:
    """Counters a (a clear 10 h ago, an add tied with it), b and c: 30 hours of events up to 2 minutes ago,
    with redeliveries and a token reused with another delta (the first write wins)."""
    rng = random.Random(seed)
    rows: list[EventRow] = []
    for c in "abc":
        for i in range(300):
            t = now - 30 * H + rng.randrange(30 * H - 2 * M)
            rows.append(ev("win", c, t, f"{c}{i}", rng.randint(-2, 9)))
    clear_at = now - 10 * H + 30 * M + 17 * S
    rows += [ev("win", "a", clear_at, "clear", clear=True), ev("win", "a", clear_at, "tied", 1000)]
    rows += rows[:60]  # redeliveries
    rows += [(*r[:5], r[5] + 50, r[6]) for r in rows[100:110]]  # same identities, another delta: ignored
    return rows


@pytest.fixture
def world(tmp_path: Path):
    now = now_us() - 5 * S  # the watermark; the clock is past it by more than max_clock_skew
    w = World(tmp_path, now)
    rows = history(now)
    w.write(rows)
    w.rows = rows
    boundaries = [*range(now - 30 * H + 2 * H, now - M, 3 * H), now - M]
    for boundary in boundaries:
        w.worker_step(WIN, "abc", boundary)
    w.last_step = boundaries[-1]
    yield w
    w.close()


def expected_reads(w: World, counter: str, upto: int) -> dict:
    """The oracle's buckets as a reader sees them (masked by the latest clear)."""
    buckets, last, _total = oracle(w.rows, "win", counter, upto)
    return {(g, s): masked(g, s, v, last) for g in CHAIN for s, v in buckets[g].items()}


def corrupt(w: World) -> dict[tuple[str, str, int], tuple[int, int]]:
    """Corrupt a few buckets; returns the drift a recount must report: (counter, granularity, start) ->
    (stored as read, recomputed)."""
    at = w.last_step
    a, last, _ = oracle(w.rows, "win", "a", at)
    b, _, _ = oracle(w.rows, "win", "b", at)
    assert last is not None
    minute = next(s for s, v in sorted(a[MINUTE].items()) if s > last and v)  # after the clear
    masked_minute = next(s for s, v in sorted(a[MINUTE].items()) if s + M <= last and v)  # ended before it
    hour = next(s for s, v in sorted(a[HOUR].items()) if s > last and v)
    day = max(a[DAY])  # the day holding the stored rollup's boundary
    b_hour = next(s for s, v in sorted(b[HOUR].items()) if v)
    phantom = next(s for s in range(align_down(at - 20 * H, MINUTE), at, M) if s not in b[MINUTE])
    w.set_bucket("win", "a", MINUTE, minute, a[MINUTE][minute] + 5)
    w.set_bucket("win", "a", MINUTE, masked_minute, a[MINUTE][masked_minute] + 3)  # reads 0 either way
    w.drop_bucket("win", "a", HOUR, hour)
    w.set_bucket("win", "a", DAY, day, a[DAY][day] + 100)
    w.set_bucket("win", "b", HOUR, b_hour, b[HOUR][b_hour] - 4)
    w.set_bucket("win", "b", MINUTE, phantom, 7, computed_upto=at)  # a bucket without events
    return {("a", "minute", minute): (a[MINUTE][minute] + 5, a[MINUTE][minute]),
            ("a", "hour", hour): (0, a[HOUR][hour]),
            ("a", "day", day): (a[DAY][day] + 100, a[DAY][day]),
            ("b", "hour", b_hour): (b[HOUR][b_hour] - 4, b[HOUR][b_hour]),
            ("b", "minute", phantom): (7, 0)}


def nonzero(reads: dict) -> dict:
    """Reads compared as series are: a missing bucket reads 0."""
    return {k: v for k, v in reads.items() if v}


def drift_of(results: list[CounterRecount]) -> dict[tuple[str, str, int], tuple[int, int]]:
    return {(r.counter, d.granularity, d.start_us): (d.stored, d.recomputed) for r in results for d in r.buckets}


def test_the_worker_steps_build_the_oracle_buckets(world: World) -> None:
    for c in "abc":
        assert world.read("win", c) == expected_reads(world, c, world.last_step)


def test_recount_reports_exactly_the_corrupted_buckets_and_repairs_them_a_dry_run_writes_nothing(world: World):
    expected = corrupt(world)
    raw = {c: world.stored("win", c) for c in "abc"}

    reported: list[CounterRecount] = []
    progress = FakeProgress()
    summary = world.run(RecountJob(RecountOptions("win", all=True, dry_run=True), world.runtime,
                                   report=reported.append, progress=progress).run())
    assert drift_of(reported) == expected
    assert {d.action for r in reported for d in r.buckets} == {"dry-run"}
    assert all(r.status == "ok" for r in reported)  # the totals were never corrupted
    assert (summary.bucket_drift, summary.count("bucket_drift_counters")) == (5, 2)
    assert summary.count("buckets_written") == 0
    assert {c: world.stored("win", c) for c in "abc"} == raw  # nothing written
    assert progress.of("start") == [("start", "checking", 3, "counters", 0)]
    assert "minute/hour/day buckets" in progress.of("log")[0][1]

    reported.clear()
    summary = world.run(RecountJob(RecountOptions("win", all=True), world.runtime, report=reported.append).run())
    boundary = world.recount_boundary(WIN)
    assert drift_of(reported) == expected
    assert {d.action for r in reported for d in r.buckets} == {"written"}
    assert {r.action for r in reported} == {"written"} and summary.not_written == 0
    assert summary.count("buckets_written") == 5
    for c in "abc":
        assert nonzero(world.read("win", c)) == nonzero(expected_reads(world, c, boundary))
        state = world.run(world.rollups.get("win", c))
        assert state.rollup_ts == boundary and state.count == oracle(world.rows, "win", c, boundary)[2]
        # every bucket the stored rollup certifies is stamped with its boundary (the masked minute too)
        assert {u for (_g, s), (_v, u) in world.stored("win", c).items()} == {boundary}

    reported.clear()
    again = world.run(RecountJob(RecountOptions("win", all=True, dry_run=True), world.runtime,
                                 report=reported.append).run())
    assert again.bucket_drift == 0 and drift_of(reported) == {}
    assert again.count("buckets_checked") > 3 * 30 * 3  # at least the minutes, hours and days of 30 hours


def test_recount_from_since_recomputes_only_after_it(world: World) -> None:
    expected = corrupt(world)
    since = world.now - 7 * H  # after the corrupted minute and hour of a (after its clear), before its last day
    reported: list[CounterRecount] = []
    opts = RecountOptions("win", all=True, dry_run=True, since=str(since))
    world.run(RecountJob(opts, world.runtime, report=reported.append).run())
    # the buckets holding times after --since, recomputed whole: from the events after it and, like the total
    # (whose base is the stored rollup), from the buckets stored before it: a day sums its hours as stored before
    # --since (a dropped hour reads 0) and as recomputed after it
    want = {k: v for k, v in expected.items() if k[2] >= align_down(since + 1, Granularity(k[1]))}
    assert [k[:2] for k in want] == [("a", "day")]  # of the corrupted buckets, only a's last day is after --since
    first_recomputed = align_down(since + 1, HOUR)
    drift = {}
    for c in "abc":  # every day holding times after --since; before 07:00 UTC --since lies in the day before the last
        truth, stored = expected_reads(world, c, world.last_step), world.read("win", c)
        for day in range(align_down(since + 1, DAY), world.now + 1, D):
            day_sum = sum((truth if h >= first_recomputed else stored).get((HOUR, h), 0)
                          for h in range(day, day + D, H))
            if stored.get((DAY, day), 0) != day_sum:
                drift[(c, "day", day)] = (stored.get((DAY, day), 0), day_sum)
    assert set(want) <= set(drift)
    assert drift_of(reported) == drift


def test_buckets_whose_events_are_past_delete_after_are_left_as_stored(tmp_path: Path) -> None:
    """Events deleted after 3 h, minutes kept 2 h: the buckets of older events cannot be recomputed. A recount
    neither reports them nor overwrites them with partial sums."""
    now = now_us() - 5 * S
    w = World(tmp_path, now)
    try:
        rows = [ev("short", "o", now - 6 * H + k * 97 * S, f"o{k}", 1 + k % 4) for k in range(6 * 3600 // 97)]
        w.write(rows)
        for boundary in [*range(now - 6 * H + 30 * M, now - M, 30 * M), now - M]:
            w.worker_step(SHORT, ["o"], boundary)
        floor = now_us() - 3 * H
        deleted = w.run(w.events.delete_rolled_up("short", "o", floor, now - M))
        assert deleted > 0
        stored = w.stored("short", "o")
        recent = min(s for s in range(align_up(floor, MINUTE) + 70 * M, now, M) if (MINUTE, s) in stored)
        w.set_bucket("short", "o", MINUTE, recent, 999)
        old_minute = min(s for g, s in stored if g is MINUTE and s >= now - 4 * H)
        w.set_bucket("short", "o", MINUTE, old_minute, 555)  # past every retention: never recomputed
        before = w.stored("short", "o")

        reported: list[CounterRecount] = []
        w.run(RecountJob(RecountOptions("short", ["o"], dry_run=True), w.runtime, report=reported.append).run())
        [r] = reported
        truth = oracle(rows, "short", "o", now)[0][MINUTE][recent]
        assert drift_of(reported) == {("o", "minute", recent): (999, truth)}
        assert r.buckets_checked > 0

        # --since before the deleted events (the way to recount such counters): the total stays right and the
        # buckets older than delete_after keep their values and stamps
        reported.clear()
        w.run(RecountJob(RecountOptions("short", ["o"], since=str(now - 5 * H)), w.runtime,
                         report=reported.append).run())
        [r] = reported
        assert r.status == "ok" and r.action == "written" and len(r.buckets) == 1
        boundary = w.recount_boundary(SHORT)
        after = w.stored("short", "o")
        for (g, s), (value, upto) in before.items():
            if s + g.width_us <= floor - M:  # ended before delete_after: as it was
                assert after[(g, s)] == (value, upto), (g, s)
            elif g is MINUTE and s >= floor + 61 * M:  # within the minutes' retention: recomputed at B
                assert after[(g, s)][1] == boundary, (g, s)
        assert after[(MINUTE, old_minute)] == (555, before[(MINUTE, old_minute)][1])
        assert after[(MINUTE, recent)] == (truth, boundary)
    finally:
        w.close()


def test_audit_by_hour_prints_the_oracle_series_and_totals(world: World) -> None:
    corrupt(world)
    world.run(RecountJob(RecountOptions("win", all=True), world.runtime).run())
    boundary = world.recount_boundary(WIN)
    for c, g, compared in (("a", HOUR, True), ("b", HOUR, False), ("b", DAY, True), ("a", MINUTE, True)):
        buckets, last, total = oracle(world.rows, "win", c, boundary)
        rows: list[dict] = []
        progress = FakeProgress()
        result = world.run(audit_series(WIN, world.buckets, world.rollups, SeriesOptions("win", c, g), rows.extend,
                                        progress=progress))
        first = min(buckets[g])  # the default range: from the first stored bucket ...
        assert result.start_us == first and boundary < result.end_us <= align_up(now_us(), g)
        want = [(s, masked(g, s, buckets[g].get(s, 0), last)) for s in range(first, result.end_us, g.width_us)]
        assert [(r["bucket_start_us"], r["count"]) for r in rows] == want  # ... zero-filled, masked
        running = 0
        for r in rows:
            running += r["count"]
            assert r["running_total"] == running and r["granularity"] == g.value
        assert result.total == running and result.buckets == len(rows)
        assert result.as_of == boundary
        assert progress.of("start") == [("start", "auditing", len(rows), "buckets", 0)]
        if compared:  # since the latest clear (or since the first day, kept forever), the buckets sum to the total
            assert result.not_compared is None and result.matches and result.total == total, (c, g)
        else:
            assert result.matches is None and "kept" in result.not_compared
    # an explicit range [from, to): aligned outwards, the running total starts at 0
    start, end = world.now - 5 * H - 17 * M, world.now - 2 * H + 1
    rows = []
    result = world.run(audit_series(WIN, world.buckets, world.rollups, SeriesOptions("win", "a", HOUR, start, end),
                                    rows.extend))
    buckets, last, _ = oracle(world.rows, "win", "a", boundary)
    lo, hi = align_down(start, HOUR), align_up(end, HOUR)
    assert (result.start_us, result.end_us) == (lo, hi)
    assert [(r["bucket_start_us"], r["count"]) for r in rows] == [
        (s, masked(HOUR, s, buckets[HOUR].get(s, 0), last)) for s in range(lo, hi, H)]
    assert result.matches is None  # does not reach the rollup's boundary, nor start at the clear


# -- through the real `counter` command -----------------------------------------------------------------


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    config = tmp_path / "namespaces.json"
    config.write_text(json.dumps(CONFIG))
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTER_")}
    env.update(COUNTER_NAMESPACES=str(config), COUNTER_CACHE="memory", **extra)
    return env


def test_cli_audit_by_hour_json_and_csv(world: World, tmp_path: Path) -> None:
    env = _env(tmp_path, COUNTER_DATA_DIR=str(world.directory))
    done = subprocess.run([*COUNTER, "audit", "win", "a", "--by", "hour", "--format", "json"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    buckets, last, total = oracle(world.rows, "win", "a", world.last_step)
    want = {s: masked(HOUR, s, v, last) for s, v in buckets[HOUR].items()}
    got = {r["bucket_start_us"]: r["count"] for r in doc["buckets"]}
    assert {s: v for s, v in got.items() if v} == {s: v for s, v in want.items() if v}
    assert doc["total"] == total == doc["buckets"][-1]["running_total"] and doc["matches"] is True
    assert doc["stored_rollup"]["count"] == total and doc["as_of"].endswith("Z")
    assert "matches" in done.stderr

    world.set_bucket("win", "a", HOUR, max(want), want[max(want)] + 1)  # the total no longer matches: exit 1
    out = tmp_path / "a.csv"
    done = subprocess.run([*COUNTER, "audit", "win", "a", "--by", "hour", "--format", "csv", "--output", str(out)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "DIFFERS" in done.stderr, done.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == "bucket_start,bucket_start_us,granularity,count,running_total"
    assert lines[-1].split(",")[-1] == str(total + 1)

    done = subprocess.run([*COUNTER, "audit", "win", "a", "--format", "table"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "--by" in done.stderr


@pytest.mark.integration
def test_cli_recount_reports_bucket_drift_in_jsonl_and_fixes_it(world: World, tmp_path: Path,
                                                                kafka_bootstrap: str, topic_name: str) -> None:
    make_topic(kafka_bootstrap, topic_name, partitions=1)
    world.run(world.rollups.set_watermarks(topic_name, {0: world.now}))
    expected = corrupt(world)
    env = _env(tmp_path, COUNTER_DATA_DIR=str(world.directory), COUNTER_KAFKA_BOOTSTRAP=kafka_bootstrap,
               COUNTER_MUTATIONS_TOPIC=topic_name)
    done = subprocess.run([*COUNTER, "recount", "win", "--all", "--dry-run", "--format", "jsonl"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    got = {(r["counter"], b["granularity"], b["start_us"]): (b["stored"], b["recomputed"]) for r in rows
           for b in r["buckets"]}
    assert got == expected
    assert all(b["start"].endswith("Z") for r in rows for b in r["buckets"])
    assert "5 drifted in 2 counter(s)" in done.stderr

    done = subprocess.run([*COUNTER, "recount", "win", "a", "b"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "5 rewritten" in done.stderr and "hour" in done.stderr  # the table lists the drifted buckets
    boundary = world.run(world.rollups.get("win", "a")).rollup_ts
    assert boundary > world.last_step
    for c in "ab":
        assert nonzero(world.read("win", c)) == nonzero(expected_reads(world, c, boundary))

