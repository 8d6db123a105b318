"""The persist consumer's fetch wait: prompt while read-your-write records arrive, long otherwise; and the aiokafka
internal it leans on (`Fetcher._fetch_max_wait_ms`), checked against the installed aiokafka."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import aiokafka
from aiokafka.consumer.fetcher import Fetcher

from agents.persist_consumer import PersistConsumer, read_your_write_in, set_fetch_wait
from agents.watermark import HEARTBEAT_HEADER
from schemas.record_headers import READ_YOUR_WRITE_HEADER, READ_YOUR_WRITE_HEADERS, has_header


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


def test_the_wait_is_prompt_after_a_read_your_write_record_and_long_again_after_prompt_for_s() -> None:
    pc = persist_consumer(wait_ms=200, prompt_wait_ms=10, prompt_for_s=60)
    consumer = consumer_with_fetcher(200)
    pc._pace(consumer, {"tp": [record()]})
    assert (pc.fetch_wait_ms, consumer._fetcher._fetch_max_wait_ms) == (200, 200)  # nobody waits: long
    pc._pace(consumer, {"tp": [record(), record(READ_YOUR_WRITE_HEADERS)]})
    assert (pc.fetch_wait_ms, consumer._fetcher._fetch_max_wait_ms) == (10, 10)
    pc._pace(consumer, {})  # an empty fetch within prompt_for_s: still prompt
    pc._pace(consumer, {"tp": [record()]})
    assert consumer._fetcher._fetch_max_wait_ms == 10
    pc._prompt_until -= 61  # prompt_for_s has passed without another such record
    pc._pace(consumer, {"tp": [record()]})
    assert (pc.fetch_wait_ms, consumer._fetcher._fetch_max_wait_ms) == (200, 200)


def test_the_prompt_wait_is_never_longer_than_the_wait() -> None:
    assert persist_consumer(wait_ms=5, prompt_wait_ms=10).prompt_wait_ms == 5


def test_without_the_internal_the_wait_stays_and_a_warning_is_logged_once(caplog: Any) -> None:
    pc = persist_consumer(wait_ms=200, prompt_wait_ms=10)
    unstarted = SimpleNamespace(_fetcher=None)
    assert not set_fetch_wait(unstarted, 10)  # type: ignore[arg-type]
    for _ in range(3):
        pc._pace(unstarted, {"tp": [record(READ_YOUR_WRITE_HEADERS)]})
    assert pc.fetch_wait_ms == 200
    assert sum("cannot change a consumer's fetch wait" in r.getMessage() for r in caplog.records) == 1


def test_the_aiokafka_internal_set_fetch_wait_leans_on_is_still_there() -> None:
    """Fails on an aiokafka that no longer builds its FetchRequests from `Fetcher._fetch_max_wait_ms`: then
    set_fetch_wait would change nothing (re-check agents.persist_consumer before raising the pin)."""
    assert aiokafka.__version__ == "0.14.0", "constraints.txt pins aiokafka 0.14.0; re-check this lean when it moves"
    assert "self._fetch_max_wait_ms = fetch_max_wait_ms" in inspect.getsource(Fetcher.__init__)
    builder = inspect.getsource(Fetcher._get_actions_per_node)
    assert "FetchRequest(" in builder and "self._fetch_max_wait_ms" in builder
