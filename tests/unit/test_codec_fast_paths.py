"""The write path's fast paths held equal to the general paths they shortcut.

- `schemas.avro_fast` readers (compiled in `make test`, see the last section) vs fastavro + the full validators
  (`decode_mutations`, `decode_signals` with the fast readers patched out), on records written by plain fastavro and
  on corrupted ones;
- the hand-written encoders (`mutation_body`, `record_of_bodies`, `encode_signals`) vs fastavro's
  `schemaless_writer`, byte for byte;
- orjson JSON decoding vs the strict `json` module path and an independent `json.loads` + `mutation_from_json` oracle;
- `iso_micros` / `parse_generation_time` vs `datetime.fromisoformat`.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from unittest import mock

import fastavro
import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import schemas
from schemas import (
    INT64_MAX,
    INT64_MIN,
    MAX_EVENT_TIME,
    MIN_EVENT_TIME,
    DecodeError,
    Mutation,
    MutationOp,
    ValidationError,
    codec,
    compiled,
    decode_mutations,
    decode_signals,
    encode_signals,
    json_records,
    mutation_body,
    mutation_from_json,
    parse_generation_time,
    record_of_bodies,
    signal_body,
    validate_counter_name,
    validate_token,
)
from schemas import avro_fast as avro_fast_py
from schemas.codec import read_mutation, read_mutation_batch, read_signal, read_signal_batch  # compiled when built
from schemas.validation import iso_micros

SCHEMA_DIR = Path(schemas.__file__).parent
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_US = timedelta(microseconds=1)
SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- plain fastavro, from the .avsc files


def _plain(filename: str) -> tuple[dict, bytes]:
    parsed = fastavro.parse_schema(json.loads((SCHEMA_DIR / filename).read_text()))
    fp = fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO")
    return parsed, b"\xc3\x01" + bytes.fromhex(fp)


CM, CM_HEADER = _plain("count_mutation.avsc")
BATCH, BATCH_HEADER = _plain("mutation_batch.avsc")
SIG, SIG_HEADER = _plain("rollup_signal.avsc")
SIG_BATCH, SIG_BATCH_HEADER = _plain("rollup_signal_batch.avsc")
HEADERS = (CM_HEADER, BATCH_HEADER, SIG_HEADER, SIG_BATCH_HEADER)
UNKNOWN_HEADER = b"\xc3\x01" + bytes(range(8))


def _body(parsed: dict, record: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, record)
    return buf.getvalue()


def _record(m: Mutation) -> dict[str, Any]:
    return {"op": m.op.value, "namespace": m.namespace, "counter_name": m.counter_name, "delta": m.delta,
            "event_time": m.event_time, "event_id": m.event_id, "event_item_key": m.event_item_key}


def fa_mutation(m: Mutation) -> bytes:
    return CM_HEADER + _body(CM, _record(m))


def fa_batch(ms: list[Mutation]) -> bytes:
    return BATCH_HEADER + _body(BATCH, {"mutations": [_record(m) for m in ms]})


def fa_signal(key: tuple[str, str]) -> bytes:
    return SIG_HEADER + _body(SIG, {"namespace": key[0], "counter": key[1]})


def fa_signal_batch(keys: list[tuple[str, str]]) -> bytes:
    return SIG_BATCH_HEADER + _body(SIG_BATCH, {"signals": [{"namespace": n, "counter": c} for n, c in keys]})


def zigzag(n: int) -> bytes:
    """An Avro long, written here independently of the code under test."""
    return varint((n << 1) ^ (n >> 63) if -(2**63) <= n < 2**63 else (n << 1 if n >= 0 else (-n << 1) - 1))


def varint(z: int) -> bytes:
    """An unsigned varint of `z` as given (no zigzag, no bound: also a corrupt writer's long)."""
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def in_blocks(header: bytes, items: list[bytes], cuts: list[int], negative: list[bool], sizes: list[int]) -> bytes:
    """An Avro array split into blocks at `cuts`; a negative count is followed by a byte size (given: readers
    only skip with it)."""
    out, start = [header], 0
    bounds = [*sorted({c % (len(items) + 1) for c in cuts} - {0, len(items)}), len(items)]
    for i, end in enumerate(bounds):
        block = items[start:end]
        if negative[i % len(negative)]:
            out += [zigzag(-len(block)), zigzag(sizes[i % len(sizes)]), *block]
        else:
            out += [zigzag(len(block)), *block]
        start = end
    out.append(b"\x00")
    return b"".join(out)


def test_plain_headers_are_the_codecs() -> None:
    assert (schemas.COUNT_MUTATION.header, schemas.MUTATION_BATCH.header, schemas.ROLLUP_SIGNAL.header,
                       schemas.ROLLUP_SIGNAL_BATCH.header) == HEADERS


# --------------------------------------------------------------------------- strategies

def _mutation(namespace: str, counter_name: str, delta: int, event_time: int, event_id: str, event_item_key: str = "",
              op: MutationOp = MutationOp.ADD) -> Mutation:
    """A mutation of the CountMutation (v1) fields only (st.builds(Mutation) would fill any later field too)."""
    return Mutation(namespace, counter_name, delta, event_time, event_id, event_item_key, op)


DELTA_EDGES = [INT64_MIN, INT64_MIN + 1, -(2**55), -(2**48) - 1, -65, -64, -63, -1, 0, 1, 62, 63, 64, 65, 127, 128,
               2**48 - 1, 2**48, 2**55 - 1, 2**55, 2**62, INT64_MAX - 1, INT64_MAX]
TIME_EDGES = [MIN_EVENT_TIME, MIN_EVENT_TIME + 1, MAX_EVENT_TIME - 1, MAX_EVENT_TIME]


def _valid_counter(s: str) -> bool:
    try:
        return validate_counter_name(s) == s
    except ValidationError:
        return False


def _valid_token(s: str) -> bool:
    try:
        return validate_token(s) == s
    except ValidationError:
        return False


namespaces = st.from_regex(r"[A-Za-z0-9_.-]{1,64}", fullmatch=True) | st.sampled_from(["a", "x" * 64])
ascii_counters = st.from_regex(r"[!-~]{1,200}", fullmatch=True) | st.sampled_from(['a"b', "a\\b", "y" * 200])
unicode_counters = (st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp")), min_size=1,
                            max_size=70).filter(_valid_counter)
                    | st.sampled_from(["é" * 100, "视频", "👍🏽", "a-ß"]))
