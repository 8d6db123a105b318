"""`counter dlq replay` killed mid-chunk and run again re-sends no record the broker has (`jobs.dlq`, in flight).

Before: acknowledged records were saved to the progress file only once their whole chunk had settled, so a run
killed in between (kill -9, or SIGTERM, which ended it without its save) left them unrecorded, and the rerun sent
them again: a token-less dead letter, re-sent, is a new event, and a review's every kill counted up to 100 writes
twice. Now each chunk is saved as in flight before it is sent, its records carry their dead letter's identity
(header `dlq.resent`), and the next run first looks for them in the target topic.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from jobs.dlq import InFlightUnknown, SentLog, _ends, pending, recover_in_flight, resubmit
from schemas.dead_letter import (
    INDEX,
    REASON,
    RESENT,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    DeadRecord,
)
from tests.helpers import make_topic, read_all, wait_for
from tests.integration.test_replay_recount import COUNTER, FAST_GROUP, _env, add_namespaces, cli, stored_total
from tests.pipeline_harness import PipelineEnv

pytestmark = pytest.mark.integration


def dead_letters(n: int) -> list[DeadRecord]:
    """Token-less dead letters of distinct source records, as the worker writes them."""
    return [DeadRecord(0, i, 1_790_000_000_000_000 + i, b"late:c",
                       json.dumps({"namespace": "late", "counter_name": "c", "delta": 1}).encode(),
                       {REASON: "unknown namespace 'late'", SOURCE_TOPIC: "src", SOURCE_PARTITION: "0",
                        SOURCE_OFFSET: str(i), SOURCE_TIMESTAMP: str(1_790_000_000_000_000 + i), INDEX: "0"})
            for i in range(n)]


def resent(bootstrap: str, topic: str) -> list[str]:
    return [dict(r.headers)[RESENT].decode() for r in read_all(bootstrap, topic) if RESENT in dict(r.headers or [])]


def test_a_chunk_left_in_flight_is_found_in_the_topic_and_only_the_rest_is_sent(kafka_bootstrap, topic_name,
                                                                                tmp_path: Path) -> None:
    make_topic(kafka_bootstrap, topic_name, 2)
    records = dead_letters(10)
    state = tmp_path / "dlq.json"
    log = SentLog(state)  # a run sends a chunk and is killed after 4 records reached the broker
    log.send(records, topic_name, _ends(kafka_bootstrap, topic_name, 2, None), time.time_ns() // 1000)
    log.save()
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for r in records[:4]:
        producer.produce(topic_name, r.value, r.key, headers=[(RESENT, r.identity.encode())])
    assert producer.flush(10) == 0
    assert len(SentLog(state).resent_originals()) == 10, "a replay meanwhile leaves out what may have been sent"

    assert recover_in_flight(kafka_bootstrap, state) == 4
    after = SentLog(state)
    assert not after.in_flight and set(after.entries) == {r.identity for r in records[:4]}
    todo = pending(records, after)[0]
    assert todo == records[4:]
    result = resubmit(kafka_bootstrap, topic_name, todo, state=state)
    assert result.done == 6 and not result.errors
    sent = resent(kafka_bootstrap, topic_name)
    assert sorted(sent) == sorted(r.identity for r in records), "each dead letter reached the topic once"
    assert recover_in_flight(kafka_bootstrap, state) is None, "nothing left in flight after a clean run"


def test_a_chunk_its_topic_can_no_longer_tell_about_is_settled_only_by_the_operators_word(kafka_bootstrap, topic_name,
                                                                                          tmp_path: Path) -> None:
    """A review: records deleted by retention since the chunk began (a rerun days later), or a recreated topic, were
    taken as never sent and re-sent (counted twice). Recovery now refuses; `--in-flight sent|unsent` decides."""
    make_topic(kafka_bootstrap, topic_name, 1)
    records = dead_letters(3)
    state = tmp_path / "dlq.json"
    log = SentLog(state)
    log.send(records, topic_name, {0: 50}, time.time_ns() // 1000)  # the chunk began past the topic's end now
    log.save()
    with pytest.raises(InFlightUnknown, match="no longer holds what a stopped run sent there from offset 50"):
        recover_in_flight(kafka_bootstrap, state)
    log.send(records, f"{topic_name}-gone", {0: 0}, time.time_ns() // 1000)
    log.save()
    with pytest.raises(InFlightUnknown, match="is not there"):
        recover_in_flight(kafka_bootstrap, state)
    log = SentLog(state)
    assert log.assume(True) == 3 and not log.in_flight and pending(records, log)[0] == []


def test_dlq_replay_killed_mid_run_and_run_again_counts_each_dead_letter_once(pipeline: PipelineEnv,
                                                                              tmp_path: Path) -> None:
    worker = pipeline.stack.start_worker(**FAST_GROUP)
    n = 3000
    plain = Producer({"bootstrap.servers": pipeline.bootstrap, "linger.ms": 20})
    for _ in range(n):  # token-less: re-sent, each is a new event
        plain.produce(pipeline.mutations_topic, b'{"namespace": "late", "counter_name": "c", "delta": 1}',
                      key=b"late:c")
    assert plain.flush(30) == 0
    wait_for(lambda: len(read_all(pipeline.bootstrap, pipeline.dlq_topic)) >= n, 60, interval=1,
             message=f"{n} dead letters")

    add_namespaces(pipeline, worker, tmp_path, {"late": {"counter_type": "EVENTUAL", "accept_limit": "1h"}})

    state = pipeline.data_dir / "dlq" / f"{pipeline.dlq_topic}.json"
    run = subprocess.Popen([*COUNTER, "dlq", "replay"], env=_env(pipeline), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)

    def frozen_in_flight() -> bool:
        """Freeze the run while its progress file shows a chunk in flight (then kill it there)."""
        if run.poll() is not None or not state.exists() or '"in_flight"' not in state.read_text():
            return False
        run.send_signal(signal.SIGSTOP)
        if '"in_flight"' in state.read_text():
            return True
        run.send_signal(signal.SIGCONT)
        return False
    try:
        wait_for(frozen_in_flight, 60, interval=0.01, message="the run with a chunk in flight")
    finally:
        run.kill()
        run.communicate(timeout=30)
    again = cli(pipeline, "dlq", "replay")
    assert "a stopped run left" in again.stderr, again.stderr

    wait_for(lambda: stored_total(pipeline, "late", "c") >= n, 60, interval=0.5,
             message=lambda: f"{stored_total(pipeline, 'late', 'c')} of {n} counted")
    sent = resent(pipeline.bootstrap, pipeline.mutations_topic)
    assert len(sent) == len(set(sent)) == n, f"{len(sent)} re-sent records, {len(set(sent))} distinct, of {n}"
    assert stored_total(pipeline, "late", "c") == n
