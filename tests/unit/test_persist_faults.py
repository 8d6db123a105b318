"""The persist path under faults: a batch retried after a transient failure (or re-read after a cancelled one) is
judged as on its first pass, a poison record is dead-lettered alone instead of stalling the path, a dead letter
near the size limit still fits a DLQ record, and a failed checkpoint keeps its counters for the next one.

The real persist path, SQLite stores and librdkafka client; only the DLQ broker is a fake."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import agents.persist
from agents.persist import RawRecord, prepare
from agents.persist_consumer import PersistConsumer
from agents.watermark import HeartbeatPace, PartitionCount, WatermarkTracker
from agents.worker import Pipeline, _persist, _retrying
from control_plane import parse_namespaces
from producers.asyncio_producer import AsyncProducer
from producers.errors import DeliveryError
from schemas import MICROS, DecodeError, Mutation, MutationOp, decode_mutations, encode_mutation
from schemas.dead_letter import MAX_RECORD_BYTES, REASON, TRUNCATED, WHOLE_RECORD, DeadLetter
from sinks import Partitioning, SqliteEventStore, SqliteRollupStore
from streams.settings import Settings

REGISTRY = parse_namespaces({"namespaces": {"ev": {"counter_type": "EVENTUAL"}}})  # preset: accept_limit 5 s
T = 1_790_000_000 * MICROS  # a record timestamp in the past: the persist path refuses one stamped ahead
LIMIT = 1 << 20  # AsyncProducer's message.max.bytes


def rec(offset: int, ts: int, value: bytes = b"", heartbeat: bool = False) -> RawRecord:
    return RawRecord("counter-mutations", 0, offset, ts // 1000, b"k", value,
                     [("counter.heartbeat", b"1")] if heartbeat else ())


def write(offset: int, ts: int) -> RawRecord:
    return rec(offset, ts, encode_mutation(Mutation("ev", "c", 1, ts, f"tok{offset}", "", MutationOp.ADD)))


def lagging_batch() -> list[RawRecord]:
    """Writes appended at T..T+8 s, then a heartbeat at T+10 s: each write admitted by its own arrival only."""
    return [write(i, T + i * MICROS) for i in range(9)] + [rec(9, T + 10 * MICROS, heartbeat=True)]


class FakeKafka:
    """The DLQ broker: acknowledges at once what librdkafka would send, refuses what it would refuse for its size
    (key + value + headers over message.max.bytes: MSG_SIZE_TOO_LARGE, before anything reaches a broker)."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes | None, bytes, dict[str, bytes]]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None, *, partition: int = -1,
                headers: Any = None) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        size = len(value) + len(key or b"") + sum(len(n) + len(v or b"") for n, v in headers or ())
        if size > LIMIT:
            future.set_exception(DeliveryError(f"cannot produce to {topic!r}: MSG_SIZE_TOO_LARGE"))
        else:
            self.sent.append((key, value, dict(headers or ())))
            future.set_result(None)
        return future


async def run_pipeline(tmp_path: Path, action: Any) -> tuple[Any, Pipeline]:
    """`action(p)` on a worker pipeline over fresh SQLite stores; returns what it returned and the pipeline."""
    part = Partitioning(4, 10, 60)
    events, rollups = SqliteEventStore(tmp_path / "e.db", lambda ns: part), SqliteRollupStore(tmp_path / "r.db")
    p = Pipeline(settings=Settings(), registry=REGISTRY, events=events, rollups=rollups, buckets=None, cache=None,
                 app=None, topics=None, tracker=WatermarkTracker(1.0), mutation_partitions=PartitionCount("m", 1),
                 pressure=None, kafka=FakeKafka(), signals=None, heartbeats=HeartbeatPace(1.0))
    try:
        return await action(p), p
    finally:
        await events.close()
        await rollups.close()


async def stored(p: Pipeline) -> int:
    return (await p.events.aggregate_many("ev", [("c", 0, T + 60 * MICROS)]))[0].delta


def test_a_retried_batch_is_judged_by_the_heartbeats_before_its_records(tmp_path: Path) -> None:
    """F4: the first attempt fails after reading the batch's heartbeat; the retry must not judge the writes before
    it as arriving with it (they would be dead-lettered as 10 s late)."""
    async def action(p: Pipeline) -> int:
        real, failures = p.events.write_events, [OSError("database is locked")]

        async def flaky(rows: Any) -> int:
            if failures:
                raise failures.pop()
            return await real(rows)

        p.events.write_events = flaky
        await asyncio.wait_for(_retrying("persist", lambda: _persist(p, lagging_batch())), 10)
        return await stored(p)

    total, p = asyncio.run(run_pipeline(tmp_path, action))
    assert total == 9 and p.kafka.sent == []
    assert p.arrivals.floor == {0: T + 10 * MICROS}  # raised once stored