counters = ascii_counters | unicode_counters
ascii_tokens = st.from_regex(r"[ -~]{1,256}", fullmatch=True) | st.sampled_from(["t" * 256, '"q"', "\\"])
unicode_tokens = (st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=90)
                  .filter(_valid_token) | st.sampled_from(["ü" * 128, "a\u2028b"]))
tokens = ascii_tokens | unicode_tokens
item_keys = st.just("") | st.just("") | tokens
deltas = st.integers(INT64_MIN, INT64_MAX) | st.sampled_from(DELTA_EDGES) | st.integers(-300, 300)
event_times = st.integers(MIN_EVENT_TIME, MAX_EVENT_TIME) | st.sampled_from(TIME_EDGES)
adds = st.builds(_mutation, namespace=namespaces, counter_name=counters, delta=deltas, event_time=event_times,
                 event_id=tokens, event_item_key=item_keys, op=st.just(MutationOp.ADD))
clears = st.builds(_mutation, namespace=namespaces, counter_name=counters, delta=st.just(0), event_time=event_times,
                   event_id=tokens, event_item_key=item_keys, op=st.just(MutationOp.CLEAR))
mutations = adds | clears
batches = st.lists(mutations, min_size=1, max_size=12)
keys = st.tuples(namespaces, counters)
key_lists = st.lists(keys, min_size=1, max_size=12)


def plain(m: Mutation) -> bool:
    """What the hand-written reader must answer itself (it returning None for these would be a silent slowdown)."""
    return m.counter_name.isascii() and m.event_id.isascii() and m.event_item_key == ""


# --------------------------------------------------------------------------- outcomes


def outcome(decode: Callable[[bytes], Any], data: bytes) -> tuple:
    """("ok", value) or ("error", reason, field); any exception other than DecodeError fails the test."""
    try:
        return ("ok", decode(data))
    except DecodeError as exc:
        return ("error", exc.reason, exc.field)


def _none(_data: bytes, _start: int) -> None:
    return None


def general_mutations(data: bytes) -> tuple:
    """decode_mutations with the hand-written readers switched off: fastavro and the full validators."""
    with mock.patch.object(codec, "read_mutation", _none), mock.patch.object(codec, "read_mutation_batch", _none):
        return outcome(decode_mutations, data)


def general_signals(data: bytes) -> tuple:
    with mock.patch.object(codec, "read_signal", _none), mock.patch.object(codec, "read_signal_batch", _none):
        return outcome(decode_signals, data)


def check_mutations(data: bytes) -> None:
    general = general_mutations(data)
    if general[0] == "ok":
        assert general[1], "decoded to no mutation"
        assert all(type(m.op) is MutationOp for m in general[1])
    reader = {CM_HEADER: read_mutation, BATCH_HEADER: read_mutation_batch}.get(data[:10])
    fast = reader(data, 10) if reader else None
    if fast is not None:
        assert general == ("ok", fast), data.hex()
        assert all(type(m.op) is MutationOp for m in fast)
    assert outcome(decode_mutations, data) == general, data.hex()


def check_signals(data: bytes) -> None:
    general = general_signals(data)
    if general[0] == "ok":
        assert general[1], "decoded to no signal"
    reader = {SIG_HEADER: read_signal, SIG_BATCH_HEADER: read_signal_batch}.get(data[:10])
    fast = reader(data, 10) if reader else None
    if fast is not None:
        assert general == ("ok", fast), data.hex()
    assert outcome(decode_signals, data) == general, data.hex()


def check_body(body: bytes) -> None:
    """The same bytes read as each of the four records, and under an unknown fingerprint."""
    for header in (*HEADERS, UNKNOWN_HEADER):
        check_mutations(header + body)
        check_signals(header + body)


# --------------------------------------------------------------------------- valid records written by fastavro


@SLOW
@given(mutations)
@example(Mutation("ns", "c", INT64_MIN, MIN_EVENT_TIME, "t" * 256))
@example(Mutation("ns", "c", INT64_MAX, MAX_EVENT_TIME, "t", "", MutationOp.ADD))
@example(Mutation("ns", "c", 0, MAX_EVENT_TIME, "t", "", MutationOp.CLEAR))
def test_a_fastavro_mutation_decodes_to_itself(m: Mutation) -> None:
    data = fa_mutation(m)
    assert decode_mutations(data) == [m]
    assert general_mutations(data) == ("ok", [m])
    assert read_mutation(data, 10) == ([m] if plain(m) else None)
    assert read_mutation_batch(data, 10) is None  # a CountMutation body is not an array


