"""agents.topic_watch: aiokafka's out-of-range reset made a counted WARNING, and a topic id that changes told once."""

from __future__ import annotations

import asyncio
import inspect
import logging

import aiokafka
import pytest
from aiokafka import TopicPartition
from aiokafka.consumer.fetcher import Fetcher

from agents import metrics, topic_watch
from agents.topic_watch import FETCHER_LOGGER, OUT_OF_RANGE, TopicWatch, watch_offset_resets


def resets(partition: str) -> float:
    return metrics.REGISTRY.get_sample_value("counter_worker_offset_resets_total", {"partition": partition}) or 0.0


def test_aiokafka_still_logs_the_reset_this_module_watches_for() -> None:
    """Fails on an aiokafka whose fetcher words the reset otherwise: then the WARNING and the count would never come
    (re-check agents.topic_watch before raising the pin)."""
    assert aiokafka.__version__ == "0.14.0", "constraints.txt pins aiokafka 0.14.0; re-check this lean when it moves"
    source = " ".join(inspect.getsource(Fetcher).split())  # the message is two adjacent literals there
    assert '"Fetch offset %s is out of range for partition %s," " resetting offset"' in source
    assert OUT_OF_RANGE == "Fetch offset %s is out of range for partition %s," " resetting offset"


def test_an_out_of_range_reset_is_a_counted_warning_and_other_info_lines_stay_hidden(
        caplog: pytest.LogCaptureFixture) -> None:
    """A review: records deleted before the worker read them (retention, a truncated or recreated topic) were
    passed over with a line at INFO, which a worker at WARNING never shows."""
    aio, fetcher = logging.getLogger(topic_watch.PARENT_LOGGER), logging.getLogger(FETCHER_LOGGER)
    before = aio.level, fetcher.level, list(fetcher.filters)
    try:
        aio.setLevel(logging.WARNING)
        watch_offset_resets()
        watch_offset_resets()  # once
        assert fetcher.filters.count(topic_watch.OFFSET_RESETS_FILTER) == 1
        counted = resets("3")
        with caplog.at_level(logging.INFO):
            fetcher.info(OUT_OF_RANGE, 120, TopicPartition("t", 3))
            fetcher.info("some other fetcher line %s", 1)
        lines = [r for r in caplog.records if r.name == FETCHER_LOGGER]
        assert [r.levelname for r in lines] == ["WARNING"]
        assert "no longer holds offset 120 of TopicPartition(topic='t', partition=3)" in lines[0].getMessage()
        assert resets("3") == counted + 1
    finally:
        aio.setLevel(before[0])
        fetcher.setLevel(before[1])
        fetcher.filters[:] = before[2]


def test_a_changed_topic_id_is_told_until_the_worker_follows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """An id not read (a broker away, the topic not created yet) is no change; a change is told again at every check
    until the worker has acted on it (`follow`): the review of this change saw a failed first attempt (the broker's
    metadata still settling) leave the partitions at the old positions for good."""
    ids: list[str | None] = ["A", None, "A", "B", "B", "B", None, "C"]
    watch = TopicWatch("127.0.0.1:1", "t", every_s=0.0)
    monkeypatch.setattr(watch, "_read", lambda: ids.pop(0))
    watch.read_now()

    async def changes() -> list[tuple[str, str] | None]:
        seen = []
        for _ in range(7):
            change = await watch.changed()
            seen.append(change)
            if change is not None and len(seen) > 3:  # the worker's first attempt (the third check) failed
                watch.follow(change[1])
        return seen

    assert asyncio.run(changes()) == [None, None, ("A", "B"), ("A", "B"), None, None, ("B", "C")]


def test_a_fetcher_asked_for_debug_lines_keeps_them() -> None:
    """The review of this change: the fetcher's level was set to INFO whatever it inherited, hiding its DEBUG lines
    from a worker debugging at DEBUG."""
    parent, fetcher = logging.getLogger(topic_watch.PARENT_LOGGER), logging.getLogger(FETCHER_LOGGER)
    before = parent.level, fetcher.level, list(fetcher.filters)
    try:
        parent.setLevel(logging.DEBUG)
        watch_offset_resets()
        assert fetcher.isEnabledFor(logging.DEBUG)
        parent.setLevel(logging.WARNING)
        watch_offset_resets()
        assert fetcher.level == logging.INFO  # the reset line is asked for; the filter hides the others
    finally:
        parent.setLevel(before[0])
        fetcher.setLevel(before[1])
        fetcher.filters[:] = before[2]
