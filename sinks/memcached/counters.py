"""BEST_EFFORT counters: memcached `incr`/`decr` with a TTL, exact for negative deltas and totals.

memcached counters are unsigned 64-bit: `decr` stops at zero and `incr` wraps at 2**64. Storing
`count + 2**63` (a bias) keeps every signed 64-bit count in range. Every delta is an `incr`, a negative one by
2**64 - |delta| (modulo 2**64 that subtracts |delta|): a result that wrapped the wrong way says the count left
int64, and a compare-and-set puts it at the bound it passed (it saturates). (A `decr` stops at zero, which is no
bound of a signed count.)

memcached refuses an `incr` of a stored number of 2**63 or more (every count >= 0 here) when a `-` happens to follow
it in its memory slot (`client.MemcachedNonNumeric`): about one new counter in thirty after counters with dashed
names were cleared (a review; the same refusal made a test flaky). Such an add reads the count back and stores the
sum with a compare-and-set, which moves the item to a new slot.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time

import xxhash

from sinks.best_effort import CounterUnavailable, CounterWriteUnknown
from sinks.memcached.client import AsyncMemcached, MemcachedError, MemcachedNonNumeric, arith_value, is_legal_key
from sinks.memcached.rollup_cache import parse_servers

__all__ = ["MemcachedCounters", "best_effort_key"]

BIAS = 1 << 63
_MAX_RELATIVE_TTL_S = 30 * 24 * 3600
_MAX_ABSOLUTE_EXPIRE = 2**31 - 1
_MAX_REMEMBERED = 100_000  # touch times kept per process
_CAS_ATTEMPTS = 8  # compare-and-set rounds before an add is refused (503, not applied) as the key kept changing


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
                           functools.partial(self._settle, result, key, delta, ttl_s))
        return result

    def _settle(self, result: asyncio.Future[int], key: str, delta: int, ttl_s: float | None, line: bytes | None,
                error: MemcachedError | None) -> None:
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
            refused = False
        except MemcachedNonNumeric:  # a count memcached misreads (module doc): stored anew in _finish
            raw, refused = None, True
        except MemcachedError as exc:
            result.set_exception(_write_failed(exc))
            return
        except Exception as exc:  # never leave the caller waiting
            result.set_exception(exc)
            return
        _copy_outcome(result.get_loop().create_task(
            self._finish(key, delta, ttl_s, raw, refused=refused)), result)

    async def _finish(self, key: str, delta: int, ttl_s: float | None, raw: int | None, *,
                      refused: bool = False) -> int:
        """After the first incr: apply it by compare-and-set if memcached refused it, create a missing key and apply
        again, saturate at a bound, refresh the TTL."""
        try:
            if refused:
                raw = await self._stored_sum(key, _amount(delta), ttl_s)
            attempts = 0
            while raw is None:  # missing (new or expired): create at the bias, then apply
                if attempts == 3:
                    raise CounterUnavailable(f"memcached {self.address}: key {key} vanished repeatedly")
                attempts += 1
                await self._client.add(key, str(BIAS).encode(), _expire(ttl_s))
                try:
                    raw = await self._client.incr(key, _amount(delta))
                except MemcachedNonNumeric:
                    raw = await self._stored_sum(key, _amount(delta), ttl_s)
            if not _in_range(delta, raw):  # saturate at the bound passed, as every count does
                raw = await self._saturate(key, delta > 0, ttl_s)
            if self._touch_due(key, ttl_s):
                self._touched[key] = time.monotonic()
                await self._client.touch(key, _expire(ttl_s))
            return raw - BIAS
        except MemcachedError as exc:
            raise _write_failed(exc) from exc

    async def _stored_sum(self, key: str, amount: int, ttl_s: float | None) -> int | None:
        """What `incr key amount` does, by compare-and-set: for a count memcached refuses to `incr` (module doc).
        None when the key is missing."""
        for _ in range(_CAS_ATTEMPTS):
            found = await self._client.gets(key)
            if found is None:
                return None
            raw = (self._count_of(key, found[0]) + amount) % (1 << 64)
            reply = await self._client.cas(key, b"%d" % raw, found[1], _expire(ttl_s))
            if reply == b"STORED":
                return raw
            if reply == b"NOT_FOUND":
                return None
        raise CounterUnavailable(f"memcached {self.address}: key {key} changed on each of {_CAS_ATTEMPTS} attempts "
                                 "to store its count anew: not applied")

    async def _saturate(self, key: str, upward: bool, ttl_s: float | None) -> int:
        """Put a count whose add left int64 at the bound it passed, unless another write moved it back to the
        bound's side meanwhile. By compare-and-set: an `incr` by the distance seen added to what a racing add did
        after the wrap, and two adds at INT64_MAX left the count near INT64_MIN (a review)."""
        bound = (1 << 64) - 1 if upward else 0
        for _ in range(_CAS_ATTEMPTS):
            found = await self._client.gets(key)
            if found is None:  # evicted in between: the count is gone; this add saw the bound
                return bound
            raw = self._count_of(key, found[0])
            if (raw >= BIAS) is upward:  # on the bound's side: at the bound, or moved from it since
                return raw
            reply = await self._client.cas(key, b"%d" % bound, found[1], _expire(ttl_s))
            if reply in (b"STORED", b"NOT_FOUND"):
                return bound
        raise CounterWriteUnknown(f"memcached {self.address}: key {key} changed on each of {_CAS_ATTEMPTS} "
                                  "attempts to saturate it at the int64 bound the add passed: the add was applied, "
                                  "and the count may have wrapped")

    def _count_of(self, key: str, value: bytes) -> int:
        """A stored count (biased); memcached's incr pads a shorter number with spaces."""
        try:
            return int(value)
        except ValueError:  # not written by this service: another application shares the key
            raise CounterUnavailable(f"memcached {self.address}: key {key} holds {value[:40]!r}, not a count "
                                     "(another application writes it?)") from None

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
        return 0 if raw is None else self._count_of(key, raw) - BIAS

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