@SLOW
@given(batches)
def test_a_fastavro_batch_decodes_to_its_mutations(ms: list[Mutation]) -> None:
    data = fa_batch(ms)
    assert decode_mutations(data) == ms
    assert general_mutations(data) == ("ok", ms)
    assert read_mutation_batch(data, 10) == (ms if all(map(plain, ms)) else None)


@SLOW
@given(batches, st.lists(st.integers(0, 20), max_size=4), st.lists(st.booleans(), min_size=1, max_size=4),
       st.lists(st.integers(0, 10**6), min_size=1, max_size=4))
def test_arrays_in_several_blocks_with_negative_counts(ms: list[Mutation], cuts: list[int], negative: list[bool],
                                                       sizes: list[int]) -> None:
    # Avro lets a writer split an array into blocks, a negative count announcing the block's byte size.
    data = in_blocks(BATCH_HEADER, [_body(CM, _record(m)) for m in ms], cuts, negative, sizes)
    assert fastavro.schemaless_reader(io.BytesIO(data[10:]), BATCH)["mutations"] == [_record(m) for m in ms]
    assert decode_mutations(data) == ms
    assert read_mutation_batch(data, 10) == (ms if all(map(plain, ms)) else None)
    check_mutations(data)
    keys_ = [(m.namespace, m.counter_name) for m in ms]
    signals = in_blocks(SIG_BATCH_HEADER, [fa_signal(k)[10:] for k in keys_], cuts, negative, sizes)
    assert decode_signals(signals) == keys_
    assert read_signal_batch(signals, 10) == (keys_ if all(c.isascii() for _, c in keys_) else None)
    check_signals(signals)


@SLOW
@given(keys)
def test_a_fastavro_signal_decodes_to_itself(key: tuple[str, str]) -> None:
    data = fa_signal(key)
    assert decode_signals(data) == [key]
    assert general_signals(data) == ("ok", [key])
    assert read_signal(data, 10) == ([key] if key[1].isascii() else None)


@SLOW
@given(key_lists)
def test_a_fastavro_signal_batch_decodes_to_its_keys(ks: list[tuple[str, str]]) -> None:
    data = fa_signal_batch(ks)
    assert decode_signals(data) == ks
    assert general_signals(data) == ("ok", ks)
    assert read_signal_batch(data, 10) == (ks if all(c.isascii() for _, c in ks) else None)


INVALID_FIELDS = [
    *(("namespace", v) for v in ("", "a:b", "a b", "é", "x" * 65, "a\x00")),
    *(("counter_name", v) for v in ("", "a b", "a\tb", "a\x7f", "x" * 201, "é" * 101, "a\x85")),
    *(("event_id", v) for v in ("", "t" * 257, "ü" * 129, "a\nb", "\x00", "a\x9f")),
    *(("event_item_key", v) for v in ("k" * 257, "a\x01", "\x7f")),
    *(("event_time", v) for v in (0, -1, MIN_EVENT_TIME - 1, MAX_EVENT_TIME + 1, INT64_MAX, INT64_MIN)),
    *(("clear_delta", v) for v in (1, -1, INT64_MAX, INT64_MIN)),
]
plain_mutations = st.builds(_mutation, namespace=namespaces, counter_name=ascii_counters, delta=deltas,
                            event_time=event_times, event_id=ascii_tokens, op=st.just(MutationOp.ADD))


@pytest.mark.parametrize(("field", "value"), INVALID_FIELDS)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ms=st.lists(plain_mutations, min_size=1, max_size=5), data=st.data())
def test_invalid_fields_written_by_fastavro_are_errors_on_both_paths(field: str, value: Any, ms: list[Mutation],
                                                                    data: st.DataObject) -> None:
    records = [_record(m) for m in ms]
    i = data.draw(st.integers(0, len(records) - 1))
    if field == "clear_delta":
        records[i].update(op="CLEAR", delta=value)
    else:
        records[i][field] = value
    single = CM_HEADER + _body(CM, records[i])
    batch = BATCH_HEADER + _body(BATCH, {"mutations": records})
    for record in (single, batch):
        check_mutations(record)
        assert outcome(decode_mutations, record)[0] == "error"
    if field in ("namespace", "counter_name"):
        ks = [(r["namespace"], r["counter_name"]) for r in records]
        for record in (fa_signal(ks[i]), fa_signal_batch(ks)):
            check_signals(record)
            assert outcome(decode_signals, record)[0] == "error"


# --------------------------------------------------------------------------- corrupted records

SPECIAL = [
    b"\x01", b"\x03", b"\x05", b"\x7f", b"\x80", b"\xff", b"\x80\x00",  # negative enum indexes, bad varints
    zigzag(-1), zigzag(-2), zigzag(-(2**40)),  # negative counts and lengths
    zigzag(2**62), zigzag(INT64_MAX), b"\xff" * 9 + b"\x01", b"\xff" * 10 + b"\x7f", b"\xff" * 12,  # huge
    zigzag(MIN_EVENT_TIME - 1), zigzag(MAX_EVENT_TIME + 1), zigzag(2**63), zigzag(-(2**63) - 1),
]


