"""Dimensions: naming of combination counters, validation, the v2 wire format, the namespace configuration, and
the persist path's expansion, bound, registry and clears (on real SQLite stores)."""

from __future__ import annotations

import asyncio
import io
import json
from itertools import combinations as choose
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.dimensions import Combinations
from agents.persist import PreparedBatch, RawRecord, prepare
from agents.persist_path import persist_batch
from control_plane import ConfigError, DimensionConfig, parse_namespaces
from control_plane.admission import extras_refusal
from schemas import (
    COUNT_MUTATION,
    COUNT_MUTATION_V2,
    MAX_EVENT_TIME,
    MICROS,
    MUTATION_BATCH,
    MUTATION_BATCH_V2,
    DecodeError,
    Mutation,
    MutationOp,
    ValidationError,
    combination,
    decode_mutations,
    decode_signals,
    encode_batch,
    encode_mutation,
    encode_signals,
    mutation_body,
    mutation_from_json,
    record_of_bodies,
    split_combination,
    subset_combinations,
    v2_body,
    validate_counter_name,
    validate_dimensions,
    validate_internal_counter_name,
    validate_item,
    validate_mutation,
)
from schemas.dead_letter import DeadLetter
from sinks import Aggregate, EventRow, Partitioning, SqliteEventStore, SqliteRollupStore

T = 1_790_000_000 * MICROS  # 2026-09-21: stamped in the past, as records are (prepare refuses ones ahead)

# -- naming ------------------------------------------------------------------------------------------------------

_name_chars = st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp"))
counters = st.text(_name_chars, min_size=1, max_size=40).filter(
    lambda s: _valid(validate_counter_name, s))
keys = st.from_regex(r"[a-z][a-z0-9_]{0,31}", fullmatch=True)
values = st.text(_name_chars, min_size=1, max_size=20).filter(lambda s: "=" not in s and _valid(
    lambda v: validate_dimensions({"k": v}), s))
dimension_maps = st.dictionaries(keys, values, min_size=1, max_size=4)


def _valid(check: Any, value: Any) -> bool:
    try:
        check(value)
    except ValidationError:
        return False
    return True


def test_combination_names_the_pairs_sorted_by_key() -> None:
    assert combination("views", {"device": "tv", "country": "US"}) == "views country=US device=tv"
    assert combination("views", [("device", "tv"), ("country", "US")]) == "views country=US device=tv"
    assert combination("views", {}) == "views"
    assert split_combination("views country=US device=tv") == ("views", (("country", "US"), ("device", "tv")))
    assert split_combination("views") == ("views", ())
    for bad in ("views country", "views =US", "views country=", "views  country=US"):
        with pytest.raises(ValueError, match="not a dimension combination"):
            split_combination(bad)


@given(counters, dimension_maps)
@settings(max_examples=300, deadline=None)
def test_property_naming_round_trips_and_never_collides_with_a_user_counter(counter: str,
                                                                             dims: dict[str, str]) -> None:
    name = combination(counter, dims)
    assert split_combination(name) == (counter, tuple(sorted(dims.items())))
    assert validate_internal_counter_name(name) == name
    with pytest.raises(ValidationError):  # no user counter can be named like a combination
        validate_counter_name(name)
    subsets = subset_combinations(counter, tuple(sorted(dims.items())))
    assert len(subsets) == len(set(subsets)) == 2 ** len(dims) - 1
    assert subsets[-1] == name
    assert all(validate_internal_counter_name(s) == s for s in subsets)


def test_subset_combinations() -> None:
    dims = (("country", "US"), ("device", "tv"), ("os", "linux"))
    expected = {combination("v", chosen) for n in (1, 2, 3) for chosen in choose(dims, n)}
    assert set(subset_combinations("v", dims)) == expected and len(expected) == 7
    assert subset_combinations("v", ()) == ()


@pytest.mark.parametrize("name", ["v b=1 a=2", "v a=1 a=2", "v A=1", "v a=1 b=2 c=3 d=4 e=5", "v a=\x01",
                                  "v a=1=2", "v a", "has\tspace a=1", "v a=" + "x" * 65])
