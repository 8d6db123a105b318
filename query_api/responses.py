"""Response bodies built from service results: one place, shared by the routes and the fast path."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

from control_plane import CounterType
from producers import DeliveryError
from query_api.models import AddCountResponse, CountResponse
from query_api.service import BrokerUnavailable, Count, NamespaceNotFound, NotCountedYet, Rejected, Written
from schemas import MICROS
from sinks.best_effort import CounterOverflow, CounterUnavailable

SERVICE_ERRORS: tuple[type[Exception], ...] = (NamespaceNotFound, BrokerUnavailable, CounterUnavailable,
                                                NotCountedYet, Rejected, CounterOverflow, DeliveryError)


def _as_of(rollup_ts: int | None) -> datetime | None:
    return datetime.fromtimestamp(rollup_ts / MICROS, UTC) if rollup_ts else None


def count_response(c: Count) -> CountResponse:
    return CountResponse(namespace=c.ns.name, counter_name=c.counter, count=c.count,
                         counter_type=c.ns.counter_type.value, as_of=_as_of(c.rollup_ts))


def count_json(c: Count) -> bytes:
    """`count_response(c)` serialized, without building the model: the same bytes at a fifth of the cost
    (the fast path's share of a cached GetCount; tests compare the two over generated values)."""
    try:
        return orjson.dumps({"namespace": c.ns.name, "counter_name": c.counter, "count": c.count,
                             "counter_type": c.ns.counter_type.value, "as_of": _as_of(c.rollup_ts)},
                            option=orjson.OPT_UTC_Z)
    except TypeError:  # an integer orjson cannot hold: the model can
        return count_response(c).model_dump_json().encode()


def add_json(w: Written) -> bytes:
    """`add_response(w)` serialized, without building the model (see count_json)."""
    return orjson.dumps({"namespace": w.ns.name, "counter_name": w.counter, "counter_type": w.ns.counter_type.value,
                         "durable": w.ns.counter_type is not CounterType.BEST_EFFORT, "idempotency_token": w.token})


def add_response(w: Written) -> AddCountResponse:
    return AddCountResponse(namespace=w.ns.name, counter_name=w.counter, counter_type=w.ns.counter_type.value,
                            durable=w.ns.counter_type is not CounterType.BEST_EFFORT, idempotency_token=w.token)


def error_response(exc: Exception) -> tuple[int, dict]:
    """Status and body for one of SERVICE_ERRORS: one mapping for the FastAPI handlers and the fast path."""
    if isinstance(exc, Rejected):
        return 422, {"detail": [{"loc": ["body", *exc.field.split(".")], "msg": str(exc), "type": "value_error"}]}
    if isinstance(exc, CounterOverflow):
        return 422, {"detail": [{"loc": ["body", "delta"], "msg": str(exc), "type": "value_error"}]}
    if isinstance(exc, NamespaceNotFound):
        return 404, {"detail": str(exc)}
    if isinstance(exc, NotCountedYet):
        return 504, {"detail": str(exc)}
    if isinstance(exc, BrokerUnavailable | CounterUnavailable | DeliveryError):
        return 503, {"detail": str(exc)}
    raise TypeError(f"not a service error: {exc!r}")
