"""Ingest: mutations persisted per second end to end, convergence time, and the raw broker read rate.

    python -m bench.ingest [--mutations 1000000] [--counters 1000] [--batch-size 500]

Produces N mutations (client-side batching) over K counters into a fresh local stack, measures the rate at
which the worker persists them (its events_persisted metric), the time from the last write until every counter
is exact in the rollup store, and, on the same broker in the same run, how fast a bare aiokafka consumer reads
the same records. Prints all three and the ratio persisted/raw.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.common import console, local_stack, progress_bar, write_result
from producers import CounterProducer
from schemas import Mutation, MutationOp
from sinks import SqliteRollupStore

NS = "my_dataset"


def persisted(worker_port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{worker_port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith("counter_events_persisted_total{"))


def produce(bootstrap: str, n: int, counters: int, batch_size: int, expected: dict[str, int],
            on_progress) -> tuple[float, int]:
    """Send n mutations as fast as the producer takes them; returns (seconds spent, records produced)."""
    rng = random.Random(1)
    started = time.perf_counter()
    with CounterProducer(bootstrap, batch_size=batch_size, linger_ms=20,
                         config={"linger.ms": 20, "batch.num.messages": 10000,
                                 "queue.buffering.max.messages": 1_000_000}) as producer:
        base = time.time_ns() // 1000
        for i in range(n):
            counter = f"k{rng.randrange(counters)}"
            delta = rng.randint(-5, 10)
            now = max(base + i, time.time_ns() // 1000)  # unique, current event times
            producer.send(Mutation(NS, counter, delta, now, f"t{i}", "", MutationOp.ADD))
            expected[counter] = expected.get(counter, 0) + delta
            if i % 5000 == 0:
                on_progress(i)
        producer.flush(120)
    on_progress(n)
    return time.perf_counter() - started, producer.records_sent


def converged(data_dir: Path, expected: dict[str, int]) -> bool:
    async def check() -> bool:
        store = SqliteRollupStore(data_dir / "rollups.sqlite3")
        try:
            states = await store.get_many([(NS, c) for c in expected])
        finally:
            await store.close()
        return all((s := states.get((NS, c))) is not None and s.count == v and s.rollup_ts >= s.last_write_ts
                   for c, v in expected.items())
    return asyncio.run(check())


async def raw_read(bootstrap: str, topic: str, records: int) -> tuple[int, float]:
    """A bare aiokafka consumer reading the topic from the start until it has seen `records` mutation
    records (heartbeats are read but not counted): (records, seconds)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)
    await consumer.start()
    try:
        parts = sorted(consumer.partitions_for_topic(topic) or [])
        consumer.assign([TopicPartition(topic, p) for p in parts])
        await consumer.seek_to_beginning()
        got, started = 0, time.perf_counter()
        while got < records:
            batch = await consumer.getmany(timeout_ms=1000, max_records=100_000)
            got += sum(1 for recs in batch.values() for r in recs if r.value)  # heartbeats have empty values
            if time.perf_counter() - started > 300:
                raise SystemExit(f"raw read saw only {got} of {records} records in 300 s")
        return got, time.perf_counter() - started
    finally:
        await consumer.stop()


def run(n: int, counters: int, batch_size: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp, \
            local_stack(Path(tmp), api=False, COUNTER_MUTATIONS_PARTITIONS="4", COUNTER_ROLLUPS_PARTITIONS="4",
                        COUNTER_PERSIST_BATCH_MAX="500") as stack:
        bootstrap = stack.env["COUNTER_KAFKA_BOOTSTRAP"]
        worker = stack.workers[0]
        expected: dict[str, int] = {}
        samples: list[tuple[float, float]] = []
        stop = threading.Event()
        t0 = time.perf_counter()

        def sample() -> None:
            while not stop.is_set():
                samples.append((time.perf_counter() - t0, persisted(worker.port)))
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        with progress_bar("producing", n, "mut") as update:
            produce_s, records = produce(bootstrap, n, counters, batch_size, expected, update)
        last_write = time.perf_counter()
        with progress_bar("persisting", n, "mut") as update:
            while (done := persisted(worker.port)) < n:
                update(done)
                time.sleep(0.25)
            update(done)
        all_persisted = time.perf_counter()
        console.print("waiting for every counter to converge...")
        while not converged(Path(tmp), expected):
            if time.perf_counter() - last_write > 600:
                raise SystemExit("not converged within 600 s")
            time.sleep(0.2)
        converged_at = time.perf_counter()
        stop.set()
        sampler.join()
        first_persist = next((t for t, v in samples if v > 0), 0.0)
        persist_rate = n / (all_persisted - t0 - first_persist)
        with progress_bar("raw aiokafka read", None, "rec"):
            got, raw_s = asyncio.run(raw_read(bootstrap, "counter-mutations", records))
        raw_mutation_rate = n / raw_s  # the same mutations, read without decoding or persisting
    result = {
        "mutations": n, "counters": counters, "batch_size": batch_size,
        "produce_rate_per_s": n / produce_s,
        "persisted_per_s": persist_rate,
        "raw_read_records": got, "raw_read_s": raw_s, "raw_read_mutations_per_s": raw_mutation_rate,
        "persisted_to_raw_ratio": persist_rate / raw_mutation_rate if raw_mutation_rate else 0.0,
        "convergence_after_last_write_s": converged_at - last_write,
        "convergence_after_all_persisted_s": converged_at - all_persisted,
        "persisted_over_time": samples,
    }
    console.print(f"  produced            {result['produce_rate_per_s']:>12,.0f} mutations/s")
    console.print(f"  persisted           {persist_rate:>12,.0f} mutations/s end to end")
    console.print(f"  raw aiokafka read   {raw_mutation_rate:>12,.0f} mutations/s ({got} records in {raw_s:.2f} s)")
    console.print(f"  ratio persisted/raw {result['persisted_to_raw_ratio']:>12.1%}")
    console.print(f"  converged           {result['convergence_after_last_write_s']:>12.2f} s after the last write "
                  f"({result['convergence_after_all_persisted_s']:.2f} s after the last persist)")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="counter bench ingest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutations", type=int, default=1_000_000)
    parser.add_argument("--counters", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=500, help="mutations per Kafka record")
    args = parser.parse_args(argv)
    write_result("ingest", run(args.mutations, args.counters, args.batch_size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
