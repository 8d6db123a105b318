"""Heartbeats down the mutations partitions go out while writes need them and stop once the watermark covers every
write, with one worker and with two (the idle one follows the other's writes); the watermark still carries every
write to an exact rollup. Heartbeats are counted by the partitions' end offsets on the real broker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from control_plane import load_namespaces
from infra.process import ManagedProcess
from producers import CounterProducer, partition_for
from schemas import MutationOp
from sinks import open_namespace_stores
from streams.positions import watermarks
from tests.helpers import wait_for
from tests.pipeline_harness import PipelineEnv, serving

pytestmark = pytest.mark.integration

TICK_MS, IDLE_MS = 50, 500
WORKER = {"COUNTER_WATERMARK_INTERVAL_MS": str(TICK_MS), "COUNTER_WATERMARK_IDLE_INTERVAL_MS": str(IDLE_MS)}
# coalesce 2.5 s - accept 1 s - skew 250 ms leaves 1.25 s of slack: the idle interval (500 ms) is used whole;
# heartbeats are needed for accept + 2 skew = 1.5 s after the last write
NAMESPACES = """
defaults:
  accept_limit: 1s
  max_clock_skew: 250ms
  queue_config: { coalesce_ms: 2500 }
namespaces:
  my_dataset: { counter_type: EVENTUAL }
"""
QUIET_WINDOW_S = 1.5  # three idle intervals: an idle worker still heartbeating would append in it


def appended(env: PipelineEnv) -> int:
    """Records appended to the mutations topic so far (the sum of its partitions' end offsets)."""
    consumer = Consumer({"bootstrap.servers": env.bootstrap, "group.id": f"{env.prefix}-probe"})
    try:
        return sum(high for _low, high in watermarks(consumer, env.mutations_topic,
                                                     list(range(env.partitions))).values())
    finally:
        consumer.close()


def quiet(env: PipelineEnv) -> bool:
    """Whether nothing was appended during a measurement window."""
    before = appended(env)
    time.sleep(QUIET_WINDOW_S)
    return appended(env) == before


def write(env: PipelineEnv, counter: str, n: int) -> None:
    with CounterProducer(env.bootstrap, topic=env.mutations_topic) as producer:
        for _ in range(n):
            producer.send(CounterProducer.mutation(MutationOp.ADD, "my_dataset", counter, 1))
        producer.flush()


def test_heartbeats_go_at_every_tick_while_writes_arrive_and_stop_once_the_watermark_covers_them(
        kafka_bootstrap: str, memcached_address: str, tmp_path: Path) -> None:
    with serving(kafka_bootstrap, memcached_address, tmp_path, NAMESPACES) as env:
        worker = env.stack.start_worker(**WORKER)
        wait_for(lambda: env.owned(worker), 60, interval=0.2, message="the worker's partitions")
        assert quiet(env), "heartbeats before anything was written"

        writes, before, started = 0, appended(env), time.monotonic()
        with CounterProducer(env.bootstrap, topic=env.mutations_topic) as producer:
            while time.monotonic() - started < 2.0:
                producer.send(CounterProducer.mutation(MutationOp.ADD, "my_dataset", "c", 1))
                producer.flush()
                writes += 1
                time.sleep(0.02)
        busy = (appended(env) - before - writes) / env.partitions / (time.monotonic() - started)
        # every tick is 20/s; the idle pace, what a worker that ignored the writes would keep, at most 2/s. Twice
        # that tells them apart on a loaded machine too (a CI run measured 5/s with two test processes running).
        assert busy >= 2 * 1000 / IDLE_MS, f"{busy:.1f} heartbeats/s per partition while writes arrive"

        wait_for(lambda: env.converged("my_dataset", {"c": writes}), 60, message="the writes rolled up exactly")
        wait_for(lambda: quiet(env), 30, interval=0, message="the heartbeats to stop")
        assert quiet(env) and env.converged("my_dataset", {"c": writes})

        write(env, "c", 3)  # after a quiet spell the next writes are carried to their rollup again
        wait_for(lambda: env.converged("my_dataset", {"c": writes + 3}), 60, message="the later writes rolled up")
        wait_for(lambda: quiet(env), 30, interval=0, message="the heartbeats to stop again")


def test_an_idle_worker_heartbeats_while_another_workers_writes_need_its_partitions(
        kafka_bootstrap: str, memcached_address: str, tmp_path: Path) -> None:
    """A rollup needs every partition's watermark: the worker whose partitions get no writes learns of the
    other's from the store, and heartbeats until they are covered (else the count would never converge)."""
    with serving(kafka_bootstrap, memcached_address, tmp_path, NAMESPACES) as env:
        a: ManagedProcess = env.stack.start_worker(**WORKER)
        b: ManagedProcess = env.stack.start_worker(**WORKER)
        wait_for(lambda: env.shared(a, b), 90, interval=0.5,
                 message=lambda: f"two workers sharing the partitions: {env.owned(a)} and {env.owned(b)}")
        owned_a = env.owned(a) or set()
        counter = next(f"c{i}" for i in range(1000)
                       if partition_for(f"my_dataset:c{i}".encode(), env.partitions) in owned_a)
        assert quiet(env), "heartbeats before anything was written"

        write(env, counter, 5)  # only a's partitions get writes; b has no reason of its own to heartbeat
        wait_for(lambda: env.converged("my_dataset", {counter: 5}), 60, message="the writes rolled up exactly")
        wait_for(lambda: quiet(env), 30, interval=0, message="both workers' heartbeats to stop")


def test_writes_persisted_without_their_time_published_are_carried_to_a_rollup_after_a_restart(
        kafka_bootstrap: str, memcached_address: str, tmp_path: Path) -> None:
    """A worker that persisted writes and stopped (or crashed) before its next tick published no write time for
    them, and a worker starting on a broker whose groups are empty (`counter up` restarted with its own broker)
    asks for no heartbeats on assignment: the counters stayed pending, GetCount 0, until the next write (a CI run
    of test_up_supervision's clean stop: 0 of 39,462 after 60 s). The sweep now asks for heartbeats past them."""
    with serving(kafka_bootstrap, memcached_address, tmp_path, NAMESPACES) as env:
        now_us = time.time_ns() // 1000
        registry = load_namespaces(env.namespaces)

        async def persisted_earlier() -> None:  # what the stopped worker left in the store: events, bumps, no marks
            events, rollups, buckets = open_namespace_stores("sqlite", env.data_dir, registry)
            try:
                await events.write_events([("my_dataset", "left", now_us - 500_000, f"e{i}", "", 1, False)
                                           for i in range(7)])
                await rollups.bump_last_write([("my_dataset", "left", now_us - 500_000)])
            finally:
                for store in (events, rollups, buckets):
                    await store.close()

        asyncio.run(persisted_earlier())
        worker = env.stack.start_worker(**WORKER)
        wait_for(lambda: env.owned(worker), 60, interval=0.2, message="the worker's partitions")
        wait_for(lambda: env.converged("my_dataset", {"left": 7}), 30, interval=0.2,
                 message=lambda: f"the stored writes rolled up: {env.mismatches('my_dataset', {'left': 7})}")
