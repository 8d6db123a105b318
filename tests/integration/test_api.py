"""The HTTP API against the real running stack: broker, worker, memcached, SQLite, `python -m query_api`."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.helpers import wait_for
from tests.pipeline_harness import PipelineEnv, own_broker

pytestmark = pytest.mark.integration

NAMESPACES = Path(__file__).resolve().parents[1] / "data" / "api_namespaces.yaml"

# The request bodies of the Netflix post, verbatim.
POST_ADD = {"namespace": "my_dataset", "counter_name": "counter123", "delta": 2,
            "idempotency_token": {"token": "some_event_id", "generation_time": "2024-10-05T14:48:00Z"}}
POST_GET = {"namespace": "my_dataset", "counter_name": "counter123"}
POST_CLEAR = {"namespace": "my_dataset", "counter_name": "counter456",
              "idempotency_token": {"token": "some_event_id", "generation_time": "2024-10-05T14:48:00Z"}}


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def fresh(body: dict, **changes: object) -> dict:
    """The body with a current generation_time and a unique token (what a live client sends)."""
    out = json.loads(json.dumps(body))
    if "idempotency_token" in out:
        out["idempotency_token"] = {"token": uuid.uuid4().hex, "generation_time": now_iso()}
    out.update(changes)
    return out


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, memcached_address, tmp_path_factory):
    env = PipelineEnv(kafka_bootstrap, memcached_address, tmp_path_factory.mktemp("api") / "data",
                      namespaces=NAMESPACES).prepare()
    env.start_worker()
    api = env.start_api()
    with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as client:
        env.client = client
        yield env
    env.stop()


def post(stack, path: str, body: dict, **headers: str) -> httpx.Response:
    return stack.client.post(path, json=body, headers=headers)


def get_count(stack, ns: str, counter: str) -> int:
    r = post(stack, "/v1/GetCount", {"namespace": ns, "counter_name": counter})
    assert r.status_code == 200, r.text
    return r.json()["count"]


def test_post_bodies_verbatim(stack):
    # GetCount: a counter nobody wrote is 0.
    r = post(stack, "/v1/GetCount", POST_GET)
    assert r.status_code == 200 and r.json()["count"] == 0 and r.json()["counter_type"] == "EVENTUAL"
    # AddCount verbatim: its generation_time (2024) lies outside the accept window of a rolled-up
    # namespace, so it is refused, naming the field (accepting it would break immutable rollup windows).
    r = post(stack, "/v1/AddCount", POST_ADD)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "generation_time", r.text
    # BEST_EFFORT accepts and ignores tokens: the same body counts there.
    r = post(stack, "/v1/AddCount", {**POST_ADD, "namespace": "my_dataset_best_effort"})
    assert r.status_code == 200 and r.json()["durable"] is False
    # The same bodies with a current generation_time are accepted and durable.
    r = post(stack, "/v1/AddCount", fresh(POST_ADD))
    assert r.status_code == 200 and r.json()["durable"] is True
    r = post(stack, "/v1/ClearCount", fresh(POST_CLEAR))
    assert r.status_code == 200 and r.json()["counter_type"] == "EVENTUAL"
    wait_for(lambda: get_count(stack, "my_dataset", "counter123") == 2, 30, interval=0.2,
             message="counter123 rolled up")
    r = post(stack, "/v1/GetCount", POST_GET)
    assert r.json()["as_of"] is not None


def test_eventual_converges_and_retries_are_idempotent(stack):
    counter = f"ev-{uuid.uuid4().hex[:8]}"
    body = fresh(POST_ADD, counter_name=counter, delta=5)
    for _ in range(3):  # a retried request (same token, same generation_time) counts once
        assert post(stack, "/v1/AddCount", body).status_code == 200
    assert post(stack, "/v1/AddCount", fresh(POST_ADD, counter_name=counter, delta=-8)).status_code == 200
    wait_for(lambda: get_count(stack, "my_dataset", counter) == -3, 30, interval=0.2, message="-3")


def test_accurate_reads_include_persisted_events_before_rollup(stack):
    counter = f"acc-{uuid.uuid4().hex[:8]}"
    r = post(stack, "/v1/AddAndGetCount", fresh(POST_ADD, namespace="my_dataset_accurate", counter_name=counter,
                                                 delta=7))
    assert r.status_code == 200 and r.json()["count"] == 7
    assert get_count(stack, "my_dataset_accurate", counter) == 7  # live delta, no rollup needed
    clear = fresh(POST_CLEAR, namespace="my_dataset_accurate", counter_name=counter)
    assert post(stack, "/v1/ClearCount", clear).status_code == 200
    r = post(stack, "/v1/AddAndGetCount", fresh(POST_ADD, namespace="my_dataset_accurate", counter_name=counter,
                                                 delta=3))
    assert r.json()["count"] == 3
    wait_for(lambda: get_count(stack, "my_dataset_accurate", counter) == 3, 30, message="accurate 3")


def test_add_and_get_answers_with_the_worker_paused_and_the_worker_then_counts_each_write_once(stack):
    """A plain AddAndGetCount stores its own event once acknowledged (query_api.early_persist): it answers while
    the worker is frozen (waiting for the worker would time out), and the worker's copies add nothing."""
    counter = f"ryw-{uuid.uuid4().hex[:8]}"
    first = fresh(POST_ADD, counter_name=counter, delta=4)
    [worker] = stack.workers
    stack.pause_settled(worker)
    try:
        started = time.monotonic()
        assert post(stack, "/v1/AddAndGetCount", first).json()["count"] == 4
        assert post(stack, "/v1/AddAndGetCount", fresh(POST_ADD, counter_name=counter, delta=6)).json()["count"] == 10
        assert post(stack, "/v1/AddAndGetCount", first).json()["count"] == 10  # a retry: counted once
        assert post(stack, "/v1/AddAndGetCount", {"namespace": "my_dataset", "counter_name": counter,
                                                  "delta": -1}).json()["count"] == 9  # the fast path's shape
        batch = [fresh(POST_ADD, counter_name=counter, delta=20), fresh(POST_ADD, counter_name=counter, delta=-2)]
        assert post(stack, "/v1/BatchAddCount", {"requests": batch}).status_code == 200
        assert post(stack, "/v1/AddAndGetCount", fresh(POST_ADD, counter_name=counter,
                                                       delta=1)).json()["count"] == 28  # the batch's writes too
        assert time.monotonic() - started < 3, "answered only after a wait for the worker"
    finally:
        worker.resume()
    wait_for(lambda: stack.converged("my_dataset", {counter: 28}), 30, interval=0.2, message="rolled up to 28")
    assert get_count(stack, "my_dataset", counter) == 28
    stack.pause_settled(worker)
    try:  # over a rollup: the rollup (read before the store) plus the events stored after it
        assert post(stack, "/v1/AddAndGetCount", fresh(POST_ADD, counter_name=counter, delta=2)).json()["count"] == 30
    finally:
        worker.resume()


