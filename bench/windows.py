"""Window reads: a 30-day GetCount next to a plain GetCount, over HTTP at concurrency 32, in the same run.

    python -m bench.windows [--duration 5] [--concurrency 32] [--counters 100] [--rounds 3]

Each counter gets 30 days of history as buckets (every minute of the last 48 hours, every hour of the last 30
days, every day), written straight into the local stack's bucket store, and a rollup state so reads have an
`as_of`. Then, in interleaved rounds: GetCount of the total (cached: the baseline), and GetCount with
`{"window": {"last": "30d"}}`, answered from the coarsest buckets that tile the window (days, then hours, then
minutes at the edges). Before measuring, every counter's 30-day answer is checked against the seeded values.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

from bench.common import console, local_stack, progress_bar, write_result
from bench.loadgen import http_load, http_post
from bench.rounds import median_ratio, medians, run_rounds
from sinks import BUCKETS_FILE, ROLLUPS_FILE, SqliteRollupStore
from sinks.sqlite.buckets import SqliteBucketStore
from sinks.windows import Granularity

NS = "my_dataset"
MICROS = 1_000_000
DAYS = 30


def seed(data_dir: Path, counters: list[str], now_us: int) -> int:
    """Buckets of value 1 per minute (hours 60, days 1,440) over 30 days for every counter; returns the
    boundary they were computed at."""
    boundary = now_us - 10 * MICROS

    async def run() -> None:
        buckets = SqliteBucketStore(data_dir / BUCKETS_FILE)
        rollups = SqliteRollupStore(data_dir / ROLLUPS_FILE)
        try:
            day0 = boundary - boundary % Granularity.DAY.width_us - DAYS * Granularity.DAY.width_us
            rows = []
            for g, value, since in ((Granularity.DAY, 1440, day0), (Granularity.HOUR, 60, day0),
                                    (Granularity.MINUTE, 1, boundary - 48 * 3600 * MICROS)):
                start = since - since % g.width_us
                for s in range(start, boundary - boundary % g.width_us, g.width_us):
                    rows.append((g, s, value))
            with progress_bar("seeding buckets", len(counters), "counter") as update:
                for i, c in enumerate(counters):
                    await buckets.write_buckets(NS, [(c, g, s, v, boundary) for g, s, v in rows])
                    update(i + 1)
            await rollups.bump_last_write([(NS, c, boundary) for c in counters])
            await rollups.write_rollups(NS, [(c, DAYS * 1440, boundary) for c in counters])
        finally:
            await buckets.close()
            await rollups.close()
    asyncio.run(run())
    return boundary


def run(duration: float, concurrency: int, counters: int, rounds: int) -> dict:
    names = [f"win-{i}" for i in range(counters)]
    with tempfile.TemporaryDirectory(prefix="bench-windows-") as tmp, local_stack(Path(tmp)) as stack:
        api = stack.apis[0]
        seed(Path(tmp), names, time.time_ns() // 1000)
        plain = [http_post("/v1/GetCount", json.dumps({"namespace": NS, "counter_name": n}).encode()) for n in names]
        window = [http_post("/v1/GetCount", json.dumps({"namespace": NS, "counter_name": n,
                                                        "window": {"last": f"{DAYS}d"}}).encode()) for n in names]
        with httpx.Client(base_url=f"http://{api.address}", timeout=30) as client:
            answers = [client.post("/v1/GetCount", json={"namespace": NS, "counter_name": n,
                                                         "window": {"last": f"{DAYS}d"}}).json() for n in names]
        for a in answers:
            start = datetime.fromisoformat(a["window"]["start"]).timestamp()
            end = datetime.fromisoformat(a["window"]["end"]).timestamp()
            minutes = int(end - start) // 60
            if not minutes - 3 <= a["count"] <= minutes:  # one per seeded minute; the newest minutes are unseeded
                raise SystemExit(f"wrong 30-day count {a['count']} for a window of {minutes} minutes: {a}")
        with progress_bar("warm-up", None) as update:
            http_load(api.host, api.port, plain + window, concurrency=concurrency, duration_s=2, on_progress=update)
        console.print(f"GetCount over HTTP at concurrency {concurrency}, {duration:g} s per phase, {rounds} rounds:")
        per_round = run_rounds({
            "getcount_total": ("GetCount, total (baseline)", lambda **kw: http_load(
                api.host, api.port, plain, concurrency=concurrency, **kw)),
            "getcount_30d": (f"GetCount, window last {DAYS}d", lambda **kw: http_load(
                api.host, api.port, window, concurrency=concurrency, **kw)),
        }, rounds=rounds, duration_s=duration)
    results = {key: medians(values) for key, values in per_round.items()}
    w, base = results["getcount_30d"], results["getcount_total"]
    w["ratio_to_total"] = median_ratio(per_round, "getcount_30d", "getcount_total")
    w["p99_to_total"] = w["p99_ms"] / base["p99_ms"] if base["p99_ms"] else float("nan")
    console.print(f"medians of {rounds} rounds: total {base['throughput_per_s']:,.0f}/s p50 {base['p50_ms']:.2f} ms "
                  f"p99 {base['p99_ms']:.2f} ms; 30-day window {w['throughput_per_s']:,.0f}/s p50 {w['p50_ms']:.2f} ms "
                  f"p99 {w['p99_ms']:.2f} ms ({w['ratio_to_total']:.0%} of the total's rate, p99 "
                  f"{w['p99_to_total']:.2f}x)")
    return {"concurrency": concurrency, "duration_s": duration, "counters": counters, "rounds": rounds,
            "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="counter bench windows", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement (default 5)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--counters", type=int, default=100, help="counters with 30 days of buckets (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians reported (default 3)")
    args = parser.parse_args(argv)
    write_result("windows", run(args.duration, args.concurrency, args.counters, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
