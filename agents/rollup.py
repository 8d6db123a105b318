"""Rollup: aggregate each signalled counter's immutable window (rollup_ts, B] and move its rollup forward.

Counters whose last write is still ahead of their new rollup are returned for re-signalling, so every
touched counter keeps circulating until it has converged (DESIGN invariant 6). A batch that fails is rolled up
again a counter at a time, so one failing counter holds back no other; one that still fails stays stale, and the
sweep signals it again. When the first counters tried alone fail too, the store is away, not a counter: the batch
then waits for it (retried with backoff) instead of failing every counter, each maybe after a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agents.sketches import maintain_sketches
from agents.windows import BucketWork, maintain_buckets
from control_plane import Namespace, NamespaceRegistry
from control_plane.admission import rollup_boundary
from sinks import BucketStore, EventStore, RollupCache, RollupStore, SketchStore, apply_aggregate

log = logging.getLogger(__name__)

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class RollupResult:
    key: Key
    count: int
    rollup_ts: int
    applied: bool
    pending: bool  # last write still ahead of the rollup: signal again


def global_watermark(marks: Mapping[int, int], partitions: int) -> int:
    """The minimum over every mutations partition; 0 (hold everything) until each has reported."""
    if partitions <= 0 or any(p not in marks for p in range(partitions)):
        return 0
    return min(marks[p] for p in range(partitions))


async def rollup_counter(ns: Namespace, counter: str, *, events: EventStore, rollups: RollupStore,
                         cache: RollupCache, watermark_us: int, now_us: int | None = None,
                         buckets: BucketStore | None = None, sketches: SketchStore | None = None) -> RollupResult:
    """Roll one counter up to the latest immutable boundary and refresh its cache value."""
    [result] = await rollup_counters(ns, [counter], events=events, rollups=rollups, cache=cache,
                                     watermark_us=watermark_us, now_us=now_us, buckets=buckets, sketches=sketches)
    return result


async def rollup_counters(ns: Namespace, counters: Sequence[str], *, events: EventStore, rollups: RollupStore,
                          cache: RollupCache, watermark_us: int, now_us: int | None = None,
                          buckets: BucketStore | None = None, sketches: SketchStore | None = None
                          ) -> list[RollupResult]:
    """Roll counters of one namespace up to the latest immutable boundary and refresh their cache values.

    Three store calls for the whole batch (states, aggregates, forward-only writes) rather than three per
    counter: on SQLite each call is a hand-off to the store's thread, which cost more than the query. With a
    bucket store and a namespace that keeps windows, the batch's minute/hour/day buckets are recomputed up to
    the same boundary first (agents.windows), so a rollup_ts always certifies its buckets; with a sketch store and
    a UNIQUE namespace, their sketches next (agents.sketches), so it certifies the sketches too.
    Returns one result per distinct counter, in order.
    """
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    boundary = rollup_boundary(now_us, watermark_us, ns)
    names = list(dict.fromkeys(counters))
    states = await rollups.get_many([(ns.name, c) for c in names])
    results: dict[str, RollupResult] = {}
    to_cache: list[tuple[str, int, int]] = []
    todo: list[tuple[str, int, int, int]] = []  # counter, count, rollup_ts, last_write_ts
    for c in names:
        st = states.get((ns.name, c))
        count, rollup_ts, last_write = (st.count, st.rollup_ts, st.last_write_ts) if st else (0, 0, 0)
        if boundary <= rollup_ts:
            to_cache.append((c, count, rollup_ts))
            results[c] = RollupResult((ns.name, c), count, rollup_ts, False, last_write > rollup_ts)
        else:
            todo.append((c, count, rollup_ts, last_write))
    if todo:
        aggs = await events.aggregate_many(ns.name, [(c, rollup_ts, boundary) for c, _, rollup_ts, _ in todo])
        if buckets is not None and ns.windows:
            work = [BucketWork(c, rollup_ts, boundary, agg.last_clear_us)
                    for (c, _, rollup_ts, _), agg in zip(todo, aggs, strict=True)]
            await maintain_buckets(ns, work, events=events, buckets=buckets, now_us=now_us, continue_minutes=True)
            if sketches is not None and ns.counts_unique:
                await maintain_sketches(ns, work, events=events, sketches=sketches, buckets=buckets, now_us=now_us,
                                        worker_step=True)
        new_counts = [apply_aggregate(count, agg, (ns.name, c))  # saturated at the int64 bounds
                      for (c, count, _, _), agg in zip(todo, aggs, strict=True)]
        applied = await rollups.write_rollups(ns.name, [(c, n, boundary) for (c, *_), n in
                                                        zip(todo, new_counts, strict=True)])
        raced: list[tuple[str, int]] = []
        for (c, _, _, last_write), n, ok in zip(todo, new_counts, applied, strict=True):
            if ok:
                to_cache.append((c, n, boundary))
                results[c] = RollupResult((ns.name, c), n, boundary, True, last_write > boundary)
            else:
                raced.append((c, n))
        if raced:  # another worker moved them further meanwhile: its values are at least as fresh
            fresh = await rollups.get_many([(ns.name, c) for c, _ in raced])
            for c, n in raced:
                f = fresh.get((ns.name, c))
                if f is None:
                    results[c] = RollupResult((ns.name, c), n, boundary, False, True)
                    continue
                to_cache.append((c, f.count, f.rollup_ts))
                results[c] = RollupResult((ns.name, c), f.count, f.rollup_ts, False, f.last_write_ts > f.rollup_ts)
    await asyncio.gather(*(cache.advance(ns.name, c, n, ts, ns.ttl_s) for c, n, ts in to_cache))
    return [results[c] for c in names]


class BackPressure:
    """Adaptive pause between rollup batches: a fraction of how long the previous batch took, capped."""

    def __init__(self, ratio: float = 0.25, max_pause_s: float = 0.5) -> None:
        self.ratio = ratio
        self.max_pause_s = max_pause_s
        self.last_batch_s = 0.0

    @property
    def pause_s(self) -> float:
        return min(self.max_pause_s, self.last_batch_s * self.ratio)


# -- store outages -------------------------------------------------------------------------------------------

PROBES = 3  # counters of a failed batch rolled up alone before its failure may be judged the store's
# SQLite primary result codes that say the file is away, not that one counter is bad (an overflowing SUM is
# SQLITE_ERROR): BUSY, LOCKED, NOMEM, READONLY, IOERR, CORRUPT, FULL, CANTOPEN, PROTOCOL, NOTADB
_SQLITE_AWAY = frozenset({5, 6, 7, 8, 10, 11, 13, 14, 15, 26})
# cassandra-driver errors that say the cluster is away (by name: agents never load the driver, sinks does)
_CASSANDRA_AWAY = frozenset({"NoHostAvailable", "Unavailable", "Timeout", "OperationTimedOut", "ConnectionException",
                             "OverloadedErrorMessage", "IsBootstrappingErrorMessage"})


def store_unavailable(exc: BaseException) -> bool:
    """Whether an error says the store is away (locked, failing I/O, full, no replica, timed out) rather than that
    one counter cannot be rolled up (an overflowing sum, a bad row): its rollups then wait for it."""
    if isinstance(exc, OSError):  # refused or reset connections, timeouts (TimeoutError), disk errors
        return True
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in _SQLITE_AWAY
    return any(cls.__module__.startswith("cassandra") and cls.__name__ in _CASSANDRA_AWAY for cls in type(exc).__mro__)


class StoreOutage(Exception):
    """A batch that the store failed, and the counters tried alone after it: the store is away, not one counter.
    Carries what was rolled up before, the counters left (the failed probes first) and the probes."""

    def __init__(self, error: BaseException, done: list[RollupResult], left: list[str], probes: list[str]) -> None:
        super().__init__(f"store unavailable: {error!r}")
        self.error = error
        self.done = done
        self.left = left
        self.probes = probes


RETRY_FIRST_S = 0.2  # the backoff between retries of the batches a store outage failed: doubling from this
RETRY_MAX_S = 5.0  # up to this
GIVE_UP_POLL_S = 0.25  # how often a backoff asks whether the worker gives the wait up
# how long one call waits for the store before leaving its counters to the sweep: a counter that times out alone
# (one huge Cassandra partition) looks like an outage, and must not hold the rollup agent, and the other
# namespaces' signals behind it, for longer than this
MAX_WAIT_S = 60.0


class RollupsAbandoned(Exception):
    """The wait for the store was given up (the worker stops, or hands its partitions over): the counters still to
    roll up, to be signalled again, and the results so far."""

    def __init__(self, left: list[Key], done: list[RollupResult]) -> None:
        super().__init__(f"{len(left)} rollup(s) waiting for the store given up")
        self.left = left
        self.done = done


class Outage:
    """A store outage as the rollups live through it: exponential backoff (capped) between retries of the batches it
    failed, one log line when it begins and one when it ends, never one per counter or per attempt."""

    def __init__(self) -> None:
        self.first_s = RETRY_FIRST_S
        self.max_s = RETRY_MAX_S
        self.delay_s = self.first_s
        self.since: float | None = None  # monotonic, while the store is away
        self.retries = 0
        self.waiting: set[Key] = set()  # counters whose rollups waited for the store

    @property
    def active(self) -> bool:
        return self.since is not None

    def failed(self, ns: str, outage: StoreOutage) -> None:
        self.waiting.update((ns, c) for c in outage.left)
        if self.since is None:
            self.since = time.monotonic()
            log.error("the store of namespace %r looks unavailable (%r, also for the first counters rolled up alone): "
                      "its rollups wait for it, retried with backoff up to %gs; their signals stay unacknowledged "
                      "meanwhile", ns, outage.error, self.max_s)

    async def wait(self, give_up: Callable[[], bool]) -> bool:
        """Sleep before the next retry, unless `give_up()` turns true meanwhile (checked every GIVE_UP_POLL_S):
        returns whether to retry."""
        self.retries += 1
        until = time.monotonic() + self.delay_s
        self.delay_s = min(self.delay_s * 2, self.max_s)
        while not give_up():
            left = until - time.monotonic()
            if left <= 0:
                return True
            await asyncio.sleep(min(left, GIVE_UP_POLL_S))
        return False

    def ended(self) -> None:
        if self.since is not None:
            log.warning("the store is back after %.1fs (%d retries): the rollups of %d counter(s) that waited for it "
                        "are done", time.monotonic() - self.since, self.retries, len(self.waiting))
        self.delay_s, self.since, self.retries = self.first_s, None, 0
        self.waiting.clear()


@dataclass(frozen=True, slots=True)
class _Batch:
    ns: Namespace
    counters: list[str]  # distinct
    suspects: frozenset[str] = frozenset()  # failed alone while the store looked away: probed last when retried

    def after(self, outage: StoreOutage) -> _Batch:
        """What the batch's retry rolls up: the counters left, those not tried alone yet first."""
        rest = [c for c in outage.left if c not in outage.probes]
        return _Batch(self.ns, rest + outage.probes, self.suspects | set(outage.probes))


