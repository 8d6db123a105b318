"""When a read signals a rollup: only for a counter whose rollup lags (a read repairs a stale counter); ReadSignals
throttles them per counter, never raises, and starts sending once the broker answers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from unittest import mock

import pytest

import query_api.signals as signals_module
from control_plane import default_config_path, load_namespaces
from control_plane.admission import rollup_boundary
from producers.errors import DeliveryError
from query_api.early_persist import Rows
from query_api.service import CounterService, Written
from query_api.signals import ReadSignals
from schemas import MICROS, counter_key, decode_signals
from streams.signals import SignalSender
from streams.topics import signal_partition

REGISTRY = load_namespaces(default_config_path())


class RecordingSignals:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def emit(self, namespace: str, counter: str) -> None:
        self.sent.append((namespace, counter))


def service(lag_s: float) -> tuple[CounterService, RecordingSignals]:
    signals = RecordingSignals()
    svc = CounterService(REGISTRY, producer=None, signals=signals, events=None, rollups=None,  # type: ignore[arg-type]
                         cache=None, counters=None, read_signal_lag_s=lag_s)  # type: ignore[arg-type]
    return svc, signals


@pytest.mark.parametrize("ns_name", ["my_dataset", "my_dataset_accurate"])
def test_stale_rollups_are_signalled_and_fresh_or_missing_ones_not(ns_name: str) -> None:
    """A missing rollup is a counter never written (a read of it made a rollup row and a cache entry: the scale
    review) or one whose first events the persist path has signalled (the sweep repairs a lost signal)."""
    ns = REGISTRY[ns_name]
    svc, signals = service(lag_s=5.0)
    now = time.time_ns() // 1000
    newest = rollup_boundary(now, now, ns)
    svc.signal_if_stale(ns, "fresh", newest - 1 * MICROS)
    svc.signal_if_stale(ns, "stale", newest - 6 * MICROS)
    svc.signal_if_stale(ns, "never-rolled-up", 0)
    assert signals.sent == [(ns_name, "stale")]


def test_lag_zero_signals_every_read() -> None:
    ns = REGISTRY["my_dataset"]
    svc, signals = service(lag_s=0.0)
    now = time.time_ns() // 1000
    svc.signal_if_stale(ns, "c", rollup_boundary(now, now, ns) - 1000)
    assert signals.sent == [("my_dataset", "c")]


# --------------------------------------------------------------------------- ReadSignals over a real SignalSender


class Clock:
    """Stands in for the time module inside query_api.signals."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class FakeProducer:
    """The AsyncProducer calls SignalSender makes: partitions() (failing `down` times first) and produce()."""

    def __init__(self, partitions: int = 4, down: int = 0) -> None:
        self.count = partitions
        self.down = down
        self.asked = 0
        self.records: list[tuple[str, bytes, bytes | None, int]] = []
        self.fail_with: Exception | None = None  # produce's future fails with it
        self.raise_on_produce: Exception | None = None

    async def partitions(self, topic: str, timeout_s: float = 3.0) -> int:
        self.asked += 1
        if self.down:
            self.down -= 1
            raise DeliveryError("broker 127.0.0.1:1 unreachable")
        return self.count

    def produce(self, topic: str, value: bytes, key: bytes | None = None, *, partition: int = -1,
                headers: object = None) -> asyncio.Future[None]:
        if self.raise_on_produce is not None:
            raise self.raise_on_produce
        self.records.append((topic, value, key, partition))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fail_with is None:
            future.set_result(None)
        else:
            future.set_exception(self.fail_with)
        return future

    def signalled(self) -> list[tuple[str, str]]:
        out = []
        for topic, value, _key, partition in self.records:
            assert topic == "rollups"
            for ns, counter in decode_signals(value):
                assert partition == signal_partition(counter_key(ns, counter).encode(), self.count)
                out.append((ns, counter))
        return out


def run_signals(scenario: Callable[[ReadSignals, FakeProducer, Clock], Awaitable[None]], *, down: int = 0,
                min_interval_s: float = 1.0) -> None:
    clock = Clock()
    producer = FakeProducer(down=down)

    async def main() -> None:
        reads = ReadSignals(SignalSender(producer, "rollups"), min_interval_s=min_interval_s)  # type: ignore[arg-type]
        await reads.start()
        await scenario(reads, producer, clock)
        await asyncio.sleep(0)  # let failure callbacks run inside the loop

    with mock.patch.object(signals_module, "time", clock):
        asyncio.run(main())


def test_read_signals_once_per_counter_per_interval() -> None:
    async def scenario(reads: ReadSignals, producer: FakeProducer, clock: Clock) -> None:
        reads.emit("ns", "a")
        reads.emit("ns", "a")
        reads.emit("ns", "b")
        reads.emit("other", "a")
        clock.now += 0.999
        reads.emit("ns", "a")
        await asyncio.sleep(0)  # the end of the loop pass sends them
        assert sorted(producer.signalled()) == [("ns", "a"), ("ns", "b"), ("other", "a")]
        clock.now += 0.002  # a second after the first signal of ns:a
        reads.emit("ns", "a")
        reads.emit("ns", "b")
        await asyncio.sleep(0)
        assert sorted(producer.signalled()) == [("ns", "a"), ("ns", "a"), ("ns", "b"), ("ns", "b"), ("other", "a")]

    run_signals(scenario)


