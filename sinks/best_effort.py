"""BEST_EFFORT counters: memcached `incr`/`decr` with a TTL, exact for negative deltas and totals.

memcached counters are unsigned 64-bit: `decr` stops at zero and `incr` wraps at 2**64. Storing
`count + 2**63` (a bias) keeps every signed 64-bit count in range, so both are exact: a decr below the bias
is a negative count, and a count outside int64 is refused before it could wrap.
"""

from __future__ import annotations

import time
from typing import Protocol

import xxhash

from sinks.cache import _parse_servers
from sinks.memcached_client import AsyncMemcached, MemcachedError, is_legal_key

BIAS = 1 << 63
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_MAX_RELATIVE_TTL_S = 30 * 24 * 3600


class CounterUnavailable(RuntimeError):
    """The best-effort counter backend (memcached) cannot be reached."""


class CounterOverflow(ValueError):
    """The count would leave the signed 64-bit range."""


def counter_key(namespace: str, counter: str) -> str:
    """`<namespace>:<counter_name>` as in the post, hashed when it is not a legal memcached key."""
    key = f"{namespace}:{counter}"
    if is_legal_key(key):
        return key
    return "be#" + xxhash.xxh3_128_hexdigest(key.encode("utf-8"))


class BestEffortCounters(Protocol):
    async def add(self, namespace: str, counter: str, delta: int, ttl_s: float | None) -> int: ...
    async def get(self, namespace: str, counter: str) -> int: ...
    async def clear(self, namespace: str, counter: str) -> None: ...
    async def healthy(self) -> bool: ...
    async def close(self) -> None: ...


def _expire(ttl_s: float | None) -> int:
    if not ttl_s or ttl_s <= 0:
        return 0
    return int(time.time() + ttl_s) if ttl_s > _MAX_RELATIVE_TTL_S else max(1, int(ttl_s))


class MemcachedCounters:
    """Signed counters in memcached. Errors raise CounterUnavailable: a best-effort write must not pretend."""

    def __init__(self, server: str, *, timeout_s: float = 0.25, pool_size: int = 1) -> None:
        (host, port), *rest = _parse_servers(server)
        if rest:
            raise ValueError("BEST_EFFORT counters use one memcached server (EVCache replicas are future work)")
        self.address = f"{host}:{port}"
        self._client = AsyncMemcached(host, port, timeout_s=timeout_s, pool_size=pool_size)
        self._touched: dict[str, float] = {}

    async def add(self, namespace: str, counter: str, delta: int, ttl_s: float | None) -> int:
        key = counter_key(namespace, counter)
        try:
            for _ in range(3):
                raw = await (self._client.incr(key, delta) if delta >= 0 else self._client.decr(key, -delta))
                if raw is None:  # missing (new or expired): create at the bias, then apply
                    await self._client.add(key, str(BIAS).encode(), _expire(ttl_s))
                    continue
                if delta > 0 and raw < delta:  # wrapped past 2**64: undo (modular) and refuse
                    await self._client.incr(key, (1 << 64) - delta)
                    raise CounterOverflow(f"count of {namespace}:{counter} would exceed {INT64_MAX}")
                if delta < 0 and raw == 0:  # decr clamped at zero: the exact value is lost below INT64_MIN
                    raise CounterOverflow(f"count of {namespace}:{counter} would fall below {INT64_MIN}")
                await self._refresh_ttl(key, ttl_s)
                return raw - BIAS
        except MemcachedError as exc:
            raise CounterUnavailable(str(exc)) from exc
        raise CounterUnavailable(f"memcached {self.address}: key {key} vanished repeatedly")

    async def _refresh_ttl(self, key: str, ttl_s: float | None) -> None:
        """`incr` keeps the expiry set at creation; touch it again at most every tenth of the TTL."""
        if not ttl_s or ttl_s <= 0:
            return
        now = time.monotonic()
        if self._touched.get(key, 0.0) + ttl_s / 10 > now:
            return
        if len(self._touched) > 100_000:
            self._touched.clear()
        self._touched[key] = now
        await self._client.touch(key, _expire(ttl_s))

    async def get(self, namespace: str, counter: str) -> int:
        try:
            raw = await self._client.get(counter_key(namespace, counter))
        except MemcachedError as exc:
            raise CounterUnavailable(str(exc)) from exc
        return 0 if raw is None else int(raw) - BIAS

    async def clear(self, namespace: str, counter: str) -> None:
        try:
            await self._client.delete(counter_key(namespace, counter))
        except MemcachedError as exc:
            raise CounterUnavailable(str(exc)) from exc

    async def healthy(self) -> bool:
        try:
            return bool(await self._client.version())
        except MemcachedError:
            return False

    async def close(self) -> None:
        await self._client.close()


class InProcessCounters:
    """Best-effort counters in this process, for the embedded default without memcached."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[int, float]] = {}

    async def add(self, namespace: str, counter: str, delta: int, ttl_s: float | None) -> int:
        key = counter_key(namespace, counter)
        now = time.monotonic()
        value, expires = self._data.get(key, (0, 0.0))
        if expires and expires <= now:
            value = 0
        value += delta
        if not INT64_MIN <= value <= INT64_MAX:
            raise CounterOverflow(f"count of {namespace}:{counter} would leave the int64 range")
        self._data[key] = (value, now + ttl_s if ttl_s else 0.0)
        return value

    async def get(self, namespace: str, counter: str) -> int:
        value, expires = self._data.get(counter_key(namespace, counter), (0, 0.0))
        return 0 if expires and expires <= time.monotonic() else value

    async def clear(self, namespace: str, counter: str) -> None:
        self._data.pop(counter_key(namespace, counter), None)

    async def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        pass


def open_counters(spec: str | None) -> BestEffortCounters:
    """"memory"/None -> in-process; "memcached://host:port" -> memcached."""
    if not spec or spec == "memory":
        return InProcessCounters()
    return MemcachedCounters(spec)
