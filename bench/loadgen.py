"""A small closed-loop load generator on raw asyncio sockets (HTTP/1.1 keep-alive and memcached text).

The same technique drives the service and its baseline, so their ratio is fair on a shared machine.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

ANSWER_GRACE_S = 30.0  # how long after a load's end a request may still be answered


class Meter(Protocol):
    """Measures around a load (bench.stack_meter.StackMeter): its figures join the load's summary."""

    def start(self) -> None: ...

    def stop(self, requests: int) -> dict[str, float]: ...


@dataclass
class LoadResult:
    latencies_s: list[float]
    elapsed_s: float
    errors: int
    figures: dict[str, float] = field(default_factory=dict)  # a Meter's, when one measured the load

    @property
    def throughput(self) -> float:
        return len(self.latencies_s) / self.elapsed_s if self.elapsed_s else 0.0

    def percentile(self, p: float) -> float:
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]

    def summary(self) -> dict[str, float]:
        return {"requests": len(self.latencies_s), "errors": self.errors, "throughput_per_s": self.throughput,
                "p50_ms": self.percentile(50) * 1e3, "p99_ms": self.percentile(99) * 1e3,
                "max_ms": max(self.latencies_s, default=float("nan")) * 1e3, **self.figures}


def http_post(path: str, body: bytes, headers: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n{headers}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _http_exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> bool:
    """One request, one response: usually a single read (the load generator's own cost competes with the
    server for the same two cores, so it reads what arrived and parses it once)."""
    writer.write(request)
    buf = await reader.read(65536)
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = buf[:end].lower()
            at = head.find(b"content-length:")
            length = 0
            if at >= 0:
                stop = head.find(b"\r\n", at)
                length = int(head[at + 15:stop if stop >= 0 else len(head)])
            if len(buf) >= end + 4 + length:
                return buf[9:12] == b"200"
        more = await reader.read(65536)
        if not more:
            raise ConnectionError("the server closed the connection mid-response")
        buf += more


async def _memcached_exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> bool:
    writer.write(request)
    if request.startswith(b"get "):
        data = await reader.readuntil(b"END\r\n")
        return data.startswith(b"VALUE") or data == b"END\r\n"
    line = await reader.readuntil(b"\r\n")
    return line[:1].isdigit()


Call = Callable[[int], Awaitable[bool]]  # one request by index: whether it succeeded
Connect = Callable[[], Awaitable[tuple[Call, Callable[[], object]]]]  # a worker's (call, close)


async def closed_loop(connect: Connect, *, concurrency: int, duration_s: float,
                      on_progress: Callable[[int], None] | None = None, acked: list[int] | None = None,
                      meter: Meter | None = None, answer_grace_s: float = ANSWER_GRACE_S) -> LoadResult:
    """`concurrency` workers, each issuing its next request as soon as the previous one answered. Worker w
    sends requests w, w + concurrency, ...; `acked[i % len(acked)]` counts the successes of request i; `meter`
    measures around the load. A request still unanswered `answer_grace_s` after the end is given up and counted
    as an error: a server that stops answering fails the load instead of hanging the benchmark."""
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration_s

    async def worker(w: int) -> None:
        nonlocal errors
        call, close = await connect()
        i = w
        try:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                ok = await call(i)
                latencies.append(time.perf_counter() - started)
                if not ok:
                    errors += 1
                elif acked is not None:
                    acked[i % len(acked)] += 1
                i += concurrency
        finally:
            close()

    async def progress() -> None:
        while time.perf_counter() < deadline:
            await asyncio.sleep(0.25)
            if on_progress:
                on_progress(len(latencies))

    if meter is not None:
        meter.start()
    started = time.perf_counter()
    ticker = asyncio.ensure_future(progress())
    workers = [asyncio.ensure_future(worker(w)) for w in range(concurrency)]
    try:
        unanswered = await _finish(workers, duration_s + answer_grace_s)
    finally:
        await ticker  # it ends at the deadline
    elapsed = time.perf_counter() - started
    errors += unanswered
    return LoadResult(latencies, elapsed, errors, meter.stop(len(latencies)) if meter is not None else {})


async def _finish(tasks: Sequence[asyncio.Task[None]], timeout_s: float) -> int:
    """Wait up to `timeout_s` for a load's tasks; cancel the rest and return how many there were (each an error).
    A task's own failure (a refused connection, say) fails the load."""
    if not tasks:
        return 0
    finished, unanswered = await asyncio.wait(tasks, timeout=timeout_s)
    for task in unanswered:
        task.cancel()
    await asyncio.gather(*unanswered, return_exceptions=True)
    failures = [error for error in (task.exception() for task in finished) if error is not None]  # all retrieved
    if failures:
        raise failures[0]
    return len(unanswered)


Requests = Sequence[bytes] | Callable[[int], bytes]  # request i: requests[i % len(requests)], or requests(i)


def _socket_connect(host: str, port: int, requests: Requests, exchange: Callable) -> Connect:
    make = requests if callable(requests) else (lambda i: requests[i % len(requests)])

    async def connect() -> tuple[Call, Callable[[], object]]:
        reader, writer = await asyncio.open_connection(host, port)
        return (lambda i: exchange(reader, writer, make(i))), writer.close
    return connect


def http_load(host: str, port: int, requests: Requests, *, concurrency: int = 32, duration_s: float = 10,
              on_progress: Callable[[int], None] | None = None, acked: list[int] | None = None,
              meter: Meter | None = None) -> LoadResult:
    """Closed-loop HTTP/1.1 keep-alive load of `requests` (a list, cycled, or a factory of request i); `acked` (one
    slot per request of the list) counts its 200 answers."""
    return asyncio.run(closed_loop(_socket_connect(host, port, requests, _http_exchange), concurrency=concurrency,
                                   duration_s=duration_s, on_progress=on_progress, acked=acked, meter=meter))


def memcached_load(host: str, port: int, requests: Sequence[bytes], *, concurrency: int = 32,
                   duration_s: float = 10, on_progress: Callable[[int], None] | None = None) -> LoadResult:
    return asyncio.run(closed_loop(_socket_connect(host, port, requests, _memcached_exchange),
                                   concurrency=concurrency, duration_s=duration_s, on_progress=on_progress))


@dataclass
class OpenLoopResult(LoadResult):
    """An open-loop load's: latencies from each request's scheduled time; `dropped`, the arrivals that found every
    connection of the pool busy (not sent: the pool, not the server, set their pace)."""

    dropped: int = 0


async def open_loop(connect: Connect, *, rate: float, duration_s: float, pool: int = 128, seed: int = 0,
                    on_progress: Callable[[int], None] | None = None, acked: list[int] | None = None,
                    answer_grace_s: float = ANSWER_GRACE_S) -> OpenLoopResult:
    """Poisson arrivals at `rate` a second for `duration_s`, as clients whose requests do not wait on their answers
    (each of their own users' requests writes): request i goes, at its scheduled time, on a free keep-alive
    connection of a pool of `pool` (the one freed last), and its latency runs from that time, so a server that
    answers late is charged for the queue it makes. `acked[i % len(acked)]` counts request i's successes."""
    arrivals = random.Random(seed)
    connections = [await connect() for _ in range(pool)]
    free = list(range(pool))
    latencies: list[float] = []
    errors = dropped = 0

    async def one(slot: int, i: int, scheduled: float) -> None:
        nonlocal errors
        try:
            ok = await connections[slot][0](i)
        finally:
            free.append(slot)
        latencies.append(time.perf_counter() - scheduled)
        if not ok:
            errors += 1
        elif acked is not None:
            acked[i % len(acked)] += 1

    started = time.perf_counter()
    due, i, reported = started, 0, started
    sent: list[asyncio.Task[None]] = []
    try:
        while True:
            due += arrivals.expovariate(rate)
            if due - started >= duration_s:
                break
            if (wait := due - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            if not free:
                dropped += 1
                continue
            sent.append(asyncio.ensure_future(one(free.pop(), i, due)))
            i += 1
            if on_progress and due - reported >= 0.25:
                reported = due
                on_progress(len(latencies))
        errors += await _finish(sent, answer_grace_s)
    finally:
        for _, close in connections:
            close()
    return OpenLoopResult(latencies, duration_s, errors, dropped=dropped)


def http_open_load(host: str, port: int, requests: Requests, *, rate: float, duration_s: float = 10, pool: int = 128,
                   on_progress: Callable[[int], None] | None = None, acked: list[int] | None = None) -> OpenLoopResult:
    """`open_loop` over HTTP/1.1 keep-alive connections; `requests` and `acked` as `http_load`'s."""
    return asyncio.run(open_loop(_socket_connect(host, port, requests, _http_exchange), rate=rate,
                                 duration_s=duration_s, pool=pool, on_progress=on_progress, acked=acked))
