"""How a metadata answer is read for a topic's partitions (producers.topic_metadata), the one reading the topic tools,
the producers and the API's offset reader share: what counts as a missing topic, and what as a broker error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError

from producers.topic_metadata import TopicUnavailable, topic_partitions


def answer(**topics: object) -> SimpleNamespace:
    return SimpleNamespace(topics=topics)


def topic(partitions: list[int], error: KafkaError | None = None) -> SimpleNamespace:
    return SimpleNamespace(partitions={p: object() for p in partitions}, error=error)


def test_the_partitions_come_in_order() -> None:
    assert topic_partitions(answer(t=topic([2, 0, 1])), "t") == [0, 1, 2]


@pytest.mark.parametrize(("metadata", "missing", "reason"), [
    (answer(), True, "not in the broker's metadata"),
    (answer(t=topic([], KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))), True, "Broker: Unknown topic or partition"),
    (answer(t=topic([], KafkaError(KafkaError._UNKNOWN_TOPIC))), True, "Local: Unknown topic"),
    (answer(t=topic([])), True, "no partitions"),
    (answer(t=topic([0], KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))), False,
     "Broker: Topic authorization failed"),
])
def test_a_topic_that_cannot_be_used_says_whether_the_broker_holds_it(metadata: SimpleNamespace, missing: bool,
                                                                      reason: str) -> None:
    """A missing topic is the operator's to create; any other error is the broker's (the API's health page tells the
    two apart, and an authorization error must not read as "create the topic")."""
    with pytest.raises(TopicUnavailable) as refused:
        topic_partitions(metadata, "t")
    assert (refused.value.missing, refused.value.reason) == (missing, reason)
    assert (refused.value.error is None) is (reason in ("not in the broker's metadata", "no partitions"))
