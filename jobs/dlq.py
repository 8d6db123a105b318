"""Dead letters: read the DLQ topic to its end, select records, and re-submit them to the mutations topic.

Re-submission progress is kept in <data dir>/dlq/<dlq topic>.json (`SentLog`): the records the broker
acknowledged, saved after every chunk, and before each chunk the chunk itself as in flight. A run killed between a
chunk's send and its save (kill -9, SIGTERM; a review's every kill counted up to 100 token-less writes twice, which
count again when sent again) leaves it in flight: the next run first reads the target topic from where that chunk
began, for the records carrying those dead letters' identities (header `dlq.resent`), and records the ones found
as sent (`recover_in_flight`). When the topic cannot tell (its records since then deleted by retention, the topic
gone or recreated), the run refuses until the operator says which to assume (`counter dlq replay --in-flight`).
So a rerun never re-sends a record the broker has (unless forced: token-less JSON records would count again).
Records are known by their source (`DeadRecord.identity`), not by their DLQ position: one source record may be
dead-lettered twice (a worker redelivery, `counter replay --dead-letter`), and the local broker, which keeps topics
in memory, reuses DLQ positions after a restart.
"""

from __future__ import annotations

import calendar
import functools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from control_plane import NamespaceRegistry
from control_plane.admission import mutation_refusal
from jobs.progress import NullProgress, Progress, Stop, never
from jobs.state import read_json, write_json_atomic
from producers.partitioner import partition_for
from schemas import MICROS, DecodeError, decode_mutations
from schemas.dead_letter import (
    INDEX,
    RESENT,
    DeadRecord,
    parse_headers,
)
from sinks import EventStore, open_namespace_stores
from streams.positions import PartitionEnds, fetch_positions, watermarks
from streams.settings import Settings
from streams.topics import TopicError, partition_count

CHUNK = 1000  # records produced (and acknowledged) between two saves of the progress
POLL_RECORDS = 1000  # records asked of each poll of the DLQ
DELIVERY_TIMEOUT_S = 30  # the producer fails a record the broker has not acknowledged by then
SETTLE_S = 2 * DELIVERY_TIMEOUT_S  # how long a chunk may take to be acknowledged or failed
SENT_VERSION = 2  # of the progress file: keyed by DeadRecord.identity (version 1, unversioned: by DLQ position)
# A chunk's records are appended within the delivery timeout of its send; the margin is for clocks (the local
# broker stamps records with their producer's time): a record stamped later than this ends a partition's search.
APPENDED_WITHIN_US = (DELIVERY_TIMEOUT_S + 600) * MICROS


def refusal(record: DeadRecord, registry: NamespaceRegistry) -> str | None:
    """Why the namespaces would dead-letter every mutation of `record` again whatever their time (the first one's
    reason: "field 'namespace': unknown namespace ..."), or None: when one of them would count, the record is worth
    sending, and one that does not decode is left to the worker."""
    try:
        ms = decode_mutations(record.value)
    except DecodeError:
        return None
    refused = [r for m in ms if (r := mutation_refusal(registry, m)) is not None]
    if not ms or len(refused) < len(ms):
        return None
    name, reason = refused[0]
    return f"field '{name}': {reason}"


def read_dead_letters(bootstrap: str, topic: str, *, quiet_s: float = 1.0, progress: Progress | None = None,
                      stop: Stop = never, security: Mapping[str, str] | None = None) -> list[DeadRecord]:
    """Every record of the DLQ topic up to its end when reading started (see PartitionEnds for why the
    reported high watermark alone is not trusted). TopicError when the topic is missing. `security`: the clients'
    (`Settings.kafka_security.librdkafka()`)."""
    records: list[DeadRecord] = []

    def keep(partition: int, offset: int, timestamp_us: int, m: Any) -> None:
        records.append(DeadRecord(partition, offset, timestamp_us, m.key(), m.value() or b"",
                                  parse_headers(m.headers())))
    _read(bootstrap, topic, keep, what="reading DLQ", quiet_s=quiet_s, progress=progress, stop=stop,
          security=security)
    return records


