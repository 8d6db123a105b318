"""The rollup agent's coalesced sets of counters, rolled up in batches (`rollup_many`), through store outages.

A batch that fails is rolled up again a counter at a time, so one failing counter holds back no other; one that
still fails stays stale, and the sweep signals it again. When counters tried alone fail with errors saying the store
is away, and more than one counter says so (several of them, or a store read failing too), the batch waits for the
store (retried with backoff) instead of failing every counter, each maybe after a timeout; any other error is the
counters' own. Why a module of its own: `agents.rollup` says what a rollup is, this what the worker does when the
store does not answer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from agents.rollup import BackPressure, Key, RollupResult, rollup_counters
from control_plane import Namespace, NamespaceRegistry
from sinks import BucketStore, EventStore, RollupCache, RollupStore, SketchStore, store_unavailable

log = logging.getLogger("agents.rollup")  # the rollups' one logger, as before the split

# -- store outages -------------------------------------------------------------------------------------------

PROBES = 3  # distinct counters failing alone in a row, with an error saying the store is away, that prove an outage
class StoreOutage(Exception):
    """A batch's rollups failed as if the store were away, and more than one counter's doing says so (`_Call.verdict`).
    Carries what was rolled up before, and the counters left, which wait for the store."""

    def __init__(self, error: BaseException, done: list[RollupResult], left: list[str]) -> None:
        super().__init__(f"store unavailable: {error!r}")
        self.error = error
        self.done = done
        self.left = left


OUTAGE, GIVEN_UP = "outage", "given up"  # what counters failing alone say (`_Call.verdict`)


class _Halted(Exception):
    """A batch stopped between its counters: the worker gives up (`abandoned`), or the call waited for the store long
    enough. Carries what was rolled up and the counters not done."""

    def __init__(self, done: list[RollupResult], left: list[str], *, abandoned: bool) -> None:
        super().__init__(f"{len(left)} rollup(s) stopped")
        self.done = done
        self.left = left
        self.abandoned = abandoned


RETRY_FIRST_S = 0.2  # the backoff between retries of the batches a store outage failed: doubling from this
RETRY_MAX_S = 5.0  # up to this
GIVE_UP_POLL_S = 0.25  # how often a backoff asks whether the worker gives the wait up
# how long one call waits for the store before leaving its counters to the sweep: an outage wrongly proven (counters
# failing alone as if the store were away, each for its own reason) must not hold the rollup agent, and the other
# namespaces' signals behind it, for longer than this
MAX_WAIT_S = 60.0
# how long the counters left to the sweep after a wait are remembered: their failures then prove no outage, so the
# same counters do not hold every later call for MAX_WAIT_S. At most GIVEN_UP_MAX of them, the oldest forgotten first.
GIVEN_UP_FOR_S = 600.0
GIVEN_UP_MAX = 100_000
OUTAGE_FORGOTTEN_S = 300.0  # a namespace none of whose rollups failed for this long is no longer taken as down


class RollupsAbandoned(Exception):
    """The worker gave the call up (it stops, or hands its partitions over: Faust waits for the batch in hand before
    either): the counters not rolled up yet, to be signalled again, and the results so far."""

    def __init__(self, left: list[Key], done: list[RollupResult]) -> None:
        super().__init__(f"{len(left)} rollup(s) given up")
        self.left = left
        self.done = done


class OverBudget(RollupsAbandoned):
    """The call ran past its `budget_s` with the store answering: the counters left go behind the signals that arrived
    meanwhile, so a burst of one namespace's counters holds the others' back by about the budget, not the burst."""


class Outage:
    """A store outage as the worker's rollups live through it, across calls (the worker owns one): the namespaces whose
    store is away, the backoff (exponential, capped) between retries of the batches it failed, one log line when it
    begins and one when it ends, never one per counter, attempt or call.

    Also the counters left to the sweep after a wait, remembered for `GIVEN_UP_FOR_S`: their failures prove no outage
    any more, so a counter that fails alone as if the store were away (a partition too large to read in time) does not
    hold every later call."""

    def __init__(self) -> None:
        self.since: float | None = None  # monotonic, while the store is away
        self.down: dict[str, float] = {}  # namespace -> when a rollup of it last failed for the store (monotonic)
        self.retries = 0
        self.next_s: float | None = None  # the next backoff (None: RETRY_FIRST_S)
        self.waiting: set[Key] = set()  # counters whose rollups waited for the store in this outage
        self.given_up: dict[Key, float] = {}  # counter -> remembered until (monotonic), oldest first

    @property
    def active(self) -> bool:
        self._expire()
        return self.since is not None

    def failed(self, ns: str, error: BaseException, left: Sequence[str]) -> None:
        now = time.monotonic()
        self._expire(now)
        self.down[ns] = now
        if len(self.waiting) < GIVEN_UP_MAX:  # for the line saying the store is back
            self.waiting.update((ns, c) for c in left)
        if self.since is None:
            self.since = now
            log.error("the store of namespace %r looks unavailable (%r): its rollups wait for it, retried with backoff "
                      "up to %gs; their signals stay unacknowledged meanwhile", ns, error, RETRY_MAX_S)

    def answered(self, ns: str, results: Sequence[RollupResult]) -> None:
        """Rollups of namespace `ns` were done: its store answers, and those counters are not given up any more."""
        for r in results:
            self.given_up.pop(r.key, None)
        if self.down.pop(ns, None) is not None and not self.down and self.since is not None:
            log.warning("the store is back after %.1fs (%d retries; the rollups of %d counter(s) waited for it)",
                        time.monotonic() - self.since, self.retries, len(self.waiting))
            self._reset()

    async def wait(self, give_up: Callable[[], bool], until: float) -> bool:
        """Sleep before the next retry, not past `until`, unless `give_up()` turns true meanwhile (checked every
        GIVE_UP_POLL_S): returns whether to retry."""
        self.retries += 1
        delay = RETRY_FIRST_S if self.next_s is None else self.next_s
        self.next_s = min(delay * 2, RETRY_MAX_S)
        end = min(time.monotonic() + delay, until)
        while not give_up():
            left = end - time.monotonic()
            if left <= 0:
                return True
            await asyncio.sleep(min(left, GIVE_UP_POLL_S))
        return False

    def gave_up(self, keys: Iterable[Key]) -> None:
        """Counters left to the sweep after a wait for the store: remembered for GIVEN_UP_FOR_S."""
        now = time.monotonic()
        while self.given_up and next(iter(self.given_up.values())) <= now:
            del self.given_up[next(iter(self.given_up))]
        for key in keys:
            self.given_up.pop(key, None)
            self.given_up[key] = now + GIVEN_UP_FOR_S
        while len(self.given_up) > GIVEN_UP_MAX:
            del self.given_up[next(iter(self.given_up))]

    def remembers(self, key: Key) -> bool:
        """Whether the counter was left to the sweep after a wait, lately: its failures prove no outage."""
        until = self.given_up.get(key)
        if until is not None and until <= time.monotonic():
            del self.given_up[key]
            return False
        return until is not None

    def _expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        gone = [ns for ns, at in self.down.items() if now - at >= OUTAGE_FORGOTTEN_S]
        for ns in gone:
            del self.down[ns]
        if gone and not self.down and self.since is not None:
            log.warning("no rollup of namespace(s) %s failed for the store in %.0fs: the outage that began %.0fs ago "
                        "is taken as over", sorted(gone), OUTAGE_FORGOTTEN_S, now - self.since)
            self._reset()

    def _reset(self) -> None:
        self.since, self.next_s, self.retries = None, None, 0
        self.waiting.clear()


@dataclass(frozen=True, slots=True)
class _Batch:
    ns: Namespace
    counters: list[str]  # distinct
    waiting: bool = False  # deferred by a store outage: retried while the call waits for the store


def _keys(batches: Iterable[_Batch]) -> list[Key]:
    return [(b.ns.name, c) for b in batches for c in b.counters]


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


@dataclass(slots=True)
class _Call:
    """One `rollup_many` call: its stores, the worker's outage, whether the worker gives up, how long it waits."""

    targets: _Targets
    outage: Outage
    give_up: Callable[[], bool]
    max_wait_s: float
    waits_from: float | None = None  # monotonic: when the call's first batch was deferred for the store
    # namespaces whose store failed a batch as if it were away in this call (`StoreOutage`, `GIVEN_UP`): their later
    # batches leave the counters given up after an earlier wait to the sweep untried
    leaving: set[str] = field(default_factory=set)

    @property
    def until(self) -> float:
        return (time.monotonic() if self.waits_from is None else self.waits_from) + self.max_wait_s

    def overdue(self) -> bool:
        return self.waits_from is not None and time.monotonic() >= self.until

    def stopping(self) -> bool | None:
        """Between two batches or counters: True if the worker gives up, False if the call waited long enough for
        the store (`_Halted.abandoned`), None to go on."""
        if self.give_up():
            return True
        if self.overdue():
            return False
        return None

    async def verdict(self, ns: str, run: list[tuple[str, Exception]], need: int, *, read: bool) -> str | None:
        """What counters failing alone in a row (`run`), each with an error saying the store is away, say.

        `OUTAGE` when they prove it: `need` (at least two) of them that were not given up after an earlier wait, or
        else, with `read`, a confirming read that fails for the store too. One counter alone proves nothing without
        that read. `GIVEN_UP` when the read answers and there are `need` (at least two) of them: some were given up
        after an earlier wait (the store was away for longer than a call waits, a SQLite file locked for long, or
        they fail alone), so the batch's other counters are left to the sweep untried, as they would wait for an
        outage; trying each could cost the store's timeout. None: go on.

        The read is the rollup store's `get_many` of the last counter, the first read of that counter's rollup: a
        primary-key read of one small row, through the same store (session, connection) as the rollups, answering
        unless that store is away; it reads none of the counter's events (a partition too large to read in time, a
        corrupt page). It cannot tell a SQLite file whose writes are locked (it reads in WAL mode), which is why
        several counters failing alone need no read."""
        fresh = {c for c, _ in run if not self.outage.remembers((ns, c))}
        if need >= 2 and len(fresh) >= need:
            return OUTAGE
        if not read:
            return None
        try:
            await self.targets.rollups.get_many([(ns, run[-1][0])])
        except Exception as exc:
            log.debug("the store check of namespace %r failed: %r", ns, exc)
            if store_unavailable(exc):
                return OUTAGE
        return GIVEN_UP if need >= 2 and len(run) >= need else None

    def without_given_up(self, batch: _Batch) -> _Batch:
        """The batch without its counters given up after an earlier wait, which are left to the sweep untried."""
        given_up = {c for c in batch.counters if self.outage.remembers((batch.ns.name, c))}
        _untried(batch.ns, [c for c in batch.counters if c in given_up])
        return _Batch(batch.ns, [c for c in batch.counters if c not in given_up], batch.waiting)

    def waited_enough(self, batches: list[_Batch]) -> None:
        """Leave the counters not rolled up yet to the sweep (their rollups stay stale, so it signals them again once
        the store answers), and remember those that waited for the store: their failures prove no outage for a while.
        """
        self.outage.gave_up(_keys(b for b in batches if b.waiting))
        log.error("the rollups of %d counter(s) of %s are left for the sweep after %.0fs waiting for the store; it "
                  "signals them again once the store answers", len(_keys(batches)),
                  sorted({b.ns.name for b in batches}), time.monotonic() - (self.waits_from or time.monotonic()))