@st.composite
def corrupted(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """A valid body changed in one of several ways."""
    body = draw(base)
    how = draw(st.sampled_from(["flip", "replace", "insert", "trailing", "cut"]))
    at = draw(st.integers(0, max(0, len(body) - 1)))
    if how == "flip":
        for i, x in draw(st.lists(st.tuples(st.integers(0, len(body) - 1), st.integers(1, 255)), min_size=1,
                                  max_size=3)):
            body = body[:i] + bytes([body[i] ^ x]) + body[i + 1:]
        return body
    if how == "replace":
        special = draw(st.sampled_from(SPECIAL))
        return body[:at] + special + body[at + draw(st.integers(1, 9)):]
    if how == "insert":
        return body[:at] + draw(st.sampled_from(SPECIAL) | st.binary(min_size=1, max_size=4)) + body[at:]
    if how == "trailing":
        return body + draw(st.sampled_from(SPECIAL) | st.binary(min_size=1, max_size=8))
    return body[:at]


mutation_bodies = (mutations.map(lambda m: fa_mutation(m)[10:]) | batches.map(lambda ms: fa_batch(ms)[10:]))
signal_bodies = keys.map(lambda k: fa_signal(k)[10:]) | key_lists.map(lambda ks: fa_signal_batch(ks)[10:])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corrupted(mutation_bodies | signal_bodies))
@example(b"\x01" + fa_mutation(Mutation("ns", "c", 0, MIN_EVENT_TIME, "t"))[11:])  # enum index -1
@example(b"\x03" + fa_mutation(Mutation("ns", "c", 5, MIN_EVENT_TIME, "t"))[11:])  # enum index -2
@example(b"\x00")  # an empty array
@example(b"\x01\x02" + fa_signal(("n", "c"))[10:] + b"\x00")  # block count -1 with its size
@example(zigzag(2**62) + fa_signal(("n", "c"))[10:] + b"\x00")  # a count far beyond the items
@example(b"\x00\x02n\xfe\xff\xff\xff\xff\xff\xff\xff\x7fc")  # a huge length
def test_corrupted_bodies_fast_path_is_none_or_the_general_answer(body: bytes) -> None:
    check_body(body)


valid_records = (mutations.map(fa_mutation) | batches.map(fa_batch) | keys.map(fa_signal)
                 | key_lists.map(fa_signal_batch))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_records)
def test_every_truncation(data: bytes) -> None:
    decode = decode_mutations if data[:10] in (CM_HEADER, BATCH_HEADER) else decode_signals
    assert outcome(decode, data)[0] == "ok"
    for end in range(len(data)):
        assert outcome(decode, data[:end])[0] == "error"
        if end >= 10:
            check_body(data[10:end])


def test_wrong_fingerprints_and_headers() -> None:
    m = Mutation("ns", "c", 1, MIN_EVENT_TIME, "t")
    body = fa_mutation(m)[10:]
    assert decode_mutations(CM_HEADER + body) == [m]
    with pytest.raises(DecodeError, match="unknown schema fingerprint"):
        decode_mutations(UNKNOWN_HEADER + body)
    with pytest.raises(DecodeError, match="RollupSignal, not a CountMutation"):
        decode_mutations(fa_signal(("ns", "c")))
    with pytest.raises(DecodeError, match="CountMutation, not a RollupSignal"):
        decode_signals(fa_mutation(m))
    for n in range(10):
        check_mutations(CM_HEADER[:n])
        check_signals(SIG_HEADER[:n])


def test_negative_enum_indexes_are_corrupt_not_an_op() -> None:
    # fastavro indexes the symbol list with the decoded number, so -1 would read as CLEAR and -2 as ADD.
    for index, delta in ((-1, 0), (-2, 5), (2, 5)):
        data = CM_HEADER + zigzag(index) + fa_mutation(Mutation("ns", "c", delta, MIN_EVENT_TIME, "t"))[11:]
        with pytest.raises(DecodeError, match=f"corrupt Avro body for CountMutation: MutationOp index {index}"):
            decode_mutations(data)
        batch = BATCH_HEADER + b"\x02" + data[10:] + b"\x00"
        with pytest.raises(DecodeError, match=f"corrupt Avro body for MutationBatch: MutationOp index {index}"):
            decode_mutations(batch)


@pytest.mark.parametrize("wide", [varint(2**64 + 10), varint(2**64), bytes([0x8A, *[0x80] * 9, 0x01])],
                         ids=["65 bits in 10 bytes", "2**64", "11 bytes"])
@pytest.mark.parametrize("field", ["delta", "event_time"])
def test_a_long_wider_than_64_bits_is_an_error_not_wrapped(wide: bytes, field: str) -> None:
    """fastavro's C reader wraps such a long silently (65 bits in 10 bytes read as delta 5, the case a review
    sent through Kafka and saw counted); the general path must refuse it, alone and in a batch, as the fast
    readers do."""
    m = Mutation("ns", "c", 7, MIN_EVENT_TIME + 1, "t")
    body = fa_mutation(m)[10:]
    plain = body[1:].split(zigzag(7) + zigzag(m.event_time), 1)
    assert len(plain) == 2
    longs = wide + zigzag(m.event_time) if field == "delta" else zigzag(7) + wide
    data = CM_HEADER + body[:1] + plain[0] + longs + plain[1]
    for record in (data, BATCH_HEADER + b"\x02" + data[10:] + b"\x00"):
        with pytest.raises(DecodeError, match=f"'{field}'"):
            decode_mutations(record)
    exact = codec.exact_schemaless_reader(io.BytesIO(data[10:]), CM)[field]  # the private reader codec leans on
    assert not INT64_MIN <= exact <= INT64_MAX, exact  # Python's integer, not wrapped as fastavro's C reader does