def test_a_batch_cancelled_before_it_was_stored_leaves_the_floor_for_its_next_reading(tmp_path: Path) -> None:
    """F4, the drain after a stop cancelled a batch: it re-reads the batch with the floor as before it."""
    async def action(p: Pipeline) -> int:
        real, blocked = p.events.write_events, asyncio.Event()

        async def hang(rows: Any) -> int:
            blocked.set()
            await asyncio.Event().wait()
            return 0

        p.events.write_events = hang
        task = asyncio.create_task(_persist(p, lagging_batch()))
        await blocked.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert p.arrivals.floor == {}
        p.events.write_events = real
        await _persist(p, lagging_batch())
        return await stored(p)

    total, p = asyncio.run(run_pipeline(tmp_path, action))
    assert total == 9 and p.kafka.sent == []


GOOD = json.dumps({"namespace": "ev", "counter_name": "c", "delta": 1}).encode()
DEEP = b"[" * 1000 + b"]" * 1000  # orjson parses it (up to 1024 levels)


def test_deeply_nested_json_is_a_decode_error() -> None:
    """F1: it used to escape the decoder as RecursionError."""
    with pytest.raises(DecodeError, match="nested deeper"):
        decode_mutations(DEEP)


def test_a_poison_record_is_dead_lettered_and_its_neighbours_stored(tmp_path: Path) -> None:
    """F1: the batch completes: the good record counted, the poison one in the DLQ with its reason."""
    records = [rec(0, T, GOOD), rec(1, T, DEEP), rec(2, T, GOOD)]

    async def action(p: Pipeline) -> int:
        await asyncio.wait_for(_retrying("persist", lambda: _persist(p, records)), 5)
        return await stored(p)

    total, p = asyncio.run(run_pipeline(tmp_path, action))
    assert total == 2
    [(_key, value, headers)] = p.kafka.sent
    assert value == DEEP and headers["dlq.offset"] == b"1" and b"nested deeper" in headers[REASON]


def test_a_rejected_mutation_that_cannot_be_re_encoded_is_dead_lettered_with_its_record_marked() -> None:
    """F1: an item of a JSON array with a token but no generation_time, stamped before 2000, takes the record time
    as event time, which Avro refuses: the DLQ gets the original record rather than prepare() raising, marked
    with the mutation's index (`dlq.whole_record`), since its neighbour was counted and re-sending the record
    would count it again. A token-less item is dead-lettered alone as its JSON (it needs no identity)."""
    good = {"namespace": "ev", "counter_name": "c", "delta": 1,
            "idempotency_token": {"token": "t1", "generation_time": T}}
    timeless = {"namespace": "ev", "counter_name": "c", "delta": 1, "idempotency_token": {"token": "t0"}}
    body = json.dumps([good, timeless]).encode()
    out = prepare([rec(5, 0, body)], REGISTRY, {0: T})
    assert [row[3] for row in out.rows] == ["t1"]
    [dead] = out.dead
    assert dead.value == body and "timestamp (0 ms) is no time" in dead.reason
    assert dict(dead.record()[2])[WHOLE_RECORD] == b"1"
    tokenless = {"namespace": "ev", "counter_name": "c", "delta": 1}
    [dead] = prepare([rec(5, 0, json.dumps([good, tokenless]).encode())], REGISTRY, {0: T}).dead
    assert json.loads(dead.value) == tokenless and WHOLE_RECORD not in dict(dead.record()[2])
    ahead = {**good, "idempotency_token": {"token": "t2", "generation_time": T + 60 * MICROS}}  # not admitted
    [alone] = prepare([rec(5, T, json.dumps([good, ahead]).encode())], REGISTRY, {0: T}).dead
    assert [m.event_id for m in decode_mutations(alone.value)] == ["t2"]  # re-encoded alone: no marker
    assert WHOLE_RECORD not in dict(alone.record()[2])


@pytest.mark.parametrize("item", [
    {"namespace": "nowhere", "counter_name": "c", "delta": 3},
    {"namespace": "nowhere", "counter_name": "c", "op": "clear"},
    {"namespace": "nowhere", "counter_name": "c", "delta": -2, "event_item_key": "k", "dimensions": {"a": "b"},
     "item": "x"},
], ids=["add", "clear", "every field"])
def test_a_token_less_item_of_a_json_array_is_dead_lettered_as_its_json_without_an_identity(item: dict) -> None:
    """A review: an unknown namespace's token-less item, dead-lettered with its Kafka position and record time as
    its identity, was refused again when `counter dlq replay` re-sent it after the fix (its time older than
    accept_limit): lost for good. Its dead letter is now its JSON, token-less, which re-sent is a new write."""
    good = {"namespace": "ev", "counter_name": "c", "delta": 1,
            "idempotency_token": {"token": "t1", "generation_time": T}}
    out = prepare([rec(5, T, json.dumps([good, item]).encode())], REGISTRY, {0: T})
    assert [row[3] for row in out.rows] == ["t1"]
    [dead] = out.dead
    assert "unknown namespace" in dead.reason and WHOLE_RECORD not in dict(dead.record()[2])
    [m] = decode_mutations(dead.value)
    assert m.event_id is None and m.event_time is None, m  # re-sent: a new record's time and position
    assert m == decode_mutations(json.dumps(item).encode())[0]


