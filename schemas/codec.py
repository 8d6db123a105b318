"""Avro single-object codec for mutations and rollup signals, plus JSON mutations.

Single-object encoding (Avro spec): bytes C3 01, the 8-byte little-endian CRC-64-AVRO fingerprint of the
writer schema's Parsing Canonical Form, then the schemaless Avro body. The fingerprint both identifies
the schema and lets any consumer decode with nothing but the .avsc files in this folder: no registry.
Schemas are parsed once at import; the per-record path is one fastavro call plus cheap validation.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from io import BytesIO
from typing import Any

import orjson
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro._read_py import schemaless_reader as exact_schemaless_reader  # private: fastavro pinned below 1.14
from fastavro.schema import fingerprint, to_parsing_canonical_form

from schemas.compiled import COMPILED_NAME, avro_fast
from schemas.dimensions import validate_internal_counter_name
from schemas.json_records import mutation_from_json
from schemas.model import Mutation, MutationOp
from schemas.validation import (
    ValidationError,
    plainly_valid,
    validate_mutation,
    validate_namespace,
)

_FAST = avro_fast()  # the hand-written readers, compiled when built (schemas.compiled)
READERS = "compiled" if _FAST.__name__ == COMPILED_NAME else "python"  # which: the worker logs it, benchmarks record it
read_mutation: Callable[[bytes, int], list[Mutation] | None] = _FAST.read_mutation
read_mutation_batch: Callable[[bytes, int], list[Mutation] | None] = _FAST.read_mutation_batch
read_signal: Callable[[bytes, int], list[tuple[str, str]] | None] = _FAST.read_signal
read_signal_batch: Callable[[bytes, int], list[tuple[str, str]] | None] = _FAST.read_signal_batch

MAGIC = b"\xc3\x01"
HEADER_LEN = 10  # magic + 8-byte fingerprint


class DecodeError(ValueError):
    """Input that cannot become mutations (or a signal); `reason` says what was wrong, `field` which field."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across worker processes
        return (type(self), (self.reason, self.field))


@dataclass(frozen=True, slots=True)
class RejectedItem:
    """An invalid item of a batch record: its index, why (``"MutationBatch item 1: field ..."``), and the item
    alone as a record of its own (a CountMutation, or the item's JSON text) for its dead letter; None when it cannot
    be written alone (the dead letter then keeps the whole record)."""

    index: int
    reason: str
    field: str | None
    alone: bytes | None


class InvalidItems(DecodeError):
    """A batch record (MutationBatch, JSON array) some of whose items are invalid. Its message is the first invalid
    item's, as when the whole record was refused for it; `valid` holds the valid mutations with their index in the
    record, `rejected` the others, so a consumer can count the valid ones and dead-letter each invalid one alone."""

    def __init__(self, valid: list[tuple[int, Mutation]], rejected: list[RejectedItem]) -> None:
        super().__init__(rejected[0].reason, rejected[0].field)
        self.valid = valid
        self.rejected = rejected

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.valid, self.rejected))


@dataclass(frozen=True, slots=True)
class AvroSchema:
    """One .avsc file, parsed once: `header` is what every single-object record of it starts with."""

    name: str
    filename: str
    parsed: dict[str, Any]
    canonical_form: str
    fingerprint: bytes  # 8 bytes, little-endian, as on the wire

    @property
    def header(self) -> bytes:
        return MAGIC + self.fingerprint

    @property
    def fingerprint_int(self) -> int:
        """The CRC-64-AVRO value as Java's SchemaNormalization.parsingFingerprint64 reports it (unsigned)."""
        return int.from_bytes(self.fingerprint, "little")


def _load(filename: str) -> AvroSchema:
    raw = json.loads(resources.files(__package__).joinpath(filename).read_text(encoding="utf-8"))
    parsed = parse_schema(raw)
    assert isinstance(parsed, dict), filename  # a named (record) schema parses to a dict
    canonical = to_parsing_canonical_form(parsed)
    # fastavro returns the CRC-64-AVRO bytes already in little-endian order (the spec's wire order).
    fp = bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
    return AvroSchema(raw["name"], filename, parsed, canonical, fp)


