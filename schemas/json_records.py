"""JSON mutations, in the Netflix post's request-body shape, for producers that do not speak Avro.

AddCount:   {"namespace", "counter_name", "delta", "idempotency_token": {"token", "generation_time"}}
ClearCount: the same with "op": "clear" and no delta (or delta 0).
Optional: "op" ("add" | "clear", any case), "event_item_key", "dimensions" (a map of key -> value, e.g.
{"country": "US", "device": "tv"}; see schemas.dimensions) and "item" (what a UNIQUE namespace counts; an add with
an item may leave "delta" out: it counts the item once). Any other key is rejected with its name, because a
misspelt "idempotency_token" silently ignored would turn retries into double counts. A null optional field means
the same as an absent one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from schemas.dimensions import validate_dimensions, validate_item
from schemas.model import Mutation, MutationOp
from schemas.validation import (
    INT64_MAX,
    INT64_MIN,
    MAX_EVENT_TIME,
    MAX_TOKEN_BYTES,
    MIN_EVENT_TIME,
    ValidationError,
    iso_micros,
    parse_generation_time,
    plainly_valid_names,
    validate_counter_name,
    validate_delta,
    validate_item_key,
    validate_namespace,
    validate_token,
)

JSON_FIELDS = frozenset({"namespace", "counter_name", "delta", "idempotency_token", "op", "event_item_key",
                         "dimensions", "item"})
TOKEN_FIELDS = frozenset({"token", "generation_time"})
_OPS_BY_NAME = {"add": MutationOp.ADD, "clear": MutationOp.CLEAR}


def _unknown_key(obj: Mapping[Any, Any], allowed: frozenset[str], prefix: str) -> None:
    if obj.keys() <= allowed:
        return
    unknown = next(k for k in obj if k not in allowed)
    name = unknown if isinstance(unknown, str) else repr(unknown)
    raise ValidationError(f"{prefix}{name}", f"unknown field (allowed: {', '.join(sorted(allowed))})")


def _parse_op(value: Any) -> MutationOp:
    if value is None:
        return MutationOp.ADD
    op = _OPS_BY_NAME.get(value.lower()) if isinstance(value, str) else None
    if op is None:
        raise ValidationError("op", f"must be 'add' or 'clear' (any case), got {value!r}"[:120])
    return op


def _required(obj: Mapping[str, Any], name: str) -> Any:
    value = obj.get(name)
    if value is None:
        raise ValidationError(name, "is required (missing or null)")
    return value


def _parse_token(value: Any) -> tuple[str | None, int | None]:
    """Return (event_id, event_time) from an idempotency_token object; (None, None) when absent."""
    if value is None:
        return None, None
    if not isinstance(value, Mapping):
        raise ValidationError("idempotency_token", "must be an object {token, generation_time}")
    _unknown_key(value, TOKEN_FIELDS, "idempotency_token.")
    token = value.get("token")
    if token is None:
        raise ValidationError("idempotency_token.token", "is required (missing or null)")
    event_id = validate_token(token, field="idempotency_token.token")
    generation_time = value.get("generation_time")
    if generation_time is None:
        return event_id, None
    return event_id, parse_generation_time(generation_time, field="idempotency_token.generation_time")


def mutation_from_json(obj: Mapping[str, Any]) -> Mutation:
    """Build a validated Mutation from a decoded JSON object; raises ValidationError naming the field."""
    if type(obj) is dict and obj.keys() <= _PLAIN_FIELDS:
        plain = _plain_add(obj)
        if plain is not None:
            return plain
    if not isinstance(obj, Mapping):
        raise ValidationError("record", f"must be a JSON object, got {type(obj).__name__}")
    _unknown_key(obj, JSON_FIELDS, "")
    op = _parse_op(obj.get("op"))
    namespace = validate_namespace(_required(obj, "namespace"))
    counter_name = validate_counter_name(_required(obj, "counter_name"))
    raw_item = obj.get("item")
    item = "" if raw_item is None else validate_item(raw_item)
    if op is MutationOp.ADD:
        # an add with an item (a UNIQUE namespace's) counts that item once: its delta may be left out
        delta = 1 if item and obj.get("delta") is None else validate_delta(_required(obj, "delta"))
    else:
        raw = obj.get("delta")
        delta = 0 if raw is None else validate_delta(raw)
        if delta != 0:
            raise ValidationError("delta", f"must be absent or 0 for a clear, got {delta}")
    event_id, event_time = _parse_token(obj.get("idempotency_token"))
    raw_key = obj.get("event_item_key")
    item_key = "" if raw_key is None else validate_item_key(raw_key)
    dimensions = validate_dimensions(obj.get("dimensions"))
    if dimensions and op is MutationOp.CLEAR:
        raise ValidationError("dimensions", "a clear applies to the counter and all its combinations: "
                                            "send it without dimensions")
    return Mutation(namespace, counter_name, delta, event_time, event_id, item_key, op, dimensions, item)


def tokenless_json(m: Mutation) -> bytes:
    """The JSON record of a mutation that came without a token (`event_id` None), without one again: re-sent
    alone (`counter dlq replay`), it takes its new record's time and position as its identity, as a token-less
    record does. The dead letter of a token-less item of a JSON array is this, so it can be replayed after
    its namespace was fixed, whatever the time."""
    if m.event_id is not None:
        raise ValueError(f"{m.key} has a token: its JSON record would carry it")
    obj: dict[str, Any] = {"namespace": m.namespace, "counter_name": m.counter_name, "delta": m.delta}
    if m.op is MutationOp.CLEAR:
        obj["op"] = "clear"
    if m.event_item_key:
        obj["event_item_key"] = m.event_item_key
    if m.dimensions:
        obj["dimensions"] = dict(m.dimensions)
    if m.item:
        obj["item"] = m.item
    return orjson.dumps(obj)


_PLAIN_FIELDS = frozenset({"namespace", "counter_name", "delta", "idempotency_token"})


def _plain_add(obj: dict[str, Any]) -> Mutation | None:
    """The common record, an AddCount body of ASCII names with a string time, checked with the validators'
    own fast tests and no intermediate calls; None sends anything else through the full path (which gives
    the verdict and the message)."""
    namespace, counter, delta = obj.get("namespace"), obj.get("counter_name"), obj.get("delta")
    if not (type(namespace) is str and type(counter) is str and type(delta) is int and INT64_MIN <= delta <= INT64_MAX
            and plainly_valid_names(namespace, counter)):
        return None
    token = obj.get("idempotency_token")
    if token is None:
        return _TUPLE_NEW(Mutation, (namespace, counter, delta, None, None, "", _ADD, (), ""))
    if type(token) is not dict or len(token) != 2:
        return None
    event_id, generation_time = token.get("token"), token.get("generation_time")
    # on an ASCII str isprintable() is the absence of what CONTROL_SEARCH finds (0x00-0x1f, 0x7f), at a third of
    # its cost
    if not (type(event_id) is str and type(generation_time) is str and 0 < len(event_id) <= MAX_TOKEN_BYTES
            and event_id.isascii() and event_id.isprintable()):
        return None
    event_time = iso_micros(generation_time)
    if event_time is None or not MIN_EVENT_TIME <= event_time <= MAX_EVENT_TIME:
        return None
    return _TUPLE_NEW(Mutation, (namespace, counter, delta, event_time, event_id, "", _ADD, (), ""))


_TUPLE_NEW = tuple.__new__  # a Mutation built without the NamedTuple's Python-level __new__ (a frame per record)
_ADD = MutationOp.ADD
