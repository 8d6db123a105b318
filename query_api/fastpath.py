"""The hottest calls, decided without the framework: a plain, valid GetCount or BEST_EFFORT AddCount.

FastAPI's routing, dependency injection and model validation cost most of a cached GetCount. `fast_call`
recognises the common case (known namespace without API keys, exactly the expected fields, valid values)
and returns the coroutine that serves it with the same service methods and response bodies; for anything
else it returns None and the request goes to the FastAPI route, so errors and edge cases have exactly one
implementation. `query_api.http_protocol` calls it straight from the HTTP parser.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import orjson

from control_plane import CounterType, Namespace
from query_api.responses import add_json, count_json
from query_api.service import CounterService
from schemas import INT64_MAX, INT64_MIN, MutationOp, ValidationError, validate_counter_name

GET_COUNT, ADD_COUNT = b"/v1/GetCount", b"/v1/AddCount"
FAST_PATHS = frozenset({GET_COUNT, ADD_COUNT})
_GET_KEYS = frozenset({"namespace", "counter_name"})
_ADD_KEYS = frozenset({"namespace", "counter_name", "delta"})


def fast_call(service: CounterService, path: bytes, body: bytes) -> Coroutine[Any, Any, bytes] | None:
    """The coroutine answering this POST with a JSON body, or None to let the FastAPI route decide."""
    try:
        req: Any = orjson.loads(body)
    except orjson.JSONDecodeError:  # or anything else orjson refuses (e.g. integers beyond 64 bits)
        return None
    if not isinstance(req, dict) or not isinstance(req.get("namespace"), str):
        return None
    ns = service.registry.get(req["namespace"])
    if ns is None or ns.requires_auth:
        return None
    counter = req.get("counter_name")
    try:
        validate_counter_name(counter)
    except ValidationError:
        return None
    if path == GET_COUNT:
        return _get(service, ns, counter) if req.keys() == _GET_KEYS else None
    delta = req.get("delta")
    if (path != ADD_COUNT or req.keys() != _ADD_KEYS or ns.counter_type is not CounterType.BEST_EFFORT
            or type(delta) is not int or not INT64_MIN <= delta <= INT64_MAX):
        return None
    return _add(service, ns, counter, delta)


async def _get(service: CounterService, ns: Namespace, counter: str) -> bytes:
    return count_json(await service.get(ns, counter))


async def _add(service: CounterService, ns: Namespace, counter: str, delta: int) -> bytes:
    written = await service.write(ns, counter, delta, MutationOp.ADD, None, None)
    return add_json(written)
