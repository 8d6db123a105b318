"""Pure logic of the agents: admission, the rollup boundary, batch preparation, one rollup on a real SQLite store."""

from __future__ import annotations

import asyncio
import json

import pytest

from agents.persist import RawRecord, prepare, settle_behind
from agents.rollup import global_watermark, rollup_counter
from agents.watermark import WatermarkTracker
from control_plane import parse_namespaces
from control_plane.admission import admission_error, rollup_boundary
from schemas import MICROS, Mutation, MutationOp, encode_batch, encode_mutation
from schemas.record_headers import is_heartbeat
from schemas.validation import micros_iso
from sinks import InProcessRollupCache, Partitioning, SqliteEventStore, SqliteRollupStore

REGISTRY = parse_namespaces({"namespaces": {
    "ev": {"counter_type": "EVENTUAL", "accept_limit": "2s", "max_clock_skew": "500ms"},
    "be": {"counter_type": "BEST_EFFORT"},
}})
EV = REGISTRY["ev"]
T = 1_790_000_000 * MICROS  # a record timestamp in the past: the persist path refuses one stamped ahead


def rec(value: bytes, offset: int = 0, ts: int = T, heartbeat: bool = False) -> RawRecord:
    """A record appended at `ts` (µs; Kafka keeps milliseconds)."""
    assert ts % 1000 == 0
    return RawRecord("counter-mutations", 3, offset, ts // 1000, b"k", value,
                     [("counter.heartbeat", b"1")] if heartbeat else ())


def m(counter: str, delta: int, t: int, token: str, op: MutationOp = MutationOp.ADD, ns: str = "ev") -> Mutation:
    return Mutation(ns, counter, delta, t, token, "", op)


