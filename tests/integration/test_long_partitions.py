"""`counter up`'s warning about the local broker's long partitions (infra.broker.LongPartitionWatch) reads the end
offsets of a real broker: it warns once a partition reaches the threshold, names that partition, and warns again only
a further step on. The threshold is lowered here: the real one (15,000 batches) would take the suite seconds to fill."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from infra.broker import LongPartitionWatch
from streams.topics import TopicSpec, ensure_topics
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def topic_writer(bootstrap: str, partitions: int) -> tuple[str, Callable[[int, int], None]]:
    """A new topic, and `write(partition, n)`: n records, one a batch, as one write per call sends them."""
    topic = f"long-{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [TopicSpec(topic, partitions, 1, {})])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})

    def write(partition: int, n: int) -> None:
        for _ in range(n):
            producer.produce(topic, b"x", partition=partition)
            producer.flush(10)
    return topic, write


def test_the_watch_warns_at_the_threshold_and_again_a_step_later(kafka_bootstrap: str) -> None:
    topic, write = topic_writer(kafka_bootstrap, 3)

    watch = LongPartitionWatch(kafka_bootstrap, topic, threshold=20, step=10)
    try:
        write(0, 5)
        write(2, 19)
        assert watch.check() is None  # below the threshold
        write(2, 1)
        warning = watch.check()
        assert warning is not None and warning.startswith(f"{topic} partition 2 holds 20 records"), warning
        write(2, 9)
        assert watch.check() is None  # warned of already: the next warning is a step on
        write(2, 1)
        warning = watch.check()
        assert warning is not None and "partition 2 holds 30 records" in warning, warning
    finally:
        watch.close()


def test_the_supervision_loop_polls_without_waiting_on_the_broker(kafka_bootstrap: str) -> None:
    """`poll` reads on a thread of its own, at most every `every_s`: `counter up`'s loop never waits on a read."""
    topic, write = topic_writer(kafka_bootstrap, 1)
    write(0, 3)
    watch = LongPartitionWatch(kafka_bootstrap, topic, every_s=3600, threshold=3, step=10)
    try:
        started = time.monotonic()
        found = watch.poll(now=0.0)  # starts the read; what it finds comes at a later poll
        assert time.monotonic() - started < 0.5
        # within every_s: no second read, only the first one's warning
        found = found or wait_for(lambda: watch.poll(now=1.0), 10, message="the read's warning")
        assert isinstance(found, str) and found.startswith(f"{topic} partition 0 holds 3 records"), found
        assert watch.poll(now=2.0) is None
    finally:
        watch.close()
