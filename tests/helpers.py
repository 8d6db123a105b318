"""Test helpers: waiting on conditions with deadlines, and reading topics back with a plain aiokafka client."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from infra.process import proc_stat
from producers import CounterProducer
from schemas import MICROS, Mutation


def metric_sum(port: int, prefix: str) -> float:
    """The sum of the series of a process's /metrics (a worker's) whose lines start with `prefix` (a name, or a name
    and some of its labels)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith(prefix) and not line.startswith("#"))


def now_us() -> int:
    return time.time_ns() // 1000


def iso(us: int) -> str:
    """An event time (µs) as the ISO-8601 UTC text the API takes."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us // MICROS)) + f".{us % MICROS:06d}Z"


def refused(response: httpx.Response) -> list[list[object]]:
    """The `loc` of each error of a 422 answer."""
    assert response.status_code == 422, response.text
    return [e["loc"] for e in response.json()["detail"]]


def gone(pid: int) -> bool:
    """No such process, or a zombie nobody has reaped yet (a killed parent's children are reparented)."""
    fields = proc_stat(pid)
    return fields is None or fields[0] == "Z"


@contextlib.asynccontextmanager
async def silent_broker() -> AsyncIterator[tuple[str, list[asyncio.StreamWriter]]]:
    """A TCP server that reads every request and answers none, as a hung broker: its bootstrap and the
    connections made to it (closed with it)."""
    connections: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}", connections
    finally:
        server.close()
        for writer in connections:
            writer.close()


def wait_for(condition: Callable[[], object], timeout: float, interval: float = 0.05,
             message: str | Callable[[], str] = "") -> object:
    """Return condition()'s first truthy value, or fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout}s waiting for {text or condition}")
        time.sleep(interval)


async def _read_all(bootstrap: str, topic: str, expected: int, timeout: float) -> list[ConsumerRecord]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        partitions = None
        while not partitions:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                if time.monotonic() > deadline:
                    raise AssertionError(f"topic {topic} has no partitions")
                await consumer.client.force_metadata_update()
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        await consumer.seek_to_beginning()
        records: list[ConsumerRecord] = []
        while len(records) < expected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"read {len(records)} of {expected} records from {topic} in {timeout}s")
            batch = await consumer.getmany(timeout_ms=int(min(remaining, 1.0) * 1000))
            for recs in batch.values():
                records.extend(r for r in recs if not is_control(r))
        return records
    finally:
        await consumer.stop()


def read_topic(bootstrap: str, topic: str, expected: int, timeout: float = 30.0) -> list[ConsumerRecord]:
    """All records of `topic` (at least `expected`), read by an independent aiokafka consumer."""
    return asyncio.run(_read_all(bootstrap, topic, expected, timeout))


SENTINEL_HEADER = "test.sentinel"
CONTROL_HEADERS = {SENTINEL_HEADER, "counter.heartbeat"}  # records that are not mutations


def is_control(record: ConsumerRecord) -> bool:
    return any(k in CONTROL_HEADERS for k, _ in (record.headers or ()))


def read_all(bootstrap: str, topic: str, timeout: float = 30.0) -> list[ConsumerRecord]:
    """Every record in `topic`, exactly: a sentinel is appended to each partition and records are read
    until every sentinel arrives (per-partition order guarantees nothing before it is missed). Brokers'
    end offsets are not used: Tansu reports the base offset of the last batch + 1 as the high watermark."""
    from confluent_kafka import Producer

    from streams.topics import partition_count

    partitions = partition_count(bootstrap, topic)
    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(partitions):
        producer.produce(topic, value=b"", partition=p, headers=[(SENTINEL_HEADER, b"1")])
    assert producer.flush(timeout) == 0
    return asyncio.run(_read_until_sentinels(bootstrap, topic, partitions, timeout))


async def _read_until_sentinels(bootstrap: str, topic: str, partitions: int,
                                timeout: float) -> list[ConsumerRecord]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + timeout
        records: list[ConsumerRecord] = []
        seen: set[int] = set()
        while len(seen) < partitions:
            if time.monotonic() > deadline:
                raise AssertionError(f"sentinels of {sorted(set(range(partitions)) - seen)} not read in {timeout}s")
            batch = await consumer.getmany(timeout_ms=500)
            for tp, recs in batch.items():
                for r in recs:
                    if any(k == SENTINEL_HEADER for k, _ in (r.headers or ())):
                        seen.add(tp.partition)
                    elif not is_control(r):
                        records.append(r)
        return records
    finally:
        await consumer.stop()


def topic_size(bootstrap: str, topic: str) -> int:
    """Number of (non-sentinel) records in `topic`."""
    return len(read_all(bootstrap, topic))


def make_topic(bootstrap: str, topic: str, partitions: int = 4) -> None:
    from streams.topics import TopicSpec, ensure_topics

    ensure_topics(bootstrap, [TopicSpec(topic, partitions)])


class Sync:
    """Calls an object's async methods from synchronous test code, on one private event loop."""

    def __init__(self, target: object) -> None:
        self._target = target
        self._runner = asyncio.Runner()

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._target, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *args, **kwargs: self._runner.run(attr(*args, **kwargs))
        return attr

    def __len__(self) -> int:
        return len(self._target)  # type: ignore[arg-type]

    def close(self) -> None:
        closer = getattr(self._target, "close", None)
        if closer is not None and inspect.iscoroutinefunction(closer):
            self._runner.run(closer())
        self._runner.close()


class RecordingProducer:
    """A CounterProducer for `counter produce`'s unit tests: records what it is made with and given to send."""

    mutation = staticmethod(CounterProducer.mutation)
    metadata_timeout_s = 10.0
    made: list[dict[str, Any]] = []
    sent: list[Mutation] = []

    @classmethod
    def reset(cls) -> None:
        cls.made, cls.sent = [], []

    def __init__(self, bootstrap: str, **kwargs: Any) -> None:
        RecordingProducer.made.append(kwargs)

    def __enter__(self) -> RecordingProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def ping(self, timeout: float) -> None:
        pass

    def send(self, m: Mutation) -> None:
        RecordingProducer.sent.append(m)

    def flush(self) -> None:
        pass
