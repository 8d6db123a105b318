"""Admission (DESIGN invariant 2): judge an event's time against when its record reached Kafka.

`t` is the record timestamp (LogAppendTime on topics the service creates), never the agent's clock, so
consumer lag can never cause a rejection.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from control_plane.model import CounterType, Namespace, NamespaceRegistry
from schemas import MICROS, Mutation, MutationOp
from schemas.validation import micros_iso


def kafka_refusal(ns: Namespace) -> str | None:
    """Why no write of the namespace may come through Kafka (a BEST_EFFORT one), or None: the persist path's
    dead-letter reason and `counter produce`'s refusal, one text."""
    if ns.counter_type is CounterType.BEST_EFFORT:
        return (f"namespace {ns.name!r} is BEST_EFFORT: its counts live in the cache only; write them through the "
                "API, not Kafka")
    return None


RECORD_TIME_US = 1000
"""A Kafka record's timestamp is in milliseconds: the record reached Kafka up to 999 µs after the time it carries."""


def ahead_allowed_us(ns: Namespace) -> int:
    """How far after its record's timestamp an event may be dated: max_clock_skew, and the rest of the record's
    millisecond. A write the API dated (µs) and the broker stamped in the same millisecond is not ahead of it: with
    max_clock_skew 0 nearly every API write was dead-lettered after its 200 (a review: 3 of 50 counted)."""
    return int(ns.max_clock_skew_s * MICROS) + RECORD_TIME_US - 1


def record_time(now_us: int) -> int:
    """The earliest timestamp a record sent now can carry (µs): Kafka's are whole milliseconds, rounded down. Who
    judges a write before its record exists judges it by this, not by `now_us`: up to 999 µs later, it admitted
    times the worker then refused as ahead of the record (a review: an AddCount dated 0-4 ms ahead with
    max_clock_skew 0 answered 200, and a third of those were dead-lettered, never counted)."""
    return now_us - now_us % RECORD_TIME_US


def admission_error(event_time_us: int, record_ts_us: int, ns: Namespace) -> str | None:
    """Why the event must be rejected, or None when it is admitted."""
    earliest = record_ts_us - int(ns.accept_limit_s * MICROS)
    latest = record_ts_us + ahead_allowed_us(ns)
    if event_time_us < earliest:
        return (f"event_time {_time(event_time_us)} is {_span(record_ts_us - event_time_us)} before the record reached "
                f"Kafka ({_time(record_ts_us)}); namespace {ns.name!r} accepts at most "
                f"accept_limit={ns.accept_limit_s}s")
    if event_time_us > latest:
        return (f"event_time {_time(event_time_us)} is {_span(event_time_us - record_ts_us)} after the record reached "
                f"Kafka ({_time(record_ts_us)}); namespace {ns.name!r} allows max_clock_skew={ns.max_clock_skew_s}s")
    return None


def rolled_past(event_time_us: int, rolled_us: int, ns: Namespace) -> str | None:
    """Why an event dated at or before its namespace's rollups (`RollupStore.newest_rollup_ts`) is refused, or None:
    no rollup counts it. Admission admits none unless its window grew past those rollups (accept_limit raised)."""
    if event_time_us > rolled_us:
        return None
    return (f"event_time {_time(event_time_us)} is at or before namespace {ns.name!r}'s rollups (up to "
            f"{_time(rolled_us)}), which no longer change: a raised accept_limit admits such times only for counters "
            "not rolled up past them")


def late_acknowledgement(event_time_us: int, acknowledged_us: int, ns: Namespace) -> str | None:
    """Why the worker may refuse an event whose record the broker acknowledged at `acknowledged_us` (this clock),
    or None. The API admits a write by its arrival, but the worker judges it by when its record reached Kafka, which
    can be as late as the acknowledgement: an event dated more than accept_limit before the acknowledgement (a write
    dated near the end of accept_limit that waited for a slow broker) may be dead-lettered, and was answered 200 (a
    review). Whether it is depends on when its record reached Kafka, which the API does not know: the answer says so."""
    if event_time_us >= acknowledged_us - int(ns.accept_limit_s * MICROS):
        return None
    return (f"its record was acknowledged {_span(acknowledged_us - event_time_us)} after its generation_time "
            f"({_time(event_time_us)}), past namespace {ns.name!r}'s accept_limit={ns.accept_limit_s}s: it is counted "
            "if its record reached Kafka within accept_limit of that time, and dead-lettered otherwise (`counter dlq "
            "list`); GetCount tells which. A retry with the same token is refused as too old")


def _time(us: int) -> str:
    """An event or record time as a person reads it; a time no calendar holds (an epoch in ns, say) as it came."""
    try:
        return micros_iso(us)
    except (OverflowError, OSError, ValueError):
        return f"{us} (epoch µs)"


def _span(us: int) -> str:
    """A gap in seconds to the ms, with days, hours or minutes beside a long one (67583448.461s reads badly)."""
    seconds = us / MICROS
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds:.3f}s ({seconds / size:,.1f} {unit})"
    return f"{seconds:.3f}s"


