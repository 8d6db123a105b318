"""Operations: liveness, readiness (broker, store and its binding, caches) and Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from query_api import metrics
from query_api.dependencies import Service
from query_api.pipeline_health import render
from query_api.service import CounterService

router = APIRouter(tags=["operations"])
log = logging.getLogger(__name__)
PIPELINE_WAIT_S = 4.0  # what a scrape waits for the pipeline's figures: within Prometheus's default 10 s timeout


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "a dependency is unreachable"}})
async def readyz(service: Service, request: Request) -> JSONResponse:
    """Broker, store and cache reachable, the mutations topic on the broker (writes fail without it), and the store
    the one the workers persist into (streams.store_binding)."""
    binding = request.app.state.binding  # set by the lifespan
    bound = "ok" if binding.bound else "not checked yet: the broker has not answered"
    checks = {"broker": _writes_failing(service) or await _check(service.producer.kafka.partitions(
                  service.producer.topic, 1.0)),
              "store": await _check(service.rollups.get("_readyz", "_readyz")),
              "store_binding": bound if binding.mismatch is None else f"another store: {binding.mismatch}",
              "cache": "ok" if await service.cache.healthy() else "unreachable",
              "best_effort_counters": "ok" if await service.counters.healthy() else "unreachable"}
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
async def prometheus(request: Request) -> Response:
    """Prometheus metrics: requests and latency per endpoint, cache hit ratio, group commit (writes per record,
    the broker's acknowledgement time), and the pipeline's figures of GET /v1/pipeline (`counter_pipeline_*`)."""
    health = request.app.state.health
    try:  # shielded: a snapshot that outlasts the scrape still lands in the shared cache for the next one
        snapshot = await asyncio.wait_for(asyncio.shield(health.snapshot()), PIPELINE_WAIT_S)
    except Exception as exc:
        # the request and group-commit metrics are served still: a broker in trouble took them down with it (a review)
        log.warning("/metrics without the pipeline's figures: %s", exc or type(exc).__name__)
        metrics.set_pipeline({"errors": 1.0})
    else:
        body = render(snapshot, health.registry, health.settings, lambda _name: True)
        metrics.set_pipeline({
            "watermark_lag_seconds": body["watermark_lag_s"], "persist_lag_records": body["persist_lag_records"],
            "rollup_lag_seconds": body["rollup_lag_s"], "persisted_still_seconds": (
                None if snapshot.stalled_s is None else max(snapshot.stalled_s.values(), default=0.0)),
            "dead_letters": body["dlq"]["size"] if body["dlq"] else None,
            "warnings": len(body["warnings"]), "errors": len(body["errors"])})
    return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)


FAILING_FRESH_S = 5.0  # a failure older than this, with none since, no longer fails /readyz


def _writes_failing(service: CounterService) -> str | None:
    """A broker that answers metadata and refuses every record (a topic recreated with another partition count on
    the local broker: a review saw /readyz say ok beside a 503 for every write). Only while the failures are recent:
    an API taken out of a load balancer gets no writes to show the broker is back."""
    producer = service.producer
    since = producer.failing_since
    if since is None or time.monotonic() - producer.last_failure_at > FAILING_FRESH_S:
        return None
    return (f"failed: every durable write for {time.monotonic() - since:.1f}s was refused "
            f"({producer.last_failure})")


async def _check(awaitable: Awaitable[object]) -> str:
    try:
        await asyncio.wait_for(awaitable, 2.0)
        return "ok"
    except Exception as exc:
        return f"failed: {exc}"
