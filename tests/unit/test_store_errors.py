"""A read whose store is away answers 503 naming the store, on the route and on the fast path, not a 500; any
other error stays a 500 (a bug is not an outage). The stores are fakes that fail: what is tested is the mapping."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import httpx
import pytest

from control_plane import default_config_path, load_namespaces
from query_api.app import create_app
from query_api.http_protocol import _outcome
from query_api.service import CounterService
from sinks import InProcessRollupCache

REGISTRY = load_namespaces(default_config_path())


def io_error() -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode = 10  # SQLITE_IOERR, as the sqlite3 module sets it  # type: ignore[attr-defined]
    return exc


class FailingRollups:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def get(self, *_args: Any) -> Any:
        raise self.exc

    async def get_many(self, *_args: Any) -> Any:
        raise self.exc


class NoSignals:
    def emit(self, *_args: object) -> None:
        pass


def read(exc: Exception) -> httpx.Response:
    async def go() -> httpx.Response:
        app = create_app()
        app.state.service = CounterService(REGISTRY, producer=None, signals=NoSignals(), events=None,  # type: ignore[arg-type]
                                           rollups=FailingRollups(exc), cache=InProcessRollupCache(),  # type: ignore[arg-type]
                                           counters=None)  # type: ignore[arg-type]
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/GetCount", json={"namespace": "my_dataset", "counter_name": "c"})
    return asyncio.run(go())


def test_a_read_whose_store_is_away_answers_503_naming_the_store() -> None:
    r = read(io_error())
    assert r.status_code == 503, r.text
    assert "store is unavailable" in r.json()["detail"] and "disk I/O error" in r.json()["detail"]


def test_a_store_error_that_is_not_an_outage_stays_a_500() -> None:
    bad = sqlite3.OperationalError("integer overflow")
    bad.sqlite_errorcode = 1  # SQLITE_ERROR: one statement's trouble  # type: ignore[attr-defined]
    assert read(bad).status_code == 500


@pytest.mark.parametrize(("exc", "status"), [(io_error(), 503), (ConnectionRefusedError("store host down"), 503),
                                             (KeyError("a bug"), 500)])
def test_the_fast_path_answers_a_store_outage_as_the_route_does(exc: Exception, status: int) -> None:
    async def go() -> tuple[int, bytes]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_exception(exc)
        return _outcome(future, lambda _r: b"", "reading failed")
    got, body = asyncio.run(go())
    assert got == status, body
