"""GetCount latency and throughput over HTTP at concurrency 32, next to raw memcached `get` in the same run.

    python -m bench.read [--duration 10] [--concurrency 32] [--counters 1000]

Cached EVENTUAL counters (the rollup is in memcached) and ACCURATE counters (rollup + live delta scan) are
measured after a warm-up; the baseline is the same load generator sending `get` straight to memcached.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import console, http_floor, local_stack, progress_bar, write_result
from bench.loadgen import LoadResult, http_load, http_post, memcached_load
from sinks.cache import cache_key


def _show(name: str, r: LoadResult) -> dict[str, float]:
    s = r.summary()
    console.print(f"  {name:<34} {s['throughput_per_s']:>9,.0f}/s  p50 {s['p50_ms']:6.2f} ms  "
                  f"p99 {s['p99_ms']:6.2f} ms  max {s['max_ms']:7.2f} ms  errors {s['errors']}")
    return s


def _load(label: str, fn, duration: float) -> LoadResult:
    with progress_bar(label, None) as update:
        return fn(on_progress=update, duration_s=duration)


def run(duration: float, concurrency: int, counters: int) -> dict:
    with (tempfile.TemporaryDirectory(prefix="bench-read-") as tmp, local_stack(Path(tmp)) as stack,
          http_floor(Path(tmp)) as floor):
        api = stack.apis[0]
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
        raw = [f"get {cache_key('my_dataset', n)}\r\n".encode() for n in names]
        host, port = api.host, api.port
        _load("warm-up", lambda **kw: http_load(host, port, eventual, concurrency=concurrency, **kw), 2)
        console.print(f"GetCount over HTTP at concurrency {concurrency}, {duration:.0f} s each:")
        results = {
            "raw_memcached_get": _show("raw memcached get (baseline)", _load(
                "raw memcached get", lambda **kw: memcached_load(mc_host, int(mc_port), raw,
                                                                 concurrency=concurrency, **kw), duration)),
            "http_floor": _show("HTTP floor (no-op uvloop+httptools)", _load(
                "HTTP floor", lambda **kw: http_load(floor.host, floor.port, eventual, concurrency=concurrency,
                                                     **kw), duration)),
            "getcount_eventual_cached": _show("GetCount EVENTUAL (cached)", _load(
                "GetCount EVENTUAL", lambda **kw: http_load(host, port, eventual, concurrency=concurrency, **kw),
                duration)),
            "getcount_accurate": _show("GetCount ACCURATE", _load(
                "GetCount ACCURATE", lambda **kw: http_load(host, port, accurate, concurrency=concurrency, **kw),
                duration)),
        }
    base = results["raw_memcached_get"]["throughput_per_s"]
    floor_rate = results["http_floor"]["throughput_per_s"]
    for key in ("getcount_eventual_cached", "getcount_accurate"):
        rate = results[key]["throughput_per_s"]
        results[key]["ratio_to_raw_get"] = rate / base if base else 0.0
        results[key]["ratio_to_http_floor"] = rate / floor_rate if floor_rate else 0.0
        console.print(f"  {key}: {results[key]['ratio_to_raw_get']:.1%} of raw memcached get throughput, "
                      f"{results[key]['ratio_to_http_floor']:.1%} of the HTTP floor")
    return {"concurrency": concurrency, "duration_s": duration, "counters": counters, "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="counter bench read", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (default 10)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--counters", type=int, default=1000)
    args = parser.parse_args(argv)
    write_result("read", run(args.duration, args.concurrency, args.counters))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
