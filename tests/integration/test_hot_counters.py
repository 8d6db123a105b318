"""Hot counters on the real stack (issue 15 part 4): a namespace with `shards: 8` spreads one counter's writes
over eight Kafka keys, so its records land on several partitions, two workers both persist them, and the count
is still exact and converges within the pipeline tests' budget after the last write.

Everything is real: the session broker, two worker processes, memcached, SQLite; the topic is read back by an
independent consumer to see where each record went.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict

import pytest

from control_plane import load_namespaces
from infra.process import ManagedProcess
from producers import CounterProducer, partition_for
from schemas import decode_mutations, shard_key
from tests.helpers import metric_sum, read_topic, wait_for
from tests.integration.test_pipeline import CONVERGENCE_BUDGET_S, as_mutation, now_us
from tests.pipeline_harness import Event, PipelineEnv, oracle

pytestmark = pytest.mark.integration

HOT = "hot"  # tests/data/pipeline_namespaces.yaml: shards 8
COLD = "my_dataset"  # one key per counter
COUNTER = "viral"


def persisted(worker: ManagedProcess, namespace: str) -> float:
    return metric_sum(worker.port, f'counter_events_persisted_total{{namespace="{namespace}"}}')


def test_a_sharded_hot_counter_spreads_over_partitions_and_workers_and_stays_exact(pipeline: PipelineEnv) -> None:
    registry = load_namespaces(pipeline.namespaces)
    assert registry[HOT].shards == 8 and registry[COLD].shards == 1
    hot_partitions = {partition_for(f"{HOT}:{COUNTER}#{k}".encode(), pipeline.partitions) for k in range(8)}
    assert len(hot_partitions) >= 3  # the premise: eight keys of this counter hash onto several partitions

    a, b = pipeline.start_worker(), pipeline.start_worker()

    wait_for(lambda: pipeline.shared(a, b), 90, interval=0.5, message=lambda: f"two workers sharing the partitions: "
             f"{pipeline.owned(a)} and {pipeline.owned(b)}")
    owned_a, owned_b = pipeline.owned(a) or set(), pipeline.owned(b) or set()
    assert hot_partitions & owned_a and hot_partitions & owned_b, (hot_partitions, owned_a, owned_b)

    rng = random.Random(41)
    hot: list[Event] = []
    cold: list[Event] = []
    with CounterProducer(pipeline.bootstrap, topic=pipeline.mutations_topic, namespaces=registry) as single, \
            CounterProducer(pipeline.bootstrap, topic=pipeline.mutations_topic, batch_size=64,
                            namespaces=registry) as batched:
        for wave in range(6):
            events = []
            for i in range(300):
                t = now_us() + i
                if wave == 3 and i == 150:  # a clear mid-stream: exact means "the deltas after it"
                    events.append(Event(COUNTER, t, f"clr-{wave}-{i}", 0, True))
                else:
                    events.append(Event(COUNTER, t, f"hot-{wave}-{i}-{rng.random()}", rng.randint(-5, 20)))
            for e in events:
                single.send(as_mutation(e, HOT))
            for e in rng.sample(events, 60):  # retries with the same tokens, batched and single
                batched.send(as_mutation(e, HOT))
                single.send(as_mutation(e, HOT))
            hot += events
            ours = [Event("steady", now_us() + i, f"cold-{wave}-{i}", 1) for i in range(20)]
            for e in ours:
                single.send(as_mutation(e, COLD))
            cold += ours
            single.flush()
            batched.flush()
        records = single.records_sent + batched.records_sent
    last_write = time.monotonic()

    expected_hot, expected_cold = oracle(hot), oracle(cold)
    wait_for(lambda: pipeline.converged(HOT, expected_hot) and pipeline.converged(COLD, expected_cold), 30,
             message=lambda: f"convergence; mismatches {pipeline.mismatches(HOT, expected_hot)} "
                             f"{pipeline.mismatches(COLD, expected_cold)}")
    took = time.monotonic() - last_write
    assert took <= CONVERGENCE_BUDGET_S, f"converged in {took:.2f}s, budget {CONVERGENCE_BUDGET_S}s"

    # Both workers persisted part of the one hot counter (the only counter of its namespace).
    by_worker = [persisted(w, HOT) for w in (a, b)]
    assert all(n > 0 for n in by_worker), by_worker
    assert sum(by_worker) >= len(hot)  # retries are persisted again (idempotently) too

    # Where the records went: the hot counter over several partitions, each token (and its retries) on one,
    # under its shard's key; the unsharded counter on its one partition.
    partitions: dict[tuple[str, str], set[int]] = defaultdict(set)
    by_token: dict[str, set[int]] = defaultdict(set)
    per_partition: dict[int, int] = defaultdict(int)
    for r in read_topic(pipeline.bootstrap, pipeline.mutations_topic, records):
        mutations = decode_mutations(r.value)
        for m in mutations:
            partitions[(m.namespace, m.counter_name)].add(r.partition)
            if m.namespace == HOT:
                by_token[m.event_id or ""].add(r.partition)
                per_partition[r.partition] += 1
        if len(mutations) == 1 and mutations[0].namespace == HOT:
            assert r.key == shard_key(HOT, COUNTER, mutations[0].event_id, 8).encode()
    assert partitions[(HOT, COUNTER)] == hot_partitions, dict(per_partition)
    assert len(by_token) == len(hot) and all(len(ps) == 1 for ps in by_token.values())
    assert partitions[(COLD, "steady")] == {partition_for(f"{COLD}:steady".encode(), pipeline.partitions)}
