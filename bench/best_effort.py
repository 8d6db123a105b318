"""BEST_EFFORT AddCount throughput over HTTP, next to raw memcached `incr` in the same run.

    python -m bench.best_effort [--duration 10] [--concurrency 32] [--counters 1000] [--rounds 3]

Baselines from the same load generator: `incr` straight to memcached, and the HTTP floor (`bench.http_floor`).
All phases run once per round; the figures are medians over the rounds.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from bench.common import console, http_floor, local_stack, progress_bar, write_result
from bench.loadgen import http_load, http_post, memcached_load
from bench.rounds import load_args, median_ratio, medians, run_rounds


def run(duration: float, concurrency: int, counters: int, rounds: int) -> dict:
    with (tempfile.TemporaryDirectory(prefix="bench-be-") as tmp, local_stack(Path(tmp)) as stack,
          http_floor(Path(tmp)) as floor):
        api = stack.apis[0]
        assert stack.memcached is not None  # local_stack starts it
        mc_host, mc_port = stack.memcached.address.rsplit(":", 1)
        names = [f"be-{i}" for i in range(counters)]
        adds = [http_post("/v1/AddCount", json.dumps({"namespace": "my_dataset_best_effort", "counter_name": n,
                                                      "delta": 1}).encode()) for n in names]
        # The baseline needs existing keys: incr on a missing key is a miss, not a write.
        seed = [f"set raw-{n} 0 0 1\r\n0\r\n".encode() for n in names]
        memcached_load(mc_host, int(mc_port), seed, concurrency=1, duration_s=0.5)
        raw = [f"incr raw-{n} 1\r\n".encode() for n in names]
        with progress_bar("warm-up", None) as update:
            http_load(api.host, api.port, adds, concurrency=concurrency, duration_s=2, on_progress=update)
        console.print(f"AddCount BEST_EFFORT at concurrency {concurrency}, {duration:.0f} s per phase, "
                      f"{rounds} interleaved rounds:")
        per_round = run_rounds({
            "raw_memcached_incr": ("raw memcached incr (baseline)", lambda **kw: memcached_load(
                mc_host, int(mc_port), raw, concurrency=concurrency, **kw)),
            "http_floor": ("HTTP floor (no-op uvloop+httptools)", lambda **kw: http_load(
                floor.host, floor.port, adds, concurrency=concurrency, **kw)),
            "addcount_best_effort": ("AddCount BEST_EFFORT", lambda **kw: http_load(
                api.host, api.port, adds, concurrency=concurrency, **kw)),
        }, rounds=rounds, duration_s=duration)
    results = {key: medians(values) for key, values in per_round.items()}
    r = results["addcount_best_effort"]
    r["ratio_to_raw_incr"] = median_ratio(per_round, "addcount_best_effort", "raw_memcached_incr")
    r["ratio_to_http_floor"] = median_ratio(per_round, "addcount_best_effort", "http_floor")
    results["http_floor"]["ratio_to_raw_incr"] = median_ratio(per_round, "http_floor", "raw_memcached_incr")
    console.print(f"medians of {rounds} rounds: AddCount BEST_EFFORT {r['throughput_per_s']:,.0f}/s, "
                  f"p99 {r['p99_ms']:.2f} ms; {r['ratio_to_raw_incr']:.1%} of raw memcached incr, "
                  f"{r['ratio_to_http_floor']:.1%} of the HTTP floor (the floor: "
                  f"{results['http_floor']['ratio_to_raw_incr']:.1%} of raw incr)")
    return {"concurrency": concurrency, "duration_s": duration, "counters": counters, "rounds": rounds,
            "results": results}


def main(argv: list[str] | None = None) -> int:
    args = load_args("counter bench best-effort", __doc__, argv)
    write_result("best_effort", run(args.duration, args.concurrency, args.counters, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
