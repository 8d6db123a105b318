"""Pure and SQLite-level logic behind `counter replay|recount|audit|dlq` (no broker needed)."""

from __future__ import annotations

import asyncio
import io
import json
import random

import pytest
from rich.console import Console

from agents.persist import PreparedBatch
from agents.persist_path import persist_batch
from control_plane import parse_namespaces
from control_plane.admission import rollup_boundary
from counter_cli import recount_cmd, replay_cmd
from counter_cli.main import build_parser
from counter_cli.progress import ProgressBar, _RateColumn
from jobs.audit import RunningTotal, last_row
from jobs.recount import Recounter, RecountOptions, recount_counter
from jobs.replay import ReplayOptions, _Writer
from schemas import MAX_EVENT_TIME, MICROS, Mutation, encode_batch, encode_mutation
from schemas.dead_letter import DeadLetter, DeadRecord, parse_headers
from sinks import (
    InProcessRollupCache,
    Partitioning,
    SqliteEventStore,
    SqliteRollupStore,
    apply_aggregate,
    dropped_key,
)

REGISTRY = parse_namespaces({"namespaces": {
    "ev": {"counter_type": "EVENTUAL", "accept_limit": "2s", "max_clock_skew": "500ms",
           "time_partition": {"buckets_per_id": 4, "seconds_per_bucket": 10, "seconds_per_slice": 60}},
}})
EV = REGISTRY["ev"]
T = 1_700_000_000 * MICROS


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def stores(tmp_path):
    part = Partitioning(4, 10, 60)
    events = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: part)
    rollups = SqliteRollupStore(tmp_path / "rollups.sqlite3")
    yield events, rollups
    run(events.close())
    run(rollups.close())


def add(counter: str, t: int, token: str, delta: int, ns: str = "ev"):
    return (ns, counter, t, token, "", delta, False)


def clear(counter: str, t: int, token: str, ns: str = "ev"):
    return (ns, counter, t, token, "", 0, True)


# -- EventStore.counters ---------------------------------------------------------------------------------


def test_counters_pages_distinct_sorted_names_across_slices(stores):
    events, _ = stores
    names = [f"c{i:03d}" for i in range(57)]
    rows = []
    for i, name in enumerate(names):  # spread over several 60 s slices, some names in many of them
        for k in range(1 + i % 3):
            rows.append(add(name, T + (i * 17 + k * 61) * MICROS, f"{name}-{k}", 1))
    rows.append(add("other", T, "x", 1, ns="zz"))
    assert run(events.write_events(rows)) == len(rows)
    assert len(run(events.slices("ev"))) > 3
    got, after = [], None
    while True:
        page = run(events.counters("ev", after=after, limit=10))
        got += page
        if len(page) < 10:
            break
        after = page[-1]
    assert got == names
    assert run(events.counters("ev", after="c050", limit=3)) == ["c051", "c052", "c053"]
    assert run(events.counters("nobody")) == [] and run(events.counters("ev", limit=0)) == []
    assert run(events.counters("zz")) == ["other"]


# -- arguments to job options ----------------------------------------------------------------------


def test_cli_arguments_become_the_jobs_options():
    args = build_parser().parse_args(["replay", "--from", "earliest", "--namespace", "ns", "--counter", "a",
                                      "--counter=-b", "--restart", "--batch-size", "10", "--no-recount"])
    assert replay_cmd.options(args) == ReplayOptions(start="earliest", namespace="ns", counters=("a", "-b"),
                                                     restart=True, batch_size=10, recount=False)
    args = build_parser().parse_args(["recount", "--dry-run", "--format", "jsonl", "--wait", "2", "--", "ns",
                                      "-odd", "x"])
    assert recount_cmd.options(args) == RecountOptions("ns", counters=("-odd", "x"), dry_run=True, wait_s=2.0)


# -- recount ----------------------------------------------------------------------------------------


