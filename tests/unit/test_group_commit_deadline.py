"""A durable write fails at the producer's timeout after it arrived, not later (review: a write that gathered behind
a record in flight waited for that record's failure and then its own timeout, 5 s instead of 2.5, so the retry its
503 asked for was refused as past accept_limit, and the write was lost). The broker here never answers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from producers import DeliveryError
from producers.group_commit import GroupCommitProducer
from schemas import Mutation
from tests.unit.test_dimensions import _FakeKafka

TIMEOUT_S = 0.2


class SilentKafka(_FakeKafka):
    """What GroupCommitProducer uses of AsyncProducer; records are kept and never acknowledged (a frozen broker)."""

    bootstrap = "frozen:9092"
    timeout_s = TIMEOUT_S

    async def partitions(self, topic: str) -> int:
        return 1

    def produce(self, topic: str, value: bytes, key: bytes | None, partition: int,
                headers: Any = None) -> asyncio.Future[None]:
        self.records.append(value)
        return asyncio.get_running_loop().create_future()


def write(n: int) -> Mutation:
    return Mutation("my_dataset", f"c{n}", 1, 1_795_000_000_000_000 + n, f"t{n}")


async def failed_after(future: asyncio.Future[None], sent: float) -> float:
    with pytest.raises(DeliveryError, match=r"did not acknowledge within 0\.2s; retry with the same idempotency"):
        await asyncio.wait_for(future, 2.0)  # a bound on the test, far past the deadline
    return time.monotonic() - sent


def test_a_write_behind_a_record_in_flight_fails_at_its_own_deadline_unsent() -> None:
    kafka = SilentKafka()

    async def scenario() -> tuple[float, float, int, int]:
        producer = GroupCommitProducer(kafka, topic="t")  # type: ignore[arg-type]
        await producer.start()
        first_sent = time.monotonic()
        first = producer.send([write(1)])
        await asyncio.sleep(TIMEOUT_S / 2)  # the first record is in flight; the second gathers behind it
        second_sent = time.monotonic()
        second = producer.send([write(2)])
        waited = await asyncio.gather(failed_after(first, first_sent), failed_after(second, second_sent))
        third = producer.send([write(3)])  # the producer goes on: a new record, in flight once the first settles
        await asyncio.sleep(0)
        third.cancel()
        return *waited, len(kafka.records), producer.records_started

    first_waited, second_waited, produced, started = asyncio.run(scenario())
    assert TIMEOUT_S <= first_waited < TIMEOUT_S + 0.1
    assert TIMEOUT_S <= second_waited < TIMEOUT_S + 0.1, "the second write waited past its own deadline"
    assert produced == 1  # the second write never reached the broker: its retry is the only copy
    assert started == 3


class StampingKafka(SilentKafka):
    """Acknowledges each record at once with the timestamp `stamp(produced_us)` gives it (µs; None: no timestamp)."""

    def __init__(self, stamp: Any) -> None:
        super().__init__()
        self.stamp = stamp

    def produce(self, topic: str, value: bytes, key: bytes | None, partition: int,
                headers: Any = None) -> asyncio.Future[int | None]:
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        future.set_result(self.stamp(time.time_ns() // 1000))
        return future


@pytest.mark.parametrize(("stamp", "disagrees"), [
    (lambda now: None, False),  # the delivery report carried no timestamp
    (lambda now: now - now % 1000, False),  # librdkafka's CreateTime, or a broker's in the same millisecond
    (lambda now: now, False),  # the broker's, stamped as the record was produced (µs; before the acknowledgement)
    (lambda now: now - now % 1000 - 1000, True),  # a millisecond before the record was produced: a clock behind
    (lambda now: now + 2_000_000, True),  # after the acknowledgement by this clock: a clock ahead
], ids=["none", "same-ms", "later", "behind", "ahead"])
def test_an_acknowledgement_carries_the_records_timestamp_only_when_this_clock_disagrees(stamp: Any,
                                                                                        disagrees: bool) -> None:
    """None tells the API that its own judgement of each write (by its clock) stands; a timestamp, that each write
    must be judged again by it (query_api.service.refused_by_record)."""
    stamps: list[int | None] = []
    kafka = StampingKafka(lambda now: stamps.append(stamp(now)) or stamps[-1])

    async def scenario() -> int | None:
        producer = GroupCommitProducer(kafka, topic="t")  # type: ignore[arg-type]
        await producer.start()
        return await asyncio.wait_for(producer.send([write(1)]), 2.0)
    settled = asyncio.run(scenario())
    assert settled == (stamps[0] if disagrees else None)
    assert not disagrees or settled is not None


def test_the_producer_says_since_when_every_record_failed_until_one_is_acknowledged() -> None:
    """What the API's /readyz reads (a review: a broker that answered metadata and refused every produce, a topic
    recreated with another partition count, read as ready beside a 503 for every write)."""
    kafka = SilentKafka()
    records: list[asyncio.Future[None]] = []

    def produce(topic: str, value: bytes, key: bytes | None, partition: int, headers: Any = None) -> asyncio.Future:
        records.append(asyncio.get_running_loop().create_future())
        return records[-1]
    kafka.produce = produce  # type: ignore[method-assign]

    async def scenario() -> list[tuple[bool, str]]:
        producer = GroupCommitProducer(kafka, topic="t")  # type: ignore[arg-type]
        await producer.start()
        seen = [(producer.failing_since is not None, producer.last_failure)]
        first = producer.send([write(1)])
        await asyncio.sleep(0)
        records[0].set_exception(RuntimeError("Broker: Unknown topic or partition"))
        with pytest.raises(DeliveryError):
            await first
        seen.append((producer.failing_since is not None, producer.last_failure))
        second = producer.send([write(2)])
        await asyncio.sleep(0)
        records[1].set_result(None)
        await second
        seen.append((producer.failing_since is not None, producer.last_failure))
        return seen

    assert asyncio.run(scenario()) == [(False, ""), (True, "Broker: Unknown topic or partition"),
                                       (False, "Broker: Unknown topic or partition")]


def test_readyz_fails_the_broker_while_every_write_fails() -> None:
    from types import SimpleNamespace

    from query_api.routes.ops import _writes_failing

    now = time.monotonic()
    producer = SimpleNamespace(failing_since=now - 3.0, last_failure="Broker: Unknown topic or partition",
                               last_failure_at=now - 0.5)
    said = _writes_failing(SimpleNamespace(producer=producer))  # type: ignore[arg-type]
    assert said is not None and said.startswith("failed: every durable write for 3.")
    assert said.endswith("was refused (Broker: Unknown topic or partition)"), said
    producer.last_failure_at = now - 6.0  # none since: a not-ready API would get no write to show the broker back
    assert _writes_failing(SimpleNamespace(producer=producer)) is None  # type: ignore[arg-type]
    producer.failing_since, producer.last_failure_at = None, now
    assert _writes_failing(SimpleNamespace(producer=producer)) is None  # type: ignore[arg-type]
