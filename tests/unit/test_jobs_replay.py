"""`jobs.replay` against real SQLite stores, Kafka faked: the recount set survives any failure, a stop during the
final recount keeps its tallies, and an unknown --namespace is refused."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from confluent_kafka import KafkaException

import jobs.replay as replay
from control_plane import parse_namespaces
from jobs.progress import Stop, never
from jobs.runtime import Runtime
from schemas import MICROS
from sinks import Partitioning, SqliteBucketStore, SqliteEventStore, SqliteRollupStore, apply_aggregate
from streams.positions import PartitionEnds
from streams.settings import load_settings

REGISTRY = parse_namespaces({"namespaces": {
    "ev": {"counter_type": "EVENTUAL", "accept_limit": "2s", "max_clock_skew": "500ms",
           "time_partition": {"buckets_per_id": 4, "seconds_per_bucket": 10, "seconds_per_slice": 60}},
}})
TOPIC = "counter-mutations"
HOUR_US = 3600 * MICROS


def run(coro):
    return asyncio.run(coro)


class FakeKafka:
    """`replay._Kafka` without a broker: rollup signals fail while `down`."""

    down = False

    def __init__(self, *_args: object) -> None:
        pass

    async def signals(self, keys: list) -> None:
        if FakeKafka.down:
            raise KafkaException("rollup signals not delivered: broker down")

    async def dead_letters(self, dead: list) -> None:
        pass

    async def close(self) -> None:
        pass


class Msg:
    def __init__(self, offset: int, ts_ms: int, value: bytes) -> None:
        self.offset_, self.ts_ms, self.value_ = offset, ts_ms, value

    def error(self):
        return None

    def partition(self):
        return 0

    def offset(self):
        return self.offset_

    def timestamp(self):
        return (1, self.ts_ms)

    def headers(self):
        return None

    def key(self):
        return b"ev:c"

    def value(self):
        return self.value_


class Consumer:
    """Hands out its messages once; commits nothing (as if every run failed before its commit)."""

    def __init__(self, messages: list[Msg]) -> None:
        self.messages = messages

    def consume(self, n: int, timeout: float) -> list[Msg]:
        out, self.messages = self.messages, []
        return out

    def commit(self, offsets: list, asynchronous: bool) -> None:
        pass


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    monkeypatch.setattr(replay, "_Kafka", FakeKafka)
    monkeypatch.setattr(FakeKafka, "down", False)
    part = Partitioning(4, 10, 60)
    rt = Runtime(load_settings(data_dir=tmp_path, mutations_topic=TOPIC, kafka_bootstrap="fake:9092"), REGISTRY,
                 SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: part),
                 SqliteRollupStore(tmp_path / "rollups.sqlite3"), SqliteBucketStore(tmp_path / "buckets.sqlite3"),
                 None, "no cache", mutation_partitions=1)
    yield rt
    run(rt.close())


def _replay(rt: Runtime, stop: Stop = never, **kw) -> replay.Replay:
    options = replay.ReplayOptions(start="earliest", **kw)
    rep = replay.Replay(options, rt.settings, rt, stop=stop)
    rep.state = {"spec": options.spec(TOPIC)}
    return rep


def _ends(now_ms: int) -> PartitionEnds:
    ends = PartitionEnds(snapshot_us=now_ms * 1000)
    ends.add(0, start=0, high=1)
    return ends


def _saved_recount(rt: Runtime, rep: replay.Replay) -> list:
    return json.loads(replay.state_path(rt.settings, rep.name).read_text())["recount"]


def test_a_failure_after_restoring_old_events_still_recounts_their_counter_on_the_rerun(runtime):
    """The batch's events are written (new, inside a rolled-up window), then the rollup signals fail before the
    replay saves its state: the rerun finds the events stored, so only the saved recount set can bring the
    counter to its recount."""
    now_ms = time.time_ns() // 1_000_000
    t_ms = now_ms - HOUR_US // 1000  # an hour old: inside the rolled-up window below
    run(runtime.rollups.set_watermarks(TOPIC, {0: now_ms * 1000}))
    run(runtime.rollups.write_rollup("ev", "c", 0, now_ms * 1000 - HOUR_US // 2))  # rolled up without the event
    value = json.dumps({"namespace": "ev", "counter_name": "c", "delta": 5,
                        "idempotency_token": {"token": "tok-1", "generation_time": t_ms * 1000}}).encode()
    FakeKafka.down = True
    first = _replay(runtime)
    with pytest.raises(KafkaException):
        run(first._step(Consumer([Msg(0, t_ms, value)]), _ends(now_ms), None))
    assert _saved_recount(runtime, first) == [["ev", "c"]]

    FakeKafka.down = False
    rerun = _replay(runtime)
    rerun.recount.update(tuple(k) for k in _saved_recount(runtime, first))  # as Replay.run loads it
    run(rerun._step(Consumer([Msg(0, t_ms, value)]), _ends(now_ms), None))
    assert rerun.writer.new == 0 and rerun.recount == {("ev", "c")}
    assert not run(rerun._recount())
    state = run(runtime.rollups.get("ev", "c"))
    assert state.count == 5 == apply_aggregate(0, run(runtime.events.aggregate("ev", "c", 0, state.rollup_ts)))
    assert rerun.totals["recounted"] == 1 and _saved_recount(runtime, rerun) == []


def test_old_events_found_stored_leave_no_counter_to_recount(runtime):
    """Counters are only saved as to-recount while their write is in doubt: a replay of events that were all
    stored already recounts nothing."""
    now_ms = time.time_ns() // 1_000_000
    t_ms = now_ms - HOUR_US // 1000
    value = json.dumps({"namespace": "ev", "counter_name": "c", "delta": 5,
                        "idempotency_token": {"token": "tok-1", "generation_time": t_ms * 1000}}).encode()
    run(runtime.events.write_events([("ev", "c", t_ms * 1000, "tok-1", "", 5, False)]))
    rep = _replay(runtime)
    run(rep._step(Consumer([Msg(0, t_ms, value)]), _ends(now_ms), None))
    assert rep.writer.new == 0 and not rep.recount and not rep.writer.in_doubt
    assert _saved_recount(runtime, rep) == []


def test_a_stop_during_the_final_recount_tallies_the_counters_recounted_before_it(runtime):
    now = time.time_ns() // 1000
    run(runtime.rollups.set_watermarks(TOPIC, {0: now}))
    for c in "abc":  # restored events inside rolled-up windows: each stored rollup misses 5
        run(runtime.events.write_events([("ev", c, now - HOUR_US, f"t-{c}", "", 5, False)]))
        run(runtime.rollups.write_rollup("ev", c, 0, now - HOUR_US // 2))
    calls = {"n": 0}

    def stop() -> bool:  # Ctrl-C once a and b are recounted
        calls["n"] += 1
        return calls["n"] > 2

    rep = _replay(runtime, stop=stop)
    rep.recount.update({("ev", "a"), ("ev", "b"), ("ev", "c")})
    assert run(rep._recount())  # interrupted
    assert [run(runtime.rollups.get("ev", c)).count for c in "abc"] == [5, 5, 0]
    assert rep.recount == {("ev", "c")} and _saved_recount(runtime, rep) == [["ev", "c"]]
    assert (rep.totals["recounted"], rep.totals["drift_fixed"]) == (2, 2)


def test_a_namespace_missing_from_the_namespace_file_is_refused(runtime):
    with pytest.raises(replay.ReplayError, match=r"--namespace 'nope' is not in the namespace file \(known: ev\)"):
        _replay(runtime, namespace="nope")
