"""AddAndGetCount after writes the worker has not persisted, in an API that had not read the worker's offsets lately:
real broker, worker (frozen), SQLite, the HTTP API.

The API stores an AddAndGetCount's own event early with its recent writes of the counter (query_api.early_persist),
and a write it has forgotten (older than its recent_s, 4 s) is one it may leave to the worker only once the worker's
committed offsets show the worker has it. An API that had made no AddAndGetCount for a while had no fresh offsets
(their poll sleeps when idle), and it skipped that check: with the worker down, it answered 1 for a count of 501,
and 101 after an acknowledged ClearCount (a review). It must now wait for the worker: a 504 while the worker is
frozen, and the exact count once it runs.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.helpers import wait_for
from tests.pipeline_harness import FAST_DEFAULTS, worker_and_api

pytestmark = pytest.mark.integration

NAMESPACES = FAST_DEFAULTS + """\
namespaces:
  views:
    counter_type: EVENTUAL
"""
ACCURATE = """\
  views_accurate:
    counter_type: ACCURATE
"""
FORGOTTEN_AFTER_S = 4 * 9 / 8 + 0.5  # the API's recent_s (4 s), forgotten an eighth at a time, and a margin


def test_add_and_get_counts_writes_it_forgot_or_waits_for_the_worker(kafka_bootstrap: str, memcached_address: str,
                                                                      tmp_path: Path) -> None:
    with worker_and_api(kafka_bootstrap, memcached_address, tmp_path, NAMESPACES) as (env, client):
        counter = {"namespace": "views", "counter_name": f"idle-{uuid.uuid4().hex[:8]}"}  # the memcached is shared
        [worker] = env.workers
        env.pause_settled(worker)
        try:
            for _ in range(50):
                assert client.post("/v1/AddCount", json={**counter, "delta": 2}).status_code == 200
            time.sleep(FORGOTTEN_AFTER_S)  # the time the API remembers its writes for: it forgets them
            answer = client.post("/v1/AddAndGetCount", json={**counter, "delta": 1})
            assert answer.status_code == 504, answer.text  # 200 with count 1 before: the 100 left out
        finally:
            worker.resume()
        wait_for(lambda: client.post("/v1/GetCount", json=counter).json()["count"] == 101, 60, interval=0.2,
                 message="the worker counts every write once it runs")
        answer = client.post("/v1/AddAndGetCount", json={**counter, "delta": 1})
        assert answer.status_code == 200 and answer.json()["count"] == 102, answer.text


@pytest.mark.parametrize("namespace", ["views", "views_accurate"])
def test_a_restarted_api_counts_what_its_predecessor_acknowledged(namespace: str, kafka_bootstrap: str,
                                                                  memcached_address: str, tmp_path: Path) -> None:
    """A review: AddAndGetCount +5 (5), the worker frozen, a ClearCount and three +10 acknowledged, the API killed
    with kill -9 and restarted (as `counter up` does): the new API's AddAndGetCount +1 answered 6 at once. It knew
    nothing of its predecessor's writes, so it stored its own event and counted without the clear and the adds. It
    must now wait for the worker: a 504 while the worker is frozen, and 31, then 32, once it runs."""
    with worker_and_api(kafka_bootstrap, memcached_address, tmp_path, NAMESPACES + ACCURATE) as (env, client):
        counter = {"namespace": namespace, "counter_name": f"restart-{uuid.uuid4().hex[:8]}"}
        assert client.post("/v1/AddAndGetCount", json={**counter, "delta": 5}).json()["count"] == 5
        [worker] = env.workers
        env.pause_settled(worker)
        try:
            assert client.post("/v1/ClearCount", json=counter).status_code == 200
            for _ in range(3):
                assert client.post("/v1/AddCount", json={**counter, "delta": 10}).status_code == 200
            [old] = env.stack.apis
            old.kill()  # SIGKILL: no clean stop
            new = env.start_api()
            with httpx.Client(base_url=f"http://127.0.0.1:{new.port}", timeout=30) as fresh:
                answer = fresh.post("/v1/AddAndGetCount", json={**counter, "delta": 1})
                assert answer.status_code == 504, answer.text  # 200 with count 6 before
        finally:
            worker.resume()
        with httpx.Client(base_url=f"http://127.0.0.1:{new.port}", timeout=30) as fresh:
            wait_for(lambda: fresh.post("/v1/GetCount", json=counter).json()["count"] == 31, 60, interval=0.2,
                     message="the worker counts every write once it runs")
            answer = fresh.post("/v1/AddAndGetCount", json={**counter, "delta": 1})
            assert answer.status_code == 200 and answer.json()["count"] == 32, answer.text
