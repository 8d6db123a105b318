"""The mutations topic deleted and created again while a worker runs (`agents.topic_watch`).

A review: the worker kept the old topic's positions (and committed them onto the new one), and the local broker
answers a fetch past a partition's end with nothing, so it read none of the new topic's records until each partition
grew past its old position: writes acknowledged after the recreation were never counted, with every health figure
green. The worker now notices the topic's new id, says so, and reads the new topic from its start."""

from __future__ import annotations

import random
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
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


def counted_first(pipeline: PipelineEnv, rng: random.Random) -> list:
    """Writes to the topic before it is recreated, once the running worker has counted them."""
    first = random_events(rng, 4, 120, clear_ratio=0)
    send(pipeline, first)
    wait_for(lambda: pipeline.converged(NS, oracle(first)), 60, message="the first writes counted")
    return first


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
    first = counted_first(pipeline, rng)

    recreate(pipeline)
    later = random_events(rng, 4, 40, clear_ratio=0)  # fewer per partition than the old positions
    send(pipeline, later)

    wait_for(lambda: "was deleted and created again" in worker.log_path.read_text()[worker.log_start:], 30,
             message="the worker noticed the new topic")
    expected = oracle(first + later)
    wait_for(lambda: pipeline.converged(NS, expected), 60,
             message=lambda: f"every write counted; mismatches {pipeline.mismatches(NS, expected)}")
    assert read_all(pipeline.bootstrap, pipeline.dlq_topic) == [], "nothing dead-lettered"


def commit_stale_offsets(pipeline: PipelineEnv, offset: int) -> None:
    """What a worker does that checkpoints a batch of the old topic just after the recreation (it checkpoints every
    100 ms) and stops before it notices the new id: commit its old positions onto the new topic."""
    stale = Consumer({"bootstrap.servers": pipeline.bootstrap, "group.id": f"{pipeline.worker_id}.persist",
                      "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        stale.subscribe([pipeline.mutations_topic])
        deadline = time.monotonic() + 30
        while len(stale.assignment()) < pipeline.partitions:  # a member of the group, or the broker refuses it
            assert time.monotonic() < deadline, "the stand-in consumer got the partitions"
            stale.poll(0.2)
        stale.commit(offsets=[TopicPartition(pipeline.mutations_topic, p, offset) for p in range(pipeline.partitions)],
                     asynchronous=False)
    finally:
        stale.close()


def test_a_worker_started_after_the_topic_was_recreated_reads_it_from_its_start(pipeline: PipelineEnv) -> None:
    """The group's committed offsets are the old topic's (`commit_stale_offsets`; the reviewer's worker committed
    404 onto a partition that ended at 182): a worker started now has no older topic id to notice the recreation by,
    and read nothing of the new topic until each partition grew past them. It checks them against the partitions'
    ends at its assignment."""
    worker = pipeline.start_worker()
    rng = random.Random(48)
    first = counted_first(pipeline, rng)
    worker.stop()

    recreate(pipeline)  # the broker drops the group's offsets with the topic: they come back as a worker's commit
    commit_stale_offsets(pipeline, 1_000)
    later = random_events(rng, 4, 40, clear_ratio=0)
    send(pipeline, later)

    worker = pipeline.start_worker()
    expected = oracle(first + later)
    wait_for(lambda: pipeline.converged(NS, expected), 60,
             message=lambda: f"every write counted; mismatches {pipeline.mismatches(NS, expected)}")
    assert "lie past the ends of those partitions" in worker.log_path.read_text()[worker.log_start:]
    assert read_all(pipeline.bootstrap, pipeline.dlq_topic) == [], "nothing dead-lettered"
