"""Record timestamps ahead of the worker's clock, and batch records with invalid items (`agents.persist.prepare`).

On a CreateTime broker (the local Tansu) any client sets a record's timestamp. A review found that:

* a client's empty record with the heartbeat header, stamped 10 minutes ahead, was taken as a heartbeat: it raised
  its partition's arrival floor 10 minutes into the future (published, so it survived restarts) and every valid
  record after it was dead-lettered as having reached Kafka long after its event;
* a token-less record stamped an hour ahead was stored with that hour as its event time: accepted, and counted by
  no rollup for an hour;
* one invalid item of a MutationBatch or JSON array dead-lettered the whole record, its valid neighbours uncounted.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from agents.persist import PublishedFloor, RawRecord, prepare
from agents.watermark import heartbeat_skew_s
from agents.worker import _persist
from control_plane import parse_namespaces
from schemas import MICROS, DecodeError, Mutation, MutationOp, decode_mutations, encode_batch, encode_mutation
from schemas.codec import InvalidItems, mutation_body, record_of_bodies
from sinks import arrival_keys
from tests.unit.test_arrival_floors import TOPIC, Stack, hand_over, heartbeat, run

NOW = 1_790_000_000 * MICROS  # the worker's clock in these tests
REGISTRY = parse_namespaces({"namespaces": {
    "ev": {"counter_type": "EVENTUAL", "accept_limit": "5s", "max_clock_skew": "1s"},
    "lax": {"counter_type": "EVENTUAL", "accept_limit": "60s", "max_clock_skew": "30s"},
    "be": {"counter_type": "BEST_EFFORT"}}})
MINUTE = 60 * MICROS


def rec(value: bytes, offset: int, ts_us: int, partition: int = 3) -> RawRecord:
    return RawRecord(TOPIC, partition, offset, ts_us // 1000, b"k", value)


def hb(offset: int, ts_us: int, partition: int = 3) -> RawRecord:
    return heartbeat(offset, ts_us, partition)


def plain(counter: str, ns: str = "ev", **extra: object) -> bytes:
    return json.dumps({"namespace": ns, "counter_name": counter, "delta": 1, **extra}).encode()


def tokened(counter: str, event_time_us: int, token: str, ns: str = "ev") -> bytes:
    return encode_mutation(Mutation(ns, counter, 1, event_time_us, token, "", MutationOp.ADD))


# -- heartbeats ----------------------------------------------------------------------------------------------------


def test_the_heartbeat_skew_is_the_largest_skew_of_the_namespaces_with_rollups() -> None:
    assert heartbeat_skew_s(REGISTRY.values()) == 30.0
    assert heartbeat_skew_s(parse_namespaces({"namespaces": {"be": {"counter_type": "BEST_EFFORT"}}}).values()) == 1.0


@pytest.mark.parametrize("ahead_us", [10 * MINUTE, (4_102_444_800 * MICROS) - NOW], ids=["10 min", "year 2100"])
def test_a_heartbeat_stamped_ahead_of_the_clock_is_dead_lettered_and_raises_no_floor(ahead_us: int) -> None:
    floor = {3: NOW - MICROS}
    records = [hb(0, NOW + ahead_us), rec(plain("a"), 1, NOW), rec(tokened("b", NOW, "t"), 2, NOW)]
    out = prepare(records, REGISTRY, floor, now_us=NOW)
    assert out.heartbeats == [] and floor == {3: NOW - MICROS}
    assert [(r[1], r[5]) for r in out.rows] == [("a", 1), ("b", 1)]  # the valid records after it are counted
    [dead] = out.dead
    assert dead.offset == 0 and dead.value == b""
    assert dead.reason.startswith(f"heartbeat (header counter.heartbeat) stamped {(NOW + ahead_us) // 1000} ms, "
                                  f"{ahead_us / MICROS:.3f}s ahead of this worker's clock"), dead.reason
    assert "not taken as a heartbeat" in dead.reason
    assert out.records == 3


def test_a_heartbeat_of_a_worker_whose_clock_is_ahead_within_the_skew_is_taken() -> None:
    floor: dict[int, int] = {}
    out = prepare([hb(0, NOW + 30 * MICROS), rec(tokened("a", NOW, "t", ns="lax"), 1, NOW)], REGISTRY, floor,
                  now_us=NOW)
    assert out.heartbeats == [(3, NOW + 30 * MICROS)] and floor == {3: NOW + 30 * MICROS} and not out.dead


def test_a_published_floor_ahead_of_the_clock_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    seed = PublishedFloor(TOPIC, 3, 4, (NOW + 10 * MINUTE) // 1000, None, b"", [("counter.heartbeat", b"1")])
    floor: dict[int, int] = {}
    with caplog.at_level(logging.WARNING, "counter.persist"):
        out = prepare([seed, rec(plain("a"), 5, NOW)], REGISTRY, floor, now_us=NOW)
    assert not out.dead and not out.heartbeats and floor == {}  # no dead letter: it is no record of the topic
    assert [r[1] for r in out.rows] == ["a"]
    assert any("arrival floor published for" in r.getMessage() and "not trusted" in r.getMessage()
               for r in caplog.records)


def test_the_next_owner_ignores_a_forged_floor_published_in_the_store(tmp_path: Path) -> None:
    """The floor a forged heartbeat had raised, published before the fix: the next owner of the partition loads it,
    and without the check dead-lettered every valid record after it (`event_time ... before the record reached
    Kafka`) at every handover, the store keeping the highest floor it was given."""
    async def scenario(stack: Stack) -> tuple[list[str], list[str]]:
        b, _counted = await hand_over(stack)  # a floor at T (in the past) published for partition 0, from offset 2
        now = time.time_ns() // 1000
        from_key, floor_key = arrival_keys(TOPIC)
        await stack.rollups.set_watermarks(floor_key, {0: now + 10 * MINUTE})  # what a forged heartbeat left
        await stack.rollups.set_watermarks(from_key, {0: 2})
        m = Mutation("ev", "c", 1, now, "fresh", "", MutationOp.ADD)
        await _persist(b, [RawRecord(TOPIC, 0, 2, now // 1000, b"k", encode_mutation(m))])
        reasons = [headers["dlq.reason"].decode() for _key, _value, headers in b.kafka.sent]
        return reasons, [e[3] for e in await stack.events.scan("ev", "c", 0, now + MINUTE, limit=10)]

    reasons, stored = run(tmp_path, scenario)
    assert reasons == [] and stored == ["early", "fresh"]


# -- records stamped ahead -----------------------------------------------------------------------------------------


def test_a_token_less_record_stamped_an_hour_ahead_is_dead_lettered_with_its_timestamp() -> None:
    out = prepare([rec(plain("x"), 0, NOW + 60 * MINUTE), rec(plain("y"), 1, NOW)], REGISTRY, now_us=NOW)
    assert [r[1] for r in out.rows] == ["y"]
    [dead] = out.dead
    # written with the identity it was given, not as the raw record: read again an hour later (a redelivery) it is
    # counted with that identity, and a re-sent dead letter is then the same event, not a second one (review)
    [kept] = decode_mutations(dead.value)
    assert (kept.event_id, kept.event_time) == ("kafka:counter-mutations:3:0:0", NOW + 60 * MINUTE) and dead.offset == 0
    later = prepare([rec(plain("x"), 0, NOW + 60 * MINUTE)], REGISTRY, now_us=NOW + 60 * MINUTE)
    assert [(r[2], r[3]) for r in later.rows] == [(kept.event_time, kept.event_id)]
    assert dead.reason.startswith("record timestamp 2026-09-21T15:13:20.000000Z is 3600.000s ahead of the worker's "
                                  "clock (2026-09-21T14:13:20.000000Z)"), dead.reason
    assert "namespace 'ev' allows max_clock_skew=1.0s" in dead.reason
    # its arrival asks no heartbeats for an hour: a worker's arrival is at most its clock plus the heartbeat skew
    assert out.written == {3: NOW}
    assert out.last_write == {("ev", "y"): NOW}


def test_a_record_stamped_ahead_is_dead_lettered_with_or_without_a_generation_time() -> None:
    ahead = NOW + 60 * MINUTE
    records = [rec(tokened("now", NOW, "t1"), 0, ahead),  # was dead-lettered as 3600 s "before" reaching Kafka
               rec(tokened("later", ahead, "t2"), 1, ahead)]  # was admitted, counted by no rollup for an hour
    out = prepare(records, REGISTRY, now_us=NOW)
    assert out.rows == [] and out.last_write == {}
    assert [d.offset for d in out.dead] == [0, 1]
    assert all(d.reason.startswith("record timestamp 2026-09-21T15:13:20.000000Z is 3600.000s ahead")
               for d in out.dead), [d.reason for d in out.dead]


def test_within_the_skew_a_record_stamped_ahead_is_admitted() -> None:
    out = prepare([rec(plain("x"), 0, NOW + MICROS)], REGISTRY, now_us=NOW)
    assert out.rows == [("ev", "x", NOW + MICROS, f"kafka:{TOPIC}:3:0:0", "", 1, False)] and not out.dead


def test_each_namespace_judges_a_record_stamped_ahead_by_its_own_skew() -> None:
    """`lax` allows 30 s of clock skew, `ev` 1 s: of one record stamped 10 s ahead, only `ev`'s mutation is refused,
    dead-lettered alone with the identity it was given."""
    ts = NOW + 10 * MICROS
    value = json.dumps([{"namespace": "ev", "counter_name": "a", "delta": 1},
                        {"namespace": "lax", "counter_name": "b", "delta": 2},
                        {"namespace": "nope", "counter_name": "c", "delta": 3}]).encode()
    out = prepare([rec(value, 7, ts)], REGISTRY, now_us=NOW)
    assert out.rows == [("lax", "b", ts, f"kafka:{TOPIC}:3:7:1", "", 2, False)]
    first, unknown = out.dead
    assert first.reason.startswith("record timestamp") and "namespace 'ev' allows max_clock_skew=1.0s" in first.reason
    assert decode_mutations(first.value) == [Mutation("ev", "a", 1, ts, f"kafka:{TOPIC}:3:7:0", "", MutationOp.ADD)]
    assert unknown.reason == "unknown namespace 'nope'"


def test_consumer_lag_never_rejects_a_record_for_its_timestamp() -> None:
    out = prepare([rec(plain("x"), 0, NOW - 60 * MINUTE)], REGISTRY, now_us=NOW)  # read an hour after it arrived
    assert len(out.rows) == 1 and not out.dead


def test_prepare_reads_the_wall_clock_by_default() -> None:
    now = time.time_ns() // 1000
    out = prepare([rec(plain("x"), 0, now + 60 * MINUTE), rec(plain("y"), 1, now)], REGISTRY)
    assert [r[1] for r in out.rows] == ["y"] and len(out.dead) == 1


# -- batch records with invalid items ------------------------------------------------------------------------------


def valid(counter: str, token: str, ns: str = "ev") -> Mutation:
    return Mutation(ns, counter, 1, NOW, token, "", MutationOp.ADD)


def unvalidated(*ms: Mutation) -> bytes:
    """A MutationBatch of these mutations as any Avro writer could send it: not validated."""
    return record_of_bodies([mutation_body(m) for m in ms])


@pytest.mark.parametrize("bad, field", [
    (Mutation("ev", "a b", 1, NOW, "bad", "", MutationOp.ADD), "counter_name"),
    (Mutation("ev", "c", 1, 10, "bad", "", MutationOp.ADD), "event_time"),
], ids=["counter name", "event time 10"])
@pytest.mark.parametrize("position", [0, 1])
def test_an_invalid_item_of_a_mutation_batch_is_dead_lettered_alone(bad: Mutation, field: str, position: int) -> None:
    items = [valid("ok", "t1")]
    items.insert(position, bad)
    out = prepare([rec(unvalidated(*items), 0, NOW)], REGISTRY, now_us=NOW)
    assert out.rows == [("ev", "ok", NOW, "t1", "", 1, False)] and out.last_write == {("ev", "ok"): NOW}
    [dead] = out.dead
    assert dead.reason.startswith(f"undecodable mutation: MutationBatch item {position}: field '{field}'"), dead.reason
    assert dead.whole_record_of is None
    assert dead.value == record_of_bodies([mutation_body(bad)])  # the item alone: re-sent, no neighbour counts again
    with pytest.raises(DecodeError):
        decode_mutations(dead.value)


def test_a_json_array_counts_its_valid_items_and_dead_letters_each_invalid_one_alone() -> None:
    value = json.dumps([{"namespace": "ev", "counter_name": "a", "delta": 1}, {"namespace": "ev", "counter_name": "x",
                        "delta": "zz"}, {"namespace": "ev", "counter_name": "b", "delta": 2}, 5]).encode()
    out = prepare([rec(value, 9, NOW)], REGISTRY, now_us=NOW)
    # the valid items keep their index in the record, and so their identity
    assert out.rows == [("ev", "a", NOW, f"kafka:{TOPIC}:3:9:0", "", 1, False),
                        ("ev", "b", NOW, f"kafka:{TOPIC}:3:9:2", "", 2, False)]
    delta, number = out.dead
    assert delta.reason.startswith("undecodable mutation: JSON array item 1: field 'delta'"), delta.reason
    assert json.loads(delta.value) == {"namespace": "ev", "counter_name": "x", "delta": "zz"}
    assert number.reason == "undecodable mutation: JSON array item 3: must be an object, got int"
    assert number.value == b"5"


def test_a_batch_of_one_invalid_item_is_dead_lettered_as_its_record() -> None:
    value = json.dumps([{"namespace": "ev", "counter_name": "x", "delta": "zz"}]).encode()
    [dead] = prepare([rec(value, 0, NOW)], REGISTRY, now_us=NOW).dead
    assert dead.value == value and dead.reason.startswith("undecodable record: JSON array item 0: field 'delta'")


def test_the_codec_names_the_first_invalid_item_and_keeps_the_valid_ones() -> None:
    bad = Mutation("ev", "a b", 1, NOW, "bad", "", MutationOp.ADD)
    with pytest.raises(InvalidItems) as raised:
        decode_mutations(unvalidated(valid("a", "t1"), bad, valid("b", "t2"), bad))
    exc = raised.value
    assert str(exc).startswith("MutationBatch item 1: field 'counter_name'") and exc.field == "counter_name"
    assert exc.valid == [(0, valid("a", "t1")), (2, valid("b", "t2"))]
    assert [(r.index, r.field) for r in exc.rejected] == [(1, "counter_name"), (3, "counter_name")]
    # a v2 batch (dimensions, items): its invalid item alone is a v2 CountMutation
    v2 = encode_batch([valid("a", "t1")._replace(item="i")])
    bad_v2 = bad._replace(item="j")
    with pytest.raises(InvalidItems) as raised:
        decode_mutations(record_of_bodies([mutation_body(valid("a", "t1")._replace(item="i")),
                                           mutation_body(bad_v2)], v2=True))
    assert raised.value.valid == [(0, decode_mutations(v2)[0])]
    assert raised.value.rejected[0].alone == record_of_bodies([mutation_body(bad_v2)], v2=True)


def test_refused_heartbeats_are_said_once_a_minute_not_per_record(caplog: pytest.LogCaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every heartbeat is refused while this worker's clock is behind by more than the skew, and rollups stand
    still: one warning names it (a review found only a line per dead letter at INFO)."""
    import agents.persist as persist

    monkeypatch.setattr(persist, "_heartbeat_warned", -persist.HEARTBEAT_WARN_EVERY_S)
    caplog.set_level(logging.WARNING, logger="counter.persist")
    for offset in range(3):
        prepare([heartbeat(offset, NOW + 10 * MINUTE)], REGISTRY, now_us=NOW)
    warned = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(warned) == 1 and "this worker's clock is behind" in warned[0], warned


