"""The jobs apart from the CLI: what they report through `Progress`, how a stop signal stops them, and how
they resume from their state files (SQLite stores, no broker). The CLI's rich implementation at the end."""

from __future__ import annotations

import asyncio
import io

import pytest
from rich.console import Console

from control_plane import parse_namespaces
from counter_cli.progress import RichProgress
from jobs.audit import AuditOptions, RowWriter, audit, last_row
from jobs.progress import NullProgress, Progress
from jobs.recount import CounterRecount, RecountError, RecountJob, RecountOptions
from jobs.runtime import Runtime
from schemas import MICROS
from sinks import Partitioning, SqliteBucketStore, SqliteEventStore, SqliteRollupStore
from streams.settings import load_settings

REGISTRY = parse_namespaces({"namespaces": {
    "ev": {"counter_type": "EVENTUAL", "accept_limit": "2s", "max_clock_skew": "500ms",
           "time_partition": {"buckets_per_id": 4, "seconds_per_bucket": 10, "seconds_per_slice": 60}},
    "be": {"counter_type": "BEST_EFFORT"},
}})
T = 1_700_000_000 * MICROS
TOPIC = "counter-mutations"


def run(coro):
    return asyncio.run(coro)


class FakeProgress:
    """Records every call, as (method, args...)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def start(self, description, *, total=None, unit="records", completed=0):
        self.calls.append(("start", description, total, unit, completed))

    def advance(self, n=1, *, note=None):
        self.calls.append(("advance", n))

    def update(self, *, total=None, note=None):
        self.calls.append(("update", total, note))

    def log(self, message, *, level="info"):
        self.calls.append(("log", message, level))

    def finish(self):
        self.calls.append(("finish",))

    def of(self, method: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == method]


def test_the_fakes_implement_the_protocol():
    progress: Progress = FakeProgress()  # a type checker checks the protocol; here: the same methods
    for method in ("start", "advance", "update", "log", "finish"):
        assert callable(getattr(progress, method)) and callable(getattr(NullProgress(), method))
        assert callable(getattr(RichProgress(Console(file=io.StringIO())), method))


@pytest.fixture
def runtime(tmp_path):
    part = Partitioning(4, 10, 60)
    events = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: part)
    rollups = SqliteRollupStore(tmp_path / "rollups.sqlite3")
    buckets = SqliteBucketStore(tmp_path / "buckets.sqlite3")
    rt = Runtime(load_settings(data_dir=tmp_path, mutations_topic=TOPIC), REGISTRY, events, rollups, buckets,
                 None, "no cache", mutation_partitions=1)
    run(rollups.set_watermarks(TOPIC, {0: T + 60 * MICROS}))
    yield rt
    run(rt.close())


def seed(rt: Runtime, counters: int) -> dict[str, int]:
    """Counter c<i> gets i+1 events of delta 1 and a wrong stored rollup (100 before them): all drifted."""
    rows = [("ev", f"c{i:02d}", T + k, f"t{i}-{k}", "", 1, False) for i in range(counters) for k in range(i + 1)]
    run(rt.events.write_events(rows))
    for i in range(counters):
        run(rt.rollups.write_rollup("ev", f"c{i:02d}", 100, T - 1))
    return {f"c{i:02d}": i + 1 for i in range(counters)}


def test_recount_reports_through_progress_and_each_counter_once(runtime):
    expected = seed(runtime, 5)
    progress, reported = FakeProgress(), []
    summary = run(RecountJob(RecountOptions("ev", all=True), runtime, report=reported.append,
                             progress=progress).run())
    assert not summary.interrupted and summary.total == 5 and summary.not_written == 0
    assert (summary.count("drift"), summary.count("action:written"), summary.drifted) == (5, 5, 5)
    assert {r.counter: r.count for r in reported} == expected
    assert all(isinstance(r, CounterRecount) and r.action == "written" for r in reported)
    assert progress.of("start") == [("start", "recounting", 5, "counters", 0)]
    assert [c[1] for c in progress.of("advance")] == [1] * 5 and progress.calls[-1] == ("finish",)
    assert [c[1].split(" ")[0] for c in progress.of("log")] == ["recounting"]
    assert not RecountOptions("ev", all=True).state_path(runtime.settings.data_dir).exists()  # done: no state


def test_a_stopped_recount_saves_its_place_and_resumes_after_it(runtime):
    expected = seed(runtime, 6)
    opts = RecountOptions("ev", all=True, dry_run=True)
    reported: list[CounterRecount] = []
    seen = []

    def stop_after_two() -> bool:
        return len(reported) >= 2

    first = run(RecountJob(opts, runtime, report=reported.append, stop=stop_after_two).run())
    assert first.interrupted and first.after == "c01" and len(reported) == 2
    assert opts.state_path(runtime.settings.data_dir).exists()
    progress = FakeProgress()
    again = run(RecountJob(opts, runtime, report=seen.append, progress=progress).run())
    assert not again.interrupted and [r.counter for r in seen] == sorted(expected)[2:]
    assert again.count("counters") == 6 and again.count("drift") == 6  # tallies carried over from the first run
    assert progress.of("start") == [("start", "checking", 6, "counters", 2)]  # the bar starts at 2 of 6
    assert progress.of("log")[0][1] == "resuming an interrupted recount after counter 'c01' (--restart to start over)"
    assert all(r.action == "dry-run" for r in reported + seen)


def test_recount_refuses_unknown_and_best_effort_namespaces(runtime):
    for ns, why in (("nope", "unknown namespace 'nope'"), ("be", "is BEST_EFFORT")):
        with pytest.raises(RecountError, match=why):
            run(RecountJob(RecountOptions(ns, all=True), runtime).run())


def test_audit_reports_progress_and_a_stop_ends_on_a_whole_group_that_resumes(runtime, tmp_path, monkeypatch):
    import jobs.audit

    monkeypatch.setattr(jobs.audit, "PAGE", 4)  # several pages
    rows = [("ev", "a", T + i // 2, f"t{i}", "", 1, False) for i in range(10)]  # groups of two per event_time
    run(runtime.events.write_events(rows))
    path = tmp_path / "audit.jsonl"
    opts = AuditOptions("ev", "a")
    progress = FakeProgress()
    with path.open("a") as out:
        stopped = run(audit(runtime.events, runtime.rollups, opts, RowWriter(out, "jsonl", True),
                            progress=progress, stop=lambda: True))
    assert stopped.interrupted and stopped.at_rollup is None
    assert progress.of("start") == [("start", "auditing", None, "events", 0)] and progress.calls[-1] == ("finish",)
    written = stopped.tally.events
    assert written == sum(c[1] for c in progress.of("advance")) and written % 2 == 0 and 0 < written < 10
    assert last_row(path, "jsonl") == {"event_time_us": T + written // 2 - 1, "running_total": written}
    with path.open("a") as out:
        done = run(audit(runtime.events, runtime.rollups, opts.resumed(path, "jsonl"),
                         RowWriter(out, "jsonl", False)))
    # the last group of the stopped run is exported again (a hard stop could have cut it short)
    assert not done.interrupted and done.tally.total == 10 and done.tally.events == 10 - written + 2
    assert last_row(path, "jsonl") == {"event_time_us": T + 4, "running_total": 10}
    assert len(path.read_text().splitlines()) == 10


def test_rich_progress_draws_one_bar_per_phase_and_logs_plain_text():
    buf = io.StringIO()
    progress = RichProgress(Console(file=buf, width=160, force_terminal=False))
    with progress:
        progress.log("reading [not markup]")
        progress.start("reading", unit="records")
        progress.advance(3)
        progress.start("writing", total=10, unit="records")  # closes the first phase
        progress.update(total=12, note="half")
        progress.advance(6)
        progress.log("careful", level="warning")
    text = buf.getvalue()
    assert "reading [not markup]" in text and "careful" in text
    assert "reading" in text and "3 records" in text and "6/12 records" in text and "half" in text
    assert progress.summary().startswith("6 records in")
    progress.finish()  # idempotent