async def rollup_many(keys: Iterable[Key], registry: NamespaceRegistry, *, events: EventStore,
                      rollups: RollupStore, cache: RollupCache, watermark: Callable[[], Awaitable[int]],
                      pressure: BackPressure, buckets: BucketStore | None = None,
                      sketches: SketchStore | None = None,
                      give_up: Callable[[], bool] = lambda: False, max_wait_s: float | None = None,
                      outage: Outage | None = None, batch_max: int | None = None,
                      budget_s: float | None = None) -> list[RollupResult]:
    """Roll up a coalesced set of counters, `rollup_batch_count` at a time per namespace, or in larger batches (up
    to `batch_max`) where a namespace's part of the set is long (`batch_size`).

    Returns once every counter is rolled up or left behind as failing alone (`_one_by_one`). While a namespace's
    store is away (`StoreOutage`) its batches wait, retried after the others with backoff (`outage`: the worker's,
    which outlives the call): the worker acknowledges the signals only once their counters are rolled up, rather than
    leaving them all to the sweep. After `max_wait_s` (default `MAX_WAIT_S`) of waiting the counters are left to the
    sweep, still stale, and remembered (`Outage.gave_up`).

    Raises `RollupsAbandoned` once `give_up()` turns true (the worker stops or hands its partitions over: Faust waits
    for the batch in hand before either), asked between batches, between counters rolled up alone, and during the
    wait; cancelling the call ends it too. Raises `OverBudget` between two batches once the call has run `budget_s`
    and rolled up a batch of each namespace (`_batches`), unless a store is away in it (its counters then wait for the
    store as above)."""
    call = _Call(_Targets(events, rollups, cache, watermark, buckets, sketches), Outage() if outage is None else outage,
                 give_up, MAX_WAIT_S if max_wait_s is None else max_wait_s)
    batches = _batches(keys, registry, batch_max)
    results: list[RollupResult] = []
    first = True
    budget_until = None if budget_s is None else time.monotonic() + budget_s
    first_round = len({b.ns.name for b in batches})  # the budget cuts a set only after a batch of each namespace
    while True:
        deferred: list[_Batch] = []
        down: set[str] = set()  # namespaces whose store failed a batch in this pass: their next batches wait
        for i, batch in enumerate(batches):
            if (abandoned := call.stopping()) is not None:
                if abandoned:
                    raise RollupsAbandoned(_keys(deferred + batches[i:]), results)
                call.waited_enough(deferred + batches[i:])
                return results
            if batch.ns.name in call.leaving and not (batch := call.without_given_up(batch)).counters:
                continue
            if batch.ns.name in down:
                deferred.append(_Batch(batch.ns, batch.counters, waiting=True))
                continue
            if (i >= first_round and budget_until is not None and time.monotonic() >= budget_until and not deferred
                    and not call.leaving):
                raise OverBudget(_keys(batches[i:]), results)
            if not first and pressure.pause_s:
                await asyncio.sleep(pressure.pause_s)
            first = False
            started = time.monotonic()
            try:
                results.extend(await _rollup_batch(batch, call))
            except StoreOutage as exc:
                results.extend(exc.done)
                down.add(batch.ns.name)
                call.leaving.add(batch.ns.name)
                if exc.left:
                    deferred.append(_Batch(batch.ns, exc.left, waiting=True))
                call.outage.failed(batch.ns.name, exc.error, exc.left)
                call.waits_from = time.monotonic() if call.waits_from is None else call.waits_from
            except _Halted as exc:
                results.extend(exc.done)
                rest = [_Batch(batch.ns, exc.left, batch.waiting), *batches[i + 1:]]
                if exc.abandoned:
                    raise RollupsAbandoned(_keys(deferred + rest), results) from None
                call.waited_enough(deferred + rest)
                return results
            pressure.last_batch_s = time.monotonic() - started
        if not deferred:
            return results
        if call.overdue():
            call.waited_enough(deferred)
            return results
        if not await call.outage.wait(give_up, call.until):
            raise RollupsAbandoned(_keys(deferred), results)
        batches = deferred


