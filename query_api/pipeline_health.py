"""Pipeline health for operators (GET /v1/pipeline, the UI's health page), from shared state and the broker.

Why not scrape the workers' /metrics: the API does not know where the workers are (there may be several, on
other hosts), and a worker's gauges die with it. Everything here is read where every process can see it:

* persist watermark lag per partition: the watermarks the workers store (`RollupStore.watermarks`), next to the
  mutations topic's end offsets and the persist group's (`<worker id>.persist`) committed offsets; none (0)
  once a watermark covers the latest write the workers persisted (`sinks.written_key`): idle workers then send
  no heartbeats and the watermark rightly stands still;
* rollups per namespace: the counters whose last write is ahead of their rollup, counted up to `PENDING_LIMIT` per
  namespace, and where the oldest of them is (`RollupStore.pending_rollups`, a query of its own: it reads pending
  counters only, never a whole namespace, and leaves the sweep's rotation alone). Not `min_rollup_ts`, the
  retention bound: it stays 0 while a counter was never rolled up, which is no lag figure;
* rollup queue depth: the rollups topic's end offsets less the Faust group's (`<worker id>`) commits;
* the DLQ's size and newest dead letters with their reasons: the DLQ topic, read from its end;
* warnings: on the local broker (its cluster id), a mutations partition grown long enough to slow every fetch
  (`infra.broker.long_partitions`);
* rates: differences between snapshots of cumulative figures (topic end offsets, group commits, and this API
  process's request tallies, the numbers its /metrics exports).

A snapshot is shared by every caller for `ttl_s`, and one is computed at a time: a wall of dashboards costs
the store and the broker one read every couple of seconds. A broker that does not answer leaves its figures
empty and says why (`errors["broker"]`), the store's are still shown; a topic it does not hold (a DLQ never
created, or deleted) empties that topic's figures only (`errors["dlq"]`, keyed as in `topics`, naming it).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from control_plane import CounterType, NamespaceRegistry
from control_plane.admission import covering_watermark
from infra.broker import TANSU_CLUSTER_ID, long_partitions
from query_api import metrics
from query_api.broker_offsets import BrokerOffsets, MissingTopic, TopicOffsets
from schemas import MICROS
from schemas.dead_letter import DeadRecord
from sinks import RollupStore, written_key
from sinks.model import PendingRollups
from streams.settings import Settings

TTL_S = 2.0
DEAD_LETTERS = 20  # newest dead letters shown
PREVIEW_WIDTH = 160  # characters of a dead letter's record shown
PENDING_LIMIT = 10_000  # pending counters counted per namespace at most (the count says when it is a floor)
RATE_WINDOW_S = 60.0  # rates are averaged over up to this much history
RATE_MIN_GAP_S = 1.0  # ... and over at least this much
STALLED_AFTER_S = 30.0  # no record persisted for this long while records wait: a warning
WATERMARK_STALLED_S = 60.0  # a caught-up partition's watermark this far behind: a warning


@dataclass(frozen=True, slots=True)
class BrokerFigures:
    """What the broker answered; a topic it does not hold has None, and why in `errors` (keyed as `topics`)."""

    mutations: TopicOffsets | None
    rollups: TopicOffsets | None
    dlq: TopicOffsets | None
    dlq_ends: dict[int, int]  # end offsets corrected by what reading the tail found
    dead_letters: list[DeadRecord]
    errors: dict[str, str] = field(default_factory=dict)
    cluster_id: str | None = None


@dataclass(frozen=True, slots=True)
class StoreFigures:
    watermarks: dict[int, int]  # partition -> µs
    covering: int | None  # the watermark covering the latest write persisted (None: no write yet)
    pending: dict[str, PendingRollups]  # namespace -> its counters whose rollup is behind their last write


@dataclass(frozen=True, slots=True)
class Snapshot:
    at_us: int
    store: StoreFigures | None
    broker: BrokerFigures | None
    rates: dict[str, float | None]
    request_rates: dict[str, float]
    rate_window_s: float | None
    errors: dict[str, str]
    stalled_s: dict[int, float] | None = None  # partition -> seconds persisting nothing while records wait (Stalled)
    unmarked_s: dict[int, float] = field(default_factory=dict)  # partition -> seconds without a watermark (Unmarked)
    clear_at_us: dict[int, int] = field(default_factory=dict)  # partition -> when last seen with nothing waiting


@dataclass
class Rates:
    """Per-second rates of cumulative totals, from samples taken whenever a snapshot is computed."""

    window_s: float = RATE_WINDOW_S
    min_gap_s: float = RATE_MIN_GAP_S
    samples: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)

    def observe(self, now: float, totals: dict[str, float]) -> tuple[dict[str, float | None], float | None]:
        """Rates of `totals` against the oldest sample within the window at least `min_gap_s` old (None: not
        measured yet, or the total went backwards, e.g. a recreated topic), and the seconds they span."""
        while self.samples and now - self.samples[0][0] > self.window_s:
            self.samples.popleft()
        old_enough = [s for s in self.samples if now - s[0] >= self.min_gap_s]
        if not self.samples or now - self.samples[-1][0] >= self.min_gap_s:
            self.samples.append((now, dict(totals)))
        rates: dict[str, float | None] = dict.fromkeys(totals)
        spans = []
        for name, value in totals.items():
            # each total against its own oldest sample: one taken while the broker was away holds none of its
            # topics' totals, and those rates stayed blank for the whole window after it (a review)
            base = next((s for s in old_enough if name in s[1]), None)
            if base is not None and value >= base[1][name]:
                rates[name] = (value - base[1][name]) / (now - base[0])
                spans.append(now - base[0])
        return rates, max(spans, default=None)


@dataclass
class Stalled:
    """How long each mutations partition has persisted nothing (its committed offset standing still) while records
    wait on it, from the first snapshot of this process that saw it so. Per partition, because the persisted total
    kept moving while one worker of several hung (a review), and from that first snapshot, not over the rate window's
    samples, which capped a stall's length at the window (another read "in the last 58 s" through an 85 s stall)."""

    since: dict[int, tuple[int | None, float]] = field(default_factory=dict)  # partition -> (committed, since)

    def observe(self, now: float, mutations: TopicOffsets | None) -> dict[int, float] | None:
        """Seconds per partition with records waiting (None: the broker did not answer)."""
        if mutations is None:
            return None
        seen: dict[int, tuple[int | None, float]] = {}
        for p in mutations.high:
            if not mutations.lag(p):
                continue
            committed = mutations.committed.get(p)
            before = self.since.get(p)
            seen[p] = (committed, before[1] if before is not None and before[0] == committed else now)
        self.since = seen
        return {p: now - since for p, (_, since) in seen.items()}


