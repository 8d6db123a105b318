"""Request bodies are JSON whatever their Content-Type says, on the FastAPI routes as on the fast paths."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from pydantic import BaseModel, field_validator

from query_api import app as api
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


def test_several_content_types_reach_the_app_as_one_json_type() -> None:
    """Starlette reads the first Content-Type: text/plain then application/json was read as text by the routes
    while the fast paths counted it (from a review)."""
    out = seen_headers("POST", [(b"content-type", b"text/plain"), (b"content-type", b"application/json")])
    assert [v for k, v in out if k == b"content-type"] == [b"application/json"]


class EchoBody(BaseModel):
    delta: int
    counter_name: str

    @field_validator("counter_name")
    @classmethod
    def _named(cls, v: str) -> str:
        if v == "refused":
            raise ValueError("must not be 'refused'")
        return v


async def echo(body: EchoBody) -> dict:
    return {"delta": body.delta}


def routes_app(recorded: list[tuple[str, int]]) -> FastAPI:
    """A FastAPI app with the API's handlers and middleware and one typed route (no broker, no stores)."""
    app = FastAPI()
    api._install_middleware(app)
    api._install_handlers(app)
    app.post("/v1/Echo")(echo)
    return app


@pytest.mark.parametrize("body", [
    b'{"delta": 1e999, "counter_name": "c"}',  # valid JSON the response encoder refused: it answered 500
    b'{"delta": NaN, "counter_name": "c"}',
    b'{"delta": "x", "counter_name": "\\ud800"}',  # a lone surrogate escape
    b'{"delta": 1, "counter_name": 5, "\\ud800": 1}',
])
def test_invalid_bodies_are_a_422_naming_the_field_never_a_500(body: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    from query_api import metrics

    recorded: list[tuple[str, int]] = []
    monkeypatch.setattr(metrics, "record", lambda endpoint, status, _s: recorded.append((endpoint, status)))

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=routes_app(recorded))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/Echo", content=body, headers={"content-type": "application/json"})

    r = asyncio.run(post())
    assert r.status_code == 422, r.text
    assert all(e["loc"][0] == "body" and "input" not in e for e in r.json()["detail"])
    assert recorded == [("/v1/Echo", 422)]


@pytest.mark.parametrize(("body", "loc"), [
    (b'{"counter_name": "c", "delta": ' + b"9" * 5000 + b"}", ["body", "delta"]),
    (b'{"counter_name": "c", "delta": -' + b"9" * 5000 + b"}", ["body", "delta"]),
    (b'{"counter_name": "c", "delta": 1, "x": [0, {"y": ' + b"1" * 4301 + b"}]}", ["body", "x", 1, "y"]),
])
def test_an_integer_past_the_parsers_digit_limit_is_a_422_naming_its_field(body: bytes, loc: list) -> None:
    """Python's JSON parser refuses an integer over 4,300 digits before a model sees it: it was a 422 saying
    "invalid body" without the field (from a review)."""
    import httpx

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=routes_app([]))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/Echo", content=body, headers={"content-type": "application/json"})

    r = asyncio.run(post())
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == loc and "64-bit" in error["msg"] and "digits" in error["msg"], error


@pytest.mark.parametrize(("body", "says"), [
    (b'{"delta": "\xff"}', "invalid body: not UTF-8 text (byte 11 is 0xff)"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid body: its arrays or objects nest too deeply"),
])
def test_a_body_that_is_not_json_says_why(body: bytes, says: str) -> None:
    """The parser's "There was an error parsing the body" left a client guessing (a new user's walkthrough)."""
    import httpx

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=routes_app([]))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/Echo", content=body, headers={"content-type": "application/json"})

    r = asyncio.run(post())
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["body"] and error["msg"].startswith(says), error


def test_a_path_no_route_matches_is_counted_as_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """A label per made-up path would grow the request metrics without end (from a review)."""
    import httpx

    from query_api import metrics

    recorded: list[tuple[str, int]] = []
    monkeypatch.setattr(metrics, "record", lambda endpoint, status, _s: recorded.append((endpoint, status)))

    async def get() -> None:
        transport = httpx.ASGITransport(app=routes_app(recorded))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for i in range(3):
                await client.post(f"/v1/junk-{i}", content=b"{}")

    asyncio.run(get())
    assert recorded == [("other", 404)] * 3


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_a_413_not_read_whole(chunked: bool) -> None:
    import httpx

    big = b'{"delta": 1, "counter_name": "' + b"x" * (api.MAX_BODY_BYTES + 10) + b'"}'

    async def chunks():  # no Content-Length: the limit is found while reading
        for i in range(0, len(big), 1 << 16):
            yield big[i:i + (1 << 16)]

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=routes_app([]))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/Echo", content=chunks() if chunked else big,
                                     headers={"content-type": "application/json"})

    r = asyncio.run(post())
    assert r.status_code == 413 and "over" in str(r.json()["detail"]), r.text


@pytest.mark.parametrize(("headers", "body", "status"), [
    ({}, b'{"delta": 1, "counter_name": "c"}', 200),
    ({}, b'{"delta": "x", "counter_name": "c"}', 422),
    ({"content-type": "application/x-www-form-urlencoded"}, b'{"delta": 1, "counter_name": "c"}', 200),
    ({"content-type": "text/plain"}, b'{"delta": "x", "counter_name": "c"}', 422),
])
def test_a_body_without_a_json_type_is_counted_under_its_endpoint(headers: dict[str, str], body: bytes, status: int,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """JsonBodies replaced the headers in a copy of the scope: the router set the matched route on the copy, and
    RequestMetrics filed every `curl -d` request the route answered under "other" (from a review)."""
    import httpx

    from query_api import metrics

    recorded: list[tuple[str, int]] = []
    monkeypatch.setattr(metrics, "record", lambda endpoint, status, _s: recorded.append((endpoint, status)))

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=routes_app(recorded))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            request = client.build_request("POST", "/v1/Echo", content=body, headers=headers)
            assert request.headers.get("content-type") == headers.get("content-type")  # none for raw bytes
            return await client.send(request)

    r = asyncio.run(post())
    assert r.status_code == status, r.text
    assert recorded == [("/v1/Echo", status)]


def test_a_validators_refusal_reads_like_the_other_422s() -> None:
    """pydantic prefixes a validator's message with "Value error, ", which no other 422 has (a new user's
    walkthrough)."""
    import httpx

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=routes_app([]))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/Echo", json={"delta": 1, "counter_name": "refused"})

    r = asyncio.run(post())
    assert r.status_code == 422, r.text
    assert [(e["loc"], e["msg"]) for e in r.json()["detail"]] == [(["body", "counter_name"], "must not be 'refused'")]