def test_an_empty_signal_batch_is_an_error() -> None:
    with pytest.raises(DecodeError, match="empty RollupSignalBatch"):
        decode_signals(fa_signal_batch([]))


# --------------------------------------------------------------------------- hand-written encoders


@SLOW
@given(mutations)
@example(Mutation("ns", "c", 2**55 - 1, MIN_EVENT_TIME, "t"))
@example(Mutation("ns", "c", 2**55, MIN_EVENT_TIME, "t"))
@example(Mutation("ns", "c", 2**48 - 1, MIN_EVENT_TIME, "t"))
@example(Mutation("ns", "c" * 63, -64, MIN_EVENT_TIME, "t" * 64, "k" * 200))
def test_mutation_body_is_fastavros_bytes(m: Mutation) -> None:
    assert mutation_body(m) == _body(CM, _record(m))


@SLOW
@given(batches)
def test_record_of_bodies_is_fastavros_record(ms: list[Mutation]) -> None:
    expected = fa_mutation(ms[0]) if len(ms) == 1 else fa_batch(ms)
    assert record_of_bodies([mutation_body(m) for m in ms]) == expected


def test_event_times_that_share_or_cross_the_remembered_high_bytes() -> None:
    """An 8-byte long's last five bytes are remembered from the previous one (z >> 21): the same, the next and the
    previous high part, in turn, all encode as fastavro does."""
    edge = (1_790_000_000_000_000 >> 20) << 20  # 2n >> 21 changes at multiples of 2^20 µs
    for t in (edge - 1, edge, edge + 1, edge - 1, edge + (1 << 20), edge + 5, edge + (1 << 20) + 5):
        m = Mutation("ns", "c", 1, t, "t")
        assert mutation_body(m) == _body(CM, _record(m)), t


def test_record_of_bodies_with_many_bodies() -> None:
    ms = [Mutation("ns", f"c{i}", i - 100, MIN_EVENT_TIME + i, f"t{i}") for i in range(200)]  # a 2-byte count
    assert record_of_bodies([mutation_body(m) for m in ms]) == fa_batch(ms)
    with pytest.raises(ValueError, match="at least one"):
        record_of_bodies([])


@SLOW
@given(key_lists)
def test_encode_signals_is_fastavros_record(ks: list[tuple[str, str]]) -> None:
    expected = fa_signal(ks[0]) if len(ks) == 1 else fa_signal_batch(ks)
    assert encode_signals(ks) == expected
    assert encode_signals(ks) == expected  # again, from signal_body's cache
    for k in ks:
        assert signal_body(*k) == fa_signal(k)[10:]


def test_encode_signals_with_many_keys_and_invalid_names() -> None:
    ks = [("ns", f"c{i}") for i in range(300)]
    assert encode_signals(ks) == fa_signal_batch(ks)
    with pytest.raises(ValidationError, match="counter"):
        encode_signals([("ns", "ok"), ("ns", "not ok")])
    with pytest.raises(ValueError, match="at least one"):
        encode_signals([])


# --------------------------------------------------------------------------- JSON: orjson vs the strict path


def _strict(data: bytes) -> list[Mutation]:
    return codec._mutations_from_json(codec._loads_strict(data))


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError("duplicate key")
    return dict(pairs)


def _constant(name: str) -> None:
    raise ValueError(name)


def oracle(data: bytes) -> tuple:
    """The json module read strictly (no repeated key, no NaN/Infinity) + mutation_from_json without its plain-AddCount
    fast path (json_records._plain_add), written here."""
    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return ("error", None)
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        return ("error", None)
    try:
        with mock.patch.object(json_records, "_plain_add", lambda _obj: None):
            return ("ok", [mutation_from_json(i) for i in items])
    except ValidationError as exc:
        return ("error", exc.field)


def j(value: Any, ascii_: bool = True) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_).encode("utf-8", "surrogatepass")


texts = st.text(max_size=12) | st.sampled_from(["", "a\"b", "\\", "é", "\ud800", "\x00", "a b", "x" * 257])
json_strings = st.builds(j, texts | namespaces | counters | tokens, st.booleans()) | st.sampled_from(
    [b'"n\xff"', b'"\xc3("', b'"\xed\xa0\x80"', b'"\\u0022"', b'"\\/"', b'"a\\"b"', b'"\\ud800"'])
json_numbers = (st.integers(-(2**70), 2**70).map(lambda n: str(n).encode())
                | st.sampled_from([INT64_MIN, INT64_MIN - 1, INT64_MAX, INT64_MAX + 1, 2**64 - 1, 2**64, 2**64 + 1,
                                   -(2**64), 10**30, 1728139680, 1728139680123, 1728139680123456])
                .map(lambda n: str(n).encode())
                | st.floats(allow_nan=False, allow_infinity=False).map(lambda f: repr(f).encode())
                | st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-0", b"1E2", b"1.0", b"2.5e15",
                                   b"1728139680.123456", b"1.7281396801234567e15", b"0.0000001e22"]))
times = (st.sampled_from(["2024-10-05T14:48:00Z", "2024-10-05t14:48:00.5z", "2024-10-05T16:48:00+02:00",
                          "2024-10-05 14:48:00", "2024-10-05", "1728139680", "1728139680.25", "yesterday",
                          "1999-12-31T23:59:59Z", "2024-10-05T144800.5Z", "2024-10-05T14:48+01Z"]).map(j)
         | json_numbers | st.just(b"null") | st.just(b"true"))
