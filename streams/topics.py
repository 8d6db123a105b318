"""Topic declarations (names, partitions, configs) and their idempotent creation.

`counter-mutations` uses LogAppendTime so the record timestamp is when the mutation reached Kafka: admission
(DESIGN invariant 2) is judged against it. Brokers that ignore the setting (Tansu keeps the producer's
CreateTime) still work because our producer stamps records at send time.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import xxhash
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from producers.topic_metadata import TopicUnavailable, topic_partitions
from streams.settings import Settings

log = logging.getLogger(__name__)

DAY_MS = 24 * 3600 * 1000
BROKER_DEFAULT = -1  # a CreateTopics replication factor: the broker's default.replication.factor (Kafka 2.4+)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int = BROKER_DEFAULT
    config: dict[str, str] = field(default_factory=dict)
    retention_loses: str = ("older records are deleted whether or not they were used (writes a worker down that long "
                            "had not persisted, dead letters not yet replayed), and replays reach back only that far")


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """The service's topics, shaped by the settings. Their batches are kept as the producer compressed them
    (compression.type=producer): a cluster default of another codec would have the broker recompress every one."""
    rf = BROKER_DEFAULT if settings.replication_factor is None else settings.replication_factor
    kept = {"compression.type": "producer"}
    return [
        TopicSpec(settings.mutations_topic, settings.mutations_partitions, rf, {
            "message.timestamp.type": "LogAppendTime",
            "retention.ms": str(settings.mutations_retention_ms), **kept,
        }),
        TopicSpec(settings.rollups_topic, settings.rollups_partitions, rf, {
            "retention.ms": str(DAY_MS), **kept,
        }),
        TopicSpec(settings.dlq_topic, settings.dlq_partitions, rf, {
            "message.timestamp.type": "LogAppendTime",
            "retention.ms": str(30 * DAY_MS), **kept,
        }),
        stores_spec(settings),
    ]


def stores_spec(settings: Settings) -> TopicSpec:
    """The store bindings topic (streams.store_binding): one partition, so one log orders the claims, kept forever,
    since a binding deleted by retention would let the next process on another store bind anew. It holds a record
    per deployment and per rebind."""
    rf = BROKER_DEFAULT if settings.replication_factor is None else settings.replication_factor
    return TopicSpec(settings.stores_topic, 1, rf, {"retention.ms": "-1", "compression.type": "producer"},
                     "the store binding is deleted with its record, and the next worker or API binds its own store, "
                     "whichever it is")


class TopicError(RuntimeError):
    """A topic could not be created or does not have the shape the service needs."""


def ensure_topics(bootstrap: str, specs: Iterable[TopicSpec], *, timeout: float = 15.0,
                  admin_config: Mapping[str, str] | None = None) -> dict[str, int]:
    """Create missing topics; return {name: partition count} as the broker reports it.

    Existing topics are left alone (their partition count is reported, never changed: re-partitioning moves
    counters between partitions and is an operator decision). If the broker refuses a config key, the topic is
    created without configs and a warning is logged, so a broker with fewer features still runs the service.
    """
    specs = list(specs)
    admin = AdminClient({"bootstrap.servers": bootstrap, **(admin_config or {})})
    existing = admin.list_topics(timeout=timeout).topics
    missing = [s for s in specs if s.name not in existing]
    if missing:
        _create(admin, missing, timeout, with_config=True)
    _check_existing(admin, [s for s in specs if s.name in existing], timeout)
    topics = admin.list_topics(timeout=timeout).topics
    result: dict[str, int] = {}
    for spec in specs:
        meta = topics.get(spec.name)
        if meta is None or meta.error is not None:
            raise TopicError(f"topic {spec.name!r} is not available after creation: {meta and meta.error}")
        result[spec.name] = len(meta.partitions)
        if spec.name in existing and result[spec.name] != spec.partitions:  # said nothing before (a review)
            log.warning("topic %s exists with %d partitions, not the %d asked for (COUNTER_MUTATIONS_PARTITIONS, "
                        "COUNTER_ROLLUPS_PARTITIONS): it is used as it is; re-partitioning moves counters between "
                        "partitions, an operator's decision (infra/README.md)", spec.name, result[spec.name],
                        spec.partitions)
    return result


def _check_existing(admin: AdminClient, specs: list[TopicSpec], timeout: float) -> None:
    """Topics someone else created: refuse a compacted one (compaction keeps a key's latest record, and mutations of
    one counter share a key: writes a worker had not read yet would be gone), and say when one does not stamp
    records as the service would (CreateTime on the mutations topic: admission then takes the producer's time for the
    arrival, bounded by the heartbeats, see the README's Admission)."""
    if not specs:
        return
    try:
        found = admin.describe_configs([ConfigResource(ResourceType.TOPIC, s.name) for s in specs],
                                       request_timeout=timeout)
        configs = {res.name: {k: v.value for k, v in future.result(timeout).items()} for res, future in found.items()}
    except KafkaException as exc:  # a broker that does not describe configs: nothing to check with
        log.warning("could not read the configs of the existing topics %s: %s", ", ".join(s.name for s in specs), exc)
        return
    for spec in specs:
        config = configs.get(spec.name, {})
        if "compact" in (config.get("cleanup.policy") or ""):
            raise TopicError(f"topic {spec.name!r} exists with cleanup.policy={config['cleanup.policy']}: compaction "
                             "drops every record of a key but its latest, so writes not yet read would be lost; set "
                             "cleanup.policy=delete on it (kafka-configs --alter)")
        if shorter := _shorter_retention(spec, config):
            log.warning("topic %s exists keeping records %s, less than the %s it would be created with: %s (raise it "
                        "with kafka-configs --alter)", spec.name, shorter, _kept(spec.config["retention.ms"]),
                        spec.retention_loses)
        wanted = spec.config.get("message.timestamp.type")
        if wanted and config.get("message.timestamp.type") not in (None, wanted):
            log.warning("topic %s exists with message.timestamp.type=%s, not %s: admission judges a write's arrival "
                        "by its producer's timestamp, bounded by the workers' heartbeats", spec.name,
                        config.get("message.timestamp.type"), wanted)


def _shorter_retention(spec: TopicSpec, config: Mapping[str, str | None]) -> str | None:
    """How an existing topic keeps records for less than `spec` asks (retention.ms shorter, or any retention.bytes,
    which deletes by size whatever was read), said as a person reads it; None when it keeps them as long."""
    wanted = spec.config.get("retention.ms")
    if wanted is None:
        return None
    found = []
    with contextlib.suppress(TypeError, ValueError):
        ms = int(config.get("retention.ms") or wanted)
        if ms >= 0 and (int(wanted) < 0 or ms < int(wanted)):
            found.append(f"{_kept(str(ms))} (retention.ms={ms})")
    with contextlib.suppress(TypeError, ValueError):
        if (size := int(config.get("retention.bytes") or -1)) >= 0:
            found.append(f"up to {size} bytes a partition (retention.bytes={size})")
    return " and ".join(found) or None


def _kept(ms: str) -> str:
    """A retention.ms as a span: "forever", "7 days", "36 h"."""
    value = int(ms)
    if value < 0:
        return "forever"
    if value and value % DAY_MS == 0:
        return f"{value // DAY_MS} day{'s' if value > DAY_MS else ''}"
    return f"{value / 3_600_000:.3g} h" if value >= 3_600_000 else f"{value / 1000:g} s"


def _create(admin: AdminClient, specs: list[TopicSpec], timeout: float, *, with_config: bool) -> None:
    new = [NewTopic(s.name, s.partitions, s.replication_factor, config=s.config if with_config else {})
           for s in specs]
    retry: list[TopicSpec] = []
    for spec, future in zip(specs, admin.create_topics(new, request_timeout=timeout).values(), strict=True):
        try:
            future.result(timeout)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            if with_config and err.code() in (KafkaError.INVALID_CONFIG, KafkaError.POLICY_VIOLATION):
                log.warning("broker refused config of topic %s (%s); creating it without", spec.name, err.str())
                retry.append(spec)
                continue
            raise TopicError(f"cannot create topic {spec.name!r}: {err.str()}") from exc
    if retry:
        _create(admin, retry, timeout, with_config=False)


def partition_count(bootstrap: str, topic: str, timeout: float = 10.0, *,
                    config: Mapping[str, str] | None = None) -> int:
    """How many partitions `topic` has (TopicError if it does not exist); `config`: the clients' security
    (`Settings.kafka_security.librdkafka()`)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "allow.auto.create.topics": False,  # ask, never create
                         **(config or {})})
    try:
        return len(topic_partitions(admin.list_topics(topic, timeout=timeout), topic))
    except TopicUnavailable as exc:
        raise TopicError(f"topic {topic!r} is not available: {exc.reason}") from None


def signal_partition(key: bytes, partitions: int) -> int:
    """Rollup signals of one counter always go to one partition (xxhash), so one queue coalesces them."""
    return xxhash.xxh64_intdigest(key) % partitions
