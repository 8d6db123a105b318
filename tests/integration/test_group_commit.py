"""GroupCommitProducer and SignalSender over AsyncProducer, against the real session broker; topics read back by an
independent aiokafka consumer (tests.helpers.read_all) and decoded."""

from __future__ import annotations

import asyncio
import random
import socket
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from producers.asyncio_producer import AsyncProducer
from producers.errors import DeliveryError
from producers.group_commit import RETRY_RULE, GroupCommitProducer
from schemas import Mutation, MutationOp, counter_key, decode_mutations, decode_signals
from schemas.record_headers import READ_YOUR_WRITE_HEADER, has_header
from streams.signals import SIGNALS_PER_RECORD, SignalSender
from streams.topics import signal_partition
from tests.helpers import make_topic, read_all, silent_broker

pytestmark = pytest.mark.integration

NOW_US = time.time_ns() // 1000
PARTITIONS = 4


def mutation(i: int, prefix: str = "tok") -> Mutation:
    if i % 10 == 9:
        return Mutation("my_dataset", f"c{i % 7}", 0, NOW_US + i, f"{prefix}-{i}", "", MutationOp.CLEAR)
    return Mutation("my_dataset", f"c{i % 7}" if i % 3 else f"видео-{i % 5}", i - 50, NOW_US + i, f"{prefix}-{i}",
                    "k" if i % 4 == 0 else "")


def run(scenario: Callable[[], Awaitable[Any]], timeout: float = 60.0) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout))


