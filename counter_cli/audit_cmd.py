"""`counter audit`: export the individual increments and clears that make up a count, or with --by its time
buckets (the jobs: `jobs.audit`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import IO, Any, TypeVar

from control_plane import CounterType, NamespaceRegistry
from counter_cli.common import console, existing_store_or_fail, fail, namespaces_or_exit, stack_settings_or_exit
from counter_cli.progress import Interrupt, RichProgress
from jobs.audit import (
    SERIES_FIELDS,
    AuditOptions,
    RowWriter,
    SeriesOptions,
    SeriesResult,
    export_format,
    iso,
    run_audit,
    run_series_audit,
)
from schemas import MAX_EVENT_TIME, ValidationError, parse_generation_time
from sinks.windows import CHAIN, Granularity, WindowError
from streams.settings import Settings

DESCRIPTION = """\
Export the events that make up a counter, oldest first: every increment (positive or negative delta) and
every clear, with its event time, idempotency token and item key, and the running total after it. The last
running total is the count over the exported range; the summary also checks it against the stored rollup.

Clear semantics are the rollups': a clear resets the total to 0 and wins ties, so an increment with exactly
the same event time as a clear is listed (counted=false) but not counted. With --from, the running total
starts at the count just before --from (computed from the store), so it always equals the real count.
Token-less JSON mutations show their Kafka position as token (kafka:<topic>:<partition>:<offset>:<index>).

Rows go to stdout (or --output FILE). Interrupt it (Ctrl-C) at any time; with --output, run the same command
again with --resume (and the same --format) to continue: the rows of the last event time in the file are
exported again, whole (a second Ctrl-C may have cut their group short; a torn last line is dropped).

