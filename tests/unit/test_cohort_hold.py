"""The group commit's cohort hold (producers.cohort_hold): closed-loop clients answered by one acknowledgement ride
the next record together instead of splitting into two cohorts that ride every other record; a lone write is
never held, and a hold whose clients do not come back ends at its bound."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from producers.cohort_hold import CohortHold
from producers.group_commit import GroupCommitProducer
from schemas import Mutation, decode_mutations
from tests.unit.test_dimensions import _FakeKafka


def test_a_hold_lasts_until_every_answered_request_is_back() -> None:
    hold = CohortHold(max_s=0.002)
    hold.acknowledged(5, took_s=0.0008, now=10.0)
    assert hold.until == pytest.approx(10.0016)  # two acknowledgement times, under the 2 ms bound
    assert hold.holding(10.0001)
    for i in range(1, 5):  # four requests, each within the gap (a quarter acknowledgement: 0.2 ms) of the last
        assert not hold.arrived(10.0 + i * 0.0001) and hold.holding(10.0 + i * 0.0001 + 0.00015)
    assert hold.arrived(10.0005)  # the fifth: the hold ends with it
    assert not hold.holding(10.0005)


def test_a_hold_is_bounded_by_max_s_and_by_two_acknowledgement_times() -> None:
    slow = CohortHold(max_s=0.002)
    slow.acknowledged(100, took_s=0.005, now=0.0)  # a slow broker: the hold stops at max_s
    assert slow.until == pytest.approx(0.002)
    for i in range(1, 20):  # requests keep coming, never all of them
        assert not slow.arrived(i * 0.0001)
    assert slow.holding(0.0019) and not slow.holding(0.002)
    assert slow.next_look() == pytest.approx(0.002)
    fast = CohortHold(max_s=0.002)
    fast.acknowledged(3, took_s=0.0003, now=0.0)
    assert fast.until == pytest.approx(0.0006)


def test_a_hold_ends_when_requests_stop_coming_for_a_quarter_acknowledgement() -> None:
    """Clients in a loop come back in a burst; a pause means the rest are not coming soon (their writes do not wait
    on their answers), and holding on would only lengthen every cycle."""
    hold = CohortHold(max_s=0.01)
    hold.acknowledged(8, took_s=0.002, now=1.0)  # the gap: 0.25 x 2 ms = 0.5 ms
    assert hold.holding(1.0004) and not hold.holding(1.0005)  # no request since the acknowledgement
    hold.arrived(1.0004)
    assert hold.next_look() == pytest.approx(1.0009)  # each request moves the gap on
    assert hold.holding(1.0008) and not hold.holding(1.0009)


def test_the_acknowledgement_time_is_smoothed_and_failures_leave_it() -> None:
    hold = CohortHold(max_s=1.0)
    hold.acknowledged(1, took_s=0.001, now=0.0)
    hold.acknowledged(1, took_s=0.009, now=0.0)  # one slow acknowledgement moves the mean an eighth of the way
    assert hold.ack_s == pytest.approx(0.002)
    assert hold.until == pytest.approx(0.004)
    hold.acknowledged(4, took_s=None, now=1.0)  # a failure after the producer's timeout: not the broker's pace
    assert hold.ack_s == pytest.approx(0.002)
    assert hold.expected == 4 and hold.until == pytest.approx(1.004)  # its clients come back to retry


def test_no_hold_when_disabled_or_before_any_acknowledgement_time() -> None:
    hold = CohortHold(max_s=0.0)
    hold.acknowledged(32, took_s=0.001, now=0.0)
    assert hold.expected == 0 and not hold.holding(0.0)
    first = CohortHold(max_s=0.002)
    first.acknowledged(32, took_s=None, now=0.0)  # the first record failed: no pace known yet
    assert first.expected == 0 and not first.holding(0.0)
    with pytest.raises(ValueError, match="max_s, factor and gap must be >= 0"):
        CohortHold(max_s=-1.0)


class ManualKafka(_FakeKafka):
    """Keeps each record's future for the test to acknowledge (a broker the test paces)."""

    def __init__(self) -> None:
        super().__init__()
        self.futures: list[asyncio.Future[None]] = []
        self.produced_at: list[float] = []

    def produce(self, topic: str, value: bytes, key: bytes | None, partition: int,
                headers: Any = None) -> asyncio.Future[None]:
        self.records.append(value)
        self.produced_at.append(time.monotonic())
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return future

    def sizes(self) -> list[int]:
        return [len(decode_mutations(record)) for record in self.records]


def write(n: int) -> Mutation:
    return Mutation("my_dataset", f"c{n}", 1, 1_795_000_000_000_000 + n, f"t{n}")


