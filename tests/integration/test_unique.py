"""Unique counts end to end: real broker, real worker, SQLite, memcached and the HTTP API.

A few thousand items reach two UNIQUE namespaces over HTTP (AddCount with and without delta, AddAndGetCount,
BatchAddCount), as Kafka JSON records from an outside client (without delta) and as Avro v2 records from
CounterProducer (single and client-side batched), with retries of the same token and item, the same items again
under other tokens, and a ClearCount in the middle. Every answer's estimate is checked against the truth computed
here: the truth lies within [lower_bound, upper_bound] and the relative error within 3 x 1.04 / sqrt(2^lg_k), per
counter, per window, per dimension filter and per group. Refusals name the field (422) or carry the reason (DLQ).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer

from producers import CounterProducer
from tests.helpers import iso, now_us, read_all, refused, wait_for
from tests.pipeline_harness import FAST_DEFAULTS, PipelineEnv, worker_and_api

pytestmark = pytest.mark.integration

NAMESPACES = FAST_DEFAULTS + """\
namespaces:
  visitors:
    counter_type: EVENTUAL
    aggregation: UNIQUE
    dimensions: { keys: [country] }
  live_visitors:
    counter_type: ACCURATE
    aggregation: UNIQUE
    unique: { lg_k: 14 }
  plain:
    counter_type: EVENTUAL
"""
NS, LIVE = "visitors", "live_visitors"
LG_K = {NS: 12, LIVE: 14}
COUNTRIES = ("US", "FR", "BR")


class Truth:
    """The distinct items of every counter (and combination), as the writes and the clear leave them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, int, str]] = []  # (namespace, counter name, time, item)
        self.clears: dict[tuple[str, str], int] = {}

    def add(self, ns: str, counter: str, t: int, item: str, country: str | None = None) -> None:
        self.events.append((ns, counter, t, item))
        if country is not None:
            self.events.append((ns, f"{counter} country={country}", t, item))

    def items(self, ns: str, name: str) -> set[str]:
        base = name.split(" ")[0]
        cut = self.clears.get((ns, base), -1)
        return {item for n, c, t, item in self.events if n == ns and c == name and t > cut}

    def last(self, ns: str, name: str) -> int:
        return max(t for n, c, t, _i in self.events if n == ns and c == name)


def within(answer: dict, truth: int, lg_k: int) -> None:
    assert answer["lower_bound"] <= truth <= answer["upper_bound"], (answer, truth)
    assert abs(answer["estimate"] - truth) <= 3 * 1.04 / (2 ** lg_k) ** 0.5 * max(truth, 1), (answer, truth)
    assert answer["count"] == round(answer["estimate"])


def test_unique_counts_end_to_end(kafka_bootstrap: str, memcached_address: str, tmp_path: Path) -> None:
    with worker_and_api(kafka_bootstrap, memcached_address, tmp_path, NAMESPACES) as (env, client):
        _run(env, client)


