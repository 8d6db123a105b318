"""Prometheus metrics of the worker, served at /metrics on its web port."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

EVENTS_PERSISTED = Counter("counter_events_persisted_total", "Mutations written to the event store "
                           "(including idempotent duplicates)", ["namespace"], registry=REGISTRY)
RECORDS_CONSUMED = Counter("counter_mutation_records_total", "Kafka records consumed by persist",
                           registry=REGISTRY)
DLQ_RECORDS = Counter("counter_dlq_records_total", "Records sent to the dead-letter topic", ["kind"],
                      registry=REGISTRY)
ROLLUPS = Counter("counter_rollups_total", "Counter rollups performed", ["namespace", "outcome"],
                  registry=REGISTRY)
RESIGNALS = Counter("counter_rollup_resignals_total", "Counters signalled again because they were not "
                    "converged yet", ["source"], registry=REGISTRY)
ROLLUP_LAG = Gauge("counter_rollup_lag_seconds", "now minus the boundary of the most recent rollup",
                   registry=REGISTRY)
WATERMARK_DELAY = Gauge("counter_watermark_delay_seconds", "now minus the global persist watermark while it is "
                        "short of the latest write persisted; 0 once it covers every write (it then stands still)",
                        registry=REGISTRY)
PERSIST_BATCH_SECONDS = Histogram("counter_persist_batch_seconds", "Time to persist one batch",
                                  registry=REGISTRY)
ROLLUP_BATCH_SECONDS = Histogram("counter_rollup_batch_seconds", "Time to roll up one coalesced set",
                                 registry=REGISTRY)


def dlq_kind(reason: str) -> str:
    """A low-cardinality label for a DLQ reason."""
    for prefix, kind in (("undecodable", "undecodable"), ("unknown namespace", "unknown_namespace"),
                         ("event_time", "admission"), ("field 'dimensions", "dimensions"), ("field 'item'", "item"),
                         ("record timestamp", "stamped_ahead"), ("heartbeat (header", "heartbeat_ahead")):
        if reason.startswith(prefix):
            return kind
    return "rejected"
