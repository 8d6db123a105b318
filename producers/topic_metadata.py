"""A topic's partitions as a broker's metadata answer gives them: one reading of that answer for every Kafka client of
the service (the topic tools, the producers, the API's offset reader), each of which says in its own words what a
missing topic means to its user."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError

__all__ = ["MISSING_CODES", "TopicUnavailable", "topic_partitions"]

# the codes of a topic the broker does not hold (never created, or deleted since), as against a broker-side failure
MISSING_CODES = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION})


class TopicUnavailable(Exception):
    """The broker answered, and `topic` cannot be used: `missing` when the broker does not hold it; otherwise `error`
    is the broker's error for it."""

    def __init__(self, topic: str, reason: str, *, missing: bool, error: KafkaError | None = None) -> None:
        super().__init__(f"topic {topic!r}: {reason}")
        self.topic = topic
        self.reason = reason
        self.missing = missing
        self.error = error


def topic_partitions(metadata: Any, topic: str) -> list[int]:
    """The partition ids of `topic` in a `list_topics` answer (confluent_kafka's ClusterMetadata), in order;
    TopicUnavailable when it is not there, carries an error, or has no partitions."""
    meta = metadata.topics.get(topic)
    if meta is None:
        raise TopicUnavailable(topic, "not in the broker's metadata", missing=True)
    if meta.error is not None:
        raise TopicUnavailable(topic, meta.error.str(), missing=meta.error.code() in MISSING_CODES, error=meta.error)
    if not meta.partitions:
        raise TopicUnavailable(topic, "no partitions", missing=True)
    return sorted(meta.partitions)
