"""The rollup cache in this process: for one process, or when memcached is absent."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from sinks.cache import Key

__all__ = ["InProcessRollupCache"]


class InProcessRollupCache:
    """A bounded LRU dict with per-entry TTL; thread-safe. For one process or when memcached is absent.
    `max_ttl_s` caps every entry's TTL (see `sinks.cache.open_cache`)."""

    def __init__(self, *, max_entries: int = 1_000_000, default_ttl_s: float | None = None,
                 max_ttl_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.default_ttl_s = default_ttl_s
        self.max_ttl_s = max_ttl_s
        self._clock = clock
        self._data: OrderedDict[Key, tuple[int, int, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    async def get(self, namespace: str, counter: str) -> tuple[int, int] | None:
        return self.get_now(namespace, counter)

    def get_now(self, namespace: str, counter: str) -> tuple[int, int] | None:
        key = (namespace, counter)
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None
            if entry[2] <= self._clock():
                del self._data[key]
                return None
            self._data.move_to_end(key)
            return entry[0], entry[1]

    async def get_many(self, keys: Iterable[Key]) -> dict[Key, tuple[int, int]]:
        out: dict[Key, tuple[int, int]] = {}
        for namespace, counter in keys:
            value = self.get_now(namespace, counter)
            if value is not None:
                out[(namespace, counter)] = value
        return out

    async def set(self, namespace: str, counter: str, count: int, rollup_ts: int,
                  ttl_s: float | None = None) -> None:
        self._store(namespace, counter, count, rollup_ts, ttl_s, forward_only=False)

    async def advance(self, namespace: str, counter: str, count: int, rollup_ts: int,
                      ttl_s: float | None = None) -> None:
        self._store(namespace, counter, count, rollup_ts, ttl_s, forward_only=True)

    async def advance_many(self, rollups: Iterable[tuple[str, str, int, int, float | None]]) -> None:
        for namespace, counter, count, rollup_ts, ttl_s in rollups:
            self._store(namespace, counter, count, rollup_ts, ttl_s, forward_only=True)

    def _store(self, namespace: str, counter: str, count: int, rollup_ts: int, ttl_s: float | None, *,
               forward_only: bool) -> None:
        ttl = self.default_ttl_s if ttl_s is None else ttl_s
        if self.max_ttl_s is not None and not (ttl and 0 < ttl <= self.max_ttl_s):
            ttl = self.max_ttl_s
        now = self._clock()
        expires = now + ttl if ttl and ttl > 0 else math.inf
        key = (namespace, counter)
        with self._lock:
            held = self._data.get(key)
            if forward_only and held is not None and held[1] > rollup_ts and held[2] > now:
                return
            self._data[key] = (int(count), int(rollup_ts), expires)
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    async def delete(self, namespace: str, counter: str) -> None:
        with self._lock:
            self._data.pop((namespace, counter), None)

    async def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        with self._lock:
            self._data.clear()
