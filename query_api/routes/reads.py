"""GetCount (the total, or a time window), BatchGetCount and GetCountSeries."""

from __future__ import annotations

from fastapi import APIRouter

from query_api.dependencies import ERRORS, CallerKey, Service, authorize
from query_api.models import (
    BatchGetCountRequest,
    BatchGetCountResponse,
    CountResponse,
    GetCountRequest,
    GetCountSeriesRequest,
    SeriesResponse,
    WindowCountResponse,
)
from query_api.responses import count_response, series_response, window_response

router = APIRouter(prefix="/v1", tags=["reads"])


@router.post("/GetCount", response_model=CountResponse | WindowCountResponse, responses=ERRORS)
async def get_count(body: GetCountRequest, service: Service, key: CallerKey) -> CountResponse | WindowCountResponse:
    """The count: EVENTUAL the cached rollup (`as_of` its timestamp), ACCURATE rollup + live delta. With a
    `window`, the count of that window (`{"last": "1h"}` or `{"start", "end"}`), answered from the coarsest
    buckets that tile it; ACCURATE adds the window's live events."""
    ns = service.namespace(body.namespace)
    authorize(ns, key, "read")
    if body.window is not None:
        return window_response(await service.get_window(ns, body.counter_name, body.window.as_spec()))
    return count_response(await service.get(ns, body.counter_name))


@router.post("/BatchGetCount", response_model=BatchGetCountResponse, responses=ERRORS)
async def batch_get_count(body: BatchGetCountRequest, service: Service, key: CallerKey) -> BatchGetCountResponse:
    """Many GetCounts of totals in one call."""
    namespaces = [service.namespace(r.namespace) for r in body.requests]
    for ns in {n.name: n for n in namespaces}.values():
        authorize(ns, key, "read")
    counts = [await service.get(ns, r.counter_name) for r, ns in zip(body.requests, namespaces, strict=True)]
    return BatchGetCountResponse(results=[count_response(c) for c in counts])


@router.post("/GetCountSeries", response_model=SeriesResponse, responses=ERRORS)
async def get_count_series(body: GetCountSeriesRequest, service: Service, key: CallerKey) -> SeriesResponse:
    """A counter's minute, hour or day buckets over [start, end): in order, zero-filled, with `as_of`. At most
    1,440 buckets per call (422 naming `end` beyond that: ask for a shorter range or a coarser granularity)."""
    ns = service.namespace(body.namespace)
    authorize(ns, key, "read")
    result, as_of = await service.get_series(ns, body.counter_name, body.granularity, body.start, body.end)
    return series_response(ns, body.counter_name, result, as_of)
