"""Positions the broker knows about the pipeline's topics: end offsets, consumer groups' commits, the DLQ's tail.

Blocking confluent-kafka calls, made by `pipeline_health` on a worker thread, one read at a time (the clients are
not shared between threads). The figures come from the broker, not from a worker's memory, so they hold with any
number of workers and from any API process.

Tansu reports the base offset of a partition's last record batch + 1 as its end offset (see
`streams.positions.PartitionEnds`): end offsets, and the lags and sizes computed from them, can fall short by the
records of that last batch. Reading the DLQ's tail corrects its size with the last offset actually read.

A topic the broker does not hold (never created, or deleted) raises `MissingTopic`, naming it, so a caller loses
that topic's figures only; a broker that does not answer raises what confluent-kafka raised. Metadata requests
never ask the broker to create a missing topic (Tansu, and Kafka's default `auto.create.topics.enable`, would,
with the broker's defaults instead of the service's topic configuration): the view reports what is there.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from producers.topic_metadata import TopicUnavailable, topic_partitions
from schemas.dead_letter import DeadRecord, parse_headers

QUIET_POLL_S = 0.1  # an empty poll after reaching the end: the rest of the last batch has arrived


class MissingTopic(Exception):
    """The broker answered and does not hold `topic` (never created, or deleted since)."""

    def __init__(self, topic: str, error: KafkaError | str) -> None:
        super().__init__(f"topic {topic!r} is missing: {error.str() if isinstance(error, KafkaError) else error}")
        self.topic = topic


@dataclass(frozen=True, slots=True)
class TopicOffsets:
    """Per partition: first and end offset, and a consumer group's committed offset (None: nothing committed)."""

    topic: str
    low: dict[int, int]
    high: dict[int, int]
    committed: dict[int, int | None]

    def lag(self, partition: int) -> int | None:
        """Records between the group's commit (or the start, without one) and the end."""
        if partition not in self.high:
            return None
        done = self.committed.get(partition)
        return max(0, self.high[partition] - (self.low[partition] if done is None else done))

    @property
    def total_lag(self) -> int:
        return sum(self.lag(p) or 0 for p in self.high)

    @property
    def records(self) -> int:
        return sum(self.high[p] - self.low[p] for p in self.high)

    @property
    def end_total(self) -> int:
        return sum(self.high.values())

    @property
    def committed_total(self) -> int:
        return sum(c for c in self.committed.values() if c is not None)


class BrokerOffsets:
    """Reads topic ends, group commits and the DLQ's newest records; clients are made on first use."""

    def __init__(self, bootstrap: str, *, timeout_s: float = 3.0, client_id: str = "counter-api-health",
                 config: Mapping[str, str] | None = None) -> None:
        self.bootstrap = bootstrap
        self.config = dict(config or {})  # the clients' security (`Settings.kafka_security.librdkafka()`)
        self.timeout_s = timeout_s
        self.client_id = client_id
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None
        self.cluster_id: str | None = None  # as the latest metadata answer gave it

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, "client.id": self.client_id,
                                       "allow.auto.create.topics": False, **self.config})
        return self._admin

    @property
    def consumer(self) -> Consumer:
        """Assigns partitions by hand and never commits: its group id is only a name librdkafka asks for."""
        if self._consumer is None:
            self._consumer = Consumer({"bootstrap.servers": self.bootstrap, "client.id": self.client_id,
                                       "group.id": f"{self.client_id}-reader", "enable.auto.commit": False,
                                       "enable.partition.eof": False, "fetch.wait.max.ms": 50,
                                       "auto.offset.reset": "earliest", **self.config})
        return self._consumer

    def partitions(self, topic: str) -> list[int]:
        cluster = self.admin.list_topics(topic, timeout=self.timeout_s)
        self.cluster_id = cluster.cluster_id
        try:
            return topic_partitions(cluster, topic)
        except TopicUnavailable as exc:
            if exc.missing:
                raise MissingTopic(topic, exc.reason) from None
            raise KafkaException(exc.error) from None

    def offsets(self, topic: str, group: str | None = None) -> TopicOffsets:
        """The topic's first and end offsets per partition, and `group`'s committed offsets when given."""
        low: dict[int, int] = {}
        high: dict[int, int] = {}
        parts = self.partitions(topic)
        for p in parts:
            low[p], high[p] = self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=self.timeout_s,
                                                                  cached=False)
        committed = self.committed(topic, group, parts) if group is not None else {}
        return TopicOffsets(topic, low, high, committed)

    def ends(self, topic: str, partitions: list[int]) -> dict[int, int]:
        """The partitions' end offsets, in one ListOffsets request per broker (every record appended before the
        request was made lies below them; on the local broker, below the last batch's first offset + 1, as above)."""
        if not partitions:
            return {}
        futures = self.admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in partitions},
                                          request_timeout=self.timeout_s)
        return {tp.partition: future.result(self.timeout_s).offset for tp, future in futures.items()}

    def committed(self, topic: str, group: str, partitions: list[int]) -> dict[int, int | None]:
        """`group`'s committed offsets of the partitions (None: nothing committed)."""
        committed: dict[int, int | None] = {}
        if partitions:
            request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
            for future in self.admin.list_consumer_group_offsets([request], request_timeout=self.timeout_s).values():
                for tp in future.result(self.timeout_s).topic_partitions or []:
                    committed[tp.partition] = tp.offset if tp.offset >= 0 else None
        return committed

    def tail(self, offsets: TopicOffsets, n: int) -> tuple[list[DeadRecord], dict[int, int]]:
        """Up to `n` newest records of each partition (newest first overall, at most `n`), and per partition the
        end as read (the last offset read + 1, when beyond the reported end offset)."""
        starts = {p: max(offsets.low[p], offsets.high[p] - n) for p in offsets.high if offsets.high[p] > offsets.low[p]}
        ends = dict(offsets.high)
        if not starts or n <= 0:
            return [], ends
        consumer = self.consumer
        consumer.assign([TopicPartition(offsets.topic, p, o) for p, o in starts.items()])
        records: list[DeadRecord] = []
        reached: set[int] = set()
        deadline = time.monotonic() + self.timeout_s
        try:
            while time.monotonic() < deadline:
                batch = consumer.consume(500, QUIET_POLL_S)
                for m in batch:
                    if m.error() is not None:
                        continue
                    p, o = cast(int, m.partition()), cast(int, m.offset())  # set on a consumed record
                    records.append(DeadRecord(p, o, m.timestamp()[1] * 1000, m.key(), m.value() or b"",
                                              parse_headers(m.headers())))
                    ends[p] = max(ends[p], o + 1)
                    if o >= offsets.high[p] - 1:
                        reached.add(p)
                if not batch and reached >= starts.keys():
                    break
        finally:
            consumer.unassign()
        records.sort(key=lambda r: (r.timestamp_us, r.partition, r.offset), reverse=True)
        return records[:n], ends

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._admin = None