class TestAdmission:
    def test_window_is_relative_to_the_record_timestamp(self):
        assert admission_error(T - 2 * MICROS, T, EV) is None
        assert admission_error(T + MICROS // 2, T, EV) is None
        assert "accept_limit" in admission_error(T - 2 * MICROS - 1, T, EV)
        assert admission_error(T + MICROS // 2 + 999, T, EV) is None  # within the record's millisecond
        assert "max_clock_skew" in admission_error(T + MICROS // 2 + 1000, T, EV)

    def test_an_event_in_its_records_millisecond_is_not_ahead_of_it_with_no_skew_allowed(self):
        """max_clock_skew 0 (allowed): the API dates a write in µs, the broker stamps its record in ms, truncated:
        the event was 'ahead' by under 1 ms and nearly every API write was dead-lettered after its 200."""
        ns = parse_namespaces({"namespaces": {"z": {"counter_type": "EVENTUAL", "max_clock_skew": 0}}})["z"]
        batch = prepare([rec(encode_mutation(Mutation("z", "c", 1, T + 999, "t1", "", MutationOp.ADD))),
                         rec(encode_mutation(Mutation("z", "c", 1, T + 1000, "t2", "", MutationOp.ADD)), offset=1)],
                        {"z": ns}, now_us=T + MICROS)
        assert [r[3] for r in batch.rows] == ["t1"]
        assert len(batch.dead) == 1 and "max_clock_skew=0.0s" in batch.dead[0].reason

    def test_consumer_lag_never_rejects(self):
        # The agent's clock plays no part: an hour-old record is judged against its own timestamp.
        old_record_ts = T - 3600 * MICROS
        assert admission_error(old_record_ts - MICROS, old_record_ts, EV) is None

    def test_boundary_stays_behind_watermark_and_clock(self):
        now = T + 100 * MICROS
        assert rollup_boundary(now, watermark_us=now, ns=EV) == now - MICROS // 2 - 2 * MICROS - 1
        lagging = T  # persist is 100 s behind: the boundary follows the watermark, not the clock
        assert rollup_boundary(now, watermark_us=lagging, ns=EV) == lagging - 2 * MICROS - 1

    def test_boundary_excludes_every_admissible_future_event(self):
        watermark = T
        b = rollup_boundary(T + 50 * MICROS, watermark, EV)
        # Any record not yet persisted has timestamp >= watermark; its earliest admissible event_time:
        assert watermark - 2 * MICROS > b

    def test_global_watermark_waits_for_every_partition(self):
        assert global_watermark({0: 5, 1: 7}, 3) == 0
        assert global_watermark({0: 5, 1: 7, 2: 6}, 3) == 5


class TestPrepare:
    def test_rows_last_write_and_dead_letters(self):
        batch = encode_batch([m("a", 2, T - 10, "t1"), m("a", -1, T - 5, "t2"),
                              m("b", 0, T - 1, "t3", MutationOp.CLEAR)])
        records = [
            rec(batch, 0),
            rec(b"\xffgarbage", 1),
            rec(encode_mutation(m("a", 1, T - 10 * MICROS, "old")), 2),
            rec(encode_mutation(m("x", 1, T, "t", ns="be")), 3),
            rec(json.dumps({"namespace": "nope", "counter_name": "c", "delta": 1}).encode(), 4),
            rec(b"", 5, heartbeat=True),
        ]
        out = prepare(records, REGISTRY)
        assert out.rows == [("ev", "a", T - 10, "t1", "", 2, False), ("ev", "a", T - 5, "t2", "", -1, False),
                            ("ev", "b", T - 1, "t3", "", 0, True)]
        assert out.last_write == {("ev", "a"): T - 5, ("ev", "b"): T - 1}
        reasons = {d.offset: d.reason for d in out.dead}
        assert set(reasons) == {1, 2, 3, 4}
        assert reasons[1].startswith("undecodable") and "accept_limit" in reasons[2]
        assert "BEST_EFFORT" in reasons[3] and "unknown namespace" in reasons[4]
        assert all(d.value == records[d.offset].value for d in out.dead)  # original bytes kept
        headers = dict(out.dead[0].headers())
        assert headers["dlq.partition"] == b"3" and headers["dlq.offset"] == b"1"

    def test_a_record_appended_after_a_heartbeat_arrived_after_it(self):
        """CreateTime brokers: a record stamped 10 s before a heartbeat it follows reached Kafka after it."""
        late = encode_mutation(m("a", 1, T - 10 * MICROS, "late"))
        floor: dict[int, int] = {}
        out = prepare([rec(b"", 0, ts=T, heartbeat=True), rec(late, 1, ts=T - 10 * MICROS)], REGISTRY, floor)
        assert out.rows == [] and "accept_limit" in out.dead[0].reason
        assert floor == {3: T}
        # the reason says the arrival it quotes is the heartbeat's, and why (a review read it as wrong)
        assert f"its own timestamp, {micros_iso(T - 10 * MICROS)}, is older, set by its client" in out.dead[0].reason
        own = prepare([rec(late, 1, ts=T + 10 * MICROS)], REGISTRY).dead[0].reason  # its own timestamp: no note
        assert "accept_limit" in own and "its own timestamp" not in own
        # Without the heartbeat before it, its own timestamp admits it.
        assert prepare([rec(late, 1, ts=T - 10 * MICROS)], REGISTRY).rows != []

    def test_json_without_token_gets_its_kafka_position_as_identity(self):
        body = json.dumps({"namespace": "ev", "counter_name": "c", "delta": 4}).encode()
        first = prepare([rec(body, 17)], REGISTRY).rows
        again = prepare([rec(body, 17)], REGISTRY).rows  # redelivery of the same record
        assert first == again == [("ev", "c", T, "kafka:counter-mutations:3:17:0", "", 4, False)]

    def test_heartbeat_headers(self):
        assert is_heartbeat([("counter.heartbeat", b"1")]) and is_heartbeat({b"counter.heartbeat": b"1"})
        assert not is_heartbeat([("other", b"1")]) and not is_heartbeat(None)
        tracker = WatermarkTracker(skew_s=0.5)
        tracker.heartbeat_persisted(0, T)
        tracker.heartbeat_persisted(0, T - 5)  # never backwards
        assert tracker.marks([0, 1]) == {0: T - MICROS // 2}


@pytest.fixture
def stores(tmp_path):
    part = Partitioning(4, 10, 60)
    events = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: part)
    rollups = SqliteRollupStore(tmp_path / "rollups.sqlite3")
    yield events, rollups
    asyncio.run(events.close())
    asyncio.run(rollups.close())


def test_rollup_counts_only_the_immutable_window(stores):
    events, rollups = stores
    cache = InProcessRollupCache()

    async def scenario():
        rows = [("ev", "c", T + i * MICROS, f"t{i}", "", 10, False) for i in range(10)]
        await events.write_events(rows)
        await rollups.bump_last_write([("ev", "c", T + 9 * MICROS)])
        now = T + 100 * MICROS
        # The watermark says only records up to T + 6.5 s are persisted: events after T + 4.5 s may still arrive.
        held = await rollup_counter(EV, "c", events=events, rollups=rollups, cache=cache,
                                    watermark_us=T + 6 * MICROS + MICROS // 2, now_us=now)
        assert held.count == 50 and held.pending  # events at T+0..T+4 only
        assert await cache.get("ev", "c") == (50, held.rollup_ts)
        done = await rollup_counter(EV, "c", events=events, rollups=rollups, cache=cache, watermark_us=now,
                                    now_us=now)
        assert done.count == 100 and not done.pending
        # Rollups only move forward: an older boundary changes nothing.
        assert not await rollups.write_rollup("ev", "c", 7, held.rollup_ts)
        assert (await rollups.get("ev", "c")).count == 100

    asyncio.run(scenario())


def test_an_event_at_or_before_its_namespaces_rollups_is_dead_lettered_with_the_reason():
    """A raised accept_limit admits times the rollups made under the old one had passed: a review's write dated 60 s
    back was stored and never counted, nor dead-lettered. The worker's `rolled` floors refuse such an event."""
    at, after = encode_mutation(m("c", 1, T - MICROS, "at")), encode_mutation(m("c", 1, T - MICROS + 1, "after"))
    batch = prepare([rec(at), rec(after, offset=1)], REGISTRY, now_us=T + MICROS, rolled={"ev": T - MICROS})
    assert [r[3] for r in batch.rows] == ["after"] and not batch.dead
    assert [(ns, key) for ns, key, _letter in batch.behind] == [("ev", ("c", T - MICROS, "at", ""))]
    unfloored = prepare([rec(at)], REGISTRY, now_us=T + MICROS)  # a replay's: no floor
    assert [r[3] for r in unfloored.rows] == ["at"]

    class Events:  # what settle_behind asks the event store
        def __init__(self, stored: bool) -> None:
            self.stored = stored

        async def contains(self, namespace: str, keys: list) -> list[bool]:
            assert namespace == "ev" and keys == [("c", T - MICROS, "at", "")]
            return [self.stored]

    for stored in (False, True):  # not stored: dead-lettered; stored (a record delivered again): dropped
        again = prepare([rec(at)], REGISTRY, now_us=T + MICROS, rolled={"ev": T - MICROS})
        asyncio.run(settle_behind(again, Events(stored)))  # type: ignore[arg-type]
        assert not again.behind and not again.rows
        assert [d.reason for d in again.dead] == ([] if stored else [
            f"event_time {micros_iso(T - MICROS)} is at or before namespace 'ev''s rollups (up to "
            f"{micros_iso(T - MICROS)}), which no longer change: a raised accept_limit admits such times only for "
            "counters not rolled up past them"])


def test_a_unique_add_behind_the_rollups_is_looked_up_by_its_item():
    """A review: a redelivered UNIQUE add at or before the rollups was looked up with an empty item key, while it is
    stored with its item as the key: found nowhere, it was dead-lettered though counted."""
    registry = parse_namespaces({"namespaces": {"u": {"counter_type": "EVENTUAL", "aggregation": "UNIQUE"}}})
    add = encode_mutation(Mutation("u", "c", 1, T - MICROS, "t", "", MutationOp.ADD, (), "user-7"))
    batch = prepare([rec(add)], registry, now_us=T + MICROS, rolled={"u": T})
    assert [key for _ns, key, _letter in batch.behind] == [("c", T - MICROS, "t", "user-7")]
