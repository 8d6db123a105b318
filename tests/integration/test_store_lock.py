"""A request does not hang on another process's SQLite lock: the API's stores wait for it as long as the API waits for
the broker (half the smallest accept_limit, 2.5 s in the presets), then give up. An AddAndGetCount whose own event
cannot be stored then waits for the worker as it would for a lagging one (5 s), and answers 504: durable, counted
once the lock is gone. The worker's stores wait out minutes of contention. Reads never wait (WAL).

Before, every store waited for a lock its 30 s busy timeout eight times over: an AddAndGetCount beside a process
holding the events file's write lock hung for about 4 minutes. Real broker, worker, SQLite file and HTTP API; the lock
is a plain sqlite3 connection's write transaction on the stack's events file."""

from __future__ import annotations

import sqlite3
import time
import uuid
from datetime import UTC, datetime

from sinks import EVENTS_FILE
from tests.helpers import wait_for
from tests.integration.test_api import NAMESPACES
from tests.pipeline_harness import own_broker


def test_a_write_beside_a_held_store_lock_answers_in_seconds_and_counts_once(tmp_path):
    with own_broker(tmp_path, NAMESPACES) as (_broker, _mc, env, c):
        body = {"namespace": "my_dataset", "counter_name": "locked", "delta": 3,
                "idempotency_token": {"token": uuid.uuid4().hex, "generation_time": datetime.now(UTC).isoformat()}}
        warm = {**body, "counter_name": "warm-up", "idempotency_token": {**body["idempotency_token"],
                                                                           "token": uuid.uuid4().hex}}
        assert c.post("/v1/AddAndGetCount", json=warm).status_code == 200  # the API's stores are open

        locker = sqlite3.connect(env.data_dir / EVENTS_FILE, isolation_level=None, timeout=30)
        locker.execute("BEGIN IMMEDIATE")  # another process's write transaction, held
        try:
            started = time.monotonic()
            first = c.post("/v1/AddAndGetCount", json=body)
            waited = time.monotonic() - started
            read = c.post("/v1/GetCount", json={"namespace": "my_dataset", "counter_name": "warm-up"})
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert first.status_code == 504 and "durable" in first.json()["detail"], first.text
        assert waited < 12, f"the answer came {waited:.1f}s after the write: the store's lock held it"
        assert read.status_code == 200, read.text  # reads do not wait for writers

        def count() -> int:
            return c.post("/v1/GetCount", json={"namespace": "my_dataset", "counter_name": "locked"}).json()["count"]

        wait_for(lambda: count() == 3, 90, message="the durable write counted once the lock was gone")
        later = {**body, "delta": 10, "idempotency_token": {"token": uuid.uuid4().hex,
                                                            "generation_time": datetime.now(UTC).isoformat()}}
        assert c.post("/v1/AddAndGetCount", json=later).json()["count"] == 13  # once: the API's try was not stored
