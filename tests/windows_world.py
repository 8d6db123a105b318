"""A counter service's stores on real SQLite files, driven by hand as the worker would drive them, for the tests
of `counter recount` and `counter audit --by` over time buckets.

Times are real (recount and audit read the clock for retention): events lie before ``now``, the persist
watermark is set to ``now`` so a recount's boundary is ``now - accept_limit - 1`` whatever the test's speed.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.rollup import rollup_counters
from agents.windows import BucketWork, maintain_buckets
from control_plane import Namespace, parse_namespaces
from control_plane.admission import rollup_boundary
from jobs.runtime import Runtime
from sinks import (
    BUCKETS_FILE,
    EVENTS_FILE,
    ROLLUPS_FILE,
    EventRow,
    InProcessRollupCache,
    Partitioning,
    SqliteBucketStore,
    SqliteEventStore,
    SqliteRollupStore,
)
from sinks.windows import CHAIN, Granularity, masked
from streams.settings import load_settings

S = 1_000_000
M, H, D = 60 * S, 3600 * S, 86400 * S
MINUTE, HOUR, DAY = Granularity.MINUTE, Granularity.HOUR, Granularity.DAY
TOPIC = "counter-mutations"

_COMMON: dict[str, Any] = {
    "counter_type": "EVENTUAL", "accept_limit": "2s", "max_clock_skew": "500ms",
    "time_partition": {"buckets_per_id": 2, "seconds_per_bucket": 300, "seconds_per_slice": 3600},
}
CONFIG: dict[str, Any] = {"namespaces": {
    # events kept a week, minutes 48 h, hours 90 days, days forever (the presets' windows)
    "win": {**_COMMON, "retention": {"close_after": "1h", "delete_after": "7d"},
            "windows": {"retention": {"minute": "48h", "hour": "90d", "day": "forever"}}},
    # events deleted after 3 h, minutes kept 2 h: older hours cannot be recomputed any more
    "short": {**_COMMON, "retention": {"close_after": "1h", "delete_after": "3h"},
              "windows": {"retention": {"minute": "2h", "hour": "2d", "day": "forever"}}},
}}
REGISTRY = parse_namespaces(CONFIG)


def now_us() -> int:
    return time.time_ns() // 1000


def ev(ns: str, counter: str, t: int, eid: str, delta: int = 1, *, clear: bool = False) -> EventRow:
    return (ns, counter, t, eid, "", 0 if clear else delta, clear)


def oracle(rows: Sequence[EventRow], ns: str, counter: str, upto: int
           ) -> tuple[dict[Granularity, dict[int, int]], int | None, int]:
    """Every bucket of ``counter`` as of ``upto`` from first principles (the first write of an identity wins;
    a minute sums its adds after its latest clear; an hour its minutes, a day its hours, as read after the
    latest clear), the latest clear and the total."""
    distinct: dict[tuple, EventRow] = {}
    for r in rows:
        distinct.setdefault(r[:5], r)
    mine = [r for r in distinct.values() if r[0] == ns and r[1] == counter and r[2] <= upto]
    last = max((r[2] for r in mine if r[6]), default=None)
    out: dict[Granularity, dict[int, int]] = {g: {} for g in CHAIN}
    by_minute: dict[int, list[EventRow]] = {}
    for r in mine:
        by_minute.setdefault(r[2] // M * M, []).append(r)
    for start, evs in by_minute.items():
        clear = max((r[2] for r in evs if r[6]), default=None)
        out[MINUTE][start] = sum(r[5] for r in evs if not r[6] and (clear is None or r[2] > clear))
    for child, parent in ((MINUTE, HOUR), (HOUR, DAY)):
        for start, value in out[child].items():
            key = start // parent.width_us * parent.width_us
            out[parent][key] = out[parent].get(key, 0) + masked(child, start, value, last)
    total = sum(r[5] for r in mine if not r[6] and (last is None or r[2] > last))
    return out, last, total


class World:
    """Event, rollup and bucket stores in ``directory`` (the files `counter` opens there) and a Runtime for the
    jobs, with the persist watermark at ``now``."""

    def __init__(self, directory: Path, now: int) -> None:
        self.directory = directory
        self.now = now
        self.rows: list[EventRow] = []  # what a test wrote (for its oracle)
        self.last_step = 0  # the worker's last boundary
        self.loop = asyncio.new_event_loop()
        self.events = SqliteEventStore(directory / EVENTS_FILE,
                                       lambda name: Partitioning.of(REGISTRY[name].time_partition))
        self.rollups = SqliteRollupStore(directory / ROLLUPS_FILE)
        self.buckets = SqliteBucketStore(directory / BUCKETS_FILE)
        self.runtime = Runtime(load_settings(data_dir=directory, mutations_topic=TOPIC), REGISTRY, self.events,
                               self.rollups, self.buckets, None, "no cache", mutation_partitions=1)
        self.run(self.rollups.set_watermarks(TOPIC, {0: now}))

    def run(self, awaitable):
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        self.run(self.runtime.close())
        self.loop.close()

    def write(self, rows: Sequence[EventRow]) -> None:
        for i in range(0, len(rows), 200):
            self.run(self.events.write_events(rows[i:i + 200]))

    def recount_boundary(self, ns: Namespace) -> int:
        """The boundary a recount run now reaches: behind the watermark (``now``), which trails the clock."""
        return rollup_boundary(now_us(), self.now, ns)

    def worker_step(self, ns: Namespace, counters: Sequence[str], boundary: int) -> None:
        """One rollup step of the worker to ``boundary``, when it was current: the buckets first
        (agents.windows), then the rollups (agents.rollup), both over the same window."""
        states = self.run(self.rollups.get_many([(ns.name, c) for c in counters]))
        work = []
        for c in counters:
            state = states.get((ns.name, c))
            ts = state.rollup_ts if state is not None else 0
            agg = self.run(self.events.aggregate(ns.name, c, ts, boundary))
            work.append(BucketWork(c, ts, boundary, agg.last_clear_us))
        self.run(maintain_buckets(ns, work, events=self.events, buckets=self.buckets, now_us=boundary + 3 * S))
        results = self.run(rollup_counters(ns, list(counters), events=self.events, rollups=self.rollups,
                                           cache=InProcessRollupCache(),
                                           watermark_us=boundary + int(ns.accept_limit_s * S) + 1,
                                           now_us=boundary + D))
        assert all(r.rollup_ts == boundary for r in results), results

    # -- buckets as stored, and by hand ---------------------------------------------------------------

    def stored(self, ns: str, counter: str) -> dict[tuple[Granularity, int], tuple[int, int]]:
        """(granularity, start) -> (value, computed_upto) of every stored bucket of the counter."""
        ranges = [(counter, g, 0, 2**62) for g in CHAIN]
        found = self.run(self.buckets.read_buckets_many(ns, ranges))
        return {(g, s): (v, u) for g, rows in zip(CHAIN, found, strict=True) for s, v, u in rows}

    def clear(self, ns: str, counter: str) -> int | None:
        return self.run(self.buckets.clears(ns, [counter])).get(counter)

    def read(self, ns: str, counter: str) -> dict[tuple[Granularity, int], int]:
        """Every stored bucket as a reader sees it (masked by the stored clear)."""
        last = self.clear(ns, counter)
        return {(g, s): masked(g, s, v, last) for (g, s), (v, _u) in self.stored(ns, counter).items()}

    def sql(self, statement: str, *params: object) -> int:
        """Change the bucket file behind the store's back (another process, as corruption would)."""
        conn = sqlite3.connect(self.directory / BUCKETS_FILE, timeout=30)
        try:
            changed = conn.execute(statement, params).rowcount
            conn.commit()
            return changed
        finally:
            conn.close()

    def set_bucket(self, ns: str, counter: str, g: Granularity, start: int, value: int,
                   computed_upto: int | None = None) -> None:
        if computed_upto is None:
            assert self.sql("UPDATE buckets SET value = ? WHERE namespace = ? AND counter = ? AND granularity = ? "
                            "AND start_us = ?", value, ns, counter, g.value, start) == 1
        else:
            self.sql("INSERT OR REPLACE INTO buckets (namespace, counter, granularity, start_us, value, "
                     "computed_upto) VALUES (?, ?, ?, ?, ?, ?)", ns, counter, g.value, start, value, computed_upto)

    def drop_bucket(self, ns: str, counter: str, g: Granularity, start: int) -> None:
        assert self.sql("DELETE FROM buckets WHERE namespace = ? AND counter = ? AND granularity = ? AND "
                        "start_us = ?", ns, counter, g.value, start) == 1
