"""Two API processes share one pipeline (COUNTER_API_WORKERS above 1, or instances on several hosts): an
AddAndGetCount through one counts the writes the other acknowledged before it, also while the worker has not
persisted them (query_api.service.earlier_ends). A real broker, worker, SQLite store and two API processes."""

from __future__ import annotations

import concurrent.futures
import time
import uuid

import httpx
import pytest

from tests.pipeline_harness import PipelineEnv

pytestmark = pytest.mark.integration

PAUSED_S = 1.5  # the worker stays frozen this long (its group session, 10 s, survives)


def test_add_and_get_through_one_api_counts_what_the_other_acknowledged(pipeline: PipelineEnv) -> None:
    pipeline.start_worker()
    a, b = (pipeline.start_api(COUNTER_API_SHARED_PIPELINE="true") for _ in range(2))
    worker = pipeline.workers[0]
    counter = f"shared-{uuid.uuid4().hex[:8]}"
    body = {"namespace": "my_dataset", "counter_name": counter}
    with httpx.Client(base_url=f"http://127.0.0.1:{a.port}", timeout=30) as via_a, \
            httpx.Client(base_url=f"http://127.0.0.1:{b.port}", timeout=30) as via_b, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert via_b.post("/v1/AddAndGetCount", json={**body, "delta": 1}).json()["count"] == 1
        worker.pause()
        try:
            assert via_a.post("/v1/AddCount", json={**body, "delta": 10}).status_code == 200
            answer = pool.submit(via_b.post, "/v1/AddAndGetCount", json={**body, "delta": 100})
            deadline = time.monotonic() + PAUSED_S
            while not answer.done() and time.monotonic() < deadline:  # an answer now would lack A's write
                time.sleep(0.01)
            assert not answer.done(), f"answered {answer.result().json()} while the worker was frozen"
        finally:
            worker.resume()
        response = answer.result(timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["count"] == 111
