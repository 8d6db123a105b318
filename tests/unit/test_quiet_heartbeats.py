"""Heartbeats stop once the watermark covers every write: what the worker records and decides, what the API and
the recount do with a watermark that stands still."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agents.persist import RawRecord, prepare
from agents.watermark import NO_PARTITION, WatermarkTracker, heartbeats_needed, request_heartbeats
from control_plane import parse_namespaces
from control_plane.admission import admission_error, covering_watermark, rollup_boundary
from query_api.service import CounterService
from schemas import MICROS, Mutation, MutationOp, encode_mutation
from sinks import SqliteRollupStore, written_key

REGISTRY = parse_namespaces({"namespaces": {
    "ev": {"counter_type": "EVENTUAL", "accept_limit": "2s", "max_clock_skew": "500ms"},
    "acc": {"counter_type": "ACCURATE", "accept_limit": "3s", "max_clock_skew": "1s"},
    "be": {"counter_type": "BEST_EFFORT", "accept_limit": "60s", "max_clock_skew": "60s"},
}})
T = 1_790_000_000 * MICROS  # a record timestamp in the past: the persist path refuses one stamped ahead


def rec(partition: int, offset: int, ts: int, value: bytes = b"", heartbeat: bool = False) -> RawRecord:
    return RawRecord("counter-mutations", partition, offset, ts // 1000, None, value,
                     [("counter.heartbeat", b"1")] if heartbeat else ())


def write(counter: str, event_time: int, token: str) -> bytes:
    return encode_mutation(Mutation("ev", counter, 1, event_time, token, "", MutationOp.ADD))


def test_a_batch_records_when_each_partitions_latest_write_reached_kafka_and_heartbeats_are_not_writes() -> None:
    out = prepare([rec(0, 0, T, write("a", T, "t1")), rec(0, 1, T + 5 * MICROS, heartbeat=True),
                   rec(1, 0, T + 2 * MICROS, write("b", T, "t2")), rec(0, 2, T + MICROS, write("c", T, "t3"))],
                  REGISTRY, {})
    # partition 0's last write was stamped before the heartbeat it follows: it arrived after it (the floor)
    assert out.written == {0: T + 5 * MICROS, 1: T + 2 * MICROS}
    assert prepare([rec(2, 0, T, heartbeat=True)], REGISTRY).written == {}
    later = prepare([rec(1, 1, T + 9 * MICROS, write("d", T + 9 * MICROS, "t4"))], REGISTRY)
    out.extend(later)
    assert out.written == {0: T + 5 * MICROS, 1: T + 9 * MICROS}


def test_the_tracker_keeps_each_partitions_latest_write_and_never_goes_back() -> None:
    tracker = WatermarkTracker(skew_s=0.5)
    tracker.writes_persisted({0: T, 1: T + 1})
    tracker.writes_persisted({0: T - 1, 2: T + 2})
    assert tracker.written([0, 1, 3]) == {0: T, 1: T + 1}
    assert tracker.written([2]) == {2: T + 2}


def test_the_covering_watermark_lets_a_rollup_count_every_admitted_event_of_the_write() -> None:
    covering = covering_watermark({0: T - MICROS, 3: T, -1: T - 5 * MICROS}, REGISTRY.values())
    # the latest write; acc: 3 s accept + 1 s skew + the rest of the record's millisecond; BEST_EFFORT has no rollups
    assert covering == T + 4 * MICROS + 999 + 1
    assert covering_watermark({}, REGISTRY.values()) is None  # nothing written: nothing to cover
    for ns in (REGISTRY["ev"], REGISTRY["acc"]):
        latest = T + int(ns.max_clock_skew_s * MICROS) + 999  # the latest event time admitted from a record at T
        assert admission_error(latest, T, ns) is None and admission_error(latest + 1, T, ns) is not None
        far_later = T + 3600 * MICROS
        assert rollup_boundary(far_later, covering, ns) >= latest  # the standing watermark holds nothing back
    ev = REGISTRY["ev"]  # one microsecond short, a rollup of the namespace that needs all of it could miss it
    assert rollup_boundary(T + 3600 * MICROS, T + 2_500_000, ev) < T + 500_000


@pytest.mark.parametrize(("marks", "covering", "needed"), [
    ({0: 10, 1: 10}, None, False),  # nothing written yet
    ({0: 10, 1: 10}, 10, False),  # every owned watermark covers the latest write
    ({0: 10, 1: 9}, 10, True),  # one is short
    ({0: 10}, 10, True),  # one has none yet
])
def test_heartbeats_are_needed_while_an_owned_watermark_is_short_of_the_latest_write(
        marks: dict[int, int], covering: int | None, needed: bool) -> None:
    assert heartbeats_needed(marks, [0, 1], covering) is needed


def test_a_heartbeat_request_is_a_write_on_no_partition_and_never_goes_back(tmp_path: Path) -> None:
    async def run() -> dict[int, int]:
        store = SqliteRollupStore(tmp_path / "rollups.sqlite3")
        try:
            await store.set_watermarks(written_key("m"), {0: T})
            await request_heartbeats(store, "m", T + 10)
            await request_heartbeats(store, "m", T + 5)
            assert await store.watermarks("m") == {}  # the topic's own watermarks are untouched
            return await store.watermarks(written_key("m"))
        finally:
            await store.close()

    assert asyncio.run(run()) == {0: T, NO_PARTITION: T + 10}


class Signals:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def emit(self, namespace: str, counter: str) -> None:
        self.sent.append(counter)


def test_a_read_does_not_signal_a_rollup_that_a_standing_watermark_could_not_move() -> None:
    ns = parse_namespaces({"namespaces": {"ev": {"counter_type": "EVENTUAL"}}})["ev"]
    signals = Signals()
    svc = CounterService({"ev": ns}, producer=None, signals=signals, events=None, rollups=None,  # type: ignore[arg-type]
                         cache=None, counters=None, read_signal_lag_s=5.0)  # type: ignore[arg-type]
    now = time.time_ns() // 1000
    svc.watermark_us = now - 3600 * MICROS  # idle for an hour: the workers' heartbeats stopped
    at_boundary = rollup_boundary(now, svc.watermark_us, ns)
    svc.signal_if_stale(ns, "converged", at_boundary)
    svc.signal_if_stale(ns, "behind", at_boundary - 6 * MICROS)
    assert signals.sent == ["behind"]
    svc.watermark_us = 0  # not known: judged against now, as before the API had read it
    svc.signal_if_stale(ns, "converged", at_boundary)
    assert signals.sent == ["behind", "converged"]
