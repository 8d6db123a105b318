"""The worker: a Faust app hosting the persist consumer, the rollup agent, the watermark and the sweep.

Run it with `counter worker` (or `python -m agents`); run as many as there are partitions. The rollup agent shares
the rollups topic through the Faust consumer group `COUNTER_WORKER_ID`; persisting is a `mode` service of the app
(`PersistService`) running an aiokafka consumer in the group `<COUNTER_WORKER_ID>.persist`
(agents.persist_consumer says why it is not a Faust agent).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import faust
import mode
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agents import metrics
from agents.arrival import ArrivalFloors
from agents.dimensions import Combinations
from agents.persist import KafkaRecord, PreparedBatch, prepare
from agents.persist_consumer import PersistConsumer, missing_codecs, run_consumer
from agents.persist_path import persist_batch
from agents.retention import drop_expired_events
from agents.rollup import BackPressure, Key, global_watermark
from agents.rollup_batches import Outage, OverBudget, RollupsAbandoned, rollup_many
from agents.timers import count_overlaps, surviving
from agents.topic_watch import TopicWatch, watch_offset_resets
from agents.watermark import (
    NO_PARTITION,
    HeartbeatPace,
    PartitionCount,
    WatermarkTracker,
    heartbeat_skew_s,
    heartbeats_needed,
    request_heartbeats,
)
from control_plane import CounterType, Namespace, NamespaceRegistry, load_namespaces
from control_plane import default_config_path as default_namespaces
from control_plane.admission import ahead_allowed_us, covering_watermark
from infra.heap import freeze_startup_heap
from producers.asyncio_producer import AsyncProducer
from schemas import DecodeError, codec, decode_signals
from schemas.dead_letter import DeadLetter
from schemas.record_headers import HEARTBEAT_HEADERS
from sinks import (
    BucketStore,
    EventStore,
    RollupCache,
    RollupStore,
    SketchStore,
    arrival_keys,
    open_cache,
    open_namespace_sketch_store,
    open_namespace_stores,
    store_location,
    written_key,
)
from sinks.rolled import RolledFloors
from sinks.windows import Granularity, expiry_cutoff
from streams.app import AppTopics, create_app, declare_topics
from streams.namespace_shapes import guard_namespaces
from streams.settings import Settings, SettingsError, backend_problems, namespace_bound_problems
from streams.signals import SignalSender
from streams.store_binding import BindingWatch
from streams.topics import ensure_topics, topic_specs

log = logging.getLogger("counter.worker")
T = TypeVar("T")

STALE_SAMPLE = 1_000  # stale counters the sweep reads the states of, per tick, for `Pipeline.cover_stale`
SIGNAL_BYTES = 256  # a queued rollup signal: Faust event, message and the decoded key, roughly


@dataclass
class Pipeline:
    """Everything the agents share; built once per worker process."""

    settings: Settings
    registry: NamespaceRegistry
    events: EventStore
    rollups: RollupStore
    buckets: BucketStore
    cache: RollupCache
    app: faust.App
    topics: AppTopics
    tracker: WatermarkTracker
    mutation_partitions: PartitionCount  # the watermark waits for each; read again as partitions are added
    pressure: BackPressure
    kafka: AsyncProducer
    signals: SignalSender
    heartbeats: HeartbeatPace  # when an idle worker sends the next heartbeats (idle_heartbeat_s)
    arrivals: ArrivalFloors = field(default_factory=ArrivalFloors)  # per partition, the last heartbeat stored
    publishing: asyncio.Lock = field(default_factory=asyncio.Lock)  # a handover waits for the watermarks in flight
    published: dict[str, dict[int, int]] = field(default_factory=dict)  # watermark key -> what this worker stored
    handover_at: int | None = None  # µs: partitions were assigned then, and the heartbeats not asked for yet
    combinations: Combinations = field(default_factory=Combinations)  # dimension combinations known here
    persist_consumer: PersistConsumer | None = None
    sketches: SketchStore | None = None  # unique counts' sketches, when a namespace is UNIQUE
    outage: Outage = field(default_factory=Outage)  # a store outage as the rollups live through it, across batches
    rolled: RolledFloors = field(default_factory=RolledFloors)  # what admission keeps events after (a raised limit)
    binding: BindingWatch | None = None  # the store this worker's consumer group persists into (streams.store_binding)
    topic_watch: TopicWatch | None = None  # the mutations topic's id: a change means it was recreated
    set_budget_s: float | None = None  # how long one set of rollup signals runs before its rest is signalled again

    def owned_mutation_partitions(self) -> list[int]:
        return sorted(self.persist_consumer.assignment()) if self.persist_consumer else []

    def partitions_assigned(self, partitions: set[int], persisted_before: bool) -> None:
        """A handover: start from the published arrival floors, and have every worker heartbeat past now when a
        previous owner persisted records there (`persisted_before`: the group had committed offsets).

        That owner may have persisted and committed a write without publishing when it reached Kafka (a crash, or
        a revoke, before its next tick): then no worker's heartbeats would be needed for it, the watermark would
        stand below it, and it would wait for some later write to be rolled up. Asking for heartbeats past the
        handover (`agents.watermark.request_heartbeats`) covers whatever it persisted. Partitions nobody consumed
        before ask for nothing: a fresh idle stack stays quiet."""
        self.arrivals.assigned(partitions)
        if persisted_before:
            self.handover_at = time.time_ns() // 1000

    async def forget_partitions(self, partitions: set[int]) -> None:
        """A handover: the next owner starts from the arrival floors published. Waits for a publication in
        flight, which must not land after the next owner has loaded what was published (the store refuses it if
        it does: `agents.arrival`)."""
        async with self.publishing:
            self.arrivals.revoked(partitions, self._commits_sent())
            self.tracker.forget(partitions)

    async def publish_watermarks(self) -> tuple[list[int], dict[int, int], dict[int, int]]:
        """Store what changed since the last call, for the partitions owned now: their arrival floors (from where
        they hold), then the watermarks those allow, both under this worker's claims (`agents.arrival`), then when
        their latest persisted writes reached Kafka (an idle worker writes nothing). Returns the owned partitions,
        their watermarks and their writes' times."""
        async with self.publishing:
            if (handover_at := self.handover_at) is not None:
                await request_heartbeats(self.rollups, self.settings.mutations_topic, handover_at)
                if self.handover_at == handover_at:
                    self.handover_at = None
            owned = self.owned_mutation_partitions()
            marks, written = self.tracker.marks(owned), self.tracker.written(owned)
            froms, floors = self.arrivals.publishable(owned)
            topic = self.settings.mutations_topic
            from_key, floor_key = arrival_keys(topic)
            for key, values in ((from_key, froms), (floor_key, floors), (topic, marks)):
                await self._publish(key, values, self.arrivals.claims)
            await self._publish(written_key(topic), written, None)  # unfenced: it only asks for more heartbeats
            return owned, marks, written

    async def _publish(self, key: str, values: dict[int, int], claims: dict[int, int] | None) -> None:
        """Store what changed of `values` since this worker last stored it; under `claims`, only for the partitions
        claimed; a partition refused is claimed again with the next batch (`ArrivalFloors.refused`), and only heartbeats
        committed after that make its watermark here."""
        published = self.published.setdefault(key, {})
        changed = {q: v for q, v in values.items() if published.get(q) != v and (claims is None or q in claims)}
        if not changed:
            return
        fence = None if claims is None else {q: claims[q] for q in changed}
        refused = await self.rollups.set_watermarks(key, changed, claims=fence)
        if refused:  # claimed again with the next batch: the heartbeats seen so far must not make its watermark
            self.arrivals.refused(refused, self._commits_sent())
            self.tracker.forget(refused)
        published.update({q: v for q, v in changed.items() if q not in refused})

    def _commits_sent(self) -> int:
        return self.persist_consumer.commits_sent if self.persist_consumer is not None else 0

    def offsets_committed(self, offsets: dict[int, int], sent: int | None = None) -> None:
        """The heartbeats behind committed offsets count toward the watermark (`agents.arrival`). `sent`: the commit's
        number (`PersistConsumer.commits_sent` when it was sent); None: sent after everything so far."""
        for partition, timestamp_us in self.arrivals.committed(offsets, sent).items():
            self.tracker.heartbeat_persisted(partition, timestamp_us)

    async def send_signals(self, keys: set[Key] | list[Key]) -> None:
        """Ask for the counters' rollups; returns once the broker has the signals."""
        await self.signals.send(keys)

    async def send_dead_letters(self, dead: list[DeadLetter]) -> None:
        """Dead-letter records with their reasons; returns once the broker has them all."""
        futures = []
        for d in dead:
            key, value, headers = d.record()  # cut to the producer's limit: a refused one would fail every retry
            futures.append(self.kafka.produce(self.settings.dlq_topic, value, key, headers=headers))
            metrics.DLQ_RECORDS.labels(metrics.dlq_kind(d.reason)).inc()
            log.info("dead-lettered %s[%d]@%d: %s", d.topic, d.partition, d.offset, d.reason)
        await asyncio.gather(*futures)

    async def watermark(self) -> int:
        return global_watermark(await self.rollups.watermarks(self.settings.mutations_topic),
                                self.mutation_partitions.count)

    async def cover_stale(self, stale: Sequence[Key]) -> None:
        """Have heartbeats carry the watermark past the writes of counters waiting for a rollup that no published
        write asks heartbeats for. A worker that persisted them and stopped or crashed before its next tick
        published no write time for them, and a worker given the partitions after it asks for heartbeats only where
        the group had committed offsets (`partitions_assigned`): a `counter up` restarted with its own broker (whose
        groups start empty) left them pending until the next write. The newest write among them is recorded as a
        write on no partition (`request_heartbeats`), once: then the covering watermark includes it. Recorded as
        having reached Kafka at the earliest its event time allows (`ahead_allowed_us` before it, as admission
        allows): what the covering watermark adds covers the event all the same, and a write whose arrival was
        published, dated ahead by a client, does not ask again at every sweep."""
        states = await self.rollups.get_many(list(stale))
        newest = max((s.last_write_ts - ahead_allowed_us(self.registry[ns])
                      for (ns, _c), s in states.items() if ns in self.registry), default=0)
        needed = covering_watermark({NO_PARTITION: newest}, self.registry.values()) if newest > 0 else None
        covering = await self.covering()
        if needed is not None and (covering is None or covering < needed):
            log.info("counters wait for a rollup behind writes no heartbeat was asked for (up to %d): asking for them",
                     newest)
            await request_heartbeats(self.rollups, self.settings.mutations_topic, newest)

    async def covering(self) -> int | None:
        """The watermark covering the latest write persisted on any partition, by any worker (None: no write yet)."""
        return covering_watermark(await self.rollups.watermarks(written_key(self.settings.mutations_topic)),
                                  self.registry.values())