def test_best_effort_negative_totals_clear_and_64_bit_edges(stack):
    ns, counter = "my_dataset_best_effort", f"be-{uuid.uuid4().hex[:8]}"

    def add_get(delta: int) -> httpx.Response:
        return post(stack, "/v1/AddAndGetCount", {"namespace": ns, "counter_name": counter, "delta": delta})

    assert add_get(5).json()["count"] == 5
    assert add_get(-12).json()["count"] == -7  # memcached decr would stop at 0
    assert get_count(stack, ns, counter) == -7
    assert add_get(2**63 - 1 + 7).status_code == 422  # delta beyond int64 is refused by the schema
    assert add_get(2**63 - 1).json()["count"] == 2**63 - 8
    assert add_get(100).json()["count"] == 2**63 - 1  # saturates at int64's bound (memcached incr would wrap)
    assert get_count(stack, ns, counter) == 2**63 - 1
    assert add_get(-(2**63)).json()["count"] == -1
    assert post(stack, "/v1/ClearCount", {"namespace": ns, "counter_name": counter}).status_code == 200
    assert get_count(stack, ns, counter) == 0


def test_batch_endpoints(stack):
    tag = uuid.uuid4().hex[:8]
    requests = [fresh(POST_ADD, counter_name=f"b{tag}-{i}", delta=i + 1) for i in range(5)]
    requests.append({"namespace": "my_dataset_best_effort", "counter_name": f"b{tag}", "delta": 4})
    r = post(stack, "/v1/BatchAddCount", {"requests": requests})
    assert r.status_code == 200 and len(r.json()["results"]) == 6
    gets = [{"namespace": q["namespace"], "counter_name": q["counter_name"]} for q in requests]

    def all_counted() -> bool:
        res = post(stack, "/v1/BatchGetCount", {"requests": gets}).json()["results"]
        return [c["count"] for c in res] == [1, 2, 3, 4, 5, 4]
    wait_for(all_counted, 30, interval=0.2, message="batch counted")
    # One invalid item refuses the whole batch before anything is sent.
    bad = [fresh(POST_ADD, counter_name=f"b{tag}-0"), {"namespace": "nope", "counter_name": "x", "delta": 1}]
    assert post(stack, "/v1/BatchAddCount", {"requests": bad}).status_code == 404
    assert post(stack, "/v1/GetCount", {"namespace": "my_dataset", "counter_name": f"b{tag}-0"}).json()["count"] == 1
    # A BEST_EFFORT entry whose count would leave int64 saturates, as a single add does; its neighbours count.
    full = {"namespace": "my_dataset_best_effort", "counter_name": f"full{tag}"}
    spare = {"namespace": "my_dataset_best_effort", "counter_name": f"spare{tag}"}
    assert post(stack, "/v1/AddCount", {**full, "delta": 2**63 - 1}).status_code == 200
    mixed = [fresh(POST_ADD, counter_name=f"m{tag}"), {**spare, "delta": 3}, {**full, "delta": 1}]
    r = post(stack, "/v1/BatchAddCount", {"requests": mixed})
    assert r.status_code == 200, r.text
    assert post(stack, "/v1/GetCount", spare).json()["count"] == 3
    assert post(stack, "/v1/GetCount", full).json()["count"] == 2**63 - 1


