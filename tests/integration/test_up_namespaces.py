"""`counter up` and its namespace file: every child reads the copy validated at the start (an edit takes effect at the
next `counter up`), and a setting changed in place between two runs, which changes what the stored data means, stops
the next run naming it, until the operator accepts it (streams.namespace_shapes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.process import http_ok
from tests.helpers import wait_for
from tests.integration.test_up_supervision import (
    COUNTER,
    NAMESPACES,
    ROOT,
    WriteLoad,
    counter_env,
    get_counts,
    start_up,
)

pytestmark = pytest.mark.integration


def test_an_edit_takes_effect_at_the_next_run_and_one_changing_stored_data_is_refused_until_accepted(tmp_path):
    """A worker restarted after an edit read the edited file while the API kept the old one, and a namespace whose
    aggregation changed between runs read its SUM counts as sketches (0), with no error (reviews)."""
    namespaces = tmp_path / "namespaces.yaml"
    namespaces.write_bytes(NAMESPACES.read_bytes())
    data_dir = tmp_path / "data"
    unique = yaml.safe_load(NAMESPACES.read_text())
    unique["namespaces"]["my_dataset"]["aggregation"] = "UNIQUE"
    running = start_up(tmp_path / "first", data_dir, COUNTER_NAMESPACES=str(namespaces))
    try:
        running.wait_up()
        endpoints = running.endpoints()
        copy = Path(endpoints["namespaces"])
        assert copy.parent == data_dir and copy.read_bytes() == NAMESPACES.read_bytes()
        assert endpoints["namespaces_source"] == str(namespaces.resolve())
        namespaces.write_text(yaml.safe_dump(unique))  # read by a restarted worker, it refused to start (a crash loop)
        api_url, worker_ready = endpoints["api_url"], endpoints["worker_metrics"].replace("/metrics", "/ready")
        counters = ["edited-ns-0", "edited-ns-1"]
        load = WriteLoad(api_url, counters).start()
        try:
            wait_for(lambda: len(load.acked) >= 100 or load.failures, 30, message="writes acknowledged")
            old = running.pids()["worker-0"]
            os.kill(old, signal.SIGKILL)
            wait_for(lambda: running.pids()["worker-0"] not in (None, old), 15, message="a new worker pid")
            wait_for(lambda: http_ok(worker_ready), 90, interval=0.25,
                     message=lambda: f"the restarted worker ready; output:\n{running.output()}")
            acked = len(load.acked)
            wait_for(lambda: len(load.acked) >= acked + 100 or load.failures, 30, message="writes after the restart")
        finally:
            load.stop()
        assert load.failures == [], load.failures[:5]
        assert "restart #2" not in running.output(), running.output()  # the restarted worker stayed up
        expected = load.expected()
        wait_for(lambda: get_counts(api_url, counters) == expected, 60, interval=0.5,
                 message=lambda: f"GetCount {get_counts(api_url, counters)} == acknowledged sums {expected}")
        code, _ = running.signal_and_wait(signal.SIGINT, 90)
        assert code == 0, running.output()
    finally:
        running.cleanup()
    # the local broker keeps nothing across runs: the shapes it recorded are saved in the data directory
    assert json.loads((data_dir / "namespace-shapes.json").read_text())["my_dataset"]["aggregation"] == "SUM"
    refused = subprocess.run([*COUNTER, "up", "--no-compile"], env=counter_env(data_dir, COUNTER_NAMESPACES=str(
        namespaces)), cwd=ROOT, capture_output=True, text=True, timeout=120)
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0 and "counter is up" not in said, said
    assert "namespace 'my_dataset': field 'aggregation': UNIQUE where the stored data is SUM" in said, said
    assert "COUNTER_ACCEPT_NAMESPACE_CHANGES=my_dataset" in said, said
    accepted = start_up(tmp_path / "accepted", data_dir, COUNTER_NAMESPACES=str(namespaces),
                        COUNTER_ACCEPT_NAMESPACE_CHANGES="my_dataset")
    try:
        accepted.wait_up()
        code, _ = accepted.signal_and_wait(signal.SIGINT, 90)
        assert code == 0, accepted.output()
    finally:
        accepted.cleanup()
    assert json.loads((data_dir / "namespace-shapes.json").read_text())["my_dataset"]["aggregation"] == "UNIQUE"
