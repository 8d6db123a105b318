"""The broker's cost of one fetch at the tail of a partition, as the partition grows (a diagnostic).

    counter bench broker-fetch [--batches 0,5000,15000] [--fetches 20]

The pipeline's worker always reads at the tail of the mutations topic. On a broker with an offset index (Apache
Kafka) that costs the same however long the partition is. This measures it on the broker the stack runs: a
partition is filled with one batch per record (as one-write-per-call clients produce) up to each length, then
the newest record is produced and fetched `--fetches` times, and the broker process's CPU time per
produce-and-fetch is read from /proc, next to the same figure on the empty partition (the baseline).
Local broker only (it reads the broker's /proc entry). On Tansu 0.6 the cost grows with the length until, from
22,000 to 26,000 batches on, a fetch costs seconds of CPU and times out after 10 s (`--batches 0,20000,24000,26000
--fetches 5`; bench/RESULTS.md, "the local broker's cliff"): lengths past it take that long per fetch.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Event
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.common import console, progress_bar, write_result
from bench.stack_meter import process_cpu_s
from infra.stack import LocalStack
from streams.topics import TopicSpec, ensure_topics

TOPIC = "bench-broker-fetch"


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of the process so far."""
    used = process_cpu_s(pid)
    if used is None:
        raise SystemExit(f"no /proc entry for the broker (pid {pid}): this diagnostic needs the local broker on Linux")
    return used


async def measure(bootstrap: str, pid: int, lengths: list[int], fetches: int) -> list[dict[str, float]]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10,
                                fetch_min_bytes=1)
    await producer.start()
    await consumer.start()
    tp = TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    rows = []
    try:
        written = 0
        for length in lengths:
            with progress_bar(f"filling to {length:,} batches", length - written, "batch") as update:
                start = written
                while written < length:
                    await producer.send_and_wait(TOPIC, b"x" * 50, partition=0)  # its own batch
                    written += 1
                    if written % 100 == 0:
                        update(written - start)
            end = (await consumer.end_offsets([tp]))[tp]
            latencies = []
            used = cpu_seconds(pid)
            for i in range(fetches):
                await producer.send_and_wait(TOPIC, b"y", partition=0)
                consumer.seek(tp, end + i)
                started = time.perf_counter()
                await consumer.getmany(tp, timeout_ms=10_000)
                latencies.append(time.perf_counter() - started)
            written += fetches
            cpu_ms = (cpu_seconds(pid) - used) / fetches * 1e3
            rows.append({"batches": end, "broker_cpu_ms_per_fetch": cpu_ms,
                         "fetch_p50_ms": statistics.median(latencies) * 1e3})
            base = rows[0]["broker_cpu_ms_per_fetch"]  # 0 when too few fetches to cross one clock tick (10 ms)
            ratio = f"{cpu_ms / base:6.1f}x the first length" if base else "first length below one clock tick"
            console.print(f"  {end:>7,} batches: broker CPU {cpu_ms:8.2f} ms per produce + tail fetch ({ratio}), "
                          f"fetch p50 {rows[-1]['fetch_p50_ms']:7.1f} ms")
    finally:
        await consumer.stop()
        await producer.stop()
    return rows


def _read_tail(bootstrap: str, topic: str, min_bytes: int, wait_ms: int, ready: Event, stop: Event) -> None:
    """A consumer at the tail of every partition of `topic` that keeps nothing: the broker's side of a reader. It
    fetches as the persist consumer does (agents.persist_consumer): after a batch that took all there was, its
    partitions pause for `wait_ms`. A copy of that pacing, not an import: bench imports no agents (the
    `bench-apart` import contract), and a reader at the tail has no backlog to tell apart."""
    async def run() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_min_bytes=min_bytes,
                                    fetch_max_wait_ms=wait_ms, max_partition_fetch_bytes=4 << 20,
                                    fetch_max_bytes=64 << 20)
        await consumer.start()
        try:
            partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            consumer.assign(partitions)
            await consumer.seek_to_end(*partitions)
            ready.set()
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=100, max_records=20_000)
                if batch and sum(map(len, batch.values())) < 20_000:
                    fetched_at = time.monotonic()
                    consumer.pause(*partitions)
                    while not stop.is_set() and time.monotonic() < fetched_at + wait_ms / 1000:
                        await asyncio.sleep(min(0.1, fetched_at + wait_ms / 1000 - time.monotonic()))
                    consumer.resume(*partitions)
        finally:
            await consumer.stop()
    asyncio.run(run())


@contextmanager
def tail_reader(bootstrap: str, topic: str, *, min_bytes: int, wait_ms: int) -> Iterator[None]:
    """A tail reader (`_read_tail`) in a process of its own while the block runs: what reading a topic costs the
    broker, without the work a reader does with the records (the persist worker's store, rollups and signals)."""
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    reader = ctx.Process(target=_read_tail, args=(bootstrap, topic, min_bytes, wait_ms, ready, stop), daemon=True)
    reader.start()
    try:
        if not ready.wait(30):
            raise RuntimeError(f"the tail reader of {topic!r} did not start within 30 s")
        yield
    finally:
        stop.set()
        reader.join(10)
        if reader.is_alive():
            reader.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="counter bench broker-fetch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="0,5000,15000", help="partition lengths to measure at (ascending)")
    parser.add_argument("--fetches", type=int, default=20, help="tail fetches per length (default 20)")
    args = parser.parse_args(argv)
    lengths = sorted(int(n) for n in args.batches.split(","))
    with tempfile.TemporaryDirectory(prefix="bench-broker-fetch-") as tmp, LocalStack(Path(tmp)) as stack:
        bootstrap = stack.start_broker()
        assert stack.broker is not None and stack.broker.pid is not None
        ensure_topics(bootstrap, [TopicSpec(TOPIC, 1, 1, {})])
        console.print("broker CPU per tail fetch as the partition grows (one batch per record):")
        rows = asyncio.run(measure(bootstrap, stack.broker.pid, lengths, args.fetches))
    write_result("broker_fetch", {"fetches": args.fetches, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