def _seed(events, rollups, *, stored: int | None, stored_ts: int = 0):
    rows = [add("c", T + 1, "a", 5), add("c", T + 2, "b", 7), clear("c", T + 3, "k"), add("c", T + 4, "d", 2),
            add("c", T + 10 * MICROS, "late", 100)]
    run(events.write_events(rows))
    if stored is not None:
        run(rollups.write_rollup("ev", "c", stored, stored_ts))


WATERMARK = T + 60 * MICROS  # far enough for a boundary past every seeded event
NOW = T + 120 * MICROS


def recount(events, rollups, cache=None, **kw):
    kw.setdefault("watermark_us", WATERMARK)
    kw.setdefault("now_us", NOW)
    return run(recount_counter(EV, "c", events=events, rollups=rollups, cache=cache, **kw))


def test_recount_of_a_missing_row_restores_value_and_last_write(stores):
    events, rollups = stores
    _seed(events, rollups, stored=None)
    cache = InProcessRollupCache()
    dry = recount(events, rollups, cache, dry_run=True)
    assert (dry.status, dry.recomputed, dry.drift, dry.action) == ("missing", 102, -102, "dry-run")
    assert run(rollups.get("ev", "c")) is None and run(cache.get("ev", "c")) is None
    # A boundary between the clear's window and the late event: the late one must stay pending.
    mark = T + 12 * MICROS - 1  # B = mark - accept_limit (2 s) - 1
    assert rollup_boundary(NOW, mark, EV) == T + 10 * MICROS - 2
    r = recount(events, rollups, cache, watermark_us=mark)
    assert r.boundary == T + 10 * MICROS - 2 and (r.recomputed, r.action) == (2, "written")
    state = run(rollups.get("ev", "c"))
    assert (state.count, state.rollup_ts, state.last_write_ts) == (2, r.boundary, T + 10 * MICROS)
    assert run(cache.get("ev", "c")) == (2, r.boundary)


def test_recount_measures_drift_at_the_stored_boundary_and_fixes_it(stores):
    events, rollups = stores
    _seed(events, rollups, stored=50, stored_ts=T + 2)  # truth at T+2 is 12
    r = recount(events, rollups, dry_run=True)
    assert (r.status, r.stored, r.drift, r.recomputed) == ("drift", 50, 38, 102)
    r = recount(events, rollups)
    assert r.action == "written" and (r.count, r.rollup_ts) == (102, r.boundary)
    again = recount(events, rollups, now_us=NOW + 1, watermark_us=WATERMARK + 1)
    assert (again.status, again.drift, again.action) == ("ok", 0, "written")


def test_recount_never_moves_a_rollup_backwards(stores):
    events, rollups = stores
    _seed(events, rollups, stored=50, stored_ts=T + 3)  # wrong (truth 0 at T+3)
    r = recount(events, rollups, watermark_us=T)  # boundary before the stored rollup
    assert (r.status, r.action) == ("drift", "behind")
    assert run(rollups.get("ev", "c")).count == 50
    run(rollups.write_rollup("ev", "c", 2, T + 4))  # now right (clear at T+3, then +2)
    assert recount(events, rollups, watermark_us=T).action == "unchanged"


def test_an_unchanged_recount_never_puts_an_older_rollup_in_the_cache(stores):
    """A worker rolls the counter up while the recount reads events (the usual reason it is behind): the cache must
    keep the worker's newer value, not get the rollup the recount read at its start."""
    events, rollups = stores
    _seed(events, rollups, stored=2, stored_ts=T + 4)  # right: the clear at T+3, then +2
    cache = InProcessRollupCache()
    run(cache.set("ev", "c", 2, T + 4))
    aggregate = events.aggregate

    async def worker_rolls_up_meanwhile(*args, **kwargs):
        out = await aggregate(*args, **kwargs)
        if run_once:
            run_once.pop()
            await rollups.write_rollup("ev", "c", 102, T + 11 * MICROS)
            await cache.set("ev", "c", 102, T + 11 * MICROS)
        return out

    run_once = [True]
    events.aggregate = worker_rolls_up_meanwhile
    r = recount(events, rollups, cache, watermark_us=T)  # boundary before the stored rollup: unchanged
    assert (r.status, r.action) == ("ok", "unchanged")
    assert run(cache.get("ev", "c")) == (102, T + 11 * MICROS)


