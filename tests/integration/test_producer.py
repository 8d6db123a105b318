"""CounterProducer against the real broker, read back by an independent aiokafka consumer."""

from __future__ import annotations

import asyncio
import io
import json
from collections import Counter, defaultdict
from pathlib import Path

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from infra.broker import LocalBroker
from producers import CounterProducer, DeliveryError, partition_for
from producers.asyncio_producer import AsyncProducer
from schemas import Mutation, MutationOp, decode_mutations
from streams.topics import TopicError, partition_count
from tests.helpers import make_topic, read_all, read_topic, topic_size, wait_for

pytestmark = pytest.mark.integration

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"
PARTITIONS = 4


def _produce_many(bootstrap: str, topic: str, n: int, batch_size: int) -> list[Mutation]:
    sent = []
    with CounterProducer(bootstrap, topic=topic, batch_size=batch_size) as producer:
        for i in range(n):
            future = producer.add("my_dataset", f"c{i % 37}", (i % 7) - 3, token=f"tok-{i}",
                                  generation_time=1_730_000_000 + i)
            sent.append(producer.mutation(MutationOp.ADD, "my_dataset", f"c{i % 37}", (i % 7) - 3,
                                          f"tok-{i}", 1_730_000_000 + i))
        producer.flush()
        assert future.done() and future.exception() is None
    return sent


@pytest.mark.parametrize("batch_size", [1, 100])
def test_every_mutation_arrives_once_on_its_counters_partition(kafka_bootstrap, topic_name, batch_size):
    make_topic(kafka_bootstrap, topic_name, PARTITIONS)
    n = 1000
    sent = _produce_many(kafka_bootstrap, topic_name, n, batch_size)
    records = read_all(kafka_bootstrap, topic_name)
    if batch_size > 1:
        assert len(records) < n / 10, "batching should put many mutations in one record"
    else:
        assert len(records) == n
    received: list[Mutation] = []
    partitions_of = defaultdict(set)
    for record in records:
        for m in decode_mutations(record.value):
            received.append(m)
            partitions_of[m.key].add(record.partition)
            assert record.partition == partition_for(m.key.encode(), PARTITIONS)
        if batch_size == 1:
            assert record.key == decode_mutations(record.value)[0].key.encode()
    assert Counter(received) == Counter(sent)
    assert all(len(p) == 1 for p in partitions_of.values())


def test_partition_matches_librdkafka_murmur2(kafka_bootstrap, topic_name):
    """Our client-side partition equals the one a plain keyed producer (murmur2_random) picks."""
    make_topic(kafka_bootstrap, topic_name, 7)
    plain = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    keys = [f"my_dataset:counter-{i}" for i in range(200)]
    for key in keys:
        plain.produce(topic_name, key=key.encode(), value=b"{}")
    assert plain.flush(20) == 0
    records = read_topic(kafka_bootstrap, topic_name, len(keys))
    for record in records:
        assert record.partition == partition_for(record.key, 7), record.key


def test_payload_decodes_with_plain_fastavro(kafka_bootstrap, topic_name):
    make_topic(kafka_bootstrap, topic_name, 1)
    with CounterProducer(kafka_bootstrap, topic=topic_name) as producer:
        producer.add("my_dataset", "counter123", 2, token="some_event_id", generation_time="2024-10-05T14:48:00Z")
    with CounterProducer(kafka_bootstrap, topic=topic_name, batch_size=10) as producer:
        for i in range(3):
            producer.add("my_dataset", f"b{i}", i + 1, token=f"t{i}")
    single, batch = read_topic(kafka_bootstrap, topic_name, 2)
    mutation_schema = fastavro.schema.load_schema(str(SCHEMA_DIR / "count_mutation.avsc"))
    batch_schema = fastavro.schema.load_schema(str(SCHEMA_DIR / "mutation_batch.avsc"),
                                               named_schemas={"counter.v1.CountMutation": mutation_schema})
    for record, schema in ((single, mutation_schema), (batch, batch_schema)):
        assert record.value[:2] == b"\xc3\x01"
        fp = fastavro.schema.fingerprint(fastavro.schema.to_parsing_canonical_form(schema), "CRC-64-AVRO")
        assert record.value[2:10] == bytes.fromhex(fp)  # fastavro's hex is already the little-endian bytes
        body = fastavro.schemaless_reader(io.BytesIO(record.value[10:]), schema)
        if schema is mutation_schema:
            assert body["namespace"] == "my_dataset" and body["counter_name"] == "counter123"
            assert body["delta"] == 2 and body["event_id"] == "some_event_id"
            assert body["event_time"] == 1728139680 * 1_000_000
        else:
            assert [m["delta"] for m in body["mutations"]] == [1, 2, 3]


