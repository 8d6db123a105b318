"""A small asyncio memcached client (text protocol) that pipelines requests over a few connections.

A blocking client stalls every request of an asyncio server for each round trip; a connection per request
costs a pool, a semaphore and a stream reader per call. Here each request goes to one of a few shared
connections and waits on a future (or, on the hottest path, passes a callback that the read callback calls
with the reply: no future, no extra loop pass); the requests made during one event-loop pass leave in one
send (a system call per request was a tenth of a cached GetCount). Replies come back in order (memcached answers a
connection's requests in sequence) and are matched first-in, first-out. A connection that saw an error, an unexpected
reply or a timeout is closed and every request waiting on it fails with MemcachedError; the next request
opens a new one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, cast, overload

log = logging.getLogger(__name__)

_LINE, _VALUES, _CAS_VALUES = 0, 1, 2  # reply shapes: one line, or VALUE blocks up to END (with cas uniques)
MAX_KEY_BYTES = 250
NON_NUMERIC = b"CLIENT_ERROR cannot increment or decrement non-numeric value"
_LEGAL_KEY = re.compile(rf"[!-~]{{1,{MAX_KEY_BYTES}}}")


def is_legal_key(key: str) -> bool:
    """memcached's text-protocol key rule: 1 to 250 printable ASCII characters, no space."""
    return _LEGAL_KEY.fullmatch(key) is not None


class MemcachedError(RuntimeError):
    """memcached could not be reached or answered something unexpected."""

    unanswered = False  # whether the request went to memcached and got no reply (`MemcachedUnanswered`)


class MemcachedNonNumeric(MemcachedError):
    """memcached refused an `incr`/`decr` of a value it read as not a number. memcached (1.6.18, Debian's) also says so
    of a number of 2**63 or more when a `-` follows it in the item's memory slot before a NUL byte: its check for a
    minus sign reads past the value into a freed item's bytes (`safe_strtoull`'s strchr). The key is then refused on
    every `incr` until it is stored anew (sinks.memcached.counters reads it back and stores its new value then)."""


class MemcachedUnanswered(MemcachedError):
    """A request queued on a connection that then timed out or broke: memcached may have applied it, so a write
    that failed so is not known to be undone (a review's five `incr`s answered 503 were applied on resume)."""

    unanswered = True


OnReply = Callable[[Any, "MemcachedError | None"], None]  # (reply, None) or (None, error)
Waiter = asyncio.Future | OnReply


def _deliver(waiter: Waiter, reply: Any, error: MemcachedError | None) -> None:
    if isinstance(waiter, asyncio.Future):
        if not waiter.done():
            waiter.set_result(reply) if error is None else waiter.set_exception(error)
        return
    try:
        waiter(reply, error)
    except Exception:  # a callback's bug must not stop the replies of the requests behind it
        log.exception("memcached reply callback failed")


