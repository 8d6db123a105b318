"""A burst of new counters on the real stack: the worker rolls it up in larger batches and cuts its sets at their budget
(`COUNTER_ROLLUP_BATCH_MAX`, `COUNTER_ROLLUP_SET_BUDGET_S`), signalling the rest of each set again through the rollups
topic. Every count stays exact, the burst's and a quiet namespace's written after it, and the cut sets did go through
the topic again (the worker's metric).

Everything is real: the session broker, a worker process, memcached, SQLite.
"""

from __future__ import annotations

import time

import pytest

from control_plane import load_namespaces
from infra.process import ManagedProcess
from producers import CounterProducer
from tests.helpers import metric_sum, wait_for
from tests.integration.test_pipeline import CONVERGENCE_BUDGET_S, as_mutation, now_us
from tests.pipeline_harness import Event, PipelineEnv, oracle

pytestmark = pytest.mark.integration

BURST, QUIET = "my_dataset", "my_dataset_accurate"  # tests/data/pipeline_namespaces.yaml
COUNTERS = 3_000


def budget_resignals(worker: ManagedProcess) -> float:
    return metric_sum(worker.port, 'counter_rollup_resignals_total{source="set_budget"}')


def test_a_burst_cut_into_budgeted_sets_converges_exactly_and_so_does_a_quiet_namespace(
        kafka_bootstrap: str, memcached_address: str, tmp_path) -> None:
    env = PipelineEnv(kafka_bootstrap, memcached_address, tmp_path / "data", extra_env={
        "COUNTER_ROLLUP_SET_BUDGET_S": "0.1", "COUNTER_ROLLUP_BATCH_MAX": "128"}).prepare()
    try:
        worker = env.start_worker()
        registry = load_namespaces(env.namespaces)
        assert registry[BURST].rollup_batch_count * 8 < COUNTERS  # the premise: the burst's sets grow their batches
        burst = [Event(f"new-{i}", now_us() + i, f"b-{i}", 1 + i % 7) for i in range(COUNTERS)]
        quiet = [Event(f"quiet-{i}", now_us() + i, f"q-{i}", 5 + i) for i in range(3)]
        with CounterProducer(env.bootstrap, topic=env.mutations_topic, batch_size=500, namespaces=registry) as producer:
            for e in burst:
                producer.send(as_mutation(e, BURST))
            producer.flush()
            for e in quiet:
                producer.send(as_mutation(e, QUIET))
            producer.flush()
        last_write = time.monotonic()

        expected_burst, expected_quiet = oracle(burst), oracle(quiet)
        wait_for(lambda: env.converged(QUIET, expected_quiet), 60,
                 message=lambda: f"the quiet namespace; mismatches {env.mismatches(QUIET, expected_quiet)}")
        took = time.monotonic() - last_write
        assert took <= CONVERGENCE_BUDGET_S + 2.0, f"the quiet namespace converged in {took:.2f}s"
        wait_for(lambda: env.converged(BURST, expected_burst), 120,
                 message=lambda: f"the burst; {len(env.mismatches(BURST, expected_burst))} counters not converged")
        assert budget_resignals(worker) > 0  # sets were cut, and their rest came back through the topic
    finally:
        env.stop()
