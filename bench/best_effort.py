"""BEST_EFFORT AddCount throughput over HTTP, next to raw memcached `incr` in the same run.

    python -m bench.best_effort [--duration 10] [--concurrency 32] [--counters 1000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench.common import console, http_floor, local_stack, write_result
from bench.loadgen import http_load, http_post, memcached_load
from bench.read import _load, _show


def run(duration: float, concurrency: int, counters: int) -> dict:
    with (tempfile.TemporaryDirectory(prefix="bench-be-") as tmp, local_stack(Path(tmp)) as stack,
          http_floor(Path(tmp)) as floor):
        api = stack.apis[0]
        mc_host, mc_port = stack.memcached.address.rsplit(":", 1)
        names = [f"be-{i}" for i in range(counters)]
        adds = [http_post("/v1/AddCount", json.dumps({"namespace": "my_dataset_best_effort", "counter_name": n,
                                                      "delta": 1}).encode()) for n in names]
        # The baseline needs existing keys: incr on a missing key is a miss, not a write.
        seed = [f"set raw-{n} 0 0 1\r\n0\r\n".encode() for n in names]
        memcached_load(mc_host, int(mc_port), seed, concurrency=1, duration_s=0.5)
        raw = [f"incr raw-{n} 1\r\n".encode() for n in names]
        _load("warm-up", lambda **kw: http_load(api.host, api.port, adds, concurrency=concurrency, **kw), 2)
        console.print(f"AddCount BEST_EFFORT at concurrency {concurrency}, {duration:.0f} s each:")
        results = {
            "raw_memcached_incr": _show("raw memcached incr (baseline)", _load(
                "raw memcached incr", lambda **kw: memcached_load(mc_host, int(mc_port), raw,
                                                                  concurrency=concurrency, **kw), duration)),
            "http_floor": _show("HTTP floor (no-op uvloop+httptools)", _load(
                "HTTP floor", lambda **kw: http_load(floor.host, floor.port, adds, concurrency=concurrency, **kw),
                duration)),
            "addcount_best_effort": _show("AddCount BEST_EFFORT", _load(
                "AddCount BEST_EFFORT", lambda **kw: http_load(api.host, api.port, adds, concurrency=concurrency,
                                                               **kw), duration)),
        }
    base = results["raw_memcached_incr"]["throughput_per_s"]
    ratio = results["addcount_best_effort"]["throughput_per_s"] / base if base else 0.0
    results["addcount_best_effort"]["ratio_to_raw_incr"] = ratio
    floor_rate = results["http_floor"]["throughput_per_s"]
    results["http_floor"]["ratio_to_raw_incr"] = floor_rate / base if base else 0.0
    results["addcount_best_effort"]["ratio_to_http_floor"] = (
        results["addcount_best_effort"]["throughput_per_s"] / floor_rate if floor_rate else 0.0)
    console.print(f"  AddCount BEST_EFFORT: {ratio:.1%} of raw memcached incr throughput, "
                  f"{results['addcount_best_effort']['ratio_to_http_floor']:.1%} of the HTTP floor "
                  f"(the floor itself: {results['http_floor']['ratio_to_raw_incr']:.1%} of raw incr)")
    return {"concurrency": concurrency, "duration_s": duration, "counters": counters, "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="counter bench best-effort", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (default 10)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--counters", type=int, default=1000)
    args = parser.parse_args(argv)
    write_result("best_effort", run(args.duration, args.concurrency, args.counters))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