class InFlightUnknown(ValueError):
    """Whether a stopped run's chunk in flight reached its topic cannot be read there any more."""


def recover_in_flight(bootstrap: str, state: Path, *, progress: Progress | None = None,
                      security: Mapping[str, str] | None = None) -> int | None:
    """Settle the chunk a killed `dlq replay` left in flight in `state` (`SentLog.send`): read its topic from where
    that chunk began, up to its last possible append, for the records carrying its dead letters' identities
    (header `dlq.resent`), and record those as sent, the rest as not. Returns how many were sent (None: nothing was
    in flight). InFlightUnknown when the topic cannot tell: the progress file's record of the chunk damaged, the
    topic gone, recreated (its ends before the chunk's start) or its records since the chunk's start deleted by
    retention (a rerun days later): deciding "not sent" would count what was sent twice (a review)."""
    sent = SentLog(state)
    flight = sent.in_flight
    if not flight:
        return None
    try:
        topic = str(flight["topic"])
        since = {int(p): int(o) for p, o in flight["since"].items()}
        until_us = int(flight["sent_us"]) + APPENDED_WITHIN_US
        wanted = set(_dicts(flight.get("entries")))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InFlightUnknown(f"{state}: the chunk a stopped run left in flight is unreadable ({exc!r})") from exc
    try:
        marks = _watermarks(bootstrap, topic, security)
    except TopicError as exc:
        raise InFlightUnknown(f"the topic a stopped run was sending to is not there ({exc})") from exc
    for p, offset in since.items():
        low, high = marks.get(p, (0, -1))
        if low > offset or high < offset:
            raise InFlightUnknown(f"{topic} partition {p} no longer holds what a stopped run sent there from offset "
                                  f"{offset} (it now spans {low}..{high}: deleted by retention, or the topic was "
                                  "recreated)")
    found: set[str] = set()

    def keep(_partition: int, _offset: int, _timestamp_us: int, m: Any) -> None:
        for name, value in m.headers() or ():
            if name == RESENT and isinstance(value, bytes) and (identity := value.decode(errors="replace")) in wanted:
                found.add(identity)
    _read(bootstrap, topic, keep, what="finding what a stopped run sent", starts=since, stop_after_us=until_us,
          progress=progress, stop=lambda: found >= wanted, security=security)
    count = sent.found(found)
    sent.save()
    return count


def _read(bootstrap: str, topic: str, keep: Callable[[int, int, int, Any], None], *, what: str,
          starts: Mapping[int, int] | None = None, stop_after_us: int | None = None, quiet_s: float = 1.0,
          progress: Progress | None = None, stop: Stop = never, security: Mapping[str, str] | None = None) -> None:
    """Read `topic` from `starts` (per partition; the first offset kept where not given) to its end when reading
    began, handing each record to `keep(partition, offset, timestamp µs, message)`; a partition ends early at a
    record stamped after `stop_after_us`, the whole read on `stop`."""
    progress = progress or NullProgress()
    partitions = partition_count(bootstrap, topic, config=security)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "counter-dlq-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "enable.partition.eof": False, **(security or {})})
    progress.start(what, unit="records")
    try:
        ends = PartitionEnds(snapshot_us=time.time_ns() // 1000, margin_us=MICROS, quiet_s=quiet_s,
                             stop_after_us=stop_after_us)
        assign = []
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            start = max(low, (starts or {}).get(p, low))
            ends.add(p, start=start, high=high)
            assign.append(TopicPartition(topic, p, start))
        consumer.assign(assign)
        total, read = ends.remaining(), 0
        progress.update(total=total)
        while not ends.all_done and not stop():
            polled = consumer.consume(POLL_RECORDS, 0.5)
            for m in polled:
                if (err := m.error()) is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                ts_us = m.timestamp()[1] * 1000
                partition, offset = cast(int, m.partition()), cast(int, m.offset())  # set on a consumed record
                if not ends.accept(partition, offset, ts_us):
                    continue
                keep(partition, offset, ts_us, m)
                read += 1
                if read > total:
                    total = read
                    progress.update(total=total)
                progress.advance(1)
            ends.idle(fetch_positions(consumer, topic, ends), drained=len(polled) < POLL_RECORDS)
    finally:
        progress.finish()
        consumer.close()


