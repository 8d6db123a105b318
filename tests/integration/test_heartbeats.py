"""An idle worker sends heartbeats down the mutations partitions once every idle interval, not at every tick, and
at every tick again while writes arrive; the watermark still carries every write to an exact rollup. Heartbeats
are counted by the partitions' end offsets on the real broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from producers import CounterProducer
from schemas import MutationOp
from streams.positions import watermarks
from tests.helpers import wait_for
from tests.pipeline_harness import PipelineEnv, serving

pytestmark = pytest.mark.integration

TICK_MS, IDLE_MS = 50, 500
# coalesce 2.5 s - accept 1 s - skew 250 ms leaves 1.25 s of slack: the idle interval (500 ms) is used whole
NAMESPACES = """
defaults:
  accept_limit: 1s
  max_clock_skew: 250ms
  queue_config: { coalesce_ms: 2500 }
namespaces:
  my_dataset: { counter_type: EVENTUAL }
"""


def appended(env: PipelineEnv) -> int:
    """Records appended to the mutations topic so far (the sum of its partitions' end offsets)."""
    consumer = Consumer({"bootstrap.servers": env.bootstrap, "group.id": f"{env.prefix}-probe"})
    try:
        return sum(high for _low, high in watermarks(consumer, env.mutations_topic,
                                                     list(range(env.partitions))).values())
    finally:
        consumer.close()


def test_an_idle_worker_sends_heartbeats_once_per_idle_interval_and_at_every_tick_while_writes_arrive(
        kafka_bootstrap: str, memcached_address: str, tmp_path: Path) -> None:
    with serving(kafka_bootstrap, memcached_address, tmp_path, NAMESPACES) as env:
        env.stack.start_worker(COUNTER_WATERMARK_INTERVAL_MS=str(TICK_MS),
                               COUNTER_WATERMARK_IDLE_INTERVAL_MS=str(IDLE_MS))
        wait_for(lambda: appended(env) >= env.partitions, 30, message="the first heartbeats")

        before, started = appended(env), time.monotonic()
        time.sleep(2.0)  # a measurement window: the heartbeats appended while nothing is written
        idle = (appended(env) - before) / env.partitions / (time.monotonic() - started)
        assert idle <= 1.5 * 1000 / IDLE_MS, f"{idle:.1f} heartbeats/s per partition while idle"

        writes = 0
        before, started = appended(env), time.monotonic()
        with CounterProducer(env.bootstrap, topic=env.mutations_topic) as producer:
            while time.monotonic() - started < 2.0:
                producer.send(CounterProducer.mutation(MutationOp.ADD, "my_dataset", "c", 1))
                producer.flush()
                writes += 1
                time.sleep(0.02)
        busy = (appended(env) - before - writes) / env.partitions / (time.monotonic() - started)
        assert busy >= 0.3 * 1000 / TICK_MS, f"{busy:.1f} heartbeats/s per partition while writes arrive"

        wait_for(lambda: env.converged("my_dataset", {"c": writes}), 60, message="the writes rolled up exactly")
