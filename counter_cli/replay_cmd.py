"""`counter replay`: re-read a mutations topic through the persist path (the job: `jobs.replay`).

The CLI's part: the arguments, their checks, the progress bar and Ctrl-C (`RichProgress`, `Interrupt`), the
summary and the exit status. Positions and partition ends: `streams.positions`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from confluent_kafka import KafkaException

from control_plane import ConfigError
from counter_cli.common import (
    add_verb,
    console,
    fail,
    job_settings,
    kafka_failure,
    resolve_bootstrap,
    settings_or_exit,
)
from counter_cli.progress import Interrupt, RichProgress
from jobs.replay import ReplayError, ReplayOptions, ReplayResult, run_replay
from streams.positions import parse_position
from streams.settings import SettingsError
from streams.topics import TopicError

DESCRIPTION = """\
Re-read the mutations topic (or --topic, e.g. a copy restored from a backup) with the replay's own consumer
group and feed every record through the same persist path as the worker: decode, admission, idempotent event
write, last_write_ts, rollup signal. Idempotency makes any replay safe: what is already stored is stored
once, so counts never grow from replaying it; events missing from the store (lost, deleted) are restored.

Admission judges each event against its record's own Kafka timestamp, exactly as the first time, so a
replay admits and rejects the same mutations (rejections are summarised, not re-dead-lettered unless
--dead-letter). Touched counters are signalled to the rollups topic so a running worker rolls them up. A
restored event older than the immutable-window boundary may lie inside a window that was already rolled
up, where rollups never look again: the replay recounts those counters itself at the end (the same logic
as `counter recount`), so restored counts are exact.

