"""The OpenAPI document says what the API answers: a review found a 504 and a 413 it returned and did not list, and
request fields' bounds it enforced and did not declare."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from query_api.routes import inspect, reads, writes

WRITES = ("/v1/AddCount", "/v1/AddAndGetCount", "/v1/ClearCount", "/v1/BatchAddCount")
READS = ("/v1/GetCount", "/v1/BatchGetCount", "/v1/GetCountSeries", "/v1/GetTopK")


def spec() -> dict[str, Any]:
    app = FastAPI()
    for module in (reads, writes, inspect):
        app.include_router(module.router)
    return app.openapi()


def test_every_write_lists_its_503_and_504_with_the_retry_token_and_every_body_its_413() -> None:
    doc = spec()
    for path in WRITES:
        responses = doc["paths"][path]["post"]["responses"]
        assert {"413", "503", "504"} <= set(responses), path
        for status in ("503", "504"):
            assert responses[status]["content"]["application/json"]["schema"]["$ref"].endswith(
                "/WriteErrorResponse"), (path, status)
    for path in READS:
        responses = doc["paths"][path]["post"]["responses"]
        assert "413" in responses and "504" not in responses, path
    fields = doc["components"]["schemas"]["WriteErrorResponse"]["properties"]
    assert {"detail", "idempotency_token", "idempotency_tokens"} <= set(fields)


def test_request_fields_declare_the_bounds_the_validators_enforce() -> None:
    schemas = spec()["components"]["schemas"]
    add = schemas["AddCountRequest"]["properties"]
    assert add["counter_name"]["maxLength"] == 200 and add["counter_name"]["minLength"] == 1
    assert "UTF-8 bytes" in add["counter_name"]["description"]
    assert add["namespace"]["maxLength"] == 64 and add["namespace"]["pattern"] == "^[A-Za-z0-9_.-]+$"
    assert add["event_item_key"]["maxLength"] == 256
    assert schemas["IdempotencyToken"]["properties"]["token"]["maxLength"] == 256
