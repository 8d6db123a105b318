"""The HTTP service: AddCount, AddAndGetCount, GetCount, ClearCount (+ batch forms) over FastAPI.

Request bodies are exactly the Netflix post's. Errors: 404 unknown namespace, 422 invalid body (naming the
field), 401/403 API keys, 503 broker or (BEST_EFFORT) memcached unreachable, 504 read-your-write timeout.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane import CounterType, Namespace, load_namespaces
from control_plane import default_config_path as default_namespaces
from producers.asyncio_producer import AsyncProducer
from producers.group_commit import GroupCommitProducer
from query_api import metrics
from query_api.models import (
    AddCountRequest,
    AddCountResponse,
    BatchAddCountRequest,
    BatchAddCountResponse,
    BatchGetCountRequest,
    BatchGetCountResponse,
    ClearCountRequest,
    CountResponse,
    ErrorResponse,
    GetCountRequest,
)
from query_api.responses import SERVICE_ERRORS, add_response, count_response, error_response
from query_api.service import (
    CounterService,
    Written,
)
from query_api.signals import ReadSignals
from schemas import MutationOp
from sinks import open_cache, open_namespace_stores
from sinks.best_effort import open_counters
from streams.settings import Settings, load_settings
from streams.signals import SignalSender

ERRORS = {401: {"model": ErrorResponse}, 403: {"model": ErrorResponse}, 404: {"model": ErrorResponse},
          422: {"description": "invalid body; the detail names the field"},
          503: {"model": ErrorResponse}}


class Forbidden(Exception):
    def __init__(self, status: int, detail: str) -> None:
        self.status = status
        self.detail = detail


async def api_key(x_api_key: Annotated[str | None, Header()] = None,
            authorization: Annotated[str | None, Header()] = None) -> str | None:
    """The caller's key: `X-API-Key: <key>` or `Authorization: Bearer <key>` (async: no thread hop)."""
    if x_api_key:
        return x_api_key
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def authorize(ns: Namespace, key: str | None, *scopes: str) -> None:
    if not ns.requires_auth:
        return
    if not key or not any(ns.allows(key, s) for s in ("read", "write")):
        raise Forbidden(401, f"namespace {ns.name!r} requires an API key (X-API-Key header)")
    missing = [s for s in scopes if not ns.allows(key, s)]
    if missing:
        raise Forbidden(403, f"this API key lacks the {'/'.join(missing)} scope for namespace {ns.name!r}")


def build_service(settings: Settings) -> CounterService:
    registry = load_namespaces(settings.namespaces or default_namespaces())

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    events, rollups, _buckets = open_namespace_stores(settings.store, settings.data_dir, registry)
    cache_spec = settings.cache if settings.cache.startswith("memcached://") else None
    kafka = AsyncProducer(settings.kafka_bootstrap or "", client_id="counter-api", timeout_s=5.0)
    producer = GroupCommitProducer(kafka, topic=settings.mutations_topic)
    signals = ReadSignals(SignalSender(kafka, settings.rollups_topic))
    return CounterService(
        registry, producer=producer, signals=signals,
        events=events, rollups=rollups, counters=open_counters(cache_spec),
        read_signal_lag_s=settings.read_signal_lag_s,
        # An in-process cache cannot see the worker's rollups: keep its entries short-lived.
        cache=open_cache(cache_spec, default_ttl_s=None if cache_spec else 1.0))


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API; services are built at start-up from COUNTER_* settings (or the given ones)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        s = settings or load_settings()
        if not s.kafka_bootstrap:
            raise RuntimeError("COUNTER_KAFKA_BOOTSTRAP must be set for the API (counter up sets it)")
        app.state.settings = s
        service = app.state.service = build_service(s)
        await service.producer.start()  # starts the shared AsyncProducer
        await service.signals.start()
        # Everything built so far lives as long as the process: keep it out of the collector's scans, or a
        # full collection of the imported frameworks' objects stalls every request in flight (tail latency).
        gc.collect()
        gc.freeze()
        yield {"service": service}  # lifespan state: what query_api.http_protocol serves the fast path with
        await service.producer.stop()
        await service.producer.kafka.stop()
        await service.events.close()
        await service.rollups.close()
        await service.cache.close()
        await service.counters.close()

    app = FastAPI(title="Counter Abstraction", version="1", lifespan=lifespan,
                  description="Distributed counters (BEST_EFFORT, EVENTUAL, ACCURATE) with idempotent writes, "
                              "after Netflix's Distributed Counter Abstraction.")
    _install_middleware(app)
    _install_handlers(app)
    _install_routes(app)
    return app


async def svc(request: Request) -> CounterService:
    return request.app.state.service


Service = Annotated[CounterService, Depends(svc)]
CallerKey = Annotated[str | None, Depends(api_key)]


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
            endpoint = path if path.startswith("/v1/") else "other"
            metrics.record(endpoint, status, time.perf_counter() - started)


def _install_middleware(app: FastAPI) -> None:
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
            return JSONResponse({"detail": [{"loc": ["body"], "msg": f"invalid body: {exc.detail}",
                                             "type": "json_invalid"}]}, status_code=422)
        return await http_exception_handler(request, exc)

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Forbidden, forbidden)


