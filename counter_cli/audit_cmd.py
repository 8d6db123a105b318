"""`counter audit`: export the individual increments and clears that make up a count (the job: `jobs.audit`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from control_plane import CounterType
from counter_cli.common import console, fail, namespaces_or_exit, settings_or_exit
from counter_cli.progress import Interrupt, RichProgress
from jobs.audit import AuditOptions, RowWriter, iso, run_audit
from schemas import MAX_EVENT_TIME, ValidationError, parse_generation_time

DESCRIPTION = """\
Export the events that make up a counter, oldest first: every increment (positive or negative delta) and
every clear, with its event time, idempotency token and item key, and the running total after it. The last
running total is the count over the exported range; the summary also checks it against the stored rollup.

Clear semantics are the rollups': a clear resets the total to 0 and wins ties, so an increment with exactly
the same event time as a clear is listed (counted=false) but not counted. With --from, the running total
starts at the count just before --from (computed from the store), so it always equals the real count.
Token-less JSON mutations show their Kafka position as token (kafka:<topic>:<partition>:<offset>:<index>).

Rows go to stdout (or --output FILE). Interrupt it (Ctrl-C) at any time; with --output, run the same command
again with --resume to continue after the last complete row (the file is never left half-written)."""

EPILOG = """\
examples:
  counter audit my_dataset counter123                          # JSONL on stdout
  counter audit my_dataset counter123 --format csv --output counter123.csv
  counter audit my_dataset counter123 --from 2024-10-05T14:00:00Z --to 2024-10-05T15:00:00Z
  counter audit my_dataset counter123 --output audit.jsonl --resume   # after an interrupted export

jsonl row: {"event_time": "2024-10-05T14:48:00.000000Z", "event_time_us": 1728139680000000, "op": "add",
            "token": "some_event_id", "item_key": "", "delta": 2, "counted": true, "running_total": 2}
csv columns: event_time,event_time_us,op,token,item_key,delta,counted,running_total
Exit status: 0 done, 1 the audit total disagrees with the stored rollup, 2 bad arguments, 130 interrupted."""

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="export a counter's increments and clears with the running total",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("namespace", metavar="NAMESPACE")
    p.add_argument("counter", metavar="COUNTER")
    p.add_argument("--from", dest="start", metavar="TIME", help="first event time (ISO-8601 or epoch), inclusive")
    p.add_argument("--to", dest="end", metavar="TIME", help="last event time (ISO-8601 or epoch), inclusive")
    p.add_argument("--format", choices=("jsonl", "csv"), default="jsonl", help="row format (default jsonl)")
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
    settings = settings_or_exit(data_dir=args.data_dir)
    _, registry = namespaces_or_exit(settings)
    ns = registry.get(args.namespace)
    if ns is None:
        fail(f"unknown namespace {args.namespace!r} (known: {', '.join(registry.names())})")
    if ns.counter_type is CounterType.BEST_EFFORT:
        fail(f"namespace {args.namespace!r} is BEST_EFFORT: its counts live in the cache only, no events to audit")
    start, end = _time(args.start, "--from"), _time(args.end, "--to")
    after_us = start - 1 if start is not None else 0
    upto_us = end if end is not None else MAX_EVENT_TIME
    if upto_us <= after_us:
        fail("--to must not be before --from")
    opts = AuditOptions(args.namespace, args.counter, after_us, upto_us)
    header = True
    if args.resume:
        if args.output is None or not args.output.exists():
            fail("--resume continues an export into an existing --output file")
        opts = opts.resumed(args.output, args.format)
        header = args.output.stat().st_size == 0
    elif args.output is not None and args.output.exists() and args.output.stat().st_size:
        fail(f"{args.output} exists: pass --resume to continue it, or remove it")

    out = args.output.open("a", encoding="utf-8", newline="") if args.output else sys.stdout
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
                  f"(not counted); running total {tally.total:,}", highlight=False)
    if result.interrupted:
        console.print("interrupted; run the same command with --resume (and --output) to continue",
                      highlight=False)
        return 130
    if state is None:
        console.print("stored rollup: none yet", highlight=False)
        return 0
    if at_rollup is None:
        console.print(f"stored rollup: {state.count:,} at {iso(state.rollup_ts)} (outside the exported range: "
                      "not compared)", highlight=False)
        return 0
    match = at_rollup == state.count
    verdict = "[green]matches[/]" if match else "[bold red]DIFFERS[/] (run `counter recount` to fix it)"
    console.print(f"stored rollup: {state.count:,} at {iso(state.rollup_ts)}; audit total at that time "
                  f"{at_rollup:,}: {verdict}", highlight=False)
    return 0 if match else 1
