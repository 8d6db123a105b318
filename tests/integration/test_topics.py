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


def test_the_service_topics_take_the_broker_default_replication(kafka_bootstrap, topic_name):
    """CreateTopics with replication factor -1 (the broker's default.replication.factor) and the topics' configs
    are accepted: the local broker creates them with its one replica."""
    from streams.settings import Settings
    from streams.topics import topic_specs

    settings = Settings(mutations_topic=f"{topic_name}-m", rollups_topic=f"{topic_name}-r",
                        dlq_topic=f"{topic_name}-d", mutations_partitions=2, rollups_partitions=2)
    assert ensure_topics(kafka_bootstrap, topic_specs(settings)) == {
        f"{topic_name}-m": 2, f"{topic_name}-r": 2, f"{topic_name}-d": 1}
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert all(len(p.replicas) == 1 for p in topics[f"{topic_name}-m"].partitions.values())
