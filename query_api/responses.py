"""Response bodies built from service results: one place, shared by the routes and the fast path."""

from __future__ import annotations

from datetime import datetime

import orjson

from control_plane import CounterType, Namespace
from producers import DeliveryError
from query_api.models import (
    AddCountResponse,
    Bucket,
    CountResponse,
    DimensionCountResponse,
    DimensionWindowCountResponse,
    Group,
    GroupedCountResponse,
    SeriesResponse,
    TopKItem,
    TopKResponse,
    Window,
    WindowCountResponse,
)
from query_api.service import (
    BrokerUnavailable,
    Count,
    Grouped,
    Identity,
    NamespaceNotFound,
    NotCountedYet,
    Ranked,
    Rejected,
    WindowedCount,
    Written,
)
from query_api.windows import Series
from schemas import Dimensions
from schemas.validation import utc_datetime
from sinks import store_unavailable
from sinks.best_effort import CounterUnavailable, CounterWriteUnknown
from sinks.windows import WindowError

SERVICE_ERRORS: tuple[type[Exception], ...] = (NamespaceNotFound, BrokerUnavailable, CounterUnavailable,
                                                NotCountedYet, Rejected, DeliveryError,
                                                WindowError)


def as_of_time(us: int | None) -> datetime | None:
    """A count's `as_of`: when its rollup (or window, sketch) was taken; None before the first."""
    return utc_datetime(us) if us else None


def window_of(start_us: int, end_us: int) -> Window:
    return Window(start=utc_datetime(start_us), end=utc_datetime(end_us))


def maybe_window(start_us: int | None, end_us: int | None) -> Window | None:
    """A grouped answer's window, None when it counts over all time."""
    return None if start_us is None or end_us is None else window_of(start_us, end_us)


def count_response(c: Count) -> CountResponse:
    return CountResponse(namespace=c.ns.name, counter_name=c.counter, count=c.count,
                         counter_type=c.ns.counter_type.value, as_of=as_of_time(c.rollup_ts))


def count_json(c: Count) -> bytes:
    """`count_response(c)` serialized, without building the model: the same bytes at a fifth of the cost
    (the fast path's share of a cached GetCount; tests compare the two over generated values)."""
    try:
        return orjson.dumps({"namespace": c.ns.name, "counter_name": c.counter, "count": c.count,
                             "counter_type": c.ns.counter_type.value, "as_of": as_of_time(c.rollup_ts)},
                            option=orjson.OPT_UTC_Z)
    except TypeError:  # an integer orjson cannot hold: the model can
        return count_response(c).model_dump_json().encode()


def window_response(w: WindowedCount) -> WindowCountResponse:
    return WindowCountResponse(namespace=w.ns.name, counter_name=w.counter, count=w.count,
                               counter_type=w.ns.counter_type.value, as_of=as_of_time(w.as_of),
                               window=window_of(w.start_us, w.end_us))


def window_json(w: WindowedCount) -> bytes:
    """`window_response(w)` serialized without building the model (see count_json)."""
    try:
        return orjson.dumps({"namespace": w.ns.name, "counter_name": w.counter, "count": w.count,
                             "counter_type": w.ns.counter_type.value, "as_of": as_of_time(w.as_of),
                             "window": {"start": utc_datetime(w.start_us), "end": utc_datetime(w.end_us)}},
                            option=orjson.OPT_UTC_Z)
    except TypeError:  # an integer orjson cannot hold: the model can
        return window_response(w).model_dump_json().encode()


def dimension_response(c: Count, counter: str, dimensions: Dimensions) -> DimensionCountResponse:
    """A filtered GetCount: `c` is the combination counter's count, answered under the base `counter`."""
    return DimensionCountResponse(namespace=c.ns.name, counter_name=counter, count=c.count,
                                  counter_type=c.ns.counter_type.value, as_of=as_of_time(c.rollup_ts),
                                  dimensions=dict(dimensions))


def dimension_window_response(w: WindowedCount, counter: str,
                              dimensions: Dimensions) -> DimensionWindowCountResponse:
    return DimensionWindowCountResponse(namespace=w.ns.name, counter_name=counter, count=w.count,
                                        counter_type=w.ns.counter_type.value, as_of=as_of_time(w.as_of),
                                        window=window_of(w.start_us, w.end_us),
                                        dimensions=dict(dimensions))


def grouped_response(g: Grouped) -> GroupedCountResponse:
    window = maybe_window(g.start_us, g.end_us)
    return GroupedCountResponse(namespace=g.ns.name, counter_name=g.counter, counter_type=g.ns.counter_type.value,
                                dimensions=dict(g.dimensions), group_by=g.group_by,
                                groups=[Group(value=v, count=n) for v, n in g.groups], count=g.count,
                                as_of=as_of_time(g.as_of), window=window)