@dataclass(frozen=True, slots=True)
class _Targets:
    """The stores a rollup reads and writes, and where the watermark comes from."""

    events: EventStore
    rollups: RollupStore
    cache: RollupCache
    watermark: Callable[[], Awaitable[int]]
    buckets: BucketStore | None
    sketches: SketchStore | None

    async def rollup(self, ns: Namespace, counters: Sequence[str], watermark_us: int) -> list[RollupResult]:
        return await rollup_counters(ns, counters, events=self.events, rollups=self.rollups, cache=self.cache,
                                     watermark_us=watermark_us, buckets=self.buckets, sketches=self.sketches)


async def rollup_many(keys: Iterable[Key], registry: NamespaceRegistry, *, events: EventStore,
                      rollups: RollupStore, cache: RollupCache, watermark: Callable[[], Awaitable[int]],
                      pressure: BackPressure, buckets: BucketStore | None = None,
                      sketches: SketchStore | None = None,
                      give_up: Callable[[], bool] = lambda: False, max_wait_s: float | None = None,
                      ) -> list[RollupResult]:
    """Roll up a coalesced set of counters, `rollup_batch_count` at a time per namespace.

    Returns once every counter is rolled up or left behind as failing alone (`_one_by_one`). While a namespace's
    store is away (`StoreOutage`) its batches wait, retried after the others with backoff (`Outage`): the worker
    acknowledges the signals only once their counters are rolled up, rather than leaving them all to the sweep.
    Raises `RollupsAbandoned` when `give_up()` turns true during that wait (the worker stops or hands its partitions
    over: Faust waits for the batch in hand before either); cancelling the call ends the wait too. After
    `max_wait_s` (default `MAX_WAIT_S`) of waiting the counters are left to the sweep, still stale."""
    max_wait_s = MAX_WAIT_S if max_wait_s is None else max_wait_s
    targets = _Targets(events, rollups, cache, watermark, buckets, sketches)
    outage = Outage()
    batches = _batches(keys, registry)
    results: list[RollupResult] = []
    first = True
    while True:
        deferred: list[_Batch] = []
        down: set[str] = set()  # namespaces whose store failed a batch in this pass: their next batches wait
        for batch in batches:
            if batch.ns.name in down:
                deferred.append(batch)
                continue
            if not first and pressure.pause_s:
                await asyncio.sleep(pressure.pause_s)
            first = False
            started = time.monotonic()
            try:
                results.extend(await _rollup_batch(batch, targets, quiet=outage.active))
            except StoreOutage as exc:
                results.extend(exc.done)
                down.add(batch.ns.name)
                deferred.append(batch.after(exc))
                outage.failed(batch.ns.name, exc)
            pressure.last_batch_s = time.monotonic() - started
        if not deferred:
            outage.ended()
            return results
        if outage.since is not None and time.monotonic() - outage.since >= max_wait_s:
            _waited_enough(deferred, outage)
            return results
        if not await outage.wait(give_up):
            raise RollupsAbandoned([(b.ns.name, c) for b in deferred for c in b.counters], results)
        batches = deferred