@pytest.mark.parametrize("ns", ["my_dataset", "my_dataset_accurate"])
def test_read_your_write_under_concurrent_writers(stack, ns):
    counter = f"ryw-{uuid.uuid4().hex[:8]}"
    failures: list[str] = []

    def writer(n: int) -> None:
        with httpx.Client(base_url=str(stack.client.base_url), timeout=30) as c:
            for i in range(1, n + 1):
                r = c.post("/v1/AddAndGetCount", json=fresh(POST_ADD, namespace=ns, counter_name=counter, delta=1))
                if r.status_code != 200 or r.json()["count"] < i:  # must include this writer's i writes
                    failures.append(f"{r.status_code} {r.text} after {i} writes")

    threads = [threading.Thread(target=writer, args=(15,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:3]
    wait_for(lambda: get_count(stack, ns, counter) == 60, 30, message="60")


@pytest.mark.parametrize("body, field", [
    ({"namespace": "my_dataset", "counter_name": "c", "delta": "two"}, "delta"),
    ({"namespace": "my_dataset", "delta": 1}, "counter_name"),
    ({"namespace": "my_dataset", "counter_name": "has space", "delta": 1}, "counter_name"),
    ({"namespace": "my:dataset", "counter_name": "c", "delta": 1}, "namespace"),
    ({"namespace": "my_dataset", "counter_name": "c", "delta": 1, "extra": 1}, "extra"),
    ({"namespace": "my_dataset", "counter_name": "c", "delta": 1,
      "idempotency_token": {"token": "t", "generation_time": "yesterday"}}, "generation_time"),
])
def test_invalid_body_is_422_naming_the_field(stack, body, field):
    r = post(stack, "/v1/AddCount", body)
    assert r.status_code == 422
    assert any(field in [str(p) for p in err["loc"]] for err in r.json()["detail"]), r.text


@pytest.mark.parametrize("path", ["/v1/AddCount", "/v1/AddAndGetCount"])
def test_an_integer_past_the_json_parsers_digit_limit_is_422_naming_delta(stack, path):
    """Python's JSON parser refuses over 4,300 digits: the 422 said "invalid body" without the field (a review)."""
    body = b'{"namespace": "my_dataset", "counter_name": "huge", "delta": ' + b"9" * 5000 + b"}"
    r = stack.client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert [e["loc"] for e in r.json()["detail"]] == [["body", "delta"]], r.text


def test_unknown_namespace_is_404(stack):
    r = post(stack, "/v1/GetCount", {"namespace": "nope", "counter_name": "c"})
    assert r.status_code == 404 and "nope" in r.json()["detail"]


def test_api_keys(stack):
    body = fresh(POST_ADD, namespace="secured", counter_name="k", delta=1)
    r = post(stack, "/v1/AddCount", body)
    assert r.status_code == 401 and "requires an API key" in r.json()["detail"], r.text
    r = post(stack, "/v1/AddCount", body, **{"X-API-Key": "wrong"})  # not "requires": one was sent (a review)
    assert r.status_code == 401, r.text
    assert r.json()["detail"] == "the API key given is not one of the keys of namespace 'secured'"
    assert post(stack, "/v1/AddCount", body, **{"X-API-Key": "reader-key"}).status_code == 403
    assert post(stack, "/v1/AddCount", body, **{"X-API-Key": "writer-key"}).status_code == 200
    get = {"namespace": "secured", "counter_name": "k"}
    assert post(stack, "/v1/GetCount", get, **{"X-API-Key": "writer-key"}).status_code == 403
    assert post(stack, "/v1/GetCount", get, Authorization="Bearer reader-key").status_code == 200
    assert post(stack, "/v1/AddAndGetCount", body, **{"X-API-Key": "reader-key"}).status_code == 403
    assert post(stack, "/v1/AddAndGetCount", fresh(body), **{"X-API-Key": "admin-key"}).json()["count"] == 2
    # in a batch, the refusal names the first entry of the namespace the key may not use
    open_add = fresh(POST_ADD, counter_name="k-open", delta=1)
    r = post(stack, "/v1/BatchAddCount", {"requests": [open_add, fresh(body), fresh(body)]},
             **{"X-API-Key": "reader-key"})
    assert r.status_code == 403 and r.json()["detail"].startswith("requests.1.namespace: this API key lacks"), r.text
    r = post(stack, "/v1/BatchGetCount", {"requests": [POST_GET, POST_GET, get]})
    assert r.status_code == 401 and r.json()["detail"].startswith("requests.2.namespace: namespace 'secured'"), r.text
    r = post(stack, "/v1/BatchGetCount", {"requests": [POST_GET, get]}, **{"X-API-Key": "reader-key"})
    assert r.status_code == 200 and len(r.json()["results"]) == 2, r.text
    # views whose answers depend on the key: no shared cache may serve one caller's answer to another
    view = stack.client.get("/v1/namespaces/secured", headers={"X-API-Key": "reader-key"})
    assert view.status_code == 200 and view.json()["config"] is not None
    assert view.headers["cache-control"] == "private" and "X-API-Key" in view.headers["vary"], view.headers


def test_health_ready_metrics_openapi(stack):
    assert stack.client.get("/healthz").status_code == 200
    ready = stack.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["broker"] == "ok"
    post(stack, "/v1/GetCount", POST_GET)
    text = stack.client.get("/metrics").text
    assert 'counter_api_requests_total{endpoint="/v1/GetCount",status="200"}' in text
    assert "counter_api_cache_hit_ratio" in text
    # the pipeline's figures, as GET /v1/pipeline has them (a review: no scrapeable lag that moved in a stall)
    pipeline = stack.client.get("/v1/pipeline").json()
    assert _metric(stack, "counter_pipeline_errors") == len(pipeline["errors"]) == 0
    assert _metric(stack, "counter_pipeline_persist_lag_records") >= 0
    assert _metric(stack, "counter_pipeline_dead_letters") == pipeline["dlq"]["size"]
    assert "counter_pipeline_warnings" in text and "# HELP counter_pipeline_persisted_still_seconds" in text
    refused = stack.client.get("/v1/namespaces/my_dataset_best_effort/audit", params={"counter_name": "c"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["path", "namespace"], refused.text
    spec = stack.client.get("/openapi.json").json()
    assert {"/v1/AddCount", "/v1/AddAndGetCount", "/v1/GetCount", "/v1/ClearCount", "/v1/BatchAddCount",
            "/v1/BatchGetCount"} <= set(spec["paths"])
    assert stack.client.get("/docs").status_code == 200


def _metric(stack, series: str) -> float:
    """The value of one unlabelled series in /metrics."""
    text = stack.client.get("/metrics").text
    return float(next(line for line in text.splitlines() if line.startswith(series + " ")).split()[-1])


def test_metrics_show_group_commit_records_and_the_brokers_acknowledgement_time(stack):
    names = ("counter_api_group_commit_records_total", "counter_api_group_commit_mutations_total",
             "counter_api_broker_ack_seconds_count", "counter_api_group_commit_failed_records_total")
    before = {n: _metric(stack, n) for n in names}
    ack_before = _metric(stack, "counter_api_broker_ack_seconds_sum")
    assert post(stack, "/v1/AddCount", fresh(POST_ADD)).status_code == 200
    batch = {"requests": [fresh(POST_ADD), fresh(POST_ADD, counter_name="other")]}
    assert post(stack, "/v1/BatchAddCount", batch).status_code == 200  # both mutations in one record
    after = {n: _metric(stack, n) for n in names}
    assert [after[n] - before[n] for n in names] == [2, 3, 2, 0]
    assert 0 < _metric(stack, "counter_api_broker_ack_seconds_sum") - ack_before < 10
    for ended in ("complete", "gave_up"):  # records held for returning clients (producers.cohort_hold), both shown
        assert _metric(stack, f'counter_api_group_commit_holds_total{{ended="{ended}"}}') >= 0


def _read_responses(sock: socket.socket, responses: int) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """Read `responses` HTTP responses from the socket: (status line, headers, body)."""
    out = []
    buf = b""
    while len(out) < responses:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(out)} responses"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        status, *lines = head.split(b"\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines)}
        length = int(headers[b"content-length"])
        while len(buf) < length:
            buf += sock.recv(65536)
        out.append((status, headers, buf[:length]))
        buf = buf[length:]
    assert not buf, f"unexpected bytes after {responses} responses: {buf[:80]!r}"
    return out


def _raw_http(port: int, data: bytes, responses: int) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """Send raw bytes on one connection and read `responses` HTTP responses: (status line, headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        out = _read_responses(sock, responses)
        if out and out[-1][1].get(b"connection") == b"close":
            assert sock.recv(1) == b""  # and the server closed it
    return out


def _get_count_requests(stack) -> float:
    series = 'counter_api_requests_total{endpoint="/v1/GetCount",status="200"} '
    line = next(x for x in stack.client.get("/metrics").text.splitlines() if x.startswith(series))
    return float(line[len(series):])


def _request(body: dict, *extra: str, path: str = "/v1/GetCount") -> bytes:
    data = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", "Host: t", "Content-Type: application/json",
            f"Content-Length: {len(data)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


def test_fast_path_answers_like_the_app_in_order_and_honours_connection_close(stack):
    """Plain GetCounts are answered by the protocol's fast path; a request pipelined behind one goes to the
    FastAPI route. Both answers are the same bytes, in request order, and both are counted in /metrics."""
    name = f"fast-{uuid.uuid4().hex[:8]}"
    assert post(stack, "/v1/AddCount", fresh(POST_ADD, counter_name=name, delta=7)).status_code == 200
    wait_for(lambda: get_count(stack, "my_dataset", name) == 7, 30, message="the count to be rolled up")
    before = _get_count_requests(stack)
    body = {"namespace": "my_dataset", "counter_name": name}
    other = {"namespace": "my_dataset_best_effort", "counter_name": name}
    answers = _raw_http(stack.apis[0].port, _request(body) + _request(other) + _request(body), 3)
    assert [a[0] for a in answers] == [b"HTTP/1.1 200 OK"] * 3
    first, second, third = (json.loads(a[2]) for a in answers)
    assert first == third and first["count"] == 7 and first["counter_type"] == "EVENTUAL" and first["as_of"]
    assert second == {"namespace": "my_dataset_best_effort", "counter_name": name, "count": 0,
                      "counter_type": "BEST_EFFORT", "as_of": None}
    assert answers[0][2] == answers[2][2]  # the fast path's bytes equal the FastAPI route's
    assert all(a[1][b"content-type"] == b"application/json" for a in answers)

    closed = _raw_http(stack.apis[0].port, _request(body, "Connection: close"), 1)
    assert json.loads(closed[0][2])["count"] == 7 and closed[0][1][b"connection"] == b"close"
    assert _get_count_requests(stack) == before + 4


def test_fast_path_hands_everything_unusual_to_the_app(stack):
    """Large, malformed, keyed or extra-field bodies get the app's answers (422 naming the field, 401)."""
    port = stack.apis[0].port
    huge = {"namespace": "my_dataset", "counter_name": "x" * 20_000}
    cases = [
        (huge, b"422", "counter_name"),
        ({"namespace": "my_dataset", "counter_name": "c", "extra": 1}, b"422", "extra"),
        ({"namespace": "my_dataset", "counter_name": "a b"}, b"422", "counter_name"),
        ({"namespace": "nope", "counter_name": "c"}, b"404", "nope"),
    ]
    for body, status, mentioned in cases:
        (line, _, text), = _raw_http(port, _request(body), 1)
        assert line.split()[1] == status and mentioned in text.decode(), (body, line, text[:200])
    (line, _, text), = _raw_http(port, b"POST /v1/GetCount HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n{nope", 1)
    assert line.split()[1] == b"422", text


def test_a_declared_body_over_the_limit_is_a_413_before_any_body_on_every_path(stack):
    """README: a body over 4 MiB is answered 413 "as soon as its Content-Length says so". The fast paths (plain
    AddCount, GetCount) buffered 16 KiB of body first and answered nothing to headers alone (a review)."""
    for path in (b"/v1/AddCount", b"/v1/GetCount", b"/v1/BatchAddCount"):
        head = b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        (line, _, text), = _raw_http(stack.apis[0].port, head % (path, 5 << 20), 1)  # no body sent at all
        assert line.split()[1] == b"413" and b"over" in text, (path, line, text)


def test_fast_path_best_effort_add_saturates_and_counts_exactly(stack):
    """AddCount on a BEST_EFFORT namespace is answered by the fast path, settled in callbacks on memcached's
    reply: concurrent adds to a new key count exactly once each, and an add past int64 leaves the count at the
    bound (a 422 there told a write-only key the count)."""
    port, counter = stack.apis[0].port, f"fast-be-{uuid.uuid4().hex[:8]}"
    add = {"namespace": "my_dataset_best_effort", "counter_name": counter, "delta": 3}
    answers = _raw_http(port, _request(add, path="/v1/AddCount") * 50, 50)  # pipelined: fast path and app
    assert {a[0] for a in answers} == {b"HTTP/1.1 200 OK"}
    assert json.loads(answers[0][2]) == {"namespace": "my_dataset_best_effort", "counter_name": counter,
                                         "counter_type": "BEST_EFFORT", "durable": False, "idempotency_token": None}
    assert len({a[2] for a in answers}) == 1  # the fast path's bytes equal the app's
    with httpx.Client(base_url=str(stack.client.base_url), timeout=30) as c:
        def add_once(_: int) -> int:
            return c.post("/v1/AddCount", json=add).status_code
        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(add_once, range(100))) == {200}
    assert get_count(stack, "my_dataset_best_effort", counter) == 150 * 3
    (line, _, text), = _raw_http(port, _request({**add, "delta": 2**63 - 1}, path="/v1/AddCount"), 1)
    assert line.split()[1] == b"200", (line, text)
    assert get_count(stack, "my_dataset_best_effort", counter) == 2**63 - 1


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_is_json_whatever_its_content_type_on_every_path(stack, content_type):
    """`curl -d` without a header sends the form type; other clients send none. The C path, the Python fast path
    and the FastAPI route all read the body as JSON, so the same write is counted whichever takes it (the route
    answered 422 "Input should be a valid dictionary" before)."""
    name = f"ctype-{uuid.uuid4().hex[:8]}"
    typed = [] if content_type is None else [f"Content-Type: {content_type}"]
    plain = {"namespace": "my_dataset", "counter_name": name, "delta": 1}
    bodies = [plain,  # the C path
              {**plain, "idempotency_token": {"token": uuid.uuid4().hex, "generation_time": now_iso()}},
              {**plain, "dimensions": {}}]  # the route: the fast paths decline a field they do not read
    for body in bodies:
        data = json.dumps(body).encode()
        head = ["POST /v1/AddCount HTTP/1.1", "Host: t", *typed, f"Content-Length: {len(data)}"]
        (line, _, text), = _raw_http(stack.apis[0].port, ("\r\n".join(head) + "\r\n\r\n").encode() + data, 1)
        assert line == b"HTTP/1.1 200 OK", (body, text[:300])
        assert json.loads(text)["counter_name"] == name
    wait_for(lambda: get_count(stack, "my_dataset", name) == 3, 30, message="every write to be counted")
    data = b"{nope"
    (line, _, text), = _raw_http(stack.apis[0].port, b"POST /v1/AddCount HTTP/1.1\r\nHost: t\r\n"
                                 + "".join(t + "\r\n" for t in typed).encode()
                                 + b"Content-Length: %d\r\n\r\n" % len(data) + data, 1)
    assert line.split()[1] == b"422" and b"JSON decode error" in text


