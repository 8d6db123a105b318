"""Recount: recompute counters from the event store, compare with their stored rollups, and fix them.

`python -m agents.recount` is what `counter recount` execs (arguments: counter_cli.recount_cmd); `counter
replay` uses the same `Recounter` for counters whose restored events lie inside already rolled-up windows.

Per counter, with B = rollup_boundary(now, persist watermark) (DESIGN invariant 3, never past the watermark):
* value_at(t) = the count of every event with event_time <= t, from zero (or from the --since base);
* drift = stored.count - value_at(stored.rollup_ts): measured at the stored rollup's own boundary, so events
  still in flight or not rolled up yet never count as drift; a missing rollup row is drift of the whole value;
* unless dry-run: write (value_at(B), B), forward-only (invariant 4), then verify: a rollup worker racing
  us may have moved the counter further from the drifted value; then it is recounted again at a later B.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agents.rollup import global_watermark
from control_plane import ConfigError, CounterType, Namespace, NamespaceRegistry, load_namespaces
from control_plane import default_config_path as default_namespaces
from control_plane.admission import rollup_boundary
from schemas import MAX_EVENT_TIME, parse_generation_time
from sinks import (
    EventStore,
    RollupCache,
    RollupStore,
    apply_aggregate,
    open_cache,
    open_namespace_stores,
)
from streams.settings import Settings, SettingsError, load_settings
from streams.topics import TopicError, partition_count

log = logging.getLogger("counter.recount")

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
            return CounterRecount(name, counter, state and state.count, state and state.rollup_ts, None, boundary,
                                  0, "no-base", "skipped")
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


# -- process wiring (shared with agents.replay) -------------------------------------------------------


@dataclass
class Runtime:
    settings: Settings
    registry: NamespaceRegistry
    events: EventStore
    rollups: RollupStore
    cache: RollupCache | None
    cache_note: str
    mutation_partitions: int

    async def watermark(self) -> int:
        marks = await self.rollups.watermarks(self.settings.mutations_topic)
        return global_watermark(marks, self.mutation_partitions)

    def recounter(self, *, since_us: int | None = None, dry_run: bool = False) -> Recounter:
        return Recounter(self.registry, self.events, self.rollups, self.cache, self.watermark,
                         since_us=since_us, dry_run=dry_run)

    async def close(self) -> None:
        await self.events.close()
        await self.rollups.close()
        if self.cache is not None:
            await self.cache.close()


def shared_cache(settings: Settings) -> tuple[RollupCache | None, str]:
    """The cache the readers share, or None with a note when there is none reachable from here."""
    spec = settings.cache
    if spec == "auto":
        with contextlib.suppress(OSError, ValueError):
            memcached = json.loads(settings.endpoints_path.read_text()).get("memcached")
            if memcached:
                spec = f"memcached://{memcached}"
    if spec.startswith("memcached://"):
        return open_cache(spec), f"cache {spec} refreshed"
    return None, ("no shared cache (COUNTER_CACHE=memory or no memcached of `counter up` found): in-process "
                  "caches of running API servers keep their values until the namespace TTL")


def open_runtime(settings: Settings) -> Runtime:
    """Namespaces, stores, the shared cache and the mutations partition count (for the watermark)."""
    if not settings.kafka_bootstrap:
        raise SettingsError("COUNTER_KAFKA_BOOTSTRAP: needed for the persist watermark (counter up sets it)")
    registry = load_namespaces(settings.namespaces or default_namespaces())
    partitions = partition_count(settings.kafka_bootstrap, settings.mutations_topic)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    events, rollups, _buckets = open_namespace_stores(settings.store, settings.data_dir, registry)
    cache, note = shared_cache(settings)
    return Runtime(settings, registry, events, rollups, cache, note, partitions)


def write_json_atomic(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def fmt_time(us: int | None) -> str:
    if us is None or us <= 0:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us // 1_000_000)) + f".{us % 1_000_000:06d}Z"


# -- `counter recount` ------------------------------------------------------------------------------


def _state_path(settings: Settings, args: argparse.Namespace) -> Path:
    what = json.dumps([args.namespace, sorted(set(args.counters)), args.all, args.since, args.dry_run])
    digest = hashlib.sha1(what.encode()).hexdigest()[:12]
    return settings.data_dir / "recount" / f"{args.namespace}-{digest}.json"


async def _count_counters(events: EventStore, namespace: str, after: str | None) -> int:
    total = 0
    while True:
        page = await events.counters(namespace, after=after, limit=1000)
        total += len(page)
        if len(page) < 1000:
            return total
        after = page[-1]


async def _names(events: EventStore, namespace: str, after: str | None):
    while True:
        page = await events.counters(namespace, after=after, limit=1000)
        for name in page:
            yield name
        if len(page) < 1000:
            return
        after = page[-1]


async def _explicit(names: list[str], after: str | None):
    for name in names:
        if after is None or name > after:
            yield name


class _Report:
    """Per-counter output (table rows on stderr or JSONL on stdout) and the tallies for the summary."""

    def __init__(self, fmt: str, verbose: bool, console, tallies: dict[str, int]) -> None:
        self.fmt = fmt
        self.verbose = verbose
        self.console = console
        self.tallies = tallies

    def add(self, r: CounterRecount, *, final: bool = True) -> None:
        if not final:
            return
        t = self.tallies
        t["counters"] = t.get("counters", 0) + 1
        t[r.status] = t.get(r.status, 0) + 1
        t[f"action:{r.action}"] = t.get(f"action:{r.action}", 0) + 1
        t["abs_drift"] = t.get("abs_drift", 0) + abs(r.drift)
        if self.fmt == "jsonl":
            sys.stdout.write(json.dumps(r.as_json()) + "\n")
            sys.stdout.flush()
        elif self.verbose or r.status != "ok" or r.action in RETRY:
            stored = "-" if r.stored is None else f"{r.stored:,}"
            recomputed = "-" if r.recomputed is None else f"{r.recomputed:,}"
            self.console.print(f"  {r.counter:30} stored {stored:>12}  recomputed {recomputed:>12}  "
                               f"drift {r.drift:>+10,}  {r.status:8} {r.action}", highlight=False)


async def _recount_main(args: argparse.Namespace, settings: Settings) -> int:
    from counter_cli.common import console
    from counter_cli.progress import Interrupt, ProgressBar

    runtime = open_runtime(settings)
    try:
        ns = runtime.registry.get(args.namespace)
        if ns is None:
            console.print(f"[bold red]error:[/] unknown namespace {args.namespace!r} "
                          f"(known: {', '.join(runtime.registry.names())})", highlight=False)
            return 2
        if ns.counter_type is CounterType.BEST_EFFORT:
            console.print(f"[bold red]error:[/] namespace {args.namespace!r} is BEST_EFFORT: its counts live "
                          "in the cache only, there are no events to recount", highlight=False)
            return 2
        since_us = parse_generation_time(args.since, field="--since") if args.since else None
        state_path = _state_path(settings, args)
        state = {} if args.restart else read_json(state_path)
        after = state.get("after")
        tallies: dict[str, int] = dict(state.get("tallies", {}))
        retry_keys = [tuple(k) for k in state.get("retry", [])]
        if after is not None:
            console.print(f"resuming an interrupted recount after counter {after!r} "
                          f"(--restart to start over)", highlight=False)
        recounter = runtime.recounter(since_us=since_us, dry_run=args.dry_run)
        names = sorted(set(args.counters))
        if args.all:
            total = await _count_counters(runtime.events, ns.name, None)
            done = total - await _count_counters(runtime.events, ns.name, after) if after else 0
            source = _names(runtime.events, ns.name, after)
        else:
            total = len(names)
            done = sum(1 for n in names if after is not None and n <= after)
            source = _explicit(names, after)
        report = _Report(args.format, args.verbose, console, tallies)
        mark = await runtime.watermark()
        boundary = rollup_boundary(time.time_ns() // 1000, mark, ns)
        what = "checking" if args.dry_run else "recounting"
        console.print(f"{what} {total:,} counter(s) of {ns.name} up to {fmt_time(boundary)} "
                      f"(persist watermark {fmt_time(mark)})", highlight=False)
        for key in retry_keys:  # behind/raced counters of the interrupted run: try them again first
            result = await recounter.once(*key)
            report.add(result, final=result.action not in RETRY)
        interrupted = False
        with Interrupt() as stop, ProgressBar(what, total=total, unit="counters", completed=done) as bar:
            last_save = time.monotonic()
            async for name in source:
                result = await recounter.once(ns.name, name)
                report.add(result, final=result.action not in RETRY)
                after = name
                bar.advance(1, note=f"drift {tallies.get('drift', 0) + tallies.get('missing', 0):,}")
                if stop() or time.monotonic() - last_save > 1.0:
                    write_json_atomic(state_path, {"after": after, "tallies": tallies,
                                                   "retry": [list(k) for k in recounter.pending]})
                    last_save = time.monotonic()
                if stop():
                    interrupted = True
                    break
            if not interrupted and recounter.pending:
                bar.update(note=f"waiting for the watermark ({len(recounter.pending)} counter(s))")
                for r in await recounter.retry(args.wait, stop):
                    report.add(r, final=not (stop() and r.action in RETRY))  # else: retried on resume
                interrupted = stop()
        if interrupted:
            write_json_atomic(state_path, {"after": after, "tallies": tallies,
                                           "retry": [list(k) for k in recounter.pending]})
            console.print(f"interrupted after counter {after!r} ({bar.summary()}); run the same command "
                          "again to resume", highlight=False)
            return 130
        state_path.unlink(missing_ok=True)
        _summary(console, tallies, args.dry_run, runtime.cache_note, bar.summary())
        return 1 if any(tallies.get(f"action:{a}", 0) for a in RETRY) else 0
    finally:
        await runtime.close()


def _summary(console, t: dict[str, int], dry_run: bool, cache_note: str, speed: str) -> None:
    drifted = t.get("drift", 0) + t.get("missing", 0)
    console.print(f"recounted {speed}: {t.get('ok', 0):,} ok, "
                  f"{t.get('drift', 0):,} drifted, {t.get('missing', 0):,} missing a rollup row, "
                  f"{t.get('no-base', 0):,} without a stored rollup at --since; total |drift| "
                  f"{t.get('abs_drift', 0):,}", highlight=False)
    if dry_run:
        console.print("dry run: nothing written" + (f"; run without --dry-run to fix {drifted:,} counter(s)"
                                                    if drifted else ""), highlight=False)
        return
    console.print(f"written {t.get('action:written', 0):,}, unchanged {t.get('action:unchanged', 0):,}; "
                  f"{cache_note}", highlight=False)
    behind = t.get("action:behind", 0) + t.get("action:raced", 0)
    if behind:
        console.print(f"[yellow]{behind:,} counter(s) could not be written yet[/]: the persist watermark has "
                      "not passed their stored rollup (is a worker running?) or a rollup raced; run again",
                      highlight=False)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from counter_cli.recount_cmd import build_parser, check

    args = build_parser().parse_args(argv)
    check(args)
    try:
        settings = load_settings()
        return asyncio.run(_recount_main(args, settings))
    except (SettingsError, ConfigError, TopicError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