def _waited_enough(deferred: list[_Batch], outage: Outage) -> None:
    """Leave the counters still waiting for the store to the sweep (their rollups stay stale, so it signals them
    again once the store answers), so that a counter failing alone as if the store were away holds nothing longer."""
    waiting = sum(len(b.counters) for b in deferred)
    log.error("the rollups of %d counter(s) of %s waited %.0fs for the store; left for the sweep, which signals them "
              "again once it answers", waiting, sorted({b.ns.name for b in deferred}),
              time.monotonic() - (outage.since or time.monotonic()))


def _batches(keys: Iterable[Key], registry: NamespaceRegistry) -> list[_Batch]:
    by_ns: dict[str, list[str]] = defaultdict(list)
    for ns_name, counter in keys:
        by_ns[ns_name].append(counter)
    batches: list[_Batch] = []
    for ns_name, counters in by_ns.items():
        ns = registry.get(ns_name)
        if ns is None:
            log.warning("rollup signal for unknown namespace %r ignored", ns_name)
            continue
        names = list(dict.fromkeys(counters))
        step = max(1, ns.rollup_batch_count)
        batches.extend(_Batch(ns, names[i:i + step]) for i in range(0, len(names), step))
    return batches


async def _rollup_batch(batch: _Batch, targets: _Targets, *, quiet: bool) -> list[RollupResult]:
    """One batch; if it fails, its counters one by one (`quiet`: an outage is on, and was logged)."""
    try:
        mark = await targets.watermark()
    except Exception as exc:
        if store_unavailable(exc):  # the rollup store is away: nothing can be rolled up
            raise StoreOutage(exc, [], batch.counters, []) from exc
        raise
    try:
        return await targets.rollup(batch.ns, batch.counters, mark)
    except Exception as exc:
        if quiet:
            log.debug("rollup batch of %d counter(s) of %r failed again: %r", len(batch.counters), batch.ns.name, exc)
        else:
            log.exception("rollup batch of %d counter(s) of namespace %r failed; rolling them up one by one",
                          len(batch.counters), batch.ns.name)
        return await _one_by_one(batch, exc, targets, mark)


