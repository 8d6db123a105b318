"""A durable write's 503 leaves time for the retry it asks for.

The 503 says: retry with the same idempotency token and generation_time, and it is counted once. A retry is admitted
only while its generation_time lies within the namespace's accept_limit of when it reaches Kafka (5 s in the
presets). The API used to wait 5 s for the broker before answering 503, so the retry a client sent at once was
refused with a 422, and a write whose first attempt had not landed was lost (a new user's walkthrough found it with
the broker frozen). Now the API waits half the smallest accept_limit (query_api.service.broker_timeout_s).
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from tests.helpers import read_all, wait_for
from tests.integration.test_api import NAMESPACES
from tests.pipeline_harness import own_broker


def test_a_write_answered_503_by_a_frozen_broker_is_counted_once_when_retried_at_once(tmp_path):
    with own_broker(tmp_path, NAMESPACES) as (broker, _mc, _env, c):
        body = {"namespace": "my_dataset", "counter_name": "retried", "delta": 7,
                "idempotency_token": {"token": uuid.uuid4().hex, "generation_time": datetime.now(UTC).isoformat()}}
        assert c.post("/v1/AddCount", json={**body, "counter_name": "warm-up"}).status_code == 200

        broker.pause()
        try:
            started = time.monotonic()
            first = c.post("/v1/AddCount", json=body)
            waited = time.monotonic() - started
        finally:
            broker.resume()
        assert first.status_code == 503, first.text
        assert first.json()["idempotency_token"]["token"] == body["idempotency_token"]["token"]
        assert "accept_limit" in first.json()["detail"], first.text  # it says until when a retry counts once
        assert waited < 4.5, f"the 503 came {waited:.1f}s after the write: too late to retry within 5 s"

        retry = c.post("/v1/AddCount", json=body)  # at once, as the 503 asks
        assert retry.status_code == 200, retry.text

        def count() -> int:
            r = c.post("/v1/GetCount", json={"namespace": "my_dataset", "counter_name": "retried"})
            assert r.status_code == 200, r.text
            return r.json()["count"]

        wait_for(lambda: count() == 7, 60, message="the retried write counted")
        later = {**body, "delta": 100, "idempotency_token": {"token": uuid.uuid4().hex,
                                                             "generation_time": datetime.now(UTC).isoformat()}}
        assert c.post("/v1/AddCount", json=later).status_code == 200
        wait_for(lambda: count() != 7, 60, message="a later write counted")
        assert count() == 107  # the first attempt and its retry are one event, whether or not the first landed


def test_a_batch_answered_503_names_each_entrys_token_and_its_retry_counts_once(tmp_path):
    """A BatchAddCount's 503 carried no tokens: the API drew them, the client could not send them again, and its
    retry was counted twice (10 instead of 5, a review's repro)."""
    with own_broker(tmp_path, NAMESPACES) as (broker, _mc, _env, c):
        batch = [{"namespace": "my_dataset", "counter_name": "batched", "delta": 5},
                 {"namespace": "my_dataset_best_effort", "counter_name": "b", "delta": 1}]
        assert c.post("/v1/AddCount", json={**batch[0], "counter_name": "warm-up"}).status_code == 200
        broker.pause()
        try:
            first = c.post("/v1/BatchAddCount", json={"requests": batch})
        finally:
            broker.resume()
        assert first.status_code == 503, first.text
        tokens = first.json()["idempotency_tokens"]
        assert tokens[1] is None and tokens[0]["token"] and isinstance(tokens[0]["generation_time"], int), tokens

        retry = [{**batch[0], "idempotency_token": tokens[0]}, batch[1]]
        assert c.post("/v1/BatchAddCount", json={"requests": retry}).status_code == 200

        def count() -> int:
            return c.post("/v1/GetCount", json={"namespace": "my_dataset", "counter_name": "batched"}).json()["count"]

        wait_for(lambda: count() == 5, 60, message="the batch's write counted")
        later = {**batch[0], "delta": 100}
        assert c.post("/v1/AddCount", json=later).status_code == 200
        wait_for(lambda: count() != 5, 60, message="a later write counted")
        assert count() == 105  # the first attempt and its retry are one event


def test_a_write_acknowledged_after_its_accept_limit_is_a_504_not_a_200(tmp_path):
    """A write dated near the end of its accept_limit (3 s here) is admitted on arrival, then gathers behind a record
    the frozen broker holds; its own record goes out, and is stamped, only once the broker is back, after the write's
    accept_limit, so the worker dead-letters it. It was answered 200 (durable) and never counted (a review); now the
    acknowledgement is checked against the accept_limit too, and the answer is a 504 saying why: for the plain
    AddCount (from the C reader and the protocol's Python fast path), the routes (ClearCount) and a batch."""
    with own_broker(tmp_path, NAMESPACES) as (broker, _mc, env, c):
        assert c.post("/v1/AddCount", json={"namespace": "my_dataset", "counter_name": "warm-up", "delta": 1}
                      ).status_code == 200

        def records_sent() -> float:
            lines = c.get("/metrics").text.splitlines()
            return sum(float(line.split()[-1]) for line in lines
                       if line.startswith("counter_api_group_commit_records_total"))

        def dated(counter: str, *, as_float: bool = False) -> dict:
            at = time.time() - 2.4  # 0.6 s of accept_limit left
            generation_time = at if as_float else datetime.fromtimestamp(at, UTC).isoformat()
            return {"namespace": "my_dataset", "counter_name": counter,
                    "idempotency_token": {"token": uuid.uuid4().hex, "generation_time": generation_time}}

        # the late entry shares its record with one on time, which the worker counts (a review: the 504 named the
        # late entry's token only, so a client resending the rest counted the on-time one twice)
        batch = [{**dated("batch-late"), "delta": 2},
                 {"namespace": "my_dataset", "counter_name": "on-time", "delta": 4},
                 {"namespace": "my_dataset_best_effort", "counter_name": "batch-be", "delta": 1}]
        with ThreadPoolExecutor(5) as pool:
            sent = records_sent()
            broker.pause()
            try:
                ahead = pool.submit(c.post, "/v1/AddCount", json={"namespace": "my_dataset", "counter_name": "ahead",
                                                                    "delta": 1})
                wait_for(lambda: records_sent() > sent, 5, interval=0.01, message="a record in flight")
                late = [pool.submit(c.post, "/v1/AddCount", json={**dated("plain-late"), "delta": 5}),
                        # epoch seconds as a float: not the C reader's form, the protocol's Python fast path (a review:
                        # it answered 200 from the raw acknowledgement)
                        pool.submit(c.post, "/v1/AddCount", json={**dated("fast-late", as_float=True), "delta": 3}),
                        pool.submit(c.post, "/v1/ClearCount", json=dated("clear-late")),
                        pool.submit(c.post, "/v1/BatchAddCount", json={"requests": batch})]
                time.sleep(1.0)  # the stall: the writes above wait behind the record in flight (1.5 s at most)
            finally:
                broker.resume()
            assert ahead.result(30).status_code == 200
            answers = [f.result(30) for f in late]
        for answer in answers:
            assert answer.status_code == 504, answer.text
            assert "past namespace 'my_dataset''s accept_limit=3.0s" in answer.text, answer.text

        def dead_letters() -> list[str] | None:
            reasons = [dict(r.headers or []).get("dlq.reason", b"").decode() for r in read_all(broker.bootstrap,
                                                                                              env.dlq_topic)]
            return reasons if len(reasons) >= 4 else None
        reasons = wait_for(dead_letters, 30, interval=0.5, message="the late writes dead-lettered")
        assert isinstance(reasons, list) and len(reasons) == 4 and all("before the record reached Kafka" in r
                                                                      for r in reasons), reasons

        tokens = answers[3].json()["idempotency_tokens"]  # each entry's, to retry the batch by
        assert tokens[0]["token"] == batch[0]["idempotency_token"]["token"] and tokens[1]["token"], tokens
        assert tokens[2] is None, tokens  # BEST_EFFORT: taken back, no token
        resent = c.post("/v1/BatchAddCount", json={"requests": [{**batch[1], "idempotency_token": tokens[1]}]})
        assert resent.status_code == 200, resent.text

        def on_time() -> int:
            return c.post("/v1/GetCount", json={"namespace": "my_dataset", "counter_name": "on-time"}).json()["count"]
        wait_for(lambda: on_time() == 4, 60, message="the on-time entry counted")
        assert c.post("/v1/AddCount", json={**batch[1], "delta": 100}).status_code == 200
        wait_for(lambda: on_time() != 4, 60, message="a later write counted")
        assert on_time() == 104  # the entry and its retry are one event
