"""The hottest calls, decided without the framework: a plain, valid GetCount, AddCount or AddAndGetCount.

FastAPI's routing, dependency injection and model validation cost most of a cached GetCount. `fast_call`
recognises the common case (known SUM namespace without API keys, exactly the expected fields, valid values)
and returns what serves it: the service call's awaitable and the function rendering its result as the
route's response body. For anything else it returns None and the request goes to the FastAPI route, so
errors and edge cases have exactly one implementation. `query_api.http_protocol` calls it straight from the
HTTP parser and settles the response in a callback (a BEST_EFFORT add needs no task at all).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import orjson

from control_plane import CounterType, Namespace
from query_api.responses import add_json, count_json, window_json
from query_api.service import CounterService, Identity, Written, identity_of, refused_by_record
from schemas import INT64_MAX, INT64_MIN, MutationOp, ValidationError, validate_counter_name

GET_COUNT, ADD_COUNT, ADD_AND_GET = b"/v1/GetCount", b"/v1/AddCount", b"/v1/AddAndGetCount"
FAST_PATHS = {GET_COUNT: "/v1/GetCount", ADD_COUNT: "/v1/AddCount",  # the path, and its metrics endpoint
              ADD_AND_GET: "/v1/AddAndGetCount"}
_GET_KEYS = frozenset({"namespace", "counter_name"})
_WINDOW_KEYS = frozenset({"namespace", "counter_name", "window"})
_WINDOW_SPEC_KEYS = frozenset({"last", "start", "end"})
_ADD_KEYS = frozenset({"namespace", "counter_name", "delta"})
_ADD_TOKEN_KEYS = frozenset({"namespace", "counter_name", "delta", "idempotency_token"})
_TOKEN_KEYS = frozenset({"token", "generation_time"})


FastCall = tuple[Awaitable[Any], Callable[[Any], bytes]]


def fast_call(service: CounterService, path: bytes, body: bytes) -> FastCall | None:
    """(service awaitable, render) answering this POST with a JSON body, or None to let the route decide."""
    try:
        req: Any = orjson.loads(body)
    except orjson.JSONDecodeError:  # or anything else orjson refuses (e.g. integers beyond 64 bits)
        return None
    if not isinstance(req, dict) or not isinstance(req.get("namespace"), str):
        return None
    ns = service.registry.get(req["namespace"])
    if ns is None or ns.requires_auth or ns.unique is not None:  # UNIQUE: estimates and items, on the routes
        return None
    counter: Any = req.get("counter_name")  # request JSON: a str once validated below
    try:
        validate_counter_name(counter)
    except ValidationError:
        return None
    if path == GET_COUNT:
        keys = req.keys()
        if keys == _GET_KEYS:
            return service.get(ns, counter), count_json
        window = req.get("window")
        if (keys == _WINDOW_KEYS and type(window) is dict and window and window.keys() <= _WINDOW_SPEC_KEYS
                and all(type(v) is str for v in window.values())):  # the plain case; the route judges the rest
            return service.get_window(ns, counter, window), window_json
        return None
    delta = req.get("delta")
    if type(delta) is not int or not INT64_MIN <= delta <= INT64_MAX:
        return None
    if ns.counter_type is CounterType.BEST_EFFORT:
        if path != ADD_COUNT or req.keys() != _ADD_KEYS:
            return None
        return service.add_best_effort(ns, counter, delta), partial(_added, ns, counter)
    return _durable(service, ns, path, req, counter, delta)


def _durable(service: CounterService, ns: Namespace, path: bytes, req: dict[str, Any], counter: str,
             delta: int) -> FastCall | None:
    """EVENTUAL/ACCURATE AddCount (answered from the group commit's acknowledgement, in a callback) and
    AddAndGetCount (a task: it waits for the event to be persisted)."""
    if not req.keys() <= _ADD_TOKEN_KEYS:
        return None
    token = req.get("idempotency_token")
    if token is not None and not (type(token) is dict and token.keys() <= _TOKEN_KEYS
                                  and type(token.get("token")) is str):
        return None
    try:
        written, acknowledged = service.write_durable(  # ignore below: a checked token dict is never falsy
            ns, counter, delta, MutationOp.ADD, token and token["token"], token and token.get("generation_time"),  # type: ignore[arg-type]
            then_count=path != ADD_COUNT)
    except ValidationError:  # nothing was sent: the route answers with the field named
        return None
    if path == ADD_COUNT:  # answered from the acknowledgement: checked against the accept_limit as the route does
        token, event_time = written.token, written.event_time
        assert token is not None and event_time is not None, "a durable write has its token and time"
        return service.late_checked(acknowledged, ns, event_time, token), _WrittenAnswer(written)
    return service.count_after(written, acknowledged), count_json


class _WrittenAnswer:
    """Renders a durable AddCount's answer once its record is acknowledged. It carries the write's `identity` for
    the answer of a failure (query_api.responses.error_response): the record's failure is shared by its writes."""

    __slots__ = ("written",)

    def __init__(self, written: Written) -> None:
        self.written = written

    def __call__(self, stamp_us: int | None) -> bytes:
        w = self.written
        if stamp_us is not None:  # the record's timestamp disagreed with this process's clock: judged by it
            assert w.token is not None and w.event_time is not None, "a durable write has its token and time"
            if refused := refused_by_record(w.ns, w.token, w.event_time, stamp_us):
                raise refused
        return add_json(w)

    @property
    def identity(self) -> Identity | None:
        return identity_of(self.written)


_ADDED: dict[tuple[str, str], bytes] = {}  # BEST_EFFORT AddCount bodies: they do not depend on the count


def _added(ns: Namespace, counter: str, value: int) -> bytes:
    key = (ns.name, counter)
    body = _ADDED.get(key)
    if body is None:
        if len(_ADDED) >= 100_000:
            _ADDED.clear()
        body = _ADDED[key] = add_json(Written(ns, counter, None, None, value))  # as service.write's result
    return body
