"""What a worker notices of its mutations topic's records going away under it.

* **The topic deleted and created again** (an operator's `kafka-topics --delete` then `--create`, an infrastructure
  tool re-applying it) while workers run: the persist consumer's positions, and the offsets it commits, are the old
  topic's, past the new one's first records. On a broker that answers a fetch past a partition's end with nothing
  (the local Tansu) the worker read nothing until each partition grew past its old position, and the records before
  were never stored: a review's counts went wrong for good with every health figure green. `TopicWatch` reads the
  topic's id (Kafka's topic id, KIP-516; Tansu has them too) every few seconds; when it changes, the worker logs an
  error and reads each of its partitions of the new topic from the start (`PersistConsumer.topic_recreated`). Records
  of the old topic no worker had persisted are lost with it, and records of the new one read after a partition
  outgrew its old position before the check may lie behind a rollup by then: dead-lettered, not counted silently.
* **Records deleted before they were read** (retention shorter than the worker's lag, `DeleteRecords`) or a
  committed offset past the end: aiokafka resets the position to the earliest record kept, with a line at INFO
  that a worker logging at WARNING never shows. `OffsetResets` makes it a WARNING that says what it means, and counts
  it in `counter_worker_offset_resets_total{partition}`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from agents import metrics

log = logging.getLogger("counter.worker")

# aiokafka's line for a fetch position the broker no longer holds (aiokafka 0.14.0, pinned in constraints.txt; the
# lean is tested in tests/unit/test_topic_watch.py)
FETCHER_LOGGER = "aiokafka.consumer.fetcher"
PARENT_LOGGER = "aiokafka.consumer"  # whose level the fetcher's other lines keep
OUT_OF_RANGE = "Fetch offset %s is out of range for partition %s, resetting offset"
NO_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # the zero id: a broker without topic ids


class OffsetResets(logging.Filter):
    """On aiokafka's fetcher logger: its out-of-range line becomes a WARNING that says what was lost, counted per
    partition; its other lines are shown as aiokafka's level says (the fetcher's own is lowered to INFO for this)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != OUT_OF_RANGE:
            return record.levelno >= logging.getLogger(PARENT_LOGGER).getEffectiveLevel()
        args: Any = record.args
        tp = args[1] if isinstance(args, tuple) and len(args) == 2 else "?"
        metrics.OFFSET_RESETS.labels(str(getattr(tp, "partition", tp))).inc()
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg = ("the broker no longer holds offset %s of %s (retention or DeleteRecords removed records this "
                      "worker had not persisted, or the topic was truncated or recreated): reading resumes at the "
                      "earliest offset kept, and the records in between are not counted (`counter audit` compares "
                      "counts with the events stored)")
        return True


OFFSET_RESETS_FILTER = OffsetResets()


def watch_offset_resets() -> None:
    """Install `OffsetResets` on aiokafka's fetcher logger (once), which is then asked for its INFO lines."""
    fetcher = logging.getLogger(FETCHER_LOGGER)
    if OFFSET_RESETS_FILTER not in fetcher.filters:
        fetcher.addFilter(OFFSET_RESETS_FILTER)
    fetcher.setLevel(min(logging.INFO, logging.getLogger(PARENT_LOGGER).getEffectiveLevel()))  # DEBUG stays DEBUG


def topic_id(admin: AdminClient, topic: str, timeout_s: float = 5.0) -> str | None:
    """The topic's id as the broker tells it, None when it has none (an old broker) or does not hold the topic."""
    try:
        described = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)[topic].result()
    except KafkaException:
        return None
    found = str(described.topic_id) if described.topic_id is not None else None
    return None if found in (None, "", NO_ID) else found


class TopicWatch:
    """The mutations topic's id, read every `every_s` (on the heartbeat timer, off the persist path): `changed()`
    returns (old id, new id) while it differs from the one the worker follows, until `follow(new id)` once the worker
    has acted on it (a failure there is tried again at the next check: the review of this change)."""

    def __init__(self, bootstrap: str, topic: str, *, config: Mapping[str, Any] | None = None,
                 every_s: float = 5.0) -> None:
        self.topic = topic
        self.every_s = every_s
        self.current: str | None = None
        self._config = {"bootstrap.servers": bootstrap, **(config or {})}
        self._admin: AdminClient | None = None
        self._due = 0.0

    def read_now(self) -> None:
        """Read the id once, at the worker's start (blocking): the id its positions and commits go with."""
        self.current = self._read()
        self._due = time.monotonic() + self.every_s

    def _read(self) -> str | None:
        if self._admin is None:
            self._admin = AdminClient(self._config)
        return topic_id(self._admin, self.topic)

    async def changed(self) -> tuple[str, str] | None:
        now = time.monotonic()
        if now < self._due:
            return None
        self._due = now + self.every_s
        try:  # on the heartbeat timer: a failure here must not hold up the watermarks
            found = await asyncio.to_thread(self._read)
        except Exception as exc:
            log.debug("could not read the id of topic %s: %r", self.topic, exc)
            return None
        if found is None:  # away, deleted and not created yet, or a broker without ids: the last one stands
            return None
        if self.current is None:
            self.current = found
        return (self.current, found) if self.current != found else None

    def follow(self, found: str) -> None:
        self.current = found
