"""BEST_EFFORT counters: memcached `incr`/`decr` with a TTL, exact for negative deltas and totals.

memcached counters are unsigned 64-bit: `decr` stops at zero and `incr` wraps at 2**64. Storing
`count + 2**63` (a bias) keeps every signed 64-bit count in range. Every delta is an `incr`, a negative one by
2**64 - |delta| (modulo 2**64 that subtracts |delta|): a result that wrapped the wrong way says the count left
int64, and one more `incr` of the right amount puts it at the bound it passed (it saturates). (A `decr` stops at
zero, which is no bound of a signed count.)
"""

from __future__ import annotations

import asyncio
import functools
import math
import time

import xxhash

from sinks.best_effort import CounterUnavailable, CounterWriteUnknown
from sinks.memcached.client import AsyncMemcached, MemcachedError, arith_value, is_legal_key
from sinks.memcached.rollup_cache import parse_servers

__all__ = ["MemcachedCounters", "best_effort_key"]

BIAS = 1 << 63
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_MAX_RELATIVE_TTL_S = 30 * 24 * 3600
_MAX_ABSOLUTE_EXPIRE = 2**31 - 1
_MAX_REMEMBERED = 100_000  # touch times kept per process


def _write_failed(exc: MemcachedError) -> CounterUnavailable:
    """A failed add or clear: not applied (a 503) when it never reached memcached, else of unknown outcome (504)."""
    if exc.unanswered:
        return CounterWriteUnknown(f"{exc}: memcached took the write and did not answer, so it may have been "
                                   "applied; a BEST_EFFORT write has no idempotency, so a retry may count it twice")
    return CounterUnavailable(str(exc))


@functools.lru_cache(maxsize=100_000)  # the key check was 2% of a fast AddCount
def best_effort_key(namespace: str, counter: str) -> str:
    """`<namespace>:<counter_name>` as in the post, hashed when it is not a legal memcached key."""
    key = f"{namespace}:{counter}"
    if is_legal_key(key):
        return key
    return "be#" + xxhash.xxh3_128_hexdigest(key.encode("utf-8"))


def _amount(delta: int) -> int:
    """What to `incr` by for `delta`: itself, or 2**64 - |delta| for a negative one."""
    return delta if delta >= 0 else (1 << 64) + delta


def _in_range(delta: int, raw: int) -> bool:
    """False when the `incr` of `_amount(delta)` left int64: a positive delta wrapped past 2**64 (the result is
    below the delta), a negative one did not wrap (the result is at least 2**64 - |delta|: below zero)."""
    return raw >= delta if delta >= 0 else raw < (1 << 64) + delta


def _saturated(bound: int, raw: int) -> int:
    """What to `incr` a count that left int64 by (`raw`, wrapped) to put it at the bound it passed: INT64_MAX (raw
    2**64 - 1) or INT64_MIN (raw 0). A count saturates as EVENTUAL and ACCURATE counts do. It used to be refused
    with a 422, and whether an add was refused told a key with the write scope alone the count (a review read one in
    62 adds, each taken back). A write racing this one may move it off the bound: best effort."""
    return (bound - raw) % (1 << 64)


def _copy_outcome(source: asyncio.Future, target: asyncio.Future) -> None:
    """Settle target as source settles (unless target was cancelled meanwhile)."""
    def copy(done: asyncio.Future) -> None:
        if target.done():
            return
        if done.cancelled():
            target.cancel()
        elif (exc := done.exception()) is not None:
            target.set_exception(exc)
        else:
            target.set_result(done.result())
    source.add_done_callback(copy)


def _expire(ttl_s: float | None) -> int:
    """The expiry of a BEST_EFFORT key written now: its TTL plus the tenth between two touches (`_touch_due`), so it
    lives at least the TTL after its last write whichever write last touched it (a review read 0 at 93% of it), and
    a second more, rounded up: memcached's clock ticks once a second, so a key set just before a tick expires up to a
    second early (a 5 s TTL read 0 after 4.4 s: a review)."""
    if not ttl_s or ttl_s <= 0:
        return 0
    ttl_s += ttl_s / 10
    if ttl_s > _MAX_RELATIVE_TTL_S:  # an absolute unix time, which memcached reads as int32: past 2038 is "expired"
        return min(math.ceil(time.time() + ttl_s) + 1, _MAX_ABSOLUTE_EXPIRE)
    return math.ceil(ttl_s) + 1


