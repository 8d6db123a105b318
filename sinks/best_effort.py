"""BEST_EFFORT counters: the interface, its errors and the factory (memcached, or in-process without it)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

__all__ = ["BestEffortCounters", "CounterUnavailable", "CounterWriteUnknown", "open_counters"]


class CounterUnavailable(RuntimeError):
    """The best-effort counter backend (memcached) cannot be reached."""


class CounterWriteUnknown(CounterUnavailable):
    """memcached took a BEST_EFFORT write (an add or a clear) and did not answer: it may have been applied, and a
    retry, which no token makes idempotent here, may count it twice."""


class BestEffortCounters(Protocol):
    def add(self, namespace: str, counter: str, delta: int, ttl_s: float | None) -> Awaitable[int]: ...
    async def get(self, namespace: str, counter: str) -> int: ...
    async def clear(self, namespace: str, counter: str) -> None: ...
    async def healthy(self) -> bool: ...
    async def close(self) -> None: ...


def open_counters(spec: str | None) -> BestEffortCounters:
    """"memory"/None -> in-process; "memcached://host:port" -> memcached."""
    if not spec or spec == "memory":
        from sinks.memory.counters import InProcessCounters

        return InProcessCounters()
    from sinks.memcached.counters import MemcachedCounters

    return MemcachedCounters(spec)