COUNT_MUTATION = _load("count_mutation.avsc")
MUTATION_BATCH = _load("mutation_batch.avsc")
COUNT_MUTATION_V2 = _load("count_mutation_v2.avsc")  # + dimensions, item
MUTATION_BATCH_V2 = _load("mutation_batch_v2.avsc")
ROLLUP_SIGNAL = _load("rollup_signal.avsc")
ROLLUP_SIGNAL_BATCH = _load("rollup_signal_batch.avsc")
SCHEMAS: dict[bytes, AvroSchema] = {s.fingerprint: s for s in (COUNT_MUTATION, MUTATION_BATCH, COUNT_MUTATION_V2,
                                                                MUTATION_BATCH_V2, ROLLUP_SIGNAL,
                                                                ROLLUP_SIGNAL_BATCH)}
"""Every schema this codec reads, by wire fingerprint. Keep old versions here when a schema evolves: writers
use CountMutation/MutationBatch v1 for mutations without dimensions or item (byte-identical to before), v2
otherwise."""
_SINGLE = (COUNT_MUTATION, COUNT_MUTATION_V2)
_BATCHES = (MUTATION_BATCH, MUTATION_BATCH_V2)

_CM_HEADER = COUNT_MUTATION.header
_BATCH_HEADER = MUTATION_BATCH.header
_SIGNAL_HEADER = ROLLUP_SIGNAL.header
_CM_PARSED = COUNT_MUTATION.parsed
_BATCH_PARSED = MUTATION_BATCH.parsed
_CM2_HEADER, _CM2_PARSED = COUNT_MUTATION_V2.header, COUNT_MUTATION_V2.parsed
_BATCH2_HEADER, _BATCH2_PARSED = MUTATION_BATCH_V2.header, MUTATION_BATCH_V2.parsed
_SIGNAL_PARSED = ROLLUP_SIGNAL.parsed
_SIGNAL_BATCH_HEADER = ROLLUP_SIGNAL_BATCH.header
_SIGNAL_BATCH_PARSED = ROLLUP_SIGNAL_BATCH.parsed
_OPS = {"ADD": MutationOp.ADD, "CLEAR": MutationOp.CLEAR}


