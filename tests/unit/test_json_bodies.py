"""Request bodies are JSON whatever their Content-Type says, on the FastAPI routes as on the fast paths."""

from __future__ import annotations

import asyncio

import pytest

from query_api.app import JsonBodies, is_json_type


@pytest.mark.parametrize(("value", "json"), [
    (b"application/json", True),
    (b"Application/JSON; charset=utf-8", True),
    (b"application/merge-patch+json", True),
    (b"text/plain", False),
    (b"application/x-www-form-urlencoded", False),
    (b"text/json", False),
    (b"", False),
])
def test_json_types_are_what_fastapi_parses_as_json(value: bytes, json: bool) -> None:
    assert is_json_type(value) is json


def seen_headers(method: str, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    seen: list[dict] = []

    async def app(scope, receive, send) -> None:
        seen.append(scope)

    asyncio.run(JsonBodies(app)({"type": "http", "method": method, "headers": headers}, None, None))
    return seen[0]["headers"]


@pytest.mark.parametrize("headers", [
    [(b"host", b"t")],
    [(b"host", b"t"), (b"content-type", b"text/plain")],
    [(b"content-type", b"application/x-www-form-urlencoded"), (b"host", b"t")],
])
def test_a_post_without_a_json_type_reaches_the_app_as_json(headers: list[tuple[bytes, bytes]]) -> None:
    out = seen_headers("POST", headers)
    assert [v for k, v in out if k == b"content-type"] == [b"application/json"]
    assert [h for h in out if h[0] != b"content-type"] == [h for h in headers if h[0] != b"content-type"]


def test_json_types_and_other_methods_are_left_alone() -> None:
    typed = [(b"host", b"t"), (b"content-type", b"application/json; charset=utf-8")]
    assert seen_headers("POST", typed) == typed
    assert seen_headers("GET", [(b"host", b"t")]) == [(b"host", b"t")]
