"""The mutations topic deleted and created again while a worker runs (`agents.topic_watch`).

A review: the worker kept the old topic's positions (and committed them onto the new one), and the local broker
answers a fetch past a partition's end with nothing, so it read none of the new topic's records until each partition
grew past its old position: writes acknowledged after the recreation were never counted, with every health figure
green. The worker now notices the topic's new id, says so, and reads the new topic from its start."""

from __future__ import annotations

import random
import time

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from tests.helpers import read_all, wait_for
from tests.integration.test_pipeline import NS, as_json, random_events
from tests.pipeline_harness import PipelineEnv, oracle

pytestmark = pytest.mark.integration


def send(pipeline: PipelineEnv, events: list) -> None:
    producer = Producer({"bootstrap.servers": pipeline.bootstrap, "acks": "all"})
    for e in events:
        producer.produce(pipeline.mutations_topic, as_json(e), key=f"{NS}:{e.counter}".encode())
    assert producer.flush(30) == 0, "every record acknowledged"


def recreate(pipeline: PipelineEnv) -> None:
    admin = AdminClient({"bootstrap.servers": pipeline.bootstrap})
    admin.delete_topics([pipeline.mutations_topic])[pipeline.mutations_topic].result(30)

    def gone() -> bool:
        return pipeline.mutations_topic not in admin.list_topics(timeout=5).topics

    wait_for(gone, 30, message="the topic deleted")
    deadline = time.monotonic() + 30
    while True:  # the broker may still be finishing the deletion
        try:
            pipeline.create_topics()
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_writes_to_a_recreated_mutations_topic_are_counted(pipeline: PipelineEnv) -> None:
    worker = pipeline.start_worker()
    rng = random.Random(47)
    first = random_events(rng, 4, 120, clear_ratio=0)
    send(pipeline, first)
    wait_for(lambda: pipeline.converged(NS, oracle(first)), 60, message="the first writes counted")

    recreate(pipeline)
    later = random_events(rng, 4, 40, clear_ratio=0)  # fewer per partition than the old positions
    send(pipeline, later)

    wait_for(lambda: "was deleted and created again" in worker.log_path.read_text()[worker.log_start:], 30,
             message="the worker noticed the new topic")
    expected = oracle(first + later)
    wait_for(lambda: pipeline.converged(NS, expected), 60,
             message=lambda: f"every write counted; mismatches {pipeline.mismatches(NS, expected)}")
    assert read_all(pipeline.bootstrap, pipeline.dlq_topic) == [], "nothing dead-lettered"
