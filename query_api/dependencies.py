"""What every route depends on: the service, the caller's API key, and the namespace's access rules."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Header, Request

from control_plane import Namespace
from query_api.models import ErrorResponse, WriteErrorResponse
from query_api.service import CounterService

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse}, 403: {"model": ErrorResponse}, 404: {"model": ErrorResponse},
    422: {"description": "invalid body; the detail names the field"}, 503: {"model": ErrorResponse}}
BODY_ERRORS: dict[int | str, dict[str, Any]] = {  # of a call with a request body
    **ERRORS, 413: {"model": ErrorResponse, "description": "the request body is over 4 MiB"}}
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    **BODY_ERRORS,
    503: {"model": WriteErrorResponse, "description": "not taken: the broker (BEST_EFFORT: memcached) or the store "
                                                      "did not answer; a durable write's answer names the "
                                                      "idempotency_token (and generation_time) a retry must send "
                                                      "to be counted once"},
    504: {"model": WriteErrorResponse, "description": "taken, not known in time to count: acknowledged past its "
                                                      "accept_limit, or AddAndGetCount's count not readable in time; "
                                                      "retry a durable write with the idempotency_token the answer "
                                                      "names (counted once). A BEST_EFFORT write's 504 (memcached "
                                                      "did not answer) names none: a retry may count twice"}}


class Forbidden(Exception):
    """401 (no or unknown key) or 403 (the key lacks a scope)."""

    def __init__(self, status: int, detail: str) -> None:
        self.status = status
        self.detail = detail


async def api_key(x_api_key: Annotated[str | None, Header()] = None,
                  authorization: Annotated[str | None, Header()] = None) -> str | None:
    """The caller's key: `X-API-Key: <key>` or `Authorization: Bearer <key>` (async: no thread hop)."""
    if x_api_key and (key := x_api_key.strip()):  # surrounding whitespace is no part of a header's value
        return key
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def authorize(ns: Namespace, key: str | None, *scopes: str) -> None:
    """Raise Forbidden unless `key` may use every scope on the namespace (no keys configured: anyone may)."""
    if not ns.requires_auth:
        return
    if not key:
        raise Forbidden(401, f"namespace {ns.name!r} requires an API key (X-API-Key: <key>, or Authorization: "
                             "Bearer <key>)")
    if not any(ns.allows(key, s) for s in ("read", "write")):
        raise Forbidden(401, f"the API key given is not one of the keys of namespace {ns.name!r}")
    missing = [s for s in scopes if not ns.allows(key, s)]
    if missing:
        raise Forbidden(403, f"this API key lacks the {'/'.join(missing)} scope for namespace {ns.name!r}")


async def _service(request: Request) -> CounterService:
    return request.app.state.service  # set by the lifespan


Service = Annotated[CounterService, Depends(_service)]
CallerKey = Annotated[str | None, Depends(api_key)]