def test_recount_since_takes_its_base_from_the_stored_rollup(stores):
    events, rollups = stores
    _seed(events, rollups, stored=2, stored_ts=T + 5)
    r = recount(events, rollups, since_us=T + 2)  # (T+2, T+5] holds the clear: the stored value is checkable
    assert (r.status, r.recomputed, r.action) == ("ok", 102, "written")
    r = recount(events, rollups, since_us=T + 59 * MICROS)  # the stored rollup does not reach --since
    assert (r.status, r.action) == ("no-base", "skipped")


def test_a_recount_starts_its_total_where_retention_may_have_deleted_events(stores):
    """A review: once retention had dropped a counter's older events, `counter recount --all` (and a replay's recount)
    recomputed its total from the events still stored: 110 became 10. From where the worker's retention dropped
    events, the stored count is taken as it was (as --since takes it); a counter whose events are all kept is still
    recounted from zero."""
    events, rollups = stores
    _seed(events, rollups, stored=50, stored_ts=T + 2)  # truth at T+2 is 12: wrong, every event kept
    assert recount(events, rollups, dry_run=True).drift == 38  # from zero: the drift is found
    run(rollups.write_rollup("ev", "c", 212, T + 11 * MICROS))  # the events say 102 (a clear at T+3, +2, +100)
    run(rollups.set_watermarks(dropped_key("ev"), {0: T + 1}))  # retention may have deleted events before T+1
    r = recount(events, rollups, dry_run=True)
    assert (r.status, r.drift) == ("drift", 110)  # a clear after the cut: the count since it is checkable
    run(rollups.set_watermarks(dropped_key("ev"), {0: T + 4}))  # after the clear: 112 before the cut is taken
    r = recount(events, rollups, dry_run=True)
    assert (r.status, r.drift, r.recomputed) == ("ok", 0, 212)
    run(rollups.set_watermarks(dropped_key("ev"), {0: T + 12 * MICROS}))  # the cut after the stored rollup
    r = recount(events, rollups)
    assert (r.status, r.recomputed, r.action) == ("ok", 212, "written")
    assert run(rollups.get("ev", "c")).count == 212


class _RacingRollups:
    """A rollup store where a rollup worker moves the counter further, from a wrong value, right after us."""

    def __init__(self, inner: SqliteRollupStore, times: int) -> None:
        self.inner = inner
        self.times = times

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def write_rollup(self, namespace, counter, count, rollup_ts):
        applied = await self.inner.write_rollup(namespace, counter, count, rollup_ts)
        if self.times:
            self.times -= 1
            await self.inner.write_rollup(namespace, counter, count + 1000, rollup_ts + 1)
        return applied


def test_a_racing_rollup_from_a_drifted_value_is_detected_and_recounted(stores):
    events, rollups = stores
    _seed(events, rollups, stored=50, stored_ts=T + 2)
    racing = _RacingRollups(rollups, times=1)
    r = recount(events, racing)
    assert r.action == "raced"
    marks = iter(range(WATERMARK + MICROS, WATERMARK + 100 * MICROS, MICROS))

    async def watermark() -> int:
        return next(marks)

    recounter = Recounter(REGISTRY, events, racing, None, watermark, retry_interval_s=0)
    (final,) = run(recounter.recount([("ev", "c")], wait_s=5))
    assert final.action == "written" and run(rollups.get("ev", "c")).count == 102


# -- replay's writer: which counters got new events inside rolled-up windows -------------------------