def test_an_api_whose_mutations_topic_is_missing_says_so_in_its_writes_and_readyz(stack):
    """A review: a durable AddCount to a mutations topic that does not exist answered 503 "broker ... unreachable",
    while /readyz said the broker was ok."""
    api = stack.start_api(COUNTER_MUTATIONS_TOPIC=f"no-such-topic-{uuid.uuid4().hex[:8]}")
    with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "no-such-topic" in ready.json()["checks"]["broker"], ready.text
        r = client.post("/v1/AddCount", json=fresh(POST_ADD))
        assert r.status_code == 503, r.text
        detail = r.json()["detail"]
        assert "topic 'no-such-topic-" in detail and "not available" in detail and "unreachable" not in detail, detail
    api.stop()


def test_idle_keep_alive_connections_close_and_busy_ones_stay_open(stack):
    """The protocol arms one keep-alive timer per idle period instead of one per request: an idle connection
    still closes after COUNTER_API_KEEP_ALIVE_S, and one kept busy (fast path and app requests) past several
    periods stays open."""
    api = stack.start_api(COUNTER_API_KEEP_ALIVE_S="1")
    fast = _request({"namespace": "my_dataset_best_effort", "counter_name": "keep-alive"})
    app = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
    with socket.create_connection(("127.0.0.1", api.port), timeout=10) as sock:
        sock.sendall(fast)
        assert _read_responses(sock, 1)[0][0] == b"HTTP/1.1 200 OK"
        answered = time.monotonic()
        assert sock.recv(1) == b""  # closed by the server...
        # ...after about the keep-alive period, not at once (this side reads the answer a little after it left)
        assert 0.5 <= time.monotonic() - answered < 6
    with socket.create_connection(("127.0.0.1", api.port), timeout=10) as sock:
        started = time.monotonic()
        while time.monotonic() - started < 3.0:  # three keep-alive periods, never idle for one
            sock.sendall(fast + app)
            assert [r[0] for r in _read_responses(sock, 2)] == [b"HTTP/1.1 200 OK"] * 2
            time.sleep(0.2)  # pacing: idle for a fifth of the period
        answered = time.monotonic()
        assert sock.recv(1) == b""
        assert 0.5 <= time.monotonic() - answered < 6