def _op_as_index(schema: Any) -> Any:
    """The schema with the MutationOp enum read as its int index. fastavro looks the symbol up with the decoded
    number, so a corrupt index of -1 or -2 would read as CLEAR or ADD (Python's negative indexing)."""
    if isinstance(schema, dict):
        if schema.get("type") == "enum" and schema.get("name") == "MutationOp":
            return "int"
        return {k: _op_as_index(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_op_as_index(v) for v in schema]
    return schema


def _reader(avro: AvroSchema) -> dict[str, Any]:
    raw = json.loads(resources.files(__package__).joinpath(avro.filename).read_text(encoding="utf-8"))
    parsed = parse_schema(_op_as_index(raw))
    assert isinstance(parsed, dict), avro.filename  # a named (record) schema parses to a dict
    return parsed


_READERS = {s.fingerprint: _reader(s) for s in (COUNT_MUTATION, MUTATION_BATCH, COUNT_MUTATION_V2, MUTATION_BATCH_V2)}
"""How the general path reads the mutation schemas (same bytes; the op's index is checked by hand)."""
_OP_SYMBOLS = ("ADD", "CLEAR")
_CM_FINGERPRINT, _BATCH_FINGERPRINT = COUNT_MUTATION.fingerprint, MUTATION_BATCH.fingerprint
_SIGNAL_FINGERPRINT, _SIGNAL_BATCH_FINGERPRINT = ROLLUP_SIGNAL.fingerprint, ROLLUP_SIGNAL_BATCH.fingerprint


# --------------------------------------------------------------------------- encoding


def _record(m: Mutation) -> dict[str, Any]:
    if m.event_time is None or m.event_id is None:
        raise ValueError(
            f"cannot encode {m.key} as Avro without event_time and event_id (idempotency token); "
            "only JSON records may omit them")
    m = validate_mutation(m)
    record: dict[str, Any] = {
        "op": m.op.value,
        "namespace": m.namespace,
        "counter_name": m.counter_name,
        "delta": m.delta,
        "event_time": m.event_time,
        "event_id": m.event_id,
        "event_item_key": m.event_item_key,
    }
    if m.dimensions or m.item:  # v2 only (the caller picks the schema by is_v2)
        record["dimensions"] = dict(m.dimensions)
        record["item"] = m.item
    return record


def is_v2(m: Mutation) -> bool:
    """Whether a mutation needs the v2 schemas (it has dimensions or an item); v1 otherwise, byte-identical to
    what the service wrote before v2 existed, so old consumers keep reading plain records."""
    return bool(m.dimensions or m.item)


def _write(header: bytes, parsed: dict[str, Any], record: dict[str, Any]) -> bytes:
    buf = BytesIO()
    buf.write(header)
    schemaless_writer(buf, parsed, record)
    return buf.getvalue()


def encode_mutation(m: Mutation) -> bytes:
    """One validated mutation as a single-object CountMutation (v2 when it has dimensions or an item); ValueError
    if invalid or without token."""
    if is_v2(m):
        return _write(_CM2_HEADER, _CM2_PARSED, _record(m))
    return _write(_CM_HEADER, _CM_PARSED, _record(m))


def encode_batch(ms: Sequence[Mutation]) -> bytes:
    """Validated mutations as one single-object MutationBatch (v2 when any has dimensions or an item); ValueError
    if empty or any is invalid."""
    if not ms:
        raise ValueError("a MutationBatch needs at least one mutation")
    records = [_record(m) for m in ms]
    if any(is_v2(m) for m in ms):
        for r in records:
            r.setdefault("dimensions", {})
            r.setdefault("item", "")
        return _write(_BATCH2_HEADER, _BATCH2_PARSED, {"mutations": records})
    return _write(_BATCH_HEADER, _BATCH_PARSED, {"mutations": records})


def mutation_body(m: Mutation) -> bytes:
    """The Avro body of a CountMutation, without the single-object header, for callers that assemble records
    from bodies (`record_of_bodies`). `m` must come validated (validate_mutation, with a token and time): it
    is not checked again, because the API's group commit validates every write once, on arrival.

    Encoded by hand, the spec's binary encoding of this one record type (an enum index, strings as a length
    and UTF-8 bytes, longs as zigzag varints), with the op, namespace and counter part remembered per counter:
    a third of fastavro's per-record cost on the API's hot path. Tests hold it byte-equal to fastavro's.

    A mutation with dimensions or an item (`is_v2`) gets the v2 body: the v1 fields, then the dimensions map and
    the item; `record_of_bodies(..., v2=True)` carries those, and `v2_body` turns a v1 body into the v2 form."""
    body = b"".join((_mutation_head(m.op is MutationOp.CLEAR, m.namespace, m.counter_name), _long(m.delta),
                     # validated with a token and time (see above), not re-checked here: the hot path
                     _long(m.event_time), _string(m.event_id),  # type: ignore[arg-type]
                     _string(m.event_item_key)))
    if m.dimensions or m.item:
        return body + _map(m.dimensions) + _string(m.item)
    return body


V2_DEFAULTS = b"\x00\x00"
"""The v2 fields at their defaults (an empty map, an empty string): a v1 body plus these is its v2 body."""


def v2_body(v1_body: bytes) -> bytes:
    """The v2 body of a mutation encoded as a v1 body (no dimensions, no item)."""
    return v1_body + V2_DEFAULTS


def _map(pairs: Sequence[tuple[str, str]]) -> bytes:
    """An Avro map of strings as fastavro writes one: a single block (its count), the pairs, then 0."""
    if not pairs:
        return b"\x00"
    return b"".join((_long(len(pairs)), *(_string(k) + _string(v) for k, v in pairs), b"\x00"))


@functools.lru_cache(maxsize=100_000)
def _mutation_head(clear: bool, namespace: str, counter: str) -> bytes:
    return (b"\x02" if clear else b"\x00") + _string(namespace) + _string(counter)  # enum index 1 or 0, zigzag


def _string(text: str) -> bytes:
    data = text.encode()
    size = len(data)
    return (_SMALL_LONGS[size + 64] if size < 64 else _long(size)) + data


def _long(n: int) -> bytes:
    """An Avro long: zigzag, then 7 bits per byte, low group first."""
    if -64 <= n < 64:
        return _SMALL_LONGS[n + 64]
    if _EIGHT_BYTES_FROM <= n < _EIGHT_BYTES_UPTO:  # every event time (epoch µs, 2000..2200): 8 bytes, unrolled
        global _HIGH_BYTES
        z = n << 1
        high = _HIGH_BYTES  # read once: another thread may replace it meanwhile, never half-way
        if high[0] != z >> 21:  # the last five bytes change about once a second for the current time
            high = _HIGH_BYTES = (z >> 21, bytes(((z >> 21 & 0x7F) | 0x80, (z >> 28 & 0x7F) | 0x80,
                                                  (z >> 35 & 0x7F) | 0x80, (z >> 42 & 0x7F) | 0x80, z >> 49)))
        return bytes(((z & 0x7F) | 0x80, (z >> 7 & 0x7F) | 0x80, (z >> 14 & 0x7F) | 0x80)) + high[1]
    return _zigzag(n)


_EIGHT_BYTES_FROM, _EIGHT_BYTES_UPTO = 1 << 48, 1 << 55  # zigzag 2n in [2^49, 2^56): exactly 8 varint bytes
_HIGH_BYTES = (-1, b"")  # the last 8-byte long's z >> 21 and its last five bytes


def record_of_bodies(bodies: Sequence[bytes], *, v2: bool = False) -> bytes:
    """One single-object record carrying CountMutation bodies: a CountMutation for one, a MutationBatch for
    more. Avro encodes an array as a block count (zigzag long), the items, and a 0 ending the blocks, so a
    batch is assembled from bodies encoded earlier without decoding or re-encoding them. `v2`: the bodies are
    all v2 bodies (see mutation_body, v2_body) and the record is a CountMutation/MutationBatch v2."""
    if not bodies:
        raise ValueError("a MutationBatch needs at least one mutation")
    if len(bodies) == 1:
        return (_CM2_HEADER if v2 else _CM_HEADER) + bodies[0]
    return b"".join((_BATCH2_HEADER if v2 else _BATCH_HEADER, _zigzag(len(bodies)), *bodies, b"\x00"))


def _zigzag(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL_LONGS = tuple(_zigzag(n) for n in range(-64, 64))  # one byte each


@functools.lru_cache(maxsize=200_000)
def signal_body(namespace: str, counter: str) -> bytes:
    """The Avro body of one RollupSignal (validated; ValidationError for invalid names), remembered: the
    persist path signals the same counters batch after batch."""
    buf = BytesIO()
    schemaless_writer(buf, _SIGNAL_PARSED, {"namespace": validate_namespace(namespace),
                                            "counter": validate_internal_counter_name(counter, field="counter")})
    return buf.getvalue()


def encode_signal(namespace: str, counter: str) -> bytes:
    """A single-object RollupSignal for one counter (a user counter or a dimension combination, see
    schemas.dimensions); ValidationError for invalid names."""
    return _SIGNAL_HEADER + signal_body(namespace, counter)


def encode_signals(keys: Sequence[tuple[str, str]]) -> bytes:
    """Signals for several counters in one record: a RollupSignal for one, a RollupSignalBatch for more.

    Why: the persist path touches hundreds of counters per batch, and a record per signal cost a send on one
    side and a record's handling on the other. Callers batch only counters bound for the same partition."""
    if not keys:
        raise ValueError("a RollupSignalBatch needs at least one signal")
    if len(keys) == 1:
        return encode_signal(*keys[0])
    return b"".join((_SIGNAL_BATCH_HEADER, _zigzag(len(keys)), *(signal_body(ns, c) for ns, c in keys), b"\x00"))


# --------------------------------------------------------------------------- decoding


_WIDE_VARINT = re.compile(rb"[\x80-\xff]{9}")
"""Nine bytes in a row with the high bit set: where an Avro long of 10 bytes or more may be. fastavro's C reader
wraps such a long to 64 bits without a word (`2**64 + 5` in 10 bytes reads as 5, and 11 bytes read as whatever
their low bits say), so a corrupt delta or event time was counted as another value; fastavro's pure-Python reader
keeps Python's exact integer, which the range checks then refuse. Names of three or more non-ASCII characters
match too, and take the slower reader for the same answer."""


def _read_avro(data: bytes) -> tuple[AvroSchema, Any]:
    """Decode a single-object record with the schema its fingerprint names; trailing bytes are an error."""
    if len(data) < HEADER_LEN:
        raise DecodeError(f"truncated Avro single-object header: {len(data)} bytes, need {HEADER_LEN}")
    schema = SCHEMAS.get(data[2:HEADER_LEN])
    if schema is None:
        fp = int.from_bytes(data[2:HEADER_LEN], "little")
        raise DecodeError(f"unknown schema fingerprint 0x{fp:016x}")
    fo = BytesIO(data)
    fo.seek(HEADER_LEN)
    try:
        reader = exact_schemaless_reader if _WIDE_VARINT.search(data, HEADER_LEN) else schemaless_reader
        value: Any = reader(fo, _READERS.get(schema.fingerprint, schema.parsed), None)
    except EOFError as exc:
        detail = str(exc) or "unexpected end of data"
        if detail.startswith("Expected -"):  # fastavro reads a negative length as a read past the end
            raise DecodeError(f"corrupt Avro body for {schema.name}: a negative string or bytes length "
                              f"({detail})") from None
        raise DecodeError(f"truncated Avro body for {schema.name}: {detail}") from None
    except Exception as exc:  # fastavro raises many types on corrupt input; all mean "undecodable"
        raise DecodeError(f"corrupt Avro body for {schema.name}: {type(exc).__name__}: {exc}"[:300]) from None
    extra = len(data) - fo.tell()
    if extra:
        raise DecodeError(f"{extra} trailing bytes after the Avro body for {schema.name}")
    if schema.fingerprint in _READERS:
        for record in (value,) if schema in _SINGLE else value["mutations"]:
            index = record["op"]
            if not 0 <= index < len(_OP_SYMBOLS):
                raise DecodeError(f"corrupt Avro body for {schema.name}: MutationOp index {index} "
                                  "(0 is ADD, 1 is CLEAR)")
            record["op"] = _OP_SYMBOLS[index]
    return schema, value


def _from_record(r: dict[str, Any]) -> Mutation:
    """Build a Mutation from a decoded Avro record (v1 or v2); the full validator runs only off the ASCII fast
    path of a v1-shaped mutation."""
    fields = (r["namespace"], r["counter_name"], r["delta"], r["event_time"], r["event_id"],
              r["event_item_key"], _OPS[r["op"]])
    dimensions, item = r.get("dimensions"), r.get("item", "")
    if dimensions or item:
        return validate_mutation(Mutation(*fields, tuple((dimensions or {}).items()), item))
    if plainly_valid(*fields):
        return Mutation(*fields)
    return validate_mutation(Mutation(*fields))


def _decode_json(data: bytes) -> list[Mutation]:
    """orjson first (a fifth of the json module's cost); the json module only for what orjson refuses or when
    the text may hold a repeated key, so both paths accept and reject exactly the same records."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:  # invalid JSON, or valid JSON orjson cannot hold (e.g. 1e400)
        return _mutations_from_json(_loads_strict(data))
    if data.count(b'"') != _quotes(value):
        return _mutations_from_json(_loads_strict(data))
    try:
        return _mutations_from_json(value)
    except DecodeError:  # orjson reads an integer beyond 64 bits as a float: the strict reading gives the reason
        return _mutations_from_json(_loads_strict(data))


_MAX_JSON_DEPTH = 32
"""Far deeper than a mutation nests (array > object > dimensions). orjson parses up to 1024 levels, deeper than
`_quotes` may recurse: a RecursionError is no DecodeError, and a record raising one would fail its batch."""


def _quotes(value: Any, depth: int = 0) -> int:
    """How many '"' the JSON text of a parsed value holds when no key repeats and no string has an escaped
    quote: 2 per key and per string. The text holding more means a repeated key (orjson keeps the last one
    silently) or an escaped quote; either way the strict parser decides."""
    kind = type(value)
    if kind is str:
        return 2
    if depth > _MAX_JSON_DEPTH:
        raise DecodeError(f"JSON nested deeper than {_MAX_JSON_DEPTH} levels")
    n = 0
    if kind is dict:
        for v in value.values():
            k = type(v)
            n += 4 if k is str else (2 + _quotes(v, depth + 1) if k is dict or k is list else 2)
    elif kind is list:
        for v in value:
            n += _quotes(v, depth + 1)
    return n


def _loads_strict(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise DecodeError(f"not valid UTF-8 JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise DecodeError(f"invalid JSON: {exc}"[:300]) from None


def _mutations_from_json(value: Any) -> list[Mutation]:
    if isinstance(value, dict):
        try:
            return [mutation_from_json(value)]
        except ValidationError as exc:
            raise DecodeError(f"JSON {exc}", exc.field) from None
    if not isinstance(value, list):
        raise DecodeError(f"JSON must be an object or an array of objects, got {type(value).__name__}")
    if not value:
        raise DecodeError("empty JSON array: no mutations")
    out = []
    try:
        for item in value:
            if not isinstance(item, dict):
                break
            out.append(mutation_from_json(item))
        else:
            return out
    except ValidationError:
        pass
    raise _invalid_items("JSON array", value, _json_item, _json_text)


def _json_item(item: Any) -> Mutation:
    if not isinstance(item, dict):
        raise DecodeError(f"must be an object, got {type(item).__name__}")
    return mutation_from_json(item)


def _json_text(item: Any) -> bytes:
    """An invalid JSON array item alone, as JSON: a number past a float's range (1e400) has no JSON spelling
    (json.dumps wrote `Infinity`), so such an item raises and its dead letter keeps the whole record."""
    return json.dumps(item, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _invalid_items(kind: str, items: Sequence[Any], read: Callable[[Any], Mutation],
                   alone: Callable[[Any], bytes]) -> DecodeError:
    """What to raise for a batch record with an invalid item (off the common path: its first reading failed): each
    item read again, the valid ones kept with their index, each invalid one with its reason and its bytes alone
    (`InvalidItems`). A batch of one item is its whole record: a plain DecodeError, as for a single mutation."""
    valid: list[tuple[int, Mutation]] = []
    rejected: list[RejectedItem] = []
    for i, item in enumerate(items):
        try:
            valid.append((i, read(item)))
        except (ValidationError, DecodeError) as exc:
            try:
                data: bytes | None = alone(item)
            except Exception:  # e.g. a value the encoder refuses: the dead letter keeps the whole record
                data = None
            rejected.append(RejectedItem(i, f"{kind} item {i}: {exc}", getattr(exc, "field", None), data))
    if len(items) == 1:
        return DecodeError(rejected[0].reason, rejected[0].field)
    return InvalidItems(valid, rejected)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # a repeated key is ambiguous; json.loads would silently keep the last
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


def _as_bytes(data: Any) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise DecodeError(f"expected bytes, got {type(data).__name__}")


def decode_mutations(data: bytes) -> list[Mutation]:
    """Decode one Kafka record value into validated mutations (never an empty list).

    Accepts a single-object CountMutation or MutationBatch, a JSON object or a JSON array of objects.
    Anything else, or any invalid field, raises DecodeError whose message names the problem.
    """
    data = _as_bytes(data)
    if data[:2] == MAGIC:
        fingerprint = data[2:HEADER_LEN]
        if fingerprint == _CM_FINGERPRINT:
            plain = read_mutation(data, HEADER_LEN)
        elif fingerprint == _BATCH_FINGERPRINT:
            plain = read_mutation_batch(data, HEADER_LEN)
        else:
            plain = None
        if plain is not None:
            return plain
        schema, value = _read_avro(data)  # v2 and anything unusual: fastavro and the full validators decide
        if schema in _SINGLE:
            try:
                return [_from_record(value)]
            except ValidationError as exc:
                raise DecodeError(f"CountMutation {exc}", exc.field) from None
        if schema in _BATCHES:
            records = value["mutations"]
            if not records:
                raise DecodeError("empty MutationBatch: no mutations")
            out: list[Mutation] = []
            try:
                for r in records:
                    out.append(_from_record(r))
            except ValidationError:
                single = COUNT_MUTATION_V2 if schema is MUTATION_BATCH_V2 else COUNT_MUTATION
                raise _invalid_items("MutationBatch", records, _from_record,
                                     lambda r: _write(single.header, single.parsed, r)) from None
            return out
        raise DecodeError(f"record is a {schema.name}, not a CountMutation or MutationBatch")
    head = data.lstrip()[:1]
    if not head:
        raise DecodeError("empty record")
    if head in (b"{", b"["):
        return _decode_json(data)
    if data.startswith(b"\xef\xbb\xbf"):
        raise DecodeError("JSON starting with a UTF-8 byte order mark (EF BB BF): send it without one")
    raise DecodeError("not Avro single-object (no C3 01 magic) and not JSON (no leading '{' or '[')")


def decode_signal(data: bytes) -> tuple[str, str]:
    """Decode a single-object RollupSignal into (namespace, counter); DecodeError otherwise."""
    signals = decode_signals(data)
    if len(signals) != 1:
        raise DecodeError(f"record is a RollupSignalBatch of {len(signals)}, not one RollupSignal")
    return signals[0]


def decode_signals(data: bytes) -> list[tuple[str, str]]:
    """Decode a RollupSignal or RollupSignalBatch into [(namespace, counter), ...]; DecodeError otherwise."""
    data = _as_bytes(data)
    if not data:
        raise DecodeError("empty record")
    if data[:2] != MAGIC:
        raise DecodeError("not Avro single-object (no C3 01 magic)")
    fingerprint = data[2:HEADER_LEN]
    if fingerprint == _SIGNAL_BATCH_FINGERPRINT:
        plain = read_signal_batch(data, HEADER_LEN)
    elif fingerprint == _SIGNAL_FINGERPRINT:
        plain = read_signal(data, HEADER_LEN)
    else:
        plain = None
    if plain is not None:
        return plain
    schema, value = _read_avro(data)
    if schema is ROLLUP_SIGNAL:
        items = [value]
    elif schema is ROLLUP_SIGNAL_BATCH:
        items = value["signals"]
        if not items:
            raise DecodeError("empty RollupSignalBatch: no signals")
    else:
        raise DecodeError(f"record is a {schema.name}, not a RollupSignal or RollupSignalBatch")
    try:
        return [(validate_namespace(v["namespace"]), validate_internal_counter_name(v["counter"], field="counter"))
                for v in items]
    except ValidationError as exc:
        raise DecodeError(f"RollupSignal {exc}", exc.field) from None