def series_response(ns: Namespace, counter: str, s: Series, as_of: int | None) -> SeriesResponse:
    return SeriesResponse(namespace=ns.name, counter_name=counter, counter_type=ns.counter_type.value,
                          granularity=s.granularity.value, start=utc_datetime(s.start_us), end=utc_datetime(s.end_us),
                          buckets=[Bucket(start=utc_datetime(start), count=count) for start, count in s.buckets],
                          as_of=as_of_time(as_of))


def top_k_response(r: Ranked) -> TopKResponse:
    return TopKResponse(namespace=r.ns.name, counter_type=r.ns.counter_type.value, k=r.k,
                        dimensions=dict(r.dimensions), window=window_of(r.top.start_us, r.top.end_us),
                        items=[TopKItem(counter_name=c, count=n) for c, n in r.top.items], as_of=as_of_time(r.as_of),
                        rows_read=r.top.rows_read, candidates=r.top.candidates)


def add_json(w: Written) -> bytes:
    """`add_response(w)` serialized, without building the model (see count_json). orjson writes the counter type, a
    str enum, as its value."""
    return orjson.dumps({"namespace": w.ns.name, "counter_name": w.counter, "counter_type": w.ns.counter_type,
                         "durable": w.ns.counter_type is not CounterType.BEST_EFFORT, "idempotency_token": w.token})


def add_response(w: Written) -> AddCountResponse:
    return AddCountResponse(namespace=w.ns.name, counter_name=w.counter, counter_type=w.ns.counter_type.value,
                            durable=w.ns.counter_type is not CounterType.BEST_EFFORT, idempotency_token=w.token)


def answerable(exc: BaseException) -> bool:
    """Whether `error_response` maps `exc` to a status: a service error, or a store's error saying the store is
    away (locked past its retries, failing I/O, no replica: sinks.store_unavailable), which is a 503, as a broker
    outage is, rather than a 500. Anything else is a bug, answered 500 and logged."""
    return isinstance(exc, SERVICE_ERRORS) or store_unavailable(exc)


def error_response(exc: Exception, identity: Identity | None = None) -> tuple[int, dict]:
    """Status and body for one of SERVICE_ERRORS: one mapping for the FastAPI handlers and the fast path. A durable
    write that failed (503) or was not counted in time (504) answers its identity (`identity`, or the exception's):
    the token and event time (epoch µs, as generation_time accepts it) a retry must send to be counted once, which
    the client never saw when this process drew them."""
    identity = identity or getattr(exc, "identity", None)
    status, body = _error_response(exc)
    if identity is not None and status in (503, 504):
        body["idempotency_token"] = {"token": identity[0], "generation_time": identity[1]}
    if (entries := getattr(exc, "entries", None)) is not None and status in (503, 504):  # a batch: each entry's
        body["idempotency_tokens"] = [None if e is None else {"token": e[0], "generation_time": e[1]}
                                      for e in entries]
    return status, body


def _loc(field: str) -> list[str | int]:
    """A refused field's loc as the request model's errors write it: a batch entry's index is a number
    (["body", "requests", 2, "delta"]); any other part stays text (a dimension key may be all digits), and a
    dimension key is one part, dots and all (["body", "dimensions", "a.b"]: it was ["body", "dimensions", "a", "b"],
    a review)."""
    head, dims, key = field.partition("dimensions.")
    parts: list[str | int] = ["body", *head.split(".")[:-1], "dimensions", key] if dims and (
        not head or head.endswith(".")) else ["body", *field.split(".")]
    if len(parts) > 2 and parts[1] == "requests" and str(parts[2]).isdigit():
        parts[2] = int(parts[2])
    return parts


def _error_response(exc: Exception) -> tuple[int, dict]:
    if isinstance(exc, Rejected):
        return 422, {"detail": [{"loc": _loc(exc.field), "msg": str(exc), "type": "value_error"}]}
    if isinstance(exc, WindowError):
        return 422, {"detail": [{"loc": _loc(exc.field or "window"), "msg": str(exc), "type": "value_error"}]}
    if isinstance(exc, NamespaceNotFound):
        return 404, {"detail": str(exc)}
    if isinstance(exc, NotCountedYet | CounterWriteUnknown):
        return 504, {"detail": str(exc)}
    if isinstance(exc, BrokerUnavailable | CounterUnavailable | DeliveryError):
        return 503, {"detail": str(exc)}
    if store_unavailable(exc):
        return 503, {"detail": f"the store is unavailable ({type(exc).__name__}: {exc}); retry later"}
    raise TypeError(f"not a service error: {exc!r}")
