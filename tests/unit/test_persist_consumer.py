"""The persist consumer's fetch wait: the shortest that recent records ask for (prompt for read-your-write, per
namespace otherwise, the idle default with none); each namespace's wait; and the aiokafka internals it leans on
(`Fetcher._fetch_max_wait_ms`, the subscription state `has_unread` reads), checked against the installed
aiokafka."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from types import SimpleNamespace
from typing import Any

import aiokafka
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition, codec
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.consumer.subscription_state import SubscriptionState

from agents import persist_consumer as module
from agents.persist_consumer import FetchPace, PersistConsumer, has_unread, read_your_write_in, set_fetch_wait
from agents.worker import build, persist_waits
from control_plane import parse_namespaces
from schemas.record_headers import HEARTBEAT_HEADER, READ_YOUR_WRITE_HEADER, READ_YOUR_WRITE_HEADERS, has_header
from streams.settings import Settings


def record(headers: Any = ()) -> SimpleNamespace:
    return SimpleNamespace(headers=headers, value=b"x", offset=0)


def consumer_with_fetcher(wait_ms: int) -> Any:
    """An object shaped like a started AIOKafkaConsumer, as far as set_fetch_wait looks."""
    return SimpleNamespace(_fetcher=SimpleNamespace(_fetch_max_wait_ms=wait_ms))


def persist_consumer(**kw: Any) -> PersistConsumer:
    async def persist(_records: Any) -> list[tuple[str, str]]:
        return []

    async def checkpoint(_keys: Any) -> None:
        return None

    return PersistConsumer(bootstrap="unused:9092", topic="t", group_id="g", persist=persist, checkpoint=checkpoint,
                           **kw)


def test_headers_are_recognised_in_every_clients_shape() -> None:
    assert has_header([(READ_YOUR_WRITE_HEADER, b"1")], READ_YOUR_WRITE_HEADER)
    assert has_header([(READ_YOUR_WRITE_HEADER.encode(), b"1")], READ_YOUR_WRITE_HEADER)
    assert has_header({READ_YOUR_WRITE_HEADER: b"1"}, READ_YOUR_WRITE_HEADER)
    assert not has_header([(HEARTBEAT_HEADER, b"1")], READ_YOUR_WRITE_HEADER)
    assert not has_header(None, READ_YOUR_WRITE_HEADER) and not has_header((), READ_YOUR_WRITE_HEADER)


def test_a_batch_asks_for_promptness_only_when_a_record_carries_the_header() -> None:
    assert read_your_write_in([record(), record([(HEARTBEAT_HEADER, b"1")]), record(READ_YOUR_WRITE_HEADERS)])
    assert not read_your_write_in([record(), record([(HEARTBEAT_HEADER, b"1")]), record(None)])


def test_the_pace_is_the_shortest_wait_asked_for_within_hold_s_and_the_idle_one_after() -> None:
    pace = FetchPace(idle_ms=200, hold_s=2.0)
    assert pace.wait_ms(now=0.0) == 200  # nothing asked: idle
    pace.ask(1000, now=0.0)
    assert pace.wait_ms(now=1.0) == 1000  # longer than idle while only it is held
    pace.ask(10, now=1.0)
    assert pace.wait_ms(now=1.5) == 10  # the shortest held wins
    assert pace.wait_ms(now=2.5) == 10  # 1000 expired at 2.0; 10 holds until 3.0
    pace.ask(1000, now=2.9)
    assert pace.wait_ms(now=3.0) == 1000  # 10 expired: the fresher long ask is what is left
    assert pace.wait_ms(now=4.8) == 1000 and pace.wait_ms(now=4.9) == 200


def test_the_consumer_waits_what_its_records_and_namespaces_ask_for() -> None:
    pc = persist_consumer(wait_ms=200, prompt_wait_ms=10, prompt_for_s=60,
                          namespace_waits={"eventual": 1000, "accurate": 200})
    consumer = consumer_with_fetcher(200)
    pc._note_fetched({"tp": [record()]})
    pc._pace(consumer)
    assert (pc.fetch_wait_ms, consumer._fetcher._fetch_max_wait_ms) == (200, 200)  # idle: the default
    pc._note_persisted({("eventual", "a"), ("unknown", "b")})
    pc._pace(consumer)
    assert (pc.fetch_wait_ms, consumer._fetcher._fetch_max_wait_ms) == (1000, 1000)  # EVENTUAL only: long
    pc._note_persisted({("eventual", "a"), ("accurate", "c")})
    pc._pace(consumer)
    assert consumer._fetcher._fetch_max_wait_ms == 200  # ACCURATE reads see persisted events: shorter
    pc._note_fetched({"tp": [record(), record(READ_YOUR_WRITE_HEADERS)]})
    pc._pace(consumer)
    assert (pc.fetch_wait_ms, consumer._fetcher._fetch_max_wait_ms) == (10, 10)  # a client waits: prompt
    pc._note_fetched({})
    pc._pace(consumer)
    assert consumer._fetcher._fetch_max_wait_ms == 10  # an empty fetch within prompt_for_s: still prompt


def test_the_prompt_wait_is_never_longer_than_the_wait() -> None:
    assert persist_consumer(wait_ms=5, prompt_wait_ms=10).prompt_wait_ms == 5


def test_without_the_internal_the_wait_stays_and_a_warning_is_logged_once(caplog: Any) -> None:
    pc = persist_consumer(wait_ms=200, prompt_wait_ms=10)
    unstarted = SimpleNamespace(_fetcher=None)
    assert not set_fetch_wait(unstarted, 10)  # type: ignore[arg-type]
    for _ in range(3):
        pc._note_fetched({"tp": [record(READ_YOUR_WRITE_HEADERS)]})
        pc._pace(unstarted)  # type: ignore[arg-type]
    assert pc.fetch_wait_ms == 200
    assert sum("cannot change a consumer's fetch wait" in r.getMessage() for r in caplog.records) == 1


def test_the_aiokafka_internal_set_fetch_wait_leans_on_is_still_there() -> None:
    """Fails on an aiokafka that no longer builds its FetchRequests from `Fetcher._fetch_max_wait_ms`: then
    set_fetch_wait would change nothing (re-check agents.persist_consumer before raising the pin)."""
    assert aiokafka.__version__ == "0.14.0", "constraints.txt pins aiokafka 0.14.0; re-check this lean when it moves"
    assert "self._fetch_max_wait_ms = fetch_max_wait_ms" in inspect.getsource(Fetcher.__init__)
    builder = inspect.getsource(Fetcher._get_actions_per_node)
    assert "FetchRequest(" in builder and "self._fetch_max_wait_ms" in builder
    # and the consumer's own attributes set_fetch_wait and has_unread reach them by (the tests above use stand-ins;
    # a rename would make both quietly answer False / None: the maintainability review)
    consumer_init = inspect.getsource(AIOKafkaConsumer.__init__)
    assert "self._subscription = SubscriptionState(" in consumer_init, "AIOKafkaConsumer._subscription moved"
    assert "self._fetcher = None" in consumer_init, "AIOKafkaConsumer._fetcher moved"
    assert "self._fetcher = Fetcher(" in inspect.getsource(AIOKafkaConsumer.start), "AIOKafkaConsumer._fetcher moved"


def test_has_unread_reads_the_positions_and_high_watermarks_aiokafka_keeps() -> None:
    """On aiokafka's own subscription state (the private internal has_unread leans on): a partition whose position
    is below its last fetch's high watermark has records not taken yet; one without a fetch yet tells nothing."""
    async def scenario() -> None:
        state = SubscriptionState()
        consumer = SimpleNamespace(_subscription=state)
        assert has_unread(consumer) is False  # type: ignore[arg-type]  # nothing subscribed or assigned
        tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
        state.assign_from_user([tp0, tp1])
        assert has_unread(consumer) is False  # type: ignore[arg-type]  # no position, no high watermark yet
        state.seek(tp0, 10)
        state.seek(tp1, 7)
        assignment = state.subscription.assignment
        assignment.state_value(tp0).highwater = 10
        assignment.state_value(tp1).highwater = 7
        assert has_unread(consumer) is False  # type: ignore[arg-type]  # both read to the end
        assignment.state_value(tp1).highwater = 9
        assert has_unread(consumer) is True  # type: ignore[arg-type]
        assignment.state_value(tp1).consumed_to(9)
        assert has_unread(consumer) is False  # type: ignore[arg-type]
        assert has_unread(SimpleNamespace()) is None  # type: ignore[arg-type]  # an aiokafka without the internal

    asyncio.run(scenario())


