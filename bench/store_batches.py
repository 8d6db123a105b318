"""Store batches: the SQLite stores' many-row calls alone and beside a busy thread of the same process.

    python -m bench.store_batches [--rounds 10]

Why: the worker and the API call the stores from a busy event loop, and Python's sqlite3 hands the GIL over at
every step of a statement (a row written, a row read). Beside a busy thread each hand-over can cost the store's
thread a switch interval (5 ms), so a call made of many steps takes seconds instead of milliseconds. Each call is
timed alone (the baseline, same run) and beside a thread spinning in Python (what a busy event loop does to the
store's thread); the figure is the median of --rounds, and the ratio to the baseline.

The calls: the worker's rollup pass (rollups read and written, 1,000 counters), its windows pass (bucket sums and
bucket items of 300 counters, 50 events each; 2,000 buckets written and read back), AddAndGetCount's live read
(aggregates of 32 counters in one call), a page of a scan (recounts, audits, UNIQUE live reads), the lookups of
read-your-write waits (`EventStore.contains`), a page of counter names (the inspect API, recounts) and a Top-K
round's rank pages (48 hourly lists, 20 entries each).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.common import console, progress_bar, write_result
from sinks import Partitioning
from sinks.sqlite.buckets import SqliteBucketStore
from sinks.sqlite.events import SqliteEventStore
from sinks.sqlite.rollups import SqliteRollupStore
from sinks.windows import Granularity, RankPage

NS = "bench"
MINUTE_US = 60_000_000


class Spinner:
    """A thread running Python without pause while it is on: the GIL's competitor."""

    def __init__(self) -> None:
        self.on = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        n = 0
        while not self._stop:
            if self.on.wait(0.05):
                while self.on.is_set() and not self._stop:
                    n += 1

    def close(self) -> None:
        self._stop = True
        self.on.clear()
        self._thread.join()


async def run_async(rounds: int, data_dir: Path) -> dict:
    part = Partitioning(buckets_per_id=1, seconds_per_bucket=60, seconds_per_slice=86_400)
    events = SqliteEventStore(data_dir / "events.sqlite3", lambda ns: part)
    rollups = SqliteRollupStore(data_dir / "rollups.sqlite3")
    buckets = SqliteBucketStore(data_dir / "buckets.sqlite3")
    now = time.time_ns() // 1000
    rows = [(NS, f"c{c}", now - 7_000_000 * j, uuid.uuid4().hex, f"u{j}", 1, False)
            for c in range(300) for j in range(50)]
    await events.write_events(rows)
    await events.write_events([(NS, "scanned", now - 300_000 * j, f"s{j}", "", 1, False) for j in range(10_000)])
    identities = [(c, t, eid, key) for _ns, c, t, eid, key, _d, _clear in rows[::15]]  # 1,000 stored events
    windows = [(f"c{c}", now - 3_600_000_000, now + 1) for c in range(300)]
    counters = [(NS, f"c{c}") for c in range(1000)]
    hour_us = Granularity.HOUR.width_us
    await buckets.write_buckets(NS, [(f"r{c}", Granularity.HOUR, h * hour_us, (c * 7919 + h * 104729) % 5000, 1)
                                     for c in range(1000) for h in range(48)])  # rank lists: 48 hours of 1,000
    rank_pages = [RankPage("", Granularity.HOUR, h * hour_us, None, 20) for h in range(48)]
    round_no = [0]

    async def write_rollups() -> None:
        round_no[0] += 1
        await rollups.write_rollups(NS, [(c, round_no[0], round_no[0]) for _ns, c in counters])

    async def write_buckets() -> None:
        round_no[0] += 1
        await buckets.write_buckets(NS, [(f"c{c}", g, 0, round_no[0], round_no[0]) for c in range(1000)
                                         for g in (Granularity.MINUTE, Granularity.HOUR)])

    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "rollups written (1,000)": write_rollups,
        "rollups read (1,000)": lambda: rollups.get_many(counters),
        "aggregates (32 counters)": lambda: events.aggregate_many(NS, windows[:32]),
        "events scanned (10,000)": lambda: events.scan(NS, "scanned", now - 3_600_000_000, now + 1),
        "events looked up (1,000)": lambda: events.contains(NS, identities),
        "counters listed (301)": lambda: events.counters(NS),
        "bucket sums (300 counters)": lambda: events.bucket_sums_many(NS, windows, MINUTE_US),
        "bucket items (300 counters)": lambda: events.bucket_items_many(NS, windows, MINUTE_US),
        "rank pages read (48 x 20)": lambda: buckets.read_ranks_many(NS, rank_pages),
        "buckets written (2,000)": write_buckets,
        "bucket ranges read (2,000)": lambda: buckets.read_buckets_many(
            NS, [(f"c{c}", g, 0, 1) for c in range(1000) for g in (Granularity.MINUTE, Granularity.HOUR)]),
    }
    for call in calls.values():  # warm: tables, caches, statements
        await call()
    timings: dict[str, dict[str, list[float]]] = {name: {"alone": [], "busy": []} for name in calls}
    spinner = Spinner()
    try:
        with progress_bar("timing store calls", rounds * len(calls) * 2, "call") as update:
            done = 0
            for _ in range(rounds):
                for name, call in calls.items():
                    for mode in ("alone", "busy"):  # interleaved: the machine's noise hits both alike
                        if mode == "busy":
                            spinner.on.set()
                        started = time.perf_counter()
                        await call()
                        timings[name][mode].append(time.perf_counter() - started)
                        spinner.on.clear()
                        done += 1
                        update(done)
    finally:
        spinner.close()
        for store in (events, rollups, buckets):
            await store.close()
    result: dict[str, dict[str, float]] = {}
    for name, t in timings.items():
        alone, busy = statistics.median(t["alone"]), statistics.median(t["busy"])
        result[name] = {"alone_ms": alone * 1e3, "busy_ms": busy * 1e3, "ratio": busy / alone,
                        "busy_p90_ms": statistics.quantiles(t["busy"], n=10)[-1] * 1e3}
        console.print(f"  {name:<28} alone {alone * 1e3:8.1f} ms (baseline)  beside a busy thread "
                      f"{busy * 1e3:8.1f} ms = {busy / alone:6.1f}x  (p90 {result[name]['busy_p90_ms']:.1f} ms)")
    return {"rounds": rounds, "calls": result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="counter bench store-batches", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        write_result("store_batches", asyncio.run(run_async(args.rounds, Path(tmp))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
