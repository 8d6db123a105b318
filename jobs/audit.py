"""Audit: the individual increments and clears that make up a count, oldest first, with the running total.

`audit` streams the events of a counter in (after_us, upto_us] as rows to a writer, grouped by event_time so
a stop never splits a group: an export into a file resumes after its last complete row (`resume_point`),
with the running total that row carries. The rows' formats (JSONL, CSV) are here too, because a resumed
export reads its own last row back.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from jobs.progress import NullProgress, Progress, Stop, never
from schemas import MAX_EVENT_TIME
from sinks import EventRow, EventStore, RollupState, RollupStore, apply_aggregate, open_namespace_stores
from streams.settings import Settings

FIELDS = ["event_time", "event_time_us", "op", "token", "item_key", "delta", "counted", "running_total"]
PAGE = 10_000

Row = dict[str, Any]


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

    def group(self, rows: list[EventRow]) -> list[Row]:
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


class RowWriter:
    """Row writer (JSONL or CSV) that only ever writes whole rows; callable with a list of rows."""

    def __init__(self, out: IO[str], fmt: str, header: bool) -> None:
        self.out = out
        self.fmt = fmt
        if fmt == "csv" and header:
            self._csv_line(FIELDS)

    def _csv_line(self, values: list[Any]) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(values)
        self.out.write(buf.getvalue())

    def __call__(self, rows: list[Row]) -> None:
        for row in rows:
            if self.fmt == "jsonl":
                self.out.write(json.dumps(row) + "\n")
            else:
                self._csv_line([str(row[f]).lower() if f == "counted" else row[f] for f in FIELDS])
        self.out.flush()


def last_row(path: Path, fmt: str) -> Row | None:
    """The last complete row of an interrupted export (a torn last line is cut off the file)."""
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


@dataclass(frozen=True, slots=True)
class AuditOptions:
    namespace: str
    counter: str
    after_us: int = 0  # events after this event time (exclusive) ...
    upto_us: int = MAX_EVENT_TIME  # ... up to this one (inclusive)
    start_total: int | None = None  # the running total at after_us when known (a resumed export)

    def resumed(self, path: Path, fmt: str) -> AuditOptions:
        """These options continuing the export in `path` after its last complete row (if it has one)."""
        last = last_row(path, fmt)
        if last is None:
            return self
        # every event_time group is written whole: continue after that time, from that total
        return AuditOptions(self.namespace, self.counter, last["event_time_us"], self.upto_us,
                            last["running_total"])


@dataclass(slots=True)
class AuditResult:
    tally: RunningTotal
    at_rollup: int | None  # the running total at the stored rollup_ts, when the range covers it
    interrupted: bool
    stored: RollupState | None  # the stored rollup, read after the export


async def audit(events: EventStore, rollups: RollupStore, options: AuditOptions, rows: Callable[[list[Row]], None],
                *, progress: Progress | None = None, stop: Stop = never) -> AuditResult:
    """Stream the events of (after_us, upto_us] to `rows`, group by group; stops between pages on `stop`
    (rows end with a whole group: `AuditOptions.resumed` continues after it)."""
    progress = progress or NullProgress()
    namespace, counter, after_us, upto_us = options.namespace, options.counter, options.after_us, options.upto_us
    start_total = options.start_total
    if start_total is None:
        start_total = apply_aggregate(0, await events.aggregate(namespace, counter, 0, after_us)) \
            if after_us > 0 else 0
    tally = RunningTotal(start_total)
    state = await rollups.get(namespace, counter)
    rollup_ts = state.rollup_ts if state is not None and 0 < state.rollup_ts <= upto_us else None
    at_rollup = tally.total if rollup_ts is not None and after_us <= rollup_ts else None
    cursor = None
    pending: list[EventRow] = []  # the current event_time group (may span pages)
    interrupted = False
    progress.start("auditing", unit="events")
    try:
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
                rows(tally.group(group))
                if rollup_ts is not None and group[0][2] <= rollup_ts:
                    at_rollup = tally.total
                progress.advance(len(group), note=f"total {tally.total:,}")
            if last_page:
                break
            cursor = (page[-1][2], page[-1][3], page[-1][4])
            if stop():  # the group in hand is not written: a resumed export reads it again, whole
                at_rollup, interrupted = None, True
                break
    finally:
        progress.finish()
    return AuditResult(tally, at_rollup, interrupted, await rollups.get(namespace, counter))


async def run_audit(settings: Settings, registry: Mapping[str, Any], options: AuditOptions,
                    rows: Callable[[list[Row]], None], *, progress: Progress | None = None,
                    stop: Stop = never) -> AuditResult:
    """`audit` over the stores of `settings` (opened and closed here)."""
    events, rollups, buckets = open_namespace_stores(settings.store, settings.data_dir, registry)
    try:
        return await audit(events, rollups, options, rows, progress=progress, stop=stop)
    finally:
        await events.close()
        await rollups.close()
        await buckets.close()