async def _one_by_one(batch: _Batch, error: Exception, targets: _Targets, watermark_us: int) -> list[RollupResult]:
    """The rollups of a failed batch, a counter at a time: one failing counter must not hold back the others (nor,
    with the batch retried, every later batch of the worker). A counter that still fails is logged and left behind:
    its rollup stays stale, so the sweep (or its next write's signal) tries it again.

    Unless the store is away: then every counter would fail, each maybe after a timeout, and be left to the sweep.
    `PROBES` failures in a row that say so (`_store_away`) stop the pass with `StoreOutage`, whose batch is retried."""
    results: list[RollupResult] = []
    failed: list[tuple[str, Exception]] = []
    run: list[tuple[str, Exception]] = []  # the latest failures in a row
    need = min(PROBES, len(batch.counters))
    for i, counter in enumerate(batch.counters):
        try:
            results.extend(await targets.rollup(batch.ns, [counter], watermark_us))
        except Exception as exc:
            run.append((counter, exc))
            probes = run[-need:]
            if len(run) >= need and _store_away(probes, error, batch, proven=bool(results)):
                _left_behind(batch.ns, failed + run[:-need])
                left = batch.counters[i + 1 - need:]
                raise StoreOutage(exc, results, left, [c for c, _ in probes]) from exc
            continue
        failed.extend(run)
        run.clear()
    failed.extend(run)
    if results:  # the store answers: a counter it failed meanwhile may have met it coming back, so try it again
        failed = await _again(batch.ns, failed, results, targets, watermark_us)
    _left_behind(batch.ns, failed)
    return results


