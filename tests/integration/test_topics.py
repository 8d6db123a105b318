"""Topic creation against the real broker: creates what is missing, leaves what exists."""

import pytest
from confluent_kafka.admin import AdminClient

from streams.topics import TopicSpec, ensure_topics

pytestmark = pytest.mark.integration


def test_ensure_topics_creates_then_is_idempotent(kafka_bootstrap, topic_name):
    specs = [TopicSpec(topic_name + "-a", 3, config={"message.timestamp.type": "LogAppendTime"}),
             TopicSpec(topic_name + "-b", 5)]
    assert ensure_topics(kafka_bootstrap, specs) == {topic_name + "-a": 3, topic_name + "-b": 5}
    # Asking again, even with another partition count, reports the existing shape and changes nothing.
    again = ensure_topics(kafka_bootstrap, [TopicSpec(topic_name + "-a", 9)])
    assert again == {topic_name + "-a": 3}
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert len(topics[topic_name + "-a"].partitions) == 3