async def passes(n: int = 3) -> None:
    """Let the loop run `n` passes (the group commit produces at the end of a pass)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def wait_for(condition: Any, deadline_s: float = 2.0) -> None:
    until = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < until, "condition not met in time"
        await asyncio.sleep(0.001)


def acknowledge_all(kafka: ManualKafka) -> int:
    """Acknowledge every record produced so far; the writes they hold."""
    for future in kafka.futures:
        if not future.done():
            future.set_result(None)
    return sum(kafka.sizes())


def cohorts(hold_max_s: float) -> list[int]:
    """Two cohorts of 4 closed-loop clients: the first rides record 1; the second gathers while it is in flight.
    Record 1 is acknowledged, and its 4 clients send their next writes a moment later. Returns the record sizes."""
    kafka = ManualKafka()

    async def scenario() -> list[int]:
        producer = GroupCommitProducer(kafka, topic="t", hold_max_s=hold_max_s)  # type: ignore[arg-type]
        await producer.start()
        first = [producer.send([write(i)]) for i in range(4)]
        await passes()
        assert kafka.sizes() == [4]
        second = [producer.send([write(i)]) for i in range(4, 8)]  # gathering behind record 1
        await asyncio.sleep(0.05)  # the acknowledgement takes 50 ms: a hold lasts up to two of them
        kafka.futures[0].set_result(None)
        await asyncio.gather(*first)
        await passes()
        third = [producer.send([write(i)]) for i in range(8, 12)]  # record 1's clients, back
        await wait_for(lambda: acknowledge_all(kafka) == 12)
        await asyncio.gather(*second, *third)
        return kafka.sizes()

    return asyncio.run(scenario())


def test_closed_loop_clients_ride_one_record_not_every_other() -> None:
    assert cohorts(hold_max_s=1.0) == [4, 8]  # the second cohort waited for the first: one record of 8
    assert cohorts(hold_max_s=0.0) == [4, 4, 4]  # without a hold, two cohorts ride every other record


def test_no_hold_for_the_clients_of_read_your_write_records() -> None:
    """AddAndGetCount's clients are answered once the worker has persisted their writes, long after the
    acknowledgement: none comes back at once, so nothing waits for them."""
    kafka = ManualKafka()

    async def scenario() -> list[int]:
        producer = GroupCommitProducer(kafka, topic="t", hold_max_s=1.0)  # type: ignore[arg-type]
        await producer.start()
        first = [producer.send([write(i)], read_your_write=True) for i in range(4)]
        await passes()
        second = [producer.send([write(i)]) for i in range(4, 8)]
        await asyncio.sleep(0.05)
        kafka.futures[0].set_result(None)
        await asyncio.gather(*first)
        await passes()
        assert kafka.sizes() == [4, 4], "the record waited for clients not yet answered"
        acknowledge_all(kafka)
        await asyncio.gather(*second)
        return kafka.sizes()

    assert asyncio.run(scenario()) == [4, 4]


def test_a_lone_write_is_produced_in_the_pass_it_arrived_in() -> None:
    """Concurrency 1: each write's client was the one the last acknowledgement answered; nothing waits a timer."""
    kafka = ManualKafka()

    async def scenario() -> list[int]:
        producer = GroupCommitProducer(kafka, topic="t", hold_max_s=1.0)  # type: ignore[arg-type]
        await producer.start()
        for i in range(3):
            written = producer.send([write(i)])
            await passes()
            assert len(kafka.records) == i + 1, "a lone write was held"
            kafka.futures[i].set_result(None)
            await written
        return kafka.sizes()

    assert asyncio.run(scenario()) == [1, 1, 1]


def test_a_hold_whose_clients_do_not_come_back_ends_after_a_gap() -> None:
    kafka = ManualKafka()

    async def scenario() -> tuple[float, list[int]]:
        producer = GroupCommitProducer(kafka, topic="t", hold_max_s=1.0)  # type: ignore[arg-type]
        await producer.start()
        first = [producer.send([write(i)]) for i in range(4)]
        await passes()
        await asyncio.sleep(0.1)  # the acknowledgement takes 100 ms: the gap is 25 ms, the bound 200 ms
        kafka.futures[0].set_result(None)
        await asyncio.gather(*first)
        came = time.monotonic()
        late = producer.send([write(9)])  # one client of four comes back; the other three do not
        await passes()
        assert len(kafka.records) == 1, "the record went before the hold's end"
        await wait_for(lambda: len(kafka.records) == 2)
        waited = kafka.produced_at[1] - came
        kafka.futures[1].set_result(None)
        await late
        return waited, kafka.sizes()

    waited, sizes = asyncio.run(scenario())
    assert sizes == [4, 1]
    assert 0.02 <= waited < 0.15, waited  # the gap after the last request, not the 200 ms bound


