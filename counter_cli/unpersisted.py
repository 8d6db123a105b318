"""The acknowledged writes no worker has persisted: what `counter up`'s local broker would lose when it stops.

The local broker keeps its topics in memory. A clean stop first lets the worker persist what its partitions hold
(COUNTER_PERSIST_DRAIN_S), but a worker that cannot (its store locked by another process, a full disk) leaves after
the drain's time, and the broker's stop then loses the rest. The stop must say so rather than end as if nothing was
lost: just before the broker goes, this reads the persist group's committed offsets and the records after them, the
workers' own heartbeats (empty records) left out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from schemas import DecodeError, decode_mutations
from schemas.record_headers import is_heartbeat
from streams.positions import watermarks

READ_FOR_S = 20.0  # reading the records after the commits: a partition past the local broker's cliff fetches slowly


@dataclass(frozen=True, slots=True)
class Unpersisted:
    records: int  # mutations records after the persist group's commits (heartbeats left out)
    writes: int  # the mutations they hold (an undecodable record counts as one)
    complete: bool = True  # False: the read ran out of time, and the unread records were counted as one write each

    def __bool__(self) -> bool:
        return self.records > 0


def unpersisted(bootstrap: str, topic: str, group: str, *, timeout_s: float = 10.0,
                read_for_s: float = READ_FOR_S) -> Unpersisted:
    """The records of `topic` after `group`'s committed offsets (from the start where it committed none), and the
    writes they hold, heartbeats left out. Reads with a consumer of its own that joins no group: it only looks."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "enable.partition.eof": True, "client.id": "counter-up-stop"})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions)
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout_s)
        marks = watermarks(consumer, topic, partitions, timeout_s)
        spans: dict[int, tuple[int, int]] = {}
        for tp in committed:
            low, high = marks[tp.partition]
            start = tp.offset if tp.offset >= 0 else low
            if start < high:
                spans[tp.partition] = (start, high)
        if not spans:
            return Unpersisted(0, 0)
        consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in spans.items()])
        next_offset = {p: start for p, (start, _) in spans.items()}
        records = writes = 0
        deadline = time.monotonic() + read_for_s
        while next_offset and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                p, offset, error = message.partition(), message.offset(), message.error()
                if p not in next_offset:
                    continue
                if error is not None or offset is None:
                    if error is not None and error.code() == KafkaError._PARTITION_EOF:
                        del next_offset[p]
                    continue
                if offset >= spans[p][1]:
                    del next_offset[p]
                    continue
                next_offset[p] = offset + 1
                if not message.value() and is_heartbeat(message.headers()):
                    continue
                records += 1
                try:
                    writes += len(decode_mutations(message.value() or b""))
                except DecodeError:
                    writes += 1  # the worker would have dead-lettered it: still a record it did not handle
                if next_offset[p] >= spans[p][1]:
                    del next_offset[p]
        unread = sum(spans[p][1] - offset for p, offset in next_offset.items())
        return Unpersisted(records + unread, writes + unread, complete=not unread)
    finally:
        consumer.close()