@dataclass
class Cleared:
    """When this process last saw each mutations partition with no record waiting (wall µs). A watermark stands
    still while nothing is written (heartbeats stop once it covers every write), so `now - watermark` counted an
    idle spell as lag as soon as a write came (a review: 16 s for a write persisted within a second, hours after an
    idle night). A record waiting now came after the last time none did, so it has waited at most that long."""

    at_us: dict[int, int] = field(default_factory=dict)

    def observe(self, now_us: int, mutations: TopicOffsets | None) -> dict[int, int]:
        if mutations is not None:
            for p in mutations.high:
                if mutations.lag(p) in (0, None):
                    self.at_us[p] = now_us
        return dict(self.at_us)


@dataclass
class Unmarked:
    """The mutations partitions without a persist watermark while a write waits for one, and since when this process
    has seen them so. A rollup waits for every partition's watermark, and each worker heartbeats its partitions once
    any write needs them, so one left without is a partition no worker owns: no worker runs, partitions were added
    that the group has not handed out, or its worker's publications are refused. Its lag has no figure (no
    watermark), so without this it stalled every rollup unwarned. An idle stack, with no write yet, has none."""

    since: dict[int, float] = field(default_factory=dict)

    def observe(self, now: float, store: StoreFigures | None,
                mutations: TopicOffsets | None) -> dict[int, float]:
        """Seconds each partition has been seen without a watermark (as before when the store or broker did not
        answer)."""
        if store is not None and mutations is not None:
            missing = set(mutations.high) - set(store.watermarks) if store.covering is not None else set()
            self.since = {p: self.since.get(p, now) for p in missing}
        return {p: now - t for p, t in self.since.items()}


