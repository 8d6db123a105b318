"""BEST_EFFORT counters in this process, for the embedded default without memcached."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from schemas.validation import INT64_MAX, INT64_MIN

__all__ = ["InProcessCounters"]

MAX_COUNTERS = 1_000_000  # as InProcessRollupCache: the process's bound, where memcached has its memory size


class InProcessCounters:
    """Best-effort counters in this process, for the embedded default without memcached.

    Bounded as memcached bounds them: a counter past its TTL is dropped (not only read as 0), and past
    `max_counters` the least recently written one of the namespace written goes. Each namespace keeps its counters in
    the order of their last write; one namespace has one TTL, so that is also the order they expire in, and each
    write drops the expired ones at the front of its namespace and of one other, in turn, so a namespace no longer
    written empties too (before: 200,000 names written once stayed in memory, about 48 MB, for the process's
    life)."""

    def __init__(self, max_counters: int = MAX_COUNTERS, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_counters = max_counters
        self._clock = clock
        self._data: dict[str, OrderedDict[str, tuple[int, float]]] = {}  # namespace -> counter -> (value, expiry)
        self._size = 0
        self._turn = 0  # which other namespace the next write sweeps

    def __len__(self) -> int:
        return self._size

    async def add(self, namespace: str, counter: str, delta: int, ttl_s: float | None) -> int:
        now = self._clock()
        counters = self._data.setdefault(namespace, OrderedDict())
        value, expires = counters.get(counter, (0, 0.0))
        if expires and expires <= now:
            value = 0
        value = min(INT64_MAX, max(INT64_MIN, value + delta))  # saturates, as memcached's (`_saturate`)
        if counter not in counters:
            self._size += 1
        counters[counter] = (value, now + ttl_s if ttl_s else 0.0)
        counters.move_to_end(counter)
        self._drop_expired(counters, now)
        if len(self._data) > 1:  # and one other namespace, in turn
            self._turn = (self._turn + 1) % len(self._data)
            self._drop_expired(list(self._data.values())[self._turn], now)
        while self._size > self.max_counters:  # the least recently written of this namespace, never this write
            victims = counters if len(counters) > 1 else next(c for c in self._data.values() if c and c is not counters)
            victims.popitem(last=False)
            self._size -= 1
        return value

    def _drop_expired(self, counters: OrderedDict[str, tuple[int, float]], now: float) -> None:
        while counters:
            _value, expires = next(iter(counters.values()))
            if not expires or expires > now:
                return
            counters.popitem(last=False)
            self._size -= 1

    async def get(self, namespace: str, counter: str) -> int:
        counters = self._data.get(namespace)
        value, expires = counters.get(counter, (0, 0.0)) if counters is not None else (0, 0.0)
        return 0 if expires and expires <= self._clock() else value

    async def clear(self, namespace: str, counter: str) -> None:
        counters = self._data.get(namespace)
        if counters is not None and counters.pop(counter, None) is not None:
            self._size -= 1

    async def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        pass
