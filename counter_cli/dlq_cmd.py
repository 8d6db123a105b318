"""`counter dlq list|replay`: inspect dead-lettered records and re-submit them after their cause is fixed."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from counter_cli.common import console, fail, resolve_bootstrap, settings_or_exit
from counter_cli.progress import Interrupt, ProgressBar
from counter_cli.replay_cmd import PartitionEnds
from producers.partitioner import partition_for
from schemas import MICROS, DecodeError, decode_mutations
from schemas.dead_letter import REASON, SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TIMESTAMP, SOURCE_TOPIC, parse_headers
from streams.settings import Settings
from streams.topics import TopicError, partition_count

DESCRIPTION = """\
The persist agent dead-letters what it cannot accept: undecodable records, unknown or BEST_EFFORT
namespaces, event times outside the accept window. Each dead letter keeps the original key and bytes, the
reason, and where it came from (topic, partition, offset). `list` shows them; `replay` re-produces the
original bytes to the mutations topic once their cause is fixed (e.g. the namespace was added to the
namespace file and the workers restarted), so the worker persists them like any other mutation."""

LIST_EPILOG = """\
examples:
  counter dlq list
  counter dlq list --reason "unknown namespace" --limit 20
  counter dlq list --format jsonl > dead.jsonl

Each row: the DLQ position (P:O), when it was dead-lettered, the reason, the source topic[partition]@offset,
the record key and a preview of the mutation(s); 'resubmitted' marks records `dlq replay` already re-sent."""

REPLAY_EPILOG = """\
examples:
  counter dlq replay --reason "unknown namespace"     # after adding the namespace and restarting workers
  counter dlq replay --offset 0:17 --offset 0:18      # just these DLQ positions (P:O, or O on partition 0)
  counter dlq replay --dry-run                        # show what would be re-submitted

