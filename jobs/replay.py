"""Replay: re-read a mutations topic with its own consumer group and feed it through the persist path.

`counter replay` runs `run_replay` (position syntax and the end-of-partition rule: `streams.positions`). Per
batch of records, like the worker: prepare (decode, admission), then `persist_batch` (idempotent event write,
last_write_ts, rollup signals); then the batch's offsets are committed to the replay's consumer group, so a
rerun resumes after the last persisted batch.

Restored events inside rolled-up windows. Rollups aggregate (rollup_ts, B] and never look back (windows are
immutable), so an event that was missing from the store and is written again by the replay with an
event_time a rollup may already have passed is invisible to rollups. The replay writes such "late" events
(event_time at or before the latest boundary any rollup can have used: now + margin - skew - accept_limit)
per counter, learns from the store which counters got new ones, and recounts exactly those at the end
(`jobs.recount`, the logic of `counter recount`). The set is saved in the state file
(<data dir>/replay/<name>.json) before the offsets are committed, so an interrupted replay still recounts
them when it is run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter as Tally
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from agents.dimensions import Combinations
from agents.metrics import dlq_kind
from agents.persist import PreparedBatch, RawRecord, prepare
from agents.persist_path import persist_batch
from control_plane.admission import rollup_boundary
from jobs.dlq import SentLog
from jobs.dlq import state_path as dlq_state_path
from jobs.progress import NullProgress, Progress, Stop, never
from jobs.recount import RETRY, CounterRecount, Recounter, recounter_of
from jobs.runtime import Runtime, open_runtime
from jobs.state import Busy, exclusive, fmt_time, read_json, safe_name, write_json_atomic
from producers.asyncio_producer import AsyncProducer
from producers.errors import DeliveryError
from schemas import MAX_EVENT_TIME, MICROS
from schemas.dead_letter import DeadLetter
from schemas.record_headers import is_heartbeat
from sinks import EventRow
from streams.positions import (
    PartitionEnds,
    Position,
    PositionError,
    fetch_positions,
    parse_position,
    resolve_start,
    watermarks,
)
from streams.settings import Settings
from streams.signals import SignalSender
from streams.topics import partition_count

Key = tuple[str, str]
LATE_MARGIN_US = 30 * MICROS  # longer than any batch write: see _Writer
STATE_VERSION = 1


class ReplayError(RuntimeError):
    """The replay cannot start (bad topic, positions, options that do not match saved progress)."""


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """What to replay. Positions in `streams.positions.parse_position` syntax."""

    start: str | None = None  # required unless resuming a replay of the same name
    end: str | None = None  # default: each partition's end when the replay starts
    topic: str | None = None  # default: the mutations topic
    namespace: str | None = None  # only this namespace's mutations
    counters: tuple[str, ...] = ()  # only these counters (of `namespace`)
    name: str | None = None  # consumer group keeping the progress (default replay-<topic>)
    restart: bool = False  # ignore saved progress
    as_topic: str | None = None  # topic name in the identity of token-less JSON records (default: topic)
    dead_letter: bool = False  # send rejected records to the DLQ again
    batch_size: int = 2000
    recount: bool = True  # recount counters whose restored events lie in rolled-up windows

    def topic_of(self, settings: Settings) -> str:
        return self.topic or settings.mutations_topic

    def name_of(self, settings: Settings) -> str:
        return self.name or f"replay-{self.topic_of(settings)}"

    def spec(self, topic: str) -> dict[str, object]:
        """Options a resumed replay must share with the run that started it."""
        return {"topic": topic, "to": self.end, "namespace": self.namespace, "counters": sorted(self.counters),
                "as_topic": self.as_topic or topic, "dead_letter": self.dead_letter}


@dataclass(slots=True)
class ReplayResult:
    name: str
    topic: str
    finished: bool
    positions: dict[int, int]  # next offset per partition
    totals: Tally[str]  # records, heartbeats, before_from, events, new, restored, rejected, filtered_out, ...
    rejected: Tally[str]  # rejections by kind (agents.metrics.dlq_kind)
    touched: int  # counters signalled for rollup
    recount_pending: list[Key]  # counters still to recount
    recount_skipped: bool  # options.recount was False
    dead_lettered: bool  # rejections were sent to the DLQ again

    def as_json(self) -> dict[str, object]:
        t = self.totals
        return {
            "name": self.name, "topic": self.topic, "finished": self.finished, "positions": self.positions,
            "records": t["records"], "heartbeats": t["heartbeats"], "before_from": t["before_from"],
            "events": t["events"], "new_events": t["new"], "restored_late_events": t["restored"],
            "rejected": t["rejected"], "rejected_by_kind": dict(self.rejected), "filtered_out": t["filtered_out"],
            "resent_by_dlq_replay": t["resent_by_dlq"],
            "counters_touched": self.touched, "recounted": t["recounted"], "drift_fixed": t["drift_fixed"],
            "recount_pending": [list(k) for k in self.recount_pending],
        }


class _Writer:
    """`write_events` for the persist path that learns which counters got new events in rolled-up windows.

    Fresh rows (event_time after now + LATE_MARGIN - skew - accept_limit) go in one write: no rollup can
    have passed them, because a rollup that read the store before this write commits computed its boundary
    from a `now` before the commit (the write takes far less than LATE_MARGIN). Late rows are written per
    counter, and a counter whose late rows were new needs a recount; with more than `precise_up_to` late
    counters in a batch they are written at once and, when any was new, all of them are recounted.

    Late counters are `in_doubt` from before their write until it returns, and `checkpoint` (the replay's save,
    which keeps them in the saved recount set) runs before the write: a failure or kill after the write but before
    the replay saves its state would otherwise lose them, since a rerun finds their events stored, not new.
    """

    precise_up_to = 32  # late counters in a batch written one by one; more: one write (see __call__)

    def __init__(self, runtime: Runtime, recount: set[Key], checkpoint: Callable[[], None] = lambda: None) -> None:
        self.runtime = runtime
        self.recount = recount
        self.checkpoint = checkpoint
        self.in_doubt: set[Key] = set()  # late counters whose write has not returned yet
        self.restored = 0  # new late events
        self.new = 0

    async def __call__(self, rows: Sequence[EventRow]) -> int:
        started = time.time_ns() // 1000
        limits: dict[str, int] = {}
        fresh: list[EventRow] = []
        late: dict[Key, list[EventRow]] = {}
        for row in rows:
            limit = limits.get(row[0])
            if limit is None:
                ns = self.runtime.registry[row[0]]
                limit = limits[row[0]] = rollup_boundary(started + LATE_MARGIN_US, MAX_EVENT_TIME, ns)
            if row[2] <= limit:
                late.setdefault((row[0], row[1]), []).append(row)
            else:
                fresh.append(row)
        if late.keys() - self.recount:
            self.in_doubt.update(late)
            self.checkpoint()  # recounting a counter whose events turn out to be stored already is harmless
        events = self.runtime.events
        new = await events.write_events(fresh) if fresh else 0
        if len(late) <= self.precise_up_to:
            keys = list(late)
            counts = await asyncio.gather(*(events.write_events(late[k]) for k in keys))
        else:
            # One transaction per counter costs ~150 µs each: with many counters, write the late rows at once
            # (re-reading stored events, the common case, then finds nothing new) and, if some were new,
            # recount every late counter of the batch: exact either way, just more recounting.
            keys = [next(iter(late))]
            counts = [await events.write_events([r for rows in late.values() for r in rows])]
            if counts[0]:
                self.recount.update(late)
        for key, n in zip(keys, counts, strict=True):
            if n:
                self.recount.add(key)
                self.restored += n
                new += n
        self.in_doubt.difference_update(late)
        if fresh and time.time_ns() // 1000 - started > LATE_MARGIN_US:  # absurdly slow write: be safe
            self.recount.update((r[0], r[1]) for r in fresh)
            self.checkpoint()
        self.new += new
        return new


class _Kafka:
    """Rollup signals and (with --dead-letter) dead letters, sent as the worker sends them: one AsyncProducer
    (acks=all, idempotent), signals through the one signal path (streams.signals.SignalSender: grouped per
    rollups partition, each counter on its own). Each call returns once the broker has acknowledged everything,
    and raises KafkaException otherwise (what the CLI reports for a failing broker), so the caller saves its
    state and commits its offsets only after its signals and dead letters are durable."""

    def __init__(self, settings: Settings, bootstrap: str) -> None:
        self.settings = settings
        security = settings.kafka_security.librdkafka()
        self.producer = AsyncProducer(bootstrap, client_id="counter-replay", timeout_s=30.0, config=security)
        self.sender = SignalSender(self.producer, settings.rollups_topic,
                                   partition_count(bootstrap, settings.rollups_topic, config=security))

    async def signals(self, keys: list[Key]) -> None:
        await self._acknowledged(self.sender.send(keys), "rollup signals")

    async def dead_letters(self, dead: list[DeadLetter]) -> None:
        await self._acknowledged(asyncio.gather(*(
            self.producer.produce(self.settings.dlq_topic, value, key, headers=headers)
            for key, value, headers in (d.record() for d in dead))),  # cut to fit, as the worker's
            "dead letters")

    @staticmethod
    async def _acknowledged(sent: asyncio.Future[Any], what: str) -> None:
        try:
            await sent
        except DeliveryError as exc:
            raise KafkaException(f"{what} not delivered: {exc}") from exc

    async def close(self) -> None:
        await self.producer.stop()


class Replay:
    def __init__(self, options: ReplayOptions, settings: Settings, runtime: Runtime, *,
                 progress: Progress | None = None, stop: Stop = never) -> None:
        self.options = options
        self.settings = settings
        self.runtime = runtime
        self.progress = progress or NullProgress()
        self.stop = stop
        self.bootstrap = settings.kafka_bootstrap or ""
        self.topic = options.topic_of(settings)
        self.name = options.name_of(settings)
        self._arrival_floor: dict[int, int] = {}  # partition -> last heartbeat seen (see agents.persist.prepare)
        self._written = 0  # the latest arrival of a replayed write (µs)
        self._told, self._told_at = 0, -math.inf  # the latest the workers were told of, and when (monotonic)
        self._combinations = Combinations()  # dimension combinations known to this replay (agents.dimensions)
        self.identity_topic = options.as_topic or self.topic
        self.state_path = state_path(settings, self.name)
        try:
            self.start: Position | None = parse_position(options.start) if options.start else None
            self.end = parse_position(options.end, allow_earliest=False) if options.end else None
        except ValueError as exc:
            raise ReplayError(str(exc)) from None
        if options.namespace is not None and options.namespace not in runtime.registry:
            raise ReplayError(f"--namespace {options.namespace!r} is not in the namespace file (known: "
                              f"{', '.join(runtime.registry.names())})")
        self.counters = set(options.counters)
        # token-less mutations `counter dlq replay` re-sent as new writes: stored again as their source records'
        # events they would count twice (a review: 30 became 65)
        self.resent = SentLog(dlq_state_path(settings, settings.dlq_topic)).resent_originals()
        self.state: dict = {}
        self.recount: set[Key] = set()
        self.totals: Tally[str] = Tally()
        self.rejected: Tally[str] = Tally()
        self.touched: set[Key] = set()
        self.positions: dict[int, int] = {}
        self.read = 0  # records read in this run (progress)
        self.total = 0  # the progress total (an estimate that only grows)
        self.kafka = _Kafka(settings, self.bootstrap)
        self.writer = _Writer(runtime, self.recount, self._save)

    # -- set-up -------------------------------------------------------------------------------------

    def _consumer(self) -> Consumer:
        return Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.name,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "enable.partition.eof": False, "client.id": "counter-replay",
                         **self.settings.kafka_security.librdkafka()})

    def _resolve(self, consumer: Consumer) -> tuple[dict[int, int], dict[int, int], bool, int | None]:
        """Start offset and reported high watermark per replayed partition; whether resuming; --from µs."""
        meta = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise ReplayError(f"topic {self.topic!r} is not available ({meta.error if meta else 'missing'})")
        partitions = sorted(meta.partitions)
        tps = [TopicPartition(self.topic, p) for p in partitions]
        committed = {} if self.options.restart else {
            tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10) if tp.offset >= 0}
        marks = watermarks(consumer, self.topic, partitions)
        spec = self.options.spec(self.topic)
        resuming = bool(committed) and self.state.get("spec") is not None
        if resuming and self.state.get("finished") and (self.start is not None or self.state["spec"] != spec):
            # the last run ended: --from or other options start a new replay (a review was told to "resume" it)
            self.progress.log(f"replay {self.name!r} finished at {self.state['finished']}: starting a new one")
            resuming = False
            if self.start is None:
                raise ReplayError(f"replay {self.name!r} finished with other options: give --from (earliest, a time "
                                  "or P:O,...) to start a new one")
        if resuming:
            saved = self.state["spec"]
            if saved != spec:
                diff = ", ".join(f"{k}={saved.get(k)!r}" for k in spec if saved.get(k) != spec[k])
                raise ReplayError(f"replay {self.name!r} was started with {diff}: run it with the same options "
                                  "to resume, or pass --restart (or another --name) to start a new replay")
            if self.options.start:
                self.progress.log(f"continuing replay {self.name!r} from its saved positions (--from ignored: "
                                  "--restart replays from --from again)")
            return committed, {p: marks[p][1] for p in committed}, True, self.state.get("from_us")
        if self.start is None:
            raise ReplayError(f"no saved progress for replay {self.name!r}: give --from (earliest, a time or P:O,...)")
        try:
            starts = resolve_start(consumer, self.topic, self.start, marks)
        except PositionError as exc:
            raise ReplayError(str(exc)) from None
        from_us = self.start.time_us if self.start.kind == "time" else None
        return starts, {p: marks[p][1] for p in starts}, False, from_us

    # -- the run ------------------------------------------------------------------------------------

    async def run(self) -> ReplayResult:
        stop, progress = self.stop, self.progress
        self.state = read_json(self.state_path)
        self.recount.update(tuple(k) for k in self.state.get("recount", []))
        consumer = self._consumer()
        try:
            starts, highs, resuming, from_us = self._resolve(consumer)
            if not resuming or self.state.get("finished"):
                carried = sorted(self.recount)
                self.state = {"version": STATE_VERSION, "name": self.name, "spec": self.options.spec(self.topic),
                              "from": str(self.start) if self.start and not resuming else self.state.get("from"),
                              "from_us": from_us, "started_at": fmt_time(time.time_ns() // 1000),
                              "totals": {}, "recount": [list(k) for k in carried]}
            self.totals.update(self.state.get("totals", {}))
            self.rejected.update(self.state.get("rejected", {}))  # by kind: a resumed summary said "()" (a review)
            if not resuming:  # every replayed partition gets a committed position: resume covers exactly them
                consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in starts.items()],
                                asynchronous=False)
            self.positions = dict(starts)
            self._save()
            snapshot_us = time.time_ns() // 1000
            skew = max((ns.max_clock_skew_s for ns in self.runtime.registry.values()), default=1.0)
            ends = PartitionEnds(snapshot_us=snapshot_us, margin_us=int(max(1.0, skew) * MICROS),
                                 stop_after_us=self.end.time_us if self.end and self.end.kind == "time" else None)
            stop_offsets = self.end.offsets if self.end and self.end.kind == "offsets" else {}
            for p, start in starts.items():
                ends.add(p, start=start, high=highs[p], stop_offset=stop_offsets.get(p))
            what = "resuming" if resuming else "replaying"
            begin = ", ".join(f"{p}:{o}" for p, o in sorted(starts.items())) or "no partition"
            reported = ", ".join(f"{p}:{h}" for p, h in sorted(highs.items())) or "-"
            progress.log(f"{what} {self.topic} as {self.name!r} from {begin} (reported ends {reported})")
            consumer.assign([TopicPartition(self.topic, p, o) for p, o in starts.items()])
            interrupted = False
            self.total = ends.remaining()
            progress.start("replaying", total=self.total, unit="records")
            try:
                while not ends.all_done and not stop():
                    polled = await self._step(consumer, ends, from_us)
                    finished = ends.idle(fetch_positions(consumer, self.topic, ends),
                                         drained=polled < self.options.batch_size)
                    if finished:
                        consumer.pause([TopicPartition(self.topic, p) for p in finished])
                interrupted = stop()
                if not interrupted and self.recount:
                    progress.update(note=f"recounting {len(self.recount):,} counter(s)")
                    interrupted = await self._recount()
            except KeyboardInterrupt:  # a hard stop (second Ctrl-C): the batch in hand is abandoned (re-reading
                interrupted = True     # it is harmless)
            except Exception:
                with contextlib.suppress(OSError):  # keep the recount set learned so far (the failure is raised)
                    self._save()
                raise
            finally:
                progress.finish()
                await self._tell_workers()
            return self._finish(interrupted)
        finally:
            with contextlib.suppress(Exception):
                consumer.close()
            await self.kafka.close()

    async def _step(self, consumer: Consumer, ends: PartitionEnds, from_us: int | None) -> int:
        """Read, persist and commit one batch; how many messages the poll returned."""
        messages = await asyncio.to_thread(consumer.consume, self.options.batch_size, 0.5)
        records: list[RawRecord] = []
        offsets: dict[int, int] = {}
        read = 0
        skipped: Tally[str] = Tally()  # heartbeats, before_from: tallied with the batch, once it is persisted
        for m in messages:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(err)
            partition, offset = cast(int, m.partition()), cast(int, m.offset())  # set on a consumed record
            timestamp_us = m.timestamp()[1] * 1000  # Kafka timestamps are ms
            if not ends.accept(partition, offset, timestamp_us):
                continue
            offsets[partition] = offset + 1
            read += 1
            if from_us is not None and timestamp_us < from_us:
                skipped["before_from"] += 1
                continue
            headers = m.headers()
            if not m.value() and is_heartbeat(headers):
                skipped["heartbeats"] += 1
            records.append(RawRecord(self.topic, partition, offset, timestamp_us // 1000, m.key(), m.value(),
                                     headers or ()))
        if records:
            await self._persist(records)
        if offsets:
            self.totals["records"] += read
            self.totals.update(skipped)
            self.positions.update(offsets)
            self._save()  # the recount set must be durable before the offsets that would skip its cause
            consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                            asynchronous=False)
            self.total = max(self.total, self.read + read + ends.remaining())
            self.read += read
            self.progress.update(total=self.total)
            self.progress.advance(read, note=f"{self.writer.new:,} new events, {len(self.touched):,} counters")
        return len(messages)

    def _filter(self, batch: PreparedBatch) -> PreparedBatch:
        if self.resent:
            resent = self.resent
            rows = [r for r in batch.rows if r[:5] not in resent]
            dimensioned = [w for w in batch.dimensioned
                           if (w.namespace, w.counter, w.event_time, w.event_id, w.item_key) not in resent]
            self.totals["resent_by_dlq"] += len(batch.rows) - len(rows) + len(batch.dimensioned) - len(dimensioned)
            batch.rows, batch.dimensioned = rows, dimensioned
        ns, counters = self.options.namespace, self.counters
        if ns is None:
            return batch
        keep = (lambda r: r[0] == ns and r[1] in counters) if counters else (lambda r: r[0] == ns)
        rows = [r for r in batch.rows if keep(r)]
        last = {k: v for k, v in batch.last_write.items() if keep(k)}
        # writes with dimensions and clears are kept by their base counter (with its combinations)
        dimensioned = [w for w in batch.dimensioned if keep((w.namespace, w.counter))]
        clears = [c for c in batch.clears if keep(c)]
        self.totals["filtered_out"] += len(batch.rows) - len(rows) + len(batch.dimensioned) - len(dimensioned)
        # the rest as it was: `written` (when the batch's writes reached Kafka) tells the workers to heartbeat past
        # them (`_tell_workers`); rebuilt without it, a filtered replay never did (a review)
        return replace(batch, rows=rows, last_write=last, dimensioned=dimensioned, clears=clears)

    async def _persist(self, records: list[RawRecord]) -> None:
        batch = self._filter(prepare(records, self.runtime.registry, self._arrival_floor,
                                     identity_topic=self.identity_topic))
        before_new, before_restored = self.writer.new, self.writer.restored
        await persist_batch(batch, events=self.runtime.events, rollups=self.runtime.rollups,
                            dead_letters=self.kafka.dead_letters if self.options.dead_letter else None,
                            signals=self.kafka.signals, write=self.writer, combinations=self._combinations)
        for d in batch.dead:
            self.rejected[dlq_kind(d.reason)] += 1
        self.totals["rejected"] += len(batch.dead)  # after: the bound on dimension combinations refuses some
        self.totals["events"] += len(batch.rows)  # with the events of dimension combinations
        self.totals["new"] += self.writer.new - before_new
        self.totals["restored"] += self.writer.restored - before_restored
        self.touched.update(batch.last_write)
        if batch.written:
            self._written = max(self._written, *batch.written.values())
            if time.monotonic() - self._told_at >= 1.0:
                await self._tell_workers()

    async def _tell_workers(self) -> None:
        """Have idle workers' heartbeats carry the watermark past the replayed writes, as past their own (their
        rollups need it; `agents.watermark`): at most once a second while replaying, and once more at the end."""
        if self._written > self._told:
            await self.runtime.request_heartbeats(self._written)
            self._told, self._told_at = self._written, time.monotonic()

    async def _recount(self) -> bool:
        """Recount the counters with restored late events; returns whether it was interrupted."""
        if not self.options.recount:
            return False
        results = await self._recount_each(recounter_of(self.runtime))
        self._save()
        self.totals["recount_checked"] += len(results)
        self.totals["recounted"] += sum(1 for r in results if r.action == "written")
        self.totals["drift_fixed"] += sum(1 for r in results if r.action == "written" and r.status != "ok")
        drifted = [r for r in results if r.status != "ok"]
        for r in drifted[:10]:
            self.progress.log(f"  recounted {r.namespace}:{r.counter}: stored {r.stored} -> {r.count} "
                              f"(drift {r.drift:+,}, {r.action})")
        if len(drifted) > 10:
            self.progress.log(f"  ... and {len(drifted) - 10:,} more")
        return self.stop()

    async def _recount_each(self, recounter: Recounter) -> list[CounterRecount]:
        """Recount each counter (dropping it from the set), then retry those behind the watermark. On a stop, the
        results so far: the caller tallies the counters written before it, which have left the saved set."""
        results: list[CounterRecount] = []
        for key in sorted(self.recount):
            if self.stop():
                return results
            if key[0] not in self.runtime.registry:
                self.recount.discard(key)
                continue
            result = await recounter.once(*key)
            if result.action not in RETRY:
                results.append(result)
                self.recount.discard(key)
                self._save()
        for result in await recounter.retry(10.0, self.stop):
            results.append(result)
            if result.action not in RETRY:
                self.recount.discard((result.namespace, result.counter))
        return results

    def _save(self) -> None:
        self.state["totals"] = dict(self.totals)
        self.state["rejected"] = dict(self.rejected)
        self.state["recount"] = [list(k) for k in sorted(self.recount | self.writer.in_doubt)]
        self.state["positions"] = {str(p): o for p, o in sorted(self.positions.items())}
        self.state["updated_at"] = fmt_time(time.time_ns() // 1000)
        write_json_atomic(self.state_path, self.state)

    def _finish(self, interrupted: bool) -> ReplayResult:
        if not interrupted:
            self.state["finished"] = fmt_time(time.time_ns() // 1000)
        self._save()
        return ReplayResult(self.name, self.topic, not interrupted, dict(self.positions), self.totals,
                            self.rejected, len(self.touched), sorted(self.recount),
                            recount_skipped=not self.options.recount, dead_lettered=self.options.dead_letter)


def state_path(settings: Settings, name: str) -> Path:
    return settings.data_dir / "replay" / f"{safe_name(name)}.json"


async def run_replay(options: ReplayOptions, settings: Settings, *, progress: Progress | None = None,
                     stop: Stop = never) -> ReplayResult:
    """Check the name, hold the replay's lock, open the runtime, replay, close.

    ReplayError when it cannot start; SettingsError, ConfigError, TopicError or KafkaException when the broker,
    the store or the configuration fails."""
    name = options.name_of(settings)
    if name == settings.worker_id:
        raise ReplayError(f"--name {name!r} is the workers' consumer group (COUNTER_WORKER_ID): a replay "
                          "committing offsets there would make the workers skip records")
    lock_path = settings.data_dir / "replay" / f"{safe_name(name)}.lock"
    try:
        with exclusive(lock_path):
            runtime = open_runtime(settings)
            try:
                return await Replay(options, settings, runtime, progress=progress, stop=stop).run()
            finally:
                await runtime.close()
    except Busy:
        raise ReplayError(f"another replay with this --name is running (lock {lock_path})") from None