def test_writer_marks_counters_whose_restored_events_are_old(stores):
    events, _ = stores

    class RT:
        registry = REGISTRY

    RT.events = events
    marked: set = set()
    writer = _Writer(RT, marked)
    import time as _time
    now = _time.time_ns() // 1000
    old = [add("a", now - 3600 * MICROS, "o1", 1), add("b", now - 3600 * MICROS, "o2", 1)]
    fresh = [add("c", now + 3600 * MICROS, "f1", 1)]
    run(events.write_events(old[1:]))  # b's event is already stored
    assert run(writer(old + fresh)) == 2
    assert marked == {("ev", "a")} and writer.restored == 1
    assert run(writer(old + fresh)) == 0 and marked == {("ev", "a")}
    # Many late counters in one batch: one write; if anything was new, each of them is recounted.
    writer.precise_up_to = 2
    many = [add(f"m{i}", now - 3600 * MICROS, f"m{i}", 1) for i in range(5)]
    run(events.write_events(many[1:]))
    assert run(writer(many)) == 1 and {("ev", f"m{i}") for i in range(5)} <= marked
    marked.clear()
    assert run(writer(many)) == 0 and not marked


def test_persist_batch_order_and_optional_steps(stores):
    events, rollups = stores
    calls = []

    async def signals(keys):
        calls.append(("signals", sorted(keys)))

    async def dead(letters):
        calls.append(("dead", len(letters)))

    batch = PreparedBatch(rows=[add("a", T, "t", 3)], last_write={("ev", "a"): T},
                          dead=[DeadLetter(b"k", b"v", "why", "topic", 0, 1, T)], records=2)
    assert run(persist_batch(batch, events=events, rollups=rollups, dead_letters=dead, signals=signals)) == 1
    assert calls == [("dead", 1), ("signals", [("ev", "a")])]
    assert run(rollups.get("ev", "a")).last_write_ts == T
    calls.clear()
    assert run(persist_batch(batch, events=events, rollups=rollups, dead_letters=None, signals=None)) == 0
    assert calls == []


# -- audit ------------------------------------------------------------------------------------------


def test_running_total_agrees_with_the_store_aggregate(stores):
    events, _ = stores
    rng = random.Random(1)
    rows = []
    for i in range(400):
        t = T + rng.randrange(60) * 1000  # many ties, clears among them
        rows.append(clear("r", t, f"k{i}") if rng.random() < 0.05 else add("r", t, f"a{i}", rng.randint(-9, 20)))
    run(events.write_events(rows))
    stored = run(events.scan("ev", "r", 0, MAX_EVENT_TIME, limit=10_000))
    tally = RunningTotal()
    groups: dict[int, list] = {}
    for row in stored:
        groups.setdefault(row[2], []).append(row)
    out = [r for t in sorted(groups) for r in tally.group(groups[t])]
    assert tally.total == apply_aggregate(0, run(events.aggregate("ev", "r", 0, MAX_EVENT_TIME)))
    assert out[-1]["running_total"] == tally.total and len(out) == len(stored)
    for t, group in groups.items():  # in a group with a clear, the clear comes first and wins
        if any(r[6] for r in group):
            shown = [r for r in out if r["event_time_us"] == t]
            assert shown[0]["op"] == "clear" and all(r["running_total"] == 0 for r in shown)


def test_resume_point_of_an_interrupted_export(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"event_time_us": 5, "running_total": 3}) + "\n" + '{"event_ti')
    assert last_row(path, "jsonl") == {"event_time_us": 5, "running_total": 3}
    assert path.read_text().endswith("}\n")  # the torn line is cut off
    csv_path = tmp_path / "a.csv"
    csv_path.write_text("event_time,event_time_us,op,token,item_key,delta,counted,running_total\n"
                        "x,7,add,t,,2,true,9\n")
    assert last_row(csv_path, "csv") == {"event_time_us": 7, "running_total": 9}


