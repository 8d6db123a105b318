"""`counter dlq list|replay`: inspect dead-lettered records and re-submit them after their cause is fixed
(the job: `jobs.dlq`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaException

from control_plane import NamespaceRegistry
from counter_cli.common import (
    console,
    fail,
    kafka_failure,
    namespaces_or_exit,
    resolve_bootstrap,
    stack_settings_or_exit,
)
from counter_cli.progress import Interrupt, RichProgress
from jobs.dlq import (
    InFlightUnknown,
    SentLog,
    iso,
    pending,
    read_dead_letters,
    recover_in_flight,
    refusal,
    resubmit,
    select,
    state_path,
    stored_originals,
)
from jobs.state import Busy, exclusive, lock_beside
from schemas.dead_letter import (
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    TRUNCATED,
    WHOLE_RECORD,
    DeadRecord,
)
from streams.settings import Settings
from streams.topics import TopicError

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
Kafka"): recover those with `counter replay --from <a time before them> --namespace <ns>`, which re-reads the
original records (while the broker holds them) and judges each by when it first reached Kafka, or by producing new
mutations; not by re-submitting. Undecodable records stay undecodable.
Token-less JSON records, and token-less items of a JSON array (dead-lettered alone, as JSON), take the new
record's time and position as their identity, so each re-submission counts again: progress is kept in
<COUNTER_DATA_DIR>/dlq/<dlq topic>.json and a rerun never re-sends a record it already sent (--force does;
harmless for records with tokens, which are idempotent). A record is known by its source (topic, partition,
offset, time) and bytes, not its DLQ position: of several dead letters of one source mutation only one is
re-submitted, and a new dead letter at a DLQ position a restarted local broker reused is not taken for an old
one.
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
    ls.add_argument("--limit", type=int, default=None, help="show only the newest N (the newest last; 0: all)")
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
    rp.add_argument("--in-flight", choices=("sent", "unsent"), default=None,
                    help="when a stopped run left a chunk in flight and the target topic can no longer tell which of "
                         "it was sent (retention deleted it, the topic is gone): take all of it as sent (those never "
                         "sent are not counted) or as unsent (re-sent: a token-less one sent already counts twice)")
    rp.set_defaults(run=run_replay)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reason", help="only dead letters whose reason contains this text (case-insensitive)")
    p.add_argument("--offset", action="append", default=[], metavar="P:O",
                   help="only this DLQ position (repeatable; O alone means partition 0)")
    p.add_argument("--topic", help="the DLQ topic (default COUNTER_DLQ_TOPIC, counter-mutations-dlq)")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default COUNTER_KAFKA_BOOTSTRAP or counter up's)")
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR")


def _positions(values: list[str]) -> set[tuple[int, int]]:
    out = set()
    for v in values:
        p, sep, o = v.partition(":")
        try:
            out.add((int(p), int(o)) if sep else (0, int(p)))
        except ValueError:
            fail(f"--offset: expected P:O or O, got {v!r}")
    return out


def _read(args: argparse.Namespace, settings: Settings, bootstrap: str, topic: str) -> list[DeadRecord]:
    """The dead letters the arguments select, read with a progress bar."""
    positions = _positions(args.offset)
    try:
        with RichProgress(console) as progress:
            records = read_dead_letters(bootstrap, topic, progress=progress,
                                        security=settings.kafka_security.librdkafka())
    except TopicError as exc:
        fail(str(exc), code=1)
    except KafkaException as exc:
        fail(kafka_failure(exc, bootstrap), code=1)
    except KeyboardInterrupt:  # a traceback before (a review)
        console.print(f"interrupted while reading {topic}: nothing was sent or recorded", highlight=False)
        raise SystemExit(130) from None
    return select(records, reason=args.reason, positions=positions)


def run_list(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        fail("--limit must be >= 0 (0 shows all)")
    settings = stack_settings_or_exit(data_dir=args.data_dir)
    bootstrap = resolve_bootstrap(settings, args.bootstrap)
    topic = args.topic or settings.dlq_topic
    records = _read(args, settings, bootstrap, topic)
    sent = SentLog(state_path(settings, topic))
    shown = records[-args.limit:] if args.limit else records
    for r in shown:
        if args.format == "jsonl":
            try:  # JSON mutations as text, anything else (Avro) as hex
                value = {"value_text": r.value.decode("utf-8")}
            except UnicodeDecodeError:
                value = {"value_hex": r.value.hex()}
            print(json.dumps({"position": r.position, "dead_lettered_at": iso(r.timestamp_us),
                              "reason": r.reason, "source_topic": r.headers.get(SOURCE_TOPIC),
                              "source_partition": _int(r.headers.get(SOURCE_PARTITION)),
                              "source_offset": _int(r.headers.get(SOURCE_OFFSET)),
                              "source_timestamp_us": _int(r.headers.get(SOURCE_TIMESTAMP)),
                              "key": r.key.decode(errors="replace") if r.key is not None else None,
                              "preview": r.preview(200), "resubmitted": sent.get(r), **value}))
        else:
            mark = "  [resubmitted]" if r in sent else ""
            print(f"{r.position:>8}  {iso(r.timestamp_us)}  {r.source:32}  {r.preview(60):60}  {r.reason}{mark}")
    summary = _summary(records)
    console.print(f"{len(records):,} dead letter(s) in {topic}" + (f" matching ({summary})" if records else "")
                  + (f"; showing the last {len(shown)}" if len(shown) < len(records) else "")
                  + f"; {sum(1 for r in records if r in sent):,} already resubmitted", highlight=False)
    return 0


_TIME = re.compile(r"\d{4}-\d\d-\d\d[Tt ][\d:.]+(?:[Zz]|[-+]\d\d:?\d\d)?")
_ASIDE = re.compile(r"\s*\([^()]*\)")
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
_QUOTED = re.compile(r"('[^']*')")  # split keeps them: odd parts are the quoted names
KINDS_SHOWN = 5


def reason_kind(reason: str) -> str:
    """What a dead letter's reason says without its particulars: its first clause (up to ';', or to ': ' after a
    leading "field 'x'" or an exception's name) without asides in parentheses, every time written T and every
    number N. The DLQ records carry the reason as text only, and an admission reason names the event time and its
    distance to the record's time, so grouping by the text split every rejected generation time into a kind of
    its own."""
    head = reason.split(";", 1)[0]
    first, sep, _ = head.partition(": ")
    if sep and (first.startswith("field ") or first.isidentifier() or first == "undecodable record"):
        head = first
    # numbers in quoted names stay: namespace 'ns2' is not namespace 'nsN'
    kind = "".join(part if i % 2 else _NUMBER.sub("N", _TIME.sub("T", part))
                   for i, part in enumerate(_QUOTED.split(_ASIDE.sub("", head)))).strip() or "?"
    return kind if len(kind) <= 80 else kind[:79] + "…"


def _summary(records: list[DeadRecord]) -> str:
    """The dead letters counted by reason kind, the most frequent first (the first few, then how many more)."""
    kinds = Counter(reason_kind(r.reason) for r in records)
    ranked = kinds.most_common()
    shown = ", ".join(f"{n:,} {kind}" for kind, n in ranked[:KINDS_SHOWN])
    rest = sum(n for _, n in ranked[KINDS_SHOWN:])
    return shown + (f", {rest:,} of {len(ranked) - KINDS_SHOWN} other kind(s)" if rest else "")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _leave_out(records: list[DeadRecord], excluded: Callable[[DeadRecord], bool],
               said: Callable[[int, DeadRecord], str]) -> list[DeadRecord]:
    """`records` less the `excluded` ones, saying how many and why (`said(count, first)`) when there are any."""
    out = [r for r in records if not excluded(r)]
    if len(out) < len(records):
        first = next(r for r in records if excluded(r))
        console.print(said(len(records) - len(out), first), highlight=False)
    return out


def _recover(args: argparse.Namespace, bootstrap: str, state: Path, settings: Settings) -> None:
    """Settle the chunk a stopped run left in flight (`jobs.dlq.recover_in_flight`), saying what it found; by
    --in-flight when the topic cannot tell."""
    log = SentLog(state)
    flight = log.in_flight
    if not flight:
        return
    if args.dry_run:
        console.print(f"a stopped run left {len(flight.get('entries') or {}):,} record(s) in flight: a run (not this "
                      "dry run) first looks for them in the topic", highlight=False)
        return
    try:
        with RichProgress(console) as progress:
            found = recover_in_flight(bootstrap, state, progress=progress,
                                      security=settings.kafka_security.librdkafka())
    except InFlightUnknown as exc:
        if args.in_flight is None:
            fail(f"{exc}: which of a stopped run's last chunk was sent cannot be known; run again with --in-flight "
                 "sent (take them all as sent: any never sent is not counted) or --in-flight unsent (re-send them: "
                 "a token-less one that was sent counts twice)", code=1)
        held = log.assume(args.in_flight == "sent")
        log.save()
        console.print(f"{held:,} record(s) a stopped run left in flight taken as {args.in_flight} (--in-flight)",
                      highlight=False)
        return
    except KafkaException as exc:
        fail(kafka_failure(exc, bootstrap), code=1)
    left = len(flight.get("entries") or {}) - (found or 0)
    console.print(f"a stopped run left {found or 0:,} record(s) sent and {left:,} not sent in its last chunk: "
                  "recorded, so none is sent twice", highlight=False)


def run_replay(args: argparse.Namespace) -> int:
    settings = stack_settings_or_exit(data_dir=args.data_dir)
    state = state_path(settings, args.topic or settings.dlq_topic)
    try:
        with exclusive(lock_beside(state)):  # two runs would both send what neither recorded
            return _replay(args, settings, state)
    except Busy:
        fail(f"another `counter dlq replay` of this DLQ is running (it holds {state}.lock): wait for it to end",
             code=1)


def _to_resubmit(args: argparse.Namespace, settings: Settings, state: Path, bootstrap: str,
                 records: list[DeadRecord]) -> tuple[list[DeadRecord], int, NamespaceRegistry]:
    """The dead letters to re-submit, after settling a stopped run's chunk in flight and leaving out (saying so)
    those that must not be sent; how many were sent before; and the namespaces."""
    _recover(args, bootstrap, state, settings)
    todo, skipped, duplicates = pending(records, SentLog(state), force=args.force)
    if duplicates:
        console.print(f"{duplicates:,} dead letter(s) repeat a source mutation of another one (dead-lettered twice): "
                      "each source mutation is re-submitted once", highlight=False)
    # Only the start of their value is here: sent on, it would be dead-lettered again as undecodable.
    todo = _leave_out(todo, lambda r: TRUNCATED in r.headers, lambda n, r: (
        f"{n:,} dead letter(s) too large for the DLQ hold only the start of their record (first: {r.position}, from "
        f"{r.source}); not re-submitted: the whole record is at that source position"))
    # The rejected mutation could not be encoded alone: its record's other mutations were counted.
    todo = _leave_out(todo, lambda r: WHOLE_RECORD in r.headers, lambda n, r: (
        f"{n:,} dead letter(s) hold the whole batch record of a mutation that could not be encoded alone (first: "
        f"{r.position}, mutation {r.headers[WHOLE_RECORD]} of the record at {r.source}); not re-submitted: its other "
        "mutations were counted, and re-sent they would count again"))
    # A heartbeat refused for its timestamp, or a record that came empty: re-sent without its headers, it would be
    # an empty record, dead-lettered again, and a heartbeat re-sent with them would be refused again.
    todo = _leave_out(todo, lambda r: not r.value, lambda n, r: (
        f"{n:,} dead letter(s) carry no mutation (first: {r.position}, from {r.source}: {r.reason}); not "
        "re-submitted: there is nothing in them to count"))
    _, registry = namespaces_or_exit(settings)  # re-submitted mutations are keyed as producers key them
    refusals = {r.identity: why for r in todo if (why := refusal(r, registry)) is not None}
    todo = _leave_out(todo, lambda r: r.identity in refusals, lambda n, r: (
        f"{n:,} dead letter(s) the namespaces still refuse (first: {r.position}, {refusals[r.identity]}); not "
        "re-submitted: they would be dead-lettered again. Fix the cause first (the namespace file, "
        "COUNTER_NAMESPACES), then run again"))
    # A token-less one whose source record a `counter replay` stored since is counted: re-sent, it would count again.
    try:
        counted = asyncio.run(stored_originals(settings, registry, todo))
    except Exception as exc:  # the store away: re-sending unchecked could count a token-less write twice
        fail(f"cannot read the event store ({type(exc).__name__}: {exc}): `counter dlq replay` asks it whether a "
             "replay stored a token-less dead letter's mutation before re-sending it; run again once it answers",
             code=1)
    todo = _leave_out(todo, lambda r: r.identity in counted, lambda n, r: (
        f"{n:,} token-less dead letter(s) are counted already: a `counter replay` stored their source record's "
        f"mutation since (first: {r.position}, from {r.source}); not re-submitted: re-sent, they would count again"))
    return todo, skipped, registry


def _replay(args: argparse.Namespace, settings: Settings, state: Path) -> int:
    bootstrap = resolve_bootstrap(settings, args.bootstrap)
    topic = args.topic or settings.dlq_topic
    target = args.to_topic or settings.mutations_topic
    records = _read(args, settings, bootstrap, topic)
    try:
        todo, skipped, registry = _to_resubmit(args, settings, state, bootstrap, records)
    except KeyboardInterrupt:  # before sending: a traceback before (a review)
        console.print("interrupted before any dead letter was re-submitted: nothing was sent", highlight=False)
        return 130
    if args.dry_run:
        for r in todo:
            print(f"{r.position:>8}  {r.preview(60):60}  {r.reason}")
        console.print(f"dry run: would re-submit {len(todo):,} record(s) to {target}; {skipped:,} already "
                      "resubmitted (--force re-sends them)", highlight=False)
        return 0
    progress = RichProgress(console)
    try:
        with Interrupt() as stop, progress:  # SIGINT: finish the chunk in hand, then stop (twice: now)
            result = resubmit(bootstrap, target, todo, state=state, force=args.force, progress=progress, stop=stop,
                              security=settings.kafka_security.librdkafka(),
                              shards=registry.shard_counts())
    except TopicError as exc:
        fail(str(exc), code=1)
    except KafkaException as exc:
        fail(kafka_failure(exc, bootstrap), code=1)
    console.print(f"re-submitted {result.done:,} dead letter(s) from {topic} to {target} ({progress.summary()}); "
                  f"{skipped:,} skipped as already re-submitted (--force re-sends them)", highlight=False)
    if result.errors:
        console.print(f"[bold red]{len(result.errors)} not delivered[/]: {result.errors[0]}; run again to retry "
                      "them", highlight=False)
        return 1
    if result.interrupted:
        console.print("interrupted; run the same command again to continue", highlight=False)
        return 130
    if result.done:
        console.print("watch them with `counter dlq list`: a record rejected again is dead-lettered again "
                      "(with its new reason)", highlight=False)
    return 0
