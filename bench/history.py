"""History: rollup cost must depend on new events only, not on how many old ones a counter has.

    python -m bench.history [--events 10000000] [--repeat 200]

Counter `old` gets N events in the past and is rolled up past them; counter `fresh` has none. Both then get
the same 10 new events, and the rollup of the window (rollup_ts, B] is timed for each (median of --repeat
runs on the real SQLite event store). The 10-event counter is the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import console, progress_bar, write_result
from control_plane import parse_namespaces
from sinks import Partitioning, apply_aggregate, open_namespace_stores

REGISTRY = parse_namespaces({"namespaces": {"hist": {"counter_type": "EVENTUAL", "cardinality": "HIGH"}}})
BATCH = 50_000


async def run_async(n: int, repeat: int, data_dir: Path) -> dict:
    events, rollups, buckets = open_namespace_stores("sqlite", data_dir, REGISTRY)
    part = Partitioning.of(REGISTRY["hist"].time_partition)
    now = time.time_ns() // 1000
    start = now - 3 * 24 * 3600 * 1_000_000  # three days of history
    step = max(1, (now - 3600 * 1_000_000 - start) // max(n, 1))
    with progress_bar("writing old events", n, "event") as update:
        for i in range(0, n, BATCH):
            rows = [("hist", "old", start + j * step, f"e{j}", "", 1, False) for j in range(i, min(n, i + BATCH))]
            await events.write_events(rows)
            update(min(n, i + BATCH))
    old_boundary = now - 3600 * 1_000_000
    agg = await events.aggregate("hist", "old", 0, old_boundary)
    await rollups.write_rollup("hist", "old", apply_aggregate(0, agg), old_boundary)
    await rollups.write_rollup("hist", "fresh", 0, old_boundary)
    new = [(c, now - 60_000_000 + k, f"n{k}", "", 1, False) for c in ("old", "fresh") for k in range(10)]
    await events.write_events([("hist", c, t, e, key, d, clr) for c, t, e, key, d, clr in new])
    boundary = now

    async def one_rollup(counter: str) -> float:
        state = await rollups.get("hist", counter)
        assert state is not None  # written above
        started = time.perf_counter()
        agg = await events.aggregate("hist", counter, state.rollup_ts, boundary)
        apply_aggregate(state.count, agg)
        return time.perf_counter() - started

    timings: dict[str, list[float]] = {"old": [], "fresh": []}
    with progress_bar("timing rollups", repeat * 2, "rollup") as update:
        for i in range(repeat):
            for counter in ("fresh", "old"):  # interleaved: the machine's noise hits both alike
                timings[counter].append(await one_rollup(counter))
            update(2 * i + 2)
    await events.close()
    await rollups.close()
    await buckets.close()
    med_old, med_fresh = statistics.median(timings["old"]), statistics.median(timings["fresh"])
    console.print(f"  rollup of 10 new events, counter with {n:,} old events: {med_old * 1e6:9.1f} µs (median)")
    console.print(f"  rollup of 10 new events, counter with no history:     {med_fresh * 1e6:9.1f} µs (baseline)")
    console.print(f"  ratio {med_old / med_fresh:.2f}x (target <= 2x); partitioning {part}")
    return {"old_events": n, "repeat": repeat, "median_old_us": med_old * 1e6, "median_fresh_us": med_fresh * 1e6,
            "ratio": med_old / med_fresh, "p90_old_us": statistics.quantiles(timings["old"], n=10)[-1] * 1e6,
            "p90_fresh_us": statistics.quantiles(timings["fresh"], n=10)[-1] * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="counter bench history", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000_000, help="old events of the big counter")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-history-") as tmp:
        write_result("history", asyncio.run(run_async(args.events, args.repeat, Path(tmp))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