def test_clear_and_generated_tokens(kafka_bootstrap, topic_name):
    make_topic(kafka_bootstrap, topic_name, 2)
    with CounterProducer(kafka_bootstrap, topic=topic_name) as producer:
        producer.add("my_dataset", "x", 1)
        producer.add("my_dataset", "x", 1)
        producer.clear("my_dataset", "x")
    records = read_topic(kafka_bootstrap, topic_name, 3)
    ms = sorted((m for r in records for m in decode_mutations(r.value)), key=lambda m: m.event_time)
    assert [m.op for m in ms] == [MutationOp.ADD, MutationOp.ADD, MutationOp.CLEAR]
    assert len({m.event_id for m in ms}) == 3 and all(ms_.event_id for ms_ in ms)


@pytest.mark.parametrize("call, field", [
    (lambda p: p.add("bad:ns", "c", 1), "namespace"),
    (lambda p: p.add("my_dataset", "", 1), "counter_name"),
    (lambda p: p.add("my_dataset", "has space", 1), "counter_name"),
    (lambda p: p.add("my_dataset", "c", 2**63), "delta"),
    (lambda p: p.add("my_dataset", "c", 1, generation_time="yesterday-ish"), "generation_time"),
])
def test_invalid_input_is_a_clear_error(kafka_bootstrap, topic_name, call, field):
    make_topic(kafka_bootstrap, topic_name, 1)
    with CounterProducer(kafka_bootstrap, topic=topic_name) as producer, pytest.raises(ValueError, match=field):
        call(producer)
    assert topic_size(kafka_bootstrap, topic_name) == 0


def test_delivery_failure_reaches_the_caller(tmp_path, topic_name):
    """With the broker stopped, the caller gets a DeliveryError (from the future and from flush)."""
    broker = LocalBroker(tmp_path / "broker.log").start()
    try:
        make_topic(broker.bootstrap, topic_name, 1)
        producer = CounterProducer(broker.bootstrap, topic=topic_name, delivery_timeout_ms=3000)
        producer.add("my_dataset", "warmup", 1)
        producer.flush(10)
    finally:
        broker.stop()
    future = producer.add("my_dataset", "lost", 1)
    with pytest.raises(DeliveryError) as info:
        producer.flush(15)
    assert "not delivered" in str(info.value) or "not acknowledged" in str(info.value)
    wait_for(future.done, 10, message="future resolution")
    assert isinstance(future.exception(), DeliveryError)
    producer.close(1)  # failures were already reported by flush(); close must not hang


def test_json_records_from_plain_producer_decode(kafka_bootstrap, topic_name):
    make_topic(kafka_bootstrap, topic_name, 1)
    body = {"namespace": "my_dataset", "counter_name": "counter123", "delta": 2,
            "idempotency_token": {"token": "some_event_id", "generation_time": "2024-10-05T14:48:00Z"}}
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    plain.produce(topic_name, key=b"my_dataset:counter123", value=json.dumps(body).encode())
    assert plain.flush(10) == 0
    (record,) = read_topic(kafka_bootstrap, topic_name, 1)
    (m,) = decode_mutations(record.value)
    assert (m.namespace, m.counter_name, m.delta, m.event_id) == ("my_dataset", "counter123", 2, "some_event_id")


def test_the_producers_never_have_the_broker_create_a_missing_topic(kafka_bootstrap, topic_name):
    """A producer's metadata request for a topic the broker does not hold made the broker create it with the
    broker's defaults (Tansu does, and Kafka with its default `auto.create.topics.enable`): the API started before
    `counter up` (or with a misspelt topic) then left a mutations topic with the wrong partition count and none of
    the service's configuration, which `ensure_topics` leaves alone. Now they refuse, naming the topic."""
    missing = f"{topic_name}-never-created"
    with pytest.raises(DeliveryError, match=missing), CounterProducer(kafka_bootstrap, topic=missing) as producer:
        producer.add("my_dataset", "c", 1).result(30)

    async def ask() -> None:
        kafka = AsyncProducer(kafka_bootstrap)
        kafka.start()
        try:
            await kafka.partitions(missing)
        finally:
            await kafka.stop()
    with pytest.raises(DeliveryError, match=missing):
        asyncio.run(ask())
    with pytest.raises(TopicError, match=missing):
        partition_count(kafka_bootstrap, missing)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap, "allow.auto.create.topics": False})
    assert missing not in admin.list_topics(timeout=10).topics