@pytest.mark.parametrize("requests", ["plain-add", "fast-get", "app", "pipelined"])
def test_a_client_that_half_closes_after_its_requests_gets_every_answer(stack, requests):
    """A client may shut its sending side once its requests are out (`nc -N`, `shutdown(SHUT_WR)`). The connection
    was closed at once, and a write it had sent went unanswered though it was counted (a review): a retry of an
    AddCount without a token then counted twice. Every path: the C reader of a plain AddCount, the protocol's fast
    path, the app, and requests pipelined behind one another."""
    counter = f"half-closed-{requests}"
    add = _request({"namespace": "my_dataset", "counter_name": counter, "delta": 2}, path="/v1/AddCount")
    sent = {"plain-add": [add],
            "fast-get": [_request({"namespace": "my_dataset", "counter_name": counter})],
            "app": [b"GET /v1/namespaces HTTP/1.1\r\nHost: t\r\n\r\n"],
            "pipelined": [add, b"GET /v1/namespaces HTTP/1.1\r\nHost: t\r\n\r\n", add]}[requests]
    with socket.create_connection(("127.0.0.1", stack.client.base_url.port), timeout=10) as sock:
        sock.sendall(b"".join(sent))
        sock.shutdown(socket.SHUT_WR)
        answers = _read_responses(sock, len(sent))
        assert sock.recv(1) == b""  # then the server closes
    assert [a[0] for a in answers] == [b"HTTP/1.1 200 OK"] * len(sent), answers
    adds = sent.count(add)
    if adds:
        wait_for(lambda: get_count(stack, "my_dataset", counter) == 2 * adds, 30, message="the writes counted")