def build(settings: Settings) -> Pipeline:
    """Validate configuration, create topics and stores, and wire the agents onto a Faust app."""
    count_overlaps()
    watch_offset_resets()
    if missing := missing_codecs():
        raise RuntimeError(f"the Kafka consumer cannot read {', '.join(missing)} compressed records: install cramjam "
                           "(pip install 'aiokafka[lz4,snappy,zstd]'; the project's requirements include it)")
    registry = load_namespaces(settings.namespaces or default_namespaces())
    if problems := backend_problems(settings, registry.values()):
        raise SettingsError("; ".join(problems))
    # kafka_bootstrap is set: `python -m agents` refuses to start without it (create_app would raise too)
    security = settings.kafka_security  # of every Kafka client (streams.kafka_security)
    counts = ensure_topics(settings.kafka_bootstrap, topic_specs(settings),  # type: ignore[arg-type]
                           admin_config=security.librdkafka())
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    events, rollups, buckets = open_namespace_stores(settings.store, settings.data_dir, registry)
    sketches = (open_namespace_sketch_store(buckets, registry) if any(ns.counts_unique for ns in registry.values())
                else None)
    binding = bound_store(settings, rollups)
    guard_namespaces(settings, registry)  # NamespaceChanged: a setting changed what the stored data means
    app = create_app(settings, app_id=settings.worker_id)
    kafka = AsyncProducer(settings.kafka_bootstrap or "", client_id=f"{settings.worker_id}-producer", timeout_s=10.0,
                          config=security.librdkafka())
    topics = declare_topics(app, settings)
    rolled = [ns for ns in registry.values() if ns.counter_type is not CounterType.BEST_EFFORT]
    skew = heartbeat_skew_s(rolled)
    # One coalescing window for the worker: the shortest a namespace asks for; its size is bounded by the
    # smallest capacity_bytes (a queued signal costs about SIGNAL_BYTES in memory). The rollup topic's
    # partitions are the queues (num_queues maps to COUNTER_ROLLUPS_PARTITIONS).
    coalesce_s = min((ns.queue.coalesce_ms for ns in rolled), default=1000) / 1000.0
    for problem in namespace_bound_problems(settings, rolled):  # `counter up`/`worker` refuse them; said if here
        log.warning("%s", problem)
    pipeline = Pipeline(
        settings=settings, registry=registry, events=events, rollups=rollups, buckets=buckets,
        cache=open_cache(_cache_spec(settings), key_prefix=settings.worker_id, scope=rollups.identity),
        app=app, topics=topics,
        tracker=WatermarkTracker(skew),
        mutation_partitions=PartitionCount(settings.mutations_topic, counts[settings.mutations_topic]),
        pressure=BackPressure(), kafka=kafka,
        signals=SignalSender(kafka, settings.rollups_topic, counts[settings.rollups_topic]), sketches=sketches,
        heartbeats=HeartbeatPace(idle_heartbeat_s(rolled, settings, coalesce_s)), binding=binding,
        set_budget_s=set_budget_s(settings, coalesce_s),
        topic_watch=TopicWatch(settings.kafka_bootstrap or "", settings.mutations_topic,
                               config=security.librdkafka()))
    pipeline.topic_watch.read_now()  # type: ignore[union-attr]  # set just above
    capacity = min((ns.queue.capacity_bytes for ns in rolled), default=16 << 20)
    max_signals = max(1, min(settings.rollup_max_signals, capacity // SIGNAL_BYTES))
    # A window is counted in records; the persist path packs up to SIGNALS_PER_RECORD signals in one, reads
    # send one each. A hundredth of the signal bound keeps a window of batches within a few times the bound.
    declare_agents(pipeline, coalesce_s, max(1, max_signals // 100))
    return pipeline


def bound_store(settings: Settings, rollups: RollupStore) -> BindingWatch:
    """Bind the consumer group to this worker's store, or refuse (StoreMismatch) when it persists into another
    (streams.store_binding). Before the app exists: the store's identity is read on a loop of its own, in a thread of
    its own (a caller may be running one, and asyncio.run would unset this thread's loop, which Faust's app takes)."""
    with ThreadPoolExecutor(1, thread_name_prefix="store-identity") as thread:
        identity = thread.submit(asyncio.run, rollups.identity()).result()
    watch = BindingWatch(settings, identity, store_location(settings.store, settings.data_dir))
    watch.bind()
    return watch


class PersistService(mode.Service):
    """The persist path (bulk consumption of counter-mutations, see agents.persist_consumer), started and stopped
    with the Faust app as one of its dependencies, ahead of Faust's own consumer.

    Not an `@app.task`: those start only once Faust's consumer has joined its group, and each join waits out the
    broker's rebalance delay (COUNTER_GROUP_REBALANCE_TIMEOUT_S), so the two joins in sequence doubled a worker's
    start. As a dependency the persist consumer joins its group while Faust's consumer joins its own."""

    def __init__(self, consumer: PersistConsumer, **kwargs: Any) -> None:
        self.consumer = consumer
        super().__init__(**kwargs)

    async def on_start(self) -> None:
        self.add_future(run_consumer(self.consumer))


def _cache_spec(settings: Settings) -> str | None:
    if settings.cache.startswith("memcached://"):
        return settings.cache
    return None  # "memory"/"auto" in a worker process: the API owns the shared cache choice


def idle_heartbeat_s(rolled: list[Namespace], settings: Settings, coalesce_s: float) -> float:
    """How often an idle worker sends heartbeats (agents.watermark.HeartbeatPace): `watermark_idle_interval_ms`
    where the rollup window hides the lag it adds, else every `watermark_interval_ms`.

    A write's rollup needs the watermark past its time + accept_limit + max_clock_skew, and the first rollup runs
    a coalescing window after the write is persisted; heartbeats every I seconds keep the watermark within about
    2I of now, so I at most half of what the window leaves over costs the first rollup nothing.
    """
    tick = settings.watermark_interval_ms / 1000
    if not rolled:
        return tick
    slack = coalesce_s - max(ns.accept_limit_s for ns in rolled) - max(ns.max_clock_skew_s for ns in rolled)
    return max(tick, min(settings.watermark_idle_interval_ms / 1000, slack / 2))


SET_BUDGET_WINDOWS = 4  # a set's default budget, in rollup windows
MIN_SET_BUDGET_S = 5.0


def set_budget_s(settings: Settings, coalesce_s: float) -> float:
    """How long one set of rollup signals runs before the rest of it is signalled again (`OverBudget`):
    `rollup_set_budget_s`, else SET_BUDGET_WINDOWS rollup windows, at least MIN_SET_BUDGET_S. Why windows: Faust's
    `take_events` waits out a whole window before it hands the agent the next set, so each cut costs the burst a
    window of idle agent; at four windows a burst keeps about four fifths of its rollup rate."""
    if settings.rollup_set_budget_s is not None:
        return settings.rollup_set_budget_s
    return max(MIN_SET_BUDGET_S, SET_BUDGET_WINDOWS * coalesce_s)


def half_window_ms(coalesce_s: float) -> int:
    """Half the worker's rollup window in ms, as `streams.settings.namespace_bound_problems` computes the bound it
    refuses settings above (coalesce_ms // 2; 2002 ms as 1.0009999 s times 500 was 1000, not 1001)."""
    return max(1, round(coalesce_s * 1000) // 2)


def persist_waits(registry: NamespaceRegistry, settings: Settings, coalesce_s: float) -> dict[str, int]:
    """The longest persist fetch wait (ms) the writes of each durable namespace tolerate (agents.persist_consumer).

    An ACCURATE read adds the persisted events live, so its writes get `persist_batch_within_ms`. An EVENTUAL read
    sees a write once a rollup has counted it, and rollups wait out the worker's `coalesce_s` anyway: half of that
    window, within [persist_batch_within_ms, persist_eventual_within_ms], delays what readers see by little and
    lets the batches grow.
    """
    short = settings.persist_batch_within_ms
    eventual = max(short, min(settings.persist_eventual_within_ms, half_window_ms(coalesce_s)))
    return {ns.name: eventual if ns.counter_type is CounterType.EVENTUAL else short
            for ns in registry.values() if ns.counter_type is not CounterType.BEST_EFFORT}


def declare_agents(p: Pipeline, coalesce_s: float, max_records: int) -> None:
    """Everything the worker runs, declared on its Faust app in one place (the app is built from settings, so
    they cannot be module-level decorators as in Faust's examples):

    - `PersistService`: the persist path, bulk consumption of counter-mutations (agents.persist_consumer);
    - agent `rollup`: coalesced rollup signals -> rollups, time buckets and sketches (agents.rollup);
    - timer `heartbeat`: watermarks earned, and the next heartbeat down each owned partition, less often when
      idle (agents.watermark);
    - timer `sweep`: re-signals counters whose rollup is stale;
    - timer `retention`: drops expired event slices, buckets and sketches;
    - timer `store_binding`: stops the worker once its consumer group persists into another store;
    - pages `/ready` and `/metrics`.
    """
    # Signalling more often than the rollup queues coalesce only repeats signals: at most half a window.
    app, settings = p.app, p.settings

    p.persist_consumer = PersistConsumer(
        bootstrap=settings.kafka_bootstrap or "", topic=settings.mutations_topic,
        group_id=f"{settings.worker_id}.persist",
        persist=lambda records: _retrying("persist", lambda: _persist(p, records)),
        checkpoint=lambda keys: _retrying("signal", lambda: p.send_signals(keys)),
        checkpoint_ms=max(1, min(settings.persist_checkpoint_ms, half_window_ms(coalesce_s))),
        max_records=settings.persist_batch_max, batch_bytes=settings.persist_batch_bytes,
        wait_ms=settings.persist_batch_within_ms, prompt_wait_ms=settings.persist_prompt_within_ms,
        prompt_for_s=settings.persist_prompt_for_s, namespace_waits=persist_waits(p.registry, settings, coalesce_s),
        min_bytes=settings.persist_fetch_min_bytes, drain_s=settings.persist_drain_s,
        session_timeout_ms=int(settings.group_session_timeout_s * 1000),
        rebalance_timeout_ms=int(settings.group_rebalance_timeout_s * 1000), on_assigned=p.partitions_assigned,
        on_revoked=p.forget_partitions, on_committed=p.offsets_committed, security=settings.kafka_security.aiokafka())

    app.add_dependency(PersistService(p.persist_consumer, loop=app.loop))

    @app.agent(p.topics.rollups, name="rollup")
    async def rollup(stream: faust.StreamT) -> None:
        # faust's StreamT protocol does not declare take_events; the Stream an agent gets has it
        async for events in stream.take_events(max_records, within=coalesce_s):  # type: ignore[attr-defined]
            keys: set[Key] = set()
            for e in events:
                try:
                    keys.update(decode_signals(e.message.value))
                except DecodeError as exc:
                    log.warning("ignoring undecodable rollup signal at %s[%d]@%d: %s", e.message.topic,
                                e.message.partition, e.message.offset, exc)
            if keys:
                # mypy infers no type for a lambda with a default (which binds this batch's keys)
                await _retrying("rollup", lambda keys=keys: _rollup(p, keys),  # type: ignore[misc]
                                give_up=lambda: p.app.should_stop or p.app.rebalancing)

    delay_due = [0.0]  # when the watermark delay gauge is next refreshed (monotonic)

    async def report_delay() -> None:
        """The watermark delay gauge: 0 once the global watermark covers every write (it then stands still)."""
        covering, mark = await p.covering(), await p.watermark()
        metrics.WATERMARK_DELAY.set(0.0 if covering is None or mark >= covering else time.time() - mark / 1e6)

    @app.timer(settings.watermark_interval_ms / 1000)
    @surviving("heartbeat")
    async def heartbeat() -> None:
        """Publish the watermarks earned and the writes persisted so far, and send the next heartbeat down each owned
        partition while their watermarks do not cover the latest write persisted anywhere (when due)."""
        await p.mutation_partitions.refresh(p.kafka.partitions)
        await follow_topic(p)
        owned, marks, written = await p.publish_watermarks()
        if not owned:
            return
        now = time.monotonic()
        if now >= delay_due[0]:  # once a second: two store reads, not at every tick
            delay_due[0] = now + 1.0
            await report_delay()
        # While this worker's own writes need heartbeats no store read is needed; else any worker's writes may
        if not (heartbeats_needed(marks, owned, covering_watermark(written, p.registry.values()))
                or heartbeats_needed(marks, owned, await p.covering())):
            return  # every write so far can be rolled up: heartbeats would say nothing new
        if not p.heartbeats.due(now):
            return  # idle: the next heartbeats go out idle_s after the last ones
        p.heartbeats.sent(now)
        await asyncio.gather(*(p.kafka.produce(settings.mutations_topic, b"", partition=partition,
                                               headers=HEARTBEAT_HEADERS) for partition in owned))

    @app.timer(settings.store_binding_check_s)
    async def store_binding() -> None:
        """Not `surviving`: the deployment moved to another store (`counter store rebind`) must stop this worker,
        whose writes would be counted nowhere (the watch itself outlives a broker away)."""
        if p.binding is not None:
            await p.binding.check()

    @app.timer(settings.sweep_interval_s)
    @surviving("sweep")
    async def sweep() -> None:
        stale = await p.rollups.stale(limit=10_000)
        if stale:
            metrics.RESIGNALS.labels("sweep").inc(len(stale))
            await p.send_signals(stale)
            await p.cover_stale(stale[:STALE_SAMPLE])

    @app.timer(settings.retention_interval_s)
    @surviving("retention")
    async def retention() -> None:
        """Drop whole event slices older than delete_after that every counter has rolled past, and time buckets
        (and a UNIQUE namespace's sketches) past their granularity's retention (never newer buckets, other
        granularities or the totals)."""
        now_us = time.time_ns() // 1000
        for ns in p.registry.values():
            if ns.counter_type is CounterType.BEST_EFFORT:
                continue
            await drop_expired_events(p.events, p.rollups, ns, now_us)
            for name in ns.windows.granularities:
                g = Granularity(name)
                cutoff = expiry_cutoff(g, now_us, ns.windows.retention_s(name))
                if cutoff is not None and await p.buckets.drop_expired(ns.name, g, cutoff):
                    log.info("retention: dropped %s buckets of namespace %s before %d", name, ns.name, cutoff)
                if cutoff is not None and p.sketches is not None and ns.counts_unique \
                        and await p.sketches.drop_expired(ns.name, g, cutoff):
                    log.info("retention: dropped %s sketches of namespace %s before %d", name, ns.name, cutoff)

    @app.task
    async def settle() -> None:
        """Once the app is up, keep what start-up built out of the collector's scans (infra.heap)."""
        log.info("froze %d start-up objects", freeze_startup_heap())
        if codec.READERS != "compiled":  # schemas.compiled: a third of the persist path's cost is decoding
            log.warning("decoding Avro records with the Python readers; `python -m schemas.compile` (counter up) "
                        "builds the compiled ones, about twice as fast")

    @app.page("/ready")
    async def ready(web: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        """200 once this worker owns partitions of both topics (it joined both groups), 503 before."""
        mutations = [f"{settings.mutations_topic}:{n}" for n in p.owned_mutation_partitions()]
        rollups = sorted(f"{tp.topic}:{tp.partition}" for tp in app.consumer.assignment())
        ready = bool(mutations) and bool(rollups)
        return web.json({"ready": ready, "partitions": mutations + rollups}, status=200 if ready else 503)

    @app.page("/metrics")
    async def prometheus(web: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        # aiohttp wants the charset out of content_type: text/plain; version=0.0.4 is Prometheus' format.
        return web.bytes(generate_latest(metrics.REGISTRY), content_type=CONTENT_TYPE_LATEST.split(";")[0])


PERSIST_CHUNK_RECORDS = 2000  # decoded between yields to the event loop: a few ms each


async def _prepare(p: Pipeline, records: Sequence[KafkaRecord]) -> PreparedBatch:
    """Decode a batch chunk by chunk, yielding to the event loop in between so one long decode (client-side
    batched records carry hundreds of mutations each) never stalls the consumer's heartbeats, metrics or the
    watermark. The result is still one batch: one transaction and one signal per counter.

    Against a copy of the arrival floor: `_persist` raises the floor only once the batch is stored, so a retry (or
    the drain after a cancelled batch) judges its records by the heartbeats before them, not by its last one."""
    floor = dict(p.arrivals.floor)
    rolled = await p.rolled.refresh(p.rollups, p.registry)
    batch = prepare(records[:PERSIST_CHUNK_RECORDS], p.registry, floor, rolled=rolled)
    for i in range(PERSIST_CHUNK_RECORDS, len(records), PERSIST_CHUNK_RECORDS):
        await asyncio.sleep(0)
        batch.extend(prepare(records[i:i + PERSIST_CHUNK_RECORDS], p.registry, floor, rolled=rolled))
    return batch


async def _persist(p: Pipeline, records: Sequence[KafkaRecord]) -> list[Key]:
    """Store a batch (events, last_write_ts, dead letters); the counters it touched, for the next checkpoint's
    rollup signals."""
    started = time.monotonic()
    await p.arrivals.load(p.rollups, p.settings.mutations_topic)  # a partition taken over starts from its floor
    records, seeded = p.arrivals.with_seeds(records)
    batch = await _prepare(p, records)
    await persist_batch(batch, events=p.events, rollups=p.rollups, dead_letters=p.send_dead_letters,
                        signals=None, combinations=p.combinations)
    p.arrivals.stored(batch.heartbeats, seeded)  # the watermark moves once their offsets are committed
    p.tracker.writes_persisted(batch.written)
    if batch.records > len(batch.heartbeats):
        p.heartbeats.writes_persisted(time.monotonic())
    metrics.RECORDS_CONSUMED.inc(batch.records)
    per_ns: dict[str, int] = {}
    for row in batch.rows:
        per_ns[row[0]] = per_ns.get(row[0], 0) + 1
    for ns, n in per_ns.items():
        metrics.EVENTS_PERSISTED.labels(ns).inc(n)
    metrics.PERSIST_BATCH_SECONDS.observe(time.monotonic() - started)
    return list(batch.last_write)


async def _rollup(p: Pipeline, keys: set[Key]) -> None:
    started = time.monotonic()
    try:
        # while the store is away the rollups wait for it, but not past a stop or a rebalance: Faust waits for the
        # batch in hand before either (stream_wait_empty), and it would wait for ever
        results = await rollup_many(keys, p.registry, events=p.events, rollups=p.rollups, cache=p.cache,
                                    watermark=p.watermark, pressure=p.pressure, buckets=p.buckets,
                                    sketches=p.sketches, give_up=lambda: p.app.should_stop or p.app.rebalancing,
                                    outage=p.outage, batch_max=p.settings.rollup_batch_max,
                                    budget_s=p.set_budget_s)
    except OverBudget as exc:
        # the rest of the set queues behind the signals that came meanwhile (another namespace's among them), whose
        # set rolls up the namespaces of fewest counters first
        results = exc.done
        if await _signal_again(p, exc.left, "left by a rollup set past its budget", "set_budget"):
            log.info("a rollup set ran past its %gs budget: %d counter(s) signalled again, behind the signals that "
                     "came meanwhile", p.set_budget_s, len(exc.left))
    except RollupsAbandoned as exc:
        # their signals are acknowledged with the batch
        results = exc.done
        if exc.left and await _signal_again(p, exc.left, "given up as the worker stopped or handed its partitions "
                                            "over"):
            log.warning("the rollups of %d counter(s) were given up as the worker stopped or handed its partitions "
                        "over: signalled again", len(exc.left))
    pending = [r.key for r in results if r.pending]
    for r in results:
        metrics.ROLLUPS.labels(r.key[0], "applied" if r.applied else "unchanged").inc()
    if results:
        metrics.ROLLUP_LAG.set(max(0.0, time.time() - max(r.rollup_ts for r in results) / 1e6))
    if pending:
        # Not raised: `_retrying` would roll the whole batch up again for it
        await _signal_again(p, pending, "whose last write is still ahead of their new rollup", "convergence")
    metrics.ROLLUP_BATCH_SECONDS.observe(time.monotonic() - started)


async def _signal_again(p: Pipeline, keys: list[Key], which: str, source: str | None = None) -> bool:
    """Signal the counters again (counted under `source`); should the broker refuse, say so and leave them to the
    sweep, which finds them: their last write is still ahead of their rollup."""
    try:
        await p.send_signals(keys)
    except Exception as exc:
        log.warning("%d counter(s) %s could not be signalled again (%r): left for the sweep", len(keys), which, exc)
        return False
    if source is not None:
        metrics.RESIGNALS.labels(source).inc(len(keys))
    return True


async def follow_topic(p: Pipeline) -> None:
    """A recreated mutations topic (its id changed, `agents.topic_watch`): say so, and read this worker's partitions
    of the new topic from their start."""
    if p.topic_watch is None or (change := await p.topic_watch.changed()) is None:
        return
    log.error("the mutations topic %s was deleted and created again (topic id %s, now %s): records of the old topic "
              "that no worker had persisted are lost with it, and this worker reads the new topic from its start; "
              "recreate the topic only with the workers stopped and drained (Ctrl-C of `counter up` drains)",
              p.settings.mutations_topic, *change)
    if p.persist_consumer is not None:
        await p.persist_consumer.topic_recreated()  # raises: tried again at the next check
    p.topic_watch.follow(change[1])
    metrics.TOPIC_RECREATIONS.inc()


@overload
async def _retrying(what: str, action: Callable[[], Awaitable[T]]) -> T: ...


@overload
async def _retrying(what: str, action: Callable[[], Awaitable[T]], *, give_up: Callable[[], bool]) -> T | None: ...


async def _retrying(what: str, action: Callable[[], Awaitable[T]], *,
                    give_up: Callable[[], bool] | None = None) -> T | None:
    """Retry a batch until it succeeds: its offsets must not be committed before it is durable. The first failure
    is logged with its traceback, the next ones in a line each (a long outage is not a wall of tracebacks).

    `give_up()` true after a failure returns None instead: for a batch that Faust waits for before a stop or a
    rebalance (the rollup agent's), which a failure that lasts must not hold for ever; its counters stay stale, so
    the sweep signals them again."""
    delay, failures = 0.1, 0
    while True:
        try:
            result = await action()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures += 1
            if give_up is not None and give_up():
                log.warning("%s batch failed (%r) while the worker stops or hands its partitions over: given up, its "
                            "counters are left for the sweep", what, exc)
                return None
            if failures == 1:
                log.exception("%s batch failed; retrying in %.1fs", what, delay)
            else:
                log.error("%s batch failed again (%d times): %r; retrying in %.1fs", what, failures, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            continue
        if failures:
            log.warning("%s batch done after %d failure(s)", what, failures)
        return result


def start(pipeline: Pipeline) -> None:
    """Run the worker and block until it is stopped (SIGINT/SIGTERM)."""
    settings = pipeline.settings
    worker = faust.Worker(pipeline.app, loglevel=settings.worker_log_level.upper())
    # Faust's terminal spinner sets the root logger to DEBUG so that it spins on every record: then every
    # debug call in aiokafka and Faust builds a log record nobody prints (about 5% of a persist batch).
    worker.spinner = None
    worker.execute_from_commandline()