# -- dlq and progress -------------------------------------------------------------------------------


def test_dead_record_preview_and_key():
    batch_member = encode_mutation(Mutation("ns", "c1", 3, T, "tok", "", "ADD"))
    r = DeadRecord(0, 4, T, b"ns:other", batch_member, parse_headers([("dlq.reason", b"unknown namespace 'ns'")]))
    assert r.preview() == "ns:c1 +3 token=tok" and r.produce_key() == b"ns:c1" and r.position == "0:4"
    assert "unknown namespace" in r.reason
    garbage = DeadRecord(0, 5, T, b"k", b"\x00\xff", {})
    assert garbage.preview().startswith("undecodable, 2 bytes") and garbage.produce_key() == b"k"
    two = encode_batch([Mutation("ns", "c1", 1, T, "a"), Mutation("ns", "c2", 1, T, "b")])
    assert DeadRecord(0, 6, T, b"ns:c1", two, {}).preview().endswith("(+1 more)")


def test_progress_bar_shows_rate_and_eta_or_elapsed():
    for total, expect in ((100, "ETA"), (None, "elapsed")):
        buf = io.StringIO()
        console = Console(file=buf, width=160, force_terminal=False)
        with ProgressBar("working", total=total, unit="records", console=console) as bar:
            bar.advance(40, note="n")
        text = buf.getvalue()
        assert "working" in text and "40" in text and "records/s" in text and expect in text, text
        assert bar.completed == 40 and "40 records in" in bar.summary()


def test_a_resumed_progress_bar_rates_only_this_runs_work():
    buf = io.StringIO()
    with ProgressBar("recounting", total=60_000, unit="counters", completed=59_990,
                     console=Console(file=buf, width=160, force_terminal=False)) as bar:
        bar.advance(1)
        task = bar._progress.tasks[0]
        task.start_time = task.get_time() - 0.5  # half a second into the run, before rich has a speed window
        assert _RateColumn().render(task).plain == "2 counters/s"


def test_a_recount_behind_a_standing_watermark_asks_the_workers_to_move_it(stores):
    """Idle workers send no heartbeats once every write is covered, so the watermark stands at the boundary the
    stored rollup already has: a drifted counter is behind until the recount asks for heartbeats."""
    events, rollups = stores
    standing = {"mark": WATERMARK}
    _seed(events, rollups, stored=50, stored_ts=rollup_boundary(NOW, WATERMARK, EV))
    asked: list[int] = []

    async def watermark() -> int:
        return standing["mark"]

    async def ask() -> None:  # what a worker does when asked: heartbeats, and the watermark moves on
        asked.append(standing["mark"])
        standing["mark"] += MICROS

    recounter = Recounter(REGISTRY, events, rollups, None, watermark, retry_interval_s=0, ask_watermark=ask)
    first = run(recounter.once("ev", "c"))
    assert first.action == "behind"
    (final,) = run(recounter.retry(wait_s=5))
    assert asked == [WATERMARK] and final.action == "written" and run(rollups.get("ev", "c")).count == 102

    quiet = Recounter(REGISTRY, events, rollups, None, watermark, retry_interval_s=0, ask_watermark=ask)
    assert run(quiet.retry(wait_s=5)) == [] and asked == [WATERMARK]  # nothing pending: nobody is woken


def test_a_counter_with_neither_rollup_nor_event_is_unknown_not_missing(stores):
    """A review: `counter recount my_dataset 'bad name' --dry-run` reported 1 counter missing a rollup row, to be
    fixed by running it again, for a counter nobody wrote."""
    events, rollups = stores
    r = recount(events, rollups, dry_run=True)
    assert (r.status, r.action, r.recomputed) == ("unknown", "skipped", None)
    assert run(rollups.get("ev", "c")) is None
    _seed(events, rollups, stored=None)  # written since, its row lost: missing, as before
    assert recount(events, rollups, dry_run=True).status == "missing"
