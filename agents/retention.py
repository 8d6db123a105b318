"""Retention of a namespace's events: whole slices older than delete_after that every counter has rolled past.

Recounts start a counter's total where retention may have deleted events (`sinks.dropped_key`, jobs.recount), so
the mark goes to the rollup store before the slices go: a stop between the two leaves a mark over slices still
there, which a recount only checks less. The other order left slices gone and no mark (the events and rollups are
separate files or tables, never one transaction), and a recount then set each count to what was left of its events
(71 to 1: a review).
"""

from __future__ import annotations

import logging

from control_plane import Namespace
from schemas import MICROS
from sinks import EventStore, RollupStore, dropped_key, retention_cutoff

log = logging.getLogger("counter.worker")


async def drop_expired_events(events: EventStore, rollups: RollupStore, ns: Namespace, now_us: int) -> int:
    """Drop the namespace's slices older than delete_after and rolled past by every counter, marking first where
    events may be gone; how many slices were dropped."""
    rolled = await rollups.min_rollup_ts(ns.name)
    cutoff = now_us - int(ns.retention.delete_after_s * MICROS)
    if not any(end <= retention_cutoff(cutoff, rolled) for _table, _start, end in await events.slices(ns.name)):
        return 0
    await rollups.set_watermarks(dropped_key(ns.name), {0: cutoff})
    dropped = await events.drop_expired_slices(ns.name, cutoff, rolled)
    log.info("retention: dropped %d slice(s) of namespace %s", dropped, ns.name)
    return dropped
