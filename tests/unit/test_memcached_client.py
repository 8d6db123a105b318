"""AsyncMemcached's framing and failure handling, against a scripted fake memcached on 127.0.0.1.

The fake server records the requests it reads and writes exactly the bytes a test scripts, one chunk at a time:
a chunk is written only once the client has read the previous one, so a test decides how replies are split
across the client's reads (and checks that they were split so). The client's connection class is wrapped only
to record its reads and sends; its behaviour is unchanged.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinks.memcached import client as client_module
from sinks.memcached.client import (
    MAX_KEY_BYTES,
    AsyncMemcached,
    MemcachedError,
    MemcachedUnanswered,
    arith_value,
    is_legal_key,
)

DEADLINE_S = 20.0  # a whole test; a hang fails here instead of blocking the run


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, DEADLINE_S))


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    """Wait for condition, failing the test with `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


# -- the fake server ------------------------------------------------------------------------------------------


class ServerSide:
    """One accepted connection: the requests read from it (storage commands with their data block)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.peer_port: int = writer.get_extra_info("peername")[1]
        self.requests: list[bytes] = []
        self.eof = asyncio.Event()

    async def pump(self) -> None:
        try:
            while True:
                line = await self.reader.readuntil(b"\r\n")
                words = line.split()
                if words and words[0] in (b"set", b"add"):
                    line += await self.reader.readexactly(int(words[4]) + 2)
                self.requests.append(line)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.eof.set()

    async def close(self) -> None:
        self.writer.close()
        await self.eof.wait()


class FakeMemcached:
    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.accepted: list[ServerSide] = []

    async def __aenter__(self) -> FakeMemcached:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, limit=1 << 22)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for side in self.accepted:
            side.writer.close()
        self._server.close()
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        side = ServerSide(reader, writer)
        self.accepted.append(side)
        await side.pump()

    async def connection(self, n: int = 1) -> ServerSide:
        """The n-th connection accepted, once it is."""
        await until(lambda: len(self.accepted) >= n, f"connection {n}")
        return self.accepted[n - 1]


# -- the client, recorded -------------------------------------------------------------------------------------


class _SendLog:
    """The transport, noting each write."""

    def __init__(self, transport: asyncio.Transport, sends: list[bytes]) -> None:
        self._transport, self._sends = transport, sends

    def write(self, data: bytes) -> None:
        self._sends.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:  # the rest of the transport (close, is_closing, ...)
        return getattr(self.__dict__["_transport"], name)


def _recording_connection(opened: list[Any]) -> type:
    class Recorded(client_module._Connection):
        def __init__(self, address: str, timeout_s: float) -> None:
            super().__init__(address, timeout_s)
            self.reads: list[bytes] = []
            self.sends: list[bytes] = []
            self.port = 0
            opened.append(self)

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.port = transport.get_extra_info("sockname")[1]
            super().connection_made(_SendLog(transport, self.sends))  # type: ignore[arg-type]

        def data_received(self, data: bytes) -> None:
            self.reads.append(bytes(data))
            super().data_received(data)

    return Recorded


@dataclass
class Harness:
    server: FakeMemcached
    client: AsyncMemcached
    opened: list[Any]  # the client's connections, in the order it opened them

    def client_side(self, side: ServerSide) -> Any:
        return next(c for c in self.opened if c.port == side.peer_port)

    async def requests(self, n: int, side: ServerSide | None = None) -> list[bytes]:
        """Wait until the server read n requests on `side` (the latest connection by default)."""
        if side is None:
            await self.server.connection()
            side = self.server.accepted[-1]
        await until(lambda: len(side.requests) >= n, f"{n} requests, got {side.requests}")
        return side.requests[:n]

    async def answer(self, *chunks: bytes, side: ServerSide | None = None) -> None:
        """Write each chunk once the client has read everything before it: one chunk, one client read."""
        side = side or self.server.accepted[-1]
        conn = self.client_side(side)
        for chunk in chunks:
            before = sum(map(len, conn.reads))
            side.writer.write(chunk)
            await until(lambda: sum(map(len, conn.reads)) >= before + len(chunk), f"the client to read {chunk!r}")  # noqa: B023


@asynccontextmanager
async def fake_memcached(timeout_s: float = 60.0, pool_size: int = 1, port: int = 0) -> AsyncIterator[Harness]:
    opened: list[Any] = []
    with mock.patch.object(client_module, "_Connection", _recording_connection(opened)):
        async with FakeMemcached(port) as server:
            client = AsyncMemcached("127.0.0.1", server.port, timeout_s=timeout_s, pool_size=pool_size)
            try:
                yield Harness(server, client, opened)
            finally:
                await client.close()


async def outcome(awaitable: Awaitable[Any]) -> Any:
    """The result, or the exception type when it raised MemcachedError."""
    try:
        return await awaitable
    except MemcachedError:
        return MemcachedError


async def via_callback(client: AsyncMemcached, cmd: bytes, key: str, delta: int) -> tuple[bytes | None, type | None]:
    """`arith` with on_reply, as (reply, type of the error)."""
    got: asyncio.Future[tuple[bytes | None, type | None]] = asyncio.get_running_loop().create_future()
    client.arith(cmd, key, delta, lambda reply, error: got.set_result((reply, type(error) if error else None)))
    return await got


def value_block(key: str, data: bytes) -> bytes:
    return b"VALUE %s 0 %d\r\n%s\r\n" % (key.encode(), len(data), data)


# -- one request's framing ------------------------------------------------------------------------------------

TRICKY = b"a\r\nEND\r\nVALUE x 0 1\r\n"  # a value holding every delimiter the parser looks for


def test_a_value_split_at_every_byte_boundary_is_read_whole() -> None:
    reply = value_block("k", TRICKY) + b"END\r\n"
    splits = [[reply[:cut], reply[cut:]] for cut in range(1, len(reply))] + [[bytes([b]) for b in reply]]

    async def scenario() -> None:
        async with fake_memcached() as h:
            for n, chunks in enumerate(splits, 1):
                pending = asyncio.ensure_future(h.client.get("k"))
                assert await h.requests(n) == [b"get k\r\n"] * n
                await h.answer(*chunks)
                assert await pending == TRICKY, chunks
                assert h.opened[0].reads[-len(chunks):] == chunks  # the split really reached the client
            assert len(h.server.accepted) == 1  # never desynchronised, never reconnected

    run(scenario())


def test_a_line_reply_split_at_every_byte_boundary() -> None:
    reply = b"18446744073709551615\r\n"

    async def scenario() -> None:
        async with fake_memcached() as h:
            for cut in range(1, len(reply)):
                pending = asyncio.ensure_future(h.client.incr("k", 1))
                await h.requests(cut)
                await h.answer(reply[:cut], reply[cut:])
                assert await pending == 2**64 - 1
            assert len(h.server.accepted) == 1

    run(scenario())


def test_large_values_get_many_with_missing_keys_and_empty_values() -> None:
    big = (TRICKY * 60_000)[: 1 << 20]  # 1 MiB: several reads of the client's transport

    async def scenario() -> None:
        async with fake_memcached() as h:
            stored = asyncio.ensure_future(h.client.set("big", big, expire=60))
            (request,) = await h.requests(1)
            assert request == b"set big 0 60 %d\r\n" % len(big) + big + b"\r\n"
            await h.answer(b"STORED\r\n")
            assert await stored is None

            got = asyncio.ensure_future(h.client.get("big"))
            await h.requests(2)
            h.server.accepted[0].writer.write(value_block("big", big) + b"END\r\n")
            assert await got == big
            assert len(h.opened[0].reads) > 2

            many = asyncio.ensure_future(h.client.get_many(["a", "missing", "empty", "c"]))
            assert (await h.requests(3))[-1] == b"get a missing empty c\r\n"
            await h.answer(value_block("a", b"1") + value_block("empty", b"") + value_block("c", b"3") + b"END\r\n")
            assert await many == {"a": b"1", "empty": b"", "c": b"3"}

            assert await h.client.get_many([]) == {}
            assert await h.client.get_many(iter(())) == {}
            nothing = asyncio.ensure_future(h.client.get("nothing"))
            assert (await h.requests(4))[-1] == b"get nothing\r\n"  # get_many([]) sent no request
            await h.answer(b"END\r\n")
            assert await nothing is None

    run(scenario())


# -- pipelines ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One request: the bytes the server must read, its reply, and what the caller must see."""

    request: bytes
    reply: bytes
    expected: Any
    call: Callable[[AsyncMemcached], Awaitable[Any]]


def _op_kinds(i: int) -> list[Op]:
    k = f"k{i}"
    v = b"v%d" % i + TRICKY
    K = k.encode()
    return [
        Op(b"get %s\r\n" % K, value_block(k, v) + b"END\r\n", v, lambda c: c.get(k)),
        Op(b"get %s\r\n" % K, b"END\r\n", None, lambda c: c.get(k)),
        Op(b"get %sa %sb %sc\r\n" % (K, K, K), value_block(k + "a", v) + value_block(k + "c", b"") + b"END\r\n",
           {k + "a": v, k + "c": b""}, lambda c: c.get_many([k + "a", k + "b", k + "c"])),
        Op(b"set %s 0 5 %d\r\n%s\r\n" % (K, len(v), v), b"STORED\r\n", None, lambda c: c.set(k, v, 5)),
        Op(b"set %s 0 0 %d\r\n%s\r\n" % (K, len(v), v), b"SERVER_ERROR out of memory storing object\r\n",
           MemcachedError, lambda c: c.set(k, v)),
        Op(b"add %s 0 0 %d\r\n%s\r\n" % (K, len(v), v), b"NOT_STORED\r\n", False, lambda c: c.add(k, v)),
        Op(b"add %s 0 0 %d\r\n%s\r\n" % (K, len(v), v), b"STORED\r\n", True, lambda c: c.add(k, v)),
        Op(b"incr %s 5\r\n" % K, b"42\r\n", 42, lambda c: c.incr(k, 5)),
        Op(b"decr %s 3\r\n" % K, b"NOT_FOUND\r\n", None, lambda c: c.decr(k, 3)),
        Op(b"incr %s 1\r\n" % K, b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
           MemcachedError, lambda c: c.incr(k, 1)),
        Op(b"incr %s 2\r\n" % K, b"ERROR\r\n", MemcachedError, lambda c: c.incr(k, 2)),
        Op(b"incr %s 7\r\n" % K, b"7\r\n", (b"7\r\n", None), lambda c: via_callback(c, b"incr", k, 7)),
        Op(b"decr %s 7\r\n" % K, b"NOT_FOUND\r\n", (b"NOT_FOUND\r\n", None), lambda c: via_callback(c, b"decr", k, 7)),
        Op(b"incr %s 9\r\n" % K, b"SERVER_ERROR busy\r\n", (b"SERVER_ERROR busy\r\n", None),
           lambda c: via_callback(c, b"incr", k, 9)),
        Op(b"delete %s\r\n" % K, b"DELETED\r\n", True, lambda c: c.delete(k)),
        Op(b"delete %s\r\n" % K, b"NOT_FOUND\r\n", False, lambda c: c.delete(k)),
        Op(b"touch %s 10\r\n" % K, b"TOUCHED\r\n", True, lambda c: c.touch(k, 10)),
        Op(b"touch %s 10\r\n" % K, b"NOT_FOUND\r\n", False, lambda c: c.touch(k, 10)),
        Op(b"version\r\n", b"VERSION 1.6.21\r\n", "1.6.21", lambda c: c.version()),
        Op(b"version\r\n", b"ERROR\r\n", MemcachedError, lambda c: c.version()),
    ]


KINDS = len(_op_kinds(0))


async def run_pipeline(h: Harness, ops: list[Op], cut: Callable[[bytes], list[bytes]]) -> None:
    """Send ops in one event-loop pass, answer them in one stream split by `cut`, check every outcome."""
    side = h.server.accepted[-1]
    done = len(side.requests)
    tasks = [asyncio.ensure_future(outcome(op.call(h.client))) for op in ops]
    requests = (await h.requests(done + len(ops), side))[done:]
    assert requests == [op.request for op in ops]  # in order ...
    assert h.client_side(side).sends[-1] == b"".join(requests)  # ... and in one send
    chunks = cut(b"".join(op.reply for op in ops))
    await h.answer(*chunks, side=side)
    assert [await t for t in tasks] == [op.expected for op in ops]
    assert h.client_side(side).reads[-len(chunks):] == chunks
    assert len(h.server.accepted) == 1 and not side.eof.is_set()  # errors were replies, not desyncs


async def _opened(h: Harness) -> None:
    first = asyncio.ensure_future(h.client.version())
    await h.requests(1)
    await h.answer(b"VERSION 1.6.21\r\n")
    assert await first == "1.6.21"


def test_pipelined_replies_in_one_read_reach_their_callers() -> None:
    async def scenario() -> None:
        async with fake_memcached() as h:
            await _opened(h)
            await run_pipeline(h, [kind for i in range(2) for kind in _op_kinds(i)], lambda stream: [stream])

    run(scenario())


def test_one_reply_across_many_reads_and_many_replies_per_read() -> None:
    async def scenario() -> None:
        async with fake_memcached() as h:
            await _opened(h)
            ops = _op_kinds(0)
            await run_pipeline(h, ops, lambda s: [s[i:i + 7] for i in range(0, len(s), 7)])
            await run_pipeline(h, ops, lambda s: [s[i:i + 1] for i in range(len(s))])

    run(scenario())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, KINDS - 1), min_size=1, max_size=12), st.data())
def test_pipelines_cut_anywhere(kinds: list[int], data: st.DataObject) -> None:
    ops = [_op_kinds(i)[kind] for i, kind in enumerate(kinds)]
    total = sum(len(op.reply) for op in ops)
    cuts = sorted(data.draw(st.sets(st.integers(1, total - 1), max_size=12), label="cuts"))

    def cut(stream: bytes) -> list[bytes]:
        bounds = [0, *cuts, len(stream)]
        return [stream[a:b] for a, b in itertools.pairwise(bounds)]

    async def scenario() -> None:
        async with fake_memcached() as h:
            await _opened(h)
            await run_pipeline(h, ops, cut)

    run(scenario())


def test_a_raising_callback_does_not_stop_the_replies_behind_it(caplog: pytest.LogCaptureFixture) -> None:
    def broken(reply: Any, error: Any) -> None:
        raise RuntimeError("callback bug")

    async def scenario() -> None:
        async with fake_memcached() as h:
            await _opened(h)
            h.client.arith(b"incr", "a", 1, broken)
            behind = asyncio.ensure_future(h.client.incr("b", 1))
            await h.requests(3)
            await h.answer(b"1\r\n2\r\n")
            assert await behind == 2

    with caplog.at_level(logging.ERROR, logger=client_module.__name__):
        run(scenario())
    assert "memcached reply callback failed" in caplog.text


def test_a_caller_that_gives_up_does_not_shift_the_replies() -> None:
    async def scenario() -> None:
        async with fake_memcached() as h:
            await _opened(h)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(h.client.get("gave-up"), 0.05)
            later = asyncio.ensure_future(h.client.get("later"))
            await h.requests(3)
            await h.answer(value_block("gave-up", b"old") + b"END\r\n" + value_block("later", b"new") + b"END\r\n")
            assert await later == b"new"

    run(scenario())


# -- errors that drop the connection --------------------------------------------------------------------------


async def _waiting_three(h: Harness) -> tuple[list[asyncio.Future[Any]], list[Any]]:
    """A get, an incr and a callback arith waiting on the current connection, sent in this order."""
    called: list[Any] = []
    sent = len(h.server.accepted[-1].requests)
    futures = [asyncio.ensure_future(outcome(h.client.get("g"))), asyncio.ensure_future(outcome(h.client.incr("i", 1)))]
    await h.requests(sent + 2)
    h.client.arith(b"incr", "cb", 1, lambda reply, error: called.append((reply, type(error))))
    return futures, called


async def _all_failed(futures: list[asyncio.Future[Any]], called: list[Any], within_s: float = 5.0) -> None:
    """Every waiting request failed within within_s: well before the client's timeout_s could fail them; as
    unanswered (MemcachedUnanswered): memcached may have applied them."""
    async with asyncio.timeout(within_s):
        assert [await f for f in futures] == [MemcachedError, MemcachedError]
    await until(lambda: bool(called), "the callback", within_s)
    assert called == [(None, MemcachedUnanswered)]  # once, with the error


async def _reconnects(h: Harness) -> None:
    """The next request opens a new connection and works."""
    n = len(h.server.accepted)
    again = asyncio.ensure_future(h.client.incr("again", 1))
    side = await h.server.connection(n + 1)
    assert await h.requests(1, side) == [b"incr again 1\r\n"]
    await h.answer(b"5\r\n", side=side)
    assert await again == 5


@pytest.mark.parametrize("reply", [b"SERVER_ERROR out of memory\r\n", b"ERROR\r\n", b"CLIENT_ERROR bad\r\n",
                                   b"VALUE g 0 notanumber\r\n", b"STORED\r\n"])
def test_an_error_reply_to_a_get_fails_everything_waiting_and_drops_the_connection(reply: bytes) -> None:
    async def scenario() -> None:
        async with fake_memcached() as h:
            await _opened(h)
            futures, called = await _waiting_three(h)
            side = h.server.accepted[0]
            await h.requests(4)
            await h.answer(reply)
            await _all_failed(futures, called)
            await asyncio.wait_for(side.eof.wait(), 5)  # the client closed it
            await _reconnects(h)

    run(scenario())


def test_an_unsolicited_reply_drops_the_connection_but_keeps_the_answer_before_it() -> None:
    async def scenario() -> None:
        async with fake_memcached() as h:
            answered = asyncio.ensure_future(h.client.version())
            await h.requests(1)
            await h.answer(b"VERSION 1.6.21\r\nEND\r\n")
            assert await answered == "1.6.21"
            await asyncio.wait_for(h.server.accepted[0].eof.wait(), 5)
            await _reconnects(h)

    run(scenario())


@pytest.mark.parametrize("partial", [b"", b"VALUE g 0 5\r\nab", b"VALUE g 0 5\r\nabcde\r\n", b"VALU"])
def test_the_server_closing_before_or_mid_reply_fails_everything_waiting(partial: bytes) -> None:
    async def scenario() -> None:
        async with fake_memcached() as h:
            await _opened(h)
            futures, called = await _waiting_three(h)
            await h.requests(4)
            if partial:
                await h.answer(partial)
            await h.server.accepted[0].close()
            await _all_failed(futures, called)
            await _reconnects(h)

    run(scenario())


def test_a_silent_server_times_out_after_timeout_s_and_the_connection_is_dropped() -> None:
    async def scenario() -> None:
        async with fake_memcached(timeout_s=0.3) as h:
            await _opened(h)
            started = time.monotonic()
            futures, called = await _waiting_three(h)
            await _all_failed(futures, called)
            assert 0.3 <= time.monotonic() - started < 3
            await asyncio.wait_for(h.server.accepted[0].eof.wait(), 5)
            await _reconnects(h)

    run(scenario())


def test_the_timeout_counts_from_each_request_not_from_the_first() -> None:
    """A request queued after an answered one gets its own timeout_s, however long the connection was busy."""
    async def scenario() -> None:
        async with fake_memcached(timeout_s=1.0) as h:
            await _opened(h)
            first = asyncio.ensure_future(h.client.incr("a", 1))
            await h.requests(2)
            await asyncio.sleep(0.6)  # scripted: the server is slow
            await h.answer(b"1\r\n")
            assert await first == 1
            second = asyncio.ensure_future(h.client.incr("b", 1))
            await h.requests(3)
            await asyncio.sleep(0.6)  # 1.2 s after the first request, 0.6 s after this one
            await h.answer(b"2\r\n")
            assert await second == 2

    run(scenario())


def test_close_fails_waiting_requests_and_a_later_request_reconnects() -> None:
    async def scenario() -> None:
        async with fake_memcached() as h:
            await _opened(h)
            futures, called = await _waiting_three(h)
            await h.requests(4)
            await h.client.close()
            await _all_failed(futures, called)
            await _reconnects(h)

    run(scenario())


# -- connecting -----------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_refused_connection_fails_both_forms_with_memcached_error() -> None:
    async def scenario() -> None:
        client = AsyncMemcached("127.0.0.1", _free_port(), timeout_s=5.0)
        called: list[Any] = []
        client.arith(b"incr", "k", 1, lambda reply, error: called.append((reply, type(error))))
        assert await outcome(client.get("k")) is MemcachedError
        await until(lambda: bool(called), "the callback")
        assert called == [(None, MemcachedError)]

    run(scenario())


@asynccontextmanager
async def gated_connect() -> AsyncIterator[asyncio.Event]:
    """Hold the loop's create_connection until the event is set."""
    loop = asyncio.get_running_loop()
    gate, real = asyncio.Event(), loop.create_connection

    async def held(*args: Any, **kwargs: Any) -> Any:
        await gate.wait()
        return await real(*args, **kwargs)

    with mock.patch.object(loop, "create_connection", held):
        yield gate


def test_a_connect_slower_than_timeout_s_fails_and_the_next_request_connects() -> None:
    async def scenario() -> None:
        async with fake_memcached(timeout_s=0.2) as h, gated_connect() as gate:
            assert await outcome(h.client.get("k")) is MemcachedError
            gate.set()
            await _reconnects(h)

    run(scenario())


def test_a_caller_cancelled_while_connecting_does_not_wedge_the_connection_slot() -> None:
    async def scenario() -> None:
        async with fake_memcached() as h, gated_connect() as gate:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(h.client.get("k"), 0.05)
            gate.set()
            await _reconnects(h)

    run(scenario())


def test_concurrent_first_requests_share_one_connection_per_slot() -> None:
    async def scenario() -> None:
        async with fake_memcached(pool_size=2) as h:
            keys = [f"k{i}" for i in range(10)]
            gets = [asyncio.ensure_future(h.client.get(k)) for k in keys]
            await until(lambda: sum(len(s.requests) for s in h.server.accepted) == len(keys), "every request")
            assert len(h.server.accepted) == 2
            for side in h.server.accepted:
                names = [r.split()[1].decode() for r in side.requests]
                await h.answer(b"".join(value_block(k, k.encode()) + b"END\r\n" for k in names), side=side)
            assert await asyncio.gather(*gets) == [k.encode() for k in keys]

    run(scenario())


def test_the_client_reconnects_from_a_new_event_loop() -> None:
    """A CLI runs asyncio.run more than once with the same client."""
    client: list[AsyncMemcached] = []
    port = _free_port()

    async def once(answer: bytes) -> None:
        async with fake_memcached(port=port) as h:
            c = client[0] if client else h.client
            client[:1] = [c]
            got = asyncio.ensure_future(c.incr("k", 1))
            await h.requests(1)
            await h.answer(answer)
            assert await got == int(answer)

    run(once(b"1\r\n"))
    run(once(b"2\r\n"))


# -- helpers --------------------------------------------------------------------------------------------------


def test_arith_value_reads_the_reply_line() -> None:
    assert arith_value(b"incr", "k", b"18446744073709551615\r\n") == 2**64 - 1
    assert arith_value(b"decr", "k", b"NOT_FOUND\r\n") is None
    for reply in (b"ERROR\r\n", b"CLIENT_ERROR invalid numeric delta argument\r\n", b"SERVER_ERROR busy\r\n"):
        with pytest.raises(MemcachedError, match="incr k"):
            arith_value(b"incr", "k", reply)


@pytest.mark.parametrize(("key", "legal"), [
    ("k", True), ("x" * MAX_KEY_BYTES, True), ("!~:#/{}", True),
    ("", False), ("x" * (MAX_KEY_BYTES + 1), False), ("a b", False), ("a\r\nflush_all", False), ("a\tb", False),
    ("a\x7f", False), ("é", False), ("k\n", False),
])
def test_is_legal_key(key: str, legal: bool) -> None:
    assert is_legal_key(key) is legal