async def _again(ns: Namespace, failed: list[tuple[str, Exception]], results: list[RollupResult], targets: _Targets,
                 watermark_us: int) -> list[tuple[str, Exception]]:
    """Roll up once more, alone, the counters that failed with an error saying the store was away (adding to
    `results`); returns the counters still failing."""
    still: list[tuple[str, Exception]] = []
    for counter, exc in failed:
        if not store_unavailable(exc):
            still.append((counter, exc))
            continue
        try:
            results.extend(await targets.rollup(ns, [counter], watermark_us))
        except Exception as again:
            still.append((counter, again))
    return still


def _store_away(probes: list[tuple[str, Exception]], batch_error: Exception, batch: _Batch, *, proven: bool) -> bool:
    """Whether counters failing alone in a row say the store is away: they all failed with an error saying so, or,
    before any counter of the pass was rolled up, with the batch's kind of error, while counters not tried alone yet
    remain (a batch of counters that all fail alone, each once, is left to the sweep: a bad one never blocks)."""
    if all(store_unavailable(exc) for _, exc in probes):
        return True
    return (not proven and all(type(exc) is type(batch_error) for _, exc in probes)
            and not any(c in batch.suspects for c, _ in probes) and len(batch.counters) > len(probes))


def _left_behind(ns: Namespace, failed: list[tuple[str, Exception]]) -> None:
    if failed:  # one line a batch: the sweep brings such counters back often
        first, error = failed[0]
        log.error("rollup of %d counter(s) of %r failed, left for their next signal or the sweep; the first, %r: %r",
                  len(failed), ns.name, first, error)
