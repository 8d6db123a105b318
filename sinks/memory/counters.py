"""BEST_EFFORT counters in this process, for the embedded default without memcached."""

from __future__ import annotations

import time

from sinks.best_effort import CounterOverflow

__all__ = ["InProcessCounters"]

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class InProcessCounters:
    """Best-effort counters in this process, for the embedded default without memcached."""

    def __init__(self) -> None:
        self._data: dict[tuple[str, str], tuple[int, float]] = {}

    async def add(self, namespace: str, counter: str, delta: int, ttl_s: float | None) -> int:
        key = (namespace, counter)
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
        value, expires = self._data.get((namespace, counter), (0, 0.0))
        return 0 if expires and expires <= time.monotonic() else value

    async def clear(self, namespace: str, counter: str) -> None:
        self._data.pop((namespace, counter), None)

    async def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        pass