class Checkable(Protocol):
    async def healthy(self) -> bool: ...


CACHE_CHECK_S = 1.0
CACHE_DOWN = {  # what an unanswering cache means, by the name /readyz checks it under
    "cache": "memcached does not answer: EVENTUAL and ACCURATE reads go to the store, slower",
    "best_effort_counters": "memcached does not answer: BEST_EFFORT counters can be neither added to nor read",
}


class PipelineHealth:
    """Computes, caches and rates the figures; `snapshot()` is what the route serves."""

    def __init__(self, settings: Settings, registry: NamespaceRegistry, rollups: RollupStore, *,
                 caches: Mapping[str, Checkable] | None = None, ttl_s: float = TTL_S,
                 dead_letters: int = DEAD_LETTERS, pending_limit: int = PENDING_LIMIT) -> None:
        """`caches`: the memcached clients, by the name /readyz checks them under (a review: with memcached down,
        /readyz said so and this page nothing)."""
        self.settings = settings
        self.caches = dict(caches or {})
        self.registry = registry
        self.rollups = rollups
        self.ttl_s = ttl_s
        self.dead_letters = dead_letters
        self.pending_limit = pending_limit
        self.broker = BrokerOffsets(settings.kafka_bootstrap or "", config=settings.kafka_security.librdkafka())
        self._broker_lock = asyncio.Lock()  # one thread at a time uses the broker clients
        self._lock = asyncio.Lock()
        self._cached: tuple[float, Snapshot] | None = None
        self._rates = Rates()
        self._request_rates = Rates()
        self._unmarked = Unmarked()
        self._stalled = Stalled()
        self._cleared = Cleared()

    @property
    def persist_group(self) -> str:
        return f"{self.settings.worker_id}.persist"

    @property
    def rollup_group(self) -> str:
        return self.settings.worker_id  # the Faust app id is its consumer group

    async def snapshot(self) -> Snapshot:
        cached = self._cached
        if cached is not None and time.monotonic() - cached[0] < self.ttl_s:
            return cached[1]
        async with self._lock:
            cached = self._cached
            if cached is not None and time.monotonic() - cached[0] < self.ttl_s:
                return cached[1]
            snapshot = await self._compute()
            self._cached = (time.monotonic(), snapshot)
            return snapshot

    async def _compute(self) -> Snapshot:
        errors: dict[str, str] = {}
        store_task = asyncio.ensure_future(self._store_figures())
        caches_task = asyncio.ensure_future(self._cache_errors())
        broker: BrokerFigures | None = None
        try:
            async with self._broker_lock:
                broker = await asyncio.to_thread(self._broker_figures)
            errors.update(broker.errors)
        except Exception as exc:  # an unreachable broker is a figure of its own, not a failed page
            errors["broker"] = f"{type(exc).__name__}: {exc}"
        store: StoreFigures | None = None
        try:
            store = await store_task
        except Exception as exc:
            errors["store"] = f"{type(exc).__name__}: {exc}"
        errors.update(await caches_task)
        now = time.monotonic()
        totals = _totals(broker)
        rates, span = self._rates.observe(now, totals)
        stalled = self._stalled.observe(now, broker.mutations if broker else None)
        served = {endpoint: float(n) for endpoint, n in metrics.requests_by_endpoint().items()}
        requests, request_span = self._request_rates.observe(now, served)
        unmarked = self._unmarked.observe(now, store, broker.mutations if broker else None)
        at_us = time.time_ns() // 1000
        return Snapshot(at_us, store, broker, rates,
                        {k: v for k, v in requests.items() if v is not None}, span or request_span, errors, stalled,
                        unmarked, self._cleared.observe(at_us, broker.mutations if broker else None))

    async def _store_figures(self) -> StoreFigures:
        watermarks = await self.rollups.watermarks(self.settings.mutations_topic)
        covering = covering_watermark(await self.rollups.watermarks(written_key(self.settings.mutations_topic)),
                                      self.registry.values())
        names = [ns.name for ns in self.registry.values() if ns.counter_type is not CounterType.BEST_EFFORT]
        return StoreFigures(watermarks, covering, await self.rollups.pending_rollups(names, self.pending_limit))

    async def _cache_errors(self) -> dict[str, str]:
        async def down(cache: Checkable) -> bool:
            try:
                return not await asyncio.wait_for(cache.healthy(), CACHE_CHECK_S)
            except Exception:
                return True
        names = list(self.caches)
        verdicts = await asyncio.gather(*(down(self.caches[name]) for name in names))
        return {name: CACHE_DOWN.get(name, "does not answer") for name, is_down in zip(names, verdicts, strict=True)
                if is_down}

    def _broker_figures(self) -> BrokerFigures:
        """Each topic on its own: one the broker does not hold loses its own figures, not the others'."""
        s, errors = self.settings, dict[str, str]()

        def offsets(role: str, topic: str, group: str | None = None) -> TopicOffsets | None:
            try:
                return self.broker.offsets(topic, group)
            except MissingTopic as exc:
                errors[role] = str(exc)
                return None
        mutations = offsets("mutations", s.mutations_topic, self.persist_group)
        rollups = offsets("rollups", s.rollups_topic, self.rollup_group)
        dlq = offsets("dlq", s.dlq_topic)
        dead, ends = self.broker.tail(dlq, self.dead_letters) if dlq is not None else ([], {})
        return BrokerFigures(mutations, rollups, dlq, ends, dead, errors, self.broker.cluster_id)

    async def close(self) -> None:
        async with self._broker_lock:
            await asyncio.to_thread(self.broker.close)