class Observed:
    """A GroupCommitObserver that keeps what it is told."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.done: list[tuple[float, bool]] = []
        self.held: list[bool] = []

    def record_sent(self, mutations: int) -> None:
        self.sent.append(mutations)

    def record_done(self, seconds: float, ok: bool) -> None:
        self.done.append((seconds, ok))

    def record_held(self, gave_up: bool) -> None:
        self.held.append(gave_up)


async def group_commit(bootstrap: str, topic: str, max_in_flight: int = 1, producer: Any = None,
                       observer: Observed | None = None,
                       hold_max_s: float = 0.0) -> tuple[AsyncProducer, GroupCommitProducer]:
    kafka = producer or AsyncProducer(bootstrap, client_id="test-group-commit", timeout_s=10.0)
    gc = GroupCommitProducer(kafka, topic=topic, max_in_flight=max_in_flight, observer=observer,
                             hold_max_s=hold_max_s)
    await gc.start()
    return kafka, gc


def records_of(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, list[Mutation]]]:
    """(partition, key, mutations) per record, in offset order per partition."""
    return [(r.partition, r.key, decode_mutations(r.value)) for r in read_all(bootstrap, topic)]


# --------------------------------------------------------------------------- group commit


def test_concurrent_writes_of_one_loop_pass_become_one_record(kafka_bootstrap: str, topic_name: str) -> None:
    make_topic(kafka_bootstrap, topic_name, PARTITIONS)
    ms = [mutation(i) for i in range(150)]

    async def scenario() -> list[asyncio.Future[None]]:
        kafka, gc = await group_commit(kafka_bootstrap, topic_name)
        futures: list[asyncio.Future[None]] = []

        async def write(m: Mutation) -> None:  # one request handler each, all started in the same pass
            future = gc.send([m])
            futures.append(future)
            await future

        await asyncio.gather(*(write(m) for m in ms))
        assert gc.records_sent == 1
        await gc.stop()
        await kafka.stop()
        return futures

    futures = run(scenario)
    assert len({id(f) for f in futures}) == 1  # every write shares the record's acknowledgement
    [(_partition, key, received)] = records_of(kafka_bootstrap, topic_name)
    assert received == ms and key is None


@pytest.mark.parametrize("hold_max_s", [0.002, 0.0], ids=["held", "unheld"])
def test_closed_loop_clients_in_two_cohorts_join_one_record_when_held(kafka_bootstrap: str, topic_name: str,
                                                                      hold_max_s: float) -> None:
    """16 clients, each sending its next write once the last is answered, start as two cohorts of 8 (the second
    arrives while the first one's record is in flight). Unheld they ride every other record for good; held
    (producers.cohort_hold), the second cohort's record waits for the first one's clients and they ride together."""
    make_topic(kafka_bootstrap, topic_name, PARTITIONS)
    writes_each = 30
    observed = Observed()

    async def scenario() -> None:
        kafka, gc = await group_commit(kafka_bootstrap, topic_name, observer=observed, hold_max_s=hold_max_s)

        async def client(c: int) -> None:
            for i in range(writes_each):
                await gc.send([Mutation("my_dataset", f"c{c}", 1, NOW_US + i, f"h-{c}-{i}")])

        first = [asyncio.ensure_future(client(c)) for c in range(8)]
        await asyncio.sleep(0)  # the first cohort's record is produced at the end of this pass
        await asyncio.gather(*first, *(client(c) for c in range(8, 16)))
        await gc.stop()
        await kafka.stop()

    run(scenario)
    records = records_of(kafka_bootstrap, topic_name)
    assert sum(len(ms) for _p, _k, ms in records) == 16 * writes_each  # every write, once
    assert Counter(m.counter_name for _p, _k, ms in records for m in ms) == {f"c{c}": writes_each for c in range(16)}
    steady = [len(ms) for _p, _k, ms in records][2:-2]  # the first two are each cohort's first; the last, the tail
    mean = statistics.mean(steady)
    if hold_max_s:
        assert mean >= 12, f"held: records of {steady}"
        assert False in observed.held  # the hold that joined the cohorts ended as the first one's clients came back
    else:
        assert mean <= 10, f"unheld: records of {steady}"
        assert observed.held == []


def test_a_pass_holding_a_read_your_write_write_marks_its_record_and_only_that_one(kafka_bootstrap: str,
                                                                                   topic_name: str) -> None:
    """AddAndGetCount's writes ask the persist consumer to hurry (agents.persist_consumer); plain writes do not."""
    make_topic(kafka_bootstrap, topic_name, PARTITIONS)

    async def scenario() -> None:
        kafka, gc = await group_commit(kafka_bootstrap, topic_name)
        await gc.send([mutation(0)])  # a plain pass
        await asyncio.gather(gc.send([mutation(1)]), gc.send([mutation(2)], read_your_write=True),
                             gc.send([mutation(3)]))  # one pass, one of its writes waited on
        await gc.send([mutation(4)])  # plain again: the mark does not stick
        await gc.stop()
        await kafka.stop()

    run(scenario)
    records = read_all(kafka_bootstrap, topic_name)
    marked = {tuple(m.event_id for m in decode_mutations(r.value)): has_header(r.headers, READ_YOUR_WRITE_HEADER)
              for r in records if r.value}
    assert marked == {("tok-0",): False, ("tok-1", "tok-2", "tok-3"): True, ("tok-4",): False}


def test_the_observer_sees_each_records_writes_and_its_acknowledgement_time(kafka_bootstrap: str,
                                                                            topic_name: str) -> None:
    """What the API exports as metrics (writes per record, the broker's acknowledgement time) is what was sent."""
    make_topic(kafka_bootstrap, topic_name, PARTITIONS)
    observed = Observed()

    async def scenario() -> float:
        kafka, gc = await group_commit(kafka_bootstrap, topic_name, observer=observed)
        started = time.perf_counter()
        await gc.send([mutation(0)])
        await asyncio.gather(gc.send([mutation(1), mutation(2)]), gc.send([mutation(3)]))  # one pass, one record
        took = time.perf_counter() - started
        await gc.stop()
        await kafka.stop()
        return took

    took = run(scenario)
    assert observed.sent == [1, 3]
    assert [ok for _, ok in observed.done] == [True, True]
    assert all(0 < seconds <= took for seconds, _ in observed.done)
    assert sorted(len(ms) for _, _, ms in records_of(kafka_bootstrap, topic_name)) == observed.sent  # per partition


def test_a_lone_write_is_sent_at_the_end_of_its_pass(kafka_bootstrap: str, topic_name: str) -> None:
    make_topic(kafka_bootstrap, topic_name, PARTITIONS)

    async def scenario() -> list[float]:
        kafka, gc = await group_commit(kafka_bootstrap, topic_name)
        await asyncio.wait_for(gc.send([mutation(0, "warm-up")]), 10)  # connection and producer id
        took = []
        for i in range(1, 8):
            started = time.perf_counter()
            future = gc.send([mutation(i)])
            assert gc.records_sent == i  # not before the end of the pass...
            await asyncio.sleep(0)
            assert gc.records_sent == i + 1  # ...and right at it: no timer to wait out
            await asyncio.wait_for(future, 10)
            took.append(time.perf_counter() - started)
        await gc.stop()
        await kafka.stop()
        return took

    took = run(scenario)
    assert statistics.median(took) < 0.1, took
    assert [len(ms) for _, _, ms in records_of(kafka_bootstrap, topic_name)] == [1] * 8


class HeldAcks:
    """An AsyncProducer whose acknowledgements reach the caller only once the test releases them (the records
    themselves go to the broker at once): a broker that is slow to acknowledge, on demand."""

    def __init__(self, inner: AsyncProducer) -> None:
        self.inner = inner
        self.bootstrap = inner.bootstrap
        self.timeout_s = inner.timeout_s
        self.released = asyncio.Event()
        self.produced = 0

    def start(self) -> None:
        self.inner.start()

    async def partitions(self, topic: str, timeout_s: float = 3.0) -> int:
        return await self.inner.partitions(topic, timeout_s)

    def produce(self, topic: str, value: bytes, key: bytes | None = None, *, partition: int = -1,
                headers: Any = None) -> asyncio.Future[None]:
        acknowledged = self.inner.produce(topic, value, key, partition=partition, headers=headers)
        self.produced += 1

        async def held() -> None:
            await acknowledged
            await self.released.wait()

        return asyncio.ensure_future(held())


@pytest.mark.parametrize("max_in_flight", [1, 2])
def test_writes_arriving_while_records_are_in_flight_gather_into_the_next(kafka_bootstrap: str, topic_name: str,
                                                                          max_in_flight: int) -> None:
    make_topic(kafka_bootstrap, topic_name, PARTITIONS)
    first = [mutation(i, "first") for i in range(max_in_flight)]
    later = [mutation(i, "later") for i in range(40)]

    async def scenario() -> None:
        held = HeldAcks(AsyncProducer(kafka_bootstrap, client_id="test-held", timeout_s=10.0))
        kafka, gc = await group_commit(kafka_bootstrap, topic_name, max_in_flight, producer=held)
        in_flight = []
        for m in first:  # one record per pass, up to max_in_flight of them
            in_flight.append(gc.send([m]))
            await asyncio.sleep(0)
        assert held.produced == max_in_flight
        gathered = []
        for i, m in enumerate(later):  # over many passes of the loop, some writes in the same pass
            gathered.append(gc.send([m]))
            if i % 3 == 0:
                await asyncio.sleep(0)
        await asyncio.sleep(0.05)  # the held records' real acknowledgements arrive meanwhile
        assert held.produced == max_in_flight and not any(f.done() for f in in_flight + gathered)
        assert len({id(f) for f in gathered}) == 1
        held.released.set()
        await asyncio.wait_for(asyncio.gather(*in_flight, *gathered), 10)
        assert held.produced == max_in_flight + 1
        await gc.stop()
        await kafka.inner.stop()

    run(scenario)
    records = [[m.event_id for m in ms] for _, _, ms in records_of(kafka_bootstrap, topic_name)]
    assert sorted(records) == sorted([[m.event_id] for m in first] + [[m.event_id for m in later]])


def test_every_acknowledged_write_is_in_the_topic_exactly_once(kafka_bootstrap: str, topic_name: str) -> None:
    make_topic(kafka_bootstrap, topic_name, PARTITIONS)
    rng = random.Random(7)
    requests = [[mutation(i * 3 + j, f"load-{i}") for j in range(rng.choice([1, 1, 1, 3]))] for i in range(1500)]

    async def scenario() -> int:
        kafka, gc = await group_commit(kafka_bootstrap, topic_name)
        queue = list(requests)

        async def client() -> None:  # 48 clients, each writing one request at a time
            while queue:
                batch = queue.pop()
                await gc.send(batch)
                for _ in range(rng.randrange(3)):
                    await asyncio.sleep(0)

        await asyncio.gather(*(client() for _ in range(48)))
        await gc.stop()
        await kafka.stop()
        return gc.records_sent

    records_sent = run(scenario, timeout=120)
    records = records_of(kafka_bootstrap, topic_name)
    assert len(records) == records_sent < len(requests) / 5, "concurrent writes should share records"
    received = Counter(m for _, _, ms in records for m in ms)
    assert received == Counter(m for batch in requests for m in batch)
    assert set(received.values()) == {1}
    assert {partition for partition, _, _ in records} == set(range(PARTITIONS))  # records rotate
    for _, _, ms in records:  # a request's mutations travel in one record, in order
        tokens = [m.event_id for m in ms]
        for batch in requests:
            if batch[0].event_id in tokens:
                start = tokens.index(batch[0].event_id)
                assert tokens[start:start + len(batch)] == [m.event_id for m in batch]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_broker_fails_writes_with_the_retry_rule() -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"

    async def scenario() -> None:
        kafka, gc = await group_commit(bootstrap, "counter-mutations")  # start-up fails, retried in the background
        try:
            started = time.monotonic()
            with pytest.raises(DeliveryError) as info:
                await asyncio.wait_for(gc.send([mutation(1)]), 5)
            assert time.monotonic() - started < 1.0  # at once: nothing can be sent
            assert RETRY_RULE in str(info.value) and bootstrap in str(info.value)
        finally:
            await gc.stop()
            await kafka.stop(timeout_s=1.0)

    run(scenario, timeout=30)


def test_a_broker_that_does_not_answer_fails_records_in_flight_and_gathered() -> None:
    observed = Observed()

    async def scenario() -> None:
        async with silent_broker() as (bootstrap, connections):
            kafka = AsyncProducer(bootstrap, client_id="test-silent", timeout_s=1.0)
            gc = GroupCommitProducer(kafka, topic="counter-mutations", observer=observed)
            try:
                await gc.start()
                assert connections, "the producer never reached the silent broker"
                gc._partitions = 2  # as if the broker had answered at start-up and then fell silent
                started = time.monotonic()
                in_flight = gc.send([mutation(1)])
                await asyncio.sleep(0)
                gathered = gc.send([mutation(2), mutation(3)])  # waits for the record in flight
                assert gathered is not in_flight
                for future in (in_flight, gathered):
                    with pytest.raises(DeliveryError) as info:
                        await asyncio.wait_for(future, 10)
                    assert RETRY_RULE in str(info.value) and "did not acknowledge" in str(info.value)
                assert time.monotonic() - started < 2.5  # each at the producer's timeout (1 s) after it came
                # the gathered writes failed at their own deadline, never produced: only their retry reaches Kafka
                assert observed.sent == [1]
                deadline = time.monotonic() + 10
                while not observed.done:  # librdkafka fails the record in flight at its own timeout
                    assert time.monotonic() < deadline, "the record in flight never failed"
                    await asyncio.sleep(0.05)
                assert [ok for _, ok in observed.done] == [False]
            finally:
                await gc.stop()
                await kafka.stop(timeout_s=1.0)

    run(scenario, timeout=60)


# --------------------------------------------------------------------------- rollup signals


def test_signals_go_to_their_counters_partition_one_record_per_partition(kafka_bootstrap: str,
                                                                         topic_name: str) -> None:
    make_topic(kafka_bootstrap, topic_name, PARTITIONS)
    keys = [("my_dataset", f"c{i}") for i in range(40)] + [("other.ns", "видео"), ("other.ns", "a:b/c?d")]

    async def scenario() -> int:
        kafka = AsyncProducer(kafka_bootstrap, client_id="test-signals", timeout_s=10.0)
        sender = SignalSender(kafka, topic_name)
        await sender.start()
        assert sender.partitions == PARTITIONS
        await asyncio.wait_for(sender.send(keys), 10)
        await kafka.stop()
        return len({signal_partition(counter_key(*k).encode(), PARTITIONS) for k in keys})

    touched = run(scenario)
    records = read_all(kafka_bootstrap, topic_name)
    assert len(records) == touched > 1
    received = []
    for record in records:
        signals = decode_signals(record.value)
        assert record.key == counter_key(*signals[0]).encode()
        for key in signals:
            assert record.partition == signal_partition(counter_key(*key).encode(), PARTITIONS)
        received += signals
    assert sorted(received) == sorted(keys)


def test_signals_beyond_a_records_worth_are_split(kafka_bootstrap: str, topic_name: str) -> None:
    make_topic(kafka_bootstrap, topic_name, 1)
    keys = [("my_dataset", f"counter-{i}") for i in range(2 * SIGNALS_PER_RECORD + 7)]

    async def scenario() -> None:
        kafka = AsyncProducer(kafka_bootstrap, client_id="test-signals", timeout_s=10.0)
        sender = SignalSender(kafka, topic_name, partitions=1)
        await asyncio.wait_for(sender.send(keys), 10)
        await kafka.stop()

    run(scenario)
    records = read_all(kafka_bootstrap, topic_name)
    assert [len(decode_signals(r.value)) for r in records] == [SIGNALS_PER_RECORD, SIGNALS_PER_RECORD, 7]
    assert [k for r in records for k in decode_signals(r.value)] == keys
