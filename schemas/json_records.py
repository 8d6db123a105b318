"""JSON mutations, in the Netflix post's request-body shape, for producers that do not speak Avro.

AddCount:   {"namespace", "counter_name", "delta", "idempotency_token": {"token", "generation_time"}}
ClearCount: the same with "op": "clear" and no delta (or delta 0).
Optional: "op" ("add" | "clear", any case) and "event_item_key". Any other key is rejected with its
name, because a misspelt "idempotency_token" silently ignored would turn retries into double counts.
A null optional field means the same as an absent one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.model import Mutation, MutationOp
from schemas.validation import (
    ValidationError,
    parse_generation_time,
    validate_counter_name,
    validate_delta,
    validate_item_key,
    validate_namespace,
    validate_token,
)

JSON_FIELDS = frozenset({"namespace", "counter_name", "delta", "idempotency_token", "op", "event_item_key"})
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
    if not isinstance(obj, Mapping):
        raise ValidationError("record", f"must be a JSON object, got {type(obj).__name__}")
    _unknown_key(obj, JSON_FIELDS, "")
    op = _parse_op(obj.get("op"))
    namespace = validate_namespace(_required(obj, "namespace"))
    counter_name = validate_counter_name(_required(obj, "counter_name"))
    if op is MutationOp.ADD:
        delta = validate_delta(_required(obj, "delta"))
    else:
        raw = obj.get("delta")
        delta = 0 if raw is None else validate_delta(raw)
        if delta != 0:
            raise ValidationError("delta", f"must be absent or 0 for a clear, got {delta}")
    event_id, event_time = _parse_token(obj.get("idempotency_token"))
    raw_key = obj.get("event_item_key")
    item_key = "" if raw_key is None else validate_item_key(raw_key)
    return Mutation(namespace, counter_name, delta, event_time, event_id, item_key, op)