def _run(env: PipelineEnv, client: httpx.Client) -> None:
    truth = Truth()

    def post(path: str, body: dict) -> dict:
        r = client.post(path, json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def http_add(ns: str, counter: str, item: str, *, token: str, t: int | None = None, country: str | None = None,
                 delta: bool = False, path: str = "/v1/AddCount") -> dict:
        t = t or now_us()
        body: dict = {"namespace": ns, "counter_name": counter, "item": item,
                      "idempotency_token": {"token": token, "generation_time": iso(t)}}
        if delta:
            body["delta"] = 1
        if country:
            body["dimensions"] = {"country": country}
        answer = post(path, body)
        truth.add(ns, counter, t, item, country)
        return answer

    # -- HTTP: AddCount (with and without delta), retries, BatchAddCount, AddAndGetCount
    for i in range(300):
        t = now_us()
        http_add(NS, "home", f"user-{i}", token=f"h{i}", t=t, country=COUNTRIES[i % 3], delta=i % 2 == 0)
        if i % 10 == 0:  # a retry: the same token, time and item
            http_add(NS, "home", f"user-{i}", token=f"h{i}", t=t, country=COUNTRIES[i % 3])
    for chunk in range(3):
        requests, batch_time = [], now_us()
        for j in range(1000):
            i = 300 + chunk * 1000 + j
            item, country = f"user-{i % 2500}", COUNTRIES[i % 3]  # some items again, under other tokens
            requests.append({"namespace": NS, "counter_name": "home", "item": item, "dimensions": {"country": country},
                             "idempotency_token": {"token": f"b{i}", "generation_time": iso(batch_time + j)}})
            truth.add(NS, "home", batch_time + j, item, country)
        assert len(post("/v1/BatchAddCount", {"requests": requests})["results"]) == 1000

    # -- Kafka: JSON records from an outside client (no delta), Avro v2 from CounterProducer
    outside = Producer({"bootstrap.servers": env.bootstrap, "acks": "all"})
    for i in range(1200):
        t, item, country = now_us() + i, f"kafka-{i % 900}", COUNTRIES[i % 3]
        body = {"namespace": NS, "counter_name": "home", "item": item, "dimensions": {"country": country},
                "idempotency_token": {"token": f"j{i}", "generation_time": t}}
        outside.produce(env.mutations_topic, json.dumps(body).encode(), key=f"{NS}:home".encode())
        truth.add(NS, "home", t, item, country)
    assert outside.flush(30) == 0
    with CounterProducer(env.bootstrap, topic=env.mutations_topic) as single, \
            CounterProducer(env.bootstrap, topic=env.mutations_topic, batch_size=200) as batched:
        for i in range(1000):
            t, item = now_us() + i, f"avro-{i % 700}"
            (batched if i % 4 else single).add(NS, "home", 1, token=f"a{i}", generation_time=t, item=item,
                                               dimensions={"country": COUNTRIES[i % 3]})
            truth.add(NS, "home", t, item, COUNTRIES[i % 3])
            if i % 50 == 0:  # a retry of the same record
                batched.add(NS, "home", 1, token=f"a{i}", generation_time=t, item=item,
                            dimensions={"country": COUNTRIES[i % 3]})

    # -- a clear of "other" halfway through its writes: only the items after it remain
    for i in range(400):
        http_add(NS, "other", f"early-{i % 250}", token=f"o{i}")
    time.sleep(0.05)
    clear_time = now_us()
    post("/v1/ClearCount", {"namespace": NS, "counter_name": "other",
                            "idempotency_token": {"token": "clr", "generation_time": iso(clear_time)}})
    truth.clears[(NS, "other")] = clear_time
    time.sleep(0.01)
    for i in range(150):
        http_add(NS, "other", f"early-{i % 50}" if i % 2 else f"late-{i}", token=f"p{i}")

    # -- ACCURATE: AddAndGetCount includes its own item at once
    for i in range(40):
        answer = http_add(LIVE, "page", f"reader-{i % 30}", token=f"l{i}", path="/v1/AddAndGetCount")
        assert answer["count"] == len({f"reader-{k % 30}" for k in range(i + 1)}), answer
        assert {"estimate", "lower_bound", "upper_bound"} <= answer.keys()

    # -- refusals name the field
    base = {"namespace": NS, "counter_name": "home"}
    assert refused(client.post("/v1/AddCount", json=base)) == [["body", "item"]]
    assert refused(client.post("/v1/AddCount", json={**base, "item": "x", "delta": 2})) == [["body", "delta"]]
    assert refused(client.post("/v1/AddCount", json={**base, "item": "x", "event_item_key": "k"})) == [
        ["body", "event_item_key"]]
    assert refused(client.post("/v1/AddCount", json={**base, "item": "x", "dimensions": {"device": "tv"}})) == [
        ["body", "dimensions", "device"]]
    assert refused(client.post("/v1/AddAndGetCount", json=base)) == [["body", "item"]]
    assert refused(client.post("/v1/BatchAddCount", json={"requests": [{**base, "item": "x"}, base]})) == [
        ["body", "requests", 1, "item"]]
    assert refused(client.post("/v1/AddCount", json={"namespace": "plain", "counter_name": "c", "delta": 1,
                                                  "item": "x"})) == [["body", "item"]]
    assert refused(client.post("/v1/AddCount", json={"namespace": "plain", "counter_name": "c"})) == [["body", "delta"]]
    assert refused(client.post("/v1/ClearCount", json={**base, "item": "x"})) == [["body", "item"]]
    # over Kafka: dead letters with the reason
    no_item = json.dumps({"namespace": NS, "counter_name": "home", "delta": 1,
                          "idempotency_token": {"token": "bad-1", "generation_time": now_us()}}).encode()
    five = json.dumps({"namespace": NS, "counter_name": "home", "delta": 5, "item": "x",
                       "idempotency_token": {"token": "bad-2", "generation_time": now_us()}}).encode()
    for value in (no_item, five):
        outside.produce(env.mutations_topic, value, key=b"visitors:home")
    assert outside.flush(20) == 0

    def dead_letters() -> dict[bytes, str] | None:
        found = {r.value: dict(r.headers)["dlq.reason"].decode() for r in read_all(env.bootstrap, env.dlq_topic)}
        return found if len(found) >= 2 else None

    dead = wait_for(dead_letters, 60, interval=0.5, message="dead letters")
    assert dead[no_item].startswith("field 'item': is required: namespace 'visitors' counts distinct items")
    assert dead[five].startswith("field 'delta': must be 1 or absent") and len(dead) == 2

    # -- everything converges: estimates within the bounds of the truth
    names: dict[tuple[str, str], dict[str, str]] = {(NS, "home"): {}, (NS, "other"): {}, (LIVE, "page"): {},
                                                    **{(NS, f"home country={c}"): {"country": c} for c in COUNTRIES}}

    def get(ns: str, counter: str, **extra: object) -> dict:
        return post("/v1/GetCount", {"namespace": ns, "counter_name": counter, **extra})

    def caught_up() -> list[str]:
        late = []
        for (ns, name), dims in names.items():
            answer = get(ns, name.split(" ")[0], dimensions=dims)
            if answer["as_of"] is None or _us(answer["as_of"]) < truth.last(ns, name):
                late.append(name)
        return late

    wait_for(lambda: not caught_up(), 90, interval=0.5, message=lambda: f"rolled up past the last write: {caught_up()}")
    home = get(NS, "home")
    within(home, len(truth.items(NS, "home")), LG_K[NS])
    assert len(truth.items(NS, "home")) > 4000  # a few thousand distinct items, written many more times
    other, after_clear = get(NS, "other"), len(truth.items(NS, "other"))
    assert other["count"] == after_clear == 100  # small counts are exact: 75 late items, 25 early ones again
    within(get(LIVE, "page"), 30, LG_K[LIVE])
    # windows: the last hour holds every write; an hour that ended before them holds none
    within(get(NS, "home", window={"last": "1h"}), len(truth.items(NS, "home")), LG_K[NS])
    assert get(NS, "other", window={"last": "1h"})["count"] == after_clear
    empty = get(NS, "home", window={"start": iso(now_us() - 3 * 3600 * 1_000_000),
                                    "end": iso(now_us() - 2 * 3600 * 1_000_000)})
    assert (empty["count"], empty["estimate"], empty["upper_bound"]) == (0, 0, 0)
    # dimension filters, group_by, BatchGetCount
    for c in COUNTRIES:
        filtered = get(NS, "home", dimensions={"country": c})
        assert filtered["dimensions"] == {"country": c}
        within(filtered, len(truth.items(NS, f"home country={c}")), LG_K[NS])
    grouped = get(NS, "home", group_by="country", window={"last": "1h"})
    assert [g["value"] for g in grouped["groups"]] == sorted(COUNTRIES) and grouped["window"] is not None
    for g in grouped["groups"]:
        within(g, len(truth.items(NS, f"home country={g['value']}")), LG_K[NS])
    within(grouped, len(truth.items(NS, "home")), LG_K[NS])
    batch = post("/v1/BatchGetCount", {"requests": [{"namespace": NS, "counter_name": "home"},
                                                    {"namespace": NS, "counter_name": "home",
                                                     "dimensions": {"country": "US"}},
                                                    {"namespace": "plain", "counter_name": "c"}]})["results"]
    assert batch[0]["estimate"] == home["estimate"] and batch[1]["dimensions"] == {"country": "US"}
    assert "estimate" not in batch[2] and batch[2]["count"] == 0
    series = post("/v1/GetCountSeries", {"namespace": NS, "counter_name": "other", "granularity": "hour",
                                         "start": iso(clear_time)})
    counts = [b["count"] for b in series["buckets"] if b["count"]]  # one hour, or two when the test straddles one
    assert counts and max(counts) <= after_clear <= sum(counts) and (len(counts) > 1 or counts == [after_clear])


def _us(text: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1_000_000)
