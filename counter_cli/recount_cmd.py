"""`counter recount`: recompute rollups from the event store (the job: `jobs.recount`)."""

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
    existing_store_or_fail,
    fail,
    job_settings,
    kafka_failure,
    resolve_bootstrap,
    settings_or_exit,
)
from counter_cli.progress import Interrupt, RichProgress
from jobs.recount import RETRY, CounterRecount, RecountError, RecountJob, RecountOptions, RecountSummary, rfc3339
from jobs.runtime import open_runtime
from jobs.state import Busy, exclusive, lock_beside
from schemas import ValidationError, parse_generation_time
from streams.settings import Settings, SettingsError
from streams.topics import TopicError

DESCRIPTION = """\
Recompute counters from their stored events and compare with the stored rollups. Per counter it reports
the stored value, the recomputed value and the drift (stored minus recomputed, both at the stored rollup's
own boundary, so in-flight events never show up as drift; a missing rollup row counts as drift of the
whole value). Unless --dry-run, it writes the recomputed rollup and refreshes the cache.

It respects the immutable-window rule like every rollup: the new boundary B stays behind both the accept
window (now - max_clock_skew - accept_limit) and the persist watermark of every mutations partition, so
no event can still arrive at or before B, and rollups only move forward (B must be later than the stored
rollup_ts). When the watermark has not moved past the stored rollup yet (no worker running, or it just
rolled the counter up), the recount waits up to --wait seconds for it, then reports the counter as
'behind' (run it again once a worker is running).

From zero (the default) it reads all of a counter's events. Events dropped by retention (older than
delete_after, once rolled up) are gone, so recount such counters with --since: events at or before TIME
are not read, and the count at TIME is taken from the stored rollup (its count minus the stored events in
(TIME, rollup_ts]); drift is then only found where a clear lies after TIME.

Time buckets (namespaces that keep windows): each counter's minute/hour/day buckets are recomputed from the
events still held, within each granularity's retention, exactly as the worker computes them, and compared with
the stored ones as they read (masked by the latest clear, 0 when missing) at the stored rollup's boundary; every
bucket that differs is reported (granularity, start, stored, recomputed). Unless --dry-run they are rewritten at
the new boundary B (forward-only: B is later than every bucket the stored rollup certifies), before the rollup.
Buckets fed by events older than delete_after (or by finer buckets past their retention) are left as stored:
recomputing them from what is left would write partial sums. With --since, buckets are recomputed from the
events after TIME; the hours and days holding TIME are summed from the buckets stored before it.

Interrupt it (Ctrl-C) at any time; running the same command again resumes after the last counter done
(--restart starts over). Recounting twice is harmless."""