class _Connection(asyncio.Protocol):
    """One connection: requests go out in order, replies resolve their futures in the same order."""

    def __init__(self, address: str, timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.transport: asyncio.Transport | None = None
        self.broken: MemcachedError | None = None
        self._pending: deque[tuple[int, Waiter, float]] = deque()
        self._buffer = bytearray()
        self._outgoing: list[bytes] = []  # written once per event-loop pass: one send for many requests
        self._watchdog: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    # -- used by the client ---------------------------------------------------------------------------

    @overload
    def request(self, data: bytes, shape: int, on_reply: None = None) -> asyncio.Future: ...
    @overload
    def request(self, data: bytes, shape: int, on_reply: OnReply) -> None: ...

    def request(self, data: bytes, shape: int, on_reply: OnReply | None = None) -> asyncio.Future | None:
        """Queue a request: its reply resolves the returned future, or is passed to on_reply if given."""
        waiter = self._loop.create_future() if on_reply is None else on_reply
        if self.broken is not None:
            _deliver(waiter, None, self.broken)
            return None if on_reply else waiter  # type: ignore[return-value]  # the future when on_reply is None
        self._pending.append((shape, waiter, time.monotonic()))
        if not self._outgoing:
            self._loop.call_soon(self._flush)
        self._outgoing.append(data)
        if self._watchdog is None:
            self._watchdog = self._loop.call_later(self.timeout_s, self._check_timeout)
        return None if on_reply else waiter  # type: ignore[return-value]  # the future when on_reply is None

    def close(self) -> None:
        self._fail(MemcachedError(f"memcached {self.address}: connection closed"))

    # -- asyncio.Protocol -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream connection's transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(MemcachedError(f"memcached {self.address}: connection lost ({exc or 'closed by server'})"))

    def data_received(self, data: bytes) -> None:
        if self._buffer:  # the rest of a reply that began in an earlier read
            data = bytes(self._buffer + data)
        at, pending = 0, self._pending
        while pending:
            shape, waiter, _ = pending[0]
            if shape == _LINE:
                end = data.find(b"\r\n", at)
                if end < 0:
                    break
                reply: bytes | dict[str, bytes] = data[at:end + 2]
                at = end + 2
            else:
                try:
                    parsed = _parse_values(data, at, shape == _CAS_VALUES)
                except ValueError as exc:
                    self._fail(MemcachedError(f"memcached {self.address}: {exc}"))
                    return
                if parsed is None:
                    break
                reply, at = parsed
            pending.popleft()
            if isinstance(waiter, asyncio.Future):  # inline _deliver: this runs once per reply
                if not waiter.done():
                    waiter.set_result(reply)
            else:
                _deliver(waiter, reply, None)
        if at < len(data):
            self._buffer = bytearray(data[at:])
        elif self._buffer:
            self._buffer.clear()
        if not pending and self._buffer:
            self._fail(MemcachedError(f"memcached {self.address}: unexpected reply {bytes(self._buffer[:60])!r}"))

    # -- internals ------------------------------------------------------------------------------------

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        if self.broken is None and outgoing:
            # requests reach a connection only once it is connected (the client awaits _connect first)
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
        unanswered = MemcachedUnanswered(str(error)) if pending else error
        for _, waiter, _ in pending:
            _deliver(waiter, None, unanswered)
        if self.transport is not None:
            self.transport.close()


def _parse_values(data: bytes, at: int, cas: bool = False) -> tuple[dict[str, Any], int] | None:
    """`VALUE <key> <flags> <bytes>[ <cas unique>]\\r\\n<data>\\r\\n` blocks up to `END\\r\\n` from offset `at`:
    the values (with `cas`, (value, cas unique) pairs) and the offset after END, or None when incomplete."""
    found: dict[str, Any] = {}
    while True:
        end = data.find(b"\r\n", at)
        if end < 0:
            return None
        if end - at == 3 and data[at:end] == b"END":
            return found, end + 2
        parts = data[at:end].split()
        if len(parts) < 4 or parts[0] != b"VALUE":
            raise ValueError(f"unexpected reply {data[at:end][:60]!r}")
        start, stop = end + 2, end + 2 + int(parts[3])
        if len(data) < stop + 2:
            return None
        if cas and len(parts) < 5:
            raise ValueError(f"no cas unique in {data[at:end][:60]!r}")
        found[parts[1].decode()] = (data[start:stop], int(parts[4])) if cas else data[start:stop]
        at = stop + 2


def arith_value(cmd: bytes, key: str, reply: bytes) -> int | None:
    """The value an `incr`/`decr` reply carries; None when the key is missing."""
    if reply == b"NOT_FOUND\r\n":
        return None
    if not reply[:1].isdigit():
        error = MemcachedNonNumeric if reply.startswith(NON_NUMERIC) else MemcachedError
        raise error(f"{cmd.decode()} {key}: {reply.strip()[:80]!r}")
    return int(reply)


def _forward_outcome(on_reply: OnReply, task: asyncio.Task) -> None:
    if task.cancelled():
        _deliver(on_reply, None, MemcachedError("memcached request cancelled"))
    elif (exc := task.exception()) is None:
        _deliver(on_reply, task.result(), None)
    else:
        _deliver(on_reply, None, exc if isinstance(exc, MemcachedError) else MemcachedError(repr(exc)))


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

    async def gets(self, key: str) -> tuple[bytes, int] | None:
        """The value and its cas unique (for `cas`), or None when absent."""
        return (await self._request(b"gets %s\r\n" % key.encode(), _CAS_VALUES)).get(key)

    async def gets_many(self, keys: Iterable[str]) -> dict[str, tuple[bytes, int]]:
        """`gets` of several keys in one request: the values held, each with its cas unique."""
        keys = list(keys)
        if not keys:
            return {}
        return await self._request(b"gets " + " ".join(keys).encode() + b"\r\n", _CAS_VALUES)

    async def cas(self, key: str, value: bytes, unique: int, expire: int = 0) -> bytes:
        """Store only if the value is still the one `gets` returned with `unique`: memcached's reply,
        STORED, EXISTS (changed since) or NOT_FOUND (gone since)."""
        request = b"cas %s 0 %d %d %d\r\n%s\r\n" % (key.encode(), expire, len(value), unique, value)
        return (await self._request(request, _LINE)).strip()

    async def incr(self, key: str, delta: int) -> int | None:
        return await self._arith(b"incr", key, delta)

    async def decr(self, key: str, delta: int) -> int | None:
        return await self._arith(b"decr", key, delta)

    def arith(self, cmd: bytes, key: str, delta: int, on_reply: OnReply) -> None:
        """`incr`/`decr`, passing memcached's raw reply line (`arith_value` reads it) or the error to on_reply,
        called from the connection's read callback: no task, no future, no extra loop pass. For the BEST_EFFORT
        AddCount hot path; on_reply runs on the event loop and must not block."""
        self._submit(b"%s %s %d\r\n" % (cmd, key.encode(), delta), _LINE, on_reply)

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop this client's connections belong to: the running one at first use, or after the previous
        loop closed (a CLI's next asyncio.run)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            # Not get_running_loop() on every call: it costs a getpid() system call (8% of a fast request).
            loop = self._loop = asyncio.get_running_loop()
            self._slots, self._next = [None] * self.pool_size, 0
        return loop

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
        """Close the connections (requests waiting on them fail); a later request opens a new one."""
        slots, self._slots = self._slots, [None] * self.pool_size
        for conn in slots:
            if isinstance(conn, _Connection):
                conn.close()

    # -- plumbing ---------------------------------------------------------------------------------------

    async def _store(self, cmd: bytes, key: str, value: bytes, expire: int) -> bytes:
        request = b"%s %s 0 %d %d\r\n%s\r\n" % (cmd, key.encode(), expire, len(value), value)
        return await self._request(request, _LINE)

    async def _arith(self, cmd: bytes, key: str, delta: int) -> int | None:
        return arith_value(cmd, key, await self._request(b"%s %s %d\r\n" % (cmd, key.encode(), delta), _LINE))

    async def _request(self, data: bytes, shape: int) -> Any:
        return await self._submit(data, shape)

    @overload
    def _submit(self, data: bytes, shape: int, on_reply: None = None) -> asyncio.Future: ...
    @overload
    def _submit(self, data: bytes, shape: int, on_reply: OnReply) -> None: ...

    def _submit(self, data: bytes, shape: int, on_reply: OnReply | None = None) -> asyncio.Future | None:
        """Send on the slot's live connection, or from a task once the slot has connected. Without on_reply,
        the future of the reply."""
        loop = self.event_loop()
        i = self._next = (self._next + 1) % self.pool_size
        conn = self._slots[i]
        if isinstance(conn, _Connection) and conn.broken is None:
            return conn.request(data, shape, on_reply)
        task = loop.create_task(self._connect_and_send(loop, i, data, shape))
        if on_reply is None:
            return task
        task.add_done_callback(functools.partial(_forward_outcome, on_reply))
        return None

    async def _connect_and_send(self, loop: asyncio.AbstractEventLoop, i: int, data: bytes, shape: int) -> Any:
        conn = await self._connect(loop, i)
        return await conn.request(data, shape)

    async def _connect(self, loop: asyncio.AbstractEventLoop, i: int) -> _Connection:
        """Slot i's connection, opened once however many callers wait for it. The opening runs in a task of its
        own: a caller cancelled meanwhile (its own timeout) must not leave the slot waiting forever."""
        opening = self._slots[i]
        if not isinstance(opening, asyncio.Future):
            opening = self._slots[i] = loop.create_task(self._open(loop, self._slots, i))
        return await asyncio.shield(opening)

    async def _open(self, loop: asyncio.AbstractEventLoop, slots: list[Any], i: int) -> _Connection:
        try:
            async with asyncio.timeout(self.timeout_s):
                _, conn = await loop.create_connection(lambda: _Connection(self.address, self.timeout_s),
                                                       self.host, self.port)
        except BaseException as exc:  # failed, or cancelled with its loop: the next request tries again
            slots[i] = None
            if isinstance(exc, OSError | TimeoutError):
                raise MemcachedError(f"memcached {self.address}: {type(exc).__name__}: {exc}") from exc
            raise
        slots[i] = conn
        if slots is not self._slots:  # close() ran meanwhile: nobody would ever close this one
            conn.close()
            raise MemcachedError(f"memcached {self.address}: client closed while connecting")
        return conn