@pytest.mark.parametrize("stamped_ms", [0, -1, 946_684_799_999])  # none given, "no timestamp", 1999-12-31
def test_a_token_less_json_mutation_in_a_record_stamped_before_2000_is_dead_lettered(stamped_ms: int) -> None:
    """Its event time is its record's timestamp: with no heartbeat seen yet (no arrival floor) it was admitted at
    that time, stored behind every rollup boundary, and never counted nor dead-lettered."""
    body = json.dumps({"namespace": "ev", "counter_name": "c", "delta": 1}).encode()
    out = prepare([rec(5, stamped_ms * 1000, body), write(6, T)], REGISTRY, {})
    assert [row[3] for row in out.rows] == ["tok6"]
    [dead] = out.dead
    assert dead.value == body and f"timestamp ({stamped_ms} ms) is no time" in dead.reason


def test_an_unforeseen_exception_dead_letters_its_record_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """F1: any exception from one record (here an injected decoder bug) dead-letters it with the exception as
    reason; its neighbours, heartbeats and the arrival floor come out as without it."""
    def decode(data: bytes) -> list[Mutation]:
        if data == b"poison":
            raise RecursionError("maximum recursion depth exceeded")
        return decode_mutations(data)

    monkeypatch.setattr(agents.persist, "decode_mutations", decode)
    records = [*lagging_batch(), rec(10, T + 10 * MICROS, b"poison")]  # after the heartbeat that raised the floor
    floor: dict[int, int] = {}
    out = prepare(records, REGISTRY, floor)
    assert len(out.rows) == 9 and out.records == 11 and out.heartbeats == [(0, T + 10 * MICROS)]
    [dead] = out.dead
    assert dead.offset == 10 and dead.value == b"poison"
    assert dead.reason == "RecursionError: maximum recursion depth exceeded"
    assert floor == {0: T + 10 * MICROS}


@pytest.mark.parametrize("value", [
    b'{"namespace": "ev", "counter_name": "c", "delta": 1, "\\ud800": 1}',
    b'{"namespace": "ev", "counter_name": "c", "delta": 1, "idempotency_token": {"token": "t", "\\ud800x": 1}}',
    b'[{"namespace": "ev", "counter_name": "c", "delta": 1}, {"namespace": "ev", "counter_name": "c", "\\udfff": 1}]',
])
def test_a_field_named_by_a_lone_surrogate_is_dead_lettered_and_its_neighbours_persisted(
        value: bytes, tmp_path: Path) -> None:
    """The reason quoted the field's name, a lone surrogate the JSON parser takes: encoding its header raised, and
    the persist retried the batch forever, so nothing on any partition was counted again (a review)."""
    records = [write(0, T), rec(1, T + 1, value), write(2, T + 2)]
    out = prepare(records, REGISTRY, {})
    [dead] = out.dead
    assert dead.offset == 1 and "unknown field" in dead.reason
    assert len(out.rows) == (3 if value.startswith(b"[") else 2)  # the neighbours, and an array's valid item

    async def action(p: Pipeline) -> None:
        await asyncio.wait_for(_retrying("persist", lambda: p.send_dead_letters([dead])), 5)

    _, p = asyncio.run(run_pipeline(tmp_path, action))
    [(_key, _value, headers)] = p.kafka.sent
    reason = headers[REASON].decode("utf-8")
    assert "unknown field" in reason and "\\ud" in reason, reason


def oversized() -> DeadLetter:
    """A record the mutations topic took (value just under 1 MiB) with a long reason."""
    return DeadLetter(b"ev:c", b"[" + b" " * (1_048_450 - 2) + b"]", "undecodable record: " + "x" * 300,
                      "counter-mutations", 0, 7, T)


def test_a_dead_letter_near_the_size_limit_is_sent_truncated_with_its_reason(tmp_path: Path) -> None:
    """F3: value + dlq.* headers over message.max.bytes was refused on every retry."""
    dead = oversized()

    async def action(p: Pipeline) -> None:
        await asyncio.wait_for(_retrying("persist", lambda: p.send_dead_letters([dead])), 5)

    _, p = asyncio.run(run_pipeline(tmp_path, action))
    [(key, value, headers)] = p.kafka.sent
    assert key == b"ev:c" and dead.value.startswith(value) and len(value) > 1_000_000
    assert headers[TRUNCATED] == str(len(dead.value)).encode() and headers[REASON] == dead.reason.encode()
    assert headers["dlq.offset"] == b"7"


