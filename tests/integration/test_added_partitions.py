"""Partitions added to the mutations topic while a worker runs (`agents.watermark.PartitionCount`).

Before: the worker read the partition count once, at start. Its watermark left a partition added later out, its
consumer took the partition at the next metadata refresh (5 min), and meanwhile rollups passed the writes waiting
there: stored and never counted (or, since admission keeps events after the newest rollup, dead-lettered).

Opt-in: adding partitions needs CreatePartitions, which the local broker (Tansu) does not have. Set
COUNTER_KAFKA_BOOTSTRAP to an Apache Kafka broker to run it."""

from __future__ import annotations

import os
import random
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from tests.helpers import read_all, wait_for
from tests.integration.test_pipeline import NS, as_json, random_events
from tests.pipeline_harness import Event, PipelineEnv, oracle

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.environ.get("COUNTER_KAFKA_BOOTSTRAP"),
                       reason="needs a broker that adds partitions (Apache Kafka): set COUNTER_KAFKA_BOOTSTRAP; the "
                              "local broker (Tansu) has no CreatePartitions"),
]


def test_a_write_to_a_partition_added_while_the_worker_runs_is_counted(pipeline: PipelineEnv) -> None:
    worker = pipeline.start_worker()
    rng = random.Random(41)
    producer = Producer({"bootstrap.servers": pipeline.bootstrap, "acks": "all"})

    def send(events, partition: int | None = None) -> None:
        for e in events:
            kwargs = {} if partition is None else {"partition": partition}
            producer.produce(pipeline.mutations_topic, as_json(e), key=f"{NS}:{e.counter}".encode(), **kwargs)
        assert producer.flush(20) == 0

    first = random_events(rng, 4, 40, clear_ratio=0)
    send(first)
    wait_for(lambda: pipeline.converged(NS, oracle(first)), 60, message="the first writes counted")

    added = pipeline.partitions
    AdminClient({"bootstrap.servers": pipeline.bootstrap}).create_partitions(
        [NewPartitions(pipeline.mutations_topic, added + 1)])[pipeline.mutations_topic].result(30)
    wait_for(lambda: f"now has {added + 1} partitions" in worker.log_path.read_text()[worker.log_start:], 30,
             message="the worker read the new partition count")
    waiting = [Event("added", time.time_ns() // 1000, "tok-added", 7)]
    send(waiting, partition=added)  # a producer that took the new partition; rollups go on over the others
    later = random_events(rng, 4, 40, clear_ratio=0)
    send(later)

    expected = oracle(first + waiting + later)
    wait_for(lambda: pipeline.converged(NS, expected), 120,
             message=lambda: f"every write counted; mismatches {pipeline.mismatches(NS, expected)}")
    assert read_all(pipeline.bootstrap, pipeline.dlq_topic) == [], "nothing dead-lettered"
