"""GET /v1/pipeline's broker figures against the real broker: a topic it does not hold loses only its own figures."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from control_plane import parse_namespaces
from query_api.broker_offsets import BrokerOffsets
from query_api.pipeline_health import PipelineHealth, render
from sinks import SqliteRollupStore
from streams.settings import Settings
from tests.helpers import make_topic, wait_for

REGISTRY = parse_namespaces("namespaces:\n  views: { counter_type: EVENTUAL }\n")


def topics_of(bootstrap: str) -> set[str]:
    broker = BrokerOffsets(bootstrap)
    try:
        return set(broker.admin.list_topics(timeout=10).topics)
    finally:
        broker.close()


def test_a_missing_dlq_topic_blanks_only_the_dlq_figures(kafka_bootstrap: str, tmp_path) -> None:
    """One missing topic blanked every broker figure (and the view's metadata request had the broker create it,
    with the broker's defaults): a DLQ never created, or deleted, now empties the DLQ's figures only, named."""
    base = f"health-{uuid.uuid4().hex[:8]}"
    settings = Settings(kafka_bootstrap=kafka_bootstrap, mutations_topic=f"{base}-m", rollups_topic=f"{base}-r",
                        dlq_topic=f"{base}-dlq")
    make_topic(kafka_bootstrap, settings.mutations_topic, 2)
    make_topic(kafka_bootstrap, settings.rollups_topic, 3)
    rollups = SqliteRollupStore(tmp_path / "rollups.sqlite3")
    health = PipelineHealth(settings, REGISTRY, rollups, ttl_s=0)

    def body() -> dict[str, Any]:
        return render(asyncio.run(health.snapshot()), REGISTRY, settings, lambda name: True)

    try:
        missing = body()
        assert set(missing["errors"]) == {"dlq"} and repr(settings.dlq_topic) in missing["errors"]["dlq"]
        assert missing["dlq"] is None and missing["rates"]["dead_letters_per_s"] is None
        assert [w["partition"] for w in missing["watermarks"]] == [0, 1] and missing["persist_lag_records"] == 0
        assert [q["partition"] for q in missing["rollup_queue"]["partitions"]] == [0, 1, 2]
        assert settings.dlq_topic not in topics_of(kafka_bootstrap)  # the view did not create it

        make_topic(kafka_bootstrap, settings.dlq_topic, 1)
        created = body()
        assert created["errors"] == {} and created["dlq"]["size"] == 0

        broker = BrokerOffsets(kafka_bootstrap)
        try:
            broker.admin.delete_topics([settings.dlq_topic], operation_timeout=10)[settings.dlq_topic].result(15)
        finally:
            broker.close()

        def without_dlq() -> dict[str, Any] | None:
            figures = body()
            return figures if figures["dlq"] is None else None
        deleted = wait_for(without_dlq, 30, interval=0.2, message="the deleted DLQ's figures gone")
        assert set(deleted["errors"]) == {"dlq"} and deleted["rollup_queue"] is not None and deleted["watermarks"]
    finally:
        asyncio.run(health.close())
        asyncio.run(rollups.close())
