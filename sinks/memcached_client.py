"""A small asyncio memcached client (text protocol): the event loop keeps serving while memcached answers.

A blocking client stalls every request of an asyncio server for each round trip; this one awaits it. One
pool of connections per event loop; a connection that saw an error or a timeout is closed, never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


class MemcachedError(RuntimeError):
    """memcached could not be reached or answered something unexpected."""


class AsyncMemcached:
    def __init__(self, host: str, port: int, *, pool_size: int = 16, timeout_s: float = 0.25) -> None:
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.pool_size = pool_size
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._slots: asyncio.Semaphore | None = None

    # -- commands ---------------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        return (await self.get_many([key])).get(key)

    async def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        keys = list(keys)
        if not keys:
            return {}

        async def op(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> dict[str, bytes]:
            writer.write(b"get " + " ".join(keys).encode() + b"\r\n")
            found: dict[str, bytes] = {}
            while True:
                line = await reader.readuntil(b"\r\n")
                if line == b"END\r\n":
                    return found
                parts = line.split()
                if parts[0] != b"VALUE" or len(parts) < 4:
                    raise MemcachedError(f"unexpected reply {line[:60]!r}")
                data = await reader.readexactly(int(parts[3]) + 2)
                found[parts[1].decode()] = data[:-2]
        return await self._run(op)

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

    async def touch(self, key: str, expire: int) -> bool:
        return await self._line(f"touch {key} {expire}\r\n".encode()) == b"TOUCHED\r\n"

    async def delete(self, key: str) -> bool:
        return await self._line(f"delete {key}\r\n".encode()) == b"DELETED\r\n"

    async def version(self) -> str:
        reply = await self._line(b"version\r\n")
        if not reply.startswith(b"VERSION"):
            raise MemcachedError(f"unexpected reply {reply[:60]!r}")
        return reply[8:].strip().decode()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()

    # -- plumbing ---------------------------------------------------------------------------------------

    async def _store(self, cmd: bytes, key: str, value: bytes, expire: int) -> bytes:
        return await self._line(b"%s %s 0 %d %d\r\n%s\r\n" % (cmd, key.encode(), expire, len(value), value))

    async def _arith(self, cmd: bytes, key: str, delta: int) -> int | None:
        reply = await self._line(b"%s %s %d\r\n" % (cmd, key.encode(), delta))
        if reply == b"NOT_FOUND\r\n":
            return None
        if not reply[:1].isdigit():
            raise MemcachedError(f"{cmd.decode()} {key}: {reply.strip()[:80]!r}")
        return int(reply)

    async def _line(self, request: bytes) -> bytes:
        async def op(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
            writer.write(request)
            return await reader.readuntil(b"\r\n")
        return await self._run(op)

    async def _run(self, op):  # type: ignore[no-untyped-def]
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (e.g. a CLI's asyncio.run): connections are per loop
            self._loop, self._idle, self._slots = loop, [], asyncio.Semaphore(self.pool_size)
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            try:
                async with asyncio.timeout(self.timeout_s):
                    if conn is None:
                        conn = await asyncio.open_connection(self.host, self.port)
                    result = await op(*conn)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                    MemcachedError, ValueError) as exc:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn[1].close()
                raise MemcachedError(f"memcached {self.address}: {type(exc).__name__}: {exc}") from exc
            self._idle.append(conn)
            return result
