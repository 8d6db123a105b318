"""Hot counters (issue 15 part 4): a namespace's `shards` spreads one counter's writes over N Kafka keys.

The key rule (schemas.shard_key), the namespace option in both file shapes, and the producers that apply it
(CounterProducer, `counter produce`, `counter dlq replay`), without a broker: the producer's sends are captured.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any

import pytest

from control_plane import ConfigError, NamespaceRegistry, default_config_path, load_namespaces, parse_namespaces
from producers import CounterProducer, partition_for
from schemas import MAX_SHARDS, Mutation, MutationOp, counter_key, encode_batch, encode_mutation, shard_key, shard_of
from schemas.dead_letter import DeadRecord

T = 1_732_000_000_000_000  # an event time (µs)


# -- the key rule ---------------------------------------------------------------------------------------


def test_shard_of_is_crc32_of_the_token_modulo_shards() -> None:
    # The standard CRC-32 check value: an outside client (zlib, java.util.zip.CRC32, Go's crc32.ChecksumIEEE)
    # reproduces the rule from this vector.
    assert zlib.crc32(b"123456789") == 0xCBF43926
    assert shard_of("123456789", 256) == 0x26
    assert shard_of("123456789", 10) == 0xCBF43926 % 10
    assert shard_of("été", 7) == zlib.crc32("été".encode()) % 7  # UTF-8 bytes
    assert shard_of("anything", 1) == 0 and shard_of(None, 8) == 0


def test_shard_key_keeps_unsharded_keys_and_suffixes_the_shard() -> None:
    assert shard_key("ns", "c", "tok", 1) == counter_key("ns", "c") == "ns:c"
    assert shard_key("ns", "c", None, 1) == "ns:c"
    assert shard_key("ns", "c", "123456789", 256) == "ns:c#38"
    assert shard_key("ns", "c", None, 8) == "ns:c#0"  # no token: shard 0
    assert shard_key("ns", "a#b", "123456789", 256) == "ns:a#b#38"  # never parsed, so '#' in names is harmless


def test_shards_spread_tokens_evenly_and_a_retry_keeps_its_shard() -> None:
    tokens = [f"evt-{i}" for i in range(16_000)]
    shards = Counter(shard_of(t, 8) for t in tokens)
    assert sorted(shards) == list(range(8))
    assert max(shards.values()) < 1.1 * 2000 and min(shards.values()) > 0.9 * 2000
    assert all(shard_of(t, 8) == shard_of(t, 8) for t in tokens[:100])


def test_mutation_sharded_key() -> None:
    m = Mutation("ns", "c", 1, T, "123456789")
    assert m.key == "ns:c" and m.sharded_key(1) == "ns:c" and m.sharded_key(256) == "ns:c#38"
    assert m._replace(event_id=None).sharded_key(4) == "ns:c#0"


# -- the namespace option -------------------------------------------------------------------------------


def flat(**fields: Any) -> dict[str, Any]:
    return {"namespaces": {"ns": {"counter_type": "EVENTUAL", **fields}}}


def netflix(config_extra: dict[str, Any] | None = None, **beside: Any) -> dict[str, Any]:
    return {"namespaces": {"ns": {
        "persistence_configuration": [{"id": "COUNTER_ROLLUP", "counter_cardinality": "LOW",
                                       "config": {"counter_type": "EVENTUAL", **(config_extra or {})}}],
        **beside}}}


def test_shards_default_to_one_in_every_preset() -> None:
    for counter_type in ("EVENTUAL", "ACCURATE", "BEST_EFFORT"):
        for cardinality in ("LOW", "MEDIUM", "HIGH"):
            ns = parse_namespaces({"namespaces": {"ns": {"counter_type": counter_type,
                                                          "cardinality": cardinality}}})["ns"]
            assert ns.shards == 1


def test_shards_in_the_flat_and_netflix_shapes_and_from_defaults() -> None:
    assert parse_namespaces(flat(shards=8))["ns"].shards == 8
    assert parse_namespaces(flat(shards="16"))["ns"].shards == 16  # the post writes numbers as strings
    assert parse_namespaces(flat(shards=MAX_SHARDS))["ns"].shards == MAX_SHARDS
    assert parse_namespaces(netflix({"shards": 4}))["ns"].shards == 4
    assert parse_namespaces(netflix(shards=4))["ns"].shards == 4  # beside persistence_configuration
    registry = parse_namespaces({"defaults": {"shards": 8}, "namespaces": {
        "a": {"counter_type": "EVENTUAL"}, "b": {"counter_type": "ACCURATE", "shards": 2},
        "c": {"counter_type": "BEST_EFFORT"}}})  # defaults never give BEST_EFFORT shards
    assert [registry[n].shards for n in "abc"] == [8, 2, 1]
    assert registry.shard_counts() == {"a": 8, "b": 2}


@pytest.mark.parametrize(("doc", "field", "reason"), [
    (flat(shards=0), "shards", "integer from 1 to 256"),
    (flat(shards=-2), "shards", "integer from 1 to 256"),
    (flat(shards=257), "shards", "at most 256 (got 257)"),
    (flat(shards=2.5), "shards", "integer from 1 to 256"),
    (flat(shards=True), "shards", "integer from 1 to 256"),
    (flat(shards="many"), "shards", "integer from 1 to 256"),
    (flat(shard=8), "shard", "did you mean 'shards'"),
    ({"namespaces": {"ns": {"counter_type": "BEST_EFFORT", "shards": 4}}}, "shards", "never to Kafka"),
    ({"namespaces": {"ns": {"counter_type": "BEST_EFFORT", "shards": 1}}}, "shards", "never to Kafka"),
    (netflix({"shards": 0}), "persistence_configuration[COUNTER_ROLLUP].config.shards", "integer from 1 to 256"),
    (netflix({"shards": 4}, shards=4), "shards", "set it in one place only"),
    ({"defaults": {"shards": 300}, "namespaces": {"ns": {"counter_type": "EVENTUAL"}}}, "defaults.shards",
     "at most 256"),
])
def test_bad_shards_name_the_field(doc: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_namespaces(doc)
    assert (info.value.namespace, info.value.field) == ("ns", field)
    assert reason in info.value.reason


def test_shipped_example_shards_plays() -> None:
    registry = load_namespaces(default_config_path())
    assert registry.shard_counts() == {"plays": 32}
    assert registry["my_dataset"].shards == 1
    header = default_config_path().read_text().split("\nnamespaces:")[0]
    assert "#   shards " in header  # documented in the header comment


# -- producers ------------------------------------------------------------------------------------------


class Captured(CounterProducer):
    """A CounterProducer whose records are captured instead of produced (no broker needed)."""

    def __init__(self, partitions: int = 8, **kwargs: Any) -> None:
        super().__init__("127.0.0.1:9", config={"log_level": 0}, **kwargs)
        self._num_partitions = partitions
        self.records: list[tuple[bytes, bytes, int, int]] = []

    def _produce(self, key: bytes, value: bytes, partition: int, future: Any, mutations: list[Mutation]) -> None:
        self.records.append((key, value, partition, len(mutations)))
        future.set_result(None)


def hot(n: int, namespace: str = "hot") -> list[Mutation]:
    return [Mutation(namespace, "viral", 1, T + i, f"tok-{i}") for i in range(n)]


def test_producer_keys_each_write_by_its_shard_and_partitions_by_the_key() -> None:
    producer = Captured(shards={"hot": 8, "cold": 1})
    try:
        for m in hot(400) + hot(5, "cold") + hot(5, "other"):
            producer.send(m)
        assert len(producer.records) == 410
        for (key, _value, partition, _n), m in zip(producer.records, hot(400) + hot(5, "cold") + hot(5, "other"),
                                                    strict=True):
            assert key == m.sharded_key(8 if m.namespace == "hot" else 1).encode()
            assert partition == partition_for(key, 8)
        keys = Counter(key for key, *_ in producer.records[:400])
        assert sorted(keys) == sorted(f"hot:viral#{k}".encode() for k in range(8))
        partitions = {p for _k, _v, p, _n in producer.records[:400]}
        assert partitions == {partition_for(f"hot:viral#{k}".encode(), 8) for k in range(8)}
        assert len(partitions) >= 3
        assert {p for _k, _v, p, _n in producer.records[400:405]} == {partition_for(b"cold:viral", 8)}
        # A retry (same token) is keyed and partitioned exactly as the first try.
        before = producer.records[7]
        producer.send(hot(8)[7])
        assert producer.records[-1][:3] == before[:3]
    finally:
        producer.close()


def test_producer_batches_per_partition_with_the_first_mutations_shard_key() -> None:
    producer = Captured(shards={"hot": 8}, batch_size=50)
    try:
        for m in hot(800):
            producer.send(m)
        producer.flush()
        assert sum(n for *_, n in producer.records) == 800
        for key, _value, partition, _n in producer.records:
            assert key.startswith(b"hot:viral#") and partition == partition_for(key, 8)
        assert len({p for *_, p, _n in producer.records}) >= 3
    finally:
        producer.close()


def test_producer_takes_a_registry_and_refuses_bad_counts() -> None:
    registry = parse_namespaces({"namespaces": {"hot": {"counter_type": "EVENTUAL", "shards": 4},
                                                "plain": {"counter_type": "EVENTUAL"}}})
    assert isinstance(registry, NamespaceRegistry)
    producer = Captured(namespaces=registry)
    try:
        assert producer.shards == {"hot": 4}
        assert producer.key_of(Mutation("hot", "c", 1, T, "123456789")) == b"hot:c#" + str(0xCBF43926 % 4).encode()
        assert producer.key_of(Mutation("plain", "c", 1, T, "123456789")) == b"plain:c"
    finally:
        producer.close()
    for bad in ({"hot": 0}, {"hot": 257}, {"hot": "8"}, {"hot": True}):
        with pytest.raises(ValueError, match=r"shards\['hot'\] must be an integer from 1 to 256"):
            CounterProducer("127.0.0.1:9", shards=bad)


def test_counter_produce_loads_the_namespaces_shards(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from counter_cli import produce_cmd
    from counter_cli.main import build_parser
    from tests.helpers import RecordingProducer

    namespaces = tmp_path / "ns.yaml"
    namespaces.write_text("namespaces:\n  hot: { counter_type: EVENTUAL, shards: 8 }\n")
    monkeypatch.setenv("COUNTER_NAMESPACES", str(namespaces))
    RecordingProducer.reset()
    monkeypatch.setattr(produce_cmd, "CounterProducer", RecordingProducer)
    args = build_parser().parse_args(["produce", "hot", "viral", "1", "--bootstrap", "127.0.0.1:9"])
    assert produce_cmd.run(args) == 0
    assert RecordingProducer.made[0]["namespaces"].shard_counts() == {"hot": 8}


def test_dlq_replay_keys_a_dead_mutation_by_its_shard() -> None:
    value = encode_mutation(Mutation("hot", "viral", 3, T, "123456789", "", MutationOp.ADD))
    r = DeadRecord(0, 4, T, b"hot:viral#1", value, {})
    assert r.produce_key() == b"hot:viral"  # no shards known: the counter's own key
    assert r.produce_key({"hot": 256}) == b"hot:viral#38"
    assert r.produce_key({"other": 8}) == b"hot:viral"
    two = encode_batch([Mutation("hot", "a", 1, T, "x"), Mutation("hot", "b", 1, T, "y")])
    assert DeadRecord(0, 5, T, b"orig", two, {}).produce_key({"hot": 8}) == b"orig"  # a batch keeps its key
