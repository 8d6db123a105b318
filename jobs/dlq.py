"""Dead letters: read the DLQ topic to its end, select records, and re-submit them to the mutations topic.

Re-submission progress is kept in <data dir>/dlq/<dlq topic>.json ({"resubmitted": {"P:O": {...}}}): only
records the broker acknowledged are recorded, after every chunk, so a stopped run loses nothing and a rerun
never re-sends a record it already sent (unless forced: token-less JSON records would count again).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from jobs.progress import NullProgress, Progress, Stop, never
from producers.partitioner import partition_for
from schemas import MICROS, DecodeError, decode_mutations
from schemas.dead_letter import REASON, SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC, parse_headers
from streams.positions import PartitionEnds, fetch_positions
from streams.settings import Settings
from streams.topics import partition_count

CHUNK = 100  # records produced (and acknowledged) between two saves of the progress
POLL_RECORDS = 1000  # records asked of each poll of the DLQ


@dataclass(frozen=True, slots=True)
class DeadRecord:
    partition: int
    offset: int
    timestamp_us: int
    key: bytes | None
    value: bytes
    headers: dict[str, str]

    @property
    def position(self) -> str:
        return f"{self.partition}:{self.offset}"

    @property
    def reason(self) -> str:
        return self.headers.get(REASON, "?")

    @property
    def source(self) -> str:
        h = self.headers
        return f"{h.get(SOURCE_TOPIC, '?')}[{h.get(SOURCE_PARTITION, '?')}]@{h.get(SOURCE_OFFSET, '?')}"

    def preview(self, width: int = 80) -> str:
        try:
            ms = decode_mutations(self.value)
        except DecodeError:
            text = self.value[:40].hex(" ") if not _printable(self.value) else self.value[:60].decode()
            return f"<undecodable {len(self.value)} bytes: {text}>"[:width]
        m = ms[0]
        what = "clear" if m.op == "CLEAR" else f"{m.delta:+d}"
        token = m.event_id if m.event_id is not None else "(no token)"
        more = f" (+{len(ms) - 1} more)" if len(ms) > 1 else ""
        return f"{m.namespace}:{m.counter_name} {what} token={token}{more}"[:width]

    def produce_key(self, shards: Mapping[str, int] | None = None) -> bytes | None:
        """The key a producer would give the mutation now, from its value (`namespace:counter`, or its shard's key
        with `shards`, namespace -> shards), when it decodes to one mutation; else the record's original key."""
        try:
            ms = decode_mutations(self.value)
        except DecodeError:
            return self.key
        if len(ms) != 1:
            return self.key
        return ms[0].sharded_key((shards or {}).get(ms[0].namespace, 1)).encode()


def _printable(data: bytes) -> bool:
    try:
        return data[:60].decode().isprintable()
    except UnicodeDecodeError:
        return False


def read_dead_letters(bootstrap: str, topic: str, *, quiet_s: float = 1.0, progress: Progress | None = None,
                      stop: Stop = never) -> list[DeadRecord]:
    """Every record of the DLQ topic up to its end when reading started (see PartitionEnds for why the
    reported high watermark alone is not trusted). TopicError when the topic is missing."""
    progress = progress or NullProgress()
    partitions = partition_count(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "counter-dlq-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "enable.partition.eof": False})
    progress.start("reading DLQ", unit="records")
    try:
        ends = PartitionEnds(snapshot_us=time.time_ns() // 1000, margin_us=MICROS, quiet_s=quiet_s)
        assign = []
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends.add(p, start=low, high=high)
            assign.append(TopicPartition(topic, p, low))
        consumer.assign(assign)
        total = ends.remaining()
        progress.update(total=total)
        records: list[DeadRecord] = []
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
                records.append(DeadRecord(partition, offset, ts_us, m.key(), m.value() or b"",
                                          parse_headers(m.headers())))
                if len(records) > total:
                    total = len(records)
                    progress.update(total=total)
                progress.advance(1)
            ends.idle(fetch_positions(consumer, topic, ends), drained=len(polled) < POLL_RECORDS)
        return records
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


def load_sent(path: Path) -> dict[str, Any]:
    """Position ("P:O") -> {at, to, reason} of every record already re-submitted."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    sent = data.get("resubmitted", {}) if isinstance(data, dict) else {}
    return sent if isinstance(sent, dict) else {}


def save_sent(path: Path, sent: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"resubmitted": sent}, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def iso(us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(us / MICROS))


@dataclass(slots=True)
class ResubmitResult:
    done: int = 0  # records the broker acknowledged
    errors: list[str] = field(default_factory=list)  # "P:O: reason" of records not delivered
    interrupted: bool = False


def resubmit(bootstrap: str, target: str, records: list[DeadRecord], *, state: Path,
             sent: dict[str, Any] | None = None, progress: Progress | None = None,
             stop: Stop = never, shards: Mapping[str, int] | None = None) -> ResubmitResult:
    """Re-produce the records' original bytes to `target` (keyed by their mutation's counter, or its shard in a
    namespace of `shards`), CHUNK at a time, recording each acknowledged one in `state`; stops after a chunk with
    a delivery error or on `stop`. TopicError when `target` is missing."""
    progress = progress or NullProgress()
    sent = load_sent(state) if sent is None else sent
    partitions = partition_count(bootstrap, target)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "client.id": "counter-dlq-replay"})
    result = ResubmitResult()
    progress.start("re-submitting", total=len(records), unit="records")
    try:
        for start in range(0, len(records), CHUNK):
            chunk = records[start:start + CHUNK]
            acked: list[DeadRecord] = []
            for r in chunk:
                key = r.produce_key(shards)

                def on_delivery(err: KafkaError | None, _msg: object, r: DeadRecord = r,
                                acked: list[DeadRecord] = acked) -> None:
                    if err is None:
                        acked.append(r)
                    else:
                        result.errors.append(f"{r.position}: {err.str()}")

                kwargs: dict[str, Any] = {"partition": partition_for(key, partitions)} if key else {}
                producer.produce(target, key=key, value=r.value, on_delivery=on_delivery, **kwargs)
            producer.flush(30)
            now = iso(time.time_ns() // 1000)
            for r in acked:  # only acknowledged records count as re-submitted
                sent[r.position] = {"at": now, "to": target, "reason": r.reason}
            save_sent(state, sent)
            result.done += len(acked)
            progress.advance(len(chunk))
            if result.errors or stop():
                break
    finally:
        progress.finish()
    result.interrupted = stop()
    return result