def _install_routes(app: FastAPI) -> None:
    @app.post("/v1/AddCount", response_model=AddCountResponse, responses=ERRORS)
    async def add_count(body: AddCountRequest, service: Service, key: CallerKey) -> AddCountResponse:
        """Adjust a counter by `delta` (positive or negative). Durable once answered (rolled-up types)."""
        ns = service.namespace(body.namespace)
        authorize(ns, key, "write")
        token = body.idempotency_token
        return add_response(await service.write(ns, body.counter_name, body.delta, MutationOp.ADD,
                                                token.token if token else None,
                                                token.generation_time if token else None, body.event_item_key))

    @app.post("/v1/AddAndGetCount", response_model=CountResponse,
              responses={**ERRORS, 504: {"model": ErrorResponse}})
    async def add_and_get_count(body: AddCountRequest, service: Service, key: CallerKey) -> CountResponse:
        """AddCount, then the count including this delta (read-your-write), or 504 after a bounded wait."""
        ns = service.namespace(body.namespace)
        authorize(ns, key, "write", "read")
        token = body.idempotency_token
        return count_response(await service.add_and_get(ns, body.counter_name, body.delta,
                                                         token.token if token else None,
                                                         token.generation_time if token else None,
                                                         body.event_item_key))

    @app.post("/v1/GetCount", response_model=CountResponse, responses=ERRORS)
    async def get_count(body: GetCountRequest, service: Service, key: CallerKey) -> CountResponse:
        """The count: EVENTUAL the cached rollup (`as_of` its timestamp), ACCURATE rollup + live delta."""
        ns = service.namespace(body.namespace)
        authorize(ns, key, "read")
        return count_response(await service.get(ns, body.counter_name))

    @app.post("/v1/ClearCount", response_model=AddCountResponse, responses=ERRORS)
    async def clear_count(body: ClearCountRequest, service: Service, key: CallerKey) -> AddCountResponse:
        """Reset a counter to 0 as of the token's generation_time (an idempotent event like any other)."""
        ns = service.namespace(body.namespace)
        authorize(ns, key, "write")
        token = body.idempotency_token
        return add_response(await service.write(ns, body.counter_name, 0, MutationOp.CLEAR,
                                                token.token if token else None,
                                                token.generation_time if token else None))

    @app.post("/v1/BatchAddCount", response_model=BatchAddCountResponse, responses=ERRORS)
    async def batch_add_count(body: BatchAddCountRequest, service: Service, key: CallerKey) -> BatchAddCountResponse:
        """Many AddCounts in one call: all validated first (nothing is sent if any is refused)."""
        namespaces = [service.namespace(r.namespace) for r in body.requests]
        for ns in {n.name: n for n in namespaces}.values():
            authorize(ns, key, "write")
        prepared, durable = [], []
        for r, ns in zip(body.requests, namespaces, strict=True):
            if ns.counter_type is CounterType.BEST_EFFORT:
                prepared.append((r, ns, None))
                continue
            t = r.idempotency_token
            m = service.mutation(ns, r.counter_name, r.delta, MutationOp.ADD, t.token if t else None,
                                 t.generation_time if t else None, r.event_item_key)
            prepared.append((r, ns, m))
            durable.append(m)
        if durable:
            await service.send_durably(durable)
        results = []
        for r, ns, m in prepared:
            if m is None:
                results.append(add_response(await service.write(ns, r.counter_name, r.delta, MutationOp.ADD,
                                                                None, None)))
            else:
                results.append(add_response(Written(ns, r.counter_name, m.event_id, m.event_time)))
        return BatchAddCountResponse(results=results)

    @app.post("/v1/BatchGetCount", response_model=BatchGetCountResponse, responses=ERRORS)
    async def batch_get_count(body: BatchGetCountRequest, service: Service, key: CallerKey) -> BatchGetCountResponse:
        """Many GetCounts in one call."""
        namespaces = [service.namespace(r.namespace) for r in body.requests]
        for ns in {n.name: n for n in namespaces}.values():
            authorize(ns, key, "read")
        counts = [await service.get(ns, r.counter_name) for r, ns in zip(body.requests, namespaces, strict=True)]
        return BatchGetCountResponse(results=[count_response(c) for c in counts])

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "a dependency is unreachable"}})
    async def readyz(service: Service) -> JSONResponse:
        """Broker, store and cache reachable."""
        checks = {"broker": await _check_async(service.producer.kafka.ping(1.0)),
                  "store": await _check_async(service.rollups.get("_readyz", "_readyz")),
                  "cache": "ok" if await service.cache.healthy() else "unreachable",
                  "best_effort_counters": "ok" if await service.counters.healthy() else "unreachable"}
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def prometheus() -> Response:
        """Prometheus metrics: requests and latency per endpoint, cache hit ratio."""
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)


async def _check_async(coro) -> str:  # type: ignore[no-untyped-def]
    try:
        await asyncio.wait_for(coro, 2.0)
        return "ok"
    except Exception as exc:
        return f"unreachable: {exc}"
