"""`counter audit`: export the individual increments and clears that make up a count, with the running total."""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from control_plane import CounterType
from counter_cli.common import console, fail, namespaces_or_exit, settings_or_exit
from counter_cli.progress import Interrupt, ProgressBar
from schemas import MAX_EVENT_TIME, ValidationError, parse_generation_time
from sinks import EventRow, EventStore, RollupStore, apply_aggregate, open_namespace_stores

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

FIELDS = ["event_time", "event_time_us", "op", "token", "item_key", "delta", "counted", "running_total"]
PAGE = 10_000


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


def iso(us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us // 1_000_000)) + f".{us % 1_000_000:06d}Z"


class RunningTotal:
    """The count event by event, with the rollups' clear semantics (DESIGN invariant 5).

    Events arrive grouped by event_time; within a group that holds a clear, the clears come first (total 0)
    and the group's increments are not counted: aggregation counts only deltas strictly after the latest clear.
    """

    def __init__(self, start: int = 0) -> None:
        self.total = start
        self.adds = self.clears = self.uncounted = self.events = 0

    def group(self, rows: list[EventRow]) -> list[dict[str, Any]]:
        cleared = any(r[6] for r in rows)
        if cleared:
            rows = sorted(rows, key=lambda r: not r[6])  # stable: clears first, then the tied increments
        out = []
        for _ns, _c, t, token, item_key, delta, is_clear in rows:
            self.events += 1
            if is_clear:
                self.total = 0
                self.clears += 1
                counted = True
            elif cleared:
                counted = False
                self.uncounted += 1
            else:
                self.total += delta
                self.adds += 1
                counted = True
            out.append({"event_time": iso(t), "event_time_us": t, "op": "clear" if is_clear else "add",
                        "token": token, "item_key": item_key, "delta": 0 if is_clear else delta,
                        "counted": counted, "running_total": self.total})
        return out


class _Sink:
    """Row writer (JSONL or CSV) that only ever writes whole rows."""

    def __init__(self, out: IO[str], fmt: str, header: bool) -> None:
        self.out = out
        self.fmt = fmt
        if fmt == "csv" and header:
            self._csv_line(FIELDS)

    def _csv_line(self, values: list[Any]) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(values)
        self.out.write(buf.getvalue())

    def rows(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            if self.fmt == "jsonl":
                self.out.write(json.dumps(row) + "\n")
            else:
                self._csv_line([str(row[f]).lower() if f == "counted" else row[f] for f in FIELDS])
        self.out.flush()


def _last_row(path: Path, fmt: str) -> dict[str, Any] | None:
    """The last complete row of an interrupted export (a torn last line is cut off)."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    lines = data.decode().splitlines()
    if fmt == "csv":
        if len(lines) < 2:
            return None
        row = dict(zip(FIELDS, next(csv.reader([lines[-1]])), strict=True))
        return {"event_time_us": int(row["event_time_us"]), "running_total": int(row["running_total"])}
    if not lines:
        return None
    row = json.loads(lines[-1])
    return {"event_time_us": int(row["event_time_us"]), "running_total": int(row["running_total"])}


async def audit(events: EventStore, rollups: RollupStore, namespace: str, counter: str, *, after_us: int,
                upto_us: int, start_total: int | None, sink: _Sink, stop: Callable[[], bool],
                bar: ProgressBar) -> tuple[RunningTotal, int | None, bool]:
    """Stream the events of (after_us, upto_us] to `sink`; returns the tally, the running total at the
    stored rollup_ts (when the range covers it) and whether it was interrupted."""
    if start_total is None:
        start_total = apply_aggregate(0, await events.aggregate(namespace, counter, 0, after_us)) \
            if after_us > 0 else 0
    tally = RunningTotal(start_total)
    state = await rollups.get(namespace, counter)
    rollup_ts = state.rollup_ts if state is not None and 0 < state.rollup_ts <= upto_us else None
    at_rollup = tally.total if rollup_ts is not None and after_us <= rollup_ts else None
    cursor = None
    pending: list[EventRow] = []  # the current event_time group (may span pages)
    while True:
        page = await events.scan(namespace, counter, after_us, upto_us, after=cursor, limit=PAGE)
        last_page = len(page) < PAGE
        groups: list[list[EventRow]] = []
        for row in page:
            if pending and row[2] != pending[0][2]:
                groups.append(pending)
                pending = []
            pending.append(row)
        if last_page and pending:
            groups.append(pending)
            pending = []
        for group in groups:
            sink.rows(tally.group(group))
            if rollup_ts is not None and group[0][2] <= rollup_ts:
                at_rollup = tally.total
            bar.advance(len(group), note=f"total {tally.total:,}")
        if last_page:
            return tally, at_rollup, False
        cursor = (page[-1][2], page[-1][3], page[-1][4])
        if stop() and not pending:
            return tally, None, True


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
    start_total = None
    header = True
    if args.resume:
        if args.output is None or not args.output.exists():
            fail("--resume continues an export into an existing --output file")
        last = _last_row(args.output, args.format)
        if last is not None:
            after_us = last["event_time_us"]  # every group is written whole: continue after that time
            start_total = last["running_total"]
        header = args.output.stat().st_size == 0
    elif args.output is not None and args.output.exists() and args.output.stat().st_size:
        fail(f"{args.output} exists: pass --resume to continue it, or remove it")

    interrupted = Interrupt().install()  # SIGINT: finish the unit in hand, then stop (twice: now)
    out = args.output.open("a", encoding="utf-8", newline="") if args.output else sys.stdout
    try:
        with ProgressBar("auditing", unit="events") as bar:
            tally, at_rollup, stopped, state = asyncio.run(_audit(
                settings, registry, args.namespace, args.counter, after_us, upto_us, start_total,
                _Sink(out, args.format, header), interrupted, bar))
    finally:
        interrupted.restore()
        if args.output:
            out.close()
    where = f" into {args.output}" if args.output else ""
    console.print(f"{args.namespace}:{args.counter}: {tally.events:,} event(s){where} ({bar.summary()}): "
                  f"{tally.adds:,} increment(s), {tally.clears:,} clear(s), {tally.uncounted:,} tied with a clear "
                  f"(not counted); running total {tally.total:,}", highlight=False)
    if stopped:
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


async def _audit(settings, registry, namespace, counter, after_us, upto_us, start_total, sink, stop, bar):
    events, rollups, buckets = open_namespace_stores(settings.store, settings.data_dir, registry)
    try:
        tally, at_rollup, stopped = await audit(events, rollups, namespace, counter, after_us=after_us,
                                                upto_us=upto_us, start_total=start_total, sink=sink, stop=stop,
                                                bar=bar)
        state = await rollups.get(namespace, counter)
        return tally, at_rollup, stopped, state
    finally:
        await events.close()
        await rollups.close()
        await buckets.close()
