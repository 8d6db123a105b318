"""bench.stack_meter: CPU per request per process, the machine's busy share, and the API's group-commit figures
read from its real metrics registry (a rename of an exported series would leave the benchmark blind)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from prometheus_client import start_http_server

from bench.rounds import medians
from bench.stack_meter import StackMeter
from infra.process import free_port
from query_api import metrics

BURN = """
import sys, time
sys.stdin.readline()
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
print("burnt", flush=True)
sys.stdin.readline()
"""


def _burn_here(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_per_request_is_split_by_process_and_the_machine_share_is_a_percentage() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURN, "0.4"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        meter = StackMeter({"child": child.pid, "gone": None})
        meter.start()
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        _burn_here(0.2)
        assert child.stdout.readline() == "burnt\n"
        figures = meter.stop(requests=1000)
    finally:
        child.communicate("\n", timeout=10)
    assert set(figures) == {"cpu_us_child", "cpu_us_client", "busy_pct"}
    assert 0.4e6 / 1000 * 0.9 <= figures["cpu_us_child"] <= 0.4e6 / 1000 * 1.5  # 400 µs per request, in ticks
    assert 0.2e6 / 1000 * 0.9 <= figures["cpu_us_client"] <= 0.2e6 / 1000 * 2.0
    assert 0 < figures["busy_pct"] <= 100
    assert "child 4" in StackMeter.describe(figures) and "% busy" in StackMeter.describe(figures)
    assert StackMeter.describe(figures, per="mutation").startswith("CPU µs/mutation: child 4")


@pytest.fixture
def metrics_url() -> str:
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=metrics.REGISTRY)
    yield f"http://127.0.0.1:{port}/metrics"
    server.shutdown()
    thread.join(5)


def test_group_commit_figures_are_the_differences_over_the_load(metrics_url: str) -> None:
    metrics.GROUP_COMMIT.record_sent(99)  # before the load: not counted
    metrics.GROUP_COMMIT.record_done(0.5, True)
    meter = StackMeter({}, metrics_url=metrics_url)
    meter.start()
    for mutations, seconds in ((10, 0.001), (30, 0.003)):
        metrics.GROUP_COMMIT.record_sent(mutations)
        metrics.GROUP_COMMIT.record_done(seconds, True)
    metrics.GROUP_COMMIT.record_sent(5)
    metrics.GROUP_COMMIT.record_done(9.0, False)  # a failed record: no acknowledgement time
    figures = meter.stop(requests=45)
    assert figures["writes_per_record"] == pytest.approx(45 / 3)
    assert figures["broker_ack_ms"] == pytest.approx(2.0)
    assert "15.0 writes/record" in StackMeter.describe(figures)


def test_a_load_without_records_has_no_group_commit_figures(metrics_url: str) -> None:
    meter = StackMeter({}, metrics_url=metrics_url)
    meter.start()
    assert not {"writes_per_record", "broker_ack_ms"} & set(meter.stop(requests=10))


def test_medians_take_a_meters_figures_over_the_rounds_that_have_them() -> None:
    base = {"requests": 1, "errors": 0, "throughput_per_s": 1.0, "p50_ms": 1.0, "p99_ms": 2.0, "max_ms": 3.0}
    rounds = [{**base, "cpu_us_api": 30.0, "broker_ack_ms": 0.5}, {**base, "cpu_us_api": 10.0},
              {**base, "cpu_us_api": 20.0, "broker_ack_ms": 0.7}]
    got = medians(rounds)
    assert got["cpu_us_api"] == 20.0 and got["broker_ack_ms"] == pytest.approx(0.6)
    assert "requests" not in got and got["errors"] == 0