ops = st.sampled_from(["add", "ADD", "clear", "Clear", "CLEAR", "incr", "", None, 1]).map(j)
wild = st.sampled_from([b"null", b"true", b"[]", b"{}", b"[1, 2]", b'{"a": {"b": []}}']) | json_numbers | json_strings
spaces = st.sampled_from([b"", b" ", b"\n", b"\t ", b"\r\n"])


@st.composite
def json_object(draw: st.DrawFn, pairs: list[tuple[bytes, bytes]]) -> bytes:
    """An object from (key, value) fragments, with repeated keys, unknown keys and wild values mixed in."""
    pairs = list(pairs)
    for _ in range(draw(st.integers(0, 2))):
        how = draw(st.sampled_from(["repeat", "unknown", "wild", "drop"]))
        if how == "repeat" and pairs:
            k, v = draw(st.sampled_from(pairs))
            pairs.insert(draw(st.integers(0, len(pairs))), (k, draw(st.just(v) | wild)))
        elif how == "unknown":
            pairs.append((j(draw(st.sampled_from(["extra", "Namespace", "token", "a\"b", ""]))), draw(wild)))
        elif how == "wild" and pairs:
            i = draw(st.integers(0, len(pairs) - 1))
            pairs[i] = (pairs[i][0], draw(wild))
        elif how == "drop" and pairs:
            pairs.pop(draw(st.integers(0, len(pairs) - 1)))
    sp = draw(spaces)
    return b"{" + sp + b", ".join(k + b":" + sp + v for k, v in pairs) + sp + b"}"


def _iso(micros: int) -> str:
    return (EPOCH + micros * ONE_US).isoformat().replace("+00:00", "Z")


valid_times = (event_times.map(lambda t: j(_iso(t))) | event_times.map(lambda t: str(t).encode())
               | event_times.map(lambda t: j(_iso(t).replace("Z", "+00:00"))))
VALID_VALUE = {  # mostly valid values, so that most records get as far as the validators (and the plain path)
    "namespace": namespaces.map(j), "counter_name": st.builds(j, counters, st.booleans()),
    "delta": deltas.map(lambda n: str(n).encode()), "token": st.builds(j, tokens, st.booleans()),
    "generation_time": valid_times, "op": ops, "event_item_key": st.builds(j, item_keys, st.booleans()),
}
OTHER_VALUE = {"delta": json_numbers, "generation_time": times, "token": json_strings}


def _value(draw: st.DrawFn, name: str) -> bytes:
    if draw(st.integers(0, 3)):
        return draw(VALID_VALUE[name])
    return draw(OTHER_VALUE.get(name, json_strings) | wild)


@st.composite
def json_record(draw: st.DrawFn) -> bytes:
    token = draw(json_object([(j("token"), _value(draw, "token")),
                              (j("generation_time"), _value(draw, "generation_time"))]))
    pairs = [(j(name), _value(draw, name)) for name in ("namespace", "counter_name", "delta")]
    if draw(st.integers(0, 3)):
        pairs.append((j("idempotency_token"), draw(st.just(token) | st.just(b"null") | wild)))
    if draw(st.booleans()):
        pairs.append((j("op"), _value(draw, "op")))
    if draw(st.booleans()):
        pairs.append((j("event_item_key"), _value(draw, "event_item_key")))
    return draw(json_object(draw(st.permutations(pairs))))


json_documents = json_record() | st.lists(json_record(), max_size=3).map(lambda rs: b"[" + b", ".join(rs) + b"]")


def check_json(data: bytes) -> None:
    got = outcome(decode_mutations, data)
    assert got == outcome(_strict, data), data  # the same verdict, and the same reason for the dead-letter queue
    assert (got[0], got[1] if got[0] == "ok" else got[2]) == oracle(data), data


POST_BODY = (b'{"namespace": "my_dataset", "counter_name": "counter123", "delta": 2, '
             b'"idempotency_token": {"token": "some_event_id", "generation_time": "2024-10-05T14:48:00Z"}}')


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_documents)
@example(POST_BODY)
@example(POST_BODY.replace(b'"delta": 2', b'"delta": 2, "delta": 3'))
@example(POST_BODY.replace(b"counter123", b'c\\"d'))
@example(POST_BODY.replace(b"2,", b"18446744073709551616,"))
@example(POST_BODY.replace(b"2,", b"-9223372036854775809,"))
@example(POST_BODY.replace(b'"2024-10-05T14:48:00Z"', b"100000000000000000000000"))
@example(POST_BODY.replace(b'"2024-10-05T14:48:00Z"', b"NaN"))
@example(POST_BODY.replace(b"counter123", b"counter\xff"))
@example(POST_BODY.replace(b'"some_event_id"', b'{"token": "x"}'))
@example(b"[" + POST_BODY + b", " + POST_BODY.replace(b"2,", b"2.0,") + b"]")
def test_json_orjson_and_strict_paths_agree(data: bytes) -> None:
    check_json(data)


def _set_token(key: str, value: Any) -> Callable[[dict], None]:
    return lambda body: body["idempotency_token"].__setitem__(key, value)


def _set(key: str, value: Any) -> Callable[[dict], None]:
    return lambda body: body.__setitem__(key, value)


