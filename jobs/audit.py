"""Audit: the individual increments and clears that make up a count, oldest first, with the running total.

`audit` streams the events of a counter in (after_us, upto_us] as rows to a writer, grouped by event_time so
a stop never splits a group. A hard stop (a second Ctrl-C, a kill) can still end a file inside a group, so an
export into a file resumes by cutting its last event_time group off and continuing after the row before it, with
the running total that row carries (`AuditOptions.resumed`). The rows' formats (JSONL, CSV) are here too,
because a resumed export reads its own rows back.

`audit_series` (`counter audit --by minute|hour|day`) streams a counter's time buckets instead: the series the
API's GetCountSeries answers (`sinks.windows.series_range` and `fill_series`: aligned, retention-clamped,
zero-filled, masked by the latest clear), one row per bucket with the running total, page by page, and checks
the total against the stored rollup when the range covers everything since the latest clear (invariant 7: since
the last clear, a counter's buckets sum to its total).
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import mmap
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from control_plane import Namespace
from control_plane.durations import format_duration
from jobs.progress import NullProgress, Progress, Stop, never
from schemas import INT64_MAX, INT64_MIN, MAX_EVENT_TIME
from schemas.validation import micros_iso
from sinks import (
    BucketStore,
    EventRow,
    EventStore,
    RollupState,
    RollupStore,
    apply_aggregate,
    dropped_key,
    open_namespace_stores,
)
from sinks.windows import Granularity, StoredBucket, align_down, align_up, fill_series, retained_from, series_range
from streams.settings import Settings

FIELDS = ["event_time", "event_time_us", "op", "token", "item_key", "delta", "counted", "running_total"]
SERIES_FIELDS = ["bucket_start", "bucket_start_us", "granularity", "count", "running_total"]
PAGE = 10_000

Row = dict[str, Any]


iso = micros_iso  # what the audit's exports and summaries print a time as


class RunningTotal:
    """The count event by event, with the rollups' clear semantics (DESIGN invariant 5).

    Events arrive grouped by event_time; within a group that holds a clear, the clears come first (total 0)
    and the group's increments are not counted: aggregation counts only deltas strictly after the latest clear.
    """

    def __init__(self, start: int = 0) -> None:
        self.total = start
        self.adds = self.clears = self.uncounted = self.events = 0
        # the event time the total first left the int64 range since the latest clear: a stored count saturates
        # there, at a rollup, so from then on it depends on when the rollups ran
        self.left_range_at: int | None = None

    def group(self, rows: list[EventRow]) -> list[Row]:
        cleared = any(r[6] for r in rows)
        if cleared:
            rows = sorted(rows, key=lambda r: not r[6])  # stable: clears first, then the tied increments
        out = []
        for _ns, _c, t, token, item_key, delta, is_clear in rows:
            self.events += 1
            if is_clear:
                self.total = 0
                self.left_range_at = None
                self.clears += 1
                counted = True
            elif cleared:
                counted = False
                self.uncounted += 1
            else:
                self.total += delta
                if self.left_range_at is None and not INT64_MIN <= self.total <= INT64_MAX:
                    self.left_range_at = t
                self.adds += 1
                counted = True
            out.append({"event_time": iso(t), "event_time_us": t, "op": "clear" if is_clear else "add",
                        "token": token, "item_key": item_key, "delta": 0 if is_clear else delta,
                        "counted": counted, "running_total": self.total})
        return out


def rfc3339(us: int) -> str:
    """A bucket start (whole seconds) as RFC 3339 UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(us // 1_000_000))


class RowWriter:
    """Row writer (JSONL or CSV) that only ever writes whole rows; callable with a list of rows. ``fields``: the
    CSV columns (the events' FIELDS, or SERIES_FIELDS for a series)."""

    def __init__(self, out: IO[str], fmt: str, header: bool, fields: list[str] = FIELDS) -> None:
        self.out = out
        self.fmt = fmt
        self.fields = fields
        if fmt == "csv" and header:
            self._csv_line(fields)

    def _csv_line(self, values: list[Any]) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(values)
        self.out.write(buf.getvalue())

    def __call__(self, rows: list[Row]) -> None:
        for row in rows:
            if self.fmt == "jsonl":
                self.out.write(json.dumps(row) + "\n")
            else:
                self._csv_line([str(row[f]).lower() if f == "counted" else row[f] for f in self.fields])
        self.out.flush()


def export_format(path: Path) -> str | None:
    """The format of an export file, from its first byte: jsonl (a JSON object) or csv (a header); None: empty."""
    with path.open("rb") as f:
        head = f.read(1)
    return None if not head else "jsonl" if head == b"{" else "csv"


def _parse(line: str, fmt: str, fields: list[str], key: str) -> Row:
    """``key`` and the running total of one row (ValueError or KeyError for a row of another kind of export)."""
    row = json.loads(line) if fmt == "jsonl" else dict(zip(fields, next(csv.reader([line])), strict=True))
    return {key: int(row[key]), "running_total": int(row["running_total"])}


def last_row(path: Path, fmt: str, fields: list[str] = FIELDS, key: str = "event_time_us") -> Row | None:
    """``key`` and the running total of the last complete row of an interrupted export (a torn last line is
    cut off the file)."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    lines = data.decode().splitlines()
    if len(lines) < (2 if fmt == "csv" else 1):
        return None
    return _parse(lines[-1], fmt, fields, key)


def cut_last_group(path: Path, fmt: str) -> Row | None:
    """Cut the rows of the last event_time (and a torn last line) off an interrupted event export: a hard stop may
    have cut that group short. The event_time_us and running total of the last row kept (None: none, a CSV keeps
    its header). The file is mapped, not read: an export may be large."""
    if path.stat().st_size == 0:
        return None
    before = None
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        first = data.find(b"\n") + 1 if fmt == "csv" else 0  # after the header
        cut = end = max(first, data.rfind(b"\n") + 1)
        group = None
        while end > first:
            start = max(first, data.rfind(b"\n", first, end - 1) + 1)
            row = _parse(data[start:end - 1].decode(), fmt, FIELDS, "event_time_us")
            if group is not None and row["event_time_us"] != group:
                before = row
                break
            group, cut, end = row["event_time_us"], start, start
    os.truncate(path, cut)
    return before


@dataclass(frozen=True, slots=True)
class AuditOptions:
    namespace: str
    counter: str
    after_us: int = 0  # events after this event time (exclusive) ...
    upto_us: int = MAX_EVENT_TIME  # ... up to this one (inclusive)
    start_total: int | None = None  # the running total at after_us when known (a resumed export)

    def resumed(self, path: Path, fmt: str) -> AuditOptions:
        """These options continuing the export in `path`: its last event_time group is cut off (`cut_last_group`)
        and exported again, after the row before it, from that row's running total (no row before it: from the
        start). ValueError or KeyError when `path` holds another kind of export."""
        before = cut_last_group(path, fmt)
        if before is None:
            return self
        return AuditOptions(self.namespace, self.counter, before["event_time_us"], self.upto_us,
                            before["running_total"])


@dataclass(slots=True)
class AuditResult:
    tally: RunningTotal
    at_rollup: int | None  # the running total at the stored rollup_ts, when the range covers it
    interrupted: bool
    stored: RollupState | None  # the stored rollup, read after the export
    not_compared: str | None = None  # why the running total cannot be compared with the rollup, beyond the range


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
    left_range_at = None  # the running total's `left_range_at` as of the rollup
    cursor = None
    pending: list[EventRow] = []  # the current event_time group (may span pages)
    interrupted = False
    dropped = (await rollups.watermarks(dropped_key(namespace))).get(0, 0)  # retention may have deleted before it
    cleared_after_cut = False  # a clear at or after it, up to the rollup: the total from there on is the events'
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
                    at_rollup, left_range_at = tally.total, tally.left_range_at
                    cleared_after_cut |= group[0][2] >= dropped and any(r[6] for r in group)
                progress.advance(len(group), note=f"total {tally.total:,}")
            if last_page:
                break
            cursor = (page[-1][2], page[-1][3], page[-1][4])
            if stop():  # the group in hand is not written: a resumed export reads it again, whole
                at_rollup, interrupted = None, True
                break
    finally:
        progress.finish()
    if at_rollup is not None and dropped and not cleared_after_cut:  # the running total misses what was deleted
        # (with --from after the cut too: the total before it was summed from the events kept, and the count was
        # reported to differ where it was right, a review)
        return AuditResult(tally, None, interrupted, await rollups.get(namespace, counter),
                           f"retention deleted the events before {iso(dropped)} (delete_after), which the "
                           "count includes: the running total, summed from the events kept, cannot be checked "
                           "against it (unless a clear after that time resets it)")
    if at_rollup is not None and left_range_at is not None:
        return AuditResult(tally, None, interrupted, await rollups.get(namespace, counter),
                           f"the running total left the int64 range at {iso(left_range_at)}: the count saturated at "
                           "its bound in a rollup and later deltas applied to the saturated count, so it depends on "
                           "when the rollups ran (README: a count saturates) and cannot be checked against the sum")
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


# -- a counter's time buckets (`counter audit --by`) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SeriesOptions:
    namespace: str
    counter: str
    granularity: Granularity
    start_us: int | None = None  # the range [start_us, end_us), aligned outwards; default: the first stored
    end_us: int | None = None  # bucket within retention ... now
    start_total: int = 0  # the running total before start_us (a resumed export)

    def resumed(self, path: Path, fmt: str) -> SeriesOptions:
        """These options continuing the export in `path` after its last complete row (if it has one)."""
        last = last_row(path, fmt, SERIES_FIELDS, "bucket_start_us")
        if last is None:
            return self
        return SeriesOptions(self.namespace, self.counter, self.granularity,
                             last["bucket_start_us"] + self.granularity.width_us, self.end_us, last["running_total"])


@dataclass(slots=True)
class SeriesResult:
    granularity: Granularity
    start_us: int  # the buckets written start in [start_us, end_us)
    end_us: int
    buckets: int  # rows written
    total: int  # the last running total
    last_clear_us: int | None
    upto_us: int  # the latest boundary a bucket read was computed at (0: none read)
    stored: RollupState | None  # the stored rollup, read before the buckets
    not_compared: str | None  # why the total was not compared with the stored rollup (None: it was)
    interrupted: bool

    @property
    def as_of(self) -> int | None:
        """The boundary the series is exact up to: buckets are maintained before the rollup that certifies
        them (as GetCountSeries answers it)."""
        return max(self.stored.rollup_ts if self.stored is not None else 0, self.upto_us) or None

    @property
    def matches(self) -> bool | None:
        """Whether the total equals the stored rollup's count (None: not compared)."""
        if self.not_compared is not None or self.stored is None:
            return None
        return self.total == self.stored.count


