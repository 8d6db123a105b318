"""bench.loadgen: a server that stops answering fails the load instead of hanging the benchmark; http_load sends
request i from a list or a factory."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest

from bench.delay_proxy import serve as delay_proxy
from bench.loadgen import Call, closed_loop, http_load, http_open_load, http_post
from bench.write import TokenedAdds
from infra.process import free_port


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


def slow_server(delay_s: float, seen: list[bytes]) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], object]:
    """An HTTP server that answers each request `delay_s` after it came, 200 with an empty JSON body."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                seen.append(await reader.readexactly(length))
                if delay_s:
                    await asyncio.sleep(delay_s)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
    return serve


def test_http_load_sends_request_i_from_a_list_or_a_factory_and_counts_acks_per_slot() -> None:
    """A list is cycled (request i is requests[i % len]); a factory makes request i itself, as bench.write's
    TokenedAdds does (a token of its own per request); acked[i % len(acked)] counts request i's 200s."""
    seen: list[bytes] = []
    serve = slow_server(0.0, seen)

    def run(requests: object, acked: list[int]) -> None:
        async def main() -> None:
            server = await asyncio.start_server(serve, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            async with server:
                await asyncio.to_thread(http_load, "127.0.0.1", port, requests, concurrency=2, duration_s=0.3,
                                        acked=acked)
        asyncio.run(main())

    acked = [0, 0]
    run([http_post("/x", b"a"), http_post("/x", b"b")], acked)
    assert set(seen) == {b"a", b"b"} and sum(acked) == len(seen) and abs(acked[0] - acked[1]) <= 2
    seen.clear()
    tokened = TokenedAdds("ns", ["c0", "c1"], "p")
    acked = [0, 0]
    run(tokened, acked)
    bodies = [json.loads(b) for b in seen]
    tokens = [b["idempotency_token"]["token"] for b in bodies]
    assert len(set(tokens)) == len(tokens) == sum(acked), "one token of its own per request"
    assert all(b["counter_name"] == f"c{int(t.split('-')[1]) % 2}" for b, t in zip(bodies, tokens, strict=True))
    assert all(b["idempotency_token"]["generation_time"].endswith("Z") for b in bodies)


def open_load_against(delay_s: float, **load: object) -> tuple[object, list[bytes]]:
    seen: list[bytes] = []

    async def main() -> object:
        server = await asyncio.start_server(slow_server(delay_s, seen), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await asyncio.to_thread(http_open_load, "127.0.0.1", port, **load)  # type: ignore[arg-type]
    return asyncio.run(main()), seen


def test_an_open_load_sends_poisson_arrivals_whatever_the_answers_and_charges_the_queue() -> None:
    """Requests go at their scheduled times, not when the last one is answered: at 400/s for 0.5 s about 200 go
    (Poisson: 150-250 with room), every one is answered and counted, and each latency includes the 20 ms the
    server takes."""
    acked = [0, 0]
    result, seen = open_load_against(0.02, requests=[http_post("/x", b"a"), http_post("/x", b"b")], rate=400,
                                     duration_s=0.5, pool=64, acked=acked)
    assert 150 <= len(seen) <= 250, len(seen)
    assert len(result.latencies_s) == len(seen) == sum(acked) and result.errors == 0 and result.dropped == 0
    assert min(result.latencies_s) >= 0.02


def test_an_open_load_drops_the_arrivals_its_pool_cannot_carry() -> None:
    """One connection and a server taking 50 ms: at 200/s most arrivals find the pool busy; they are dropped and
    counted, not queued behind the connection (the pool, not the server, would set their pace)."""
    result, seen = open_load_against(0.05, requests=[http_post("/x", b"a")], rate=200, duration_s=0.5, pool=1)
    assert len(seen) == len(result.latencies_s) <= 11
    assert result.dropped >= 40, result.dropped


def test_the_delay_proxy_hands_back_every_byte_in_order_and_late() -> None:
    """bench.delay_proxy between a client and an echo server: what goes up comes back whole, in order, and no
    sooner than the delay after it was sent."""
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            writer.write(data)
        writer.close()

    async def main() -> tuple[bytes, list[float]]:
        upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
        listen = free_port()
        proxy = asyncio.ensure_future(delay_proxy(listen, upstream.sockets[0].getsockname()[1], 0.05))
        deadline = time.monotonic() + 5
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", listen)
                break
            except OSError:
                assert time.monotonic() < deadline, "the proxy never listened"
                await asyncio.sleep(0.01)
        got, waits = b"", []
        for i in range(5):
            sent = time.monotonic()
            message = f"message {i};".encode() * (i * 1000 + 1)
            writer.write(message)
            while len(got) < sum(len(f"message {j};".encode()) * (j * 1000 + 1) for j in range(i + 1)):
                got += await asyncio.wait_for(reader.read(1 << 20), 5)
            waits.append(time.monotonic() - sent)
        writer.close()
        proxy.cancel()
        upstream.close()
        return got, waits

    got, waits = asyncio.run(main())
    assert got == b"".join(f"message {i};".encode() * (i * 1000 + 1) for i in range(5))
    assert min(waits) >= 0.045, waits
