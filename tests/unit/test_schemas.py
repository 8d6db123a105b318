"""Wire format: Avro single-object codec, JSON records and validation (schemas/)."""

from __future__ import annotations

import contextlib
import io
import json
import pickle
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import fastavro
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import schemas
from schemas import (
    INT64_MAX,
    INT64_MIN,
    MAX_EVENT_TIME,
    MICROS,
    MIN_EVENT_TIME,
    DecodeError,
    Mutation,
    MutationOp,
    ValidationError,
    decode_mutations,
    decode_signal,
    decode_signals,
    encode_batch,
    encode_mutation,
    encode_signal,
    encode_signals,
    mutation_from_json,
    parse_generation_time,
    validate_counter_name,
    validate_delta,
    validate_item_key,
    validate_mutation,
    validate_namespace,
    validate_token,
)
from schemas.validation import plainly_valid

SCHEMA_DIR = Path(schemas.__file__).parent

# The AddCount body from the Netflix post, verbatim.
POST_BODY = (
    b'{"namespace": "my_dataset", "counter_name": "counter123", "delta": 2, '
    b'"idempotency_token": {"token": "some_event_id", "generation_time": "2024-10-05T14:48:00Z"}}'
)
POST_TIME = 1_728_139_680 * MICROS  # 2024-10-05T14:48:00Z
POST_MUTATION = Mutation("my_dataset", "counter123", 2, POST_TIME, "some_event_id")


def _mutation(**changes: object) -> Mutation:
    fields: dict[str, object] = {
        "namespace": "ns", "counter_name": "c", "delta": 1, "event_time": POST_TIME, "event_id": "t",
    }
    fields.update(changes)
    return Mutation(**fields)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- independent CRC-64-AVRO


