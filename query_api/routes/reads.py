"""GetCount (the total, or a time window), BatchGetCount, GetCountSeries and GetTopK."""

from __future__ import annotations

from fastapi import APIRouter

from query_api.dependencies import ERRORS, CallerKey, Service, authorize
from query_api.models import (
    BatchGetCountRequest,
    BatchGetCountResponse,
    CountResponse,
    DimensionCountResponse,
    DimensionWindowCountResponse,
    GetCountRequest,
    GetCountSeriesRequest,
    GetTopKRequest,
    GroupedCountResponse,
    SeriesResponse,
    TopKResponse,
    UniqueCountResponse,
    UniqueDimensionCountResponse,
    UniqueDimensionWindowCountResponse,
    UniqueGroupedCountResponse,
    UniqueWindowCountResponse,
    WindowCountResponse,
)
from query_api.responses import (
    count_response,
    dimension_response,
    dimension_window_response,
    grouped_response,
    series_response,
    top_k_response,
    window_response,
)
from query_api.service import Rejected
from query_api.unique import get_unique, unique_get_count, unique_response, unique_series
from schemas import combination

GetCountResponse = (CountResponse | WindowCountResponse | DimensionCountResponse | DimensionWindowCountResponse
                    | GroupedCountResponse | UniqueCountResponse | UniqueWindowCountResponse
                    | UniqueDimensionCountResponse | UniqueDimensionWindowCountResponse | UniqueGroupedCountResponse)

router = APIRouter(prefix="/v1", tags=["reads"])


@router.post("/GetCount", response_model=GetCountResponse, responses=ERRORS)
async def get_count(body: GetCountRequest, service: Service, key: CallerKey) -> GetCountResponse:
    """The count: EVENTUAL the cached rollup (`as_of` its timestamp), ACCURATE rollup + live delta. With a
    `window`, the count of that window (`{"last": "1h"}` or `{"start", "end"}`), answered from the coarsest
    buckets that tile it; ACCURATE adds the window's live events.

    With `dimensions` (any subset of the namespace's keys, e.g. `{"country": "US"}`), the count of the writes
    carrying them (one combination counter: exact, one read, windows included). With `group_by` (a declared key
    not in the filter), one count per value of it among those writes (`groups`), and the filter's total.

    In a UNIQUE namespace, the distinct items instead: `estimate` with `lower_bound` and `upper_bound` (95%), `count`
    the estimate rounded, for the total, a window, a filter or each group."""
    ns = service.namespace(body.namespace)
    authorize(ns, key, "read")
    dims, group_by = service.dimension_filter(ns, body.dimensions, body.group_by)
    spec = body.window.as_spec() if body.window is not None else None
    if ns.counts_unique:
        return await unique_get_count(service, ns, body.counter_name, dims, group_by, spec)
    if group_by is not None:
        return grouped_response(await service.get_groups(ns, body.counter_name, dims, group_by, spec))
    if dims:
        name = combination(body.counter_name, dims)
        if spec is not None:
            return dimension_window_response(await service.get_window(ns, name, spec), body.counter_name, dims)
        return dimension_response(await service.get(ns, name), body.counter_name, dims)
    if spec is not None:
        return window_response(await service.get_window(ns, body.counter_name, spec))
    return count_response(await service.get(ns, body.counter_name))


@router.post("/BatchGetCount", response_model=BatchGetCountResponse, responses=ERRORS)
async def batch_get_count(body: BatchGetCountRequest, service: Service, key: CallerKey) -> BatchGetCountResponse:
    """Many GetCounts of totals in one call (a `dimensions` filter each; no group_by); UNIQUE namespaces' answers
    carry their estimates and bounds, as GetCount's."""
    namespaces = [service.namespace(r.namespace) for r in body.requests]
    for ns in {n.name: n for n in namespaces}.values():
        authorize(ns, key, "read")
    names = []
    for i, (r, ns) in enumerate(zip(body.requests, namespaces, strict=True)):
        if r.group_by is not None:
            raise Rejected(f"requests.{i}.group_by", "BatchGetCount answers totals: use GetCount for group_by")
        try:
            dims, _ = service.dimension_filter(ns, r.dimensions, None)
        except Rejected as exc:
            raise Rejected(f"requests.{i}.{exc.field}", exc.reason) from None
        names.append((r.counter_name, dims))
    results: list[CountResponse] = []
    for (counter, dims), ns in zip(names, namespaces, strict=True):
        if ns.counts_unique:
            results.append(unique_response(await get_unique(service, ns, combination(counter, dims)), counter, dims))
            continue
        c = await service.get(ns, combination(counter, dims))
        results.append(dimension_response(c, counter, dims) if dims else count_response(c))
    return BatchGetCountResponse(results=results)


@router.post("/GetCountSeries", response_model=SeriesResponse, responses=ERRORS)
async def get_count_series(body: GetCountSeriesRequest, service: Service, key: CallerKey) -> SeriesResponse:
    """A counter's minute, hour or day buckets over [start, end): in order, zero-filled, with `as_of`. At most
    1,440 buckets per call (422 naming `end` beyond that: ask for a shorter range or a coarser granularity). In a
    UNIQUE namespace each bucket's count is its distinct items (its sketch's estimate, rounded)."""
    ns = service.namespace(body.namespace)
    authorize(ns, key, "read")
    if ns.counts_unique:
        result, as_of = await unique_series(service, ns, body.counter_name, body.granularity, body.start, body.end)
        return series_response(ns, body.counter_name, result, as_of)
    result, as_of = await service.get_series(ns, body.counter_name, body.granularity, body.start, body.end)
    return series_response(ns, body.counter_name, result, as_of)


@router.post("/GetTopK", response_model=TopKResponse, responses=ERRORS)
async def get_top_k(body: GetTopKRequest, service: Service, key: CallerKey) -> TopKResponse:
    """The `k` (1..100, default 10) counters with the highest counts in `window` (required: `{"last": "1h"}` or
    `{"start", "end"}`), count descending, ties by name: of all the namespace's counters, or with `dimensions` of
    the writes carrying them (`{"country": "BR"}`: the most played titles in Brazil). Exact for the rolled-up
    counts, read from rank lists kept with the time buckets (never a scan of the namespace's counters); `as_of`
    is the oldest rollup among the counters returned; ACCURATE live events are not included. Counters whose count
    in the window is 0 or less are not ranked. Not for UNIQUE namespaces (their counts are estimates)."""
    ns = service.namespace(body.namespace)
    authorize(ns, key, "read")
    return top_k_response(await service.get_top_k(ns, body.k, body.window.as_spec(), body.dimensions))
