"""The worker's timers outlive a failing run (`agents.timers.surviving`).

In faust-streaming (pinned in constraints.txt) an exception escaping an `@app.timer` crashes the app: with the
worker's heartbeat, sweep and retention reading and writing the store, a store hiccup of a second stopped the whole
worker. A real Faust app's timer, no broker (a timer task runs without one)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import faust
import pytest

from agents import metrics, worker
from agents.timers import count_overlaps, surviving

DEADLINE_S = 10.0


def run_timer(tmp_path: Path, body: Callable[[], Awaitable[None]], done: Callable[[], bool]) -> faust.App:
    """Run `body` as a 10 ms timer of a fresh app until `done()` or the app crashed (fails after DEADLINE_S)."""
    async def main() -> faust.App:
        app = faust.App("timers-test", broker="kafka://127.0.0.1:1", datadir=str(tmp_path / "faust"),
                        web_enabled=False)
        app.timer(0.01)(body)
        task = app.add_future(app._app_tasks[0]())  # as the app runs it: a failure crashes the app
        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        while not (done() or app._crashed.is_set()):
            assert asyncio.get_running_loop().time() < deadline, "the timer neither finished nor crashed the app"
            await asyncio.sleep(0.01)
        task.cancel()
        return app
    return asyncio.run(main())


def test_a_failing_timer_crashes_a_faust_app_and_one_that_survives_runs_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    async def failing() -> None:
        calls.append(1)
        if len(calls) <= 2:
            raise ConnectionRefusedError("store away")

    crashed = run_timer(tmp_path / "bare", failing, lambda: len(calls) >= 3)
    assert crashed._crashed.is_set() and len(calls) == 1  # the lean: Faust does not survive it

    calls.clear()
    with caplog.at_level(logging.WARNING, logger="counter.worker"):
        app = run_timer(tmp_path / "surviving", surviving("sweep")(failing), lambda: len(calls) >= 4)
    assert not app._crashed.is_set() and len(calls) >= 4
    ours = [r for r in caplog.records if r.name == "counter.worker"]
    assert [r.getMessage() for r in ours if r.exc_info] == ["sweep failed; it runs again at its next tick"]
    assert any(r.getMessage() == "sweep runs again after 2 failure(s)" for r in ours)


def test_every_timer_of_the_worker_survives_a_failing_run() -> None:
    """Each `@app.timer` that `declare_agents` declares is `@surviving`, but `store_binding`: its StoreMismatch must
    stop the worker (its BindingWatch survives a broker away itself, tests/unit/test_store_binding.py)."""
    source = inspect.getsource(worker.declare_agents)
    timers = re.findall(r"@app\.timer\([^)]*\)\n\s*(@surviving\(\"\w+\"\)\n\s*)?async def (\w+)", source)
    assert {name for _, name in timers} >= {"heartbeat", "sweep", "retention"}
    assert [name for wrapped, name in timers if not wrapped] == ["store_binding"]


def test_a_timer_run_outlasting_its_interval_is_counted_not_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """mode (pinned in constraints.txt) logs a WARNING at every timer run longer than its interval; under load the
    250 ms heartbeat's runs often are, and a soak saw the line about once a minute. It is counted instead. This is
    the lean on mode's message: if mode words it otherwise, nothing is counted here."""
    calls: list[int] = []

    async def slow() -> None:
        calls.append(1)
        await asyncio.sleep(0.05)  # five times the 10 ms interval

    def overlaps() -> float:
        return sum(s.value for m in metrics.REGISTRY.collect() if m.name == "counter_worker_timer_overlaps"
                   for s in m.samples if s.name.endswith("_total") and s.labels == {"timer": "slow"})

    before = overlaps()
    count_overlaps()
    with caplog.at_level(logging.INFO, logger="mode.timers"):
        run_timer(tmp_path, slow, lambda: len(calls) >= 4)
    assert overlaps() - before >= 2, "mode's overlapping runs were not counted"
    assert not [r for r in caplog.records if "is overlapping" in r.getMessage()]