# -- rendering --------------------------------------------------------------------------------------------------


def render(snapshot: Snapshot, registry: NamespaceRegistry, settings: Settings, can_read: Any) -> dict[str, Any]:
    """The JSON body of GET /v1/pipeline. `can_read(namespace) -> bool` says whether the caller may see a dead
    letter's reason, key and record (a namespace with API keys keeps them from callers without its read scope)."""
    now = snapshot.at_us
    store, broker = snapshot.store, snapshot.broker
    mutations = broker.mutations if broker else None
    watermarks = _watermarks(now, store, mutations, snapshot.clear_at_us)
    lags = [w["lag_s"] for w in watermarks if w["lag_s"] is not None]
    rollups = _rollups(now, store, registry, can_read)
    rollup_lags = [r["lag_s"] for r in rollups if r["lag_s"] is not None]
    heartbeats = len(watermarks) * 1000 / settings.watermark_interval_ms
    return {
        "generated_at": _time(now),
        "topics": {"mutations": settings.mutations_topic, "rollups": settings.rollups_topic, "dlq": settings.dlq_topic},
        "errors": snapshot.errors,
        "warnings": (_warnings(snapshot) + _watermark_warnings(watermarks, settings.mutations_topic)
                     + _unmarked_warnings(snapshot.unmarked_s, settings.mutations_topic)),
        "watermarks": watermarks,
        "watermark_lag_s": max(lags) if lags else None,
        "persist_lag_records": mutations.total_lag if mutations else None,
        "rollups": rollups,
        "pending_truncated": any(r["pending_truncated"] for r in rollups),
        "rollup_lag_s": max(rollup_lags) if rollup_lags else None,
        "rollup_queue": _queue(broker.rollups) if broker and broker.rollups else None,
        "dlq": _dlq(broker, broker.dlq, settings, can_read, registry) if broker and broker.dlq else None,
        "rates": {"window_s": snapshot.rate_window_s,
                  "mutation_records_per_s": snapshot.rates.get("mutation_records"),
                  "persisted_records_per_s": snapshot.rates.get("persisted_records"),
                  "rollup_signals_per_s": snapshot.rates.get("rollup_signals"),
                  "dead_letters_per_s": snapshot.rates.get("dead_letters"),
                  "heartbeat_records_per_s": heartbeats,
                  "api_requests_per_s": dict(sorted(snapshot.request_rates.items()))},
    }


