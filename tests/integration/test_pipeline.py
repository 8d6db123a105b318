"""The eventually-consistent pipeline end to end: real broker, real worker processes, memcached, SQLite.

Each test checks a DESIGN invariant with an oracle computed here; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading
import time

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Producer

from producers import CounterProducer
from schemas import MICROS, Mutation, MutationOp, encode_signal
from sinks import open_cache
from tests.helpers import Sync, metric_sum, read_all, wait_for
from tests.pipeline_harness import ACCEPT_LIMIT_S, COALESCE_S, Event, PipelineEnv, oracle

pytestmark = pytest.mark.integration

NS = "my_dataset"
CONVERGENCE_BUDGET_S = ACCEPT_LIMIT_S + COALESCE_S + 2.0


def now_us() -> int:
    return time.time_ns() // 1000


def random_events(rng: random.Random, counters: int, n: int, clear_ratio: float = 0.03) -> list[Event]:
    """Adds (positive and negative) and a few clears, each with a distinct token and a current time."""
    events = []
    for i in range(n):
        counter = f"c{rng.randrange(counters)}"
        t = now_us() + i  # distinct, current: within the accept window when produced
        if rng.random() < clear_ratio:
            events.append(Event(counter, t, f"clr-{i}-{rng.random()}", 0, True))
        else:
            events.append(Event(counter, t, f"tok-{i}-{rng.random()}", rng.randint(-50, 100)))
    return events


def as_mutation(e: Event, ns: str = NS) -> Mutation:
    return Mutation(ns, e.counter, e.delta, e.event_time, e.token, "", MutationOp.CLEAR if e.clear else MutationOp.ADD)


def as_json(e: Event, ns: str = NS) -> bytes:
    body = {"namespace": ns, "counter_name": e.counter,
            "idempotency_token": {"token": e.token, "generation_time": e.event_time}}
    if e.clear:
        body["op"] = "clear"
    else:
        body["delta"] = e.delta
    return json.dumps(body).encode()


def produce_json(bootstrap: str, topic: str, events: list[Event]) -> None:
    """A plain aiokafka producer, as any Kafka client would send JSON AddCount bodies."""
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for e in events:
                await producer.send(topic, as_json(e), key=f"{NS}:{e.counter}".encode())
            await producer.flush()
        finally:
            await producer.stop()
    asyncio.run(run())


def produce_three_times(env: PipelineEnv, events: list[Event]) -> None:
    """Every mutation three times with the same token: single records, batched records, and JSON."""
    with CounterProducer(env.bootstrap, topic=env.mutations_topic) as single, \
            CounterProducer(env.bootstrap, topic=env.mutations_topic, batch_size=64) as batched:
        for e in events:
            single.send(as_mutation(e))
            batched.send(as_mutation(e))
    produce_json(env.bootstrap, env.mutations_topic, events)


def test_exact_after_triple_delivery_and_converges_in_time(pipeline):
    pipeline.start_worker()
    rng = random.Random(7)
    events = []
    for _ in range(3):  # several waves, so rollups happen between them
        wave = random_events(rng, 50, 400)
        produce_three_times(pipeline, wave)
        events += wave
    last_write = time.monotonic()
    expected = oracle(events)
    assert len(expected) == 50
    wait_for(lambda: pipeline.converged(NS, expected), 30,
             message=lambda: f"convergence; mismatches {pipeline.mismatches(NS, expected)}")
    took = time.monotonic() - last_write
    assert took <= CONVERGENCE_BUDGET_S, f"converged in {took:.2f}s, budget {CONVERGENCE_BUDGET_S}s"
    # The cache holds count and rollup_ts in one value, matching the store.
    cache = Sync(open_cache(f"memcached://{pipeline.memcached}", key_prefix=pipeline.cache_prefix()))
    states = pipeline.rollups([(NS, c) for c in expected])
    for c, n in expected.items():
        cached = cache.get(NS, c)
        assert cached is not None and cached[0] == n and cached[1] == states[(NS, c)].rollup_ts


def test_paused_persist_agent_holds_rollups_back(pipeline):
    """Invariant 3: with the worker frozen longer than accept_limit while writes continue, nothing is skipped."""
    worker = pipeline.start_worker()
    rng = random.Random(11)
    first = random_events(rng, 20, 200, clear_ratio=0)
    produce_three_times(pipeline, first)
    wait_for(lambda: pipeline.converged(NS, oracle(first)), 30, message="first wave")
    worker.pause()
    try:
        second = []
        deadline = time.monotonic() + ACCEPT_LIMIT_S * 1.5  # frozen for longer than accept_limit
        while time.monotonic() < deadline:  # writes continue while the agent is frozen
            wave = random_events(rng, 20, 30)
            produce_three_times(pipeline, wave)
            second += wave
    finally:
        worker.resume()
    expected = oracle(first + second)
    wait_for(lambda: pipeline.converged(NS, expected), 45,
             message=lambda: f"convergence after pause; mismatches {pipeline.mismatches(NS, expected)}")


def stream_single_records(env: PipelineEnv, events: list[Event], done: threading.Event, *, waves: int,
                          wave_size: int, seed: int, until: threading.Event | None = None) -> None:
    """What users' own clients send: one mutation per record, each acknowledged, with some retries (the same
    token again) mixed in; Avro from CounterProducer and JSON from a plain confluent-kafka producer. At least
    `waves` waves, then on (paced, about 20 waves a second) until `until` is set, for 120 s at most."""
    rng = random.Random(seed)
    plain = Producer({"bootstrap.servers": env.bootstrap, "acks": "all", "linger.ms": 5})
    deadline = time.monotonic() + 120
    with CounterProducer(env.bootstrap, topic=env.mutations_topic) as producer:
        for i in range(1_000_000):
            if i >= waves and (until is None or until.is_set() or time.monotonic() > deadline):
                break
            if until is not None and i >= waves:
                time.sleep(0.05)
            wave = random_events(rng, 30, wave_size)
            events.extend(wave)
            for n, e in enumerate(wave):
                if n % 2:
                    producer.send(as_mutation(e))
                else:
                    plain.produce(env.mutations_topic, as_json(e), key=f"{NS}:{e.counter}".encode())
            for e in wave[: wave_size // 5]:  # retries
                producer.send(as_mutation(e))
            producer.flush()
            assert plain.flush(30) == 0
            if i % 10 == 0:
                time.sleep(0.01)
    done.set()


def test_kill_9_mid_stream_then_restart_is_exact(pipeline):
    """Single-mutation records: the worker dies with a batch half stored and uncommitted; its replacement
    re-reads it and nothing is lost or counted twice."""
    worker = pipeline.start_worker()
    events: list[Event] = []
    done = threading.Event()
    thread = threading.Thread(target=stream_single_records, args=(pipeline, events, done),
                              kwargs={"waves": 80, "wave_size": 100, "seed": 23}, daemon=True)
    thread.start()
    wait_for(lambda: metric_sum(worker.port, "counter_events_persisted_total") >= 1500, 60,
             message="stream under way and persisted")
    os.kill(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait(10)
    pipeline.start_worker()
    thread.join(120)
    assert done.is_set()
    expected = oracle(events)
    wait_for(lambda: pipeline.converged(NS, expected), 60,
             message=lambda: f"convergence after kill -9; mismatches {pipeline.mismatches(NS, expected)}")


def test_a_second_worker_joining_mid_stream_shares_partitions_and_stays_exact(pipeline):
    """Single-mutation records stream while a second worker joins: the rebalance hands partitions over with
    their batches stored and committed (or re-read), and the counts stay exact."""
    a = pipeline.start_worker()
    events: list[Event] = []
    done, enough = threading.Event(), threading.Event()
    thread = threading.Thread(target=stream_single_records, args=(pipeline, events, done),
                              kwargs={"waves": 40, "wave_size": 100, "seed": 31, "until": enough}, daemon=True)
    thread.start()
    wait_for(lambda: metric_sum(a.port, "counter_events_persisted_total") >= 1000, 60,
             message="first worker persisting")
    b = pipeline.start_worker()  # joins the groups mid-stream
    wait_for(lambda: metric_sum(b.port, "counter_events_persisted_total") > 0, 90, interval=0.5,
             message=lambda: f"second worker persisting (group rebalanced); {len(events)} events streamed")
    enough.set()
    thread.join(120)
    assert done.is_set()
    expected = oracle(events)
    wait_for(lambda: pipeline.converged(NS, expected), 60,
             message=lambda: f"convergence with two workers; mismatches {pipeline.mismatches(NS, expected)}")


def test_bad_records_go_to_the_dlq_and_good_ones_count(pipeline):
    pipeline.start_worker()
    good = random_events(random.Random(5), 5, 50, clear_ratio=0)
    plain = Producer({"bootstrap.servers": pipeline.bootstrap})
    topic = pipeline.mutations_topic
    bad = [
        (b"\x00\xffgarbage\x13", "undecodable"),
        (encode_signal(NS, "c1"), "RollupSignal"),  # valid Avro, wrong schema
        (b"\xc3\x01" + b"\x01" * 8 + b"\x02", "unknown schema fingerprint"),
        (json.dumps({"namespace": "", "counter_name": "c", "delta": 1}).encode(), "namespace"),
        (json.dumps({"namespace": NS, "counter_name": "", "delta": 1}).encode(), "counter_name"),
        (json.dumps({"namespace": "nope", "counter_name": "c", "delta": 1}).encode(), "unknown namespace"),
        (as_json(Event("c1", now_us() - 3600 * MICROS, "old", 5)), "accept_limit"),
        (as_json(Event("c1", now_us() + 3600 * MICROS, "future", 5)), "max_clock_skew"),
        (b"[" * 1000 + b"]" * 1000, "nested deeper"),  # once a RecursionError that stalled the persist path
        # a field named by a lone surrogate: its reason could not be encoded, which stalled every partition
        (b'{"namespace": "%s", "counter_name": "c1", "delta": 1, "\\ud800": 1}' % NS.encode(), "unknown field"),
    ]
    half = len(good) // 2
    for e in good[:half]:
        plain.produce(topic, as_json(e), key=f"{NS}:{e.counter}".encode())
    for value, _ in bad:
        plain.produce(topic, value, key=b"bad")
    for e in good[half:]:
        plain.produce(topic, as_json(e), key=f"{NS}:{e.counter}".encode())
    assert plain.flush(20) == 0
    expected = oracle(good)
    wait_for(lambda: pipeline.converged(NS, expected), 30, message="good records counted")

    def dead_letters():
        records = read_all(pipeline.bootstrap, pipeline.dlq_topic)
        return records if len(records) >= len(bad) else None

    records = wait_for(dead_letters, 30, interval=0.5, message="dead letters")
    assert len(records) == len(bad)
    by_value = {r.value: {k: v.decode() for k, v in r.headers} for r in records}
    for value, reason_part in bad:
        headers = by_value[value]  # the original bytes are preserved
        assert reason_part in headers["dlq.reason"], headers
        assert headers["dlq.topic"] == topic
        assert int(headers["dlq.partition"]) >= 0 and int(headers["dlq.offset"]) >= 0


def test_records_compressed_by_an_outside_producer_count(pipeline):
    """Any Kafka client may compress its batches (or the broker may, by a topic's compression.type). aiokafka reads
    snappy, lz4 and zstd only with cramjam: without it the persist consumer raised in getmany, the worker restarted
    onto the same batch forever, and no partition was persisted again (a review's acknowledged writes were lost)."""
    pipeline.start_worker()
    good = random_events(random.Random(17), 8, 80, clear_ratio=0)
    codecs = ["gzip", "snappy", "lz4", "zstd"]
    for i, codec in enumerate(codecs):
        plain = Producer({"bootstrap.servers": pipeline.bootstrap, "compression.type": codec, "linger.ms": 20})
        for e in good[i::len(codecs)]:
            plain.produce(pipeline.mutations_topic, as_json(e), key=f"{NS}:{e.counter}".encode())
        assert plain.flush(20) == 0, codec
    expected = oracle(good)
    wait_for(lambda: pipeline.converged(NS, expected), 30,
             message=lambda: f"compressed records counted; mismatches {pipeline.mismatches(NS, expected)}")
