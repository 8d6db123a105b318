"""A fast path for the hottest calls: a plain, valid GetCount or BEST_EFFORT AddCount.

FastAPI's dependency injection and model validation cost most of a cached GetCount. A plain Starlette route,
matched before the FastAPI one, serves the common case with the same service methods and response models
and hands everything else (API keys, unknown namespaces, anything invalid or unusual) to the FastAPI route,
body replayed, so errors and edge cases have exactly one implementation. Exceptions still reach the app's
exception handlers, since routes run inside them.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from control_plane import CounterType
from query_api.responses import add_response, count_response
from query_api.service import CounterService
from schemas import INT64_MAX, INT64_MIN, MutationOp, ValidationError, validate_counter_name

_GET_KEYS = frozenset({"namespace", "counter_name"})
_ADD_KEYS = frozenset({"namespace", "counter_name", "delta"})
_HEADERS = [(b"content-type", b"application/json")]


FAST_PATHS = ("/v1/GetCount", "/v1/AddCount")


def install_fast_paths(app: FastAPI) -> None:
    """Put a FastRoute in front of each FastAPI route of FAST_PATHS (call after the routes exist)."""
    for path in FAST_PATHS:
        route = next(r for r in app.router.routes if isinstance(r, APIRoute) and r.path == path)
        app.router.routes.insert(0, Route(path, FastRoute(path, route), methods=["POST"], include_in_schema=False))


class FastRoute:
    def __init__(self, path: str, fallback: APIRoute) -> None:
        self.path = path
        self.fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read_body(receive)
        response = await self._serve(scope, self.path, body)
        if response is None:
            await self.fallback.handle(scope, _replay(body), send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_HEADERS, (b"content-length", str(len(response)).encode())]})
        await send({"type": "http.response.body", "body": response})

    async def _serve(self, scope: Scope, path: str, body: bytes) -> bytes | None:
        """The response body, or None to let the FastAPI route decide."""
        service: CounterService | None = getattr(scope["app"].state, "service", None)
        if service is None:
            return None
        try:
            req: Any = json.loads(body)
        except ValueError:
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
        if path == "/v1/GetCount":
            if req.keys() != _GET_KEYS:
                return None
            return count_response(await service.get(ns, counter)).model_dump_json().encode()
        delta = req.get("delta")
        if (req.keys() != _ADD_KEYS or ns.counter_type is not CounterType.BEST_EFFORT or type(delta) is not int
                or not INT64_MIN <= delta <= INT64_MAX):
            return None
        written = await service.write(ns, counter, delta, MutationOp.ADD, None, None)
        return add_response(written).model_dump_json().encode()


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}
    return receive
