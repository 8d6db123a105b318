"""A small asyncio memcached client (text protocol) that pipelines requests over a few connections.

A blocking client stalls every request of an asyncio server for each round trip; a connection per request
costs a pool, a semaphore and a stream reader per call. Here each request goes to one of a few shared
connections and waits on a future; the requests made during one event-loop pass leave in one send (a
system call per request was a tenth of a cached GetCount). Replies come back in order (memcached answers a
connection's requests in sequence) and are matched first-in, first-out. A connection that saw an error, an unexpected
reply or a timeout is closed and every request waiting on it fails with MemcachedError; the next request
opens a new one.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Iterable

_LINE, _VALUES = 0, 1  # reply shapes: one line, or VALUE blocks up to END
MAX_KEY_BYTES = 250
_LEGAL_KEY = re.compile(rf"[!-~]{{1,{MAX_KEY_BYTES}}}")


def is_legal_key(key: str) -> bool:
    """memcached's text-protocol key rule: 1 to 250 printable ASCII characters, no space."""
    return _LEGAL_KEY.fullmatch(key) is not None


class MemcachedError(RuntimeError):
    """memcached could not be reached or answered something unexpected."""


class _Connection(asyncio.Protocol):
    """One connection: requests go out in order, replies resolve their futures in the same order."""

    def __init__(self, address: str, timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.transport: asyncio.Transport | None = None
        self.broken: MemcachedError | None = None
        self._pending: deque[tuple[int, asyncio.Future, float]] = deque()
        self._buffer = bytearray()
        self._outgoing: list[bytes] = []  # written once per event-loop pass: one send for many requests
        self._watchdog: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    # -- used by the client ---------------------------------------------------------------------------

    def request(self, data: bytes, shape: int) -> asyncio.Future:
        future = self._loop.create_future()
        if self.broken is not None:
            future.set_exception(self.broken)
            return future
        self._pending.append((shape, future, time.monotonic()))
        if not self._outgoing:
            self._loop.call_soon(self._flush)
        self._outgoing.append(data)
        if self._watchdog is None:
            self._watchdog = self._loop.call_later(self.timeout_s, self._check_timeout)
        return future

    def close(self) -> None:
        self._fail(MemcachedError(f"memcached {self.address}: connection closed"))

    # -- asyncio.Protocol -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(MemcachedError(f"memcached {self.address}: connection lost ({exc or 'closed by server'})"))

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        pending = self._pending
        while pending:
            shape, future, _ = pending[0]
            try:
                parsed = _parse_line(buffer) if shape == _LINE else _parse_values(buffer)
            except ValueError as exc:
                self._fail(MemcachedError(f"memcached {self.address}: {exc}"))
                return
            if parsed is None:
                break
            reply, used = parsed
            del buffer[:used]
            pending.popleft()
            if not future.done():
                future.set_result(reply)
        if not pending and buffer:
            self._fail(MemcachedError(f"memcached {self.address}: unexpected reply {bytes(buffer[:60])!r}"))

    # -- internals ------------------------------------------------------------------------------------

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        if self.broken is None and outgoing:
            self.transport.write(b"".join(outgoing))  # type: ignore[union-attr]

    def _check_timeout(self) -> None:
        self._watchdog = None
        if not self._pending:
            return
        waited = time.monotonic() - self._pending[0][2]
        if waited >= self.timeout_s:
            self._fail(MemcachedError(f"memcached {self.address}: no reply within {self.timeout_s}s"))
        else:
            self._watchdog = self._loop.call_later(self.timeout_s - waited, self._check_timeout)

    def _fail(self, error: MemcachedError) -> None:
        if self.broken is None:
            self.broken = error
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        pending, self._pending = self._pending, deque()
        for _, future, _ in pending:
            if not future.done():
                future.set_exception(error)
        if self.transport is not None:
            self.transport.close()


def _parse_line(buffer: bytearray) -> tuple[bytes, int] | None:
    end = buffer.find(b"\r\n")
    return None if end < 0 else (bytes(buffer[:end + 2]), end + 2)


def _parse_values(buffer: bytearray) -> tuple[dict[str, bytes], int] | None:
    """`VALUE <key> <flags> <bytes>\\r\\n<data>\\r\\n` blocks up to `END\\r\\n`, or None when incomplete."""
    found: dict[str, bytes] = {}
    at = 0
    while True:
        end = buffer.find(b"\r\n", at)
        if end < 0:
            return None
        if end - at == 3 and buffer[at:end] == b"END":
            return found, end + 2
        parts = bytes(buffer[at:end]).split()
        if len(parts) < 4 or parts[0] != b"VALUE":
            raise ValueError(f"unexpected reply {bytes(buffer[at:end][:60])!r}")
        start, stop = end + 2, end + 2 + int(parts[3])
        if len(buffer) < stop + 2:
            return None
        found[parts[1].decode()] = bytes(buffer[start:stop])
        at = stop + 2


def arith_value(cmd: bytes, key: str, reply: bytes) -> int | None:
    """The value an `incr`/`decr` reply carries; None when the key is missing."""
    if reply == b"NOT_FOUND\r\n":
        return None
    if not reply[:1].isdigit():
        raise MemcachedError(f"{cmd.decode()} {key}: {reply.strip()[:80]!r}")
    return int(reply)


class AsyncMemcached:
    def __init__(self, host: str, port: int, *, pool_size: int = 4, timeout_s: float = 0.25) -> None:
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.pool_size = max(1, pool_size)
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: list[_Connection | asyncio.Future | None] = []
        self._next = 0

    # -- commands ---------------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        return (await self._request(b"get %s\r\n" % key.encode(), _VALUES)).get(key)

    async def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        keys = list(keys)
        if not keys:
            return {}
        return await self._request(b"get " + " ".join(keys).encode() + b"\r\n", _VALUES)

    async def set(self, key: str, value: bytes, expire: int = 0) -> None:
        if await self._store(b"set", key, value, expire) != b"STORED\r\n":
            raise MemcachedError(f"set {key} was not stored")

    async def add(self, key: str, value: bytes, expire: int = 0) -> bool:
        """Store only if absent; True when stored."""
        return await self._store(b"add", key, value, expire) == b"STORED\r\n"

    async def incr(self, key: str, delta: int) -> int | None:
        return await self._arith(b"incr", key, delta)

    async def decr(self, key: str, delta: int) -> int | None:
        return await self._arith(b"decr", key, delta)

    def arith(self, cmd: bytes, key: str, delta: int) -> asyncio.Future[bytes]:
        """`incr`/`decr` as a future of memcached's raw reply line (`arith_value` reads it), for a caller that
        settles its result in a callback rather than a task: the BEST_EFFORT AddCount hot path."""
        return self._submit(b"%s %s %d\r\n" % (cmd, key.encode(), delta), _LINE)

    async def touch(self, key: str, expire: int) -> bool:
        return await self._request(b"touch %s %d\r\n" % (key.encode(), expire), _LINE) == b"TOUCHED\r\n"

    async def delete(self, key: str) -> bool:
        return await self._request(b"delete %s\r\n" % key.encode(), _LINE) == b"DELETED\r\n"

    async def version(self) -> str:
        reply = await self._request(b"version\r\n", _LINE)
        if not reply.startswith(b"VERSION"):
            raise MemcachedError(f"unexpected reply {reply[:60]!r}")
        return reply[8:].strip().decode()

    async def close(self) -> None:
        slots, self._slots = self._slots, []
        for conn in slots:
            if isinstance(conn, _Connection):
                conn.close()

    # -- plumbing ---------------------------------------------------------------------------------------

    async def _store(self, cmd: bytes, key: str, value: bytes, expire: int) -> bytes:
        request = b"%s %s 0 %d %d\r\n%s\r\n" % (cmd, key.encode(), expire, len(value), value)
        return await self._request(request, _LINE)

    async def _arith(self, cmd: bytes, key: str, delta: int) -> int | None:
        return arith_value(cmd, key, await self.arith(cmd, key, delta))

    async def _request(self, data: bytes, shape: int):  # type: ignore[no-untyped-def]
        return await self._submit(data, shape)

    def _submit(self, data: bytes, shape: int) -> asyncio.Future:
        """The future of this request's reply: sent on the slot's live connection, or by a task once the slot
        has connected."""
        loop = self._loop
        if loop is None or loop.is_closed():
            # First use, or a new event loop (a CLI's next asyncio.run): connections belong to one loop.
            # Not get_running_loop() on every call: it costs a getpid() system call (8% of a fast request).
            loop = self._loop = asyncio.get_running_loop()
            self._slots, self._next = [None] * self.pool_size, 0
        i = self._next = (self._next + 1) % self.pool_size
        conn = self._slots[i]
        if isinstance(conn, _Connection) and conn.broken is None:
            return conn.request(data, shape)
        return loop.create_task(self._connect_and_send(loop, i, data, shape))

    async def _connect_and_send(self, loop: asyncio.AbstractEventLoop, i: int, data: bytes, shape: int):  # type: ignore[no-untyped-def]
        conn = await self._connect(loop, i)
        return await conn.request(data, shape)

    async def _connect(self, loop: asyncio.AbstractEventLoop, i: int) -> _Connection:
        """Slot i's connection, opened once however many callers wait for it."""
        slot = self._slots[i]
        if isinstance(slot, asyncio.Future):  # another caller is connecting this slot
            return await asyncio.shield(slot)
        slots, opening = self._slots, loop.create_future()
        slots[i] = opening
        try:
            async with asyncio.timeout(self.timeout_s):
                _, conn = await loop.create_connection(lambda: _Connection(self.address, self.timeout_s),
                                                       self.host, self.port)
        except (OSError, TimeoutError) as exc:
            error = MemcachedError(f"memcached {self.address}: {type(exc).__name__}: {exc}")
            slots[i] = None
            opening.set_exception(error)
            opening.exception()  # retrieved: concurrent callers get it, nobody else needs to
            raise error from exc
        slots[i] = conn
        opening.set_result(conn)
        return conn
