"""Hot counters: one viral counter with and without shards, against 1,000 counters, same rate, same run.

    python -m bench.hot [--mutations 60000] [--rate 5000] [--shards 32] [--counters 1000] [--batch-size 1]

Three cases in one invocation, each on a fresh local stack (broker, memcached, two workers, 8 mutations
partitions; fresh so no case pays for the topic history of another: Tansu's cost per fetch grows with it):

  hot, shards 1    every write to one counter, keyed `namespace:counter`: one partition, one worker
  hot, shards N    the same counter in a namespace with `shards: N`: keys `namespace:counter#k`
  1,000 counters   writes spread over --counters counters, one key each (the baseline)

Each case sends the same number of mutations at the same fixed rate from CounterProducer (given the namespaces,
so it keys by their shards; one record per mutation by default, as users' own clients send), then measures:
records and mutations per partition (read back from the topic: max, mean, max/mean skew), mutations persisted by
each worker (its events_persisted metric), the persisted rate (mutations / time from the first write until both
workers together persisted them all), the largest persist backlog seen (sent minus persisted), and the time
from the last acknowledged write until the case's counters are exact in the rollup store. Every case must end
exact; the run fails otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.common import console, exact_counters, local_stack, progress_bar, write_result
from control_plane import NamespaceRegistry, load_namespaces
from infra.process import ManagedProcess
from producers import CounterProducer
from schemas import Mutation, MutationOp, decode_mutations

TOPIC = "counter-mutations"
PARTITIONS = 8
NAMESPACES_YAML = """\
# bench.hot: the bench namespaces' short windows, and a namespace whose counters spread over {shards} keys.
defaults:
  accept_limit: 2s
  max_clock_skew: 250ms
  queue_config: {{ coalesce_ms: 500 }}
  time_partition: {{ buckets_per_id: 4, seconds_per_bucket: 60, seconds_per_slice: 3600 }}
namespaces:
  hot_unsharded:
    counter_type: EVENTUAL
  hot_sharded:
    counter_type: EVENTUAL
    shards: {shards}
  many:
    counter_type: EVENTUAL
"""
HOT_COUNTER = "viral"


def persisted(worker: ManagedProcess, namespace: str) -> float:
    """Mutations of `namespace` the worker persisted (its counter_events_persisted_total)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/metrics", timeout=5).read().decode()
    series = f'counter_events_persisted_total{{namespace="{namespace}"}}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(series))


def owned(worker: ManagedProcess) -> set[int]:
    """The mutations partitions the worker's persist consumer owns ({} while it is not ready)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/ready", timeout=5) as response:
            body = json.load(response)
    except (urllib.error.URLError, OSError):
        return set()
    prefix = f"{TOPIC}:"
    return {int(p[len(prefix):]) for p in body["partitions"] if p.startswith(prefix)}


def wait_settled(workers: list[ManagedProcess], timeout_s: float = 120) -> list[set[int]]:
    """Until the workers own disjoint sets of partitions that cover the topic (the rebalance is over)."""
    deadline = time.monotonic() + timeout_s
    while True:
        sets = [owned(w) for w in workers]
        union = set().union(*sets)
        if all(sets) and union == set(range(PARTITIONS)) and sum(map(len, sets)) == PARTITIONS:
            return sets
        if time.monotonic() > deadline:
            raise SystemExit(f"workers did not settle on the partitions within {timeout_s:.0f} s: {sets}")
        time.sleep(0.5)


class Sampler(threading.Thread):
    """Samples each worker's persisted mutations of one namespace every 0.25 s while the case runs."""

    def __init__(self, workers: list[ManagedProcess], namespace: str) -> None:
        super().__init__(daemon=True)
        self.workers = workers
        self.namespace = namespace
        self.samples: list[tuple[float, list[float]]] = []  # (perf_counter, per worker)
        self.sent = 0  # updated by the producer loop
        self.max_backlog = 0.0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(0.25)

    def sample(self) -> list[float]:
        values = [persisted(w, self.namespace) for w in self.workers]
        self.samples.append((time.perf_counter(), values))
        self.max_backlog = max(self.max_backlog, self.sent - sum(values))
        return values


