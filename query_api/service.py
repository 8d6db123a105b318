"""The counting logic behind the endpoints, one method per API call.

BEST_EFFORT goes to memcached only. EVENTUAL and ACCURATE writes are acknowledged once the broker has them
(durable); reads serve the rollup (cache, then store) and ACCURATE adds the live delta of persisted events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass

from control_plane import CounterType, Namespace, NamespaceRegistry
from control_plane.admission import admission_error, rollup_boundary
from producers import DeliveryError, new_token
from producers.group_commit import GroupCommitProducer
from query_api import metrics
from query_api.arrivals import Arrivals
from query_api.signals import ReadSignals
from query_api.windows import Series, parse_window, series, window_count
from schemas import (
    MICROS,
    Mutation,
    MutationOp,
    ValidationError,
    parse_generation_time,
    validate_item_key,
    validate_token,
)
from sinks import BucketStore, EventStore, RollupCache, RollupStore
from sinks.best_effort import BestEffortCounters
from sinks.windows import WindowError

LIVE_SCAN_PAGE = 1000


class NamespaceNotFound(LookupError):
    pass


class BrokerUnavailable(RuntimeError):
    pass


class NotCountedYet(TimeoutError):
    """The write is durable but was not persisted within the read-your-write wait."""


class Rejected(ValueError):
    """A well-formed request the namespace cannot accept (e.g. generation_time outside the accept window)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


@dataclass(frozen=True, slots=True)
class Count:
    ns: Namespace
    counter: str
    count: int
    rollup_ts: int | None


@dataclass(frozen=True, slots=True)
class WindowedCount:
    """A window's count over [start_us, end_us) (aligned to its buckets), exact up to `as_of`."""

    ns: Namespace
    counter: str
    count: int
    start_us: int
    end_us: int
    as_of: int | None


@dataclass(frozen=True, slots=True)
class Written:
    ns: Namespace
    counter: str
    token: str | None
    event_time: int | None
    value: int | None = None  # BEST_EFFORT: the new count