def _warnings(snapshot: Snapshot) -> list[str]:
    """What the operator should act on: persisting that stands still while records wait (a worker down or hung, its
    store failing: `errors` holds only what this process met, and a failing store still answered its reads), and
    on the local broker, partitions grown long enough to slow every fetch (infra.broker.long_partitions)."""
    broker = snapshot.broker
    mutations = broker.mutations if broker is not None else None
    if mutations is None:
        return []
    out = []
    stalled = sorted(p for p, s in (snapshot.stalled_s or {}).items() if s >= STALLED_AFTER_S)
    if stalled:
        longest = max((snapshot.stalled_s or {})[p] for p in stalled)
        waiting = sum(mutations.lag(p) or 0 for p in stalled)
        out.append(f"the workers persisted no record of {mutations.topic} partition(s) {', '.join(map(str, stalled))} "
                   f"in the last {longest:.0f} s while {waiting:,} wait there: a worker is down or hung, or its store "
                   "is failing (locked by another process, a full disk); the workers' logs say which")
    if broker is not None and broker.cluster_id == TANSU_CLUSTER_ID and (
            warning := long_partitions(mutations.topic, mutations.high)):
        out.append(warning)
    return out


def _watermark_warnings(rows: list[dict[str, Any]], topic: str) -> list[str]:
    """Watermarks that stand behind although every record of their partition was persisted: rollups wait for them,
    and no other figure moved (a review: a worker joined with another store persisted and committed its partitions
    into a store no API reads, its watermarks never reached this one, and rollups stalled for minutes unwarned)."""
    stuck = [w for w in rows if w["lag_s"] is not None and w["lag_s"] >= WATERMARK_STALLED_S
             and w["persist_lag_records"] == 0]  # known persisted: the broker answered
    if not stuck:
        return []
    return [f"the persist watermark of {topic} partition(s) {', '.join(str(w['partition']) for w in stuck)} stands "
            f"{max(w['lag_s'] for w in stuck):.0f} s behind though their records were persisted: rollups wait for "
            "it. A worker that persists into another store than this API reads, or a hung one, or one whose "
            "watermark publications are refused (its log says so)"]


def _unmarked_warnings(unmarked_s: dict[int, float], topic: str) -> list[str]:
    """Partitions without a watermark for WATERMARK_STALLED_S while writes wait for it (`Unmarked`)."""
    long = sorted(p for p, s in unmarked_s.items() if s >= WATERMARK_STALLED_S)
    if not long:
        return []
    return [f"{topic} partition(s) {', '.join(map(str, long))} have had no persist watermark for "
            f"{max(unmarked_s[p] for p in long):.0f} s while writes wait for one: every rollup waits for all "
            "partitions. No worker owns them (none runs, or partitions were added that the consumer group has not "
            "handed out yet), or their worker's watermark publications are refused (its log says so)"]


def _watermarks(now: int, store: StoreFigures | None, mutations: TopicOffsets | None,
                clear_at_us: Mapping[int, int]) -> list[dict[str, Any]]:
    marks = store.watermarks if store else {}
    rows = []
    for p in sorted(set(marks) | set(mutations.high if mutations else ())):
        mark = marks.get(p)
        short = mark is not None and store is not None and store.covering is not None and mark < store.covering
        if mark is None:
            lag = None
        elif mutations is None:  # the broker did not answer: whether records wait is not known (it read 0)
            lag = _lag(now, mark) if short else None
        elif mutations.lag(p) not in (0, None):  # records wait: since the watermark, or since none did (`Cleared`)
            lag = _lag(now, max(mark, clear_at_us.get(p, 0)))
        else:
            # covered: past the latest write persisted, and nothing left unpersisted on the broker (a dead worker
            # persists nothing more, so the latest write persisted stands still while records wait)
            lag = _lag(now, mark) if short else 0.0
        rows.append({
            "partition": p, "watermark": _time(mark), "lag_s": lag,
            "end_offset": mutations.high.get(p) if mutations else None,
            "persisted_offset": mutations.committed.get(p) if mutations else None,
            "persist_lag_records": mutations.lag(p) if mutations else None})
    return rows


