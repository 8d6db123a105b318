"""The HTTP service: AddCount, AddAndGetCount, GetCount, ClearCount (+ batch forms, GetCountSeries) over FastAPI.

This module builds the service and the app (lifespan, middleware, error handlers); the routes live in
`query_api/routes/` by concern, their dependencies in `query_api/dependencies.py`.

Request bodies are exactly the Netflix post's. Errors: 404 unknown namespace, 422 invalid body (naming the
field), 401/403 API keys, 503 broker or (BEST_EFFORT) memcached unreachable, 504 read-your-write timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane import default_config_path as default_namespaces
from control_plane import load_namespaces
from infra.heap import freeze_startup_heap
from producers.asyncio_producer import AsyncProducer
from producers.group_commit import GroupCommitProducer
from query_api import metrics
from query_api.broker_offsets import BrokerOffsets
from query_api.dependencies import Forbidden
from query_api.persist_progress import PersistProgress
from query_api.pipeline_health import PipelineHealth
from query_api.responses import SERVICE_ERRORS, error_response
from query_api.routes import inspect, ops, reads, ui, writes
from query_api.service import CounterService, broker_timeout_s
from query_api.signals import ReadSignals
from query_api.store_errors import StoreErrors
from sinks import open_cache, open_namespace_sketch_store, open_namespace_stores, store_location
from sinks.best_effort import open_counters
from streams.settings import Settings, api_start_problems, load_settings
from streams.signals import SignalSender
from streams.store_binding import BindingWatch, StoreMismatch

log = logging.getLogger(__name__)


def build_service(settings: Settings) -> CounterService:
    registry = load_namespaces(settings.namespaces or default_namespaces())

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # A call waits for another process's SQLite lock (a worker's batch, a recount) as long as for the broker, not the
    # minutes the worker's stores wait out: reads never wait (WAL), and the API's one write, AddAndGetCount's own
    # event, is then left to the worker (the call answers as for a lagging worker: a 504, durable, within seconds).
    wait_s = broker_timeout_s(registry)
    events, rollups, buckets = open_namespace_stores(settings.store, settings.data_dir, registry, lock_wait_s=wait_s)
    unique = any(ns.counts_unique for ns in registry.values())
    sketches = open_namespace_sketch_store(buckets, registry, lock_wait_s=wait_s) if unique else None  # unique counts
    cache_spec = settings.cache if settings.cache.startswith("memcached://") else None
    if problems := api_start_problems(settings, registry, in_process_cache=not cache_spec):
        raise RuntimeError("; ".join(problems))
    security = settings.kafka_security.librdkafka()  # of every Kafka client (streams.kafka_security)
    kafka = AsyncProducer(settings.kafka_bootstrap or "", client_id="counter-api", timeout_s=wait_s, config=security)
    producer = GroupCommitProducer(kafka, topic=settings.mutations_topic, observer=metrics.GROUP_COMMIT,
                                   hold_max_s=settings.api_group_commit_hold_ms / 1000)
    signals = ReadSignals(SignalSender(kafka, settings.rollups_topic))
    progress = PersistProgress(producer, BrokerOffsets(kafka.bootstrap, client_id="counter-api-progress",
                                                            config=security),
                               group=f"{settings.worker_id}.persist")
    return CounterService(
        registry, producer=producer, signals=signals, progress=progress,
        events=events, rollups=rollups, buckets=buckets, sketches=sketches, counters=open_counters(cache_spec),
        read_signal_lag_s=settings.read_signal_lag_s, shared_pipeline=settings.api_shared,
        # An in-process cache cannot see the worker's rollups: its entries live a second at most.
        cache=open_cache(cache_spec, local_max_ttl_s=1.0, key_prefix=settings.worker_id, scope=rollups.identity))


async def watch_binding(binding: BindingWatch, every_s: float) -> None:
    """Read the store binding again every `every_s`: an API whose deployment moved to another store (`counter store
    rebind`) answers from counts no worker keeps any more. It says so in its log and in /readyz (503, so that a load
    balancer stops sending it requests) until it is restarted on that store; its writes still reach the workers."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await binding.check()
        except StoreMismatch as exc:
            log.error("%s", exc)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API; services are built at start-up from COUNTER_* settings (or the given ones)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, CounterService]]:
        s = settings or load_settings()
        if not s.kafka_bootstrap:
            raise RuntimeError("COUNTER_KAFKA_BOOTSTRAP must be set for the API (counter up sets it)")
        app.state.settings = s
        service = app.state.service = build_service(s)
        binding = app.state.binding = BindingWatch(s, await service.rollups.identity(),
                                                   store_location(s.store, s.data_dir))
        try:  # the consumer group's store: another one is no start (python -m query_api checked it first)
            await asyncio.to_thread(binding.bind, 5.0)
        except StoreMismatch:
            raise
        except Exception as exc:  # a broker away: reads are still served, and the watch binds once it answers
            log.warning("the store binding is not checked yet (%s: %s): it is, every %g s, once the broker answers",
                        type(exc).__name__, exc, s.store_binding_check_s)
        app.state.health = PipelineHealth(  # GET /v1/pipeline
            s, service.registry, service.rollups,
            caches={"cache": service.cache, "best_effort_counters": service.counters})
        await service.producer.start()  # starts the shared AsyncProducer
        await service.signals.start()
        if service.progress is not None:
            service.progress.start()
        await service.inherit_earlier_writes()  # the writes acknowledged before this process (a restart's)
        try:  # admission's floors before the first write; a store away now leaves them to follow_watermark
            await service.rolled.refresh(service.rollups, service.registry)
        except Exception as exc:
            log.warning("the namespaces' newest rollups not read at start: %s", exc)
        watermark = asyncio.create_task(service.follow_watermark(s.mutations_topic))
        watch = asyncio.create_task(watch_binding(binding, s.store_binding_check_s))
        freeze_startup_heap()  # everything built so far lives as long as the process (infra.heap)
        yield {"service": service}  # lifespan state: what query_api.http_protocol serves the fast path with
        watermark.cancel()
        watch.cancel()
        if service.progress is not None:
            await service.progress.stop()
        await service.producer.stop()
        await service.producer.kafka.stop()
        await app.state.health.close()
        await service.events.close()
        await service.rollups.close()
        if service.buckets is not None:
            await service.buckets.close()
        if service.sketches is not None:
            await service.sketches.close()
        await service.cache.close()
        await service.counters.close()

    # redirect_slashes off: `POST /v1/AddCount/` is a 404, not a 307 to /v1/AddCount, which `curl -d` (without -L)
    # shows as an empty success, exit 0 even with -f, while nothing was written; and whose Location Starlette builds
    # from the Host header and scheme this process sees (behind a TLS proxy: an http:// URL). The UI redirects its
    # own paths (query_api.routes.ui).
    app = FastAPI(title="Counter Abstraction", version="1", lifespan=lifespan, redirect_slashes=False,
                  description="Distributed counters (BEST_EFFORT, EVENTUAL, ACCURATE) with idempotent writes, "
                              "after Netflix's Distributed Counter Abstraction.")
    _install_middleware(app)
    _install_handlers(app)
    for router in (writes.router, reads.router, ops.router, inspect.router, ui.router):
        app.include_router(router)
    return app