def test_internal_names_refuse_malformed_combinations(name: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_internal_counter_name(name)
    assert info.value.field == "counter"


# -- validation --------------------------------------------------------------------------------------------------


def test_dimensions_are_validated_and_sorted() -> None:
    assert validate_dimensions({"device": "tv", "country": "US"}) == (("country", "US"), ("device", "tv"))
    assert validate_dimensions(None) == validate_dimensions({}) == ()
    assert validate_dimensions([("b", "1"), ("a", "é")]) == (("a", "é"), ("b", "1"))


@pytest.mark.parametrize(("value", "field", "reason"), [
    ({"Country": "US"}, "dimensions.Country", "lower-case identifier"),
    ({"country": ""}, "dimensions.country", "must not be empty"),
    ({"country": "U S"}, "dimensions.country", "whitespace"),
    ({"country": "a=b"}, "dimensions.country", "'='"),
    ({"country": "\u00a0"}, "dimensions.country", "whitespace"),
    ({"country": "x" * 65}, "dimensions.country", "at most 64 UTF-8 bytes"),
    ({"country": "é" * 33}, "dimensions.country", "at most 64 UTF-8 bytes"),
    ({"country": 1}, "dimensions.country", "must be a string"),
    ({"a": "1", "b": "1", "c": "1", "d": "1", "e": "1"}, "dimensions", "at most 4 dimensions"),
    ("country=US", "dimensions", "must be a map"),
    ([("a", "1"), ("a", "2")], "dimensions.a", "given more than once"),
])
def test_invalid_dimensions_name_the_field(value: Any, field: str, reason: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_dimensions(value)
    assert info.value.field == field and reason in info.value.reason


def test_item_is_validated() -> None:
    assert validate_item("") == "" and validate_item("user-42") == "user-42" and validate_item("é" * 128)
    for bad, reason in (("a\x00", "control"), ("x" * 257, "at most 256"), (5, "must be a string")):
        with pytest.raises(ValidationError, match=reason):
            validate_item(bad)


def test_a_clear_takes_no_dimensions() -> None:
    m = Mutation("ns", "v", 0, T, "t", "", MutationOp.CLEAR, (("a", "1"),))
    with pytest.raises(ValidationError) as info:
        validate_mutation(m)
    assert info.value.field == "dimensions" and "all its combinations" in info.value.reason
    with pytest.raises(ValidationError) as info:
        mutation_from_json({"namespace": "ns", "counter_name": "v", "op": "clear", "dimensions": {"a": "1"}})
    assert info.value.field == "dimensions"


def test_json_records_carry_dimensions_and_item() -> None:
    m = mutation_from_json({"namespace": "ns", "counter_name": "v", "delta": 2, "item": "u1",
                            "dimensions": {"device": "tv", "country": "US"},
                            "idempotency_token": {"token": "t", "generation_time": "2026-11-23T10:00:00Z"}})
    assert m.dimensions == (("country", "US"), ("device", "tv")) and m.item == "u1"
    plain = mutation_from_json({"namespace": "ns", "counter_name": "v", "delta": 2, "dimensions": None,
                                "item": None})
    assert plain.dimensions == () and plain.item == ""
    [decoded] = decode_mutations(json.dumps({"namespace": "ns", "counter_name": "v", "delta": 1,
                                             "dimensions": {"country": "FR"}}).encode())
    assert decoded.dimensions == (("country", "FR"),)
    with pytest.raises(DecodeError) as info:
        decode_mutations(json.dumps({"namespace": "ns", "counter_name": "v", "delta": 1,
                                     "dimensions": {"country": "F R"}}).encode())
    assert info.value.field == "dimensions.country"


# -- the v2 wire format ------------------------------------------------------------------------------------------


def _fastavro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def _record(m: Mutation, v2: bool) -> dict[str, Any]:
    r = {"op": m.op.value, "namespace": m.namespace, "counter_name": m.counter_name, "delta": m.delta,
         "event_time": m.event_time, "event_id": m.event_id, "event_item_key": m.event_item_key}
    if v2:
        r |= {"dimensions": dict(m.dimensions), "item": m.item}
    return r


PLAIN = Mutation("my_dataset", "counter123", 2, T, "tok", "", MutationOp.ADD)
DIMENSIONED = Mutation("plays", "title_1", 3, T + 1, "tok2", "k", MutationOp.ADD,
                       (("country", "US"), ("device", "tv")), "")
WITH_ITEM = Mutation("plays", "title_1", 1, T + 2, "tok3", "", MutationOp.ADD, (), "user-\u00e9")


def test_plain_mutations_stay_v1_byte_for_byte() -> None:
    v1 = COUNT_MUTATION.header + _fastavro(COUNT_MUTATION.parsed, _record(PLAIN, False))
    assert encode_mutation(PLAIN) == v1 == record_of_bodies([mutation_body(PLAIN)])
    batch = encode_batch([PLAIN, PLAIN._replace(event_id="other")])
    assert batch[:10] == MUTATION_BATCH.header
    assert batch == MUTATION_BATCH.header + _fastavro(
        MUTATION_BATCH.parsed, {"mutations": [_record(PLAIN, False), _record(PLAIN._replace(event_id="other"), False)]})


@pytest.mark.parametrize("m", [DIMENSIONED, WITH_ITEM, DIMENSIONED._replace(item="u")])
def test_v2_records_equal_fastavro_and_round_trip(m: Mutation) -> None:
    expected = COUNT_MUTATION_V2.header + _fastavro(COUNT_MUTATION_V2.parsed, _record(m, True))
    assert encode_mutation(m) == expected == record_of_bodies([mutation_body(m)], v2=True)
    assert decode_mutations(expected) == [m]
    mixed = [PLAIN, m, PLAIN._replace(event_id="x")]
    batch = MUTATION_BATCH_V2.header + _fastavro(MUTATION_BATCH_V2.parsed,
                                                 {"mutations": [_record(x, True) for x in mixed]})
    assert encode_batch(mixed) == batch
    assert record_of_bodies([v2_body(mutation_body(PLAIN)), mutation_body(m),
                             v2_body(mutation_body(mixed[2]))], v2=True) == batch
    assert decode_mutations(batch) == mixed


def test_old_v1_records_still_decode_and_resolve_against_v2() -> None:
    old = COUNT_MUTATION.header + _fastavro(COUNT_MUTATION.parsed, _record(PLAIN, False))
    assert decode_mutations(old) == [PLAIN]
    # Avro schema resolution both ways: a v2 reader fills the defaults, a v1 reader skips the new fields
    resolved = fastavro.schemaless_reader(io.BytesIO(old[10:]), COUNT_MUTATION.parsed, COUNT_MUTATION_V2.parsed)
    assert resolved["dimensions"] == {} and resolved["item"] == ""
    new = encode_mutation(DIMENSIONED)
    skipped = fastavro.schemaless_reader(io.BytesIO(new[10:]), COUNT_MUTATION_V2.parsed, COUNT_MUTATION.parsed)
    assert skipped == _record(DIMENSIONED, False)


def test_v2_schema_files_keep_v1_and_inline_the_same_record() -> None:
    folder = Path(__file__).resolve().parents[2] / "schemas"
    v1 = json.loads((folder / "count_mutation.avsc").read_text())
    v2 = json.loads((folder / "count_mutation_v2.avsc").read_text())
    batch = json.loads((folder / "mutation_batch_v2.avsc").read_text())
    assert (v2["name"], v2["namespace"]) == (v1["name"], v1["namespace"])  # resolution needs the same full name
    assert v2["fields"][:len(v1["fields"])] == v1["fields"]
    assert [f["name"] for f in v2["fields"][len(v1["fields"]):]] == ["dimensions", "item"]
    assert all("default" in f for f in v2["fields"][len(v1["fields"]):])
    assert batch["fields"][0]["type"]["items"] == v2


def test_invalid_v2_records_are_decode_errors_naming_the_field() -> None:
    bad = COUNT_MUTATION_V2.header + _fastavro(COUNT_MUTATION_V2.parsed, _record(DIMENSIONED, True) | {
        "dimensions": {"Country": "US"}})
    with pytest.raises(DecodeError) as info:
        decode_mutations(bad)
    assert info.value.field == "dimensions.Country"
    clear = COUNT_MUTATION_V2.header + _fastavro(COUNT_MUTATION_V2.parsed, _record(DIMENSIONED, True) | {
        "op": "CLEAR", "delta": 0})
    with pytest.raises(DecodeError, match="all its combinations"):
        decode_mutations(clear)


def test_signals_carry_combination_names_on_both_paths() -> None:
    keys = [("plays", "title_1 country=US device=tv"), ("plays", "title_1"), ("plays", "t country=\u00e9")]
    assert decode_signals(encode_signals(keys)) == keys
    assert decode_signals(encode_signals(keys[:1])) == keys[:1]
    with pytest.raises(ValidationError):
        encode_signals([("plays", "t b=1 a=2")])


# -- configuration -----------------------------------------------------------------------------------------------


def _flat(**fields: Any) -> dict[str, Any]:
    return {"namespaces": {"ns": {"counter_type": "EVENTUAL", **fields}}}


def test_dimensions_config() -> None:
    ns = parse_namespaces(_flat(dimensions={"keys": ["country", "device"], "max_combinations": "50"}))["ns"]
    assert ns.dimensions == DimensionConfig(("country", "device"), 50)
    assert parse_namespaces(_flat(dimensions={"keys": ["a"]}))["ns"].dimensions.max_combinations == 1000
    assert not parse_namespaces(_flat())["ns"].dimensions
    assert not parse_namespaces(_flat(dimensions={"keys": []}))["ns"].dimensions


@pytest.mark.parametrize(("dimensions", "field", "reason"), [
    ({"keys": ["Country"]}, "dimensions.keys", "lower-case identifier"),
    ({"keys": ["a", "b", "c", "d", "e"]}, "dimensions.keys", "at most 4 dimension keys"),
    ({"keys": ["a", "a"]}, "dimensions.keys", "declared twice"),
    ({"keys": "country"}, "dimensions.keys", "must be a list"),
    ({"keys": ["a"], "max_combinations": 0}, "dimensions.max_combinations", "positive integer"),
    ({"max_combinations": 10}, "dimensions.max_combinations", "declare dimensions.keys"),
    ({"key": ["a"]}, "dimensions.key", "did you mean 'keys'"),
    ("country", "dimensions", "must be a mapping"),
])
def test_bad_dimensions_config_names_the_field(dimensions: Any, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_namespaces(_flat(dimensions=dimensions))
    assert (info.value.namespace, info.value.field) == ("ns", field) and reason in info.value.reason


def test_best_effort_declares_no_dimensions_and_the_netflix_shape_takes_them() -> None:
    with pytest.raises(ConfigError, match="keep no dimension combinations") as info:
        parse_namespaces(_flat(counter_type="BEST_EFFORT", dimensions={"keys": ["a"]}))
    assert info.value.field == "dimensions.keys"
    doc = {"persistence_configuration": [{"id": "COUNTER_ROLLUP", "config": {
        "counter_type": "EVENTUAL", "dimensions": {"keys": ["country"], "max_combinations": 7}}}]}
    ns = next(iter(parse_namespaces({"namespaces": {"n": doc}}).values()))
    assert ns.dimensions == DimensionConfig(("country",), 7)
    beside = {**doc, "dimensions": {"keys": ["x"]}}
    beside["persistence_configuration"][0]["config"].pop("dimensions")
    assert next(iter(parse_namespaces({"namespaces": {"n": beside}}).values())).dimensions.keys == ("x",)
    doc["persistence_configuration"][0]["config"]["dimensions"] = {"keys": ["A"]}
    with pytest.raises(ConfigError) as info:
        parse_namespaces({"namespaces": {"n": doc}})
    assert info.value.field == "persistence_configuration[COUNTER_ROLLUP].config.dimensions.keys"


def test_extras_refusals_name_the_field() -> None:
    reg = parse_namespaces({"namespaces": {"p": {"counter_type": "EVENTUAL", "dimensions": {"keys": ["country"]}},
                                           "plain": {"counter_type": "EVENTUAL"}}})
    assert extras_refusal(reg["p"], (("country", "US"),), "") is None
    assert extras_refusal(reg["p"], (("device", "tv"),), "")[0] == "dimensions.device"
    field, reason = extras_refusal(reg["plain"], (("country", "US"),), "")
    assert field == "dimensions.country" and "declares none" in reason
    assert extras_refusal(reg["p"], (), "user")[0] == "item"
    assert extras_refusal(reg["p"], (("country", "US"),), "", clear=True)[0] == "dimensions"


# -- the persist path --------------------------------------------------------------------------------------------

REGISTRY = parse_namespaces({"namespaces": {
    "p": {"counter_type": "EVENTUAL", "accept_limit": "2s", "max_clock_skew": "500ms",
          "dimensions": {"keys": ["country", "device"], "max_combinations": 3}},
    "plain": {"counter_type": "EVENTUAL", "accept_limit": "2s"},
}})
PART = Partitioning(buckets_per_id=4, seconds_per_bucket=10, seconds_per_slice=60)


def rec(offset: int, *ms: Mutation, ts: int = T) -> RawRecord:
    value = encode_mutation(ms[0]) if len(ms) == 1 else encode_batch(ms)
    return RawRecord("counter-mutations", 0, offset, ts // 1000, b"k", value)


def add(counter: str, delta: int, token: str, t: int = T, ns: str = "p", **dims: str) -> Mutation:
    return Mutation(ns, counter, delta, t, token, "", MutationOp.ADD, tuple(sorted(dims.items())))


def clear(counter: str, token: str, t: int) -> Mutation:
    return Mutation("p", counter, 0, t, token, "", MutationOp.CLEAR)


class World:
    """Real SQLite stores, one persist process's Combinations, the dead letters sent, and an oracle."""

    def __init__(self, tmp: Path) -> None:
        self.events = SqliteEventStore(tmp / "events.sqlite3", lambda ns: PART)
        self.rollups = SqliteRollupStore(tmp / "rollups.sqlite3")
        self.combinations = Combinations()
        self.dead: list[DeadLetter] = []
        self.signalled: set[tuple[str, str]] = set()

    async def _dead(self, dead: list[DeadLetter]) -> None:
        self.dead.extend(dead)

    async def _signals(self, keys: list[tuple[str, str]]) -> None:
        self.signalled.update(keys)

    def persist(self, records: list[RawRecord], combinations: Combinations | None = None) -> PreparedBatch:
        batch = prepare(records, REGISTRY)
        asyncio.run(persist_batch(batch, events=self.events, rollups=self.rollups, dead_letters=self._dead,
                                  signals=self._signals, combinations=combinations or self.combinations))
        return batch

    def count(self, name: str, ns: str = "p") -> int:
        agg: Aggregate = asyncio.run(self.events.aggregate(ns, name, 0, MAX_EVENT_TIME))
        return agg.delta

    def rows(self, name: str) -> list[EventRow]:
        return asyncio.run(self.events.scan("p", name, 0, MAX_EVENT_TIME))

    def close(self) -> None:
        async def close() -> None:
            await self.events.close()
            await self.rollups.close()
        asyncio.run(close())


@pytest.fixture
def world(tmp_path: Path):
    w = World(tmp_path)
    yield w
    w.close()


def test_a_write_is_counted_in_its_counter_and_every_combination(world: World) -> None:
    batch = world.persist([rec(0, add("v", 2, "a", country="US", device="tv")),
                           rec(1, add("v", 5, "b", country="FR")),
                           rec(2, add("v", 7, "c"))])
    assert world.dead == []
    expected = {"v": 14, "v country=US": 2, "v device=tv": 2, "v country=US device=tv": 2, "v country=FR": 5}
    assert {name: world.count(name) for name in expected} == expected
    assert {name for _, name in world.signalled} == set(expected)
    assert set(batch.last_write) == {("p", name) for name in expected}
    # every event of a write carries its identity: token, time, item key, delta
    assert [r[2:6] for r in world.rows("v country=US device=tv")] == [(T, "a", "", 2)]
    assert asyncio.run(world.rollups.combinations("p", "v")) == sorted(set(expected) - {"v"})
    assert asyncio.run(world.rollups.combinations("p", "v", full_only=True)) == ["v country=FR",
                                                                                 "v country=US device=tv"]


def test_retries_and_redelivery_count_once(world: World) -> None:
    w = add("v", 3, "a", country="US", device="tv")
    world.persist([rec(0, w)])
    world.persist([rec(0, w), rec(1, w._replace(delta=100))])  # redelivery, and a retry with another delta
    world.persist([rec(0, w)], Combinations())  # another worker (or a restart)
    assert [world.count(n) for n in ("v", "v country=US", "v device=tv", "v country=US device=tv")] == [3] * 4


def test_a_batch_retried_after_its_registration_failed_registers_its_full_combinations(world: World) -> None:
    """The bound counts a counter's full combinations from the store's registry: a retry after a failed register
    must register them, or other workers never count them (this process remembered them as known already)."""
    real = world.rollups.register_combinations
    failed: list[bool] = []

    async def fail_once(*args: object, **kwargs: object) -> None:
        if not failed:
            failed.append(True)
            raise ConnectionError("store unreachable")
        await real(*args, **kwargs)

    world.rollups.register_combinations = fail_once  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        world.persist([rec(0, add("v", 2, "a", country="US", device="tv"))])
    world.persist([rec(0, add("v", 2, "a", country="US", device="tv"))])  # the retry, same Combinations
    assert asyncio.run(world.rollups.combinations("p", "v", full_only=True)) == ["v country=US device=tv"]
    assert world.count("v country=US device=tv") == 2


def test_undeclared_keys_items_and_no_dimensions_are_dead_lettered_with_the_reason(world: World) -> None:
    world.persist([rec(0, add("v", 1, "a", os="linux")), rec(1, add("v", 1, "b", ns="plain", country="US")),
                   rec(2, add("v", 1, "c")._replace(item="user-1")),
                   rec(3, add("v", 1, "d", country="US"), add("v", 1, "e", country="US", os="x"))])
    reasons = [d.reason for d in world.dead]
    assert reasons[0].startswith("field 'dimensions.os': dimension 'os' is not declared by namespace 'p'")
    assert reasons[1].startswith("field 'dimensions.country'") and "declares none" in reasons[1]
    assert reasons[2].startswith("field 'item': namespace 'p' is EVENTUAL: only UNIQUE namespaces count items")
    assert reasons[3].startswith("field 'dimensions.os'")
    # the refused mutation of a batch record is dead-lettered alone, with its identity
    assert decode_mutations(world.dead[3].value) == [add("v", 1, "e", country="US", os="x")]
    assert world.count("v") == 1 and world.count("v country=US") == 1


def test_max_combinations_bounds_the_full_combinations(world: World) -> None:
    world.persist([rec(0, add("v", 1, "a", country="US", device="tv")), rec(1, add("v", 1, "b", country="US")),
                   rec(2, add("v", 1, "c", country="FR", device="tv"))])  # three full combinations
    world.persist([rec(3, add("v", 10, "d", country="DE")),  # a fourth: refused, in every counter
                   rec(4, add("v", 100, "e", country="US", device="tv")),  # known: counted
                   rec(5, add("w", 1000, "f", country="DE"))])  # another counter has its own bound
    [refused] = world.dead
    assert refused.reason == ("field 'dimensions': counter 'v' of namespace 'p' already has 3 dimension "
                              "combinations (max_combinations 3); 'v country=DE' would be one more")
    assert decode_mutations(refused.value) == [add("v", 10, "d", country="DE")]
    assert world.count("v") == 103 and world.count("v country=DE") == 0 and world.count("w country=DE") == 1000
    # another process learns the bound from the registry
    world.persist([rec(6, add("v", 10, "g", device="tv", country="ES"))], Combinations())
    assert len(world.dead) == 2 and "already has 3" in world.dead[1].reason


def test_a_clear_reaches_every_registered_combination(world: World) -> None:
    world.persist([rec(0, add("v", 2, "a", T - 10, country="US", device="tv")),
                   rec(1, add("v", 5, "b", T - 9, country="FR"))])
    world.persist([rec(2, clear("v", "clr", T - 5)), rec(3, add("v", 1, "c", T - 4, country="US"))])
    for name in ("v", "v country=US", "v device=tv", "v country=US device=tv", "v country=FR"):
        clears = [r for r in world.rows(name) if r[6]]
        assert [(r[2], r[3]) for r in clears] == [(T - 5, "clr")], name
    assert world.count("v") == 1 and world.count("v country=US") == 1 and world.count("v country=FR") == 0
    assert world.count("v device=tv") == 0
    assert ("p", "v country=FR") in world.signalled


def test_a_new_combination_gets_the_clear_it_was_written_before(world: World) -> None:
    """A write generated before a clear but persisted after it, for a combination first seen then: its combination
    counters must not count what the base counter's clear erased."""
    world.persist([rec(0, add("v", 2, "a", T - 10, country="US"))])
    world.persist([rec(1, clear("v", "clr", T - 5))])
    world.persist([rec(2, add("v", 4, "late", T - 8, country="FR", device="tv"))])  # new combinations, older time
    world.persist([rec(3, add("v", 1, "after", T - 1, country="DE"))])  # new, after the clear: nothing erased
    assert world.count("v") == 1
    for name in ("v country=FR", "v device=tv", "v country=FR device=tv", "v country=US"):
        assert world.count(name) == 0, name
        assert [(r[2], r[3], r[6]) for r in world.rows(name) if r[6]] == [(T - 5, "clr", True)], name
    assert world.count("v country=DE") == 1
    # restarted: another process copies it too, idempotently
    world.persist([rec(2, add("v", 4, "late", T - 8, country="FR", device="tv"))], Combinations())
    assert world.count("v country=FR device=tv") == 0


def test_replay_filter_keeps_writes_by_their_base_counter(world: World) -> None:
    from jobs.replay import Replay

    batch = prepare([rec(0, add("v", 1, "a", country="US")), rec(1, add("w", 1, "b", country="US")),
                     rec(2, clear("v", "c", T))], REGISTRY)

    class _Options:
        namespace = "p"

    replay = Replay.__new__(Replay)
    replay.options = _Options()  # type: ignore[assignment]
    replay.counters = {"v"}
    replay.resent = set()
    replay.totals = {"filtered_out": 0}  # type: ignore[assignment]
    assert batch.written
    kept = replay._filter(batch)
    assert [(w.counter, w.combinations) for w in kept.dimensioned] == [("v", ("v country=US",))]
    assert [c[1] for c in kept.clears] == ["v"]
    assert kept.written == batch.written  # the workers are told to heartbeat past the replayed writes


# -- producers ---------------------------------------------------------------------------------------------------


class _FakeKafka:
    """What GroupCommitProducer uses of AsyncProducer; records produced are kept, acknowledged at once."""

    bootstrap = "fake:9092"
    timeout_s = 5.0

    def __init__(self) -> None:
        self.records: list[bytes] = []

    def start(self) -> None:
        pass

    async def partitions(self, topic: str) -> int:
        return 3

    def produce(self, topic: str, value: bytes, key: bytes | None, partition: int,
                headers: Any = None) -> asyncio.Future[None]:
        self.records.append(value)
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


def test_group_commit_packs_plain_and_dimensioned_writes_in_one_v2_record() -> None:
    from producers.group_commit import GroupCommitProducer

    kafka = _FakeKafka()
    plain2 = PLAIN._replace(event_id="p2")

    async def body() -> None:
        producer = GroupCommitProducer(kafka, topic="t")  # type: ignore[arg-type]
        await producer.start()
        futures = [producer.send([PLAIN]), producer.send([DIMENSIONED, plain2])]
        await asyncio.gather(*futures)
        await producer.send([PLAIN])  # alone in the next pass: a plain v1 record
    asyncio.run(body())
    first, second = kafka.records
    assert first[:10] == MUTATION_BATCH_V2.header and decode_mutations(first) == [PLAIN, DIMENSIONED, plain2]
    assert second == encode_mutation(PLAIN)


def test_counter_producer_builds_dimensioned_mutations() -> None:
    from producers import CounterProducer

    m = CounterProducer.mutation(MutationOp.ADD, "plays", "t", 1, "tok", T, dimensions={"device": "tv",
                                                                                         "country": "US"})
    assert m.dimensions == (("country", "US"), ("device", "tv"))
    assert encode_mutation(m)[:10] == COUNT_MUTATION_V2.header
    with pytest.raises(ValidationError) as info:
        CounterProducer.mutation(MutationOp.ADD, "plays", "t", 1, dimensions={"country": "U S"})
    assert info.value.field == "dimensions.country"


def test_counter_produce_takes_dimensions_as_arguments_and_in_jsonl(tmp_path: Path) -> None:
    from counter_cli import produce_cmd
    from counter_cli.main import build_parser

    args = build_parser().parse_args(["produce", "plays", "t", "2", "--dimension", "country=US",
                                      "--dimension", "device=tv", "--token", "x", "--generation-time", str(T)])
    m = produce_cmd._from_args(args)
    assert (m.dimensions, m.delta, m.event_id) == ((("country", "US"), ("device", "tv")), 2, "x")
    for bad in (["--dimension", "country"], ["--dimension", "a=1", "--dimension", "a=2"], ["--clear", "--dimension",
                                                                                          "a=1"]):
        with pytest.raises(SystemExit):
            produce_cmd._from_args(build_parser().parse_args(["produce", "plays", "t", *(["0"] if "--clear" not in
                                                                                        bad else []), *bad]))
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"namespace": "plays", "counter_name": "t", "delta": 1,
                                "dimensions": {"device": "tv"}}) + "\n")
    [from_file], _ = produce_cmd._from_file(path)
    assert from_file.dimensions == (("device", "tv"),)