With --by minute|hour|day it prints the counter's time buckets instead, as GetCountSeries answers them: one row
per bucket of the range [--from, --to) (edges aligned outwards to whole buckets; default: from the first stored
bucket within the granularity's retention to now), zero-filled, masked by the latest clear, with the running
total, then the total and as_of (the boundary the buckets are exact up to). When the range holds every bucket
since the latest clear (or, for a granularity kept forever, since the counter's first bucket) up to the stored
rollup, the total is checked against it (since the last clear, a counter's buckets sum to its total)."""

EPILOG = """\
examples:
  counter audit my_dataset counter123                          # JSONL on stdout
  counter audit my_dataset counter123 --format csv --output counter123.csv
  counter audit my_dataset counter123 --from 2024-10-05T14:00:00Z --to 2024-10-05T15:00:00Z
  counter audit my_dataset counter123 --output audit.jsonl --resume   # after an interrupted export
  counter audit my_dataset counter123 --by hour --format table        # hourly counts with the running total
  counter audit my_dataset counter123 --by minute --from 2024-10-05T14:00:00Z --to 2024-10-05T15:00:00Z --format csv

jsonl row: {"event_time": "2024-10-05T14:48:00.000000Z", "event_time_us": 1728139680000000, "op": "add",
            "token": "some_event_id", "item_key": "", "delta": 2, "counted": true, "running_total": 2}
csv columns: event_time,event_time_us,op,token,item_key,delta,counted,running_total
--by jsonl row: {"bucket_start": "2024-10-05T14:00:00Z", "bucket_start_us": 1728136800000000,
                 "granularity": "hour", "count": 12, "running_total": 40}
--by csv columns: bucket_start,bucket_start_us,granularity,count,running_total
--by json: {"namespace", "counter", "granularity", "from", "to", "buckets": [rows], "total", "as_of",
            "stored_rollup": {"count", "rollup_ts"} or null, "matches": true|false|null, "not_compared": reason}
--by table: one line per bucket, then the total and as_of
Exit status: 0 done, 1 the audit total disagrees with the stored rollup, 2 bad arguments, 130 interrupted."""

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="export a counter's increments and clears with the running total",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("namespace", metavar="NAMESPACE")
    p.add_argument("counter", metavar="COUNTER")
    p.add_argument("--from", dest="start", metavar="TIME",
                   help="first event time (ISO-8601 or epoch), inclusive; with --by: start of the range")
    p.add_argument("--to", dest="end", metavar="TIME",
                   help="last event time (ISO-8601 or epoch), inclusive; with --by: end of the range, exclusive")
    p.add_argument("--by", choices=[g.value for g in CHAIN],
                   help="print the counter's time buckets of this granularity instead of its events")
    p.add_argument("--format", choices=("jsonl", "csv", "json", "table"), default="jsonl",
                   help="row format (default jsonl); json and table only with --by")
    p.add_argument("--output", type=Path, help="write rows to FILE instead of stdout")
    p.add_argument("--resume", action="store_true", help="continue an interrupted export into --output")
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR")
    p.set_defaults(run=run)


def _time(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    try:
        return parse_generation_time(value, field=flag)
    except ValidationError as exc:
        fail(str(exc))


def run(args: argparse.Namespace) -> int:
    settings = stack_settings_or_exit(data_dir=args.data_dir)
    existing_store_or_fail(settings)  # an audit reads a store: it makes none
    _, registry = namespaces_or_exit(settings)
    ns = registry.get(args.namespace)
    if ns is None:
        fail(f"unknown namespace {args.namespace!r} (known: {', '.join(registry.names())})")
    if ns.counter_type is CounterType.BEST_EFFORT:
        fail(f"namespace {args.namespace!r} is BEST_EFFORT: its counts live in the cache only, no events to audit")
    start, end = _time(args.start, "--from"), _time(args.end, "--to")
    if args.by is not None and ns.counts_unique:
        fail(f"--by: namespace {args.namespace!r} counts distinct items (UNIQUE): its series are estimated from "
             "sketches, which GetCountSeries answers; the audit's buckets would count writes")
    if args.by is not None:
        return _run_series(args, settings, registry, start, end)
    if args.format in ("json", "table"):
        fail(f"--format {args.format} is for --by (an event export is jsonl or csv)")
    after_us = start - 1 if start is not None else 0
    upto_us = end if end is not None else MAX_EVENT_TIME
    if upto_us <= after_us:
        fail("--to must not be before --from")
    opts = AuditOptions(args.namespace, args.counter, after_us, upto_us)
    header = True
    if args.resume:
        opts = _resumed(args, opts)
        header = args.output.stat().st_size == 0
    elif args.output is not None and args.output.exists() and args.output.stat().st_size:
        fail(f"{args.output} exists: pass --resume to continue it, or remove it")

    out = _opened(args.output) if args.output else sys.stdout
    progress = RichProgress(console)
    try:
        # SIGINT: finish the page in hand, then stop (twice: now)
        with Interrupt() as stop, progress:
            result = asyncio.run(run_audit(settings, registry, opts, RowWriter(out, args.format, header),
                                           progress=progress, stop=stop))
    finally:
        if args.output:
            out.close()
    tally, state, at_rollup = result.tally, result.stored, result.at_rollup
    where = f" into {args.output}" if args.output else ""
    console.print(f"{args.namespace}:{args.counter}: {tally.events:,} event(s){where} ({progress.summary()}): "
                  f"{tally.adds:,} increment(s), {tally.clears:,} clear(s), {tally.uncounted:,} tied with a clear "
                  f"(not counted); running total {tally.total:,}", highlight=False, emoji=False, markup=False)
    if ns.counts_unique:
        console.print(f"namespace {args.namespace!r} counts distinct items (UNIQUE): the running total counts its "
                      "writes (each item once per write); the count GetCount answers is the distinct items' estimate",
                      highlight=False)
    if result.interrupted:
        console.print("interrupted; run the same command with --resume (and --output) to continue",
                      highlight=False)
        return 130
    if state is None:
        console.print("stored rollup: none yet", highlight=False)
        return 0
    if at_rollup is None:
        why = result.not_compared or "outside the exported range"
        console.print(f"stored rollup: {state.count:,} at {iso(state.rollup_ts)} (not compared: {why})",
                      highlight=False)
        return 0
    match = at_rollup == state.count
    verdict = "[green]matches[/]" if match else "[bold red]DIFFERS[/] (run `counter recount` to fix it)"
    console.print(f"stored rollup: {state.count:,} at {iso(state.rollup_ts)}; audit total at that time "
                  f"{at_rollup:,}: {verdict}", highlight=False)
    return 0 if match else 1


Resumable = TypeVar("Resumable", AuditOptions, SeriesOptions)


def _resumed(args: argparse.Namespace, opts: Resumable) -> Resumable:
    """`opts` continuing the export in --output, which must hold one of this kind, in --format."""
    if args.output is None or not args.output.exists():
        fail("--resume continues an export into an existing --output file")
    found = export_format(args.output)
    if found is not None and found != args.format:
        fail(f"{args.output} holds a {found} export, not {args.format}: resume it with --format {found}, or give "
             "another --output")
    try:
        return opts.resumed(args.output, args.format)
    except (ValueError, KeyError) as exc:
        what = "bucket series (--by)" if isinstance(opts, SeriesOptions) else "event export (no --by)"
        fail(f"{args.output} is not a {args.format} {what} this command can continue ({exc!r} in its last rows): "
             "give another --output")


class _TableWriter:
    """--by --format table: aligned lines as the rows come; the totals at the end (by the caller)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        out.write(f"{'bucket_start':20}  {'count':>14}  {'running_total':>16}\n")

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            self.out.write(f"{r['bucket_start']:20}  {r['count']:>14,}  {r['running_total']:>16,}\n")
        self.out.flush()


class _JsonCollector:
    """--by --format json: the rows, written as one document once the series is complete."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        self.rows.extend({k: v for k, v in r.items() if k != "granularity"} for r in rows)


def _run_series(args: argparse.Namespace, settings: Settings, registry: NamespaceRegistry, start: int | None,
                end: int | None) -> int:
    ns = registry[args.namespace]
    g = Granularity(args.by)
    if not ns.windows.enabled(g):
        fail(f"namespace {ns.name!r} keeps no {g} buckets (it keeps: {', '.join(ns.windows.granularities) or 'none'})")
    if start is not None and end is not None and end <= start:
        fail("--to must be after --from")
    if args.resume and args.format not in ("jsonl", "csv"):
        fail("--resume continues a jsonl or csv export")
    opts = SeriesOptions(ns.name, args.counter, g, start, end)
    header = True
    if args.resume:
        opts = _resumed(args, opts)
        header = args.output.stat().st_size == 0
    elif args.output is not None and args.output.exists() and args.output.stat().st_size:
        fail(f"{args.output} exists: pass --resume to continue it, or remove it")

    out = _opened(args.output) if args.output else sys.stdout
    collector = _JsonCollector()
    writer = (collector if args.format == "json" else _TableWriter(out) if args.format == "table"
              else RowWriter(out, args.format, header, SERIES_FIELDS))
    progress = RichProgress(console)
    try:
        with Interrupt() as stop, progress:  # SIGINT: finish the page in hand, then stop (twice: now)
            result = asyncio.run(run_series_audit(settings, registry, opts, writer, progress=progress, stop=stop))
        if args.format == "json" and not result.interrupted:
            out.write(json.dumps(_document(ns.name, args.counter, result, collector.rows), indent=1) + "\n")
        elif args.format == "table" and not result.interrupted:
            out.write(f"total {result.total:,} over {result.buckets:,} {g} bucket(s); as_of "
                      f"{iso(result.as_of) if result.as_of else '-'}\n")
    except WindowError as exc:
        fail(f"--from/--to: {exc}")
    finally:
        if args.output:
            out.close()
    where = f" into {args.output}" if args.output else ""
    as_of = iso(result.as_of) if result.as_of else "-"
    console.print(f"{args.namespace}:{args.counter}: {result.buckets:,} {g} bucket(s){where} from "
                  f"{iso(result.start_us)} to {iso(result.end_us)} ({progress.summary()}): total {result.total:,}, "
                  f"as_of {as_of}", highlight=False, emoji=False, markup=False)
    if result.interrupted:
        console.print("interrupted; run the same command with --resume (and --output) to continue",
                      highlight=False)
        return 130
    state = result.stored
    if result.matches is None:
        stored = f"{state.count:,} at {iso(state.rollup_ts)}" if state is not None and state.rollup_ts else "none"
        console.print(f"stored rollup: {stored} (not compared: {result.not_compared})", highlight=False)
        return 0
    assert state is not None
    verdict = "[green]matches[/]" if result.matches else "[bold red]DIFFERS[/] (run `counter recount` to fix it)"
    console.print(f"stored rollup: {state.count:,} at {iso(state.rollup_ts)}; bucket total since the latest clear "
                  f"{result.total:,}: {verdict}", highlight=False)
    return 0 if result.matches else 1


def _document(namespace: str, counter: str, r: SeriesResult, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"namespace": namespace, "counter": counter, "granularity": r.granularity.value,
            "from": iso(r.start_us), "to": iso(r.end_us), "buckets": rows, "total": r.total,
            "as_of": iso(r.as_of) if r.as_of else None,
            "stored_rollup": None if r.stored is None else {"count": r.stored.count,
                                                            "rollup_ts": iso(r.stored.rollup_ts)},
            "matches": r.matches, "not_compared": r.not_compared}


def _opened(path: Path) -> IO[str]:
    """The --output file, appended to; a clear error where it cannot be (a missing directory gave a traceback)."""
    try:
        return path.open("a", encoding="utf-8", newline="")
    except OSError as exc:
        fail(f"--output {path}: {exc.strerror or exc}")
