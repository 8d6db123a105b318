"""Timers that outlive a failing run: a failure is logged and the timer runs again at its next tick.

Why: in Faust (faust-streaming 0.15, mode 0.7) an exception escaping an `@app.timer` crashes the whole app, and the
worker's timers read and write the store (the heartbeat publishes watermarks, the sweep lists stale counters,
retention drops slices). A store hiccup of a second then stopped the worker, persist path and rollups included,
rather than delaying one heartbeat, sweep or retention pass, which the next tick does anyway.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from agents import metrics

log = logging.getLogger("counter.worker")

# mode's line for a timer run that outlasted its interval (mode-streaming 0.7.1, pinned in constraints.txt; the
# lean is tested in tests/unit/test_timers.py)
OVERLAPPING = "Timer %s is overlapping (interval=%r runtime=%r)"

REPEAT_LOG_S = 60.0  # while a timer keeps failing, one line at most this often

R = TypeVar("R")


def surviving(what: str) -> Callable[[Callable[[], Awaitable[R]]], Callable[[], Awaitable[R | None]]]:
    """Decorate a timer's body: an exception is logged (its first with the traceback, then one line at most every
    REPEAT_LOG_S with the count, and a line when it runs again) and the run returns None."""
    def decorate(body: Callable[[], Awaitable[R]]) -> Callable[[], Awaitable[R | None]]:
        state = {"failures": 0, "logged_at": 0.0}

        @functools.wraps(body)  # Faust reads the signature (no arguments: the app is not passed)
        async def run() -> R | None:
            try:
                result = await body()
            except Exception as exc:
                state["failures"] += 1
                now = time.monotonic()
                if state["failures"] == 1:
                    state["logged_at"] = now
                    log.exception("%s failed; it runs again at its next tick", what)
                elif now - state["logged_at"] >= REPEAT_LOG_S:
                    state["logged_at"] = now
                    log.error("%s still failing (%d times): %r", what, state["failures"], exc)
                return None
            if state["failures"]:
                log.warning("%s runs again after %d failure(s)", what, state["failures"])
                state["failures"] = 0
            return result
        return run
    return decorate


class CountOverlaps(logging.Filter):
    """Counts mode's "Timer ... is overlapping" WARNINGs in `counter_worker_timer_overlaps_total{timer}` and drops
    them. The heartbeat ticks every 250 ms, and under load a run of it (store reads, a publish) often takes longer,
    harmlessly: the next run starts at once. A soak saw such a line about once a minute, which reads like a fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != OVERLAPPING:
            return True
        args: Any = record.args
        name = str(args[0]) if isinstance(args, tuple) and args else "?"
        metrics.TIMER_OVERLAPS.labels(name.rsplit(".", 1)[-1]).inc()  # Faust names a timer by its qualified name
        return False


COUNT_OVERLAPS = CountOverlaps()


def count_overlaps() -> None:
    """Install `CountOverlaps` on mode's timer logger (once: a filter is added once)."""
    logging.getLogger("mode.timers").addFilter(COUNT_OVERLAPS)
