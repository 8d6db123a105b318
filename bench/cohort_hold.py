"""The group commit's cohort hold, on and off, for clients in a loop and for clients that do not wait on their answers.

    python -m bench.cohort_hold [--delay-ms 3] [--rates 1000,4000] [--concurrency 32] [--duration 3] [--rounds 3]

Two API processes on one stack: one holds its records for the clients the last acknowledgement answered (the
default `COUNTER_API_GROUP_COMMIT_HOLD_MS`), the other never does (0). Each round runs, against each API in turn
(the order alternates by round), EVENTUAL AddCount from a closed loop of `--concurrency` connections (each sends
its next write once the last is answered: a connection pool) and from Poisson arrivals at each of `--rates` writes a
second over a pool of 128 keep-alive connections (a service whose users' requests each write; latency from each
write's scheduled time). The unheld API is the baseline, measured in the same rounds.

`--delay-ms` puts `bench.delay_proxy` between every client of the stack and the local broker, handing its answers
that late: a broker that answers like a cluster replicating acks=all across hosts (0: the local broker as it is,
about half a millisecond). At the end the benchmark waits until every acknowledged write is counted, exactly, and
prints how each API's holds ended (`counter_api_group_commit_holds_total`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import console, local_stack, progress_bar, wait_exact, write_result
from bench.loadgen import LoadResult, OpenLoopResult, http_load, http_open_load, http_post
from bench.rounds import medians
from bench.stack_meter import scrape
from infra.process import ManagedProcess

NAMESPACE = "my_dataset"
COUNTERS = 200
HOLDS = "counter_api_group_commit_holds_total"


def holds(api: ManagedProcess) -> dict[str, float]:
    """The API's holds so far, by how they ended."""
    return {sample.labels["ended"]: sample.value for sample in scrape(f"http://{api.address}/metrics")
            if sample.name == HOLDS}


def main() -> None:
    parser = argparse.ArgumentParser(prog="counter bench cohort-hold", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-ms", type=float, default=3.0)
    parser.add_argument("--rates", default="1000,4000", help="Poisson arrival rates, writes/s, comma-separated")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",") if rate]

    names = [f"hold-{i}" for i in range(COUNTERS)]
    bodies = [http_post("/v1/AddCount", json.dumps({"namespace": NAMESPACE, "counter_name": name, "delta": 1})
                        .encode()) for name in names]
    acked = [0] * COUNTERS
    with tempfile.TemporaryDirectory(prefix="bench-hold-") as tmp, \
            local_stack(Path(tmp), api=False, broker_delay_ms=args.delay_ms) as stack:
        apis = {"held": stack.start_api(), "unheld": stack.start_api(COUNTER_API_GROUP_COMMIT_HOLD_MS="0")}
        for api in apis.values():  # connections and the first records, outside the figures
            http_load(api.host, api.port, bodies, concurrency=args.concurrency, duration_s=0.5, acked=acked)

        def closed(api: ManagedProcess, update: Callable[[int], None]) -> LoadResult:
            return http_load(api.host, api.port, bodies, concurrency=args.concurrency, duration_s=args.duration,
                             on_progress=update, acked=acked)

        def poisson(rate: float) -> Callable[[ManagedProcess, Callable[[int], None]], OpenLoopResult]:
            return lambda api, update: http_open_load(api.host, api.port, bodies, rate=rate,
                                                      duration_s=args.duration, on_progress=update, acked=acked)

        phases: dict[str, Callable[[ManagedProcess, Callable[[int], None]], LoadResult]] = {
            f"closed loop, c={args.concurrency}": closed, **{f"Poisson {rate:,.0f}/s": poisson(rate) for rate in rates}}
        runs: dict[str, dict[str, list[dict[str, float]]]] = {}
        for round_ in range(args.rounds):
            console.print(f"round {round_ + 1}/{args.rounds}:")
            for phase, load in phases.items():
                for arm in (("held", "unheld") if round_ % 2 == 0 else ("unheld", "held")):
                    with progress_bar(f"{phase}, {arm}", None) as update:
                        loaded = load(apis[arm], update)
                    summary = loaded.summary()
                    if isinstance(loaded, OpenLoopResult):
                        summary["dropped"] = loaded.dropped
                    runs.setdefault(phase, {}).setdefault(arm, []).append(summary)
                    console.print(f"  {phase + ', ' + arm:<28} {summary['throughput_per_s']:>9,.0f}/s  p50 "
                                  f"{summary['p50_ms']:6.2f} ms  p99 {summary['p99_ms']:6.2f} ms  errors "
                                  f"{summary['errors']:.0f}" + (f"  dropped {summary['dropped']:.0f}"
                                                                if "dropped" in summary else ""))
        ended = {arm: holds(api) for arm, api in apis.items()}
        counted = wait_exact(Path(tmp), {(NAMESPACE, name): n for name, n in zip(names, acked, strict=True)})

    result: dict[str, Any] = {"delay_ms": args.delay_ms, "rounds": args.rounds, "duration_s": args.duration,
                              "phases": {}, "holds": ended, "all_counted": counted, "acknowledged": sum(acked)}
    console.print(f"medians of {args.rounds} rounds, the broker's answers {args.delay_ms:g} ms late "
                  "(held: COUNTER_API_GROUP_COMMIT_HOLD_MS at its default; unheld: 0, the baseline):")
    for phase, arms in runs.items():
        figures = {arm: medians(rounds) for arm, rounds in arms.items()}
        result["phases"][phase] = figures
        held, unheld = figures["held"], figures["unheld"]
        console.print(f"  {phase:<22} held {held['throughput_per_s']:>8,.0f}/s p50 {held['p50_ms']:6.2f} ms "
                      f"p99 {held['p99_ms']:6.2f} ms | unheld {unheld['throughput_per_s']:>8,.0f}/s p50 "
                      f"{unheld['p50_ms']:6.2f} ms p99 {unheld['p99_ms']:6.2f} ms | held/unheld: rate "
                      f"{held['throughput_per_s'] / unheld['throughput_per_s']:.2f}x, p50 "
                      f"{held['p50_ms'] / unheld['p50_ms']:.2f}x")
    for arm, counts in ended.items():
        console.print(f"  holds, {arm}: {', '.join(f'{k} {v:,.0f}' for k, v in sorted(counts.items())) or 'none'}")
    console.print(f"  every acknowledged write counted: {counted} ({sum(acked):,} writes over {COUNTERS} counters)")
    write_result("cohort-hold", result)
    if not counted:
        raise SystemExit("not every acknowledged write was counted")


if __name__ == "__main__":
    main()
