"""An ACCURATE window read after a ClearCount that no rollup has applied yet: real broker, worker, SQLite, HTTP API.

A clear zeros every window that ends at or before it. An ACCURATE read adds the persisted events after the
buckets' boundary, and before the fix it looked for a clear only inside the window: a clear later than the window's
end, persisted but not rolled up, was missed, and the window kept its old count until the rollup (12-18 s in a
review) while the total read 0. The namespaces' accept_limit of 10 minutes keeps every rollup below the clear for
the whole test, so the read cannot be saved by a rollup landing first.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from schemas import MICROS
from tests.helpers import iso, now_us, wait_for
from tests.pipeline_harness import FAST_DEFAULTS, worker_and_api

pytestmark = pytest.mark.integration

NAMESPACES = FAST_DEFAULTS.replace("accept_limit: 3s", "accept_limit: 10m") + """\
namespaces:
  sums:
    counter_type: ACCURATE
  visitors:
    counter_type: ACCURATE
    aggregation: UNIQUE
"""
MINUTE = 60 * MICROS


def test_a_clear_after_the_window_zeros_it_before_any_rollup(kafka_bootstrap: str, memcached_address: str,
                                                             tmp_path: Path) -> None:
    with worker_and_api(kafka_bootstrap, memcached_address, tmp_path, NAMESPACES) as (_env, client):
        def post(path: str, body: dict) -> dict:
            r = client.post(path, json=body)
            assert r.status_code == 200, r.text
            return r.json()

        last_minute = now_us() // MINUTE * MINUTE - MINUTE
        window = {"start": iso(last_minute), "end": iso(last_minute + MINUTE)}  # over before the clear below
        name = f"wc-{uuid.uuid4().hex[:8]}"  # the session's memcached caches rollups by namespace:counter
        sums = {"namespace": "sums", "counter_name": name}
        visitors = {"namespace": "visitors", "counter_name": name}
        token = {"token": "early", "generation_time": iso(last_minute + MICROS)}
        post("/v1/AddCount", {**sums, "delta": 5, "idempotency_token": token})
        post("/v1/AddCount", {**visitors, "item": "alice", "idempotency_token": token})

        def counts() -> list[int]:
            return [post("/v1/GetCount", {**body, **extra})["count"] for body in (sums, visitors)
                    for extra in ({}, {"window": window})]
        wait_for(lambda: counts() == [5, 5, 1, 1], 30, interval=0.1,
                 message=lambda: f"the adds persisted: in the totals and the window (live): {counts()} for the "
                                 f"window {window}; the pipeline: {client.get('/v1/pipeline').text[:3000]}")

        for body in (sums, visitors):
            post("/v1/ClearCount", {**body, "idempotency_token": {"token": "clear", "generation_time": iso(now_us())}})
        wait_for(lambda: post("/v1/GetCount", sums)["count"] == 0 and post("/v1/GetCount", visitors)["count"] == 0,
                 30, interval=0.1, message="the clears persisted: the totals read 0")
        assert post("/v1/GetCount", {**sums, "window": window})["count"] == 0
        unique = post("/v1/GetCount", {**visitors, "window": window})
        assert unique["count"] == 0 and unique["estimate"] == 0, unique

        # A window holding the clear counts what follows it, live too (two minutes: the clear's and the next).
        this_minute = now_us() // MINUTE * MINUTE - MINUTE
        holding = {"start": iso(this_minute), "end": iso(this_minute + 3 * MINUTE)}
        post("/v1/AddCount", {**sums, "delta": 3, "idempotency_token": {"token": "after",
                                                                         "generation_time": iso(now_us())}})
        wait_for(lambda: post("/v1/GetCount", sums)["count"] == 3, 30, interval=0.1, message="the add persisted")
        assert post("/v1/GetCount", {**sums, "window": holding})["count"] == 3
        assert post("/v1/GetCount", {**sums, "window": window})["count"] == 0
