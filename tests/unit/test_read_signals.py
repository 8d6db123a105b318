"""When a read signals a rollup: only for a counter whose rollup lags (a read repairs a stale counter)."""

from __future__ import annotations

import time

import pytest

from control_plane import default_config_path, load_namespaces
from control_plane.admission import rollup_boundary
from query_api.service import CounterService
from schemas import MICROS

REGISTRY = load_namespaces(default_config_path())


class RecordingSignals:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def emit(self, namespace: str, counter: str) -> None:
        self.sent.append((namespace, counter))


def service(lag_s: float) -> tuple[CounterService, RecordingSignals]:
    signals = RecordingSignals()
    svc = CounterService(REGISTRY, producer=None, signals=signals, events=None, rollups=None,  # type: ignore[arg-type]
                         cache=None, counters=None, read_signal_lag_s=lag_s)  # type: ignore[arg-type]
    return svc, signals


@pytest.mark.parametrize("ns_name", ["my_dataset", "my_dataset_accurate"])
def test_fresh_rollups_are_not_signalled_stale_and_missing_ones_are(ns_name: str) -> None:
    ns = REGISTRY[ns_name]
    svc, signals = service(lag_s=5.0)
    now = time.time_ns() // 1000
    newest = rollup_boundary(now, now, ns)
    svc.signal_if_stale(ns, "fresh", newest - 1 * MICROS)
    svc.signal_if_stale(ns, "stale", newest - 6 * MICROS)
    svc.signal_if_stale(ns, "never-rolled-up", 0)
    assert signals.sent == [(ns_name, "stale"), (ns_name, "never-rolled-up")]


def test_lag_zero_signals_every_read() -> None:
    ns = REGISTRY["my_dataset"]
    svc, signals = service(lag_s=0.0)
    now = time.time_ns() // 1000
    svc.signal_if_stale(ns, "c", rollup_boundary(now, now, ns) - 1000)
    assert signals.sent == [("my_dataset", "c")]