def test_librdkafka_takes_the_truncated_dead_letter_and_refuses_the_whole_one() -> None:
    """The fake's size rule is the client's: AsyncProducer refuses the original at once, and queues the cut one."""
    async def main() -> tuple[BaseException | None, bool]:
        producer = AsyncProducer("127.0.0.1:1", client_id="test-dlq", timeout_s=0.1)
        dead = oversized()
        whole = producer.produce("dlq", dead.value, dead.key, headers=dead.headers())
        key, value, headers = dead.record()
        cut = producer.produce("dlq", value, key, headers=headers)
        refused, queued = whole.exception() if whole.done() else None, not cut.done()
        await producer.stop(0.0)
        await asyncio.gather(cut, return_exceptions=True)  # no broker: it times out
        return refused, queued

    refused, queued = asyncio.run(main())
    assert "MSG_SIZE_TOO_LARGE" in str(refused) and queued


def test_record_cuts_a_huge_reason_and_key_too() -> None:
    dead = DeadLetter(b"k" * 500_000, b"v" * 1_048_000, "r" * 500_000, "t", 0, 1, T)
    key, value, headers = dead.record()
    size = len(key or b"") + len(value) + sum(len(n) + len(v or b"") for n, v in headers)
    assert size <= MAX_RECORD_BYTES and dict(headers)["dlq.key_truncated"] == b"500000"
    assert dict(headers)[REASON] == ("r" * 4096 + "…").encode() and dict(headers)[TRUNCATED] == b"1048000"
    small = DeadLetter(b"k", b"v", "why", "t", 0, 1, T)
    assert small.record() == (b"k", b"v", small.headers())


def test_a_failed_or_cancelled_checkpoint_keeps_its_counters_for_the_next() -> None:
    """The signals of counters whose checkpoint failed go with the next checkpoint, not the sweep's."""
    sent: list[set[tuple[str, str]]] = []
    outcomes: list[BaseException | None] = [None, asyncio.CancelledError(), OSError("broker down")]

    async def checkpoint(keys: set[tuple[str, str]]) -> None:
        error = outcomes.pop()
        if error is not None:
            raise error
        sent.append(set(keys))

    async def persist(_records: Any) -> list[tuple[str, str]]:
        return []

    async def main() -> None:
        consumer = PersistConsumer(bootstrap="unused:9092", topic="t", group_id="g", persist=persist,
                                   checkpoint=checkpoint)
        consumer._touched = {("ev", "a")}
        with pytest.raises(OSError):
            await consumer.checkpoint_now()
        consumer._touched.add(("ev", "b"))
        with pytest.raises(asyncio.CancelledError):
            await consumer.checkpoint_now()
        await consumer.checkpoint_now()
        assert consumer._touched == set()

    asyncio.run(main())
    assert sent == [{("ev", "a"), ("ev", "b")}]


def test_a_retried_batch_logs_one_traceback_and_a_rollup_batch_is_given_up_at_a_stop(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch failing for a while was a traceback every attempt; and the rollup agent's batch, which Faust waits
    for before a stop or a rebalance, held either for as long as its failure lasted. Now one traceback, then a line
    per attempt, and the rollup batch is given up once the worker stops (its counters stay stale for the sweep); a
    persist batch never is (its offsets must not be committed before it is durable)."""
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    stopping = [False]

    async def failing() -> int:
        if len(attempts) == 4:
            stopping[0] = True
        attempts.append(1)
        raise OSError("no route to the store")

    async def main() -> tuple[int | None, int]:
        given_up = await asyncio.wait_for(_retrying("rollup", failing, give_up=lambda: stopping[0]), 5)
        succeeded = await asyncio.wait_for(_retrying("persist", flaky), 5)
        return given_up, succeeded

    async def flaky() -> int:
        flaky_attempts.append(1)
        if len(flaky_attempts) < 3:
            raise OSError("busy")
        return 7

    attempts: list[int] = []
    flaky_attempts: list[int] = []
    with caplog.at_level("WARNING", logger="counter.worker"):
        assert asyncio.run(main()) == (None, 7)
    assert len(attempts) == 5
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert [r.getMessage().split(";")[0] for r in tracebacks] == ["rollup batch failed", "persist batch failed"]
    assert sum("failed again" in r.getMessage() for r in caplog.records) == 3 + 1
    assert any("given up" in r.getMessage() for r in caplog.records)


async def _no_sleep(_delay: float) -> None:
    """asyncio.sleep without the wait, still a turn of the loop."""
    await _REAL_SLEEP(0)


_REAL_SLEEP = asyncio.sleep