BACKLOG_BATCHES = 8  # a namespace's set of more than this many rollup_batch_count batches is rolled up in larger ones


def batch_size(batch_count: int, queued: int, batch_max: int | None) -> int:
    """How many counters of a namespace one batch rolls up, `queued` of them in the coalesced set.

    `rollup_batch_count`, unless the set holds more than BACKLOG_BATCHES of those: then the set is cut into about
    BACKLOG_BATCHES batches, none above `batch_max` (the worker's `rollup_batch_max`; None keeps rollup_batch_count).
    Why: a batch costs about seven store round trips whatever its size (on SQLite about 7 ms against 0.09 ms a
    counter), so a burst of new counters rolled up 32 at a time ran at a third of what the store takes."""
    step = max(1, batch_count)
    if batch_max is None or queued <= step * BACKLOG_BATCHES:
        return step
    return max(step, min(batch_max, -(-queued // BACKLOG_BATCHES)))


def _batches(keys: Iterable[Key], registry: NamespaceRegistry, batch_max: int | None = None) -> list[_Batch]:
    """The set's batches in rounds, one batch of each namespace a round, the namespaces with fewest counters first:
    the signals of every namespace share the rollup queues, so a quiet namespace's few counters would otherwise wait
    out a burst of another's (a scale review saw 39-125 s), and a set cut by its budget (`OverBudget`) after the first
    round has given every namespace a batch, the largest too."""
    by_ns: dict[str, list[str]] = defaultdict(list)
    for ns_name, counter in keys:
        by_ns[ns_name].append(counter)
    per_ns: list[list[_Batch]] = []
    for ns_name, counters in sorted(by_ns.items(), key=lambda item: len(item[1])):
        ns = registry.get(ns_name)
        if ns is None:
            log.warning("rollup signal for unknown namespace %r ignored", ns_name)
            continue
        names = list(dict.fromkeys(counters))
        step = batch_size(ns.rollup_batch_count, len(names), batch_max)
        per_ns.append([_Batch(ns, names[i:i + step]) for i in range(0, len(names), step)])
    return [b for round_ in itertools.zip_longest(*per_ns) for b in round_ if b is not None]


def _wait_for_store(call: _Call, ns: Namespace, error: BaseException, done: list[RollupResult],
                    left: list[str]) -> StoreOutage:
    """The `StoreOutage` that has `left` wait for the store, but for the counters given up after an earlier wait:
    those never wait again (they may be failing alone), they are left to the sweep untried."""
    given_up = {c for c in left if call.outage.remembers((ns.name, c))}
    _untried(ns, [c for c in left if c in given_up], error)
    return StoreOutage(error, done, [c for c in left if c not in given_up])


async def _rollup_batch(batch: _Batch, call: _Call) -> list[RollupResult]:
    """One batch; if it fails, its counters one by one. While the store is taken as away (an outage is on: the
    worker's namespaces share their stores), a batch failing as if it still were waits at once, without trying counters
    alone."""
    ns = batch.ns.name
    try:
        mark = await call.targets.watermark()
    except Exception as exc:
        if store_unavailable(exc):  # the rollup store is away: nothing can be rolled up
            raise _wait_for_store(call, batch.ns, exc, [], batch.counters) from exc
        raise
    try:
        done = await call.targets.rollup(batch.ns, batch.counters, mark)
    except Exception as exc:
        if store_unavailable(exc) and call.outage.active:  # logged when the outage began
            log.debug("rollup batch of %d counter(s) of %r failed again: %r", len(batch.counters), ns, exc)
            raise _wait_for_store(call, batch.ns, exc, [], batch.counters) from exc
        log.exception("rollup batch of %d counter(s) of namespace %r failed; rolling them up one by one",
                      len(batch.counters), ns)
        return await _one_by_one(batch, call, mark)
    call.outage.answered(ns, done)
    return done


async def _one_by_one(batch: _Batch, call: _Call, watermark_us: int) -> list[RollupResult]:
    """The rollups of a failed batch, a counter at a time: one failing counter must not hold back the others (nor,
    with the batch retried, every later batch of the worker). A counter that still fails is logged and left behind:
    its rollup stays stale, so the sweep (or its next write's signal) tries it again.

    Unless the store is away: then every counter would fail, each maybe after a timeout, and be left to the sweep.
    Counters failing in a row with errors saying so stop the pass with `StoreOutage` once they prove it
    (`_Call.verdict`), and the batch waits for the store; so does a batch ending on such failures (counters tried twice
    when the store answered the others). Counters given up after an earlier wait go last and never wait again: they
    prove no outage, but enough of them failing in a row leave the rest to the sweep untried."""
    ns = batch.ns
    counters = sorted(batch.counters, key=lambda c: call.outage.remembers((ns.name, c)))  # stable: fresh ones first
    results: list[RollupResult] = []
    failed: list[tuple[str, Exception]] = []  # left behind, unless tried again and done
    run: list[tuple[str, Exception]] = []  # the latest failures in a row, each saying the store is away
    need = min(PROBES, len(counters))
    for i, counter in enumerate(counters):
        if (abandoned := call.stopping()) is not None:
            raise _Halted(results, [c for c, _ in failed + run] + counters[i:], abandoned=abandoned)
        try:
            done = await call.targets.rollup(ns, [counter], watermark_us)
        except Exception as exc:
            if not store_unavailable(exc):
                failed.extend(run)
                run.clear()
                failed.append((counter, exc))
                continue
            run.append((counter, exc))
            if len(run) < need:
                continue
            verdict = await call.verdict(ns.name, run, need, read=len(run) % need == 0)
            if verdict == OUTAGE:
                _left_behind(ns, failed)
                raise _wait_for_store(call, ns, exc, results, [c for c, _ in run] + counters[i + 1:]) from exc
            if verdict == GIVEN_UP:
                _left_behind(ns, failed + run)
                _untried(ns, counters[i + 1:], exc)
                call.leaving.add(ns.name)
                return results
            continue
        results.extend(done)
        call.outage.answered(ns.name, done)
        failed.extend(run)
        run.clear()
    tried = len(run)
    if results:  # the store answers: a counter it failed meanwhile may have met it coming back, so try it again
        failed = await _again(batch, failed, results, call, watermark_us)
        run = await _again(batch, run, results, call, watermark_us)
    if tried and len(run) == tried and all(store_unavailable(exc) for _, exc in run):
        # the pass ended on counters failing as if the store were away (again, after others were done): it may have
        # gone away during the last counters
        if (abandoned := call.stopping()) is not None:
            raise _Halted(results, [c for c, _ in failed + run], abandoned=abandoned)
        if await call.verdict(ns.name, run, max(2, min(need, tried)), read=tried < need) == OUTAGE:
            _left_behind(ns, failed)
            raise _wait_for_store(call, ns, run[-1][1], results, [c for c, _ in run])
    _left_behind(ns, failed + run)
    return results


async def _again(batch: _Batch, failed: list[tuple[str, Exception]], results: list[RollupResult], call: _Call,
                 watermark_us: int) -> list[tuple[str, Exception]]:
    """Roll up once more, alone, the counters that failed with an error saying the store was away (adding to
    `results`); returns the counters still failing (and those not tried again: the worker gives up)."""
    still: list[tuple[str, Exception]] = []
    for k, (counter, exc) in enumerate(failed):
        if not store_unavailable(exc):
            still.append((counter, exc))
            continue
        if call.stopping() is not None:
            still.extend(failed[k:])
            break
        try:
            done = await call.targets.rollup(batch.ns, [counter], watermark_us)
        except Exception as again:
            still.append((counter, again))
            continue
        results.extend(done)
        call.outage.answered(batch.ns.name, done)
    return still


def _untried(ns: Namespace, counters: list[str], error: BaseException | None = None) -> None:
    if counters:  # one line a batch
        log.error("rollup of %d counter(s) of %r left for the sweep untried: given up after an earlier wait for the "
                  "store, which fails them again as if it were away%s", len(counters), ns.name,
                  "" if error is None else f" ({error!r})")


def _left_behind(ns: Namespace, failed: list[tuple[str, Exception]]) -> None:
    if failed:  # one line a batch: the sweep brings such counters back often
        first, error = failed[0]
        log.error("rollup of %d counter(s) of %r failed, left for their next signal or the sweep; the first, %r: %r",
                  len(failed), ns.name, first, error)
