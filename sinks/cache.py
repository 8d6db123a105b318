"""Rollup cache: one value per counter holding BOTH count and rollup_ts.

One value (never two keys) so a reader can never pair a count with another rollup's timestamp;
ACCURATE reads add the live delta of events after exactly that rollup_ts.

The cache is best effort: the rollup store is the truth. Nothing here ever raises to a caller; a
memcached outage degrades reads to the store (a circuit breaker skips memcached for ~1 s after a
failure, so an outage costs reads almost nothing) and never fails a write.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, runtime_checkable

__all__ = ["Key", "RollupCache", "open_cache"]

Key = tuple[str, str]


@runtime_checkable
class RollupCache(Protocol):
    """Async, so an asyncio server keeps serving while memcached answers."""

    async def get(self, namespace: str, counter: str) -> tuple[int, int] | None:
        """(count, rollup_ts) from one cached value, or None on a miss (or an outage)."""
        ...

    async def get_many(self, keys: Iterable[Key]) -> dict[Key, tuple[int, int]]:
        """Hits only; misses are absent."""
        ...

    async def set(self, namespace: str, counter: str, count: int, rollup_ts: int,
                  ttl_s: float | None = None) -> None:
        """Store (count, rollup_ts) whatever the cache holds; ttl_s None = the cache's default. Never raises."""
        ...

    async def advance(self, namespace: str, counter: str, count: int, rollup_ts: int,
                      ttl_s: float | None = None) -> None:
        """Store (count, rollup_ts) unless the cache holds a later rollup_ts: what a rollup or a reader's fill
        after a miss writes, so that one writing a rollup it read before another was cached never replaces the
        newer value (EVENTUAL reads would serve the older count until the next rollup). Never raises."""
        ...

    async def advance_many(self, rollups: Iterable[tuple[str, str, int, int, float | None]]) -> None:
        """`advance` for each (namespace, counter, count, rollup_ts, ttl_s), as one call: what a rollup batch writes.
        Never raises."""
        ...

    async def delete(self, namespace: str, counter: str) -> None: ...

    async def healthy(self) -> bool: ...

    async def close(self) -> None: ...


def open_cache(spec: str | None, *, default_ttl_s: float | None = None,
               local_max_ttl_s: float | None = None, key_prefix: str = "",
               scope: Callable[[], Awaitable[str]] | None = None) -> RollupCache:
    """None / "" / "memory" -> in-process; "host:port[,host:port]" or "memcached://..." -> memcached, its keys
    prefixed by `key_prefix` and the identity `scope` gives: the service passes its deployment's name
    (COUNTER_WORKER_ID) and its rollup store's `identity`, since two deployments sharing one memcached and a
    namespace name would read each other's rollups, and a new store (a fresh data directory or keyspace) the counts
    an earlier one cached (wrong counts).

    `local_max_ttl_s` bounds how long an in-process cache keeps a value whatever TTL a namespace asks for: the
    API's own cache never sees the worker's rollups, so a namespace's hour-long `ttl` would serve its first read
    for an hour. ("auto" is resolved by the launcher, which knows whether it started a local memcached.)
    """
    from sinks.memcached.rollup_cache import MemcachedRollupCache
    from sinks.memory.rollup_cache import InProcessRollupCache

    text = (spec or "").strip()
    if text in ("", "memory"):
        return InProcessRollupCache(default_ttl_s=default_ttl_s, max_ttl_s=local_max_ttl_s)
    if text in ("auto", "default"):
        raise ValueError(f"cache {spec!r} must be resolved to 'memory' or 'memcached://host:port' first")
    if text.startswith("memcached://") or "://" not in text:
        return MemcachedRollupCache(text, default_ttl_s=default_ttl_s, key_prefix=key_prefix, scope=scope)
    raise ValueError(f"unknown cache {spec!r}: expected 'memory' or 'memcached://host:port[,host:port]'")
