"""Recount: recompute counters from the event store, compare with their stored rollups, and fix them.

`counter recount` runs `RecountJob`; `jobs.replay` uses the same `Recounter` for counters whose restored
events lie inside already rolled-up windows.

Per counter, with B = rollup_boundary(now, persist watermark) (DESIGN invariant 3, never past the watermark):
* value_at(t) = the count of every event with event_time <= t, from zero (or from the --since base);
* drift = stored.count - value_at(stored.rollup_ts): measured at the stored rollup's own boundary, so events
  still in flight or not rolled up yet never count as drift; a missing rollup row is drift of the whole value;
* unless dry-run: write (value_at(B), B), forward-only (invariant 4), then verify: a rollup worker racing
  us may have moved the counter further from the drifted value; then it is recounted again at a later B.

Its time buckets too, when the namespace keeps windows (DESIGN invariant 7), with the worker's own algorithm
(``agents.windows.maintain_buckets``) run against a bucket store that records its writes instead of applying them:
* drift per bucket: the buckets recomputed from the events at the stored rollup_ts R (the boundary that certifies
  them: the worker maintains buckets before the rollup that moves rollup_ts), compared with the stored ones as
  they read (masked by the counter's latest clear, 0 when missing). A stored bucket that holds no event gets a
  zero minute in the recomputation, so a bucket that should not exist is found too. Buckets whose sources may be
  gone (events older than delete_after, finer buckets past their retention) are not recomputed, so neither
  compared nor overwritten: that is maintain_buckets' retention guard, reused as it is;
* unless dry-run, and only when the rollup moves (B > R): every bucket recomputed at B is written with
  computed_upto = B, the latest clear bumped first, *before* the rollup write, as the worker does. Forward-only
  makes a corrected value win because B is later than the computed_upto of every bucket the rollup R certifies;
  a bucket stamped at or after B (a worker's step in flight) refuses it and the counter is retried at a later B,
  like a rollup. Buckets are never written at B <= R: a value at B stamped below R would hide events of (B, R]
  from a reader of as_of R, and no later rollup step would revisit it.

A UNIQUE namespace's sketches (``agents.sketches``) are rebuilt with the buckets, at B, from the same events: a
replay that restored events inside rolled-up windows gets them into the estimates too.

`RecountJob` walks a namespace's counters (or a given list) in name order and saves, at least once a second,
the last counter done, the tallies and the counters to retry in <data dir>/recount/<namespace>-<digest>.json:
stopped, it returns; run again with the same options, it resumes after that counter.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agents.sketches import maintain_sketches
from agents.windows import BucketWork, maintain_buckets
from control_plane import CounterType, Namespace, NamespaceRegistry
from control_plane.admission import rollup_boundary
from jobs.progress import NullProgress, Progress, Stop, never
from jobs.runtime import Runtime
from jobs.state import fmt_time, read_json, write_json_atomic
from schemas import MAX_EVENT_TIME, parse_generation_time
from sinks import BucketStore, EventStore, RollupCache, RollupStore, SketchStore, apply_aggregate, dropped_key
from sinks.windows import CHAIN, BucketRange, BucketRow, BucketSum, Granularity, StoredBucket, align_down, masked

Key = tuple[str, str]
RETRY = ("behind", "raced")  # actions worth another attempt once the watermark has moved
_US = 1_000_000


def rfc3339(us: int) -> str:
    """A bucket start (whole seconds) as RFC 3339 UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(us // _US))


@dataclass(slots=True)
class BucketDrift:
    """A bucket whose stored value, as it reads (masked by the counter's latest clear, 0 when missing), differs
    from the value recomputed from the events at the stored rollup's boundary."""

    granularity: str
    start_us: int
    stored: int
    recomputed: int
    action: str = "dry-run"  # dry-run | written | behind | raced (see CounterRecount.action)

    def as_json(self) -> dict[str, object]:
        return {"granularity": self.granularity, "start": rfc3339(self.start_us), "start_us": self.start_us,
                "stored": self.stored, "recomputed": self.recomputed, "action": self.action}


@dataclass(slots=True)
class CounterRecount:
    """What a recount found and did for one counter (times in epoch µs)."""

    namespace: str
    counter: str
    stored: int | None  # stored rollup count (None: no rollup row)
    stored_rollup_ts: int | None
    recomputed: int | None  # value at `boundary` (None: not computable, see status)
    boundary: int
    drift: int  # stored - recomputed at the stored rollup_ts; -recomputed for a missing row
    status: str  # ok | drift | missing | no-base | unknown (no rollup, no event)
    action: str = "dry-run"  # dry-run | written | unchanged | behind | raced | skipped
    count: int | None = None  # the stored count after the recount
    rollup_ts: int | None = None
    buckets: list[BucketDrift] = field(default_factory=list)  # drifted time buckets (empty: none, or no windows)
    buckets_checked: int = 0  # buckets recomputed and compared

    def as_json(self) -> dict[str, object]:
        out = asdict(self)
        out["buckets"] = [b.as_json() for b in self.buckets]
        return out


class _Recorder:
    """A bucket store for ``maintain_buckets`` that reads through to the real one and records the clears' bump
    and the bucket writes instead of applying them: what a rollup step would write."""

    def __init__(self, store: BucketStore) -> None:
        self.store = store
        self.clears_bumped: list[tuple[str, int]] = []
        self.rows: list[BucketRow] = []

    async def read_buckets_many(self, namespace: str, ranges: Sequence[BucketRange]) -> list[list[StoredBucket]]:
        return await self.store.read_buckets_many(namespace, ranges)

    async def clears(self, namespace: str, counters: Sequence[str]) -> dict[str, int]:
        return await self.store.clears(namespace, counters)

    async def bump_clears(self, namespace: str, items: Sequence[tuple[str, int]]) -> None:
        self.clears_bumped.extend(items)

    async def write_buckets(self, namespace: str, rows: Sequence[BucketRow]) -> list[bool]:
        self.rows.extend(rows)
        return [True] * len(rows)


class _ZeroFilled:
    """The event store as ``maintain_buckets`` reads it, plus a minute of 0 (no events) wherever a stored bucket
    meets the recomputed range without holding events there: its first minute in the range. The recomputation
    then covers that bucket too (as 0, or as the sum of its other children), so a bucket that should not exist
    shows up as drift and is rewritten. A true answer: those minutes hold no events in the window."""

    def __init__(self, events: EventStore, spans: Sequence[tuple[int, int]]) -> None:
        self.events = events
        self.spans = spans  # [start, end) of the counter's stored buckets

    async def bucket_sums_many(self, namespace: str, windows: Sequence[tuple[str, int, int]],
                               width_us: int) -> list[list[BucketSum]]:
        found = await self.events.bucket_sums_many(namespace, windows, width_us)
        out = []
        for (_counter, after, upto), sums in zip(windows, found, strict=True):
            have = {row[0] for row in sums}
            extra = set()
            for start, end in self.spans:
                first = max(start, after + 1)
                first = -(-first // width_us) * width_us  # the first whole minute in the window
                if first < end and first <= upto and first not in have:
                    extra.add(first)
            out.append(sorted([*sums, *((m, 0, None, 0) for m in extra)], key=lambda row: row[0]))
        return out


class _CounterBuckets:
    """One counter's stored buckets and clear, and what ``maintain_buckets`` recomputes them to."""

    def __init__(self, ns: Namespace, counter: str, *, events: EventStore, buckets: BucketStore, from_us: int,
                 now_us: int) -> None:
        self.ns, self.counter, self.events, self.store = ns, counter, events, buckets
        self.from_us, self.now_us = from_us, now_us
        self.chain = tuple(g for g in CHAIN if ns.windows.enabled(g))
        self.stored: dict[tuple[Granularity, int], tuple[int, int]] = {}  # (g, start) -> (value, computed_upto)
        self.clear: int | None = None

    async def load(self, upto_us: int) -> None:
        """The stored buckets that a recomputation up to ``upto_us`` can touch: those starting from the coarsest
        bucket holding the first time whose events are still kept (or --since), up to ``upto_us``."""
        kept_from = max(self.from_us, self.now_us - int(self.ns.retention.delete_after_s * _US), 0)
        lo = align_down(kept_from, self.chain[-1])
        ranges: list[BucketRange] = [(self.counter, g, lo, upto_us + 1) for g in self.chain]
        found = await self.store.read_buckets_many(self.ns.name, ranges)
        self.stored = {(g, start): (value, upto) for g, rows in zip(self.chain, found, strict=True)
                       for start, value, upto in rows}
        self.clear = (await self.store.clears(self.ns.name, [self.counter])).get(self.counter)

    async def recompute(self, boundary: int) -> _Recorder:
        """The buckets (and clear) a rollup step from ``from_us`` to ``boundary`` writes, recorded."""
        recorder = _Recorder(self.store)
        spans = [(start, start + g.width_us) for g, start in self.stored]
        # _ZeroFilled and _Recorder have the store methods maintain_buckets calls, not the whole store protocols
        await maintain_buckets(self.ns, [BucketWork(self.counter, self.from_us, boundary)],
                               events=_ZeroFilled(self.events, spans), buckets=recorder,  # type: ignore[arg-type]
                               now_us=self.now_us)
        return recorder

    def drift(self, recorded: _Recorder, measured_at: int) -> tuple[list[BucketDrift], int]:
        """Drifted buckets (in time order, finest first) and how many were compared: every recomputed bucket
        but those stored at a later boundary than ``measured_at`` that may hold events after it (in flight)."""
        clears = [t for t in (self.clear, *(t for _c, t in recorded.clears_bumped)) if t is not None]
        clear_after = max(clears) if clears else None
        drifted: list[BucketDrift] = []
        checked = 0
        for _c, g, start, value, _upto in recorded.rows:
            stored, upto = self.stored.get((g, start), (0, None))
            if upto is not None and upto > measured_at and start + g.width_us > measured_at + 1:
                continue
            checked += 1
            before, after = masked(g, start, stored, self.clear), masked(g, start, value, clear_after)
            if before != after:
                drifted.append(BucketDrift(g.value, start, before, after))
        return drifted, checked

    async def apply(self, recorded: _Recorder, boundary: int, drifted: list[BucketDrift]) -> None:
        """Write what ``recompute(boundary)`` recorded, as the worker would (the clear first), and set each
        drifted bucket's action from whether its forward-only write was applied."""
        if recorded.clears_bumped:
            await self.store.bump_clears(self.ns.name, recorded.clears_bumped)
        # a 0 where nothing is stored reads the same (series are zero-filled): the zero minutes given for stored
        # buckets without events, and their parents, are not written as new rows
        rows = [row for row in recorded.rows if row[3] or (row[1], row[2]) in self.stored]
        applied = await self.store.write_buckets(self.ns.name, rows) if rows else []
        done = {(g.value, start): ok for (_c, g, start, _v, _u), ok in zip(rows, applied, strict=True)}
        for d in drifted:
            if done.get((d.granularity, d.start_us)):
                d.action = "written"
            else:  # stamped at or after B before we started (behind), or by a worker meanwhile (raced)
                _value, upto = self.stored.get((Granularity(d.granularity), d.start_us), (0, 0))
                d.action = "behind" if upto >= boundary else "raced"


async def recount_counter(ns: Namespace, counter: str, *, events: EventStore, rollups: RollupStore,
                          cache: RollupCache | None, watermark_us: int, since_us: int | None = None,
                          dry_run: bool = False, now_us: int | None = None,
                          buckets: BucketStore | None = None, sketches: SketchStore | None = None) -> CounterRecount:
    """One attempt at recounting one counter and, with a bucket store, its time buckets (see the module doc); with
    a sketch store, a UNIQUE namespace's sketches are rebuilt with the buckets (not compared: a union of immutable
    events cannot drift, it can only miss events a replay restored)."""
    name = ns.name
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    boundary = rollup_boundary(now_us, watermark_us, ns)
    state = await rollups.get(name, counter)
    start, base = 0, 0
    if since_us is None and state is not None:
        # Events before what retention may have deleted cannot be recounted: from there, the stored count is taken
        # as it was, as --since takes it (a recount from zero set a counter of 110 to the 10 still stored: a review)
        dropped = (await rollups.watermarks(dropped_key(name))).get(0, 0)
        if state.rollup_ts <= dropped:
            start, base = state.rollup_ts, state.count
        elif dropped > 0:
            window = await events.aggregate(name, counter, dropped, state.rollup_ts)
            start, base = dropped, (0 if window.cleared else state.count - window.delta)
    elif since_us is not None:
        if state is None or state.rollup_ts < since_us:
            return CounterRecount(name, counter, None if state is None else state.count,
                                  None if state is None else state.rollup_ts, None, boundary, 0, "no-base", "skipped")
        window = await events.aggregate(name, counter, since_us, state.rollup_ts)
        start, base = since_us, (0 if window.cleared else state.count - window.delta)

    async def value_at(ts: int) -> int:
        if ts <= start:
            return base
        return apply_aggregate(base, await events.aggregate(name, counter, start, ts))

    if state is None:
        if not (await events.aggregate(name, counter, 0, MAX_EVENT_TIME)).events:
            # no rollup and no event: a counter nobody wrote (a misspelled name?), not one whose row was lost
            return CounterRecount(name, counter, None, None, None, boundary, 0, "unknown", "skipped")
        recomputed = await value_at(boundary)
        result = CounterRecount(name, counter, None, None, recomputed, boundary, -recomputed, "missing")
    else:
        at_stored = await value_at(state.rollup_ts)
        if boundary >= state.rollup_ts:
            recomputed = apply_aggregate(at_stored, await events.aggregate(name, counter, state.rollup_ts, boundary))
        else:
            recomputed = await value_at(boundary)
        drift = state.count - at_stored
        result = CounterRecount(name, counter, state.count, state.rollup_ts, recomputed, boundary, drift,
                                "drift" if drift else "ok")

    current_ts = state.rollup_ts if state is not None else 0
    windows: _CounterBuckets | None = None
    at_boundary: _Recorder | None = None  # the buckets recomputed at B, when measured there
    if buckets is not None and ns.windows:
        windows = _CounterBuckets(ns, counter, events=events, buckets=buckets, from_us=start, now_us=now_us)
        measured_at = state.rollup_ts if state is not None else boundary  # what the stored rollup certifies
        await windows.load(max(measured_at, boundary))
        recorded = await windows.recompute(measured_at)
        result.buckets, result.buckets_checked = windows.drift(recorded, measured_at)
        if measured_at == boundary:
            at_boundary = recorded
    if dry_run:
        return result

    if boundary <= current_ts:
        # Forward-only: nothing can be written before the watermark passes the stored rollup (buckets neither).
        drifted = result.status != "ok" or bool(result.buckets)
        result.action = "behind" if drifted else "unchanged"
        for d in result.buckets:
            d.action = "behind"
        if state is not None:
            result.count, result.rollup_ts = state.count, state.rollup_ts
            if cache is not None and result.status == "ok":  # read at our start: a worker may have moved it since
                await _refresh_cache(cache, rollups, ns, counter, state.count, state.rollup_ts)
        return result

    if windows is not None:  # the buckets first: the rollup written next certifies them (as in the worker)
        if at_boundary is None:
            at_boundary = await windows.recompute(boundary)
        await windows.apply(at_boundary, boundary, result.buckets)
        if sketches is not None and ns.counts_unique:  # with the buckets, at B, as the worker's rollup step
            await maintain_sketches(ns, [BucketWork(counter, start, boundary)], events=events, sketches=sketches,
                                    buckets=windows.store, now_us=now_us)
    await rollups.write_rollup(name, counter, recomputed, boundary)
    fresh = await rollups.get(name, counter)
    if fresh is None:  # deleted under our feet
        result.action = "raced"
        return result
    result.count, result.rollup_ts = fresh.count, fresh.rollup_ts
    if fresh.rollup_ts == boundary and fresh.count == recomputed:
        result.action = "written"
    elif fresh.count == await value_at(fresh.rollup_ts):
        result.action = "written"  # a rollup worker moved it further meanwhile, from the right value
    else:
        result.action = "raced"  # ... from the drifted one: recount again at a later boundary
    if cache is not None and result.action == "written":
        await _refresh_cache(cache, rollups, ns, counter, fresh.count, fresh.rollup_ts)
    if state is None and result.action == "written":
        # The lost row also lost last_write_ts: restore it so the sweep rolls up events after B.
        newest = await _newest_event_after(events, name, counter, boundary)
        if newest is not None:
            await rollups.bump_last_write([(name, counter, newest)])
    late = [d.action for d in result.buckets if d.action in RETRY]
    if late and result.action not in RETRY:
        result.action = late[0]  # a drifted bucket refused our write: recount again at a later boundary
    return result


async def _refresh_cache(cache: RollupCache, rollups: RollupStore, ns: Namespace, counter: str, count: int,
                         rollup_ts: int) -> None:
    """Cache our rollup unless the cache holds a later one (forward-only, as the workers cache theirs), then follow
    a rollup a worker stored meanwhile, in case its own cache write came first or never came (a few rounds)."""
    for _ in range(3):
        await cache.advance(ns.name, counter, count, rollup_ts, ns.ttl_s)
        now = await rollups.get(ns.name, counter)
        if now is None or now.rollup_ts <= rollup_ts:
            return
        count, rollup_ts = now.count, now.rollup_ts


async def _newest_event_after(events: EventStore, namespace: str, counter: str, after_us: int) -> int | None:
    newest = None
    cursor = None
    while True:
        page = await events.scan(namespace, counter, after_us, MAX_EVENT_TIME, after=cursor, limit=10_000)
        if not page:
            return newest
        newest = page[-1][2]
        if len(page) < 10_000:
            return newest
        cursor = (page[-1][2], page[-1][3], page[-1][4])


@dataclass
class Recounter:
    """Recounts counters of any namespace against one event store, rollup store and cache."""

    registry: NamespaceRegistry
    events: EventStore
    rollups: RollupStore
    cache: RollupCache | None
    watermark: Callable[[], Awaitable[int]]
    since_us: int | None = None
    dry_run: bool = False
    retry_interval_s: float = 0.25
    buckets: BucketStore | None = None  # recount the namespaces' time buckets too
    sketches: SketchStore | None = None  # and a UNIQUE namespace's sketches
    pending: dict[Key, CounterRecount] = field(default_factory=dict)  # behind/raced, to retry
    ask_watermark: Callable[[], Awaitable[None]] | None = None  # wakes idle workers' heartbeats before a retry

    async def once(self, namespace: str, counter: str) -> CounterRecount:
        ns = self.registry[namespace]
        result = await recount_counter(ns, counter, events=self.events, rollups=self.rollups, cache=self.cache,
                                       watermark_us=await self.watermark(), since_us=self.since_us,
                                       dry_run=self.dry_run, buckets=self.buckets, sketches=self.sketches)
        if result.action in RETRY:
            self.pending[(namespace, counter)] = result
        else:
            self.pending.pop((namespace, counter), None)
        return result

    async def retry(self, wait_s: float, stop: Callable[[], bool] = lambda: False) -> list[CounterRecount]:
        """Retry behind/raced counters as the watermark moves, for up to `wait_s`; returns their final results."""
        deadline = time.monotonic() + wait_s
        finals: dict[Key, CounterRecount] = {}
        if self.pending and self.ask_watermark is not None:
            await self.ask_watermark()  # the watermark may stand still: idle workers stop their heartbeats
        while self.pending and time.monotonic() < deadline and not stop():
            await asyncio.sleep(self.retry_interval_s)
            for key in list(self.pending):
                finals[key] = await self.once(*key)
        finals.update(self.pending)
        return list(finals.values())

    async def recount(self, keys: Iterable[Key], wait_s: float = 10.0) -> list[CounterRecount]:
        results = {key: await self.once(*key) for key in keys}
        for r in await self.retry(wait_s):
            results[(r.namespace, r.counter)] = r
        return list(results.values())


def recounter_of(runtime: Runtime, *, since_us: int | None = None, dry_run: bool = False) -> Recounter:
    """A `Recounter` over the runtime's stores (time buckets included) and cache, bounded by its persist
    watermark."""
    return Recounter(runtime.registry, runtime.events, runtime.rollups, runtime.cache, runtime.watermark,
                     since_us=since_us, dry_run=dry_run, buckets=runtime.buckets, sketches=runtime.sketches,
                     ask_watermark=runtime.request_heartbeats)


# -- the job behind `counter recount` ---------------------------------------------------------------


class RecountError(RuntimeError):
    """The recount cannot start (unknown or BEST_EFFORT namespace)."""


@dataclass(frozen=True, slots=True)
class RecountOptions:
    namespace: str
    counters: tuple[str, ...] = ()  # these counters, or
    all: bool = False  # every counter of the namespace that has stored events
    since: str | None = None  # ISO time (or epoch): events at or before it are not read (see recount_counter)
    dry_run: bool = False
    wait_s: float = 10.0  # how long to wait for the watermark to pass a stored rollup
    restart: bool = False  # ignore the saved progress of an interrupted run

    def state_path(self, data_dir: Path) -> Path:
        what = json.dumps([self.namespace, sorted(set(self.counters)), self.all, self.since, self.dry_run])
        digest = hashlib.sha1(what.encode()).hexdigest()[:12]
        return data_dir / "recount" / f"{self.namespace}-{digest}.json"


@dataclass(slots=True)
class RecountSummary:
    namespace: str
    total: int  # counters to recount (including those done by an interrupted run)
    tallies: dict[str, int]  # counters, per status, per "action:<action>", abs_drift, bucket_drift (drifted
    #                          buckets), bucket_drift_counters, buckets_written (of those), buckets_checked
    #                          (over resumed runs too)
    interrupted: bool
    after: str | None  # the last counter done
    cache_note: str

    def count(self, key: str) -> int:
        return self.tallies.get(key, 0)

    @property
    def drifted(self) -> int:
        return self.count("drift") + self.count("missing")

    @property
    def bucket_drift(self) -> int:
        """Drifted time buckets found (each counter's final attempt)."""
        return self.count("bucket_drift")

    @property
    def not_written(self) -> int:
        """Counters that could not be written yet (behind the watermark, or raced): run again."""
        return sum(self.count(f"action:{a}") for a in RETRY)


async def _count_counters(events: EventStore, namespace: str, after: str | None) -> int:
    total = 0
    while True:
        page = await events.counters(namespace, after=after, limit=1000)
        total += len(page)
        if len(page) < 1000:
            return total
        after = page[-1]


async def _names(events: EventStore, namespace: str, after: str | None) -> AsyncIterator[str]:
    while True:
        page = await events.counters(namespace, after=after, limit=1000)
        for name in page:
            yield name
        if len(page) < 1000:
            return
        after = page[-1]


async def _explicit(names: list[str], after: str | None) -> AsyncIterator[str]:
    for name in names:
        if after is None or name > after:
            yield name


class RecountJob:
    """Recount a namespace's counters; `report` gets each counter's final result as soon as it is known."""

    def __init__(self, options: RecountOptions, runtime: Runtime, *,
                 report: Callable[[CounterRecount], None] = lambda r: None,
                 progress: Progress | None = None, stop: Stop = never) -> None:
        self.options = options
        self.runtime = runtime
        self.report = report
        self.progress = progress or NullProgress()
        self.stop = stop
        self.state_path = options.state_path(runtime.settings.data_dir)
        self.tallies: dict[str, int] = {}

    def _final(self, r: CounterRecount) -> None:
        t = self.tallies
        t["counters"] = t.get("counters", 0) + 1
        t[r.status] = t.get(r.status, 0) + 1
        t[f"action:{r.action}"] = t.get(f"action:{r.action}", 0) + 1
        t["abs_drift"] = t.get("abs_drift", 0) + abs(r.drift)
        t["buckets_checked"] = t.get("buckets_checked", 0) + r.buckets_checked
        if r.buckets:
            t["bucket_drift"] = t.get("bucket_drift", 0) + len(r.buckets)
            t["bucket_drift_counters"] = t.get("bucket_drift_counters", 0) + 1
            t["buckets_written"] = t.get("buckets_written", 0) + sum(d.action == "written" for d in r.buckets)
        self.report(r)

    def _note(self) -> str:
        t = self.tallies
        note = f"drift {t.get('drift', 0) + t.get('missing', 0):,}"
        return note + (f", {t['bucket_drift']:,} bucket(s)" if t.get("bucket_drift") else "")

    def _save(self, after: str | None, recounter: Recounter) -> None:
        write_json_atomic(self.state_path, {"after": after, "tallies": self.tallies,
                                            "retry": [list(k) for k in recounter.pending]})

    async def run(self) -> RecountSummary:
        opts, runtime, progress, stop = self.options, self.runtime, self.progress, self.stop
        ns = runtime.registry.get(opts.namespace)
        if ns is None:
            raise RecountError(f"unknown namespace {opts.namespace!r} (known: {', '.join(runtime.registry.names())})")
        if ns.counter_type is CounterType.BEST_EFFORT:
            raise RecountError(f"namespace {opts.namespace!r} is BEST_EFFORT: its counts live in the cache only, "
                               "there are no events to recount")
        since_us = parse_generation_time(opts.since, field="--since") if opts.since else None
        state = {} if opts.restart else read_json(self.state_path)
        after = state.get("after")
        self.tallies = dict(state.get("tallies", {}))
        retry_keys = [tuple(k) for k in state.get("retry", [])]
        if after is not None:
            progress.log(f"resuming an interrupted recount after counter {after!r} (--restart to start over)")
        recounter = recounter_of(runtime, since_us=since_us, dry_run=opts.dry_run)
        names = sorted(set(opts.counters))
        source: AsyncIterator[str]
        if opts.all:
            total = await _count_counters(runtime.events, ns.name, None)
            done = total - await _count_counters(runtime.events, ns.name, after) if after else 0
            source = _names(runtime.events, ns.name, after)
        else:
            total = len(names)
            done = sum(1 for n in names if after is not None and n <= after)
            source = _explicit(names, after)
        mark = await runtime.watermark()
        boundary = rollup_boundary(time.time_ns() // 1000, mark, ns)
        what = "checking" if opts.dry_run else "recounting"
        kept = f" and their {'/'.join(ns.windows.granularities)} buckets" if ns.windows else ""
        progress.log(f"{what} {total:,} counter(s) of {ns.name}{kept} up to {fmt_time(boundary)} "
                     f"(persist watermark {fmt_time(mark)})")
        dropped = (await runtime.rollups.watermarks(dropped_key(ns.name))).get(0, 0) if opts.all else 0
        if dropped:  # --all finds counters by their events: say so once retention deleted some (it said 0, silent)
            progress.log(f"retention deleted events up to {fmt_time(dropped)}: --all lists counters by their stored "
                         "events, so a counter with none since is not listed (its stored count has nothing left to "
                         "be checked against)")
        for key in retry_keys:  # behind/raced counters of the interrupted run: try them again first
            result = await recounter.once(*key)
            if result.action not in RETRY:
                self._final(result)
        interrupted = False
        progress.start(what, total=total, unit="counters", completed=done)
        try:
            last_save = time.monotonic()
            async for name in source:
                result = await recounter.once(ns.name, name)
                if result.action not in RETRY:
                    self._final(result)
                after = name
                progress.advance(1, note=self._note())
                if stop() or time.monotonic() - last_save > 1.0:
                    self._save(after, recounter)
                    last_save = time.monotonic()
                if stop():
                    interrupted = True
                    break
            if not interrupted and recounter.pending:
                progress.update(note=f"waiting for the watermark ({len(recounter.pending)} counter(s))")
                for r in await recounter.retry(opts.wait_s, stop):
                    if not (stop() and r.action in RETRY):  # else: retried on resume
                        self._final(r)
                interrupted = stop()
        finally:
            progress.finish()
        if interrupted:
            self._save(after, recounter)
        else:
            self.state_path.unlink(missing_ok=True)
        return RecountSummary(ns.name, total, self.tallies, interrupted, after, runtime.cache_note)
