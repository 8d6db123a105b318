"""CounterProducer judges each acknowledgement as the worker will (`producers.client.NotAdmitted`).

Before: a write whose record reached Kafka past its namespace's accept_limit (a broker that stalled longer than
accept_limit on a LogAppendTime topic, or a generation_time given too old) resolved its future as delivered, and
the worker dead-lettered it: an acknowledged write, not counted, that the caller never heard of. Given the
namespaces, the client now fails that write's future with NotAdmitted (and flush raises it), and only that write."""

from __future__ import annotations

import time

import pytest

from control_plane import load_namespaces
from producers import CounterProducer, NotAdmitted
from schemas import MICROS, MutationOp
from tests.helpers import read_all, wait_for
from tests.pipeline_harness import ACCEPT_LIMIT_S, PipelineEnv

pytestmark = pytest.mark.integration

NS = "my_dataset"


@pytest.mark.parametrize("batch_size", [1, 10])
def test_a_write_the_pipeline_will_refuse_fails_its_future_and_the_others_count(pipeline: PipelineEnv,
                                                                               batch_size: int) -> None:
    pipeline.start_worker()
    registry = load_namespaces(pipeline.namespaces)
    stale_us = time.time_ns() // 1000 - int((ACCEPT_LIMIT_S + 30) * MICROS)
    with CounterProducer(pipeline.bootstrap, topic=pipeline.mutations_topic, batch_size=batch_size,
                         namespaces=registry) as producer:
        stale = producer.add(NS, "c", 5, token="t-stale", generation_time=stale_us)
        fresh = producer.add(NS, "c", 2, token="t-fresh", generation_time=time.time_ns() // 1000)
        with pytest.raises(NotAdmitted) as flushed:
            producer.flush()
    assert [m.event_id for m in flushed.value.mutations] == ["t-stale"]
    assert "accept_limit" in flushed.value.refusals[0][1]
    refused = stale.exception(timeout=0)
    assert isinstance(refused, NotAdmitted) and [m.event_id for m in refused.mutations] == ["t-stale"]
    if batch_size == 1:
        assert fresh.exception(timeout=0) is None, "the fresh write is acknowledged as counted"

    wait_for(lambda: pipeline.converged(NS, {"c": 2}), 30, message=lambda: pipeline.mismatches(NS, {"c": 2}))
    letters = wait_for(lambda: read_all(pipeline.bootstrap, pipeline.dlq_topic) or None, 30, interval=0.5,
                       message="the refused write dead-lettered")
    assert len(letters) == 1 and b"t-stale" in letters[0].value, "what the client refused is what the worker refused"


def test_a_retry_of_several_mutations_fails_whole_when_one_is_refused(pipeline: PipelineEnv) -> None:
    """A review: a future settled from several records (a retry of several mutations, a batch split in records)
    resolved as delivered when a part was refused by admission."""
    from producers import DeliveryError

    registry = load_namespaces(pipeline.namespaces)
    stale_us = time.time_ns() // 1000 - int((ACCEPT_LIMIT_S + 30) * MICROS)
    with CounterProducer(pipeline.bootstrap, topic=pipeline.mutations_topic, namespaces=registry,
                         track_failures=False) as producer:
        stale = producer.mutation(MutationOp.ADD, NS, "c", 5, "t-stale", stale_us)
        fresh = producer.mutation(MutationOp.ADD, NS, "d", 1, "t-fresh", time.time_ns() // 1000)
        whole = producer.retry(DeliveryError("a stall", mutations=[stale, fresh]))
        refused = whole.exception(timeout=30)
    assert isinstance(refused, NotAdmitted) and [m.event_id for m in refused.mutations] == ["t-stale"], refused


def test_without_the_namespaces_nothing_is_judged(pipeline: PipelineEnv) -> None:
    """The check needs the namespaces' accept limits: a producer given none resolves every acknowledged write."""
    stale_us = time.time_ns() // 1000 - int((ACCEPT_LIMIT_S + 30) * MICROS)
    with CounterProducer(pipeline.bootstrap, topic=pipeline.mutations_topic) as producer:
        stale = producer.add(NS, "c", 5, token="t-stale", generation_time=stale_us)
        producer.flush()
    assert stale.exception(timeout=0) is None
