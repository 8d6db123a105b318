"""The batch calls are the single calls, many at once: BatchGetCount answers each entry (window, dimensions, UNIQUE
estimates) exactly as GetCount answers it, and every refusal of an entry names it (`requests.N.<field>`), in
BatchGetCount as in BatchAddCount. Also the 422s of windows that named a field the request has not, or blamed the
wrong thing. Real broker, worker, SQLite, memcached and the HTTP API."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers import iso, now_us, refused, wait_for
from tests.pipeline_harness import FAST_DEFAULTS, worker_and_api

pytestmark = pytest.mark.integration

NAMESPACES = FAST_DEFAULTS + """\
namespaces:
  plays:
    counter_type: EVENTUAL
    dimensions: { keys: [country, device] }
  live:
    counter_type: ACCURATE
  visitors:
    counter_type: EVENTUAL
    aggregation: UNIQUE
    dimensions: { keys: [country] }
  fast:
    counter_type: BEST_EFFORT
"""
HOUR = 3600 * 1_000_000
PAST_DAY = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"}  # the review's window: before any write


@pytest.fixture(scope="module")
def client(kafka_bootstrap: str, memcached_address: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with worker_and_api(kafka_bootstrap, memcached_address, tmp_path_factory.mktemp("batch"), NAMESPACES) as (_, c):
        yield c


def named(r: httpx.Response) -> list[list[object]]:
    """The `loc` of each error of a 422: an entry's index is a number, whether pydantic or the service refused it."""
    return refused(r)


def token() -> dict[str, object]:
    return {"token": uuid.uuid4().hex, "generation_time": now_us()}


def test_each_entry_of_a_batch_read_is_answered_as_getcount_answers_it(client: httpx.Client) -> None:
    tag = uuid.uuid4().hex[:8]
    writes = [
        {"namespace": "plays", "counter_name": f"p{tag}", "delta": 3, "dimensions": {"country": "US", "device": "tv"}},
        {"namespace": "plays", "counter_name": f"p{tag}", "delta": 4, "dimensions": {"country": "FR"}},
        {"namespace": "live", "counter_name": f"l{tag}", "delta": 5},
        {"namespace": "visitors", "counter_name": f"v{tag}", "item": "u1", "dimensions": {"country": "US"}},
        {"namespace": "visitors", "counter_name": f"v{tag}", "item": "u2", "dimensions": {"country": "FR"}},
        {"namespace": "fast", "counter_name": f"f{tag}", "delta": 6},
    ]
    r = client.post("/v1/BatchAddCount", json={"requests": [{**w, "idempotency_token": token()} for w in writes]})
    assert r.status_code == 200, r.text
    now = now_us()
    around = {"start": iso(now - HOUR), "end": iso(now + HOUR)}  # holds every write above
    gets = [{"namespace": ns, "counter_name": f"{ns[0]}{tag}", **extra}
            for ns in ("plays", "live", "visitors")
            for extra in ({}, {"window": around}, {"window": PAST_DAY})]
    gets += [{"namespace": "plays", "counter_name": f"p{tag}", **extra}
             for extra in ({"dimensions": {"country": "US"}}, {"dimensions": {"country": "US"}, "window": around},
                           {"dimensions": {"device": "tv"}, "window": PAST_DAY})]
    gets += [{"namespace": "visitors", "counter_name": f"v{tag}", "dimensions": {"country": "FR"}, "window": around},
             {"namespace": "fast", "counter_name": f"f{tag}"}]
    expected = [7, 7, 0, 5, 5, 0, 2, 2, 0, 3, 3, 0, 1, 6]

    def same_answers() -> bool:
        batch = client.post("/v1/BatchGetCount", json={"requests": gets})
        assert batch.status_code == 200, batch.text
        singles = [client.post("/v1/GetCount", json=g).json() for g in gets]
        return batch.json()["results"] == singles and [s["count"] for s in singles] == expected

    # equal once the rollups have the writes and stay put between the batch and the single reads
    wait_for(same_answers, 30, interval=0.2, message="BatchGetCount's answers equal GetCount's")
    results = client.post("/v1/BatchGetCount", json={"requests": gets}).json()["results"]
    assert ["window" in res for res in results] == ["window" in g for g in gets]
    assert [res.get("dimensions") for res in results] == [g.get("dimensions") for g in gets]
    assert "estimate" in results[6] and "estimate" in results[7]
    # a `last` window: the count of the window, and the window it covers, as GetCount answers it
    last = [{"namespace": "plays", "counter_name": f"p{tag}", "window": {"last": "1h"}},
            {"namespace": "visitors", "counter_name": f"v{tag}", "window": {"last": "1h"}}]
    results = client.post("/v1/BatchGetCount", json={"requests": last}).json()["results"]
    assert [(res["count"], set(res["window"])) for res in results] == [(7, {"start", "end"}), (2, {"start", "end"})]