def select(records: Iterable[DeadRecord], *, reason: str | None = None,
           positions: set[tuple[int, int]] | None = None) -> list[DeadRecord]:
    """Records whose reason contains `reason` (case-insensitive) and, if given, at one of `positions`."""
    text = (reason or "").lower()
    return [r for r in records
            if (not positions or (r.partition, r.offset) in positions) and (not text or text in r.reason.lower())]


def state_path(settings: Settings, topic: str) -> Path:
    return settings.data_dir / "dlq" / f"{topic}.json"


class SentLog:
    """The dead letters already re-submitted, as saved in the progress file: identity -> {at, to, reason, position}.

    A file of version 1 keyed them by DLQ position ("P:O"), which a restarted local broker reuses: such an entry
    still marks the record at its position when that record was dead-lettered before the entry was written, so a
    new dead letter at a reused position is not taken for it. Those entries are kept as they are. Entries written
    before identities held a batch item's index (`DeadRecord.legacy_identity`) still mark its items: the version
    that wrote them re-sent one of two equal token-less items of a record and marked both (that one is lost; re-
    sending the other now could count the first twice)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        data = read_json(path)
        saved = _dicts(data.get("resubmitted"))
        if data.get("version") == SENT_VERSION:
            self.entries, self.by_position = saved, _dicts(data.get("by_dlq_position"))
        else:
            self.entries, self.by_position = {}, saved
        # the chunk sent and not yet saved as acknowledged: {"topic", "since": {partition: offset}, "sent_us",
        # "entries": {identity: entry}}; empty when the last run saved its last chunk
        flight = data.get("in_flight")
        self.in_flight: dict[str, Any] = flight if isinstance(flight, dict) else {}

    def get(self, r: DeadRecord) -> dict[str, Any] | None:
        """Its entry when `r` was re-submitted already."""
        entry = self.entries.get(r.identity)
        if entry is None and INDEX in r.headers:  # re-submitted by a version keying a batch's items without it
            entry = self.entries.get(r.legacy_identity)
        if entry is None and (old := self.by_position.get(r.position)) is not None:
            at = _epoch_s(old.get("at"))
            if at is None or r.timestamp_us < (at + 1) * MICROS:  # "at" has whole seconds
                entry = old
        return entry

    def __contains__(self, r: DeadRecord) -> bool:
        return self.get(r) is not None

    def add(self, r: DeadRecord, target: str, at: str) -> None:
        self.entries[r.identity] = _entry(r, target, at)

    def send(self, records: list[DeadRecord], target: str, since: Mapping[int, int], now_us: int) -> None:
        """Mark `records` in flight to `target`, whose partitions ended at `since` before they were sent (saved before
        they are produced: `recover_in_flight`)."""
        self.in_flight = {"topic": target, "since": {str(p): o for p, o in since.items()}, "sent_us": now_us,
                          "entries": {r.identity: _entry(r, target, iso(now_us)) for r in records}}

    def sent(self) -> None:
        """The chunk in flight settled: what the broker acknowledged is in `entries`."""
        self.in_flight = {}

    def assume(self, sent: bool) -> int:
        """Settle the chunk in flight by the operator's word when its topic cannot tell: all sent, or none. Returns
        how many it held."""
        entries = set(_dicts(self.in_flight.get("entries")))
        self.found(entries if sent else set())
        return len(entries)

    def found(self, identities: set[str]) -> int:
        """The in-flight records found in their topic are sent; the rest were not. Returns how many were found."""
        entries = _dicts(self.in_flight.get("entries"))
        sent = identities & entries.keys()
        self.entries.update({identity: entries[identity] for identity in sent})
        self.in_flight = {}
        return len(sent)

    def resent_originals(self) -> set[tuple[str, str, int, str, str]]:
        """The token-less mutations re-submitted as new writes, as their source records' events: (namespace,
        counter, event_time, event_id, item key), which a `counter replay` of those records leaves out."""
        out: set[tuple[str, str, int, str, str]] = set()
        # in flight too: a run killed mid-chunk may have sent them (a rerun of `dlq replay` re-sends the others)
        for entry in [*self.entries.values(), *_dicts(self.in_flight.get("entries")).values()]:
            original = entry.get("original")
            if isinstance(original, list) and len(original) == 5:
                out.add((str(original[0]), str(original[1]), int(original[2]), str(original[3]), str(original[4])))
        return out

    def save(self) -> None:
        data: dict[str, Any] = {"version": SENT_VERSION, "resubmitted": self.entries}
        if self.by_position:
            data["by_dlq_position"] = self.by_position
        if self.in_flight:
            data["in_flight"] = self.in_flight
        write_json_atomic(self.path, data)


def _entry(r: DeadRecord, target: str, at: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"at": at, "to": target, "reason": r.reason, "position": r.position}
    if (original := r.tokenless()) is not None:  # re-sent as a new write: a replay must not store the original
        entry["original"] = [original[0], *original[1]]
    return entry


def _dicts(value: object) -> dict[str, Any]:
    """The entries of a saved map whose values are objects (anything else in a damaged file is dropped)."""
    return {k: v for k, v in value.items() if isinstance(v, dict)} if isinstance(value, dict) else {}


def _epoch_s(text: object) -> int | None:
    try:
        return calendar.timegm(time.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return None


def pending(records: Iterable[DeadRecord], sent: SentLog, *, force: bool = False) -> tuple[list[DeadRecord], int, int]:
    """The records to re-submit, one per source mutation (a second dead letter of it would count it twice when it
    carries no token), without those `sent` already (all of them with `force`); and how many were left out as
    already re-submitted, and as duplicates."""
    todo: list[DeadRecord] = []
    seen: set[str] = set()
    already = duplicates = 0
    for r in records:
        if r.identity in seen:
            duplicates += 1
        elif not force and r in sent:
            already += 1
        else:
            todo.append(r)
        seen.add(r.identity)
    return todo, already, duplicates


async def stored_originals(settings: Settings, registry: Mapping[str, Any], records: list[DeadRecord]) -> set[str]:
    """The identities of the token-less dead letters whose mutation is stored as its source record's event (a
    `counter replay` of that record stored it since): re-sent, they would be counted a second time, as new writes."""
    if not any(r.tokenless() is not None for r in records):
        return set()  # nothing to ask the store
    events, rollups, buckets = open_namespace_stores(settings.store, settings.data_dir, registry)
    try:
        return await _stored(records, events)
    finally:
        for store in (events, rollups, buckets):
            await store.close()


async def _stored(records: list[DeadRecord], events: EventStore) -> set[str]:
    by_namespace: dict[str, list[tuple[DeadRecord, tuple[str, int, str, str]]]] = {}
    for r in records:
        if (original := r.tokenless()) is not None:
            by_namespace.setdefault(original[0], []).append((r, original[1]))
    out: set[str] = set()
    for namespace, items in by_namespace.items():
        found = await events.contains(namespace, [key for _r, key in items])
        out.update(r.identity for (r, _key), stored in zip(items, found, strict=True) if stored)
    return out


def iso(us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(us / MICROS))


@dataclass(slots=True)
class ResubmitResult:
    done: int = 0  # records the broker acknowledged
    errors: list[str] = field(default_factory=list)  # "P:O: reason" of records not delivered
    interrupted: bool = False


def resubmit(bootstrap: str, target: str, records: list[DeadRecord], *, state: Path, force: bool = False,
             progress: Progress | None = None, stop: Stop = never,
             shards: Mapping[str, int] | None = None, security: Mapping[str, str] | None = None) -> ResubmitResult:
    """Re-produce the records' original bytes to `target` (keyed by their mutation's counter, or its shard in a
    namespace of `shards`), CHUNK at a time, recording each acknowledged one in `state` (`SentLog`); one record per
    source mutation, none already re-submitted unless `force` (`pending`). Stops after a chunk with a delivery
    error or on `stop`. TopicError when `target` is missing."""
    progress = progress or NullProgress()
    sent = SentLog(state)
    if sent.in_flight:
        raise ValueError(f"{state}: a stopped run left a chunk in flight; settle it first (recover_in_flight)")
    records = pending(records, sent, force=force)[0]
    partitions = partition_count(bootstrap, target, config=security)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "message.timeout.ms": DELIVERY_TIMEOUT_S * 1000,
                         "client.id": "counter-dlq-replay", "allow.auto.create.topics": False, **(security or {})})
    result = ResubmitResult()

    def delivered(r: DeadRecord, err: KafkaError | None, _msg: object) -> None:  # of every chunk, into one log
        if err is None:
            sent.add(r, target, iso(time.time_ns() // 1000))
            result.done += 1
        else:
            result.errors.append(f"{r.position}: {err.str()}")

    progress.start("re-submitting", total=len(records), unit="records")
    try:
        for start in range(0, len(records), CHUNK):
            chunk = records[start:start + CHUNK]
            since = _ends(bootstrap, target, partitions, security)  # where a search for this chunk would start
            sent.send(chunk, target, since, time.time_ns() // 1000)
            sent.save()  # before the first record leaves: a run killed from here on leaves the chunk in flight
            for r in chunk:
                key = r.produce_key(shards)
                kwargs: dict[str, Any] = {"partition": partition_for(key, partitions)} if key else {}
                producer.produce(target, key=key, value=r.value, headers=[(RESENT, r.identity.encode())],
                                 on_delivery=functools.partial(delivered, r), **kwargs)
            if left := _settle(producer):
                result.errors.append(f"{left} record(s) neither acknowledged nor failed after {SETTLE_S}s: the next "
                                     "run first looks for them in the topic, and re-sends those it does not find")
            if not result.errors:  # a failed record may have reached the broker all the same (a timeout): in flight
                sent.sent()
            sent.save()
            progress.advance(len(chunk))
            if result.errors or stop():
                break
    finally:
        sent.save()  # a hard stop too: what was acknowledged is never re-sent
        progress.finish()
    result.interrupted = stop()
    return result


def _ends(bootstrap: str, topic: str, partitions: int, security: Mapping[str, str] | None) -> dict[int, int]:
    """Each partition's reported end (on the local broker, the start of its last batch: a search from there reads
    a few records more)."""
    return {p: high for p, (_low, high) in _watermarks(bootstrap, topic, security, partitions).items()}


def _watermarks(bootstrap: str, topic: str, security: Mapping[str, str] | None,
                partitions: int | None = None) -> dict[int, tuple[int, int]]:
    """Each partition's first and reported end offsets (TopicError when the topic is missing)."""
    if partitions is None:
        partitions = partition_count(bootstrap, topic, config=security)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "counter-dlq-reader",
                         "enable.auto.commit": False, **(security or {})})
    try:
        return watermarks(consumer, topic, list(range(partitions)))
    finally:
        consumer.close()


def _settle(producer: Producer) -> int:
    """Flush until every produced record is acknowledged or failed (the producer fails it after
    DELIVERY_TIMEOUT_S); the records still queued after SETTLE_S (0: none). Short flushes keep Ctrl-C prompt."""
    deadline = time.monotonic() + SETTLE_S
    left = producer.flush(1.0)
    while left and time.monotonic() < deadline:
        left = producer.flush(1.0)
    return left or 0