def rollup_boundary(now_us: int, watermark_us: int, ns: Namespace) -> int:
    """The latest boundary B whose window (.., B] is immutable (DESIGN invariant 3).

    Any event still to be persisted sits in a record with timestamp >= min(now - skew, watermark), and
    admission bounds its event_time below by that minus accept_limit; B stays strictly under that.
    """
    horizon = min(now_us - int(ns.max_clock_skew_s * MICROS), watermark_us)
    return horizon - int(ns.accept_limit_s * MICROS) - 1


def covering_watermark(written: Mapping[int, int], namespaces: Iterable[Namespace]) -> int | None:
    """The persist watermark at which every event of the latest write can be rolled up; None when nothing was written.

    `written` holds when each partition's latest persisted write reached Kafka (µs; `sinks.written_key`). Such an
    event's time is at most that + `ahead_allowed_us` (admission), and `rollup_boundary` lets a rollup count it once
    the watermark is past that time + accept_limit. Once every partition's watermark is here, no rollup waits for
    a later one: until the next write, heartbeats are not needed. BEST_EFFORT namespaces have no rollups.
    """
    if not written:
        return None
    margin = max((ahead_allowed_us(ns) + int(ns.accept_limit_s * MICROS) for ns in namespaces
                  if ns.counter_type is not CounterType.BEST_EFFORT), default=0)
    return max(written.values()) + margin + 1


def extras_refusal(ns: Namespace, dimensions: tuple[tuple[str, str], ...], item: str,
                   clear: bool = False, *, delta: int = 1, item_key: str = "") -> tuple[str, str] | None:
    """``(field, reason)`` when a write's dimensions or item are not accepted by the namespace, else None.

    Shared by the API (a 422 naming the field) and the persist path (a dead letter with the reason): in a UNIQUE
    namespace an add without an item, with a delta other than 1, or with an event_item_key (the item is the event's
    item key there), and a clear with an item; an item outside a UNIQUE namespace; dimensions on a BEST_EFFORT
    namespace, on a clear, on a namespace that declares none, or with a key it does not declare
    (``dimensions.<key>``)."""
    if ns.unique is not None:
        refusal = unique_refusal(ns, item, clear, delta, item_key)
        if refusal is not None:
            return refusal
    elif item:
        return "item", (f"namespace {ns.name!r} is {ns.counter_type.value}: only UNIQUE namespaces count items "
                        "(aggregation: UNIQUE); send the write without item")
    if not dimensions:
        return None
    if clear:
        return "dimensions", ("a clear applies to the counter and all its combinations: send it without "
                              "dimensions")
    if ns.counter_type.value == "BEST_EFFORT":
        return "dimensions", (f"namespace {ns.name!r} is BEST_EFFORT: its counts live in memcached only and keep "
                              "no dimension combinations")
    return ns.dimensions.refusal(ns.name, dimensions)


def mutation_refusal(registry: NamespaceRegistry, m: Mutation) -> tuple[str, str] | None:
    """``(field, reason)`` when the pipeline dead-letters `m` whatever its time, else None: an unknown namespace, one
    Kafka does not take (BEST_EFFORT), dimensions or an item the namespace refuses. What clients check before they
    send (`CounterProducer`, `counter produce`); the time (`admission_error`) and the dimension bound
    (max_combinations, which needs the stored combinations) are judged later."""
    try:
        ns = registry[m.namespace]
    except KeyError as exc:
        return "namespace", str(exc.args[0])
    if (refused := kafka_refusal(ns)) is not None:
        return "namespace", refused
    return extras_refusal(ns, m.dimensions, m.item, m.op is MutationOp.CLEAR, delta=m.delta,
                          item_key=m.event_item_key)


def unique_refusal(ns: Namespace, item: str, clear: bool, delta: int, item_key: str) -> tuple[str, str] | None:
    """``(field, reason)`` when a write cannot be counted by a UNIQUE namespace, else None."""
    if clear:
        if item:
            return "item", ("a clear erases every item counted before it: send it without item")
        return None
    if not item:
        return "item", (f"is required: namespace {ns.name!r} counts distinct items (aggregation UNIQUE), so every "
                        "write names the item it counts (e.g. a user id)")
    if item_key:
        return "event_item_key", ("in a UNIQUE namespace the item is the event's item key (a retry of the same "
                                  "token and item is one event, two items under one token are two): send item alone")
    if delta != 1:
        return "delta", (f"must be 1 or absent in namespace {ns.name!r} (aggregation UNIQUE): a write counts one item, "
                         f"got {delta}")
    return None


def bound_reason(namespace: str, counter: str, known: int, max_combinations: int, full: str) -> str:
    """Why a write introducing the full combination ``full`` is refused: its counter is at max_combinations."""
    return (f"counter {counter!r} of namespace {namespace!r} already has {known} dimension combinations "
            f"(max_combinations {max_combinations}); {full!r} would be one more")
