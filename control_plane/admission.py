"""Admission (DESIGN invariant 2): judge an event's time against when its record reached Kafka.

`t` is the record timestamp (LogAppendTime on topics the service creates), never the agent's clock, so
consumer lag can never cause a rejection.
"""

from __future__ import annotations

from control_plane.model import Namespace
from schemas import MICROS


def admission_error(event_time_us: int, record_ts_us: int, ns: Namespace) -> str | None:
    """Why the event must be rejected, or None when it is admitted."""
    earliest = record_ts_us - int(ns.accept_limit_s * MICROS)
    latest = record_ts_us + int(ns.max_clock_skew_s * MICROS)
    if event_time_us < earliest:
        return (f"event_time {event_time_us} is {(record_ts_us - event_time_us) / MICROS:.3f}s before the "
                f"record reached Kafka; namespace {ns.name!r} accepts at most accept_limit="
                f"{ns.accept_limit_s}s")
    if event_time_us > latest:
        return (f"event_time {event_time_us} is {(event_time_us - record_ts_us) / MICROS:.3f}s after the "
                f"record reached Kafka; namespace {ns.name!r} allows max_clock_skew={ns.max_clock_skew_s}s")
    return None


def rollup_boundary(now_us: int, watermark_us: int, ns: Namespace) -> int:
    """The latest boundary B whose window (.., B] is immutable (DESIGN invariant 3).

    Any event still to be persisted sits in a record with timestamp >= min(now - skew, watermark), and
    admission bounds its event_time below by that minus accept_limit; B stays strictly under that.
    """
    horizon = min(now_us - int(ns.max_clock_skew_s * MICROS), watermark_us)
    return horizon - int(ns.accept_limit_s * MICROS) - 1