def produce_at_rate(producer: CounterProducer, mutations: int, rate: float, namespace: str, counters: int,
                    expected: dict[str, int], sampler: Sampler, seed: int) -> tuple[float, float, float]:
    """Send `mutations` at `rate` per second (paced on a fixed schedule, not as fast as possible); returns
    (first send, last send, acknowledged) perf_counter times."""
    rng = random.Random(seed)
    names = [HOT_COUNTER] if counters == 1 else [f"k{i}" for i in range(counters)]
    base = time.time_ns() // 1000
    with progress_bar(f"producing {namespace}", mutations, "mut") as update:
        started = time.perf_counter()
        for i in range(mutations):
            if i % 20 == 0:
                delay = started + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                sampler.sent = i
                if i % 2000 == 0:
                    update(i)
            counter = names[0] if counters == 1 else rng.choice(names)
            delta = rng.randint(-5, 10)
            now = max(base + i, time.time_ns() // 1000)  # unique, current event times
            producer.send(Mutation(namespace, counter, delta, now, f"{namespace}-{i}", "", MutationOp.ADD))
            expected[counter] = expected.get(counter, 0) + delta
        last = time.perf_counter()
        sampler.sent = mutations
        producer.flush(120)
        update(mutations)
    return started, last, time.perf_counter()


async def read_back(bootstrap: str, records: int) -> tuple[dict[int, int], dict[int, int]]:
    """(records, mutations) per partition of the topic, read from the start until `records` mutation records
    (heartbeats, which have empty values, are skipped)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        per_record: dict[int, int] = defaultdict(int)
        per_mutation: dict[int, int] = defaultdict(int)
        got, deadline = 0, time.monotonic() + 120
        while got < records:
            if time.monotonic() > deadline:
                raise SystemExit(f"read back only {got} of {records} records in 120 s")
            batch = await consumer.getmany(timeout_ms=1000, max_records=50_000)
            for tp, recs in batch.items():
                for r in recs:
                    if r.value:
                        got += 1
                        per_record[tp.partition] += 1
                        per_mutation[tp.partition] += len(decode_mutations(r.value))
        return dict(per_record), dict(per_mutation)
    finally:
        await consumer.stop()


def skew(per_partition: dict[int, int]) -> dict[str, Any]:
    counts = [per_partition.get(p, 0) for p in range(PARTITIONS)]
    mean = statistics.fmean(counts)
    return {"per_partition": counts, "max": max(counts), "mean": mean, "max_over_mean": max(counts) / mean,
            "partitions_used": sum(1 for c in counts if c)}


def run_case(label: str, namespace: str, counters: int, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    console.print(f"[bold]{label}[/] (namespace {namespace}, {counters:,} counter(s))")
    with tempfile.TemporaryDirectory(prefix="bench-hot-") as tmp:
        data_dir = Path(tmp)
        namespaces = data_dir / "namespaces.yaml"
        namespaces.write_text(NAMESPACES_YAML.format(shards=args.shards))
        registry: NamespaceRegistry = load_namespaces(namespaces)
        with local_stack(data_dir / "stack", workers=args.workers, api=False, COUNTER_NAMESPACES=str(namespaces),
                         COUNTER_MUTATIONS_PARTITIONS=str(PARTITIONS)) as stack:
            bootstrap = stack.env["COUNTER_KAFKA_BOOTSTRAP"]
            ownership = wait_settled(stack.workers)
            sampler = Sampler(stack.workers, namespace)
            sampler.start()
            expected: dict[str, int] = {}
            with CounterProducer(bootstrap, batch_size=args.batch_size, linger_ms=5, namespaces=registry,
                                 config={"queue.buffering.max.messages": 1_000_000}) as producer:
                first, last_send, acked = produce_at_rate(producer, args.mutations, args.rate, namespace, counters,
                                                          expected, sampler, seed)
                records = producer.records_sent
            keys = {(namespace, c): v for c, v in expected.items()}
            converged_s = None
            with progress_bar("waiting: exact", len(keys), "counter") as update:
                while True:
                    exact = exact_counters(data_dir / "stack", keys)
                    update(exact)
                    if exact == len(keys):
                        converged_s = time.perf_counter() - acked
                        break
                    if time.perf_counter() - acked > args.timeout:
                        break
                    time.sleep(0.1)
            while sum(sampler.sample()) < args.mutations and time.perf_counter() - acked < args.timeout:
                time.sleep(0.1)  # the metrics lag the store by a scrape at most
            sampler.stopped.set()
            sampler.join()
            all_persisted = next((t for t, v in sampler.samples if sum(v) >= args.mutations), None)
            by_worker = sampler.samples[-1][1]
            per_record, per_mutation = asyncio.run(read_back(bootstrap, records))
    result = {
        "namespace": namespace, "counters": counters, "shards": registry[namespace].shards,
        "mutations": args.mutations, "records": records,
        "offered_rate_per_s": args.mutations / (last_send - first),
        "persisted_rate_per_s": args.mutations / (all_persisted - first) if all_persisted else None,
        "max_persist_backlog": sampler.max_backlog,
        "persisted_by_worker": by_worker,
        "partitions_by_worker": [sorted(s) for s in ownership],
        "records_by_partition": skew(per_record), "mutations_by_partition": skew(per_mutation),
        "convergence_after_last_write_s": converged_s, "exact": converged_s is not None,
    }
    show(label, result)
    return result


def show(label: str, r: dict[str, Any]) -> None:
    recs = r["records_by_partition"]
    workers = r["persisted_by_worker"]
    total = sum(workers) or 1
    split = " / ".join(f"{w:,.0f} ({w / total:.0%})" for w in workers)
    rate = f"{r['persisted_rate_per_s']:,.0f}/s" if r["persisted_rate_per_s"] else "not all persisted"
    converged = (f"{r['convergence_after_last_write_s']:.2f} s" if r["exact"] else "NOT EXACT within the timeout")
    lines = [
        f"records/partition {recs['per_partition']}",
        f"  max {recs['max']:,}, mean {recs['mean']:,.0f}, max/mean {recs['max_over_mean']:.2f}, "
        f"{recs['partitions_used']} of {PARTITIONS} partitions used",
        f"persisted/worker  {split}",
        f"  (partitions owned {r['partitions_by_worker']})",
        f"persisted rate    {rate} (offered {r['offered_rate_per_s']:,.0f}/s)",
        f"  largest persist backlog {r['max_persist_backlog']:,.0f} mutations",
        f"exact             {converged} after the last write",
    ]
    for line in lines:
        console.print("  " + line, highlight=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="counter bench hot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutations", type=int, default=60_000, help="mutations per case (default 60,000)")
    parser.add_argument("--rate", type=float, default=5_000, help="mutations per second, every case (default 5,000)")
    parser.add_argument("--shards", type=int, default=32, help="shards of the sharded case (default 32: 4x the "
                                                               "8 partitions, since N keys hash onto fewer)")
    parser.add_argument("--counters", type=int, default=1000, help="counters of the baseline case (default 1,000)")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="mutations per record (default 1: one record per mutation, as users' clients send)")
    parser.add_argument("--workers", type=int, default=2, help="pipeline workers (default 2)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for exact counts per case")
    args = parser.parse_args(argv)
    if not 1 <= args.shards <= 256:
        parser.error("--shards must be from 1 to 256")
    cases = [("hot, shards 1", "hot_unsharded", 1), (f"hot, shards {args.shards}", "hot_sharded", 1),
             (f"{args.counters:,} counters", "many", args.counters)]
    results = {label: run_case(label, ns, counters, args, seed) for seed, (label, ns, counters) in enumerate(cases)}
    console.print(f"[bold]summary[/]: {args.mutations:,} mutations per case at {args.rate:,.0f}/s,\n"
                  f"  {args.workers} workers, {PARTITIONS} partitions, {args.batch_size} mutation(s) per record")
    for label, r in results.items():
        workers = r["persisted_by_worker"]
        busiest = max(workers) / (sum(workers) or 1)
        rate = f"{r['persisted_rate_per_s']:>6,.0f}/s" if r["persisted_rate_per_s"] else "     -  "
        converged = f"{r['convergence_after_last_write_s']:.2f} s" if r["exact"] else "NOT EXACT"
        console.print(f"  {label:<15} skew {r['records_by_partition']['max_over_mean']:4.2f}  busiest worker "
                      f"{busiest:4.0%}  {rate}  exact after {converged}", highlight=False)
    write_result("hot", {"mutations": args.mutations, "rate_per_s": args.rate, "shards": args.shards,
                         "counters": args.counters, "batch_size": args.batch_size, "workers": args.workers,
                         "partitions": PARTITIONS, "cases": results})
    if not all(r["exact"] for r in results.values()):
        console.print("[bold red]a case did not end exact[/]")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
