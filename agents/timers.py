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
from typing import TypeVar

log = logging.getLogger("counter.worker")

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