class CounterService:
    def __init__(self, registry: NamespaceRegistry, *, producer: GroupCommitProducer, signals: ReadSignals,
                 events: EventStore, rollups: RollupStore, cache: RollupCache, counters: BestEffortCounters,
                 buckets: BucketStore | None = None,
                 read_your_write_timeout_s: float = 5.0,
                 read_signal_lag_s: float = 5.0) -> None:
        self.registry = registry
        self.producer = producer
        self.signals = signals
        self.events = events
        self.rollups = rollups
        self.buckets = buckets
        self.cache = cache
        self.counters = counters
        self.read_your_write_timeout_s = read_your_write_timeout_s
        self.arrivals = Arrivals(events, timeout_s=read_your_write_timeout_s)
        self.read_signal_lag_us = int(read_signal_lag_s * MICROS)

    def namespace(self, name: str) -> Namespace:
        ns = self.registry.get(name)
        if ns is None:
            raise NamespaceNotFound(f"unknown namespace {name!r}")
        return ns

    # -- writes -----------------------------------------------------------------------------------------

    def mutation(self, ns: Namespace, counter: str, delta: int, op: MutationOp, token: str | None,
                 generation_time: str | int | float | None, item_key: str = "") -> Mutation:
        """The mutation a write becomes; refuses times the pipeline would dead-letter (admission).

        `counter` and `delta` arrive validated (the request models and the fast path check them); the token,
        generation time and item key are validated here (ValidationError naming the field). A write without
        a generation time happens now, which admission always accepts."""
        now = time.time_ns() // 1000
        if generation_time is None:
            event_time = now
        else:
            event_time = parse_generation_time(generation_time, field="idempotency_token.generation_time")
            reason = admission_error(event_time, now, ns)
            if reason is not None:
                raise Rejected("idempotency_token.generation_time", reason)
        event_id = new_token() if token is None else validate_token(token, field="idempotency_token.token")
        if item_key:
            item_key = validate_item_key(item_key)
        return Mutation(ns.name, counter, delta if op is MutationOp.ADD else 0, event_time, event_id, item_key, op)

    async def write(self, ns: Namespace, counter: str, delta: int, op: MutationOp, token: str | None,
                    generation_time: str | int | float | None, item_key: str = "") -> Written:
        if ns.counter_type is CounterType.BEST_EFFORT:  # tokens are accepted and ignored, as documented
            if op is MutationOp.CLEAR:
                await self.counters.clear(ns.name, counter)
                return Written(ns, counter, None, None, 0)
            return Written(ns, counter, None, None, await self.add_best_effort(ns, counter, delta))
        written, acknowledged = self.write_durable(ns, counter, delta, op, token, generation_time, item_key)
        await self.acknowledged(acknowledged)
        return written

    def write_durable(self, ns: Namespace, counter: str, delta: int, op: MutationOp, token: str | None,
                      generation_time: str | int | float | None, item_key: str = "",
                      ) -> tuple[Written, asyncio.Future[None]]:
        """A durable (EVENTUAL/ACCURATE) write, group-committed: what to answer, and the future of the broker's
        acknowledgement (failing with DeliveryError). Plain, so the fast path can answer from a callback."""
        m = self.mutation(ns, counter, delta, op, token, generation_time, item_key)
        return Written(ns, counter, m.event_id, m.event_time), self.producer.send([m])

    def add_best_effort(self, ns: Namespace, counter: str, delta: int) -> Awaitable[int]:
        """A BEST_EFFORT add (memcached only): the new count. An awaitable rather than a coroutine, so the fast
        path can settle the response in a callback."""
        return self.counters.add(ns.name, counter, delta, ns.ttl_s)

    async def send_durably(self, mutations: Sequence[Mutation]) -> None:
        """Return once the broker acknowledged every mutation (one record: all or none); BrokerUnavailable
        otherwise."""
        await self.acknowledged(self.producer.send(mutations))

    @staticmethod
    async def acknowledged(future: asyncio.Future[None]) -> None:
        try:
            await future
        except DeliveryError as exc:
            raise BrokerUnavailable(str(exc)) from exc

    # -- reads ------------------------------------------------------------------------------------------

    async def rollup_of(self, ns: Namespace, counter: str) -> tuple[int, int]:
        """(count, rollup_ts): the cached rollup, else the rollup store's (then cached)."""
        cached = await self.cache.get(ns.name, counter)
        if cached is not None:
            metrics.count_cache(hit=True)
            return cached
        metrics.count_cache(hit=False)
        state = await self.rollups.get(ns.name, counter)
        if state is None or state.rollup_ts == 0:
            return (state.count if state else 0), 0
        await self.cache.set(ns.name, counter, state.count, state.rollup_ts, ns.ttl_s)
        return state.count, state.rollup_ts

    async def get(self, ns: Namespace, counter: str) -> Count:
        if ns.counter_type is CounterType.BEST_EFFORT:
            return Count(ns, counter, await self.counters.get(ns.name, counter), None)
        count, rollup_ts = await self.rollup_of(ns, counter)
        self.signal_if_stale(ns, counter, rollup_ts)
        if ns.counter_type is CounterType.ACCURATE:
            count = await self.live_count(ns, counter, count, rollup_ts)
        return Count(ns, counter, count, rollup_ts or None)

    def signal_if_stale(self, ns: Namespace, counter: str, rollup_ts: int) -> None:
        """A read repairs a stale counter: signal a rollup when its rollup lags the newest boundary possible
        now by more than `read_signal_lag_s`. A converged counter read in a loop then costs the workers one
        rollup per lag period (shared by every API process) instead of one per read; written counters are
        signalled by the persist path anyway, and the sweep repairs lost signals."""
        now_us = time.time_ns() // 1000
        if rollup_ts < rollup_boundary(now_us, now_us, ns) - self.read_signal_lag_us:
            self.signals.emit(ns.name, counter)

    async def live_count(self, ns: Namespace, counter: str, rollup_count: int, rollup_ts: int) -> int:
        """Rollup plus the persisted events after it; a clear among them resets the sum."""
        return await self._plus_live(ns, counter, rollup_count, rollup_ts, self._live_horizon(ns))

    @staticmethod
    def _live_horizon(ns: Namespace) -> int:
        """The newest event time a live read looks at: the latest admissible, with a minute to spare."""
        return time.time_ns() // 1000 + int((ns.max_clock_skew_s + 60) * MICROS)

    async def _plus_live(self, ns: Namespace, counter: str, count: int, after_us: int, upto_us: int) -> int:
        """`count` plus the persisted events in (after_us, upto_us], read in bounded pages; a clear among them
        replaces the count with the adds after it (an add at the very time of a clear is erased by it)."""
        if upto_us <= after_us:
            return count
        delta, cleared, clear_time = 0, False, -1
        cursor = None
        while True:
            page = await self.events.scan(ns.name, counter, after_us, upto_us, after=cursor, limit=LIVE_SCAN_PAGE)
            for _ns, _c, event_time, _id, _key, d, is_clear in page:
                if is_clear:
                    delta, cleared, clear_time = 0, True, event_time
                elif event_time > clear_time:
                    delta += d
            if len(page) < LIVE_SCAN_PAGE:
                break
            last = page[-1]
            cursor = (last[2], last[3], last[4])
        return delta if cleared else count + delta

    # -- time windows -----------------------------------------------------------------------------------

    def _windowed(self, ns: Namespace) -> None:
        if ns.counter_type is CounterType.BEST_EFFORT or not ns.windows:
            raise WindowError(f"namespace {ns.name!r} ({ns.counter_type.value}) keeps no time windows",
                              field="window")

    async def get_window(self, ns: Namespace, counter: str, spec: Mapping[str, object]) -> WindowedCount:
        """GetCount over a window: the buckets tiling it (coarsest first); ACCURATE adds the live events in the
        window after the buckets' boundary, honouring a live clear."""
        self._windowed(ns)
        now = time.time_ns() // 1000
        start, end = parse_window(spec, now)
        # buckets: the app always opens them (None only for a service built without windows, in tests)
        counted = await window_count(self.buckets, ns, counter, start, end, now_us=now)  # type: ignore[arg-type]
        _, rollup_ts = await self.rollup_of(ns, counter)
        self.signal_if_stale(ns, counter, rollup_ts)
        as_of = max(rollup_ts, counted.upto_us)
        count = counted.count
        if ns.counter_type is CounterType.ACCURATE:  # the window's events after the buckets' boundary
            count = await self._plus_live(ns, counter, count, max(as_of, counted.start_us - 1),
                                          min(counted.end_us - 1, self._live_horizon(ns)))
        return WindowedCount(ns, counter, count, counted.start_us, counted.end_us, as_of or None)

    async def get_series(self, ns: Namespace, counter: str, granularity: str, start: str | int | float,
                         end: str | int | float | None) -> tuple[Series, int | None]:
        """GetCountSeries: the granularity's buckets over [start, end), zero-filled, and their as_of."""
        self._windowed(ns)
        now = time.time_ns() // 1000
        start_us = _window_time(start, "start")
        end_us = now if end is None else _window_time(end, "end")
        # buckets: the app always opens them (None only for a service built without windows, in tests)
        result = await series(self.buckets, ns, counter, granularity, start_us, end_us,  # type: ignore[arg-type]
                              now_us=now)
        _, rollup_ts = await self.rollup_of(ns, counter)
        return result, max(rollup_ts, result.upto_us) or None

    async def add_and_get(self, ns: Namespace, counter: str, delta: int, token: str | None,
                          generation_time: str | int | float | None, item_key: str = "") -> Count:
        """Read-your-write: the count includes this delta, or NotCountedYet after a bounded wait."""
        if ns.counter_type is CounterType.BEST_EFFORT:
            written = await self.write(ns, counter, delta, MutationOp.ADD, token, generation_time, item_key)
            return Count(ns, counter, written.value, None)  # type: ignore[arg-type]  # BEST_EFFORT: the new count
        written, acknowledged = self.write_durable(ns, counter, delta, MutationOp.ADD, token, generation_time,
                                                   item_key)
        return await self.count_after(written, acknowledged, item_key)

    async def count_after(self, written: Written, acknowledged: asyncio.Future[None], item_key: str = "") -> Count:
        """The count once a durable write is acknowledged and persisted: AddAndGetCount's read-your-write."""
        await self.acknowledged(acknowledged)
        ns, counter = written.ns, written.counter
        # a durable write always has its event time and token (write_durable sets them)
        await self.wait_persisted(ns, counter, written.event_time, written.token, item_key)  # type: ignore[arg-type]
        count, rollup_ts = await self.rollup_of(ns, counter)
        self.signal_if_stale(ns, counter, rollup_ts)
        return Count(ns, counter, await self.live_count(ns, counter, count, rollup_ts), rollup_ts or None)

    async def wait_persisted(self, ns: Namespace, counter: str, event_time: int, token: str, item_key: str) -> None:
        if not await self.arrivals.wait(ns.name, (counter, event_time, token, item_key)):
            raise NotCountedYet(
                f"the write is durable (token {token!r}) but was not counted within "
                f"{self.read_your_write_timeout_s}s; GetCount will include it, or retry with the same token")


def _window_time(value: str | int | float, field: str) -> int:
    try:
        return parse_generation_time(value, field=field)
    except ValidationError as exc:
        raise WindowError(exc.reason, field=field) from None
