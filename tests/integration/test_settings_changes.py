"""Namespace settings changed between restarts, through a real worker and API: a raised accept_limit.

Before: restarted with accept_limit 120 s instead of 5 s, the API answered 200 for a write dated 60 s back and the
worker stored it, but rollups had passed that time under the old limit: it was never counted, nor dead-lettered
(a review). The worker and the API now keep admission after each namespace's newest rollup (`sinks.rolled`)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import yaml
from confluent_kafka import Producer

from infra.process import ServiceError
from schemas.validation import micros_iso
from tests.helpers import read_all, wait_for
from tests.pipeline_harness import NAMESPACES, PipelineEnv

pytestmark = pytest.mark.integration

NS = "widened"


def _namespaces(tmp_path, accept_limit: str):
    config = yaml.safe_load(NAMESPACES.read_text())
    # ACCURATE: its reads add the events after the rollup, which 120 s of accept_limit holds back two minutes
    config["namespaces"][NS] = {"counter_type": "ACCURATE", "accept_limit": accept_limit}
    path = tmp_path / f"namespaces-{accept_limit}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_raised_accept_limit_refuses_times_the_rollups_passed(pipeline: PipelineEnv, tmp_path) -> None:
    short = _namespaces(tmp_path, "3s")
    pipeline.stack.env["COUNTER_NAMESPACES"] = str(short)
    worker, api = pipeline.start_worker(), pipeline.start_api()
    with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as client:
        assert client.post("/v1/AddCount", json={"namespace": NS, "counter_name": "c", "delta": 1}).status_code == 200
    wait_for(lambda: pipeline.converged(NS, {"c": 1}), 45, message="the first write rolled up")
    dated = time.time_ns() // 1000 - 60_000_000  # a minute back: behind the rollups made under 3 s
    worker.stop()
    api.stop()

    long = _namespaces(tmp_path, "120s")
    pipeline.namespaces = long
    pipeline.stack.env["COUNTER_NAMESPACES"] = str(long)
    pipeline.start_worker()
    api = pipeline.start_api()
    with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as client:
        late = client.post("/v1/AddCount", json={"namespace": NS, "counter_name": "c", "delta": 10,
                                                 "idempotency_token": {"token": "t-late",
                                                                       "generation_time": micros_iso(dated)}})
        assert late.status_code == 422, late.text
        assert "idempotency_token.generation_time" in late.text and "rollups" in late.text, late.text
        recent = time.time_ns() // 1000 - 1_000_000
        fine = client.post("/v1/AddCount", json={"namespace": NS, "counter_name": "c", "delta": 100,
                                                 "idempotency_token": {"token": "t-fine",
                                                                       "generation_time": micros_iso(recent)}})
        assert fine.status_code == 200, fine.text

        def count() -> int:
            return client.post("/v1/GetCount", json={"namespace": NS, "counter_name": "c"}).json()["count"]

        wait_for(lambda: count() == 101, 30, message=lambda: f"101 counted, read {count()}")
    producer = Producer({"bootstrap.servers": pipeline.bootstrap, "acks": "all"})
    producer.produce(pipeline.mutations_topic, json.dumps({
        "namespace": NS, "counter_name": "c", "delta": 1000,
        "idempotency_token": {"token": "t-kafka", "generation_time": dated}}).encode())
    assert producer.flush(20) == 0
    letters = wait_for(lambda: [r for r in read_all(pipeline.bootstrap, pipeline.dlq_topic)] or None, 30,
                       interval=0.5, message="the late Kafka write dead-lettered")
    reason = dict(letters[0].headers)["dlq.reason"].decode()
    assert "t-kafka" in letters[0].value.decode() and f"namespace '{NS}''s rollups" in reason, reason


def _aggregated(tmp_path, aggregation: str):
    config = yaml.safe_load(NAMESPACES.read_text())
    config["namespaces"]["reshaped"] = {"counter_type": "EVENTUAL", "aggregation": aggregation}
    path = tmp_path / f"namespaces-{aggregation}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_namespace_made_unique_in_place_is_refused_until_accepted(pipeline: PipelineEnv, tmp_path) -> None:
    """A namespace's aggregation changed between restarts read its stored SUM counts as sketches (0), with no
    error. The worker and the API now refuse to start, naming it, unless the operator accepts the change."""
    pipeline.stack.env["COUNTER_NAMESPACES"] = str(_aggregated(tmp_path, "SUM"))
    pipeline.start_worker().stop()  # its start records the namespaces' shapes

    pipeline.stack.env["COUNTER_NAMESPACES"] = str(_aggregated(tmp_path, "UNIQUE"))
    for start in (pipeline.start_worker, pipeline.start_api):
        with pytest.raises(ServiceError) as refused:
            start()
        assert "namespace 'reshaped': field 'aggregation': UNIQUE where the stored data is SUM" in str(refused.value)
        assert "COUNTER_ACCEPT_NAMESPACE_CHANGES=reshaped" in str(refused.value)
    pipeline.stack.env["COUNTER_ACCEPT_NAMESPACE_CHANGES"] = "reshaped"
    pipeline.start_worker()  # accepted: the new shape is recorded, and later starts need no word
    del pipeline.stack.env["COUNTER_ACCEPT_NAMESPACE_CHANGES"]
    pipeline.start_api()
