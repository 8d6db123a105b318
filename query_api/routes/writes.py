"""AddCount, AddAndGetCount, ClearCount and BatchAddCount: the Netflix post's write calls."""

from __future__ import annotations

import logging

from fastapi import APIRouter

from control_plane import CounterType, Namespace
from query_api.combination_bound import OverBound
from query_api.dependencies import WRITE_ERRORS, CallerKey, Service, authorize
from query_api.models import (
    AddCountRequest,
    AddCountResponse,
    BatchAddCountRequest,
    BatchAddCountResponse,
    ClearCountRequest,
    CountResponse,
    UniqueCountResponse,
)
from query_api.responses import add_response, count_response
from query_api.routes.entries import authorize_entries, entry
from query_api.service import BrokerUnavailable, CounterService, NotCountedYet, Rejected, Written
from query_api.unique import add_and_get_unique, unique_response
from schemas import Mutation, MutationOp
from schemas.dimensions import Dimensions

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["writes"])


@router.post("/AddCount", response_model=AddCountResponse, responses=WRITE_ERRORS)
async def add_count(body: AddCountRequest, service: Service, key: CallerKey) -> AddCountResponse:
    """Adjust a counter by `delta` (positive or negative). Durable once answered (rolled-up types). In a UNIQUE
    namespace, count `item` (required; `delta` 1 or absent)."""
    ns = service.namespace(body.namespace)
    authorize(ns, key, "write")
    token = body.idempotency_token
    return add_response(await service.write(ns, body.counter_name, service.delta_of(ns, body.delta), MutationOp.ADD,
                                            token.token if token else None,
                                            token.generation_time if token else None, body.event_item_key,
                                            body.dimensions, body.item))


@router.post("/AddAndGetCount", response_model=CountResponse | UniqueCountResponse,
             responses=WRITE_ERRORS)
async def add_and_get_count(body: AddCountRequest, service: Service,
                            key: CallerKey) -> CountResponse | UniqueCountResponse:
    """AddCount, then the count including this delta (read-your-write), or 504 after a bounded wait. In a UNIQUE
    namespace, the estimate including this item."""
    ns = service.namespace(body.namespace)
    authorize(ns, key, "write", "read")
    token = body.idempotency_token
    if ns.counts_unique:
        return unique_response(await add_and_get_unique(service, ns, body.counter_name,
                                                        token.token if token else None,
                                                        token.generation_time if token else None,
                                                        body.dimensions, body.item, body.delta, body.event_item_key))
    return count_response(await service.add_and_get(ns, body.counter_name, service.delta_of(ns, body.delta),
                                                     token.token if token else None,
                                                     token.generation_time if token else None, body.event_item_key,
                                                     body.dimensions, body.item))


@router.post("/ClearCount", response_model=AddCountResponse, responses=WRITE_ERRORS)
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


@router.post("/BatchAddCount", response_model=BatchAddCountResponse, responses=WRITE_ERRORS)
async def batch_add_count(body: BatchAddCountRequest, service: Service, key: CallerKey) -> BatchAddCountResponse:
    """Many AddCounts in one call: all validated first (nothing is sent if any is refused); the durable ones
    travel in one record, so they reach Kafka all or none. The worker judges each by the record's timestamp: one
    acknowledged after its accept_limit (504) or refused by that timestamp (503) is dead-lettered alone and the
    others count, so those answers list every entry's token, and a retry with them counts each once. BEST_EFFORT
    ones are applied first, one by one: when memcached fails, or the durable record then fails, those applied are
    taken back (best effort, as their type says: one that saturated at an int64 bound is taken back by its whole
    delta) and the batch is refused: a refused batch counted its durable writes before. A refusal names its entry
    (`requests.N.<field>`)."""
    namespaces = []
    for i, r in enumerate(body.requests):
        with entry(i):
            namespaces.append(service.namespace(r.namespace))
    authorize_entries(namespaces, key, "write")
    prepared: list[tuple[AddCountRequest, int, Mutation | None]] = []
    durable = []
    bounded: list[tuple[Namespace, str, Dimensions]] = []  # every entry, once all are valid: none takes a slot of
    for i, (r, ns) in enumerate(zip(body.requests, namespaces, strict=True)):  # max_combinations before then
        with entry(i):
            delta = service.delta_of(ns, r.delta)
            dims, _ = service.extras(ns, r.dimensions, r.item, delta=delta, item_key=r.event_item_key)
            bounded.append((ns, r.counter_name, dims))
            if ns.counter_type is CounterType.BEST_EFFORT:
                prepared.append((r, delta, None))
                continue
            t = r.idempotency_token
            m = service.mutation(ns, r.counter_name, delta, MutationOp.ADD, t.token if t else None,
                                 t.generation_time if t else None, r.event_item_key, r.dimensions, r.item)
        prepared.append((r, delta, m))
        durable.append(m)
    try:
        await service.check_bounds(bounded)
    except OverBound as exc:
        with entry(exc.index):
            raise Rejected("dimensions", str(exc)) from None
    values: dict[int, int] = {}  # BEST_EFFORT entries applied: index -> the new count
    try:
        for i, ((r, delta, mutation), ns) in enumerate(zip(prepared, namespaces, strict=True)):
            if mutation is None:
                values[i] = await service.add_best_effort(ns, r.counter_name, delta)
        if durable:
            try:
                await service.send_durably(durable)
            except (BrokerUnavailable, NotCountedYet) as exc:  # the tokens a retry must send again, drawn here
                # for entries without: a 504 (an entry acknowledged after its accept_limit) leaves the others counted
                raise type(exc)(str(exc), entries=[
                    (m.event_id, m.event_time) if m is not None and m.event_id and m.event_time is not None else None
                    for _, _, m in prepared]) from exc
    except BaseException:
        await _take_back(service, [(namespaces[i], prepared[i][0].counter_name, prepared[i][1]) for i in values])
        raise
    results = []
    for i, ((r, _delta, mutation), ns) in enumerate(zip(prepared, namespaces, strict=True)):
        if mutation is None:
            results.append(add_response(Written(ns, r.counter_name, None, None, values[i])))
        else:
            results.append(add_response(Written(ns, r.counter_name, mutation.event_id, mutation.event_time)))
    return BatchAddCountResponse(results=results)


async def _take_back(service: CounterService, applied: list[tuple[Namespace, str, int]]) -> None:
    """Undo BEST_EFFORT adds of a refused batch (best effort: an undo that fails is logged)."""
    for ns, counter, delta in reversed(applied):
        try:
            await service.add_best_effort(ns, counter, -delta)
        except Exception as exc:
            log.warning("could not take back BEST_EFFORT %+d on %s:%s of a refused batch: %s", delta, ns.name,
                        counter, exc)
