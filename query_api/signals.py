"""Fire-and-forget rollup signals from reads, throttled per counter so a hot counter costs one per second."""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import Producer

from producers.client import release
from schemas import encode_signal
from streams.topics import partition_count, signal_partition

log = logging.getLogger(__name__)


class SignalEmitter:
    """Sends `{namespace, counter}` to the rollups topic, on the counter's xxhash partition."""

    def __init__(self, bootstrap: str, topic: str, *, min_interval_s: float = 1.0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.min_interval_s = min_interval_s
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5,
                                   "message.timeout.ms": 10_000, "client.id": "counter-api-signals"})
        self._partitions: int | None = None
        self._last: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._failed_at = 0.0

    def emit(self, namespace: str, counter: str) -> None:
        """Signal a rollup of the counter unless one was signalled recently; never raises."""
        now = time.monotonic()
        key = (namespace, counter)
        with self._lock:
            if now - self._last.get(key, -1e9) < self.min_interval_s:
                return
            self._last[key] = now
            if len(self._last) > 200_000:
                self._last.clear()
        try:
            if self._partitions is None:
                if now - self._failed_at < 5.0:
                    return
                self._partitions = partition_count(self.bootstrap, self.topic, timeout=2.0)
            record_key = f"{namespace}:{counter}".encode()
            self._producer.produce(self.topic, encode_signal(namespace, counter), record_key,
                                   partition=signal_partition(record_key, self._partitions))
            self._producer.poll(0)
        except Exception as exc:  # a lost signal only delays a rollup; the sweep repairs it
            self._failed_at = now
            log.warning("rollup signal for %s:%s not sent: %s", namespace, counter, exc)

    def close(self) -> None:
        self._producer.flush(2.0)
        release(self._producer)
