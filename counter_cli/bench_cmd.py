"""`counter bench`: run a benchmark from bench/ (each prints its figures next to a same-run baseline)."""

from __future__ import annotations

import argparse
import os
import sys

BENCHMARKS = {
    "ingest": ("bench.ingest", "mutations persisted/s, convergence time, raw aiokafka read rate"),
    "read": ("bench.read", "GetCount p50/p99/throughput at concurrency 32 vs raw memcached get"),
    "best-effort": ("bench.best_effort", "BEST_EFFORT AddCount throughput vs raw memcached incr"),
    "history": ("bench.history", "rollup time with 10M old events vs 10 events"),
    "windows": ("bench.windows", "a 30-day windowed GetCount vs a plain GetCount over HTTP"),
    "write": ("bench.write", "durable AddCount/AddAndGetCount over HTTP vs a raw acks=all produce"),
    "topk": ("bench.topk", "GetTopK p50/p99 at concurrency 32 over 10,000 counters vs a plain GetCount"),
    "hot": ("bench.hot", "one hot counter with shards 1 and N vs 1,000 counters: partition skew, per-worker "
                         "share, persisted rate, convergence"),
    "store-batches": ("bench.store_batches", "the SQLite stores' many-row calls alone vs beside a busy thread (GIL "
                                             "hand-overs per statement step)"),
    "shared-read-your-write": ("bench.shared_read_your_write", "AddAndGetCount through an API process sharing the "
                                                               "pipeline vs a lone API process's"),
    "cohort-hold": ("bench.cohort_hold", "durable writes from a closed loop and from Poisson arrivals, the group "
                                         "commit's cohort hold on vs off, optionally behind a broker answering late"),
    "broker-fetch": ("bench.broker_fetch", "the local broker's CPU per fetch at a partition's tail as the partition "
                                           "grows, vs the empty partition (a diagnostic)"),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="run a benchmark (ingest, read, best-effort, history, windows, write, hot, topk, broker-fetch, "
             "store-batches, shared-read-your-write, cohort-hold)",
        description="Benchmarks start their own local stack in a temporary directory, show progress, print "
                    "their figures next to a baseline measured in the same run, and write JSON results to "
                    "bench/results/. " + "; ".join(f"{k}: {v[1]}" for k, v in BENCHMARKS.items()) + ".",
        epilog="examples:\n  counter bench ingest --mutations 1000000 --counters 1000\n"
               "  counter bench read --duration 10\n  counter bench history --events 10000000\n"
               "  counter bench ingest --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("benchmark", choices=sorted(BENCHMARKS))
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the benchmark (see its --help)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    module, _ = BENCHMARKS[args.benchmark]
    os.execv(sys.executable, [sys.executable, "-m", module, *args.args])
    return 0  # pragma: no cover
