"""An API whose clock disagrees with the timestamps the broker gives its records answers each write as the worker
will judge it, by the record's timestamp.

The worker admits an event by the timestamp of its record (LogAppendTime on Apache Kafka: the broker's clock), the
API by its own clock. With the API's clock 2 s ahead of the broker's, a write dated 0.1 s after the API's now was
admitted by the API, answered 200, and dead-lettered by the worker (2.1 s after its record, max_clock_skew 250 ms):
never counted. With it 2 s behind, a write dated 2.5 s before the API's now (accept_limit 3 s) likewise. Now every
path that answers a durable write (the C plain AddCount, the Python fast path, the routes, AddAndGetCount, batches)
judges it by the timestamp the acknowledgement carries when that timestamp is not where the API's clock put the
record, and answers 503 (with the write's identity) for what the worker will dead-letter.

Here the local broker keeps the CreateTime librdkafka stamps (the machine's clock), so the API's Python clock is
shifted instead (`sitecustomize`, below): the API dates writes by it, while its records carry the real time, as a
broker's LogAppendTime would. The C reader of a plain AddCount reads the real clock, so its undated writes agree.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import httpx
import pytest

from schemas.validation import micros_iso
from tests.helpers import read_all, wait_for
from tests.pipeline_harness import PipelineEnv

pytestmark = pytest.mark.integration

NS = "my_dataset"  # tests/data/pipeline_namespaces.yaml: accept_limit 3s, max_clock_skew 250ms
ACCEPT_S, SKEW_S = 3.0, 0.25

SHIFTED_CLOCK = """
import os, time
_shift_ns = int(float(os.environ["COUNTER_TEST_CLOCK_SHIFT_S"]) * 1e9)
_time_ns, _time = time.time_ns, time.time
time.time_ns = lambda: _time_ns() + _shift_ns
time.time = lambda: _time() + _shift_ns / 1e9
"""


def admitted(offset_s: float) -> bool:
    """Whether the worker admits an event dated `offset_s` after its record's timestamp."""
    return -ACCEPT_S <= offset_s <= SKEW_S


@pytest.mark.parametrize("shift_s", [2.0, -2.0], ids=["api-ahead", "api-behind"])
def test_writes_the_worker_refuses_by_the_records_timestamp_are_answered_503_and_the_rest_counted(
        pipeline: PipelineEnv, tmp_path: Path, shift_s: float) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SHIFTED_CLOCK)
    worker = pipeline.start_worker()
    wait_for(lambda: pipeline.owned(worker) == set(range(pipeline.partitions)), 60, interval=0.2,
             message="the worker owning every mutations partition")
    api = pipeline.start_api(COUNTER_TEST_CLOCK_SHIFT_S=str(shift_s),
                             PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    refused_by = 0.1 if shift_s > 0 else -2.5  # a generation_time this far from the API's now: the worker refuses it
    # and one it admits, 1.1 s inside both the API's and the worker's bounds either way: -2.5 left the API's
    # accept_limit 0.5 s for the request to arrive, which a loaded CI run once took (422 for an admitted write)
    kept_by = -1.9 if shift_s > 0 else 0.1

    def dated(by_s: float) -> dict[str, object]:
        api_now_us = int((time.time() + shift_s) * 1e6)
        return {"token": uuid.uuid4().hex, "generation_time": micros_iso(api_now_us + int(by_s * 1e6))}

    # (path, counter, body, the write's offsets from its record's timestamp, by the real clock: either, for a plain
    # AddCount without a time, which the C reader dates by the real clock when the request arrives whole, and the
    # Python path by the API's shifted one when it arrives in pieces, as the client and the kernel send it)
    writes = [
        ("/v1/AddCount", "c-undated", {}, (0.0, shift_s)),
        ("/v1/AddCount", "c-dated", {"idempotency_token": dated(refused_by)}, (shift_s + refused_by,)),
        ("/v1/AddCount", "c-dated-kept", {"idempotency_token": dated(kept_by)}, (shift_s + kept_by,)),
        ("/v1/AddCount", "esc\\u0041", {"idempotency_token": dated(refused_by)}, (shift_s + refused_by,)),  # fast path
        ("/v1/AddCount", "route", {"dimensions": {}, "idempotency_token": dated(refused_by)},
         (shift_s + refused_by,)),  # the app's route
        ("/v1/AddAndGetCount", "aag-undated", {}, (shift_s,)),  # dated by the API's (Python) clock
        ("/v1/AddAndGetCount", "aag-dated", {"idempotency_token": dated(refused_by)}, (shift_s + refused_by,)),
    ]
    expected: dict[str, int] = {}
    refused: set[str] = set()
    with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as c:
        for path, counter, extra, offsets in writes:
            raw = f'{{"namespace": "{NS}", "counter_name": "{counter}", "delta": 1'
            for key, value in extra.items():
                raw += f', "{key}": {httpx.Response(200, json=value).text}'
            r = c.post(path, content=(raw + "}").encode(), headers={"content-type": "application/json"})
            name = counter.replace("\\u0041", "A")
            verdicts = {admitted(offset) for offset in offsets}
            assert r.status_code in {200 if ok else 503 for ok in verdicts}, (counter, r.status_code, r.text)
            if r.status_code == 200:
                expected[name] = 1
            else:
                assert r.status_code == 503, (counter, r.status_code, r.text)
                assert r.json()["idempotency_token"]["token"], r.text  # what a retry sends again
                assert "disagrees with this API's clock" in r.json()["detail"], r.text
                refused.add(name)
        batch = [{"namespace": NS, "counter_name": "batch-undated", "delta": 1},
                 {"namespace": NS, "counter_name": "batch-dated", "delta": 1,
                  "idempotency_token": dated(refused_by)}]
        r = c.post("/v1/BatchAddCount", json={"requests": batch})
        assert r.status_code == 503, r.text
        assert all(t["token"] for t in r.json()["idempotency_tokens"]), r.text  # a retry of each counts once
        if admitted(shift_s):  # counted: it shares a record with the refused one, but is judged alone
            expected["batch-undated"] = 1
        else:
            refused.add("batch-undated")
        refused.add("batch-dated")

    assert refused and expected
    wait_for(lambda: pipeline.converged(NS, expected), 60,
             message=lambda: f"the admitted writes counted; mismatches {pipeline.mismatches(NS, expected)}")

    def dead_lettered() -> set[str] | None:
        names = set()
        for record in read_all(pipeline.bootstrap, pipeline.dlq_topic):
            reason = dict(record.headers).get("dlq.reason", b"").decode()
            if "reached Kafka" in reason:
                names |= {name for name in refused if f'"{name}"' in record.value.decode(errors="replace")
                          or name.encode() in record.value}
        return names if names == refused else None
    wait_for(dead_lettered, 30, interval=0.5, message=lambda: f"the refused writes dead-lettered: {refused}")
    states = pipeline.rollups([(NS, name) for name in refused])
    assert all(s is None or s.count == 0 for s in states.values()), states  # none counted, not even early