def test_eventual_namespaces_wait_up_to_half_the_coalesce_window_and_accurate_ones_the_short_wait() -> None:
    registry = parse_namespaces({"namespaces": {"ev": {"counter_type": "EVENTUAL"}, "acc": {"counter_type": "ACCURATE"},
                                                "be": {"counter_type": "BEST_EFFORT", "ttl": "1h"}}})
    settings = Settings(persist_batch_within_ms=200, persist_eventual_within_ms=1000)
    assert persist_waits(registry, settings, coalesce_s=10.0) == {"ev": 1000, "acc": 200}  # capped
    assert persist_waits(registry, settings, coalesce_s=1.0) == {"ev": 500, "acc": 200}  # half the window
    assert persist_waits(registry, settings, coalesce_s=0.2) == {"ev": 200, "acc": 200}  # never below the short one


def test_the_worker_lowers_settings_to_the_bound_the_start_up_check_names() -> None:
    """The worker took int(coalesce_s * 500) and the check coalesce_ms // 2: 1000 against 1001 for 2002 ms, and
    11,806 values of coalesce_ms like it, so a setting the check let through was lowered without a word (review)."""
    from agents.worker import half_window_ms

    assert all(half_window_ms(ms / 1000) == max(1, ms // 2) for ms in range(1, 3_600_001))


def test_the_consumer_reads_committed_records_only() -> None:
    """An outside transactional producer's aborted writes are not counted (aiokafka's default, read_uncommitted,
    returned them: a review's 5 aborted + 3 committed counted 8). The config must be one aiokafka accepts."""
    config = persist_consumer()._config
    assert config["isolation_level"] == "read_committed"
    assert "isolation_level" in inspect.signature(aiokafka.AIOKafkaConsumer.__init__).parameters


def test_a_worker_without_the_compression_codecs_refuses_to_start(monkeypatch: Any) -> None:
    """Without cramjam aiokafka reads no snappy, lz4 or zstd batch, and the worker crashed on each fetch of one
    forever: it now refuses to start, naming what to install."""
    assert module.missing_codecs() == []  # installed here (pyproject.toml's aiokafka extras)
    monkeypatch.setattr(codec, "has_lz4", lambda: False)
    monkeypatch.setattr(codec, "has_zstd", lambda: False)
    assert module.missing_codecs() == ["lz4", "zstd"]
    with pytest.raises(RuntimeError, match=r"cannot read lz4, zstd compressed records: install cramjam"):
        build(Settings(kafka_bootstrap="127.0.0.1:1"))


def test_a_batch_fetched_before_the_topic_was_recreated_is_dropped() -> None:
    """The review of the recreated-topic change: `run` fetches outside the batch lock, so a batch taken at the old
    topic's position (a partition of the new topic that grew past it) waited for the lock while `topic_recreated`
    sought the start, then was persisted and its old offsets committed over the start. Such a batch is dropped now
    (the topic epoch moved): the records are read again from the start."""
    tp = TopicPartition("m", 0)

    class Fake:
        def __init__(self) -> None:
            self.calls: list[tuple[str, object]] = []
            self.fetches = 0
            self.release = asyncio.Event()

        def assignment(self) -> set[TopicPartition]:
            return {tp}

        async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
            self.fetches += 1
            if self.fetches == 1:  # at the old position
                await self.release.wait()
                return {tp: [SimpleNamespace(offset=o, serialized_value_size=50, headers=()) for o in range(80, 85)]}
            await asyncio.sleep(timeout_ms / 1000)
            return {}

        async def beginning_offsets(self, parts: list[TopicPartition]) -> dict[TopicPartition, int]:
            self.release.set()  # the fetch at the old position answers while the lock is held
            await asyncio.sleep(0.05)
            return dict.fromkeys(parts, 0)

        def seek(self, _tp: TopicPartition, offset: int) -> None:
            self.calls.append(("seek", offset))

        def pause(self, *_tps: TopicPartition) -> None:
            pass

        def paused(self) -> set[TopicPartition]:
            return set()

        def resume(self, *_tps: TopicPartition) -> None:
            pass

        async def commit(self, offsets: dict[TopicPartition, int]) -> None:
            self.calls.append(("commit", {t.partition: o for t, o in offsets.items()}))

    persisted: list[int] = []

    async def persist(records: list) -> list[tuple[str, str]]:
        persisted.extend(r.offset for r in records)
        return [("ns", "c")]

    async def checkpoint(_touched: set) -> None:
        return None

    async def scenario() -> list[tuple[str, object]]:
        pc = PersistConsumer(bootstrap="x", topic="m", group_id="g", persist=persist, checkpoint=checkpoint)
        fake = pc._consumer = Fake()  # type: ignore[assignment]
        runner = asyncio.create_task(pc.run())
        await asyncio.sleep(0.01)  # run() is inside getmany
        await pc.topic_recreated()
        await asyncio.sleep(0.3)  # run() takes the lock with its batch, and checkpoints
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        return fake.calls

    calls = asyncio.run(scenario())
    assert calls == [("seek", 0), ("commit", {0: 0})], calls
    assert persisted == []