CHANGES: list[tuple[str, Callable[[dict], None]]] = [  # one change to a plain AddCount body
    ("none", lambda body: None),
    ("token: a third key", _set_token("extra", 1)),
    ("token: no generation_time", lambda body: body["idempotency_token"].pop("generation_time")),
    ("token: null generation_time", _set_token("generation_time", None)),
    ("token: control character", lambda body: body["idempotency_token"].__setitem__(
        "token", body["idempotency_token"]["token"][:200] + "\x01")),
    ("token: DEL", _set_token("token", "a\x7f")),
    ("token: 256 bytes", _set_token("token", "t" * 256)),
    ("token: 257 bytes", _set_token("token", "t" * 257)),
    ("token: empty", _set_token("token", "")),
    ("token: non-ASCII", _set_token("token", "ü" * 128)),
    ("token: a number", _set_token("token", 5)),
    ("token: null", _set_token("token", None)),
    ("token: an array", _set("idempotency_token", ["t", "2024-10-05T14:48:00Z"])),
    ("token: a string", _set("idempotency_token", "t")),
    ("idempotency_token: null", _set("idempotency_token", None)),
    ("time: epoch µs", _set_token("generation_time", 1_728_139_680_000_000)),
    ("time: epoch s as text", _set_token("generation_time", "1728139680")),
    ("time: lower-case z", _set_token("generation_time", "2024-10-05T14:48:00.123z")),
    ("time: offset", _set_token("generation_time", "2024-10-05T16:48:00+02:00")),
    ("time: 7 digits", _set_token("generation_time", "2024-10-05T14:48:00.1234567Z")),
    ("time: 1999", _set_token("generation_time", "1999-12-31T23:59:59.999999Z")),
    ("time: 2201", _set_token("generation_time", "2201-01-01T00:00:00Z")),
    ("time: basic format", _set_token("generation_time", "2024-10-05T144800.5Z")),
    ("time: not a time", _set_token("generation_time", "yesterday")),
    ("time: full-width digits", _set_token("generation_time", "\uff12\uff10\uff12\uff14-10-05T14:48:00Z")),
    ("delta: 2**63", _set("delta", 2**63)),
    ("delta: -2**63 - 1", _set("delta", -(2**63) - 1)),
    ("delta: 2**64", _set("delta", 2**64)),
    ("delta: 2**64 - 1", _set("delta", 2**64 - 1)),
    ("delta: 2.0", _set("delta", 2.0)),
    ("delta: true", _set("delta", True)),
    ("delta: text", _set("delta", "2")),
    ("delta: null", _set("delta", None)),
    ("namespace: colon", _set("namespace", "a:b")),
    ("namespace: 65", _set("namespace", "n" * 65)),
    ("namespace: number", _set("namespace", 1)),
    ("counter: non-ASCII", _set("counter_name", "é")),
    ("counter: space", _set("counter_name", "a b")),
    ("counter: 201", _set("counter_name", "c" * 201)),
    ("counter: quote", _set("counter_name", 'a"b')),
    ("op: clear", _set("op", "clear")),
    ("op: ADD", _set("op", "ADD")),
    ("item key", _set("event_item_key", "k")),
    ("item key: empty", _set("event_item_key", "")),
    ("unknown key", _set("extra", 1)),
]


@pytest.mark.parametrize(("name", "change"), CHANGES, ids=[name for name, _ in CHANGES])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=plain_mutations, ascii_=st.booleans())
def test_json_one_change_to_a_plain_body(name: str, change: Callable[[dict], None], m: Mutation,
                                         ascii_: bool) -> None:
    body = json.loads(_json_of(m, _iso(m.event_time), True, " "))
    change(body)
    data = json.dumps(body, ensure_ascii=ascii_).encode()
    check_json(data)
    check_json(b"[" + data + b", " + data + b"]")
    if name == "none":
        assert decode_mutations(data) == [m]


def _json_of(m: Mutation, time_text: Any, ascii_: bool, sp: str) -> bytes:
    body = {"namespace": m.namespace, "counter_name": m.counter_name, "delta": m.delta,
            "idempotency_token": {"token": m.event_id, "generation_time": time_text}}
    if m.op is MutationOp.CLEAR:
        body["op"] = "clear"
    if m.event_item_key:
        body["event_item_key"] = m.event_item_key
    return json.dumps(body, ensure_ascii=ascii_, separators=(",", ":" + sp)).encode()


@SLOW
@given(st.lists(mutations, min_size=1, max_size=4), st.booleans(), st.sampled_from(["", " "]), st.integers(0, 2))
def test_json_valid_records_decode_the_same_on_both_paths(ms: list[Mutation], ascii_: bool, sp: str,
                                                          form: int) -> None:
    def time_text(m: Mutation) -> Any:
        return (_iso(m.event_time), m.event_time, str(m.event_time))[form]

    docs = [_json_of(m, time_text(m), ascii_, sp) for m in ms]
    for data, expected in ((docs[0], ms[:1]), (b"[" + b",".join(docs) + b"]", ms)):
        assert decode_mutations(data) == expected
        assert _strict(data) == expected
        check_json(data)


# --------------------------------------------------------------------------- RFC 3339 times: iso_micros

OFFSETS = [timedelta(0), timedelta(hours=5, minutes=30), -timedelta(hours=4, minutes=30), timedelta(hours=14),
           -timedelta(hours=12), timedelta(minutes=1), -timedelta(minutes=59)]


