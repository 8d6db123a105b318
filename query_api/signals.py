"""Rollup signals from reads: fire and forget, throttled per counter so a hot counter costs one per second."""

from __future__ import annotations

import asyncio
import logging
import time

from streams.signals import SignalSender

log = logging.getLogger(__name__)


class ReadSignals:
    """A read of a stale counter asks for its rollup through the shared SignalSender; never raises."""

    def __init__(self, sender: SignalSender, *, min_interval_s: float = 1.0) -> None:
        self.sender = sender
        self.min_interval_s = min_interval_s
        self._last: dict[tuple[str, str], float] = {}
        self._started_at = -1e9
        self._starting: asyncio.Future[None] | None = None

    async def start(self) -> None:
        """Learn the rollups topic's partitions; if the broker is not there yet, the next reads try again."""
        self._started_at = time.monotonic()
        try:
            await self.sender.start()
        except Exception as exc:
            log.warning("rollup signals from reads are off until the broker answers: %s", exc)

    def emit(self, namespace: str, counter: str) -> None:
        """Signal a rollup of the counter unless one was signalled recently (a lost signal only delays a
        rollup: the worker's sweep repairs it)."""
        now = time.monotonic()
        key = (namespace, counter)
        if now - self._last.get(key, -1e9) < self.min_interval_s:
            return
        self._last[key] = now
        if len(self._last) > 200_000:
            self._last.clear()
        if not self.sender.partitions:
            if now - self._started_at > 5.0 and (self._starting is None or self._starting.done()):
                self._starting = asyncio.ensure_future(self.start())
            return
        try:
            self.sender.send([key]).add_done_callback(_log_failure)
        except Exception as exc:  # e.g. the broker was unreachable when the API started
            log.warning("rollup signal for %s:%s not sent: %s", namespace, counter, exc)


def _log_failure(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("rollup signal not delivered: %s", future.exception())