def _crc64_avro(data: bytes) -> int:
    """The Rabin fingerprint exactly as the Avro specification writes it (independent of fastavro)."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def _plain_schema(filename: str) -> tuple[dict, bytes]:
    """Parse an .avsc with plain fastavro and compute its single-object header without our code."""
    parsed = fastavro.parse_schema(json.loads((SCHEMA_DIR / filename).read_text()))
    canonical = fastavro.schema.to_parsing_canonical_form(parsed)
    return parsed, b"\xc3\x01" + _crc64_avro(canonical.encode()).to_bytes(8, "little")


def test_crc64_avro_matches_the_spec_vectors() -> None:
    # Known values from the Avro test suites: "null" and "int" (Ruby test_fingerprints.rb gives the header).
    assert _crc64_avro(b'"null"') == 7195948357588979594
    assert _crc64_avro(b'"int"') == 0x7275D51A3F395C8F
    header = b"\xc3\x01" + _crc64_avro(b'"int"').to_bytes(8, "little")
    assert header == bytes([0xC3, 0x01, 0x8F, 0x5C, 0x39, 0x3F, 0x1A, 0xD5, 0x75, 0x72])


@pytest.mark.parametrize(
    ("filename", "schema"),
    [("count_mutation.avsc", schemas.COUNT_MUTATION), ("mutation_batch.avsc", schemas.MUTATION_BATCH),
     ("rollup_signal.avsc", schemas.ROLLUP_SIGNAL)],
)
def test_headers_are_magic_plus_little_endian_fingerprint(filename: str, schema: schemas.AvroSchema) -> None:
    _, header = _plain_schema(filename)
    assert schema.header == header
    assert schema.fingerprint_int == _crc64_avro(schema.canonical_form.encode())


def test_schema_files_are_counter_v1_with_docs() -> None:
    for path in SCHEMA_DIR.glob("*.avsc"):
        raw = json.loads(path.read_text())
        assert raw["namespace"] == "counter.v1", path
        assert raw.get("doc"), path
        for field in raw["fields"]:
            assert field.get("doc"), (path, field["name"])


def test_batch_schema_inlines_the_same_count_mutation() -> None:
    mutation, _ = _plain_schema("count_mutation.avsc")
    batch, _ = _plain_schema("mutation_batch.avsc")
    items = batch["fields"][0]["type"]["items"]
    canonical = fastavro.schema.to_parsing_canonical_form
    assert canonical(items) == canonical(mutation)


def test_event_time_is_a_plain_long() -> None:
    raw = json.loads((SCHEMA_DIR / "count_mutation.avsc").read_text())
    field = next(f for f in raw["fields"] if f["name"] == "event_time")
    assert field["type"] == "long"


# --------------------------------------------------------------------------- round trips


def test_round_trip_single() -> None:
    m = _mutation(event_item_key="item-7", delta=-5)
    data = encode_mutation(m)
    assert data[:10] == schemas.COUNT_MUTATION.header
    [decoded] = decode_mutations(data)
    assert decoded == m
    assert decoded.op is MutationOp.ADD


def test_round_trip_clear() -> None:
    m = _mutation(op=MutationOp.CLEAR, delta=0)
    [decoded] = decode_mutations(encode_mutation(m))
    assert decoded == m and decoded.op is MutationOp.CLEAR


def test_round_trip_batch() -> None:
    ms = [_mutation(counter_name=f"c{i}", delta=i, event_id=f"t{i}") for i in range(50)]
    data = encode_batch(ms)
    assert data[:10] == schemas.MUTATION_BATCH.header
    assert decode_mutations(data) == ms


def test_round_trip_signal() -> None:
    data = encode_signal("my_dataset", "counter123")
    assert data[:10] == schemas.ROLLUP_SIGNAL.header
    assert decode_signal(data) == ("my_dataset", "counter123")


def test_round_trip_signal_batches() -> None:
    keys = [("my_dataset", f"c{i}") for i in range(3)] + [("other", "视频")]
    data = encode_signals(keys)
    assert data[:10] == schemas.ROLLUP_SIGNAL_BATCH.header
    assert decode_signals(data) == keys
    one = encode_signals(keys[:1])
    assert one == encode_signal(*keys[0]) and decode_signals(one) == keys[:1]  # one signal: a RollupSignal
    with pytest.raises(DecodeError, match="RollupSignalBatch of 4"):
        decode_signal(data)
    with pytest.raises(ValueError, match="at least one"):
        encode_signals([])
    with pytest.raises(ValidationError, match="counter"):
        encode_signals([("ns", "ok"), ("ns", "has space")])
    with pytest.raises(DecodeError, match="not a RollupSignal or RollupSignalBatch"):
        decode_signals(encode_mutation(_mutation()))
    bad = _plain_encode("rollup_signal_batch.avsc", {"signals": [{"namespace": "n", "counter": "c"},
                                                                {"namespace": "n", "counter": "a b"}]})
    with pytest.raises(DecodeError, match="counter") as info:
        decode_signals(bad)
    assert info.value.field == "counter"


def test_mutation_key() -> None:
    assert POST_MUTATION.key == "my_dataset:counter123"


def test_encode_requires_token_and_time() -> None:
    with pytest.raises(ValueError, match="event_time and event_id"):
        encode_mutation(_mutation(event_time=None))
    with pytest.raises(ValueError, match="event_time and event_id"):
        encode_batch([_mutation(event_id=None)])


def test_encode_validates() -> None:
    with pytest.raises(ValidationError, match="namespace"):
        encode_mutation(_mutation(namespace="a:b"))
    with pytest.raises(ValidationError, match="delta"):
        encode_batch([_mutation(), _mutation(op=MutationOp.CLEAR, delta=3)])
    with pytest.raises(ValueError, match="at least one"):
        encode_batch([])
    with pytest.raises(ValidationError, match="counter"):
        encode_signal("ns", "has space")


def test_encode_accepts_plain_string_op() -> None:
    m = _mutation(op="CLEAR", delta=0)
    [decoded] = decode_mutations(encode_mutation(m))
    assert decoded.op is MutationOp.CLEAR


# --------------------------------------------------------------------------- any consumer can decode


def test_plain_fastavro_decodes_our_records_from_the_avsc_files() -> None:
    m = _mutation(event_item_key="k", delta=-3)
    parsed, header = _plain_schema("count_mutation.avsc")
    data = encode_mutation(m)
    assert data[:10] == header  # fingerprint checked independently of schemas.codec
    body = io.BytesIO(data[10:])
    assert fastavro.schemaless_reader(body, parsed) == {
        "op": "ADD", "namespace": "ns", "counter_name": "c", "delta": -3,
        "event_time": POST_TIME, "event_id": "t", "event_item_key": "k",
    }

    parsed, header = _plain_schema("mutation_batch.avsc")
    data = encode_batch([m, m])
    assert data[:10] == header
    assert len(fastavro.schemaless_reader(io.BytesIO(data[10:]), parsed)["mutations"]) == 2

    parsed, header = _plain_schema("rollup_signal.avsc")
    data = encode_signal("ns", "c")
    assert data[:10] == header
    assert fastavro.schemaless_reader(io.BytesIO(data[10:]), parsed) == {"namespace": "ns", "counter": "c"}

    parsed, header = _plain_schema("rollup_signal_batch.avsc")
    data = encode_signals([("ns", "c"), ("ns", "d")])
    assert data[:10] == header
    assert fastavro.schemaless_reader(io.BytesIO(data[10:]), parsed) == {
        "signals": [{"namespace": "ns", "counter": "c"}, {"namespace": "ns", "counter": "d"}]}


def _plain_encode(filename: str, record: dict) -> bytes:
    parsed, header = _plain_schema(filename)
    buf = io.BytesIO(header)
    buf.seek(0, io.SEEK_END)
    fastavro.schemaless_writer(buf, parsed, record)
    return buf.getvalue()


def test_we_decode_records_written_by_plain_fastavro() -> None:
    record = {"op": "CLEAR", "namespace": "ns", "counter_name": "c", "delta": 0,
              "event_time": POST_TIME, "event_id": "t", "event_item_key": ""}
    assert decode_mutations(_plain_encode("count_mutation.avsc", record)) == [
        _mutation(op=MutationOp.CLEAR, delta=0)]
    signal = _plain_encode("rollup_signal.avsc", {"namespace": "n", "counter": "c"})
    assert decode_signal(signal) == ("n", "c")


def test_invalid_content_in_valid_avro_is_a_decode_error_naming_the_field() -> None:
    record = {"op": "ADD", "namespace": "", "counter_name": "c", "delta": 1,
              "event_time": POST_TIME, "event_id": "t", "event_item_key": ""}
    with pytest.raises(DecodeError, match="namespace") as info:
        decode_mutations(_plain_encode("count_mutation.avsc", record))
    assert info.value.field == "namespace"
    bad_time = dict(record, namespace="ns", event_time=0)
    with pytest.raises(DecodeError, match="event_time"):
        decode_mutations(_plain_encode("count_mutation.avsc", bad_time))
    bad_clear = dict(record, namespace="ns", op="CLEAR")
    with pytest.raises(DecodeError, match=r"item 1: field 'delta'"):
        batch = {"mutations": [dict(bad_clear, delta=0), bad_clear]}
        decode_mutations(_plain_encode("mutation_batch.avsc", batch))
    with pytest.raises(DecodeError, match="counter"):
        decode_signal(_plain_encode("rollup_signal.avsc", {"namespace": "n", "counter": "a b"}))
    with pytest.raises(DecodeError, match="empty MutationBatch"):
        decode_mutations(_plain_encode("mutation_batch.avsc", {"mutations": []}))


# --------------------------------------------------------------------------- JSON records


def test_post_body_verbatim() -> None:
    assert decode_mutations(POST_BODY) == [POST_MUTATION]
    assert mutation_from_json(json.loads(POST_BODY)) == POST_MUTATION


def test_clear_body() -> None:
    body = {"namespace": "my_dataset", "counter_name": "counter456", "op": "clear",
            "idempotency_token": {"token": "some_event_id", "generation_time": "2024-10-05T14:48:00Z"}}
    expected = Mutation("my_dataset", "counter456", 0, POST_TIME, "some_event_id", "", MutationOp.CLEAR)
    assert decode_mutations(json.dumps(body).encode()) == [expected]
    for spelling in ("CLEAR", "Clear"):
        assert mutation_from_json(dict(body, op=spelling)) == expected
    assert mutation_from_json(dict(body, delta=0)) == expected
    with pytest.raises(ValidationError, match=r"'delta'.*clear"):
        mutation_from_json(dict(body, delta=5))


def test_clear_body_without_op_is_not_an_add() -> None:
    body = {"namespace": "my_dataset", "counter_name": "counter456", "idempotency_token": {"token": "t"}}
    with pytest.raises(ValidationError, match=r"'delta'.*required"):
        mutation_from_json(body)


def test_op_add_explicit_and_item_key() -> None:
    body = json.loads(POST_BODY) | {"op": "ADD", "event_item_key": "row-1"}
    expected = Mutation("my_dataset", "counter123", 2, POST_TIME, "some_event_id", "row-1")
    assert mutation_from_json(body) == expected


def test_json_without_token_or_generation_time() -> None:
    base = {"namespace": "n", "counter_name": "c", "delta": 1}
    assert mutation_from_json(base) == Mutation("n", "c", 1, None, None)
    assert mutation_from_json(base | {"idempotency_token": None}) == Mutation("n", "c", 1, None, None)
    token_only = base | {"idempotency_token": {"token": "tok"}}
    assert mutation_from_json(token_only) == Mutation("n", "c", 1, None, "tok")
    with_null_time = base | {"idempotency_token": {"token": "tok", "generation_time": None}}
    assert mutation_from_json(with_null_time) == Mutation("n", "c", 1, None, "tok")


def test_json_array() -> None:
    items = [json.loads(POST_BODY), {"namespace": "n", "counter_name": "c", "op": "clear"}]
    assert decode_mutations(json.dumps(items).encode()) == [
        POST_MUTATION, Mutation("n", "c", 0, None, None, "", MutationOp.CLEAR)]
    assert decode_mutations(b"  \n" + POST_BODY + b"\n") == [POST_MUTATION]


_BASE = {"namespace": "n", "counter_name": "c", "delta": 1}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (_BASE | {"delta": "2"}, "delta"),
        (_BASE | {"delta": 2.0}, "delta"),
        (_BASE | {"delta": True}, "delta"),
        (_BASE | {"delta": None}, "delta"),
        (_BASE | {"delta": 2**63}, "delta"),
        ({"namespace": "n", "counter_name": "c"}, "delta"),
        (_BASE | {"namespace": 5}, "namespace"),
        ({"counter_name": "c", "delta": 1}, "namespace"),
        (_BASE | {"counter_name": ["c"]}, "counter_name"),
        (_BASE | {"op": "incr"}, "op"),
        (_BASE | {"op": 1}, "op"),
        (_BASE | {"idempotency_token": "tok"}, "idempotency_token"),
        (_BASE | {"idempotency_token": {}}, "idempotency_token.token"),
        (_BASE | {"idempotency_token": {"token": 7}}, "idempotency_token.token"),
        (_BASE | {"idempotency_token": {"token": "t", "generation_time": "yesterday"}},
         "idempotency_token.generation_time"),
        (_BASE | {"idempotency_token": {"token": "t", "generation_time": True}},
         "idempotency_token.generation_time"),
        (_BASE | {"event_item_key": 3}, "event_item_key"),
        # Unknown keys are rejected by name, so a typo is never silently ignored.
        (_BASE | {"idempotency_tokn": {"token": "t"}}, "idempotency_tokn"),
        (_BASE | {"idempotency_token": {"token": "t", "gen_time": 1}}, "idempotency_token.gen_time"),
    ],
)
def test_json_errors_name_the_field(body: dict, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        mutation_from_json(body)
    assert info.value.field == field
    assert f"'{field}'" in str(info.value)
    with pytest.raises(DecodeError) as decoded:
        decode_mutations(json.dumps(body).encode())
    assert decoded.value.field == field
    assert str(decoded.value).startswith(f"JSON field '{field}': ")
    with pytest.raises(DecodeError, match=rf"^JSON array item 1: field '{field}'"):
        decode_mutations(json.dumps([json.loads(POST_BODY), body]).encode())


def test_mutation_from_json_rejects_non_objects() -> None:
    with pytest.raises(ValidationError, match="record"):
        mutation_from_json([1, 2])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- garbage is a DecodeError


VALID = encode_mutation(_mutation())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty record"),
        (b"   ", "empty record"),
        (b"hello", "not Avro single-object"),
        (b"\x00\x01\x02", "not Avro single-object"),
        (b"42", "not Avro single-object"),
        (b"\xc3\x01\x00", "truncated Avro single-object header"),
        (b"\xc3\x01" + bytes(8) + VALID[10:], "unknown schema fingerprint 0x0000000000000000"),
        (VALID[:-1], "truncated Avro body for CountMutation"),
        (VALID[:10], "truncated Avro body for CountMutation"),
        (VALID + b"\x00", "1 trailing bytes"),
        (VALID[:10] + b"\x08" + VALID[11:], "corrupt Avro body"),  # enum index 4 of 2
        (VALID[:11] + b"\x01" + VALID[12:], "a negative string or bytes length"),  # it said "truncated"
        (b"\xef\xbb\xbf" + b'{"namespace": "n", "counter_name": "c", "delta": 1}', "UTF-8 byte order mark"),
        (b'{"namespace": "n", "counter_name": "c", "delta": 1e400}', "beyond a float's range"),  # it said "inf"
        (encode_signal("n", "c"), "RollupSignal, not a CountMutation"),
        (b"{", "invalid JSON"),
        (b"[]", "empty JSON array"),
        (b"[1]", "JSON array item 0: must be an object"),
        (b"[[]]", "JSON array item 0: must be an object"),
        (b'{"namespace": "n", "counter_name": "c", "delta": 1, "delta": 100}', "duplicate key 'delta'"),
        (b'{"namespace": "n", "counter_name": "c", "delta": NaN}', "NaN"),
        (b'{"namespace": "n\xff", "counter_name": "c", "delta": 1}', "not valid UTF-8"),
        (b"[" * 100_000, "invalid JSON"),
        (b'{"namespace": "n", "counter_name": "\\ud800", "delta": 1}', "counter_name"),
    ],
)
def test_garbage_raises_decode_error(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_mutations(data)
    assert message in str(info.value)
    assert info.value.reason == str(info.value)


def test_every_truncation_of_a_batch_is_a_decode_error() -> None:
    data = encode_batch([_mutation(event_id=f"t{i}", event_item_key="k") for i in range(3)])
    for end in range(len(data)):
        with pytest.raises(DecodeError):
            decode_mutations(data[:end])


def test_decode_signal_rejects_other_records() -> None:
    for data, message in [(VALID, "CountMutation, not a RollupSignal"), (b"", "empty record"),
                          (b"{}", "no C3 01 magic"), (encode_signal("n", "c")[:-1], "truncated")]:
        with pytest.raises(DecodeError, match=message):
            decode_signal(data)


def test_decode_accepts_bytes_like_and_rejects_str() -> None:
    assert decode_mutations(bytearray(VALID)) == decode_mutations(memoryview(VALID)) == [_mutation()]
    with pytest.raises(DecodeError, match="expected bytes"):
        decode_mutations(POST_BODY.decode())  # type: ignore[arg-type]


def test_errors_are_value_errors_and_pickle() -> None:
    v = pickle.loads(pickle.dumps(ValidationError("delta", "must be an integer")))
    assert (v.field, v.reason, str(v)) == ("delta", "must be an integer", "field 'delta': must be an integer")
    d = pickle.loads(pickle.dumps(DecodeError("JSON field 'delta': bad", "delta")))
    assert (d.reason, d.field) == ("JSON field 'delta': bad", "delta")
    assert issubclass(ValidationError, ValueError) and issubclass(DecodeError, ValueError)


@settings(max_examples=500)
@given(st.binary(max_size=300))
@example(b"\xc3\x01")
@example(b"\xff" * 40)
def test_arbitrary_bytes_only_raise_decode_error(data: bytes) -> None:
    try:
        out = decode_mutations(data)
    except DecodeError:
        return
    assert out and all(isinstance(m, Mutation) for m in out)


_HEADERS = st.sampled_from([s.header for s in schemas.SCHEMAS.values()])


@settings(max_examples=500)
@given(_HEADERS, st.binary(max_size=200))
def test_valid_header_with_random_body_only_raises_decode_error(header: bytes, body: bytes) -> None:
    for decode in (decode_mutations, decode_signal):
        with contextlib.suppress(DecodeError):
            decode(header + body)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_JSON_FIELDS = st.sampled_from(["namespace", "counter_name", "delta", "idempotency_token", "op",
                                "event_item_key", "token", "generation_time"])


@settings(max_examples=300)
@given(st.dictionaries(_JSON_FIELDS, _JSON, max_size=6) | st.lists(_JSON, max_size=3))
def test_arbitrary_json_only_raises_decode_error(value: object) -> None:
    try:
        out = decode_mutations(json.dumps(value).encode())
    except DecodeError:
        return
    assert out and all(validate_mutation(m) == m for m in out)


# --------------------------------------------------------------------------- property round trips

namespaces = st.from_regex(r"[A-Za-z0-9_.-]{1,64}", fullmatch=True)
_name_chars = st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp"))
counter_names = st.text(_name_chars, min_size=1, max_size=60).filter(
    lambda s: len(s.encode()) <= 200 and not any(c.isspace() for c in s))
tokens = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=80).filter(
    lambda s: len(s.encode()) <= 256)
item_keys = st.just("") | tokens
event_times = st.integers(MIN_EVENT_TIME, MAX_EVENT_TIME)
# v1 mutations: st.builds would fill the v2 fields (dimensions, item) too; tests/unit/test_dimensions.py has those
adds = st.builds(Mutation, namespace=namespaces, counter_name=counter_names,
                 delta=st.integers(INT64_MIN, INT64_MAX), event_time=event_times, event_id=tokens,
                 event_item_key=item_keys, op=st.just(MutationOp.ADD), dimensions=st.just(()), item=st.just(""))
clears = st.builds(Mutation, namespace=namespaces, counter_name=counter_names, delta=st.just(0),
                   event_time=event_times, event_id=tokens, event_item_key=item_keys,
                   op=st.just(MutationOp.CLEAR), dimensions=st.just(()), item=st.just(""))
mutations = adds | clears


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(mutations)
def test_property_single_round_trip(m: Mutation) -> None:
    assert validate_mutation(m) == m
    assert decode_mutations(encode_mutation(m)) == [m]


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutations, min_size=1, max_size=20))
def test_property_batch_round_trip(ms: list[Mutation]) -> None:
    assert decode_mutations(encode_batch(ms)) == ms


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(namespaces, counter_names)
def test_property_signal_round_trip(namespace: str, counter: str) -> None:
    assert decode_signal(encode_signal(namespace, counter)) == (namespace, counter)


def _to_json(m: Mutation) -> dict:
    return {"namespace": m.namespace, "counter_name": m.counter_name, "delta": m.delta, "op": m.op.lower(),
            "event_item_key": m.event_item_key,
            "idempotency_token": {"token": m.event_id, "generation_time": m.event_time}}


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutations, min_size=1, max_size=5))
def test_property_json_round_trip(ms: list[Mutation]) -> None:
    # An epoch-µs generation_time (>= 1e14) is read back as microseconds, exactly.
    assert decode_mutations(json.dumps([_to_json(m) for m in ms]).encode()) == ms
    assert decode_mutations(json.dumps(_to_json(ms[0]), ensure_ascii=False).encode()) == ms[:1]


@given(st.text(max_size=12), st.text(max_size=12), st.integers(), st.integers(), st.text(max_size=8),
       st.sampled_from(["", "k", "\x00"]), st.sampled_from(list(MutationOp)))
def test_fast_path_never_accepts_what_the_validator_rejects(
        ns: str, cn: str, delta: int, et: int, eid: str, key: str, op: MutationOp) -> None:
    if plainly_valid(ns, cn, delta, et, eid, key, op):
        validate_mutation(Mutation(ns, cn, delta, et, eid, key, op))


# --------------------------------------------------------------------------- validation rules


@pytest.mark.parametrize("name", ["a", "my_dataset", "A.b-c_9", "x" * 64])
def test_namespace_valid(name: str) -> None:
    assert validate_namespace(name) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [("", "empty"), ("x" * 65, "at most 64"), ("a:b", "':'"), ("a b", "letters"), ("é", "letters"),
     ("a/b", "letters"), ("a\n", "letters"), (None, "string"), (5, "string")],
)
def test_namespace_invalid(name: object, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason) as info:
        validate_namespace(name)
    assert info.value.field == "namespace" and "'namespace'" in str(info.value)


@pytest.mark.parametrize("name", ["c", "counter123", "a:b/c?d", "x" * 200, "é" * 100, "视频", "👍🏽", "a-ß"])
def test_counter_name_valid(name: str) -> None:
    assert validate_counter_name(name) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [("", "empty"), ("x" * 201, "at most 200"), ("é" * 101, "at most 200"), ("a b", "whitespace"),
     ("a\tb", "whitespace"), ("a\nb", "whitespace"), ("a\x00b", "control"), ("a\x7fb", "control"),
     ("é\x85", "control"), ("視\u3000聴", "whitespace"), ("a\xa0b", "whitespace"), ("é\u2028", "whitespace"),
     ("a\ud800", "UTF-8"), (b"abc", "string"), (12, "string")],
)
def test_counter_name_invalid(name: object, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason) as info:
        validate_counter_name(name)
    assert info.value.field == "counter_name" and "'counter_name'" in str(info.value)


@pytest.mark.parametrize("delta", [0, 1, -1, INT64_MAX, INT64_MIN])
def test_delta_valid(delta: int) -> None:
    assert validate_delta(delta) == delta


@pytest.mark.parametrize(
    ("delta", "reason"),
    [(True, "integer"), (2.0, "integer"), ("2", "integer"), (None, "integer"), (INT64_MAX + 1, "64-bit"),
     (INT64_MIN - 1, "64-bit")],
)
def test_delta_invalid(delta: object, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason) as info:
        validate_delta(delta)
    assert info.value.field == "delta" and "'delta'" in str(info.value)


@pytest.mark.parametrize("token", ["t", "some_event_id", "with space", "ü" * 128, "x" * 256])
def test_token_valid(token: str) -> None:
    assert validate_token(token) == token


@pytest.mark.parametrize(
    ("token", "reason"),
    [("", "empty"), ("x" * 257, "at most 256"), ("ü" * 129, "at most 256"), ("a\x00", "control"),
     ("a\nb", "control"), ("\ud800", "UTF-8"), (7, "string")],
)
def test_token_invalid(token: object, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason) as info:
        validate_token(token)
    assert info.value.field == "token"
    with pytest.raises(ValidationError, match=r"'idempotency_token\.token'"):
        validate_token(token, field="idempotency_token.token")


def test_item_key_rules() -> None:
    assert validate_item_key("") == ""
    assert validate_item_key("row-1") == "row-1"
    for bad in ("x" * 257, "a\x01", None):
        with pytest.raises(ValidationError, match="'event_item_key'"):
            validate_item_key(bad)


def test_validate_mutation_rules() -> None:
    assert validate_mutation(POST_MUTATION) is POST_MUTATION
    assert validate_mutation(_mutation(event_time=None, event_id=None)).event_time is None
    with pytest.raises(ValidationError, match=r"'delta'.*CLEAR"):
        validate_mutation(_mutation(op=MutationOp.CLEAR, delta=1))
    with pytest.raises(ValidationError, match="'op'"):
        validate_mutation(_mutation(op="INCR"))
    with pytest.raises(ValidationError, match=r"'event_time'.*2000"):
        validate_mutation(_mutation(event_time=1_728_139_680))  # seconds where µs are expected
    with pytest.raises(ValidationError, match="'event_id'"):
        validate_mutation(_mutation(event_id=""))
    with pytest.raises(ValidationError, match="'event_item_key'"):
        validate_mutation(_mutation(event_item_key="a\nb"))
    assert validate_mutation(_mutation(op="ADD")).op is MutationOp.ADD


# --------------------------------------------------------------------------- generation_time


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2024-10-05T14:48:00Z", POST_TIME),
        ("2024-10-05t14:48:00z", POST_TIME),
        ("2024-10-05T14:48:00+00:00", POST_TIME),
        ("2024-10-05T16:48:00+02:00", POST_TIME),
        ("2024-10-05T10:18:00-04:30", POST_TIME),
        ("2024-10-05T14:48:00", POST_TIME),  # naive = UTC
        ("2024-10-05 14:48:00", POST_TIME),
        ("2024-10-05T14:48:00.5Z", POST_TIME + 500_000),
        ("2024-10-05T14:48:00.123456Z", POST_TIME + 123_456),
        ("2024-10-05T14:48:00.123Z", POST_TIME + 123_000),
        ("2024-10-05", POST_TIME - (14 * 3600 + 48 * 60) * MICROS),
        (1_728_139_680, POST_TIME),  # seconds
        (1_728_139_680.25, POST_TIME + 250_000),
        (1_728_139_680_000, POST_TIME),  # milliseconds
        (1_728_139_680_123, POST_TIME + 123_000),
        (1_728_139_680_123.456, POST_TIME + 123_456),
        (POST_TIME, POST_TIME),  # microseconds
        (POST_TIME + 7, POST_TIME + 7),
        ("1728139680", POST_TIME),
        ("1728139680.000001", POST_TIME + 1),
        ("1728139680123", POST_TIME + 123_000),
        (str(POST_TIME + 9), POST_TIME + 9),
        (datetime(2024, 10, 5, 14, 48, tzinfo=UTC), POST_TIME),
        (datetime(2024, 10, 5, 15, 48, tzinfo=timezone(timedelta(hours=1))), POST_TIME),
        (datetime(2024, 10, 5, 14, 48), POST_TIME),
        ("2000-01-01T00:00:00Z", MIN_EVENT_TIME),
        ("2200-12-31T23:59:59.999999Z", MAX_EVENT_TIME),
        (946_684_800, MIN_EVENT_TIME),
    ],
)
def test_generation_time_parsing(value: object, expected: int) -> None:
    assert parse_generation_time(value) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (True, "bool"),
        (None, "ISO-8601"),
        ([2024], "ISO-8601"),
        ("yesterday", "ISO-8601"),
        ("", "ISO-8601"),
        ("2024-13-05T14:48:00Z", "ISO-8601"),
        ("\uff12\uff10\uff12\uff14-10-05", "ISO-8601"),  # full-width digits
        ("1999-12-31T23:59:59.999999Z", "2000..2200"),
        ("2201-01-01T00:00:00Z", "2000..2200"),
        (0, "2000..2200"),
        (-1_728_139_680, "2000..2200"),
        (946_684_799, "read as epoch seconds"),
        (99_999_999_999_999, "read as epoch milliseconds"),
        (10**30, "read as epoch microseconds"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        ("1" * 5000, "out of range"),
        (1e300, r"got 1\.000e\+300 µs since the epoch \(read as epoch microseconds\)$"),  # not 300 digits
        ("2026-11-27T10:00:00+00:00:00.123456", "fraction of a second"),  # Python reads it as +00:00
        ("2026-11-27T10:00:00+05:30:30.5", "fraction of a second"),
        ("2026-11-27X16:38:00Z", r"between its date and its time, found 'X'"),  # fromisoformat takes any
        ("2026-11-27x16:38:00.5Z", r"between its date and its time, found 'x'"),
        ("20261127_163800", r"between its date and its time, found '_'"),
        ("2026-W48-5/16:38", r"between its date and its time, found '/'"),
        ("2026-11-27116:38:00", r"between its date and its time, found '1'"),  # a digit: fromisoformat read it
        ("2026-11-2716:38:00", r"between its date and its time, found '1'"),
    ],
)
def test_generation_time_invalid(value: object, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason) as info:
        parse_generation_time(value)
    assert info.value.field == "generation_time" and "'generation_time'" in str(info.value)


@given(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2200, 12, 31, 23, 59, 59, 999999)))
def test_property_iso_and_epoch_agree(dt: datetime) -> None:
    micros = parse_generation_time(dt.isoformat() + "Z")
    assert parse_generation_time(micros) == micros
    assert parse_generation_time(micros // 1000) == micros // 1000 * 1000
    assert parse_generation_time(micros // MICROS) == micros // MICROS * MICROS
    assert parse_generation_time(dt.replace(tzinfo=UTC)) == micros
