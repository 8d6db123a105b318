"""AddCount, AddAndGetCount, ClearCount and BatchAddCount: the Netflix post's write calls."""

from __future__ import annotations

from fastapi import APIRouter

from control_plane import CounterType
from query_api.dependencies import ERRORS, CallerKey, Service, authorize
from query_api.models import (
    AddCountRequest,
    AddCountResponse,
    BatchAddCountRequest,
    BatchAddCountResponse,
    ClearCountRequest,
    CountResponse,
    ErrorResponse,
)
from query_api.responses import add_response, count_response
from query_api.service import Rejected, Written
from schemas import Mutation, MutationOp

router = APIRouter(prefix="/v1", tags=["writes"])


@router.post("/AddCount", response_model=AddCountResponse, responses=ERRORS)
async def add_count(body: AddCountRequest, service: Service, key: CallerKey) -> AddCountResponse:
    """Adjust a counter by `delta` (positive or negative). Durable once answered (rolled-up types)."""
    ns = service.namespace(body.namespace)
    authorize(ns, key, "write")
    token = body.idempotency_token
    return add_response(await service.write(ns, body.counter_name, body.delta, MutationOp.ADD,
                                            token.token if token else None,
                                            token.generation_time if token else None, body.event_item_key,
                                            body.dimensions, body.item))


@router.post("/AddAndGetCount", response_model=CountResponse, responses={**ERRORS, 504: {"model": ErrorResponse}})
async def add_and_get_count(body: AddCountRequest, service: Service, key: CallerKey) -> CountResponse:
    """AddCount, then the count including this delta (read-your-write), or 504 after a bounded wait."""
    ns = service.namespace(body.namespace)
    authorize(ns, key, "write", "read")
    token = body.idempotency_token
    return count_response(await service.add_and_get(ns, body.counter_name, body.delta,
                                                     token.token if token else None,
                                                     token.generation_time if token else None, body.event_item_key,
                                                     body.dimensions, body.item))


@router.post("/ClearCount", response_model=AddCountResponse, responses=ERRORS)
async def clear_count(body: ClearCountRequest, service: Service, key: CallerKey) -> AddCountResponse:
    """Reset a counter to 0 as of the token's generation_time (an idempotent event like any other), with every
    combination of its dimensions."""
    ns = service.namespace(body.namespace)
    authorize(ns, key, "write")
    if body.dimensions:
        raise Rejected("dimensions", "a clear applies to the counter and all its combinations: send it without "
                                     "dimensions")
    token = body.idempotency_token
    return add_response(await service.write(ns, body.counter_name, 0, MutationOp.CLEAR,
                                            token.token if token else None,
                                            token.generation_time if token else None))


@router.post("/BatchAddCount", response_model=BatchAddCountResponse, responses=ERRORS)
async def batch_add_count(body: BatchAddCountRequest, service: Service, key: CallerKey) -> BatchAddCountResponse:
    """Many AddCounts in one call: all validated first (nothing is sent if any is refused); the durable ones
    travel in one record, so they are counted all or none."""
    namespaces = [service.namespace(r.namespace) for r in body.requests]
    for ns in {n.name: n for n in namespaces}.values():
        authorize(ns, key, "write")
    prepared: list[tuple[AddCountRequest, Mutation | None]] = []
    durable = []
    for i, (r, ns) in enumerate(zip(body.requests, namespaces, strict=True)):
        try:
            dims, _ = service.extras(ns, r.dimensions, r.item)
            if dims:
                await service.check_bound(ns, r.counter_name, dims)
        except Rejected as exc:
            raise Rejected(f"requests.{i}.{exc.field}", exc.reason) from None
        if ns.counter_type is CounterType.BEST_EFFORT:
            prepared.append((r, None))
            continue
        t = r.idempotency_token
        m = service.mutation(ns, r.counter_name, r.delta, MutationOp.ADD, t.token if t else None,
                             t.generation_time if t else None, r.event_item_key, r.dimensions, r.item)
        prepared.append((r, m))
        durable.append(m)
    if durable:
        await service.send_durably(durable)
    results = []
    for (r, mutation), ns in zip(prepared, namespaces, strict=True):
        if mutation is None:
            results.append(add_response(await service.write(ns, r.counter_name, r.delta, MutationOp.ADD, None, None)))
        else:
            results.append(add_response(Written(ns, r.counter_name, mutation.event_id, mutation.event_time)))
    return BatchAddCountResponse(results=results)
