"""Heartbeats slow down when the worker is idle, and only as far as the rollup window hides the lag."""

from __future__ import annotations

import pytest

from agents.watermark import HeartbeatPace
from agents.worker import idle_heartbeat_s
from control_plane import parse_namespaces
from streams.settings import Settings


def test_heartbeats_go_at_every_tick_while_writes_are_persisted_and_once_per_idle_s_after() -> None:
    pace = HeartbeatPace(idle_s=2.0)
    assert pace.due(0.0)  # nothing sent yet
    pace.sent(0.0)
    assert not pace.due(0.25) and not pace.due(1.9)  # idle: not before idle_s
    assert pace.due(2.0)
    pace.sent(2.0)
    pace.writes_persisted(2.1)
    for now in (2.25, 2.5, 4.0):  # writes within idle_s: every tick
        assert pace.due(now)
        pace.sent(now)
    assert not pace.due(4.25)  # 2.15 s since the last writes: idle again, and the last heartbeats are fresh
    assert pace.due(6.0)


def test_a_zero_idle_s_sends_at_every_tick() -> None:
    pace = HeartbeatPace(0.0)
    pace.sent(1.0)
    assert pace.due(1.0) and pace.due(1.01)


def namespaces(accept: str, skew: str, coalesce_ms: int) -> list:
    registry = parse_namespaces({"defaults": {"accept_limit": accept, "max_clock_skew": skew,
                                              "queue_config": {"coalesce_ms": coalesce_ms}},
                                 "namespaces": {"a": {"counter_type": "EVENTUAL"}, "b": {"counter_type": "ACCURATE"}}})
    return list(registry.values())


@pytest.mark.parametrize(("accept", "skew", "coalesce_s", "expected"), [
    ("5s", "1s", 10.0, 2.0),     # the shipped presets: 4 s of slack, the idle interval whole
    ("5s", "1s", 8.0, 1.0),      # 2 s of slack: half of it
    ("2s", "250ms", 0.5, 0.25),  # the benchmarks' namespaces: no slack, every tick
])
def test_the_idle_interval_is_what_the_rollup_window_leaves_over_halved(accept: str, skew: str, coalesce_s: float,
                                                                        expected: float) -> None:
    settings = Settings(watermark_interval_ms=250, watermark_idle_interval_ms=2000)
    assert idle_heartbeat_s(namespaces(accept, skew, int(coalesce_s * 1000)), settings, coalesce_s) == expected
    assert idle_heartbeat_s([], settings, coalesce_s) == 0.25