def test_an_invalid_item_with_no_json_spelling_is_dead_lettered_as_its_record() -> None:
    """An item with "delta": 1e400 was dead-lettered alone as `..."delta":Infinity}`, which is not JSON (review):
    its dead letter keeps the whole record, marked with its index, and its neighbour is still counted."""
    value = b'[{"namespace":"ev","counter_name":"a","delta":1},{"namespace":"ev","counter_name":"x","delta":1e400}]'
    out = prepare([rec(value, 4, NOW)], REGISTRY, now_us=NOW)
    assert [r[1] for r in out.rows] == ["a"]
    [dead] = out.dead
    assert dead.value == value and dead.whole_record_of == 1, dead


@pytest.mark.parametrize(("reason", "kind"), [
    ("record timestamp 2026-09-21T15:13:20.000000Z is 3600.000s ahead of the worker's clock", "stamped_ahead"),
    ("heartbeat (header counter.heartbeat) stamped 1795727103595 ms, 599.885s ahead", "heartbeat_ahead"),
])
def test_the_dlq_metric_names_records_stamped_ahead(reason: str, kind: str) -> None:
    from agents.metrics import dlq_kind

    assert dlq_kind(reason) == kind



def test_a_token_without_a_generation_time_is_dead_lettered_with_the_time_it_was_given() -> None:
    """It takes its record's timestamp as its event time: dead-lettered as it arrived, each re-send (a `dlq replay
    --force`, or one beside a `counter replay`) was another event under the same token (a review: 5, then 10, then
    15). Its letter now holds the token and that time, so any re-send is the same event."""
    stamped = NOW - 2 * MICROS
    value = plain("c", ns="unknown", idempotency_token={"token": "t-1"})
    batch = prepare([rec(value, 7, stamped)], REGISTRY, now_us=NOW)
    [letter] = batch.dead
    [m] = decode_mutations(letter.value)
    assert (m.namespace, m.counter_name, m.event_id, m.event_time, m.delta) == ("unknown", "c", "t-1", stamped, 1)
    assert "unknown namespace" in letter.reason
    kept = prepare([rec(plain("c", ns="unknown"), 8, stamped)], REGISTRY, now_us=NOW)  # token-less: as it arrived
    assert kept.dead[0].value == plain("c", ns="unknown")
