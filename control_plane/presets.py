"""Cardinality presets: production defaults for every setting a namespace leaves out.

Netflix's control plane derives queue and partition settings from the declared counter
cardinality ("adjust w.r.t cardinality"). LOW reproduces the post's example exactly. Going up:

* more rollup queues (``num_queues``) and bigger ``rollup_batch_count``: more counters need
  rolling up concurrently, so we parallelise more per worker;
* bigger ``capacity_bytes``: the coalescing set of pending counters holds more distinct names;
* shorter ``coalesce_ms``: coalescing dedupes repeated signals for the *same* counter, which
  pays off for a few hot counters (LOW) but little when signals are spread over many counters;
  a shorter window bounds the pending set's memory and keeps convergence
  (~accept_limit + coalesce_ms + one rollup) tight;
* more ``buckets_per_id`` and narrower ``seconds_per_bucket``: a busy counter's events spread
  over more, smaller event-store partitions (no wide Cassandra partitions, cheap range scans);
* narrower ``seconds_per_slice`` (HIGH): smaller slice tables, so retention drops data in
  finer steps. Every slice width is a multiple of its bucket width.

Shared by all: ``accept_limit`` 5s (the post's immutability boundary), ``max_clock_skew`` 1s,
retention closes slices after 6 days and deletes events after 7 (the post's 518400s/604800s),
and store/cache are "default" (the service-wide COUNTER_STORE / COUNTER_CACHE). Time windows: minute, hour and
day buckets, kept 48 hours, 90 days and forever (BEST_EFFORT counters have none). Rolled-up counters keep
their cached rollup without expiry (the rollup store is the truth, reads repair the cache); no dimensions are
declared (when a namespace declares keys, each counter may have 1,000 distinct full combinations);
best-effort counters live only in memcached, so they expire after a day unless told otherwise. Every counter's
writes go to one Kafka key (``shards`` 1): a namespace of hot counters asks for more.
Counters sum deltas (``aggregation`` SUM); a UNIQUE namespace's sketches have lg_k 12 (about 1.6% relative error).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .model import Cardinality, CounterType

__all__ = ["PRESETS", "preset_fields"]

_MIB = 1024 * 1024
_DAY = 86400

_COMMON: dict[str, Any] = {
    "accept_limit": 5.0,
    "max_clock_skew": 1.0,
    "retention.close_after": 6.0 * _DAY,
    "retention.delete_after": 7.0 * _DAY,
    "store": "default",
    "cache": "default",
    "api_keys": (),
    "windows.granularities": ("minute", "hour", "day"),
    "windows.retention.minute": 48.0 * 3600,
    "windows.retention.hour": 90.0 * _DAY,
    "windows.retention.day": None,  # forever
    "dimensions.keys": (),  # none declared: writes carry no dimensions
    "dimensions.max_combinations": 1000,
    "shards": 1,  # one Kafka key per counter (`namespace:counter`)
    "aggregation": "SUM",  # counters add deltas; UNIQUE counts distinct items
    "unique.lg_k": 12,  # UNIQUE: HLL sketches of 2^12 buckets (about 1.6% relative error)
}

# Keys are the file's own dotted field paths, so a preset merges exactly like a user's fields.
PRESETS: Mapping[Cardinality, Mapping[str, Any]] = MappingProxyType({
    Cardinality.LOW: MappingProxyType({
        "queue_config.num_queues": 8,
        "queue_config.coalesce_ms": 10_000,
        "queue_config.capacity_bytes": 16 * _MIB,
        "rollup_batch_count": 32,
        "time_partition.buckets_per_id": 4,
        "time_partition.seconds_per_bucket": 600,
        "time_partition.seconds_per_slice": _DAY,
        **_COMMON,
    }),
    Cardinality.MEDIUM: MappingProxyType({
        "queue_config.num_queues": 16,
        "queue_config.coalesce_ms": 5_000,
        "queue_config.capacity_bytes": 32 * _MIB,
        "rollup_batch_count": 64,
        "time_partition.buckets_per_id": 8,
        "time_partition.seconds_per_bucket": 300,
        "time_partition.seconds_per_slice": _DAY,
        **_COMMON,
    }),
    Cardinality.HIGH: MappingProxyType({
        "queue_config.num_queues": 32,
        "queue_config.coalesce_ms": 2_000,
        "queue_config.capacity_bytes": 64 * _MIB,
        "rollup_batch_count": 128,
        "time_partition.buckets_per_id": 16,
        "time_partition.seconds_per_bucket": 60,
        "time_partition.seconds_per_slice": 6 * 3600,
        **_COMMON,
    }),
})

_BEST_EFFORT_TTL_S = float(_DAY)


def preset_fields(cardinality: Cardinality, counter_type: CounterType) -> dict[str, Any]:
    """All fields of the preset for ``cardinality`` (dotted paths), TTL and windows chosen by counter type."""
    fields = dict(PRESETS[cardinality])
    if counter_type is CounterType.BEST_EFFORT:
        fields["ttl"] = _BEST_EFFORT_TTL_S
        fields["windows.granularities"] = ()  # memcached only: nothing to roll buckets up from
    else:
        fields["ttl"] = None
    return fields