Which records can succeed: a re-submitted record gets a new Kafka timestamp, and admission judges the
event time against it. Mutations carrying an idempotency token keep their event time (generation_time), so
one older than the namespace's accept_limit is rejected again ("event_time ... before the record reached
Kafka"): fix those by producing new mutations, not by re-submitting. Undecodable records stay undecodable.
Token-less JSON records take the new record's time and position as their identity, so each re-submission
counts again: progress is kept in <COUNTER_DATA_DIR>/dlq/<dlq topic>.json and a rerun never re-sends a
record it already sent (--force does; harmless for records with tokens, which are idempotent).
Interrupt it (Ctrl-C) at any time and run it again to continue.
Exit status: 0 done, 1 delivery failed, 130 interrupted."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dlq", help="list dead-lettered records, re-submit them after a fix",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  counter dlq list --reason 'unknown namespace'\n"
                              "  counter dlq replay --reason 'unknown namespace'\n"
                              "see `counter dlq list --help` and `counter dlq replay --help`")
    verbs = p.add_subparsers(dest="dlq_verb", metavar="{list,replay}", required=True)

    ls = verbs.add_parser("list", help="show dead letters with their reasons", description=DESCRIPTION,
                          epilog=LIST_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(ls)
    ls.add_argument("--limit", type=int, default=None, help="show at most N (the newest last)")
    ls.add_argument("--format", choices=("table", "jsonl"), default="table",
                    help="table (stdout, one line each) or jsonl (full headers, value as text/hex)")
    ls.set_defaults(run=run_list)

    rp = verbs.add_parser("replay", help="re-submit dead letters to the mutations topic",
                          description=DESCRIPTION, epilog=REPLAY_EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(rp)
    rp.add_argument("--to-topic", help="topic to re-submit to (default COUNTER_MUTATIONS_TOPIC)")
    rp.add_argument("--dry-run", action="store_true", help="list what would be re-submitted; send nothing")
    rp.add_argument("--force", action="store_true", help="also re-send records a previous run already sent")
    rp.set_defaults(run=run_replay)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reason", help="only dead letters whose reason contains this text (case-insensitive)")
    p.add_argument("--offset", action="append", default=[], metavar="P:O",
                   help="only this DLQ position (repeatable; O alone means partition 0)")
    p.add_argument("--topic", help="the DLQ topic (default COUNTER_DLQ_TOPIC, counter-mutations-dlq)")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default COUNTER_KAFKA_BOOTSTRAP or counter up's)")
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR")


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

    def produce_key(self) -> bytes | None:
        """The mutation's own `namespace:counter` key when it decodes (so it lands on its counter's partition)."""
        try:
            ms = decode_mutations(self.value)
        except DecodeError:
            return self.key
        return ms[0].key.encode() if len(ms) == 1 else self.key


def _printable(data: bytes) -> bool:
    try:
        return data[:60].decode().isprintable()
    except UnicodeDecodeError:
        return False


def _positions(values: list[str]) -> set[tuple[int, int]]:
    out = set()
    for v in values:
        p, sep, o = v.partition(":")
        try:
            out.add((int(p), int(o)) if sep else (0, int(p)))
        except ValueError:
            fail(f"--offset: expected P:O or O, got {v!r}")
    return out


def read_dead_letters(bootstrap: str, topic: str, *, quiet_s: float = 1.0, bar: ProgressBar | None = None,
                      stop=lambda: False) -> list[DeadRecord]:
    """Every record of the DLQ topic up to its end when reading started (see PartitionEnds for why the
    reported high watermark alone is not trusted)."""
    try:
        partitions = partition_count(bootstrap, topic)
    except TopicError as exc:
        fail(str(exc), code=1)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "counter-dlq-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "enable.partition.eof": False})
    try:
        ends = PartitionEnds(snapshot_us=time.time_ns() // 1000, margin_us=MICROS, quiet_s=quiet_s)
        assign = []
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends.add(p, start=low, high=high)
            assign.append(TopicPartition(topic, p, low))
        consumer.assign(assign)
        if bar is not None:
            bar.update(total=ends.remaining())
        records: list[DeadRecord] = []
        while not ends.all_done and not stop():
            for m in consumer.consume(1000, 0.5):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(m.error())
                ts_us = m.timestamp()[1] * 1000
                if not ends.accept(m.partition(), m.offset(), ts_us):
                    continue
                records.append(DeadRecord(m.partition(), m.offset(), ts_us, m.key(), m.value() or b"",
                                          parse_headers(m.headers())))
                if bar is not None:
                    bar.update(total=max(bar.total or 0, len(records)))
                    bar.advance(1)
            live = [TopicPartition(topic, p) for p in ends.parts if not ends.done(p)]
            positions = {tp.partition: tp.offset for tp in consumer.position(live) if tp.offset >= 0} if live else {}
            ends.idle(positions)
        return records
    finally:
        consumer.close()


def _select(records: list[DeadRecord], args: argparse.Namespace) -> list[DeadRecord]:
    wanted = _positions(args.offset)
    reason = (args.reason or "").lower()
    return [r for r in records
            if (not wanted or (r.partition, r.offset) in wanted) and (not reason or reason in r.reason.lower())]


def _state_path(settings: Settings, topic: str) -> Path:
    return settings.data_dir / "dlq" / f"{topic}.json"


def _load_sent(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    sent = data.get("resubmitted", {}) if isinstance(data, dict) else {}
    return sent if isinstance(sent, dict) else {}


def _save_sent(path: Path, sent: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"resubmitted": sent}, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def _iso(us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(us / MICROS))


def run_list(args: argparse.Namespace) -> int:
    settings = settings_or_exit(data_dir=args.data_dir)
    bootstrap = resolve_bootstrap(settings, args.bootstrap)
    topic = args.topic or settings.dlq_topic
    with ProgressBar("reading DLQ", unit="records") as bar:
        records = _select(read_dead_letters(bootstrap, topic, bar=bar), args)
    sent = _load_sent(_state_path(settings, topic))
    shown = records[-args.limit:] if args.limit else records
    for r in shown:
        if args.format == "jsonl":
            try:  # JSON mutations as text, anything else (Avro) as hex
                value = {"value_text": r.value.decode("utf-8")}
            except UnicodeDecodeError:
                value = {"value_hex": r.value.hex()}
            print(json.dumps({"position": r.position, "dead_lettered_at": _iso(r.timestamp_us),
                              "reason": r.reason, "source_topic": r.headers.get(SOURCE_TOPIC),
                              "source_partition": _int(r.headers.get(SOURCE_PARTITION)),
                              "source_offset": _int(r.headers.get(SOURCE_OFFSET)),
                              "source_timestamp_us": _int(r.headers.get(SOURCE_TIMESTAMP)),
                              "key": r.key.decode(errors="replace") if r.key is not None else None,
                              "preview": r.preview(200), "resubmitted": sent.get(r.position), **value}))
        else:
            mark = "  [resubmitted]" if r.position in sent else ""
            print(f"{r.position:>8}  {_iso(r.timestamp_us)}  {r.source:32}  {r.preview(60):60}  {r.reason}{mark}")
    kinds: dict[str, int] = {}
    for r in records:
        kinds[r.reason.split(":")[0][:40]] = kinds.get(r.reason.split(":")[0][:40], 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    console.print(f"{len(records):,} dead letter(s) in {topic}" + (f" matching ({summary})" if records else "")
                  + (f"; showing the last {len(shown)}" if len(shown) < len(records) else "")
                  + f"; {sum(1 for r in records if r.position in sent):,} already resubmitted", highlight=False)
    return 0


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def run_replay(args: argparse.Namespace) -> int:
    settings = settings_or_exit(data_dir=args.data_dir)
    bootstrap = resolve_bootstrap(settings, args.bootstrap)
    topic = args.topic or settings.dlq_topic
    target = args.to_topic or settings.mutations_topic
    state_path = _state_path(settings, topic)
    sent = _load_sent(state_path)
    with ProgressBar("reading DLQ", unit="records") as bar:
        records = _select(read_dead_letters(bootstrap, topic, bar=bar), args)
    todo = [r for r in records if args.force or r.position not in sent]
    skipped = len(records) - len(todo)
    if args.dry_run:
        for r in todo:
            print(f"{r.position:>8}  {r.preview(60):60}  {r.reason}")
        console.print(f"dry run: would re-submit {len(todo):,} record(s) to {target}; {skipped:,} already "
                      "resubmitted (--force re-sends them)", highlight=False)
        return 0
    try:
        partitions = partition_count(bootstrap, target)
    except TopicError as exc:
        fail(str(exc), code=1)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "client.id": "counter-dlq-replay"})
    errors: list[str] = []
    interrupted = Interrupt().install()  # SIGINT: finish the unit in hand, then stop (twice: now)
    done = 0
    try:
        with ProgressBar("re-submitting", total=len(todo), unit="records") as bar:
            for start in range(0, len(todo), 100):
                chunk = todo[start:start + 100]
                acked: list[DeadRecord] = []
                for r in chunk:
                    key = r.produce_key()

                    def on_delivery(err: KafkaError | None, _msg: object, r: DeadRecord = r,
                                    acked: list[DeadRecord] = acked) -> None:
                        if err is None:
                            acked.append(r)
                        else:
                            errors.append(f"{r.position}: {err.str()}")

                    kwargs: dict[str, Any] = {"partition": partition_for(key, partitions)} if key else {}
                    producer.produce(target, key=key, value=r.value, on_delivery=on_delivery, **kwargs)
                producer.flush(30)
                now = _iso(time.time_ns() // 1000)
                for r in acked:  # only acknowledged records count as re-submitted
                    sent[r.position] = {"at": now, "to": target, "reason": r.reason}
                _save_sent(state_path, sent)
                done += len(acked)
                bar.advance(len(chunk))
                if errors or interrupted():
                    break
    finally:
        interrupted.restore()
    console.print(f"re-submitted {done:,} dead letter(s) from {topic} to {target} ({bar.summary()}); "
                  f"{skipped:,} skipped as already re-submitted (--force re-sends them)", highlight=False)
    if errors:
        console.print(f"[bold red]{len(errors)} not delivered[/]: {errors[0]}; run again to retry them",
                      highlight=False)
        return 1
    if interrupted():
        console.print("interrupted; run the same command again to continue", highlight=False)
        return 130
    if done:
        console.print("watch them with `counter dlq list`: a record rejected again is dead-lettered again "
                      "(with its new reason)", highlight=False)
    return 0