class RequestMetrics:
    """Pure ASGI middleware: request count and latency per endpoint (BaseHTTPMiddleware costs far more)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            path = scope["path"]
            # a matched route's template (/v1/namespaces/{namespace}): one series per endpoint, not per namespace
            template = getattr(scope.get("route"), "path", None)
            # any other path is "other": a label per path a client makes up would grow the metrics without end
            endpoint = template if isinstance(template, str) and path.startswith("/v1/") else "other"
            metrics.record(endpoint, status, time.perf_counter() - started)


_JSON_TYPE = (b"content-type", b"application/json")


def is_json_type(value: bytes) -> bool:
    """Whether a Content-Type value is JSON as FastAPI reads it: application/json or application/*+json."""
    media = value.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


class JsonBodies:
    """Pure ASGI middleware: a request's body is read as JSON whatever its Content-Type says (none, text/plain,
    or the form type `curl -d` sends), as the fast paths read it (query_api.fastpath, query_api.plain_add).

    Why: FastAPI hands a body of another type to the request model as bytes and answers 422 "Input should be a
    valid dictionary", so the same write was counted when a fast path took it and refused when the route did (a
    body with dimensions, say). Refusing it on the fast paths too would break clients that work today."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = scope["headers"]
            types = [value for name, value in headers if name == b"content-type"]
            if len(types) != 1 or not is_json_type(types[0]):  # several: Starlette reads the first, whatever it is
                # In place, not in a copy: the router records the matched route in this scope, and RequestMetrics
                # (outside this middleware) reads it there to file the request under its endpoint; with a copy,
                # every such request was counted as "other".
                scope["headers"] = [h for h in headers if h[0] != b"content-type"] + [_JSON_TYPE]
        await self.app(scope, receive, send)


MAX_BODY_BYTES = 4 << 20  # a BatchAddCount of MAX_BATCH plain requests is a few hundred KiB


BODY_CHUNKS = "counter.body_chunks"  # scope key: the body as the routes read it, for an error that must point into it


class BodyLimit:
    """Pure ASGI middleware: a request body over `max_bytes` is answered 413, as soon as its Content-Length says
    so or its chunks pass the limit, instead of being read whole into memory (a 30 MB body took the API from 90
    to 243 MB, and its 422 echoed it back)."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((value for name, value in scope["headers"] if name == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await JSONResponse({"detail": self._message()}, status_code=413)(scope, receive, send)
            return
        seen = 0
        chunks: list[bytes] = []
        scope[BODY_CHUNKS] = chunks

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                seen += len(chunk)
                chunks.append(chunk)
                if seen > self.max_bytes:  # chunked: the route's error handling answers it (FastAPI re-raises it)
                    raise StarletteHTTPException(413, self._message())
            return message

        await self.app(scope, limited, send)

    def _message(self) -> str:
        return f"the request body is over {self.max_bytes} bytes"


LOC_PART_MAX = 256  # longer than any name or key a request may hold (a counter name is at most 200 bytes)


def huge_integer(body: bytes) -> tuple[list[str | int], int] | None:
    """(where, digits) of the first integer in a JSON body too long to be any count, or None.

    Python's JSON parser refuses an integer over 4,300 digits outright (the route answered "invalid body" without
    naming the field), so the body is read again with every integer over 20 characters, beyond int64, kept as text."""
    class Huge(str):
        pass

    def parse_int(text: str) -> int | Huge:
        return Huge(text) if len(text) > 20 else int(text)
    try:
        doc = json.loads(body, parse_int=parse_int)
    except (ValueError, RecursionError):
        return None
    todo: list[tuple[list[str | int], Any]] = [([], doc)]
    while todo:
        loc, node = todo.pop()
        if type(node) is Huge:
            return loc, len(node.lstrip("-"))
        if isinstance(node, dict):
            todo.extend(([*loc, k], v) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            todo.extend(([*loc, i], v) for i, v in reversed(list(enumerate(node))))
    return None


def body_problem(body: bytes, detail: str) -> str:
    """Why a body the route's parser refused is no JSON document, in words a client can act on (the parser's own
    `detail` said only "There was an error parsing the body")."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (f"invalid body: not UTF-8 text (byte {exc.start} is {body[exc.start]:#04x}); send JSON encoded as "
                "UTF-8")
    try:
        json.loads(text)
    except RecursionError:
        return "invalid body: its arrays or objects nest too deeply for a request"
    except ValueError as exc:
        return f"invalid body: not JSON ({exc})"
    return f"invalid body: {detail}"


def _safe_error(error: Mapping[str, Any]) -> dict[str, Any]:
    """A validation error's loc, msg and type, as text any JSON encoder takes (a key may hold a lone surrogate), each
    part cut to LOC_PART_MAX characters (an unknown key of 20 KB was answered whole: a review)."""
    def text(value: object) -> object:
        if not isinstance(value, str):
            return value
        value = value if len(value) <= LOC_PART_MAX else value[:LOC_PART_MAX] + "..."
        return value.encode("utf-8", "backslashreplace").decode()
    msg = str(error.get("msg", ""))
    if error.get("type") == "value_error":  # pydantic's prefix for a validator's own words, which other 422s lack
        msg = msg.removeprefix("Value error, ")
    return {"loc": [text(part) for part in error.get("loc", ())], "msg": text(msg),
            "type": text(str(error.get("type", "")))}


def _install_middleware(app: FastAPI) -> None:
    app.add_middleware(StoreErrors)  # innermost (Starlette runs the last added first): metrics see its 503
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit)
    app.add_middleware(RequestMetrics)


def _install_handlers(app: FastAPI) -> None:
    async def service_error(_request: Request, exc: Exception) -> JSONResponse:
        status, body = error_response(exc)
        return JSONResponse(body, status_code=status)

    for error in SERVICE_ERRORS:
        app.add_exception_handler(error, service_error)

    async def forbidden(_request: Request, exc: Forbidden) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400:  # an unparseable body (e.g. not UTF-8): invalid input, answered like the rest
            body = b"".join(request.scope.get(BODY_CHUNKS, ()))
            huge = huge_integer(body)
            if huge is not None:  # past Python's 4,300 digits, the parser refuses it before a model can name it
                loc, digits = huge
                return JSONResponse({"detail": [_safe_error({
                    "loc": ["body", *loc], "type": "int_parsing",
                    "msg": f"must fit in a signed 64-bit integer, got an integer of {digits} digits"})]},
                    status_code=422)
            return JSONResponse({"detail": [_safe_error({"loc": ["body"], "msg": body_problem(body, str(exc.detail)),
                                                         "type": "json_invalid"})]}, status_code=422)
        return await http_exception_handler(request, exc)

    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's 422, without the input it echoes: a body holding 1e999, NaN or a lone surrogate escape is
        valid JSON to the parser but not to the response encoder (it answered 500), and a huge body was echoed."""
        return JSONResponse({"detail": [_safe_error(e) for e in exc.errors()]}, status_code=422)

    # Starlette types a handler as taking any Exception; it calls each with the class it is registered for
    app.add_exception_handler(RequestValidationError, invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Forbidden, forbidden)  # type: ignore[arg-type]