def _rollups(now: int, store: StoreFigures | None, registry: NamespaceRegistry,
             can_read: Any) -> list[dict[str, Any]]:
    """Per rolled-up namespace the caller may read (a keyed one's figures are its readers': a review saw them from a
    caller without its key): its pending counters and the age of the oldest un-rolled-up work (0: none)."""
    if store is None:
        return []
    rows = []
    for ns in registry.values():
        if ns.counter_type is CounterType.BEST_EFFORT or not can_read(ns.name):
            continue
        pending = store.pending.get(ns.name, PendingRollups())
        since = pending.oldest_us if pending.counters else None
        rows.append({"namespace": ns.name, "pending_counters": pending.counters,
                     "pending_truncated": pending.truncated, "rolled_up_to": _time(since),
                     "lag_s": _lag(now, since) if pending.counters else 0.0})
    return rows


def _totals(broker: BrokerFigures | None) -> dict[str, float]:
    """The cumulative figures rates are made of, of the topics the broker answered for."""
    totals: dict[str, float] = {}
    if broker is None:
        return totals
    if broker.mutations is not None:
        totals["mutation_records"] = broker.mutations.end_total
        totals["persisted_records"] = broker.mutations.committed_total
    if broker.rollups is not None:
        totals["rollup_signals"] = broker.rollups.end_total
    if broker.dlq is not None:
        totals["dead_letters"] = sum(broker.dlq_ends.values())
    return totals


def _queue(rollups: TopicOffsets) -> dict[str, Any]:
    parts = [{"partition": p, "end_offset": rollups.high[p], "committed_offset": rollups.committed.get(p),
              "depth": rollups.lag(p)} for p in sorted(rollups.high)]
    return {"depth": rollups.total_lag, "partitions": parts}


_HIDDEN = "(hidden: the namespace's read key is needed)"


def _dlq(broker: BrokerFigures, dlq: TopicOffsets, settings: Settings, can_read: Any,
         registry: NamespaceRegistry) -> dict[str, Any]:
    """The DLQ's figures and newest dead letters. A dead letter's reason, key and record show only to a caller who
    may read every namespace its record holds; one whose namespaces cannot be told (undecodable: its text and its
    client-chosen key may name any) only to a caller who may read every namespace. A review read a protected
    namespace's counter names and deltas there without a key: undecodable records showed to anyone, a record's
    key chose the namespace judged, and reasons quote names and dimension values."""
    size = sum(broker.dlq_ends[p] - dlq.low[p] for p in broker.dlq_ends)
    reads_all: bool | None = None
    letters = []
    for r in broker.dead_letters:
        namespaces = r.namespaces()
        if namespaces:
            visible = all(can_read(name) for name in namespaces)
        else:
            if reads_all is None:
                reads_all = all(can_read(name) for name in registry.names())
            visible = reads_all
        letters.append({
            "partition": r.partition, "offset": r.offset, "time": _time(r.timestamp_us),
            "reason": r.reason if visible else _HIDDEN, "namespace": namespaces[0] if namespaces else None,
            "source": r.source, "key": _key(r.key, can_read, registry) if visible else None,
            "record": r.preview(PREVIEW_WIDTH) if visible else _HIDDEN})
    return {"topic": settings.dlq_topic, "size": size, "dead_letters": letters}


def _key(key: bytes | None, can_read: Any, registry: NamespaceRegistry) -> str | None:
    """A dead letter's record key, unless it names a namespace the caller may not read. The key is the whole
    record's, chosen by its producer (`namespace:counter` by convention), while a dead letter may hold one item of
    it: a review read a protected counter's name in the key of another namespace's item."""
    text = (key or b"").decode(errors="replace")
    named = text.split(":", 1)[0]
    return text if registry.get(named) is None or can_read(named) else None


def _time(us: int | None) -> str | None:
    if not us:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us / MICROS)) + f".{us % MICROS // 1000:03d}Z"


def _lag(now_us: int, us: int | None) -> float | None:
    return None if not us else round(max(0, now_us - us) / MICROS, 3)
