"""`counter up`'s warning about the local broker's long partitions (infra.broker.LongPartitionWatch) reads the end
offsets of a real broker: it warns once a partition reaches the threshold, names that partition, and warns again only
a further step on. The threshold is lowered here: the real one (15,000 batches) would take the suite seconds to fill."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

from infra.broker import LongPartitionWatch
from streams.topics import TopicSpec, ensure_topics

pytestmark = pytest.mark.integration


def test_the_watch_warns_at_the_threshold_and_again_a_step_later(kafka_bootstrap: str) -> None:
    topic = f"long-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, 3, 1, {})])
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})

    def write(partition: int, n: int) -> None:
        for _ in range(n):
            producer.produce(topic, b"x", partition=partition)
            producer.flush(10)  # one record a batch, as one write per call sends it

    watch = LongPartitionWatch(kafka_bootstrap, topic, every_s=0, threshold=20, step=10)
    try:
        write(0, 5)
        write(2, 19)
        assert watch.poll() is None  # below the threshold
        write(2, 1)
        warning = watch.poll()
        assert warning is not None and warning.startswith(f"{topic} partition 2 holds 20 records"), warning
        write(2, 9)
        assert watch.poll() is None  # warned of already: the next warning is a step on
        write(2, 1)
        warning = watch.poll()
        assert warning is not None and "partition 2 holds 30 records" in warning, warning
        paced = LongPartitionWatch(kafka_bootstrap, topic, every_s=3600, threshold=20, step=10)
        assert paced.poll(now=0.0) is not None and paced.poll(now=1.0) is None  # read at most every `every_s`
        paced.close()
    finally:
        watch.close()