class MemcachedCounters:
    """Signed counters in memcached. Errors raise CounterUnavailable: a best-effort write must not pretend."""

    def __init__(self, server: str, *, timeout_s: float = 0.25, pool_size: int = 1) -> None:
        (host, port), *rest = parse_servers(server)
        if rest:
            raise ValueError("BEST_EFFORT counters use one memcached server (EVCache replicas are future work)")
        self.address = f"{host}:{port}"
        self._client = AsyncMemcached(host, port, timeout_s=timeout_s, pool_size=pool_size)
        self._touched: dict[str, float] = {}

    def add(self, namespace: str, counter: str, delta: int, ttl_s: float | None) -> asyncio.Future[int]:
        """The new count. This is BEST_EFFORT AddCount's hot path, so the common case (the key exists, no wrap,
        no TTL touch due) is settled in a callback on memcached's reply, without a task or coroutine;
        anything else continues in `_finish`."""
        key = best_effort_key(namespace, counter)
        result = self._client.event_loop().create_future()
        self._client.arith(b"incr", key, _amount(delta),
                           functools.partial(self._settle, result, namespace, counter, key, delta, ttl_s))
        return result

    def _settle(self, result: asyncio.Future[int], namespace: str, counter: str, key: str, delta: int,
                ttl_s: float | None, line: bytes | None, error: MemcachedError | None) -> None:
        if result.done():  # the caller gave up (cancelled)
            return
        raw: int | None
        # `line` is bytes whenever `error` is None (a reply callback gets one or the other): the ignores below
        try:
            if error is None and line[:1].isdigit():  # type: ignore[index]  # the common case first: a count
                raw = int(line)  # type: ignore[arg-type]
                if _in_range(delta, raw) and not (ttl_s and self._touch_due(key, ttl_s)):
                    result.set_result(raw - BIAS)
                    return
            if error is not None:
                raise error
            raw = arith_value(b"incr", key, line)  # type: ignore[arg-type]  # error is None here
        except MemcachedError as exc:
            result.set_exception(_write_failed(exc))
            return
        except Exception as exc:  # never leave the caller waiting
            result.set_exception(exc)
            return
        _copy_outcome(result.get_loop().create_task(self._finish(namespace, counter, key, delta, ttl_s, raw)),
                      result)

    async def _finish(self, namespace: str, counter: str, key: str, delta: int, ttl_s: float | None,
                      raw: int | None) -> int:
        """After the first incr/decr: create a missing key and apply again, undo a wrap, refresh the TTL."""
        try:
            attempts = 0
            while raw is None:  # missing (new or expired): create at the bias, then apply
                if attempts == 3:
                    raise CounterUnavailable(f"memcached {self.address}: key {key} vanished repeatedly")
                attempts += 1
                await self._client.add(key, str(BIAS).encode(), _expire(ttl_s))
                raw = await self._client.incr(key, _amount(delta))
            if not _in_range(delta, raw):  # saturate at the bound passed, as every count does (`_saturated`)
                bound = (1 << 64) - 1 if delta > 0 else 0
                raw = await self._client.incr(key, _saturated(bound, raw))
                raw = bound if raw is None else raw  # evicted in between: the count is gone; this add saw the bound
            if self._touch_due(key, ttl_s):
                self._touched[key] = time.monotonic()
                await self._client.touch(key, _expire(ttl_s))
            return raw - BIAS
        except MemcachedError as exc:
            raise _write_failed(exc) from exc

    def _touch_due(self, key: str, ttl_s: float | None) -> bool:
        """`incr` keeps the expiry set at creation: touch it again at most every tenth of the TTL."""
        if not ttl_s or ttl_s <= 0:
            return False
        if len(self._touched) > _MAX_REMEMBERED:
            self._touched.clear()
        return self._touched.get(key, 0.0) + ttl_s / 10 <= time.monotonic()

    async def get(self, namespace: str, counter: str) -> int:
        key = best_effort_key(namespace, counter)
        try:
            raw = await self._client.get(key)
        except MemcachedError as exc:
            raise CounterUnavailable(str(exc)) from exc
        if raw is None:
            return 0
        try:
            return int(raw) - BIAS  # memcached's incr pads a shorter number with spaces
        except ValueError:  # not written by this service: another application shares the key
            raise CounterUnavailable(f"memcached {self.address}: key {key} holds {raw[:40]!r}, not a count "
                                     "(another application writes it?)") from None

    async def clear(self, namespace: str, counter: str) -> None:
        try:
            await self._client.delete(best_effort_key(namespace, counter))
        except MemcachedError as exc:
            raise _write_failed(exc) from exc

    async def healthy(self) -> bool:
        try:
            return bool(await self._client.version())
        except MemcachedError:
            return False

    async def close(self) -> None:
        await self._client.close()