EPILOG = """\
examples:
  counter recount my_dataset --all --dry-run              # report drift of every counter, change nothing
  counter recount my_dataset --all                        # fix every counter (rollup store and cache)
  counter recount my_dataset counter123 counter456        # just these
  counter recount my_dataset --all --since 2024-10-05T00:00:00Z --format jsonl > drift.jsonl

jsonl rows: {"namespace", "counter", "stored", "stored_rollup_ts", "recomputed", "boundary", "drift",
             "status": ok|drift|missing|no-base|unknown, "action": dry-run|written|unchanged|behind|raced,
             "count", "rollup_ts", "buckets_checked",
             "buckets": [{"granularity": minute|hour|day, "start": RFC 3339, "start_us", "stored", "recomputed",
                          "action": dry-run|written|behind|raced}, ...]}   (drifted buckets only)
Exit status: 0 done (drift found and fixed, or reported with --dry-run), 1 some counter could not be
written (behind/raced: run again), 2 bad arguments, 130 interrupted (run again to resume)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("namespace", metavar="NAMESPACE")
    p.add_argument("counters", nargs="*", metavar="COUNTER", help="counters to recount (or --all)")
    p.add_argument("--all", action="store_true", help="every counter of the namespace that has stored events")
    p.add_argument("--dry-run", action="store_true", help="report only; write nothing")
    p.add_argument("--since", metavar="TIME", help="ISO time: do not read events at or before it (see above)")
    p.add_argument("--format", choices=("table", "jsonl"), default="table",
                   help="table (stderr: counters with drift, then a summary) or jsonl (stdout: every counter)")
    p.add_argument("--verbose", action="store_true",
                   help="table: list every counter, not only drifted ones, and every drifted bucket")
    p.add_argument("--wait", type=float, default=10.0, metavar="S",
                   help="how long to wait for the watermark to pass a stored rollup (default 10)")
    p.add_argument("--restart", action="store_true", help="ignore the progress of an interrupted run")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default COUNTER_KAFKA_BOOTSTRAP or counter up's)")
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR")


def register(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "recount", help="recompute rollups from the event store; report and fix drift",
             description=DESCRIPTION, epilog=EPILOG,
             add_arguments=add_arguments, run=run)


def check(args: argparse.Namespace) -> None:
    if args.all and args.counters:
        fail("give COUNTER names or --all, not both")
    if not args.all and not args.counters:
        fail("give COUNTER names, or --all for every counter of the namespace")
    if not 0 <= args.wait <= 3600:  # nan fails both comparisons; inf would wait forever for a counter behind
        fail(f"--wait must be 0 to 3600 seconds, got {args.wait}")
    if args.since is not None:
        try:
            parse_generation_time(args.since, field="--since")
        except ValidationError as exc:
            fail(str(exc))


def options(args: argparse.Namespace) -> RecountOptions:
    return RecountOptions(args.namespace, counters=tuple(args.counters), all=args.all, since=args.since,
                          dry_run=args.dry_run, wait_s=args.wait, restart=args.restart)


def run(args: argparse.Namespace) -> int:
    check(args)
    bootstrap = resolve_bootstrap(settings_or_exit(data_dir=args.data_dir), args.bootstrap)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    progress = RichProgress(console)
    try:
        settings = job_settings(bootstrap, args.data_dir)
        existing_store_or_fail(settings, " (a recount corrects a store: it makes none; `counter replay` rebuilds one)")
        with Interrupt() as stop, progress:  # SIGINT: save after the counter in hand and stop (twice: now)
            summary = asyncio.run(_recount(options(args), settings, Rows(args.format, args.verbose), progress, stop))
    except RecountError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2
    except (SettingsError, ConfigError, TopicError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KafkaException as exc:  # the broker (the persist watermark's partition count) cannot be reached
        print(f"error: {kafka_failure(exc, bootstrap)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    if summary.interrupted:
        console.print(f"interrupted after counter {summary.after!r} ({progress.summary()}); run the same command "
                      "again to resume", highlight=False)
        return 130
    _summary(summary, args.dry_run, progress.summary())
    return 1 if summary.not_written else 0


async def _recount(opts: RecountOptions, settings: Settings, rows: Rows, progress: RichProgress,
                   stop: Interrupt) -> RecountSummary:
    """The job, holding its state file's lock: two identical runs shared one progress file, and the first to end
    deleted it, so an interrupted second could not resume (a review)."""
    state = opts.state_path(settings.data_dir)
    lock = lock_beside(state)
    try:
        with exclusive(lock):
            runtime = open_runtime(settings)
            try:
                return await RecountJob(opts, runtime, report=rows, progress=progress, stop=stop).run()
            finally:
                await runtime.close()
    except Busy:
        raise RecountError(f"the same recount is running already (lock {lock}); wait for it, or stop it and run "
                           "this one again to resume") from None


class Rows:
    """Per-counter output: table rows on stderr (drifted or not written yet; all with --verbose), each followed by
    its drifted buckets (the first BUCKETS_SHOWN; all with --verbose), or JSONL on stdout (every counter)."""

    BUCKETS_SHOWN = 20

    def __init__(self, fmt: str, verbose: bool) -> None:
        self.fmt = fmt
        self.verbose = verbose

    def __call__(self, r: CounterRecount) -> None:
        if self.fmt == "jsonl":
            sys.stdout.write(json.dumps(r.as_json()) + "\n")
            sys.stdout.flush()
        elif self.verbose or r.status != "ok" or r.action in RETRY or r.buckets:
            stored = "-" if r.stored is None else f"{r.stored:,}"
            recomputed = "-" if r.recomputed is None else f"{r.recomputed:,}"
            console.print(f"  {r.counter:30} stored {stored:>12}  recomputed {recomputed:>12}  "
                          f"drift {r.drift:>+10,}  {r.status:8} {r.action}", highlight=False, markup=False)
            shown = r.buckets if self.verbose else r.buckets[:self.BUCKETS_SHOWN]
            for b in shown:
                console.print(f"    {b.granularity:6} {rfc3339(b.start_us)}  stored {b.stored:>12,}  recomputed "
                              f"{b.recomputed:>12,}  drift {b.stored - b.recomputed:>+10,}  {b.action}",
                              highlight=False, markup=False)
            if len(r.buckets) > len(shown):
                console.print(f"    ... and {len(r.buckets) - len(shown):,} more drifted bucket(s) (--verbose or "
                              "--format jsonl lists them all)", highlight=False, markup=False)


def _summary(s: RecountSummary, dry_run: bool, speed: str) -> None:
    console.print(f"recounted {speed}: {s.count('ok'):,} ok, "
                  f"{s.count('drift'):,} drifted, {s.count('missing'):,} missing a rollup row, "
                  f"{s.count('no-base'):,} without a stored rollup at --since; total |drift| "
                  f"{s.count('abs_drift'):,}", highlight=False)
    if s.count("unknown"):
        console.print(f"{s.count('unknown'):,} counter(s) have neither a rollup nor an event (a misspelled name?): "
                      "nothing to recount", highlight=False)
    if s.count("buckets_checked") or s.bucket_drift:
        fixed = "" if dry_run else f", {s.count('buckets_written'):,} rewritten"
        console.print(f"time buckets: {s.count('buckets_checked'):,} checked, {s.bucket_drift:,} drifted in "
                      f"{s.count('bucket_drift_counters'):,} counter(s){fixed}", highlight=False)
    if dry_run:
        todo = [f"{n:,} {what}" for n, what in ((s.drifted, "counter(s)"), (s.bucket_drift, "bucket(s)")) if n]
        console.print("dry run: nothing written" + (f"; run without --dry-run to fix {' and '.join(todo)}"
                                                    if todo else ""), highlight=False)
        return
    console.print(f"written {s.count('action:written'):,}, unchanged {s.count('action:unchanged'):,}; "
                  f"{s.cache_note}", highlight=False)
    if s.not_written:
        console.print(f"[yellow]{s.not_written:,} counter(s) could not be written yet[/]: the persist watermark has "
                      "not passed their stored rollup (is a worker running?) or a rollup raced; run again",
                      highlight=False)
