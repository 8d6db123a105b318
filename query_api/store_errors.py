"""Pure ASGI middleware: a route whose store is away answers 503, not 500.

Why a middleware rather than exception handlers: the errors that say a store is away are sqlite3's and
cassandra-driver's, judged by class and code (sinks.store_unavailable), and Starlette finds handlers by class only;
a handler for `Exception` runs outside the app's middleware and re-raises after answering. The fast paths answer
the same errors the same way (query_api.http_protocol, query_api.responses.error_response).
"""

from __future__ import annotations

import logging
import time

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from query_api.responses import error_response
from sinks import store_unavailable

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0  # during an outage every request fails alike: a line now and then, not one each


class StoreErrors:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._logged = -LOG_EVERY_S

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started or not store_unavailable(exc):
                raise
            if time.monotonic() - self._logged >= LOG_EVERY_S:
                self._logged = time.monotonic()
                log.warning("%s %s answered 503, the store is unavailable (said at most every %gs): %r",
                            scope["method"], scope["path"], LOG_EVERY_S, exc)
            status, body = error_response(exc)
            payload = orjson.dumps(body)
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