def test_a_refused_entry_of_a_batch_is_named(client: httpx.Client) -> None:
    ok = {"namespace": "plays", "counter_name": "c"}
    bad_reads = [
        ({"window": {"last": "bogus"}}, ["window", "last"]),
        ({"window": {"start": "2200-12-31T00:00:00Z"}}, ["window", "start"]),
        ({"window": {"bogus": "1h"}}, ["window", "bogus"]),
        ({"namespace": "fast", "window": {"last": "1h"}}, ["window"]),  # BEST_EFFORT keeps no windows
        ({"dimensions": {"os": "linux"}}, ["dimensions", "os"]),
        ({"group_by": "country"}, ["group_by"]),
    ]
    for change, loc in bad_reads:
        r = client.post("/v1/BatchGetCount", json={"requests": [ok, ok, {**ok, **change}]})
        assert named(r) == [["body", "requests", 2, *loc]], (change, r.text)
    r = client.post("/v1/BatchGetCount", json={"requests": [ok, {**ok, "namespace": "nope"}]})
    assert r.status_code == 404 and r.json()["detail"] == "requests.1.namespace: unknown namespace 'nope'", r.text

    tag = uuid.uuid4().hex[:8]
    first = {"namespace": "plays", "counter_name": f"first{tag}", "delta": 1, "idempotency_token": token()}
    write = {"namespace": "plays", "counter_name": "c", "delta": 1}
    bad_writes = [
        ({"idempotency_token": {"token": "t", "generation_time": "2024-10-05T14:48:00Z"}},  # the post's example
         ["idempotency_token", "generation_time"]),
        ({"namespace": "visitors"}, ["item"]),
        ({"dimensions": {"os": "linux"}}, ["dimensions", "os"]),
    ]
    for change, loc in bad_writes:
        r = client.post("/v1/BatchAddCount", json={"requests": [first, write, {**write, **change}]})
        assert named(r) == [["body", "requests", 2, *loc]], (change, r.text)
    r = client.post("/v1/BatchAddCount", json={"requests": [first, write, {**write, "namespace": "nope"}]})
    assert r.status_code == 404 and r.json()["detail"] == "requests.2.namespace: unknown namespace 'nope'", r.text
    # all validated before anything was sent: the first entry of those batches was never counted
    r = client.post("/v1/AddAndGetCount", json={**first, "idempotency_token": token()})
    assert r.status_code == 200 and r.json()["count"] == 1, r.text


def test_window_refusals_name_a_field_of_the_request_and_say_what_is_wrong(client: httpx.Client) -> None:
    series = {"namespace": "fast", "counter_name": "c", "granularity": "hour", "start": iso(now_us() - HOUR)}
    r = client.post("/v1/GetCountSeries", json=series)
    assert refused(r) == [["body", "namespace"]] and "keeps no time windows" in r.text, r.text  # it has no window
    future = {"start": "2200-12-31T00:00:00Z"}  # and no end: the window would end now, before it starts
    for path, body in (("/v1/GetCount", {"namespace": "plays", "counter_name": "c", "window": future}),
                       ("/v1/GetTopK", {"namespace": "plays", "window": future})):
        r = client.post(path, json=body)
        assert refused(r) == [["body", "window", "start"]], r.text
        assert "must be before now" in r.json()["detail"][0]["msg"] and "after start" not in r.text, r.text
