"""The store a deployment persists into is recorded in Kafka (streams.store_binding), through real workers, APIs and
the `counter store` CLI on the session broker.

Before: a worker started with another store (COUNTER_STORE unset on one host, another data directory) and no
`counter up` endpoints file to check against joined the consumer group, persisted its share of the writes where no
API read, and committed their offsets: those acknowledged writes were never counted, and nothing said so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import httpx
import pytest

from infra.process import ServiceError
from tests.helpers import wait_for
from tests.pipeline_harness import PipelineEnv

pytestmark = pytest.mark.integration


def _cli(pipeline: PipelineEnv, *args: str, data_dir) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **pipeline.stack.env, "COUNTER_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "counter_cli.main", *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)


def test_another_store_is_refused_and_a_rebind_stops_the_workers_left_on_the_old_one(pipeline: PipelineEnv,
                                                                                      tmp_path) -> None:
    pipeline.stack.env["COUNTER_STORE_BINDING_CHECK_S"] = "1"
    first = pipeline.start_worker()
    api = pipeline.start_api()
    with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as client:
        assert client.get("/readyz").json()["checks"]["store_binding"] == "ok"
        written = client.post("/v1/AddCount", json={"namespace": "my_dataset", "counter_name": "c", "delta": 5})
        assert written.status_code == 200, written.text
    wait_for(lambda: pipeline.converged("my_dataset", {"c": 5}), 45, message="the write counted")

    other = tmp_path / "other-store"
    with pytest.raises(ServiceError) as refused:  # a second worker of the group, on another store
        pipeline.stack.start_worker(COUNTER_DATA_DIR=str(other))
    text = str(refused.value)
    assert "exited with code 2" in text and "is not the one consumer group" in text, text
    assert f"sqlite://{pipeline.data_dir.resolve()}" in text and f"sqlite://{other.resolve()}" in text, text
    with pytest.raises(ServiceError) as refused:  # an API would answer from counts no worker keeps
        pipeline.stack.start_api(COUNTER_DATA_DIR=str(other))
    text = str(refused.value)
    assert "exited with code 2" in text and "error: this process's store" in text, text
    assert "Traceback" not in text, text  # one line, as the worker's
    assert first.running()

    typo = tmp_path / "typo"
    shown = _cli(pipeline, "store", "show", data_dir=typo)
    assert shown.returncode == 2 and f"no store in {typo}" in shown.stdout, shown.stdout
    assert not typo.exists()  # nothing created
    shown = _cli(pipeline, "store", "show", data_dir=other)
    assert shown.returncode == 1 and "another store" in shown.stdout, shown.stdout
    assert _cli(pipeline, "store", "show", data_dir=pipeline.data_dir).returncode == 0

    moved = _cli(pipeline, "store", "rebind", data_dir=other)
    assert moved.returncode == 0 and "now persists into store" in moved.stdout, moved.stdout
    wait_for(lambda: not first.running(), 60, message="the worker on the old store stopped")
    assert "is not the one consumer group" in first.log_tail(200), first.log_tail(200)
    with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as client:
        wait_for(lambda: client.get("/readyz").status_code == 503, 30, message="the API on the old store unready")
        assert client.get("/readyz").json()["checks"]["store_binding"].startswith("another store"), \
            client.get("/readyz").text
    pipeline.stack.start_worker(COUNTER_DATA_DIR=str(other))  # the new store's workers start


def test_a_copy_of_the_store_passes_for_it_until_rebound_as_a_store_of_its_own(pipeline: PipelineEnv,
                                                                               tmp_path) -> None:
    """A copy (a restored backup, a cloned disk) carries the original's identity: a worker on it beside one on the
    original would split the writes between two stores unnoticed (a review: 100 of 200 acknowledged writes counted).
    `counter store` says so, and `rebind --new-store` gives the copy its own identity: the original's workers stop."""
    pipeline.stack.env["COUNTER_STORE_BINDING_CHECK_S"] = "1"
    original = pipeline.start_worker()
    wait_for(lambda: pipeline.owned(original) == set(range(pipeline.partitions)), 60,
             message="the worker bound and owns the partitions")
    original.stop()
    copy = tmp_path / "restored"
    shutil.copytree(pipeline.data_dir, copy, ignore=shutil.ignore_patterns("logs"))
    original = pipeline.start_worker()

    shown = _cli(pipeline, "store", "show", data_dir=copy)
    assert shown.returncode == 0 and "note: this store has the bound store's identity" in shown.stdout, shown.stdout
    kept = _cli(pipeline, "store", "rebind", data_dir=copy)
    assert kept.returncode == 0 and "already persists into" in kept.stdout and "--new-store" in kept.stdout, \
        kept.stdout
    assert original.running()

    moved = _cli(pipeline, "store", "rebind", "--new-store", data_dir=copy)
    assert moved.returncode == 0 and "now persists into store" in moved.stdout, moved.stdout
    wait_for(lambda: not original.running(), 60, message="the worker on the original stopped")
    with pytest.raises(ServiceError):
        pipeline.stack.start_worker()  # the original store is refused from now on
    pipeline.stack.start_worker(COUNTER_DATA_DIR=str(copy))
