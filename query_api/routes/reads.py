"""GetCount (the total, or a time window), BatchGetCount, GetCountSeries and GetTopK."""

from __future__ import annotations

import time
from collections.abc import Mapping

from fastapi import APIRouter

from control_plane import Namespace
from query_api.dependencies import BODY_ERRORS, CallerKey, Service, authorize
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
from query_api.routes.entries import authorize_entries, entry
from query_api.service import CounterService, Rejected
from query_api.unique import get_unique, unique_get_count, unique_response, unique_series
from query_api.windows import parse_window, windowed
from schemas import Dimensions, combination

GetCountResponse = (CountResponse | WindowCountResponse | DimensionCountResponse | DimensionWindowCountResponse
                    | GroupedCountResponse | UniqueCountResponse | UniqueWindowCountResponse
                    | UniqueDimensionCountResponse | UniqueDimensionWindowCountResponse | UniqueGroupedCountResponse)

BatchCountResponse = (CountResponse | WindowCountResponse | DimensionCountResponse | DimensionWindowCountResponse
                      | UniqueCountResponse | UniqueWindowCountResponse | UniqueDimensionCountResponse
                      | UniqueDimensionWindowCountResponse)

router = APIRouter(prefix="/v1", tags=["reads"])


@router.post("/GetCount", response_model=GetCountResponse, responses=BODY_ERRORS)
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
    if group_by is not None:
        if ns.counts_unique:
            return await unique_get_count(service, ns, body.counter_name, dims, group_by, spec)
        return grouped_response(await service.get_groups(ns, body.counter_name, dims, group_by, spec))
    return await _count(service, ns, body.counter_name, dims, spec)


async def _count(service: CounterService, ns: Namespace, counter: str, dims: Dimensions,
                 spec: Mapping[str, object] | None, now_us: int | None = None) -> BatchCountResponse:
    """GetCount without group_by, as GetCount and each entry of BatchGetCount answer it: the total or the `spec`
    window (`last` ending at `now_us`, default now) of the counter or of its `dims` combination."""
    name = combination(counter, dims)
    if ns.counts_unique:
        return unique_response(await get_unique(service, ns, name, spec, now_us=now_us), counter, dims)
    if spec is not None:
        w = await service.get_window(ns, name, spec, now_us=now_us)
        return dimension_window_response(w, counter, dims) if dims else window_response(w)
    c = await service.get(ns, name)
    return dimension_response(c, counter, dims) if dims else count_response(c)


@router.post("/BatchGetCount", response_model=BatchGetCountResponse, responses=BODY_ERRORS)
async def batch_get_count(body: BatchGetCountRequest, service: Service, key: CallerKey) -> BatchGetCountResponse:
    """Many GetCounts in one call, each answered as GetCount answers it: a total, a `window` (the `last` windows
    of one call all end at the same time) or a `dimensions` filter, with their estimates and bounds in UNIQUE
    namespaces; not group_by (a read per value: use GetCount). Every entry is validated before any is read; a
    refusal names its entry (`requests.N.<field>`)."""
    namespaces = []
    for i, r in enumerate(body.requests):
        with entry(i):
            namespaces.append(service.namespace(r.namespace))
    authorize_entries(namespaces, key, "read")
    now = time.time_ns() // 1000
    reads = []
    for i, (r, ns) in enumerate(zip(body.requests, namespaces, strict=True)):
        if r.group_by is not None:
            raise Rejected(f"requests.{i}.group_by", "BatchGetCount answers totals and windows: use GetCount for "
                                                     "group_by")
        with entry(i):
            dims, _ = service.dimension_filter(ns, r.dimensions, None)
            spec = r.window.as_spec() if r.window is not None else None
            if spec is not None:  # as GetCount would refuse it, before anything is read
                windowed(ns)
                parse_window(spec, now)
        reads.append((r.counter_name, dims, spec))
    results = []
    for i, ((counter, dims, spec), ns) in enumerate(zip(reads, namespaces, strict=True)):
        with entry(i):
            results.append(await _count(service, ns, counter, dims, spec, now))
    return BatchGetCountResponse(results=results)


@router.post("/GetCountSeries", response_model=SeriesResponse, responses=BODY_ERRORS)
async def get_count_series(body: GetCountSeriesRequest, service: Service, key: CallerKey) -> SeriesResponse:
    """A counter's minute, hour or day buckets over [start, end): in order, zero-filled, with `as_of`. At most
    1,440 buckets per call (422 naming `end` beyond that: ask for a shorter range or a coarser granularity). In a
    UNIQUE namespace each bucket's count is its distinct items (its sketch's estimate, rounded)."""
    ns = service.namespace(body.namespace)
    authorize(ns, key, "read")
    windowed(ns, field="namespace")  # the series has no `window` to name: the namespace keeps no buckets
    if ns.counts_unique:
        result, as_of = await unique_series(service, ns, body.counter_name, body.granularity, body.start, body.end)
        return series_response(ns, body.counter_name, result, as_of)
    result, as_of = await service.get_series(ns, body.counter_name, body.granularity, body.start, body.end)
    return series_response(ns, body.counter_name, result, as_of)


@router.post("/GetTopK", response_model=TopKResponse, responses=BODY_ERRORS)
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