async def audit_series(ns: Namespace, buckets: BucketStore, rollups: RollupStore, options: SeriesOptions,
                       rows: Callable[[list[Row]], None], *, progress: Progress | None = None, stop: Stop = never,
                       now_us: int | None = None, page: int = PAGE) -> SeriesResult:
    """Stream the counter's ``granularity`` buckets to `rows`, ``page`` buckets at a time: zero-filled, masked,
    with the running total. Stops between pages on `stop` (`SeriesOptions.resumed` continues after the last
    row). ``WindowError`` for a range outside retention or a granularity the namespace does not keep."""
    progress = progress or NullProgress()
    g, counter = options.granularity, options.counter
    retention = ns.windows.retention_s(g)  # KeyError if not kept: the CLI checks first
    now = time.time_ns() // 1000 if now_us is None else now_us
    end = options.end_us if options.end_us is not None else now
    stored = await rollups.get(ns.name, counter)
    clear = (await buckets.clears(ns.name, [counter])).get(counter)
    prefetched: list[StoredBucket] | None = None
    if options.start_us is None:  # from the first stored bucket within retention
        hi = align_up(end, g)
        floor = retained_from(g, now, retention)
        lo = max(floor or 0, 0)
        [prefetched] = await buckets.read_buckets_many(ns.name, [(counter, g, lo, hi)]) if hi > lo else [[]]
        lo = prefetched[0][0] if prefetched else hi
    else:
        lo, hi = series_range(g, options.start_us, end, now_us=now, retention_s=retention)
    starts = [row[0] for row in prefetched] if prefetched is not None else []
    total, written, upto = options.start_total, 0, 0
    interrupted = False
    step = page * g.width_us
    progress.start("auditing", total=(hi - lo) // g.width_us, unit="buckets")
    try:
        for a in range(lo, hi, step):
            b = min(hi, a + step)
            if prefetched is not None:
                chunk = prefetched[bisect.bisect_left(starts, a):bisect.bisect_left(starts, b)]
            else:
                [chunk] = await buckets.read_buckets_many(ns.name, [(counter, g, a, b)])
            upto = max(upto, max((row[2] for row in chunk), default=0))
            out: list[Row] = []
            for start, count in fill_series(g, a, b, chunk, clear):
                total += count
                out.append({"bucket_start": rfc3339(start), "bucket_start_us": start, "granularity": g.value,
                            "count": count, "running_total": total})
            rows(out)
            written += len(out)
            progress.advance(len(out), note=f"total {total:,}")
            if b < hi and stop():
                interrupted = True
                break
    finally:
        progress.finish()
    why = None if interrupted else _why_not_compared(ns, g, options, lo, hi, stored, clear, upto, prefetched)
    return SeriesResult(g, lo, hi, written, total, clear, upto, stored, why, interrupted)


def _why_not_compared(ns: Namespace, g: Granularity, options: SeriesOptions, lo: int, hi: int,
                      stored: RollupState | None, clear: int | None, upto: int,
                      prefetched: list[StoredBucket] | None) -> str | None:
    """Since the latest clear a counter's buckets sum to its total (DESIGN invariant 7): the total is comparable
    with the stored rollup when the range holds every bucket from that clear (or from the counter's first bucket,
    for a granularity kept forever) to the rollup's boundary, all certified by it."""
    if stored is None or stored.rollup_ts <= 0:
        return "no stored rollup yet"
    if upto > stored.rollup_ts:
        return f"buckets were computed after the stored rollup ({upto} > {stored.rollup_ts}): a rollup is in progress"
    if hi <= stored.rollup_ts:
        return "the range ends before the stored rollup's boundary"
    if clear is not None:
        return None if lo <= align_down(clear, g) else "the range starts after the bucket of the latest clear"
    if ns.windows.retention_s(g) is None and prefetched is not None and options.start_total == 0:
        return None  # every bucket ever stored is in the range: none is ever dropped, none lies before lo
    kept = ns.windows.retention_s(g)
    return ("the range may not start at the counter's first bucket" if kept is None else
            f"{g} buckets are kept {format_duration(kept)}: older ones may be gone (no clear to start from)")


async def run_series_audit(settings: Settings, registry: Mapping[str, Any], options: SeriesOptions,
                           rows: Callable[[list[Row]], None], *, progress: Progress | None = None,
                           stop: Stop = never) -> SeriesResult:
    """`audit_series` over the stores of `settings` (opened and closed here)."""
    events, rollups, buckets = open_namespace_stores(settings.store, settings.data_dir, registry)
    try:
        return await audit_series(registry[options.namespace], buckets, rollups, options, rows, progress=progress,
                                  stop=stop)
    finally:
        await events.close()
        await rollups.close()
        await buckets.close()
