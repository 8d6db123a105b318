"""Recount: recompute counters from the event store, compare with their stored rollups, and fix them.

`counter recount` runs `RecountJob`; `jobs.replay` uses the same `Recounter` for counters whose restored
events lie inside already rolled-up windows.

Per counter, with B = rollup_boundary(now, persist watermark) (DESIGN invariant 3, never past the watermark):
* value_at(t) = the count of every event with event_time <= t, from zero (or from the --since base);
* drift = stored.count - value_at(stored.rollup_ts): measured at the stored rollup's own boundary, so events
  still in flight or not rolled up yet never count as drift; a missing rollup row is drift of the whole value;
* unless dry-run: write (value_at(B), B), forward-only (invariant 4), then verify: a rollup worker racing
  us may have moved the counter further from the drifted value; then it is recounted again at a later B.

`RecountJob` walks a namespace's counters (or a given list) in name order and saves, at least once a second,
the last counter done, the tallies and the counters to retry in <data dir>/recount/<namespace>-<digest>.json:
stopped, it returns; run again with the same options, it resumes after that counter.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from control_plane import CounterType, Namespace, NamespaceRegistry
from control_plane.admission import rollup_boundary
from jobs.progress import NullProgress, Progress, Stop, never
from jobs.runtime import Runtime
from jobs.state import fmt_time, read_json, write_json_atomic
from schemas import MAX_EVENT_TIME, parse_generation_time
from sinks import EventStore, RollupCache, RollupStore, apply_aggregate

Key = tuple[str, str]
RETRY = ("behind", "raced")  # actions worth another attempt once the watermark has moved


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
    status: str  # ok | drift | missing | no-base
    action: str = "dry-run"  # dry-run | written | unchanged | behind | raced | skipped
    count: int | None = None  # the stored count after the recount
    rollup_ts: int | None = None

    def as_json(self) -> dict[str, object]:
        return asdict(self)


async def recount_counter(ns: Namespace, counter: str, *, events: EventStore, rollups: RollupStore,
                          cache: RollupCache | None, watermark_us: int, since_us: int | None = None,
                          dry_run: bool = False, now_us: int | None = None) -> CounterRecount:
    """One attempt at recounting one counter (see the module doc)."""
    name = ns.name
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    boundary = rollup_boundary(now_us, watermark_us, ns)
    state = await rollups.get(name, counter)
    start, base = 0, 0
    if since_us is not None:
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
    if dry_run:
        return result

    current_ts = state.rollup_ts if state is not None else 0
    if boundary <= current_ts:
        # Forward-only: nothing can be written before the watermark passes the stored rollup.
        result.action = "unchanged" if result.status == "ok" else "behind"
        if state is not None:
            result.count, result.rollup_ts = state.count, state.rollup_ts
            if cache is not None and result.status == "ok":
                await cache.set(name, counter, state.count, state.rollup_ts, ns.ttl_s)
        return result

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
    return result


async def _refresh_cache(cache: RollupCache, rollups: RollupStore, ns: Namespace, counter: str, count: int,
                         rollup_ts: int) -> None:
    """Set the cache, then make sure a rollup worker that moved the counter meanwhile is not overwritten
    with our older value (a few rounds: each one only follows a newer stored rollup)."""
    for _ in range(3):
        await cache.set(ns.name, counter, count, rollup_ts, ns.ttl_s)
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
    pending: dict[Key, CounterRecount] = field(default_factory=dict)  # behind/raced, to retry

    async def once(self, namespace: str, counter: str) -> CounterRecount:
        ns = self.registry[namespace]
        result = await recount_counter(ns, counter, events=self.events, rollups=self.rollups, cache=self.cache,
                                       watermark_us=await self.watermark(), since_us=self.since_us,
                                       dry_run=self.dry_run)
        if result.action in RETRY:
            self.pending[(namespace, counter)] = result
        else:
            self.pending.pop((namespace, counter), None)
        return result

    async def retry(self, wait_s: float, stop: Callable[[], bool] = lambda: False) -> list[CounterRecount]:
        """Retry behind/raced counters as the watermark moves, for up to `wait_s`; returns their final results."""
        deadline = time.monotonic() + wait_s
        finals: dict[Key, CounterRecount] = {}
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
    """A `Recounter` over the runtime's stores and cache, bounded by its persist watermark."""
    return Recounter(runtime.registry, runtime.events, runtime.rollups, runtime.cache, runtime.watermark,
                     since_us=since_us, dry_run=dry_run)


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
    tallies: dict[str, int]  # counters, per status, per "action:<action>", abs_drift (over resumed runs too)
    interrupted: bool
    after: str | None  # the last counter done
    cache_note: str

    def count(self, key: str) -> int:
        return self.tallies.get(key, 0)

    @property
    def drifted(self) -> int:
        return self.count("drift") + self.count("missing")

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
        self.report(r)

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
        progress.log(f"{what} {total:,} counter(s) of {ns.name} up to {fmt_time(boundary)} "
                     f"(persist watermark {fmt_time(mark)})")
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
                progress.advance(1, note=f"drift {self.tallies.get('drift', 0) + self.tallies.get('missing', 0):,}")
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
