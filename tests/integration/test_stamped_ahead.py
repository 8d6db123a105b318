"""What any Kafka client can send on the local broker (CreateTime: the producer stamps the record), through a real
worker: a heartbeat forged 10 minutes ahead, a record stamped an hour ahead, batch records with one invalid item.

Before: the forged heartbeat raised its partition's arrival floor 10 minutes ahead and every valid record after it
was dead-lettered; the record stamped ahead was stored with that hour as its event time and no rollup counted it;
an invalid item dead-lettered its whole record, its valid neighbours never counted."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from schemas import Mutation, MutationOp
from schemas.codec import mutation_body, record_of_bodies
from schemas.validation import micros_iso
from tests.helpers import read_all, wait_for
from tests.pipeline_harness import PipelineEnv

pytestmark = pytest.mark.integration

NS = "my_dataset"  # tests/data/pipeline_namespaces.yaml: accept_limit 3s, max_clock_skew 250ms


def body(counter: str, **extra: object) -> dict[str, object]:
    return {"namespace": NS, "counter_name": counter, "delta": 1, **extra}


def test_records_stamped_ahead_and_invalid_items_are_dead_lettered_alone_and_the_rest_counted(
        pipeline: PipelineEnv) -> None:
    worker = pipeline.start_worker()
    wait_for(lambda: pipeline.owned(worker) == set(range(pipeline.partitions)), 60, interval=0.2,
             message="the worker owning every mutations partition")
    topic, now_ms = pipeline.mutations_topic, int(time.time() * 1000)
    now_us = now_ms * 1000
    p = Producer({"bootstrap.servers": pipeline.bootstrap, "acks": "all"})
    p.produce(topic, value=b"", partition=1, headers=[("counter.heartbeat", b"1")], timestamp=now_ms + 600_000)
    assert p.flush(20) == 0  # before the valid records of its partition
    p.produce(topic, json.dumps(body("plain")).encode(), partition=1)
    p.produce(topic, json.dumps(body("tokened", idempotency_token={"token": "t1", "generation_time": now_us})).encode(),
              partition=1)
    p.produce(topic, json.dumps(body("ahead")).encode(), partition=2, timestamp=now_ms + 3_600_000)
    p.produce(topic, json.dumps([body("arr-a"), body("arr-x", delta="zz"), body("arr-b")]).encode(), partition=0)
    bad = Mutation(NS, "a b", 1, now_us, "t3", "", MutationOp.ADD)
    p.produce(topic, record_of_bodies([mutation_body(Mutation(NS, "avro-ok", 2, now_us, "t2", "", MutationOp.ADD)),
                                       mutation_body(bad)]), partition=3)
    assert p.flush(20) == 0

    expected = {"plain": 1, "tokened": 1, "arr-a": 1, "arr-b": 1, "avro-ok": 2}
    wait_for(lambda: pipeline.converged(NS, expected), 60,
             message=lambda: f"the valid records counted; mismatches {pipeline.mismatches(NS, expected)}")

    def dead_letters() -> list[dict[str, str]] | None:
        records = read_all(pipeline.bootstrap, pipeline.dlq_topic)
        return [{k: v.decode() for k, v in r.headers} | {"value": r.value.decode(errors="replace")}
                for r in records] if len(records) >= 4 else None

    letters = wait_for(dead_letters, 30, interval=0.5, message="four dead letters")
    assert isinstance(letters, list) and len(letters) == 4, letters
    reasons = sorted(letter["dlq.reason"] for letter in letters)
    assert reasons[0].startswith(f"heartbeat (header counter.heartbeat) stamped {now_ms + 600_000} ms"), reasons
    assert reasons[1].startswith(f"record timestamp {micros_iso((now_ms + 3_600_000) * 1000)} is "), reasons
    assert "max_clock_skew=0.25s" in reasons[1]
    assert reasons[2].startswith("undecodable mutation: JSON array item 1: field 'delta'"), reasons
    assert reasons[3].startswith("undecodable mutation: MutationBatch item 1: field 'counter_name'"), reasons
    by_reason = {letter["dlq.reason"]: letter for letter in letters}
    assert json.loads(by_reason[reasons[2]]["value"]) == body("arr-x", delta="zz")  # the item alone
    assert "dlq.whole_record" not in by_reason[reasons[3]]
    assert pipeline.rollups([(NS, "ahead")]) == {}  # not stored to be counted an hour from now
