"""The API's HTTP protocol: uvicorn's httptools protocol that serves the hottest calls straight from the parser.

Why: at concurrency 32 a cached GetCount spent about 60% of the event loop in ASGI plumbing (scope, receive
and send messages, middleware, routing) around a single memcached round trip. For a POST to one of
`fastpath.FAST_PATHS` this protocol keeps the body, asks `fastpath.fast_call` whether it is the plain case,
and if so runs that coroutine and writes the response itself. Anything else (other paths, API keys,
invalid bodies, pipelined requests behind a busy one, `Expect: 100-continue`) is replayed into uvicorn's own
request cycle unchanged, so the FastAPI app answers it as before.

Use it with `uvicorn.run(..., http=CounterHttpProtocol)` (what `python -m query_api` does).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Coroutine
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from query_api import metrics
from query_api.fastpath import FAST_PATHS, fast_call
from query_api.responses import SERVICE_ERRORS, error_response

log = logging.getLogger(__name__)

MAX_FAST_BODY = 16 * 1024  # larger bodies are not the plain case: hand them to the app as they arrive
_JSON = b"content-type: application/json\r\n"
_CLOSE = b"connection: close\r\n"


@functools.cache
def _metrics(path: bytes, status: int) -> tuple[Any, Any]:
    """The request counter and latency histogram of (endpoint, status), looked up once."""
    endpoint = path.decode()
    return metrics.REQUESTS.labels(endpoint, str(status)), metrics.LATENCY.labels(endpoint)


class _Noop:
    def set(self) -> None:
        pass


class FastCycle:
    """The state uvicorn's protocol reads from `self.cycle` while a fast request is in flight.

    While `response_complete` is False uvicorn queues any pipelined request behind it; `shutdown()` clears
    `keep_alive`; `connection_lost` sets `disconnected` and pokes `message_event`.
    """

    __slots__ = ("disconnected", "keep_alive", "message_event", "response_complete")

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.disconnected = False
        self.response_complete = False
        self.message_event = _Noop()


class CounterHttpProtocol(HttpToolsProtocol):
    _fast_body: bytearray | None = None

    # -- httptools parser callbacks ---------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        idle = (self.cycle is None or self.cycle.response_complete) and not self.pipeline
        if (idle and self.url in FAST_PATHS and not self.expect_100_continue and self.limit_concurrency is None
                and self.parser.get_method() == b"POST" and self.app_state.get("service") is not None):
            self._fast_body = bytearray()
            return
        self._fast_body = None
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._fast_body is None:
            super().on_body(body)
            return
        self._fast_body += body
        if len(self._fast_body) > MAX_FAST_BODY:
            self._to_app(bytes(self._fast_body))

    def on_message_complete(self) -> None:
        if self._fast_body is None:
            super().on_message_complete()
            return
        body, self._fast_body = bytes(self._fast_body), None
        call = fast_call(self.app_state["service"], self.url, body)
        if call is None:
            self._to_app(body)
            super().on_message_complete()
            return
        keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        self.cycle = cycle = FastCycle(keep_alive)  # type: ignore[assignment]
        task = self.loop.create_task(self._serve(cycle, self.url, call))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    # -- internals --------------------------------------------------------------------------------------

    def _to_app(self, body: bytes) -> None:
        """Hand the request so far (headers, and the body read until now) to uvicorn's own cycle: the FastAPI
        app answers it."""
        self._fast_body = None
        super().on_headers_complete()
        if body:
            super().on_body(body)

    async def _serve(self, cycle: FastCycle, path: bytes, call: Coroutine[Any, Any, bytes]) -> None:
        started = time.perf_counter()
        try:
            status, body = 200, await call
        except SERVICE_ERRORS as exc:
            status, detail = error_response(exc)
            body = orjson.dumps(detail)  # compact, like the app's JSONResponse
        except Exception:
            log.exception("fast path %s failed", path.decode())
            status, body = 500, b'{"detail":"Internal Server Error"}'
        self._respond(cycle, status, body)
        requests, latency = _metrics(path, status)
        requests.inc()
        latency.observe(time.perf_counter() - started)

    def _respond(self, cycle: FastCycle, status: int, body: bytes) -> None:
        cycle.response_complete = True
        if cycle.disconnected or self.transport.is_closing():
            return
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [_JSON, b"content-length: %d\r\n" % len(body)]
        if not cycle.keep_alive:
            head.append(_CLOSE)
        head += [b"\r\n", body]
        self.transport.write(b"".join(head))
        if not cycle.keep_alive:
            self.transport.close()
        self.on_response_complete()  # uvicorn: count it; then the next pipelined request or the keep-alive timer
