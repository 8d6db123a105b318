"""AddAndGetCount through an API process that shares the pipeline with others, next to a lone API process's.

    python -m bench.shared_read_your_write [--duration 10] [--concurrency 32] [--counters 1000] [--rounds 3]

Where several API processes write to one pipeline (COUNTER_API_WORKERS above 1, or instances on several hosts:
COUNTER_API_SHARED_PIPELINE), no process can store another's writes, so an AddAndGetCount waits until the worker
has persisted every write acknowledged before it (query_api.service.earlier_ends). The baseline, in the same stack
and the same rounds, is a lone API process on the same pipeline, which counts its own earlier writes itself
(query_api.early_persist). Both answer AddAndGetCount in `my_dataset` (EVENTUAL), at concurrency 1 and at
`--concurrency`; every phase runs once per round, figures are medians over the rounds, and at the end every
acknowledged write must be counted in the rollup store, exactly. Each phase prints the CPU per request of the API
processes, the worker and the broker (`bench.stack_meter`): on the local broker a fetch and a ListOffsets list the
partition's batches, so the shared path, which waits on both, slows as the topic grows. (A lone process beside a
shared one is a setup the README warns against: its counts can lack the other's unpersisted writes. Here the phases
run one after another and a shared call answers only once the worker has every write before it, so the lone counts
lack at most the last shared calls in flight; only the totals at the end are checked.)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from bench.common import console, local_stack, progress_bar, wait_exact, write_result
from bench.loadgen import http_load, http_post
from bench.rounds import load_args, median_ratio, medians, run_rounds
from bench.stack_meter import StackMeter


def run(duration: float, concurrency: int, counters: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-shared-") as tmp, local_stack(Path(tmp), api=False) as stack:
        lone = stack.start_api(COUNTER_API_SHARED_PIPELINE="false")
        shared = stack.start_api(COUNTER_API_SHARED_PIPELINE="true")
        names = [f"shared-{i}" for i in range(counters)]
        calls = [http_post("/v1/AddAndGetCount", json.dumps({"namespace": "my_dataset", "counter_name": n,
                                                             "delta": 1}).encode()) for n in names]
        acked = [0] * counters

        def load(api: Any, c: int) -> Any:
            return lambda **kw: http_load(api.host, api.port, calls, concurrency=c, acked=acked, **kw)

        with progress_bar("warm-up", None) as update:
            for api in (lone, shared):
                http_load(api.host, api.port, calls, concurrency=concurrency, duration_s=2, on_progress=update,
                          acked=acked)
        console.print(f"AddAndGetCount, my_dataset, concurrency 1 and {concurrency}, {duration:.0f} s per phase, "
                      f"{rounds} interleaved rounds:")
        meter = StackMeter({"lone_api": lone.pid, "shared_api": shared.pid, "broker": stack.broker.pid if stack.broker
                            else None, **{w.name: w.pid for w in stack.workers}})
        per_round = run_rounds({
            "lone_c1": ("lone API process, c=1 (baseline)", load(lone, 1)),
            "shared_c1": ("shared pipeline, c=1", load(shared, 1)),
            "lone": (f"lone API process, c={concurrency} (baseline)", load(lone, concurrency)),
            "shared": (f"shared pipeline, c={concurrency}", load(shared, concurrency)),
        }, rounds=rounds, duration_s=duration, meter=meter)
        counted = wait_exact(Path(tmp), {("my_dataset", n): a for n, a in zip(names, acked, strict=True) if a})
    results = {key: medians(values) for key, values in per_round.items()}
    for key, base in (("shared_c1", "lone_c1"), ("shared", "lone")):
        results[key]["ratio_to_lone"] = median_ratio(per_round, key, base)
        results[key]["p50_vs_lone"] = results[key]["p50_ms"] / results[base]["p50_ms"]
    s, s1 = results["shared"], results["shared_c1"]
    console.print(f"medians of {rounds} rounds: shared pipeline c={concurrency} {s['throughput_per_s']:,.0f}/s, p50 "
                  f"{s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms ({s['ratio_to_lone']:.1%} of the lone process's "
                  f"rate); c=1 p50 {s1['p50_ms']:.1f} ms ({s1['p50_vs_lone']:.1f}x the lone process's); every "
                  f"acknowledged write counted: {counted}")
    return {"concurrency": concurrency, "duration_s": duration, "counters": counters, "rounds": rounds,
            "all_counted": counted, "acknowledged": sum(acked), "results": results}


def main(argv: list[str] | None = None) -> int:
    args = load_args("counter bench shared-read-your-write", __doc__, argv)
    result = run(args.duration, args.concurrency, args.counters, args.rounds)
    write_result("shared_read_your_write", result)
    return 0 if result["all_counted"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
