"""Top-K reads: GetTopK latency next to a plain GetCount, over HTTP at concurrency 32, in the same run.

    python -m bench.topk [--duration 5] [--concurrency 32] [--counters 10000] [--rounds 3] [--k 10]

Seeding: N counters (default 10,000) with a Zipf-skewed load (exponent 1.1, popularity unrelated to names) over the
last 30 days, written straight into the local stack's bucket store as buckets (which keeps their rank lists):
every minute of the last 3 hours, every hour of the last 2 days, every day, each the sum of its children where
they are kept, and a `country=BR` combination of each counter holding about a third of it; the namespace
`my_dataset_topk` (bench/namespaces.yaml) keeps minutes 3 hours and hours 2 days so the seed stays small. A rollup
state per counter gives reads an `as_of`.

Then, in interleaved rounds: GetCount of a counter's total (cached: the baseline), and GetTopK of the last hour,
the last 24 hours, the last 30 days and the last hour of `country=BR`. Before measuring, every GetTopK answer is
checked against an oracle computed here from the seeded buckets (the window the answer covered, tiled as a
windowed GetCount reads it); the rows each one read are printed beside its latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import httpx

from bench.common import NAMESPACES, console, local_stack, progress_bar, write_result
from bench.loadgen import http_load, http_post
from bench.rounds import median_ratio, medians, run_rounds
from control_plane import load_namespaces
from sinks import BUCKETS_FILE, ROLLUPS_FILE, SqliteRollupStore
from sinks.sqlite.buckets import SqliteBucketStore
from sinks.windows import Granularity, align_down, retained_from, tile

NS = "my_dataset_topk"
MICROS = 1_000_000
MINUTE, HOUR, DAY = Granularity.MINUTE, Granularity.HOUR, Granularity.DAY
M, H, D = MINUTE.width_us, HOUR.width_us, DAY.width_us
DAYS = 30
PER_MINUTE = 3000  # writes per minute over all counters
BR_SHARE = 0.33

Seed = dict[tuple[str, Granularity, int], int]  # (counter, granularity, start) -> value


def generate(counters: int, now_us: int, seed: int = 15) -> tuple[Seed, int]:
    """The buckets to seed (base counters and their country=BR combinations) and the boundary they are exact up to."""
    rng = random.Random(seed)
    names = [f"title_{i}" for i in range(counters)]
    ranked = names[:]
    rng.shuffle(ranked)
    total_weight = sum(1 / (r + 1) ** 1.1 for r in range(counters))
    rate = {name: PER_MINUTE / total_weight / (r + 1) ** 1.1 for r, name in enumerate(ranked)}  # writes per minute
    boundary = now_us - 10 * MICROS
    minutes_from = align_down(boundary - 3 * H, HOUR)
    hours_from = align_down(boundary - 3 * D, DAY)  # whole days of hours, so days are sums of their hours
    first_day = align_down(boundary, DAY) - DAYS * D
    out: Seed = {}

    def put(counter: str, g: Granularity, start: int, value: int) -> None:
        if value:
            out[(counter, g, start)] = out.get((counter, g, start), 0) + value

    def draw(mean: float) -> int:
        """A count with the given mean: Poisson for small means, normal beyond."""
        if mean > 30:
            return max(0, round(rng.gauss(mean, mean ** 0.5)))
        n, p, limit = 0, 1.0, pow(2.718281828459045, -mean)
        while True:
            p *= rng.random()
            if p < limit:
                return n
            n += 1

    def split(value: int) -> int:
        return sum(1 for _ in range(value) if rng.random() < BR_SHARE) if value < 200 else round(value * BR_SHARE)

    with progress_bar("generating buckets", counters, "counter") as update:
        for i, name in enumerate(names):
            per_min = rate[name]
            br_name = f"{name} country=BR"
            for t in range(minutes_from, align_down(boundary, MINUTE) + M, M):
                v = draw(per_min * min(1.0, (boundary - t) / M))
                b = split(v)
                for counter, value in ((name, v), (br_name, b)):
                    put(counter, MINUTE, t, value)
                    put(counter, HOUR, align_down(t, HOUR), value)
                    put(counter, DAY, align_down(t, DAY), value)
            for t in range(hours_from, minutes_from, H):
                v = draw(per_min * 60)
                b = split(v)
                for counter, value in ((name, v), (br_name, b)):
                    put(counter, HOUR, t, value)
                    put(counter, DAY, align_down(t, DAY), value)
            for t in range(first_day, hours_from, D):
                v = draw(per_min * 1440)
                put(name, DAY, t, v)
                put(br_name, DAY, t, split(v))
            if i % 200 == 0:
                update(i)
        update(counters)
    return out, boundary


def seed(data_dir: Path, buckets: Seed, boundary: int, now_us: int) -> None:
    """Write the buckets still within their retention, and a converged rollup state per counter."""
    ns = load_namespaces(NAMESPACES)[NS]
    floors = {g: retained_from(g, now_us, ns.windows.retention_s(g.value)) or 0 for g in (MINUTE, HOUR, DAY)}
    rows = [(c, g, s, v, boundary) for (c, g, s), v in buckets.items() if s >= floors[g]]
    totals: dict[str, int] = defaultdict(int)
    for (c, g, _s), v in buckets.items():
        if g is DAY:
            totals[c] += v

    async def run() -> None:
        store = SqliteBucketStore(data_dir / BUCKETS_FILE)
        rollups = SqliteRollupStore(data_dir / ROLLUPS_FILE)
        try:
            with progress_bar("seeding buckets and rank lists", len(rows), "row") as update:
                for i in range(0, len(rows), 20_000):
                    await store.write_buckets(NS, rows[i:i + 20_000])
                    update(min(i + 20_000, len(rows)))
            await rollups.bump_last_write([(NS, c, boundary) for c in totals])
            await rollups.write_rollups(NS, [(c, n, boundary) for c, n in totals.items()])
        finally:
            await store.close()
            await rollups.close()
    asyncio.run(run())


def oracle(buckets: Seed, start_us: int, end_us: int, signature: str, k: int, now_us: int) -> list[list]:
    """The top k of the seeded buckets over the window [start, end), read as a windowed GetCount reads it."""
    ns = load_namespaces(NAMESPACES)[NS]
    chain = (MINUTE, HOUR, DAY)
    floors = {g: retained_from(g, now_us, ns.windows.retention_s(g.value)) for g in chain}
    tiling = tile(start_us, end_us, chain, floors)
    if (tiling.start_us, tiling.end_us) != (start_us, end_us):
        raise SystemExit(f"the answer's window [{start_us}, {end_us}) is not a tiled one: {tiling}")
    wanted = {(seg.granularity, s) for seg in tiling.segments
              for s in range(seg.start_us, seg.end_us, seg.granularity.width_us)}
    sums: dict[str, int] = defaultdict(int)
    for (counter, g, s), v in buckets.items():
        base, _, sig = counter.partition(" ")
        if sig == signature and (g, s) in wanted:
            sums[base] += v
    ranked = sorted(((c, n) for c, n in sums.items() if n > 0), key=lambda e: (-e[1], e[0]))[:k]
    return [[c, n] for c, n in ranked]


def _at(text: str) -> int:
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * MICROS)


QUERIES: dict[str, tuple[str, dict[str, str], dict[str, str]]] = {  # key: (label, window, dimensions)
    "topk_1h": ("GetTopK, last 1h", {"last": "1h"}, {}),
    "topk_24h": ("GetTopK, last 24h", {"last": "24h"}, {}),
    "topk_30d": ("GetTopK, last 30d", {"last": "30d"}, {}),
    "topk_1h_br": ("GetTopK, last 1h, country=BR", {"last": "1h"}, {"country": "BR"}),
}


def run(duration: float, concurrency: int, counters: int, rounds: int, k: int) -> dict:
    now = time.time_ns() // 1000
    buckets, boundary = generate(counters, now)
    with tempfile.TemporaryDirectory(prefix="bench-topk-") as tmp, local_stack(Path(tmp)) as stack:
        api = stack.apis[0]
        seed(Path(tmp), buckets, boundary, now)
        names = [f"title_{i}" for i in range(counters)]
        plain = [http_post("/v1/GetCount", json.dumps({"namespace": NS, "counter_name": n}).encode()) for n in names]
        bodies: dict[str, dict[str, object]] = {
            key: {"namespace": NS, "k": k, "window": window, **({"dimensions": dims} if dims else {})}
            for key, (_label, window, dims) in QUERIES.items()}
        cost: dict[str, dict[str, int]] = {}
        with httpx.Client(base_url=f"http://{api.address}", timeout=60) as client:
            for key, body in bodies.items():
                answer = client.post("/v1/GetTopK", json=body).json()
                start, end = _at(answer["window"]["start"]), _at(answer["window"]["end"])
                dims = QUERIES[key][2]
                signature = " ".join(f"{a}={b}" for a, b in sorted(dims.items()))
                got = [[e["counter_name"], e["count"]] for e in answer["items"]]
                expected = oracle(buckets, start, end, signature, k, time.time_ns() // 1000)
                if got != expected:
                    raise SystemExit(f"{key}: GetTopK answered {got[:5]}..., the seeded buckets say {expected[:5]}...")
                cost[key] = {"rows_read": answer["rows_read"], "candidates": answer["candidates"]}
                console.print(f"  {QUERIES[key][0]:<30} exact; read {answer['rows_read']:,} rows, verified "
                              f"{answer['candidates']} candidates (of {counters:,} counters)")
        requests = {key: [http_post("/v1/GetTopK", json.dumps(body).encode())] for key, body in bodies.items()}
        with progress_bar("warm-up", None) as update:
            http_load(api.host, api.port, plain + [r for rs in requests.values() for r in rs],
                      concurrency=concurrency, duration_s=2, on_progress=update)
        console.print(f"over HTTP at concurrency {concurrency}, {duration:g} s per phase, {rounds} rounds:")
        phases = {"getcount_total": ("GetCount, total (baseline)", lambda **kw: http_load(
            api.host, api.port, plain, concurrency=concurrency, **kw))}
        for key, (label, _w, _d) in QUERIES.items():
            phases[key] = (label, lambda key=key, **kw: http_load(api.host, api.port, requests[key],
                                                                   concurrency=concurrency, **kw))
        per_round = run_rounds(phases, rounds=rounds, duration_s=duration)
    results = {key: medians(values) for key, values in per_round.items()}
    base = results["getcount_total"]
    console.print(f"medians of {rounds} rounds (k={k}, {counters:,} counters): GetCount total "
                  f"{base['throughput_per_s']:,.0f}/s p50 {base['p50_ms']:.2f} ms p99 {base['p99_ms']:.2f} ms")
    for key in QUERIES:
        r = results[key]
        r["ratio_to_total"] = median_ratio(per_round, key, "getcount_total")
        r.update(cost[key])
        console.print(f"  {QUERIES[key][0]:<30} {r['throughput_per_s']:>8,.0f}/s p50 {r['p50_ms']:7.2f} ms "
                      f"p99 {r['p99_ms']:7.2f} ms ({r['ratio_to_total']:.0%} of GetCount's rate), "
                      f"{r['rows_read']:,} rows read")
    return {"concurrency": concurrency, "duration_s": duration, "counters": counters, "rounds": rounds, "k": k,
            "seeded_buckets": len(buckets),
            "median_rows_read": statistics.median(c["rows_read"] for c in cost.values()), "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="counter bench topk", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement (default 5)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--counters", type=int, default=10_000, help="counters seeded (default 10,000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians reported (default 3)")
    parser.add_argument("--k", type=int, default=10, help="GetTopK's k (default 10)")
    args = parser.parse_args(argv)
    write_result("topk", run(args.duration, args.concurrency, args.counters, args.rounds, args.k))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