def test_a_client_of_batch_requests_is_counted_by_its_requests() -> None:
    """One client whose requests carry several mutations (a batch request) comes back with one request: a record of
    its 5 mutations expects one request back, not five (a review: its next single write waited out the gap)."""
    kafka = ManualKafka()

    async def scenario() -> list[int]:
        producer = GroupCommitProducer(kafka, topic="t", hold_max_s=1.0)  # type: ignore[arg-type]
        await producer.start()
        batch = producer.send([write(i) for i in range(5)])
        await passes()
        await asyncio.sleep(0.05)
        kafka.futures[0].set_result(None)
        await batch
        single = producer.send([write(9)])
        await passes()
        assert len(kafka.records) == 2, "a lone client's next request was held"
        kafka.futures[1].set_result(None)
        await single
        return kafka.sizes()

    assert asyncio.run(scenario()) == [5, 1]


def test_a_hold_ends_at_its_bound_while_writes_trickle_in() -> None:
    kafka = ManualKafka()
    bound_s = 0.05

    async def scenario() -> tuple[float, list[int]]:
        producer = GroupCommitProducer(kafka, topic="t", hold_max_s=bound_s)  # type: ignore[arg-type]
        await producer.start()
        first = [producer.send([write(i)]) for i in range(40)]
        await passes()
        await asyncio.sleep(0.1)  # the gap is 25 ms; the bound, hold_max_s, 50 ms
        kafka.futures[0].set_result(None)
        await asyncio.gather(*first)
        acknowledged = time.monotonic()
        trickle: list[asyncio.Future[int | None]] = []
        while len(kafka.records) == 1:  # one write every 5 ms, well inside the gap, never all 40
            assert time.monotonic() < acknowledged + 2.0, "the hold did not end"
            trickle.append(producer.send([write(100 + len(trickle))]))
            await asyncio.sleep(0.005)
        waited = kafka.produced_at[1] - acknowledged
        acknowledge_all(kafka)
        await asyncio.gather(*trickle)
        return waited, kafka.sizes()

    waited, sizes = asyncio.run(scenario())
    assert sizes[0] == 40 and 5 <= sizes[1] < 40
    assert bound_s * 0.9 <= waited < bound_s + 0.1, waited


def test_stop_sends_a_held_record_at_once() -> None:
    kafka = ManualKafka()

    async def scenario() -> list[int]:
        producer = GroupCommitProducer(kafka, topic="t", hold_max_s=10.0)  # type: ignore[arg-type]
        await producer.start()
        first = [producer.send([write(i)]) for i in range(4)]
        await asyncio.sleep(0.2)  # a slow acknowledgement: the hold lasts at least 50 ms without writes
        kafka.futures[0].set_result(None)
        await asyncio.gather(*first)
        producer.send([write(9)])  # held: three more are expected
        await passes()
        assert len(kafka.records) == 1
        await producer.stop()
        return kafka.sizes()

    assert asyncio.run(scenario()) == [4, 1]


def hold_cycles(outcomes: list[str]) -> list[bool]:
    """Acknowledgements of 4 requests each, 4 ms apart (the gap: 1 ms); after each, whether the record was held,
    and if so whether its 4 clients all came back ("complete") or only one did ("gave_up": the gap ends it)."""
    async def scenario() -> list[bool]:
        loop = asyncio.get_running_loop()
        hold = CohortHold(max_s=1.0)
        held: list[bool] = []
        for outcome in outcomes:
            hold.acknowledged(4, took_s=0.004, now=loop.time())
            over: asyncio.Future[None] = loop.create_future()
            held.append(hold.wait(loop, lambda over=over: over.set_result(None)))
            if not held[-1]:
                continue
            for _ in range(4 if outcome == "complete" else 1):
                ended = hold.came(loop)
            if outcome == "complete":
                assert ended and not over.done()
            else:
                await asyncio.wait_for(over, 1.0)
        return held

    return asyncio.run(scenario())


def test_holds_that_keep_giving_up_switch_holding_off_and_try_again_later() -> None:
    """Clients whose writes do not wait on their answers let every hold run out: against a broker answering in
    milliseconds that made each of their writes wait the hold's bound (bench/RESULTS.md). Four holds in a row
    that give up switch holding off; 7-10 records on a hold tries again, and one that completes switches it back on."""
    held = hold_cycles(["gave_up"] * 20 + ["complete"] * 4)  # an outcome applies only where a record is held
    assert "".join("H" if h else "." for h in held) == "HHHH......H.........HHHH"


def test_closed_loop_holds_that_sometimes_give_up_stay_on() -> None:
    """In a closed loop a client now and then comes back late and its hold gives up; while at most half do,
    every record is held."""
    outcomes = ["complete", "gave_up"] * 10 + ["complete", "complete", "gave_up"] * 5
    assert hold_cycles(outcomes) == [True] * len(outcomes)
