"""Read-only views for operators and the web UI: namespaces and their configuration, a namespace's counters, a
counter's newest events (its audit log), and pipeline health. Same API keys as the counting calls (a namespace
with keys needs the read scope); nothing here writes.

GETs with query parameters rather than the POST bodies of the Netflix calls: these are pages a browser (and
curl) fetches and caches like any resource.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from control_plane import CounterType, Namespace
from query_api.audit_log import BadCursor, decode_cursor, encode_cursor, newest_events
from query_api.dependencies import ERRORS, CallerKey, Service, authorize
from query_api.inspect_models import (
    AuditEntry,
    AuditResponse,
    CountersResponse,
    NamespaceInfo,
    NamespacesResponse,
    PipelineHealthResponse,
)
from query_api.namespace_info import namespace_config
from query_api.pipeline_health import PipelineHealth, render
from schemas import ValidationError, validate_counter_name
from schemas.validation import utc_datetime


def _per_caller(response: Response) -> None:
    """What these views show depends on the caller's API key: a shared cache (a proxy in front of the API) must not
    keep one caller's answer for another (a review: they carried no Cache-Control nor Vary)."""
    response.headers["Cache-Control"] = "private"
    response.headers["Vary"] = "X-API-Key, Authorization"


router = APIRouter(prefix="/v1", tags=["operations"], dependencies=[Depends(_per_caller)])

MAX_PAGE = 200


def _info(ns: Namespace, key: str | None) -> NamespaceInfo:
    readable = ns.allows(key, "read")
    valid = ns.requires_auth and any(ns.allows(key, scope) for scope in ("read", "write"))  # as authorize() judges
    return NamespaceInfo(name=ns.name, counter_type=ns.counter_type.value, requires_key=ns.requires_auth,
                         readable=readable, key_valid=valid, config=namespace_config(ns) if readable else None)


def _unprocessable(field: str, message: str, *, where: str = "query") -> JSONResponse:
    """A 422 as FastAPI words one: `where` the field is, "query" or "path" (the namespace: a review read it as a
    query parameter)."""
    return JSONResponse({"detail": [{"loc": [where, field], "msg": message, "type": "value_error"}]},
                        status_code=422)


@router.get("/namespaces", response_model=NamespacesResponse)
async def list_namespaces(service: Service, key: CallerKey) -> NamespacesResponse:
    """Every configured namespace with its type; its configuration (never its API keys) when the caller may read
    it (a namespace with keys needs a key with the read scope)."""
    return NamespacesResponse(namespaces=[_info(ns, key) for ns in service.registry.values()])


@router.get("/namespaces/{namespace}", response_model=NamespaceInfo, responses=ERRORS)
async def get_namespace(namespace: str, service: Service, key: CallerKey) -> NamespaceInfo:
    """One namespace's type and configuration (401/403 without a read key where it has keys)."""
    ns = service.namespace(namespace)
    authorize(ns, key, "read")
    return _info(ns, key)


PAGES_PER_CALL = 8  # store pages one call reads at most while they hold only combinations
PAST_COMBINATIONS = " \U0010ffff"  # after "<counter>" + this: past every "<counter> k=v..." (UTF-8 byte order)
"""A counter with a thousand combinations filled ten pages of nothing but them: the UI's "more counters" showed
nothing, click after click (a review)."""


@router.get("/namespaces/{namespace}/counters", response_model=CountersResponse, responses=ERRORS)
async def list_counters(namespace: str, service: Service, key: CallerKey,
                        after: Annotated[str | None, Query(max_length=1024)] = None,
                        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100) -> CountersResponse:
    """A page of the namespace's counters that have stored events, by name (EVENTUAL and ACCURATE; BEST_EFFORT
    keeps no events: an empty list). Dimension combinations (`views country=US`) are left out: they are reached
    through their counter."""
    ns = service.namespace(namespace)
    authorize(ns, key, "read")
    if ns.counter_type is CounterType.BEST_EFFORT:
        return CountersResponse(namespace=ns.name, counters=[], next_after=None)
    names: list[str] = []
    cursor = after
    for _ in range(PAGES_PER_CALL):
        page = await service.events.counters(ns.name, after=cursor, limit=limit)
        # user counter names never hold whitespace (validate_counter_name): a name with a space is a combination
        names += [c for c in page if " " not in c]
        if len(names) >= limit:  # a full page (a review: 3 of 4 counters with limit=10, read as the last page)
            names = names[:limit]
            return CountersResponse(namespace=ns.name, counters=names, next_after=names[-1] + PAST_COMBINATIONS)
        if len(page) < limit:
            return CountersResponse(namespace=ns.name, counters=names, next_after=None)
        cursor = page[-1]
        if " " in cursor:  # past the rest of that counter's combinations: they all start "<counter> "
            cursor = cursor.split(" ", 1)[0] + PAST_COMBINATIONS
    return CountersResponse(namespace=ns.name, counters=names, next_after=cursor)


@router.get("/namespaces/{namespace}/audit", response_model=AuditResponse,
            responses={**ERRORS, 422: {"description": "invalid parameter, or a namespace that keeps no events"}})
async def audit_log(namespace: str, service: Service, key: CallerKey,
                    counter_name: Annotated[str, Query(max_length=1024)],
                    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
                    before: Annotated[str | None, Query(max_length=2048)] = None) -> Any:
    """A counter's newest stored events (every increment and clear with its token and time), newest first;
    `before` (the previous page's `next_before`) pages back. Events past the namespace's retention are gone."""
    ns = service.namespace(namespace)
    authorize(ns, key, "read")
    try:
        counter = validate_counter_name(counter_name)
    except ValidationError as exc:
        return _unprocessable("counter_name", exc.reason)
    if ns.counter_type is CounterType.BEST_EFFORT:
        return _unprocessable("namespace", f"namespace {ns.name!r} is BEST_EFFORT: it keeps no events", where="path")
    try:
        cursor = decode_cursor(before) if before else None
    except BadCursor as exc:
        return _unprocessable("before", str(exc))
    rows, more = await newest_events(service.events, ns, counter, limit=limit, before=cursor,
                                     now_us=time.time_ns() // 1000)
    entries = [AuditEntry(event_time=utc_datetime(r[2]), token=r[3], item_key=r[4],
                          delta=r[5], clear=bool(r[6])) for r in rows]
    return AuditResponse(namespace=ns.name, counter_name=counter, entries=entries,
                         next_before=encode_cursor(rows[-1]) if more and rows else None)


@router.get("/pipeline", response_model=PipelineHealthResponse)
async def pipeline_health(request: Request, service: Service, key: CallerKey) -> Any:
    """Pipeline health from shared state and the broker: persist watermark lag per partition, rollups pending per
    namespace and their lag, the rollup queue's depth, the DLQ's size and newest dead letters with their reasons,
    and ingest and request rates. Figures are refreshed at most every two seconds. A dead letter's reason, key and
    record are hidden unless the caller may read every namespace its record names (every namespace, when it does
    not decode)."""
    health: PipelineHealth = request.app.state.health  # set by the lifespan
    snapshot = await health.snapshot()

    def can_read(name: str) -> bool:
        ns = service.registry.get(name)
        return ns is None or ns.allows(key, "read")

    return render(snapshot, service.registry, health.settings, can_read)