def general_time(text: str) -> int | None:
    """The datetime-based reading of an ISO time: fromisoformat, naive = UTC; None when it refuses."""
    try:
        dt = datetime.fromisoformat(text.upper())
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - EPOCH) // ONE_US


def parsed(text: str) -> int | None:
    try:
        return parse_generation_time(text)
    except ValidationError:
        return None


@settings(max_examples=1000, deadline=None)
@given(st.datetimes(min_value=datetime(1999, 12, 31, 10), max_value=datetime(2201, 1, 1, 14)),
       st.sampled_from(OFFSETS), st.integers(0, 6), st.sampled_from("Tt "), st.sampled_from(["Z", "z", "offset"]))
@example(datetime(2000, 1, 1), timedelta(0), 0, "T", "Z")
@example(datetime(2200, 12, 31, 23, 59, 59, 999999), timedelta(0), 6, "T", "Z")
@example(datetime(1999, 12, 31, 23, 59, 59, 999999), timedelta(0), 6, "T", "Z")
@example(datetime(2201, 1, 1), timedelta(0), 0, "T", "Z")
@example(datetime(2000, 1, 1, 5, 29, 59), timedelta(hours=5, minutes=30), 0, "T", "offset")
def test_iso_times_equal_the_datetime_reading(local: datetime, offset: timedelta, digits: int, sep: str,
                                              zone: str) -> None:
    if zone != "offset":
        offset = timedelta(0)
    dt = local.replace(tzinfo=timezone(offset))
    fraction = f"{dt.microsecond:06d}"[:digits]
    text = dt.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + (f".{fraction}" if digits else "")
    text += zone if zone != "offset" else dt.strftime("%z")[:3] + ":" + dt.strftime("%z")[3:]
    micros = (dt.replace(microsecond=int(fraction.ljust(6, "0")) if digits else 0) - EPOCH) // ONE_US
    assert general_time(text) == micros
    expected = micros if MIN_EVENT_TIME <= micros <= MAX_EVENT_TIME else None
    assert parsed(text) == expected, text
    fast = iso_micros(text)
    assert fast is None or fast == micros, text
    if zone == "Z":
        assert fast == micros  # the fast path does answer the common form


iso_like = st.from_regex(r"\A[0-9]{4}-(W[0-9]{2}(-?[0-9])?|[0-9]{2}(-?[0-9]{2})?)[Tt x][0-9:.,]{2,12}"
                         r"([+-][0-9]{2}(:?[0-9]{2})?)?(\.[0-9]{1,7})?[Zz]?\Z")


@settings(max_examples=1500, deadline=None)
@given(iso_like)
@example("2024-10-05T144800.5Z")  # basic-format time with its own fraction
@example("2024-10-05T14:48+01Z")  # an offset inside the first 19 characters
@example("2024-10-05T14+01:00Z")
@example("2024-W40-6T14:48:00Z")  # a week date
@example("2024-W40T144800.000.5Z")
@example("2024-10-05x14:48:00Z")
def test_odd_iso_forms_fast_path_is_none_or_the_datetime_reading(text: str) -> None:
    general = general_time(text)
    fast = iso_micros(text)
    assert fast is None or fast == general, (text, fast, general)
    expected = general if general is not None and MIN_EVENT_TIME <= general <= MAX_EVENT_TIME else None
    if "x" in text:  # fromisoformat takes any date-time separator; the parser takes 'T' or a space
        assert fast is None
        expected = None
    assert parsed(text) == expected, text


# --------------------------------------------------------------------------- the compiled build (schemas.compiled)
# `make test` compiles schemas.avro_fast with mypyc (python -m schemas.compile) and the tests above run the build
# codec picked. Here the build must be the one in use, and must answer exactly what the Python module answers.
# COUNTER_TEST_PURE_PYTHON=1 says no build is expected (a machine without a C compiler): the tests above then test
# the Python module, and these only check that codec uses it.

PURE_ONLY = os.environ.get("COUNTER_TEST_PURE_PYTHON") == "1"
COMPILED = compiled.compiled_build()
READERS = ("read_mutation", "read_mutation_batch", "read_signal", "read_signal_batch")


def test_codec_uses_the_compiled_build_of_the_current_source() -> None:
    assert COMPILED is not None or PURE_ONLY, "no build of schemas/avro_fast.py: run `python -m schemas.compile`"
    assert codec._FAST is (COMPILED or avro_fast_py)
    assert all(getattr(codec, name) is getattr(codec._FAST, name) for name in READERS)
    if COMPILED is not None:
        assert compiled.source_digest() == COMPILED.SOURCE_SHA256
        assert type(read_mutation).__name__ == "builtin_function_or_method"  # C, not a Python function


def test_a_build_of_another_source_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "source_digest", lambda: "0" * 64)  # as if avro_fast.py had been edited since
    assert compiled.compiled_build() is None and compiled.avro_fast() is avro_fast_py


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_records | corrupted(mutation_bodies | signal_bodies).map(lambda body: b"\xc3\x01" + bytes(8) + body))
def test_the_compiled_readers_answer_what_the_python_module_answers(data: bytes) -> None:
    if COMPILED is None:
        assert PURE_ONLY, "no compiled build to compare"
        return
    for name in READERS:
        for prefix in (data, data[:-1]):
            assert getattr(COMPILED, name)(prefix, 10) == getattr(avro_fast_py, name)(prefix, 10), (name, prefix.hex())
