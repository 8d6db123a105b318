"""The app's routing: a path with a trailing slash is not redirected (a 307 that `curl -d` shows as an empty success
while nothing was written), and the UI keeps its own redirects."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from query_api.app import create_app


def call(method: str, path: str, body: bytes = b"") -> httpx.Response:
    async def go() -> httpx.Response:  # no lifespan: routing answers before any service is needed
        transport = httpx.ASGITransport(app=create_app())  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.request(method, path, content=body)
    return asyncio.run(go())


@pytest.mark.parametrize("path", ["/v1/AddCount/", "/v1/GetCount/", "/v1/BatchAddCount/", "/healthz/"])
def test_a_trailing_slash_is_a_404_not_a_redirect(path: str) -> None:
    r = call("POST" if path.startswith("/v1/") else "GET", path, b'{"namespace": "my_dataset", "counter_name": "c"}')
    assert r.status_code == 404 and "location" not in r.headers, (r.status_code, r.headers)


@pytest.mark.parametrize(("path", "location"), [("/", "/ui/"), ("/ui", "/ui/")])
def test_the_ui_still_redirects_to_its_page(path: str, location: str) -> None:
    r = call("GET", path)
    assert r.status_code == 307 and r.headers["location"] == location
