"""GetCount latency and throughput over HTTP at concurrency 32, next to raw memcached `get` in the same run.

    python -m bench.read [--duration 10] [--concurrency 32] [--counters 1000] [--rounds 3]

Cached EVENTUAL counters (the rollup is in memcached) and ACCURATE counters (rollup + live delta scan) are
measured after a warm-up. Baselines, from the same load generator: `get` straight to memcached, and the
HTTP floor (`bench.http_floor`, the cheapest Python HTTP endpoint). All phases run once per round; the
figures are medians over the rounds.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import console, http_floor, local_stack, progress_bar, stack_settings, write_result
from bench.loadgen import http_load, http_post, memcached_load
from bench.rounds import load_args, median_ratio, medians, run_rounds
from sinks import SqliteRollupStore, cache_key, scoped_prefix
from sinks.factory import ROLLUPS_FILE
from streams.settings import Settings


async def _cache_prefix(settings: Settings) -> str:
    store = SqliteRollupStore(settings.data_dir / ROLLUPS_FILE)
    try:
        return scoped_prefix(settings.worker_id, await store.identity())
    finally:
        await store.close()


def run(duration: float, concurrency: int, counters: int, rounds: int) -> dict:
    with (tempfile.TemporaryDirectory(prefix="bench-read-") as tmp, local_stack(Path(tmp)) as stack,
          http_floor(Path(tmp)) as floor):
        api = stack.apis[0]
        assert stack.memcached is not None  # local_stack starts it
        mc_host, mc_port = stack.memcached.address.rsplit(":", 1)
        names = [f"bench-{i}" for i in range(counters)]
        with httpx.Client(base_url=f"http://{api.address}", timeout=30) as client:
            with progress_bar("seeding counters", counters * 2, "counter") as update:
                for i, name in enumerate(names):
                    for ns in ("my_dataset", "my_dataset_accurate"):
                        body = {"namespace": ns, "counter_name": name, "delta": i + 1}
                        r = client.post("/v1/AddCount", json=body)
                        r.raise_for_status()
                    update(2 * i + 2)
            console.print("waiting for the EVENTUAL counters to be rolled up and cached...")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                res = client.post("/v1/BatchGetCount", json={"requests": [
                    {"namespace": "my_dataset", "counter_name": n} for n in names]}).json()["results"]
                if all(c["count"] == i + 1 and c["as_of"] for i, c in enumerate(res)):
                    break
                time.sleep(0.5)
            else:
                raise SystemExit("counters did not converge within 120 s")
        eventual = [http_post("/v1/GetCount", json.dumps({"namespace": "my_dataset", "counter_name": n}).encode())
                    for n in names]
        accurate = [http_post("/v1/GetCount", json.dumps({"namespace": "my_dataset_accurate",
                                                          "counter_name": n}).encode()) for n in names]
        prefix = asyncio.run(_cache_prefix(stack_settings(stack)))  # the API's cache keys (sinks.cache.open_cache)
        raw = [f"get {cache_key('my_dataset', n, prefix)}\r\n".encode() for n in names]
        host, port = api.host, api.port
        with progress_bar("warm-up", None) as update:
            http_load(host, port, eventual, concurrency=concurrency, duration_s=2, on_progress=update)
        console.print(f"GetCount over HTTP at concurrency {concurrency}, {duration:.0f} s per phase, "
                      f"{rounds} interleaved rounds:")
        per_round = run_rounds({
            "raw_memcached_get": ("raw memcached get (baseline)", lambda **kw: memcached_load(
                mc_host, int(mc_port), raw, concurrency=concurrency, **kw)),
            "http_floor": ("HTTP floor (no-op uvloop+httptools)", lambda **kw: http_load(
                floor.host, floor.port, eventual, concurrency=concurrency, **kw)),
            "getcount_eventual_cached": ("GetCount EVENTUAL (cached)", lambda **kw: http_load(
                host, port, eventual, concurrency=concurrency, **kw)),
            "getcount_accurate": ("GetCount ACCURATE", lambda **kw: http_load(
                host, port, accurate, concurrency=concurrency, **kw)),
        }, rounds=rounds, duration_s=duration)
    results = {key: medians(values) for key, values in per_round.items()}
    console.print(f"medians of {rounds} rounds:")
    for key in ("getcount_eventual_cached", "getcount_accurate"):
        res = results[key]
        res["ratio_to_raw_get"] = median_ratio(per_round, key, "raw_memcached_get")
        res["ratio_to_http_floor"] = median_ratio(per_round, key, "http_floor")
        console.print(f"  {key}: {res['throughput_per_s']:,.0f}/s, p50 {res['p50_ms']:.2f} ms, "
                      f"p99 {res['p99_ms']:.2f} ms; {res['ratio_to_raw_get']:.1%} of raw memcached get, "
                      f"{res['ratio_to_http_floor']:.1%} of the HTTP floor")
    return {"concurrency": concurrency, "duration_s": duration, "counters": counters, "rounds": rounds,
            "results": results}


def main(argv: list[str] | None = None) -> int:
    args = load_args("counter bench read", __doc__, argv)
    write_result("read", run(args.duration, args.concurrency, args.counters, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