def test_broker_and_memcached_outages(memcached_address, tmp_path):
    """Stopping the broker: writes 503 (nothing half-written), reads still served. Stopping memcached:
    rolled-up reads fall back to the store, BEST_EFFORT answers 503."""
    with own_broker(tmp_path, NAMESPACES) as (broker, mc, env, c):
        env.client = c
        assert post(env, "/v1/AddAndGetCount", fresh(POST_ADD, delta=3)).json()["count"] == 3
        wait_for(lambda: get_count(env, "my_dataset", "counter123") == 3, 30, message="rolled up")
        assert post(env, "/v1/AddCount", {**POST_ADD, "namespace": "my_dataset_best_effort"}).status_code == 200

        mc.stop()
        assert get_count(env, "my_dataset", "counter123") == 3  # from the rollup store
        r = post(env, "/v1/AddCount", {**POST_ADD, "namespace": "my_dataset_best_effort"})
        assert r.status_code == 503 and "memcached" in r.json()["detail"]
        assert post(env, "/v1/GetCount", {**POST_GET, "namespace": "my_dataset_best_effort"}).status_code == 503

        env.workers[0].stop()
        broker.stop()
        started = time.monotonic()
        sent = fresh(POST_ADD, delta=100)
        r = post(env, "/v1/AddCount", sent)
        assert r.status_code == 503 and "broker" in r.json()["detail"], r.text
        assert time.monotonic() - started < 15
        assert r.json()["idempotency_token"]["token"] == sent["idempotency_token"]["token"]
        plain = post(env, "/v1/AddCount", {"namespace": "my_dataset", "counter_name": "plain", "delta": 1})
        drawn = plain.json().get("idempotency_token") or {}  # the token and time the API drew for it
        assert plain.status_code == 503 and drawn.get("token") and isinstance(drawn.get("generation_time"), int)
        assert get_count(env, "my_dataset", "counter123") == 3  # reads still served, nothing half-written
        assert c.get("/readyz").status_code == 503