def test_the_signals_of_one_loop_pass_share_a_record_per_partition() -> None:
    async def scenario(reads: ReadSignals, producer: FakeProducer, clock: Clock) -> None:
        counters = [f"c-{i}" for i in range(40)]
        for counter in counters:
            reads.emit("ns", counter)
        assert producer.records == []  # not one record each, as they come
        await asyncio.sleep(0)
        assert sorted(producer.signalled()) == sorted(("ns", c) for c in counters)
        assert len(producer.records) == len({signal_partition(counter_key("ns", c).encode(), producer.count)
                                             for c in counters}) <= producer.count

    run_signals(scenario)


def test_read_signals_never_raise(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(reads: ReadSignals, producer: FakeProducer, clock: Clock) -> None:
        reads.emit("ns", "not valid")  # the sender refuses the name (ValidationError)...
        reads.emit("bad:ns", "c")
        reads.emit("ns", "beside-them")  # ...which costs the signals of the same pass nothing
        await asyncio.sleep(0)
        producer.raise_on_produce = BufferError("local queue full")
        reads.emit("ns", "queue-full")
        await asyncio.sleep(0)
        producer.raise_on_produce = None
        producer.fail_with = DeliveryError("the broker did not acknowledge the record")
        reads.emit("ns", "unacknowledged")
        await asyncio.sleep(0)
        producer.fail_with = None
        reads.emit("ns", "fine")
        await asyncio.sleep(0)
        assert producer.signalled() == [("ns", "beside-them"), ("ns", "unacknowledged"), ("ns", "fine")]
        deadline = time.monotonic() + 5
        while "rollup signal not delivered" not in caplog.text:  # logged from the failed future's callback
            assert time.monotonic() < deadline, caplog.text
            await asyncio.sleep(0.001)

    with caplog.at_level(logging.WARNING, logger="query_api.signals"):
        run_signals(scenario)
    assert "not sent" in caplog.text


def test_read_signals_start_once_the_broker_answers(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(reads: ReadSignals, producer: FakeProducer, clock: Clock) -> None:
        assert producer.asked == 1 and reads.sender.partitions == 0  # the broker was down at start
        reads.emit("ns", "a")  # dropped: no partitions yet, and the start-up attempt is recent
        clock.now += 4.0
        reads.emit("ns", "b")
        assert producer.asked == 1 and producer.records == []
        clock.now += 1.5  # more than 5 s since the failed start: a read tries again (broker still down)
        reads.emit("ns", "c")
        await _settled(reads)
        assert producer.asked == 2 and reads.sender.partitions == 0
        clock.now += 1.0
        reads.emit("ns", "d")  # within 5 s of that attempt: no new one
        await _settled(reads)
        assert producer.asked == 2
        clock.now += 5.0
        reads.emit("ns", "e")  # the broker answers this time
        await _settled(reads)
        assert producer.asked == 3 and reads.sender.partitions == 4
        reads.emit("ns", "a")
        reads.emit("ns", "f")
        await asyncio.sleep(0)
        assert sorted(producer.signalled()) == [("ns", "a"), ("ns", "f")]
        assert producer.asked == 3

    with caplog.at_level(logging.WARNING, logger="query_api.signals"):
        run_signals(scenario, down=2)
    assert "rollup signals from reads are off until the broker answers" in caplog.text


async def _settled(reads: ReadSignals) -> None:
    if reads._starting is not None:
        await asyncio.wait_for(asyncio.shield(reads._starting), 5.0)


@pytest.mark.parametrize("early", [True, False], ids=["stored by the API", "waited for the worker"])
def test_add_and_get_count_sends_no_read_signal_even_for_a_stale_counter(early: bool) -> None:
    """An AddAndGetCount is a write: the worker's persist of its record signals the counter's rollup (with the other
    counters of its checkpoint, one record per partition). A read signal beside it was one more record per counter
    (0.045 a request at c=32 over 1,000 counters, against 0.003 from the persist path), which the broker and the
    worker's rollup agent paid for."""
    ns = REGISTRY["my_dataset"]
    svc, signals = service(lag_s=0.0)  # every read of a lagging rollup would signal
    written = Written(ns, "c", "token-1", time.time_ns() // 1000)

    async def rollup_of(_ns: object, _counter: str) -> tuple[int, int]:
        return 5, 0  # never rolled up: as stale as can be

    rows = Rows()
    if early:
        rows.append(("my_dataset", "c", written.event_time, "token-1", "", 1, False))

    async def scenario() -> int:
        acknowledged = asyncio.get_running_loop().create_future()
        acknowledged.set_result(None)
        with mock.patch.object(svc, "rollup_of", rollup_of), \
                mock.patch.object(svc, "counted_early", wraps=svc.counted_early) as counted_early, \
                mock.patch.object(svc, "wait_persisted", mock.AsyncMock(return_value=None)), \
                mock.patch.object(svc, "live_count", mock.AsyncMock(return_value=6)), \
                mock.patch.object(svc.early, "rows", return_value=rows), \
                mock.patch.object(svc.early, "store_and_count", mock.AsyncMock(return_value=6)):
            count = await svc.count_after(written, acknowledged)
            assert counted_early.called
        return count.count

    assert asyncio.run(scenario()) == 6
    assert signals.sent == []
    svc.signal_if_stale(ns, "c", 1)  # a read of the same counter does signal
    assert signals.sent == [("my_dataset", "c")]
