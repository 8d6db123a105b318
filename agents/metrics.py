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
# Both are set as this worker works, so they stand still when it does (idle, or stalled by its store): the API's
# counter_pipeline_* gauges (GET /v1/pipeline's figures) are the ones to alert on.
ROLLUP_LAG = Gauge("counter_rollup_lag_seconds", "At this worker's latest rollup, then minus its boundary (set by "
                   "rollups only; the API's counter_pipeline_rollup_lag_seconds tracks pending work)",
                   registry=REGISTRY)
WATERMARK_DELAY = Gauge("counter_watermark_delay_seconds", "now minus the global persist watermark while it is "
                        "short of the latest write persisted; 0 once it covers every write (it then stands still). "
                        "Set by this worker's heartbeat timer, which a stalled store holds up: the API's "
                        "counter_pipeline_watermark_lag_seconds does not stand still with it",
                        registry=REGISTRY)
TIMER_OVERLAPS = Counter("counter_worker_timer_overlaps_total", "Timer runs that outlasted the timer's interval (the "
                         "next run started at once); counted here instead of mode's WARNING line",
                         ["timer"], registry=REGISTRY)
OFFSET_RESETS = Counter("counter_worker_offset_resets_total", "Fetch positions the broker no longer held (records "
                        "deleted before they were read, or a truncated or recreated topic): the consumer resumed at "
                        "the earliest record kept, and the records in between are not counted", ["partition"],
                        registry=REGISTRY)
TOPIC_RECREATIONS = Counter("counter_worker_topic_recreations_total", "Times the mutations topic's id changed under "
                            "this worker (deleted and created again): it then read its partitions of the new topic "
                            "from the start", registry=REGISTRY)
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