Interrupt it (Ctrl-C) at any time: the current batch is finished (or, on a second Ctrl-C, abandoned:
re-processing it is harmless), offsets are committed to the consumer group after every persisted batch,
and running the same command again resumes where it stopped (--restart starts over). A finished replay
run again without --from replays only what arrived since; with --from it starts a new replay, reading
from there again (other options than the finished run's need --from)."""

EPILOG = """\
examples:
  counter replay --from earliest                          # the whole counter-mutations topic
  counter replay --from 2024-10-05T14:00:00Z --to 2024-10-05T15:00:00Z --namespace my_dataset
  counter replay --from 0:1200,3:88 --counter counter123 --namespace my_dataset
  counter replay --topic counter-mutations-restored --from earliest --name restore-2024-10-05
  counter replay --from earliest --restart                # forget saved progress, start over

positions:
  --from earliest | ISO-8601 time (records appended at or after it) | P:O[,P:O...] (partition:offset;
         partitions not listed are not replayed)
  --to   ISO-8601 time (stop at the first record appended after it) | P:O[,P:O...] (stop before offset O;
         partitions not listed are read to their end). Default: the end of each partition when the
         replay starts.

Token-less JSON records are identified by their Kafka position (topic, partition, offset): replay them
from the topic they were first consumed from (or pass --as-topic with that name) and from identical
offsets, or they count again. Every other mutation carries its idempotency token and is always safe.
Progress state: the consumer group --name (offsets) and <COUNTER_DATA_DIR>/replay/<name>.json.
Exit status: 0 done, 1 error, 130 interrupted (run again to resume)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="start", default=None, metavar="POS",
                   help="earliest | ISO time | P:O,... (required unless resuming a replay of the same --name)")
    p.add_argument("--to", dest="end", default=None, metavar="POS",
                   help="ISO time | P:O,... (default: each partition's end when the replay starts)")
    p.add_argument("--topic", help="topic to read (default COUNTER_MUTATIONS_TOPIC, counter-mutations)")
    p.add_argument("--namespace", help="replay only this namespace's mutations")
    p.add_argument("--counter", action="append", default=[], metavar="C",
                   help="replay only this counter (repeatable; needs --namespace)")
    p.add_argument("--name", help="replay name = consumer group keeping its progress (default replay-<topic>)")
    p.add_argument("--restart", action="store_true", help="ignore saved progress of --name and start at --from")
    p.add_argument("--as-topic", metavar="TOPIC",
                   help="topic name used in the identity of token-less JSON records (default: --topic)")
    p.add_argument("--dead-letter", action="store_true",
                   help="send rejected records to the DLQ again (default: only count them; the worker "
                        "dead-lettered them when it first read them)")
    p.add_argument("--batch-size", type=int, default=2000, help="records per persisted batch (default 2000)")
    p.add_argument("--no-recount", action="store_true",
                   help="do not recount counters whose restored events lie in rolled-up windows; list them")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default COUNTER_KAFKA_BOOTSTRAP or counter up's)")
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR")


def register(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "replay", help="re-read a mutations topic through the persist path (safe: idempotent)",
             description=DESCRIPTION, epilog=EPILOG,
             add_arguments=add_arguments, run=run)


def check(args: argparse.Namespace) -> None:
    """Argument errors the CLI reports before starting anything."""
    if args.counter and not args.namespace:
        fail("--counter needs --namespace")
    if args.dead_letter and (args.namespace or args.counter):
        fail("--dead-letter replays every rejection; it cannot be combined with --namespace/--counter")
    if args.batch_size < 1:
        fail("--batch-size must be >= 1")
    for flag, value in (("--from", args.start), ("--to", args.end)):
        if value is not None:
            try:
                parse_position(value, allow_earliest=flag == "--from")
            except ValueError as exc:
                fail(f"{flag}: {exc}")


def options(args: argparse.Namespace) -> ReplayOptions:
    return ReplayOptions(start=args.start, end=args.end, topic=args.topic, namespace=args.namespace,
                         counters=tuple(args.counter), name=args.name, restart=args.restart,
                         as_topic=args.as_topic, dead_letter=args.dead_letter, batch_size=args.batch_size,
                         recount=not args.no_recount)


def run(args: argparse.Namespace) -> int:
    check(args)
    bootstrap = resolve_bootstrap(settings_or_exit(data_dir=args.data_dir), args.bootstrap)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    progress = RichProgress(console)
    try:
        settings = job_settings(bootstrap, args.data_dir)
        # SIGINT: finish the batch in hand, save, return (twice: abandon the batch; a rerun resumes either way)
        with Interrupt() as stop, progress:
            result = asyncio.run(run_replay(options(args), settings, progress=progress, stop=stop))
    except ReplayError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2
    except (SettingsError, ConfigError, TopicError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KafkaException as exc:
        print(f"error: {kafka_failure(exc, bootstrap)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    return report(result, progress.summary(), as_json=args.json)


def report(r: ReplayResult, speed: str, *, as_json: bool) -> int:
    """The summary on stderr (and with --json one object on stdout); returns the exit status."""
    t, c = r.totals, console
    c.print(f"replay {r.name!r} of {r.topic}: {speed}", highlight=False)
    c.print(f"  records {t['records']:,} (heartbeats {t['heartbeats']:,}, before --from {t['before_from']:,}); "
            f"events {t['events']:,}: {t['new']:,} new ({t['restored']:,} in rolled-up windows), the rest "
            f"already stored", highlight=False)
    if t["rejected"]:
        kinds = ", ".join(f"{n:,} {k}" for k, n in r.rejected.most_common())
        sent = "sent to the DLQ again" if r.dead_lettered else "not re-dead-lettered (--dead-letter)"
        c.print(f"  rejected {t['rejected']:,} mutation(s) as the first time ({kinds}); {sent}", highlight=False)
    if t["resent_by_dlq"]:
        c.print(f"  left out {t['resent_by_dlq']:,} token-less mutation(s) `counter dlq replay` re-sent as new "
                "writes (counted as those)", highlight=False)
    c.print(f"  {r.touched:,} counter(s) signalled for rollup; {t['recount_checked']:,} recounted, "
            f"{t['recounted']:,} of them rewritten (drift fixed on {t['drift_fixed']:,})", highlight=False)
    if r.recount_pending and r.finished:
        names = ", ".join(f"{ns}:{counter}" for ns, counter in r.recount_pending[:10])
        how = "--no-recount was given" if r.recount_skipped else "the watermark did not pass their rollup"
        c.print(f"[yellow]  {len(r.recount_pending):,} counter(s) still need a recount ({how}): {names}; run "
                "`counter recount` for them, or this replay again[/]", highlight=False)
    if as_json:
        sys.stdout.write(json.dumps(r.as_json()) + "\n")
        sys.stdout.flush()
    if not r.finished:
        at = ", ".join(f"{p}:{o}" for p, o in sorted(r.positions.items()))
        c.print(f"interrupted at {at or '-'}; run the same command again to resume", highlight=False)
        return 130
    return 1 if r.recount_pending and not r.recount_skipped else 0
