"""Ingest: mutations persisted per second end to end, convergence time, and the raw broker read rate.

    python -m bench.ingest [--mutations 1000000] [--counters 1000] [--batch-size 500]

Produces N mutations (client-side batching) over K counters into a fresh local stack, measures the rate at
which the worker persists them (its events_persisted metric), the time from the last write until every counter
is exact in the rollup store, and, on the same broker in the same run, how fast a bare aiokafka consumer reads
the same records. Prints all three and the ratio persisted/raw. Also how long one write of another namespace, sent
right after the last write, takes to be rolled up meanwhile: what a burst of many counters costs the others.

Two ceilings of the persist path are measured in the same run on the same records, so the ratio can be
read against them: decoding alone (the records' Avro, on one core, nothing stored) and storing alone (the
decoded events written to a fresh SQLite event store in the worker's batch size, nothing decoded). The
pipeline cannot persist faster than either.

``--compare-windows`` runs twice in one invocation: plain counters in a namespace that keeps minute, hour and day
buckets, and so their rank lists (Top-K reads them; they are maintained in the statements that write the buckets),
and the same writes in a namespace that keeps none; it reports the persisted rate and the convergence of both, and
how many rank-list entries the first run maintained.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Producer

from bench.common import NAMESPACES, console, exact_counters, local_stack, progress_bar, write_result
from bench.stack_meter import StackMeter
from control_plane import load_namespaces
from producers import CounterProducer
from schemas import MICROS, Mutation, MutationOp, decode_mutations, encode_mutation
from sinks import BUCKETS_FILE, EventRow, open_namespace_stores
from sinks.sqlite.buckets import SqliteBucketStore
from sinks.windows import CHAIN, RankPage, align_down

NS = "my_dataset"
NS_NO_WINDOWS = "my_dataset_no_windows"  # bench/namespaces.yaml: the same, without time buckets


def persisted(worker_port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{worker_port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith("counter_events_persisted_total{"))


def produce(bootstrap: str, n: int, counters: int, batch_size: int, expected: dict[str, int],
            on_progress, *, seed: int, offset: int = 0, fmt: str = "avro", ns: str = NS) -> tuple[float, int]:
    """Send n mutations as fast as the client takes them; returns (seconds spent, records produced).

    batch_size 1 is what users' own clients send: a plain confluent-kafka producer (not CounterProducer), one
    record per mutation, JSON (the post's AddCount body) or Avro single-object; more than 1 is CounterProducer's
    client-side batching (Avro MutationBatch records)."""
    rng = random.Random(seed)
    started = time.perf_counter()
    base = time.time_ns() // 1000
    if batch_size == 1:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 20, "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000})
        for i in range(n):
            counter = f"k{rng.randrange(counters)}"
            delta = rng.randint(-5, 10)
            now = max(base + i, time.time_ns() // 1000)
            if fmt == "json":
                value = orjson.dumps({"namespace": ns, "counter_name": counter, "delta": delta,
                                      "idempotency_token": {"token": f"t{offset + i}",
                                                            "generation_time": _rfc3339(now)}})
            else:
                value = encode_mutation(Mutation(ns, counter, delta, now, f"t{offset + i}", "", MutationOp.ADD))
            while True:
                try:
                    producer.produce("counter-mutations", value, f"{ns}:{counter}".encode())
                    break
                except BufferError:
                    producer.poll(0.05)
            expected[counter] = expected.get(counter, 0) + delta
            if i % 5000 == 0:
                producer.poll(0)
                on_progress(i)
        if producer.flush(120):
            raise SystemExit("the broker did not acknowledge every record")
        on_progress(n)
        return time.perf_counter() - started, n
    with CounterProducer(bootstrap, batch_size=batch_size, linger_ms=20,
                         config={"linger.ms": 20, "batch.num.messages": 10000,
                                 "queue.buffering.max.messages": 1_000_000}) as counter_producer:
        for i in range(n):
            counter = f"k{rng.randrange(counters)}"
            delta = rng.randint(-5, 10)
            now = max(base + i, time.time_ns() // 1000)  # unique, current event times
            counter_producer.send(Mutation(ns, counter, delta, now, f"t{offset + i}", "", MutationOp.ADD))
            expected[counter] = expected.get(counter, 0) + delta
            if i % 5000 == 0:
                on_progress(i)
        counter_producer.flush(120)
    on_progress(n)
    return time.perf_counter() - started, counter_producer.records_sent


def _rfc3339(us: int) -> str:
    return datetime.fromtimestamp(us / MICROS, UTC).isoformat().replace("+00:00", "Z")


async def raw_read(bootstrap: str, topic: str, records: int, keep: list[bytes] | None = None) -> tuple[int, float]:
    """A bare aiokafka consumer reading the topic from the start until it has seen `records` mutation
    records (heartbeats are read but not counted): (records, seconds). `keep` collects the values."""
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
            if keep is not None:
                keep.extend(r.value for recs in batch.values() for r in recs if r.value)
            if time.perf_counter() - started > 300:
                raise SystemExit(f"raw read saw only {got} of {records} records in 300 s")
        return got, time.perf_counter() - started
    finally:
        await consumer.stop()


ROWS_PER_PERSIST_BATCH = 500_000  # the worker's persist batch: 1,000 records of 500 mutations, one transaction


def ceilings(values: list[bytes], data_dir: Path) -> tuple[float, float]:
    """(decoded mutations/s, stored event rows/s) for the same records, each step alone."""
    started = time.perf_counter()
    decoded = [m for value in values for m in decode_mutations(value)]
    decode_rate = len(decoded) / (time.perf_counter() - started)
    rows: list[EventRow] = [(m.namespace, m.counter_name, m.event_time or 0, m.event_id or "", m.event_item_key,
                             m.delta, m.op is MutationOp.CLEAR) for m in decoded]

    async def store() -> float:
        events, rollups, buckets = open_namespace_stores("sqlite", data_dir, load_namespaces(NAMESPACES))
        try:
            started = time.perf_counter()
            for i in range(0, len(rows), ROWS_PER_PERSIST_BATCH):
                await events.write_events(rows[i:i + ROWS_PER_PERSIST_BATCH])
            return len(rows) / (time.perf_counter() - started)
        finally:
            await events.close()
            await rollups.close()
            await buckets.close()
    return decode_rate, asyncio.run(store())


def rank_entries(data_dir: Path, ns: str, since_us: int, until_us: int) -> int:
    """Entries of the namespace's rank lists (base counters) of every bucket between the two times, read through the
    bucket store as Top-K reads them: one per bucket the rollups wrote."""
    async def count() -> int:
        store = SqliteBucketStore(data_dir / BUCKETS_FILE)
        try:
            pages = [RankPage("", g, start, None, 10**9) for g in CHAIN
                     for start in range(align_down(since_us, g), until_us, g.width_us)]
            return sum(len(entries) for entries in await store.read_ranks_many(ns, pages))
        finally:
            await store.close()
    return asyncio.run(count())


def run(n: int, counters: int, batch_size: int, fmt: str = "avro", ns: str = NS) -> dict:
    """Phase 1 (capacity): N mutations wait in Kafka, then one worker starts and drains them: the persisted
    rate is the pipeline's, not the producer's. Phase 2 (convergence): with the worker running, N/4 more at
    full producer speed; time from the last write until every counter is exact."""
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp, \
            local_stack(Path(tmp), workers=0, api=False) as stack:
        bootstrap = stack.env["COUNTER_KAFKA_BOOTSTRAP"]
        expected: dict[str, int] = {}
        started_us = time.time_ns() // 1000
        with progress_bar("producing backlog", n, "mut") as update:
            produce_s, records = produce(bootstrap, n, counters, batch_size, expected, update, seed=1, fmt=fmt,
                                         ns=ns)
        with progress_bar("raw aiokafka read", None, "rec"):
            got, raw_s = asyncio.run(raw_read(bootstrap, "counter-mutations", records))
        raw_rate = n / raw_s  # the same mutations, read without decoding or persisting
        values: list[bytes] = []
        with progress_bar("ceilings: decode, store", None, "rec"):
            asyncio.run(raw_read(bootstrap, "counter-mutations", records, keep=values))
            decode_rate, store_rate = ceilings(values, Path(tmp) / "ceiling")
        del values
        console.print("starting the worker (joins the consumer group)...")
        worker = stack.start_worker()
        meter = StackMeter({"worker": worker.pid, "broker": stack.broker.pid if stack.broker else None})
        meter.start()
        t0 = time.perf_counter()
        samples: list[tuple[float, float]] = []
        with progress_bar("persisting backlog", n, "mut") as update:
            while (done := persisted(worker.port)) < n:
                samples.append((time.perf_counter() - t0, done))
                update(done)
                time.sleep(0.25)
            samples.append((time.perf_counter() - t0, done))
            update(done)
        drain = meter.stop(n)  # CPU per mutation of the worker and the broker while the backlog drained
        first = next((t for t, v in samples if v > 0), 0.0)
        persist_rate = n / (samples[-1][0] - first) if samples[-1][0] > first else float("nan")
        extra = max(1, n // 4)
        with progress_bar("producing while running", extra, "mut") as update:
            stream_s, _ = produce(bootstrap, extra, counters, batch_size, expected, update, seed=2, offset=n, fmt=fmt,
                                  ns=ns)
        last_write = time.perf_counter()
        quiet_ns = NS_NO_WINDOWS if ns != NS_NO_WINDOWS else NS
        quiet_at = write_quiet(bootstrap, quiet_ns)
        quiet_s: float | None = None
        converged_s: float | None = None
        convergence: list[tuple[float, int]] = []
        console.print("waiting for every counter to converge...")
        while quiet_s is None or converged_s is None:
            if quiet_s is None and exact_counters(Path(tmp), {(quiet_ns, QUIET_COUNTER): 1}):
                quiet_s = time.perf_counter() - quiet_at
            if converged_s is None:
                exact = exact_counters(Path(tmp), {(ns, c): v for c, v in expected.items()})
                convergence.append((time.perf_counter() - last_write, exact))
                if exact == len(expected):
                    converged_s = convergence[-1][0]
            if time.perf_counter() - last_write > 600:
                raise SystemExit("not converged within 600 s")
            time.sleep(0.2)
        ranked = rank_entries(Path(tmp), ns, started_us, time.time_ns() // 1000 + 60 * MICROS)
    result = {
        "mutations": n, "counters": counters, "batch_size": batch_size, "format": fmt, "namespace": ns,
        "records": records,
        "produce_rate_per_s": n / produce_s, "persisted_per_s": persist_rate,
        "raw_read_mutations_per_s": raw_rate, "raw_read_records_per_s": got / raw_s,
        "persisted_to_raw_ratio": persist_rate / raw_rate,
        "decode_only_mutations_per_s": decode_rate, "store_only_rows_per_s": store_rate,
        "streaming_mutations": extra, "streaming_produce_rate_per_s": extra / stream_s,
        "convergence_after_last_write_s": converged_s, "quiet_namespace_write_shown_s": quiet_s,
        "rank_entries": ranked,
        "persisted_over_time": samples, "exact_counters_over_time": convergence, "drain": drain,
    }
    console.print(f"  persisted           {persist_rate:>12,.0f} mutations/s end to end (backlog drained by 1 worker)")
    console.print(f"  raw aiokafka read   {raw_rate:>12,.0f} mutations/s ({got} records of {batch_size} in "
                  f"{raw_s:.2f} s: {got / raw_s:,.0f} records/s)")
    console.print(f"  ratio persisted/raw {result['persisted_to_raw_ratio']:>12.1%}")
    console.print(f"  while draining      {StackMeter.describe(drain, per='mutation')}")
    console.print(f"  decode alone        {decode_rate:>12,.0f} mutations/s on one core "
                  f"({decode_rate / raw_rate:.1%} of raw)")
    console.print(f"  store alone         {store_rate:>12,.0f} event rows/s into SQLite "
                  f"({store_rate / raw_rate:.1%} of raw)")
    console.print(f"  converged           {converged_s:>12.2f} s after the last of {extra:,} writes at "
                  f"{extra / stream_s:,.0f}/s")
    console.print(f"  quiet namespace     {quiet_s:>12.2f} s until one write of {quiet_ns!r}, sent after those, "
                  "was rolled up")
    console.print(f"  rank-list entries   {ranked:>12,} (one per minute/hour/day bucket written)")
    return result


QUIET_COUNTER = "quiet"


def write_quiet(bootstrap: str, ns: str) -> float:
    """One write (+1 to QUIET_COUNTER) of another namespace, as an outside client sends it; returns when the broker
    acknowledged it (perf_counter). The signals of every namespace share the rollup queues: how long it takes to be
    rolled up while the burst converges is what the burst costs the other namespaces."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    producer.produce("counter-mutations", encode_mutation(Mutation(ns, QUIET_COUNTER, 1, time.time_ns() // 1000,
                                                                   "quiet-1", "", MutationOp.ADD)))
    if producer.flush(30):
        raise SystemExit("the broker did not acknowledge the quiet namespace's write")
    return time.perf_counter()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="counter bench ingest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutations", type=int, default=1_000_000)
    parser.add_argument("--counters", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=500,
                        help="mutations per Kafka record; 1 = an outside client's one record per mutation")
    parser.add_argument("--format", choices=("avro", "json"), default="avro",
                        help="record format with --batch-size 1 (default avro single-object)")
    parser.add_argument("--compare-windows", action="store_true",
                        help="run twice in this invocation, a namespace with minute/hour/day buckets (and their "
                             "Top-K rank lists) and one without, and report both")
    args = parser.parse_args(argv)
    if not args.compare_windows:
        write_result("ingest", run(args.mutations, args.counters, args.batch_size, args.format))
        return 0
    runs = {}
    for label, ns in (("with_windows", NS), ("without_windows", NS_NO_WINDOWS)):
        console.print(f"[bold]{label.replace('_', ' ')}[/] (namespace {ns})")
        runs[label] = run(args.mutations, args.counters, args.batch_size, args.format, ns)
    with_w, without = runs["with_windows"], runs["without_windows"]
    ratio = with_w["persisted_per_s"] / without["persisted_per_s"]
    console.print(f"persisted with buckets and rank lists {with_w['persisted_per_s']:,.0f}/s, without "
                  f"{without['persisted_per_s']:,.0f}/s ({ratio:.0%}); converged after "
                  f"{with_w['convergence_after_last_write_s']:.2f} s vs "
                  f"{without['convergence_after_last_write_s']:.2f} s; {with_w['rank_entries']:,} rank-list entries "
                  f"maintained (without: {without['rank_entries']:,})")
    write_result("ingest_windows", {**runs, "persisted_ratio_with_to_without": ratio})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
