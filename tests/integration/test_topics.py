"""Topic creation against the real broker: creates what is missing, leaves what exists."""

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

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
        f"{topic_name}-m": 2, f"{topic_name}-r": 2, f"{topic_name}-d": 1, f"{topic_name}-m-stores": 1}
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert all(len(p.replicas) == 1 for p in topics[f"{topic_name}-m"].partitions.values())


def test_an_existing_compacted_topic_is_refused_and_another_timestamp_type_said(kafka_bootstrap, topic_name, caplog):
    """Topics someone else created (a review: their settings were never looked at). Compaction keeps a key's latest
    record only, and one counter's mutations share a key: writes not yet read would be lost."""
    import logging

    from streams.topics import TopicError

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    created = admin.create_topics([
        NewTopic(f"{topic_name}-c", 1, 1, config={"cleanup.policy": "compact"}),
        NewTopic(f"{topic_name}-t", 1, 1, config={"message.timestamp.type": "CreateTime"})])
    for future in created.values():
        future.result(10)
    with pytest.raises(TopicError, match=f"topic '{topic_name}-c' exists with cleanup.policy=compact"):
        ensure_topics(kafka_bootstrap, [TopicSpec(f"{topic_name}-c", 1)])
    with caplog.at_level(logging.WARNING, logger="streams.topics"):
        ensure_topics(kafka_bootstrap, [TopicSpec(f"{topic_name}-t", 1, config={"message.timestamp.type":
                                                                                "LogAppendTime"})])
    assert any("message.timestamp.type=CreateTime, not LogAppendTime" in r.getMessage() for r in caplog.records)


def test_an_existing_topic_keeping_records_for_less_is_said(kafka_bootstrap, topic_name, caplog):
    """A mutations topic someone created with 1 h of retention (or a size bound) deletes writes a worker down longer
    had not read, and bounds replays: start-up says so, naming what it keeps against what it would be created with."""
    import logging

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_topics([
            NewTopic(f"{topic_name}-s", 1, 1, config={"retention.ms": "3600000"}),
            NewTopic(f"{topic_name}-b", 1, 1, config={"retention.ms": "604800000", "retention.bytes": "1048576"}),
            NewTopic(f"{topic_name}-k", 1, 1, config={"retention.ms": "604800000"})]).values():
        future.result(10)
    week = {"retention.ms": "604800000"}
    with caplog.at_level(logging.WARNING, logger="streams.topics"):
        ensure_topics(kafka_bootstrap, [TopicSpec(f"{topic_name}-{n}", 1, config=week) for n in "sbk"])
    said = [r.getMessage() for r in caplog.records]
    assert any(f"topic {topic_name}-s exists keeping records 1 h (retention.ms=3600000), less than the 7 days" in m
               for m in said), said
    assert any(f"topic {topic_name}-b exists keeping records up to 1048576 bytes a partition" in m for m in said), said
    assert not any(f"{topic_name}-k" in m for m in said), said


def test_an_existing_topic_with_other_partitions_is_said_and_used(kafka_bootstrap, topic_name, caplog):
    """COUNTER_MUTATIONS_PARTITIONS set to other than an existing topic's count was silently not applied (a review)."""
    import logging

    ensure_topics(kafka_bootstrap, [TopicSpec(f"{topic_name}-p", 2)])
    with caplog.at_level(logging.WARNING, logger="streams.topics"):
        assert ensure_topics(kafka_bootstrap, [TopicSpec(f"{topic_name}-p", 5)]) == {f"{topic_name}-p": 2}
    assert any(f"topic {topic_name}-p exists with 2 partitions, not the 5 asked for" in r.getMessage()
               for r in caplog.records)
