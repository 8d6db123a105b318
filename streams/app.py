"""The Faust application factory: the Faust app's Kafka settings (group, topics, timeouts). The persist path's own
aiokafka consumer is `agents.persist_consumer`, and the worker's producer `producers.asyncio_producer`.

Agents (in `agents/`) attach themselves to the app this returns; topics carry raw bytes because the
codec in `schemas/` owns the wire format (Avro single-object or JSON).
"""

from __future__ import annotations

from dataclasses import dataclass

import faust

from streams.settings import Settings


@dataclass(frozen=True, slots=True)
class AppTopics:
    mutations: faust.TopicT
    rollups: faust.TopicT
    dlq: faust.TopicT


def broker_url(bootstrap: str) -> list[str]:
    """Faust wants kafka://host:port URLs, one per bootstrap server."""
    return [f"kafka://{host.strip()}" for host in bootstrap.split(",")]


def create_app(settings: Settings, *, app_id: str = "counter-worker") -> faust.App:
    """A Faust app for the worker; `app_id` is the consumer group shared by all workers."""
    if not settings.kafka_bootstrap:
        raise ValueError("COUNTER_KAFKA_BOOTSTRAP must be set for the worker (counter up sets it for you)")
    return faust.App(
        app_id,
        broker=broker_url(settings.kafka_bootstrap),
        store="memory://",
        web_enabled=True,
        web_host="127.0.0.1",
        web_bind="127.0.0.1",  # its /metrics and /ready for this host only (Faust binds 0.0.0.0 by default)
        web_port=settings.worker_port,
        topic_partitions=settings.mutations_partitions,
        topic_allow_declare=False,  # streams.topics creates topics with the right configs
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        **settings.kafka_security.faust(),
        producer_acks=-1,
        broker_session_timeout=settings.group_session_timeout_s,
        broker_rebalance_timeout=settings.group_rebalance_timeout_s,
        broker_heartbeat_interval=1.0,
        broker_commit_every=1000,
        broker_commit_interval=1.0,
        datadir=str(settings.data_dir / "faust"),
    )


def declare_topics(app: faust.App, settings: Settings) -> AppTopics:
    """The service topics as raw-bytes Faust topics."""
    def topic(name: str, partitions: int) -> faust.TopicT:
        return app.topic(name, partitions=partitions, key_serializer="raw", value_serializer="raw",
                         allow_empty=True)

    return AppTopics(
        mutations=topic(settings.mutations_topic, settings.mutations_partitions),
        rollups=topic(settings.rollups_topic, settings.rollups_partitions),
        dlq=topic(settings.dlq_topic, settings.dlq_partitions),
    )
