"""Response bodies of the read-only operator endpoints (namespaces, counters, audit log, pipeline health).

Apart from `models.py` (the Netflix post's calls) so the two can change independently; every field is
documented because the OpenAPI page is where operators read what a figure means.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from query_api.pipeline_health import PENDING_LIMIT


class NamespaceInfo(BaseModel):
    name: str
    counter_type: str
    requires_key: bool = Field(..., description="API keys guard this namespace")
    readable: bool = Field(..., description="the caller's key (or none) may read it")
    key_valid: bool = Field(..., description="the caller's key is one of the namespace's keys, whatever its scopes "
                                             "(not readable: 403 when it is, 401 when it is not)")
    config: dict[str, Any] | None = Field(
        None, description="every resolved setting but the API keys; null when the caller may not read it")


class NamespacesResponse(BaseModel):
    namespaces: list[NamespaceInfo]


class CountersResponse(BaseModel):
    namespace: str
    counters: list[str] = Field(..., description="counters with stored events, in name order")
    next_after: str | None = Field(None, description="pass as `after` for the next page; null on the last page")


class AuditEntry(BaseModel):
    event_time: datetime
    token: str = Field(..., description="the idempotency token (event id) the event was stored under")
    item_key: str
    delta: int
    clear: bool


class AuditResponse(BaseModel):
    namespace: str
    counter_name: str
    entries: list[AuditEntry] = Field(..., description="newest first")
    next_before: str | None = Field(None, description="pass as `before` for older entries; null when none remain")


class PartitionWatermark(BaseModel):
    partition: int
    watermark: datetime | None = Field(None, description="everything appended before it is persisted")
    lag_s: float | None = Field(None, description="now - watermark while the watermark is short of the latest write "
                                "persisted, else 0 (idle workers send no heartbeats then: it stands still)")
    end_offset: int | None = None
    persisted_offset: int | None = Field(None, description="the persist group's committed offset")
    persist_lag_records: int | None = None


class NamespaceRollups(BaseModel):
    namespace: str
    pending_counters: int = Field(..., description="counters whose last write is ahead of their rollup, counted up "
                                                   f"to {PENDING_LIMIT:,} (see pending_truncated)")
    pending_truncated: bool = Field(False, description="more counters are pending than were counted: "
                                                       "pending_counters, rolled_up_to and lag_s cover those counted")
    rolled_up_to: datetime | None = Field(
        None, description="where the oldest un-rolled-up work starts: per pending counter, when it turned pending "
                          "(the newest write of the batch that turned it: up to the accept window late) or, if later, "
                          "its rollup (SQLite; Cassandra: its rollup, or for a counter never rolled up its latest "
                          "write); null when no counter is pending")
    lag_s: float | None = Field(None, description="the age of the oldest un-rolled-up work (now - rolled_up_to) "
                                                  "while counters are pending; 0 when none is")


class QueuePartition(BaseModel):
    partition: int
    end_offset: int
    committed_offset: int | None
    depth: int | None


class RollupQueue(BaseModel):
    depth: int = Field(..., description="signals not yet consumed by the rollup group")
    partitions: list[QueuePartition]


class DeadLetterInfo(BaseModel):
    partition: int
    offset: int
    time: datetime | None
    reason: str
    namespace: str | None
    source: str = Field(..., description="topic[partition]@offset of the original record")
    key: str | None = Field(None, description="null when hidden (the namespace's read key is needed)")
    record: str = Field(..., description="the record's first mutation, or the start of its bytes")


class DeadLetters(BaseModel):
    topic: str
    size: int = Field(..., description="records held by the DLQ topic")
    dead_letters: list[DeadLetterInfo] = Field(..., description="the newest, newest first")


class PipelineRates(BaseModel):
    window_s: float | None = Field(None, description="seconds the rates are averaged over (null: first sample)")
    mutation_records_per_s: float | None = Field(None, description="records appended to the mutations topic, "
                                                 "heartbeats included (one record may carry many mutations)")
    persisted_records_per_s: float | None = Field(None, description="records the persist group committed")
    rollup_signals_per_s: float | None = None
    dead_letters_per_s: float | None = None
    heartbeat_records_per_s: float = Field(..., description="the most heartbeats among those records, while writes "
                                           "flow (partitions x 1000 / COUNTER_WATERMARK_INTERVAL_MS); fewer after "
                                           "(COUNTER_WATERMARK_IDLE_INTERVAL_MS), none once the watermark covers "
                                           "every write")
    api_requests_per_s: dict[str, float] = Field(..., description="this API process, per endpoint")


class PipelineHealthResponse(BaseModel):
    generated_at: datetime | None
    topics: dict[str, str]
    errors: dict[str, str] = Field(..., description="sources that did not answer, and why: the broker or the store "
                                                    "as a whole (`broker`, `store`: all their figures are empty), or "
                                                    "one topic the broker does not hold, keyed as in `topics` "
                                                    "(`dlq`: only that topic's figures are empty)")
    watermarks: list[PartitionWatermark]
    watermark_lag_s: float | None
    persist_lag_records: int | None
    rollups: list[NamespaceRollups]
    pending_truncated: bool = Field(..., description="some namespace has more pending counters than were counted")
    rollup_lag_s: float | None
    rollup_queue: RollupQueue | None
    dlq: DeadLetters | None
    rates: PipelineRates
    warnings: list[str] = Field(..., description="what to act on: no record persisted for 30 s or more while records "
                                                 "wait (a worker down or hung, its store failing), and on the local "
                                                 "broker, partitions long enough to slow every fetch")
