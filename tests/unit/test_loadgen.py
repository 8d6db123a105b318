"""bench.loadgen.closed_loop: a server that stops answering fails the load instead of hanging the benchmark."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from bench.loadgen import Call, closed_loop


def _connect_with(hang_after: dict[int, int], closed: list[int]) -> Callable:
    """Connections whose request i is answered at once, except that the connection of worker w hangs forever
    from its `hang_after[w]`-th request on."""
    count = {"n": 0}

    async def connect() -> tuple[Call, Callable[[], object]]:
        w = count["n"]
        count["n"] += 1
        sent = {"n": 0}

        async def call(i: int) -> bool:
            sent["n"] += 1
            if w in hang_after and sent["n"] > hang_after[w]:
                await asyncio.Event().wait()  # never answered
            await asyncio.sleep(0.001)
            return True

        return call, lambda: closed.append(w)
    return connect


def test_unanswered_requests_are_errors_after_the_grace_and_every_connection_is_closed() -> None:
    closed: list[int] = []
    started = time.perf_counter()
    result = asyncio.run(asyncio.wait_for(closed_loop(_connect_with({1: 3, 2: 0}, closed), concurrency=4,
                                                      duration_s=0.3, answer_grace_s=0.2), 10))  # not a hang
    took = time.perf_counter() - started
    assert result.errors == 2  # workers 1 and 2 each left one request unanswered
    assert 0.3 + 0.2 <= took < 5
    assert sorted(closed) == [0, 1, 2, 3]
    assert len(result.latencies_s) >= 3  # the answered ones, worker 1's first three among them


def test_a_load_that_is_answered_has_no_errors_and_ends_at_its_deadline() -> None:
    closed: list[int] = []
    started = time.perf_counter()
    result = asyncio.run(closed_loop(_connect_with({}, closed), concurrency=3, duration_s=0.2, answer_grace_s=30))
    assert time.perf_counter() - started < 2  # no wait for the grace when every request was answered
    assert result.errors == 0 and sorted(closed) == [0, 1, 2] and result.latencies_s


def test_a_workers_own_failure_still_fails_the_load() -> None:
    async def connect() -> tuple[Call, Callable[[], object]]:
        raise ConnectionRefusedError("no server")

    with pytest.raises(ConnectionRefusedError):
        asyncio.run(closed_loop(connect, concurrency=2, duration_s=0.1, answer_grace_s=0.1))
